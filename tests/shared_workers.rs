//! External workers against several `brood serve` processes sharing one PostgreSQL database:
//! a process that lost the child's session without noticing yet neither renews the child for
//! its worker (the heartbeat goes to the session's holder) nor answers a completion 200 before
//! its row is recorded (it refuses it, 409, instead of dropping the result), and a worker
//! whose process died is told what became of its child by any process, as soon as the ledger
//! knows: the recorded outcome for the completion that was recorded, 409 once the child ended
//! otherwise; a heartbeat renews the child while a database outage shorter than the session
//! tenure lasts.

mod server;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server::{assert_error, psql, Server};

fn node(dir: &Path, url: &str, name: &str, lease_ms: &str) -> Server {
    Server::node(dir, url, name, lease_ms)
}

/// Session `x` opened through `s` with one external child that is not safe to re-run, handed
/// to a worker polling `s`: its id and token.
fn held_child(s: &Server) -> (String, String) {
    s.open("x");
    let task = json!({"goal": "render", "runner": {"kind": "external"}});
    let (status, reply) = s.call("POST", "/v1/sessions/x/delegate", Some(json!({"tasks": [task]})));
    assert_eq!(status, 202, "{reply}");
    s.poll_work()
}

/// The status of `child` of session `x` as `s` shows it, once `s` answers and the child is
/// neither queued nor running.
fn ended_as(s: &Server, child: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, view) = s.call("GET", "/v1/sessions/x", None);
        let found = view["calls"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["children"].as_array().cloned().unwrap_or_default())
            .find(|c| c["child_id"] == child)
            .and_then(|c| c["status"].as_str().map(str::to_string));
        match found {
            Some(s) if status == 200 && s != "queued" && s != "running" => return s,
            _ => {}
        }
        assert!(Instant::now() < deadline, "{child} did not end: {status} {view}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn complete(s: &Server, child: &str, body: Value) -> (u16, Value) {
    s.call("POST", &format!("/v1/children/{child}/complete"), Some(body))
}

#[test]
fn a_holder_that_lost_the_session_unnoticed_refuses_a_heartbeat_and_a_completion_it_cannot_record() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    // a renews its tenures every 200 s: it will not notice losing one within this test.
    let a = node(dir.path(), &url, "a", "600000");
    let b = node(dir.path(), &url, "b", "2000");
    let (child, token) = held_child(&a);
    // a's tenure of `x` runs out (as through a long pause); b's sweep takes the session over
    // and recovers it: the child, not safe to re-run, ends `unknown`.
    psql(
        &url,
        "UPDATE brood.session_leases SET expires_at = now() - interval '1 second' WHERE session = 'x'::bytea",
    );
    assert_eq!(ended_as(&b, &child), "unknown");
    assert_eq!(
        psql(
            &url,
            "SELECT owner FROM brood.session_leases WHERE session = 'x'::bytea"
        ),
        "b"
    );
    // a still holds the child for its worker, but renews it no more: a heartbeat is sent on
    // to b, the session's holder, where the child ended.
    assert_error(
        a.call(
            "POST",
            &format!("/v1/children/{child}/heartbeat"),
            Some(json!({"token": token})),
        ),
        409,
        "child_ended",
    );
    // What it is told of a completion must not be a 200 that no row backs: a's write of the
    // row is refused, so is the completion.
    let done = json!({"token": token, "status": "succeeded", "summary": "frame 7"});
    assert_error(complete(&a, &child, done.clone()), 409, "stale_token");
    assert_eq!(ended_as(&b, &child), "unknown", "the recorded outcome stands");
    // Sent again anywhere: the child ended, and not as the worker says.
    for s in [&a, &b] {
        assert_error(complete(s, &child, done.clone()), 409, "child_ended");
    }
}

#[test]
fn a_completion_recorded_before_its_holder_died_is_answered_by_any_process_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    // Tenures of a minute: b could not take the session over within this test.
    let a = node(dir.path(), &url, "a", "60000");
    let b = node(dir.path(), &url, "b", "60000");
    let (child, token) = held_child(&a);
    let done = json!({"token": token, "status": "succeeded", "summary": "frame 7"});
    let (status, first) = complete(&a, &child, done.clone());
    assert_eq!(status, 200, "{first}");
    // a dies before the worker heard its answer; its tenure of `x` is live for a minute more.
    a.kill9();
    // The worker sends its completion again through b: the ledger recorded it, so b answers
    // with the recorded outcome, not 503 `session_moved` to a dead process.
    let (status, again) = complete(&b, &child, done);
    assert_eq!(
        (status, again),
        (
            200,
            json!({"child_id": child, "status": "succeeded", "summary": "frame 7", "output": null, "error": null})
        )
    );
    assert_error(
        complete(&b, &child, json!({"token": token, "status": "failed", "error": "late"})),
        409,
        "child_ended",
    );
}

#[test]
fn a_dead_holders_token_is_told_409_once_its_child_ended() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let a = node(dir.path(), &url, "a", "2000");
    let b = node(dir.path(), &url, "b", "2000");
    let c = node(dir.path(), &url, "c", "2000");
    let (child, token) = held_child(&a);
    a.kill9();
    // While a's tenure is live, nobody can say what became of the child: retry. Once b or c
    // took the session over, the token is void (409), and the child, not safe to re-run,
    // ended `unknown`.
    let deadline = Instant::now() + Duration::from_secs(30);
    let done = json!({"token": token, "status": "succeeded", "summary": "frame 7"});
    let answered = loop {
        let reply = complete(&b, &child, done.clone());
        if reply.0 != 503 {
            break reply;
        }
        assert!(Instant::now() < deadline, "still 503: {}", reply.1);
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(answered.0, 409, "{}", answered.1);
    assert_eq!(ended_as(&c, &child), "unknown");
    // From then on, through every process, heartbeat or completion: it ended.
    for s in [&b, &c] {
        assert_error(complete(s, &child, done.clone()), 409, "child_ended");
        assert_error(
            s.call(
                "POST",
                &format!("/v1/children/{child}/heartbeat"),
                Some(json!({"token": token})),
            ),
            409,
            "child_ended",
        );
    }
}

#[test]
fn a_heartbeat_during_a_database_outage_shorter_than_the_session_tenure_renews_the_child() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = brood_actors::ledger::pg_testkit::Cluster::private();
    let a = node(dir.path(), &cluster.url(), "a", "60000");
    let (child, token) = held_child(&a);
    // The database goes away for a moment: a's tenure of `x` runs for a minute more, the tenure
    // row cannot be read, and the worker keeps its child.
    cluster.stop();
    let beat = a.call(
        "POST",
        &format!("/v1/children/{child}/heartbeat"),
        Some(json!({"token": token})),
    );
    cluster.start();
    assert_eq!(beat.0, 200, "{}", beat.1);
    let done = json!({"token": token, "status": "succeeded", "summary": "frame 7"});
    let (status, reply) = complete(&a, &child, done);
    assert_eq!(status, 200, "{reply}");
    assert_eq!(ended_as(&a, &child), "succeeded");
}
