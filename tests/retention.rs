//! Retention: a sweep removes exactly what is old enough — calls delivered long enough ago,
//! with their rows and the ack rows that recorded them — and nothing live, nothing recent, no
//! dead letter younger than its own window; a ledger under steady load stays bounded; an idle
//! session is removed and a live one is not; what was removed is not delivered again after a
//! restart.

use std::time::Duration;

use brood::*;

mod common;
use common::*;

fn retention(delivered_ms: u64, dead_ms: u64, idle_ms: Option<u64>) -> Retention {
    Retention {
        delivered: Duration::from_millis(delivered_ms),
        dead: Duration::from_millis(dead_ms),
        idle_session: idle_ms.map(Duration::from_millis),
        interval: None,
        // Small pages, so a sweep walks several.
        batch: 2,
    }
}

fn open(dir: &std::path::Path, kit: &Kit, policy: Retention) -> Brood {
    Brood::open(
        BroodConfig::new(dir.join("ledger"))
            .runners(kit.runners())
            .retention(policy),
    )
    .unwrap()
}

/// Delegates `n` sim children to `session` and acks their results: the call id.
async fn delivered_call(b: &Brood, session: &str, n: usize) -> String {
    let tasks = (0..n).map(|i| task(format!("t{i}"), sim(0))).collect();
    let call = b
        .delegate(session, DelegateRequest::background(tasks))
        .await
        .unwrap()
        .call_id()
        .to_string();
    let env = next_envelope(b, session, "t", LONG_LEASE).await;
    assert_eq!(env.items.len(), n);
    b.ack(&env.claim_id).await.unwrap();
    call_left_memory(b, session, &call).await;
    call
}

fn rows(b: &Brood, tree: &str) -> usize {
    b.stored_rows()
        .unwrap()
        .iter()
        .find(|(t, _)| *t == tree)
        .map_or(0, |(_, n)| *n)
}

fn total_rows(b: &Brood) -> usize {
    b.stored_rows().unwrap().iter().map(|(_, n)| n).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_removes_exactly_what_is_old_and_nothing_live() {
    let dir = tempfile::tempdir().unwrap();
    let kit = Kit::default();
    let b = open(dir.path(), &kit, retention(400, 3_600_000, None));
    b.open_session("s", SessionSettings::default().wake(|_| {}).max_delivery_attempts(1))
        .await
        .unwrap();
    let old = delivered_call(&b, "s", 3).await;
    // A dead letter: younger than its own window, so kept with its call.
    let dead = b
        .delegate("s", DelegateRequest::background(vec![task("dies", sim(0))]))
        .await
        .unwrap()
        .call_id()
        .to_string();
    let env = next_envelope(&b, "s", "t", LONG_LEASE).await;
    b.release(&env.claim_id, ReleaseReason::Failed, Duration::ZERO)
        .await
        .unwrap();
    wait_for!(
        "a dead letter",
        (b.dead_letters().await.unwrap().len() == 1).then_some(())
    );
    // A live call: its child runs.
    let live = b
        .delegate("s", DelegateRequest::background(vec![task("runs", hold())]))
        .await
        .unwrap()
        .call_id()
        .to_string();
    wait_for!("the live child runs", (kit.holds.started().len() == 1).then_some(()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A recent call: delivered, but not long enough ago.
    let recent = delivered_call(&b, "s", 1).await;
    let acks_before = rows(&b, "acks");

    let swept = b.sweep().await.unwrap();
    assert_eq!((swept.calls, swept.sessions), (1, 0), "{swept:?}");
    assert_eq!(swept.acks, 1, "the old call's ack row, not the recent one's: {swept:?}");
    assert_eq!(rows(&b, "acks"), acks_before - 1);
    let err = b.call(&old).await.unwrap_err();
    assert!(matches!(err, BroodError::UnknownTarget { kind: "call", .. }), "{err:?}");
    for kept in [&dead, &live, &recent] {
        assert_eq!(&b.call(kept).await.unwrap().call.call_id, kept);
    }
    assert_eq!(
        b.dead_letters().await.unwrap().len(),
        1,
        "the dead letter is younger than its window"
    );
    assert_eq!(
        rows(&b, "children"),
        2,
        "the dead one's and the recent one's (the live one has none yet)"
    );
    assert_eq!(kit.holds.stopped(), 0, "the live child was not touched");
    assert!(
        b.boundary("s", "t", LONG_LEASE).await.unwrap().is_none(),
        "nothing delivered again"
    );
    assert_eq!(
        b.sweep().await.unwrap(),
        Swept::default(),
        "a second sweep finds nothing more"
    );
    b.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_under_steady_load_stays_bounded_and_what_went_is_not_delivered_again() {
    let dir = tempfile::tempdir().unwrap();
    let kit = Kit::default();
    let b = open(dir.path(), &kit, retention(0, 0, None));
    open_wake(&b, "s").await;
    let mut after: Vec<usize> = Vec::new();
    for _ in 0..25 {
        delivered_call(&b, "s", 20).await;
        b.sweep().await.unwrap();
        after.push(total_rows(&b));
    }
    assert!(
        after.iter().all(|&n| n <= 3),
        "500 children went through; what stays is the session's rows only: {after:?}"
    );
    let delivered = b.counts("s").await.unwrap().delivered;
    assert_eq!(delivered, 500);
    b.shutdown();
    let b = open(dir.path(), &kit, retention(0, 0, None));
    open_wake(&b, "s").await;
    assert!(
        b.boundary("s", "t", LONG_LEASE).await.unwrap().is_none(),
        "nothing comes back"
    );
    let call = delivered_call(&b, "s", 1).await;
    assert!(b.call(&call).await.is_ok());
    b.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_is_removed_and_a_live_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let kit = Kit::default();
    let b = open(dir.path(), &kit, retention(0, 0, Some(300)));
    open_wake(&b, "idle").await;
    open_wake(&b, "busy").await;
    delivered_call(&b, "idle", 2).await;
    b.delegate("busy", DelegateRequest::background(vec![task("runs", hold())]))
        .await
        .unwrap();
    // Nothing happened in "idle" for long enough only after this.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let swept = b.sweep().await.unwrap();
    assert_eq!((swept.calls, swept.sessions), (1, 1), "{swept:?}");
    assert_eq!(b.sessions(), vec!["busy".to_string()]);
    assert!(matches!(b.counts("idle").await, Err(BroodError::UnknownSession(_))));
    b.shutdown();
    let b = open(dir.path(), &kit, retention(0, 0, Some(300)));
    assert_eq!(
        b.sessions(),
        vec!["busy".to_string()],
        "it stays removed after a restart"
    );
    b.shutdown();
}
