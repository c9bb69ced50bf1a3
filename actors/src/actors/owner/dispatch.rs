//! Accepting calls and running their children: the dispatch decision (set number, call, unit
//! and session rows), session settings, capacity admission, handing admitted children to their
//! unit actors, and a lost start queued again. Each durable decision is a [`Step`] that applies
//! only once its rows are flushed.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;

use super::apply::Apply;
use super::persist::{BatchView, Decided, Step};
use super::{answer, child_event, Delegate, Durable, SessionInfo, SessionOwner, UnitExited};
use crate::actors::child::CallIds;
use crate::actors::supervise::{self, Decision, Exit};
use crate::actors::unit::{StartChildren, Starting, Unit};
use crate::error::BroodError;
use crate::ledger::Writes;
use crate::model::*;
use crate::recovery::queued_child;
use crate::routing::Reservation;

/// How long admission waits before trying again after running marks could not be flushed.
const ADMIT_RETRY: Duration = Duration::from_millis(100);

/// A call accepted, to add to the owed calls once its rows are durable.
pub(super) struct Dispatched {
    reply: oneshot::Sender<Result<DelegateReply, BroodError>>,
    /// Where the caller reads the call id once it is accepted.
    accepted: Arc<std::sync::Mutex<Option<String>>>,
    call: CallRow,
    units: Vec<UnitRow>,
    /// The call's children, queued, but for the first `started`: running (their start row is
    /// in the step).
    children: Vec<ChildRow>,
    started: usize,
    /// The call's children counted as live in the engine until the session counts them.
    reserved: Reservation,
}

/// A change of settings, to apply once it is durable (at once when nothing durable changed).
pub(super) struct Configured {
    capacity: u32,
    attempts: u32,
    addressable: bool,
    settings: SessionSettings,
    reply: oneshot::Sender<Result<SessionInfo, BroodError>>,
}

impl SessionOwner {
    /// Whether this session may take a call: a nested session's child must not have ended,
    /// and the call must not be deeper than the engine's `max_depth`.
    fn may_delegate(&self) -> Result<(), BroodError> {
        let session = &self.session.session_id;
        if self.parent_ended.is_some() {
            return Err(BroodError::ParentEnded {
                session: session.clone(),
            });
        }
        let depth = self.engine.depth(session).saturating_add(1);
        if depth > self.engine.max_depth {
            return Err(BroodError::MaxDepthExceeded {
                session: session.clone(),
                depth,
                max: self.engine.max_depth,
            });
        }
        Ok(())
    }

