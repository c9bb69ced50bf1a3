//! A process starting on a shared PostgreSQL ledger reads the sessions it takes in a number of
//! statements that does not grow with how many there are (a few per table, not ten per
//! session), and serves every session read so as a start reading it alone would (I6: its live
//! claims returned, what was running resolved, its settings as stored).
//!
//! The statements are counted by the test kit, which counts them with the `failpoints` feature
//! only (the feature `.ci/test` runs every test with).
#![cfg(feature = "failpoints")]

mod common;

use std::time::Duration;

use brood::{Brood, BroodConfig, ChildStatus, DelegateRequest, SessionSettings};
use brood_actors::ledger::{pg_testkit, Ledger, PgLedger, Writes};
use brood_actors::model::{now_ms, SessionRow};
use common::*;

fn sharing(dir: &std::path::Path, kit: &Kit, url: &str, schema: &str, node: &str) -> Brood {
    let config = BroodConfig::new(dir)
        .runners(kit.runners())
        .postgres(url)
        .postgres_schema(schema)
        .share(node, format!("http://{node}"), Duration::from_secs(60));
    Brood::open(config).expect("open sharing PostgreSQL")
}

/// The idle sessions' capacity as stored (not the default): a session read back shows it.
const IDLE_CAPACITY: u32 = 3;

/// What a first process left in the schema for the next one to take.
struct Stored {
    /// The call whose one child was still running when the first process stopped.
    running_call: String,
    /// A claim of "busy" left live (its items not acked).
    live_claim: Vec<String>,
    /// The items of an acked claim of "busy".
    acked: Vec<String>,
}

/// Stores, through a first process that stops cleanly after (its tenures given back): session
/// "busy" with a call of four finished children, two of whose items were claimed and acked and
/// the other two claimed and left live, and a call whose one child still runs; then `idle`
/// sessions with no call, written through the ledger's own API as a bulk load would.
async fn stored(url: &str, schema: &str, idle: usize) -> Stored {
    let (kit, dir) = (Kit::default(), tempfile::tempdir().unwrap());
    let a = sharing(dir.path(), &kit, url, schema, "a");
    open_wake(&a, "busy").await;
    let tasks = (0..4).map(|i| task(format!("t{i}"), sim(0))).collect();
    delegated(&a, "busy", DelegateRequest::background(tasks).independent()).await;
    let mut claims = Vec::new();
    let mut items = 0;
    while items < 4 {
        let env = next_envelope(&a, "busy", "c", LONG_LEASE).await;
        items += env.items.len();
        claims.push(env);
    }
    let (first, rest) = claims.split_first().expect("a claim");
    a.ack(&first.claim_id).await.expect("ack");
    let running_call = delegated(
        &a,
        "busy",
        DelegateRequest::background(vec![task("long", sim(600_000))]),
    )
    .await;
    status_until(&a, "busy", "the long child running", |st| {
        child_status(st, &running_call, 0) == Some(ChildStatus::Running)
    })
    .await;
    a.shutdown();
    let ledger = PgLedger::open_in(url, schema).expect("open the ledger");
    let sessions = (0..idle)
        .map(|i| SessionRow {
            session_id: idle_id(i),
            max_concurrent_children: IDLE_CAPACITY,
            max_delivery_attempts: 5,
            next_set: 1,
            created_at_ms: now_ms(),
            addressable: false,
        })
        .collect();
    ledger
        .write(&Writes {
            sessions,
            ..Writes::default()
        })
        .expect("write");
    ledger.flush().expect("flush");
    Stored {
        running_call,
        live_claim: rest
            .iter()
            .flat_map(|e| e.items.iter().map(|i| i.dedup_key.clone()))
            .collect(),
        acked: first.items.iter().map(|i| i.dedup_key.clone()).collect(),
    }
}

fn idle_id(i: usize) -> String {
    format!("idle{i:04}")
}

/// A second process, started on what a first one left.
struct Second {
    /// The statements its ledger sent while it opened (every free session taken and read).
    sent: u64,
    brood: Brood,
    left: Stored,
    schema: String,
    _kit: Kit,
    _dir: tempfile::TempDir,
}

