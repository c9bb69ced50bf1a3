//! The `command` and `external` runners over HTTP, on the real `brood serve`: a command's output
//! tail as its summary, its exit code, its process group killed on timeout and on shutdown; an
//! external child polled (long-poll), heartbeated and completed by a worker, handed out again
//! with a new token when its hold runs out; and every bad request of a worker answered in
//! API.md's error shape.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
mod server;
use common::gone;
use server::*;

fn command(argv: &[&str]) -> Value {
    json!({"kind": "command", "argv": argv})
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "not within 30 s: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The pid a command wrote to `file`, once it did.
fn pid_in(file: &Path) -> u32 {
    let mut pid = 0;
    wait_until("the command wrote its grandchild's pid", || {
        pid = std::fs::read_to_string(file)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
        pid != 0
    });
    pid
}

/// A shell that leaves a grandchild (`sleep 300`) in its group, writes its pid, and waits.
fn leaves_a_grandchild(pidfile: &Path) -> Value {
    let script = format!("sleep 300 & echo $! > '{}'; sleep 300", pidfile.display());
    command(&["sh", "-c", &script])
}

/// Runs one command child on a server that allows commands: its delegation reply and its
/// result.
fn run_command(runner: Value) -> (Value, Value) {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), None, &["--allow-command"]);
    s.open("c");
    let reply = s.delegate_task("c", json!({"goal": "run", "runner": runner}));
    (reply, s.only_result("c"))
}

#[test]
fn a_command_succeeds_with_the_tail_of_its_output_as_summary() {
    let script = "i=0; while [ $i -lt 3000 ]; do echo \"line $i\"; i=$((i+1)); done";
    let (_, item) = run_command(command(&["sh", "-c", script]));
    assert_eq!(item["status"], "succeeded", "{item}");
    let summary = item["summary"].as_str().unwrap();
    assert!(summary.len() <= 4096, "the tail is at most 4 KiB: {}", summary.len());
    assert!(summary.starts_with('…'), "the cut is marked: {summary:.40}");
    assert!(summary.ends_with("line 2999"), "{summary}");
    assert!(!summary.contains("line 1\n"), "the start was cut");
}

#[test]
fn a_command_gets_its_env_and_cwd() {
    let work = tempfile::tempdir().unwrap();
    let (reply, item) = run_command(json!({
        "kind": "command",
        "argv": ["sh", "-c", "echo \"$GREETING from $(pwd) as $BROOD_CHILD_ID\" >&2"],
        "env": {"GREETING": "hello"},
        "cwd": work.path(),
    }));
    let cwd = work.path().canonicalize().unwrap();
    let child_id = format!("{}.0", reply["call_id"].as_str().unwrap());
    let expected = format!("hello from {} as {child_id}", cwd.display());
    assert_eq!(item["summary"], expected, "{item}");
}

#[test]
fn a_nonzero_exit_fails_naming_the_code_with_the_output_as_summary() {
    let (_, item) = run_command(command(&["sh", "-c", "echo oops; exit 3"]));
    assert_eq!(item["status"], "failed", "{item}");
    assert!(item["error"].as_str().unwrap().contains("exited with code 3"), "{item}");
    assert_eq!(item["summary"], "oops");
}

#[test]
fn a_command_killed_by_a_signal_fails_naming_it() {
    let (_, item) = run_command(command(&["sh", "-c", "kill -TERM $$"]));
    assert_eq!(item["status"], "failed", "{item}");
    let error = item["error"].as_str().unwrap();
    assert!(error.contains("signal 15 (SIGTERM)"), "{error}");
}

#[test]
fn a_program_that_cannot_start_fails_saying_why() {
    let (_, item) = run_command(command(&["/no/such/program"]));
    assert_eq!(item["status"], "failed", "{item}");
    let error = item["error"].as_str().unwrap();
    assert!(
        error.contains("/no/such/program") && error.contains("could not be started"),
        "{error}"
    );
    let (_, item) = run_command(json!({"kind": "command", "argv": ["true"], "cwd": "/no/such/folder"}));
    assert_eq!(item["status"], "failed", "{item}");
    assert!(item["error"].as_str().unwrap().contains("/no/such/folder"), "{item}");
}

#[test]
fn command_is_refused_with_403_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("r");
    let m = assert_error(
        s.call(
            "POST",
            "/v1/sessions/r/delegate",
            Some(json!({"tasks": [{"goal": "g", "runner": command(&["true"])}]})),
        ),
        403,
        "runner_not_allowed",
    );
    assert!(
        m.contains("tasks[0].runner.kind") && m.contains("--allow-command"),
        "{m}"
    );
    let (status, view) = s.call("GET", "/v1/sessions/r", None);
    assert_eq!(status, 200);
    assert_eq!(view["calls"], json!([]), "a refused call stores nothing: {view}");
}

