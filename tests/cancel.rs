//! Cancelling a call, a unit or a child through the embedding API: a running child's runner
//! really stops (its future is dropped) while its siblings go on, a queued child never starts
//! and its slot goes to the next, finished children are still delivered, a unit with a
//! cancelled member still goes out whole (without a failure notice), a cancel outlives a
//! restart, cancelling twice or something finished changes nothing, and unknown ids are refused.

use brood::*;

mod common;
use common::*;

struct Engine {
    b: Option<Brood>,
    kit: Kit,
    dir: tempfile::TempDir,
}

impl Engine {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let kit = Kit::default();
        let b = Some(Self::open(dir.path(), &kit));
        Engine { b, kit, dir }
    }

    fn open(dir: &std::path::Path, kit: &Kit) -> Brood {
        Brood::open(BroodConfig::new(dir.join("ledger")).runners(kit.runners())).unwrap()
    }

    fn b(&self) -> &Brood {
        self.b.as_ref().unwrap()
    }

    fn reopen(&mut self) {
        self.b.take().unwrap().shutdown();
        self.b = Some(Self::open(self.dir.path(), &self.kit));
    }

    fn started(&self) -> Vec<String> {
        self.kit.holds.started()
    }
}

async fn running(b: &Brood) -> usize {
    b.counts("s").await.unwrap().running
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_child_stops_its_runner_while_its_siblings_go_on() {
    let e = Engine::new();
    let b = e.b();
    open_capped(b, "s", 8).await;
    let call = delegated(
        b,
        "s",
        DelegateRequest::background(vec![task("a", hold()), task("b", hold()), task("c", sim(0))]).independent(),
    )
    .await;
    let done = collect_results(b, "s", 1).await;
    assert_eq!(done[0].child_id, child_id(&call, 2), "the sim child ended first");
    wait_for!(
        "both holds running",
        (e.started().len() == 2 && running(b).await == 2).then_some(())
    );

    let first = child_id(&call, 0);
    let reply = b
        .cancel(CancelTarget::Child(first.clone()), "the test", Some("not needed"))
        .await
        .unwrap();
    assert_eq!(
        reply,
        Cancelled {
            cancelled: vec![first.clone()],
            already_finished: 0
        }
    );
    wait_for!("the runner dropped", (e.kit.holds.stopped() == 1).then_some(()));
    let env = next_envelope(b, "s", "t", LONG_LEASE).await;
    assert_eq!(env.items.len(), 1, "{:?}", env.items);
    let item = &env.items[0];
    assert_eq!(
        (item.child_id.as_str(), item.status, item.kind),
        (first.as_str(), ChildStatus::Cancelled, ItemKind::Result)
    );
    let error = item.error.as_deref().unwrap();
    assert!(
        error.contains("the test") && error.contains("not needed") && error.contains(&first),
        "{error}"
    );
    b.ack(&env.claim_id).await.unwrap();
    assert_eq!(running(b).await, 1, "the sibling runs on");
    assert_eq!(e.kit.holds.stopped(), 1, "only the cancelled runner stopped");

    // The call: the one left is cancelled, the two that ended are not touched.
    let reply = b
        .cancel(CancelTarget::Call(call.clone()), "the test", None)
        .await
        .unwrap();
    assert_eq!(
        reply,
        Cancelled {
            cancelled: vec![child_id(&call, 1)],
            already_finished: 2
        }
    );
    let again = b
        .cancel(CancelTarget::Call(call.clone()), "the test", None)
        .await
        .unwrap();
    assert_eq!(
        again,
        Cancelled {
            cancelled: vec![],
            already_finished: 3
        },
        "cancelling twice changes nothing"
    );
    let rest = collect_results(b, "s", 1).await;
    assert_eq!(
        (rest[0].child_id.clone(), rest[0].status),
        (child_id(&call, 1), ChildStatus::Cancelled)
    );
    wait_for!("both runners dropped", (e.kit.holds.stopped() == 2).then_some(()));

    // Everything delivered: the call left memory, and the ledger answers for it.
    wait_for!(
        "the call settled",
        b.status("s").await.unwrap().calls.is_empty().then_some(())
    );
    let late = b
        .cancel(CancelTarget::Unit(unit_id(&call, 3)), "the test", None)
        .await
        .unwrap();
    assert_eq!(
        late,
        Cancelled {
            cancelled: vec![],
            already_finished: 1
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_child_never_starts_and_a_cancel_frees_a_slot_for_the_next() {
    let e = Engine::new();
    let b = e.b();
    open_capped(b, "s", 1).await;
    let call = delegated(
        b,
        "s",
        DelegateRequest::background(vec![task("a", hold()), task("b", hold()), task("c", hold())]).independent(),
    )
    .await;
    wait_for!("the first running", (e.started().len() == 1).then_some(()));
    let queued = child_id(&call, 1);
    let reply = b
        .cancel(CancelTarget::Child(queued.clone()), "the test", None)
        .await
        .unwrap();
    assert_eq!(reply.cancelled, vec![queued.clone()]);
    let st = b.counts("s").await.unwrap();
    assert_eq!((st.running, st.queued), (1, 1), "the cancelled one left the queue");

    let reply = b
        .cancel(CancelTarget::Child(child_id(&call, 0)), "the test", None)
        .await
        .unwrap();
    assert_eq!(reply.cancelled, vec![child_id(&call, 0)]);
    wait_for!(
        "the last one started in the freed slot",
        (e.started().len() == 2).then_some(())
    );
    assert_eq!(
        e.started(),
        vec![child_id(&call, 0), child_id(&call, 2)],
        "the cancelled queued child never started"
    );
    let items = collect_results(b, "s", 2).await;
    assert!(items.iter().all(|i| i.status == ChildStatus::Cancelled), "{items:?}");
    b.cancel(CancelTarget::Child(child_id(&call, 2)), "the test", None)
        .await
        .unwrap();
    collect_results(b, "s", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_with_a_cancelled_member_goes_out_whole_and_the_cancel_outlives_a_restart() {
    let mut e = Engine::new();
    open_capped(e.b(), "s", 8).await;
    let call = delegated(
        e.b(),
        "s",
        DelegateRequest::background(vec![
            task("a", hold()).group("g"),
            task("b", sim(0)).group("g"),
            task("c", hold()),
        ]),
    )
    .await;
    wait_for!("both holds running", (e.started().len() == 2).then_some(()));
    status_until(e.b(), "s", "the group's sim child ended", |st| {
        child_status(st, &call, 1) == Some(ChildStatus::Succeeded)
    })
    .await;
    let unit = unit_id(&call, 1);
    let reply = e
        .b()
        .cancel(CancelTarget::Unit(unit.clone()), "the test", None)
        .await
        .unwrap();
    assert_eq!(
        reply,
        Cancelled {
            cancelled: vec![child_id(&call, 0)],
            already_finished: 1
        }
    );
    let env = next_envelope(e.b(), "s", "t", LONG_LEASE).await;
    let got: Vec<(String, ChildStatus, ItemKind)> = env
        .items
        .iter()
        .map(|i| (i.child_id.clone(), i.status, i.kind))
        .collect();
    assert_eq!(
        got,
        vec![
            (child_id(&call, 0), ChildStatus::Cancelled, ItemKind::Result),
            (child_id(&call, 1), ChildStatus::Succeeded, ItemKind::Result),
        ],
        "the unit went out whole, with no failure notice"
    );
    b_ack(e.b(), &env).await;

    // The other unit's child: cancelled, not delivered, then a restart.
    let last = child_id(&call, 2);
    e.b()
        .cancel(CancelTarget::Child(last.clone()), "the test", None)
        .await
        .unwrap();
    e.reopen();
    open_capped(e.b(), "s", 8).await;
    let items = collect_results(e.b(), "s", 1).await;
    assert_eq!(
        (items[0].child_id.clone(), items[0].status),
        (last, ChildStatus::Cancelled)
    );
    assert_eq!(e.started().len(), 2, "nothing ran again after the restart");
}

async fn b_ack(b: &Brood, env: &Envelope) {
    b.ack(&env.claim_id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_targets_are_refused_and_change_nothing() {
    let e = Engine::new();
    let b = e.b();
    open_capped(b, "s", 8).await;
    let call = delegated(b, "s", DelegateRequest::background(vec![task("a", sim(0))])).await;
    for target in [
        CancelTarget::Call("deleg_nothing".into()),
        CancelTarget::Child(format!("{call}.1")),
        CancelTarget::Child(format!("{call}.00")),
        CancelTarget::Child("no dot".into()),
        CancelTarget::Unit(format!("{call}-0")),
        CancelTarget::Unit(format!("{call}-2")),
    ] {
        let err = b.cancel(target.clone(), "the test", None).await.unwrap_err();
        assert!(matches!(err, BroodError::UnknownTarget { .. }), "{target:?}: {err}");
        assert!(err.to_string().contains(target.id()), "{err}");
    }
    let long = "x".repeat(MAX_CANCEL_REASON + 1);
    let err = b
        .cancel(CancelTarget::Call(call.clone()), "the test", Some(&long))
        .await
        .unwrap_err();
    assert!(
        matches!(err, BroodError::Invalid { ref field, .. } if field == "reason"),
        "{err}"
    );
    let items = collect_results(b, "s", 1).await;
    assert_eq!(items[0].status, ChildStatus::Succeeded, "nothing was cancelled");
}

/// A runner that holds the children's thread for a while: what the owner sends units meanwhile
/// waits in their mailboxes.
struct Block;

impl Runner for Block {
    fn run(self: Box<Self>, _ctx: RunContext) -> futures::future::LocalBoxFuture<'static, RunOutput> {
        Box::pin(async move {
            std::thread::sleep(std::time::Duration::from_millis(1500));
            RunOutput::Succeeded {
                summary: "blocked".into(),
                output: None,
            }
        })
    }
}

/// A runner that records that its body ran (a command runner would spawn its process there).
struct Mark(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Runner for Mark {
    fn run(self: Box<Self>, ctx: RunContext) -> futures::future::LocalBoxFuture<'static, RunOutput> {
        let ran = self.0.clone();
        Box::pin(async move {
            ran.lock().unwrap().push(ctx.child_id.clone());
            RunOutput::Succeeded {
                summary: "ran".into(),
                output: None,
            }
        })
    }
}

/// A child marked running whose cancel is decided before its unit read its start (the start
/// is ahead of the cancel in the unit's mailbox) ends `cancelled` without its runner built.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_cancelled_before_its_unit_started_it_never_runs_its_runner() {
    let dir = tempfile::tempdir().unwrap();
    let ran = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut runners = Runners::builtin();
    runners.register("block", |_| Ok(Box::new(Block) as Box<dyn Runner>));
    let marks = ran.clone();
    runners.register("mark", move |_| Ok(Box::new(Mark(marks.clone())) as Box<dyn Runner>));
    let b = Brood::open(BroodConfig::new(dir.path().join("ledger")).runners(runners)).unwrap();
    open_capped(&b, "s", 8).await;
    delegated(
        &b,
        "s",
        DelegateRequest::background(vec![task("hold", serde_json::json!({"kind": "block"}))]),
    )
    .await;
    // The children's thread is held: the next call's start waits in its unit's mailbox.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let call = delegated(
        &b,
        "s",
        DelegateRequest::background(vec![task("b", serde_json::json!({"kind": "mark"}))]),
    )
    .await;
    let cancelled = b
        .cancel(CancelTarget::Call(call.clone()), "the test", None)
        .await
        .unwrap();
    assert_eq!(cancelled.cancelled, vec![format!("{call}.0")]);
    let items = collect_results(&b, "s", 2).await;
    let marked = items.iter().find(|i| i.child_id == format!("{call}.0")).unwrap();
    assert_eq!(marked.status, ChildStatus::Cancelled);
    assert!(
        ran.lock().unwrap().is_empty(),
        "the cancelled child's runner ran: {:?}",
        ran.lock().unwrap()
    );
    b.shutdown();
}

/// A cancel is answered once its rows are recorded; the children's thread may drop the runner
/// later. An external worker must hear 409 from the answer on all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_workers_heartbeat_is_refused_from_the_moment_the_cancel_answered() {
    let dir = tempfile::tempdir().unwrap();
    let queues = std::sync::Arc::new(brood::runners::WorkQueues::new());
    let mut runners = Runners::builtin();
    runners.register("block", |_| Ok(Box::new(Block) as Box<dyn Runner>));
    runners.register_external(queues.clone());
    let b = Brood::open(BroodConfig::new(dir.path().join("ledger")).runners(runners)).unwrap();
    open_capped(&b, "s", 8).await;
    let call = delegated(
        &b,
        "s",
        DelegateRequest::background(vec![task("out", serde_json::json!({"kind": "external"}))]),
    )
    .await;
    let lease = std::time::Duration::from_secs(30);
    let work = queues
        .poll("default", "w1", std::time::Duration::from_secs(10), lease)
        .await
        .expect("the external child was handed out");
    assert!(queues.heartbeat(&work.child_id, &work.token, None).is_ok());
    delegated(
        &b,
        "s",
        DelegateRequest::background(vec![task("hold", serde_json::json!({"kind": "block"}))]),
    )
    .await;
    // The children's thread is held: the external child's runner cannot be dropped until it
    // is free, but the cancel is answered meanwhile.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let cancelled = b
        .cancel(CancelTarget::Call(call.clone()), "the test", None)
        .await
        .unwrap();
    assert_eq!(cancelled.cancelled, vec![work.child_id.clone()]);
    assert_eq!(
        queues.heartbeat(&work.child_id, &work.token, None),
        Err(brood::runners::WorkError::Ended(work.child_id.clone())),
        "the worker still held a cancelled child"
    );
    assert_eq!(
        queues
            .complete(
                &work.child_id,
                &work.token,
                RunOutput::Succeeded {
                    summary: "late".into(),
                    output: None
                }
            )
            .err(),
        Some(brood::runners::WorkError::Ended(work.child_id.clone()))
    );
    let items = collect_results(&b, "s", 2).await;
    let out = items.iter().find(|i| i.child_id == work.child_id).unwrap();
    assert_eq!(out.status, ChildStatus::Cancelled);
    b.shutdown();
}