/// Starts a second process on a schema holding "busy" and `idle` idle sessions.
async fn started_over(idle: usize) -> Second {
    let url = pg_testkit::url();
    let schema = pg_testkit::fresh_schema();
    let left = stored(&url, &schema, idle).await;
    let (kit, dir) = (Kit::default(), tempfile::tempdir().unwrap());
    let before = pg_testkit::statements_in(&schema);
    let b = sharing(dir.path(), &kit, &url, &schema, "b");
    let sent = pg_testkit::statements_in(&schema) - before;
    Second {
        sent,
        brood: b,
        left,
        schema,
        _kit: kit,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_reads_the_sessions_it_takes_in_statements_that_do_not_grow_with_them() {
    let small = started_over(20).await;
    let few = small.sent;
    small.brood.shutdown();
    let big = started_over(500).await;
    let (many, b) = (big.sent, &big.brood);
    assert_eq!(b.health().await.expect("health").sessions, 501, "every session taken");
    eprintln!("statements sent by a start: {few} with 21 sessions, {many} with 501");
    // Read one at a time, 480 more sessions would cost about ten statements each.
    assert!(
        many <= few + 2,
        "a start sent {few} statements with 21 sessions and {many} with 501: it grows with the sessions"
    );
    big.brood.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_session_a_start_read_at_once_is_served_as_recovered() {
    let second = started_over(500).await;
    served_as_recovered(&second.brood, &second.left, 500).await;
    second.brood.shutdown();
}

/// A process already running takes up every session another gives back at its stop (a sweep,
/// as after a death) reading them together, in fewer statements than there are sessions (one at
/// a time, each would cost about ten), and serves each as recovered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_reads_the_sessions_it_takes_together_and_serves_them_as_recovered() {
    let second = started_over(300).await;
    let (kit, dir) = (Kit::default(), tempfile::tempdir().unwrap());
    let c = sharing(dir.path(), &kit, &pg_testkit::url(), &second.schema, "c");
    let before = pg_testkit::statements_in(&second.schema);
    second.brood.shutdown();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while c.health().await.expect("health").sessions < 301 {
        assert!(std::time::Instant::now() < deadline, "c never took every session");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let sent = pg_testkit::statements_in(&second.schema) - before;
    eprintln!("statements sent while a sweep took 301 sessions up: {sent}");
    assert!(sent < 301, "{sent} statements for 301 sessions taken by sweeps");
    served_as_recovered(&c, &second.left, 300).await;
    c.shutdown();
}

/// Checks that `b` serves what [`stored`] left as a recovery of it: "busy"'s running child
/// resolved, its live claim's items ready again and the acked ones never; idle sessions with
/// their stored settings (`idle` of them), taking work.
async fn served_as_recovered(b: &Brood, left: &Stored, idle: usize) {
    // busy: the child that was running resolved unknown (it may not re-run), its result ready;
    // the live claim's items handed out again (I6), the acked ones never (I2).
    let st = b.status("busy").await.expect("status");
    assert_eq!(
        child_status(&st, &left.running_call, 0),
        Some(ChildStatus::Unknown),
        "the child running at the stop is resolved unknown"
    );
    let env = next_envelope(b, "busy", "c2", LONG_LEASE).await;
    let mut again: Vec<String> = env.items.iter().map(|i| i.dedup_key.clone()).collect();
    again.sort();
    let mut expected = left.live_claim.clone();
    expected.push(result_key(&left.running_call, 0));
    expected.sort();
    assert_eq!(
        again, expected,
        "the live claim's items and the unknown child's result, and only they, are ready"
    );
    assert!(
        left.acked.iter().all(|k| !again.contains(k)),
        "acked items handed out again"
    );
    assert_eq!(b.ack(&env.claim_id).await.expect("ack"), expected.len());
    // Idle sessions read in the batch: their stored settings, and work through them.
    for i in [0, idle / 2, idle - 1] {
        let id = idle_id(i);
        let info = b
            .open_session(&id, SessionSettings::default().wake(|_| {}))
            .await
            .expect("open a stored session");
        assert_eq!(info.max_concurrent_children, IDLE_CAPACITY, "{id}'s stored capacity");
        delegated(b, &id, DelegateRequest::background(vec![task("x", sim(0))])).await;
        let results = collect_results(b, &id, 1).await;
        assert_eq!(results.len(), 1, "{id} delivered its child's result");
    }
}
