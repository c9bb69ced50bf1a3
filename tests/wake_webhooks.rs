//! Webhook wakes of `brood serve` reach only the receivers they may, and cost bounded resources.
//!
//! A `wake_url` aimed inside the network (metadata, link-local, and — unless `wake_allow` lets
//! it — private or loopback addresses) or carrying credentials or control characters is refused
//! at `PUT`; a name is judged by the addresses it resolves to when the wake is delivered, and
//! the address connected to is one of those judged. Redirects are not followed. A receiver that
//! never answers holds no more than the delivery pool's threads and one host's share of the
//! wakes in flight (the others wait for a slot), and the URL's credentials, path and query never
//! reach the log.

mod server;

use std::io::Write as _;
use std::net::TcpListener;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server::*;

/// A server with no `wake_allow`: the defaults alone decide where wakes may go.
fn bare(dir: &std::path::Path) -> Server {
    Server::start_exactly(dir, None, &[], Stdio::null())
}

fn put_wake(s: &Server, session: &str, url: &str) -> (u16, Value) {
    s.call(
        "PUT",
        &format!("/v1/sessions/{session}"),
        Some(json!({"wake_url": url})),
    )
}

/// The value of metric `name` (0 when it is not reported).
fn metric(s: &Server, name: &str) -> f64 {
    let text = s.send("GET", "/metrics", None, None).text;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Waits (up to 30 s) until `done` holds.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "{what} did not happen within 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A listener that counts the connections it accepts and answers none of them (it keeps each
/// open, unread).
fn silent_listener() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            count.fetch_add(1, Ordering::SeqCst);
            held.push(stream);
        }
    });
    (port, accepted)
}

/// A receiver that answers every request with `302 Found` to `location`; counts the requests.
fn redirecting_receiver(location: String) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/wake", listener.local_addr().unwrap());
    let hits = Arc::new(AtomicUsize::new(0));
    let count = hits.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let _ = read_json_body(&stream);
            count.fetch_add(1, Ordering::SeqCst);
            let answer =
                format!("HTTP/1.1 302 Found\r\nlocation: {location}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    (url, hits)
}

/// The `Threads:` line of the server process's /proc status.
fn threads(s: &Server) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{}/status", s.child.id())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("a Threads: line")
}

/// Delegates one zero-time child to `session` and waits until its result is ready.
fn one_ready(s: &Server, session: &str) {
    let (status, reply) = s.call(
        "POST",
        &format!("/v1/sessions/{session}/delegate"),
        Some(json!({"tasks": [{"goal": "a", "runner": sim(0)}]})),
    );
    assert_eq!(status, 202, "{reply}");
    wait_until("the child's result to be ready", || {
        s.call("GET", &format!("/v1/sessions/{session}"), None).1["counts"]["ready"] == 1
    });
}

#[test]
fn metadata_and_link_local_targets_are_refused_at_put() {
    let dir = tempfile::tempdir().unwrap();
    // Even a server that allows loopback refuses these.
    let s = Server::start(dir.path(), None);
    for url in [
        "http://169.254.169.254/latest",
        "http://169.254.1.1:8080/",
        "http://[fe80::1]/",
        "http://[fd00:ec2::254]/latest",
        "http://[::ffff:169.254.169.254]/latest",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://0.0.0.0:9000/",
        "http://255.255.255.255/",
        "http://224.0.0.1/",
    ] {
        let message = assert_error(put_wake(&s, "m", url), 400, "invalid_request");
        assert!(message.contains("wake_url"), "{url}: {message}");
    }
    let (status, view) = s.call("GET", "/v1/sessions/m", None);
    assert!(
        status == 404 || view["wake_capable"] == false,
        "a refused PUT binds nothing: {view}"
    );
}

#[test]
fn private_targets_are_refused_unless_wake_allow_lists_them() {
    let dir = tempfile::tempdir().unwrap();
    let s = bare(dir.path());
    for url in [
        "http://10.0.0.1/",
        "http://192.168.1.10:8080/wake",
        "http://172.16.0.5/",
        "http://100.64.0.1/",
        "http://127.0.0.1:9/wake",
        "http://[::1]:9/wake",
        "http://[::ffff:10.0.0.1]/",
        "http://[fd12::1]/",
    ] {
        let message = assert_error(put_wake(&s, "p", url), 400, "invalid_request");
        assert!(message.contains("wake_allow"), "says how to allow it: {url}: {message}");
    }
    drop(s);
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_exactly(dir.path(), None, &["--wake-allow", "10.0.0.0/8"], Stdio::null());
    let (status, body) = put_wake(&s, "p", "http://10.0.0.1/");
    assert_eq!(status, 200, "{body}");
    assert_error(put_wake(&s, "q", "http://192.168.1.10/"), 400, "invalid_request");
}

