//! What happens to calls after delivery: a delivered call leaves memory (however acks
//! interleave), and sync results count as delivered only once the caller has them.

mod common;

use std::time::{Duration, Instant};

use brood::{Brood, BroodConfig, DelegateReply, DelegateRequest, SessionSettings, TaskSpec};
use serde_json::json;
use tempfile::TempDir;

fn sim(ms: u64) -> TaskSpec {
    TaskSpec::new(format!("work {ms} ms"), json!({"kind": "sim", "ms": ms}))
}

const LEASE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivered_calls_leave_memory_even_when_acks_overlap() {
    let dir = TempDir::new().unwrap();
    let brood = Brood::open(BroodConfig::new(dir.path())).unwrap();
    brood
        .open_session("s", SessionSettings::default().wake(|_| {}))
        .await
        .unwrap();
    for _ in 0..10 {
        brood
            .delegate("s", DelegateRequest::background(vec![sim(0)]))
            .await
            .unwrap();
        let first = common::next_envelope(&brood, "s", "c", LEASE).await;
        brood
            .delegate("s", DelegateRequest::background(vec![sim(0)]))
            .await
            .unwrap();
        let second = common::next_envelope(&brood, "s", "c", LEASE).await;
        // Two acks in flight at once.
        let (a, b) = tokio::join!(brood.ack(&first.claim_id), brood.ack(&second.claim_id));
        assert_eq!((a.unwrap(), b.unwrap()), (1, 1));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = brood.status("s").await.unwrap();
        if st.calls.is_empty() {
            assert_eq!(st.counts.delivered, 20);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} delivered calls stay in memory",
            st.calls.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    brood.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_results_the_caller_never_received_go_out_at_a_boundary() {
    let dir = TempDir::new().unwrap();
    let brood = Brood::open(BroodConfig::new(dir.path())).unwrap();
    brood
        .open_session("s", SessionSettings::default().wake(|_| {}))
        .await
        .unwrap();
    // The caller gives up before the child ends; its results must not be lost.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(50),
        brood.delegate("s", DelegateRequest::sync(vec![sim(300)])),
    )
    .await;
    assert!(gave_up.is_err());
    let env = common::next_envelope(&brood, "s", "c", LEASE).await;
    assert_eq!(env.items.len(), 1);
    assert_eq!(brood.ack(&env.claim_id).await.unwrap(), 1);
    // A caller that waits gets its results inline, and they are not offered again.
    let reply = brood.delegate("s", DelegateRequest::sync(vec![sim(10)])).await.unwrap();
    assert!(matches!(reply, DelegateReply::Sync { ref results, .. } if results.len() == 1));
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert!(
        brood.boundary("s", "c", LEASE).await.unwrap().is_none(),
        "received sync results offered again"
    );
    brood.shutdown();
    let brood = Brood::open(BroodConfig::new(dir.path())).unwrap();
    brood
        .open_session("s", SessionSettings::default().wake(|_| {}))
        .await
        .unwrap();
    assert!(
        brood.boundary("s", "c", LEASE).await.unwrap().is_none(),
        "delivered sync results came back after a restart"
    );
    brood.shutdown();
}
