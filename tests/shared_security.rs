//! What crosses between `brood serve` processes sharing one PostgreSQL database, driven as an
//! attacker would: a forged worker token names no place to forward to, a request is forwarded
//! only to an address a process wrote into the lease table, with the peer credential instead of
//! the user's key, following no redirect and relaying no more than a bounded answer; and
//! lookups of ids that name no session leave nothing in the database.

mod server;

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use server::{assert_error, psql, Server};

const KEY: &str = "the-users-key";

fn node(dir: &Path, url: &str, name: &str) -> Server {
    Server::node_with(dir, url, name, "2000", Some(KEY), &[])
}

/// What a listener was sent: each request's head (request line and headers), lowercased.
type Heads = Arc<Mutex<Vec<String>>>;

/// Answers a request as a holder of session "s" answers its status, with `extra` header lines
/// (each ending in CRLF) beside the length and content type.
fn status_of_s(stream: &mut std::net::TcpStream, extra: &str) {
    let body = br#"{"session_id":"s","turn":"idle","wake_capable":true,"counts":{}}"#;
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: application/json\r\n{extra}\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body);
}

/// A listener on a free loopback port that records each request's head and answers with
/// `answer` (the whole response, or a function writing it); its address and what it saw.
fn listener(answer: impl Fn(&mut std::net::TcpStream) + Send + 'static) -> (String, Heads) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = format!("http://{}", l.local_addr().unwrap());
    let heads: Heads = Arc::default();
    let seen = heads.clone();
    std::thread::spawn(move || {
        for stream in l.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                let lower = line.to_ascii_lowercase();
                if let Some(v) = lower.strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                head.push_str(&lower);
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            seen.lock().unwrap().push(head);
            answer(&mut stream);
        }
    });
    (address, heads)
}

fn text_hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn a_forged_worker_token_is_refused_and_sends_nothing_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let a = node(dir.path(), &url, "a");
    let (sink, heads) = listener(|s| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}");
    });
    // A token that ends in the hex of an address, as tokens once named their holder.
    let forged = format!("wtk_0123456789abcdef~{}", text_hex(&sink));
    for op in ["heartbeat", "complete"] {
        let body = match op {
            "heartbeat" => json!({"token": forged}),
            _ => json!({"token": forged, "status": "succeeded", "summary": "x"}),
        };
        let reply = a.call("POST", &format!("/v1/children/deleg_00ff.0/{op}"), Some(body));
        assert_error(reply, 409, "stale_token");
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        heads.lock().unwrap().is_empty(),
        "the server sent requests to the token's address: {:?}",
        heads.lock().unwrap()
    );
}

#[test]
fn tokens_name_no_process() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let a = node(dir.path(), &url, "a");
    a.open("w");
    let task = json!({"goal": "g", "runner": {"kind": "external"}});
    let (status, reply) = a.call("POST", "/v1/sessions/w/delegate", Some(json!({"tasks": [task]})));
    assert_eq!(status, 202, "{reply}");
    let (status, work) = a.call(
        "POST",
        "/v1/workers/poll",
        Some(json!({"worker": "w", "wait_ms": 5000})),
    );
    assert_eq!(status, 200, "{work}");
    let token = work["token"].as_str().unwrap();
    assert!(!token.contains('~') && !token.contains(&text_hex(&a.base)), "{token}");
    assert!(
        token.starts_with("wtk_") && token[4..].chars().all(|c| c.is_ascii_hexdigit()),
        "{token}"
    );
}

/// A session opened through `a`, whose lease row is then pointed at `address` (as if a peer
/// there held it) once `a` is gone; `b` serves requests for it from then on.
fn session_held_at(dir: &Path, url: &str, address: &str) -> Server {
    let a = node(dir, url, "a");
    a.open("s");
    a.kill9();
    let b = node(dir, url, "b");
    psql(
        url,
        &format!(
            "UPDATE brood.session_leases SET address = '{address}', owner = 'elsewhere', instance = 'x',
                 expires_at = now() + interval '1 hour' WHERE session = 's'::bytea"
        ),
    );
    b
}

#[test]
fn a_forwarded_request_carries_the_peer_credential_not_the_users_key() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let (peer, heads) = listener(|s| status_of_s(s, ""));
    let b = session_held_at(dir.path(), &url, &peer);
    let (status, body) = b.call("GET", "/v1/sessions/s", None);
    assert_eq!(status, 200, "relayed: {body}");
    let heads = heads.lock().unwrap();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert!(
        !heads[0].contains(KEY),
        "the user's key crossed to a peer: {}",
        heads[0]
    );
    assert!(!heads[0].contains("authorization:"), "{}", heads[0]);
    assert!(
        heads[0].contains("x-brood-peer: bpk_"),
        "no peer credential: {}",
        heads[0]
    );
}

