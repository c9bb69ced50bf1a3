//! I5 liveness — "an unacknowledged claim's items are ready again after lease expiry; no child
//! stays `running` after its stall timeout; a release with a failure backs off, and past
//! `max_delivery_attempts` (default 8) the item moves to a durable dead-letter list, never
//! silently away. Claims returned by recovery are not delivery attempts."
//!
//! One test per clause, plus the two sides of delivery attempts (vocabulary): a lease expiry
//! or a failed release counts one, a busy release does not. The only clock checks are lower
//! bounds (a backoff held an item at least that long), which a slow machine cannot break.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use brood::{
    Brood, BroodConfig, ChildStatus, DelegateRequest, Envelope, ItemKind, ReleaseReason, RunContext, RunOutput, Runner,
    Runners, SessionSettings, TaskSpec,
};
use common::*;
use futures::future::LocalBoxFuture;
use serde_json::json;

/// Three ready items claimed under [`SHORT_LEASE`], not acked, and claimed again after the
/// lease ran out. Returns both envelopes and the items' keys.
async fn claimed_twice(b: &Brood) -> (Envelope, Envelope, BTreeSet<String>) {
    open_wake(b, "l").await;
    let reply = b
        .delegate(
            "l",
            DelegateRequest::background(vec![task("a", sim(0)), task("b", sim(0)), task("c", sim(0))]).independent(),
        )
        .await
        .unwrap();
    let call = reply.call_id().to_string();
    status_until(b, "l", "three ready items", |st| st.counts.ready == 3).await;
    let first = b
        .boundary("l", "c1", SHORT_LEASE)
        .await
        .unwrap()
        .expect("three items are ready");
    let expected: BTreeSet<String> = (0..3).map(|i| result_key(&call, i)).collect();
    assert_eq!(keys(&first), expected);
    assert!(first.items.iter().all(|i| i.delivery_attempt == 1));
    // Not acked: after the lease the same items come back.
    let second = next_envelope(b, "l", "c2", LONG_LEASE).await;
    (first, second, expected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacked_claims_items_are_ready_again_after_lease_expiry() {
    let t = TestBrood::new();
    let b = t.b();
    let (first, second, expected) = claimed_twice(b).await;
    assert_ne!(second.claim_id, first.claim_id);
    assert_eq!(keys(&second), expected, "the same dedup keys come back");
    assert_eq!(b.ack(&second.claim_id).await.unwrap(), 3);
    assert!(b.boundary("l", "c3", LONG_LEASE).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_back_from_lease_expiry_come_as_the_next_delivery_attempt() {
    let t = TestBrood::new();
    let b = t.b();
    let (_, second, _) = claimed_twice(b).await;
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_released_item_joins_newer_completions_in_one_envelope() {
    let t = TestBrood::new();
    let Reclaimed { second, a, b: bk, .. } = released_busy_then_reclaimed(&t).await;
    assert_eq!(keys(&second), BTreeSet::from([a, bk]), "one envelope holds both");
    assert_eq!(t.b().ack(&second.claim_id).await.unwrap(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_release_is_not_a_delivery_attempt() {
    let t = TestBrood::new();
    let Reclaimed { second, .. } = released_busy_then_reclaimed(&t).await;
    for item in &second.items {
        assert_eq!(
            item.delivery_attempt, 1,
            "a busy release is not a delivery attempt ({})",
            item.dedup_key
        );
    }
}

/// Claims the single item `key` of session `session` `attempts` times, releasing it as failed
/// each time, and checks it was offered as attempt 1, 2, … and never before its backoff ended.
async fn release_failed(b: &Brood, session: &str, key: &str, attempts: u32) {
    let mut released: Option<(Instant, u64)> = None;
    for attempt in 1..=attempts {
        let env = next_envelope(b, session, "c", LONG_LEASE).await;
        if let Some((at, backoff_ms)) = released {
            // A lower bound only: the backoff held the item at least this long.
            let waited = at.elapsed();
            assert!(
                waited >= Duration::from_millis(backoff_ms - 2),
                "attempt {attempt} was offered {waited:?} after a failed release; the backoff is {backoff_ms} ms"
            );
        }
        assert_eq!(keys(&env), BTreeSet::from([key.to_string()]));
        assert_eq!(env.items[0].delivery_attempt, attempt);
        let at = Instant::now();
        b.release(&env.claim_id, ReleaseReason::Failed, Duration::ZERO)
            .await
            .unwrap();
        released = Some((at, 100u64 << (attempt - 1)));
    }
}

/// A session `dl` allowing `max_attempts` delivery attempts, with one ready item; returns the
/// call id and the item's key.
async fn one_item(b: &Brood, max_attempts: Option<u32>) -> (String, String) {
    let mut settings = SessionSettings::default().wake(|_| {});
    if let Some(n) = max_attempts {
        settings = settings.max_delivery_attempts(n);
    }
    b.open_session("dl", settings).await.unwrap();
    let reply = b
        .delegate("dl", DelegateRequest::background(vec![task("poison", sim(0))]))
        .await
        .unwrap();
    let call = reply.call_id().to_string();
    let key = result_key(&call, 0);
    (call, key)
}

/// The dead letters of `key`.
async fn dead_letters_of(b: &Brood, key: &str) -> Vec<brood::DeadLetterInfo> {
    let all = b.dead_letters().await.unwrap();
    all.into_iter().filter(|d| d.dedup_key == key).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_releases_back_off_before_each_next_attempt() {
    let t = TestBrood::new();
    let b = t.b();
    // The default of 8 attempts: the item stays deliverable throughout.
    let (_, key) = one_item(b, None).await;
    release_failed(b, "dl", &key, 3).await;
    let env = next_envelope(b, "dl", "c", LONG_LEASE).await;
    assert_eq!(env.items[0].delivery_attempt, 4);
    assert_eq!(b.ack(&env.claim_id).await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_past_max_delivery_attempts_is_dead_lettered_and_never_offered_again() {
    let t = TestBrood::new();
    let b = t.b();
    let (call, key) = one_item(b, Some(3)).await;
    release_failed(b, "dl", &key, 3).await;
    let dead = wait_for!("the dead letter", {
        let mine = dead_letters_of(b, &key).await;
        (!mine.is_empty()).then_some(mine)
    });
    assert_eq!(dead.len(), 1, "one dead letter per item");
    assert_eq!(dead[0].attempts, 3);
    assert_eq!(dead[0].session_id, "dl");
    assert_eq!(dead[0].call_id, call);
    assert_eq!(dead[0].kind, ItemKind::Result);
    let st = b.status("dl").await.unwrap();
    assert_eq!((st.counts.ready, st.counts.claimed), (0, 0));
    // Longer than the next backoff would have been: it is not merely backing off.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        b.boundary("dl", "c", LONG_LEASE).await.unwrap().is_none(),
        "a dead item is never offered again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_survives_reopen_and_is_not_offered() {
    let mut t = TestBrood::new();
    let b = t.b();
    let (_, key) = one_item(b, Some(3)).await;
    release_failed(b, "dl", &key, 3).await;
    wait_for!("the dead letter", {
        let mine = dead_letters_of(b, &key).await;
        (!mine.is_empty()).then_some(())
    });
    t.reopen();
    let b = t.b();
    open_wake(b, "dl").await;
    assert!(b.boundary("dl", "c", LONG_LEASE).await.unwrap().is_none());
    let dead = dead_letters_of(b, &key).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].attempts, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_returned_by_recovery_is_not_a_delivery_attempt() {
    let mut t = TestBrood::new();
    let mixed = acked_claimed_and_ready(t.b(), "r").await;
    let env = reopened_envelope(&mut t, "r", "unacked items are ready").await;
    assert!(keys(&env).contains(&mixed.claimed));
    for item in &env.items {
        assert_eq!(
            item.delivery_attempt, 1,
            "a claim returned by recovery is not a delivery attempt ({})",
            item.dedup_key
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_child_is_interrupted_and_does_not_stay_running() {
    let t = TestBrood::new();
    let b = t.b();
    open_wake(b, "st").await;
    let mut hang = task("hangs", sim_outcome(0, "hang"));
    hang.stall_ms = Some(200);
    let reply = b.delegate("st", DelegateRequest::background(vec![hang])).await.unwrap();
    let items = collect_results(b, "st", 1).await;
    let item = items.iter().find(|i| i.kind == ItemKind::Result).unwrap();
    assert_eq!(item.status, ChildStatus::Interrupted, "{item:?}");
    assert!(item.error.is_some());
    let st = b.status("st").await.unwrap();
    assert_eq!(st.counts.running, 0, "no child stays running after its stall timeout");
    assert!(child_status(&st, reply.call_id(), 0).is_none_or(|s| s == ChildStatus::Interrupted));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_past_its_timeout_is_timed_out() {
    let t = TestBrood::new();
    let b = t.b();
    open_wake(b, "st").await;
    let mut slow = task("too slow", sim(5000));
    slow.timeout_ms = Some(200);
    b.delegate("st", DelegateRequest::background(vec![slow])).await.unwrap();
    let items = collect_results(b, "st", 1).await;
    let by_index: HashMap<u32, _> = items
        .iter()
        .filter(|i| i.kind == ItemKind::Result)
        .map(|i| (i.task_index, i))
        .collect();
    assert_eq!(by_index[&0].status, ChildStatus::TimedOut, "{:?}", by_index[&0]);
    assert!(by_index[&0].error.is_some());
    assert_eq!(b.status("st").await.unwrap().counts.running, 0);
}

/// Reports progress with a partial result, beats for a while, then goes silent for good.
struct GoesSilent;

impl Runner for GoesSilent {
    fn run(self: Box<Self>, ctx: RunContext) -> LocalBoxFuture<'static, RunOutput> {
        Box::pin(async move {
            for i in 1..=3 {
                tokio::time::sleep(Duration::from_millis(60)).await;
                ctx.progress.partial(format!("read {i} of 10 files"));
            }
            futures::future::pending::<RunOutput>().await
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_hold_off_the_stall_clock_and_a_partial_result_is_kept() {
    let dir = tempfile::TempDir::new().unwrap();
    let mut runners = Runners::builtin();
    runners.register("silent", |_| Ok(Box::new(GoesSilent) as Box<dyn Runner>));
    let brood = Brood::open(BroodConfig::new(dir.path()).runners(runners)).unwrap();
    brood
        .open_session("s", SessionSettings::default().wake(|_| {}))
        .await
        .unwrap();
    let mut task = TaskSpec::new("read ten files", json!({"kind": "silent"}));
    // Each heartbeat comes 60 ms after the last, well inside 150 ms; the runner lives ~180 ms
    // of heartbeats, longer than one stall timeout, before it goes silent.
    task.stall_ms = Some(150);
    brood
        .delegate("s", DelegateRequest::background(vec![task]))
        .await
        .unwrap();
    let env = next_envelope(&brood, "s", "c", LONG_LEASE).await;
    let item = &env.items[0];
    assert_eq!(item.status, ChildStatus::Interrupted);
    assert_eq!(item.summary.as_deref(), Some("read 3 of 10 files"));
    brood.shutdown();
}
