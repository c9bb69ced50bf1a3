//! The Child actor: one execution of one task.
//!
//! It builds its runner and runs it inside its own context, with the runner's future wrapped
//! in `catch_unwind` (so a panic ends only this child, as `failed`, and no task of its own is
//! spawned per child), arms the task timeout and the stall clock when the runner starts, and when the
//! child is terminal hands its row to the [`Coalescer`]. It keeps the row until the coalescer
//! answers that the owner recorded it; a failed hand-off is retried with backoff, never dropped.
//! It does not decide readiness or capacity: that is the session owner's.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use futures::FutureExt;

use super::coalescer::{Completion, HandOffError};
use super::unit::{ChildStopped, Unit};
use super::Engine;
use crate::model::{now_ms, panic_message, ChildRow, ChildStatus, Task};
use crate::runner::{Progress, RunContext, RunOutput};

/// First hand-off retry delay; doubles up to [`HANDOFF_BACKOFF_MAX`].
pub(crate) const HANDOFF_BACKOFF_START: Duration = Duration::from_millis(10);
pub(crate) const HANDOFF_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Stop the child's runner and end it `cancelled` (its owner recorded it so already).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Cancel {
    /// Who cancelled it, and why (its error text).
    pub reason: String,
}

/// One task execution.
pub struct Child {
    row: ChildRow,
    task: Task,
    engine: Arc<Engine>,
    unit: Addr<Unit>,
    progress: Progress,
    /// The runner's future in this context, until the child ends (then it is dropped).
    runner: Option<SpawnHandle>,
    ended: bool,
    backoff: Duration,
    /// Cancelled before it started: it ends at once, its runner never built.
    cancelled: Option<String>,
}

impl std::fmt::Debug for Child {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Child")
            .field("child_id", &self.row.child_id)
            .field("status", &self.row.status)
            .finish()
    }
}

impl Child {
    /// A child for `row` (already marked running by its owner), supervised by `unit`.
    pub fn new(row: ChildRow, task: Task, engine: Arc<Engine>, unit: Addr<Unit>) -> Self {
        Child {
            cancelled: None,
            row,
            task,
            engine,
            unit,
            progress: Progress::new(),
            runner: None,
            ended: false,
            backoff: HANDOFF_BACKOFF_START,
        }
    }

    /// A child cancelled before it started: it ends `cancelled` as it starts (`reason` is its
    /// error text).
    pub fn cancelled(mut self, reason: Option<String>) -> Self {
        self.cancelled = reason;
        self
    }

    /// Ends the child `cancelled`, its runner dropped (a command's process group is killed).
    fn cancel(&mut self, ctx: &mut Context<Self>, reason: String) {
        let partial = self.progress.take_partial();
        self.end(ctx, ChildStatus::Cancelled, partial, Some(reason));
    }

    fn end(&mut self, ctx: &mut Context<Self>, status: ChildStatus, summary: Option<String>, error: Option<String>) {
        if self.ended {
            return;
        }
        self.ended = true;
        if let Some(handle) = self.runner.take() {
            // Dropped, as an aborted task's future would be (a command runner kills its
            // process group when dropped).
            ctx.cancel_future(handle);
        }
        self.row.status = status;
        self.row.summary = summary;
        self.row.error = error;
        self.row.finished_at_ms = Some(now_ms());
        tracing::debug!(child = %self.row.child_id, status = %status, "child ended");
        self.hand_off(ctx);
    }

    fn hand_off(&mut self, ctx: &mut Context<Self>) {
        let msg = Completion { row: self.row.clone() };
        let coalescer = self.engine.coalescer();
        async move {
            match coalescer {
                Some(c) => c.send(msg).await.unwrap_or(Err(HandOffError::Stopped)),
                None => Err(HandOffError::Stopped),
            }
        }
        .into_actor(self)
        .map(|res, act, ctx| match res {
            Ok(_) => ctx.stop(),
            Err(_) if !super::running(ctx) => {} // shutting down: the ledger recovers the rest
            Err(HandOffError::Moved) => {
                tracing::info!(child = %act.row.child_id, "the child's session moved to another process; its result was not recorded here");
                ctx.stop();
            }
            Err(e) => {
                tracing::warn!(child = %act.row.child_id, retry_in = ?act.backoff, "hand-off failed: {e}");
                let delay = act.backoff;
                act.backoff = (act.backoff * 2).min(HANDOFF_BACKOFF_MAX);
                ctx.run_later(delay, |act, ctx| act.hand_off(ctx));
            }
        })
        .spawn(ctx);
    }

