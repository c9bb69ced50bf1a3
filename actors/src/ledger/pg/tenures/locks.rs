//! The advisory locks that fence commits off takeovers (see the parent module's "Fencing"):
//! one key per session, or per bucket of sessions for a commit of many, always taken in key
//! order.

/// The advisory lock of `session`'s tenure in the tenure table `table` (schema-qualified): a
/// 64-bit FNV-1a hash of both, the same in every process. Two sessions whose keys collide only
/// make a takeover of one wait for the commits of the other.
pub(in crate::ledger::pg) fn lock_key(table: &str, session: &[u8]) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in table.as_bytes().iter().chain([0u8].iter()).chain(session) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h as i64
}

/// How many buckets the sessions' advisory locks fall into, for commits of many sessions.
pub(super) const BUCKETS: u64 = 256;

/// A commit of more sessions than this takes the locks of their buckets, not theirs: at most
/// [`BUCKETS`] locks, so a commit never outgrows the database's lock table (whose room is
/// `max_locks_per_transaction`, 64 by default, per connection, shared by all of them).
const PER_SESSION_MOST: usize = 256;

/// A takeover of more sessions than this (a start, or a sweep after a process with many
/// sessions died) takes them in transactions of this many at most, for the same reason.
pub(super) const TAKE_BATCH: usize = 512;

/// The advisory lock of the bucket `session`'s lock falls into (see [`PER_SESSION_MOST`]).
fn bucket_key(table: &str, session: &[u8]) -> i64 {
    let bucket = (lock_key(table, session) as u64) % BUCKETS;
    lock_key(&format!("{table}/buckets"), &bucket.to_be_bytes())
}

/// Sorted and without repeats: every statement here takes its locks in this order, so
/// transactions never wait for each other's advisory locks in a cycle.
fn sorted(mut keys: Vec<i64>) -> Vec<i64> {
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// The advisory locks a commit writing `sessions` takes shared: each session's own, or, for
/// more than [`PER_SESSION_MOST`] sessions, their buckets'.
pub(super) fn commit_keys(table: &str, sessions: &[Vec<u8>]) -> Vec<i64> {
    let key = if sessions.len() <= PER_SESSION_MOST {
        lock_key
    } else {
        bucket_key
    };
    sorted(sessions.iter().map(|s| key(table, s)).collect())
}

/// The advisory locks a takeover of `sessions` takes exclusively: each session's own and its
/// bucket's, so it waits for every commit writing one of them, whichever locks that took.
pub(super) fn take_keys(table: &str, sessions: &[Vec<u8>]) -> Vec<i64> {
    sorted(
        sessions
            .iter()
            .flat_map(|s| [lock_key(table, s), bucket_key(table, s)])
            .collect(),
    )
}
