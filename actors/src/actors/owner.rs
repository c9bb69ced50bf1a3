//! The SessionOwner actor: the routing reservation of one session.
//!
//! Its mailbox serialises everything that decides who gets what: accepting calls (set ordinals,
//! dispatch rows), capacity admission, recording completions handed over by the coalescer,
//! boundaries (claims), acks, releases, lease expiries and wakes. The decisions themselves are
//! the pure types of [`crate::routing`]; this actor applies them to its state, writes the
//! ledger and answers. Rendering, wake I/O and runner work happen elsewhere.
//!
//! Lease expiries and backoffs share one timer: the router keeps the deadlines ordered and the
//! owner arms a single `run_later` for the earliest one (no polling, no re-queue spin).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::oneshot;

use super::supervise::{self, Decision, Exit, RestartBudgets, RestartPolicy};
use super::unit::{StartChild, Unit, UnitComplete};
use super::Engine;
use crate::ledger::LedgerError;
use crate::model::*;
use crate::recovery::{self, queued_child, Recovery, SessionSnapshot};
use crate::routing::{on_child_end, Capacity, ClaimError, Publish, ReleaseReason, Returned, Router, Turn, WakeState};
use crate::runner::RunnerFactory;
use crate::wake::{Wake, WakeEvent, WakeTarget};

/// What the owner refuses, and why. A refused request changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    /// The request is malformed; `field` names what is wrong.
    #[error("invalid `{field}`: {message}")]
    Invalid {
        /// The offending field, as a path (`tasks[2].runner.kind`).
        field: String,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The ack or release concerned a claim that is not live.
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// The ledger failed; nothing was reported as done.
    #[error("ledger: {0}")]
    Ledger(String),
    /// The owner stopped before answering.
    #[error("the session owner stopped before answering")]
    Stopped,
    /// The session's owner kept failing and was not restarted again (its supervisor gave up).
    #[error("session `{session}` failed and is no longer served: {reason}")]
    SessionFailed {
        /// The session.
        session: String,
        /// The last failure.
        reason: String,
    },
    /// No such session.
    #[error("unknown session `{0}`")]
    UnknownSession(String),
}

impl From<LedgerError> for OwnerError {
    fn from(e: LedgerError) -> Self {
        OwnerError::Ledger(e.to_string())
    }
}

/// A task as submitted, before validation.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSpec {
    /// What the child should do; not empty.
    pub goal: String,
    /// The runner spec: a JSON object with a `kind` the runner factory knows.
    pub runner: serde_json::Value,
    /// Tasks sharing a group form one completion unit.
    pub group: Option<String>,
    /// Per-task timeout in ms (> 0).
    pub timeout_ms: Option<u64>,
    /// Stall timeout in ms (> 0); default 450000.
    pub stall_ms: Option<u64>,
    /// Whether recovery may re-run the task when it was running at a crash.
    pub rerun_on_recovery: bool,
}

impl TaskSpec {
    /// A task with defaults for everything but the goal and runner.
    pub fn new(goal: impl Into<String>, runner: serde_json::Value) -> Self {
        TaskSpec {
            goal: goal.into(),
            runner,
            group: None,
            timeout_ms: None,
            stall_ms: None,
            rerun_on_recovery: false,
        }
    }
}

/// One delegate request.
#[derive(Debug, Clone, PartialEq)]
pub struct DelegateRequest {
    /// The tasks; not empty.
    pub tasks: Vec<TaskSpec>,
    /// Background (default) or sync.
    pub mode: Mode,
    /// Whether each ungrouped task is its own unit.
    pub independent_completions: bool,
}

/// Checks a request and turns it into stored tasks. Changes nothing.
pub fn validate(req: &DelegateRequest, factory: &dyn RunnerFactory) -> Result<Vec<Task>, OwnerError> {
    let invalid = |field: String, message: String| OwnerError::Invalid { field, message };
    if req.tasks.is_empty() {
        return Err(invalid("tasks".into(), "must hold at least one task".into()));
    }
    if req.tasks.len() > u32::MAX as usize {
        return Err(invalid("tasks".into(), "too many tasks".into()));
    }
    let mut out = Vec::with_capacity(req.tasks.len());
    for (i, t) in req.tasks.iter().enumerate() {
        if t.goal.trim().is_empty() {
            return Err(invalid(format!("tasks[{i}].goal"), "must not be empty".into()));
        }
        if !t.runner.is_object() {
            return Err(invalid(
                format!("tasks[{i}].runner"),
                "must be an object with a `kind`".into(),
            ));
        }
        factory
            .validate(&t.runner)
            .map_err(|m| invalid(format!("tasks[{i}].runner"), m))?;
        if let Some(g) = &t.group {
            if g.trim().is_empty() {
                return Err(invalid(
                    format!("tasks[{i}].group"),
                    "must not be empty when given".into(),
                ));
            }
        }
        if t.timeout_ms == Some(0) {
            return Err(invalid(
                format!("tasks[{i}].timeout_ms"),
                "must be greater than 0".into(),
            ));
        }
        if t.stall_ms == Some(0) {
            return Err(invalid(format!("tasks[{i}].stall_ms"), "must be greater than 0".into()));
        }
        out.push(Task {
            goal: t.goal.clone(),
            runner_json: t.runner.to_string(),
            group: t.group.clone(),
            timeout_ms: t.timeout_ms,
            stall_ms: t.stall_ms.unwrap_or(DEFAULT_STALL_MS),
            rerun_on_recovery: t.rerun_on_recovery,
        });
    }
    Ok(out)
}

/// Accept a call.
#[derive(Debug, Message)]
#[rtype(result = "Result<Delegated, OwnerError>")]
pub struct Delegate(pub DelegateRequest);

/// What an accepted call answers.
#[derive(Debug, Clone)]
pub enum Delegated {
    /// Running in the background; results come at boundaries.
    Background {
        /// The call id.
        call_id: String,
        /// Its set ordinal.
        set: u64,
        /// Its units.
        units: Vec<UnitRow>,
    },
    /// Ran synchronously; the results are here and count as delivered.
    Sync {
        /// The call id.
        call_id: String,
        /// Its set ordinal.
        set: u64,
        /// Its units.
        units: Vec<UnitRow>,
        /// Why a background call was forced to sync, if it was.
        forced_sync_reason: Option<String>,
        /// Every child's result.
        results: Vec<ReadyItem>,
    },
}