    /// Decides a delegate: validates it, gives it the batch's next set, and writes session and
    /// call (in that order: a crash may skip a set, never reuse one). Applied — the
    /// set taken, the call booked, its children queued — only once that is durable.
    pub(super) fn decide_delegate(
        &mut self,
        msg: Delegate,
        mut reply: oneshot::Sender<Result<DelegateReply, BroodError>>,
        view: &mut BatchView,
    ) -> Decided<Durable> {
        let factory = &*self.engine.factory;
        let tasks = match validate(&msg.request, &|spec| factory.validate(spec)) {
            Ok(t) => t,
            Err(e) => {
                answer(reply, Err(e.into()));
                return Decided::Done;
            }
        };
        if let Err(e) = self.may_delegate() {
            answer(reply, Err(e));
            return Decided::Done;
        }
        let request = &msg.request;
        let idempotency = request.idempotency_key.as_ref().map(|key| Idempotency {
            key: key.clone(),
            fingerprint: request_fingerprint(&tasks, request.mode, request.independent_completions),
        });
        let call_id = match &idempotency {
            None => new_call_id(),
            Some(asked) => {
                let call_id = keyed_call_id(&self.session.session_id, &asked.key);
                if view.calls.contains(&call_id) || view.pruned.contains(&call_id) {
                    // Made, or removed by retention, in this very batch: answered once that is
                    // applied (a removed call is not answered; it is made again).
                    return Decided::Later(Durable::Delegate(msg, reply));
                }
                match self.replay(&call_id, asked, reply) {
                    Ok(()) => return Decided::Done,
                    Err(unanswered) => {
                        reply = unanswered;
                        call_id
                    }
                }
            }
        };
        // Counted as live from here: a refused or failed call gives its reservation back, a
        // booked one once its children are counted by the session.
        let reserved = match self.engine.live.reserve(tasks.len()) {
            Ok(r) => r,
            Err(live) => {
                let max = self.engine.live.max().unwrap_or(usize::MAX);
                answer(
                    reply,
                    Err(BroodError::ServerFull {
                        live,
                        asked: tasks.len(),
                        max,
                    }),
                );
                return Decided::Done;
            }
        };
        let (mode, forced_sync_reason) = match msg.request.mode {
            Mode::Background if !self.wake_capable() => (
                Mode::Sync,
                Some(format!(
                    "session `{}` is not wake-capable (no wake target is bound), so a background result could never wake the parent; the call ran synchronously",
                    self.session.session_id
                )),
            ),
            m => (m, None),
        };
        let set = view.session.next_set;
        view.calls.insert(call_id.clone());
        let call = CallRow {
            call_id: call_id.clone(),
            session_id: self.session.session_id.clone(),
            set,
            mode,
            forced_sync_reason: forced_sync_reason.clone(),
            independent_completions: msg.request.independent_completions,
            tasks,
            created_at_ms: now_ms(),
            traceparent: msg.request.traceparent.clone(),
            idempotency,
        };
        let units = plan_units(&call_id, &call.tasks, call.independent_completions);
        view.session.next_set = set.saturating_add(1);
        let mut children: Vec<ChildRow> = Vec::with_capacity(call.tasks.len());
        children.extend(
            units
                .iter()
                .flat_map(|u| u.tasks.iter().map(|&i| queued_child(&call, u, i))),
        );
        children.sort_by_key(|c| c.task_index);
        // The children capacity has room for start at once, their running marks one start row
        // flushed with the call: a dispatch costs one flush, not one for the call and another
        // for its starts. Only when nothing is queued before them (queued children go first).
        // Under a server-wide bound every start goes through admission, which shares it out.
        let room =
            if self.capacity.queued() == 0 && !view.queued && self.engine.admitting() && self.engine.shares.is_none() {
                let max = (view.session.max_concurrent_children as usize).max(1);
                max.saturating_sub(self.capacity.running().saturating_add(view.admitted))
            } else {
                0
            };
        let started = room.min(children.len());
        view.admitted += started;
        view.queued |= started < children.len();
        let mut writes = Writes {
            sessions: vec![view.session.clone()],
            calls: vec![call.clone()],
            ..Writes::default()
        };
        let mut restore = Writes {
            sessions: vec![self.session.clone()],
            remove_calls: vec![self.row_key(&call_id)],
            ..Writes::default()
        };
        if started > 0 {
            let now = now_ms();
            for c in &mut children[..started] {
                c.status = ChildStatus::Running;
                c.started_at_ms = Some(now);
            }
            let tasks = children[..started].iter().map(|c| c.task_index).collect();
            let start = StartRow::new(&self.session.session_id, &call_id, tasks, now);
            restore.remove_starts.push(self.row_key(&start.start_id));
            writes.starts.push(start);
        }
        Decided::Step(Step {
            writes,
            restore,
            apply: Apply::Dispatch(Box::new(Dispatched {
                reply,
                accepted: msg.accepted,
                call,
                units,
                children,
                started,
                reserved,
            })),
        })
    }