#[test]
fn allowed_runners_refuses_the_kinds_it_does_not_list() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), None, &["--allowed-runners", "sim"]);
    s.open("a");
    let m = assert_error(
        s.call(
            "POST",
            "/v1/sessions/a/delegate",
            Some(json!({"tasks": [{"goal": "g", "runner": sim(0)}, {"goal": "h", "runner": {"kind": "external"}}]})),
        ),
        403,
        "runner_not_allowed",
    );
    assert!(m.contains("tasks[1]") && m.contains("allowed: sim"), "{m}");
}

#[test]
fn a_bad_runner_spec_is_400_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), None, &["--allow-command"]);
    s.open("b");
    let bad = |runner: Value| {
        assert_error(
            s.call(
                "POST",
                "/v1/sessions/b/delegate",
                Some(json!({"tasks": [{"goal": "g", "runner": runner}]})),
            ),
            400,
            "invalid_request",
        )
    };
    assert!(bad(json!({"kind": "command", "argv": []})).contains("argv"));
    assert!(bad(json!({"kind": "command"})).contains("argv"));
    assert!(bad(json!({"kind": "command", "argv": ["true"], "shell": true})).contains("shell"));
    assert!(bad(json!({"kind": "command", "argv": ["true"], "env": {"A": 1}})).contains("env"));
    assert!(bad(json!({"kind": "external", "queue": ""})).contains("queue"));
    assert!(bad(json!({"kind": "external", "lane": "x"})).contains("lane"));
    let (_, view) = s.call("GET", "/v1/sessions/b", None);
    assert_eq!(view["calls"], json!([]), "{view}");
}

#[test]
fn a_timed_out_command_takes_its_whole_process_group_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let pidfile = files.path().join("grandchild.pid");
    let s = Server::start_with(dir.path(), None, &["--allow-command"]);
    s.open("t");
    s.delegate_task(
        "t",
        json!({"goal": "hang", "runner": leaves_a_grandchild(&pidfile), "timeout_ms": 800}),
    );
    let grandchild = pid_in(&pidfile);
    let item = s.only_result("t");
    assert_eq!(item["status"], "timed_out", "{item}");
    wait_until("the grandchild is killed with its group", || gone(grandchild));
}

#[test]
fn stopping_the_server_kills_a_running_commands_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let pidfile = files.path().join("grandchild.pid");
    // The drain gives running children this long to end; this one never would.
    let s = Server::start_with(dir.path(), None, &["--allow-command", "--drain-timeout-ms", "500"]);
    s.open("s");
    s.delegate_task("s", json!({"goal": "hang", "runner": leaves_a_grandchild(&pidfile)}));
    let grandchild = pid_in(&pidfile);
    assert!(!gone(grandchild), "the grandchild runs while the server does");
    let status = s.terminate();
    assert!(status.success(), "{status}");
    wait_until("the grandchild is killed when the server stops", || gone(grandchild));
}

fn poll(s: &Server, body: Value) -> (u16, Value) {
    s.call("POST", "/v1/workers/poll", Some(body))
}

#[test]
fn an_external_child_round_trips_through_a_worker() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("x");
    std::thread::scope(|scope| {
        // The worker waits before there is anything to take: the poll is answered when the
        // child is queued, within its wait.
        let worker = scope.spawn(|| poll(&s, json!({"worker": "w1", "queue": "gpu", "wait_ms": 30_000})));
        std::thread::sleep(Duration::from_millis(300));
        let reply = s.delegate_task(
            "x",
            json!({"goal": "render frame 7", "runner": {"kind": "external", "queue": "gpu"}}),
        );
        let (status, work) = worker.join().unwrap();
        assert_eq!(status, 200, "{work}");
        let child_id = work["child_id"].as_str().unwrap().to_string();
        assert_eq!(child_id, format!("{}.0", reply["call_id"].as_str().unwrap()));
        assert_eq!(work["goal"], "render frame 7");
        assert_eq!(work["lease_ms"], 30_000, "the default lease");
        let token = work["token"].as_str().unwrap();
        let (status, beat) = s.call(
            "POST",
            &format!("/v1/children/{child_id}/heartbeat"),
            Some(json!({"token": token, "progress": "half done"})),
        );
        assert_eq!((status, beat["lease_ms"].as_u64()), (200, Some(30_000)), "{beat}");
        let (status, done) = s.call(
            "POST",
            &format!("/v1/children/{child_id}/complete"),
            Some(json!({"token": token, "status": "succeeded", "summary": "frame 7 rendered", "error": null})),
        );
        assert_eq!(status, 200, "{done}");
        let item = s.only_result("x");
        assert_eq!(
            (item["status"].as_str(), item["summary"].as_str()),
            (Some("succeeded"), Some("frame 7 rendered"))
        );
        // Nothing is left to take, on this queue or the default one.
        assert_eq!(poll(&s, json!({"worker": "w1", "queue": "gpu"})).0, 204);
        assert_eq!(poll(&s, json!({"worker": "w1"})).0, 204);
    });
}

