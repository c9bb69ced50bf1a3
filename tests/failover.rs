//! A database failover loses nothing acknowledged: one `brood serve` on a PostgreSQL primary
//! with a synchronous standby, given both hosts (`target_session_attrs=read-write`), under a
//! workload of sessions delegating many short children while consumers claim and ack. Midway the
//! primary is killed (immediate shutdown) and, a tenure time later, the standby promoted. The
//! clients retry what answered 503 or did not answer, as a client should; at the end every child
//! of every call answered 2xx was delivered exactly once, and the outage shows as retried
//! requests, not as lost work.

mod common;
mod server;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use brood::{Brood, BroodConfig, DelegateRequest};
use brood_actors::ledger::pg_testkit::Replicated;
use serde_json::{json, Value};
use server::{sim, Server};

/// The tenure time: the outage is made longer than it, so the process's tenures lapse.
const TENURE_MS: u64 = 2000;
const SESSIONS: usize = 4;
const CALLS_PER_SESSION: usize = 12;
const CHILDREN_PER_CALL: usize = 16;

/// How generous every wait is: a loaded machine is slow, never wrong.
const PATIENCE: Duration = Duration::from_secs(120);

/// What the clients saw, shared by their threads.
#[derive(Default)]
struct Seen {
    /// Requests answered 503 (or 408), or not answered, and sent again.
    retried: AtomicUsize,
    /// The 503 error codes seen, counted.
    codes: Mutex<BTreeMap<String, usize>>,
    /// Each call answered 2xx: its task count.
    accepted: Mutex<HashMap<String, usize>>,
    /// Each acked item's dedup key, with its child id, and how many acks answered 200 for it.
    acked: Mutex<HashMap<String, (String, usize)>>,
    /// Items handed out again after an ack of them answered 200 (dedup keys).
    came_back: Mutex<Vec<String>>,
    /// Claims whose ack was refused as lost (their items come again).
    claims_lost: AtomicUsize,
    /// The longest wait for one answer, and what it was (shown, not asserted).
    slowest: Mutex<(Duration, String)>,
}

