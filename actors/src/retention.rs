//! Retention: the ledger does not grow forever. Calls whose items were all delivered are kept
//! for [`Retention::delivered`] (default 7 days) after their last child finished, calls with
//! dead letters for [`Retention::dead`] (default 30 days) after their last item died, and a
//! session with nothing left and nothing live can be removed after [`Retention::idle_session`]
//! (off by default).
//!
//! This is the policy, and what is old enough under it, decided by plain code ([`old_call`],
//! [`old_ack`]). The sweep ([`crate::actors::sweeper`]) reads the ledger a session at a time, in
//! bounded pages, off every actor's thread, and has what is old removed by the session's own
//! owner ([`crate::actors::owner::Prune`]), which keeps what it still holds in memory: nothing
//! live is ever removed, and routing never waits for a sweep.

use std::time::Duration;

use crate::ledger::CallParts;
use crate::model::*;

/// How long what is over is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// A call whose every item was delivered, after its last child finished.
    pub delivered: Duration,
    /// A call with dead letters, after the last of them died (and `delivered` after its last
    /// child finished).
    pub dead: Duration,
    /// A session with no call left and nothing live, after its last activity; none: kept.
    pub idle_session: Option<Duration>,
    /// How often the background sweep runs; none: only when asked (`sweep`).
    pub interval: Option<Duration>,
    /// Calls decided per page (and removed per owner step).
    pub batch: usize,
}

impl Default for Retention {
    fn default() -> Self {
        const DAY: u64 = 24 * 60 * 60;
        Retention {
            delivered: Duration::from_secs(7 * DAY),
            dead: Duration::from_secs(30 * DAY),
            // Off unless asked for: a removed session loses its stored wake target and starts
            // its sets afresh, which a long-lived parent would not expect.
            idle_session: None,
            interval: Some(Duration::from_secs(60)),
            batch: 256,
        }
    }
}

/// What a sweep removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Calls, with their children, dead letters and start rows.
    pub calls: usize,
    /// Ack rows.
    pub acks: usize,
    /// Idle sessions.
    pub sessions: usize,
}

pub(crate) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Whether a call is old enough to go, from its stored rows: every child has ended (a stored
/// row, terminal), the last finished before `now - delivered`, and every dead letter of it
/// died before `now - dead`. (Whether everything in it was delivered or dead is its owner's to
/// say: it holds every call that is not.)
pub fn old_call(call: &CallRow, parts: &CallParts, now: u64, policy: &Retention) -> bool {
    if parts.children.len() != call.tasks.len() || !parts.children.iter().all(|c| c.status.is_terminal()) {
        return false;
    }
    let finished = parts
        .children
        .iter()
        .map(|c| c.finished_at_ms.unwrap_or(u64::MAX))
        .max()
        .unwrap_or(call.created_at_ms);
    let died = parts.dead_letters.iter().map(|d| d.dead_at_ms).max();
    finished.saturating_add(ms(policy.delivered)) <= now
        && died.is_none_or(|d| d.saturating_add(ms(policy.dead)) <= now)
}

/// Whether an ack row is old enough to go: acked before `now - delivered`, and `stored(call)`
/// is false for the call of every item it names (an ack row is the record that its items were
/// delivered: it goes only after them).
pub fn old_ack(ack: &AckRow, now: u64, policy: &Retention, mut stored: impl FnMut(&str) -> bool) -> bool {
    ack.acked_at_ms.saturating_add(ms(policy.delivered)) <= now
        && ack.items.iter().all(|key| {
            parse_dedup_key(key)
                .and_then(|(child, _)| parse_child_id(child))
                .is_none_or(|(call, _)| !stored(call))
        })
}