#[test]
fn a_wake_url_with_userinfo_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    let message = assert_error(put_wake(&s, "u", "http://user:pw@127.0.0.1:1/"), 400, "invalid_request");
    assert!(message.contains("userinfo"), "{message}");
}

#[test]
fn a_wake_url_with_control_characters_or_spaces_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    for url in [
        "http://127.0.0.1:1/wake\r\nX-Injected: 1",
        "http://127.0.0.1:1/wa ke",
        "http://127.0.0.1:1/\twake",
        "http://127.0.0.1:1/\u{7f}",
    ] {
        let message = assert_error(put_wake(&s, "c", url), 400, "invalid_request");
        assert!(
            message.contains("control character") || message.contains("space"),
            "{url:?}: {message}"
        );
    }
}

#[test]
fn a_name_resolving_to_loopback_is_not_connected_to_and_the_refusal_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let s = bare(dir.path());
    let (port, accepted) = silent_listener();
    // A name is judged when the wake is delivered, by the addresses it resolves to.
    let (status, body) = put_wake(&s, "n", &format!("http://localhost:{port}/wake"));
    assert_eq!(status, 200, "{body}");
    one_ready(&s, "n");
    wait_until("the refused wake to be counted, or a connection", || {
        metric(&s, "brood_wakes_refused_total") >= 1.0 || accepted.load(Ordering::SeqCst) > 0
    });
    assert_eq!(accepted.load(Ordering::SeqCst), 0, "a wake connected to loopback");
    assert_eq!(metric(&s, "brood_wakes_refused_total"), 1.0);
}

#[test]
fn a_redirect_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    let (target_port, target_seen) = silent_listener();
    let (url, redirects) = redirecting_receiver(format!("http://127.0.0.1:{target_port}/wake"));
    let (status, body) = put_wake(&s, "r", &url);
    assert_eq!(status, 200, "{body}");
    one_ready(&s, "r");
    // A 302 is a failed try: it is retried at the first receiver, never sent on.
    wait_until("a retry after the redirect, or a connection to its target", || {
        redirects.load(Ordering::SeqCst) >= 2 || target_seen.load(Ordering::SeqCst) > 0
    });
    assert_eq!(target_seen.load(Ordering::SeqCst), 0, "the redirect was followed");
    assert!(metric(&s, "brood_wake_tries_failed_total") >= 1.0);
    assert_eq!(metric(&s, "brood_wakes_delivered_total"), 0.0);
}

#[test]
fn a_receiver_that_never_answers_holds_a_bounded_number_of_threads() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    let (port, accepted) = silent_listener();
    let (status, body) = put_wake(&s, "slow", &format!("http://127.0.0.1:{port}/wake"));
    assert_eq!(status, 200, "{body}");
    one_ready(&s, "slow");
    wait_until("the first wake's connection", || accepted.load(Ordering::SeqCst) >= 1);
    let before = threads(&s);
    // Each busy -> idle change with an item ready is a new idle period, and a wake.
    for _ in 0..300 {
        for state in ["busy", "idle"] {
            let (status, body) = s.call("POST", "/v1/sessions/slow/turn", Some(json!({"state": state})));
            assert_eq!(status, 200, "{body}");
        }
    }
    let after = threads(&s);
    assert!(
        after < 40 && after <= before + 8,
        "{after} threads after 300 wakes to a receiver that never answers ({before} before)"
    );
    // Other sessions' wakes still go out.
    let (good, seen) = wake_receiver(0);
    let (status, body) = put_wake(&s, "good", &good);
    assert_eq!(status, 200, "{body}");
    one_ready(&s, "good");
    wait_until("the good receiver's wake", || !seen.lock().unwrap().is_empty());
    assert_eq!(seen.lock().unwrap()[0]["session_id"], "good");
}

