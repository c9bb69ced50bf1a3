//! Several `brood serve` processes on one PostgreSQL database: each session served by
//! the holder of its tenure, requests forwarded to it from whichever process they reach, a dead
//! holder's sessions taken over, and a paused one refused once it wakes up.

mod server;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server::{psql, sim, Server};

/// The tenure time the tests run with: short, so takeovers come quickly.
const TENURE_MS: &str = "2000";

fn node(dir: &Path, url: &str, name: &str) -> Server {
    Server::node(dir, url, name, TENURE_MS)
}

/// The child ids of an envelope's result items.
fn children_of(env: &Value) -> Vec<String> {
    env["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["child_id"].as_str().unwrap().to_string())
        .collect()
}

/// Boundaries and acks of `session` through `s` until `want` items were taken, or `within`
/// passed; the child ids taken. A 503 (a session between holders) is retried.
fn drain(s: &Server, session: &str, want: usize, within: Duration) -> Vec<String> {
    let taken = std::sync::Mutex::new(Vec::new());
    drain_into(s, session, want, within, &taken);
    taken.into_inner().unwrap()
}

/// As [`drain`], with several consumers sharing `taken`: each stops once `taken` holds `want`.
fn drain_into(s: &Server, session: &str, want: usize, within: Duration, taken: &std::sync::Mutex<Vec<String>>) {
    let deadline = Instant::now() + within;
    while taken.lock().unwrap().len() < want && Instant::now() < deadline {
        let (status, env) = s.call(
            "POST",
            &format!("/v1/sessions/{session}/boundary"),
            Some(json!({"consumer": "drain", "lease_ms": 30000})),
        );
        match status {
            200 => {
                let claim = env["claim_id"].as_str().unwrap();
                let (acked, body) = s.call("POST", &format!("/v1/claims/{claim}/ack"), None);
                if acked == 200 {
                    taken.lock().unwrap().extend(children_of(&env));
                } else {
                    assert!(acked == 409 || acked == 503, "ack answered {acked}: {body}");
                }
            }
            204 | 503 => std::thread::sleep(Duration::from_millis(25)),
            s => panic!("boundary answered {s}: {env}"),
        }
    }
}

#[test]
fn three_processes_serve_every_session_wherever_a_request_lands() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let nodes: Vec<Server> = ["a", "b", "c"].iter().map(|n| node(dir.path(), &url, n)).collect();
    let sessions: Vec<String> = (0..6).map(|i| format!("s{i}")).collect();
    // Each session opened through one process, its calls made through the next.
    let per_call = 20;
    let mut expected = Vec::new();
    for (i, s) in sessions.iter().enumerate() {
        nodes[i % 3].open(s);
        for _ in 0..2 {
            let call = nodes[(i + 1) % 3].delegate_sims(s, per_call);
            expected.extend((0..per_call).map(|t| format!("{call}.{t}")));
        }
    }
    // Consumers race each session's boundaries through all three processes at once.
    let per_session: Vec<std::sync::Mutex<Vec<String>>> = sessions.iter().map(|_| Default::default()).collect();
    std::thread::scope(|scope| {
        for (s, taken) in sessions.iter().zip(&per_session) {
            for n in &nodes {
                scope.spawn(move || drain_into(n, s, 2 * per_call, Duration::from_secs(60), taken));
            }
        }
    });
    let mut taken: Vec<String> = per_session.into_iter().flat_map(|t| t.into_inner().unwrap()).collect();
    let total = taken.len();
    taken.sort();
    taken.dedup();
    assert_eq!(taken.len(), total, "an item was delivered twice");
    expected.sort();
    assert_eq!(taken, expected, "every result was delivered, once");
    // Every process answers for every session, with the same view.
    for s in &sessions {
        let views: Vec<Value> = nodes
            .iter()
            .map(|n| {
                let (status, view) = n.call("GET", &format!("/v1/sessions/{s}"), None);
                assert_eq!(status, 200, "{view}");
                view["counts"].clone()
            })
            .collect();
        assert!(views.windows(2).all(|w| w[0] == w[1]), "{views:?}");
        assert_eq!(views[0]["delivered"], 2 * per_call, "{s}: {views:?}");
    }
}

