//! Idempotent delegates: a delegate naming an idempotency key is made as the call whose id the
//! key gives ([`keyed_call_id`]); one naming a key the session already made a call with is
//! answered with that call, as it was made, instead of making another — whether the call is in
//! memory or only in the ledger (delivered and dropped from memory, until retention removes
//! it), after a restart or a takeover alike, since the id is found wherever the call is.
//!
//! What a replay answers is decided here, from the call as made: a background call's id, set
//! and units; a sync call's results once it is complete, or a wait for them when the request
//! that made it went away without them. A request asking for something else under the same key
//! is refused, and nothing changes.

use tokio::sync::oneshot;

use super::owed::OwedCalls;
use super::SessionOwner;
use crate::error::BroodError;
use crate::model::*;

impl SessionOwner {
    /// Answers a keyed delegate whose call `call_id` exists, in memory or in the ledger (a sync
    /// call still running whose first caller went away: this request waits for its results in
    /// its place); hands the reply back when there is no such call (it is to be made).
    pub(super) fn replay(
        &mut self,
        call_id: &str,
        asked: &Idempotency,
        reply: oneshot::Sender<Result<DelegateReply, BroodError>>,
    ) -> Result<(), oneshot::Sender<Result<DelegateReply, BroodError>>> {
        if let Some(call) = self.owed.calls.get_mut(call_id) {
            if let Err(e) = same_request(&call.row, asked) {
                super::answer(reply, Err(e));
                return Ok(());
            }
            if call.row.mode == Mode::Background || call.incomplete_units == 0 {
                let answer = replayed(&self.owed, call_id);
                super::answer(reply, answer);
                return Ok(());
            }
            // A sync call still running: its first caller waits for it, or went away.
            if call.sync_reply.as_ref().is_some_and(|w| !w.gone()) {
                let e = BroodError::IdempotencyInProgress {
                    call_id: call_id.to_string(),
                };
                super::answer(reply, Err(e));
                return Ok(());
            }
            let units = call.units.iter().map(|u| UnitInfo::from(&u.row)).collect();
            let forced_sync_reason = call.row.forced_sync_reason.clone();
            self.wait_sync(call_id, reply, units, forced_sync_reason);
            return Ok(());
        }
        let session = self.session.session_id.clone();
        let stored = match self.engine.ledger.call(&session, call_id) {
            Ok(Some(call)) => call,
            Ok(None) => return Err(reply),
            Err(e) => {
                super::answer(reply, Err(e.into()));
                return Ok(());
            }
        };
        if let Err(e) = same_request(&stored, asked) {
            super::answer(reply, Err(e));
            return Ok(());
        }
        // Settled and out of memory: answered from its rows, without bringing it back.
        let answer = self
            .engine
            .ledger
            .call_parts(&session, call_id)
            .map_err(BroodError::from)
            .and_then(|parts| {
                let mut settled = OwedCalls::default();
                let units = plan_units(&stored.call_id, &stored.tasks, stored.independent_completions)
                    .into_iter()
                    .map(|u| {
                        let n = u.tasks.len();
                        (u, n, None)
                    })
                    .collect();
                settled.insert_call(stored, units, parts.children);
                replayed(&settled, call_id)
            });
        super::answer(reply, answer);
        Ok(())
    }
}

/// Whether `asked` is the request `call` was made with: the same key (a call id made from
/// another key is another call) and the same fingerprint.
fn same_request(call: &CallRow, asked: &Idempotency) -> Result<(), BroodError> {
    match &call.idempotency {
        Some(made) if made == asked => Ok(()),
        _ => Err(BroodError::IdempotencyConflict {
            key: asked.key.clone(),
            call_id: call.call_id.clone(),
        }),
    }
}

/// The reply the call `call_id` of `owed` was made with: a background call's id, set and
/// units; a complete sync call's results too.
fn replayed(owed: &OwedCalls, call_id: &str) -> Result<DelegateReply, BroodError> {
    let call = owed.calls.get(call_id).ok_or_else(|| BroodError::UnknownTarget {
        kind: "call",
        id: call_id.to_string(),
    })?;
    let units: Vec<UnitInfo> = call.units.iter().map(|u| UnitInfo::from(&u.row)).collect();
    let row = &call.row;
    Ok(match row.mode {
        Mode::Background => DelegateReply::Background {
            call_id: row.call_id.clone(),
            set: row.set,
            units,
            note: String::new(),
        },
        Mode::Sync => {
            let keys = (0..row.tasks.len() as u32)
                .map(|i| (dedup_key(&child_id(call_id, i), ItemKind::Result), 1))
                .collect();
            DelegateReply::Sync {
                call_id: row.call_id.clone(),
                set: row.set,
                units,
                forced_sync_reason: row.forced_sync_reason.clone(),
                results: owed.items(keys),
                note: String::new(),
                text: String::new(),
            }
        }
    })
}
