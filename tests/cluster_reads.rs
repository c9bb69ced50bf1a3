//! Reads that see the whole cluster: several `brood serve` processes on one PostgreSQL database,
//! and whichever of them a read reaches answers for every session stored there. The listing of
//! sessions (paged, filtered by prefix and state) is the same through each process; a call is
//! read through a process that does not serve its session; a redrive of dead letters of
//! sessions served by several processes is done by each holder and counted whole, and a holder
//! that does not answer is reported, not skipped. Readiness asks the database itself.

mod server;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server::{assert_error, Server};

/// Starts process `name` on the database `url`, each session's lease lasting `lease_ms`, every
/// item dead after one failed delivery.
fn node(dir: &Path, url: &str, name: &str, lease_ms: &str) -> Server {
    Server::node_with(dir, url, name, lease_ms, None, &["--max-delivery-attempts", "1"])
}

/// Every session id `GET /v1/sessions` lists through `s` with `query`, page after page of at
/// most `limit`: in the order listed, each page asserted to follow the last.
fn list_all(s: &Server, query: &str, limit: usize) -> Vec<String> {
    let (mut ids, mut after): (Vec<String>, Option<String>) = (Vec::new(), None);
    for _ in 0..1000 {
        let mut path = format!("/v1/sessions?limit={limit}{query}");
        if let Some(a) = &after {
            path.push_str(&format!("&after={a}"));
        }
        let (status, page) = s.call("GET", &path, None);
        assert_eq!(status, 200, "{path}: {page}");
        let sessions = page["sessions"].as_array().unwrap();
        assert!(sessions.len() <= limit, "{page}");
        ids.extend(sessions.iter().map(|v| v["session_id"].as_str().unwrap().to_string()));
        match page["next"].as_str() {
            Some(next) => {
                assert_eq!(Some(next), ids.last().map(String::as_str), "{page}");
                after = Some(next.to_string());
            }
            None => return ids,
        }
    }
    panic!("the listing did not end");
}

/// Polls `what` until it answers `Some`, for up to 60 s.
fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "waited 60 s for {what}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// The session's counts as `s` answers them.
fn counts(s: &Server, session: &str) -> Value {
    let (status, view) = s.call("GET", &format!("/v1/sessions/{session}"), None);
    assert_eq!(status, 200, "{view}");
    view["counts"].clone()
}

/// Makes the results of `n` sim children of `session` dead letters (each released `failed`
/// once, through `s`); returns the call id.
fn dead_results(s: &Server, session: &str, n: usize) -> String {
    let call = s.delegate_sims(session, n);
    let mut released = 0;
    while released < n {
        let env = s.envelope(session, 30_000);
        released += env["items"].as_array().unwrap().len();
        let claim = env["claim_id"].as_str().unwrap();
        let (status, body) = s.call(
            "POST",
            &format!("/v1/claims/{claim}/release"),
            Some(json!({"reason": "failed"})),
        );
        assert_eq!(status, 200, "{body}");
    }
    until("the results to be dead letters", || {
        let (_, dead) = s.call("GET", &format!("/v1/dead-letters?session_id={session}"), None);
        (dead["items"].as_array().map(Vec::len) == Some(n)).then_some(())
    });
    call
}

