//! Embedder code cannot take a session down: a runner factory's `validate` that panics refuses
//! that one request with `EmbedderPanicked`, however often; a wake callback that panics is
//! logged and the session keeps routing; runners that panic in `build`, or in `run` before they
//! return their future, fail only their child.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use brood::{
    Brood, BroodConfig, BroodError, ChildStatus, DelegateRequest, Runner, RunnerFactory, Runners, SessionSettings,
    WakeEvent,
};
use common::*;
use serde_json::{json, Value};

/// The built-in runners, except that validating or building a `bomb` panics.
struct Bombs {
    inner: Runners,
    on: &'static str,
}

impl RunnerFactory for Bombs {
    fn validate(&self, spec: &Value) -> Result<(), String> {
        if self.on == "validate" && spec.get("kind") == Some(&json!("bomb")) {
            panic!("validate blew up");
        }
        if spec.get("kind") == Some(&json!("bomb")) || spec.get("kind") == Some(&json!("bomb_at_start")) {
            return Ok(());
        }
        self.inner.validate(spec)
    }

    fn build(&self, spec: &Value) -> Result<Box<dyn Runner>, String> {
        if spec.get("kind") == Some(&json!("bomb")) {
            panic!("build blew up");
        }
        if spec.get("kind") == Some(&json!("bomb_at_start")) {
            return Ok(Box::new(PanicsAsItStarts));
        }
        self.inner.build(spec)
    }
}

/// A runner whose `run` panics before it returns its future.
struct PanicsAsItStarts;

impl Runner for PanicsAsItStarts {
    fn run(self: Box<Self>, _: brood::RunContext) -> futures::future::LocalBoxFuture<'static, brood::RunOutput> {
        panic!("run blew up before its future")
    }
}

fn open(dir: &std::path::Path, on: &'static str) -> Brood {
    let factory = Bombs {
        inner: Runners::builtin(),
        on,
    };
    Brood::open(BroodConfig::new(dir).runners(factory)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_validate_refuses_only_its_request() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), "validate");
    open_wake(&b, "s").await;
    let good = b
        .delegate("s", DelegateRequest::background(vec![task("slow", sim(200))]))
        .await
        .unwrap();
    for _ in 0..6 {
        let err = b
            .delegate(
                "s",
                DelegateRequest::background(vec![task("x", json!({"kind": "bomb"}))]),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(
                err.error,
                BroodError::EmbedderPanicked {
                    hook: "RunnerFactory::validate",
                    ..
                }
            ),
            "{err}"
        );
    }
    // The session was never given up: the good call finishes and is delivered, and new calls
    // keep their set numbers in order (the refused ones took none).
    let env = next_envelope(&b, "s", "c", LONG_LEASE).await;
    assert_eq!(env.items[0].call_id, good.call_id());
    assert_eq!(env.items[0].status, ChildStatus::Succeeded);
    let next = b
        .delegate("s", DelegateRequest::background(vec![task("next", sim(0))]))
        .await
        .unwrap();
    assert_eq!(next.set(), 2);
}

/// Delegates a task of the runner `kind` beside a sim child, and returns their two results, in
/// task order.
async fn a_bomb_beside_a_fine_child(on: &'static str, kind: &str) -> Vec<brood::ReadyItem> {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), on);
    open_wake(&b, "s").await;
    b.delegate(
        "s",
        DelegateRequest::background(vec![task("boom", json!({ "kind": kind })), task("fine", sim(0))]),
    )
    .await
    .unwrap();
    let mut items: Vec<brood::ReadyItem> = collect_results(&b, "s", 2)
        .await
        .into_iter()
        .filter(|i| i.kind == brood::ItemKind::Result)
        .collect();
    items.sort_by_key(|i| i.task_index);
    items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_build_fails_only_its_child() {
    let items = a_bomb_beside_a_fine_child("build", "bomb").await;
    let statuses: Vec<(u32, ChildStatus)> = items.iter().map(|i| (i.task_index, i.status)).collect();
    assert_eq!(statuses, vec![(0, ChildStatus::Failed), (1, ChildStatus::Succeeded)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_panicking_as_it_starts_fails_only_its_child() {
    let items = a_bomb_beside_a_fine_child("run", "bomb_at_start").await;
    assert_eq!(items[0].status, ChildStatus::Failed);
    let error = items[0].error.as_deref().unwrap_or_default();
    assert!(
        error.contains("runner panicked: run blew up before its future"),
        "{error}"
    );
    assert_eq!(items[1].status, ChildStatus::Succeeded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_wake_callback_leaves_the_session_routing() {
    let dir = tempfile::tempdir().unwrap();
    let b = Brood::open(BroodConfig::new(dir.path())).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    b.open_session(
        "s",
        SessionSettings::default().wake(move |_: WakeEvent| {
            seen.fetch_add(1, Ordering::SeqCst);
            panic!("the wake callback blew up");
        }),
    )
    .await
    .unwrap();
    for round in 0..3 {
        b.delegate("s", DelegateRequest::background(vec![task("x", sim(0))]))
            .await
            .unwrap();
        let env = next_envelope(&b, "s", "c", LONG_LEASE).await;
        assert_eq!(b.ack(&env.claim_id).await.unwrap(), 1, "round {round}");
    }
    assert!(calls.load(Ordering::SeqCst) >= 1, "the callback was called");
}