/// Terminal rows, flushed by the coalescer, for the owner to record and publish.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Recorded {
    /// The rows.
    pub rows: Vec<ChildRow>,
}

/// A turn boundary: claim everything ready, or nothing.
#[derive(Debug, Message)]
#[rtype(result = "Result<Option<Claimed>, OwnerError>")]
pub struct Boundary {
    /// Who claims.
    pub consumer: String,
    /// Lease length in ms.
    pub lease_ms: u64,
}

/// The items of one claim (an envelope before rendering).
#[derive(Debug, Clone)]
pub struct Claimed {
    /// The claim id.
    pub claim_id: String,
    /// The consumer that holds it.
    pub consumer: String,
    /// When the lease runs out.
    pub lease_expires_at_ms: u64,
    /// The items, ordered by set, unit, task, kind.
    pub items: Vec<ReadyItem>,
}

/// Acknowledge a claim.
#[derive(Debug, Message)]
#[rtype(result = "Result<usize, OwnerError>")]
pub struct Ack {
    /// The claim.
    pub claim_id: String,
}

/// Hand a claim back.
#[derive(Debug, Message)]
#[rtype(result = "Result<(), OwnerError>")]
pub struct Release {
    /// The claim.
    pub claim_id: String,
    /// Busy or failed.
    pub reason: ReleaseReason,
    /// Least time before the items are ready again.
    pub retry_after_ms: u64,
}

/// Change the session's turn state.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct SetTurn(pub Turn);

/// Settings of a session; unset fields keep their current (or default) value.
#[derive(Clone, Default)]
pub struct SessionSettings {
    /// Running children at most (default 8).
    pub max_concurrent_children: Option<u32>,
    /// Delivery attempts before dead-lettering (default 8).
    pub max_delivery_attempts: Option<u32>,
    /// The wake target; binding one makes the session wake-capable.
    pub wake: Option<Arc<dyn Wake>>,
}

impl std::fmt::Debug for SessionSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionSettings")
            .field("max_concurrent_children", &self.max_concurrent_children)
            .field("max_delivery_attempts", &self.max_delivery_attempts)
            .field("wake", &self.wake.is_some())
            .finish()
    }
}

impl SessionSettings {
    /// Sets the capacity.
    pub fn max_concurrent_children(mut self, n: u32) -> Self {
        self.max_concurrent_children = Some(n);
        self
    }

    /// Sets the dead-letter limit.
    pub fn max_delivery_attempts(mut self, n: u32) -> Self {
        self.max_delivery_attempts = Some(n);
        self
    }

    /// Binds a wake target (an embedded callback).
    pub fn wake(mut self, wake: impl Wake) -> Self {
        self.wake = Some(Arc::new(wake));
        self
    }

    /// Refuses zero limits, naming the field.
    pub fn validate(&self) -> Result<(), OwnerError> {
        for (field, value) in [
            ("max_concurrent_children", self.max_concurrent_children),
            ("max_delivery_attempts", self.max_delivery_attempts),
        ] {
            if value == Some(0) {
                return Err(OwnerError::Invalid {
                    field: field.into(),
                    message: "must be at least 1".into(),
                });
            }
        }
        Ok(())
    }
}

/// Change a session's settings.
#[derive(Debug, Message)]
#[rtype(result = "Result<SessionInfo, OwnerError>")]
pub struct Configure(pub SessionSettings);

/// A session's settings and turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// The session id.
    pub session_id: String,
    /// Whether a wake target is bound.
    pub wake_capable: bool,
    /// Idle or busy.
    pub turn: Turn,
    /// Capacity.
    pub max_concurrent_children: u32,
    /// Dead-letter limit.
    pub max_delivery_attempts: u32,
}

/// Ask for the session's state; with `calls: false` only the counts (cheap: no rows copied).
#[derive(Debug, Message)]
#[rtype(result = "SessionStatus")]
pub struct Status {
    /// Whether to list the calls in memory with their units and children.
    pub calls: bool,
}

/// Counts and calls of a session.
#[derive(Debug, Clone)]
pub struct SessionStatus {
    /// Settings and turn.
    pub info: SessionInfo,
    /// Children waiting for capacity.
    pub queued: usize,
    /// Children running.
    pub running: usize,
    /// Items ready (or backing off).
    pub ready: usize,
    /// Items in live claims.
    pub claimed: usize,
    /// Items delivered (acked or returned inline).
    pub delivered: u64,
    /// Calls still in memory (not yet fully delivered), by set.
    pub calls: Vec<CallStatus>,
}

/// One call of a session's status.
#[derive(Debug, Clone)]
pub struct CallStatus {
    /// The call row.
    pub call: CallRow,
    /// Its units.
    pub units: Vec<UnitRow>,
    /// Its children, by task index.
    pub children: Vec<ChildRow>,
}

struct CallState {
    row: CallRow,
    units: Vec<String>,
    incomplete_units: usize,
    /// The caller of a sync call, until its results are handed over.
    sync_reply: Option<SyncWaiter>,
    /// Sync results were handed over and await the caller's receipt (then they are delivered).
    awaiting_receipt: bool,
}

struct SyncWaiter {
    tx: oneshot::Sender<Result<Delegated, OwnerError>>,
    units: Vec<UnitRow>,
    forced_sync_reason: Option<String>,
}

/// How long sync results wait for the caller's receipt before they go out at boundaries.
const SYNC_RECEIPT_WAIT: Duration = Duration::from_secs(3);

struct UnitState {
    row: UnitRow,
    terminal: usize,
    complete: bool,
    addr: Option<Addr<Unit>>,
    recorded_before_exit: Option<u32>,
}

/// A claim id that names its session: `clm_<session as hex>_<random>`.
pub fn new_claim_id(session_id: &str) -> String {
    let hex: String = session_id.bytes().map(|b| format!("{b:02x}")).collect();
    format!("clm_{hex}_{}", random_hex())
}

