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
//! It does not route anything itself. On a ledger shared with other processes it also sweeps
//! for free session tenures and balances the sessions with the other processes (`adopt`,
//! `balance`, `handover`), and remembers who serves the sessions it does not (the engine's [`super::holders`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_rt::ArbiterHandle;

use super::coalescer::Coalescer;
use super::owner::{Configure, SessionInfo, SessionOwner};
use super::supervise::{self, Decision, Exit, RestartBudget, RestartBudgets, RestartPolicy};
use super::{Engine, Owners};
use crate::error::BroodError;
use crate::ledger::{Ledger, LedgerError, RowKey, Writes};
use crate::model::{
    nest_parent, now_ms, validate_new_session_id, validate_session_id, ChildRow, ChildStatus, ClaimRow, DeadLetterRow,
    NestRow, SessionRow, SessionSettings,
};
use crate::recovery::{split_snapshot, Recovery, Reject};
use crate::runner::RunnerFactory;
use crate::wake::Wake;

mod adopt;
mod balance;
mod handover;

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

/// How long a session owner whose rebuild failed waits before the next attempt.
const REBUILD_RETRY: Duration = Duration::from_millis(50);

/// The longest wait between rebuilds of an owner that fail because the ledger does not answer.
const REBUILD_RETRY_MOST: Duration = Duration::from_secs(2);

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
                keep_sessions(&mut snapshot, &taken);
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

    fn owner_exited(&mut self, id: String, exit: Exit, ctx: &mut Context<Self>) {
        let asked = self.restarting.remove(&id);
        let msg = match exit {
            Exit::Panicked(msg) => {
                tracing::error!(session = %id, "session owner panicked: {msg}");
                if !super::running(ctx) {
                    return; // the engine is stopping: nothing to restart
                }
                let decision = self.budgets.on_failure(&id, Instant::now());
                if decision == Decision::Escalate {
                    tracing::error!(session = %id, "session owner keeps failing; the session is given up");
                    self.engine.owners.remove(&id);
                    self.engine.forget_share(&id);
                    self.failed.insert(id, msg);
                    return;
                }
                msg
            }
            Exit::Stopped if asked && super::running(ctx) => "a restart was asked for".to_string(),
            Exit::Stopped => {
                self.engine.owners.remove(&id);
                return;
            }
        };
        self.rebuild(id, msg, ctx);
    }

    /// Rebuilds session `id`'s owner from the ledger (its old one ended as `msg` says). A
    /// rebuild that fails on an error of the ledger's storage (its database out of reach, as
    /// during a failover; a disk's I/O error) is tried again, `wait` later, then twice as long each time up
    /// to [`REBUILD_RETRY_MOST`], for as long as it takes: an outage of the database gives no
    /// session up. Any other failure is a failure of the owner like a panic: tried again within
    /// the restart budget, the session given up past it.
    fn rebuild(&mut self, id: String, msg: String, ctx: &mut Context<Self>) {
        self.rebuild_after(id, msg, REBUILD_RETRY, ctx);
    }

    fn rebuild_after(&mut self, id: String, msg: String, wait: Duration, ctx: &mut Context<Self>) {
        // Rebuilt on a thread of its own at a lower priority: its reads, flushes and planning
        // block neither this actor's thread nor, on a machine with few cores, the threads that
        // route the other sessions. Requests to the session meanwhile are answered as
        // interrupted (its old owner is gone), as they are while any owner restarts.
        let (engine, wake, session) = (self.engine.clone(), self.wakes.get(&id).cloned(), id.clone());
        let (tx, rx) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new().name("brood-rebuild".into()).spawn(move || {
            lower_this_threads_priority();
            let _ = tx.send(rebuild_owner(&engine, &session, wake));
        });
        if let Err(e) = spawned {
            tracing::error!(session = %id, "no thread to rebuild the session owner on: {e}");
            self.engine.owners.remove(&id);
            self.failed
                .insert(id, format!("{msg}; no thread to rebuild its owner on: {e}"));
            return;
        }
        rx.into_actor(self)
            .map(move |rebuilt, act, ctx| {
                let rebuilt = rebuilt.unwrap_or_else(|_| Err(LedgerError::storage_msg("the rebuild panicked")));
                match rebuilt {
                    Ok(_) if !super::running(ctx) => {} // the engine is stopping
                    // Its tenure went to another process while it was rebuilt (the outage it
                    // waited out outlasted the tenure): not served here. The next request looks
                    // the session up again and learns where it is served.
                    Ok((owner, _)) if act.engine.tenures.as_ref().is_some_and(|t| !t.holds(&id)) => {
                        owner.stop_running_children();
                        act.engine.owners.remove(&id);
                        act.engine.forget_share(&id);
                        act.engine.supersede(&id);
                        tracing::warn!(session = %id, "session owner rebuilt after its tenure went to another process; not served here");
                    }
                    // Its tenure went to another process and came back while it was rebuilt (the
                    // other may have written meanwhile): what it read is not served; read again.
                    Ok((_, epoch)) if held_epoch(&act.engine, &id) != epoch => {
                        tracing::info!(session = %id, "the session's tenure changed hands while its owner was rebuilt; rebuilding it again");
                        act.rebuild_after(id, msg, REBUILD_RETRY, ctx);
                    }
                    Ok((owner, _)) => {
                        act.spawn_owner(owner, ctx);
                        tracing::info!(session = %id, "session owner restarted from the ledger");
                    }
                    Err(e @ LedgerError::Storage { source: Some(_), .. }) if super::running(ctx) => {
                        tracing::warn!(session = %id, retry_in = ?wait, "session owner could not be rebuilt: the ledger did not answer; trying again: {e}");
                        let next = (wait * 2).min(REBUILD_RETRY_MOST);
                        ctx.run_later(wait, move |act, ctx| act.rebuild_after(id, msg, next, ctx));
                    }
                    Err(e)
                        if super::running(ctx) && act.budgets.on_failure(&id, Instant::now()) == Decision::Restart =>
                    {
                        tracing::warn!(session = %id, "session owner could not be rebuilt; trying again: {e}");
                        ctx.run_later(REBUILD_RETRY, move |act, ctx| act.rebuild(id, msg, ctx));
                    }
                    Err(e) => {
                        tracing::error!(session = %id, "session owner could not be rebuilt: {e}");
                        act.engine.owners.remove(&id);
                        act.failed
                            .insert(id, format!("{msg}; rebuilding from the ledger failed: {e}"));
                    }
                }
            })
            .spawn(ctx);
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

/// Leaves in `snapshot` only the rows of `sessions` (the damaged children of their calls).
fn keep_sessions(snapshot: &mut crate::ledger::Snapshot, sessions: &std::collections::HashSet<String>) {
    let ours = |s: &String| sessions.contains(s);
    snapshot.sessions.retain(|r| ours(&r.session_id));
    snapshot.calls.retain(|r| ours(&r.session_id));
    snapshot.children.retain(|r| ours(&r.session_id));
    snapshot.claims.retain(|r| ours(&r.session_id));
    snapshot.starts.retain(|r| ours(&r.session_id));
    snapshot.wakes.retain(|r| ours(&r.session_id));
    snapshot.nests.retain(|r| ours(&r.session_id));
    let calls: std::collections::HashSet<&str> = snapshot.calls.iter().map(|c| c.call_id.as_str()).collect();
    snapshot
        .damaged_children
        .retain(|id| id.rsplit_once('.').is_some_and(|(call, _)| calls.contains(call)));
}

/// Moves aside the rows recovery found inconsistent with the rest.
fn quarantine_rejects(ledger: &dyn Ledger, rejects: &[Reject]) -> Result<(), LedgerError> {
    for r in rejects {
        ledger.quarantine(r.tree, &r.session_id, &r.key, &r.reason)?;
    }
    Ok(())
}

/// The keys of claim rows, to remove them.
fn claim_keys(claims: &[ClaimRow]) -> Vec<RowKey> {
    claims
        .iter()
        .map(|c| RowKey::new(c.session_id.clone(), c.claim_id.clone()))
        .collect()
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

/// Marks the recovered owners of nested sessions whose child has ended (while no process ran,
/// or before its end reached them: a crash in between): each cancels its unfinished calls as it
/// starts, before it admits anything, and takes no more.
fn end_orphaned_nests(engine: &Engine, owners: &mut [SessionOwner]) {
    let index: HashMap<String, usize> = owners
        .iter()
        .enumerate()
        .map(|(i, o)| (o.session_id().to_string(), i))
        .collect();
    let mut ended = Vec::new();
    for nest in engine.nests() {
        let Some(&me) = index.get(&nest.session_id) else {
            continue;
        };
        let Some((call_id, task)) = nest_parent(&nest.session_id) else {
            continue;
        };
        let Some(&parent) = index.get(&nest.parent_session_id) else {
            // Shared: the parent is served by another process, whose child may still run.
            if engine.tenures.is_none() {
                ended.push(me);
            }
            continue;
        };
        let state = owners[parent].child_status(call_id, task);
        if state.is_none_or(|s| s.is_terminal()) {
            ended.push(me);
        }
    }
    for i in ended {
        let reason = crate::model::parent_ended_reason(owners[i].session_id());
        owners[i].end_nested_when_started(reason);
    }
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

/// Reads one session back from the ledger for an in-process owner restart: its own rows
/// only (they are one key range), so the rebuild costs what the session holds, whatever
/// the rest of the ledger holds. The ledger is flushed first, so the rebuilt owner
/// publishes nothing that is not durable (I1).
fn rebuild_owner(
    engine: &Engine,
    id: &str,
    wake: Option<Arc<dyn Wake>>,
) -> Result<(SessionOwner, Option<u64>), LedgerError> {
    crate::failpoints::hold("rebuild_hold");
    // The epoch of the tenure the rows are read under: should it change before the rebuilt
    // owner is served, another process may have written to the session since the read.
    let epoch = held_epoch(engine, id);
    // The dead owner's write in flight lands before the read below, or never.
    engine.supersede(id);
    engine.ledger.flush()?;
    let (mut owner, _) = recover_session(engine, id, Recovery::Owner)?
        .ok_or_else(|| LedgerError::storage_msg(format!("session `{id}` has no row")))?;
    if let Some(wake) = wake {
        owner.bind_wake(wake);
    }
    crate::failpoints::hold("rebuild_read_hold");
    Ok((owner, epoch))
}

/// The epoch at which this process holds session `id`'s tenure, when it shares the ledger and
/// holds it (known here: no read).
fn held_epoch(engine: &Engine, id: &str) -> Option<u64> {
    match engine.tenures.as_ref()?.holder(id) {
        Ok(Some(crate::ledger::TenureHolder::Here(epoch))) => Some(epoch),
        _ => None,
    }
}

/// Reads one session's own rows back and recovers its owner from them as `mode` says (its live
/// claims returned; what recovery resolved written and flushed), with its own nest row if it is
/// nested; none when the session has no row.
fn recover_session(
    engine: &Engine,
    id: &str,
    mode: Recovery,
) -> Result<Option<(SessionOwner, Option<NestRow>)>, LedgerError> {
    let mut snapshot = engine.ledger.load_session(id)?;
    let nest = snapshot.nests.pop();
    let split = split_snapshot(snapshot);
    quarantine_rejects(&*engine.ledger, &split.rejects)?;
    let Some((session, part)) = split.sessions.into_iter().find(|(s, _)| s.session_id == id) else {
        return Ok(None);
    };
    let claim_ids = claim_keys(&part.claims);
    let (owner, changed) = SessionOwner::recover(engine.clone(), session, part, mode);
    let writes = Writes {
        children: changed,
        remove_claims: claim_ids,
        ..Writes::default()
    };
    engine.ledger.write(&writes)?;
    // A child queued again must not read `running` after a crash (it would be `unknown`).
    engine.ledger.flush()?;
    count_unknown(engine, &writes.children);
    Ok(Some((owner, nest)))
}

/// Reads the top-level sessions `ids` (whose tenures this process just took) back all at once
/// — on PostgreSQL a few statements per table, whatever their number — and recovers each owner
/// as [`recover_session`] recovers one (as a restart of the process would: I6), with one write
/// and one flush for them all. The sessions stored are answered; an id missing from the answer
/// has no row any more.
fn recover_sessions(engine: &Engine, ids: &[String]) -> Result<Vec<SessionOwner>, LedgerError> {
    let mut snapshot = engine.ledger.load_sessions(ids)?;
    keep_sessions(&mut snapshot, &ids.iter().cloned().collect());
    for nest in std::mem::take(&mut snapshot.nests) {
        engine.add_nest(nest);
    }
    let claim_ids = claim_keys(&snapshot.claims);
    let split = split_snapshot(snapshot);
    quarantine_rejects(&*engine.ledger, &split.rejects)?;
    let mut writes = Writes {
        sessions: split.rebuilt_sessions,
        remove_claims: claim_ids,
        ..Writes::default()
    };
    let mut owners = Vec::with_capacity(split.sessions.len());
    for (session, part) in split.sessions {
        let (owner, rows) = SessionOwner::recover(engine.clone(), session, part, Recovery::Process);
        writes.children.extend(rows);
        owners.push(owner);
    }
    engine.ledger.write(&writes)?;
    // A child queued again must not read `running` after a crash (it would be `unknown`).
    engine.ledger.flush()?;
    count_unknown(engine, &writes.children);
    Ok(owners)
}

/// Counts the children recovery resolved `unknown` (their rows durable now) as ended: the
/// only way a child ends so. Rows it read as ended already, and marked recovered, are not
/// counted: their end was counted where it happened, or before this process started.
fn count_unknown(engine: &Engine, changed: &[ChildRow]) {
    let unknown = changed.iter().filter(|r| r.status == ChildStatus::Unknown).count();
    engine.counters.ended(ChildStatus::Unknown, unknown as u64);
}

/// Lowers the calling thread's scheduling priority (nice 10): background work yields the CPU
/// to routing. Linux applies `setpriority` to the one thread named by its id; elsewhere, or if
/// refused, the thread keeps its priority.
fn lower_this_threads_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid has no arguments and cannot fail; setpriority only reads its arguments.
        let refused = unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::setpriority(libc::PRIO_PROCESS, tid, 10) != 0
        };
        if refused {
            tracing::debug!("could not lower the rebuild thread's priority");
        }
    }
}
