//! What an external worker hears when it completes a child, and when it sends a completion
//! again (its answer was lost, or the server restarted meanwhile): the completion that was
//! recorded answers 200 with the recorded outcome, any other completion or heartbeat of an
//! ended child 409 `child_ended`, a token a restart voided 409, and an id that names no child
//! 404 `unknown_child`.

mod server;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server::{assert_error, Server};

fn delegate(s: &Server, session: &str, tasks: Vec<Value>) -> String {
    let (status, reply) = s.call(
        "POST",
        &format!("/v1/sessions/{session}/delegate"),
        Some(json!({"tasks": tasks, "independent_completions": true})),
    );
    assert_eq!(status, 202, "{reply}");
    reply["call_id"].as_str().unwrap().to_string()
}

fn external(goal: &str, rerun: bool) -> Value {
    json!({"goal": goal, "runner": {"kind": "external"}, "rerun_on_recovery": rerun})
}

fn complete(s: &Server, child: &str, body: Value) -> (u16, Value) {
    s.call("POST", &format!("/v1/children/{child}/complete"), Some(body))
}

fn heartbeat(s: &Server, child: &str, token: &str) -> (u16, Value) {
    s.call(
        "POST",
        &format!("/v1/children/{child}/heartbeat"),
        Some(json!({"token": token})),
    )
}

/// The status of `child` in its session's view, once it is not `running` or `queued`.
fn ended_as(s: &Server, session: &str, child: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, view) = s.call("GET", &format!("/v1/sessions/{session}"), None);
        let status = view["calls"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["children"].as_array().cloned().unwrap_or_default())
            .find(|c| c["child_id"] == child)
            .map(|c| c["status"].as_str().unwrap_or_default().to_string());
        if let Some(s) = status.filter(|s| s != "running" && s != "queued") {
            return s;
        }
        assert!(Instant::now() < deadline, "{child} did not end: {view}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_completion_sent_again_answers_its_recorded_outcome_and_another_answers_child_ended() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("x");
    delegate(&s, "x", vec![external("render", false)]);
    let (child, token) = s.poll_work();
    let done = json!({"token": token, "status": "succeeded", "summary": "frame 7"});
    let (status, first) = complete(&s, &child, done.clone());
    assert_eq!(status, 200, "{first}");
    let recorded =
        json!({"child_id": child, "status": "succeeded", "summary": "frame 7", "output": null, "error": null});
    assert_eq!(first, recorded);
    // Its answer lost, the worker sends it again: what was recorded.
    let (status, again) = complete(&s, &child, done);
    assert_eq!((status, again), (200, recorded));
    // Any other end of it is not what happened.
    assert_error(
        complete(
            &s,
            &child,
            json!({"token": token, "status": "succeeded", "summary": "frame 8"}),
        ),
        409,
        "child_ended",
    );
    assert_error(
        complete(&s, &child, json!({"token": token, "status": "failed", "error": "no"})),
        409,
        "child_ended",
    );
    assert_error(heartbeat(&s, &child, &token), 409, "child_ended");
    assert_eq!(ended_as(&s, "x", &child), "succeeded");
    // An id no call has is still unknown.
    let (call, _) = child.rsplit_once('.').unwrap();
    assert_error(
        complete(&s, &format!("{call}.9"), json!({"token": token, "status": "succeeded"})),
        404,
        "unknown_child",
    );
}

#[test]
fn a_completion_sent_again_after_a_restart_answers_its_recorded_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("r");
    delegate(&s, "r", vec![external("render", false)]);
    let (child, token) = s.poll_work();
    let done = json!({"token": token, "status": "failed", "error": "GPU on fire", "summary": "40%"});
    let (status, first) = complete(&s, &child, done.clone());
    assert_eq!(status, 200, "{first}");
    s.kill9();
    let s = Server::start(dir.path(), None);
    let (status, again) = complete(&s, &child, done);
    assert_eq!(
        (status, again),
        (
            200,
            json!({"child_id": child, "status": "failed", "summary": "40%", "output": null, "error": "GPU on fire"})
        )
    );
    assert_error(
        complete(&s, &child, json!({"token": token, "status": "succeeded"})),
        409,
        "child_ended",
    );
}

#[test]
fn a_token_voided_by_a_restart_answers_409() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("v");
    delegate(
        &s,
        "v",
        vec![external("not safe to re-run", false), external("safe to re-run", true)],
    );
    let held: Vec<(String, String)> = (0..2).map(|_| s.poll_work()).collect();
    s.kill9();
    let s = Server::start(dir.path(), None);
    s.open("v");
    for (child, token) in &held {
        if child.ends_with(".0") {
            // Recovery ended it `unknown`: it ended, and not as this worker says.
            assert_eq!(ended_as(&s, "v", child), "unknown");
            assert_error(heartbeat(&s, child, token), 409, "child_ended");
            assert_error(
                complete(&s, child, json!({"token": token, "status": "succeeded"})),
                409,
                "child_ended",
            );
        } else {
            // Queued again: handed out with a new token, the old one is stale.
            let (again, new_token) = s.poll_work();
            assert_eq!(&again, child);
            assert_error(heartbeat(&s, child, token), 409, "stale_token");
            assert_error(
                complete(&s, child, json!({"token": token, "status": "succeeded"})),
                409,
                "stale_token",
            );
            let (status, done) = complete(
                &s,
                child,
                json!({"token": new_token, "status": "succeeded", "summary": "second run"}),
            );
            assert_eq!(status, 200, "{done}");
        }
    }
}