/// The session a claim id names, if it is one of ours.
pub fn claim_session(claim_id: &str) -> Option<String> {
    let rest = claim_id.strip_prefix("clm_")?;
    let (hex, _) = rest.rsplit_once('_')?;
    if hex.len() % 2 != 0 {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// The k of a unit id `<call>-<k>` (0 when it has none).
fn unit_ordinal(unit_id: &str) -> u64 {
    unit_id.rsplit_once('-').and_then(|(_, k)| k.parse().ok()).unwrap_or(0)
}

/// The routing reservation of one session.
pub struct SessionOwner {
    engine: Engine,
    session: SessionRow,
    wake: Option<WakeTarget>,
    wake_state: WakeState,
    calls: HashMap<String, CallState>,
    units: HashMap<String, UnitState>,
    children: HashMap<String, ChildRow>,
    capacity: Capacity<String>,
    router: Router<String>,
    timer: Option<(u64, SpawnHandle)>,
    delivered_done: u64,
    unit_budgets: RestartBudgets,
    /// Acks whose flush is in flight, with repeated acks of the same claim waiting for it.
    acking: HashMap<String, Vec<oneshot::Sender<Result<usize, OwnerError>>>>,
    /// Durable writes in flight besides acks (dead letters, sync receipts).
    pending_writes: usize,
    /// Calls whose collection waited for writes in flight.
    gc_deferred: BTreeSet<String>,
}

impl std::fmt::Debug for SessionOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionOwner")
            .field("session", &self.session.session_id)
            .field("calls", &self.calls.len())
            .field("running", &self.capacity.running())
            .finish()
    }
}

impl SessionOwner {
    /// A fresh owner for a session with nothing in flight.
    pub fn new(engine: Engine, session: SessionRow) -> Self {
        let mut wake_state = WakeState::default();
        if let Some(turn) = engine.turns.get(&session.session_id) {
            wake_state.set_turn(*turn);
        }
        SessionOwner {
            capacity: Capacity::new(session.max_concurrent_children as usize),
            router: Router::new(session.max_delivery_attempts),
            engine,
            session,
            wake: None,
            wake_state,
            calls: HashMap::new(),
            units: HashMap::new(),
            children: HashMap::new(),
            timer: None,
            delivered_done: 0,
            unit_budgets: RestartBudgets::new(RestartPolicy::default()),
            acking: HashMap::new(),
            pending_writes: 0,
            gc_deferred: BTreeSet::new(),
        }
    }

    /// Rebuilds an owner from what an earlier process (or an earlier owner) left in the
    /// ledger, following [`recovery::plan`] (I6). Returns the rows recovery changed, for the
    /// caller to write.
    pub fn recover(
        engine: Engine,
        session: SessionRow,
        snapshot: &SessionSnapshot,
        mode: Recovery,
    ) -> (Self, Vec<ChildRow>) {
        let live = if mode == Recovery::Owner {
            engine.live_children()
        } else {
            Default::default()
        };
        let plan = recovery::plan(&session, snapshot, mode, &live, now_ms());
        let mut owner = SessionOwner::new(engine, session);
        owner.session.next_set = plan.next_set;
        owner.delivered_done = plan.delivered_done;
        for claim in plan.lost_claims {
            owner.router.remember_lost(claim);
        }
        for row in plan.children {
            owner.children.insert(row.child_id.clone(), row);
        }
        for id in plan.queue {
            owner.capacity.enqueue(id);
        }
        for id in plan.running {
            owner.capacity.mark_running(id);
        }
        for call in plan.calls {
            let unit_ids: Vec<String> = call.units.iter().map(|u| u.row.unit_id.clone()).collect();
            let incomplete = call.units.iter().filter(|u| !u.complete()).count();
            for unit in call.units {
                let complete = unit.complete();
                owner.units.insert(
                    unit.row.unit_id.clone(),
                    UnitState {
                        row: unit.row,
                        terminal: unit.terminal,
                        complete,
                        addr: None,
                        recorded_before_exit: unit.recorded_before_exit,
                    },
                );
            }
            owner.calls.insert(
                call.row.call_id.clone(),
                CallState {
                    row: call.row,
                    units: unit_ids,
                    incomplete_units: incomplete,
                    sync_reply: None,
                    awaiting_receipt: false,
                },
            );
        }
        for (key, attempts) in plan.ready {
            owner.router.publish(key, attempts);
        }
        (owner, plan.changed)
    }

    /// Binds a wake target (the session becomes wake-capable).
    pub fn bind_wake(&mut self, wake: Arc<dyn Wake>) {
        self.wake = Some(WakeTarget(wake));
    }

    /// The session this owner routes.
    pub fn session_id(&self) -> &str {
        &self.session.session_id
    }

    fn info(&self) -> SessionInfo {
        SessionInfo {
            session_id: self.session.session_id.clone(),
            wake_capable: self.wake.is_some(),
            turn: self.wake_state.turn(),
            max_concurrent_children: self.session.max_concurrent_children,
            max_delivery_attempts: self.session.max_delivery_attempts,
        }
    }

    fn register_call(&mut self, call: CallRow, units: Vec<UnitRow>, children: Vec<ChildRow>) {
        let unit_ids: Vec<String> = units.iter().map(|u| u.unit_id.clone()).collect();
        for unit in units {
            self.units.insert(
                unit.unit_id.clone(),
                UnitState {
                    row: unit,
                    terminal: 0,
                    complete: false,
                    addr: None,
                    recorded_before_exit: None,
                },
            );
        }
        for row in children {
            self.capacity.enqueue(row.child_id.clone());
            self.children.insert(row.child_id.clone(), row);
        }
        self.calls.insert(
            call.call_id.clone(),
            CallState {
                row: call,
                incomplete_units: unit_ids.len(),
                units: unit_ids,
                sync_reply: None,
                awaiting_receipt: false,
            },
        );
    }

