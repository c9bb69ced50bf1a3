//! I6 recovery — "after a restart every unit that was running is resolved: recorded children are
//! replayed with their real results; children that never started are queued again; children that
//! were running re-run if their task allows it, else become `unknown`; the unit's text says "k/n
//! child results were recorded before the owner exited". Live claims are returned."
//!
//! Proven here: a unit cut off by a shutdown is resolved child by child, as the rule says; live
//! claims are returned (a late ack of one is refused) and their items are ready again with the
//! ones that were never claimed. That acked items stay delivered is in i2_no_duplication.rs.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use brood::{
    Brood, BroodConfig, BroodError, ChildStatus, DelegateRequest, ItemKind, RunContext, RunOutput, Runner, Runners,
    SessionSettings, TaskSpec,
};
use common::*;
use futures::future::LocalBoxFuture;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_claim_is_returned_by_a_restart_and_acking_it_is_refused() {
    let mut t = TestBrood::new();
    let mixed = acked_claimed_and_ready(t.b(), "r").await;
    t.reopen();
    let b = t.b();
    open_wake(b, "r").await;
    assert!(
        matches!(b.ack(&mixed.held.claim_id).await, Err(BroodError::ClaimLost(_))),
        "a claim from before the restart was returned; acking it is refused"
    );
    let st = b.status("r").await.unwrap();
    assert_eq!(
        (st.counts.ready, st.counts.claimed),
        (3, 0),
        "the returned claim's item is ready again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_items_claimed_or_not_are_ready_after_a_restart() {
    let mut t = TestBrood::new();
    let mixed = acked_claimed_and_ready(t.b(), "r").await;
    let env = reopened_envelope(&mut t, "r", "unacked items are ready").await;
    let b = t.b();
    let mut want = mixed.ready.clone();
    want.insert(mixed.claimed.clone());
    assert_eq!(keys(&env), want, "exactly the unacked items, the claimed one included");
    for item in &env.items {
        assert_eq!(item.status, ChildStatus::Succeeded);
    }
    assert_eq!(b.ack(&env.claim_id).await.unwrap(), 3);
    assert!(b.boundary("r", "c", LONG_LEASE).await.unwrap().is_none());
}

/// Fails on its first attempt only by hanging; later attempts succeed.
struct HangsOnFirstAttempt(Arc<AtomicU32>);

impl Runner for HangsOnFirstAttempt {
    fn run(self: Box<Self>, ctx: RunContext) -> LocalBoxFuture<'static, RunOutput> {
        let runs = self.0.clone();
        Box::pin(async move {
            runs.fetch_add(1, Ordering::SeqCst);
            if ctx.attempt == 1 {
                futures::future::pending::<()>().await;
            }
            RunOutput::Succeeded {
                summary: format!("attempt {}", ctx.attempt),
                output: None,
            }
        })
    }
}

fn sim_task(ms: u64) -> TaskSpec {
    task(format!("work for {ms} ms"), sim(ms))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_replays_recorded_children_reruns_or_resolves_the_rest() {
    let dir = tempfile::TempDir::new().unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let config = {
        let runs = runs.clone();
        let mut runners = Runners::builtin();
        runners.register("flaky", move |_| {
            Ok(Box::new(HangsOnFirstAttempt(runs.clone())) as Box<dyn Runner>)
        });
        BroodConfig::new(dir.path()).runners(runners)
    };
    let brood = Brood::open(config.clone()).unwrap();
    brood
        .open_session("s", SessionSettings::default().wake(|_| {}))
        .await
        .unwrap();
    // One unit of four: two finish, one hangs and may re-run, one hangs and may not.
    let mut rerun = TaskSpec::new("re-runnable", json!({"kind": "flaky"}));
    rerun.rerun_on_recovery = true;
    let stuck = TaskSpec::new("not re-runnable", json!({"kind": "flaky"}));
    let reply = brood
        .delegate(
            "s",
            DelegateRequest::background(vec![sim_task(0), sim_task(10), rerun, stuck]),
        )
        .await
        .unwrap();
    let call = reply.call_id().to_string();
    // Wait until the two sim children are recorded and the other two are running.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let st = brood.status("s").await.unwrap();
        let done = st.calls[0].children.iter().filter(|c| c.status.is_terminal()).count();
        if done == 2 && st.counts.running == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "children never settled: {st:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        brood.boundary("s", "c", LONG_LEASE).await.unwrap().is_none(),
        "the unit is incomplete"
    );
    brood.shutdown(); // the owner exits with two children running

    let brood = Brood::open(config).unwrap();
    brood
        .open_session("s", SessionSettings::default().wake(|_| {}))
        .await
        .unwrap();
    let env = next_envelope(&brood, "s", "c", LONG_LEASE).await;
    let by_index: BTreeMap<u32, _> = env
        .items
        .iter()
        .filter(|i| i.kind == ItemKind::Result)
        .map(|i| (i.task_index, i))
        .collect();
    assert_eq!(by_index.len(), 4, "{:#?}", env.items);
    assert_eq!(by_index[&0].status, ChildStatus::Succeeded);
    assert!(by_index[&0].recovered, "recorded children are replayed as recovered");
    assert_eq!(by_index[&1].status, ChildStatus::Succeeded);
    assert_eq!(by_index[&2].status, ChildStatus::Succeeded);
    assert_eq!(by_index[&2].summary.as_deref(), Some("attempt 2"));
    assert_eq!(by_index[&3].status, ChildStatus::Unknown);
    assert_eq!(runs.load(Ordering::SeqCst), 3, "only the re-runnable child ran again");
    assert!(
        env.text
            .contains("2/4 child results were recorded before the owner exited"),
        "{}",
        env.text
    );
    assert!(env.items.iter().all(|i| i.call_id == call));
    brood.ack(&env.claim_id).await.unwrap();
    brood.shutdown();
}
