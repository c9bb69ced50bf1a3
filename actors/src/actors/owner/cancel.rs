//! Cancelling a call, a unit or one child.
//!
//! Every unfinished child under the target is recorded `cancelled` through the coalescer, as
//! any child's end is (so the first terminal row wins: a child that really ended first keeps
//! its own end, and is counted as already finished, not as cancelled). Queued children leave the queue at once and
//! never start; running ones are told to stop through the engine's registry of live children,
//! which reaches them whichever owner or unit incarnation started them (their runner is
//! dropped, a command's process group killed). A running child keeps its slot until its runner
//! is stopped or known gone (it never started, or its start was lost), so a session never runs
//! more children than its capacity. The request is answered once the rows are recorded and
//! those slots are free; a coalescer that restarts meanwhile is waited for, as a child waits
//! for it. A cancelled child's unit goes out whole like any other (a cancel raises no failure
//! notice).

use actix::prelude::*;
use futures::future::join_all;

use super::persist::{BatchView, Decided};
use super::{Durable, EndNested, SessionOwner};
use crate::actors::child::{HANDOFF_BACKOFF_MAX, HANDOFF_BACKOFF_START};
use crate::actors::coalescer::{HandOffError, Terminal};
use crate::actors::{Engine, RunnersStopped};
use crate::error::BroodError;
use crate::events::Event;
use crate::model::*;

/// What cancelling a target decided: the cancelled rows to record, how many children under it
/// had ended already, and the running ones being stopped (they keep their slots until they
/// are).
struct Decision {
    rows: Vec<ChildRow>,
    already_finished: usize,
    stopping: Option<(Vec<String>, RunnersStopped)>,
}

/// The running children a cancel stopped are stopped or known gone: their slots are free.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct RunnersEnded {
    children: Vec<String>,
}

impl Handler<RunnersEnded> for SessionOwner {
    type Result = ();

    fn handle(&mut self, RunnersEnded { children }: RunnersEnded, ctx: &mut Context<Self>) {
        for child in &children {
            self.capacity.finish(child);
            self.stopping.remove(child);
        }
        self.admit(ctx);
        self.after_change(ctx);
    }
}