#[test]
fn a_killed_holders_sessions_are_taken_over_with_nothing_lost_and_nothing_acked_again() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let a = node(dir.path(), &url, "a");
    let b = node(dir.path(), &url, "b");
    a.open("k");
    // One call delivered and acked, the next claimed and not acked when the holder dies.
    let first = a.delegate_sims("k", 10);
    let acked = drain(&a, "k", 10, Duration::from_secs(20));
    assert_eq!(acked.len(), 10);
    let second = a.delegate_sims("k", 20);
    let mut held = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while held.len() < 20 && Instant::now() < deadline {
        let (status, env) = a.call(
            "POST",
            "/v1/sessions/k/boundary",
            Some(json!({"consumer": "dies", "lease_ms": 60000})),
        );
        match status {
            200 => held.extend(children_of(&env)),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    assert_eq!(held.len(), 20, "every result of the second call was claimed");
    a.kill9();
    let killed = Instant::now();
    // b takes the session over once a's tenure ran out, and recovers it as a restart would:
    // the claims a held are returned, what was acked stays acked.
    let rest = drain(&b, "k", 20, Duration::from_secs(30));
    eprintln!(
        "takeover: the dead holder's items all delivered through b {:?} after the kill (tenure {TENURE_MS} ms)",
        killed.elapsed()
    );
    let mut all: Vec<String> = acked.iter().chain(&rest).cloned().collect();
    let total = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), total, "an acked item came back after the takeover");
    let mut expected: Vec<String> = (0..10)
        .map(|t| format!("{first}.{t}"))
        .chain((0..20).map(|t| format!("{second}.{t}")))
        .collect();
    expected.sort();
    assert_eq!(all, expected, "every result was delivered once");
    // And b goes on serving it: a new call takes the next set.
    let (_, next) = b.call(
        "POST",
        "/v1/sessions/k/delegate",
        Some(json!({"tasks": [{"goal": "after", "runner": sim(0)}]})),
    );
    assert_eq!(next["set"], 3, "{next}");
}

#[test]
fn a_paused_holder_is_refused_once_taken_over_and_acks_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let a = node(dir.path(), &url, "a");
    let b = node(dir.path(), &url, "b");
    a.open("p");
    let call = a.delegate_sims("p", 10);
    let env = a.envelope("p", 60_000);
    let claim = env["claim_id"].as_str().unwrap().to_string();
    let claimed = children_of(&env);
    // a is paused past its tenure (a GC pause, SIGSTOP); b takes the session over meanwhile.
    a.signal("-STOP");
    // Past the tenure: b's sweep takes the session up (a request meanwhile would be forwarded
    // to a, which answers nothing while stopped).
    std::thread::sleep(Duration::from_millis(TENURE_MS.parse::<u64>().unwrap() + 1000));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, view) = b.call("GET", "/v1/sessions/p", None);
        if status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "b never took the session over: {status} {view}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    a.signal("-CONT");
    // a wakes up holding a claim of the session: its ack is refused, never applied.
    let (status, body) = a.call("POST", &format!("/v1/claims/{claim}/ack"), None);
    assert_ne!(status, 200, "a paused holder acked after losing the session: {body}");
    // Nothing a held was delivered: b hands every result out, once.
    let mut taken = drain(&b, "p", 10, Duration::from_secs(15));
    assert!(claimed.iter().all(|id| taken.contains(id)), "{claimed:?} {taken:?}");
    taken.sort();
    let mut expected: Vec<String> = (0..10).map(|t| format!("{call}.{t}")).collect();
    expected.sort();
    assert_eq!(taken, expected);
    // a no longer serves it: what reaches a is answered by b.
    let (status, view) = a.call("GET", "/v1/sessions/p", None);
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["counts"]["delivered"], 10, "{view}");
}

