//! Tasks carry data: a task's `input` (any JSON) reaches its runner — an embedded runner's
//! context, an external worker's poll reply (with the session, call, attempt and deadline), a
//! `command`'s stdin — and a child's `output` (any JSON) comes back beside its summary in
//! envelope items, the call's children and a worker's completion reply, survives a restart,
//! and is bounded: over `max_input_bytes` or `max_output_bytes` a request is refused naming the
//! key and changes nothing; an embedded runner's output over the engine's bound fails its child.

mod common;
mod server;

use std::time::{Duration, Instant};

use brood::{Brood, BroodConfig, DelegateRequest, RunContext, RunOutput, Runner, Runners};
use futures::future::LocalBoxFuture;
use serde_json::{json, Value};

/// Data with what JSON text can hold: nesting, numbers written several ways, escapes, unicode.
fn data() -> Value {
    json!({"files": ["src/a.rs", "b\n\"c\""], "n": 1.5, "big": 12345678901234_u64, "ok": true, "none": null, "é": {}})
}

// ---------------------------------------------------------------------------------------------
// Embedded runners.

/// Hands back what its task's input says: `{"echo": v}` succeeds with `v` as its output;
/// `{"bytes": n}` returns a string of `n` bytes.
struct Data;

impl Runner for Data {
    fn run(self: Box<Self>, ctx: RunContext) -> LocalBoxFuture<'static, RunOutput> {
        Box::pin(async move {
            let input = ctx.input.clone().unwrap_or(Value::Null);
            let output = match input.get("bytes").and_then(Value::as_u64) {
                Some(n) => Value::String("x".repeat(n as usize)),
                None => input.get("echo").cloned().unwrap_or(Value::Null),
            };
            let summary = format!(
                "in {} of {} (attempt {})",
                ctx.call_id, ctx.parent_session_id, ctx.attempt
            );
            RunOutput::succeeded(summary).with_output(output)
        })
    }
}

/// An engine over `dir` with the `data` runner beside the built-in ones.
fn embedded(dir: &std::path::Path) -> Brood {
    let mut runners = Runners::builtin();
    runners.register("data", |_| Ok(Box::new(Data) as Box<dyn Runner>));
    Brood::open(BroodConfig::new(dir.join("ledger")).runners(runners)).expect("open brood")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_runner_sees_its_input_and_its_output_is_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let b = embedded(dir.path());
    common::open_wake(&b, "e").await;
    let call = common::delegated(
        &b,
        "e",
        DelegateRequest::background(vec![
            common::task("echo", json!({"kind": "data"})).input(json!({"echo": data()})),
            common::task("nothing", json!({"kind": "data"})),
            common::task("null", json!({"kind": "data"})).input(Value::Null),
        ])
        .independent(),
    )
    .await;
    let items = common::collect_results(&b, "e", 3).await;
    let by_index = |i: u32| items.iter().find(|it| it.task_index == i).expect("item");
    let echoed: Value = serde_json::from_str(by_index(0).output.as_deref().expect("an output")).unwrap();
    assert_eq!(echoed, data());
    assert_eq!(
        by_index(0).summary.as_deref(),
        Some(&*format!("in {call} of e (attempt 1)"))
    );
    assert_eq!(by_index(0).attempts, 1);
    // No input, or a JSON null: the runner saw none, and returned none.
    assert_eq!(
        (by_index(1).output.as_deref(), by_index(2).output.as_deref()),
        (None, None)
    );
    let info = b.call(&call).await.unwrap();
    let child = info.children.iter().find(|c| c.task_index == 0).unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(child.output.as_deref().unwrap()).unwrap(),
        data()
    );
    b.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_over_the_engines_bound_fails_its_child_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let b = embedded(dir.path());
    common::open_wake(&b, "big").await;
    let over = brood_actors::model::MAX_OUTPUT_BYTES as u64;
    common::delegated(
        &b,
        "big",
        DelegateRequest::background(vec![
            common::task("too much", json!({"kind": "data"})).input(json!({"bytes": over}))
        ]),
    )
    .await;
    let items = common::collect_results(&b, "big", 1).await;
    let item = items
        .iter()
        .find(|i| i.kind == brood::ItemKind::Result)
        .expect("the result");
    assert_eq!(item.status, brood::ChildStatus::Failed);
    assert_eq!(item.output, None);
    let error = item.error.as_deref().unwrap();
    assert!(error.contains("bytes of JSON; at most"), "{error}");
    b.shutdown();
}

