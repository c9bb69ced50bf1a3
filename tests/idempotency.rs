//! Idempotent delegates: a delegate naming an idempotency key (the body's `idempotency_key` or
//! the `Idempotency-Key` header) is answered, when retried with the same request, with the call
//! the first one made — while its children run, once everything in it was delivered, after the
//! server was killed, and when the retries race each other — and never makes a second call;
//! the same key with another request is refused 409 `idempotency_conflict` and changes nothing.
//! Bounded envelopes ride along: a boundary's `max_items` and `max_bytes` leave what does not fit
//! ready for the next, each item delivered once.

mod common;
mod server;

use std::collections::BTreeSet;
use std::time::Duration;

use brood::{DelegateRequest, EnvelopeLimits};
use serde_json::{json, Value};
use server::{assert_error, Server};

fn delegate(s: &Server, session: &str, body: Value) -> (u16, Value) {
    s.call("POST", &format!("/v1/sessions/{session}/delegate"), Some(body))
}

/// The calls the session has made (its `GET`'s `calls` while any is undelivered).
fn calls(s: &Server, session: &str) -> usize {
    let (status, body) = s.call("GET", &format!("/v1/sessions/{session}"), None);
    assert_eq!(status, 200, "{body}");
    body["calls"].as_array().map_or(0, Vec::len)
}

fn sims(n: usize, ms: u64) -> Vec<Value> {
    (0..n)
        .map(|i| json!({"goal": format!("t{i}"), "runner": server::sim(ms)}))
        .collect()
}

#[test]
fn a_retried_delegate_is_answered_with_the_first_call_and_makes_no_second() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("i");
    let body = json!({"tasks": sims(2, 300), "idempotency_key": "order-17"});
    let (status, first) = delegate(&s, "i", body.clone());
    assert_eq!(status, 202, "{first}");
    // While its children run: the same reply.
    let (status, again) = delegate(&s, "i", body.clone());
    assert_eq!((status, &again), (202, &first));
    assert_eq!(calls(&s, "i"), 1);
    // The header is the same key.
    let (status, by_header) = s.post_with_header(
        "/v1/sessions/i/delegate",
        &json!({"tasks": sims(2, 300)}),
        ("Idempotency-Key", "order-17"),
    );
    assert_eq!((status, &by_header["call_id"]), (202, &first["call_id"]), "{by_header}");
    // Another request under the key is refused; nothing changes.
    let other = json!({"tasks": sims(3, 300), "idempotency_key": "order-17"});
    let message = assert_error(delegate(&s, "i", other), 409, "idempotency_conflict");
    assert!(message.contains("order-17"), "{message}");
    assert_eq!(calls(&s, "i"), 1);
    // Everything delivered (the call leaves memory): still the same reply, from the ledger.
    let env = s.envelope("i", 30_000);
    let claim = env["claim_id"].as_str().unwrap();
    assert_eq!(env["items"].as_array().unwrap().len(), 2);
    assert_eq!(s.call("POST", &format!("/v1/claims/{claim}/ack"), None).0, 200);
    let (status, later) = delegate(&s, "i", body);
    assert_eq!((status, &later), (202, &first));
    assert_eq!(
        s.call("POST", "/v1/sessions/i/boundary", Some(json!({"consumer": "t"})))
            .0,
        204
    );
}

#[test]
fn the_bodys_key_wins_over_the_headers_and_a_key_has_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("b");
    let (status, first) = s.post_with_header(
        "/v1/sessions/b/delegate",
        &json!({"tasks": sims(1, 0), "idempotency_key": "a"}),
        ("Idempotency-Key", "b"),
    );
    assert_eq!(status, 202, "{first}");
    let (status, again) = s.post_with_header(
        "/v1/sessions/b/delegate",
        &json!({"tasks": sims(1, 0)}),
        ("Idempotency-Key", "a"),
    );
    assert_eq!(
        (status, &again["call_id"]),
        (202, &first["call_id"]),
        "made under the body's key"
    );
    let long = "k".repeat(256);
    let message = assert_error(
        delegate(&s, "b", json!({"tasks": sims(1, 0), "idempotency_key": long})),
        400,
        "invalid_request",
    );
    assert!(message.contains("idempotency_key"), "{message}");
}

