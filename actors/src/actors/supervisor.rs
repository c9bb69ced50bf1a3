//! The root Supervisor: opens the engine, recovers every session from the ledger, and
//! supervises the session owners and the coalescer.
//!
//! Each owner and the coalescer run as tasks of their own (see [`super::supervise`]). When one
//! panics, the supervisor applies its [`RestartPolicy`]: a restarted owner is rebuilt from the
//! ledger (its claims returned, its running children adopted), a restarted coalescer simply
//! takes over (children retry their hand-off). Past the budget, the failure escalates: a
//! session owner is given up and its session answers [`BroodError::SessionFailed`]; the
//! coalescer, without which nothing can be recorded, stops the whole engine. A rebuild that
//! fails on an error of the ledger's storage (its database out of reach during a failover) is
//! not such a failure: it is tried again, with backoff, until the ledger answers.
//! Owners are read back from the ledger by `recover` (at start, and for each session taken up)
//! and rebuilt by `rebuild`.
//! It does not route anything itself. On a ledger shared with other processes it also sweeps
//! for free session tenures and balances the sessions with the other processes (`adopt`,
//! `balance`, `handover`), and remembers who serves the sessions it does not (the engine's [`super::holders`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use actix_rt::ArbiterHandle;

use super::coalescer::Coalescer;
use super::owner::{Configure, SessionInfo, SessionOwner};
use super::supervise::{self, Decision, Exit, RestartBudget, RestartBudgets, RestartPolicy};
use super::{Engine, Owners};
use crate::error::BroodError;
use crate::ledger::{Ledger, LedgerError, Writes};
use crate::model::{
    nest_parent, now_ms, validate_new_session_id, validate_session_id, DeadLetterRow, NestRow, SessionRow,
    SessionSettings,
};
use crate::recovery::{split_snapshot, Recovery};
use crate::runner::RunnerFactory;
use crate::wake::Wake;

mod adopt;
mod balance;
mod handover;
mod rebuild;
mod recover;

use recover::{claim_keys, count_unknown, end_orphaned_nests, keep_sessions, quarantine_rejects};

/// Create a session, or update one.
#[derive(Debug, Message)]
#[rtype(result = "Result<(Addr<SessionOwner>, SessionInfo), BroodError>")]
pub struct OpenSession {
    /// The session id (1 to 256 bytes, no control characters).
    pub session_id: String,
    /// Its settings (defaults for a new session: `defaults`, no wake).
    pub settings: SessionSettings,
    /// Capacity and delivery attempts of a new session when `settings` leave them unset.
    pub defaults: (u32, u32),
}

/// Where a session's owner is (with a shared ledger, a stored session that no process serves
/// is taken up here first).
#[derive(Debug, Message)]
#[rtype(result = "Result<Addr<SessionOwner>, BroodError>")]
pub struct GetOwner(pub String);

/// Every dead letter.
#[derive(Debug, Message)]
#[rtype(result = "Result<Vec<DeadLetterRow>, BroodError>")]
pub struct GetDeadLetters;

/// Rebuilds a session's owner from the ledger as a restart after a panic would (its live claims
/// returned, its running children adopted), without a panic and outside the restart budget:
/// the owner is stopped and, once it has stopped, rebuilt from its session's rows.
#[derive(Debug, Message)]
#[rtype(result = "Result<(), BroodError>")]
pub struct RestartOwner(pub String);

/// Whether the engine can take work: the supervisor answers, and the coalescer (without which
/// nothing can be recorded) is alive. Reads nothing from the ledger.
#[derive(Debug, Message)]
#[rtype(result = "Result<Health, BroodError>")]
pub struct GetHealth;

/// What [`GetHealth`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// Sessions routed.
    pub sessions: usize,
    /// Sessions given up after their owner kept failing.
    pub failed_sessions: usize,
}

/// Who waits for a session's owner to be taken up.
type OwnerWaiter = tokio::sync::oneshot::Sender<Result<Addr<SessionOwner>, BroodError>>;

