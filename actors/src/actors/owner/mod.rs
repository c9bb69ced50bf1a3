//! The SessionOwner actor: the routing reservation of one session.
//!
//! Its mailbox serialises everything that decides who gets what: accepting calls (set ordinals,
//! dispatch rows), capacity admission, recording completions handed over by the coalescer,
//! boundaries (claims), acks, releases, lease expiries and wakes. Every mutating request goes
//! decide → persist → apply (`persist`): decided by plain code from the current state, made
//! durable when it must be, applied to memory only after its flush succeeded. Rendering, wake
//! I/O and runner work happen elsewhere.
//!
//! The parts, one job each: [`messages`] (what it is asked and answers), `owed` (the calls,
//! units and children it holds), `persist` (the write → flush → apply step and its group
//! commit), `dispatch` (accepting calls, admitting and starting children), `recording`
//! (completions), `claims` (boundaries, acks, releases, expiries, dead letters), `sync` (sync
//! calls), `rebuild` (an owner built from the ledger), `tell` (its events and wakes), `moving` (its
//! session handed over or taken over by another process). Lease expiries and backoffs share one
//! timer: the router keeps the deadlines ordered and the owner arms a single `run_later` for the
//! earliest one.

mod apply;
mod cancel;
mod claims;
mod dispatch;
mod invariants;
mod moving;
mod nest;
mod owed;
pub use invariants::broken_invariants;
pub mod messages;
mod persist;
mod prune;
mod rebuild;
mod recording;
mod redrive;
mod replay;
mod sync;
mod tell;

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;

use self::owed::OwedCalls;
use self::persist::Persist;
use super::supervise::{Exit, RestartBudgets, RestartPolicy};
use super::Engine;
use crate::error::BroodError;
use crate::ledger::{RowKey, Writes};
use crate::model::*;
use crate::routing::{Capacity, Router, WakeState};
use crate::wake::{Wake, WakeTarget};

pub use messages::*;
pub(crate) use nest::CheckParent;
pub use prune::{DropIfIdle, OldCall, Prune};
pub use redrive::Redrive;
use tell::child_event;

pub(crate) use crate::model::claim_made_ms;
pub use crate::model::{claim_session, new_claim_id};

/// A request that may need durable rows: decided when no flush is in flight (see [`persist`]).
enum Durable {
    Delegate(Delegate, oneshot::Sender<Result<DelegateReply, BroodError>>),
    /// An ack, with the moment it arrived (a lease that runs out while it waits is no reason
    /// to refuse it).
    Ack(String, oneshot::Sender<Result<usize, BroodError>>, u64),
    /// A release, with the moment it arrived.
    Release(Release, oneshot::Sender<Result<(), BroodError>>, u64),
    /// A lease ran out and handing the claim back dead-letters some of its items.
    Expire(String),
    Configure(SessionSettings, oneshot::Sender<Result<SessionInfo, BroodError>>),
    SyncReceived(String, oneshot::Sender<()>),
    /// Admitted children (their slots taken) whose running marks must be durable before they
    /// start: their tasks are not safe to re-run, so a crash must know they had started.
    Start(Vec<String>),
    /// A child whose start was lost goes back to the queue.
    Requeue(String),
    /// A child whose retry's backoff ran out is queued again, its next attempt recorded.
    Retry(String),
    /// The nested session's child ended: cancel every call, accept no more (decided after the
    /// dispatches before it applied, so none of them escapes it).
    EndNested(String, oneshot::Sender<Result<Cancelled, BroodError>>),
    /// Dead letters to put back in the ready set, with what was read for them.
    Redrive(redrive::Loaded, oneshot::Sender<Result<usize, BroodError>>),
    /// Old calls and ack rows retention removes.
    Prune(Prune, oneshot::Sender<Result<usize, BroodError>>),
    /// Retention removes the session if nothing of it is live.
    Drop(DropIfIdle, oneshot::Sender<Result<bool, BroodError>>),
}