#[test]
fn a_peer_that_redirects_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let (elsewhere, followed) = listener(|s| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}");
    });
    let (peer, _) = listener(move |s| {
        let _ = s.write_all(
            format!("HTTP/1.1 302 Found\r\nLocation: {elsewhere}/latest/meta-data\r\nContent-Length: 0\r\n\r\n")
                .as_bytes(),
        );
    });
    let b = session_held_at(dir.path(), &url, &peer);
    let (status, _) = b.call("POST", "/v1/sessions/s/turn", Some(json!({"state": "busy"})));
    assert_ne!(status, 200);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        followed.lock().unwrap().is_empty(),
        "a redirect was followed: {:?}",
        followed.lock().unwrap()
    );
}

/// The resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn a_peers_huge_answer_is_not_buffered_or_relayed() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    const HUGE: usize = 300 << 20;
    let (peer, _) = listener(|s| {
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {HUGE}\r\nContent-Type: application/json\r\n\r\n");
        let _ = s.write_all(head.as_bytes());
        let chunk = vec![b' '; 1 << 20];
        for _ in 0..HUGE >> 20 {
            if s.write_all(&chunk).is_err() {
                return;
            }
        }
    });
    let b = session_held_at(dir.path(), &url, &peer);
    let before = rss_kib(b.child.id());
    let started = Instant::now();
    let reply = b.send("GET", "/v1/sessions/s", None, Some(KEY));
    assert!(reply.text.len() < 1 << 20, "relayed {} bytes", reply.text.len());
    assert_eq!(reply.status, 503, "{}", reply.text);
    let grew = rss_kib(b.child.id()).saturating_sub(before);
    assert!(
        grew < 200 << 10,
        "the answer was buffered: RSS grew by {grew} KiB in {:?}",
        started.elapsed()
    );
}

#[test]
fn looking_up_ids_that_name_no_session_leaves_nothing_in_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let a = node(dir.path(), &url, "a");
    a.open("real");
    for i in 0..40 {
        assert_error(
            a.call("GET", &format!("/v1/sessions/junk-{i}"), None),
            404,
            "unknown_session",
        );
        let (status, _) = a.call(
            "POST",
            &format!("/v1/sessions/junk-{i}/boundary"),
            Some(json!({"consumer": "c"})),
        );
        assert_eq!(status, 404);
    }
    let leases = psql(&url, "SELECT count(*) FROM brood.session_leases");
    assert_eq!(
        leases,
        "1",
        "lease rows: {}",
        psql(&url, "SELECT session FROM brood.session_leases")
    );
    // The real one still works.
    let (status, body) = a.call("GET", "/v1/sessions/real", None);
    assert_eq!(status, 200, "{body}");
}

#[test]
fn session_ids_outside_the_allowed_characters_are_refused_before_any_lookup() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let a = node(dir.path(), &url, "a");
    let long = "x".repeat(5000);
    // No session has such an id: refused before anything is read.
    for id in [long.as_str(), "a%00b", "a%0Ab"] {
        let (status, body) = a.call("GET", &format!("/v1/sessions/{id}"), None);
        assert_eq!(status, 400, "{id}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request", "{body}");
        let (status, _) = a.call("PUT", &format!("/v1/sessions/{id}"), Some(json!({})));
        assert_eq!(status, 400, "{id}");
    }
    // Ids an earlier build could store are looked up, but no new session gets one.
    for id in ["a%20b", "caf%C3%A9", "a%25b"] {
        let (status, body) = a.call("GET", &format!("/v1/sessions/{id}"), None);
        assert_eq!(status, 404, "{id}: {body}");
        let (status, body) = a.call("PUT", &format!("/v1/sessions/{id}"), Some(json!({})));
        assert_eq!(status, 400, "{id}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains("printable ASCII"),
            "{body}"
        );
    }
    assert_eq!(psql(&url, "SELECT count(*) FROM brood.session_leases"), "0");
    assert_eq!(psql(&url, "SELECT count(*) FROM brood.sessions"), "0");
}

#[test]
fn a_call_is_found_by_its_id_from_any_process() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let a = node(dir.path(), &url, "a");
    let b = node(dir.path(), &url, "b");
    a.open("c");
    let call = a.delegate_sims("c", 2);
    let (status, body) = b.call("GET", &format!("/v1/calls/{call}"), None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["session_id"], "c");
    assert_error(b.call("GET", "/v1/calls/deleg_00000000", None), 404, "unknown_call");
}