/// The root of the actor tree.
pub struct Supervisor {
    engine: Engine,
    budgets: RestartBudgets,
    coalescer_budget: RestartBudget,
    wakes: HashMap<String, Arc<dyn Wake>>,
    failed: HashMap<String, String>,
    recovered: Vec<SessionOwner>,
    /// Sessions whose owner was asked to stop so it is rebuilt ([`RestartOwner`]).
    restarting: std::collections::HashSet<String>,
    /// Sessions being taken up from a shared ledger, with who waits for their owner.
    adopting: HashMap<String, Vec<OwnerWaiter>>,
    /// Whether a sweep for free tenures is under way.
    sweeping: bool,
    /// Who serves the sessions another process holds, as last found out.
    /// Whether another sweep was asked for while one was under way.
    sweep_again: bool,
    /// Handovers under way.
    handing: usize,
    /// When sessions were last handed over.
    last_give: Option<Instant>,
    /// How many sessions the last round of handovers picked, and how many of them declined.
    round_size: usize,
    round_declined: usize,
    /// Rounds in a row whose every pick declined (busy).
    declined_rounds: u32,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("sessions", &self.engine.owners.len())
            .field("failed", &self.failed)
            .finish()
    }
}

impl Supervisor {
    /// Opens the engine on `ledger` with the default restart policy: recovers every session
    /// (I6), writes and flushes what recovery resolved, and starts the actors. Must run inside
    /// an actix system. Returns the supervisor and the live-owner registry.
    pub fn start(
        ledger: Arc<dyn Ledger>,
        factory: Arc<dyn RunnerFactory>,
        wake_factory: Option<Arc<dyn crate::wake::WakeFactory>>,
        children_arbiter: ArbiterHandle,
    ) -> Result<(Addr<Supervisor>, Owners), LedgerError> {
        Self::start_with(
            ledger,
            factory,
            wake_factory,
            children_arbiter,
            RestartPolicy::default(),
        )
    }

    /// As [`Supervisor::start`], with an explicit restart policy for owners and the coalescer.
    pub fn start_with(
        ledger: Arc<dyn Ledger>,
        factory: Arc<dyn RunnerFactory>,
        wake_factory: Option<Arc<dyn crate::wake::WakeFactory>>,
        children_arbiter: ArbiterHandle,
        policy: RestartPolicy,
    ) -> Result<(Addr<Supervisor>, Owners), LedgerError> {
        let engine = Engine::builder(ledger, factory, children_arbiter)
            .wake_factory(wake_factory)
            .build();
        let owners = engine.owners.clone();
        Ok((Self::start_engine(engine, policy)?, owners))
    }

    /// As [`Supervisor::start_with`], on an engine the caller built (its wake factory, event
    /// channels and commit window set); the caller keeps clones of what it needs of it.
    pub fn start_engine(engine: Engine, policy: RestartPolicy) -> Result<Addr<Supervisor>, LedgerError> {
        let ledger = engine.ledger.clone();
        // Sharing the ledger: only the sessions whose tenure this process took are served here
        // (the others' holders serve them), read after their tenures were taken, so that no
        // write of their last holder is missed (it landed before the take, or never).
        let taken: Option<std::collections::HashSet<String>> = match &engine.tenures {
            Some(tenures) => {
                // Told at once of every tenure it loses.
                let owners = engine.owners.clone();
                tenures.on_lost(Box::new(move |lost| {
                    for s in lost {
                        if let Some(owner) = owners.get(s) {
                            owner.do_send(super::owner::Moved);
                        }
                    }
                }));
                // Up to its fair share: a process joining others takes none of theirs (they
                // hand some over), one starting alone takes every session.
                let plan = balance::plan(&tenures.spread()?, tenures.held_count() as u64);
                let limit = usize::try_from(plan.take).unwrap_or(usize::MAX);
                Some(tenures.acquire_free(limit)?.into_iter().collect())
            }
            None => None,
        };
        let mut snapshot = match (&engine.tenures, taken) {
            (Some(tenures), Some(mut taken)) => {
                // Only their rows, all read at once (on PostgreSQL a few statements per table,
                // whatever their number): what the other processes serve is not read.
                let ids: Vec<String> = taken.iter().cloned().collect();
                let mut snapshot = ledger.load_sessions(&ids)?;
                // Their nest rows name the nested sessions' parents: known before the nested
                // sessions whose parent is served elsewhere are given back, so no call of theirs
                // is looked up one at a time.
                for nest in &snapshot.nests {
                    engine.add_nest(nest.clone());
                }
                adopt::give_back_nests_apart(&engine, &**tenures, &mut taken)?;
                for id in &ids {
                    if !taken.contains(id) {
                        engine.nests.remove(id);
                    }
                }
                // The rows read are of `ids` alone: sifted only when some were given back.
                if taken.len() < ids.len() {
                    keep_sessions(&mut snapshot, &taken);
                }
                tracing::info!(
                    node = tenures.node(),
                    sessions = taken.len(),
                    "session tenures taken at start"
                );
                snapshot
            }
            _ => ledger.load()?,
        };
        for nest in std::mem::take(&mut snapshot.nests) {
            engine.add_nest(nest);
        }
        let claim_ids = claim_keys(&snapshot.claims);
        let split = split_snapshot(snapshot);
        quarantine_rejects(&*ledger, &split.rejects)?;
        for row in &split.rebuilt_sessions {
            tracing::warn!(
                session = %row.session_id,
                next_set = row.next_set,
                "a session's row was missing; rebuilt from its calls with default settings"
            );
        }
        let mut recovered = Vec::new();
        let mut writes = Writes {
            sessions: split.rebuilt_sessions,
            remove_claims: claim_ids,
            ..Writes::default()
        };
        for (session, part) in split.sessions {
            let (owner, rows) = SessionOwner::recover(engine.clone(), session, part, Recovery::Process);
            writes.children.extend(rows);
            recovered.push(owner);
        }
        if !writes.is_empty() || !split.rejects.is_empty() {
            tracing::info!(
                children = writes.children.len(),
                claims = writes.remove_claims.len(),
                quarantined = split.rejects.len(),
                "recovery resolved rows from an earlier process"
            );
            ledger.write(&writes)?;
            ledger.flush()?;
            count_unknown(&engine, &writes.children);
        }
        end_orphaned_nests(&engine, &mut recovered);
        let sup = Supervisor {
            engine,
            budgets: RestartBudgets::new(policy),
            coalescer_budget: RestartBudget::new(policy),
            wakes: HashMap::new(),
            failed: HashMap::new(),
            recovered,
            restarting: Default::default(),
            adopting: HashMap::new(),
            sweeping: false,
            sweep_again: false,
            handing: 0,
            last_give: None,
            round_size: 0,
            round_declined: 0,
            declined_rounds: 0,
        };
        Ok(supervise::start(sup, tracing::info_span!("supervisor")))
    }

