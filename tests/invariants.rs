//! Integration tests of DESIGN.md's invariants (I1–I8) through the embedding API, against a real
//! sled ledger in a temporary folder.
//!
//! No test asserts on how long something took: each waits for a condition with a bounded
//! deadline. The only clock checks are lower bounds (a backoff held an item at least that long),
//! which a slow machine cannot break.

mod common;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use brood::{child_id, dedup_key};
use brood::{BroodError, ChildStatus, DelegateReply, DelegateRequest, ItemKind, ReleaseReason, SessionOptions, Turn};
use common::*;

const SHORT_LEASE: Duration = Duration::from_millis(100);

// ---------------------------------------------------------------------------------------------
// 1. I3: no sibling blocking

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_child_is_delivered_while_slow_sibling_runs() {
    let t = TestBrood::new();
    let b = t.b();
    open_wake(b, "s").await;

    // Within one call: each ungrouped task is its own unit; the slow one hangs for good.
    let call1 = b
        .delegate(
            "s",
            DelegateRequest::background(vec![task("slow", sim_outcome(0, "hang")), task("fast", sim(0))]).independent(),
        )
        .await
        .unwrap();
    let call1 = call1.call_id().to_string();
    let env = next_envelope(b, "s", "c", LONG_LEASE).await;
    assert_eq!(keys(&env), BTreeSet::from([result_key(&call1, 1)]));
    assert_eq!(env.items[0].status, ChildStatus::Succeeded);
    let st = b.status("s").await.unwrap();
    assert_eq!(
        child_status(&st, &call1, 0),
        Some(ChildStatus::Running),
        "the slow sibling still runs"
    );
    assert_eq!(b.ack(&env.claim_id).await.unwrap(), 1);

    // Across calls: a later call's fast child is not held back by call 1's hanging unit.
    let call2 = b
        .delegate("s", DelegateRequest::background(vec![task("fast 2", sim(0))]))
        .await
        .unwrap();
    let call2 = call2.call_id().to_string();
    let env = next_envelope(b, "s", "c", LONG_LEASE).await;
    assert_eq!(keys(&env), BTreeSet::from([result_key(&call2, 0)]));
    assert_eq!(b.ack(&env.claim_id).await.unwrap(), 1);

    // The other side of the rule: a unit goes out whole. Ungrouped tasks of a default call form
    // one unit, so its fast child waits for the gated one (and for nothing else).
    let call3 = b
        .delegate(
            "s",
            DelegateRequest::background(vec![task("fast 3", sim(0)), task("gated", gate("g3"))]),
        )
        .await
        .unwrap();
    let call3 = call3.call_id().to_string();
    status_until(b, "s", "the fast child of call 3 to be recorded", |st| {
        child_status(st, &call3, 0) == Some(ChildStatus::Succeeded)
    })
    .await;
    assert!(
        b.boundary("s", "c", LONG_LEASE).await.unwrap().is_none(),
        "a unit must not go out before its last child is terminal"
    );
    t.kit.gates.open("g3");
    let env = next_envelope(b, "s", "c", LONG_LEASE).await;
    assert_eq!(
        keys(&env),
        BTreeSet::from([result_key(&call3, 0), result_key(&call3, 1)])
    );
    b.ack(&env.claim_id).await.unwrap();
    let st = b.status("s").await.unwrap();
    assert_eq!(child_status(&st, &call1, 0), Some(ChildStatus::Running));
}

// ---------------------------------------------------------------------------------------------
// 2. I4 + I2: racing consumers

