//! The engine's running totals (`Brood::totals`) and its delivery timings
//! (`BroodConfig::on_delivery_timing`): counted once what they count is durable, once per
//! child however often its end is recorded or read back, nothing for a request whose flush
//! failed; a restart starts them from 0. Counts only: no duration is looked at.
//!
//! Fault points are process-wide, so the tests of this file run one at a time.
#![cfg(feature = "failpoints")]
#![allow(clippy::await_holding_lock)]

mod common;

use brood::{
    failpoints, BroodError, CancelTarget, ChildStatus, DelegateRequest, DeliveryStage, ItemKind, RedriveSelect,
    ReleaseReason, RetryPolicy, SessionSettings,
};
use common::*;

/// One background call of one task; its id.
async fn one(t: &TestBrood, session: &str, runner: serde_json::Value) -> String {
    delegated(t.b(), session, DelegateRequest::background(vec![task("t", runner)])).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_end_read_again_by_a_rebuilt_owner_or_cancelled_after_counts_once() {
    let _g = serial();
    let t = TestBrood::new();
    open_wake(t.b(), "s").await;
    let call = one(&t, "s", sim(0)).await;
    next_envelope(t.b(), "s", "c", LONG_LEASE).await;
    assert_eq!(t.b().totals().ended(ChildStatus::Succeeded), 1);
    // The rebuilt owner reads the child's row ended: nothing to count.
    t.b().restart_owner("s").await.unwrap();
    // A cancel after its end finds it finished: its cancelled row is not recorded over it.
    let cancelled = t.b().cancel(CancelTarget::Call(call), "test", None).await.unwrap();
    assert_eq!(cancelled.already_finished, 1);
    let totals = t.b().totals();
    assert_eq!(totals.ended(ChildStatus::Succeeded), 1);
    assert_eq!(totals.ended(ChildStatus::Cancelled), 0);
    // The item the rebuilt owner published again was timed once, when the child ended.
    assert_eq!(t.kit.timings.count(DeliveryStage::EndToReady), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_end_whose_flush_failed_counts_once_when_it_is_recorded() {
    let _g = serial();
    let t = TestBrood::new();
    open_wake(t.b(), "s").await;
    one(&t, "s", gate("g")).await;
    status_until(t.b(), "s", "the child running", |st| st.counts.running == 1).await;
    failpoints::arm("ledger_flush", 1);
    t.kit.gates.open("g");
    let env = next_envelope(t.b(), "s", "c", LONG_LEASE).await;
    assert!(!failpoints::armed("ledger_flush"), "a flush failed on the way");
    assert_eq!(env.items.len(), 1);
    assert_eq!(t.b().totals().ended(ChildStatus::Succeeded), 1);
    assert_eq!(t.kit.timings.count(DeliveryStage::EndToReady), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_whose_flush_failed_counts_nothing_delivered() {
    let _g = serial();
    let t = TestBrood::new();
    open_wake(t.b(), "s").await;
    one(&t, "s", sim(0)).await;
    let env = next_envelope(t.b(), "s", "c", LONG_LEASE).await;
    failpoints::arm("ledger_flush", 1);
    let refused = t.b().ack(&env.claim_id).await.unwrap_err();
    assert!(matches!(refused, BroodError::Ledger(_)), "{refused}");
    assert_eq!(t.b().totals().delivered(ItemKind::Result), 0);
    assert_eq!(t.kit.timings.count(DeliveryStage::ReadyToAck), 0);
    assert_eq!(t.b().ack(&env.claim_id).await.unwrap(), 1);
    let totals = t.b().totals();
    assert_eq!(totals.delivered(ItemKind::Result), 1);
    assert_eq!(totals.delivered(ItemKind::FailureNotice), 0);
    assert_eq!(t.kit.timings.count(DeliveryStage::ReadyToAck), 1);
    // Acked again: the same answer, nothing counted again.
    assert_eq!(t.b().ack(&env.claim_id).await.unwrap(), 1);
    assert_eq!(t.b().totals().delivered(ItemKind::Result), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_whose_flush_failed_counts_nothing_redriven() {
    let _g = serial();
    let t = TestBrood::new();
    let settings = SessionSettings::default().wake(|_| {}).max_delivery_attempts(1);
    t.b().open_session("s", settings).await.unwrap();
    one(&t, "s", sim(0)).await;
    let env = next_envelope(t.b(), "s", "c", LONG_LEASE).await;
    t.b()
        .release(&env.claim_id, ReleaseReason::Failed, std::time::Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(t.b().dead_letters().await.unwrap().len(), 1);
    failpoints::arm("ledger_flush", 1);
    let refused = t
        .b()
        .redrive(RedriveSelect::Session("s".into()), None)
        .await
        .unwrap_err();
    assert!(matches!(refused, BroodError::Ledger(_)), "{refused}");
    assert_eq!(t.b().totals().redriven, 0);
    assert_eq!(
        t.b().redrive(RedriveSelect::Session("s".into()), None).await.unwrap(),
        1
    );
    assert_eq!(t.b().totals().redriven, 1);
    let env = next_envelope(t.b(), "s", "c", LONG_LEASE).await;
    assert_eq!(t.b().ack(&env.claim_id).await.unwrap(), 1);
    let totals = t.b().totals();
    assert_eq!(totals.delivered(ItemKind::Result), 1);
    // Made ready once by its child's end, timed to its ack once (from its redrive).
    assert_eq!(t.kit.timings.count(DeliveryStage::EndToReady), 1);
    assert_eq!(t.kit.timings.count(DeliveryStage::ReadyToAck), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_retry_counts_and_the_retried_child_ends_once() {
    let _g = serial();
    let t = TestBrood::new();
    open_wake(t.b(), "s").await;
    let retry = RetryPolicy {
        max_attempts: 3,
        backoff_ms: 0,
        max_backoff_ms: 0,
    };
    let request = DelegateRequest::background(vec![task("t", sim_outcome(0, "fail")).retry(retry)]);
    delegated(t.b(), "s", request).await;
    let env = next_envelope(t.b(), "s", "c", LONG_LEASE).await;
    assert_eq!(env.items.len(), 1, "{:?}", env.items);
    let totals = t.b().totals();
    assert_eq!(totals.retries, 2);
    assert_eq!(totals.ended(ChildStatus::Failed), 1);
    assert_eq!(t.kit.timings.count(DeliveryStage::EndToReady), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_wake_fired_is_counted() {
    let _g = serial();
    let t = TestBrood::new();
    let log = WakeLog::default();
    t.b()
        .open_session("s", SessionSettings::default().wake(log.target()))
        .await
        .unwrap();
    one(&t, "s", sim(0)).await;
    wait_for!("a wake", (log.count() == 1).then_some(()));
    let env = next_envelope(t.b(), "s", "c", LONG_LEASE).await;
    t.b().ack(&env.claim_id).await.unwrap();
    one(&t, "s", sim(0)).await;
    wait_for!("a second wake", (log.count() == 2).then_some(()));
    assert_eq!(t.b().totals().wakes, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_starts_the_totals_from_zero_and_counts_what_recovery_ended() {
    let _g = serial();
    let mut t = TestBrood::new();
    open_wake(t.b(), "s").await;
    one(&t, "s", sim(0)).await;
    let env = next_envelope(t.b(), "s", "c", LONG_LEASE).await;
    t.b().ack(&env.claim_id).await.unwrap();
    // Not safe to re-run: running at the restart, it ends `unknown`.
    one(&t, "s", gate("never")).await;
    status_until(t.b(), "s", "the child running", |st| st.counts.running == 1).await;
    assert_eq!(t.b().totals().ended(ChildStatus::Succeeded), 1);
    t.reopen();
    let totals = t.b().totals();
    assert_eq!(totals.ended(ChildStatus::Succeeded), 0);
    assert_eq!(totals.delivered(ItemKind::Result), 0);
    assert_eq!(totals.ended(ChildStatus::Unknown), 1);
    // Read back again by a rebuilt owner, it is not counted again.
    open_wake(t.b(), "s").await;
    t.b().restart_owner("s").await.unwrap();
    assert_eq!(t.b().totals().ended(ChildStatus::Unknown), 1);
}