#[test]
fn a_database_crash_while_two_processes_share_it_loses_nothing_and_delivers_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = brood_actors::ledger::pg_testkit::Cluster::private();
    let url = cluster.url();
    let a = node(dir.path(), &url, "a");
    let b = node(dir.path(), &url, "b");
    a.open("d");
    b.open("e");
    // Children finishing over four seconds: before, during and after the outage.
    let ms: Vec<u64> = (0..40).map(|i| i * 100).collect();
    let calls = [a.delegate_timed("d", &ms), b.delegate_timed("e", &ms)];
    // Consumers through both processes, for both sessions (half of the requests forwarded),
    // while the database crashes for longer than a tenure and comes back.
    let per_session: [std::sync::Mutex<Vec<String>>; 2] = Default::default();
    std::thread::scope(|scope| {
        for (s, taken) in ["d", "e"].into_iter().zip(&per_session) {
            for n in [&a, &b] {
                scope.spawn(move || drain_into(n, s, 40, Duration::from_secs(60), taken));
            }
        }
        std::thread::sleep(Duration::from_millis(500));
        cluster.stop();
        std::thread::sleep(Duration::from_millis(TENURE_MS.parse::<u64>().unwrap() + 500));
        cluster.start();
    });
    let mut taken: Vec<String> = per_session.into_iter().flat_map(|t| t.into_inner().unwrap()).collect();
    let total = taken.len();
    taken.sort();
    taken.dedup();
    assert_eq!(taken.len(), total, "an item was delivered twice");
    let mut expected: Vec<String> = calls
        .iter()
        .flat_map(|c| (0..40).map(move |t| format!("{c}.{t}")))
        .collect();
    expected.sort();
    assert_eq!(taken, expected, "every result was delivered, once");
}

#[test]
fn a_worker_polling_any_process_gets_the_external_children_of_every_session() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let nodes: Vec<Server> = ["a", "b", "c"].iter().map(|n| node(dir.path(), &url, n)).collect();
    // Served by a; its external children queued there.
    nodes[0].open("x");
    let tasks: Vec<Value> = (0..6)
        .map(|i| json!({"goal": format!("render {i}"), "runner": {"kind": "external", "queue": "gpu"}}))
        .collect();
    let (status, call) = nodes[1].call(
        "POST",
        "/v1/sessions/x/delegate",
        Some(json!({"tasks": tasks, "independent_completions": true})),
    );
    assert_eq!(status, 202, "{call}");
    let call = call["call_id"].as_str().unwrap().to_string();
    // A worker that only knows c: it polls c, heartbeats through b, completes through c.
    let mut done = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while done.len() < 6 {
        assert!(Instant::now() < deadline, "the worker got {done:?} of 6");
        let (status, work) = nodes[2].call(
            "POST",
            "/v1/workers/poll",
            Some(json!({"worker": "w", "queue": "gpu", "wait_ms": 1000})),
        );
        if status == 204 {
            continue;
        }
        assert_eq!(status, 200, "{work}");
        let (child, token) = (work["child_id"].as_str().unwrap(), work["token"].as_str().unwrap());
        let (status, beat) = nodes[1].call(
            "POST",
            &format!("/v1/children/{child}/heartbeat"),
            Some(json!({"token": token, "progress": "half"})),
        );
        assert_eq!(status, 200, "{beat}");
        let (status, end) = nodes[2].call(
            "POST",
            &format!("/v1/children/{child}/complete"),
            Some(json!({"token": token, "status": "succeeded", "summary": format!("{child} done")})),
        );
        assert_eq!(status, 200, "{end}");
        done.push(child.to_string());
    }
    done.sort();
    let mut expected: Vec<String> = (0..6).map(|t| format!("{call}.{t}")).collect();
    expected.sort();
    assert_eq!(done, expected, "each child handed out once");
    let mut taken = drain(&nodes[2], "x", 6, Duration::from_secs(20));
    taken.sort();
    assert_eq!(taken, expected, "every result delivered, through any process");
}

