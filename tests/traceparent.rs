//! A call delegated with a W3C trace context (`DelegateRequest::traceparent`) hands it to every
//! child it runs: the runner's context has it (a `command` child gets it as `TRACEPARENT`), the
//! children's `child` events carry it, and it is stored with the call, so a child run again
//! after a restart still gets it. A malformed one refuses the call, naming the field, and
//! nothing is stored (the set number is not used).

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use brood::{
    Brood, BroodConfig, BroodError, ChildStatus, DelegateRequest, Event, ItemKind, RunContext, RunOutput, Runner,
    Runners, SessionSettings, TaskSpec,
};
use common::*;
use futures::future::LocalBoxFuture;
use serde_json::json;

const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// Whether a `hang first` child hangs: in the engine opened first, until the test reopens it.
static FIRST_LIFE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Answers with the attempt and the trace context it was given; hangs while [`FIRST_LIFE`]
/// when its goal says `hang first`.
struct Traced;

impl Runner for Traced {
    fn run(self: Box<Self>, ctx: RunContext) -> LocalBoxFuture<'static, RunOutput> {
        Box::pin(async move {
            if ctx.goal == "hang first" && FIRST_LIFE.load(std::sync::atomic::Ordering::SeqCst) {
                futures::future::pending::<()>().await;
            }
            RunOutput::Succeeded {
                summary: format!("attempt {}: {}", ctx.attempt, ctx.traceparent().unwrap_or("none")),
                output: None,
            }
        })
    }
}

/// `sim`, `traced` and `command` runners, over `dir`.
fn config(dir: &std::path::Path) -> BroodConfig {
    let mut runners = Runners::builtin();
    runners.register("traced", |_| Ok(Box::new(Traced) as Box<dyn Runner>));
    runners.register_command();
    BroodConfig::new(dir.join("ledger")).runners(runners)
}

async fn open(dir: &std::path::Path, session: &str) -> Brood {
    let b = Brood::open(config(dir)).expect("open brood");
    b.open_session(session, SessionSettings::default().wake(|_| {}))
        .await
        .expect("open session");
    b
}

/// A call of one zero-time `sim` task.
fn sim_call(goal: &str) -> DelegateRequest {
    DelegateRequest::background(vec![task(goal, sim(0))])
}

/// The summaries of `n` results of `session`, by call and task index.
async fn summaries(b: &Brood, session: &str, n: usize) -> BTreeMap<(String, u32), String> {
    collect_results(b, session, n)
        .await
        .into_iter()
        .map(|i| ((i.call_id, i.task_index), i.summary.unwrap_or_default()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_child_of_the_call_is_run_with_its_traceparent() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), "t").await;
    let tasks = || {
        vec![
            task("a", json!({"kind": "traced"})),
            task("b", json!({"kind": "traced"})),
        ]
    };
    let traced = b
        .delegate("t", DelegateRequest::background(tasks()).independent().traceparent(TP))
        .await
        .unwrap();
    let plain = b.delegate("t", DelegateRequest::background(tasks())).await.unwrap();
    let got = summaries(&b, "t", 4).await;
    for i in 0..2 {
        assert_eq!(got[&(traced.call_id().to_string(), i)], format!("attempt 1: {TP}"));
        assert_eq!(got[&(plain.call_id().to_string(), i)], "attempt 1: none");
    }
    b.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_child_gets_the_traceparent_in_its_environment() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), "cmd").await;
    let echo = || {
        task(
            "echo the trace context",
            json!({"kind": "command", "argv": ["sh", "-c", "printf 'TRACEPARENT=%s' \"${TRACEPARENT-unset}\""]}),
        )
    };
    let traced = b
        .delegate("cmd", DelegateRequest::background(vec![echo()]).traceparent(TP))
        .await
        .unwrap();
    let plain = b
        .delegate("cmd", DelegateRequest::background(vec![echo()]))
        .await
        .unwrap();
    let got = summaries(&b, "cmd", 2).await;
    assert_eq!(got[&(traced.call_id().to_string(), 0)], format!("TRACEPARENT={TP}"));
    assert_eq!(
        got[&(plain.call_id().to_string(), 0)],
        "TRACEPARENT=unset",
        "a call without one sets no TRACEPARENT"
    );
    b.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_traceparent_refuses_the_call_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), "bad").await;
    let bad = "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01";
    let request = sim_call("a").traceparent(bad);
    let refused = b.delegate("bad", request.clone()).await.unwrap_err();
    match &refused.error {
        BroodError::Invalid { field, message } => {
            assert_eq!(field, "traceparent");
            assert!(message.contains("parent id is all zeros"), "{message}");
        }
        other => panic!("not refused as invalid: {other:?}"),
    }
    assert_eq!(refused.request, request, "the request is handed back as it was");
    let st = b.status("bad").await.unwrap();
    assert!(st.calls.is_empty(), "no call was stored: {st:?}");
    assert_eq!(
        brood::validate_traceparent(bad).unwrap_err(),
        brood::RequestError::invalid("traceparent", message_of(&refused.error)),
        "the same check the embedding API exposes"
    );
    let good = b.delegate("bad", sim_call("a").traceparent(TP)).await.unwrap();
    assert_eq!(good.set(), 1, "the refused call used no set number");
    b.shutdown();
}