    /// Starts the queued children capacity allows, marking them running.
    fn admit(&mut self, ctx: &mut Context<Self>) {
        if !super::running(ctx) {
            return;
        }
        let ids = self.capacity.admit();
        if ids.is_empty() {
            return;
        }
        let now = now_ms();
        let mut rows = Vec::with_capacity(ids.len());
        for id in &ids {
            if let Some(row) = self.children.get_mut(id) {
                row.status = ChildStatus::Running;
                row.started_at_ms = Some(now);
                rows.push(row.clone());
            }
        }
        // The running mark tells recovery "this one had started". A task that is safe to re-run
        // needs no flush for it (queued or running, recovery runs it again); one that is not
        // must not start before its mark is durable, or a crash would run it twice.
        let written = self.engine.ledger.put_children(&rows);
        let must_flush = rows.iter().any(|r| {
            self.calls
                .get(&r.call_id)
                .and_then(|c| c.row.tasks.get(r.task_index as usize))
                .is_some_and(|t| !t.rerun_on_recovery)
        });
        if !must_flush {
            if let Err(e) = written {
                tracing::warn!(session = %self.session.session_id, "writing running marks failed: {e}");
            }
            return self.start_children(rows, ctx);
        }
        let ledger = self.engine.ledger.clone();
        async move {
            written?;
            super::flush(ledger).await
        }
        .into_actor(self)
        .map(move |res, act, ctx| match res {
            Ok(_) => act.start_children(rows, ctx),
            Err(e) => {
                tracing::warn!(session = %act.session.session_id, "running marks not durable ({e}); the children wait");
                ctx.run_later(Duration::from_millis(100), move |act, ctx| {
                    for row in rows.iter().rev() {
                        act.requeue(&row.child_id, ctx);
                    }
                });
            }
        })
        .spawn(ctx);
    }

    /// Hands admitted children to their unit actors (starting a unit actor where needed).
    fn start_children(&mut self, rows: Vec<ChildRow>, ctx: &mut Context<Self>) {
        let me = ctx.address();
        for row in rows {
            let Some(call) = self.calls.get(&row.call_id) else {
                continue;
            };
            let Some(task) = call.row.tasks.get(row.task_index as usize).cloned() else {
                continue;
            };
            let Some(unit) = self.units.get_mut(&row.unit_id) else {
                continue;
            };
            let addr = match &unit.addr {
                Some(addr) if addr.connected() => addr.clone(),
                _ => {
                    let (row, engine, owner) = (unit.row.clone(), self.engine.clone(), me.clone());
                    let (addr, exit) =
                        supervise::spawn_in(&self.engine.children_arbiter, move || Unit::new(row, engine, owner));
                    // Watched from a task of its own, not from this context: an actix context
                    // polls every future it holds on every message, so thousands of watchers
                    // here would make each message cost O(units).
                    let unit_id = unit.row.unit_id.clone();
                    let owner = me.downgrade();
                    actix::spawn(async move {
                        if let exit @ Exit::Panicked(_) = exit.await {
                            if let Some(owner) = owner.upgrade() {
                                owner.do_send(UnitExited { unit_id, exit });
                            }
                        }
                    });
                    unit.addr = Some(addr.clone());
                    addr
                }
            };
            let child_id = row.child_id.clone();
            let owner = me.downgrade();
            actix::spawn(async move {
                if addr.send(StartChild { row, task }).await.is_err() {
                    // The unit died before starting the child: it never ran, so queue it again.
                    if let Some(owner) = owner.upgrade() {
                        owner.do_send(StartLost { child_id });
                    }
                }
            });
        }
    }

    /// A child whose start was lost goes back to the head of the queue.
    fn requeue(&mut self, child: &str, ctx: &mut Context<Self>) {
        let Some(row) = self.children.get_mut(child) else {
            return;
        };
        if row.status != ChildStatus::Running {
            return;
        }
        row.status = ChildStatus::Queued;
        row.started_at_ms = None;
        let row = row.clone();
        if let Err(e) = self.engine.ledger.put_children(std::slice::from_ref(&row)) {
            tracing::warn!(child, "writing a queued mark failed: {e}");
        }
        self.capacity.requeue_front(child.to_string());
        self.admit(ctx);
    }

    /// A unit actor's task ended. A panic restarts it (lazily, at the next start of one of its
    /// children) within the restart budget; past it, the failure escalates to this owner.
    fn unit_exited(&mut self, unit_id: &str, exit: Exit, ctx: &mut Context<Self>) {
        let Exit::Panicked(msg) = exit else { return };
        tracing::error!(unit = unit_id, "unit actor panicked: {msg}");
        let decision = self.unit_budgets.on_failure(unit_id, Instant::now());
        if decision == Decision::Escalate {
            panic!("unit {unit_id} keeps panicking ({msg}); escalating to its session owner's supervisor");
        }
        if let Some(unit) = self.units.get_mut(unit_id) {
            // Only forget the dead actor, not a replacement a requeue already started.
            if unit.addr.as_ref().is_some_and(|a| !a.connected()) {
                unit.addr = None;
            }
        }
        self.admit(ctx);
    }

    fn complete_unit(&mut self, unit_id: &str, ctx: &mut Context<Self>) {
        let Some(unit) = self.units.get_mut(unit_id) else {
            return;
        };
        if unit.complete {
            return;
        }
        unit.complete = true;
        if let Some(addr) = unit.addr.take() {
            addr.do_send(UnitComplete);
        }
        let call_id = unit.row.call_id.clone();
        let members: Vec<String> = unit.row.tasks.iter().map(|&i| child_id(&call_id, i)).collect();
        let Some(call) = self.calls.get_mut(&call_id) else {
            return;
        };
        call.incomplete_units = call.incomplete_units.saturating_sub(1);
        match call.row.mode {
            Mode::Background => {
                for id in members {
                    let attempts = self.children.get(&id).map(|r| r.result.failed_attempts).unwrap_or(0);
                    self.router.publish(dedup_key(&id, ItemKind::Result), attempts);
                }
            }
            Mode::Sync if call.incomplete_units == 0 => self.finish_sync(&call_id, ctx),
            Mode::Sync => {}
        }
    }

    /// Every unit of a sync call is complete: hand the results to the caller. They become
    /// delivered only when the caller's [`SyncReceived`] comes back; without it (the caller
    /// went away, or the owner died first) they go out at boundaries instead, never lost.
    fn finish_sync(&mut self, call_id: &str, ctx: &mut Context<Self>) {
        let Some(call) = self.calls.get_mut(call_id) else {
            return;
        };
        let set = call.row.set;
        let waiter = call.sync_reply.take();
        let items: Vec<ReadyItem> = (0..call.row.tasks.len() as u32)
            .filter_map(|i| self.item(&dedup_key(&child_id(call_id, i), ItemKind::Result), 1))
            .collect();
        if let Some(w) = waiter {
            let reply = Delegated::Sync {
                call_id: call_id.to_string(),
                set,
                units: w.units,
                forced_sync_reason: w.forced_sync_reason,
                results: items,
            };
            if w.tx.send(Ok(reply)).is_ok() {
                if let Some(c) = self.calls.get_mut(call_id) {
                    c.awaiting_receipt = true;
                }
                let call_id = call_id.to_string();
                ctx.run_later(SYNC_RECEIPT_WAIT, move |act, ctx| act.sync_unreceived(&call_id, ctx));
                return;
            }
        }
        self.sync_unreceived(call_id, ctx);
    }