/// Runs `CONSUMERS` tasks that race boundary + ack until `total` items were delivered in all;
/// returns every envelope each consumer got. Odd consumers hold their claim for a moment before
/// acking, so several claims are live at once.
async fn race(b: &Arc<brood::Brood>, session: &'static str, total: usize) -> Vec<brood::Envelope> {
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
fn check_disjoint_cover(claims: &[brood::Envelope], expected: &HashSet<String>) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_consumers_get_disjoint_claims_and_each_result_once() {
    const N: usize = 1000;
    let t = TestBrood::new();
    let b = t.arc();
    for s in ["ready", "trickle"] {
        b.open_session(
            s,
            SessionOptions::default().wake(|_| {}).max_concurrent_children(N as u32),
        )
        .await
        .unwrap();
    }

    // 1000 items all ready before 8 consumers hit the boundary at once: one claim takes every
    // item (a claim owns everything ready, or nothing), the others get nothing.
    let tasks = (0..N).map(|i| task(format!("t{i}"), sim(0))).collect();
    let reply = b
        .delegate("ready", DelegateRequest::background(tasks).independent())
        .await
        .unwrap();
    let expected: HashSet<String> = (0..N as u32).map(|i| result_key(reply.call_id(), i)).collect();
    status_until(&b, "ready", "1000 ready items", |st| st.ready == N).await;
    let claims = race(&b, "ready", N).await;
    check_disjoint_cover(&claims, &expected);
    assert_eq!(claims.len(), 1, "everything ready went to one claim");

    // 1000 children finishing over ~150 ms while the consumers race: many claims, still
    // disjoint and together everything.
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

    for s in ["ready", "trickle"] {
        assert!(b.boundary(s, "late", LONG_LEASE).await.unwrap().is_none());
        let st = b.status(s).await.unwrap();
        assert_eq!((st.ready, st.claimed, st.delivered), (0, 0, N as u64));
    }
}

// ---------------------------------------------------------------------------------------------
// 3. I5: lease expiry

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expiry_returns_items_with_next_delivery_attempt() {
    let t = TestBrood::new();
    let b = t.b();
    open_wake(b, "l").await;
    let reply = b
        .delegate(
            "l",
            DelegateRequest::background(vec![task("a", sim(0)), task("b", sim(0)), task("c", sim(0))]).independent(),
        )
        .await
        .unwrap();
    let call = reply.call_id().to_string();
    status_until(b, "l", "three ready items", |st| st.ready == 3).await;

    let first = b
        .boundary("l", "c1", SHORT_LEASE)
        .await
        .unwrap()
        .expect("three items are ready");
    let expected: BTreeSet<String> = (0..3).map(|i| result_key(&call, i)).collect();
    assert_eq!(keys(&first), expected);
    assert!(first.items.iter().all(|i| i.delivery_attempt == 1));

    // Not acked: after the lease the same items come back, as the next delivery attempt.
    let second = next_envelope(b, "l", "c2", LONG_LEASE).await;
    assert_ne!(second.claim_id, first.claim_id);
    assert_eq!(keys(&second), expected, "the same dedup keys come back");
    for item in &second.items {
        assert_eq!(
            item.delivery_attempt, 2,
            "{} came back as attempt {}",
            item.dedup_key, item.delivery_attempt
        );
        assert!(
            second.text.contains(&item.dedup_key),
            "a re-offered item names its dedup key"
        );
    }
    assert_eq!(b.ack(&second.claim_id).await.unwrap(), 3);
    assert!(b.boundary("l", "c3", LONG_LEASE).await.unwrap().is_none());
}

// ---------------------------------------------------------------------------------------------
// 4. A late ack is refused and changes nothing

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_ack_after_lease_expiry_is_refused_and_changes_nothing() {
    let t = TestBrood::new();
    let b = t.b();
    open_wake(b, "la").await;
    let reply = b
        .delegate(
            "la",
            DelegateRequest::background(vec![task("a", sim(0)), task("b", sim(0))]),
        )
        .await
        .unwrap();
    let call = reply.call_id().to_string();
    let expected: BTreeSet<String> = (0..2).map(|i| result_key(&call, i)).collect();

    let first = wait_for!("the first claim", b.boundary("la", "slow", SHORT_LEASE).await.unwrap());
    assert_eq!(keys(&first), expected);
    status_until(b, "la", "the lease to expire", |st| st.claimed == 0 && st.ready == 2).await;

    // Lost while the items are ready again.
    match b.ack(&first.claim_id).await {
        Err(BroodError::ClaimLost(c)) => assert_eq!(c, first.claim_id),
        other => panic!("a late ack must be refused as claim_lost, got {other:?}"),
    }
    let st = b.status("la").await.unwrap();
    assert_eq!(
        (st.ready, st.claimed, st.delivered),
        (2, 0, 0),
        "the refused ack changed nothing"
    );

    // Lost while the items are in a newer claim.
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
        (st.ready, st.claimed, st.delivered),
        (0, 2, 0),
        "the newer claim still owns the items"
    );

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
    assert!(matches!(b.ack("clm_6c61_nope").await, Err(BroodError::UnknownClaim(_))));
    assert!(b.boundary("la", "fast", LONG_LEASE).await.unwrap().is_none());
    assert_eq!(b.status("la").await.unwrap().delivered, 2);
}

// ---------------------------------------------------------------------------------------------
// 5. A busy release re-coalesces with newer completions

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_release_recoalesces_with_newer_completion() {
    let t = TestBrood::new();
    let b = t.b();
    open_wake(b, "r").await;
    let reply = b
        .delegate(
            "r",
            DelegateRequest::background(vec![task("A", sim(0)), task("B", gate("b"))]).independent(),
        )
        .await
        .unwrap();
    let call = reply.call_id().to_string();
    let (a, bk) = (result_key(&call, 0), result_key(&call, 1));

    let first = next_envelope(b, "r", "c", LONG_LEASE).await;
    assert_eq!(keys(&first), BTreeSet::from([a.clone()]), "B is still running");
    b.release(&first.claim_id, ReleaseReason::Busy, Duration::ZERO)
        .await
        .unwrap();

    t.kit.gates.open("b");
    status_until(b, "r", "B to be recorded", |st| {
        child_status(st, &call, 1) == Some(ChildStatus::Succeeded) && st.ready == 2
    })
    .await;
    let second = b
        .boundary("r", "c", LONG_LEASE)
        .await
        .unwrap()
        .expect("A and B are ready");
    assert_eq!(
        keys(&second),
        BTreeSet::from([a.clone(), bk.clone()]),
        "one envelope holds both"
    );
    for item in &second.items {
        assert_eq!(
            item.delivery_attempt, 1,
            "a busy release is not a delivery attempt ({})",
            item.dedup_key
        );
    }
    assert!(
        matches!(b.ack(&first.claim_id).await, Err(BroodError::ClaimLost(_))),
        "a released claim cannot be acked"
    );
    assert_eq!(b.ack(&second.claim_id).await.unwrap(), 2);
}

