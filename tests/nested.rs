//! Nested delegation through the embedding API: a running child delegates in its own right
//! (its child id is its session's id) and its children's results go to that session only, with
//! set ordinals of its own; a call deeper than `max_depth` is refused and changes nothing;
//! cancelling a call cancels its descendants; a child's end cancels its nested calls still
//! running while what they finished stays claimable; a nested session survives a restart, and
//! one whose child ended while no process ran is ended when the engine opens.

use brood::*;
use futures::future::LocalBoxFuture;
use serde_json::json;

mod common;
use common::*;

/// Delegates `n` sim children in its own session (background, woken), takes their results at
/// its boundaries, acks them, and answers what it got: the nested call's set and the results'
/// child ids.
struct Nester {
    n: usize,
}

impl Runner for Nester {
    fn run(self: Box<Self>, ctx: RunContext) -> LocalBoxFuture<'static, RunOutput> {
        Box::pin(async move {
            match nest(&ctx, self.n).await {
                Ok(summary) => RunOutput::Succeeded { summary, output: None },
                Err(e) => RunOutput::Failed {
                    error: e.to_string(),
                    summary: None,
                    output: None,
                },
            }
        })
    }
}

async fn nest(ctx: &RunContext, n: usize) -> Result<String, BroodError> {
    let brood = BroodHandle::of(ctx)?;
    let session = ctx.session_id();
    brood
        .open_session(session, SessionSettings::default().wake(|_| {}))
        .await?;
    let tasks = (0..n).map(|i| task(format!("inner {i}"), sim(5))).collect();
    let reply = brood
        .delegate(session, DelegateRequest::background(tasks).independent())
        .await?;
    let mut got = Vec::new();
    while got.len() < n {
        match brood.boundary(session, "nester", LONG_LEASE).await? {
            Some(env) => {
                got.extend(env.items.iter().map(|i| i.child_id.clone()));
                brood.ack(&env.claim_id).await?;
            }
            None => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
        }
    }
    got.sort();
    Ok(format!("set {}: {}", reply.set(), got.join(",")))
}

struct Engine {
    b: Option<Brood>,
    kit: Kit,
    dir: tempfile::TempDir,
    max_depth: Option<u32>,
}

impl Engine {
    fn new() -> Self {
        Self::with_depth(None)
    }

    fn with_depth(max_depth: Option<u32>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let kit = Kit::default();
        let b = Some(Self::open(dir.path(), &kit, max_depth));
        Engine { b, kit, dir, max_depth }
    }

    fn open(dir: &std::path::Path, kit: &Kit, max_depth: Option<u32>) -> Brood {
        let mut runners = kit.runners();
        runners.register("nester", |spec| {
            let n = spec.get("n").and_then(serde_json::Value::as_u64).unwrap_or(2) as usize;
            Ok(Box::new(Nester { n }) as Box<dyn Runner>)
        });
        let mut config = BroodConfig::new(dir.join("ledger")).runners(runners);
        if let Some(d) = max_depth {
            config = config.max_depth(d);
        }
        Brood::open(config).unwrap()
    }

    fn b(&self) -> &Brood {
        self.b.as_ref().unwrap()
    }

    fn reopen(&mut self) {
        self.b.take().unwrap().shutdown();
        self.b = Some(Self::open(self.dir.path(), &self.kit, self.max_depth));
    }

    fn stopped(&self) -> usize {
        self.kit.holds.stopped()
    }

    fn started(&self) -> Vec<String> {
        self.kit.holds.started()
    }
}

async fn delegate(b: &Brood, session: &str, tasks: Vec<TaskSpec>) -> Result<String, BroodError> {
    Ok(b.delegate(session, DelegateRequest::background(tasks).independent())
        .await?
        .call_id()
        .to_string())
}

async fn status_of(b: &Brood, session: &str, child: &str) -> Option<ChildStatus> {
    let (call, index) = child.rsplit_once('.')?;
    child_status(&b.status(session).await.ok()?, call, index.parse().ok()?)
}