#[test]
fn a_take_with_a_deadline_is_checked_on_the_clock_of_a_process_that_shares_no_work_list() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("x");
    let reply = s.delegate_task(
        "x",
        json!({"goal": "render", "runner": {"kind": "external", "queue": "gpu"}}),
    );
    let child = format!("{}.0", reply["call_id"].as_str().unwrap());
    let take = |answer_by_ms: u64| {
        s.call(
            "POST",
            "/v1/workers/take",
            Some(json!({"child_id": child, "worker": "w", "lease_ms": 30_000, "answer_by_ms": answer_by_ms})),
        )
    };
    let (status, refused) = take(1);
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"]["code"], "take_expired", "{refused}");
    // Nothing was handed out: a take in time gets the child.
    let (status, work) = take(13_569_465_600_000);
    assert_eq!(status, 200, "{work}");
    assert_eq!(work["child_id"], child);
}

#[test]
fn a_worker_can_report_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("wf");
    s.delegate_task("wf", json!({"goal": "g", "runner": {"kind": "external"}}));
    let (status, work) = poll(&s, json!({"worker": "w", "wait_ms": 20_000}));
    assert_eq!(status, 200, "{work}");
    let (status, _) = s.call(
        "POST",
        &format!("/v1/children/{}/complete", work["child_id"].as_str().unwrap()),
        Some(json!({"token": work["token"], "status": "failed", "error": "GPU on fire", "summary": "got to 40%"})),
    );
    assert_eq!(status, 200);
    let item = s.only_result("wf");
    assert_eq!(item["status"], "failed", "{item}");
    assert_eq!(
        (item["error"].as_str(), item["summary"].as_str()),
        (Some("GPU on fire"), Some("got to 40%"))
    );
}

#[test]
fn a_lapsed_hold_hands_the_child_out_again_with_a_new_token() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("l");
    s.delegate_task("l", json!({"goal": "g", "runner": {"kind": "external"}}));
    let (status, first) = poll(&s, json!({"worker": "slow", "wait_ms": 20_000, "lease_ms": 1000}));
    assert_eq!(status, 200, "{first}");
    // No heartbeat: the hold runs out and the next poll gets the same child.
    let (status, second) = poll(&s, json!({"worker": "fast", "wait_ms": 30_000}));
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["child_id"], first["child_id"]);
    assert_ne!(second["token"], first["token"], "a new hold, a new token");
    let child = first["child_id"].as_str().unwrap();
    let heartbeat = format!("/v1/children/{child}/heartbeat");
    let complete = format!("/v1/children/{child}/complete");
    assert_error(
        s.call("POST", &heartbeat, Some(json!({"token": first["token"]}))),
        409,
        "stale_token",
    );
    assert_error(
        s.call(
            "POST",
            &complete,
            Some(json!({"token": first["token"], "status": "succeeded", "summary": "late"})),
        ),
        409,
        "stale_token",
    );
    let (status, _) = s.call(
        "POST",
        &complete,
        Some(json!({"token": second["token"], "status": "succeeded", "summary": "on time"})),
    );
    assert_eq!(status, 200);
    assert_eq!(s.only_result("l")["summary"], "on time");
}

#[test]
fn a_timed_out_external_child_leaves_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("to");
    s.delegate_task(
        "to",
        json!({"goal": "g", "runner": {"kind": "external"}, "timeout_ms": 1000}),
    );
    let (status, work) = poll(&s, json!({"worker": "w", "wait_ms": 20_000}));
    assert_eq!(status, 200, "{work}");
    let item = s.only_result("to");
    assert_eq!(item["status"], "timed_out", "{item}");
    let child = work["child_id"].as_str().unwrap();
    assert_error(
        s.call(
            "POST",
            &format!("/v1/children/{child}/heartbeat"),
            Some(json!({"token": work["token"]})),
        ),
        409,
        "child_ended",
    );
    assert_error(
        s.call(
            "POST",
            &format!("/v1/children/{child}/complete"),
            Some(json!({"token": work["token"], "status": "succeeded"})),
        ),
        409,
        "child_ended",
    );
}