// ---------------------------------------------------------------------------------------------
// 6. I5: failed releases back off, then dead-letter

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_releases_back_off_and_dead_letter_after_max_attempts() {
    let mut t = TestBrood::new();
    let b = t.b();
    b.open_session("dl", SessionOptions::default().wake(|_| {}).max_delivery_attempts(3))
        .await
        .unwrap();
    let reply = b
        .delegate("dl", DelegateRequest::background(vec![task("poison", sim(0))]))
        .await
        .unwrap();
    let call = reply.call_id().to_string();
    let key = result_key(&call, 0);

    let mut released: Option<(Instant, u64)> = None;
    for attempt in 1..=3u32 {
        let env = next_envelope(b, "dl", "c", LONG_LEASE).await;
        if let Some((at, backoff_ms)) = released {
            // A lower bound only: the backoff held the item at least this long.
            let waited = at.elapsed();
            assert!(
                waited >= Duration::from_millis(backoff_ms - 2),
                "attempt {attempt} was offered {waited:?} after a failed release; the backoff is {backoff_ms} ms"
            );
        }
        assert_eq!(keys(&env), BTreeSet::from([key.clone()]));
        assert_eq!(env.items[0].delivery_attempt, attempt);
        let at = Instant::now();
        b.release(&env.claim_id, ReleaseReason::Failed, Duration::ZERO)
            .await
            .unwrap();
        released = Some((at, 100u64 << (attempt - 1)));
    }

    let dead = wait_for!("the dead letter", {
        let all = b.dead_letters().await.unwrap();
        let mine: Vec<_> = all.into_iter().filter(|d| d.dedup_key == key).collect();
        (!mine.is_empty()).then_some(mine)
    });
    assert_eq!(dead.len(), 1, "one dead letter per item");
    assert_eq!(dead[0].attempts, 3);
    assert_eq!(dead[0].session_id, "dl");
    assert_eq!(dead[0].call_id, call);
    assert_eq!(dead[0].kind, ItemKind::Result);
    let st = b.status("dl").await.unwrap();
    assert_eq!((st.ready, st.claimed), (0, 0));
    // Longer than the next backoff would have been: it is not merely backing off.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        b.boundary("dl", "c", LONG_LEASE).await.unwrap().is_none(),
        "a dead item is never offered again"
    );

    // Durable: after a restart it is still dead and still not offered.
    t.reopen();
    let b = t.b();
    open_wake(b, "dl").await;
    assert!(b.boundary("dl", "c", LONG_LEASE).await.unwrap().is_none());
    let dead: Vec<_> = b
        .dead_letters()
        .await
        .unwrap()
        .into_iter()
        .filter(|d| d.dedup_key == key)
        .collect();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].attempts, 3);
}

// ---------------------------------------------------------------------------------------------
// 7. A panicking runner fails only its child

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panicking_runner_fails_only_its_child() {
    let t = TestBrood::new();
    let b = t.b();
    open_wake(b, "p").await;
    let reply = b
        .delegate(
            "p",
            DelegateRequest::background(vec![
                task("a", sim(0)),
                task("boom", sim_outcome(0, "panic")),
                task("c", sim(20)),
            ]),
        )
        .await
        .unwrap();
    let call = reply.call_id().to_string();
    let items = collect_results(b, "p", 3).await;
    let results: HashMap<u32, _> = items
        .iter()
        .filter(|i| i.kind == ItemKind::Result)
        .map(|i| (i.task_index, i))
        .collect();
    assert_eq!(results.len(), 3);
    let boom = results[&1];
    assert_eq!(boom.status, ChildStatus::Failed);
    let error = boom.error.as_deref().unwrap_or_default();
    let expected = format!("simulated panic in {}", child_id(&call, 1));
    assert!(error.contains(&expected), "the panic message is the error: {error:?}");
    for i in [0, 2] {
        assert_eq!(results[&i].status, ChildStatus::Succeeded, "sibling {i} must succeed");
        assert!(results[&i].error.is_none());
    }

    // The system goes on.
    match b
        .delegate("p", DelegateRequest::sync(vec![task("after", sim(0))]))
        .await
        .unwrap()
    {
        DelegateReply::Sync {
            results,
            forced_sync_reason,
            set,
            ..
        } => {
            assert_eq!(set, 2);
            assert!(forced_sync_reason.is_none());
            assert_eq!(results.len(), 1);
            assert_eq!(results[0].status, ChildStatus::Succeeded);
        }
        other => panic!("a sync call answers inline, got {other:?}"),
    }
    let later = b
        .delegate("p", DelegateRequest::background(vec![task("later", sim(0))]))
        .await
        .unwrap();
    assert_eq!(later.set(), 3);
    let items = collect_results(b, "p", 1).await;
    assert_eq!(items[0].dedup_key, result_key(later.call_id(), 0));
    assert_eq!(items[0].status, ChildStatus::Succeeded);
}