/// Counts, in `brood.takes_counted`, the statements that take from the shared work list (a
/// statement trigger fires once a statement, whether it took a row or not: a take updates the
/// row it takes, hiding it; with nothing listed, nothing else updates the list).
fn count_takes(url: &str) {
    psql(
        url,
        "CREATE TABLE brood.takes_counted (n bigint NOT NULL);
         INSERT INTO brood.takes_counted VALUES (0);
         CREATE FUNCTION brood.count_take() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN UPDATE brood.takes_counted SET n = n + 1; RETURN NULL; END $$;
         CREATE TRIGGER count_takes AFTER UPDATE ON brood.work_directory
             FOR EACH STATEMENT EXECUTE FUNCTION brood.count_take();",
    );
}

#[test]
fn idle_worker_polls_ask_the_database_nothing_while_they_wait() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let a = node(dir.path(), &url, "a");
    let b = node(dir.path(), &url, "b");
    count_takes(&url);
    const POLLS: u64 = 10;
    std::thread::scope(|s| {
        for i in 0..POLLS {
            let a = &a;
            s.spawn(move || {
                let (status, reply) = a.call(
                    "POST",
                    "/v1/workers/poll",
                    Some(json!({"worker": format!("w{i}"), "queue": "idle", "wait_ms": 3000})),
                );
                assert_eq!(status, 204, "{reply}");
            });
        }
    });
    let takes: u64 = psql(&url, "SELECT n FROM brood.takes_counted").parse().unwrap();
    // One look when a poll comes, and one for each time the list may have changed (none here);
    // a poll that asked the database on a timer looks about fifteen times in three seconds.
    assert!(
        takes <= 2 * POLLS,
        "{POLLS} polls waiting 3 s with nothing listed asked the shared list {takes} times"
    );

    // A child listed by another process while a poll waits is still handed to it.
    b.open("y");
    std::thread::scope(|s| {
        let waiting = s.spawn(|| {
            a.call(
                "POST",
                "/v1/workers/poll",
                Some(json!({"worker": "w", "queue": "gpu", "wait_ms": 30000})),
            )
        });
        std::thread::sleep(Duration::from_millis(500));
        let task = json!({"goal": "render", "runner": {"kind": "external", "queue": "gpu"}});
        let (status, reply) = b.call("POST", "/v1/sessions/y/delegate", Some(json!({"tasks": [task]})));
        assert_eq!(status, 202, "{reply}");
        let call = reply["call_id"].as_str().unwrap().to_string();
        let (status, work) = waiting.join().unwrap();
        assert_eq!(status, 200, "{work}");
        assert_eq!(work["child_id"], format!("{call}.0"));
    });
}

#[test]
fn a_holder_a_peers_answer_names_is_not_sent_anything() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let (elsewhere, reached) = listener(|s| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}");
    });
    let (peer, asked) = listener(move |s| status_of_s(s, &format!("X-Brood-Holder: {elsewhere}\r\n")));
    let b = session_held_at(dir.path(), &url, &peer);
    // The peer's answers say another process serves the session: b's next requests still go
    // where the lease table says, never with its peer credential to an address only an answer
    // named.
    for _ in 0..3 {
        let (status, body) = b.call("GET", "/v1/sessions/s", None);
        assert_eq!(status, 200, "relayed: {body}");
    }
    let reached = reached.lock().unwrap().clone();
    assert!(
        reached.is_empty(),
        "sent to an address a peer's answer named: {reached:?}"
    );
    let asked = asked.lock().unwrap().len();
    assert_eq!(asked, 3, "each request went to the holder the lease table names");
}