/// Every session stored, listed through any process: the same ids, paged with no gap and no
/// repeat, and filtered by prefix and by state across the sessions of every process.
#[test]
fn every_process_lists_every_stored_session_paged_and_filtered() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let nodes: Vec<Server> = ["a", "b", "c"]
        .iter()
        .map(|n| node(dir.path(), &url, n, "5000"))
        .collect();
    // Sessions opened through each process in turn: each is served by the one that made it.
    let mut all: Vec<String> = Vec::new();
    for i in 0..10 {
        let id = format!("t-{i:02}");
        nodes[i % 3].open(&id);
        all.push(id);
    }
    for i in 0..4 {
        let id = format!("u-{i}");
        nodes[(i + 1) % 3].open(&id);
        all.push(id);
    }
    all.sort();
    // Ready items in sessions served by each of the three.
    let ready = ["t-00", "t-04", "t-08", "u-1"];
    for (i, id) in ready.iter().enumerate() {
        nodes[i % 3].delegate_sims(id, 1);
    }
    for id in ready {
        until("the item to be ready", || {
            (counts(&nodes[0], id)["ready"] == 1).then_some(())
        });
    }
    for (i, n) in nodes.iter().enumerate() {
        for limit in [1, 3, 100] {
            let listed = list_all(n, "", limit);
            assert_eq!(listed, all, "through process {i}, {limit} a page");
        }
        let listed = list_all(n, "&prefix=u-", 2);
        assert_eq!(listed, ["u-0", "u-1", "u-2", "u-3"], "through process {i}");
        let listed = list_all(n, "&state=ready", 1);
        assert_eq!(listed, ["t-00", "t-04", "t-08", "u-1"], "through process {i}");
        let listed = list_all(n, "&state=ready&prefix=t-", 2);
        assert_eq!(listed, ["t-00", "t-04", "t-08"], "through process {i}");
        // A page after an id that is not stored starts at the next one.
        let (status, page) = n.call("GET", "/v1/sessions?limit=2&after=t-035", None);
        assert_eq!(status, 200, "{page}");
        let ids: Vec<&str> = page["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["session_id"].as_str().unwrap())
            .collect();
        assert_eq!((ids, page["next"].as_str()), (vec!["t-04", "t-05"], Some("t-05")));
    }
    // What a listing says of a session is what its holder says.
    let (_, page) = nodes[1].call("GET", "/v1/sessions?prefix=t-04", None);
    assert_eq!(page["sessions"][0]["counts"], counts(&nodes[1], "t-04"), "{page}");
    assert_eq!(page["sessions"][0]["counts"]["ready"], 1, "{page}");
}

/// A call of a session another process serves is read through any process, also once every
/// item of it was delivered.
#[test]
fn a_call_is_read_through_a_process_that_does_not_serve_its_session() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let (a, b) = (node(dir.path(), &url, "a", "5000"), node(dir.path(), &url, "b", "5000"));
    b.open("s");
    let call = b.delegate_sims("s", 2);
    let (status, view) = a.call("GET", &format!("/v1/calls/{call}"), None);
    assert_eq!(status, 200, "{view}");
    assert_eq!(
        (view["call_id"].as_str(), view["session_id"].as_str()),
        (Some(call.as_str()), Some("s"))
    );
    assert_eq!(view["children"].as_array().map(Vec::len), Some(2), "{view}");
    // Delivered: still read through the other process.
    let mut taken = 0;
    while taken < 2 {
        let env = a.envelope("s", 30_000);
        taken += env["items"].as_array().unwrap().len();
        let (status, acked) = a.call(
            "POST",
            &format!("/v1/claims/{}/ack", env["claim_id"].as_str().unwrap()),
            None,
        );
        assert_eq!(status, 200, "{acked}");
    }
    let (status, view) = a.call("GET", &format!("/v1/calls/{call}"), None);
    assert_eq!(status, 200, "{view}");
    let statuses: BTreeSet<&str> = view["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, BTreeSet::from(["succeeded"]), "{view}");
    assert_error(
        a.call("GET", "/v1/calls/deleg_00000000000000000000000000000000", None),
        404,
        "unknown_call",
    );
}

