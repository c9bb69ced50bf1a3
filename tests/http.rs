//! `brood serve` over HTTP: the real binary on a loopback port with a temporary data folder,
//! driven as any client of API.md would drive it — delegate → boundary → ack, release and
//! re-coalesce, forced sync, a lost claim, auth, every kind of bad input (each answered in
//! API.md's error shape, changing nothing), kill -9 and a restart with the results intact, and a
//! configuration refused at start.

use std::io::{BufRead as _, BufReader};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod server;
use server::*;

#[test]
fn delegate_boundary_ack_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("chat");
    let (status, reply) = s.call(
        "POST",
        "/v1/sessions/chat/delegate",
        Some(json!({"tasks": [{"goal": "a", "runner": sim(0)}, {"goal": "b", "runner": sim(10)}]})),
    );
    assert_eq!(status, 202, "{reply}");
    assert_eq!(reply["mode"], "background");
    assert_eq!(reply["set"], 1);
    assert!(reply["call_id"].as_str().unwrap().starts_with("deleg_"));
    assert!(reply["note"].as_str().unwrap().contains("set 1"), "{reply}");
    let env = s.envelope("chat", 30_000);
    let items = env["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["status"], "succeeded");
    assert_eq!(items[0]["kind"], "result");
    assert!(env["text"].as_str().unwrap().contains("[set 1 · 1/2]"), "{env}");
    let claim = env["claim_id"].as_str().unwrap();
    let (status, acked) = s.call("POST", &format!("/v1/claims/{claim}/ack"), None);
    assert_eq!((status, acked["delivered"].as_u64()), (200, Some(2)));
    // Acking again answers the same; nothing is ready any more.
    let (status, acked) = s.call("POST", &format!("/v1/claims/{claim}/ack"), None);
    assert_eq!((status, acked["delivered"].as_u64()), (200, Some(2)));
    let (status, _) = s.call("POST", "/v1/sessions/chat/boundary", Some(json!({"consumer": "t"})));
    assert_eq!(status, 204);
    let (status, view) = s.call("GET", "/v1/sessions/chat", None);
    assert_eq!(status, 200);
    assert_eq!(view["counts"]["delivered"], 2, "{view}");
}

#[test]
fn a_session_without_wake_capability_runs_its_calls_synchronously() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    let (status, _) = s.call("PUT", "/v1/sessions/plain", Some(json!({})));
    assert_eq!(status, 200);
    let (status, reply) = s.call(
        "POST",
        "/v1/sessions/plain/delegate",
        Some(json!({"tasks": [{"goal": "a", "runner": sim(0)}]})),
    );
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["mode"], "sync");
    assert!(reply["forced_sync_reason"].as_str().unwrap().contains("wake"));
    assert_eq!(reply["results"][0]["status"], "succeeded");
}

#[test]
fn a_released_claim_recoalesces_and_a_lost_one_refuses_its_ack() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("r");
    s.call(
        "POST",
        "/v1/sessions/r/delegate",
        Some(json!({"tasks": [{"goal": "a", "runner": sim(0)}]})),
    );
    let env = s.envelope("r", 30_000);
    let claim = env["claim_id"].as_str().unwrap().to_string();
    let (status, _) = s.call(
        "POST",
        &format!("/v1/claims/{claim}/release"),
        Some(json!({"reason": "busy"})),
    );
    assert_eq!(status, 200);
    let again = s.envelope("r", 100);
    assert_eq!(again["items"][0]["dedup_key"], env["items"][0]["dedup_key"]);
    assert_eq!(again["items"][0]["delivery_attempt"], 1, "busy is not an attempt");
    let lost = again["claim_id"].as_str().unwrap().to_string();
    std::thread::sleep(Duration::from_millis(300));
    assert_error(
        s.call("POST", &format!("/v1/claims/{lost}/ack"), None),
        409,
        "claim_lost",
    );
    let third = s.envelope("r", 30_000);
    assert_eq!(third["items"][0]["delivery_attempt"], 2, "a lease expiry is an attempt");
}

