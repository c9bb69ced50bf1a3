//! The policies a call carries beside its tasks, as plain values the owner's decisions read: a
//! task's [`RetryPolicy`], a call's [`Idempotency`] (with the id a key gives its call and the
//! fingerprint of what it asked), and the [`EnvelopeLimits`] of a bounded boundary.

use serde::{Deserialize, Serialize};

use super::{ChildStatus, Mode, Task};

/// How often, and how soon, a child that ended `failed` or `timed_out` is run again before its
/// result counts: attempt n + 1 starts `backoff_ms × 2^(n-1)` (at most `max_backoff_ms`) after
/// attempt n ended, while n < `max_attempts`. Each attempt's end is recorded; the result is the
/// last attempt's, and says how many were made. Runs again after a restart count as attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1: no retry).
    pub max_attempts: u32,
    /// The wait before the second attempt, in ms; doubled for each attempt after.
    pub backoff_ms: u64,
    /// The longest wait between attempts, in ms.
    pub max_backoff_ms: u64,
}

/// The most attempts a retry policy may ask for.
pub const MAX_RETRY_ATTEMPTS: u32 = 20;

impl RetryPolicy {
    /// The wait before running again a child whose attempt `attempt` ended `status`; none when
    /// it is not run again (it succeeded, was cancelled or interrupted, or used its attempts).
    pub fn delay_after(&self, attempt: u32, status: ChildStatus) -> Option<u64> {
        if !matches!(status, ChildStatus::Failed | ChildStatus::TimedOut) || attempt >= self.max_attempts {
            return None;
        }
        let doublings = attempt.saturating_sub(1).min(63);
        let delay = self.backoff_ms.saturating_mul(1u64 << doublings);
        Some(delay.min(self.max_backoff_ms))
    }
}

/// A call's idempotency key and the fingerprint of the request it was made with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Idempotency {
    /// The key the caller chose.
    pub key: String,
    /// [`request_fingerprint`] of the request: its tasks (as stored), mode and completions.
    pub fingerprint: u64,
}

/// The fingerprint of a request to compare a retry's with: FNV-1a over the stored encoding of
/// its tasks, its requested mode and its completions (the trace context is not part of it).
pub fn request_fingerprint(tasks: &[Task], mode: Mode, independent_completions: bool) -> u64 {
    let mut h = Fnv::default();
    for t in tasks {
        for text in [Some(&t.goal), Some(&t.runner_json), t.group.as_ref(), t.input.as_ref()] {
            h.write_opt(text.map(String::as_bytes));
        }
        h.write_opt(t.timeout_ms.map(u64::to_le_bytes).as_ref().map(|b| &b[..]));
        h.write_opt(Some(&t.stall_ms.to_le_bytes()));
        h.write_opt(Some(&[u8::from(t.rerun_on_recovery)]));
    }
    h.write_opt(Some(&[mode as u8, u8::from(independent_completions)]));
    h.0
}

/// The id of the call a session makes with an idempotency key: `deleg_` and 16 hex digits of
/// FNV-1a over the session id and the key, so that a retry finds it by id (in memory, or in
/// the ledger's index of calls) wherever and whenever it comes.
pub fn keyed_call_id(session_id: &str, key: &str) -> String {
    let mut h = Fnv::default();
    h.write_opt(Some(session_id.as_bytes()));
    h.write_opt(Some(key.as_bytes()));
    format!("deleg_{:016x}", h.0)
}

/// 64-bit FNV-1a: stable across builds and platforms (unlike std's hashers), for ids and
/// fingerprints that are stored.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn byte(&mut self, b: u8) {
        self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }

    /// Writes a field so that no two sequences of fields write the same bytes: a presence
    /// byte, then the length and the bytes.
    fn write_opt(&mut self, bytes: Option<&[u8]>) {
        match bytes {
            None => self.byte(0),
            Some(b) => {
                self.byte(1);
                for x in (b.len() as u64).to_le_bytes() {
                    self.byte(x);
                }
                for &x in b {
                    self.byte(x);
                }
            }
        }
    }
}

/// How much one envelope may hold: what does not fit stays ready for a later boundary. The
/// oldest ready items go first, and the first always goes, however large (so that no item is
/// held back for good); a bound may split a unit's items over several envelopes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EnvelopeLimits {
    /// At most this many items (none: no bound).
    pub max_items: Option<usize>,
    /// At most about this many bytes: each item counted as its texts, its data and
    /// [`ITEM_OVERHEAD_BYTES`] for its ids and fields (none: no bound).
    pub max_bytes: Option<usize>,
}

/// What an item is counted as beside its goal, summary, error and output, against
/// [`EnvelopeLimits::max_bytes`]: about what its ids and other fields take as JSON.
pub const ITEM_OVERHEAD_BYTES: usize = 320;

impl EnvelopeLimits {
    /// No bound.
    pub const NONE: EnvelopeLimits = EnvelopeLimits {
        max_items: None,
        max_bytes: None,
    };

    /// A check for a claim, to be asked of each item in turn with its size: whether it fits
    /// beside those asked of before.
    pub fn fits(self) -> impl FnMut(usize) -> bool {
        let (mut items, mut bytes) = (0usize, 0usize);
        move |size| {
            items += 1;
            bytes = bytes.saturating_add(size);
            self.max_items.is_none_or(|max| items <= max) && self.max_bytes.is_none_or(|max| bytes <= max)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::task;

    #[test]
    fn a_retry_waits_longer_each_attempt_up_to_its_bound_and_stops_at_its_last() {
        let p = RetryPolicy {
            max_attempts: 5,
            backoff_ms: 100,
            max_backoff_ms: 350,
        };
        let waits: Vec<Option<u64>> = (1..=5).map(|a| p.delay_after(a, ChildStatus::Failed)).collect();
        assert_eq!(waits, vec![Some(100), Some(200), Some(350), Some(350), None]);
        assert_eq!(p.delay_after(1, ChildStatus::TimedOut), Some(100));
        for status in [
            ChildStatus::Succeeded,
            ChildStatus::Cancelled,
            ChildStatus::Interrupted,
            ChildStatus::Unknown,
        ] {
            assert_eq!(p.delay_after(1, status), None, "{status}");
        }
        let huge = RetryPolicy {
            max_attempts: 20,
            backoff_ms: u64::MAX / 2,
            max_backoff_ms: 7,
        };
        assert_eq!(huge.delay_after(19, ChildStatus::Failed), Some(7), "no overflow");
    }

    #[test]
    fn keyed_call_ids_and_fingerprints_are_stable_and_tell_requests_apart() {
        let id = keyed_call_id("s", "k");
        assert_eq!(id, keyed_call_id("s", "k"));
        assert_eq!(id.len(), "deleg_".len() + 16);
        assert_ne!(id, keyed_call_id("s2", "k"));
        assert_ne!(
            keyed_call_id("ab", "c"),
            keyed_call_id("a", "bc"),
            "fields are delimited"
        );
        let tasks = vec![task(None), task(Some("g"))];
        let f = request_fingerprint(&tasks, Mode::Background, false);
        assert_eq!(f, request_fingerprint(&tasks.clone(), Mode::Background, false));
        assert_ne!(f, request_fingerprint(&tasks, Mode::Sync, false));
        assert_ne!(f, request_fingerprint(&tasks, Mode::Background, true));
        assert_ne!(f, request_fingerprint(&tasks[..1], Mode::Background, false));
        let mut with_input = tasks.clone();
        with_input[0].input = Some("1".into());
        assert_ne!(f, request_fingerprint(&with_input, Mode::Background, false));
    }
}