/// A receiver that records each request's body and answers 200, holding its answer to the
/// first request until `release` is sent.
fn held_receiver() -> (String, Arc<std::sync::Mutex<Vec<Value>>>, std::sync::mpsc::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/wake", listener.local_addr().unwrap());
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let (release, gate) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        for (n, mut stream) in listener.incoming().flatten().enumerate() {
            log.lock().unwrap().extend(read_json_body(&stream));
            if n == 0 {
                let _ = gate.recv();
            }
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
    (url, seen, release)
}

#[test]
fn a_wake_that_comes_while_its_session_is_being_posted_is_posted_after() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    let (url, seen, release) = held_receiver();
    let (status, body) = put_wake(&s, "h", &url);
    assert_eq!(status, 200, "{body}");
    one_ready(&s, "h");
    wait_until("the first POST", || seen.lock().unwrap().len() == 1);
    // A new idle period while the first POST waits for its answer: one more wake.
    for state in ["busy", "idle"] {
        let (status, body) = s.call("POST", "/v1/sessions/h/turn", Some(json!({"state": state})));
        assert_eq!(status, 200, "{body}");
    }
    release.send(()).unwrap();
    wait_until("a POST after the second wake", || seen.lock().unwrap().len() >= 2);
    assert_eq!(seen.lock().unwrap()[1]["session_id"], "h");
}

#[test]
fn wakes_beyond_a_hosts_slots_wait_for_one_and_other_receivers_still_get_theirs() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    let (port, _accepted) = silent_listener();
    let url = format!("http://127.0.0.1:{port}/wake");
    // 72 sessions, one wake each, to a receiver that never answers: each stays in flight
    // through its tries, 8 of them at a time (one host's share); the other 64 wait for a slot.
    for i in 0..72 {
        let (status, body) = put_wake(&s, &format!("d{i}"), &url);
        assert_eq!(status, 200, "{body}");
        let (status, reply) = s.call(
            "POST",
            &format!("/v1/sessions/d{i}/delegate"),
            Some(json!({"tasks": [{"goal": "a", "runner": sim(0)}]})),
        );
        assert_eq!(status, 202, "{reply}");
    }
    wait_until("64 parked wakes", || metric(&s, "brood_wakes_parked_total") >= 64.0);
    assert_eq!(metric(&s, "brood_wakes_dropped_total"), 0.0);
    assert!(threads(&s) < 40, "{} threads", threads(&s));
    // Another receiver's wake has a slot of its own.
    let (good, seen) = wake_receiver(0);
    let (status, body) = put_wake(&s, "good", &good);
    assert_eq!(status, 200, "{body}");
    one_ready(&s, "good");
    wait_until("the other receiver's wake", || !seen.lock().unwrap().is_empty());
    assert_eq!(seen.lock().unwrap()[0]["session_id"], "good");
}

#[test]
fn credentials_path_and_query_of_a_wake_url_never_reach_the_log_or_the_reply() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("stderr.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let s = Server::start_exactly(
        &dir.path().join("data"),
        None,
        &["--log", "brood=debug"],
        Stdio::from(log),
    );
    let (status, body) = put_wake(&s, "u", "http://brood:s3cr3t-pw@127.0.0.1:1/wake");
    assert_eq!(status, 400, "{body}");
    assert!(
        !body.to_string().contains("s3cr3t-pw"),
        "the reply echoes the password: {body}"
    );
    // A refused delivery is logged, naming its target by scheme, host and port only.
    let (port, _accepted) = silent_listener();
    let (status, body) = put_wake(&s, "q", &format!("http://localhost:{port}/p4th-t0ken?token=qs-t0ken"));
    assert_eq!(status, 200, "{body}");
    one_ready(&s, "q");
    let shown = format!("http://localhost:{port}");
    wait_until("the refused wake to be logged", || {
        std::fs::read_to_string(&log_path).unwrap().contains(&shown)
    });
    let text = std::fs::read_to_string(&log_path).unwrap();
    assert!(!text.contains("s3cr3t-pw"), "the log holds the password:\n{text}");
    assert!(!text.contains("p4th-t0ken"), "the log holds the path:\n{text}");
    assert!(!text.contains("qs-t0ken"), "the log holds the query:\n{text}");
}