/// Session `x` served by `b`, with one external child (queue `gpu`) listed in the shared work
/// list; its id. `rerun`: the task's `rerun_on_recovery`.
fn listed_at(b: &Server, url: &str, rerun: bool) -> String {
    b.open("x");
    let task = json!({"goal": "render", "runner": {"kind": "external", "queue": "gpu"}, "rerun_on_recovery": rerun});
    let (status, reply) = b.call("POST", "/v1/sessions/x/delegate", Some(json!({"tasks": [task]})));
    assert_eq!(status, 202, "{reply}");
    let child = format!("{}.0", reply["call_id"].as_str().unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    while psql(url, "SELECT count(*) FROM brood.work_directory") != "1" {
        assert!(Instant::now() < deadline, "the child was never listed");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// A poll at `a` of queue `gpu`, waiting up to 20 s.
fn poll_gpu(a: &Server, wait_ms: u64) -> (u16, Value) {
    a.call(
        "POST",
        "/v1/workers/poll",
        Some(json!({"worker": "w", "queue": "gpu", "wait_ms": wait_ms})),
    )
}

#[test]
fn a_poll_does_not_wait_on_a_silent_process() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let (a, b) = (node(dir.path(), &url, "a"), node(dir.path(), &url, "b"));
    let child = listed_at(&b, &url, false);
    // b is paused (well inside its lease): asked for its child, it does not answer.
    b.signal("-STOP");
    let asked = Instant::now();
    let (status, reply) = poll_gpu(&a, 0);
    let took = asked.elapsed();
    b.signal("-CONT");
    assert_eq!(status, 204, "{reply}");
    // A wait of 0 is not ten seconds of asking (the margin is half a second; this bound is
    // generous for a shared machine).
    assert!(took < Duration::from_secs(5), "a poll with wait_ms 0 took {took:?}");
    // b answers again: its child was handed out there, to the poll that gave up on it, or is
    // still listed; a take it serves after its asker gave up is taken back (see below).
    let _ = child;
}

#[test]
fn a_child_listed_by_a_process_that_is_gone_leaves_the_list_and_comes_back_with_its_session() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let (a, mut b) = (node(dir.path(), &url, "a"), node(dir.path(), &url, "b"));
    let child = listed_at(&b, &url, true);
    let b_port = b.port();
    // Nothing listens at b's address any more.
    b.signal("-KILL");
    b.child.wait().unwrap();
    let (status, reply) = poll_gpu(&a, 0);
    assert_eq!(status, 204, "{reply}");
    // Refused at once, and asked for again a little later while b's heartbeat lasts (nothing
    // listening may be a restart under way); once it ran out, the listing at b's address
    // leaves the list (or a, having taken the session over, listed the child anew).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let at_b = format!("SELECT count(*) FROM brood.work_directory WHERE address LIKE '%:{b_port}'");
    while psql(&url, &at_b) != "0" {
        assert!(
            std::time::Instant::now() < deadline,
            "the child of a process that is gone is still listed at its address"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Once a took the session over, it runs the child again (its task may be: it was never
    // handed out, and brood cannot know that) and hands it out.
    let (status, work) = poll_gpu(&a, 20_000);
    assert_eq!(status, 200, "{work}");
    assert_eq!(work["child_id"], child);
}

#[test]
fn a_take_its_asker_gave_up_on_leaves_the_child_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let a = node(dir.path(), &url, "a");
    let b_dir = dir.path().join("b");
    std::fs::create_dir_all(&b_dir).unwrap();
    // b serves a take 1.5 s after it was asked for it.
    let b = Server::start_env(
        &b_dir,
        None,
        &["--ledger", &url, "--node", "b", "--session-lease-ms", TENURE_MS],
        &[("BROOD_FAILPOINTS", "take_stall=1")],
    );
    let child = listed_at(&b, &url, false);
    // a's poll asks b for the child and gives up before b serves the take.
    let (status, reply) = poll_gpu(&a, 0);
    assert_eq!(status, 204, "{reply}");
    // Once b would have served it: the child is not held by the take nobody got (for its
    // 30 s hold), it waits for a worker, and one polling b gets it.
    std::thread::sleep(Duration::from_millis(2500));
    let (status, work) = poll_gpu(&b, 10_000);
    assert_eq!(status, 200, "the child is held by a take nobody got: {work}");
    assert_eq!(work["child_id"], child);
}

#[test]
fn a_listing_that_failed_to_land_is_written_once_the_database_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let (a, b) = (node(dir.path(), &url, "a"), node(dir.path(), &url, "b"));
    b.open("x");
    // The list cannot be written for a while.
    psql(&url, "ALTER TABLE brood.work_directory RENAME TO work_directory_away");
    let task = json!({"goal": "render", "runner": {"kind": "external", "queue": "gpu"}});
    let (status, reply) = b.call("POST", "/v1/sessions/x/delegate", Some(json!({"tasks": [task]})));
    assert_eq!(status, 202, "{reply}");
    std::thread::sleep(Duration::from_millis(1500));
    psql(&url, "ALTER TABLE brood.work_directory_away RENAME TO work_directory");
    let (status, work) = poll_gpu(&a, 20_000);
    assert_eq!(status, 200, "{work}");
    assert_eq!(work["child_id"], format!("{}.0", reply["call_id"].as_str().unwrap()));
}

#[test]
fn two_processes_on_one_database_may_be_started_in_one_folder() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let flags = ["--ledger", url.as_str(), "--allow-command"];
    let a = Server::start_with(dir.path(), None, &flags);
    let b = Server::start_with(dir.path(), None, &flags);
    for s in [&a, &b] {
        let (status, body) = s.call("GET", "/v1/sessions", None);
        assert_eq!(status, 200, "{body}");
    }
}

#[test]
fn a_request_sent_on_to_the_holder_is_counted_where_it_arrived() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let (a, b) = (node(dir.path(), &url, "a"), node(dir.path(), &url, "b"));
    a.open("x");
    let relayed = r#"brood_requests_forwarded_total{outcome="relayed"}"#;
    let before = |s: &Server| server::sample(&server::scrape(s), relayed).unwrap_or(0.0);
    let (a0, b0) = (before(&a), before(&b));
    let (status, view) = b.call("GET", "/v1/sessions/x", None);
    assert_eq!(status, 200, "{view}");
    let (status, view) = a.call("GET", "/v1/sessions/x", None);
    assert_eq!(status, 200, "{view}");
    assert_eq!(before(&b), b0 + 1.0, "b sent the read on to a, once");
    assert_eq!(before(&a), a0, "a served it");
    // The holder gone, a request through b is answered 503 and counted failed; b forgets
    // where the session was, and serves it once its tenure ran out.
    a.kill9();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut refused = 0;
    loop {
        let (status, reply) = b.call("GET", "/v1/sessions/x", None);
        match status {
            200 => break,
            503 if Instant::now() < deadline => {
                refused += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            s => panic!("a read through b after a was killed answered {s}: {reply}"),
        }
    }
    if refused > 0 {
        let failed = server::value(
            &server::scrape(&b),
            r#"brood_requests_forwarded_total{outcome="failed"}"#,
        );
        assert!(failed >= 1.0, "{refused} reads were refused, none counted failed");
    }
}

/// A raw request to `s` with `headers` as given (a header may come twice) and JSON `body`
/// when given: the status, the reply's head (lowercased) and its body.
fn exchange(
    s: &Server,
    method: &str,
    path: &str,
    body: Option<&Value>,
    headers: &[(&str, &str)],
) -> (u16, String, String) {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", s.port())).unwrap();
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let status = reply.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let (head, text) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    (status, head.to_ascii_lowercase(), text.to_string())
}

/// A raw `POST` of JSON `body` to `s` with `headers` as given: the status and the reply's body.
fn post_headers(s: &Server, path: &str, body: &Value, headers: &[(&str, &str)]) -> (u16, String) {
    let (status, _, text) = exchange(s, "POST", path, Some(body), headers);
    (status, text)
}

#[test]
fn a_request_sent_on_carries_every_value_of_a_header_given_twice() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let (a, b) = (node(dir.path(), &url, "a"), node(dir.path(), &url, "b"));
    a.open("x");
    let body = json!({"tasks": [{"goal": "t", "runner": sim(0)}]});
    let twice = [("Idempotency-Key", "k1"), ("Idempotency-Key", "k2")];
    // Where it is served: the request is refused for its two keys, as the process it reached
    // refuses it when it serves the session itself.
    let (status, reply) = post_headers(&a, "/v1/sessions/x/delegate", &body, &twice);
    assert_eq!(status, 400, "{reply}");
    // b finds out that a serves x; the same request through b is sent on before any handler
    // there runs, and a judges it whole: both keys, refused.
    let (status, view) = b.call("GET", "/v1/sessions/x", None);
    assert_eq!(status, 200, "{view}");
    for _ in 0..2 {
        let (status, reply) = post_headers(&b, "/v1/sessions/x/delegate", &body, &twice);
        assert_eq!(status, 400, "sent on with one key of two: {reply}");
        assert!(reply.contains("more than once"), "{reply}");
    }
    // Nothing was called under either key.
    let (status, view) = a.call("GET", "/v1/sessions/x?delivered=true", None);
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["calls"].as_array().map_or(0, Vec::len), 0, "{view}");
}