#[test]
fn a_retried_sync_delegate_gets_the_first_calls_results() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("s");
    let body = json!({"tasks": sims(2, 0), "mode": "sync", "idempotency_key": "sync-1"});
    let (status, first) = delegate(&s, "s", body.clone());
    assert_eq!(status, 200, "{first}");
    let (status, again) = delegate(&s, "s", body);
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["call_id"], first["call_id"]);
    let keys = |r: &Value| -> BTreeSet<String> {
        r["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["dedup_key"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(keys(&again), keys(&first));
    assert_eq!(keys(&first).len(), 2);
}

#[test]
fn a_retry_after_the_server_was_killed_finds_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("k");
    let body = json!({"tasks": sims(3, 0), "independent_completions": true, "idempotency_key": "k-1"});
    let (status, first) = delegate(&s, "k", body.clone());
    assert_eq!(status, 202, "{first}");
    s.kill9();
    let s = Server::start(dir.path(), None);
    let (status, again) = delegate(&s, "k", body);
    assert_eq!(
        (status, &again["call_id"], &again["set"]),
        (202, &first["call_id"], &first["set"]),
        "{again}"
    );
    // Each child once, whatever the boundaries.
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let env = s.envelope("k", 30_000);
        for item in env["items"].as_array().unwrap() {
            seen.push(item["dedup_key"].as_str().unwrap().to_string());
        }
        let claim = env["claim_id"].as_str().unwrap();
        assert_eq!(s.call("POST", &format!("/v1/claims/{claim}/ack"), None).0, 200);
    }
    let unique: BTreeSet<_> = seen.iter().collect();
    assert_eq!((seen.len(), unique.len()), (3, 3), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_retries_make_one_call() {
    let t = common::TestBrood::new();
    let b = t.b();
    common::open_wake(b, "race").await;
    let request = || DelegateRequest::background(vec![common::task("g", common::sim(0))]).idempotency_key("same");
    let replies = futures::future::join_all((0..8).map(|_| b.delegate("race", request()))).await;
    let ids: BTreeSet<String> = replies
        .into_iter()
        .map(|r| r.map_err(|e| e.error).unwrap().call_id().to_string())
        .collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    let items = common::collect_results(b, "race", 1).await;
    assert_eq!(items.len(), 1);
    assert_eq!(b.status("race").await.unwrap().calls.len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_boundary_leaves_what_does_not_fit_ready_and_delivers_each_item_once() {
    let t = common::TestBrood::new();
    let b = t.b();
    common::open_wake(b, "bounded").await;
    let tasks = (0..5).map(|i| common::task(format!("t{i}"), common::sim(0))).collect();
    common::delegated(b, "bounded", DelegateRequest::background(tasks).independent()).await;
    // All five ready first.
    common::status_until(b, "bounded", "five results ready", |s| s.counts.ready >= 5).await;
    let lease = Duration::from_secs(30);
    let two = EnvelopeLimits {
        max_items: Some(2),
        max_bytes: None,
    };
    let mut seen = Vec::new();
    let mut sizes = Vec::new();
    loop {
        let Some(env) = b.boundary_within("bounded", "c", lease, two).await.unwrap() else {
            break;
        };
        sizes.push((env.items.len(), env.more));
        seen.extend(env.items.iter().map(|i| i.dedup_key.clone()));
        b.ack(&env.claim_id).await.unwrap();
    }
    assert_eq!(sizes, vec![(2, true), (2, true), (1, false)]);
    let unique: BTreeSet<_> = seen.iter().collect();
    assert_eq!((seen.len(), unique.len()), (5, 5));
    // A byte bound smaller than any item still hands one out at a time; a bound of 0 is refused.
    let tasks = (0..2).map(|i| common::task(format!("u{i}"), common::sim(0))).collect();
    common::delegated(b, "bounded", DelegateRequest::background(tasks).independent()).await;
    common::status_until(b, "bounded", "two results ready", |s| s.counts.ready >= 2).await;
    let tiny = EnvelopeLimits {
        max_items: None,
        max_bytes: Some(1),
    };
    let env = b.boundary_within("bounded", "c", lease, tiny).await.unwrap().unwrap();
    assert_eq!((env.items.len(), env.more), (1, true));
    b.release(&env.claim_id, brood::ReleaseReason::Busy, Duration::ZERO)
        .await
        .unwrap();
    let env = b.boundary("bounded", "c", lease).await.unwrap().unwrap();
    assert_eq!(
        (env.items.len(), env.more),
        (2, false),
        "the released item joins the rest"
    );
    let zero = EnvelopeLimits {
        max_items: Some(0),
        max_bytes: None,
    };
    assert!(b.boundary_within("bounded", "c", lease, zero).await.is_err());
}

#[test]
fn a_boundary_over_http_takes_max_items_and_says_more() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("h");
    s.delegate_sims("h", 3);
    // Wait until all three are ready: an unbounded look would claim them, so count instead.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, session) = s.call("GET", "/v1/sessions/h", None);
        if session["counts"]["ready"] == 3 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{session}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, env) = s.call(
        "POST",
        "/v1/sessions/h/boundary",
        Some(json!({"consumer": "t", "max_items": 2, "max_bytes": 1_000_000})),
    );
    assert_eq!(status, 200, "{env}");
    assert_eq!(
        (env["items"].as_array().unwrap().len(), &env["more"]),
        (2, &json!(true))
    );
    let (status, rest) = s.call("POST", "/v1/sessions/h/boundary", Some(json!({"consumer": "t"})));
    assert_eq!(
        (status, rest["items"].as_array().unwrap().len(), &rest["more"]),
        (200, 1, &json!(false))
    );
    assert_error(
        s.call(
            "POST",
            "/v1/sessions/h/boundary",
            Some(json!({"consumer": "t", "max_items": 0})),
        ),
        400,
        "invalid_request",
    );
}