    /// Applies a dispatch: the set is taken, the call booked, the children capacity had room
    /// for started and the rest queued; a background call is answered first, a sync one waits
    /// for its children.
    pub(super) fn apply_dispatch(&mut self, d: Dispatched, res: Result<(), BroodError>, ctx: &mut Context<Self>) {
        let Dispatched {
            reply,
            accepted,
            call,
            units,
            children,
            started,
            reserved,
        } = d;
        if let Err(e) = res {
            return answer(reply, Err(e));
        }
        let (call_id, set, mode) = (call.call_id.clone(), call.set, call.mode);
        let forced_sync_reason = call.forced_sync_reason.clone();
        self.session.next_set = self.session.next_set.max(set.saturating_add(1));
        if let Ok(mut a) = accepted.lock() {
            *a = Some(call_id.clone());
        }
        let infos: Vec<UnitInfo> = units.iter().map(UnitInfo::from).collect();
        let booked: Vec<(UnitRow, usize, Option<u32>)> = units.into_iter().map(|u| (u, 0, None)).collect();
        self.engine
            .calls
            .insert(call_id.clone(), self.session.session_id.clone());
        // A background call is answered before it is booked: the caller's next request to this
        // owner waits in its mailbox until this step applied, and what is read beside the owner
        // (which session a call is in) is in place.
        let sync = match mode {
            Mode::Sync => Some((reply, infos)),
            Mode::Background => {
                let call_id = call_id.clone();
                answer(
                    reply,
                    Ok(DelegateReply::Background {
                        call_id,
                        set,
                        units: infos,
                        note: String::new(),
                    }),
                );
                None
            }
        };
        let running: Vec<u32> = children[..started].iter().map(|c| c.task_index).collect();
        for c in &children[..started] {
            self.capacity.start_now(c.child_id.clone());
            self.emit_status(c, ChildStatus::Queued, &call);
        }
        for c in &children[started..] {
            self.capacity.enqueue(c.child_id.clone());
            self.emit_status(c, c.status, &call);
        }
        drop(reserved);
        self.owed.insert_call(call, booked, children);
        if let Some((reply, units)) = sync {
            self.wait_sync(&call_id, reply, units, forced_sync_reason);
        }
        let starts: Vec<(&str, u32)> = running.iter().map(|&i| (call_id.as_str(), i)).collect();
        self.start_children(&starts, ctx);
        self.admit(ctx);
    }

    /// Decides a change of settings; a change of limits is made durable first, a wake target
    /// is bound once it applies.
    pub(super) fn decide_configure(
        &mut self,
        settings: SessionSettings,
        reply: oneshot::Sender<Result<SessionInfo, BroodError>>,
        view: &mut BatchView,
    ) -> Decided<Durable> {
        if let Err(e) = settings.validate() {
            answer(reply, Err(e.into()));
            return Decided::Done;
        }
        if let Some(url) = &settings.wake_url {
            let checked = match &self.engine.wake_factory {
                None => Err("this engine cannot make webhook wake targets (it has no wake factory)".to_string()),
                Some(f) => f.validate(url),
            };
            if let Err(m) = checked {
                answer(reply, Err(BroodError::invalid("wake_url", m)));
                return Decided::Done;
            }
        }
        if view.session != self.session {
            // A step of this batch changes the session row: decide against its outcome.
            return Decided::Later(Durable::Configure(settings, reply));
        }
        let mut session = self.session.clone();
        if let Some(n) = settings.max_concurrent_children {
            session.max_concurrent_children = n;
        }
        if let Some(n) = settings.max_delivery_attempts {
            session.max_delivery_attempts = n;
        }
        if let Some(a) = settings.addressable {
            session.addressable = a;
        }
        let new_url = settings.wake_url.clone().filter(|u| Some(u) != self.wake_url.as_ref());
        let configured = Configured {
            capacity: session.max_concurrent_children,
            attempts: session.max_delivery_attempts,
            addressable: session.addressable,
            settings,
            reply,
        };
        if session == self.session && new_url.is_none() {
            return Decided::Now(Apply::Configure(Box::new(configured)));
        }
        let mut writes = Writes::default();
        let mut restore = Writes::default();
        if session != self.session {
            view.session = session.clone();
            writes.sessions.push(session);
            restore.sessions.push(self.session.clone());
        }
        if let Some(url) = new_url {
            writes.wakes.push(WakeRow {
                session_id: self.session.session_id.clone(),
                url,
                bound_at_ms: now_ms(),
            });
            match &self.wake_url {
                Some(old) => restore.wakes.push(WakeRow {
                    session_id: self.session.session_id.clone(),
                    url: old.clone(),
                    bound_at_ms: now_ms(),
                }),
                None => restore.remove_wakes.push(self.session.session_id.clone()),
            }
        }
        Decided::Step(Step {
            writes,
            restore,
            apply: Apply::Configure(Box::new(configured)),
        })
    }

    /// Applies a change of settings: limits set, a wake target bound, and admission run (a
    /// larger capacity starts queued children).
    pub(super) fn apply_configure(&mut self, c: Configured, res: Result<(), BroodError>, ctx: &mut Context<Self>) {
        if let Err(e) = res {
            return answer(c.reply, Err(e));
        }
        self.session.max_concurrent_children = c.capacity;
        self.session.max_delivery_attempts = c.attempts;
        self.session.addressable = c.addressable;
        self.capacity.set_max(c.capacity as usize);
        self.router.set_max_delivery_attempts(c.attempts);
        if let Some(w) = c.settings.wake {
            self.bind_wake(w);
        }
        if let Some(url) = &c.settings.wake_url {
            self.bind_wake_url(url);
        }
        self.admit(ctx);
        answer(c.reply, Ok(self.info()));
    }