    fn spawn_owner(&mut self, owner: SessionOwner, ctx: &mut Context<Self>) -> Addr<SessionOwner> {
        let id = owner.session_id().to_string();
        let check_parent = owner.checks_parent();
        let span = tracing::info_span!("session_owner", session_id = %id);
        let (addr, exit): (_, futures::future::LocalBoxFuture<'static, Exit>) = match self.engine.routing_arbiter(&id) {
            Some(arbiter) => {
                let (addr, exit) = supervise::spawn_in(arbiter, span, move || owner);
                (addr, exit)
            }
            None => supervise::spawn(owner, span),
        };
        self.engine.owners.insert(id.clone(), addr.clone());
        if check_parent {
            // Now that an end of its child is told to this owner, it reads whether the child
            // ended before.
            addr.do_send(super::owner::CheckParent);
        }
        // Watched from a task of its own: a future per session parked in this context would
        // be polled on every message the supervisor handles.
        let me = ctx.address().downgrade();
        let watched = addr.clone();
        actix::spawn(async move {
            let exit = exit.await;
            if let Some(me) = me.upgrade() {
                me.do_send(OwnerExited {
                    session_id: id,
                    owner: watched,
                    exit,
                });
            }
        });
        addr
    }

    fn spawn_coalescer(&mut self, ctx: &mut Context<Self>) {
        let (ledger, owners, window) = (
            self.engine.ledger.clone(),
            self.engine.owners.clone(),
            self.engine.commit_window,
        );
        let make = move || Coalescer::new(ledger, owners, window);
        let span = tracing::info_span!("coalescer");
        let (addr, exit): (_, futures::future::LocalBoxFuture<'static, Exit>) = match &self.engine.commit_arbiter {
            Some(arbiter) => {
                let (addr, exit) = supervise::spawn_in(arbiter, span, make);
                (addr, exit)
            }
            None => supervise::spawn(make(), span),
        };
        self.engine.set_coalescer(Some(addr));
        exit.into_actor(self)
            .map(|exit, act, ctx| {
                let Exit::Panicked(msg) = exit else { return };
                tracing::error!("coalescer panicked: {msg}");
                if !super::running(ctx) {
                    return;
                }
                if act.coalescer_budget.on_failure(Instant::now()) == Decision::Escalate {
                    tracing::error!("the coalescer keeps failing; stopping the engine (nothing unrecorded was reported as recorded)");
                    act.engine.set_coalescer(None);
                    System::current().stop_with_code(1);
                    return;
                }
                act.spawn_coalescer(ctx);
            })
            .spawn(ctx);
    }
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.spawn_coalescer(ctx);
        for owner in std::mem::take(&mut self.recovered) {
            self.spawn_owner(owner, ctx);
        }
        // Retention reads off every actor's thread and removes through the owners.
        actix::spawn(tracing::Instrument::instrument(
            super::sweeper::run(self.engine.clone()),
            tracing::info_span!("sweeper"),
        ));
        if let Some(tenures) = &self.engine.tenures {
            let every = (tenures.ttl() / 4).min(std::time::Duration::from_secs(1));
            ctx.run_interval(every, |act, ctx| act.sweep(ctx));
            if let Some(mut freed) = tenures.freed() {
                // Another process gave tenures back: looked at now, not at the next turn.
                let me = ctx.address().downgrade();
                actix::spawn(async move {
                    while freed.changed().await.is_ok() {
                        match me.upgrade() {
                            Some(me) => me.do_send(adopt::SweepNow),
                            None => return,
                        }
                    }
                });
            }
        }
    }
}