#[test]
fn a_peers_chunked_answer_is_relayed_whole_and_a_huge_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let huge = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let big = huge.clone();
    let (peer, heads) = listener(move |s| {
        let head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\nX-Brood-Holder: http://127.0.0.1:1\r\n\r\n";
        let _ = s.write_all(head.as_bytes());
        if big.load(std::sync::atomic::Ordering::SeqCst) {
            // Past any limit, with no length to tell it beforehand.
            let chunk = format!("{:x}\r\n{}\r\n", 1 << 20, " ".repeat(1 << 20));
            for _ in 0..300 {
                if s.write_all(chunk.as_bytes()).is_err() {
                    return;
                }
            }
        } else {
            for part in [
                r#"{"session_id":"s","turn":"idle","#,
                r#""wake_capable":true,"counts":{}}"#,
            ] {
                let _ = s.write_all(format!("{:x}\r\n{part}\r\n", part.len()).as_bytes());
            }
        }
        let _ = s.write_all(b"0\r\n\r\n");
    });
    let b = session_held_at(dir.path(), &url, &peer);
    let reply = b.send("GET", "/v1/sessions/s", None, Some(KEY));
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(
        reply.text, r#"{"session_id":"s","turn":"idle","wake_capable":true,"counts":{}}"#,
        "relayed whole, as it came"
    );
    assert_eq!(reply.content_type, "application/json");
    assert_eq!(
        reply.holder.as_deref(),
        Some("http://127.0.0.1:1"),
        "the holder it named is relayed"
    );
    // What went to the peer: the peer credential, never the user's key; no encoding it would
    // have to undo.
    {
        let heads = heads.lock().unwrap();
        assert_eq!(heads.len(), 1, "{heads:?}");
        assert!(heads[0].contains("x-brood-peer: bpk_"), "{}", heads[0]);
        assert!(
            !heads[0].contains(KEY) && !heads[0].contains("authorization:"),
            "{}",
            heads[0]
        );
        assert!(heads[0].contains("x-brood-forwarded-by: "), "{}", heads[0]);
        let encoding = heads[0].lines().find(|l| l.starts_with("accept-encoding:"));
        assert!(
            encoding.is_none_or(|l| l.trim() == "accept-encoding: identity"),
            "{}",
            heads[0]
        );
    }
    huge.store(true, std::sync::atomic::Ordering::SeqCst);
    let reply = b.send("GET", "/v1/sessions/s", None, Some(KEY));
    assert_eq!(reply.status, 503, "{}", reply.text);
    assert!(reply.text.contains("session_moved"), "{}", reply.text);
    assert!(reply.text.len() < 1 << 20, "relayed {} bytes", reply.text.len());
}

#[test]
fn a_peer_that_drops_a_request_unanswered_is_sent_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    // Read whole, then the connection closed with no answer: as a holder killed mid-request.
    let (peer, heads) = listener(|s| {
        let _ = s.shutdown(std::net::Shutdown::Both);
    });
    let b = session_held_at(dir.path(), &url, &peer);
    let body = json!({"tasks": [{"goal": "t", "runner": server::sim(0)}]});
    let (status, reply) = b.call("POST", "/v1/sessions/s/delegate", Some(body));
    assert_error((status, reply), 503, "session_moved");
    // Not sent again on another connection: a request that may have been done there is the
    // client's to retry (with its idempotency key), never this process's.
    std::thread::sleep(Duration::from_millis(300));
    let heads = heads.lock().unwrap();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert!(heads[0].starts_with("post /v1/sessions/s/delegate"), "{}", heads[0]);
}

#[test]
fn requests_held_up_at_a_slow_peer_hold_up_nothing_sent_to_another() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    // More requests at once than one process's workers kept connections for (100 each).
    const SLOW: usize = 240;
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    // A peer that takes each request in and answers none until told to.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let slow = format!("http://{}", l.local_addr().unwrap());
    let (arrived, go) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
    {
        let (arrived, go) = (arrived.clone(), go.clone());
        std::thread::spawn(move || {
            for stream in l.incoming() {
                let Ok(mut stream) = stream else { return };
                let (arrived, go) = (arrived.clone(), go.clone());
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    arrived.fetch_add(1, Ordering::SeqCst);
                    while !go.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    status_of_s(&mut stream, "Connection: close\r\n");
                });
            }
        });
    }
    let b = session_held_at(dir.path(), &url, &slow);
    let c = node(dir.path(), &url, "c");
    c.open("x");
    std::thread::scope(|scope| {
        let held: Vec<_> = (0..SLOW)
            .map(|_| scope.spawn(|| b.call("GET", "/v1/sessions/s", None).0))
            .collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        while arrived.load(Ordering::SeqCst) < SLOW {
            assert!(
                Instant::now() < deadline,
                "{} of {SLOW} requests reached the slow peer",
                arrived.load(Ordering::SeqCst)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // Every one of them still waits there: a request through b for a session c serves is
        // answered meanwhile.
        for _ in 0..4 {
            let (status, view) = b.call("GET", "/v1/sessions/x", None);
            assert_eq!(status, 200, "{view}");
        }
        assert!(!go.load(Ordering::SeqCst));
        go.store(true, Ordering::SeqCst);
        for h in held {
            assert_eq!(h.join().unwrap(), 200);
        }
    });
}