/// The routing reservation of one session.
pub struct SessionOwner {
    engine: Engine,
    /// The engine as its units and children share it (one pointer each, not a copy).
    shared: Arc<Engine>,
    session: SessionRow,
    wake: Option<WakeTarget>,
    wake_state: WakeState,
    owed: OwedCalls,
    capacity: Capacity<String>,
    router: Router<String>,
    timer: Option<(u64, SpawnHandle)>,
    unit_budgets: RestartBudgets,
    persist: Persist<Durable>,
    /// The session's fence and this owner's epoch under it.
    fence: (super::Fence, u64),
    /// The stored webhook wake target, if one is bound.
    wake_url: Option<String>,
    /// The ready count last told to observers.
    told_ready: usize,
    /// Why this nested session accepts no more calls: its child ended.
    parent_ended: Option<String>,
    /// Who made each live claim (its boundary's consumer), for the session's view.
    consumers: std::collections::HashMap<String, String>,
    /// The session's tenure was lost: the owner stops once its batch in flight is answered.
    moved: bool,
    /// The session is being handed over to another process (see [`HandOver`]).
    handing_over: bool,
    /// A nested session recovered from stored rows whose child's row is not read yet (see
    /// [`CheckParent`]): nothing is admitted until it is.
    awaiting_parent: bool,
    /// The ended children with a nested session a rebuild found (recovery ended them, or
    /// their end was stored already): their nested sessions are ended as the owner starts.
    resolved_ended: Vec<String>,
    /// Changes applied, for sampling the owed calls' check in a release build.
    changes: u64,
    /// Running children a cancel of this owner is stopping: each keeps its slot until its
    /// runner is stopped or known gone (the cancel's `RunnersEnded`), and only those may hold a
    /// slot once they ended, are being cancelled, or their call left memory.
    stopping: foldhash::HashSet<String>,
    /// Cancels an owner before this one decided wait for starts of children of this session
    /// that died with it: looked at as children end (until none is left), so an owner that
    /// inherited none takes no lock for it.
    inherited_cancels: bool,
    /// When this owner took the session: a claim made before it that the router does not know
    /// was made by an owner before this one (here, or in a process that held the session) and
    /// was lost with it.
    since_ms: u64,
}

/// A release build checks the owed calls' invariants once every this many changes.
const RELEASE_CHECK_EVERY: u64 = 1024;