impl Handler<OpenSession> for Supervisor {
    type Result = futures::future::LocalBoxFuture<'static, Result<(Addr<SessionOwner>, SessionInfo), BroodError>>;

    fn handle(&mut self, msg: OpenSession, ctx: &mut Context<Self>) -> Self::Result {
        if let Err(e) = validate_session_id(&msg.session_id).and_then(|()| msg.settings.validate()) {
            return Box::pin(async { Err(e.into()) });
        }
        if let Some(reason) = self.failed.get(&msg.session_id) {
            let e = BroodError::SessionFailed {
                session: msg.session_id.clone(),
                reason: reason.clone(),
            };
            return Box::pin(async move { Err(e) });
        }
        type Found = futures::future::LocalBoxFuture<'static, Result<Addr<SessionOwner>, BroodError>>;
        let addr: Found = match self.engine.owner(&msg.session_id) {
            Some(addr) => Box::pin(futures::future::ready(Ok(addr))),
            None => {
                // Not routed here: new (on a ledger of its own, every stored session is routed),
                // or, on a shared one, maybe stored (adopting it checks the new rule only when
                // it is not).
                if self.engine.tenures.is_none() {
                    if let Err(e) = validate_new_session_id(&msg.session_id) {
                        return Box::pin(async { Err(e.into()) });
                    }
                }
                let row = SessionRow {
                    session_id: msg.session_id.clone(),
                    max_concurrent_children: msg.settings.max_concurrent_children.unwrap_or(msg.defaults.0),
                    max_delivery_attempts: msg.settings.max_delivery_attempts.unwrap_or(msg.defaults.1),
                    next_set: 1,
                    created_at_ms: now_ms(),
                    addressable: msg.settings.addressable.unwrap_or(false),
                };
                let nest = match nest_of(&self.engine, &msg.session_id) {
                    Ok(nest) => nest,
                    Err(e) => return Box::pin(async move { Err(e) }),
                };
                if self.engine.tenures.is_some() {
                    // Shared: the session may be stored already, served elsewhere, or new.
                    Box::pin(self.adopt(msg.session_id.clone(), Some((row, nest)), ctx))
                } else {
                    if let Err(e) = store_session(&*self.engine.ledger, &row, &nest) {
                        return Box::pin(async move { Err(e.into()) });
                    }
                    if let Some(nest) = nest {
                        self.engine.add_nest(nest);
                    }
                    let owner = self.spawn_owner(SessionOwner::new(self.engine.clone(), row), ctx);
                    Box::pin(futures::future::ready(Ok(owner)))
                }
            }
        };
        if let Some(w) = &msg.settings.wake {
            self.wakes.insert(msg.session_id.clone(), w.clone());
        }
        let configure = Configure(msg.settings);
        Box::pin(async move {
            let addr = addr.await?;
            let info = addr.send(configure).await.map_err(|_| BroodError::Stopped)??;
            Ok((addr, info))
        })
    }
}

