//! Bounded resources of `brood serve`: the tasks of one call (`max_tasks_per_call`), the
//! capacity a session may ask for (`max_session_capacity`), the children live over every
//! session (`max_live_children`), and the time a request's body may take to arrive
//! (`body_timeout_ms`). Each bound refuses what is over it in API.md's error shape and stores
//! nothing.

mod server;

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server::{assert_error, sim, Server};

const KEY: &str = "bounds-key";

fn tasks(n: usize, ms: u64) -> Value {
    let tasks: Vec<Value> = (0..n)
        .map(|i| json!({"goal": format!("t{i}"), "runner": sim(ms)}))
        .collect();
    json!({"tasks": tasks, "independent_completions": true})
}

fn calls(s: &Server, session: &str) -> Vec<Value> {
    let (status, body) = s.call("GET", &format!("/v1/sessions/{session}"), None);
    assert_eq!(status, 200, "{body}");
    body["calls"].as_array().cloned().unwrap_or_default()
}

#[test]
fn a_call_over_max_tasks_per_call_is_refused_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), Some(KEY), &["--max-tasks-per-call", "5"]);
    s.open("s");
    let message = assert_error(
        s.call("POST", "/v1/sessions/s/delegate", Some(tasks(6, 0))),
        400,
        "too_many_tasks",
    );
    assert!(
        message.contains("max_tasks_per_call") && message.contains('5') && message.contains('6'),
        "{message}"
    );
    assert!(calls(&s, "s").is_empty(), "a refused call is not stored");
    let (status, reply) = s.call("POST", "/v1/sessions/s/delegate", Some(tasks(5, 0)));
    assert_eq!(status, 202, "exactly the limit is accepted: {reply}");
    assert_eq!(reply["set"], 1, "the refused call used no set number: {reply}");
}

#[test]
fn a_put_over_max_session_capacity_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), Some(KEY), &["--max-session-capacity", "16"]);
    s.open("s");
    let message = assert_error(
        s.call("PUT", "/v1/sessions/s", Some(json!({"max_concurrent_children": 17}))),
        400,
        "invalid_request",
    );
    assert!(
        message.contains("max_session_capacity") && message.contains("16"),
        "{message}"
    );
    let (_, body) = s.call("GET", "/v1/sessions/s", None);
    assert_eq!(body["max_concurrent_children"], 8, "unchanged: {body}");
    let (status, body) = s.call("PUT", "/v1/sessions/s", Some(json!({"max_concurrent_children": 16})));
    assert_eq!((status, &body["max_concurrent_children"]), (200, &json!(16)), "{body}");
}

#[test]
fn a_session_cannot_raise_its_capacity_to_millions_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Some(KEY));
    let message = assert_error(
        s.call(
            "PUT",
            "/v1/sessions/big",
            Some(json!({"max_concurrent_children": 4_000_000})),
        ),
        400,
        "invalid_request",
    );
    assert!(message.contains("max_session_capacity"), "{message}");
    let (status, _) = s.call("GET", "/v1/sessions/big", None);
    assert_eq!(status, 404, "a refused PUT creates no session");
}

#[test]
fn a_default_capacity_over_max_session_capacity_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_brood"))
        .args(["serve", "--print-config", "--data-dir"])
        .arg(dir.path())
        .args(["--max-concurrent-children", "32", "--max-session-capacity", "16"])
        .env_remove("BROOD_API_KEY")
        .output()
        .expect("run brood serve --print-config");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "refused: {stderr}");
    assert!(
        stderr.contains("max_concurrent_children") && stderr.contains("max_session_capacity"),
        "{stderr}"
    );
}