fn message_of(e: &BroodError) -> String {
    match e {
        BroodError::Invalid { message, .. } => message.clone(),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_run_again_after_a_restart_gets_the_traceparent() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), "r").await;
    let rerun = TaskSpec::new("hang first", json!({"kind": "traced"})).rerun_on_recovery(true);
    let call = b
        .delegate("r", DelegateRequest::background(vec![rerun]).traceparent(TP))
        .await
        .unwrap()
        .call_id()
        .to_string();
    let deadline = Instant::now() + DEADLINE;
    while b.status("r").await.unwrap().counts.running < 1 {
        assert!(Instant::now() < deadline, "the child never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    b.shutdown(); // the child is running: the restart runs it again
    FIRST_LIFE.store(false, std::sync::atomic::Ordering::SeqCst);

    let b = open(dir.path(), "r").await;
    let env = next_envelope(&b, "r", "c", LONG_LEASE).await;
    let result = env
        .items
        .iter()
        .find(|i| i.kind == ItemKind::Result)
        .expect("the re-run child's result");
    assert_eq!(result.call_id, call);
    assert_eq!(result.status, ChildStatus::Succeeded);
    // Attempt 2 once the first start was recorded; 1 when the stop came before that write (the
    // child is then queued again): either way from the call's stored row.
    let summary = result.summary.as_deref().unwrap_or_default();
    assert!(summary.ends_with(&format!(": {TP}")), "{summary}");
    b.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_childrens_events_carry_the_traceparent() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path(), "ev").await;
    let mut rx = b.subscribe("ev").await.unwrap();
    let traced = b.delegate("ev", sim_call("a").traceparent(TP)).await.unwrap();
    let plain = b.delegate("ev", sim_call("b")).await.unwrap();
    // Each child is told queued, running and succeeded.
    let mut told: BTreeMap<String, Vec<(ChildStatus, Option<String>)>> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while told
        .values()
        .filter(|s| s.iter().any(|(st, _)| *st == ChildStatus::Succeeded))
        .count()
        < 2
    {
        let ev = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .expect("the children's events in time")
            .expect("the event stream");
        if let Event::Child {
            call_id,
            status,
            traceparent,
            ..
        } = &ev.event
        {
            told.entry(call_id.clone())
                .or_default()
                .push((*status, traceparent.clone()));
        }
    }
    let of = |call: &str| told[call].clone();
    assert!(of(traced.call_id()).len() >= 3, "{told:?}");
    assert!(
        of(traced.call_id()).iter().all(|(_, tp)| tp.as_deref() == Some(TP)),
        "{told:?}"
    );
    assert!(of(plain.call_id()).iter().all(|(_, tp)| tp.is_none()), "{told:?}");
    b.shutdown();
}