#[test]
fn a_boundary_acks_the_claim_it_names_first_and_claims_nothing_when_that_ack_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("k");
    s.open("other");
    let three = json!({"tasks": [{"goal": "a", "runner": sim(0)}, {"goal": "b", "runner": sim(0)}, {"goal": "c", "runner": sim(0)}],
        "independent_completions": true});
    let (status, reply) = s.call("POST", "/v1/sessions/k/delegate", Some(three));
    assert_eq!(status, 202, "{reply}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.call("GET", "/v1/sessions/k", None).1["counts"]["ready"] != 3 {
        assert!(Instant::now() < deadline, "the three results did not get ready");
        std::thread::sleep(Duration::from_millis(10));
    }
    let boundary = |body: Value| s.call("POST", "/v1/sessions/k/boundary", Some(body));
    let (status, first) = boundary(json!({"consumer": "c", "max_items": 1}));
    assert_eq!(status, 200, "{first}");
    let first_claim = first["claim_id"].as_str().unwrap().to_string();
    // Bad input (a claim of another session, a blank id) acks nothing and claims nothing.
    let (status, elsewhere) = s.call(
        "POST",
        "/v1/sessions/other/delegate",
        Some(json!({"tasks": [{"goal": "x", "runner": sim(0)}]})),
    );
    assert_eq!(status, 202, "{elsewhere}");
    let other_env = s.envelope("other", 30_000);
    let other_claim = other_env["claim_id"].as_str().unwrap();
    let m = assert_error(
        boundary(json!({"consumer": "c", "ack": other_claim})),
        400,
        "invalid_request",
    );
    assert!(m.contains("`ack`") && m.contains("other"), "{m}");
    assert_error(boundary(json!({"consumer": "c", "ack": ""})), 400, "invalid_request");
    let (_, view) = s.call("GET", "/v1/sessions/k", None);
    assert_eq!(
        (view["counts"]["ready"].as_u64(), view["counts"]["delivered"].as_u64()),
        (Some(2), Some(0)),
        "{view}"
    );
    let (_, view) = s.call("GET", "/v1/sessions/other", None);
    assert_eq!(view["counts"]["delivered"], 0, "{view}");
    // An ack and the next claim in one request.
    let (status, second) = boundary(json!({"consumer": "c", "max_items": 1, "ack": first_claim}));
    assert_eq!(status, 200, "{second}");
    assert_ne!(second["items"][0]["dedup_key"], first["items"][0]["dedup_key"]);
    let (status, acked) = s.call("POST", &format!("/v1/claims/{first_claim}/ack"), None);
    assert_eq!(
        (status, acked["delivered"].as_u64()),
        (200, Some(1)),
        "the boundary acked the first claim"
    );
    // A lost claim: its error is the answer, and what is ready stays ready.
    let second_claim = second["claim_id"].as_str().unwrap().to_string();
    let (status, _) = s.call(
        "POST",
        &format!("/v1/claims/{second_claim}/release"),
        Some(json!({"reason": "busy"})),
    );
    assert_eq!(status, 200);
    assert_error(
        boundary(json!({"consumer": "c", "ack": second_claim})),
        409,
        "claim_lost",
    );
    assert_error(
        boundary(json!({"consumer": "c", "ack": "clm_6b_ffffffffffffffffffff"})),
        404,
        "unknown_claim",
    );
    let (_, view) = s.call("GET", "/v1/sessions/k", None);
    assert_eq!(
        (view["counts"]["ready"].as_u64(), view["counts"]["claimed"].as_u64()),
        (Some(2), Some(0)),
        "{view}"
    );
    // The last: acked by a boundary that then finds nothing.
    let (status, rest) = boundary(json!({"consumer": "c"}));
    assert_eq!(status, 200, "{rest}");
    let (status, _) = boundary(json!({"consumer": "c", "ack": rest["claim_id"]}));
    assert_eq!(status, 204);
    let (_, view) = s.call("GET", "/v1/sessions/k", None);
    assert_eq!(view["counts"]["delivered"], 3, "{view}");
}

