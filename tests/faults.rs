//! Fault paths, provoked through the `failpoints` feature: failing ledger writes and flushes,
//! failing coalescer hand-offs, panics in the session owner, a unit and the coalescer, an actor
//! that keeps panicking, and a hanging runner. (Recovery after a clean shutdown is in
//! i6_recovery.rs, the stall clock of a runner that goes silent in i5_liveness.rs.)
//!
//! Fault points are process-wide, so the tests of this file run one at a time (`SERIAL`).
#![cfg(feature = "failpoints")]
// The lock serialises whole tests, each on a runtime of its own; holding it across awaits is the point.
#![allow(clippy::await_holding_lock)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

mod common;

use brood::failpoints;
use brood::{Brood, BroodConfig, BroodError, ChildStatus, DelegateReply, DelegateRequest, SessionSettings, TaskSpec};
use common::serial;
use serde_json::json;
use tempfile::TempDir;

const LEASE: Duration = Duration::from_secs(30);
const PATIENCE: Duration = Duration::from_secs(20);

fn sim(ms: u64) -> TaskSpec {
    TaskSpec::new(format!("work for {ms} ms"), json!({"kind": "sim", "ms": ms}))
}

async fn open(dir: &TempDir, session: &str) -> Brood {
    let brood = Brood::open(BroodConfig::new(dir.path())).expect("open");
    brood
        .open_session(session, SessionSettings::default().wake(|_| {}))
        .await
        .expect("session");
    brood
}

/// Claims and acks until `want` distinct results were delivered; returns how often each dedup
/// key was acked. Retries requests interrupted by an owner restart.
async fn drain(brood: &Brood, session: &str, want: usize) -> BTreeMap<String, u32> {
    let mut acked: BTreeMap<String, u32> = BTreeMap::new();
    let deadline = Instant::now() + PATIENCE;
    while acked.keys().filter(|k| k.ends_with(":result")).count() < want {
        assert!(
            Instant::now() < deadline,
            "only {} of {want} results arrived: {acked:?}",
            acked.len()
        );
        match brood.boundary(session, "drain", LEASE).await {
            Ok(Some(env)) => match brood.ack(&env.claim_id).await {
                Ok(_) => {
                    for item in env.items {
                        *acked.entry(item.dedup_key).or_default() += 1;
                    }
                }
                Err(BroodError::Interrupted { .. }) | Err(BroodError::ClaimLost(_)) => {}
                Err(e) => panic!("ack failed: {e}"),
            },
            Ok(None) | Err(BroodError::Interrupted { .. }) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("boundary failed: {e}"),
        }
    }
    acked
}

fn assert_once(acked: &BTreeMap<String, u32>) {
    let twice: Vec<_> = acked.iter().filter(|(_, &n)| n > 1).collect();
    assert!(twice.is_empty(), "acked more than once: {twice:?}");
}