// ---------------------------------------------------------------------------------------------
// 8. I8: capacity

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_bounds_real_concurrency_and_queued_children_do_not_stall() {
    const CAP: usize = 2;
    let t = TestBrood::new();
    let b = t.arc();
    b.open_session(
        "cap",
        SessionOptions::default()
            .wake(|_| {})
            .max_concurrent_children(CAP as u32),
    )
    .await
    .unwrap();
    // Each child runs 150 ms and heartbeats; its stall timeout (400 ms) is shorter than the
    // time the later ones wait in the queue (up to ~600 ms), so a stall clock that ran while
    // queued would interrupt them.
    let t150 = |goal: String| {
        let mut t = task(goal, probe(150));
        t.stall_ms = Some(400);
        t
    };
    let independent = b
        .delegate(
            "cap",
            DelegateRequest::background((0..10).map(|i| t150(format!("ind {i}"))).collect()).independent(),
        )
        .await
        .unwrap();
    // The same capacity applies however a call is split into units.
    let one_unit = b
        .delegate(
            "cap",
            DelegateRequest::background((0..4).map(|i| t150(format!("unit {i}"))).collect()),
        )
        .await
        .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let b = b.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let (mut samples, mut max_running) = (0usize, 0usize);
            while !stop.load(Ordering::SeqCst) {
                let st = b.status("cap").await.unwrap();
                assert!(
                    st.running <= CAP,
                    "status reports {} running with capacity {CAP}",
                    st.running
                );
                max_running = max_running.max(st.running);
                samples += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            (samples, max_running)
        })
    };
    let items = collect_results(&b, "cap", 14).await;
    stop.store(true, Ordering::SeqCst);
    let (samples, sampled_max) = sampler.await.unwrap();
    eprintln!("status samples: {samples}, most running seen: {sampled_max}");

    for item in items.iter().filter(|i| i.kind == ItemKind::Result) {
        assert_eq!(
            item.status,
            ChildStatus::Succeeded,
            "{} ended {} ({:?}): a queued child must not be stalled",
            item.dedup_key,
            item.status,
            item.error
        );
    }
    assert!(
        !items.iter().any(|i| i.kind == ItemKind::FailureNotice),
        "no child failed, so there is no failure notice"
    );
    let real_max = t.kit.probe.max.load(Ordering::SeqCst);
    assert!(real_max <= CAP, "{real_max} runners ran at once with capacity {CAP}");
    assert_eq!(real_max, CAP, "capacity 2 with 14 queued children should run 2 at once");
    assert_eq!(t.kit.probe.current.load(Ordering::SeqCst), 0);

    // Children over capacity wait in order: a child starts at most CAP-1 places from its queue
    // position (children admitted together may start in either order).
    let expected: Vec<String> = (0..10)
        .map(|i| child_id(independent.call_id(), i))
        .chain((0..4).map(|i| child_id(one_unit.call_id(), i)))
        .collect();
    let starts = t.kit.probe.starts.lock().unwrap().clone();
    assert_eq!(starts.len(), expected.len(), "every child ran once: {starts:?}");
    for (want, id) in expected.iter().enumerate() {
        let got = starts.iter().position(|s| s == id).expect("child started");
        assert!(
            got.abs_diff(want) < CAP,
            "{id} started {got}th but was queued {want}th: {starts:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 9. Set ordinals are per session and durable

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_ordinals_count_per_session_and_survive_reopen() {
    let mut t = TestBrood::new();
    let b = t.b();
    open_wake(b, "s1").await;
    open_wake(b, "s2").await;
    let one = || DelegateRequest::background(vec![task("x", sim(0))]);
    assert_eq!(b.delegate("s1", one()).await.unwrap().set(), 1);
    assert_eq!(b.delegate("s2", one()).await.unwrap().set(), 1);
    assert_eq!(b.delegate("s1", one()).await.unwrap().set(), 2);
    // A sync call takes a set number too.
    let sync = b
        .delegate("s2", DelegateRequest::sync(vec![task("y", sim(0))]))
        .await
        .unwrap();
    assert!(matches!(sync, DelegateReply::Sync { .. }));
    assert_eq!(sync.set(), 2);
    assert!(sync.note().contains("set 2"), "{}", sync.note());

    t.reopen();
    let b = t.b();
    open_wake(b, "s1").await;
    assert_eq!(b.delegate("s1", one()).await.unwrap().set(), 3);
    // s2 is re-opened without a wake target: its background call is forced to sync, and still
    // takes its session's next set.
    b.open_session("s2", SessionOptions::default()).await.unwrap();
    let forced = b.delegate("s2", one()).await.unwrap();
    assert!(matches!(forced, DelegateReply::Sync { .. }));
    assert_eq!(forced.set(), 3);
    open_wake(b, "s3").await;
    assert_eq!(
        b.delegate("s3", one()).await.unwrap().set(),
        1,
        "a new session starts at set 1"
    );
    assert_eq!(b.delegate("s1", one()).await.unwrap().set(), 4);
}

// ---------------------------------------------------------------------------------------------
// 10. Reopen: acked stays delivered, unacked (and claimed) is ready

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopen_keeps_acked_delivered_and_unacked_ready() {
    let mut t = TestBrood::new();
    let b = t.b();
    open_wake(b, "r").await;

    let acked = b
        .delegate(
            "r",
            DelegateRequest::background(vec![task("a0", sim(0)), task("a1", sim(0))]),
        )
        .await
        .unwrap();
    let acked_keys: BTreeSet<String> = (0..2).map(|i| result_key(acked.call_id(), i)).collect();
    let env = next_envelope(b, "r", "c", LONG_LEASE).await;
    assert_eq!(keys(&env), acked_keys);
    assert_eq!(b.ack(&env.claim_id).await.unwrap(), 2);

    let claimed = b
        .delegate("r", DelegateRequest::background(vec![task("c0", sim(0))]))
        .await
        .unwrap();
    let claimed_key = result_key(claimed.call_id(), 0);
    let held = next_envelope(b, "r", "c", LONG_LEASE).await;
    assert_eq!(keys(&held), BTreeSet::from([claimed_key.clone()]));

    let ready = b
        .delegate(
            "r",
            DelegateRequest::background(vec![task("r0", sim(0)), task("r1", sim(0))]),
        )
        .await
        .unwrap();
    let ready_keys: BTreeSet<String> = (0..2).map(|i| result_key(ready.call_id(), i)).collect();
    status_until(b, "r", "two ready items and one claimed", |st| {
        st.ready == 2 && st.claimed == 1
    })
    .await;

    t.reopen();
    let b = t.b();
    // Re-binding the wake target of a session with ready items wakes it once (I7).
    let log = WakeLog::default();
    b.open_session("r", SessionOptions::default().wake(log.target()))
        .await
        .unwrap();
    wait_for!("a wake for the recovered ready items", (log.count() >= 1).then_some(()));
    assert!(
        matches!(b.ack(&held.claim_id).await, Err(BroodError::ClaimLost(_))),
        "a claim from before the restart was returned; acking it is refused"
    );
    let st = b.status("r").await.unwrap();
    assert_eq!(st.delivered, 2, "the acked items count as delivered after the restart");
    let env = b
        .boundary("r", "c", LONG_LEASE)
        .await
        .unwrap()
        .expect("unacked items are ready");
    let mut want = ready_keys.clone();
    want.insert(claimed_key.clone());
    assert_eq!(keys(&env), want, "exactly the unacked items, the claimed one included");
    assert!(
        keys(&env).is_disjoint(&acked_keys),
        "an acked item is never delivered again"
    );
    for item in &env.items {
        assert_eq!(
            item.delivery_attempt, 1,
            "a claim returned by recovery is not a delivery attempt ({})",
            item.dedup_key
        );
        assert_eq!(item.status, ChildStatus::Succeeded);
    }
    assert_eq!(b.ack(&env.claim_id).await.unwrap(), 3);
    assert!(b.boundary("r", "c", LONG_LEASE).await.unwrap().is_none());
    settle(b, "r").await;
    assert_eq!(log.count(), 1, "{:?}", log.events());

    t.reopen();
    let b = t.b();
    open_wake(b, "r").await;
    assert!(b.boundary("r", "c", LONG_LEASE).await.unwrap().is_none());
    assert_eq!(b.status("r").await.unwrap().delivered, 5);
}

// ---------------------------------------------------------------------------------------------
// 11. I1 at the API level

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_a_boundary_returned_survive_reopen_unless_acked() {
    let mut t = TestBrood::new();
    let b = t.b();
    open_wake(b, "i1").await;
    let tasks = (0..4)
        .map(|i| {
            task(
                format!("t{i}"),
                serde_json::json!({"kind": "sim", "ms": i * 10, "summary": format!("summary {i}")}),
            )
        })
        .collect();
    let reply = b
        .delegate("i1", DelegateRequest::background(tasks).independent())
        .await
        .unwrap();
    let call = reply.call_id().to_string();
    // Take everything as it arrives, possibly in several envelopes, acking nothing.
    let mut returned = HashMap::new();
    while returned.len() < 4 {
        let env = next_envelope(b, "i1", "c", LONG_LEASE).await;
        for item in env.items {
            assert!(returned.insert(item.dedup_key.clone(), item).is_none());
        }
    }
    // Restart right away.
    t.reopen();
    let b = t.b();
    open_wake(b, "i1").await;
    let env = b
        .boundary("i1", "c", LONG_LEASE)
        .await
        .unwrap()
        .expect("returned items survive");
    assert_eq!(keys(&env), returned.keys().cloned().collect::<BTreeSet<_>>());
    for item in &env.items {
        let before = &returned[&item.dedup_key];
        assert_eq!(item.status, before.status);
        assert_eq!(item.summary, before.summary);
        assert_eq!(item.child_id, before.child_id);
        assert_eq!(item.set, 1);
    }
    assert_eq!(
        env.items.iter().find(|i| i.task_index == 3).unwrap().summary.as_deref(),
        Some("summary 3")
    );
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

/// The env var that makes the test below act as the process that gets killed.
const CRASH_ENV: &str = "BROOD_INVARIANTS_CRASH_DIR";

/// I1/I2 across `kill -9`: this test re-runs itself in a child process that delegates, claims,
/// acks some, writes down what the API told it, and kills itself with SIGKILL (no destructor, no
/// flush on drop). The parent then opens the same folder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_a_boundary_returned_survive_kill9() {
    if let Ok(dir) = std::env::var(CRASH_ENV) {
        return crashing_child(std::path::Path::new(&dir)).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "items_a_boundary_returned_survive_kill9",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CRASH_ENV, dir.path())
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    {
        use std::os::unix::process::ExitStatusExt;
        // SIGKILL, or SIGABRT if `kill` was not available; anything else means the child failed.
        assert!(
            matches!(status.signal(), Some(9) | Some(6)),
            "the child process was meant to be killed, but it ended with {status:?}"
        );
    }
    let report = std::fs::read_to_string(dir.path().join("report.txt")).expect("the child wrote its report");
    assert!(
        report.ends_with("DONE\n"),
        "the child did not finish its work: {report}"
    );
    let mut acked = BTreeSet::new();
    let mut claimed = HashMap::new();
    for line in report.lines() {
        let mut parts = line.splitn(4, ' ');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some("ACKED"), Some(k), None, None) => {
                acked.insert(k.to_string());
            }
            (Some("CLAIMED"), Some(k), Some(status), summary) => {
                claimed.insert(k.to_string(), (status.to_string(), summary.unwrap_or("").to_string()));
            }
            _ => {}
        }
    }
    assert_eq!((acked.len(), claimed.len()), (2, 3));

    let b = brood::Brood::open(brood::BroodConfig::new(dir.path().join("ledger"))).unwrap();
    open_wake(&b, "k9").await;
    let env = b
        .boundary("k9", "c", LONG_LEASE)
        .await
        .unwrap()
        .expect("what a boundary returned before kill -9 is still there");
    assert_eq!(
        keys(&env),
        claimed.keys().cloned().collect::<BTreeSet<_>>(),
        "exactly the claimed-but-unacked items; never the acked ones"
    );
    for item in &env.items {
        let (status, summary) = &claimed[&item.dedup_key];
        assert_eq!(
            &item.status.to_string(),
            status,
            "{} changed across the crash",
            item.dedup_key
        );
        assert_eq!(item.summary.as_deref().unwrap_or(""), summary);
        assert_eq!(
            item.delivery_attempt, 1,
            "a claim returned by recovery is not a delivery attempt"
        );
    }
    assert_eq!(b.ack(&env.claim_id).await.unwrap(), 3);
    assert!(b.boundary("k9", "c", LONG_LEASE).await.unwrap().is_none());
    b.shutdown();
}