#[test]
fn bad_input_gets_the_error_shape_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("b");
    let delegate = "/v1/sessions/b/delegate";
    let raw = |body: &[u8]| s.raw("POST", delegate, Some(body.to_vec()), None);
    let m = assert_error(raw(b"{not json"), 400, "invalid_request");
    assert!(m.contains("not valid JSON"), "{m}");
    let m = assert_error(s.call("POST", delegate, Some(json!({}))), 400, "invalid_request");
    assert!(m.contains("tasks"), "{m}");
    assert_error(
        s.call("POST", delegate, Some(json!({"tasks": []}))),
        400,
        "invalid_request",
    );
    let m = assert_error(
        s.call(
            "POST",
            delegate,
            Some(json!({"tasks": [{"goal": 5, "runner": sim(0)}]})),
        ),
        400,
        "invalid_request",
    );
    assert!(m.contains("tasks[0].goal"), "{m}");
    let m = assert_error(
        s.call(
            "POST",
            delegate,
            Some(json!({"tasks": [{"goal": "g", "runner": {"kind": "nope"}}]})),
        ),
        400,
        "invalid_request",
    );
    assert!(m.contains("unknown runner kind"), "{m}");
    assert_error(
        s.call(
            "POST",
            delegate,
            Some(json!({"tasks": [{"goal": "g", "runner": sim(0), "colour": 1}]})),
        ),
        400,
        "invalid_request",
    );
    assert_error(
        s.call(
            "POST",
            delegate,
            Some(json!({"tasks": [{"goal": "g", "runner": {"kind": "command", "argv": ["true"]}}]})),
        ),
        403,
        "runner_not_allowed",
    );
    assert_error(
        s.call(
            "POST",
            delegate,
            Some(json!({"tasks": [{"goal": "g", "runner": sim(0), "timeout_ms": 0}]})),
        ),
        400,
        "invalid_request",
    );
    assert_error(
        s.call(
            "POST",
            "/v1/sessions/b/boundary",
            Some(json!({"consumer": "c", "lease_ms": 99})),
        ),
        400,
        "invalid_request",
    );
    assert_error(
        s.call("POST", "/v1/sessions/b/boundary", Some(json!({"lease_ms": 1000}))),
        400,
        "invalid_request",
    );
    assert_error(
        s.call("POST", "/v1/sessions/b/turn", Some(json!({"state": "asleep"}))),
        400,
        "invalid_request",
    );
    assert_error(
        s.call(
            "POST",
            "/v1/sessions/nobody/delegate",
            Some(json!({"tasks": [{"goal": "g", "runner": sim(0)}]})),
        ),
        404,
        "unknown_session",
    );
    assert_error(s.call("POST", "/v1/claims/clm_nope/ack", None), 404, "unknown_claim");
    assert_error(
        s.call("PUT", "/v1/sessions/bad%01id", Some(json!({}))),
        400,
        "invalid_request",
    );
    assert_error(s.call("GET", "/v1/nothing-here", None), 404, "not_found");
    let big = vec![b' '; 8 * 1024 * 1024 + 1];
    assert_error(s.raw("POST", delegate, Some(big), None), 413, "body_too_large");
    // Nothing above used a set number.
    let (status, reply) = s.call(
        "POST",
        delegate,
        Some(json!({"tasks": [{"goal": "g", "runner": sim(0)}]})),
    );
    assert_eq!((status, reply["set"].as_u64()), (202, Some(1)), "{reply}");
}

#[test]
fn with_a_key_every_v1_request_needs_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Some("s3cret"));
    let put = |key: Option<&str>| s.raw("PUT", "/v1/sessions/k", Some(b"{}".to_vec()), key);
    assert_error(put(None), 401, "unauthorized");
    assert_error(put(Some("s3creT")), 401, "unauthorized");
    assert_eq!(put(Some("s3cret")).0, 200);
    let (status, _) = s.raw("GET", "/healthz", None, None);
    assert_eq!(status, 200, "health needs no key");
}

