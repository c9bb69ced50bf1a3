//! A task's retry policy: a child that ended `failed` or `timed_out` runs again, after its
//! backoff, until an attempt succeeds or its attempts are used; only then does its result count
//! (no early failure notice for an attempt that is retried), and the result says how many
//! attempts were made. A cancel during the backoff ends it (as its next attempt, which never
//! starts); each retry is recorded before the next attempt starts, and an attempt running at a
//! kill is resolved by recovery like any child (run again when its task allows it).

mod common;
mod server;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use brood::{
    Brood, BroodConfig, CancelTarget, ChildStatus, DelegateRequest, ItemKind, RetryPolicy, RunContext, RunOutput,
    Runner, Runners,
};
use futures::future::LocalBoxFuture;
use serde_json::json;
use server::{assert_error, Server};

/// Attempts made of each child by the `flaky` runner.
static ATTEMPTS: Mutex<Option<HashMap<String, u32>>> = Mutex::new(None);

/// Fails until the attempt its goal names (`ok at 3`; `never` fails every time), saying which
/// attempt it was.
struct Flaky;

impl Runner for Flaky {
    fn run(self: Box<Self>, ctx: RunContext) -> LocalBoxFuture<'static, RunOutput> {
        Box::pin(async move {
            let made = {
                let mut all = ATTEMPTS.lock().unwrap();
                let n = all
                    .get_or_insert_with(HashMap::new)
                    .entry(ctx.child_id.clone())
                    .or_insert(0);
                *n += 1;
                *n
            };
            assert_eq!(made, ctx.attempt, "the context counts the attempts");
            match ctx.goal.strip_prefix("ok at ").and_then(|n| n.parse::<u32>().ok()) {
                Some(at) if ctx.attempt >= at => RunOutput::succeeded(format!("attempt {}", ctx.attempt)),
                _ => RunOutput::failed(format!("attempt {} failed", ctx.attempt)),
            }
        })
    }
}

fn engine(dir: &std::path::Path) -> Brood {
    let mut runners = Runners::builtin();
    runners.register("flaky", |_| Ok(Box::new(Flaky) as Box<dyn Runner>));
    Brood::open(BroodConfig::new(dir.join("ledger")).runners(runners)).expect("open brood")
}

fn policy(max_attempts: u32, backoff_ms: u64) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        backoff_ms,
        max_backoff_ms: 1_000,
    }
}