// ---------------------------------------------------------------------------------------------
// Over HTTP.

use server::{assert_error, Server};

fn poll(s: &Server, body: Value) -> (u16, Value) {
    s.call("POST", "/v1/workers/poll", Some(body))
}

#[test]
fn a_sim_child_hands_its_input_back_and_every_reply_carries_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("d");
    let reply = s.delegate_task("d", json!({"goal": "echo", "runner": server::sim(0), "input": data()}));
    let call_id = reply["call_id"].as_str().unwrap();
    let item = s.only_result("d");
    assert_eq!((&item["output"], &item["attempts"]), (&data(), &json!(1)), "{item}");
    let (status, call) = s.call("GET", &format!("/v1/calls/{call_id}"), None);
    assert_eq!(status, 200, "{call}");
    let child = &call["children"][0];
    assert_eq!((&child["output"], &child["attempts"]), (&data(), &json!(1)), "{call}");
    // Without input there is no output: `null`.
    s.delegate_task("d", json!({"goal": "plain", "runner": server::sim(0), "input": null}));
    assert_eq!(s.only_result("d")["output"], Value::Null);
}

#[test]
fn an_external_worker_gets_the_input_and_context_and_completes_with_output() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("w");
    let before = brood_actors::model::now_ms();
    let reply = s.delegate_task(
        "w",
        json!({"goal": "render", "runner": {"kind": "external"}, "input": data(), "timeout_ms": 60_000}),
    );
    let call_id = reply["call_id"].as_str().unwrap();
    let (status, work) = poll(&s, json!({"worker": "w1", "wait_ms": 20_000}));
    assert_eq!(status, 200, "{work}");
    assert_eq!(work["input"], data());
    assert_eq!(
        (work["session_id"].as_str(), work["call_id"].as_str()),
        (Some("w"), Some(call_id))
    );
    assert_eq!(work["attempt"], 1);
    let deadline = work["deadline_at"]
        .as_u64()
        .expect("a deadline: the task has a timeout");
    assert!(
        (before + 60_000..=brood_actors::model::now_ms() + 60_000).contains(&deadline),
        "{deadline}"
    );
    let (child, token) = (work["child_id"].as_str().unwrap(), work["token"].as_str().unwrap());
    let done = json!({"token": token, "status": "succeeded", "summary": "rendered", "output": {"frames": [7, 8]}});
    let path = format!("/v1/children/{child}/complete");
    let (status, completed) = s.call("POST", &path, Some(done.clone()));
    assert_eq!(status, 200, "{completed}");
    assert_eq!(completed["output"], json!({"frames": [7, 8]}));
    // The same completion again (its answer lost) answers the same; other data is refused.
    let (status, again) = s.call("POST", &path, Some(done.clone()));
    assert_eq!((status, &again["output"]), (200, &json!({"frames": [7, 8]})), "{again}");
    let mut other = done;
    other["output"] = json!({"frames": [9]});
    assert_error(s.call("POST", &path, Some(other)), 409, "child_ended");
    let item = s.only_result("w");
    assert_eq!(
        (&item["output"], &item["summary"]),
        (&json!({"frames": [7, 8]}), &json!("rendered"))
    );
}

#[test]
fn a_task_without_a_timeout_gives_its_worker_no_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("n");
    s.delegate_task("n", json!({"goal": "g", "runner": {"kind": "external"}}));
    let (status, work) = poll(&s, json!({"worker": "w1", "wait_ms": 20_000}));
    assert_eq!(status, 200, "{work}");
    assert_eq!(
        (&work["input"], &work["deadline_at"]),
        (&Value::Null, &Value::Null),
        "{work}"
    );
}