#[test]
fn results_survive_kill9_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("k");
    let (_, reply) = s.call(
        "POST",
        "/v1/sessions/k/delegate",
        Some(json!({"tasks": [{"goal": "a", "runner": sim(0)}, {"goal": "b", "runner": sim(0)}], "independent_completions": true})),
    );
    let call = reply["call_id"].as_str().unwrap().to_string();
    // Both results recorded (ready), one of them handed out and acked, then kill -9.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, view) = s.call("GET", "/v1/sessions/k", None);
        if view["counts"]["ready"] == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "{view}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let env = s.envelope("k", 30_000);
    let claim = env["claim_id"].as_str().unwrap().to_string();
    assert_eq!(s.call("POST", &format!("/v1/claims/{claim}/ack"), None).0, 200);
    s.kill9();
    let s = Server::start(dir.path(), None);
    s.open("k");
    // The acked claim stays acked; nothing is delivered again, and the set goes on.
    let (status, acked) = s.call("POST", &format!("/v1/claims/{claim}/ack"), None);
    assert_eq!((status, acked["delivered"].as_u64()), (200, Some(2)), "{acked}");
    let (status, _) = s.call("POST", "/v1/sessions/k/boundary", Some(json!({"consumer": "t"})));
    assert_eq!(status, 204);
    let (_, next) = s.call(
        "POST",
        "/v1/sessions/k/delegate",
        Some(json!({"tasks": [{"goal": "c", "runner": sim(0)}]})),
    );
    assert_eq!(next["set"], 2);
    assert_ne!(next["call_id"], call);
}

#[test]
fn a_configuration_error_stops_the_start_and_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("brood.toml");
    std::fs::write(&file, "max_delivery_attempts = 0\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_brood"))
        .args(["serve", "--config"])
        .arg(&file)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("max_delivery_attempts") && err.contains("brood.toml") && err.contains("from 1 to 1000"),
        "{err}"
    );
}

fn wait_wakes(seen: &Arc<Mutex<Vec<Value>>>, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = seen.lock().unwrap().clone();
        if got.len() >= n {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {n} wakes arrived: {got:?}",
            got.len()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_wake_url_is_posted_once_per_idle_period_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (url, seen) = wake_receiver(0);
    let s = Server::start(dir.path(), None);
    let (status, body) = s.call("PUT", "/v1/sessions/w", Some(json!({"wake_url": url})));
    assert_eq!((status, &body["wake_capable"]), (200, &json!(true)), "{body}");
    let (status, reply) = s.call(
        "POST",
        "/v1/sessions/w/delegate",
        Some(json!({"tasks": [{"goal": "a", "runner": sim(0)}, {"goal": "b", "runner": sim(30)}], "independent_completions": true})),
    );
    assert_eq!((status, reply["mode"].as_str()), (202, Some("background")), "{reply}");
    let wakes = wait_wakes(&seen, 1);
    assert_eq!(wakes[0]["session_id"], "w");
    assert!(wakes[0]["ready"].as_u64().unwrap() >= 1);
    // Both results ready: still one wake in this idle period.
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.call("GET", "/v1/sessions/w", None).1["counts"]["ready"] != 2 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "one wake however many items land meanwhile"
    );
    let env = s.envelope("w", 30_000);
    s.call(
        "POST",
        &format!("/v1/claims/{}/ack", env["claim_id"].as_str().unwrap()),
        None,
    );
    s.kill9();
    // The wake_url is stored with the session: a restarted server wakes it without a new PUT.
    let s = Server::start(dir.path(), None);
    let (_, view) = s.call("GET", "/v1/sessions/w", None);
    assert_eq!(view["wake_capable"], true, "{view}");
    s.call(
        "POST",
        "/v1/sessions/w/delegate",
        Some(json!({"tasks": [{"goal": "c", "runner": sim(0)}]})),
    );
    let wakes = wait_wakes(&seen, 2);
    assert_eq!(wakes[1]["session_id"], "w");
    let (_, bad) = s.call(
        "PUT",
        "/v1/sessions/w",
        Some(json!({"wake_url": "https://example.test/"})),
    );
    assert!(bad["error"]["message"].as_str().unwrap().contains("https"), "{bad}");
}

#[test]
fn sigterm_stops_the_server_with_exit_0_and_keeps_what_was_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("g");
    s.call(
        "POST",
        "/v1/sessions/g/delegate",
        Some(json!({"tasks": [{"goal": "a", "runner": sim(0)}, {"goal": "b", "runner": sim(0)}]})),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.call("GET", "/v1/sessions/g", None).1["counts"]["ready"] != 2 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = s.terminate();
    assert!(
        status.success(),
        "SIGTERM must end brood serve with exit 0, got {status}"
    );
    let s = Server::start(dir.path(), None);
    s.open("g");
    let env = s.envelope("g", 30_000);
    assert_eq!(env["items"].as_array().unwrap().len(), 2);
}

