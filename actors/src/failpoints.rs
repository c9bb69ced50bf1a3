//! Fault injection points, compiled in only with the `failpoints` feature.
//!
//! A point is a name in the code (`ledger_write`, `ledger_flush`, `ledger_flush_stall` and
//! `ledger_write_stall` (a flush or write that succeeds 400 ms late), `ledger_flush_slow_fail` (a
//! flush that fails 400 ms late), `start_flush_slow_fail` (the flush of admitted children's
//! running marks fails 400 ms late), `coalescer_handoff`, `owner_handler`, `unit_handler`,
//! `coalescer_handler`, `unit_start_hold` (a unit is held before it reads a start of children,
//! until `release`; the thread it runs on with it), `runner_hang`, `requeue_flush_stall` (the flush of a lost start's
//! requeue is 400 ms late), `events_subscribe_stall` (a subscriber that takes 400 ms between
//! finding its session's event channel and joining it), `rebuild_hold` (an owner rebuilt from
//! the ledger is held before it reads its rows, until `release`), `rebuild_read_hold` (one
//! is held once it read them, before it is served, until `release`), `moved_hold` (an owner
//! told that its session's tenure was lost is held before it stops, until `release`; the
//! thread it runs on with it), `adopt_elsewhere_hold` (an adoption that found its session's
//! tenure held by another process is held before it answers so, until `release`),
//! `decode_thread_refused` (no thread is made for a share of a large read's rows to decode, as
//! when the system has none left: the share is decoded on the reading thread),
//! `share_thread_refused` (likewise for a share of a plan or of a rebuild's calls: it is worked
//! on the calling thread),
//! `take_stall` (a server's
//! `POST /v1/workers/take` waits 1.5 s before it serves the take), `take_recording_hold` (a take
//! that handed its child out is held before it records that, until `release`), `work_clock_read`
//! (reading the shared work list's clock fails)). A server arms `take_stall`,
//! `ledger_flush_stall`, `ledger_flush_slow_fail` and `work_clock_read` from `BROOD_FAILPOINTS`. Tests arm a point with `arm` for a
//! number of hits; while armed, the point fails (an error for I/O points, a panic for handler
//! points, a wait for hold points). Without the feature, [`crate::failpoint!`] expands to
//! nothing and this module has only inert stand-ins.

#[cfg(feature = "failpoints")]
use std::collections::HashMap;
#[cfg(feature = "failpoints")]
use std::sync::Mutex;

#[cfg(feature = "failpoints")]
static POINTS: Mutex<Option<HashMap<&'static str, u64>>> = Mutex::new(None);

/// The hold points code waits at until they are released.
#[cfg(feature = "failpoints")]
static HELD: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

/// The longest a hold point waits for its release: a test that never releases it fails on its
/// own deadline instead of hanging.
#[cfg(feature = "failpoints")]
const MAX_HOLD: std::time::Duration = std::time::Duration::from_secs(60);

/// The points a test outside this process may name (`BROOD_FAILPOINTS` of a server), as the
/// static names [`arm`] takes.
#[cfg(feature = "failpoints")]
pub fn known(name: &str) -> Option<&'static str> {
    const KNOWN: &[&str] = &[
        "take_stall",
        "share_stall",
        "ledger_flush_stall",
        "ledger_flush_slow_fail",
        "work_clock_read",
    ];
    KNOWN.iter().copied().find(|k| *k == name)
}

/// Arms `name` to fire on its next `times` hits (u64::MAX: until disarmed).
#[cfg(feature = "failpoints")]
pub fn arm(name: &'static str, times: u64) {
    if let Ok(mut guard) = POINTS.lock() {
        guard.get_or_insert_with(HashMap::new).insert(name, times);
    }
}

/// Disarms every point, and releases every hold.
#[cfg(feature = "failpoints")]
pub fn disarm_all() {
    if let Ok(mut guard) = POINTS.lock() {
        *guard = None;
    }
    if let Ok(mut held) = HELD.lock() {
        held.clear();
    }
}

/// Where `name` fires, waits (the calling thread blocked) until the test [`release`]s it, for
/// [`MAX_HOLD`] at most. A test arms it for one hit and waits for [`armed`] to turn false to
/// know that code is held there.
#[cfg(feature = "failpoints")]
pub fn hold(name: &'static str) {
    if !fires(name) {
        return;
    }
    if let Ok(mut held) = HELD.lock() {
        held.push(name);
    }
    let deadline = std::time::Instant::now() + MAX_HOLD;
    while std::time::Instant::now() < deadline && HELD.lock().is_ok_and(|h| h.contains(&name)) {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Lets code held at `name` go on.
#[cfg(feature = "failpoints")]
pub fn release(name: &'static str) {
    if let Ok(mut held) = HELD.lock() {
        held.retain(|h| *h != name);
    }
}

/// Whether code is held at the hold point `name` now (it fired, and was not released yet): what a
/// test waits for before it does what must meet the held code.
#[cfg(feature = "failpoints")]
pub fn held(name: &'static str) -> bool {
    HELD.lock().is_ok_and(|h| h.contains(&name))
}

/// Whether `name` has hits left (without counting one).
#[cfg(feature = "failpoints")]
pub fn armed(name: &'static str) -> bool {
    remaining(name) > 0
}

/// How many more hits of `name` fire (0 once they were used up, or if it was never armed): a
/// test waits on it to know that code reached the point.
#[cfg(feature = "failpoints")]
pub fn remaining(name: &'static str) -> u64 {
    let Ok(guard) = POINTS.lock() else { return 0 };
    guard.as_ref().and_then(|p| p.get(name).copied()).unwrap_or(0)
}

/// Whether `name` fires now (and counts the hit).
#[cfg(feature = "failpoints")]
pub fn fires(name: &'static str) -> bool {
    let Ok(mut guard) = POINTS.lock() else { return false };
    let Some(points) = guard.as_mut() else { return false };
    match points.get_mut(name) {
        Some(0) | None => false,
        Some(n) => {
            if *n != u64::MAX {
                *n -= 1;
            }
            true
        }
    }
}

/// Whether `name` fires now: always false without the `failpoints` feature.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn fires(_name: &'static str) -> bool {
    false
}

/// Never waits without the `failpoints` feature.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hold(_name: &'static str) {}

/// Returns `Err(LedgerError::Injected(name))` from the enclosing function when `name` fires.
#[macro_export]
macro_rules! failpoint {
    ($name:literal) => {
        if $crate::failpoints::fires($name) {
            return Err($crate::ledger::LedgerError::Injected($name).into());
        }
    };
}
