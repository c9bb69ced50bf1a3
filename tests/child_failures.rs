//! A failing child — DESIGN.md, I3: a unit's items go out whatever other units are doing; here,
//! whatever a sibling's runner does. A runner that panics fails its own child only: the panic
//! message becomes that child's error, its siblings succeed, and the session takes new calls.
//! Early failure notices are in i3_no_sibling_blocking.rs; panics of the engine's own actors
//! are in faults.rs.

mod common;

use std::collections::HashMap;

use brood::child_id;
use brood::{ChildStatus, DelegateReply, DelegateRequest, ItemKind};
use common::*;

/// Session `p` with one unit of three children, the middle one panicking; returns the call id
/// and every item delivered once all three results were.
async fn one_panics(b: &brood::Brood) -> (String, Vec<brood::ReadyItem>) {
    open_wake(b, "p").await;
    let reply = b
        .delegate(
            "p",
            DelegateRequest::background(vec![
                task("a", sim(0)),
                task("boom", sim_outcome(0, "panic")),
                task("c", sim(20)),
            ]),
        )
        .await
        .unwrap();
    let items = collect_results(b, "p", 3).await;
    (reply.call_id().to_string(), items)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_runner_fails_only_its_child() {
    let t = TestBrood::new();
    let (call, items) = one_panics(t.b()).await;
    let results: HashMap<u32, _> = items
        .iter()
        .filter(|i| i.kind == ItemKind::Result)
        .map(|i| (i.task_index, i))
        .collect();
    assert_eq!(results.len(), 3);
    let boom = results[&1];
    assert_eq!(boom.status, ChildStatus::Failed);
    let error = boom.error.as_deref().unwrap_or_default();
    let expected = format!("simulated panic in {}", child_id(&call, 1));
    assert!(error.contains(&expected), "the panic message is the error: {error:?}");
    for i in [0, 2] {
        assert_eq!(results[&i].status, ChildStatus::Succeeded, "sibling {i} must succeed");
        assert!(results[&i].error.is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_takes_new_calls_after_a_runner_panicked() {
    let t = TestBrood::new();
    let b = t.b();
    one_panics(b).await;
    match b
        .delegate("p", DelegateRequest::sync(vec![task("after", sim(0))]))
        .await
        .unwrap()
    {
        DelegateReply::Sync {
            results,
            forced_sync_reason,
            set,
            ..
        } => {
            assert_eq!(set, 2);
            assert!(forced_sync_reason.is_none());
            assert_eq!(results.len(), 1);
            assert_eq!(results[0].status, ChildStatus::Succeeded);
        }
        other => panic!("a sync call answers inline, got {other:?}"),
    }
    let later = b
        .delegate("p", DelegateRequest::background(vec![task("later", sim(0))]))
        .await
        .unwrap();
    assert_eq!(later.set(), 3);
    let items = collect_results(b, "p", 1).await;
    assert_eq!(items[0].dedup_key, result_key(later.call_id(), 0));
    assert_eq!(items[0].status, ChildStatus::Succeeded);
}