#[test]
fn bad_worker_input_gets_the_error_shape() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    let bad_poll = |body: Value| assert_error(poll(&s, body), 400, "invalid_request");
    assert!(bad_poll(json!({})).contains("worker"));
    assert!(bad_poll(json!({"worker": ""})).contains("worker"));
    assert!(bad_poll(json!({"worker": "w", "wait_ms": 30_001})).contains("wait_ms"));
    assert!(bad_poll(json!({"worker": "w", "wait_ms": -1})).contains("wait_ms"));
    assert!(bad_poll(json!({"worker": "w", "lease_ms": 10})).contains("lease_ms"));
    assert!(bad_poll(json!({"worker": "w", "queue": ""})).contains("queue"));
    assert!(bad_poll(json!({"worker": "w", "colour": "red"})).contains("colour"));
    let m = assert_error(
        s.raw("POST", "/v1/workers/poll", Some(b"{not json".to_vec()), None),
        400,
        "invalid_request",
    );
    assert!(m.contains("not valid JSON"), "{m}");
    assert_error(
        s.call("POST", "/v1/children/nobody.0/heartbeat", Some(json!({"token": "t"}))),
        404,
        "unknown_child",
    );
    assert_error(
        s.call(
            "POST",
            "/v1/children/nobody.0/complete",
            Some(json!({"token": "t", "status": "succeeded"})),
        ),
        404,
        "unknown_child",
    );

    s.open("w");
    s.delegate_task("w", json!({"goal": "g", "runner": {"kind": "external"}}));
    let (status, work) = poll(&s, json!({"worker": "w", "wait_ms": 20_000}));
    assert_eq!(status, 200, "{work}");
    let child = work["child_id"].as_str().unwrap();
    let heartbeat = format!("/v1/children/{child}/heartbeat");
    let complete = format!("/v1/children/{child}/complete");
    assert_error(
        s.call("POST", &heartbeat, Some(json!({"token": "wtk_wrong"}))),
        409,
        "stale_token",
    );
    assert!(assert_error(s.call("POST", &heartbeat, Some(json!({}))), 400, "invalid_request").contains("token"));
    let m = assert_error(
        s.call(
            "POST",
            &complete,
            Some(json!({"token": work["token"], "status": "done"})),
        ),
        400,
        "invalid_request",
    );
    assert!(m.contains("status") && m.contains("succeeded"), "{m}");
    assert_error(
        s.call(
            "POST",
            &complete,
            Some(json!({"token": "wtk_wrong", "status": "succeeded"})),
        ),
        409,
        "stale_token",
    );
    // None of that took the child from its worker.
    let (status, _) = s.call("POST", &heartbeat, Some(json!({"token": work["token"]})));
    assert_eq!(status, 200);
}

#[test]
fn cancelling_a_command_kills_its_process_group_and_twice_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let pidfile = files.path().join("grandchild.pid");
    let s = Server::start_with(dir.path(), None, &["--allow-command"]);
    s.open("k");
    let reply = s.delegate_task("k", json!({"goal": "hang", "runner": leaves_a_grandchild(&pidfile)}));
    let child = format!("{}.0", reply["call_id"].as_str().unwrap());
    let grandchild = pid_in(&pidfile);
    let path = format!("/v1/children/{child}/cancel");
    let (status, done) = s.call("POST", &path, Some(json!({"reason": "no longer wanted"})));
    assert_eq!(
        (status, done.clone()),
        (200, json!({"cancelled": [child.clone()], "already_finished": 0}))
    );
    let item = s.only_result("k");
    assert_eq!(item["status"], "cancelled", "{item}");
    let error = item["error"].as_str().unwrap();
    assert!(error.contains("no longer wanted") && error.contains(&child), "{error}");
    wait_until("the grandchild is killed with its group", || gone(grandchild));
    let (status, again) = s.call("POST", &path, None);
    assert_eq!((status, again), (200, json!({"cancelled": [], "already_finished": 1})));
    let (status, err) = s.call("POST", &format!("/v1/children/{child}9/cancel"), None);
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (404, Some("unknown_child")),
        "{err}"
    );
    let (status, err) = s.call("POST", "/v1/units/nothing-1/cancel", None);
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (404, Some("unknown_unit")),
        "{err}"
    );
    let (status, err) = s.call("POST", &path, Some(json!({"why": "typo"})));
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (400, Some("invalid_request")),
        "{err}"
    );
}

