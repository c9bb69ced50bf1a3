//! Retention's removals, decided by the owner so they are ordered with everything else it
//! decides: a call is removed only while no owner holds it in memory (everything in it was
//! delivered or dead, and no redrive of this batch brings it back), and an idle session only
//! while nothing of it is live. What is old enough was chosen by [`crate::retention`].

use actix::prelude::*;
use tokio::sync::oneshot;

use super::apply::Apply;
use super::persist::{BatchView, Decided, Step};
use super::{answer, Durable, SessionOwner};
use crate::error::BroodError;
use crate::ledger::Writes;
use crate::model::{parse_child_id, parse_dedup_key, AckRow};

/// One call retention found old enough, with the ids of its other rows.
#[derive(Debug, Clone)]
pub struct OldCall {
    /// The call.
    pub call_id: String,
    /// Its children's ids.
    pub children: Vec<String>,
    /// The dedup keys of its items' dead letters.
    pub dead_letters: Vec<String>,
    /// The dedup keys of its items' redrive records.
    pub redrives: Vec<String>,
    /// Its start rows' ids.
    pub starts: Vec<String>,
    /// Whether it was made under an idempotency key (a delegate under that key makes a call
    /// of the same id once it is removed).
    pub keyed: bool,
    /// For a keyed call: the ack rows naming its items, as read. Its items are taken out of
    /// them as it is removed (a row naming nothing else goes), so they never mark the items
    /// of the call made again under its key delivered.
    pub acks: Vec<AckRow>,
}

/// Remove these old calls and ack rows of the session. Answers how many calls were removed
/// (one still in memory is kept).
#[derive(Debug, Message)]
#[rtype(result = "Result<usize, BroodError>")]
pub struct Prune {
    /// Calls old enough to go.
    pub calls: Vec<OldCall>,
    /// Ack rows (claim ids) old enough to go, none of whose items' calls is stored any more.
    pub acks: Vec<String>,
}

/// Remove the session if nothing of it is live (no call in memory, nothing ready, claimed or
/// waiting, no live claim) and nothing happened in it after the cutoff: it was made, and its
/// last ack was, before. Answers whether it was removed (the owner then stops for good).
#[derive(Debug, Message)]
#[rtype(result = "Result<bool, BroodError>")]
pub struct DropIfIdle {
    /// The latest activity retention saw in the ledger (its newest ack row).
    pub last_activity_ms: u64,
    /// Nothing may have happened after this.
    pub cutoff_ms: u64,
}

impl SessionOwner {
    /// Decides a prune: the calls no owner holds go, with their rows, in one durable step.
    pub(super) fn decide_prune(
        &mut self,
        prune: Prune,
        reply: oneshot::Sender<Result<usize, BroodError>>,
        view: &mut BatchView,
    ) -> Decided<Durable> {
        let mut writes = Writes::default();
        let mut removed = 0;
        let mut acks: std::collections::BTreeMap<String, AckRow> = Default::default();
        for call in prune.calls {
            if self.owed.calls.contains_key(&call.call_id) || view.revived.contains(&call.call_id) {
                continue;
            }
            let key = |id: &String| self.row_key(id);
            // The call's row first: a crash part-way leaves rows of a call that is gone (the
            // next open quarantines them), never a call whose children look queued again.
            writes.remove_calls.push(key(&call.call_id));
            writes.remove_dead_letters.extend(call.dead_letters.iter().map(key));
            writes.remove_children.extend(call.children.iter().map(key));
            writes.remove_starts.extend(call.starts.iter().map(key));
            writes.remove_redrives.extend(call.redrives.iter().map(key));
            for ack in call.acks {
                acks.entry(ack.claim_id.clone()).or_insert(ack);
            }
            view.pruned.insert(call.call_id);
            removed += 1;
        }
        // The ack rows naming items of removed keyed calls, without those items (put back as
        // read should the flush fail: the calls may not be removed).
        let mut restore = Writes::default();
        for (claim_id, ack) in acks {
            let mut left = ack.clone();
            left.items.retain(|k| {
                let call = parse_dedup_key(k).and_then(|(child, _)| parse_child_id(child));
                call.is_none_or(|(call, _)| !view.pruned.contains(call))
            });
            if left.items.is_empty() {
                writes.remove_acks.push(self.row_key(&claim_id));
            } else {
                writes.acks.push(left);
            }
            restore.acks.push(ack);
        }
        writes.remove_acks.extend(prune.acks.iter().map(|c| self.row_key(c)));
        if writes.is_empty() {
            answer(reply, Ok(0));
            return Decided::Done;
        }
        Decided::Step(Step {
            writes,
            // Nothing else to put back: what was removed was old and out of memory, and a
            // failed flush leaves it as good as removed or not.
            restore,
            apply: Apply::Prune { removed, reply },
        })
    }

    /// Answers a prune once its removals are durable.
    pub(super) fn apply_prune(
        &mut self,
        removed: usize,
        reply: oneshot::Sender<Result<usize, BroodError>>,
        res: Result<(), BroodError>,
    ) {
        if res.is_ok() && removed > 0 {
            tracing::debug!(calls = removed, "retention removed old calls");
        }
        answer(reply, res.map(|_| removed));
    }

    /// Whether nothing of this session is live.
    fn idle(&self) -> bool {
        self.owed.calls.is_empty()
            && self.capacity.running() == 0
            && self.capacity.queued() == 0
            && self.router.pending_count() == 0
            && self.router.claimed_count() == 0
    }

    /// Decides dropping the idle session: its rows go, and once that is durable the owner
    /// stops (its supervisor does not rebuild an owner that stopped on its own).
    pub(super) fn decide_drop(
        &mut self,
        msg: DropIfIdle,
        reply: oneshot::Sender<Result<bool, BroodError>>,
        view: &BatchView,
    ) -> Decided<Durable> {
        let last = msg.last_activity_ms.max(self.session.created_at_ms);
        if !self.idle() || view.session.next_set != self.session.next_set || last > msg.cutoff_ms {
            answer(reply, Ok(false));
            return Decided::Done;
        }
        let id = self.session.session_id.clone();
        let writes = Writes {
            remove_sessions: vec![id.clone()],
            remove_wakes: vec![id.clone()],
            remove_nests: vec![id],
            ..Writes::default()
        };
        Decided::Step(Step {
            writes,
            restore: Writes {
                sessions: vec![self.session.clone()],
                nests: self.engine.nest(&self.session.session_id).into_iter().collect(),
                wakes: self
                    .wake_url
                    .iter()
                    .map(|url| crate::model::WakeRow {
                        session_id: self.session.session_id.clone(),
                        url: url.clone(),
                        bound_at_ms: crate::model::now_ms(),
                    })
                    .collect(),
                ..Writes::default()
            },
            apply: Apply::Drop { reply },
        })
    }

    /// Stops the owner once the idle session's rows are removed for good.
    pub(super) fn apply_drop(
        &mut self,
        reply: oneshot::Sender<Result<bool, BroodError>>,
        res: Result<(), BroodError>,
        ctx: &mut Context<Self>,
    ) {
        if let Err(e) = res {
            return answer(reply, Err(e));
        }
        let id = self.session.session_id.clone();
        tracing::info!("retention removed an idle session");
        self.engine.forget_session(&id);
        answer(reply, Ok(true));
        ctx.stop();
    }
}
