//! The engine on PostgreSQL, where PostgreSQL itself fails: a database server that crashes and
//! comes back in the middle of a run. Every result is delivered once, and nothing acked comes
//! back (the invariant tests run on PostgreSQL too, from `.ci/run`).

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use brood::{Brood, BroodConfig, BroodError, DelegateRequest};
use brood_actors::ledger::pg_testkit::Cluster;
use common::*;

const CHILDREN: usize = 60;
/// Short, so that items of a claim whose ack failed come back soon.
const LEASE: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_crash_mid_run_loses_nothing_and_delivers_nothing_twice() {
    let mut cluster = Cluster::private();
    let kit = Kit::default();
    let dir = tempfile::tempdir().unwrap();
    let url = cluster.url();
    let config = || BroodConfig::new(dir.path()).runners(kit.runners()).postgres(&url);
    let b = Brood::open(config()).expect("open on PostgreSQL");
    open_wake(&b, "p").await;
    let tasks = (0..CHILDREN)
        .map(|i| task(format!("t{i}"), sim(20 + (i as u64 % 7) * 10)))
        .collect();
    let call = b
        .delegate("p", DelegateRequest::background(tasks).independent())
        .await
        .expect("delegate")
        .call_id()
        .to_string();
    let mut delivered: BTreeSet<String> = BTreeSet::new();
    let mut acked_twice = Vec::new();
    let started = Instant::now();
    let mut down_since: Option<Instant> = None;
    let mut back = false;
    let mut failed_while_down = 0;
    while delivered.len() < CHILDREN {
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "delivered {} of {CHILDREN}",
            delivered.len()
        );
        if !back && down_since.is_some_and(|t| t.elapsed() > Duration::from_secs(1)) {
            cluster.start();
            back = true;
        }
        let down = down_since.is_some() && !back;
        // Requests while the database is down or reconnecting may fail: retried.
        let env = match b.boundary("p", "c", LEASE).await {
            Ok(Some(env)) => env,
            Ok(None) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            Err(_) => {
                failed_while_down += usize::from(down);
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        // The server crashes while the first envelope is in hand, so its ack meets the crash,
        // and comes back a second later; the consumer goes on asking meanwhile.
        if down_since.is_none() {
            cluster.stop();
            down_since = Some(Instant::now());
        }
        let down = down_since.is_some() && !back;
        if b.ack(&env.claim_id).await.is_err() {
            // Not acked: the items come back when the claim's lease ends or is lost.
            failed_while_down += usize::from(down);
            continue;
        }
        for item in &env.items {
            if !delivered.insert(item.dedup_key.clone()) {
                acked_twice.push(item.dedup_key.clone());
            }
        }
    }
    let crashed = down_since.is_some();
    assert!(failed_while_down > 0, "some requests met the crashed database");
    assert!(crashed && back, "the database crashed and came back during the run");
    assert!(acked_twice.is_empty(), "acked twice: {acked_twice:?}");
    let expected: BTreeSet<String> = (0..CHILDREN as u32).map(|i| result_key(&call, i)).collect();
    assert_eq!(delivered, expected);
    // And after a restart of the engine, nothing acked is handed out again.
    b.shutdown();
    let b = Brood::open(config()).expect("reopen on PostgreSQL");
    open_wake(&b, "p").await;
    assert!(b.boundary("p", "c", Duration::from_secs(30)).await.unwrap().is_none());
    b.shutdown();
}

/// An engine sharing the database as one of several processes would: node `node`, reached at
/// `http://<node>`, with leases long enough that no renewal runs during a test.
fn sharing(dir: &std::path::Path, kit: &Kit, url: &str, schema: &str, node: &str) -> Brood {
    let config = BroodConfig::new(dir)
        .runners(kit.runners())
        .postgres(url)
        .postgres_schema(schema)
        .share(node, format!("http://{node}"), Duration::from_secs(60));
    Brood::open(config).expect("open sharing PostgreSQL")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_whose_lease_was_taken_over_is_refused_at_its_first_write_and_serves_no_more() {
    let (kit, dir) = (Kit::default(), tempfile::tempdir().unwrap());
    let url = brood_actors::ledger::pg_testkit::url();
    let schema = brood_actors::ledger::pg_testkit::fresh_schema();
    let a = sharing(&dir.path().join("a"), &kit, &url, &schema, "a");
    let b = sharing(&dir.path().join("b"), &kit, &url, &schema, "b");
    open_wake(&a, "f").await;
    let tasks = (0..5).map(|i| task(format!("t{i}"), sim(0))).collect();
    a.delegate("f", DelegateRequest::background(tasks).independent())
        .await
        .expect("delegate");
    let mut claimed = Vec::new();
    let mut claims = Vec::new();
    while claimed.len() < 5 {
        let env = next_envelope(&a, "f", "c", Duration::from_secs(60)).await;
        claimed.extend(env.items.iter().map(|i| i.dedup_key.clone()));
        claims.push(env.claim_id);
    }
    // a is paused past its lease (it renews nothing meanwhile), and b takes the session over.
    brood_actors::ledger::pg_testkit::execute(
        &url,
        &format!("UPDATE {schema}.session_leases SET expires_at = now() - interval '1 second'"),
    );
    open_wake(&b, "f").await;
    // a wakes up holding claims: its ack is refused at its write, and nothing of it lands.
    match a.ack(&claims[0]).await {
        Err(BroodError::TenureLapsed { session }) => assert_eq!(session, "f"),
        other => panic!("the old holder's ack was not refused: {other:?}"),
    }
    // From then on a names the holder instead of serving the session.
    match a.boundary("f", "c", LEASE).await {
        Err(BroodError::Moved { address, .. }) => assert_eq!(address, "http://b"),
        other => panic!("the old holder still serves the session: {other:?}"),
    }
    let late = DelegateRequest::background(vec![task("late", sim(0))]);
    let refused = a.delegate("f", late).await.expect_err("the old holder accepted a call");
    assert!(matches!(refused.error, BroodError::Moved { .. }), "{:?}", refused.error);
    // b recovered the session as a restart would: a's claims were returned, and every item is
    // delivered through b, once.
    let mut again = Vec::new();
    while again.len() < 5 {
        let env = next_envelope(&b, "f", "c", Duration::from_secs(60)).await;
        again.extend(env.items.iter().map(|i| i.dedup_key.clone()));
        b.ack(&env.claim_id).await.expect("b acks");
    }
    claimed.sort();
    again.sort();
    assert_eq!(again, claimed);
    assert!(b.boundary("f", "c", LEASE).await.unwrap().is_none(), "nothing twice");
    a.shutdown();
    b.shutdown();
}
