//! I4 atomic claims — "concurrent boundaries from competing consumers get disjoint sets."
//!
//! Proven here with eight consumers racing boundary + ack over 1,000 items: when everything is
//! ready before the race, one claim takes all of it (a claim owns everything ready, or nothing);
//! when children finish during the race, the claims are many, disjoint, and together every
//! result, each delivered once (I2). The claim state machine itself is property-tested in
//! claim_model.rs.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use brood::{Brood, ChildStatus, DelegateRequest, Envelope, ItemKind};
use common::*;

const N: usize = 1000;

/// Runs `CONSUMERS` tasks that race boundary + ack until `total` items were delivered in all;
/// returns every envelope each consumer got. Odd consumers hold their claim for a moment before
/// acking, so several claims are live at once.
async fn race(b: &Arc<Brood>, session: &'static str, total: usize) -> Vec<Envelope> {
    const CONSUMERS: usize = 8;
    let delivered = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(tokio::sync::Barrier::new(CONSUMERS));
    let mut handles = Vec::new();
    for c in 0..CONSUMERS {
        let (b, delivered, start) = (b.clone(), delivered.clone(), start.clone());
        handles.push(tokio::spawn(async move {
            let consumer = format!("consumer-{c}");
            let mut claims = Vec::new();
            let deadline = Instant::now() + DEADLINE;
            start.wait().await;
            while delivered.load(Ordering::SeqCst) < total {
                assert!(Instant::now() < deadline, "{consumer}: results stopped arriving");
                match b.boundary(session, &consumer, LONG_LEASE).await.unwrap() {
                    Some(env) => {
                        assert_eq!(env.consumer, consumer);
                        if c % 2 == 1 {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        let n = b.ack(&env.claim_id).await.unwrap();
                        assert_eq!(n, env.items.len(), "an ack delivers exactly its claim's items");
                        delivered.fetch_add(n, Ordering::SeqCst);
                        claims.push(env);
                    }
                    None => tokio::task::yield_now().await,
                }
            }
            claims
        }));
    }
    let mut all = Vec::new();
    let mut per_consumer = Vec::new();
    for h in handles {
        let claims = h.await.unwrap();
        per_consumer.push(claims.len());
        all.extend(claims);
    }
    eprintln!("{session}: claims per consumer {per_consumer:?}");
    assert_eq!(
        delivered.load(Ordering::SeqCst),
        total,
        "every result was delivered exactly once"
    );
    all
}

/// Checks that `claims` are disjoint, unique, first attempts, and together exactly `expected`.
fn check_disjoint_cover(claims: &[Envelope], expected: &HashSet<String>) {
    let mut owner_of: HashMap<String, String> = HashMap::new();
    let mut claim_ids = HashSet::new();
    for env in claims {
        assert!(
            claim_ids.insert(env.claim_id.clone()),
            "claim id {} reused",
            env.claim_id
        );
        for item in &env.items {
            assert_eq!(item.kind, ItemKind::Result);
            assert_eq!(item.status, ChildStatus::Succeeded);
            assert_eq!(item.delivery_attempt, 1, "no claim ended, so no item was re-offered");
            if let Some(other) = owner_of.insert(item.dedup_key.clone(), env.claim_id.clone()) {
                panic!(
                    "{} was in two claims ({other} and {}): claims are not disjoint",
                    item.dedup_key, env.claim_id
                );
            }
        }
    }
    let got: HashSet<String> = owner_of.into_keys().collect();
    assert_eq!(got.len(), expected.len());
    assert!(&got == expected, "the union of the claims is not every result");
}

/// A brood with session `session` able to run all `N` children at once.
async fn wide_session(session: &str) -> (TestBrood, Arc<Brood>) {
    let t = TestBrood::new();
    let b = t.arc();
    open_capped(&b, session, N as u32).await;
    (t, b)
}

/// Nothing is left once the race is over.
async fn assert_all_delivered(b: &Brood, session: &str) {
    assert!(b.boundary(session, "late", LONG_LEASE).await.unwrap().is_none());
    let st = b.status(session).await.unwrap();
    assert_eq!(
        (st.counts.ready, st.counts.claimed, st.counts.delivered),
        (0, 0, N as u64)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_consumers_over_a_full_ready_set_get_one_claim_of_everything() {
    let (_t, b) = wide_session("ready").await;
    let tasks = (0..N).map(|i| task(format!("t{i}"), sim(0))).collect();
    let reply = b
        .delegate("ready", DelegateRequest::background(tasks).independent())
        .await
        .unwrap();
    let expected: HashSet<String> = (0..N as u32).map(|i| result_key(reply.call_id(), i)).collect();
    status_until(&b, "ready", "1000 ready items", |st| st.counts.ready == N).await;
    let claims = race(&b, "ready", N).await;
    check_disjoint_cover(&claims, &expected);
    assert_eq!(claims.len(), 1, "everything ready went to one claim");
    assert_all_delivered(&b, "ready").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_consumers_while_children_finish_get_disjoint_claims_of_every_result() {
    let (_t, b) = wide_session("trickle").await;
    // 1000 children finishing over ~150 ms while the consumers race.
    let tasks = (0..N)
        .map(|i| task(format!("t{i}"), sim((i as u64 * 7) % 150)))
        .collect();
    let reply = b
        .delegate("trickle", DelegateRequest::background(tasks).independent())
        .await
        .unwrap();
    let expected: HashSet<String> = (0..N as u32).map(|i| result_key(reply.call_id(), i)).collect();
    let claims = race(&b, "trickle", N).await;
    check_disjoint_cover(&claims, &expected);
    assert_all_delivered(&b, "trickle").await;
}