/// `{"all": true}` redrives the dead letters of sessions served by three processes, each
/// session's by its holder, and the reply counts every one; the items are ready again.
#[test]
fn a_redrive_of_every_dead_letter_is_done_by_each_sessions_holder_and_counted_whole() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let nodes: Vec<Server> = ["a", "b", "c"]
        .iter()
        .map(|n| node(dir.path(), &url, n, "5000"))
        .collect();
    let sessions = ["d-0", "d-1", "d-2"];
    for (n, s) in nodes.iter().zip(sessions) {
        n.open(s);
        dead_results(n, s, 2);
    }
    for n in &nodes {
        let (_, dead) = n.call("GET", "/v1/dead-letters", None);
        assert_eq!(dead["items"].as_array().map(Vec::len), Some(6), "{dead}");
        assert_eq!(list_all(n, "&state=dead_letters", 1), sessions);
    }
    let (status, reply) = nodes[0].call("POST", "/v1/dead-letters/redrive", Some(json!({"all": true})));
    assert_eq!((status, reply["redriven"].as_u64()), (200, Some(6)), "{reply}");
    for n in &nodes {
        let (_, dead) = n.call("GET", "/v1/dead-letters", None);
        assert_eq!(dead["items"].as_array().map(Vec::len), Some(0), "{dead}");
    }
    // Every item is ready again in its session, taken through a process that does not serve it.
    for (i, s) in sessions.iter().enumerate() {
        let via = &nodes[(i + 1) % 3];
        let env = via.envelope(s, 30_000);
        let items = env["items"].as_array().unwrap();
        assert_eq!(items.len(), 2, "{env}");
        assert!(items.iter().all(|it| it["delivery_attempt"] == 1), "{env}");
    }
    // A redrive of children of two sessions served elsewhere: counted whole too.
    let (status, reply) = nodes[2].call("POST", "/v1/dead-letters/redrive", Some(json!({"all": true})));
    assert_eq!(
        (status, reply["redriven"].as_u64()),
        (200, Some(0)),
        "nothing is dead any more: {reply}"
    );
}

/// A holder that does not answer is reported by a redrive spanning its sessions (the others'
/// items redriven, the reply a 503 naming it) and by a listing holding its sessions, not
/// skipped; a retry once its sessions were taken over completes.
#[test]
fn a_holder_that_does_not_answer_is_reported_not_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    // Leases long enough that the dead holder's sessions stay its own while the test asks.
    let a = node(dir.path(), &url, "a", "60000");
    let b = node(dir.path(), &url, "b", "60000");
    a.open("d-a");
    b.open("d-b");
    dead_results(&a, "d-a", 1);
    dead_results(&b, "d-b", 1);
    b.kill9();
    let message = assert_error(
        a.call("POST", "/v1/dead-letters/redrive", Some(json!({"all": true}))),
        503,
        "session_moved",
    );
    assert!(
        message.contains("1 item(s) were redriven") && message.contains("`d-b`"),
        "{message}"
    );
    let (_, dead) = a.call("GET", "/v1/dead-letters", None);
    let left: Vec<&str> = dead["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(left, ["d-b"], "{dead}");
    let message = assert_error(a.call("GET", "/v1/sessions", None), 503, "session_moved");
    assert!(message.contains("did not answer"), "{message}");
}

/// `/readyz` asks the database: 503 `ledger_unavailable` while it is down, 200 once it is back;
/// `/healthz`, a liveness probe, answers 200 throughout.
#[test]
fn readiness_follows_the_database_and_liveness_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = brood_actors::ledger::pg_testkit::Cluster::private();
    let s = node(dir.path(), &cluster.url(), "a", "5000");
    let (status, ready) = s.call("GET", "/readyz", None);
    assert_eq!((status, ready["status"].as_str()), (200, Some("ready")), "{ready}");
    cluster.stop();
    let message = until("/readyz to answer 503", || {
        let (status, body) = s.call("GET", "/readyz", None);
        (status == 503).then_some(body)
    });
    assert_eq!(message["error"]["code"], "ledger_unavailable", "{message}");
    let (status, health) = s.call("GET", "/healthz", None);
    assert_eq!((status, health["status"].as_str()), (200, Some("ok")), "{health}");
    cluster.start();
    until("/readyz to answer 200", || {
        (s.call("GET", "/readyz", None).0 == 200).then_some(())
    });
    let (status, _) = s.call("GET", "/healthz", None);
    assert_eq!(status, 200);
}

/// A listener on a free loopback port standing in for a peer: it reads each request whole and
/// answers `status` with `body`; its address.
fn fake_peer(status: &'static str, body: &'static str) -> String {
    use std::io::{BufRead as _, Read as _, Write as _};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = format!("http://{}", l.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in l.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
            let mut request = vec![0; length];
            let _ = reader.read_exact(&mut request);
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(body.as_bytes());
        }
    });
    address
}