/// One request, retried while it answers 503 or 408 or does not answer (the server is alive,
/// its database is not): the first other answer.
fn send(agent: &ureq::Agent, base: &str, path: &str, body: &Value, seen: &Seen) -> (u16, Value) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let sent = Instant::now();
        let answer = agent
            .post(&format!("{base}{path}"))
            .header("Content-Type", "application/json")
            .send(body.to_string().as_bytes());
        {
            let mut slowest = seen.slowest.lock().unwrap();
            if sent.elapsed() > slowest.0 {
                let status = answer.as_ref().map(|r| r.status().as_u16()).unwrap_or(0);
                *slowest = (sent.elapsed(), format!("POST {path}: {status}"));
            }
        }
        match answer {
            Ok(mut r) => {
                let status = r.status().as_u16();
                let text = r.body_mut().read_to_string().unwrap_or_default();
                let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                if status != 503 && status != 408 {
                    return (status, value);
                }
                let code = value["error"]["code"].as_str().unwrap_or("(none)").to_string();
                *seen.codes.lock().unwrap().entry(code).or_default() += 1;
            }
            Err(e) => {
                *seen.codes.lock().unwrap().entry(format!("transport: {e}")).or_default() += 1;
            }
        }
        seen.retried.fetch_add(1, Ordering::Relaxed);
        assert!(Instant::now() < deadline, "POST {path} kept failing for {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Makes the session's calls, one after another, each under an idempotency key (a retry of
/// one whose answer was lost is answered as the first was, not made again).
fn produce(agent: ureq::Agent, base: String, session: String, seen: Arc<Seen>) {
    for c in 0..CALLS_PER_SESSION {
        let tasks: Vec<Value> = (0..CHILDREN_PER_CALL)
            .map(|t| json!({"goal": format!("{session} call {c} task {t}"), "runner": sim((t % 4) as u64 * 5)}))
            .collect();
        let body = json!({
            "tasks": tasks,
            "independent_completions": true,
            "idempotency_key": format!("{session}-call-{c}"),
        });
        let (status, reply) = send(&agent, &base, &format!("/v1/sessions/{session}/delegate"), &body, &seen);
        assert_eq!(status, 202, "{reply}");
        let call = reply["call_id"].as_str().expect("a call id").to_string();
        seen.accepted.lock().unwrap().insert(call, CHILDREN_PER_CALL);
        std::thread::sleep(Duration::from_millis(40));
    }
}

/// Claims and acks the session's items until `done`: an ack refused as lost leaves its items to
/// come again; an item handed out after an ack of it answered 200 is noted.
fn consume(agent: ureq::Agent, base: String, session: String, seen: Arc<Seen>, done: Arc<AtomicBool>) {
    // Shorter than the outage: a claim made before it may run out before its ack lands.
    let boundary = json!({"consumer": "failover", "lease_ms": 3_000});
    while !done.load(Ordering::Relaxed) {
        let (status, env) = send(
            &agent,
            &base,
            &format!("/v1/sessions/{session}/boundary"),
            &boundary,
            &seen,
        );
        if status == 204 {
            std::thread::sleep(Duration::from_millis(30));
            continue;
        }
        assert_eq!(status, 200, "{env}");
        let items: Vec<(String, String)> = env["items"]
            .as_array()
            .expect("items")
            .iter()
            .filter(|i| i["kind"] == "result")
            .map(|i| {
                assert_eq!(i["status"], "succeeded", "{i}");
                (
                    i["dedup_key"].as_str().unwrap().to_string(),
                    i["child_id"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        {
            let acked = seen.acked.lock().unwrap();
            let again = items
                .iter()
                .filter(|(k, _)| acked.contains_key(k))
                .map(|(k, _)| k.clone());
            seen.came_back.lock().unwrap().extend(again);
        }
        let claim = env["claim_id"].as_str().expect("a claim id");
        let (status, reply) = send(&agent, &base, &format!("/v1/claims/{claim}/ack"), &Value::Null, &seen);
        match status {
            200 => {
                let mut acked = seen.acked.lock().unwrap();
                for (key, child) in items {
                    acked.entry(key).or_insert((child, 0)).1 += 1;
                }
            }
            // Its lease ran out during the outage: the items come again.
            409 if reply["error"]["code"] == "claim_lost" => {
                seen.claims_lost.fetch_add(1, Ordering::Relaxed);
            }
            s => panic!("ack answered {s}: {reply}"),
        }
    }
}

#[test]
fn a_database_failover_loses_nothing_acknowledged_and_delivers_nothing_twice() {
    let mut pair = Replicated::start();
    let url = pair.fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(
        dir.path(),
        None,
        &[
            "--ledger",
            &url,
            "--node",
            "a",
            "--session-lease-ms",
            &TENURE_MS.to_string(),
        ],
    );
    let sessions: Vec<String> = (0..SESSIONS).map(|i| format!("fo{i}")).collect();
    for session in &sessions {
        s.open(session);
    }
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let seen = Arc::new(Seen::default());
    let done = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = sessions
        .iter()
        .map(|session| {
            let (agent, base, session, seen) = (agent.clone(), s.base.clone(), session.clone(), seen.clone());
            std::thread::spawn(move || produce(agent, base, session, seen))
        })
        .collect();
    let consumers: Vec<_> = sessions
        .iter()
        .map(|session| {
            let (agent, base, session, seen, done) = (
                agent.clone(),
                s.base.clone(),
                session.clone(),
                seen.clone(),
                done.clone(),
            );
            std::thread::spawn(move || consume(agent, base, session, seen, done))
        })
        .collect();

    // Midway: some calls made and some items acked, more to come.
    let total = SESSIONS * CALLS_PER_SESSION * CHILDREN_PER_CALL;
    let deadline = Instant::now() + PATIENCE;
    while seen.acked.lock().unwrap().len() < total / 5 {
        assert!(
            Instant::now() < deadline,
            "the workload made no progress before the failover"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let acked_before = seen.acked.lock().unwrap().len();
    pair.kill_primary();
    // Out for longer than a tenure: the process stops serving its sessions, and must take them
    // up again once the database is back. Longer also than an owner retries putting the ledger
    // back after a refused write (5 s).
    std::thread::sleep(Duration::from_millis(TENURE_MS * 3));
    pair.promote_standby();

    for p in producers {
        p.join().expect("a producer failed");
    }
    let accepted = seen.accepted.lock().unwrap().clone();
    assert_eq!(
        accepted.len(),
        SESSIONS * CALLS_PER_SESSION,
        "every call was accepted in the end"
    );
    let deadline = Instant::now() + PATIENCE;
    while seen.acked.lock().unwrap().len() < total {
        assert!(
            Instant::now() < deadline,
            "only {} of {total} items were delivered within {PATIENCE:?}",
            seen.acked.lock().unwrap().len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    done.store(true, Ordering::Relaxed);
    for c in consumers {
        c.join().expect("a consumer failed");
    }

    let acked = seen.acked.lock().unwrap();
    let twice: Vec<_> = acked.iter().filter(|(_, (_, n))| *n != 1).collect();
    assert!(twice.is_empty(), "items acked more than once: {twice:?}");
    let came_back = seen.came_back.lock().unwrap();
    assert!(came_back.is_empty(), "acked items handed out again: {came_back:?}");
    // Every child of every accepted call, delivered.
    let delivered: BTreeSet<&str> = acked.values().map(|(child, _)| child.as_str()).collect();
    for (call, n) in &accepted {
        for k in 0..*n {
            let child = format!("{call}.{k}");
            assert!(delivered.contains(child.as_str()), "{child} was never delivered");
        }
    }
    assert_eq!(delivered.len(), total);
    // Nothing dead-lettered, nothing left running, ready or claimed: every item delivered.
    for session in &sessions {
        let (status, state) = s.call("GET", &format!("/v1/sessions/{session}"), None);
        assert_eq!(status, 200, "{state}");
        let counts = &state["counts"];
        for n in ["queued", "running", "ready", "backing_off", "claimed"] {
            assert_eq!(counts[n], 0, "{session}: {n} in {state}");
        }
        assert_eq!(
            counts["delivered"].as_u64(),
            Some((CALLS_PER_SESSION * CHILDREN_PER_CALL) as u64),
            "{state}"
        );
    }
    let (status, dead) = s.call("GET", "/v1/dead-letters", None);
    assert_eq!(status, 200, "{dead}");
    assert_eq!(dead["items"].as_array().map(Vec::len), Some(0), "{dead}");
    let retried = seen.retried.load(Ordering::Relaxed);
    let codes = seen.codes.lock().unwrap();
    eprintln!(
        "failover: {total} items delivered ({acked_before} before the primary was killed); \
         {retried} requests retried {codes:?}; {} claims lost to their lease; the slowest answer {:?}",
        seen.claims_lost.load(Ordering::Relaxed),
        seen.slowest.lock().unwrap()
    );
    assert!(retried > 0, "the outage was not seen by any request");
}

/// The result of `call` (one child) at a boundary of `session`, acked: boundaries and acks
/// refused meanwhile (the session not served yet) are tried again.
async fn delivered(b: &Brood, session: &str, call: &str) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        assert!(
            Instant::now() < deadline,
            "{call} was not delivered within {PATIENCE:?}"
        );
        let env = match b.boundary(session, "c", Duration::from_secs(30)).await {
            Ok(Some(env)) => env,
            Ok(None) | Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let calls: Vec<&str> = env.items.iter().map(|i| i.call_id.as_str()).collect();
        assert_eq!(calls, vec![call], "{env:?}");
        if b.ack(&env.claim_id).await.is_ok() {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_rebuilt_while_the_database_is_out_comes_back_with_it_instead_of_being_given_up() {
    let mut pair = Replicated::start();
    let url = pair.fresh_database();
    let kit = common::Kit::default();
    let dir = tempfile::tempdir().unwrap();
    let config = BroodConfig::new(dir.path())
        .runners(kit.runners())
        .postgres(&url)
        .share("a", "http://a", Duration::from_millis(TENURE_MS));
    let b = Brood::open(config).expect("open on the pair");
    common::open_wake(&b, "s").await;
    let first = common::delegated(
        &b,
        "s",
        DelegateRequest::background(vec![common::task("t", common::sim(0))]),
    )
    .await;
    delivered(&b, "s", &first).await;
    pair.kill_primary();
    // Promoted a while after the rebuild below began: every attempt meanwhile fails (more
    // attempts than the restart budget allows failures).
    let promoted = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(TENURE_MS));
        pair.promote_standby();
        pair
    });
    b.restart_owner("s")
        .await
        .expect("the owner is rebuilt once the database is back, not given up");
    let _pair = promoted.join().expect("promoting the standby");
    let second = common::delegated(
        &b,
        "s",
        DelegateRequest::background(vec![common::task("t", common::sim(0))]),
    )
    .await;
    delivered(&b, "s", &second).await;
    b.shutdown();
}