    /// Sync results nobody confirmed: they go out at boundaries like a background call's.
    fn sync_unreceived(&mut self, call_id: &str, ctx: &mut Context<Self>) {
        let Some(call) = self.calls.get_mut(call_id) else {
            return;
        };
        if call.row.mode == Mode::Background {
            return;
        }
        call.row.mode = Mode::Background;
        call.awaiting_receipt = false;
        for i in 0..call.row.tasks.len() as u32 {
            let id = child_id(call_id, i);
            let Some(row) = self.children.get(&id) else { continue };
            if !row.result.delivered && !row.result.dead {
                self.router
                    .publish(dedup_key(&id, ItemKind::Result), row.result.failed_attempts);
            }
        }
        self.after_change(ctx);
    }

    /// Counts a durable write in flight (calls are not collected while one is).
    fn write_started(&mut self) {
        self.pending_writes += 1;
    }

    /// A durable write ended; collects the calls that waited for it.
    fn write_ended(&mut self) {
        self.pending_writes = self.pending_writes.saturating_sub(1);
        self.drain_deferred();
    }

    /// Collects the calls whose collection waited, once no write is in flight.
    fn drain_deferred(&mut self) {
        if self.pending_writes == 0 && self.acking.is_empty() {
            for c in std::mem::take(&mut self.gc_deferred) {
                self.gc_call(&c);
            }
        }
    }

    /// Builds the consumer's view of an item.
    fn item(&self, key: &str, delivery_attempt: u32) -> Option<ReadyItem> {
        let (child, kind) = parse_dedup_key(key)?;
        let row = self.children.get(child)?;
        let call = self.calls.get(&row.call_id)?;
        let unit = self.units.get(&row.unit_id)?;
        let task = call.row.tasks.get(row.task_index as usize)?;
        Some(ReadyItem {
            kind,
            dedup_key: key.to_string(),
            delivery_attempt,
            call_id: row.call_id.clone(),
            set: call.row.set,
            unit_id: row.unit_id.clone(),
            group: unit.row.group.clone(),
            child_id: row.child_id.clone(),
            task_index: row.task_index,
            of: call.row.tasks.len() as u32,
            unit_size: unit.row.tasks.len() as u32,
            status: row.status,
            goal: task.goal.clone(),
            summary: row.summary.clone(),
            error: row.error.clone(),
            recovered: row.recovered,
            finished_at_ms: row.finished_at_ms,
            recorded_before_exit: unit.recorded_before_exit,
        })
    }

    /// Writes what a release or expiry changed: attempt counts, and dead letters (flushed).
    fn persist_returned(&mut self, returned: Returned<String>, why: &str, ctx: &mut Context<Self>) {
        let mut touched: BTreeSet<String> = BTreeSet::new();
        for (key, attempts) in &returned.requeued {
            if let Some((child, kind)) = parse_dedup_key(key) {
                if let Some(row) = self.children.get_mut(child) {
                    row.delivery_mut(kind).failed_attempts = *attempts;
                    touched.insert(child.to_string());
                }
            }
        }
        let now = now_ms();
        let mut dead = Vec::new();
        for (key, attempts) in &returned.dead {
            if let Some((child, kind)) = parse_dedup_key(key) {
                if let Some(row) = self.children.get_mut(child) {
                    let d = row.delivery_mut(kind);
                    d.failed_attempts = *attempts;
                    d.dead = true;
                    touched.insert(child.to_string());
                    dead.push(DeadLetterRow {
                        dedup_key: key.clone(),
                        child_id: child.to_string(),
                        session_id: row.session_id.clone(),
                        call_id: row.call_id.clone(),
                        kind,
                        reason: why.to_string(),
                        attempts: *attempts,
                        dead_at_ms: now,
                    });
                }
            }
        }
        // Dead letters first: a crash may then leave a dead letter whose child row still says
        // "not dead" (it is delivered again, at-least-once), never a dead item without its row.
        let ledger = self.engine.ledger.clone();
        let dead_written = if dead.is_empty() {
            Ok(())
        } else {
            ledger.put_dead_letters(&dead)
        };
        let rows: Vec<ChildRow> = touched.iter().filter_map(|id| self.children.get(id).cloned()).collect();
        if let Err(e) = ledger.put_children(&rows) {
            tracing::warn!(session = %self.session.session_id, "writing delivery attempts failed: {e}");
        }
        if dead.is_empty() {
            return;
        }
        tracing::warn!(session = %self.session.session_id, items = dead.len(), "items moved to the dead-letter tree: {why}");
        self.write_started();
        async move {
            dead_written?;
            super::flush(ledger).await
        }
        .into_actor(self)
        .map(move |res, act, ctx| match res {
            Ok(_) => {
                act.gc_deferred.extend(dead.iter().map(|d| d.call_id.clone()));
                act.write_ended();
            }
            Err(e) => {
                // Not durably dead: back to the ready set, to be tried (and given up) again.
                tracing::error!(session = %act.session.session_id, "dead letters not recorded ({e}); the items stay ready");
                let mut rows = Vec::new();
                for d in &dead {
                    act.router.revive(&d.dedup_key);
                    if let Some(row) = act.children.get_mut(&d.child_id) {
                        row.delivery_mut(d.kind).dead = false;
                        rows.push(row.clone());
                    }
                }
                let keys: Vec<String> = dead.iter().map(|d| d.dedup_key.clone()).collect();
                let ledger = &act.engine.ledger;
                if let Err(undo) = ledger.remove_dead_letters(&keys).and_then(|_| ledger.put_children(&rows)) {
                    tracing::error!("reviving items whose dead letters failed: {undo}");
                }
                act.write_ended();
                act.after_change(ctx);
            }
        })
        .spawn(ctx);
    }