#[test]
fn a_holder_restarted_at_its_address_is_reached_anew_through_a_peer() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let (a, b) = (node(dir.path(), &url, "a"), node(dir.path(), &url, "b"));
    a.open("x");
    // b sends reads on to a, over a connection it keeps for the next one.
    for _ in 0..3 {
        let (status, view) = b.call("GET", "/v1/sessions/x", None);
        assert_eq!(status, 200, "{view}");
    }
    let port = a.port();
    a.kill9();
    let a = Server::node_on(dir.path(), &url, "a", TENURE_MS, port);
    // Through b, a read is answered 503 (to retry) until a process serves x again: never from
    // the connection to the killed process, and never anything else.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, view) = b.call("GET", "/v1/sessions/x", None);
        if status == 200 {
            assert_eq!(view["session_id"], "x", "{view}");
            break;
        }
        let code = view["error"]["code"].as_str().unwrap_or("");
        assert!(
            status == 503 && ["session_moved", "lease_lapsed"].contains(&code),
            "{status}: {view}"
        );
        assert!(Instant::now() < deadline, "x was never served again");
        std::thread::sleep(Duration::from_millis(50));
    }
    // And a request through a as well.
    let (status, view) = a.call("GET", "/v1/sessions/x", None);
    assert_eq!(status, 200, "{view}");
}

#[test]
fn a_method_a_path_does_not_answer_is_refused_naming_those_it_does_through_any_process() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let (a, b) = (node(dir.path(), &url, "a"), node(dir.path(), &url, "b"));
    a.open("x");
    let (status, head, text) = exchange(&a, "DELETE", "/v1/sessions/x", None, &[]);
    assert_eq!(status, 405, "{text}");
    let allow = head
        .lines()
        .find(|l| l.starts_with("allow:"))
        .unwrap_or_else(|| panic!("no Allow where x is served: {head}"))
        .to_string();
    // b finds out that a serves x; the same request through b is sent on to a, and its
    // answer comes back with the methods the path answers.
    let (status, view) = b.call("GET", "/v1/sessions/x", None);
    assert_eq!(status, 200, "{view}");
    for _ in 0..2 {
        let (status, head, text) = exchange(&b, "DELETE", "/v1/sessions/x", None, &[]);
        assert_eq!(status, 405, "{text}");
        assert!(head.lines().any(|l| l == allow), "no `{allow}` through b: {head}");
    }
}