/// A top-level session "p" with one running hold child, and that child's session opened: the
/// child's id.
async fn running_parent(e: &Engine) -> String {
    let b = e.b();
    open_wake(b, "p").await;
    let call = delegate(b, "p", vec![task("parent", hold())]).await.unwrap();
    let child = child_id(&call, 0);
    wait_for!("the parent child runs", e.started().contains(&child).then_some(()));
    open_wake(b, &child).await;
    child
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_calls_results_go_to_its_own_session_with_set_ordinals_of_its_own() {
    let e = Engine::new();
    let b = e.b();
    open_wake(b, "p").await;
    // Two earlier calls in the parent session: its sets 1 and 2 are taken.
    let mut calls = Vec::new();
    calls.push(delegate(b, "p", vec![task("warm-up", sim(0))]).await.unwrap());
    calls.push(delegate(b, "p", vec![task("warm-up", sim(0))]).await.unwrap());
    let call = delegate(b, "p", vec![task("fan out", json!({"kind": "nester", "n": 3}))])
        .await
        .unwrap();
    calls.push(call.clone());
    let parent_child = child_id(&call, 0);
    let results = collect_results(b, "p", 3).await;
    let ours = results
        .iter()
        .find(|i| i.child_id == parent_child)
        .expect("the nester's result");
    assert_eq!(ours.status, ChildStatus::Succeeded, "{ours:?}");
    let summary = ours.summary.clone().unwrap_or_default();
    assert!(
        summary.starts_with("set 1: "),
        "sets count inside the nested session: {summary}"
    );
    assert_eq!(
        summary.split(',').count(),
        3,
        "all three nested results reached the child: {summary}"
    );
    // The parent session got only its own children's results.
    for item in &results {
        assert!(
            calls.contains(&item.call_id),
            "{item:?} is not of the parent's calls {calls:?}"
        );
    }
    assert!(b.boundary("p", "t", LONG_LEASE).await.unwrap().is_none());
    let nest = b.nest(&parent_child).expect("the child's session is nested");
    assert_eq!((nest.parent_session_id.as_str(), nest.depth), ("p", 1));
    assert!(b.nest("p").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_deeper_than_max_depth_is_refused_and_changes_nothing() {
    let e = Engine::new();
    let b = e.b();
    let child = running_parent(&e).await;
    // Depth 2 (the default max_depth): accepted.
    let inner = delegate(b, &child, vec![task("inner", hold())]).await.unwrap();
    let grandchild = child_id(&inner, 0);
    wait_for!("the nested child runs", e.started().contains(&grandchild).then_some(()));
    open_wake(b, &grandchild).await;
    assert_eq!(b.nest(&grandchild).map(|n| n.depth), Some(2));
    // Depth 3: refused, and no set number used.
    let err = delegate(b, &grandchild, vec![task("too deep", sim(0))])
        .await
        .unwrap_err();
    assert!(
        matches!(err, BroodError::MaxDepthExceeded { depth: 3, max: 2, .. }),
        "{err:?}"
    );
    assert_eq!(err.code(), "max_depth_exceeded");
    assert!(err.to_string().contains("max_depth 2"), "{err}");
    let st = b.status(&grandchild).await.unwrap();
    assert!(st.calls.is_empty(), "{:?}", st.calls);

    // With max_depth 1 a child's session takes no call at all.
    let shallow = Engine::with_depth(Some(1));
    let child = running_parent(&shallow).await;
    let err = delegate(shallow.b(), &child, vec![task("inner", sim(0))])
        .await
        .unwrap_err();
    assert!(
        matches!(err, BroodError::MaxDepthExceeded { depth: 2, max: 1, .. }),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_call_cancels_its_descendants() {
    let e = Engine::with_depth(Some(3));
    let b = e.b();
    let child = running_parent(&e).await;
    let call = child.rsplit_once('.').unwrap().0.to_string();
    let inner = delegate(b, &child, vec![task("a", hold()), task("b", hold())])
        .await
        .unwrap();
    let (a, c) = (child_id(&inner, 0), child_id(&inner, 1));
    wait_for!(
        "both nested children run",
        (e.started().contains(&a) && e.started().contains(&c)).then_some(())
    );
    open_wake(b, &a).await;
    let deepest = delegate(b, &a, vec![task("deep", hold())]).await.unwrap();
    let d = child_id(&deepest, 0);
    wait_for!("the deepest child runs", e.started().contains(&d).then_some(()));

    let reply = b
        .cancel(CancelTarget::Call(call), "the test", Some("changed my mind"))
        .await
        .unwrap();
    let mut cancelled = reply.cancelled.clone();
    cancelled.sort();
    let mut expected = vec![child.clone(), a.clone(), c.clone(), d.clone()];
    expected.sort();
    assert_eq!(cancelled, expected, "the call's child and every descendant: {reply:?}");
    wait_for!("all four runners dropped", (e.stopped() == 4).then_some(()));
    for (session, id) in [(child.as_str(), &a), (child.as_str(), &c), (a.as_str(), &d)] {
        assert_eq!(status_of(b, session, id).await, Some(ChildStatus::Cancelled), "{id}");
    }
    // The nested results are ordinary results of their own sessions.
    let env = next_envelope(b, &child, "t", LONG_LEASE).await;
    assert_eq!(env.items.len(), 2, "{:?}", env.items);
    assert!(env.items.iter().all(|i| i.status == ChildStatus::Cancelled));
    let why = env.items[0].error.clone().unwrap_or_default();
    assert!(
        why.contains(&format!("its parent child `{child}` was cancelled")),
        "{why}"
    );
    // An ended child's session takes no more calls.
    let err = delegate(b, &child, vec![task("late", sim(0))]).await.unwrap_err();
    assert!(matches!(err, BroodError::ParentEnded { .. }), "{err:?}");
    assert_eq!(err.code(), "parent_ended");
    // Again: nothing more to cancel.
    let again = b
        .cancel(
            CancelTarget::Call(child.rsplit_once('.').unwrap().0.to_string()),
            "the test",
            None,
        )
        .await
        .unwrap();
    assert!(again.cancelled.is_empty(), "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_childs_end_cancels_its_nested_calls_and_their_finished_results_stay_claimable() {
    let e = Engine::new();
    let b = e.b();
    open_wake(b, "p").await;
    let call = delegate(b, "p", vec![task("parent", gate("parent"))]).await.unwrap();
    let child = child_id(&call, 0);
    wait_for!(
        "the parent child runs",
        (status_of(b, "p", &child).await == Some(ChildStatus::Running)).then_some(())
    );
    open_wake(b, &child).await;
    let inner = delegate(b, &child, vec![task("quick", sim(0)), task("slow", hold())])
        .await
        .unwrap();
    let (quick, slow) = (child_id(&inner, 0), child_id(&inner, 1));
    wait_for!("the slow nested child runs", e.started().contains(&slow).then_some(()));
    wait_for!(
        "the quick one ended",
        (status_of(b, &child, &quick).await == Some(ChildStatus::Succeeded)).then_some(())
    );

    e.kit.gates.open("parent");
    let parent = collect_results(b, "p", 1).await;
    assert_eq!(parent[0].status, ChildStatus::Succeeded);
    wait_for!("the slow nested runner dropped", (e.stopped() == 1).then_some(()));
    assert_eq!(status_of(b, &child, &slow).await, Some(ChildStatus::Cancelled));
    let results = collect_results(b, &child, 2).await;
    let by_id = |id: &str| results.iter().find(|i| i.child_id == id).cloned().unwrap();
    assert_eq!(
        by_id(&quick).status,
        ChildStatus::Succeeded,
        "what finished is still delivered"
    );
    let why = by_id(&slow).error.unwrap_or_default();
    assert!(why.contains(&format!("its parent child `{child}` ended")), "{why}");
    let err = delegate(b, &child, vec![task("late", sim(0))]).await.unwrap_err();
    assert!(matches!(err, BroodError::ParentEnded { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_named_after_an_unknown_child_is_refused() {
    let e = Engine::new();
    let b = e.b();
    let err = b
        .open_session("deleg_00000000000000ff.0", SessionSettings::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, BroodError::UnknownTarget { kind: "child", id } if id == "deleg_00000000000000ff.0"),
        "{err:?}"
    );
    assert!(b.sessions().is_empty(), "nothing was opened: {:?}", b.sessions());
    // A task index its call does not have is unknown too.
    open_wake(b, "p").await;
    let call = delegate(b, "p", vec![task("one", sim(0))]).await.unwrap();
    let err = b
        .open_session(&child_id(&call, 1), SessionSettings::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), "unknown_child", "{err:?}");
    // An id that only looks like one (not canonical) is an ordinary top-level session.
    b.open_session(&format!("{call}.01"), SessionSettings::default())
        .await
        .unwrap();
    assert!(b.nest(&format!("{call}.01")).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_session_survives_a_restart_and_is_ended_when_its_child_ended_meanwhile() {
    let mut e = Engine::new();
    let child = running_parent(&e).await;
    let b = e.b();
    b.open_session(
        &child,
        SessionSettings::default().wake(|_| {}).max_concurrent_children(1),
    )
    .await
    .unwrap();
    let inner = delegate(b, &child, vec![task("first", hold()), task("second", hold())])
        .await
        .unwrap();
    let (first, second) = (child_id(&inner, 0), child_id(&inner, 1));
    wait_for!(
        "the first nested child runs",
        e.started().contains(&first).then_some(())
    );
    assert_eq!(status_of(b, &child, &second).await, Some(ChildStatus::Queued));

    // A restart: the running parent child is interrupted (it ends), so its session's queued
    // child must never run after all.
    e.reopen();
    let b = e.b();
    let nest = b.nest(&child).expect("the nest is read back");
    assert_eq!((nest.parent_session_id.as_str(), nest.depth), ("p", 1));
    wait_for!(
        "the queued nested child is cancelled",
        (status_of(b, &child, &second).await == Some(ChildStatus::Cancelled)).then_some(())
    );
    assert!(status_of(b, "p", &child).await.is_some_and(ChildStatus::is_terminal));
    assert!(status_of(b, &child, &first).await.is_some_and(ChildStatus::is_terminal));
    assert!(!e.started().contains(&second), "the queued nested child never started");
    let err = delegate(b, &child, vec![task("late", sim(0))]).await.unwrap_err();
    assert!(matches!(err, BroodError::ParentEnded { .. }), "{err:?}");
}

/// A top-level session "p" whose one child waits at the gate "parent", and that child's session
/// opened (one child at a time) with a call of two children, the first (`first`) running and the
/// second (held) queued: the child's id and the nested children's ids.
async fn parent_with_a_queued_nested_child(e: &Engine, first: serde_json::Value) -> (String, String, String) {
    let b = e.b();
    open_wake(b, "p").await;
    let call = delegate(b, "p", vec![task("parent", gate("parent"))]).await.unwrap();
    let child = child_id(&call, 0);
    wait_for!(
        "the parent child runs",
        (status_of(b, "p", &child).await == Some(ChildStatus::Running)).then_some(())
    );
    b.open_session(
        &child,
        SessionSettings::default().wake(|_| {}).max_concurrent_children(1),
    )
    .await
    .unwrap();
    let inner = delegate(b, &child, vec![task("first", first), task("second", hold())])
        .await
        .unwrap();
    let (first, second) = (child_id(&inner, 0), child_id(&inner, 1));
    wait_for!(
        "the first nested child runs",
        (status_of(b, &child, &first).await == Some(ChildStatus::Running)).then_some(())
    );
    assert_eq!(status_of(b, &child, &second).await, Some(ChildStatus::Queued));
    (child, first, second)
}

/// Its session refuses calls, its queued child was cancelled (never started), and its running
/// one ended.
async fn assert_ended(e: &Engine, child: &str, first: &str, second: &str) {
    let b = e.b();
    wait_for!(
        "the queued nested child is cancelled",
        (status_of(b, child, second).await == Some(ChildStatus::Cancelled)).then_some(())
    );
    assert!(
        !e.started().contains(&second.to_string()),
        "the queued nested child never started"
    );
    wait_for!(
        "the running nested child ends",
        status_of(b, child, first)
            .await
            .is_some_and(ChildStatus::is_terminal)
            .then_some(())
    );
    let err = delegate(b, child, vec![task("late", sim(0))]).await.unwrap_err();
    assert!(matches!(err, BroodError::ParentEnded { .. }), "{err:?}");
}

/// The tests that hold a rebuild run one at a time: fault points are process-wide.
#[cfg(feature = "failpoints")]
static REBUILD_HOLD: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Restarts the owner of `session`, its rebuild held before it reads its rows while the gates
/// `open` are opened and the parent child's result (which they end) is collected from "p".
#[cfg(feature = "failpoints")]
#[allow(clippy::await_holding_lock)]
async fn rebuild_held_while(e: &Engine, session: &str, open: &[&str]) {
    let _serial = REBUILD_HOLD.lock().unwrap_or_else(|e| e.into_inner());
    failpoints::arm("rebuild_hold", 1);
    let b = e.b();
    let (restarted, ()) = tokio::join!(b.restart_owner(session), async {
        wait_for!(
            "the rebuild to be held",
            (!failpoints::armed("rebuild_hold")).then_some(())
        );
        for gate in open {
            e.kit.gates.open(gate);
        }
        let parent = collect_results(b, "p", 1).await;
        assert_eq!(parent[0].status, ChildStatus::Succeeded);
        failpoints::release("rebuild_hold");
    });
    restarted.unwrap();
}

#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_ends_while_its_nested_sessions_owner_is_rebuilt_ends_that_session() {
    let e = Engine::new();
    let (child, first, second) = parent_with_a_queued_nested_child(&e, hold()).await;
    // The nested session's owner is rebuilt, held before it reads its rows: the child's end is
    // told to no live owner.
    rebuild_held_while(&e, &child, &["parent"]).await;
    assert_ended(&e, &child, &first, &second).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_session_ended_by_its_child_stays_ended_when_its_owner_is_rebuilt() {
    let e = Engine::new();
    let (child, first, second) = parent_with_a_queued_nested_child(&e, hold()).await;
    let b = e.b();
    e.kit.gates.open("parent");
    collect_results(b, "p", 1).await;
    assert_ended(&e, &child, &first, &second).await;
    b.restart_owner(&child).await.unwrap();
    // The rebuilt owner knows its child ended from the ledger: it takes no call either.
    wait_for!(
        "the rebuilt owner answers",
        b.status(&child).await.is_ok().then_some(())
    );
    let err = delegate(b, &child, vec![task("late", sim(0))]).await.unwrap_err();
    assert!(matches!(err, BroodError::ParentEnded { .. }), "{err:?}");
}

#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_nested_session_whose_child_ended_starts_none_of_its_queued_children() {
    let e = Engine::new();
    let (child, _, second) = parent_with_a_queued_nested_child(&e, gate("n1")).await;
    // While its owner is rebuilt, the running nested child ends (its slot is free when the
    // rebuilt owner reads its rows) and so does the parent child.
    rebuild_held_while(&e, &child, &["n1", "parent"]).await;
    let b = e.b();
    wait_for!(
        "the queued nested child is cancelled",
        (status_of(b, &child, &second).await == Some(ChildStatus::Cancelled)).then_some(())
    );
    assert!(
        !e.started().contains(&second),
        "a queued child of a nested session whose child ended was started"
    );
}

#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::await_holding_lock)]
async fn a_child_that_ends_while_its_own_sessions_owner_is_rebuilt_ends_its_nested_session() {
    let e = Engine::new();
    let (child, first, second) = parent_with_a_queued_nested_child(&e, hold()).await;
    let b = e.b();
    let _serial = REBUILD_HOLD.lock().unwrap_or_else(|e| e.into_inner());
    // The parent session's owner is rebuilt, held before it reads its rows, while the parent
    // child ends: its end is stored, and its hand-off to an owner fails (it is tried again),
    // so the rebuilt owner reads the child ended.
    failpoints::arm("rebuild_hold", 1);
    let (restarted, ()) = tokio::join!(b.restart_owner("p"), async {
        wait_for!(
            "the rebuild to be held",
            (!failpoints::armed("rebuild_hold")).then_some(())
        );
        failpoints::arm("coalescer_handoff", 1);
        e.kit.gates.open("parent");
        wait_for!(
            "the parent child's end to be stored",
            (!failpoints::armed("coalescer_handoff")).then_some(())
        );
        failpoints::release("rebuild_hold");
    });
    restarted.unwrap();
    let parent = collect_results(b, "p", 1).await;
    assert_eq!(parent[0].status, ChildStatus::Succeeded);
    assert_ended(&e, &child, &first, &second).await;
}