    /// Starts the queued children capacity allows. A re-runnable task needs no durable running
    /// mark (queued or running, recovery runs it again), so it starts at once; one that is not
    /// starts only once its mark is durable, or a crash could run it twice.
    pub(super) fn admit(&mut self, ctx: &mut Context<Self>) {
        // A nested session whose child ended starts nothing (its calls are being cancelled),
        // nor one whose child is not known yet not to have ended.
        let open = crate::actors::running(ctx)
            && self.engine.admitting()
            && self.parent_ended.is_none()
            && !self.awaiting_parent;
        let ids = match &self.engine.shares {
            None if open => self.capacity.admit(),
            None => return,
            Some(shares) => {
                // Told even when it wants nothing, so the slots its ended children held go on.
                let wants = if open { self.capacity.startable() } else { 0 };
                let (allowed, poked) = shares.update(&self.session.session_id, self.capacity.running(), wants);
                self.engine.poke(poked);
                self.capacity.admit_up_to(allowed)
            }
        };
        if ids.is_empty() {
            return;
        }
        let (now, mut durable, mut rerun) = (now_ms(), Vec::new(), Vec::new());
        for id in ids {
            let may_rerun = self
                .owed
                .child(&id)
                .and_then(|r| self.owed.task_of(r))
                .is_some_and(|t| t.rerun_on_recovery);
            if !may_rerun {
                durable.push(id);
            } else if self.owed.mark_running(&id, now) {
                // (Never one being cancelled: a cancel withdraws its children from capacity.)
                rerun.push(id);
            }
        }
        if !rerun.is_empty() {
            let rows: Vec<&ChildRow> = rerun.iter().filter_map(|id| self.owed.child(id)).collect();
            let marks = self.start_marks(&rows, now).0;
            self.write_unflushed(marks);
            let starts: Vec<(&str, u32)> = rerun.iter().filter_map(|id| parse_child_id(id)).collect();
            self.start_children(&starts, ctx);
        }
        if !durable.is_empty() {
            self.submit(Durable::Start(durable), ctx);
        }
    }

    /// Decides the running marks of admitted children: applied (the children started) once
    /// durable; on failure they go back to the head of the queue and admission tries again.
    pub(super) fn decide_start(&mut self, ids: Vec<String>) -> Decided<Durable> {
        let now = now_ms();
        let rows: Vec<&ChildRow> = ids.iter().filter_map(|id| self.owed.child(id)).collect();
        let (writes, restore) = self.start_marks(&rows, now);
        #[cfg(feature = "failpoints")]
        if crate::failpoints::fires("start_flush_slow_fail") {
            crate::failpoints::arm("ledger_flush_slow_fail", 1);
        }
        Decided::Step(Step {
            writes,
            restore,
            apply: Apply::Start { ids, now },
        })
    }

    /// Applies admitted children's running marks: the children start once the marks are
    /// durable; on failure they go back to the head of the queue and admission tries again.
    pub(super) fn apply_start(
        &mut self,
        ids: Vec<String>,
        now: u64,
        res: Result<(), BroodError>,
        ctx: &mut Context<Self>,
    ) {
        if let Err(e) = res {
            tracing::warn!("running marks not durable ({e}); the children wait");
            // One cancelled meanwhile left capacity with its cancel: it is not queued again (it
            // would take a slot it never gives back).
            for id in ids.iter().rev() {
                if self
                    .owed
                    .child(id)
                    .is_some_and(|r| r.status == ChildStatus::Queued && !self.owed.cancelling(r))
                {
                    self.capacity.requeue_front(id.clone());
                }
            }
            ctx.run_later(ADMIT_RETRY, |act, ctx| act.admit(ctx));
            return;
        }
        // One cancelled meanwhile stays as its cancel left it, and does not start.
        let starts: Vec<(&str, u32)> = ids
            .iter()
            .filter(|id| self.owed.mark_running(id, now))
            .filter_map(|id| parse_child_id(id))
            .collect();
        self.start_children(&starts, ctx);
    }

