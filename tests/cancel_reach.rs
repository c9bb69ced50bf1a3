//! A cancel reaches what it cancels whatever incarnation of its session's owner, of its unit
//! or of the coalescer holds it now: after an owner was rebuilt (on request or after a panic)
//! a running child's runner is stopped — a command's process is gone — and the session never
//! runs more children than its capacity; after a unit was replaced following a panic its
//! running child is stopped; a cancel decided while the coalescer restarts is recorded and
//! answered, not dropped; a start an owner sent before it was rebuilt, read only after the
//! rebuilt owner cancelled the child it started again, does not run it.
//!
//! Fault points are process-wide, so the tests of this file run one at a time (`SERIAL`).
#![cfg(feature = "failpoints")]
// The lock serialises whole tests, each on a runtime of its own; holding it across awaits is the point.
#![allow(clippy::await_holding_lock)]

use std::path::Path;

use brood::*;
use serde_json::json;

mod common;
use common::*;

/// An engine over `dir` with the test runners and `command`.
fn open(dir: &Path, kit: &Kit) -> Brood {
    let mut runners = kit.runners();
    runners.register_command();
    Brood::open(BroodConfig::new(dir.join("ledger")).runners(runners)).unwrap()
}

async fn cancel_child(b: &Brood, child: &str) -> Cancelled {
    b.cancel(CancelTarget::Child(child.to_string()), "the test", None)
        .await
        .expect("cancel")
}

fn only(child: &str) -> Cancelled {
    Cancelled {
        cancelled: vec![child.to_string()],
        already_finished: 0,
    }
}

/// The pid a command wrote to `file`, once it did.
async fn pid_in(file: &Path) -> u32 {
    wait_for!(
        "the command wrote its pid",
        std::fs::read_to_string(file)
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
    )
}

/// Capacity 1: child `a` runs (a hold), child `b` (a hold) waits for its slot. Returns the call.
async fn one_running_one_queued(e: &Kit, b: &Brood) -> String {
    open_capped(b, "s", 1).await;
    let call = delegated(
        b,
        "s",
        DelegateRequest::background(vec![task("a", hold()), task("b", hold())]).independent(),
    )
    .await;
    wait_for!("a running, b queued", {
        let st = b.counts("s").await.unwrap();
        (e.holds.started().len() == 1 && st.running == 1 && st.queued == 1).then_some(())
    });
    call
}