async fn crashing_child(dir: &std::path::Path) {
    use std::fmt::Write;
    let b = brood::Brood::open(brood::BroodConfig::new(dir.join("ledger"))).unwrap();
    open_wake(&b, "k9").await;
    let mut report = String::new();
    let first = b
        .delegate(
            "k9",
            DelegateRequest::background(vec![task("a0", sim(0)), task("a1", sim(0))]),
        )
        .await
        .unwrap();
    let env = next_envelope(&b, "k9", "c", LONG_LEASE).await;
    assert_eq!(env.items.len(), 2);
    b.ack(&env.claim_id).await.unwrap();
    for k in keys(&env) {
        assert!(k.starts_with(first.call_id()));
        writeln!(report, "ACKED {k}").unwrap();
    }
    b.delegate(
        "k9",
        DelegateRequest::background(vec![task("c0", sim(0)), task("c1", sim(0)), task("c2", sim(0))]),
    )
    .await
    .unwrap();
    let env = next_envelope(&b, "k9", "c", LONG_LEASE).await;
    let mut got = env.items;
    while got.len() < 3 {
        got.extend(next_envelope(&b, "k9", "c", LONG_LEASE).await.items);
    }
    for item in got {
        let summary = item.summary.unwrap_or_default();
        writeln!(report, "CLAIMED {} {} {summary}", item.dedup_key, item.status).unwrap();
    }
    report.push_str("DONE\n");
    std::fs::write(dir.join("report.txt"), report).unwrap();
    let _ = std::process::Command::new("kill")
        .args(["-9", &std::process::id().to_string()])
        .status();
    std::process::abort();
}