    /// The running marks of the children `rows` (their rows, set running at `now` or about to
    /// be), and the writes that take them back: one start row per call for the children
    /// without a row of their own, their own row (running, and back to queued to take it
    /// back) for those with one.
    fn start_marks(&self, rows: &[&ChildRow], now: u64) -> (Writes, Writes) {
        let (mut writes, mut restore) = (Writes::default(), Writes::default());
        let mut fresh: Vec<(&str, u32)> = Vec::new();
        for &row in rows {
            if self.owed.rowed.contains(&row.child_id) {
                writes.children.push(ChildRow {
                    status: ChildStatus::Running,
                    started_at_ms: Some(now),
                    ..row.clone()
                });
                restore.children.push(ChildRow {
                    status: ChildStatus::Queued,
                    started_at_ms: None,
                    ..row.clone()
                });
            } else {
                fresh.push((&row.call_id, row.task_index));
            }
        }
        fresh.sort_unstable();
        for run in fresh.chunk_by(|a, b| a.0 == b.0) {
            let tasks = run.iter().map(|&(_, i)| i).collect();
            let start = StartRow::new(&self.session.session_id, run[0].0, tasks, now);
            restore.remove_starts.push(self.row_key(&start.start_id));
            writes.starts.push(start);
        }
        (writes, restore)
    }

    /// Decides putting a child whose start was lost back at the head of the queue, durably (its
    /// running mark was flushed; a crash must not find it `running` and call it `unknown`).
    pub(super) fn decide_requeue(&mut self, child_id: String) -> Decided<Durable> {
        // No unit starts this child now: a cancel decided for it while it was marked running
        // needs no mark for one (a cancelled child is not queued again, below).
        if let Some((call_id, task)) = parse_child_id(&child_id) {
            self.engine.forget_cancel(call_id, task, self.fence.1);
        }
        let Some(current) = self.owed.child(&child_id).cloned() else {
            return Decided::Done;
        };
        if current.status != ChildStatus::Running || self.owed.cancelling(&current) {
            return Decided::Done;
        }
        #[cfg(feature = "failpoints")]
        if crate::failpoints::fires("requeue_flush_stall") {
            crate::failpoints::arm("ledger_flush_stall", 1);
        }
        let mut queued = current.clone();
        queued.status = ChildStatus::Queued;
        queued.started_at_ms = None;
        let writes = Writes {
            children: vec![queued.clone()],
            ..Writes::default()
        };
        let restore = Writes {
            children: vec![current],
            ..Writes::default()
        };
        Decided::Step(Step {
            writes,
            restore,
            apply: Apply::Requeue { child_id, queued },
        })
    }

    /// Applies a lost start's requeue: the child goes back to the head of the queue once it is
    /// durably queued; a failed flush tries again later.
    pub(super) fn apply_requeue(
        &mut self,
        child_id: String,
        queued: ChildRow,
        res: Result<(), BroodError>,
        ctx: &mut Context<Self>,
    ) {
        if res.is_err() {
            ctx.run_later(ADMIT_RETRY, move |act, ctx| act.submit(Durable::Requeue(child_id), ctx));
            return;
        }
        // A cancel decided while the requeue was being written ended the child: it stays as its
        // cancel left it (out of capacity), and is not queued again. No unit starts it, so the
        // cancel, which waits for it to stop, is told it is gone.
        if self
            .owed
            .child(&child_id)
            .is_none_or(|r| r.status != ChildStatus::Running || self.owed.cancelling(r))
        {
            if let Some((call_id, task)) = parse_child_id(&child_id) {
                self.engine.forget_cancel(call_id, task, self.fence.1);
            }
            return;
        }
        self.emit_child(&queued);
        self.owed.rowed.insert(queued.child_id.clone());
        self.owed.put_child(queued);
        self.capacity.requeue_front(child_id);
        self.admit(ctx);
    }