/// Writes a new session's row (and its nest row) durably; on failure takes them back (a later
/// flush must not make them real): not durable, so not opened.
fn store_session(ledger: &dyn Ledger, row: &SessionRow, nest: &Option<NestRow>) -> Result<(), LedgerError> {
    let writes = Writes {
        sessions: vec![row.clone()],
        nests: nest.iter().cloned().collect(),
        ..Writes::default()
    };
    let stored = ledger.write(&writes).and_then(|_| ledger.flush().map(|_| ()));
    if stored.is_err() {
        let _ = ledger.write(&Writes {
            remove_sessions: vec![row.session_id.clone()],
            remove_nests: nest.iter().map(|n| n.session_id.clone()).collect(),
            ..Writes::default()
        });
    }
    stored
}

/// The nest row of a new session whose id names a child (`deleg_<hex>.<index>`): its parent's
/// session and its depth. A child id no call has is refused; any other id is a top-level
/// session.
fn nest_of(engine: &Engine, session_id: &str) -> Result<Option<NestRow>, BroodError> {
    let Some((call_id, task)) = nest_parent(session_id) else {
        return Ok(None);
    };
    let live = engine.calls.get(call_id).map(|s| s.value().clone());
    let call = match live {
        Some(session) => engine.ledger.call(&session, call_id)?,
        None => engine.ledger.find_call(call_id)?,
    };
    let Some(call) = call.filter(|c| (task as usize) < c.tasks.len()) else {
        return Err(BroodError::UnknownTarget {
            kind: "child",
            id: session_id.to_string(),
        });
    };
    Ok(Some(NestRow {
        session_id: session_id.to_string(),
        depth: engine.depth(&call.session_id).saturating_add(1),
        parent_session_id: call.session_id,
        created_at_ms: now_ms(),
    }))
}

/// A session owner's task ended.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct OwnerExited {
    session_id: String,
    owner: Addr<SessionOwner>,
    exit: Exit,
}

impl Handler<OwnerExited> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: OwnerExited, ctx: &mut Context<Self>) {
        // Only the current owner's end matters; an older one was replaced already.
        let current = self.engine.owner(&msg.session_id).is_some_and(|a| a == msg.owner);
        if current {
            self.owner_exited(msg.session_id, msg.exit, ctx);
        }
    }
}

impl Handler<GetOwner> for Supervisor {
    type Result = futures::future::LocalBoxFuture<'static, Result<Addr<SessionOwner>, BroodError>>;

    fn handle(&mut self, GetOwner(id): GetOwner, ctx: &mut Context<Self>) -> Self::Result {
        if let Some(reason) = self.failed.get(&id) {
            let e = BroodError::SessionFailed {
                session: id,
                reason: reason.clone(),
            };
            return Box::pin(futures::future::ready(Err(e)));
        }
        match self.engine.owner(&id) {
            Some(addr) => Box::pin(futures::future::ready(Ok(addr))),
            // Shared: served elsewhere a moment ago, or stored and served elsewhere, or free
            // to take up here.
            None if self.engine.tenures.is_some() => match self.engine.holders.get(&id, Instant::now()) {
                Some(address) => {
                    let e = BroodError::Moved { address, session: id };
                    Box::pin(futures::future::ready(Err(e)))
                }
                None => Box::pin(self.adopt(id, None, ctx)),
            },
            None => Box::pin(futures::future::ready(Err(BroodError::UnknownSession(id)))),
        }
    }
}

impl Handler<RestartOwner> for Supervisor {
    type Result = Result<(), BroodError>;

    fn handle(&mut self, RestartOwner(id): RestartOwner, _: &mut Context<Self>) -> Self::Result {
        if let Some(reason) = self.failed.get(&id) {
            return Err(BroodError::SessionFailed {
                session: id,
                reason: reason.clone(),
            });
        }
        let owner = self
            .engine
            .owner(&id)
            .ok_or_else(|| BroodError::UnknownSession(id.clone()))?;
        if self.restarting.insert(id) {
            owner.do_send(super::owner::Retire);
        }
        Ok(())
    }
}

impl Handler<GetHealth> for Supervisor {
    type Result = Result<Health, BroodError>;

    fn handle(&mut self, _: GetHealth, _: &mut Context<Self>) -> Self::Result {
        match self.engine.coalescer() {
            Some(c) if c.connected() => Ok(Health {
                sessions: self.engine.owners.len(),
                failed_sessions: self.failed.len(),
            }),
            _ => Err(BroodError::Stopped),
        }
    }
}

impl Handler<GetDeadLetters> for Supervisor {
    type Result = Result<Vec<DeadLetterRow>, BroodError>;

    fn handle(&mut self, _: GetDeadLetters, _: &mut Context<Self>) -> Self::Result {
        Ok(self.engine.ledger.dead_letters()?)
    }
}