#[test]
fn a_cancelled_external_child_answers_its_worker_409() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("x");
    let reply = s.delegate_task("x", json!({"goal": "render", "runner": {"kind": "external"}}));
    let call = reply["call_id"].as_str().unwrap();
    let (status, work) = poll(&s, json!({"worker": "w1", "wait_ms": 10_000}));
    assert_eq!(status, 200, "{work}");
    let (child, token) = (work["child_id"].as_str().unwrap(), work["token"].as_str().unwrap());
    let (status, done) = s.call("POST", &format!("/v1/calls/{call}/cancel"), None);
    assert_eq!(
        (status, done),
        (200, json!({"cancelled": [child], "already_finished": 0}))
    );
    let (status, beat) = s.call(
        "POST",
        &format!("/v1/children/{child}/heartbeat"),
        Some(json!({"token": token, "progress": "still here"})),
    );
    assert_eq!(status, 409, "{beat}");
    let (status, late) = s.call(
        "POST",
        &format!("/v1/children/{child}/complete"),
        Some(json!({"token": token, "status": "succeeded", "summary": "done anyway", "error": null})),
    );
    assert_eq!(status, 409, "{late}");
    let item = s.only_result("x");
    assert_eq!(item["status"], "cancelled", "{item}");
}

/// The child id of the first child of `call_id`, once it runs.
fn running_child(s: &Server, session: &str, call_id: &str) -> String {
    let child = format!("{call_id}.0");
    wait_until("the child runs", || {
        let (_, st) = s.call("GET", &format!("/v1/sessions/{session}"), None);
        st["calls"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["children"].as_array().cloned().unwrap_or_default())
            .any(|ch| ch["child_id"] == child.as_str() && ch["status"] == "running")
    });
    child
}

#[test]
fn a_running_child_delegates_through_its_own_session_within_max_depth() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    let hang = json!({"goal": "wait", "runner": {"kind": "sim", "outcome": "hang"}});
    s.open("p");
    let call = s.delegate_task("p", hang.clone())["call_id"]
        .as_str()
        .unwrap()
        .to_string();
    let child = running_child(&s, "p", &call);

    s.open(&child);
    let (status, st) = s.call("GET", &format!("/v1/sessions/{child}"), None);
    assert_eq!(
        (status, st["parent_child_id"].as_str()),
        (200, Some(child.as_str())),
        "{st}"
    );
    let inner = s.delegate_task(&child, hang.clone())["call_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        s.call("GET", &format!("/v1/sessions/{child}"), None).1["calls"][0]["set"],
        1
    );
    let grandchild = running_child(&s, &child, &inner);
    s.open(&grandchild);
    let message = assert_error(
        s.call(
            "POST",
            &format!("/v1/sessions/{grandchild}/delegate"),
            Some(json!({"tasks": [{"goal": "too deep", "runner": sim(0)}]})),
        ),
        400,
        "max_depth_exceeded",
    );
    assert!(message.contains("depth 3"), "{message}");
    let (_, st) = s.call("GET", &format!("/v1/sessions/{grandchild}"), None);
    assert_eq!(st["calls"].as_array().map(Vec::len), Some(0), "nothing changed: {st}");

    let (_, listed) = s.call("GET", "/v1/sessions", None);
    let parent_of = |id: &str| {
        listed["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["session_id"] == id)
            .map(|e| e["parent_child_id"].clone())
    };
    assert_eq!(parent_of("p"), Some(Value::Null), "{listed}");
    assert_eq!(parent_of(&child), Some(json!(child)), "{listed}");
    assert_eq!(parent_of(&grandchild), Some(json!(grandchild)), "{listed}");

    // Cancelling the top call cancels its descendants, and the child's session takes no more.
    let (status, reply) = s.call("POST", &format!("/v1/calls/{call}/cancel"), None);
    assert_eq!(status, 200, "{reply}");
    let mut cancelled: Vec<&str> = reply["cancelled"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    cancelled.sort();
    let mut expected = vec![child.as_str(), grandchild.as_str()];
    expected.sort();
    assert_eq!(cancelled, expected, "{reply}");
    assert_error(
        s.call(
            "POST",
            &format!("/v1/sessions/{child}/delegate"),
            Some(json!({"tasks": [{"goal": "late", "runner": sim(0)}]})),
        ),
        409,
        "parent_ended",
    );
    // A session named after a child no call has is refused.
    assert_error(
        s.call("PUT", "/v1/sessions/deleg_00000000000000ff.0", Some(json!({}))),
        404,
        "unknown_child",
    );
}