/// Reads a server-sent event stream on a thread of its own: each event as (name, data).
fn sse_reader(s: &Server, session: &str) -> std::sync::mpsc::Receiver<(String, Value)> {
    let mut response = s
        .agent
        .get(&format!("{}/v1/sessions/{session}/events", s.base))
        .call()
        .expect("open the event stream");
    assert_eq!(response.status(), 200);
    let content_type = response
        .headers()
        .get("content-type")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert!(content_type.starts_with("text/event-stream"), "{content_type}");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let reader = BufReader::new(response.body_mut().as_reader());
        let mut name = String::new();
        for line in reader.lines() {
            let Ok(line) = line else { return };
            if let Some(n) = line.strip_prefix("event: ") {
                name = n.to_string();
            } else if let Some(d) = line.strip_prefix("data: ") {
                let data: Value = serde_json::from_str(d).expect("event data is JSON");
                if tx.send((name.clone(), data)).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

#[test]
fn the_event_stream_tells_a_child_from_queued_to_its_acked_claim() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("sse");
    assert_error(
        s.call("GET", "/v1/sessions/nobody/events", None),
        404,
        "unknown_session",
    );
    let events = sse_reader(&s, "sse");
    let (first, data) = events.recv_timeout(Duration::from_secs(20)).expect("the opening event");
    assert_eq!(
        (first.as_str(), &data["ready"], &data["seq"]),
        ("ready", &json!(0), &json!(0))
    );
    let (status, reply) = s.call(
        "POST",
        "/v1/sessions/sse/delegate",
        Some(json!({"tasks": [{"goal": "ok", "runner": sim(300)}, {"goal": "bad", "runner": {"kind": "sim", "outcome": "fail"}}]})),
    );
    assert_eq!(status, 202, "{reply}");
    let call = reply["call_id"].as_str().unwrap().to_string();
    let mut seen: Vec<(String, Value)> = Vec::new();
    type Seen = Vec<(String, Value)>;
    let until = |seen: &mut Seen, what: &str, done: &dyn Fn(&Seen) -> bool| {
        while !done(seen) {
            match events.recv_timeout(Duration::from_secs(20)) {
                Ok(ev) => seen.push(ev),
                Err(_) => panic!("no {what} in 20 s; seen: {seen:?}"),
            }
        }
    };
    let ok_child = format!("{call}.0");
    until(&mut seen, "the whole unit ready", &|ev| {
        ev.iter()
            .position(|(n, d)| n == "child" && d["child_id"] == ok_child.as_str() && d["status"] == "succeeded")
            .is_some_and(|at| ev[at..].iter().any(|(n, _)| n == "ready"))
    });
    let statuses = |child: &str| -> Vec<String> {
        seen.iter()
            .filter(|(n, d)| n == "child" && d["child_id"] == child)
            .map(|(_, d)| d["status"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(statuses(&format!("{call}.0")), ["queued", "running", "succeeded"]);
    assert_eq!(statuses(&format!("{call}.1")), ["queued", "running", "failed"]);
    let notice = seen
        .iter()
        .find(|(n, _)| n == "failure_notice")
        .expect("a failure notice event");
    assert_eq!(notice.1["child_id"], format!("{call}.1"));
    assert_eq!(notice.1["session_id"], "sse");
    // A boundary and its ack are told as claim events.
    let env = s.envelope("sse", 30_000);
    let (status, _) = s.call(
        "POST",
        &format!("/v1/claims/{}/ack", env["claim_id"].as_str().unwrap()),
        None,
    );
    assert_eq!(status, 200);
    until(&mut seen, "an acked claim", &|ev| {
        ev.iter().any(|(n, d)| n == "claim" && d["change"] == "acked")
    });
    let changes: Vec<&Value> = seen
        .iter()
        .filter(|(n, _)| n == "claim")
        .map(|(_, d)| &d["change"])
        .collect();
    assert_eq!(changes, [&json!("claimed"), &json!("acked")]);
    // Events are numbered in order, from 1 after the opening one.
    let seqs: Vec<u64> = seen.iter().map(|(_, d)| d["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
}

#[test]
fn a_drain_lets_running_children_finish_refuses_new_calls_and_keeps_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), None, &["--drain-timeout-ms", "60000"]);
    let (status, body) = s.call(
        "PUT",
        "/v1/sessions/d",
        Some(json!({"addressable": true, "max_concurrent_children": 1})),
    );
    assert_eq!(status, 200, "{body}");
    // One slot: the first child runs for a while, the second waits in the queue.
    let (status, reply) = s.call(
        "POST",
        "/v1/sessions/d/delegate",
        Some(
            json!({"tasks": [{"goal": "long", "runner": sim(3000)}, {"goal": "next", "runner": sim(0)}],
                    "independent_completions": true}),
        ),
    );
    assert_eq!(status, 202, "{reply}");
    let call = reply["call_id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.call("GET", "/v1/sessions/d", None).1["counts"]["running"] != 1 {
        assert!(Instant::now() < deadline, "the first child never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    s.sigterm();
    // Draining: a new call is refused with 503, and the running child is still running.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let reply = s.call(
            "POST",
            "/v1/sessions/d/delegate",
            Some(json!({"tasks": [{"goal": "late", "runner": sim(0)}]})),
        );
        if reply.0 == 503 {
            assert_error(reply, 503, "draining");
            break;
        }
        assert_eq!(reply.0, 202, "before the drain began: {}", reply.1);
        assert!(Instant::now() < deadline, "the server never began to drain");
        std::thread::sleep(Duration::from_millis(10));
    }
    let status = s.wait_exit();
    assert!(status.success(), "a drained stop exits 0, got {status}");

    // The running child finished during the drain and its result was recorded as it was; the
    // queued one never started then, and runs after the restart.
    let s = Server::start(dir.path(), None);
    s.open("d");
    let mut items = Vec::new();
    while items.len() < 2 {
        let env = s.envelope("d", 30_000);
        items.extend(
            env["items"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|i| i["call_id"] == call.as_str())
                .cloned(),
        );
        s.call(
            "POST",
            &format!("/v1/claims/{}/ack", env["claim_id"].as_str().unwrap()),
            None,
        );
    }
    items.sort_by_key(|i| i["task_index"].as_u64());
    assert_eq!(items[0]["status"], "succeeded", "{items:?}");
    assert_eq!(items[0]["recovered"], false, "it ended before the stop: {items:?}");
    assert_eq!(items[1]["status"], "succeeded", "{items:?}");
    assert_eq!(
        items[1]["recovered"], false,
        "a child that never started is simply run: {items:?}"
    );
}

#[test]
fn a_task_without_a_timeout_gets_the_configured_default() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), None, &["--default-timeout-ms", "300"]);
    s.open("t");
    let (status, reply) = s.call(
        "POST",
        "/v1/sessions/t/delegate",
        Some(json!({"tasks": [
            {"goal": "silent", "runner": {"kind": "sim", "outcome": "hang"}},
            {"goal": "quick", "runner": sim(0), "timeout_ms": 600000}
        ], "independent_completions": true})),
    );
    assert_eq!(status, 202, "{reply}");
    let mut statuses = std::collections::BTreeMap::new();
    while statuses.len() < 2 {
        let env = s.envelope("t", 30_000);
        for item in env["items"].as_array().unwrap() {
            statuses.insert(
                item["task_index"].as_u64().unwrap(),
                item["status"].as_str().unwrap().to_string(),
            );
        }
        s.call(
            "POST",
            &format!("/v1/claims/{}/ack", env["claim_id"].as_str().unwrap()),
            None,
        );
    }
    assert_eq!(statuses[&0], "timed_out", "the default timeout ended the silent child");
    assert_eq!(statuses[&1], "succeeded");
}

#[test]
fn competing_consumers_each_get_an_item_at_most_once() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("race");
    let n = 60;
    let tasks: Vec<Value> = (0..n)
        .map(|i| json!({"goal": format!("t{i}"), "runner": sim(i % 5 * 10)}))
        .collect();
    let (status, reply) = s.call(
        "POST",
        "/v1/sessions/race/delegate",
        Some(json!({"tasks": tasks, "independent_completions": true})),
    );
    assert_eq!(status, 202, "{reply}");
    let taken: Mutex<Vec<String>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for consumer in ["cli", "gateway", "tui"] {
            let (s, taken) = (&s, &taken);
            scope.spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(30);
                while taken.lock().unwrap().len() < n as usize {
                    assert!(Instant::now() < deadline, "{consumer}: not every item came in 30 s");
                    let (status, env) = s.call(
                        "POST",
                        "/v1/sessions/race/boundary",
                        Some(json!({"consumer": consumer, "lease_ms": 30000})),
                    );
                    match status {
                        204 => std::thread::sleep(Duration::from_millis(5)),
                        200 => {
                            let (status, acked) = s.call(
                                "POST",
                                &format!("/v1/claims/{}/ack", env["claim_id"].as_str().unwrap()),
                                None,
                            );
                            assert_eq!(status, 200, "{acked}");
                            let keys = env["items"]
                                .as_array()
                                .unwrap()
                                .iter()
                                .map(|i| i["dedup_key"].as_str().unwrap().to_string());
                            taken.lock().unwrap().extend(keys);
                        }
                        s => panic!("{consumer}: boundary answered {s}: {env}"),
                    }
                }
            });
        }
    });
    let mut keys = taken.into_inner().unwrap();
    let total = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), total, "an item was handed to two consumers");
    assert_eq!(total, n as usize);
}

