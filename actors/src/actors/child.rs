//! The Child actor: one execution of one task.
//!
//! It builds its runner and runs it inside its own context, with the runner's future wrapped
//! in `catch_unwind` (so a panic ends only this child, as `failed`, and no task of its own is
//! spawned per child), arms the task timeout and the stall clock when the runner starts, and when the
//! child is terminal hands its row to the [`Coalescer`](super::coalescer::Coalescer). It keeps the row until the coalescer
//! answers that the owner recorded it; a failed hand-off is retried with backoff, never dropped.
//! It does not decide readiness or capacity: that is the session owner's.
//!
//! It runs inside the `child` span its unit made (inside the unit's and the owner's): what it
//! and its runner log carries its session's, call's and own id. The span is kept in the child's
//! [`Progress`], not in the actor, whose task would grow past its allocation's size class, and
//! is entered by each handler, timer and hand-off answer, and around each poll of the runner.
//!
//! A live child is kept small (DESIGN.md: about an actix actor's own size): the ids its row
//! repeats are one [`CallIds`] shared by every child of its call, what only starting needs is
//! boxed and dropped once it started, and its row is built whole only when it ended.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix::WeakAddr;
use futures::FutureExt;

use super::coalescer::{Ended, HandOffError, Terminal};
use super::unit::{ChildStopped, Starting, Unit};
use super::Engine;
use crate::model::{child_id, now_ms, panic_message, ChildStatus, Task, MAX_OUTPUT_BYTES};
use crate::runner::{Progress, RecordOutcome, RunContext, RunOutput};

/// First hand-off retry delay; doubles up to [`HANDOFF_BACKOFF_MAX`].
pub(crate) const HANDOFF_BACKOFF_START: Duration = Duration::from_millis(10);
pub(crate) const HANDOFF_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Stop the child's runner and end it `cancelled` (its owner records it so).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Cancel {
    /// Who cancelled it, and why (its error text).
    pub reason: String,
    /// Dropped with the message, once the child handled it: its runner is dropped by then
    /// (before this child's thread runs anything else), or it had ended already.
    pub(crate) gone: super::Gone,
}

/// What every child of one call shares: the ids its row repeats and the engine. One
/// allocation per call admitted (a child's own id and its unit's are made from them when it
/// ends).
pub struct CallIds {
    /// The owning session.
    pub session_id: String,
    /// The call.
    pub call_id: String,
    /// The call's W3C trace context, handed to each child's runner.
    pub traceparent: Option<Arc<str>>,
    /// The engine the children run in.
    pub engine: Arc<Engine>,
}

impl std::fmt::Debug for CallIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallIds")
            .field("session_id", &self.session_id)
            .field("call_id", &self.call_id)
            .field("traceparent", &self.traceparent)
            .finish()
    }
}

/// One task execution.
///
/// Kept to a few words (a test pins its size): what the child needs while it runs is inline,
/// what it needs only before it starts or after it ended is boxed in `aside`.
pub struct Child {
    ids: Arc<CallIds>,
    /// Its unit, told when this child stops (a weak address: no sender of its own per child).
    unit: WeakAddr<Unit>,
    progress: Progress,
    /// Before it starts, and after it ended; `None` while it runs.
    aside: Option<Box<Aside>>,
    /// The runner's future in this context, until the child ends (then it is dropped).
    runner: Option<SpawnHandle>,
    /// When its runner started (the owner's mark); [`NOT_STARTED`] if the row had none.
    started_at_ms: u64,
    task_index: u32,
    /// Its unit's ordinal in the call (`<call>-<k>`).
    unit_k: u32,
    attempt: u32,
    recovered: bool,
}

/// `started_at_ms` of a row that had none.
const NOT_STARTED: u64 = u64::MAX;

/// What a child keeps aside from its running state.
enum Aside {
    /// Not started yet: what starting needs, dropped once it started.
    Waiting {
        task: Task,
        /// Cancelled before it started: it ends at once, its runner never built.
        cancelled: Option<String>,
    },
    /// Ended: how, kept until the owner recorded it, and the next hand-off retry delay.
    Ended { end: Ended, backoff: Duration },
}

impl std::fmt::Debug for Child {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stage = match self.aside.as_deref() {
            Some(Aside::Waiting { .. }) => "starting".to_string(),
            None => "running".to_string(),
            Some(Aside::Ended { end, .. }) => format!("ended {}", end.status),
        };
        f.debug_struct("Child")
            .field("child_id", &self.child_id())
            .field("stage", &stage)
            .finish()
    }
}

