//! I2 no duplication — "an acknowledged item is never delivered again; an item is in at most one
//! live claim. (Between delivery and ack the guarantee is at-least-once, with stable dedup
//! keys.)"
//!
//! Proven here: acked items stay delivered across restarts, and a claim that ended (lease expiry,
//! release) or was acked is fenced: a late ack or release is refused and changes nothing, so it
//! can never deliver items a newer claim holds. Concurrent consumers are in i4_atomic_claims.rs.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use brood::{BroodError, DelegateRequest, Envelope, ReleaseReason};
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_items_are_never_delivered_again_after_reopen() {
    let mut t = TestBrood::new();
    let mixed = acked_claimed_and_ready(t.b(), "r").await;
    t.reopen();
    let b = t.b();
    open_wake(b, "r").await;
    let st = b.status("r").await.unwrap();
    assert_eq!(
        st.counts.delivered, 2,
        "the acked items count as delivered after the restart"
    );
    let env = b
        .boundary("r", "c", LONG_LEASE)
        .await
        .unwrap()
        .expect("unacked items are ready");
    assert!(
        keys(&env).is_disjoint(&mixed.acked),
        "an acked item is never delivered again"
    );
    assert_eq!(b.ack(&env.claim_id).await.unwrap(), 3);
    assert!(b.boundary("r", "c", LONG_LEASE).await.unwrap().is_none());

    t.reopen();
    let b = t.b();
    open_wake(b, "r").await;
    assert!(b.boundary("r", "c", LONG_LEASE).await.unwrap().is_none());
    assert_eq!(b.status("r").await.unwrap().counts.delivered, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_acked_after_a_restart_stays_delivered_and_leaves_memory() {
    let mut t = TestBrood::new();
    let (call, _) = take_four_unacked(t.b(), "i1").await;
    let env = reopened_envelope(&mut t, "i1", "returned items survive").await;
    let b = t.b();
    assert_eq!(b.ack(&env.claim_id).await.unwrap(), 4);
    t.reopen();
    let b = t.b();
    open_wake(b, "i1").await;
    assert!(
        b.boundary("i1", "c", LONG_LEASE).await.unwrap().is_none(),
        "acked items stay delivered"
    );
    assert!(b
        .status("i1")
        .await
        .unwrap()
        .calls
        .iter()
        .all(|c| c.call.call_id != call));
}

/// Two ready items claimed under [`SHORT_LEASE`] by consumer "slow", waited out until the lease
/// expired and the items are ready again. Returns the expired claim and the items' keys.
async fn expired_claim(b: &brood::Brood, session: &str) -> (Envelope, BTreeSet<String>) {
    open_wake(b, session).await;
    let reply = b
        .delegate(
            session,
            DelegateRequest::background(vec![task("a", sim(0)), task("b", sim(0))]),
        )
        .await
        .unwrap();
    let expected: BTreeSet<String> = (0..2).map(|i| result_key(reply.call_id(), i)).collect();
    let first = wait_for!(
        "the first claim",
        b.boundary(session, "slow", SHORT_LEASE).await.unwrap()
    );
    assert_eq!(keys(&first), expected);
    status_until(b, session, "the lease to expire", |st| {
        st.counts.claimed == 0 && st.counts.ready == 2
    })
    .await;
    (first, expected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_ack_while_the_items_are_ready_again_is_refused_and_changes_nothing() {
    let t = TestBrood::new();
    let b = t.b();
    let (first, _) = expired_claim(b, "la").await;
    match b.ack(&first.claim_id).await {
        Err(BroodError::ClaimLost(c)) => assert_eq!(c, first.claim_id),
        other => panic!("a late ack must be refused as claim_lost, got {other:?}"),
    }
    let st = b.status("la").await.unwrap();
    assert_eq!(
        (st.counts.ready, st.counts.claimed, st.counts.delivered),
        (2, 0, 0),
        "the refused ack changed nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_ack_or_release_while_a_newer_claim_holds_the_items_is_refused() {
    let t = TestBrood::new();
    let b = t.b();
    let (first, expected) = expired_claim(b, "la").await;
    let second = b
        .boundary("la", "fast", LONG_LEASE)
        .await
        .unwrap()
        .expect("items are ready again");
    assert_eq!(keys(&second), expected);
    assert!(second.items.iter().all(|i| i.delivery_attempt == 2));
    assert!(matches!(b.ack(&first.claim_id).await, Err(BroodError::ClaimLost(_))));
    assert!(matches!(
        b.release(&first.claim_id, ReleaseReason::Busy, Duration::ZERO).await,
        Err(BroodError::ClaimLost(_))
    ));
    let st = b.status("la").await.unwrap();
    assert_eq!(
        (st.counts.ready, st.counts.claimed, st.counts.delivered),
        (0, 2, 0),
        "the newer claim still owns the items"
    );
    assert_eq!(b.ack(&second.claim_id).await.unwrap(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_ack_answers_the_same_and_an_acked_claim_cannot_be_released() {
    let t = TestBrood::new();
    let b = t.b();
    let (_, expected) = expired_claim(b, "la").await;
    let second = b
        .boundary("la", "fast", LONG_LEASE)
        .await
        .unwrap()
        .expect("items are ready again");
    assert_eq!(keys(&second), expected);
    assert_eq!(b.ack(&second.claim_id).await.unwrap(), 2);
    assert_eq!(
        b.ack(&second.claim_id).await.unwrap(),
        2,
        "a repeated ack answers the same"
    );
    assert!(matches!(
        b.release(&second.claim_id, ReleaseReason::Busy, Duration::ZERO).await,
        Err(BroodError::ClaimAcked(_))
    ));
    assert!(b.boundary("la", "fast", LONG_LEASE).await.unwrap().is_none());
    assert_eq!(b.status("la").await.unwrap().counts.delivered, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_claim_cannot_be_acked() {
    let t = TestBrood::new();
    let Reclaimed { first, second, .. } = released_busy_then_reclaimed(&t).await;
    let b = t.b();
    assert!(
        matches!(b.ack(&first.claim_id).await, Err(BroodError::ClaimLost(_))),
        "a released claim cannot be acked"
    );
    assert_eq!(b.ack(&second.claim_id).await.unwrap(), 2);
}
