//! Sync calls: the caller waits for every child and gets the results inline. They count as
//! delivered only once the caller's receipt comes back and its ack row is durable; a caller that
//! went away (or an owner that died first) leaves them undelivered, and they go out at
//! boundaries with the same dedup keys instead (at-least-once, never lost).

use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;

use super::apply::Apply;
use super::persist::{Decided, Step};
use super::{Durable, SessionOwner};
use crate::error::BroodError;
use crate::ledger::Writes;
use crate::model::*;
use crate::totals::DeliveryStage;

/// How long sync results wait for the caller's receipt before they go out at boundaries.
const SYNC_RECEIPT_WAIT: Duration = Duration::from_secs(3);

/// The caller of a sync call.
pub(super) struct SyncWaiter {
    tx: oneshot::Sender<Result<DelegateReply, BroodError>>,
    units: Vec<UnitInfo>,
    forced_sync_reason: Option<String>,
}

impl SyncWaiter {
    /// Whether its caller went away (it would not get the results).
    pub(super) fn gone(&self) -> bool {
        self.tx.is_closed()
    }
}

impl SessionOwner {
    /// Parks the caller of an accepted sync call until its last unit completes.
    pub(super) fn wait_sync(
        &mut self,
        call_id: &str,
        tx: oneshot::Sender<Result<DelegateReply, BroodError>>,
        units: Vec<UnitInfo>,
        forced_sync_reason: Option<String>,
    ) {
        if let Some(c) = self.owed.calls.get_mut(call_id) {
            c.sync_reply = Some(SyncWaiter {
                tx,
                units,
                forced_sync_reason,
            });
        }
    }

    /// Every unit of a sync call is complete: hand the results to the caller.
    pub(super) fn finish_sync(&mut self, call_id: &str, ctx: &mut Context<Self>) {
        let Some(call) = self.owed.calls.get_mut(call_id) else {
            return;
        };
        let set = call.row.set;
        let waiter = call.sync_reply.take();
        let keys: Vec<(String, u32)> = (0..call.row.tasks.len() as u32)
            .map(|i| (dedup_key(&child_id(call_id, i), ItemKind::Result), 1))
            .collect();
        let results = self.owed.items(keys);
        if let Some(w) = waiter {
            let reply = DelegateReply::Sync {
                call_id: call_id.to_string(),
                set,
                units: w.units,
                forced_sync_reason: w.forced_sync_reason,
                results,
                note: String::new(),
                text: String::new(),
            };
            if w.tx.send(Ok(reply)).is_ok() {
                if let Some(c) = self.owed.calls.get_mut(call_id) {
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
        let Some(call) = self.owed.calls.get_mut(call_id) else {
            return;
        };
        if call.row.mode == Mode::Background || call.receipt_pending {
            return;
        }
        call.row.mode = Mode::Background;
        call.awaiting_receipt = false;
        let now = now_ms();
        for row in call.children() {
            if !row.result.delivered && !row.result.dead {
                let key = dedup_key(&row.child_id, ItemKind::Result);
                if self.router.publish(key, row.result.failed_attempts, now) {
                    let ended = row.finished_at_ms.unwrap_or(now);
                    self.engine.counters.time(DeliveryStage::EndToReady, ended, now);
                }
            }
        }
        self.after_change(ctx);
    }

    /// Decides a caller's receipt: one ack row for the call's results, flushed; then they are
    /// delivered. Too late (they went out at boundaries already) changes nothing.
    pub(super) fn decide_receipt(&mut self, call_id: String, done: oneshot::Sender<()>) -> Decided<Durable> {
        let Some(call) = self.owed.calls.get_mut(&call_id) else {
            return Decided::Done;
        };
        if !call.awaiting_receipt || call.receipt_pending {
            return Decided::Done;
        }
        call.receipt_pending = true;
        let items: Vec<String> = super::owed::OwedCalls::child_ids(&call.row)
            .map(|id| dedup_key(&id, ItemKind::Result))
            .collect();
        let receipt = sync_receipt_id(&call_id);
        let row = AckRow {
            claim_id: receipt.clone(),
            session_id: self.session.session_id.clone(),
            items: items.clone(),
            acked_at_ms: now_ms(),
        };
        Decided::Step(Step {
            writes: Writes {
                acks: vec![row],
                ..Writes::default()
            },
            restore: Writes {
                remove_acks: vec![self.row_key(&receipt)],
                ..Writes::default()
            },
            apply: Apply::Receipt { call_id, items, done },
        })
    }

    /// Applies a caller's receipt: once its ack row is durable the call's results are
    /// delivered; if that failed, they go out at boundaries.
    pub(super) fn apply_receipt(
        &mut self,
        call_id: String,
        items: Vec<String>,
        done: oneshot::Sender<()>,
        res: Result<(), BroodError>,
        ctx: &mut Context<Self>,
    ) {
        if let Some(c) = self.owed.calls.get_mut(&call_id) {
            c.receipt_pending = false;
        }
        match res {
            Ok(()) => {
                if let Some(c) = self.owed.calls.get_mut(&call_id) {
                    c.awaiting_receipt = false;
                }
                // The receipt's ack row is the durable record, folded into the children's rows
                // when they are read back: they are not rewritten.
                self.owed.mark_calls(&items, |d| d.delivered = true);
                // Delivered inline, without a claim: counted, not timed.
                self.count_delivered(&items, false);
                self.collect([call_id]);
            }
            Err(e) => {
                tracing::warn!(call = %call_id, "sync results were received but recording that failed ({e}); they go out at boundaries");
                self.sync_unreceived(&call_id, ctx);
            }
        }
        let _ = done.send(());
    }
}