impl Child {
    /// A child (already marked running by its owner, as `start` says) of the call `ids` names,
    /// in that call's unit `unit_k`, supervised by `unit`. Its terminal row is made from these
    /// when it ends; the delivery state of a child that has not ended is empty, and the ledger
    /// keeps a stored one anyway. It runs in `span`.
    pub fn new(
        ids: Arc<CallIds>,
        unit_k: u32,
        start: Starting,
        (task, span): (Task, tracing::Span),
        unit: WeakAddr<Unit>,
    ) -> Self {
        Child {
            ids,
            unit,
            progress: Progress::new(span),
            aside: Some(Box::new(Aside::Waiting { task, cancelled: None })),
            runner: None,
            started_at_ms: start.started_at_ms.unwrap_or(NOT_STARTED),
            task_index: start.task_index,
            unit_k,
            attempt: start.attempt,
            recovered: start.recovered,
        }
    }

    /// A child cancelled before it started: it ends `cancelled` as it starts (`reason` is its
    /// error text).
    pub fn cancelled(mut self, reason: Option<String>) -> Self {
        if let Some(Aside::Waiting { cancelled, .. }) = self.aside.as_deref_mut() {
            *cancelled = reason;
        }
        self
    }

    /// Its id, `<call_id>.<index>`.
    fn child_id(&self) -> String {
        child_id(&self.ids.call_id, self.task_index)
    }

    /// Its span, entered until the guard is dropped (a copy: the child stays free to change);
    /// nothing when no subscriber records it, so that a child's handlers cost no more then.
    fn entered(&self) -> Option<tracing::span::EnteredSpan> {
        let span = self.progress.span();
        (!span.is_disabled()).then(|| span.clone().entered())
    }

    fn ended(&self) -> bool {
        matches!(self.aside.as_deref(), Some(Aside::Ended { .. }))
    }

    /// Ends the child `cancelled`, its runner dropped (a command's process group is killed).
    fn cancel(&mut self, ctx: &mut Context<Self>, reason: String) {
        let partial = self.progress.take_partial();
        self.end(ctx, ChildStatus::Cancelled, partial, Some(reason));
    }

    fn end(&mut self, ctx: &mut Context<Self>, status: ChildStatus, summary: Option<String>, error: Option<String>) {
        self.end_with(ctx, status, (summary, None), error);
    }

    /// Ends the child with its summary and its data (as JSON text).
    fn end_with(
        &mut self,
        ctx: &mut Context<Self>,
        status: ChildStatus,
        (summary, output): (Option<String>, Option<String>),
        error: Option<String>,
    ) {
        if self.ended() {
            return;
        }
        if let Some(handle) = self.runner.take() {
            // Dropped, as an aborted task's future would be (a command runner kills its
            // process group when dropped).
            ctx.cancel_future(handle);
        }
        let end = Ended {
            ids: self.ids.clone(),
            unit_k: self.unit_k,
            task_index: self.task_index,
            attempt: self.attempt,
            recovered: self.recovered,
            status,
            summary,
            output,
            error,
            started_at_ms: (self.started_at_ms != NOT_STARTED).then_some(self.started_at_ms),
            finished_at_ms: now_ms(),
        };
        tracing::debug!(status = %status, "child ended");
        self.aside = Some(Box::new(Aside::Ended {
            end,
            backoff: HANDOFF_BACKOFF_START,
        }));
        self.hand_off(ctx);
    }

    fn hand_off(&mut self, ctx: &mut Context<Self>) {
        let Some(Aside::Ended { end, .. }) = self.aside.as_deref() else {
            return;
        };
        let answer = self.ids.engine.hand_off(Terminal::Ended(end.clone()));
        async move { answer.await.unwrap_or(Err(HandOffError::Stopped)) }
            .into_actor(self)
            .map(|res, act, ctx| {
                let _in = act.entered();
                act.handed_off(res, ctx)
            })
            .spawn(ctx);
    }

