//! I8 capacity — "running children per session ≤ `max_concurrent_children` (default 8); how a
//! call is split into units changes nothing about that; children over it wait in order; a queued
//! child's stall clock does not run."
//!
//! Each test runs the same workload on a session of capacity 2: a call of ten independent units
//! and a call of one unit of four, every child a probe that measures real concurrency inside its
//! runner. One test per clause.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use brood::child_id;
use brood::{ChildStatus, DelegateRequest, ItemKind, ReadyItem};
use common::*;

const CAP: usize = 2;

/// What the workload left behind.
struct Run {
    items: Vec<ReadyItem>,
    /// Child ids in the order they were queued.
    queued: Vec<String>,
    /// The most children the status ever reported running.
    sampled_max: usize,
}

async fn run_workload(t: &TestBrood) -> Run {
    let b = t.arc();
    open_capped(&b, "cap", CAP as u32).await;
    // Each child runs 150 ms and heartbeats; its stall timeout (400 ms) is shorter than the
    // time the later ones wait in the queue (up to ~600 ms), so a stall clock that ran while
    // queued would interrupt them.
    let t150 = |goal: String| {
        let mut t = task(goal, probe(150));
        t.stall_ms = Some(400);
        t
    };
    let independent = b
        .delegate(
            "cap",
            DelegateRequest::background((0..10).map(|i| t150(format!("ind {i}"))).collect()).independent(),
        )
        .await
        .unwrap();
    // The same capacity applies however a call is split into units.
    let one_unit = b
        .delegate(
            "cap",
            DelegateRequest::background((0..4).map(|i| t150(format!("unit {i}"))).collect()),
        )
        .await
        .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let b = b.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let (mut samples, mut max_running) = (0usize, 0usize);
            while !stop.load(Ordering::SeqCst) {
                let st = b.status("cap").await.unwrap();
                assert!(
                    st.counts.running <= CAP,
                    "status reports {} running with capacity {CAP}",
                    st.counts.running
                );
                max_running = max_running.max(st.counts.running);
                samples += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            (samples, max_running)
        })
    };
    let items = collect_results(&b, "cap", 14).await;
    stop.store(true, Ordering::SeqCst);
    let (samples, sampled_max) = sampler.await.unwrap();
    eprintln!("status samples: {samples}, most running seen: {sampled_max}");
    let queued = (0..10)
        .map(|i| child_id(independent.call_id(), i))
        .chain((0..4).map(|i| child_id(one_unit.call_id(), i)))
        .collect();
    Run {
        items,
        queued,
        sampled_max,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_children_never_exceed_capacity_however_calls_are_split() {
    let t = TestBrood::new();
    let run = run_workload(&t).await;
    assert!(run.sampled_max <= CAP);
    let real_max = t.kit.probe.max.load(Ordering::SeqCst);
    assert!(real_max <= CAP, "{real_max} runners ran at once with capacity {CAP}");
    assert_eq!(real_max, CAP, "capacity 2 with 14 queued children should run 2 at once");
    assert_eq!(t.kit.probe.current.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_childs_stall_clock_does_not_run() {
    let t = TestBrood::new();
    let run = run_workload(&t).await;
    for item in run.items.iter().filter(|i| i.kind == ItemKind::Result) {
        assert_eq!(
            item.status,
            ChildStatus::Succeeded,
            "{} ended {} ({:?}): a queued child must not be stalled",
            item.dedup_key,
            item.status,
            item.error
        );
    }
    assert!(
        !run.items.iter().any(|i| i.kind == ItemKind::FailureNotice),
        "no child failed, so there is no failure notice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_over_capacity_start_in_queue_order() {
    let t = TestBrood::new();
    let run = run_workload(&t).await;
    // A child starts at most CAP-1 places from its queue position (children admitted together
    // may start in either order).
    let starts = t.kit.probe.starts.lock().unwrap().clone();
    assert_eq!(starts.len(), run.queued.len(), "every child ran once: {starts:?}");
    for (want, id) in run.queued.iter().enumerate() {
        let got = starts.iter().position(|s| s == id).expect("child started");
        assert!(
            got.abs_diff(want) < CAP,
            "{id} started {got}th but was queued {want}th: {starts:?}"
        );
    }
}

/// A server-wide `max_running_children` holds over every session, and once it binds the freed
/// slots go round-robin: a session with one child queued behind another's twelve gets the next
/// free slot, not the thirteenth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_wide_bound_holds_and_is_shared_round_robin() {
    let dir = tempfile::tempdir().unwrap();
    let kit = Kit::default();
    let config = brood::BroodConfig::new(dir.path().join("ledger"))
        .runners(kit.runners())
        .max_running_children(Some(2));
    let b = brood::Brood::open(config).unwrap();
    for s in ["big", "small"] {
        open_capped(&b, s, 8).await;
    }
    let tasks = (0..12).map(|i| task(format!("big {i}"), probe(100))).collect();
    let big = b
        .delegate("big", DelegateRequest::background(tasks).independent())
        .await
        .unwrap();
    wait_for!(
        "two of big's children run",
        (kit.probe.current.load(Ordering::SeqCst) == 2).then_some(())
    );
    assert_eq!(
        b.counts("big").await.unwrap().queued,
        10,
        "the bound, not big's capacity of 8"
    );
    let small = b
        .delegate("small", DelegateRequest::background(vec![task("small", probe(100))]))
        .await
        .unwrap();
    assert_eq!(collect_results(&b, "big", 12).await.len(), 12);
    assert_eq!(collect_results(&b, "small", 1).await.len(), 1);
    assert!(
        kit.probe.max.load(Ordering::SeqCst) <= 2,
        "never more than the bound at once"
    );
    let starts = kit.probe.starts.lock().unwrap().clone();
    let at = starts
        .iter()
        .position(|id| *id == child_id(small.call_id(), 0))
        .expect("small's child ran");
    assert!(
        at <= 3,
        "small got one of the first freed slots, not the last: {at} in {starts:?}"
    );
    assert_eq!(starts.len(), 13, "{:?}", big.call_id());
    b.shutdown();
}