    /// Decides a retry whose backoff ran out: the child's next attempt, queued, is written over
    /// the row of the attempt that ended. Nothing when it was cancelled meanwhile.
    pub(super) fn decide_retry(&mut self, child_id: String) -> Decided<Durable> {
        let Some(ended) = self.owed.retrying.get(&child_id).cloned() else {
            return Decided::Done;
        };
        let current = self.owed.child(&child_id);
        if current.is_none_or(|r| r.status != ChildStatus::Queued || self.owed.cancelling(r)) {
            self.owed.retrying.remove(&child_id);
            return Decided::Done;
        }
        let mut queued = ended.clone();
        queued.status = ChildStatus::Queued;
        (queued.started_at_ms, queued.finished_at_ms) = (None, None);
        (queued.summary, queued.output) = (None, None);
        queued.attempt = ended.attempt.saturating_add(1);
        Decided::Step(Step {
            writes: Writes {
                children: vec![queued.clone()],
                ..Writes::default()
            },
            restore: Writes {
                children: vec![ended],
                ..Writes::default()
            },
            apply: Apply::Retry { child_id, queued },
        })
    }

    /// Applies a retry: once the next attempt is durably queued, the child joins the queue; a
    /// failed flush tries again later.
    pub(super) fn apply_retry(
        &mut self,
        child_id: String,
        queued: ChildRow,
        res: Result<(), BroodError>,
        ctx: &mut Context<Self>,
    ) {
        if res.is_err() {
            ctx.run_later(ADMIT_RETRY, move |act, ctx| act.submit(Durable::Retry(child_id), ctx));
            return;
        }
        if self.owed.retrying.remove(&child_id).is_none() {
            return;
        }
        // A cancel decided while the retry was being written ended the child.
        if self
            .owed
            .child(&child_id)
            .is_none_or(|r| r.status != ChildStatus::Queued || self.owed.cancelling(r))
        {
            return;
        }
        // (Its watchers saw it queued as the wait began.)
        self.owed.rowed.insert(queued.child_id.clone());
        self.owed.put_child(queued);
        self.capacity.enqueue(child_id);
        self.engine.counters.retried();
        self.admit(ctx);
    }