    /// Drops a call from memory once every item of it is delivered or dead.
    fn gc_call(&mut self, call_id: &str) {
        if !self.acking.is_empty() || self.pending_writes > 0 {
            // A write that fails must still find its rows: collect once writes settle.
            self.gc_deferred.insert(call_id.to_string());
            return;
        }
        let Some(call) = self.calls.get(call_id) else { return };
        if call.incomplete_units > 0 {
            return;
        }
        let ids: Vec<String> = (0..call.row.tasks.len() as u32).map(|i| child_id(call_id, i)).collect();
        let open = ids.iter().any(|id| {
            [ItemKind::Result, ItemKind::FailureNotice].iter().any(|&k| {
                let key = dedup_key(id, k);
                self.router.is_open(&key)
            }) || self
                .children
                .get(id)
                .is_some_and(|r| !r.result.delivered && !r.result.dead)
        });
        if open {
            return;
        }
        for id in &ids {
            if let Some(row) = self.children.remove(id) {
                self.delivered_done += row.result.delivered as u64 + row.notice.delivered as u64;
            }
            self.router.forget(&dedup_key(id, ItemKind::Result));
            self.router.forget(&dedup_key(id, ItemKind::FailureNotice));
        }
        if let Some(call) = self.calls.remove(call_id) {
            for u in call.units {
                self.units.remove(&u);
            }
        }
    }

    fn maybe_wake(&mut self) {
        let ready = self.router.ready_count(now_ms());
        if self.wake_state.decide(self.wake.is_some(), ready) {
            if let Some(WakeTarget(w)) = &self.wake {
                let w = w.clone();
                let event = WakeEvent {
                    session_id: self.session.session_id.clone(),
                    ready,
                };
                tracing::debug!(session = %event.session_id, ready, "waking session");
                actix::spawn(async move { w.wake(event) });
            }
        }
    }

    fn reschedule(&mut self, ctx: &mut Context<Self>) {
        let next = self.router.next_deadline();
        if self.timer.as_ref().map(|t| t.0) == next {
            return;
        }
        if let Some((_, handle)) = self.timer.take() {
            ctx.cancel_future(handle);
        }
        if let Some(at) = next {
            let delay = Duration::from_millis(at.saturating_sub(now_ms()));
            let handle = ctx.run_later(delay, |act, ctx| {
                act.timer = None;
                act.expire_due(ctx);
                act.after_change(ctx);
            });
            self.timer = Some((at, handle));
        }
    }

    /// Ends the claims whose lease ran out and readies backed-off items whose time came. Runs
    /// from the timer, and first thing in every claim handler, so a boundary or ack never acts
    /// on a lease that already ended.
    fn expire_due(&mut self, ctx: &mut Context<Self>) {
        for (claim_id, returned) in self.router.tick(now_ms()) {
            tracing::debug!(claim = %claim_id, "lease expired");
            self.persist_returned(returned, "lease expired on the last delivery attempt", ctx);
            if let Err(e) = self.engine.ledger.remove_claims(&[claim_id]) {
                tracing::warn!("forgetting an expired claim failed: {e}");
            }
        }
    }

    fn after_change(&mut self, ctx: &mut Context<Self>) {
        if !super::running(ctx) {
            return;
        }
        self.maybe_wake();
        self.reschedule(ctx);
    }

    fn fault_point(&self) {
        if crate::failpoints::fires("owner_handler") {
            panic!("injected fault: owner_handler (session {})", self.session.session_id);
        }
    }
}

impl Actor for SessionOwner {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        tracing::debug!(session = %self.session.session_id, calls = self.calls.len(), "session owner started");
        self.admit(ctx);
        self.after_change(ctx);
    }
}

impl Handler<Delegate> for SessionOwner {
    // Answered from outside this actor's context: a sync call waits for all its children, and
    // a future parked in the context would be polled on every message meanwhile.
    type Result = ResponseFuture<Result<Delegated, OwnerError>>;

    fn handle(&mut self, Delegate(req): Delegate, ctx: &mut Context<Self>) -> Self::Result {
        self.fault_point();
        let tasks = match validate(&req, &*self.engine.factory) {
            Ok(t) => t,
            Err(e) => return Box::pin(async { Err(e) }),
        };
        let (mode, forced_sync_reason) = match req.mode {
            Mode::Background if self.wake.is_none() => (
                Mode::Sync,
                Some(format!(
                    "session `{}` is not wake-capable (no wake target is bound), so a background result could never wake the parent; the call ran synchronously",
                    self.session.session_id
                )),
            ),
            m => (m, None),
        };
        let set = self.session.next_set;
        let call_id = new_call_id();
        let call = CallRow {
            call_id: call_id.clone(),
            session_id: self.session.session_id.clone(),
            set,
            mode,
            forced_sync_reason: forced_sync_reason.clone(),
            independent_completions: req.independent_completions,
            tasks,
            created_at_ms: now_ms(),
        };
        let units = plan_units(&call_id, &call.tasks, call.independent_completions);
        let mut children: Vec<ChildRow> = units
            .iter()
            .flat_map(|u| u.tasks.iter().map(|&i| queued_child(&call, u, i)))
            .collect();
        children.sort_by_key(|c| c.task_index);
        let mut session = self.session.clone();
        session.next_set = set + 1;
        if let Err(e) = self.engine.ledger.put_dispatch(&session, &call, &units) {
            return Box::pin(async { Err(e.into()) });
        }
        // The set is taken now, so a call accepted meanwhile gets the next one.
        self.session.next_set = set + 1;
        let ledger = self.engine.ledger.clone();
        let (tx, rx) = oneshot::channel();
        async move { super::flush(ledger).await }
            .into_actor(self)
            .map(move |flushed, act, ctx| {
                if let Err(e) = flushed {
                    // Refused, so it must not surface later: take its rows back out, durably.
                    let unit_ids: Vec<String> = units.iter().map(|u| u.unit_id.clone()).collect();
                    let child_ids: Vec<String> = children.iter().map(|c| c.child_id.clone()).collect();
                    let ledger = &act.engine.ledger;
                    if let Err(undo) = ledger
                        .remove_dispatch(&call_id, &unit_ids, &child_ids)
                        .and_then(|_| ledger.flush())
                    {
                        tracing::error!(call = %call_id, "removing a refused call's rows failed: {undo}");
                    }
                    let _ = tx.send(Err(OwnerError::from(e)));
                    return;
                }
                act.register_call(call, units.clone(), children);
                if mode == Mode::Sync {
                    if let Some(c) = act.calls.get_mut(&call_id) {
                        c.sync_reply = Some(SyncWaiter {
                            tx,
                            units,
                            forced_sync_reason,
                        });
                    }
                } else {
                    let _ = tx.send(Ok(Delegated::Background { call_id, set, units }));
                }
                act.admit(ctx);
            })
            .spawn(ctx);
        Box::pin(async move { rx.await.unwrap_or(Err(OwnerError::Stopped)) })
    }
}