/// Points the lease of `session` at `address`, as if a process there held it for an hour.
fn lease_held_at(url: &str, session: &str, address: &str) {
    server::psql(
        url,
        &format!(
            "UPDATE brood.session_leases SET address = '{address}', owner = 'elsewhere', instance = 'x',
                 expires_at = now() + interval '1 hour' WHERE session = '{session}'::bytea"
        ),
    );
}

/// A holder that refuses the peer credential, answers what does not parse, or keeps saying the
/// session is served elsewhere fails the listing or the redrive with what it did, naming it.
#[test]
fn a_holder_answering_amiss_fails_the_page_and_the_redrive_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let a = node(dir.path(), &url, "a", "60000");
    a.open("s");
    dead_results(&a, "s", 1);
    a.kill9();
    let b = node(dir.path(), &url, "b", "60000");
    b.open("t");
    let refusing = fake_peer(
        "401 Unauthorized",
        r#"{"error":{"code":"unauthorized","message":"no"}}"#,
    );
    lease_held_at(&url, "s", &refusing);
    let message = assert_error(b.call("GET", "/v1/sessions", None), 502, "peer_refused");
    assert!(message.contains(&refusing), "{message}");
    let message = assert_error(
        b.call("POST", "/v1/dead-letters/redrive", Some(json!({"all": true}))),
        502,
        "peer_refused",
    );
    assert!(
        message.contains("0 item(s) were redriven") && message.contains("`s`"),
        "{message}"
    );
    let garbled = fake_peer("200 OK", "[1, 2");
    lease_held_at(&url, "s", &garbled);
    let message = assert_error(b.call("GET", "/v1/sessions", None), 503, "session_moved");
    assert!(message.contains("does not parse"), "{message}");
    let message = assert_error(
        b.call("POST", "/v1/dead-letters/redrive", Some(json!({"session_id": "s"}))),
        503,
        "session_moved",
    );
    assert!(message.contains("does not parse"), "{message}");
    let disowning = fake_peer("200 OK", r#"{"sessions": [], "elsewhere": ["s"]}"#);
    lease_held_at(&url, "s", &disowning);
    let message = assert_error(b.call("GET", "/v1/sessions", None), 503, "session_moved");
    assert!(message.contains("changed hands") && message.contains('s'), "{message}");
    // The session served here is listed once the other is out of the way.
    let (status, page) = b.call("GET", "/v1/sessions?prefix=t", None);
    assert_eq!(
        (status, page["sessions"][0]["session_id"].as_str()),
        (200, Some("t")),
        "{page}"
    );
}

/// The route between processes refuses a body naming no session, too many, or an id no session
/// can have; and says which of those it names it does not serve.
#[test]
fn the_peer_route_checks_what_it_is_asked_and_names_what_it_does_not_serve() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let (a, b) = (
        node(dir.path(), &url, "a", "60000"),
        node(dir.path(), &url, "b", "60000"),
    );
    a.open("s");
    b.open("t");
    let ask = |ids: Value| a.call("POST", "/v1/peers/sessions", Some(json!({"session_ids": ids})));
    assert_error(ask(json!([])), 400, "invalid_request");
    let many: Vec<String> = (0..1002).map(|i| format!("s{i}")).collect();
    assert_error(ask(json!(many)), 400, "invalid_request");
    // An id no session could have names none: nothing of it is answered.
    let (status, answer) = ask(json!(["a\u{7}", ""]));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        (answer["sessions"].clone(), answer["elsewhere"].clone()),
        (json!([]), json!([])),
        "{answer}"
    );
    let (status, answer) = ask(json!(["s", "t", "nobody"]));
    assert_eq!(status, 200, "{answer}");
    let listed: Vec<&str> = answer["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, ["s"], "{answer}");
    assert_eq!(answer["elsewhere"], json!(["t"]), "{answer}");
}