#[test]
fn a_server_on_postgres_keeps_results_and_acks_across_kill9() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let flags = ["--ledger", &url, "--node", "n1", "--session-lease-ms", "1000"];
    let s = Server::start_with(dir.path(), None, &flags);
    s.open("k");
    let (_, reply) = s.call(
        "POST",
        "/v1/sessions/k/delegate",
        Some(json!({"tasks": [{"goal": "a", "runner": sim(0)}, {"goal": "b", "runner": sim(0)}, {"goal": "c", "runner": sim(0)}], "independent_completions": true})),
    );
    assert!(reply["call_id"].is_string(), "{reply}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, view) = s.call("GET", "/v1/sessions/k", None);
        if view["counts"]["ready"] == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "{view}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let env = s.envelope("k", 30_000);
    let claim = env["claim_id"].as_str().unwrap().to_string();
    assert_eq!(env["items"].as_array().map(Vec::len), Some(3), "{env}");
    assert_eq!(s.call("POST", &format!("/v1/claims/{claim}/ack"), None).0, 200);
    s.kill9();
    // Nothing was in the folder: everything came back from PostgreSQL.
    assert!(!dir.path().join("db").exists() && !dir.path().join("conf").exists());
    let s = Server::start_with(dir.path(), None, &flags);
    // The killed process's lease runs out first (its instance might have been alive still):
    // until then the session is named as served at the old address, which answers nothing.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = s.call("PUT", "/v1/sessions/k", Some(json!({"addressable": true})));
        if status == 200 {
            break;
        }
        assert_eq!(body["error"]["code"], "session_moved", "{body}");
        assert!(Instant::now() < deadline, "the session was never taken back: {body}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, acked) = s.call("POST", &format!("/v1/claims/{claim}/ack"), None);
    assert_eq!((status, acked["delivered"].as_u64()), (200, Some(3)), "{acked}");
    let (status, _) = s.call("POST", "/v1/sessions/k/boundary", Some(json!({"consumer": "t"})));
    assert_eq!(status, 204, "nothing acked is delivered again");
    let (_, next) = s.call(
        "POST",
        "/v1/sessions/k/delegate",
        Some(json!({"tasks": [{"goal": "d", "runner": sim(0)}]})),
    );
    assert_eq!(next["set"], 2);
}

#[test]
fn a_ledger_address_that_is_not_postgres_is_refused_at_start() {
    let out = Command::new(env!("CARGO_BIN_EXE_brood"))
        .args(["serve", "--ledger", "mysql://somewhere/db", "--print-config"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ledger") && err.contains("postgres://"), "{err}");
}
