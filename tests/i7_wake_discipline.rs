//! I7 wake discipline — "a session is woken when it is idle, has ready items, and has not been
//! woken since its last boundary or its last busy → idle change: one wake however many items land
//! meanwhile. None for a session without wake capability."
//!
//! One test per clause. Tests that something did *not* wake let the engine `settle` first, so a
//! slow machine can make them miss a bug but never fail a correct engine. The pure wake state
//! machine is property-tested in claim_model.rs.

mod common;

use brood::{ChildStatus, DelegateReply, DelegateRequest, SessionSettings, SessionStatus, Turn};
use common::*;

/// Opens session `w` with `log` as its wake target and delegates six independent children
/// waiting on gates `w1` … `w6`; returns the call id.
async fn six_gated(t: &TestBrood, log: &WakeLog) -> String {
    let b = t.b();
    let info = b
        .open_session("w", SessionSettings::default().wake(log.target()))
        .await
        .unwrap();
    assert!(info.wake_capable);
    let tasks = (1..=6).map(|i| task(format!("w{i}"), gate(&format!("w{i}")))).collect();
    let reply = b
        .delegate("w", DelegateRequest::background(tasks).independent())
        .await
        .unwrap();
    assert!(matches!(reply, DelegateReply::Background { .. }));
    reply.call_id().to_string()
}

/// Opens gate `w{i}` and waits until its child is recorded.
async fn finish(t: &TestBrood, call: &str, i: u32) -> SessionStatus {
    t.kit.gates.open(&format!("w{i}"));
    status_until(t.b(), "w", "a gated child to be recorded", |st| {
        child_status(st, call, i - 1) == Some(ChildStatus::Succeeded)
    })
    .await
}

/// Children 1–3 complete at different moments while the session is idle, before any boundary,
/// after the first of them woke it.
async fn three_land_while_idle(t: &TestBrood, log: &WakeLog, call: &str) {
    for i in 1..=3u32 {
        finish(t, call, i).await;
        if i == 1 {
            wait_for!("the first wake", (log.count() >= 1).then_some(()));
        }
    }
}

/// [`three_land_while_idle`], then a boundary takes and acks the three.
async fn first_period_delivered(t: &TestBrood, log: &WakeLog, call: &str) {
    three_land_while_idle(t, log, call).await;
    let b = t.b();
    let env = b.boundary("w", "c", LONG_LEASE).await.unwrap().expect("three ready");
    assert_eq!(env.items.len(), 3);
    b.ack(&env.claim_id).await.unwrap();
}