    fn check_stall(&mut self, ctx: &mut Context<Self>) {
        if self.ended || !super::running(ctx) {
            return;
        }
        let silent_for = self.progress.elapsed_ms().saturating_sub(self.progress.last_beat_ms());
        if silent_for >= self.task.stall_ms {
            let partial = self.progress.take_partial();
            let error = format!(
                "no progress for {} ms (stall timeout {} ms)",
                silent_for, self.task.stall_ms
            );
            self.end(ctx, ChildStatus::Interrupted, partial, Some(error));
        } else {
            let left = self.task.stall_ms - silent_for;
            ctx.run_later(Duration::from_millis(left), |act, ctx| act.check_stall(ctx));
        }
    }
}

impl Actor for Child {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.engine.child_stopped(&self.row.call_id, self.row.task_index);
        self.unit.do_send(ChildStopped {
            task_index: self.row.task_index,
        });
    }

    fn started(&mut self, ctx: &mut Context<Self>) {
        // The runner starts now, and so do its clocks (a queued child's stall clock never runs).
        self.progress = Progress::new();
        if let Some(reason) = self.cancelled.take() {
            return self.cancel(ctx, reason);
        }
        let run_ctx = RunContext {
            child_id: self.row.child_id.clone(),
            goal: std::mem::take(&mut self.task.goal),
            attempt: self.row.attempt,
            progress: self.progress.clone(),
            embedder: self.engine.embedder.clone(),
        };
        let factory = self.engine.factory.clone();
        // Taken, not copied: once its runner started, a child keeps only its clocks' settings.
        let runner_json = std::mem::take(&mut self.task.runner_json);
        let hang = crate::failpoints::fires("runner_hang");
        // Building and starting the runner happen inside the guarded future too, so a panic
        // anywhere in the embedder's code ends this child as `failed` and nothing else.
        let run = async move {
            if hang {
                futures::future::pending::<()>().await;
            }
            // The spec is parsed and the runner built before the run is awaited, and the
            // parsed spec, its text and the factory are dropped first: a running child keeps
            // only its runner.
            let built = match serde_json::from_str::<serde_json::Value>(&runner_json) {
                Err(e) => Err(format!("runner spec is not JSON: {e}")),
                Ok(spec) => factory
                    .build(&spec)
                    .map_err(|e| format!("runner could not be built: {e}")),
            };
            drop((runner_json, factory));
            match built {
                Ok(runner) => runner.run(run_ctx).await,
                Err(error) => RunOutput::Failed { error, summary: None },
            }
        };
        let guarded = std::panic::AssertUnwindSafe(run).catch_unwind();
        let handle = ctx.spawn(guarded.into_actor(self).map(|res, act, ctx| {
            act.runner = None;
            match res {
                Ok(RunOutput::Succeeded { summary }) => act.end(ctx, ChildStatus::Succeeded, Some(summary), None),
                Ok(RunOutput::Failed { error, summary }) => act.end(ctx, ChildStatus::Failed, summary, Some(error)),
                Err(panic) => {
                    let msg = panic_message(panic);
                    act.end(
                        ctx,
                        ChildStatus::Failed,
                        act.progress.take_partial(),
                        Some(format!("runner panicked: {msg}")),
                    )
                }
            }
        }));
        self.runner = Some(handle);
        if let Some(ms) = self.task.timeout_ms {
            ctx.run_later(Duration::from_millis(ms), move |act, ctx| {
                let partial = act.progress.take_partial();
                act.end(
                    ctx,
                    ChildStatus::TimedOut,
                    partial,
                    Some(format!("timed out after {ms} ms")),
                );
            });
        }
        ctx.run_later(Duration::from_millis(self.task.stall_ms), |act, ctx| {
            act.check_stall(ctx)
        });
    }
}

impl Handler<Cancel> for Child {
    type Result = ();

    fn handle(&mut self, msg: Cancel, ctx: &mut Context<Self>) {
        self.cancel(ctx, msg.reason);
    }
}