/// With a fault armed for good, finished children are never published; once disarmed, every
/// result arrives exactly once.
async fn nothing_published_while(point: &'static str) {
    let dir = TempDir::new().unwrap();
    let brood = open(&dir, "s").await;
    brood
        .delegate(
            "s",
            DelegateRequest::background(vec![sim(300), sim(350), sim(400)]).independent(),
        )
        .await
        .unwrap();
    // Once they run (their running marks are durable), the fault is armed for good.
    common::status_until(&brood, "s", "three started children", |st| {
        st.calls
            .iter()
            .flat_map(|c| &c.children)
            .filter(|c| c.status == ChildStatus::Running)
            .count()
            == 3
    })
    .await;
    failpoints::arm(point, u64::MAX);
    // The children finish within ~400 ms; give them far longer, then check nothing was published.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(
        brood.boundary("s", "c", LEASE).await.unwrap().is_none(),
        "{point}: a result was published before it was recorded"
    );
    let st = brood.status("s").await.unwrap();
    assert_eq!(
        st.counts.running, 3,
        "{point}: the children must keep their results until recorded"
    );
    failpoints::disarm_all();
    let acked = drain(&brood, "s", 3).await;
    assert_once(&acked);
    assert_eq!(acked.len(), 3);
    brood.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_ledger_write_never_reports_a_result_as_recorded() {
    let _g = serial();
    nothing_published_while("ledger_write").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_flush_never_reports_a_result_as_recorded() {
    let _g = serial();
    nothing_published_while("ledger_flush").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_coalescer_hand_off_is_retried_not_dropped() {
    let _g = serial();
    nothing_published_while("coalescer_handoff").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_flush_refuses_the_ack_and_keeps_the_claim() {
    let _g = serial();
    let dir = TempDir::new().unwrap();
    let brood = open(&dir, "s").await;
    brood
        .delegate("s", DelegateRequest::background(vec![sim(0)]))
        .await
        .unwrap();
    let env = common::next_envelope(&brood, "s", "c", LEASE).await;
    failpoints::arm("ledger_flush", 1);
    let err = brood.ack(&env.claim_id).await.unwrap_err();
    assert!(matches!(err, BroodError::Ledger(_)), "{err}");
    // Not delivered: the claim is still live and a second ack succeeds.
    assert_eq!(brood.ack(&env.claim_id).await.unwrap(), 1);
    brood.shutdown();
    let brood = open(&dir, "s").await;
    assert!(
        brood.boundary("s", "c", LEASE).await.unwrap().is_none(),
        "acked item delivered again after reopen"
    );
    brood.shutdown();
}

/// Runs 20 children while `point` fires once mid-workload; everything arrives exactly once.
async fn survives_one_panic_in(point: &'static str, arm_before_delegate: bool) {
    let dir = TempDir::new().unwrap();
    let brood = Brood::open(BroodConfig::new(dir.path())).unwrap();
    brood
        .open_session("s", SessionSettings::default().wake(|_| {}).max_concurrent_children(4))
        .await
        .unwrap();
    if arm_before_delegate {
        failpoints::arm(point, 1);
    }
    let tasks: Vec<TaskSpec> = (0..20).map(|i| sim(10 + (i * 7) % 60)).collect();
    let reply = brood
        .delegate("s", DelegateRequest::background(tasks).independent())
        .await
        .unwrap();
    if !arm_before_delegate {
        tokio::time::sleep(Duration::from_millis(30)).await;
        failpoints::arm(point, 1);
    }
    let acked = drain(&brood, "s", 20).await;
    assert_once(&acked);
    let results: BTreeSet<_> = acked.keys().filter(|k| k.ends_with(":result")).cloned().collect();
    let expected: BTreeSet<_> = (0..20).map(|i| format!("{}.{i}:result", reply.call_id())).collect();
    assert_eq!(results, expected, "{point}: lost or foreign results");
    // The fault really fired (otherwise this test proves nothing).
    assert!(!failpoints::fires(point), "{point} was never hit");
    // The system goes on.
    brood
        .delegate("s", DelegateRequest::background(vec![sim(0)]))
        .await
        .unwrap();
    brood.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_session_owner_is_restarted_from_the_ledger() {
    let _g = serial();
    survives_one_panic_in("owner_handler", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_unit_is_restarted_and_its_child_requeued() {
    let _g = serial();
    survives_one_panic_in("unit_handler", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_coalescer_is_restarted_and_children_retry() {
    let _g = serial();
    survives_one_panic_in("coalescer_handler", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_that_keeps_panicking_escalates_instead_of_looping() {
    let _g = serial();
    let dir = TempDir::new().unwrap();
    let brood = open(&dir, "s").await;
    failpoints::arm("owner_handler", u64::MAX);
    let mut interrupted = 0;
    let mut failed = None;
    for _ in 0..20 {
        match brood.boundary("s", "c", LEASE).await {
            Err(BroodError::Interrupted { .. }) => interrupted += 1,
            Err(e @ BroodError::SessionFailed { .. }) => {
                failed = Some(e);
                break;
            }
            // The registry may still name the dead owner for a moment.
            Err(BroodError::UnknownSession(_)) => {}
            other => panic!("unexpected: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    failpoints::disarm_all();
    let failed = failed.expect("the session should have been given up");
    assert!(failed.to_string().contains("owner_handler"), "{failed}");
    // Default policy: 3 restarts within 10 s, so the 4th panic escalates.
    assert!(interrupted >= 4, "escalated after only {interrupted} failures");
    // It stays given up; other sessions are unaffected.
    assert!(matches!(brood.status("s").await, Err(BroodError::SessionFailed { .. })));
    brood.open_session("t", SessionSettings::default()).await.unwrap();
    assert!(matches!(
        brood.delegate("t", DelegateRequest::sync(vec![sim(0)])).await.unwrap(),
        DelegateReply::Sync { .. }
    ));
    brood.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_whose_rebuild_fails_once_is_rebuilt_again_and_serves_its_session() {
    let _g = serial();
    let dir = TempDir::new().unwrap();
    let brood = open(&dir, "s").await;
    // The owner panics at the delegate, before it writes anything; the next flush is the
    // rebuild's, and it fails.
    failpoints::arm("ledger_flush", 1);
    failpoints::arm("owner_handler", 1);
    let err = brood
        .delegate("s", DelegateRequest::background(vec![sim(0)]))
        .await
        .unwrap_err();
    assert!(
        matches!(err.error, BroodError::Interrupted { call_id: None, .. }),
        "{err}"
    );
    let deadline = Instant::now() + PATIENCE;
    loop {
        match brood.status("s").await {
            Ok(_) => break,
            Err(BroodError::Interrupted { .. }) | Err(BroodError::UnknownSession(_)) => {}
            Err(e) => panic!("one failed flush gave the session up: {e}"),
        }
        assert!(Instant::now() < deadline, "the session was never served again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!failpoints::armed("ledger_flush"), "the rebuild never flushed");
    let call = brood
        .delegate("s", DelegateRequest::background(vec![sim(0)]))
        .await
        .unwrap();
    let acked = drain(&brood, "s", 1).await;
    assert_eq!(
        acked.keys().collect::<Vec<_>>(),
        vec![&format!("{}.0:result", call.call_id())]
    );
    brood.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_runner_is_interrupted_by_its_stall_clock() {
    let _g = serial();
    let dir = TempDir::new().unwrap();
    let brood = open(&dir, "s").await;
    failpoints::arm("runner_hang", 1);
    let mut task = sim(10);
    task.stall_ms = Some(200);
    brood
        .delegate("s", DelegateRequest::background(vec![task]))
        .await
        .unwrap();
    let env = common::next_envelope(&brood, "s", "c", LEASE).await;
    assert_eq!(env.items[0].status, ChildStatus::Interrupted);
    assert!(env.items[0]
        .error
        .as_deref()
        .unwrap_or("")
        .contains("stall timeout 200 ms"));
    brood.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_that_keeps_panicking_escalates_to_its_owner_and_then_gives_the_session_up() {
    let _g = serial();
    let dir = TempDir::new().unwrap();
    let brood = open(&dir, "s").await;
    failpoints::arm("unit_handler", u64::MAX);
    brood
        .delegate("s", DelegateRequest::background(vec![sim(0)]))
        .await
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    loop {
        match brood.status("s").await {
            Err(BroodError::SessionFailed { reason, .. }) => {
                assert!(reason.contains("keeps panicking"), "{reason}");
                break;
            }
            Ok(_) | Err(BroodError::Interrupted { .. }) => {}
            Err(e) => panic!("unexpected: {e}"),
        }
        assert!(Instant::now() < deadline, "the failure never escalated: it loops");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    failpoints::disarm_all();
    brood.shutdown();
    // The session is served again after a restart, and the child's task runs to its end.
    let brood = open(&dir, "s").await;
    let acked = drain(&brood, "s", 1).await;
    assert_eq!(acked.len(), 1);
    brood.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coalescer_that_keeps_panicking_stops_the_engine_and_nothing_is_lost() {
    let _g = serial();
    let dir = TempDir::new().unwrap();
    let brood = open(&dir, "s").await;
    assert_eq!(brood.health().await.unwrap().sessions, 1);
    failpoints::arm("coalescer_handler", u64::MAX);
    let mut task = sim(0);
    task.rerun_on_recovery = true;
    brood
        .delegate("s", DelegateRequest::background(vec![task]))
        .await
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    loop {
        match brood.status("s").await {
            Err(BroodError::Stopped) | Err(BroodError::Interrupted { .. }) => break,
            Ok(st) => assert_eq!(st.counts.ready, 0, "nothing can be published without the coalescer"),
            Err(e) => panic!("unexpected: {e}"),
        }
        assert!(
            Instant::now() < deadline,
            "the engine never stopped: the coalescer loops"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    failpoints::disarm_all();
    match brood.health().await {
        Err(BroodError::Stopped) => {}
        other => panic!("a stopped engine is unhealthy, got {other:?}"),
    }
    brood.shutdown();
    // Reopened, recovery re-runs the child (its result was never recorded) and delivers it.
    let brood = open(&dir, "s").await;
    let acked = drain(&brood, "s", 1).await;
    assert_eq!(acked.len(), 1);
    brood.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_dispatch_cannot_be_flushed_is_refused_and_never_runs() {
    let _g = serial();
    let dir = TempDir::new().unwrap();
    let brood = open(&dir, "s").await;
    failpoints::arm("ledger_flush", 1);
    let err = brood
        .delegate("s", DelegateRequest::background(vec![sim(0)]))
        .await
        .unwrap_err();
    assert!(matches!(err.error, BroodError::Ledger(_)), "{err}");
    let st = brood.status("s").await.unwrap();
    assert!(
        st.calls.is_empty() && st.counts.queued + st.counts.running == 0,
        "a refused call runs: {st:?}"
    );
    let accepted = brood
        .delegate("s", DelegateRequest::background(vec![sim(0)]))
        .await
        .unwrap();
    brood.shutdown();
    let brood = open(&dir, "s").await;
    let acked = drain(&brood, "s", 1).await;
    let calls: BTreeSet<&str> = acked.keys().map(|k| k.split('.').next().unwrap_or("")).collect();
    assert_eq!(
        calls,
        BTreeSet::from([accepted.call_id()]),
        "the refused call surfaced after a restart"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(brood.boundary("s", "c", LEASE).await.unwrap().is_none());
    brood.shutdown();
}
