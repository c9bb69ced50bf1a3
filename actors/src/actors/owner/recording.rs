//! Recording completions: terminal rows the coalescer flushed come here. A child's end frees
//! its slot; a failure in an incomplete unit publishes an early failure notice; a unit's last
//! child publishes every member's result (a unit goes out whole); a sync call's last unit hands
//! the results to its caller. Nothing here writes: the rows are durable already (I1).

use actix::prelude::*;

use super::SessionOwner;
use crate::actors::unit::{Unit, UnitCompleted};
use crate::model::*;
use crate::routing::{on_child_end, Publish};
use crate::totals::DeliveryStage;

impl SessionOwner {
    /// Records terminal rows and publishes what they make ready.
    pub(super) fn record(&mut self, rows: Vec<ChildRow>, ctx: &mut Context<Self>) {
        let mut completed = Vec::new();
        let mut nests_ended = Vec::new();
        for mut row in rows {
            // One lookup of the call for what the owed calls know of the child.
            let Some(call) = self.owed.calls.get(&row.call_id) else {
                continue;
            };
            let Some(known) = call.child(row.task_index) else {
                continue;
            };
            if known.status.is_terminal() || !row.status.is_terminal() || row.attempt < known.attempt {
                // A retried hand-off of a result already recorded, or the end of an attempt
                // the ledger holds a later attempt of (the stored row came back).
                continue;
            }
            // Delivery state is the owner's; the child's copy of it may be stale.
            (row.result, row.notice) = (known.result, known.notice);
            // A cancelled child left capacity as it was cancelled.
            if !call.cancelling.contains(&row.task_index) {
                self.capacity.finish(&row.child_id);
                // Ended before this owner started it: a cancel the owner before this one
                // decided for it waits for a start that died with that owner.
                if self.inherited_cancels {
                    let (call_id, task) = (row.call_id.as_str(), row.task_index);
                    let owed = &self.owed;
                    let left = self.engine.forget_stale_cancels(self.fence.1, |c, t| {
                        owed.calls.contains_key(c).then_some(c == call_id && t == task)
                    });
                    self.inherited_cancels = left;
                }
            }
            if !self.owed.rowed.is_empty() {
                self.owed.rowed.remove(&row.child_id);
            }
            if let Some(ended) = self.retry_later(row, ctx) {
                row = ended;
            } else {
                continue; // it runs again: its unit is not a child further
            }
            // Once: a row recorded again (a repeated completion, a cancel after the child's
            // own end) finds the child ended above, and so does an owner rebuilt since.
            self.engine.counters.ended(row.status, 1);
            let failed = row.status.is_failure();
            let (call_id, task, child) = (row.call_id.clone(), row.task_index, row.child_id.clone());
            self.emit_child(&row);
            // A cancel ends the nested sessions of what it cancelled itself (and reports them).
            if row.status != ChildStatus::Cancelled && self.engine.is_nested(&child) {
                nests_ended.push(child.clone());
            }
            // Only a failure can need its notice's details.
            let notice = failed.then(|| (row.status, row.error.clone()));
            let finished_at_ms = row.finished_at_ms;
            self.owed.put_child(row);
            let Some(call) = self.owed.calls.get_mut(&call_id) else {
                continue;
            };
            let sync = call.row.mode == Mode::Sync;
            let Some(unit) = call.unit_of_mut(task) else {
                continue;
            };
            unit.terminal = unit.terminal.saturating_add(1);
            match on_child_end(unit.terminal, unit.row.tasks.len(), failed) {
                Publish::UnitComplete => self.complete_unit(&call_id, task, &mut completed, ctx),
                Publish::FailureNotice if !sync => {
                    let now = now_ms();
                    if self.router.publish(dedup_key(&child, ItemKind::FailureNotice), 0, now) {
                        let ended = finished_at_ms.unwrap_or(now);
                        self.engine.counters.time(DeliveryStage::EndToReady, ended, now);
                    }
                    if let Some((status, error)) = notice {
                        self.emit(|| crate::events::Event::FailureNotice {
                            child_id: child.clone(),
                            call_id,
                            status,
                            error,
                        });
                    }
                }
                Publish::FailureNotice | Publish::Nothing => {}
            }
        }
        if !nests_ended.is_empty() {
            super::cancel::end_nests_of_ended(self.shared.clone(), nests_ended);
        }
        if !completed.is_empty() {
            // One hop to the units' thread for all of them (not a wake-up of it per unit); the
            // addresses are dropped there too.
            let _ = self.engine.children_arbiter.spawn_fn(move || {
                for addr in completed {
                    addr.do_send(UnitCompleted);
                }
            });
        }
    }

    /// A child whose attempt ended `failed` or `timed_out` and whose task's retry policy runs
    /// it again: it waits out the backoff queued (in memory; the ledger keeps the attempt's
    /// row until the retry is recorded), then the retry is made durable and it joins the
    /// queue. Hands the row back when the child is not run again.
    fn retry_later(&mut self, row: ChildRow, ctx: &mut Context<Self>) -> Option<ChildRow> {
        let policy = self.owed.task_of(&row).and_then(|t| t.retry);
        let Some(delay) = policy.and_then(|p| p.delay_after(row.attempt, row.status)) else {
            return Some(row);
        };
        if self.owed.cancelling(&row) {
            return Some(row);
        }
        tracing::info!(child = %row.child_id, attempt = row.attempt, status = %row.status, delay_ms = delay, "the child runs again");
        // Its next attempt already: a cancel meanwhile is recorded over the attempt that ended.
        let mut waiting = row.clone();
        waiting.attempt = row.attempt.saturating_add(1);
        waiting.status = ChildStatus::Queued;
        (waiting.started_at_ms, waiting.finished_at_ms) = (None, None);
        (waiting.summary, waiting.output) = (None, None);
        // Watchers see the attempt end, then the child queued as its next attempt.
        self.emit_child(&row);
        self.emit_child(&waiting);
        let child_id = row.child_id.clone();
        self.owed.retrying.insert(child_id.clone(), row);
        self.owed.put_child(waiting);
        ctx.run_later(std::time::Duration::from_millis(delay), move |act, ctx| {
            act.submit(super::Durable::Retry(child_id), ctx)
        });
        None
    }

    /// The unit of `call_id`'s task `task` is complete: it goes out whole.
    fn complete_unit(&mut self, call_id: &str, task: u32, completed: &mut Vec<Addr<Unit>>, ctx: &mut Context<Self>) {
        let Some(call) = self.owed.calls.get_mut(call_id) else {
            return;
        };
        let Some(unit) = call.unit_of_mut(task) else {
            return;
        };
        if unit.complete {
            return;
        }
        unit.complete = true;
        completed.extend(unit.addr.take());
        call.incomplete_units = call.incomplete_units.saturating_sub(1);
        match call.row.mode {
            Mode::Background => {
                let now = now_ms();
                for &i in call.unit_of(task).map_or(&[][..], |u| &u.row.tasks) {
                    let child = call.child(i);
                    let attempts = child.map_or(0, |r| r.result.failed_attempts);
                    let key = dedup_key(&child_id(call_id, i), ItemKind::Result);
                    if self.router.publish(key, attempts, now) {
                        let ended = child.and_then(|r| r.finished_at_ms).unwrap_or(now);
                        self.engine.counters.time(DeliveryStage::EndToReady, ended, now);
                    }
                }
            }
            Mode::Sync if call.incomplete_units == 0 => self.finish_sync(call_id, ctx),
            Mode::Sync => {}
        }
    }
}