#[test]
fn a_command_reads_its_input_on_stdin_and_writes_its_output_to_brood_output() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), None, &["--allow-command"]);
    s.open("c");
    let cat = json!({"kind": "command", "argv": ["sh", "-c", "cat > \"$BROOD_OUTPUT\"; echo copied"]});
    s.delegate_task("c", json!({"goal": "copy", "runner": cat, "input": data()}));
    let item = s.only_result("c");
    assert_eq!(
        (&item["status"], &item["output"], &item["summary"]),
        (&json!("succeeded"), &data(), &json!("copied"))
    );
    // Without input, stdin is empty and the file left empty is no output.
    let empty = json!({"kind": "command", "argv": ["sh", "-c", "test -z \"$(cat)\" && echo empty"]});
    s.delegate_task("c", json!({"goal": "read", "runner": empty}));
    let item = s.only_result("c");
    assert_eq!(
        (&item["status"], &item["output"], &item["summary"]),
        (&json!("succeeded"), &Value::Null, &json!("empty"))
    );
    // A file that is not JSON fails the child, saying so; the file is gone after the run.
    let bad =
        json!({"kind": "command", "argv": ["sh", "-c", "echo \"$BROOD_OUTPUT\"; echo '{oops' > \"$BROOD_OUTPUT\""]});
    s.delegate_task("c", json!({"goal": "bad", "runner": bad}));
    let item = s.only_result("c");
    assert_eq!(item["status"], "failed", "{item}");
    assert!(
        item["error"]
            .as_str()
            .unwrap()
            .contains("BROOD_OUTPUT file is not JSON"),
        "{item}"
    );
    let file = item["summary"].as_str().unwrap();
    assert!(!std::path::Path::new(file).exists(), "{file} was removed");
}

#[test]
fn input_and_output_over_their_bounds_are_refused_naming_the_key_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(
        dir.path(),
        None,
        &["--max-input-bytes", "64", "--max-output-bytes", "32"],
    );
    s.open("b");
    let big = json!({"text": "x".repeat(100)});
    let refused = s.call(
        "POST",
        "/v1/sessions/b/delegate",
        Some(json!({"tasks": [{"goal": "g", "runner": server::sim(0)}, {"goal": "h", "runner": server::sim(0), "input": big}]})),
    );
    let message = assert_error(refused, 400, "invalid_request");
    assert!(
        message.contains("tasks[1].input") && message.contains("max_input_bytes"),
        "{message}"
    );
    let (_, session) = s.call("GET", "/v1/sessions/b", None);
    assert_eq!(session["calls"], json!([]), "nothing was delegated: {session}");
    // A worker's output over the bound is refused, and the child stays its to complete.
    s.delegate_task(
        "b",
        json!({"goal": "g", "runner": {"kind": "external"}, "input": {"fits": 1}}),
    );
    let (_, work) = poll(&s, json!({"worker": "w1", "wait_ms": 20_000}));
    let (child, token) = (work["child_id"].as_str().unwrap(), work["token"].as_str().unwrap());
    let path = format!("/v1/children/{child}/complete");
    let over = json!({"token": token, "status": "succeeded", "output": {"text": "y".repeat(40)}});
    let message = assert_error(s.call("POST", &path, Some(over)), 400, "invalid_request");
    assert!(message.contains("max_output_bytes"), "{message}");
    let fits = json!({"token": token, "status": "succeeded", "output": [1, 2]});
    assert_eq!(s.call("POST", &path, Some(fits)).0, 200);
    assert_eq!(s.only_result("b")["output"], json!([1, 2]));
}

#[test]
fn a_recorded_output_survives_a_killed_server() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("k");
    let reply = s.delegate_task("k", json!({"goal": "echo", "runner": server::sim(0), "input": data()}));
    let call_id = reply["call_id"].as_str().unwrap().to_string();
    // Recorded once it is ready: the call's child shows its output.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, call) = s.call("GET", &format!("/v1/calls/{call_id}"), None);
        if call["children"][0]["output"] == data() {
            break;
        }
        assert!(Instant::now() < deadline, "not recorded in 20 s: {call}");
        std::thread::sleep(Duration::from_millis(20));
    }
    s.kill9();
    let s = Server::start(dir.path(), None);
    let item = s.only_result("k");
    assert_eq!(item["output"], data(), "{item}");
}