fn flaky(goal: &str, retry: RetryPolicy) -> brood::TaskSpec {
    common::task(goal, json!({"kind": "flaky"})).retry(retry)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_child_runs_again_until_it_succeeds_or_its_attempts_are_used() {
    let dir = tempfile::tempdir().unwrap();
    let b = engine(dir.path());
    common::open_wake(&b, "r").await;
    let call = common::delegated(
        &b,
        "r",
        DelegateRequest::background(vec![flaky("ok at 3", policy(5, 5)), flaky("never", policy(2, 5))]),
    )
    .await;
    // One unit of two: an attempt that is retried raises no early notice; the last one does.
    let items = common::collect_results(&b, "r", 2).await;
    let notices: Vec<_> = items.iter().filter(|i| i.kind == ItemKind::FailureNotice).collect();
    assert!(
        notices.iter().all(|n| n.task_index == 1 && n.attempts == 2),
        "{notices:?}"
    );
    let by_index = |i: u32| items.iter().find(|it| it.task_index == i).unwrap();
    assert_eq!(
        (by_index(0).status, by_index(0).attempts, by_index(0).summary.as_deref()),
        (ChildStatus::Succeeded, 3, Some("attempt 3"))
    );
    assert_eq!(
        (by_index(1).status, by_index(1).attempts, by_index(1).error.as_deref()),
        (ChildStatus::Failed, 2, Some("attempt 2 failed"))
    );
    let status = b.call(&call).await.unwrap();
    assert_eq!(
        status.children.iter().map(|c| c.attempt).collect::<Vec<_>>(),
        vec![3, 2]
    );
    b.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_child_is_retried_and_one_without_a_policy_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let b = engine(dir.path());
    common::open_wake(&b, "t").await;
    let hang = || common::task("hang", common::sim_outcome(0, "hang")).timeout_ms(30);
    common::delegated(
        &b,
        "t",
        DelegateRequest::background(vec![hang().retry(policy(3, 0)), hang()]).independent(),
    )
    .await;
    let items = common::collect_results(&b, "t", 2).await;
    let results: Vec<_> = items.iter().filter(|i| i.kind == ItemKind::Result).collect();
    let mut got: Vec<(ChildStatus, u32)> = results.iter().map(|i| (i.status, i.attempts)).collect();
    got.sort_by_key(|g| g.1);
    assert_eq!(got, vec![(ChildStatus::TimedOut, 1), (ChildStatus::TimedOut, 3)]);
    b.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_during_the_backoff_ends_the_child_without_another_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let b = engine(dir.path());
    common::open_wake(&b, "c").await;
    let call = common::delegated(
        &b,
        "c",
        DelegateRequest::background(vec![flaky("never", policy(5, 60_000))]),
    )
    .await;
    // Waiting out its backoff: queued again, its first attempt's error kept.
    let child = format!("{call}.0");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let status = b.call(&call).await.unwrap();
        let c = &status.children[0];
        if c.status == ChildStatus::Queued && c.error.is_some() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{c:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let cancelled = b
        .cancel(CancelTarget::Child(child.clone()), "test", Some("enough"))
        .await
        .unwrap();
    assert_eq!(cancelled.cancelled, vec![child.clone()]);
    let items = common::collect_results(&b, "c", 1).await;
    // Recorded as its next attempt, cancelled before it started.
    assert_eq!((items[0].status, items[0].attempts), (ChildStatus::Cancelled, 2));
    assert_eq!(
        ATTEMPTS.lock().unwrap().as_ref().unwrap()[&child],
        1,
        "no second attempt ran"
    );
    b.shutdown();
}

#[test]
fn over_http_a_policy_is_checked_and_the_result_says_its_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), None, &["--max-retry-backoff-ms", "1000"]);
    s.open("h");
    for (retry, field) in [
        (json!({"max_attempts": 0}), "max_attempts"),
        (json!({"max_attempts": 21}), "max_attempts"),
        (json!({"max_attempts": 2, "backoff_ms": 1_001}), "max_retry_backoff_ms"),
        (
            json!({"max_attempts": 2, "max_backoff_ms": 5_000}),
            "max_retry_backoff_ms",
        ),
        (json!({"max_attempts": 2, "lag_ms": 5}), "lag_ms"),
    ] {
        let body = json!({"tasks": [{"goal": "g", "runner": server::sim(0), "retry": retry}]});
        let message = assert_error(
            s.call("POST", "/v1/sessions/h/delegate", Some(body)),
            400,
            "invalid_request",
        );
        assert!(message.contains(field), "{message}");
    }
    let failing = json!({"kind": "sim", "ms": 0, "outcome": "fail"});
    s.delegate_task(
        "h",
        json!({"goal": "g", "runner": failing, "retry": {"max_attempts": 3, "backoff_ms": 0}}),
    );
    let item = s.only_result("h");
    assert_eq!(
        (&item["status"], &item["attempts"]),
        (&json!("failed"), &json!(3)),
        "{item}"
    );
}

#[test]
fn a_retried_attempt_running_at_a_kill_is_run_again_after_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("k");
    let task = json!({
        "goal": "g",
        "runner": {"kind": "external"},
        "retry": {"max_attempts": 3, "backoff_ms": 0},
        "rerun_on_recovery": true,
    });
    s.delegate_task("k", task);
    let poll = |s: &Server| {
        s.call(
            "POST",
            "/v1/workers/poll",
            Some(json!({"worker": "w", "wait_ms": 20_000})),
        )
    };
    let (status, work) = poll(&s);
    assert_eq!((status, &work["attempt"]), (200, &json!(1)), "{work}");
    let (child, token) = (work["child_id"].as_str().unwrap(), work["token"].as_str().unwrap());
    let failed = json!({"token": token, "status": "failed", "error": "first try"});
    assert_eq!(
        s.call("POST", &format!("/v1/children/{child}/complete"), Some(failed))
            .0,
        200
    );
    // The second attempt is handed out once its retry is recorded; the server dies before a
    // worker finishes it, and recovery runs it again (the task allows it): as the second attempt
    // when its start was not yet recorded (a task safe to re-run has its starts recorded
    // lazily), else as a third.
    let (status, work) = poll(&s);
    assert_eq!((status, &work["attempt"]), (200, &json!(2)), "{work}");
    s.kill9();
    let s = Server::start(dir.path(), None);
    let (status, work) = poll(&s);
    assert_eq!(status, 200, "{work}");
    let attempt = work["attempt"].as_u64().unwrap();
    assert!((2..=3).contains(&attempt), "{work}");
    let (child, token) = (work["child_id"].as_str().unwrap(), work["token"].as_str().unwrap());
    let done = json!({"token": token, "status": "succeeded", "summary": "second try"});
    assert_eq!(
        s.call("POST", &format!("/v1/children/{child}/complete"), Some(done)).0,
        200
    );
    let item = s.only_result("k");
    assert_eq!(
        (&item["status"], &item["summary"], &item["attempts"]),
        (&json!("succeeded"), &json!("second try"), &json!(attempt)),
        "{item}"
    );
}
