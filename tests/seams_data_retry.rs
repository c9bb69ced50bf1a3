//! Where task data, idempotent delegates, bounded envelopes and retry policies meet restarts,
//! rebuilt owners, retention and cancels: a child waiting out a retry's backoff is run again by
//! whichever owner holds its session next, and a call made again under a key after retention
//! removed the first one delivers its own results.

mod common;

use std::time::Duration;

use brood::{ChildStatus, DelegateRequest, ItemKind, RetryPolicy};
use common::*;

/// Two attempts, the second an hour after the first: a child that failed once is waiting.
fn slow_retry() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 2,
        backoff_ms: 3_600_000,
        max_backoff_ms: 3_600_000,
    }
}

/// Delegates one failing task with [`slow_retry`] to `session` and waits until its first attempt
/// failed and it waits out its backoff: the call id.
async fn waiting_to_retry(b: &brood::Brood, session: &str) -> String {
    let failing = task("fails", sim_outcome(0, "fail")).retry(slow_retry());
    let call = delegated(b, session, DelegateRequest::background(vec![failing])).await;
    wait_for!("the child waiting out its backoff", {
        let st = b.call(&call).await.unwrap();
        let c = &st.children[0];
        (c.status == ChildStatus::Queued && c.error.is_some()).then_some(())
    });
    call
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_owner_runs_again_a_child_waiting_out_its_retry() {
    let t = TestBrood::new();
    let b = t.b();
    open_wake(b, "s").await;
    let call = waiting_to_retry(b, "s").await;
    b.restart_owner("s").await.expect("restart");
    let items = collect_results(b, "s", 1).await;
    assert!(items.iter().all(|i| i.kind == ItemKind::Result), "{items:?}");
    assert_eq!(
        (items[0].status, items[0].attempts),
        (ChildStatus::Failed, 2),
        "its second attempt ran: {items:?}"
    );
    assert_eq!(b.call(&call).await.unwrap().children[0].attempt, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_runs_again_a_child_waiting_out_its_retry() {
    let mut t = TestBrood::new();
    open_wake(t.b(), "s").await;
    waiting_to_retry(t.b(), "s").await;
    t.reopen();
    let b = t.b();
    open_wake(b, "s").await;
    let items = collect_results(b, "s", 1).await;
    assert_eq!(
        (items[0].kind, items[0].status, items[0].attempts),
        (ItemKind::Result, ChildStatus::Failed, 2),
        "{items:?}"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_made_again_under_its_key_after_retention_delivers_its_own_results() {
    let t = TestBrood::with_retention(brood::Retention {
        delivered: Duration::from_millis(50),
        dead: Duration::from_secs(3_600),
        idle_session: None,
        interval: None,
        batch: 2,
    });
    let b = t.b();
    open_wake(b, "s").await;
    let keyed = || DelegateRequest::background(vec![task("once", sim(0))]).idempotency_key("k");
    let first = delegated(b, "s", keyed()).await;
    // Another call's item is acked in the same claim; that call stays (a child of it runs), and
    // so does the ack row.
    let other = delegated(
        b,
        "s",
        DelegateRequest::background(vec![task("quick", sim(0)), task("runs", hold())]).independent(),
    )
    .await;
    status_until(b, "s", "two results ready", |st| st.counts.ready == 2).await;
    let env = next_envelope(b, "s", "t", LONG_LEASE).await;
    assert_eq!(env.items.len(), 2);
    b.ack(&env.claim_id).await.unwrap();
    call_left_memory(b, "s", &first).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let swept = b.sweep().await.unwrap();
    assert_eq!(swept.calls, 1, "{swept:?}");
    assert!(b.call(&first).await.is_err(), "the keyed call was removed");
    assert_eq!(b.call(&other).await.unwrap().call.call_id, other);
    // The same key makes the call again, with the same id; its result is delivered, also by an
    // owner rebuilt from the ledger.
    let again = delegated(b, "s", keyed()).await;
    assert_eq!(again, first);
    status_until(b, "s", "the new result ready", |st| st.counts.ready == 1).await;
    b.restart_owner("s").await.expect("restart");
    let items = collect_results(b, "s", 1).await;
    assert_eq!(items[0].dedup_key, result_key(&again, 0), "{items:?}");
}