/// After the owner was rebuilt, cancelling the running child stops its runner before the
/// child waiting for its slot starts, and both end `cancelled`.
async fn cancel_after_rebuild(rebuild: impl AsyncFnOnce(&Brood)) {
    let dir = tempfile::tempdir().unwrap();
    let kit = Kit::default();
    let b = open(dir.path(), &kit);
    let call = one_running_one_queued(&kit, &b).await;
    let (a, second) = (child_id(&call, 0), child_id(&call, 1));

    rebuild(&b).await;
    assert_eq!(b.counts("s").await.unwrap().running, 1, "the running child was adopted");

    assert_eq!(cancel_child(&b, &a).await, only(&a));
    wait_for!(
        "b started in the freed slot",
        (kit.holds.started().len() == 2).then_some(())
    );
    assert_eq!(kit.holds.started(), vec![a.clone(), second.clone()]);
    assert_eq!(
        kit.holds.most_alive(),
        1,
        "b started while the cancelled a still ran: the session ran more children than its capacity"
    );
    assert_eq!(kit.holds.stopped(), 1, "a's runner was stopped");

    assert_eq!(cancel_child(&b, &second).await, only(&second));
    wait_for!("b's runner stopped", (kit.holds.stopped() == 2).then_some(()));
    let got = collect_results(&b, "s", 2).await;
    assert!(got.iter().all(|i| i.status == ChildStatus::Cancelled), "{got:?}");
    b.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_after_restart_owner_stops_the_adopted_child_before_its_slot_is_given_again() {
    let _g = serial();
    cancel_after_rebuild(async |b: &Brood| b.restart_owner("s").await.expect("restart")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_after_an_owner_panic_stops_the_adopted_child_before_its_slot_is_given_again() {
    let _g = serial();
    cancel_after_rebuild(async |b: &Brood| {
        failpoints::arm("owner_handler", 1);
        // A boundary passes the owner's fault point: the owner panics and is rebuilt.
        let lost = b.boundary("s", "t", LONG_LEASE).await;
        assert!(lost.is_err(), "the owner did not panic: {lost:?}");
        assert_eq!(failpoints::remaining("owner_handler"), 0);
        wait_for!("the owner rebuilt", b.counts("s").await.ok());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_after_restart_owner_kills_the_running_command() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let kit = Kit::default();
    let b = open(dir.path(), &kit);
    open_capped(&b, "s", 1).await;
    let pid_file = dir.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 600", pid_file.display());
    let call = delegated(
        &b,
        "s",
        DelegateRequest::background(vec![task(
            "sleeps",
            json!({"kind": "command", "argv": ["sh", "-c", script]}),
        )]),
    )
    .await;
    let pid = pid_in(&pid_file).await;
    assert!(!gone(pid), "the command runs");

    b.restart_owner("s").await.expect("restart");
    let child = child_id(&call, 0);
    assert_eq!(cancel_child(&b, &child).await, only(&child));
    wait_for!("the command's process gone", gone(pid).then_some(()));
    let got = collect_results(&b, "s", 1).await;
    assert_eq!(got[0].status, ChildStatus::Cancelled);
    b.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_reaches_a_running_child_whose_unit_was_replaced_after_a_panic() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let kit = Kit::default();
    let b = open(dir.path(), &kit);
    open_capped(&b, "s", 2).await;
    // One unit: x and a start at once; b waits for x's slot.
    let call = delegated(
        &b,
        "s",
        DelegateRequest::background(vec![task("x", gate("x")), task("a", hold()), task("b", hold())]),
    )
    .await;
    let (a, second) = (child_id(&call, 1), child_id(&call, 2));
    wait_for!("x and a running", {
        let st = b.counts("s").await.unwrap();
        (kit.holds.started() == vec![a.clone()] && st.running == 2).then_some(())
    });
    // The unit panics as it is handed b: a keeps running, b is queued again and started by
    // the unit's replacement.
    failpoints::arm("unit_handler", 1);
    kit.gates.open("x");
    wait_for!(
        "b started by the replaced unit",
        (kit.holds.started().len() == 2).then_some(())
    );
    assert_eq!(failpoints::remaining("unit_handler"), 0, "the unit never panicked");
    assert_eq!(kit.holds.started(), vec![a.clone(), second.clone()]);

    assert_eq!(cancel_child(&b, &a).await, only(&a));
    wait_for!("a's runner stopped", (kit.holds.stopped() == 1).then_some(()));
    assert_eq!(b.counts("s").await.unwrap().running, 1, "b runs on");
    assert_eq!(cancel_child(&b, &second).await, only(&second));
    wait_for!("b's runner stopped", (kit.holds.stopped() == 2).then_some(()));
    let got = collect_results(&b, "s", 3).await;
    let cancelled: Vec<&str> = got
        .iter()
        .filter(|i| i.status == ChildStatus::Cancelled)
        .map(|i| i.child_id.as_str())
        .collect();
    assert_eq!(cancelled, vec![a.as_str(), second.as_str()], "{got:?}");
    b.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_while_the_coalescer_restarts_is_recorded_and_answered() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let kit = Kit::default();
    let b = open(dir.path(), &kit);
    let call = one_running_one_queued(&kit, &b).await;
    let (a, queued) = (child_id(&call, 0), child_id(&call, 1));

    // The coalescer panics on the cancel's row, and is restarted.
    failpoints::arm("coalescer_handler", 1);
    assert_eq!(cancel_child(&b, &queued).await, only(&queued));
    assert_eq!(
        failpoints::remaining("coalescer_handler"),
        0,
        "the coalescer never panicked"
    );
    let st = b.counts("s").await.unwrap();
    assert_eq!((st.running, st.queued), (1, 0), "the cancelled child left the queue");
    assert_eq!(
        cancel_child(&b, &queued).await,
        Cancelled {
            cancelled: vec![],
            already_finished: 1
        },
        "the cancel was recorded"
    );
    let got = collect_results(&b, "s", 1).await;
    assert_eq!(
        (got[0].child_id.as_str(), got[0].status),
        (queued.as_str(), ChildStatus::Cancelled)
    );

    assert_eq!(cancel_child(&b, &a).await, only(&a));
    collect_results(&b, "s", 1).await;
    assert_eq!(kit.holds.started(), vec![a], "the cancelled queued child never started");
    b.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_of_a_child_that_ended_before_its_owner_knew_counts_it_as_already_finished() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let kit = Kit::default();
    let b = open(dir.path(), &kit);
    open_capped(&b, "s", 8).await;
    // The child's end is recorded, but its owner is not told: it still counts it running.
    failpoints::arm("coalescer_handoff", u64::MAX);
    let call = delegated(&b, "s", DelegateRequest::background(vec![task("a", sim(0))])).await;
    let child = child_id(&call, 0);
    wait_for!(
        "the child's end recorded",
        b.stored_child(&child)
            .await
            .unwrap()
            .filter(|row| row.status.is_terminal())
    );
    let st = b.status("s").await.unwrap();
    assert_eq!(child_status(&st, &call, 0), Some(ChildStatus::Running));

    // The cancel is decided while the owner counts the child running; its row meets the
    // recorded end, which wins.
    let (reply, ()) = tokio::join!(cancel_child(&b, &child), async {
        b.status("s").await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        failpoints::disarm_all();
    });
    assert_eq!(
        reply,
        Cancelled {
            cancelled: vec![],
            already_finished: 1
        },
        "every child under the target is cancelled or already finished"
    );
    let got = collect_results(&b, "s", 1).await;
    assert_eq!(
        (got[0].child_id.as_str(), got[0].status),
        (child.as_str(), ChildStatus::Succeeded)
    );
    b.shutdown();
}

/// A start its owner sent before it was rebuilt, read by the unit only after the rebuilt owner
/// started the child again and cancelled it, is refused (its owner is gone) and leaves that
/// cancel to the start the rebuilt owner sent: the child never runs, and the session never
/// runs more children than its capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_start_read_after_a_rebuild_leaves_the_rebuilt_owners_cancel_to_its_own_start() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let kit = Kit::default();
    let b = open(dir.path(), &kit);
    open_capped(&b, "s", 1).await;
    // The unit holds before it reads the first start (and the children's thread with it).
    failpoints::arm("unit_start_hold", 1);
    let rerun = task("a", hold()).rerun_on_recovery(true);
    let call = delegated(&b, "s", DelegateRequest::background(vec![rerun])).await;
    let a = child_id(&call, 0);
    wait_for!(
        "the unit held before it reads the start",
        (!failpoints::armed("unit_start_hold")).then_some(())
    );
    // The rebuilt owner finds `a` marked running and not alive, and starts it again (its task
    // may re-run): that start waits behind the held one.
    b.restart_owner("s").await.expect("restart");
    assert_eq!(b.counts("s").await.unwrap().running, 1);
    let cancelled = cancel_child(&b, &a);
    let release = async {
        wait_for!("the cancel recorded", {
            let st = b.status("s").await.unwrap();
            let row = st
                .calls
                .iter()
                .flat_map(|c| c.children.iter())
                .find(|c| c.child_id == a);
            row.is_some_and(|r| r.status == ChildStatus::Cancelled).then_some(())
        });
        failpoints::release("unit_start_hold");
    };
    let (answer, ()) = tokio::join!(cancelled, release);
    assert_eq!(answer, only(&a));
    // A child started after it: once it runs, the children's thread read both starts of `a`.
    let next = delegated(&b, "s", DelegateRequest::background(vec![task("next", hold())])).await;
    let next = child_id(&next, 0);
    wait_for!(
        "the next child running",
        kit.holds.started().contains(&next).then_some(())
    );
    assert_eq!(
        kit.holds.started(),
        vec![next.clone()],
        "the cancelled child ran: the stale start took the rebuilt owner's cancel"
    );
    assert_eq!(kit.holds.most_alive(), 1);
    assert_eq!(cancel_child(&b, &next).await, only(&next));
    b.shutdown();
}

/// A cancel decided while a lost start's requeue is being written waits for a start that never
/// comes once the owner is rebuilt: the rebuilt owner finds the child cancelled (or is told so
/// before it starts it) and starts nothing. The rebuild lets the dead owner's waiting cancels
/// of children that ended go, and the cancel is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_waiting_for_a_lost_start_is_answered_when_the_owner_is_rebuilt() {
    let _g = serial();
    for round in 0..4 {
        let dir = tempfile::tempdir().unwrap();
        let kit = Kit::default();
        let b = open(dir.path(), &kit);
        open_capped(&b, "s", 1).await;
        // The unit panics as it reads the start (the start is lost), and the requeue of the
        // lost start is written 400 ms late.
        failpoints::arm("unit_handler", 1);
        failpoints::arm("requeue_flush_stall", 1);
        let call = delegated(&b, "s", DelegateRequest::background(vec![task("a", hold())])).await;
        let a = child_id(&call, 0);
        wait_for!(
            "the lost start's requeue being written",
            (!failpoints::armed("requeue_flush_stall")).then_some(())
        );
        let cancelled = cancel_child(&b, &a);
        let rebuilt = async { b.restart_owner("s").await.expect("restart") };
        let (answer, ()) = tokio::join!(
            async {
                tokio::time::timeout(DEADLINE, cancelled)
                    .await
                    .unwrap_or_else(|_| panic!("round {round}: the cancel was never answered"))
            },
            rebuilt
        );
        assert_eq!(answer, only(&a));
        assert!(kit.holds.started().is_empty(), "the cancelled child ran");
        let got = collect_results(&b, "s", 1).await;
        assert_eq!(got[0].status, ChildStatus::Cancelled);
        b.shutdown();
        failpoints::disarm_all();
    }
}