/// Held by each test that arms a fault point: the points are the process's, and a point one
/// arms would fire in the engine of another running beside it.
#[cfg(feature = "failpoints")]
static FAULTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// An engine in `dir` whose external children wait in the queues it answers with, and one
/// external child (queue `default`) delegated to its addressable session `s`: the engine, the
/// queues and the child's id.
#[cfg(feature = "failpoints")]
async fn one_external_child(
    dir: &std::path::Path,
) -> (brood::Brood, std::sync::Arc<brood::runners::WorkQueues>, String) {
    use brood::{Brood, BroodConfig, DelegateRequest, Runners, SessionSettings, TaskSpec};

    let queues = std::sync::Arc::new(brood::runners::WorkQueues::new());
    let mut runners = Runners::builtin();
    runners.register_external(queues.clone());
    let b = Brood::open(BroodConfig::new(dir.join("ledger")).runners(runners)).unwrap();
    b.open_session("s", SessionSettings::default().addressable(true))
        .await
        .unwrap();
    let task = TaskSpec::new("render", json!({"kind": "external"}));
    let call = b
        .delegate("s", DelegateRequest::background(vec![task]))
        .await
        .map_err(|e| e.error)
        .unwrap();
    let child = format!("{}.0", call.call_id());
    (b, queues, child)
}

/// A completion whose row cannot be recorded yet (every flush of the ledger fails) is answered
/// as not recorded when its wait runs out; the same completion sent again waits for that same
/// row, and is answered once the ledger takes it.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_not_recorded_in_its_wait_is_answered_so_and_the_same_again_waits_for_its_row() {
    use brood::runners::WorkError;
    use brood::RunOutput;

    let _faults = FAULTS.lock().await;
    brood::failpoints::disarm_all();
    let dir = tempfile::tempdir().unwrap();
    let (b, queues, _) = one_external_child(dir.path()).await;
    let work = queues
        .poll("default", "w", Duration::from_secs(20), Duration::from_secs(60))
        .await
        .expect("the child was handed out");
    let output = RunOutput::Succeeded {
        summary: "frame 7".into(),
        output: None,
    };
    brood::failpoints::arm("ledger_flush", u64::MAX);
    let first = queues.complete(&work.child_id, &work.token, output.clone()).unwrap();
    assert_eq!(
        first.outcome(Duration::from_millis(300)).await,
        Err(WorkError::NotRecorded(work.child_id.clone()))
    );
    let other = RunOutput::Succeeded {
        summary: "frame 8".into(),
        output: None,
    };
    assert_eq!(
        queues.complete(&work.child_id, &work.token, other).err(),
        Some(WorkError::Ended(work.child_id.clone())),
        "another end of a child already ending"
    );
    let again = queues.complete(&work.child_id, &work.token, output.clone()).unwrap();
    brood::failpoints::disarm_all();
    assert_eq!(again.outcome(Duration::from_secs(20)).await, Ok(output));
    b.shutdown();
}

/// Another process asked this one for a child (a take) and gave up waiting (an untake), and
/// both requests are read at once (this process was slow, or paused): the untake, read while
/// the take hands the child out, waits for the take's record and gives the child back. It is
/// never left held by a take nobody got (the record overwriting the give-up).
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_given_up_while_it_hands_its_child_out_gives_the_child_back() {
    let _faults = FAULTS.lock().await;
    brood::failpoints::disarm_all();
    let dir = tempfile::tempdir().unwrap();
    let (b, queues, child) = one_external_child(dir.path()).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !queues.holds(&child) {
        assert!(Instant::now() < deadline, "the child was never queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    brood::failpoints::arm("take_recording_hold", 1);
    let taking = {
        let (queues, child) = (queues.clone(), child.clone());
        std::thread::spawn(move || queues.take(&child, "w", Duration::from_secs(600), Some("take_1")))
    };
    while !brood::failpoints::held("take_recording_hold") {
        assert!(Instant::now() < deadline, "the take never handed the child out");
        std::thread::sleep(Duration::from_millis(2));
    }
    // The take handed the child out and is held before it records that: the untake comes now.
    let untaking = {
        let (queues, child) = (queues.clone(), child.clone());
        std::thread::spawn(move || queues.untake(&child, "take_1"))
    };
    std::thread::sleep(Duration::from_millis(200));
    brood::failpoints::release("take_recording_hold");
    let handed = taking.join().unwrap();
    assert_eq!(
        handed.map(|h| h.child_id),
        Some(child.clone()),
        "the take handed it out"
    );
    untaking.join().unwrap();
    let again = queues
        .poll("default", "w2", Duration::from_secs(5), Duration::from_secs(60))
        .await
        .expect("the child is still held by the take nobody got");
    assert_eq!(again.child_id, child);
    let done = brood::RunOutput::Succeeded {
        summary: "frame 1".into(),
        output: None,
    };
    let ended = queues.complete(&child, &again.token, done.clone()).unwrap();
    assert_eq!(ended.outcome(Duration::from_secs(20)).await, Ok(done));
    b.shutdown();
}