// ---------------------------------------------------------------------------------------------
// 12. I7: wake discipline

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_discipline() {
    let t = TestBrood::new();
    let b = t.b();
    let log = WakeLog::default();
    let info = b
        .open_session("w", SessionOptions::default().wake(log.target()))
        .await
        .unwrap();
    assert!(info.wake_capable);
    let tasks = (1..=6).map(|i| task(format!("w{i}"), gate(&format!("w{i}")))).collect();
    let reply = b
        .delegate("w", DelegateRequest::background(tasks).independent())
        .await
        .unwrap();
    assert!(matches!(reply, DelegateReply::Background { .. }));
    let call = reply.call_id().to_string();
    let done = |i: u32| {
        let call = call.clone();
        move |st: &brood::SessionStatus| child_status(st, &call, i) == Some(ChildStatus::Succeeded)
    };
    settle(b, "w").await;
    assert_eq!(log.count(), 0, "nothing ready, no wake");

    // Idle; three children complete at different moments before any boundary: one wake.
    for i in 1..=3u32 {
        t.kit.gates.open(&format!("w{i}"));
        status_until(b, "w", "a gated child to be recorded", done(i - 1)).await;
        if i == 1 {
            wait_for!("the first wake", (log.count() >= 1).then_some(()));
        }
    }
    settle(b, "w").await;
    assert_eq!(
        log.count(),
        1,
        "one wake however many items land meanwhile: {:?}",
        log.events()
    );
    let ev = &log.events()[0];
    assert_eq!(ev.session_id, "w");
    assert!(ev.ready >= 1);

    let env = b.boundary("w", "c", LONG_LEASE).await.unwrap().expect("three ready");
    assert_eq!(env.items.len(), 3);
    b.ack(&env.claim_id).await.unwrap();
    settle(b, "w").await;
    assert_eq!(log.count(), 1, "a boundary with nothing left does not wake");

    // After a boundary, more completions: exactly one more wake.
    for i in 4..=5u32 {
        t.kit.gates.open(&format!("w{i}"));
        status_until(b, "w", "a gated child to be recorded", done(i - 1)).await;
        if i == 4 {
            wait_for!("the second wake", (log.count() >= 2).then_some(()));
        }
    }
    settle(b, "w").await;
    assert_eq!(log.count(), 2, "{:?}", log.events());
    let env = b.boundary("w", "c", LONG_LEASE).await.unwrap().expect("two ready");
    assert_eq!(env.items.len(), 2);
    b.ack(&env.claim_id).await.unwrap();

    // Busy: no wake, however much lands.
    b.set_turn("w", Turn::Busy).await.unwrap();
    t.kit.gates.open("w6");
    let st = status_until(b, "w", "the last gated child to be recorded", done(5)).await;
    assert_eq!(st.ready, 1);
    assert_eq!(st.info.turn, Turn::Busy);
    settle(b, "w").await;
    assert_eq!(log.count(), 2, "a busy session is never woken");

    // Busy -> idle with ready items: a wake.
    b.set_turn("w", Turn::Idle).await.unwrap();
    wait_for!("the busy->idle wake", (log.count() >= 3).then_some(()));
    // Idle -> idle opens no new idle period.
    b.set_turn("w", Turn::Idle).await.unwrap();
    settle(b, "w").await;
    assert_eq!(log.count(), 3, "{:?}", log.events());
    // Another busy -> idle change with the item still ready: a new idle period, a new wake.
    b.set_turn("w", Turn::Busy).await.unwrap();
    b.set_turn("w", Turn::Idle).await.unwrap();
    wait_for!("the second busy->idle wake", (log.count() >= 4).then_some(()));
    let env = b.boundary("w", "c", LONG_LEASE).await.unwrap().expect("one ready");
    b.ack(&env.claim_id).await.unwrap();
    settle(b, "w").await;
    assert_eq!(log.count(), 4, "{:?}", log.events());
    assert!(log.events().iter().all(|e| e.session_id == "w"));

    // No wake capability: the background call runs synchronously and says why.
    let info = b.open_session("nw", SessionOptions::default()).await.unwrap();
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
    assert_eq!(b.status("nw").await.unwrap().delivered, 2);
    settle(b, "nw").await;
    assert_eq!(log.count(), 4);
}