/// Child 6 completes while the session is busy.
async fn one_lands_while_busy(t: &TestBrood, call: &str) {
    let b = t.b();
    b.set_turn("w", Turn::Busy).await.unwrap();
    let st = finish(t, call, 6).await;
    assert_eq!(st.counts.ready, 1);
    assert_eq!(st.counts.info.turn, Turn::Busy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_wake_while_nothing_is_ready() {
    let t = TestBrood::new();
    let log = WakeLog::default();
    six_gated(&t, &log).await;
    settle(t.b(), "w").await;
    assert_eq!(log.count(), 0, "nothing ready, no wake");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_wake_however_many_items_land_while_idle() {
    let t = TestBrood::new();
    let log = WakeLog::default();
    let call = six_gated(&t, &log).await;
    three_land_while_idle(&t, &log, &call).await;
    settle(t.b(), "w").await;
    assert_eq!(
        log.count(),
        1,
        "one wake however many items land meanwhile: {:?}",
        log.events()
    );
    let ev = &log.events()[0];
    assert_eq!(ev.session_id, "w");
    assert!(ev.ready >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boundary_that_leaves_nothing_ready_does_not_wake() {
    let t = TestBrood::new();
    let log = WakeLog::default();
    let call = six_gated(&t, &log).await;
    first_period_delivered(&t, &log, &call).await;
    settle(t.b(), "w").await;
    assert_eq!(log.count(), 1, "a boundary with nothing left does not wake");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_landing_after_a_boundary_wake_once_more() {
    let t = TestBrood::new();
    let log = WakeLog::default();
    let call = six_gated(&t, &log).await;
    first_period_delivered(&t, &log, &call).await;
    for i in 4..=5u32 {
        finish(&t, &call, i).await;
        if i == 4 {
            wait_for!("the second wake", (log.count() >= 2).then_some(()));
        }
    }
    let b = t.b();
    settle(b, "w").await;
    assert_eq!(log.count(), 2, "{:?}", log.events());
    let env = b.boundary("w", "c", LONG_LEASE).await.unwrap().expect("two ready");
    assert_eq!(env.items.len(), 2);
    b.ack(&env.claim_id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_session_is_never_woken() {
    let t = TestBrood::new();
    let log = WakeLog::default();
    let call = six_gated(&t, &log).await;
    one_lands_while_busy(&t, &call).await;
    settle(t.b(), "w").await;
    assert_eq!(log.count(), 0, "a busy session is never woken");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_busy_to_idle_change_with_ready_items_wakes() {
    let t = TestBrood::new();
    let log = WakeLog::default();
    let call = six_gated(&t, &log).await;
    one_lands_while_busy(&t, &call).await;
    let b = t.b();
    b.set_turn("w", Turn::Idle).await.unwrap();
    wait_for!("the busy->idle wake", (log.count() >= 1).then_some(()));
    // Another busy -> idle change with the item still ready: a new idle period, a new wake.
    b.set_turn("w", Turn::Busy).await.unwrap();
    b.set_turn("w", Turn::Idle).await.unwrap();
    wait_for!("the second busy->idle wake", (log.count() >= 2).then_some(()));
    let env = b.boundary("w", "c", LONG_LEASE).await.unwrap().expect("one ready");
    b.ack(&env.claim_id).await.unwrap();
    settle(b, "w").await;
    assert_eq!(log.count(), 2, "{:?}", log.events());
    assert!(log.events().iter().all(|e| e.session_id == "w"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_to_idle_change_does_not_wake() {
    let t = TestBrood::new();
    let log = WakeLog::default();
    let call = six_gated(&t, &log).await;
    one_lands_while_busy(&t, &call).await;
    let b = t.b();
    b.set_turn("w", Turn::Idle).await.unwrap();
    wait_for!("the busy->idle wake", (log.count() >= 1).then_some(()));
    // Idle -> idle opens no new idle period.
    b.set_turn("w", Turn::Idle).await.unwrap();
    settle(b, "w").await;
    assert_eq!(log.count(), 1, "{:?}", log.events());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_without_wake_capability_runs_background_calls_sync_and_wakes_nobody() {
    let t = TestBrood::new();
    let b = t.b();
    // A wake-capable neighbour, to see that nothing is woken in its place.
    let log = WakeLog::default();
    b.open_session("w", SessionSettings::default().wake(log.target()))
        .await
        .unwrap();
    let info = b.open_session("nw", SessionSettings::default()).await.unwrap();
    assert!(!info.wake_capable);
    match b
        .delegate(
            "nw",
            DelegateRequest::background(vec![task("x", sim(0)), task("y", sim(0))]),
        )
        .await
        .unwrap()
    {
        DelegateReply::Sync {
            forced_sync_reason,
            results,
            set,
            ..
        } => {
            let why = forced_sync_reason.expect("a forced sync says why");
            assert!(why.contains("wake"), "{why}");
            assert_eq!(set, 1);
            assert_eq!(results.len(), 2);
            assert!(results.iter().all(|r| r.status == ChildStatus::Succeeded));
        }
        other => panic!("a session without wake capability must get a sync reply, got {other:?}"),
    }
    assert!(
        b.boundary("nw", "c", LONG_LEASE).await.unwrap().is_none(),
        "inline results count as delivered"
    );
    assert_eq!(b.status("nw").await.unwrap().counts.delivered, 2);
    settle(b, "nw").await;
    assert_eq!(log.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebinding_a_wake_target_after_a_restart_wakes_once_for_recovered_items() {
    let mut t = TestBrood::new();
    acked_claimed_and_ready(t.b(), "r").await;
    t.reopen();
    let b = t.b();
    let log = WakeLog::default();
    b.open_session("r", SessionSettings::default().wake(log.target()))
        .await
        .unwrap();
    wait_for!("a wake for the recovered ready items", (log.count() >= 1).then_some(()));
    let env = b
        .boundary("r", "c", LONG_LEASE)
        .await
        .unwrap()
        .expect("unacked items are ready");
    assert_eq!(b.ack(&env.claim_id).await.unwrap(), 3);
    assert!(b.boundary("r", "c", LONG_LEASE).await.unwrap().is_none());
    settle(b, "r").await;
    assert_eq!(log.count(), 1, "{:?}", log.events());
}