impl SessionOwner {
    /// Cancels what `target` names; `stored` is its call's row when no owner holds the call
    /// in memory (it ended, so nothing under it can be cancelled).
    pub(super) fn cancel(
        &mut self,
        target: CancelTarget,
        reason: String,
        stored: Option<CallRow>,
        ctx: &mut Context<Self>,
    ) -> ResponseFuture<Result<Cancelled, BroodError>> {
        let unknown = || BroodError::UnknownTarget {
            kind: target.kind(),
            id: target.id().to_string(),
        };
        let decided = match target.call_id().filter(|c| self.owed.calls.contains_key(*c)) {
            Some(_) => self.decide_cancel(&target, &reason).ok_or_else(unknown),
            None => match stored.as_ref().and_then(|row| target.tasks(row)) {
                Some(tasks) => Ok(Decision {
                    rows: Vec::new(),
                    already_finished: tasks.len(),
                    stopping: None,
                }),
                None => Err(unknown()),
            },
        };
        let decision = match decided {
            Ok(d) => d,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        let engine = self.shared.clone();
        let session = self.session.session_id.clone();
        let me = ctx.address().downgrade();
        Box::pin(async move {
            let Decision {
                rows,
                already_finished,
                stopping,
            } = decision;
            if rows.is_empty() {
                return Ok(Cancelled {
                    cancelled: Vec::new(),
                    already_finished,
                });
            }
            let stopped = async {
                let (children, runners) = stopping?;
                runners.wait().await;
                Some(children)
            };
            let decided = rows.len();
            let (recorded, stopped) = futures::join!(record_all(&engine, rows), stopped);
            // Their slots are free once the owner that held them knows (a successor of it
            // counted afresh what it found alive).
            if let (Some(children), Some(owner)) = (stopped, me.upgrade()) {
                let _ = owner.send(RunnersEnded { children }).await;
            }
            let mut cancelled = recorded?;
            // A child whose own end was recorded before its cancel row had ended already.
            let already_finished = already_finished + (decided - cancelled.len());
            engine.events.emit(&session, || Event::Cancel {
                kind: target.kind(),
                id: target.id().to_string(),
                cancelled: cancelled.clone(),
                reason: reason.clone(),
            });
            let nested = end_nested(&engine, &cancelled, |child| {
                format!("its parent child `{child}` was cancelled ({reason})")
            })
            .await;
            cancelled.extend(nested.cancelled);
            Ok(Cancelled {
                cancelled,
                already_finished,
            })
        })
    }

    /// Ends this nested session, its child having ended: every call's unfinished children are
    /// cancelled (descendants too) and no call is accepted any more. Waits for the dispatches
    /// in the batch before it, so a call accepted just before is cancelled too.
    pub(super) fn decide_end_nested(
        &mut self,
        reason: String,
        reply: tokio::sync::oneshot::Sender<Result<Cancelled, BroodError>>,
        view: &BatchView,
        ctx: &mut Context<Self>,
    ) -> Decided<Durable> {
        if view.session.next_set != self.session.next_set {
            return Decided::Later(Durable::EndNested(reason, reply));
        }
        self.parent_ended = Some(reason.clone());
        let calls: Vec<String> = self.owed.calls.keys().cloned().collect();
        let cancels: Vec<_> = calls
            .into_iter()
            .map(|call| self.cancel(CancelTarget::Call(call), reason.clone(), None, ctx))
            .collect();
        let all = async move {
            let mut out = Cancelled::default();
            for done in join_all(cancels).await {
                match done {
                    Ok(c) => out.absorb(c),
                    // A call that settled meanwhile has nothing left to cancel.
                    Err(BroodError::UnknownTarget { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(out)
        };
        ctx.spawn(actix::fut::wrap_future(async move {
            let _ = reply.send(all.await);
        }));
        Decided::Done
    }

    /// Marks the unfinished children under `target` cancelled among the owed calls (so nothing starts
    /// them), takes the queued ones out of capacity, tells those that run to stop (they leave
    /// capacity once they did), and returns their cancelled rows to record. None: the target
    /// names nothing in its call.
    fn decide_cancel(&mut self, target: &CancelTarget, reason: &str) -> Option<Decision> {
        let call = self.owed.calls.get_mut(target.call_id()?)?;
        let tasks = target.tasks(&call.row)?;
        let now = now_ms();
        let mut decision = Decision {
            rows: Vec::new(),
            already_finished: 0,
            stopping: None,
        };
        let mut stop: Vec<u32> = Vec::new();
        let mut queued: foldhash::HashSet<String> = Default::default();
        for task in tasks {
            let Some(row) = call.child(task) else {
                // Recovery found this child's row damaged and resolved it: it is over.
                decision.already_finished += 1;
                continue;
            };
            if row.status.is_terminal() {
                decision.already_finished += 1;
                continue;
            }
            let mut row = row.clone();
            if !call.cancelling.insert(task) {
                continue; // an earlier cancel of it is being recorded
            }
            if row.status == ChildStatus::Running {
                stop.push(task);
            } else {
                queued.insert(row.child_id.clone());
            }
            row.status = ChildStatus::Cancelled;
            row.finished_at_ms = Some(now);
            row.summary = None;
            row.output = None;
            row.error = Some(reason.to_string());
            decision.rows.push(row);
        }
        // Whichever unit started them, and whether or not it has yet (one it starts from now
        // on ends it `cancelled` as it starts, its runner never built).
        if !stop.is_empty() {
            let call_id = &call.row.call_id;
            let runners = self
                .engine
                .cancel_running(call_id, stop.iter().copied(), reason, self.fence.1);
            let children: Vec<String> = stop.iter().map(|&t| child_id(call_id, t)).collect();
            for child in &children {
                self.engine.factory.cancelled(child);
            }
            self.stopping.extend(children.iter().cloned());
            decision.stopping = Some((children, runners));
        }
        self.capacity.withdraw(&queued);
        Some(decision)
    }
}

/// Ends, in the background, the nested sessions of those of `children` that have one, these
/// children having ended on their own (not by a cancel, which ends the nested sessions of what
/// it cancelled itself, and reports them).
pub(super) fn end_nests_of_ended(engine: std::sync::Arc<Engine>, children: Vec<String>) {
    let end = async move {
        end_nested(&engine, &children, parent_ended_reason).await;
    };
    actix::spawn(tracing::Instrument::in_current_span(end));
}

/// Ends the nested sessions of those of `children` that have one (their calls' unfinished
/// children cancelled with `why(child)` as the reason, their descendants too), and what that
/// cancelled. A nested session that cannot be reached now is ended when the engine next opens.
pub(crate) async fn end_nested(
    engine: &crate::actors::Engine,
    children: &[String],
    why: impl Fn(&str) -> String,
) -> Cancelled {
    let mut out = Cancelled::default();
    for child in children.iter().filter(|c| engine.is_nested(c)) {
        let Some(owner) = engine.owner(child) else {
            continue;
        };
        match owner.send(EndNested { reason: why(child) }).await {
            Ok(Ok(c)) => out.absorb(c),
            Ok(Err(e)) => tracing::warn!(session = %child, "ending a nested session failed: {e}"),
            Err(_) => tracing::warn!(session = %child, "a nested session's owner stopped before it was ended"),
        }
    }
    out
}

/// Hands the cancelled rows to the coalescer, each as a child's end is handed over: a failed
/// hand-off, or one a restarting coalescer dropped unanswered, is tried again, as a child tries
/// again. Gives up when the engine has no coalescer any more (it is stopping), or when another
/// process took the session over (its rows are refused here). The ids of those it stored
/// `cancelled`.
async fn record_all(engine: &Engine, rows: Vec<ChildRow>) -> Result<Vec<String>, BroodError> {
    let sends = rows.into_iter().map(|row| async move {
        let mut backoff = HANDOFF_BACKOFF_START;
        loop {
            let failed = match engine.hand_off(Terminal::Row(row.clone())).await {
                Ok(Ok(status)) => return Ok((row.child_id, status)),
                // Another process took the session over: its row is not recorded here, and a
                // retry of the cancel reaches the new holder.
                Ok(Err(HandOffError::Moved)) => {
                    return Err(BroodError::TenureLapsed {
                        session: row.session_id,
                    })
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) if engine.coalescer().is_none() => return Err(BroodError::Stopped),
                Err(_) => "the coalescer stopped before it answered".to_string(),
            };
            tracing::warn!(child = %row.child_id, retry_in = ?backoff, "recording a cancel failed: {failed}");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(HANDOFF_BACKOFF_MAX);
        }
    });
    let stored = join_all(sends).await.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok(stored
        .into_iter()
        .filter(|(_, status)| *status == ChildStatus::Cancelled)
        .map(|(id, _)| id)
        .collect())
}