// ---------------------------------------------------------------------------------------------
// 13. Early failure notices

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_failure_notice_before_unit_completes() {
    let t = TestBrood::new();
    let b = t.b();
    open_wake(b, "f").await;
    let grouped = |goal: &str, runner| {
        let mut t = task(goal, runner);
        t.group = Some("wave".into());
        t
    };
    let reply = b
        .delegate(
            "f",
            DelegateRequest::background(vec![
                grouped("dies fast", sim_outcome(0, "fail")),
                grouped("slow a", gate("fa")),
                grouped("slow b", gate("fb")),
            ]),
        )
        .await
        .unwrap();
    let call = reply.call_id().to_string();
    let failed_child = child_id(&call, 0);

    let env = next_envelope(b, "f", "c", LONG_LEASE).await;
    assert_eq!(env.items.len(), 1, "only the notice is ready: {:?}", keys(&env));
    let notice = &env.items[0];
    assert_eq!(notice.kind, ItemKind::FailureNotice);
    assert_eq!(notice.dedup_key, format!("{failed_child}:failure_notice"));
    assert_eq!(notice.dedup_key, dedup_key(&failed_child, ItemKind::FailureNotice));
    assert_eq!(notice.status, ChildStatus::Failed);
    assert!(notice.error.is_some());
    assert_eq!(notice.group.as_deref(), Some("wave"));
    assert_eq!(notice.unit_size, 3);
    let st = b.status("f").await.unwrap();
    assert_eq!(child_status(&st, &call, 1), Some(ChildStatus::Running));
    assert_eq!(child_status(&st, &call, 2), Some(ChildStatus::Running));
    assert_eq!(b.ack(&env.claim_id).await.unwrap(), 1);
    assert!(
        b.boundary("f", "c", LONG_LEASE).await.unwrap().is_none(),
        "the unit is not complete"
    );

    t.kit.gates.open("fa");
    t.kit.gates.open("fb");
    let env = next_envelope(b, "f", "c", LONG_LEASE).await;
    let want: BTreeSet<String> = (0..3).map(|i| result_key(&call, i)).collect();
    assert_eq!(keys(&env), want, "then the unit's full results, once");
    for item in &env.items {
        assert_eq!(item.kind, ItemKind::Result);
        let want = if item.task_index == 0 {
            ChildStatus::Failed
        } else {
            ChildStatus::Succeeded
        };
        assert_eq!(item.status, want);
    }
    assert_eq!(b.ack(&env.claim_id).await.unwrap(), 3);
    assert!(b.boundary("f", "c", LONG_LEASE).await.unwrap().is_none());
}