impl std::fmt::Debug for SessionOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionOwner")
            .field("session", &self.session.session_id)
            .field("calls", &self.owed.calls.len())
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
        let fence = engine.fence(&session.session_id);
        SessionOwner {
            fence,
            wake_url: None,
            told_ready: 0,
            parent_ended: None,
            consumers: Default::default(),
            moved: false,
            handing_over: false,
            awaiting_parent: false,
            resolved_ended: Vec::new(),
            changes: 0,
            stopping: Default::default(),
            inherited_cancels: false,
            since_ms: now_ms(),
            capacity: Capacity::counted(session.max_concurrent_children as usize, engine.live.clone()),
            router: Router::new(session.max_delivery_attempts),
            shared: Arc::new(engine.clone()),
            engine,
            session,
            wake: None,
            wake_state,
            owed: OwedCalls::default(),
            timer: None,
            unit_budgets: RestartBudgets::new(RestartPolicy::default()),
            persist: Persist::default(),
        }
    }

    /// Binds a wake target (the session becomes wake-capable).
    pub fn bind_wake(&mut self, wake: Arc<dyn Wake>) {
        self.wake = Some(WakeTarget(wake));
    }

    /// Binds the wake target of a stored webhook URL, through the engine's wake factory.
    pub(crate) fn bind_wake_url(&mut self, url: &str) {
        match &self.engine.wake_factory {
            Some(f) => {
                let wake = f.wake_for(&self.session.session_id, url);
                self.bind_wake(wake);
                self.wake_url = Some(url.to_string());
            }
            None => tracing::warn!(
                session = %self.session.session_id,
                "the session has a stored wake URL but this engine has no wake factory; it is not wake-capable until a target is bound"
            ),
        }
    }

    /// The live claims with their consumers, oldest first.
    fn live_claims(&self) -> Vec<LiveClaim> {
        let mut claims: Vec<LiveClaim> = self
            .router
            .live_claims()
            .map(|c| LiveClaim {
                claim_id: c.claim_id.to_string(),
                consumer: self.consumers.get(c.claim_id).cloned().unwrap_or_default(),
                items: c.items.len(),
                children: c.items.iter().filter_map(|k| ItemRef::parse(k)).collect(),
                claimed_at_ms: c.claimed_at_ms,
                lease_expires_at_ms: c.lease_expires_at_ms,
            })
            .collect();
        claims.sort_by(|a, b| a.claim_id.cmp(&b.claim_id));
        claims
    }

    /// The status of a child of a call this owner holds.
    pub(crate) fn child_status(&self, call_id: &str, task: u32) -> Option<ChildStatus> {
        self.owed.calls.get(call_id)?.child(task).map(|row| row.status)
    }

    /// This nested session's child ended: as it starts, the owner cancels its unfinished calls
    /// (before it admits anything) and takes no more.
    pub(crate) fn end_nested_when_started(&mut self, reason: String) {
        self.parent_ended = Some(reason);
    }

    /// Whether this owner was recovered from stored rows for a nested session, so that its
    /// child may have ended while it was not served (see [`CheckParent`]).
    pub(crate) fn checks_parent(&self) -> bool {
        self.awaiting_parent
    }

    /// Checks the owed calls' invariants ([`invariants::owed_faults`]) after a change: each time in
    /// a debug build, where a fault panics; in a release build once every
    /// [`RELEASE_CHECK_EVERY`] changes (the check reads every child in memory), where a fault
    /// is logged and counted.
    fn check_owed(&mut self) {
        self.changes = self.changes.wrapping_add(1);
        if !cfg!(debug_assertions) && !self.changes.is_multiple_of(RELEASE_CHECK_EVERY) {
            return;
        }
        let faults = invariants::owed_faults(&self.owed, &self.capacity, &self.stopping);
        if faults.is_empty() {
            return;
        }
        // Counted first: a test sees a fault even when the panic's rebuild healed the owed calls.
        invariants::count(faults.len());
        debug_assert!(
            faults.is_empty(),
            "session `{}`: the owed calls' invariants broke: {}",
            self.session.session_id,
            faults.join("; ")
        );
        tracing::error!(faults = %faults.join("; "), "the owed calls' invariants broke");
    }

    /// The session this owner routes.
    pub fn session_id(&self) -> &str {
        &self.session.session_id
    }

    /// Whether a background result can reach the parent: a wake target is bound, or the
    /// parent reaches the session by itself.
    fn wake_capable(&self) -> bool {
        self.wake.is_some() || self.session.addressable
    }

    fn info(&self) -> SessionInfo {
        SessionInfo {
            session_id: self.session.session_id.clone(),
            wake_capable: self.wake_capable(),
            addressable: self.session.addressable,
            turn: self.wake_state.turn(),
            max_concurrent_children: self.session.max_concurrent_children,
            max_delivery_attempts: self.session.max_delivery_attempts,
        }
    }

    fn counts(&self) -> SessionCounts {
        let ready = self.router.ready_count(now_ms());
        SessionCounts {
            info: self.info(),
            queued: self.capacity.queued(),
            running: self.capacity.running(),
            ready,
            backing_off: self.router.pending_count().saturating_sub(ready),
            claimed: self.router.claimed_count(),
            delivered: self.owed.delivered(),
        }
    }

    fn interrupted(&self) -> BroodError {
        BroodError::Interrupted {
            session: self.session.session_id.clone(),
            call_id: None,
        }
    }

    /// The key of this session's row `id` in a session-scoped tree.
    fn row_key(&self, id: &str) -> RowKey {
        RowKey::new(self.session.session_id.clone(), id)
    }

    /// Writes rows that need no flush of their own (running marks of re-runnable tasks,
    /// attempt counts, dead marks whose dead letters are durable).
    fn write_unflushed(&self, writes: Writes) {
        if writes.is_empty() {
            return;
        }
        if let Err(e) = self.engine.ledger.write(&writes) {
            tracing::warn!("writing rows that need no flush failed: {e}");
        }
    }

    /// Drops the given calls from memory once every item of theirs is delivered or dead.
    fn collect(&mut self, call_ids: impl IntoIterator<Item = String>) {
        let mut ids: Vec<String> = call_ids.into_iter().collect();
        ids.sort();
        ids.dedup();
        for call_id in ids {
            if self.owed.settled(&call_id, |k| self.router.is_open(k)) {
                let router = &mut self.router;
                self.owed.drop_call(&call_id, |key| router.forget(key));
                self.engine.calls.remove(&call_id);
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
                for dying in act.expire_due() {
                    act.submit(dying, ctx);
                }
                act.after_change(ctx);
            });
            self.timer = Some((at, handle));
        }
    }

    fn after_change(&mut self, ctx: &mut Context<Self>) {
        if !super::running(ctx) {
            return;
        }
        self.check_owed();
        self.emit_ready();
        self.maybe_wake();
        self.reschedule(ctx);
    }

    fn fault_point(&self) {
        if crate::failpoints::fires("owner_handler") {
            panic!("injected fault: owner_handler (session {})", self.session.session_id);
        }
    }
}

/// Answers a request's reply channel; the caller may have gone, which changes nothing.
fn answer<T>(reply: oneshot::Sender<T>, value: T) {
    let _ = reply.send(value);
}

