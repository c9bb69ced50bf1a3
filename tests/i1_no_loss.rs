//! I1 no loss — "a terminal child is durably recorded before it is published as ready; what
//! brood reported as recorded survives `kill -9`."
//!
//! Proven here at the API level: what a boundary returned (so brood reported it recorded) comes
//! back unchanged after a clean restart and after `kill -9`. That nothing is published before it
//! is recorded is proven with failing writes and flushes in faults.rs; crash.rs kills a worker at
//! random moments.

mod common;

use std::collections::{BTreeSet, HashMap};

use brood::DelegateRequest;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_a_boundary_returned_survive_reopen_unchanged() {
    let mut t = TestBrood::new();
    let (_, returned) = take_four_unacked(t.b(), "i1").await;
    // Restart right away.
    let env = reopened_envelope(&mut t, "i1", "returned items survive").await;
    let b = t.b();
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
}

/// The env var that makes the test below act as the process that gets killed.
const CRASH_ENV: &str = "BROOD_I1_CRASH_DIR";

/// Across `kill -9`: this test re-runs itself in a child process that delegates, claims, acks
/// some, writes down what the API told it, and kills itself with SIGKILL (no destructor, no
/// flush on drop). The parent then opens the same folder: exactly the claimed-but-unacked items
/// come back, unchanged (I1), never the acked ones (I2).
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
