//! `Brood::restart_owner`: a session's owner rebuilt on request from its own rows in the
//! ledger, as its supervisor rebuilds one that panicked — its live claims returned, its running
//! children adopted, nothing recorded lost or delivered twice — and outside the restart budget.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use brood::{Brood, BroodConfig, BroodError, DelegateRequest};
use common::*;
use tempfile::TempDir;

const LEASE: Duration = Duration::from_secs(60);

/// Claims and acks until `want` results were delivered; how often each item was acked.
async fn drain(b: &Brood, session: &str, want: usize) -> BTreeMap<String, u32> {
    let mut acked: BTreeMap<String, u32> = BTreeMap::new();
    while acked.keys().filter(|k| k.ends_with(":result")).count() < want {
        let env = next_envelope(b, session, "drain", LEASE).await;
        b.ack(&env.claim_id).await.expect("ack");
        for item in env.items {
            *acked.entry(item.dedup_key).or_default() += 1;
        }
    }
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_owner_returns_its_claims_adopts_its_running_children_and_loses_nothing() {
    let dir = TempDir::new().unwrap();
    let b = Brood::open(BroodConfig::new(dir.path())).unwrap();
    open_wake(&b, "s").await;
    open_wake(&b, "other").await;
    let quick = b
        .delegate(
            "s",
            DelegateRequest::background((0..6).map(|i| task(format!("q{i}"), sim(0))).collect()).independent(),
        )
        .await
        .unwrap();
    status_until(&b, "s", "six results ready", |st| st.counts.ready == 6).await;
    let claim = next_envelope(&b, "s", "before", LEASE).await;
    assert_eq!(claim.items.len(), 6);
    // A child running across the restart: its actor lives on and hands its result to the
    // rebuilt owner.
    let slow = b
        .delegate("s", DelegateRequest::background(vec![task("slow", sim(600))]))
        .await
        .unwrap();
    status_until(&b, "s", "the slow child running", |st| st.counts.running == 1).await;
    let other = b
        .delegate("other", DelegateRequest::background(vec![task("o", sim(0))]))
        .await
        .unwrap();

    b.restart_owner("s").await.expect("restart");

    let lost = b.ack(&claim.claim_id).await.unwrap_err();
    assert!(matches!(lost, BroodError::ClaimLost(_)), "{lost}");
    let st = b.status("s").await.unwrap();
    assert_eq!(st.counts.running, 1, "the running child was adopted, not started again");
    let acked = drain(&b, "s", 7).await;
    assert!(acked.values().all(|&n| n == 1), "an item was acked twice: {acked:?}");
    for i in 0..6 {
        assert!(
            acked.contains_key(&result_key(quick.call_id(), i)),
            "q{i} lost: {acked:?}"
        );
    }
    assert!(
        acked.contains_key(&result_key(slow.call_id(), 0)),
        "the slow child's result lost"
    );
    // The other session was never touched.
    let o = collect_results(&b, "other", 1).await;
    assert_eq!(o[0].dedup_key, result_key(other.call_id(), 0));
    // Set numbers go on.
    let next = b
        .delegate("s", DelegateRequest::background(vec![task("n", sim(0))]))
        .await
        .unwrap();
    assert_eq!(next.set(), 3);
    b.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_on_request_do_not_spend_the_restart_budget() {
    let dir = TempDir::new().unwrap();
    let b = Brood::open(BroodConfig::new(dir.path())).unwrap();
    open_wake(&b, "s").await;
    // The default budget is 3 restarts within 10 s; a panicking owner past it is given up.
    for _ in 0..6 {
        b.restart_owner("s").await.expect("restart");
    }
    let call = b
        .delegate("s", DelegateRequest::background(vec![task("t", sim(0))]))
        .await
        .unwrap();
    let got = collect_results(&b, "s", 1).await;
    assert_eq!(got[0].dedup_key, result_key(call.call_id(), 0));
    let unknown = b.restart_owner("nobody").await.unwrap_err();
    assert!(matches!(unknown, BroodError::UnknownSession(_)), "{unknown}");
    b.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_lost_with_its_owner_stays_lost_after_later_rebuilds_and_restarts() {
    let dir = TempDir::new().unwrap();
    let b = Brood::open(BroodConfig::new(dir.path())).unwrap();
    open_wake(&b, "s").await;
    b.delegate("s", DelegateRequest::background(vec![task("t", sim(0))]))
        .await
        .unwrap();
    status_until(&b, "s", "the result ready", |st| st.counts.ready == 1).await;
    let claim = next_envelope(&b, "s", "before", LEASE).await;
    // The first rebuild reads the claim's row and returns its items; the second finds no row of
    // it (the first removed it), as a process that takes the session over may find none.
    b.restart_owner("s").await.expect("restart");
    b.restart_owner("s").await.expect("restart");
    let lost = b.ack(&claim.claim_id).await.unwrap_err();
    assert!(
        matches!(lost, BroodError::ClaimLost(_)),
        "an ack after two rebuilds: {lost}"
    );
    let lost = b
        .release(&claim.claim_id, brood::ReleaseReason::Busy, Duration::ZERO)
        .await
        .unwrap_err();
    assert!(
        matches!(lost, BroodError::ClaimLost(_)),
        "a release after two rebuilds: {lost}"
    );
    b.shutdown();
    let b = Brood::open(BroodConfig::new(dir.path())).unwrap();
    let lost = b.ack(&claim.claim_id).await.unwrap_err();
    assert!(
        matches!(lost, BroodError::ClaimLost(_)),
        "an ack after a restart: {lost}"
    );
    // A claim id no owner made is unknown, not lost.
    let (named, _) = claim.claim_id.rsplit_once('_').unwrap();
    let future = format!("{named}_ffffffffffffffff");
    let unknown = b.ack(&future).await.unwrap_err();
    assert!(
        matches!(unknown, BroodError::UnknownClaim(_)),
        "a claim made later than now: {unknown}"
    );
    let unknown = b.ack("clm_nonsense").await.unwrap_err();
    assert!(matches!(unknown, BroodError::UnknownClaim(_)), "{unknown}");
    // Its items went out again, once.
    let got = collect_results(&b, "s", 1).await;
    assert_eq!(got.len(), 1);
    b.shutdown();
}