impl Actor for SessionOwner {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        tracing::debug!(calls = self.owed.calls.len(), "session owner started");
        if let Some(reason) = self.parent_ended.clone() {
            // Before anything is admitted: none of its queued children may start.
            let (tx, _) = oneshot::channel();
            self.submit(Durable::EndNested(reason, tx), ctx);
        }
        let mut ended = std::mem::take(&mut self.resolved_ended);
        ended.retain(|c| self.engine.is_nested(c));
        if !ended.is_empty() {
            // Their rows were written before this owner started: a nested session registered
            // later reads them (CheckParent); one registered already is told here.
            cancel::end_nests_of_ended(self.shared.clone(), ended);
        }
        self.admit(ctx);
        self.after_change(ctx);
    }
}

/// The reply future of a request submitted to the owner: a lost answer means the owner died.
fn reply_future<T: Send + 'static>(
    rx: oneshot::Receiver<Result<T, BroodError>>,
    lost: BroodError,
) -> ResponseFuture<Result<T, BroodError>> {
    Box::pin(async move { rx.await.unwrap_or(Err(lost)) })
}

impl SessionOwner {
    /// Submits the durable request `request` makes of its reply channel, and answers with what
    /// it is decided to (interrupted, when the owner dies first).
    fn submit_for<T: Send + 'static>(
        &mut self,
        request: impl FnOnce(oneshot::Sender<Result<T, BroodError>>) -> Durable,
        ctx: &mut Context<Self>,
    ) -> ResponseFuture<Result<T, BroodError>> {
        let (tx, rx) = oneshot::channel();
        let lost = self.interrupted();
        self.submit(request(tx), ctx);
        reply_future(rx, lost)
    }
}

impl Handler<Delegate> for SessionOwner {
    // Answered from outside this actor's context: a sync call waits for all its children, and
    // a future parked in the context would be polled on every message meanwhile.
    type Result = ResponseFuture<Result<DelegateReply, BroodError>>;

    fn handle(&mut self, msg: Delegate, ctx: &mut Context<Self>) -> Self::Result {
        self.fault_point();
        let (tx, rx) = oneshot::channel();
        let session = self.session.session_id.clone();
        let accepted = msg.accepted.clone();
        self.submit(Durable::Delegate(msg, tx), ctx);
        Box::pin(async move {
            rx.await.unwrap_or_else(|_| {
                Err(BroodError::Interrupted {
                    session,
                    call_id: accepted.lock().ok().and_then(|a| a.clone()),
                })
            })
        })
    }
}

impl Handler<Ack> for SessionOwner {
    type Result = ResponseFuture<Result<usize, BroodError>>;

    fn handle(&mut self, Ack { claim_id }: Ack, ctx: &mut Context<Self>) -> Self::Result {
        self.fault_point();
        let arrived = now_ms();
        self.submit_for(|tx| Durable::Ack(claim_id, tx, arrived), ctx)
    }
}

impl Handler<Release> for SessionOwner {
    type Result = ResponseFuture<Result<(), BroodError>>;

    fn handle(&mut self, msg: Release, ctx: &mut Context<Self>) -> Self::Result {
        self.fault_point();
        let arrived = now_ms();
        self.submit_for(|tx| Durable::Release(msg, tx, arrived), ctx)
    }
}

impl Handler<Configure> for SessionOwner {
    type Result = ResponseFuture<Result<SessionInfo, BroodError>>;

    fn handle(&mut self, Configure(settings): Configure, ctx: &mut Context<Self>) -> Self::Result {
        self.submit_for(|tx| Durable::Configure(settings, tx), ctx)
    }
}

impl Handler<SyncReceived> for SessionOwner {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, msg: SyncReceived, ctx: &mut Context<Self>) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        self.submit(Durable::SyncReceived(msg.call_id, tx), ctx);
        Box::pin(async move {
            let _ = rx.await;
        })
    }
}

impl Handler<Cancel> for SessionOwner {
    type Result = ResponseFuture<Result<Cancelled, BroodError>>;

    fn handle(&mut self, msg: Cancel, ctx: &mut Context<Self>) -> Self::Result {
        self.fault_point();
        self.cancel(msg.target, msg.reason, msg.stored, ctx)
    }
}

impl Handler<EndNested> for SessionOwner {
    type Result = ResponseFuture<Result<Cancelled, BroodError>>;