#[test]
fn a_delegate_over_max_live_children_is_refused_until_children_end() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), Some(KEY), &["--max-live-children", "10"]);
    s.open("a");
    s.open("b");
    let (status, first) = s.call("POST", "/v1/sessions/a/delegate", Some(tasks(8, 600_000)));
    assert_eq!(status, 202, "{first}");
    // Another session: the bound is the server's, over every session.
    let message = assert_error(
        s.call("POST", "/v1/sessions/b/delegate", Some(tasks(5, 0))),
        503,
        "server_full",
    );
    assert!(
        message.contains("max_live_children") && message.contains("10"),
        "{message}"
    );
    assert!(calls(&s, "b").is_empty(), "a refused call is not stored");
    let call = first["call_id"].as_str().unwrap();
    let (status, cancelled) = s.call("POST", &format!("/v1/calls/{call}/cancel"), None);
    assert_eq!(status, 200, "{cancelled}");
    // The cancelled children leave the count as their ends are recorded.
    let deadline = Instant::now() + Duration::from_secs(30);
    let reply = loop {
        let (status, reply) = s.call("POST", "/v1/sessions/b/delegate", Some(tasks(5, 0)));
        match status {
            202 => break reply,
            503 => assert!(
                Instant::now() < deadline,
                "still refused 30 s after the cancel: {reply}"
            ),
            _ => panic!("{status}: {reply}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(reply["set"], 1, "the refused calls used no set number: {reply}");
}

/// Sends the head of `method path` announcing a body of `length` bytes (or a chunked one),
/// then one byte a second; returns what the server answered (read until it closed, or until a
/// whole error reply came when `until_reply`), and how many body bytes were sent by then. The
/// connection is given up after 60 s.
fn trickle(s: &Server, method: &str, path: &str, length: usize, chunked: bool, until_reply: bool) -> (String, usize) {
    trickle_as(s, Some(KEY), method, path, length, chunked, until_reply)
}

/// As [`trickle`], with `key` (or none) as the request's key.
fn trickle_as(
    s: &Server,
    key: Option<&str>,
    method: &str,
    path: &str,
    length: usize,
    chunked: bool,
    until_reply: bool,
) -> (String, usize) {
    let address = s.base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).unwrap();
    let framing = if chunked {
        "Transfer-Encoding: chunked".to_string()
    } else {
        format!("Content-Length: {length}")
    };
    let authorization = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\n{authorization}\
         Content-Type: application/json\r\n{framing}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = sent.clone();
    let trickler = std::thread::spawn(move || {
        for _ in 0..length {
            let byte: &[u8] = if chunked { b"1\r\n \r\n" } else { b" " };
            if writer.write_all(byte).is_err() {
                return;
            }
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                answer.extend_from_slice(&buf[..n]);
                if until_reply && answer.ends_with(b"}}") {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!(
                "{method} {path}: not answered and closed within 60 s ({e}); so far: {:?}",
                String::from_utf8_lossy(&answer)
            ),
        }
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
    let _ = trickler.join();
    (
        String::from_utf8_lossy(&answer).into_owned(),
        sent.load(std::sync::atomic::Ordering::SeqCst),
    )
}

const TRICKLED: [(&str, &str); 4] = [
    ("POST", "/v1/sessions/s/delegate"),
    ("PUT", "/v1/sessions/s"),
    ("POST", "/v1/claims/no-such-claim/ack"),
    ("POST", "/v1/workers/poll"),
];

#[test]
fn a_trickled_body_is_answered_408_and_closed_on_every_route() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), Some(KEY), &["--body-timeout-ms", "1000"]);
    s.open("s");
    for (method, path) in TRICKLED {
        let (answer, sent) = trickle(&s, method, path, 1_000, false, false);
        assert!(answer.starts_with("HTTP/1.1 408"), "{method} {path}: {answer:?}");
        assert!(answer.contains("body_timeout"), "{method} {path}: {answer:?}");
        assert!(sent < 1_000, "{method} {path}: answered only once the body was whole");
    }
    let (status, body) = s.call("GET", "/v1/sessions/s", None);
    assert_eq!(status, 200, "the server still serves: {body}");
}

/// A chunked body is answered alike, and its connection closed too: actix-web reads on what is
/// left of a chunked body nobody holds, so the reply holds it until it is sent.
#[test]
fn a_trickled_chunked_body_is_answered_408_and_closed_on_every_route() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), Some(KEY), &["--body-timeout-ms", "1000"]);
    s.open("s");
    for (method, path) in TRICKLED {
        let (answer, sent) = trickle(&s, method, path, 1_000, true, false);
        assert!(answer.starts_with("HTTP/1.1 408"), "{method} {path}: {answer:?}");
        assert!(answer.contains("body_timeout"), "{method} {path}: {answer:?}");
        assert!(sent < 1_000, "{method} {path}: answered only once the body was whole");
    }
    let (status, body) = s.call("GET", "/v1/sessions/s", None);
    assert_eq!(status, 200, "the server still serves: {body}");
}

/// A body nobody reads (the key is missing, or the route takes none) does not hold its
/// connection either, chunked or not.
#[test]
fn a_trickled_body_that_is_refused_or_not_read_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), Some(KEY), &["--body-timeout-ms", "1000"]);
    for chunked in [true, false] {
        let (answer, sent) = trickle_as(&s, None, "POST", "/v1/sessions/s/delegate", 1_000, chunked, false);
        assert!(answer.starts_with("HTTP/1.1 401"), "chunked {chunked}: {answer:?}");
        assert!(sent < 1_000, "chunked {chunked}: read whole");
        let (answer, sent) = trickle_as(&s, None, "POST", "/healthz", 1_000, chunked, false);
        assert!(answer.starts_with("HTTP/1.1 405"), "chunked {chunked}: {answer:?}");
        assert!(sent < 1_000, "chunked {chunked}: read whole");
    }
    let (status, body) = s.call("GET", "/v1/sessions", None);
    assert_eq!(status, 200, "the server still serves: {body}");
}

/// `max_task_timeout_ms` bounds how long any child runs: a longer timeout is refused naming the
/// key (nothing stored), a task naming none gets it, and the OpenAPI document states it.
#[test]
fn a_task_timeout_over_the_servers_bound_is_refused_and_none_gets_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), Some(KEY), &["--max-task-timeout-ms", "300"]);
    s.open("t");
    let (status, reply) = s.call(
        "POST",
        "/v1/sessions/t/delegate",
        Some(json!({"tasks": [{"goal": "g", "runner": sim(0), "timeout_ms": 301}]})),
    );
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (400, Some("invalid_request")),
        "{reply}"
    );
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_task_timeout_ms"),
        "{reply}"
    );
    // A child that would hang ends timed_out at the bound; the call refused above used no set.
    let (status, reply) = s.call(
        "POST",
        "/v1/sessions/t/delegate",
        Some(json!({"tasks": [{"goal": "hang", "runner": {"kind": "sim", "outcome": "hang"}}]})),
    );
    assert_eq!((status, reply["set"].as_u64()), (202, Some(1)), "{reply}");
    assert_eq!(s.only_result("t")["status"], "timed_out");
    let (_, doc) = s.call("GET", "/v1/openapi.json", None);
    assert_eq!(
        doc["components"]["schemas"]["TaskBody"]["properties"]["timeout_ms"]["maximum"],
        300
    );
}