/// The caller of a sync call received its results: now they count as delivered.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct SyncReceived {
    /// The sync call.
    pub call_id: String,
}

impl Handler<SyncReceived> for SessionOwner {
    type Result = ();

    fn handle(&mut self, msg: SyncReceived, ctx: &mut Context<Self>) {
        let Some(call) = self.calls.get_mut(&msg.call_id) else {
            return;
        };
        if !call.awaiting_receipt {
            return; // too late: they went out at boundaries (same dedup keys)
        }
        call.awaiting_receipt = false;
        let n = call.row.tasks.len() as u32;
        let mut rows = Vec::new();
        for i in 0..n {
            if let Some(row) = self.children.get_mut(&child_id(&msg.call_id, i)) {
                row.result.delivered = true;
                rows.push(row.clone());
            }
        }
        let ledger = self.engine.ledger.clone();
        let written = ledger.put_children(&rows);
        self.write_started();
        let call_id = msg.call_id;
        async move {
            written?;
            super::flush(ledger).await
        }
        .into_actor(self)
        .map(move |res, act, _| {
            match res {
                Ok(_) => {
                    act.gc_deferred.insert(call_id);
                }
                Err(e) => tracing::warn!(
                    call = %call_id,
                    "sync results were received but recording them as delivered failed ({e}); after a restart they are delivered again"
                ),
            }
            act.write_ended();
        })
        .spawn(ctx);
    }
}

impl Handler<Recorded> for SessionOwner {
    type Result = ();

    fn handle(&mut self, Recorded { rows }: Recorded, ctx: &mut Context<Self>) {
        self.fault_point();
        for row in rows {
            let Some(known) = self.children.get(&row.child_id) else {
                continue;
            };
            if known.status.is_terminal() {
                continue; // a retried hand-off of a result already recorded
            }
            self.capacity.finish(&row.child_id);
            let failed = row.status.is_failure();
            let unit_id = row.unit_id.clone();
            let child = row.child_id.clone();
            let mut row = row;
            // Delivery state is the owner's; the child's copy of it may be stale.
            row.result = known.result;
            row.notice = known.notice;
            self.children.insert(child.clone(), row);
            let Some(unit) = self.units.get_mut(&unit_id) else {
                continue;
            };
            unit.terminal += 1;
            let sync = self
                .calls
                .get(&unit.row.call_id)
                .is_some_and(|c| c.row.mode == Mode::Sync);
            match on_child_end(unit.terminal, unit.row.tasks.len(), failed) {
                Publish::UnitComplete => self.complete_unit(&unit_id, ctx),
                Publish::FailureNotice if !sync => {
                    self.router.publish(dedup_key(&child, ItemKind::FailureNotice), 0);
                }
                Publish::FailureNotice | Publish::Nothing => {}
            }
        }
        self.admit(ctx);
        self.after_change(ctx);
    }
}

impl Handler<Boundary> for SessionOwner {
    type Result = Result<Option<Claimed>, OwnerError>;

    fn handle(&mut self, msg: Boundary, ctx: &mut Context<Self>) -> Self::Result {
        self.fault_point();
        self.expire_due(ctx);
        let now = now_ms();
        self.wake_state.boundary();
        let claim_id = new_claim_id(&self.session.session_id);
        let Some(granted) = self.router.claim(now, claim_id, msg.lease_ms) else {
            self.after_change(ctx);
            return Ok(None);
        };
        let mut items: Vec<ReadyItem> = granted.items.iter().filter_map(|(k, a)| self.item(k, *a)).collect();
        items.sort_by_cached_key(|i| (i.set, unit_ordinal(&i.unit_id), i.task_index, i.kind));
        let row = ClaimRow {
            claim_id: granted.claim_id.clone(),
            session_id: self.session.session_id.clone(),
            consumer: msg.consumer.clone(),
            lease_expires_at_ms: granted.lease_expires_at_ms,
            items: granted.items.len() as u32,
        };
        // Cheap by design: a claim is returned at a crash anyway, so its row is not flushed.
        if let Err(e) = self.engine.ledger.put_claim(&row) {
            tracing::warn!(claim = %row.claim_id, "writing the claim row failed: {e}");
        }
        self.after_change(ctx);
        Ok(Some(Claimed {
            claim_id: granted.claim_id,
            consumer: msg.consumer,
            lease_expires_at_ms: granted.lease_expires_at_ms,
            items,
        }))
    }
}

impl Handler<Ack> for SessionOwner {
    type Result = ResponseActFuture<Self, Result<usize, OwnerError>>;