    fn handle(&mut self, msg: EndNested, ctx: &mut Context<Self>) -> Self::Result {
        self.fault_point();
        self.submit_for(|tx| Durable::EndNested(msg.reason, tx), ctx)
    }
}

impl Handler<Redrive> for SessionOwner {
    type Result = ResponseFuture<Result<usize, BroodError>>;

    fn handle(&mut self, msg: Redrive, ctx: &mut Context<Self>) -> Self::Result {
        self.fault_point();
        let lost = self.interrupted();
        let rx = self.redrive(msg, ctx);
        reply_future(rx, lost)
    }
}

impl Handler<Admit> for SessionOwner {
    type Result = ();

    fn handle(&mut self, _: Admit, ctx: &mut Context<Self>) {
        self.admit(ctx);
        self.after_change(ctx);
    }
}

impl Handler<GetCall> for SessionOwner {
    type Result = Option<CallStatus>;

    fn handle(&mut self, GetCall(call_id): GetCall, _: &mut Context<Self>) -> Self::Result {
        let router = &self.router;
        self.owed.calls.get(&call_id).map(|c| c.status(|k| router.is_open(k)))
    }
}

impl Handler<Prune> for SessionOwner {
    type Result = ResponseFuture<Result<usize, BroodError>>;

    fn handle(&mut self, msg: Prune, ctx: &mut Context<Self>) -> Self::Result {
        self.submit_for(|tx| Durable::Prune(msg, tx), ctx)
    }
}

impl Handler<DropIfIdle> for SessionOwner {
    type Result = ResponseFuture<Result<bool, BroodError>>;

    fn handle(&mut self, msg: DropIfIdle, ctx: &mut Context<Self>) -> Self::Result {
        self.submit_for(|tx| Durable::Drop(msg, tx), ctx)
    }
}

impl Handler<GetChildStatus> for SessionOwner {
    type Result = Option<ChildStatus>;

    fn handle(&mut self, msg: GetChildStatus, _: &mut Context<Self>) -> Self::Result {
        self.child_status(&msg.call_id, msg.task)
    }
}

impl Handler<Recorded> for SessionOwner {
    type Result = ();

    fn handle(&mut self, Recorded { rows }: Recorded, ctx: &mut Context<Self>) {
        self.fault_point();
        if !self.engine.holds(&self.session.session_id) {
            // Taken over: the rows may not have been written, and are not published here.
            return self.moved(ctx);
        }
        self.record(rows, ctx);
        self.admit(ctx);
        self.after_change(ctx);
    }
}

impl Handler<ClaimReady> for SessionOwner {
    type Result = Result<Option<Envelope>, BroodError>;

    fn handle(&mut self, msg: ClaimReady, ctx: &mut Context<Self>) -> Self::Result {
        self.fault_point();
        // Claims are not fenced by a write: none is handed out once the session's tenure may
        // have lapsed.
        self.engine.check_serving(&self.session.session_id)?;
        for dying in self.expire_due() {
            self.submit(dying, ctx);
        }
        let envelope = self.claim(msg.consumer, msg.lease_ms, msg.limits);
        self.after_change(ctx);
        Ok(envelope)
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

impl Handler<GetCounts> for SessionOwner {
    type Result = MessageResult<GetCounts>;

    fn handle(&mut self, _: GetCounts, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.counts())
    }
}

impl Handler<GetStatus> for SessionOwner {
    type Result = MessageResult<GetStatus>;

    fn handle(&mut self, _: GetStatus, _: &mut Context<Self>) -> Self::Result {
        MessageResult(SessionStatus {
            counts: self.counts(),
            calls: self.owed.call_statuses(|k| self.router.is_open(k)),
            claims: self.live_claims(),
        })
    }
}

impl Handler<Retire> for SessionOwner {
    type Result = ();

    fn handle(&mut self, _: Retire, ctx: &mut Context<Self>) {
        tracing::info!("session owner retiring, to be rebuilt from the ledger");
        ctx.stop();
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
pub(crate) struct StartLost {
    pub(crate) child_id: String,
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
        self.submit(Durable::Requeue(msg.child_id), ctx);
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

    #[test]
    fn claim_ids_say_when_they_were_made() {
        let before = now_ms();
        let made = claim_made_ms(&new_claim_id("s_1")).expect("a claim id of ours");
        assert!(before <= made && made <= now_ms(), "{before} {made}");
        assert_eq!(claim_made_ms("clm_7331_zz"), None);
        assert_eq!(claim_made_ms("clm_73_1"), None);
        assert_eq!(claim_made_ms("nope"), None);
    }
}