    /// The coalescer answered a hand-off: the child stops once its row is recorded (or refused
    /// for good); a failed hand-off is tried again after a backoff.
    fn handed_off(&mut self, res: Result<ChildStatus, HandOffError>, ctx: &mut Context<Self>) {
        match res {
            Ok(status) => {
                self.ids
                    .engine
                    .factory
                    .recorded(&self.child_id(), RecordOutcome::Stored(status));
                ctx.stop()
            }
            Err(_) if !super::running(ctx) => {} // shutting down: the ledger recovers the rest
            Err(HandOffError::Moved) => {
                tracing::info!("the child's session moved to another process; its result was not recorded here");
                self.ids
                    .engine
                    .factory
                    .recorded(&self.child_id(), RecordOutcome::Refused);
                ctx.stop();
            }
            Err(e) => {
                let Some(Aside::Ended { backoff, .. }) = self.aside.as_deref_mut() else {
                    return;
                };
                let delay = *backoff;
                *backoff = (delay * 2).min(HANDOFF_BACKOFF_MAX);
                tracing::warn!(retry_in = ?delay, "hand-off failed: {e}");
                ctx.run_later(delay, |act, ctx| act.hand_off(ctx));
            }
        }
    }

    /// The stall clock: ends the child `interrupted` once its runner was silent for
    /// `stall_ms`, else looks again when it would be (the setting travels with the clock, not
    /// in the child).
    fn check_stall(&mut self, ctx: &mut Context<Self>, stall_ms: u64) {
        let _in = self.entered();
        if self.aside.is_some() || !super::running(ctx) {
            return;
        }
        let silent_for = self.progress.elapsed_ms().saturating_sub(self.progress.last_beat_ms());
        if silent_for >= stall_ms {
            let partial = self.progress.take_partial();
            let error = format!("no progress for {silent_for} ms (stall timeout {stall_ms} ms)");
            self.end(ctx, ChildStatus::Interrupted, partial, Some(error));
        } else {
            let left = stall_ms - silent_for;
            ctx.run_later(Duration::from_millis(left), move |act, ctx| {
                act.check_stall(ctx, stall_ms)
            });
        }
    }

    /// Builds the runner from its spec and starts it, all of the embedder's code under
    /// `catch_unwind`: a panic building or starting it is this child's failure. The runner's
    /// future alone is kept (as one boxed future in this child's context).
    fn start_runner(&mut self, ctx: &mut Context<Self>, task: Task) {
        let Task {
            goal,
            runner_json,
            timeout_ms,
            input,
            ..
        } = task;
        let input = match input.as_deref().map(serde_json::from_str::<serde_json::Value>) {
            None => None,
            Some(Ok(value)) => Some(value),
            Some(Err(e)) => {
                let error = format!("the task's stored input is not JSON: {e}");
                return self.end(ctx, ChildStatus::Failed, None, Some(error));
            }
        };
        let engine = &self.ids.engine;
        let run_ctx = RunContext {
            child_id: self.child_id(),
            parent_session_id: self.ids.session_id.clone(),
            call_id: self.ids.call_id.clone(),
            goal,
            input,
            attempt: self.attempt,
            deadline_at_ms: timeout_ms.map(|ms| now_ms().saturating_add(ms)),
            progress: self.progress.clone(),
            traceparent: self.ids.traceparent.clone(),
            embedder: engine.embedder.clone(),
        };
        let factory = &engine.factory;
        let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if crate::failpoints::fires("runner_hang") {
                return Ok(Box::pin(futures::future::pending()) as futures::future::LocalBoxFuture<'static, RunOutput>);
            }
            let spec = serde_json::from_str::<serde_json::Value>(&runner_json)
                .map_err(|e| format!("runner spec is not JSON: {e}"))?;
            let runner = factory
                .build(&spec)
                .map_err(|e| format!("runner could not be built: {e}"))?;
            Ok(runner.run(run_ctx))
        }));
        drop(runner_json);
        let mut run = match started {
            Ok(Ok(run)) => run,
            Ok(Err(error)) => return self.end(ctx, ChildStatus::Failed, None, Some(error)),
            Err(panic) => return self.panicked(ctx, panic),
        };
        // A runner done at its first poll (a zero-time sim, an answer at hand) ends the child
        // here: no future in this context and no clocks. One that is not goes on in this
        // context, which polls it again in this same turn (actix polls what `started` spawned
        // before it returns), handing it the real waker in place of this one.
        let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
            run.as_mut().poll(&mut cx)
        }));
        match first {
            Ok(std::task::Poll::Ready(out)) => return self.finish(ctx, Ok(out)),
            Ok(std::task::Poll::Pending) => {}
            Err(panic) => return self.finish(ctx, Err(panic)),
        }
        let in_span = tracing::Instrument::instrument(run, self.progress.span().clone());
        let guarded = std::panic::AssertUnwindSafe(in_span).catch_unwind();
        let handle = ctx.spawn(guarded.into_actor(self).map(|res, act, ctx| {
            let _in = act.entered();
            act.runner = None;
            act.finish(ctx, res);
        }));
        self.runner = Some(handle);
    }

    /// Ends the child as its runner's end says: its output, or the panic that ended it.
    fn finish(&mut self, ctx: &mut Context<Self>, res: Result<RunOutput, Box<dyn std::any::Any + Send>>) {
        let (status, summary, output, error) = match res {
            Ok(RunOutput::Succeeded { summary, output }) => (ChildStatus::Succeeded, Some(summary), output, None),
            Ok(RunOutput::Failed { error, summary, output }) => (ChildStatus::Failed, summary, output, Some(error)),
            Err(panic) => return self.panicked(ctx, panic),
        };
        match output.filter(|v| !v.is_null()).map(|v| v.to_string()) {
            Some(text) if text.len() > MAX_OUTPUT_BYTES => {
                let error = format!(
                    "its output is {} bytes of JSON; at most {MAX_OUTPUT_BYTES} are recorded{}",
                    text.len(),
                    error
                        .map(|e| format!(" (and it ended {status}: {e})"))
                        .unwrap_or_default()
                );
                self.end(ctx, ChildStatus::Failed, summary, Some(error))
            }
            output => self.end_with(ctx, status, (summary, output), error),
        }
    }

    /// Its runner panicked (building, starting or running): it ends `failed`, with the panic
    /// message and whatever partial result the runner reported.
    fn panicked(&mut self, ctx: &mut Context<Self>, panic: Box<dyn std::any::Any + Send>) {
        let msg = panic_message(panic);
        let partial = self.progress.take_partial();
        self.end(
            ctx,
            ChildStatus::Failed,
            partial,
            Some(format!("runner panicked: {msg}")),
        );
    }
}

