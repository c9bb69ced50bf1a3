//! Recording completions: terminal rows the coalescer flushed come here. A child's end frees
//! its slot; a failure in an incomplete unit publishes an early failure notice; a unit's last
//! child publishes every member's result (a unit goes out whole); a sync call's last unit hands
//! the results to its caller. Nothing here writes: the rows are durable already (I1).

use actix::prelude::*;

use super::SessionOwner;
use crate::actors::unit::{Unit, UnitComplete};
use crate::model::*;
use crate::routing::{on_child_end, Publish};

impl SessionOwner {
    /// Records terminal rows and publishes what they make ready.
    pub(super) fn record(&mut self, rows: Vec<ChildRow>, ctx: &mut Context<Self>) {
        let mut completed = Vec::new();
        for mut row in rows {
            let Some(known) = self.book.children.get(&row.child_id) else {
                continue;
            };
            if known.status.is_terminal() {
                continue; // a retried hand-off of a result already recorded
            }
            self.capacity.finish(&row.child_id);
            if !self.book.rowed.is_empty() {
                self.book.rowed.remove(&row.child_id);
            }
            // Delivery state is the owner's; the child's copy of it may be stale.
            row.result = known.result;
            row.notice = known.notice;
            let failed = row.status.is_failure();
            let (unit_id, child) = (row.unit_id.clone(), row.child_id.clone());
            self.emit_child(&row);
            // Only a failure can need its notice's details.
            let notice = failed.then(|| (row.call_id.clone(), row.status, row.error.clone()));
            self.book.put_child(row);
            let Some(unit) = self.book.units.get_mut(&unit_id) else {
                continue;
            };
            unit.terminal = unit.terminal.saturating_add(1);
            let sync = self
                .book
                .calls
                .get(&unit.row.call_id)
                .is_some_and(|c| c.row.mode == Mode::Sync);
            match on_child_end(unit.terminal, unit.row.tasks.len(), failed) {
                Publish::UnitComplete => self.complete_unit(&unit_id, &mut completed, ctx),
                Publish::FailureNotice if !sync => {
                    self.router.publish(dedup_key(&child, ItemKind::FailureNotice), 0);
                    if let Some((call_id, status, error)) = notice {
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
        if !completed.is_empty() {
            // One hop to the units' thread for all of them (not a wake-up of it per unit); the
            // addresses are dropped there too.
            let _ = self.engine.children_arbiter.spawn_fn(move || {
                for addr in completed {
                    addr.do_send(UnitComplete);
                }
            });
        }
    }

    fn complete_unit(&mut self, unit_id: &str, completed: &mut Vec<Addr<Unit>>, ctx: &mut Context<Self>) {
        let Some(unit) = self.book.units.get_mut(unit_id) else {
            return;
        };
        if unit.complete {
            return;
        }
        unit.complete = true;
        completed.extend(unit.addr.take());
        let call_id = unit.row.call_id.clone();
        let members: Vec<String> = unit.row.tasks.iter().map(|&i| child_id(&call_id, i)).collect();
        let Some(call) = self.book.calls.get_mut(&call_id) else {
            return;
        };
        call.incomplete_units = call.incomplete_units.saturating_sub(1);
        match call.row.mode {
            Mode::Background => {
                for id in members {
                    let attempts = self.book.children.get(&id).map_or(0, |r| r.result.failed_attempts);
                    self.router.publish(dedup_key(&id, ItemKind::Result), attempts);
                }
            }
            Mode::Sync if call.incomplete_units == 0 => self.finish_sync(&call_id, ctx),
            Mode::Sync => {}
        }
    }
}
