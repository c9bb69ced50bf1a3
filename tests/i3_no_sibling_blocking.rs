//! I3 no sibling blocking — "a completed unit's items are claimable at the next boundary whatever
//! other units, of its call or any other, are still doing; a failure notice never waits for
//! anything."
//!
//! Proven here: a fast unit goes out while a sibling unit of its call, or a unit of an earlier
//! call, hangs; a failure notice goes out while its own unit still runs. And the other side of
//! the rule: a unit goes out whole, once its last child is terminal, and only once.

mod common;

use std::collections::BTreeSet;

use brood::{child_id, dedup_key};
use brood::{ChildStatus, DelegateRequest, ItemKind};
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_unit_is_claimable_while_a_sibling_unit_of_its_call_hangs() {
    let t = TestBrood::new();
    let b = t.b();
    open_wake(b, "s").await;
    // Each ungrouped task is its own unit; the slow one hangs for good.
    let call1 = b
        .delegate(
            "s",
            DelegateRequest::background(vec![task("slow", sim_outcome(0, "hang")), task("fast", sim(0))]).independent(),
        )
        .await
        .unwrap();
    let call1 = call1.call_id().to_string();
    let env = next_envelope(b, "s", "c", LONG_LEASE).await;
    assert_eq!(keys(&env), BTreeSet::from([result_key(&call1, 1)]));
    assert_eq!(env.items[0].status, ChildStatus::Succeeded);
    let st = b.status("s").await.unwrap();
    assert_eq!(
        child_status(&st, &call1, 0),
        Some(ChildStatus::Running),
        "the slow sibling still runs"
    );
    assert_eq!(b.ack(&env.claim_id).await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_calls_unit_is_not_held_back_by_an_earlier_calls_hanging_unit() {
    let t = TestBrood::new();
    let b = t.b();
    open_wake(b, "s").await;
    let call1 = b
        .delegate(
            "s",
            DelegateRequest::background(vec![task("slow", sim_outcome(0, "hang"))]),
        )
        .await
        .unwrap();
    let call1 = call1.call_id().to_string();
    let call2 = b
        .delegate("s", DelegateRequest::background(vec![task("fast 2", sim(0))]))
        .await
        .unwrap();
    let call2 = call2.call_id().to_string();
    let env = next_envelope(b, "s", "c", LONG_LEASE).await;
    assert_eq!(keys(&env), BTreeSet::from([result_key(&call2, 0)]));
    assert_eq!(b.ack(&env.claim_id).await.unwrap(), 1);
    let st = b.status("s").await.unwrap();
    assert_eq!(child_status(&st, &call1, 0), Some(ChildStatus::Running));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_goes_out_whole_once_its_last_child_is_terminal() {
    let t = TestBrood::new();
    let b = t.b();
    open_wake(b, "s").await;
    // Ungrouped tasks of a default call form one unit, so its fast child waits for the gated
    // one (and for nothing else).
    let call3 = b
        .delegate(
            "s",
            DelegateRequest::background(vec![task("fast 3", sim(0)), task("gated", gate("g3"))]),
        )
        .await
        .unwrap();
    let call3 = call3.call_id().to_string();
    status_until(b, "s", "the fast child of call 3 to be recorded", |st| {
        child_status(st, &call3, 0) == Some(ChildStatus::Succeeded)
    })
    .await;
    assert!(
        b.boundary("s", "c", LONG_LEASE).await.unwrap().is_none(),
        "a unit must not go out before its last child is terminal"
    );
    t.kit.gates.open("g3");
    let env = next_envelope(b, "s", "c", LONG_LEASE).await;
    assert_eq!(
        keys(&env),
        BTreeSet::from([result_key(&call3, 0), result_key(&call3, 1)])
    );
    b.ack(&env.claim_id).await.unwrap();
}

/// A grouped unit of three on `session`: one child fails at once, two wait on gates `fa`, `fb`.
async fn wave_with_a_fast_failure(b: &brood::Brood, session: &str) -> String {
    open_wake(b, session).await;
    let grouped = |goal: &str, runner| {
        let mut t = task(goal, runner);
        t.group = Some("wave".into());
        t
    };
    let reply = b
        .delegate(
            session,
            DelegateRequest::background(vec![
                grouped("dies fast", sim_outcome(0, "fail")),
                grouped("slow a", gate("fa")),
                grouped("slow b", gate("fb")),
            ]),
        )
        .await
        .unwrap();
    reply.call_id().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_notice_is_claimable_while_its_unit_still_runs() {
    let t = TestBrood::new();
    let b = t.b();
    let call = wave_with_a_fast_failure(b, "f").await;
    let failed_child = child_id(&call, 0);

    let env = next_envelope(b, "f", "c", LONG_LEASE).await;
    assert_eq!(env.items.len(), 1, "only the notice is ready: {:?}", keys(&env));
    let notice = &env.items[0];
    assert_eq!(notice.kind, ItemKind::FailureNotice);
    assert_eq!(notice.dedup_key, format!("{failed_child}:failure_notice"));
    assert_eq!(notice.dedup_key, dedup_key(&failed_child, ItemKind::FailureNotice));
    assert_eq!(notice.status, ChildStatus::Failed);
    assert!(notice.error.is_some());
    assert_eq!(notice.group.as_deref(), Some("wave"));
    assert_eq!(notice.unit_size, 3);
    let st = b.status("f").await.unwrap();
    assert_eq!(child_status(&st, &call, 1), Some(ChildStatus::Running));
    assert_eq!(child_status(&st, &call, 2), Some(ChildStatus::Running));
    assert_eq!(b.ack(&env.claim_id).await.unwrap(), 1);
    assert!(
        b.boundary("f", "c", LONG_LEASE).await.unwrap().is_none(),
        "the unit is not complete"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_its_failure_notice_a_unit_goes_out_whole_once() {
    let t = TestBrood::new();
    let b = t.b();
    let call = wave_with_a_fast_failure(b, "f").await;
    let env = next_envelope(b, "f", "c", LONG_LEASE).await;
    assert_eq!(
        keys(&env),
        BTreeSet::from([dedup_key(&child_id(&call, 0), ItemKind::FailureNotice)])
    );
    assert_eq!(b.ack(&env.claim_id).await.unwrap(), 1);

    t.kit.gates.open("fa");
    t.kit.gates.open("fb");
    let env = next_envelope(b, "f", "c", LONG_LEASE).await;
    let want: BTreeSet<String> = (0..3).map(|i| result_key(&call, i)).collect();
    assert_eq!(keys(&env), want, "then the unit's full results, once");
    for item in &env.items {
        assert_eq!(item.kind, ItemKind::Result);
        let want = if item.task_index == 0 {
            ChildStatus::Failed
        } else {
            ChildStatus::Succeeded
        };
        assert_eq!(item.status, want);
    }
    assert_eq!(b.ack(&env.claim_id).await.unwrap(), 3);
    assert!(b.boundary("f", "c", LONG_LEASE).await.unwrap().is_none());
}