// ---------------------------------------------------------------------------------------------
// 14. I5: stall and timeout

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_child_is_interrupted_and_slow_child_times_out() {
    let t = TestBrood::new();
    let b = t.b();
    open_wake(b, "st").await;
    let mut hang = task("hangs", sim_outcome(0, "hang"));
    hang.stall_ms = Some(200);
    let mut slow = task("too slow", sim(5000));
    slow.timeout_ms = Some(200);
    let reply = b
        .delegate("st", DelegateRequest::background(vec![hang, slow]).independent())
        .await
        .unwrap();
    let items = collect_results(b, "st", 2).await;
    let by_index: HashMap<u32, _> = items
        .iter()
        .filter(|i| i.kind == ItemKind::Result)
        .map(|i| (i.task_index, i))
        .collect();
    assert_eq!(by_index[&0].status, ChildStatus::Interrupted, "{:?}", by_index[&0]);
    assert_eq!(by_index[&1].status, ChildStatus::TimedOut, "{:?}", by_index[&1]);
    assert!(by_index[&0].error.is_some() && by_index[&1].error.is_some());
    let st = b.status("st").await.unwrap();
    assert_eq!(st.running, 0, "no child stays running after its stall timeout");
    assert!(child_status(&st, reply.call_id(), 0).map_or(true, |s| s == ChildStatus::Interrupted));
}

// ---------------------------------------------------------------------------------------------
// 15. Bad input changes nothing

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_changes_nothing() {
    let t = TestBrood::new();
    let b = t.b();
    open_wake(b, "bad").await;
    let first = b
        .delegate("bad", DelegateRequest::background(vec![task("ok", sim(0))]))
        .await
        .unwrap();
    assert_eq!(first.set(), 1);
    status_until(b, "bad", "the first result to be ready", |st| st.ready == 1).await;

    fn invalid<T: std::fmt::Debug, E: Into<BroodError>>(r: Result<T, E>, field: &str) {
        match r.map_err(Into::into) {
            Err(BroodError::Invalid { field: f, message }) => {
                assert!(f.starts_with(field), "expected field {field}, got {f}: {message}");
                assert!(!message.is_empty());
            }
            other => panic!("expected invalid `{field}`, got {other:?}"),
        }
    }
    invalid(b.delegate("bad", DelegateRequest::background(vec![])).await, "tasks");
    invalid(
        b.delegate(
            "bad",
            DelegateRequest::background(vec![task("ok", sim(0)), task("x", serde_json::json!({"kind": "nope"}))]),
        )
        .await,
        "tasks[1].runner",
    );
    invalid(
        b.delegate(
            "bad",
            DelegateRequest::background(vec![task("x", serde_json::json!({"kind": "sim", "msec": 1}))]),
        )
        .await,
        "tasks[0].runner",
    );
    invalid(
        b.delegate("bad", DelegateRequest::background(vec![task("  ", sim(0))]))
            .await,
        "tasks[0].goal",
    );
    let mut zero = task("x", sim(0));
    zero.timeout_ms = Some(0);
    invalid(
        b.delegate("bad", DelegateRequest::background(vec![zero])).await,
        "tasks[0].timeout_ms",
    );
    let mut zero = task("x", sim(0));
    zero.stall_ms = Some(0);
    invalid(
        b.delegate("bad", DelegateRequest::sync(vec![zero])).await,
        "tasks[0].stall_ms",
    );

    // Bad leases and consumers claim nothing.
    invalid(b.boundary("bad", "c", Duration::from_millis(50)).await, "lease_ms");
    invalid(b.boundary("bad", "c", Duration::from_secs(3601)).await, "lease_ms");
    invalid(b.boundary("bad", " ", LONG_LEASE).await, "consumer");
    assert!(matches!(
        b.delegate("nobody", DelegateRequest::background(vec![task("x", sim(0))]))
            .await
            .map_err(|e| e.error),
        Err(BroodError::UnknownSession(_))
    ));

    // Bad session settings are refused too, and change nothing.
    invalid(
        b.open_session("bad", SessionOptions::default().max_concurrent_children(0))
            .await,
        "max_concurrent_children",
    );
    invalid(
        b.open_session("bad", SessionOptions::default().max_delivery_attempts(0))
            .await,
        "max_delivery_attempts",
    );
    invalid(b.open_session("", SessionOptions::default()).await, "session_id");

    let st = b.status("bad").await.unwrap();
    assert_eq!(st.info.max_concurrent_children, 8);
    assert_eq!(st.info.max_delivery_attempts, 8);
    assert!(st.info.wake_capable);
    assert_eq!(st.calls.len(), 1, "no refused call was stored");
    assert_eq!((st.ready, st.claimed, st.queued), (1, 0, 0));
    let env = b.boundary("bad", "c", LONG_LEASE).await.unwrap().expect("still ready");
    assert_eq!(keys(&env), BTreeSet::from([result_key(first.call_id(), 0)]));
    assert_eq!(
        env.items[0].delivery_attempt, 1,
        "the refused boundaries were no attempts"
    );
    b.ack(&env.claim_id).await.unwrap();
    let next = b
        .delegate("bad", DelegateRequest::background(vec![task("ok", sim(0))]))
        .await
        .unwrap();
    assert_eq!(next.set(), 2, "refused calls took no set number");
}
