//! Set ordinals — DESIGN.md, vocabulary: "the call's ordinal inside its session is its *set*
//! (`set 1`, `set 2`, …) … A sync call (or one forced to sync) also takes a set number", and
//! problem 6: "ordinals are scoped per parent session".
//!
//! Proven here: sets count per session from 1, sync and forced-sync calls take one too, and the
//! count goes on after a restart. That refused calls take none is in bad_input.rs; api_model.rs
//! checks sets across random sequences with faults and restarts.

mod common;

use brood::{DelegateReply, DelegateRequest, SessionSettings};
use common::*;

fn one() -> DelegateRequest {
    DelegateRequest::background(vec![task("x", sim(0))])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_ordinals_count_per_session_from_one() {
    let t = TestBrood::new();
    let b = t.b();
    open_wake(b, "s1").await;
    open_wake(b, "s2").await;
    assert_eq!(b.delegate("s1", one()).await.unwrap().set(), 1);
    assert_eq!(b.delegate("s2", one()).await.unwrap().set(), 1);
    assert_eq!(b.delegate("s1", one()).await.unwrap().set(), 2);
    open_wake(b, "s3").await;
    assert_eq!(
        b.delegate("s3", one()).await.unwrap().set(),
        1,
        "a new session starts at set 1"
    );
    assert_eq!(b.delegate("s2", one()).await.unwrap().set(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_and_forced_sync_calls_take_the_next_set() {
    let t = TestBrood::new();
    let b = t.b();
    open_wake(b, "s2").await;
    assert_eq!(b.delegate("s2", one()).await.unwrap().set(), 1);
    let sync = b
        .delegate("s2", DelegateRequest::sync(vec![task("y", sim(0))]))
        .await
        .unwrap();
    assert!(matches!(sync, DelegateReply::Sync { .. }));
    assert_eq!(sync.set(), 2);
    assert!(sync.note().contains("set 2"), "{}", sync.note());
    // Without a wake target a background call is forced to sync, and still takes its session's
    // next set.
    b.open_session("nw", SessionSettings::default()).await.unwrap();
    assert_eq!(
        b.delegate("nw", DelegateRequest::sync(vec![task("y", sim(0))]))
            .await
            .unwrap()
            .set(),
        1
    );
    let forced = b.delegate("nw", one()).await.unwrap();
    assert!(matches!(forced, DelegateReply::Sync { .. }));
    assert_eq!(forced.set(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_ordinals_go_on_after_a_restart() {
    let mut t = TestBrood::new();
    let b = t.b();
    open_wake(b, "s1").await;
    open_wake(b, "s2").await;
    assert_eq!(b.delegate("s1", one()).await.unwrap().set(), 1);
    assert_eq!(b.delegate("s2", one()).await.unwrap().set(), 1);
    assert_eq!(b.delegate("s1", one()).await.unwrap().set(), 2);
    let sync = b
        .delegate("s2", DelegateRequest::sync(vec![task("y", sim(0))]))
        .await
        .unwrap();
    assert_eq!(sync.set(), 2);

    t.reopen();
    let b = t.b();
    open_wake(b, "s1").await;
    assert_eq!(b.delegate("s1", one()).await.unwrap().set(), 3);
    b.open_session("s2", SessionSettings::default()).await.unwrap();
    let forced = b.delegate("s2", one()).await.unwrap();
    assert!(matches!(forced, DelegateReply::Sync { .. }));
    assert_eq!(forced.set(), 3);
    open_wake(b, "s3").await;
    assert_eq!(
        b.delegate("s3", one()).await.unwrap().set(),
        1,
        "a new session starts at set 1"
    );
    assert_eq!(b.delegate("s1", one()).await.unwrap().set(), 4);
}