    /// Hands started children (their rows marked running among the owed calls), named by call and task
    /// index, to their unit actors: each unit is sent its children in one message, and the
    /// units not running yet are started in one hop to the children's thread (this thread only
    /// makes their mailboxes, where the messages wait). Children a unit never starts are
    /// reported back by their message and queued again (they never ran).
    fn start_children(&mut self, starts: &[(&str, u32)], ctx: &mut Context<Self>) {
        // One address of this owner for every unit started here (copying an actix address
        // allocates twice).
        let me = Arc::new(ctx.address());
        let owner = me.downgrade();
        let mut new_units: Vec<NewUnit> = Vec::new();
        // Sized once (a unit per child at most): a call of independent children has a thousand
        // units, and growing these by doubling touched twice the memory.
        let mut batches: Vec<UnitBatch<'_>> = Vec::with_capacity(starts.len());
        let mut batch_of: foldhash::HashMap<(&str, usize), usize> =
            foldhash::HashMap::with_capacity_and_hasher(starts.len(), Default::default());
        // One allocation of the ids the children of a call share, for all its units.
        let mut ids_of: foldhash::HashMap<&str, Arc<CallIds>> = foldhash::HashMap::default();
        let session_id = &self.session.session_id;
        let events = &self.engine.events;
        for (at, &(call_id, i)) in starts.iter().enumerate() {
            // One lookup of the call for the child's row, task and unit.
            let Some(call) = self.owed.calls.get_mut(call_id) else {
                continue;
            };
            if call.cancelling.contains(&i) {
                continue; // its cancel is recorded instead
            }
            let (Some(row), Some(task), Some(unit_pos)) =
                (call.child(i), call.row.tasks.get(i as usize), call.unit_pos(i))
            else {
                continue;
            };
            let (start, task) = (Starting::of(row), task.clone());
            events.emit(session_id, || {
                child_event(row, row.status, call.row.traceparent.as_deref())
            });
            let Some(unit) = call.units.get_mut(unit_pos) else {
                continue;
            };
            let slot = match batch_of.get(&(call_id, unit_pos)) {
                Some(&b) => b,
                None => {
                    let ids = ids_of
                        .entry(call_id)
                        .or_insert_with(|| {
                            Arc::new(CallIds {
                                session_id: session_id.clone(),
                                call_id: call_id.to_string(),
                                traceparent: call.row.traceparent.as_deref().map(Arc::from),
                                engine: self.shared.clone(),
                            })
                        })
                        .clone();
                    // Unit `<call>-<k>` is at k - 1.
                    let unit_k = u32::try_from(unit_pos + 1).unwrap_or(u32::MAX);
                    if !unit.addr.as_ref().is_some_and(|a| a.connected()) {
                        let (addr, mailbox) = supervise::mailbox();
                        unit.addr = Some(addr);
                        // Inside this owner's span (the session's id).
                        let span = tracing::info_span!(
                            "unit",
                            call_id = %call_id,
                            unit_id = %unit.row.unit_id,
                            traceparent = tracing::field::Empty
                        );
                        if let Some(traceparent) = &call.row.traceparent {
                            span.record("traceparent", traceparent.as_str());
                        }
                        new_units.push(NewUnit {
                            mailbox,
                            span,
                            unit_id: unit.row.unit_id.clone(),
                            tasks: unit.row.tasks.as_slice().into(),
                            ids: ids.clone(),
                            unit_k,
                        });
                    }
                    // Room for the unit's members (usually all start together).
                    let room = unit.row.tasks.len().min(starts.len() - at);
                    batches.push((call_id, unit_pos, ids, unit_k, Vec::with_capacity(room)));
                    batch_of.insert((call_id, unit_pos), batches.len() - 1);
                    batches.len() - 1
                }
            };
            batches[slot].4.push((start, task));
        }
        // Into the units' mailboxes now; a new unit reads its own once it started. A message
        // with no unit to go to reports its children lost as it is dropped.
        for (call_id, unit_pos, ids, unit_k, children) in batches {
            let msg = StartChildren::new(ids, unit_k, children, (owner.clone(), self.fence.1));
            let unit = self.owed.calls.get(call_id).and_then(|c| c.units.get(unit_pos));
            if let Some(addr) = unit.and_then(|u| u.addr.as_ref()) {
                addr.do_send(msg);
            }
        }
        if new_units.is_empty() {
            return;
        }
        let engine = self.shared.clone();
        // If this never runs (the arbiter is gone), the mailboxes are dropped with it, and so
        // are the messages waiting in them: each reports its children lost.
        let started = self.engine.children_arbiter.spawn_fn(move || {
            for u in new_units {
                let watcher = owner.clone();
                let unit = Unit::new(u.unit_id, u.tasks, engine.clone(), me.clone());
                let (ids, unit_k) = (u.ids, u.unit_k);
                supervise::run_here(u.mailbox, unit, u.span, move |exit| {
                    if let exit @ Exit::Panicked(_) = exit {
                        if let Some(owner) = watcher.upgrade() {
                            let unit_id = unit_id(&ids.call_id, unit_k as usize);
                            owner.do_send(UnitExited { unit_id, exit });
                        }
                    }
                });
            }
        });
        if !started {
            tracing::warn!("the children's arbiter is gone; the admitted children are queued again");
        }
    }

    /// A unit actor's task ended. A panic restarts it (lazily, at the next start of one of its
    /// children) within the restart budget; past it, the failure escalates to this owner.
    pub(super) fn unit_exited(&mut self, unit_id: &str, exit: Exit, ctx: &mut Context<Self>) {
        let Exit::Panicked(msg) = exit else { return };
        tracing::error!(unit = unit_id, "unit actor panicked: {msg}");
        let decision = self.unit_budgets.on_failure(unit_id, std::time::Instant::now());
        if decision == Decision::Escalate {
            panic!("unit {unit_id} keeps panicking ({msg}); escalating to its session owner's supervisor");
        }
        if let Some(unit) = self.owed.unit_mut(unit_id) {
            // Only forget the dead actor, not a replacement a requeue already started.
            if unit.addr.as_ref().is_some_and(|a| !a.connected()) {
                unit.addr = None;
            }
        }
        self.admit(ctx);
    }
}

/// A unit (its call and its place in the call's units), the ids its call's children share,
/// its ordinal k in the call, and the children it is to start.
type UnitBatch<'a> = (&'a str, usize, Arc<CallIds>, u32, Vec<(Starting, Task)>);

/// A unit actor to start on the children's thread: its mailbox (made here, where messages to
/// it wait), its id and members, and what its exit is reported with.
struct NewUnit {
    mailbox: supervise::Mailbox<Unit>,
    /// The span it runs in: its call's and its own id, inside its owner's.
    span: tracing::Span,
    unit_id: String,
    tasks: Box<[u32]>,
    ids: Arc<CallIds>,
    unit_k: u32,
}
