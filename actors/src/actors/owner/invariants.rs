//! The owed calls' invariants, checked after each change the owner applies: what capacity counts is
//! what the owed calls say runs and waits. A broken one is a fault of brood: in a debug build (the
//! tests) it panics at once, naming what broke; in a release build it is logged and counted
//! ([`broken_invariants`]), and the owner goes on.

use crate::model::ChildStatus;
use crate::routing::Capacity;

use super::owed::OwedCalls;

static BROKEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times an owner found its owed calls' invariants broken, in this process.
pub fn broken_invariants() -> u64 {
    BROKEN.load(std::sync::atomic::Ordering::Relaxed)
}

/// Counts `n` faults found.
pub(super) fn count(n: usize) {
    BROKEN.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
}

/// What is wrong with `owed` and `capacity` together, each fault in a sentence: a queued child
/// that is not queued among the owed calls (ended, running, being cancelled, or unknown), a child counted
/// both queued and running, one counted running that ended or is being cancelled while no cancel
/// is stopping it (`stopping`: a child a cancel stops keeps its slot until its runner is gone,
/// whichever end was recorded first, and so may one whose call left memory meanwhile; any other
/// such slot is held for good, with nothing running in it), and one the owed calls say runs that
/// capacity does not count (the session would run more children than its limit).
pub(super) fn owed_faults(
    owed: &OwedCalls,
    capacity: &Capacity<String>,
    stopping: &foldhash::HashSet<String>,
) -> Vec<String> {
    let mut faults = Vec::new();
    let running: foldhash::HashSet<&String> = capacity.running_keys().collect();
    for id in capacity.queued_keys() {
        match owed.child(id) {
            None => faults.push(format!("queued child `{id}` is not among the owed calls")),
            Some(row) if row.status != ChildStatus::Queued => {
                faults.push(format!("queued child `{id}` is {} among the owed calls", row.status))
            }
            Some(row) if owed.cancelling(row) => faults.push(format!("queued child `{id}` is being cancelled")),
            Some(_) => {}
        }
        if running.contains(id) {
            faults.push(format!("child `{id}` is counted both queued and running"));
        }
    }
    for id in &running {
        if stopping.contains(*id) {
            continue;
        }
        match owed.child(id) {
            None => faults.push(format!(
                "child `{id}` holds a slot, its call is not among the owed calls, and no cancel is stopping it"
            )),
            Some(row) if owed.cancelling(row) => faults.push(format!(
                "child `{id}` is being cancelled and holds a slot, but no cancel is stopping it"
            )),
            Some(row) if row.status.is_terminal() => {
                faults.push(format!("child `{id}` ended {} but still holds a slot", row.status))
            }
            Some(_) => {}
        }
    }
    for call in owed.calls.values() {
        for row in call.children() {
            if row.status == ChildStatus::Running && !owed.cancelling(row) && !running.contains(&row.child_id) {
                faults.push(format!("running child `{}` holds no slot", row.child_id));
            }
        }
    }
    faults
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::conformance::{call_row, child_row};

    fn owed_of(statuses: &[ChildStatus]) -> (OwedCalls, Vec<String>) {
        let call = call_row("s", "deleg_00000000000000aa", statuses.len() as u32);
        let rows = statuses
            .iter()
            .enumerate()
            .map(|(i, &s)| child_row("s", &call.call_id, i as u32, s))
            .collect();
        let ids = (0..statuses.len() as u32)
            .map(|i| crate::model::child_id(&call.call_id, i))
            .collect();
        let units = crate::model::plan_units(&call.call_id, &call.tasks, true)
            .into_iter()
            .map(|u| (u, 0, None))
            .collect();
        let mut owed = OwedCalls::default();
        owed.insert_call(call, units, rows);
        (owed, ids)
    }

    #[test]
    fn capacity_counts_what_the_owed_calls_say_runs_and_waits() {
        let none = foldhash::HashSet::default();
        let (owed, ids) = owed_of(&[ChildStatus::Running, ChildStatus::Queued, ChildStatus::Cancelled]);
        let mut cap = Capacity::new(2);
        cap.start_now(ids[0].clone());
        cap.enqueue(ids[1].clone());
        cap.start_now(ids[2].clone()); // cancelled, its runner not gone yet (once it is cancelling)
        assert_eq!(
            owed_faults(&owed, &cap, &none),
            vec![format!("child `{}` ended cancelled but still holds a slot", ids[2])],
            "not being cancelled: it ended and kept its slot"
        );
        let (mut owed, _) = (owed, ());
        for call in owed.calls.values_mut() {
            call.cancelling.insert(2);
        }
        let stopped: foldhash::HashSet<String> = std::iter::once(ids[2].clone()).collect();
        assert_eq!(
            owed_faults(&owed, &cap, &stopped),
            Vec::<String>::new(),
            "its runner is being stopped"
        );
        // A cancel that lost the race to the child's own end: it keeps its slot all the same.
        let (mut won, won_ids) = owed_of(&[ChildStatus::Succeeded]);
        for call in won.calls.values_mut() {
            call.cancelling.insert(0);
        }
        let won_stopped: foldhash::HashSet<String> = std::iter::once(won_ids[0].clone()).collect();
        let mut stopping = Capacity::new(1);
        stopping.start_now(won_ids[0].clone());
        assert_eq!(owed_faults(&won, &stopping, &won_stopped), Vec::<String>::new());
        // Its call left memory before its runner was gone.
        assert_eq!(
            owed_faults(&OwedCalls::default(), &stopping, &won_stopped),
            Vec::<String>::new()
        );

        let mut lost = Capacity::new(2);
        lost.enqueue(ids[1].clone());
        assert_eq!(
            owed_faults(&owed, &lost, &stopped),
            vec![format!("running child `{}` holds no slot", ids[0])]
        );

        let mut ended = Capacity::new(2);
        ended.start_now(ids[0].clone());
        ended.enqueue(ids[2].clone());
        assert_eq!(
            owed_faults(&owed, &ended, &stopped),
            vec![format!("queued child `{}` is cancelled among the owed calls", ids[2])]
        );
    }

    #[test]
    fn a_slot_held_by_a_cancelled_child_no_cancel_is_stopping_is_a_fault() {
        let none = foldhash::HashSet::default();
        // A child cancelled while its running mark was being written: its cancel took it out of
        // capacity, and no runner of it is being stopped. Back in a slot (admitted again, never
        // to start), it holds that slot for good.
        let (mut owed, ids) = owed_of(&[ChildStatus::Cancelled]);
        for call in owed.calls.values_mut() {
            call.cancelling.insert(0);
        }
        let mut cap = Capacity::new(1);
        cap.start_now(ids[0].clone());
        assert_eq!(
            owed_faults(&owed, &cap, &none),
            vec![format!(
                "child `{}` is being cancelled and holds a slot, but no cancel is stopping it",
                ids[0]
            )]
        );
        // Still so once its call left memory (everything in it delivered).
        assert_eq!(
            owed_faults(&OwedCalls::default(), &cap, &none),
            vec![format!(
                "child `{}` holds a slot, its call is not among the owed calls, and no cancel is stopping it",
                ids[0]
            )]
        );
    }
}
