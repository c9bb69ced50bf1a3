//! What a client set on a session with `PUT /v1/sessions/{id}` — `addressable`, its capacity,
//! its webhook wake target — and the delivery-attempt limit it was created with survive a
//! `kill -9` and a restart of the server, on its own ledger and on PostgreSQL: a restarted
//! server shows the same settings, keeps to them, and runs a background call on an addressable
//! session in the background, as before the restart.

mod server;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server::{wake_receiver, Server};

/// A request answered 200 (or as `want`), retried while the session is between holders (503:
/// a restarted process waits out the lease of its earlier life) for up to 30 s.
fn settled(s: &Server, method: &str, path: &str, body: Option<Value>, want: u16) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, reply) = s.call(method, path, body.clone());
        if status == want {
            return reply;
        }
        assert!(
            status == 503 && Instant::now() < deadline,
            "{method} {path} answered {status}: {reply}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The settings a session's view shows.
fn settings(view: &Value) -> Value {
    json!({
        "wake_capable": view["wake_capable"],
        "addressable": view["addressable"],
        "max_concurrent_children": view["max_concurrent_children"],
        "max_delivery_attempts": view["max_delivery_attempts"],
    })
}

/// Waits until `session` runs `running` children and has `queued` more waiting.
fn wait_counts(s: &Server, session: &str, running: u64, queued: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let view = settled(s, "GET", &format!("/v1/sessions/{session}"), None, 200);
        let counts = &view["counts"];
        if counts["running"] == running && counts["queued"] == queued {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{session}: want {running} running and {queued} queued: {view}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn hang(n: usize) -> Value {
    let tasks: Vec<Value> = (0..n)
        .map(|i| json!({"goal": format!("h{i}"), "runner": {"kind": "sim", "outcome": "hang"}}))
        .collect();
    json!({"tasks": tasks, "independent_completions": true})
}

/// Sets up sessions through `before`, kills it with SIGKILL, and checks through `after` (a
/// server started again on the same ledger) that every setting held.
fn settings_survive(start: impl Fn(&[&str]) -> Server) {
    let (url, _wakes) = wake_receiver(0);
    let before = start(&["--max-delivery-attempts", "3"]);
    let put = |session: &str, body: Value| {
        let (status, reply) = before.call("PUT", &format!("/v1/sessions/{session}"), Some(body));
        assert_eq!(status, 200, "{reply}");
        reply
    };
    let polled = put("polled", json!({"addressable": true, "max_concurrent_children": 2}));
    let expected_polled = json!({
        "wake_capable": true, "addressable": true, "max_concurrent_children": 2, "max_delivery_attempts": 3,
    });
    assert_eq!(settings(&polled), expected_polled, "{polled}");
    let hooked = put("hooked", json!({"wake_url": url, "max_concurrent_children": 3}));
    let expected_hooked = json!({
        "wake_capable": true, "addressable": false, "max_concurrent_children": 3, "max_delivery_attempts": 3,
    });
    assert_eq!(settings(&hooked), expected_hooked, "{hooked}");
    // A later PUT changes one setting and keeps the others.
    let polled = put("polled", json!({"max_concurrent_children": 4}));
    let expected_polled = json!({
        "wake_capable": true, "addressable": true, "max_concurrent_children": 4, "max_delivery_attempts": 3,
    });
    assert_eq!(settings(&polled), expected_polled, "{polled}");
    let (status, _) = before.call("POST", "/v1/sessions/polled/delegate", Some(hang(1)));
    assert_eq!(status, 202);
    before.kill9();

    // Started again with the default delivery-attempt limit (8): the stored one holds.
    let after = start(&[]);
    let view = settled(&after, "GET", "/v1/sessions/polled", None, 200);
    assert_eq!(settings(&view), expected_polled, "{view}");
    let view = settled(&after, "GET", "/v1/sessions/hooked", None, 200);
    assert_eq!(settings(&view), expected_hooked, "{view}");
    // A background call on the addressable session runs in the background, not forced to
    // sync (which would hold this request until its hanging children ended)...
    let reply = settled(&after, "POST", "/v1/sessions/polled/delegate", Some(hang(6)), 202);
    assert_eq!(reply["mode"], "background", "{reply}");
    // ...and within the stored capacity: 4 running (the child of before the kill ended
    // `unknown` at recovery), the rest waiting.
    wait_counts(&after, "polled", 4, 2);
    let reply = settled(&after, "POST", "/v1/sessions/hooked/delegate", Some(hang(4)), 202);
    assert_eq!(reply["mode"], "background", "{reply}");
    wait_counts(&after, "hooked", 3, 1);
}

#[test]
fn settings_put_on_a_session_survive_a_kill9_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    settings_survive(|flags| Server::start_with(dir.path(), None, flags));
}

#[test]
fn settings_put_on_a_session_survive_a_kill9_and_a_restart_on_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let start = |flags: &[&str]| {
        let mut all = vec!["--ledger", url.as_str(), "--node", "a", "--session-lease-ms", "2000"];
        all.extend_from_slice(flags);
        Server::start_with(Path::new(dir.path()), None, &all)
    };
    settings_survive(start);
}

#[test]
fn taking_addressable_back_forces_background_calls_to_sync_again() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    let (status, reply) = s.call("PUT", "/v1/sessions/t", Some(json!({"addressable": true})));
    assert_eq!((status, &reply["wake_capable"]), (200, &json!(true)), "{reply}");
    let (status, reply) = s.call("PUT", "/v1/sessions/t", Some(json!({"addressable": false})));
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        (&reply["wake_capable"], &reply["addressable"]),
        (&json!(false), &json!(false)),
        "{reply}"
    );
    s.kill9();
    let s = Server::start(dir.path(), None);
    let (status, reply) = s.call(
        "POST",
        "/v1/sessions/t/delegate",
        Some(json!({"tasks": [{"goal": "g", "runner": {"kind": "sim", "ms": 0}}]})),
    );
    assert_eq!((status, reply["mode"].as_str()), (200, Some("sync")), "{reply}");
}