impl Actor for Child {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Context<Self>) {
        let _in = self.entered();
        self.ids.engine.child_stopped(&self.ids.call_id, self.task_index);
        if let Some(unit) = self.unit.upgrade() {
            unit.do_send(ChildStopped {
                task_index: self.task_index,
            });
        }
    }

    fn started(&mut self, ctx: &mut Context<Self>) {
        let _in = self.entered();
        // The runner starts now, and so do its clocks (a queued child's stall clock never runs).
        self.progress = Progress::new(self.progress.span().clone());
        let Some(Aside::Waiting { task, cancelled }) = self.aside.take().map(|b| *b) else {
            return;
        };
        if let Some(reason) = cancelled {
            return self.cancel(ctx, reason);
        }
        // Moved, not copied: once its runner started, a child keeps only its clocks.
        let (timeout_ms, stall_ms) = (task.timeout_ms, task.stall_ms);
        self.start_runner(ctx, task);
        if self.ended() {
            return; // it could not be built or started
        }
        if let Some(ms) = timeout_ms {
            ctx.run_later(Duration::from_millis(ms), move |act, ctx| {
                let _in = act.entered();
                let partial = act.progress.take_partial();
                act.end(
                    ctx,
                    ChildStatus::TimedOut,
                    partial,
                    Some(format!("timed out after {ms} ms")),
                );
            });
        }
        ctx.run_later(Duration::from_millis(stall_ms), move |act, ctx| {
            act.check_stall(ctx, stall_ms)
        });
    }
}

impl Handler<Cancel> for Child {
    type Result = ();

    fn handle(&mut self, Cancel { reason, gone }: Cancel, ctx: &mut Context<Self>) {
        let _in = self.entered();
        self.cancel(ctx, reason);
        drop(gone);
    }
}

#[cfg(test)]
mod tests {
    /// A live child is a few words beside its actor's context: 72 bytes keep its actor's tokio
    /// task in a 512-byte cell (rss_per_live_child_bytes). Growing it is a measured decision.
    #[test]
    fn a_live_child_is_a_few_words() {
        assert!(
            std::mem::size_of::<super::Child>() <= 72,
            "Child is {} bytes",
            std::mem::size_of::<super::Child>()
        );
    }
}