    fn handle(&mut self, Ack { claim_id }: Ack, ctx: &mut Context<Self>) -> Self::Result {
        self.fault_point();
        if let Some(waiters) = self.acking.get_mut(&claim_id) {
            // The same claim's ack is being made durable: answer when it is, not before.
            let (tx, rx) = oneshot::channel();
            waiters.push(tx);
            return Box::pin(fut::wrap_future(
                async move { rx.await.unwrap_or(Err(OwnerError::Stopped)) },
            ));
        }
        self.expire_due(ctx);
        let lease = self.router.lease_of(&claim_id);
        let acked = match self.router.ack(&claim_id) {
            Ok(a) => a,
            Err(e) => return Box::pin(fut::ready(Err(e.into()))),
        };
        if acked.items.is_empty() {
            return Box::pin(fut::ready(Ok(acked.delivered)));
        }
        let mut touched = BTreeSet::new();
        for key in &acked.items {
            if let Some((child, kind)) = parse_dedup_key(key) {
                if let Some(row) = self.children.get_mut(child) {
                    row.delivery_mut(kind).delivered = true;
                    touched.insert(child.to_string());
                }
            }
        }
        let rows: Vec<ChildRow> = touched.iter().filter_map(|id| self.children.get(id).cloned()).collect();
        let ledger = self.engine.ledger.clone();
        let written = ledger
            .put_children(&rows)
            .and_then(|_| ledger.remove_claims(std::slice::from_ref(&claim_id)));
        let delivered = acked.delivered;
        let items = acked.items;
        self.acking.insert(claim_id.clone(), Vec::new());
        Box::pin(
            async move {
                written?;
                super::flush(ledger).await
            }
            .into_actor(self)
            .map(move |res, act, ctx| {
                let waiters = act.acking.remove(&claim_id).unwrap_or_default();
                match res {
                    Ok(_) => {
                        for w in waiters {
                            let _ = w.send(Ok(delivered));
                        }
                        let calls: BTreeSet<String> = touched
                            .iter()
                            .filter_map(|id| act.children.get(id).map(|r| r.call_id.clone()))
                            .collect();
                        act.gc_deferred.extend(calls);
                        act.drain_deferred();
                        Ok(delivered)
                    }
                    Err(e) => {
                        // Not durable, so not delivered: the claim is live again, as it was.
                        for key in &items {
                            if let Some((child, kind)) = parse_dedup_key(key) {
                                if let Some(row) = act.children.get_mut(child) {
                                    row.delivery_mut(kind).delivered = false;
                                }
                            }
                        }
                        let rows: Vec<ChildRow> =
                            touched.iter().filter_map(|id| act.children.get(id).cloned()).collect();
                        // Undo durably too, or a later flush could make the ack real after all.
                        let ledger = &act.engine.ledger;
                        if let Err(undo) = ledger.put_children(&rows).and_then(|_| ledger.flush()) {
                            tracing::error!("undoing a failed ack did not reach the disk: {undo}");
                        }
                        act.router.undo_ack(&claim_id, items, lease.unwrap_or_else(now_ms));
                        for w in waiters {
                            let _ = w.send(Err(OwnerError::Ledger(e.to_string())));
                        }
                        act.drain_deferred();
                        act.after_change(ctx);
                        Err(OwnerError::from(e))
                    }
                }
            }),
        )
    }
}

impl Handler<Release> for SessionOwner {
    type Result = Result<(), OwnerError>;

    fn handle(&mut self, msg: Release, ctx: &mut Context<Self>) -> Self::Result {
        self.fault_point();
        self.expire_due(ctx);
        let returned = self
            .router
            .release(now_ms(), &msg.claim_id, msg.reason, msg.retry_after_ms)?;
        let why = match msg.reason {
            ReleaseReason::Busy => "released busy",
            ReleaseReason::Failed => "delivery failed on the last attempt",
        };
        self.persist_returned(returned, why, ctx);
        if let Err(e) = self.engine.ledger.remove_claims(&[msg.claim_id]) {
            tracing::warn!("forgetting a released claim failed: {e}");
        }
        self.after_change(ctx);
        Ok(())
    }
}

/// A unit actor of this owner panicked.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct UnitExited {
    unit_id: String,
    exit: Exit,
}

/// A child handed to a unit actor that died before starting it.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct StartLost {
    child_id: String,
}

impl Handler<UnitExited> for SessionOwner {
    type Result = ();

    fn handle(&mut self, msg: UnitExited, ctx: &mut Context<Self>) {
        self.unit_exited(&msg.unit_id, msg.exit, ctx);
    }
}

impl Handler<StartLost> for SessionOwner {
    type Result = ();

    fn handle(&mut self, msg: StartLost, ctx: &mut Context<Self>) {
        self.requeue(&msg.child_id, ctx);
    }
}

impl Handler<SetTurn> for SessionOwner {
    type Result = ();

    fn handle(&mut self, SetTurn(turn): SetTurn, ctx: &mut Context<Self>) {
        self.wake_state.set_turn(turn);
        // Kept outside the actor too, so an owner restarted in-process knows the turn.
        self.engine.turns.insert(self.session.session_id.clone(), turn);
        self.after_change(ctx);
    }
}

impl Handler<Configure> for SessionOwner {
    type Result = Result<SessionInfo, OwnerError>;

    fn handle(&mut self, Configure(settings): Configure, ctx: &mut Context<Self>) -> Self::Result {
        settings.validate()?;
        let mut session = self.session.clone();
        if let Some(n) = settings.max_concurrent_children {
            session.max_concurrent_children = n;
        }
        if let Some(n) = settings.max_delivery_attempts {
            session.max_delivery_attempts = n;
        }
        if session != self.session {
            self.engine.ledger.put_session(&session)?;
            self.engine.ledger.flush()?;
            self.capacity.set_max(session.max_concurrent_children as usize);
            self.router.set_max_delivery_attempts(session.max_delivery_attempts);
            self.session = session;
        }
        if let Some(w) = settings.wake {
            self.bind_wake(w);
        }
        self.admit(ctx);
        self.after_change(ctx);
        Ok(self.info())
    }
}

impl Handler<Status> for SessionOwner {
    type Result = MessageResult<Status>;

    fn handle(&mut self, msg: Status, _: &mut Context<Self>) -> Self::Result {
        let mut calls: Vec<CallStatus> = self
            .calls
            .values()
            .filter(|_| msg.calls)
            .map(|c| {
                let mut children: Vec<ChildRow> = (0..c.row.tasks.len() as u32)
                    .filter_map(|i| self.children.get(&child_id(&c.row.call_id, i)).cloned())
                    .collect();
                children.sort_by_key(|r| r.task_index);
                CallStatus {
                    call: c.row.clone(),
                    units: c
                        .units
                        .iter()
                        .filter_map(|u| self.units.get(u).map(|s| s.row.clone()))
                        .collect(),
                    children,
                }
            })
            .collect();
        calls.sort_by_key(|c| c.call.set);
        let delivered_live: u64 = self
            .children
            .values()
            .map(|r| r.result.delivered as u64 + r.notice.delivered as u64)
            .sum();
        MessageResult(SessionStatus {
            info: self.info(),
            queued: self.capacity.queued(),
            running: self.capacity.running(),
            ready: self.router.pending_count(),
            claimed: self.router.claimed_count(),
            delivered: self.delivered_done + delivered_live,
            calls,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_ids_name_their_session() {
        for s in ["s1", "chat:42/üñï", ""] {
            let id = new_claim_id(s);
            assert_eq!(claim_session(&id).as_deref(), Some(s));
        }
        assert_eq!(claim_session("clm_zz_1"), None);
        assert_eq!(claim_session("nope"), None);
    }
}
