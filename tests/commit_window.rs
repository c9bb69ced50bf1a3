//! A commit window (`BroodConfig::commit_window`) gathers completions into fewer flushes; it
//! must not change what is delivered: every result once, durable before it is published, and a
//! restart finds them all.

mod common;

use std::time::Duration;

use brood::{Brood, BroodConfig, DelegateRequest};
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_gathered_in_a_window_are_all_delivered_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        Brood::open(BroodConfig::new(dir.path().join("ledger")).commit_window(Duration::from_millis(40)))
            .expect("open brood")
    };
    let b = open();
    open_wake(&b, "w").await;
    let n = 60;
    let tasks = (0..n).map(|i| task(format!("t{i}"), sim(i % 7))).collect();
    let reply = b
        .delegate("w", DelegateRequest::background(tasks).independent())
        .await
        .unwrap();
    // Half of them claimed and acked; the rest recorded but left ready.
    let mut acked = std::collections::BTreeSet::new();
    while acked.len() < n as usize / 2 {
        let env = next_envelope(&b, "w", "c", Duration::from_secs(30)).await;
        for item in &env.items {
            assert!(
                acked.insert(item.dedup_key.clone()),
                "{} delivered twice",
                item.dedup_key
            );
        }
        b.ack(&env.claim_id).await.unwrap();
    }
    status_until(&b, "w", "every child recorded", |st| {
        st.counts.running == 0 && st.counts.queued == 0
    })
    .await;
    b.shutdown();

    let b = open();
    open_wake(&b, "w").await;
    let rest = collect_results(&b, "w", n as usize - acked.len()).await;
    for item in &rest {
        assert_eq!(item.call_id, reply.call_id());
        assert!(!item.recovered, "{} was recorded before the restart", item.dedup_key);
        assert!(
            acked.insert(item.dedup_key.clone()),
            "{} delivered again after its ack",
            item.dedup_key
        );
    }
    assert_eq!(acked.len(), n as usize);
    b.shutdown();
}
