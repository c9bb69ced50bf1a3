//! Decide → persist → apply (DESIGN.md): a request whose rows could not be made durable changed
//! nothing — no set number taken, no item dead without its dead letter, no claim lost — and a
//! request that was made durable is answered as such even when its owner died before it could
//! answer (a retried ack, a sync caller).
//!
//! Fault points are process-wide, so the tests of this file run one at a time.
#![cfg(feature = "failpoints")]
#![allow(clippy::await_holding_lock)]

mod common;

use std::time::Duration;

use brood::{failpoints, BroodError, DelegateError, DelegateRequest, ReleaseReason, SessionSettings};
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_whose_flush_failed_takes_no_set_number() {
    let _g = serial();
    let mut t = TestBrood::new();
    open_wake(t.b(), "s").await;
    failpoints::arm("ledger_flush", 1);
    let refused = t
        .b()
        .delegate("s", DelegateRequest::background(vec![task("lost", sim(0))]))
        .await
        .unwrap_err();
    assert!(matches!(refused.error, BroodError::Ledger(_)), "{refused}");
    assert_eq!(refused.request.tasks[0].goal, "lost", "the request is handed back");
    let next = t.b().delegate("s", refused.request).await.unwrap();
    assert_eq!(next.set(), 1, "the refused call took no set number");
    t.reopen();
    open_wake(t.b(), "s").await;
    let after = t
        .b()
        .delegate("s", DelegateRequest::background(vec![task("after", sim(0))]))
        .await
        .unwrap();
    assert_eq!(after.set(), 2, "nor did it leave one behind in the ledger");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_marks_the_children_it_starts_in_one_start_row_flushed_with_its_call() {
    let _g = serial();
    let mut t = TestBrood::new();
    open_capped(t.b(), "s", 2).await;
    // A refused dispatch leaves no start row behind.
    failpoints::arm("ledger_flush", 1);
    let refused = t
        .b()
        .delegate("s", DelegateRequest::background(vec![task("lost", gate("never"))]))
        .await
        .unwrap_err();
    assert!(matches!(refused.error, BroodError::Ledger(_)), "{refused}");
    // Two of three start at once (capacity 2): neither is safe to re-run.
    let reply = t
        .b()
        .delegate(
            "s",
            DelegateRequest::background(vec![task("a", hold()), task("b", hold()), task("c", sim(0))]),
        )
        .await
        .unwrap();
    let call = reply.call_id().to_string();
    let st = status_until(t.b(), "s", "two children running", |st| st.counts.running == 2).await;
    assert_eq!(st.counts.queued, 1);
    // Their runners really started: a stop before that would hand them back to the queue
    // (a row of their own), which is another test's case.
    wait_for!("both runners started", (t.kit.holds.started().len() == 2).then_some(()));
    t.shut_down();
    {
        let ledger = t.open_ledger();
        let rows = ledger.load().unwrap();
        assert_eq!(rows.calls.len(), 1, "only the accepted call is stored");
        assert_eq!(rows.starts.len(), 1, "{:?}", rows.starts);
        assert_eq!(
            (rows.starts[0].call_id.as_str(), &rows.starts[0].tasks[..]),
            (call.as_str(), &[0, 1][..])
        );
        assert!(
            rows.children.is_empty(),
            "no child wrote a row of its own: {:?}",
            rows.children
        );
    }
    // A restart finds the two started (running at the crash, not safe to re-run): unknown; the
    // queued one runs.
    t.open_again();
    open_wake(t.b(), "s").await;
    let results = collect_results(t.b(), "s", 3).await;
    let by_index: std::collections::BTreeMap<u32, brood::ChildStatus> = results
        .iter()
        .filter(|i| i.kind == brood::ItemKind::Result)
        .map(|i| (i.task_index, i.status))
        .collect();
    assert_eq!(
        by_index.into_iter().collect::<Vec<_>>(),
        vec![
            (0, brood::ChildStatus::Unknown),
            (1, brood::ChildStatus::Unknown),
            (2, brood::ChildStatus::Succeeded)
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_started_again_after_its_start_was_lost_is_still_known_started_after_a_restart() {
    let _g = serial();
    let mut t = TestBrood::new();
    open_wake(t.b(), "s").await;
    // Its unit panics at the first start: the start is lost, the child requeued (a row of its
    // own, queued), and started again, so its running mark must now go into that row: a start
    // row would be hidden behind the queued row, and a restart would run it a second time.
    failpoints::arm("unit_handler", 1);
    t.b()
        .delegate("s", DelegateRequest::background(vec![task("long", probe(600_000))]))
        .await
        .unwrap();
    let probe = t.kit.probe.clone();
    wait_for!(
        "the child's runner to start",
        (probe.starts.lock().unwrap().len() == 1).then_some(())
    );
    assert!(!failpoints::fires("unit_handler"), "the unit never panicked");
    t.shut_down();
    {
        let ledger = t.open_ledger();
        let rows = ledger.load().unwrap();
        let statuses: Vec<brood::ChildStatus> = rows.children.iter().map(|c| c.status).collect();
        assert_eq!(statuses, vec![brood::ChildStatus::Running], "its own row says running");
    }
    t.open_again();
    open_wake(t.b(), "s").await;
    let results = collect_results(t.b(), "s", 1).await;
    let result = results.iter().find(|i| i.kind == brood::ItemKind::Result).unwrap();
    assert_eq!(result.status, brood::ChildStatus::Unknown);
    assert_eq!(probe.starts.lock().unwrap().len(), 1, "never run a second time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_whose_flush_failed_leaves_the_claim_as_it_was() {
    let _g = serial();
    let mut t = TestBrood::new();
    t.b()
        .open_session("s", SessionSettings::default().wake(|_| {}).max_delivery_attempts(1))
        .await
        .unwrap();
    t.b()
        .delegate("s", DelegateRequest::background(vec![task("a", sim(0))]))
        .await
        .unwrap();
    let env = next_envelope(t.b(), "s", "c", LONG_LEASE).await;
    failpoints::arm("ledger_flush", 1);
    let err = t
        .b()
        .release(&env.claim_id, ReleaseReason::Failed, Duration::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(err, BroodError::Ledger(_)), "{err}");
    assert!(
        t.b().dead_letters().await.unwrap().is_empty(),
        "no dead letter was recorded"
    );
    let st = t.b().counts("s").await.unwrap();
    assert_eq!((st.claimed, st.ready), (1, 0), "the claim is still live, as it was");
    // Nothing was marked dead behind the failed flush: after a restart the item is ready.
    t.reopen();
    open_wake(t.b(), "s").await;
    assert!(t.b().dead_letters().await.unwrap().is_empty());
    let again = next_envelope(t.b(), "s", "c", LONG_LEASE).await;
    assert_eq!(keys(&again), keys(&env));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_retried_after_a_restart_answers_what_it_delivered() {
    let _g = serial();
    let mut t = TestBrood::new();
    open_wake(t.b(), "s").await;
    t.b()
        .delegate(
            "s",
            DelegateRequest::background(vec![task("a", sim(0)), task("b", sim(0))]),
        )
        .await
        .unwrap();
    let env = next_envelope(t.b(), "s", "c", LONG_LEASE).await;
    assert_eq!(t.b().ack(&env.claim_id).await.unwrap(), 2);
    t.reopen();
    open_wake(t.b(), "s").await;
    assert_eq!(
        t.b().ack(&env.claim_id).await.unwrap(),
        2,
        "the retried ack took effect before"
    );
    assert!(matches!(
        t.b().release(&env.claim_id, ReleaseReason::Busy, Duration::ZERO).await,
        Err(BroodError::ClaimAcked(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_retried_after_an_owner_restart_answers_what_it_delivered() {
    let _g = serial();
    let t = TestBrood::new();
    open_wake(t.b(), "s").await;
    t.b()
        .delegate("s", DelegateRequest::background(vec![task("a", sim(0))]))
        .await
        .unwrap();
    let env = next_envelope(t.b(), "s", "c", LONG_LEASE).await;
    assert_eq!(t.b().ack(&env.claim_id).await.unwrap(), 1);
    // The owner panics at its next message and is rebuilt from the ledger, forgetting the
    // claims it had in memory.
    failpoints::arm("owner_handler", 1);
    let _ = t.b().boundary("s", "c", LONG_LEASE).await;
    let n = wait_for!("the restarted owner", t.b().ack(&env.claim_id).await.ok());
    assert_eq!(n, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_caller_whose_owner_restarts_learns_its_call_id() {
    let _g = serial();
    let t = TestBrood::new();
    open_wake(t.b(), "s").await;
    let b = t.arc();
    let waiting = tokio::spawn(async move {
        b.delegate("s", DelegateRequest::sync(vec![task("gated", gate("g"))]))
            .await
    });
    status_until(t.b(), "s", "the sync child to run", |st| st.counts.running == 1).await;
    failpoints::arm("owner_handler", 1);
    let _ = t.b().boundary("s", "c", LONG_LEASE).await;
    let err = waiting.await.unwrap().unwrap_err();
    let DelegateError {
        error: BroodError::Interrupted {
            call_id: Some(call_id), ..
        },
        ..
    } = err
    else {
        panic!("expected Interrupted with the accepted call's id, got {err:?}");
    };
    t.kit.gates.open("g");
    let env = wait_for!(
        "the result at a boundary of the restarted owner",
        t.b().boundary("s", "c", LONG_LEASE).await.ok().flatten()
    );
    assert_eq!(
        env.items[0].call_id, call_id,
        "its result comes under the id it was told"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_release_never_dead_letters_even_below_a_lowered_limit() {
    let _g = serial();
    let t = TestBrood::new();
    open_wake(t.b(), "s").await;
    t.b()
        .delegate("s", DelegateRequest::background(vec![task("a", sim(0))]))
        .await
        .unwrap();
    for _ in 0..2 {
        let env = next_envelope(t.b(), "s", "c", LONG_LEASE).await;
        t.b()
            .release(&env.claim_id, ReleaseReason::Failed, Duration::ZERO)
            .await
            .unwrap();
    }
    t.b()
        .open_session("s", SessionSettings::default().max_delivery_attempts(1))
        .await
        .unwrap();
    let env = next_envelope(t.b(), "s", "c", LONG_LEASE).await;
    assert_eq!(env.items[0].delivery_attempt, 3);
    t.b()
        .release(&env.claim_id, ReleaseReason::Busy, Duration::ZERO)
        .await
        .unwrap();
    assert!(t.b().dead_letters().await.unwrap().is_empty(), "busy is not an attempt");
    let again = next_envelope(t.b(), "s", "c", LONG_LEASE).await;
    assert_eq!(keys(&again), keys(&env));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_too_long_for_milliseconds_are_refused_not_wrapped() {
    let _g = serial();
    let t = TestBrood::new();
    open_wake(t.b(), "s").await;
    let huge = Duration::from_secs(1 << 61);
    match t.b().boundary("s", "c", huge).await {
        Err(BroodError::Invalid { field, .. }) => assert_eq!(field, "lease_ms"),
        other => panic!("a lease of 2^61 s must be refused, got {other:?}"),
    }
    t.b()
        .delegate("s", DelegateRequest::background(vec![task("a", sim(0))]))
        .await
        .unwrap();
    let env = next_envelope(t.b(), "s", "c", LONG_LEASE).await;
    match t.b().release(&env.claim_id, ReleaseReason::Busy, huge).await {
        Err(BroodError::Invalid { field, .. }) => assert_eq!(field, "retry_after_ms"),
        other => panic!("a retry_after of 2^61 s must be refused, got {other:?}"),
    }
    // A long one that fits is honoured: the item waits, it is not ready at once.
    t.b()
        .release(&env.claim_id, ReleaseReason::Busy, Duration::from_secs(86_400))
        .await
        .unwrap();
    let st = t.b().counts("s").await.unwrap();
    assert_eq!((st.ready, st.backing_off), (0, 1));
    assert!(t.b().boundary("s", "c", LONG_LEASE).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_configure_changes_no_setting() {
    let _g = serial();
    let t = TestBrood::new();
    open_wake(t.b(), "s").await;
    failpoints::arm("ledger_flush", 1);
    let err = t
        .b()
        .open_session("s", SessionSettings::default().max_concurrent_children(2))
        .await
        .unwrap_err();
    assert!(matches!(err, BroodError::Ledger(_)), "{err}");
    let st = t.b().counts("s").await.unwrap();
    assert_eq!(st.info.max_concurrent_children, 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_that_arrived_inside_its_lease_waits_out_a_slow_flush_and_succeeds() {
    let _g = serial();
    let t = TestBrood::new();
    open_wake(t.b(), "s").await;
    t.b()
        .delegate("s", DelegateRequest::background(vec![task("a", sim(0))]))
        .await
        .unwrap();
    let env = next_envelope(t.b(), "s", "c", Duration::from_millis(200)).await;
    // Another request's flush is slow: it outlasts the lease while the ack waits for it.
    failpoints::arm("ledger_flush_stall", 1);
    let b = t.arc();
    let slow = tokio::spawn(async move {
        b.open_session("s", SessionSettings::default().max_concurrent_children(7))
            .await
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let sent_at = brood_actors::model::now_ms();
    let acked = t.b().ack(&env.claim_id).await;
    slow.await.unwrap().unwrap();
    if sent_at < env.lease_expires_at_ms {
        assert_eq!(acked.unwrap(), 1, "the ack arrived inside the lease");
        assert!(
            t.b().boundary("s", "c", LONG_LEASE).await.unwrap().is_none(),
            "nothing comes back"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_written_late_by_a_dead_owner_never_lands_beside_its_successor() {
    let _g = serial();
    let mut t = TestBrood::new();
    open_wake(t.b(), "s").await;
    // The owner's next write (a dispatch) stalls; meanwhile the owner dies and is rebuilt.
    failpoints::arm("ledger_write_stall", 1);
    let b = t.arc();
    let stalled = tokio::spawn(async move {
        b.delegate("s", DelegateRequest::background(vec![task("late", sim(0))]))
            .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    failpoints::arm("owner_handler", 1);
    let _ = t.b().boundary("s", "c", LONG_LEASE).await;
    let first = stalled.await.unwrap();
    let next = wait_for!(
        "the restarted owner",
        t.b()
            .delegate("s", DelegateRequest::background(vec![task("next", sim(0))]))
            .await
            .ok()
    );
    match first {
        // The dead owner's write landed before its successor read the ledger: its call is set 1.
        Ok(reply) => assert_eq!((reply.set(), next.set()), (1, 2)),
        // Or it never landed: nothing holds set 1 but the next call.
        Err(e) => {
            assert!(matches!(e.error, BroodError::Interrupted { .. }), "{e}");
            let st = t.b().status("s").await.unwrap();
            let sets: Vec<u64> = st.calls.iter().map(|c| c.call.set).collect();
            assert!(
                sets == vec![1, 2] || sets == vec![next.set()],
                "no set is held twice: {sets:?}, next {}",
                next.set()
            );
            let mut seen = sets.clone();
            seen.dedup();
            assert_eq!(seen, sets);
        }
    }
    // What the ledger holds after a restart: no set number twice.
    t.reopen();
    open_wake(t.b(), "s").await;
    let st = t.b().status("s").await.unwrap();
    let mut sets: Vec<u64> = st.calls.iter().map(|c| c.call.set).collect();
    let all = sets.len();
    sets.dedup();
    assert_eq!(
        sets.len(),
        all,
        "a set number is held by two calls: {:?}",
        st.calls
            .iter()
            .map(|c| (&c.call.call_id, c.call.set))
            .collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_cancelled_while_its_lost_start_is_requeued_stays_cancelled() {
    let _g = serial();
    let mut t = TestBrood::new();
    open_capped(t.b(), "s", 1).await;
    // Its unit panics at the start, so the child is requeued; that requeue's flush is slow,
    // and the child is cancelled while it is written.
    failpoints::arm("unit_handler", 1);
    failpoints::arm("requeue_flush_stall", 1);
    let first = t
        .b()
        .delegate("s", DelegateRequest::background(vec![task("long", probe(600_000))]))
        .await
        .unwrap()
        .call_id()
        .to_string();
    wait_for!(
        "the lost start's requeue to be decided",
        (!failpoints::armed("requeue_flush_stall")).then_some(())
    );
    // No unit starts it again: the cancel, which waits for it to stop, is answered.
    let cancel = t
        .b()
        .cancel(brood::CancelTarget::Child(brood::child_id(&first, 0)), "the test", None);
    let cancelled = tokio::time::timeout(DEADLINE, cancel)
        .await
        .expect("the cancel of a child whose start was lost is answered")
        .unwrap();
    assert_eq!(cancelled.cancelled, vec![brood::child_id(&first, 0)]);
    // The slot it held is free: a later call runs.
    t.b()
        .delegate("s", DelegateRequest::background(vec![task("next", sim(0))]))
        .await
        .unwrap();
    let items = collect_results(t.b(), "s", 2).await;
    let mut got: Vec<(String, brood::ChildStatus)> = items.iter().map(|i| (i.child_id.clone(), i.status)).collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(got[0], (brood::child_id(&first, 0), brood::ChildStatus::Cancelled));
    assert_eq!(got[1].1, brood::ChildStatus::Succeeded, "the later call ran");
    let probe = t.kit.probe.clone();
    t.shut_down();
    {
        let rows = t.open_ledger().load().unwrap();
        let row = rows.children.iter().find(|c| c.call_id == first).expect("its row");
        assert_eq!(
            row.status,
            brood::ChildStatus::Cancelled,
            "its durable row stays cancelled"
        );
    }
    t.open_again();
    open_wake(t.b(), "s").await;
    assert_eq!(
        t.b().counts("s").await.unwrap().running,
        0,
        "nothing runs after the restart"
    );
    assert!(probe.starts.lock().unwrap().is_empty(), "the cancelled child never ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_cancelled_while_its_refused_start_is_written_gives_its_slot_back() {
    let _g = serial();
    let t = TestBrood::new();
    open_capped(t.b(), "s", 1).await;
    let first = t
        .b()
        .delegate("s", DelegateRequest::background(vec![task("first", gate("first"))]))
        .await
        .unwrap()
        .call_id()
        .to_string();
    let second = t
        .b()
        .delegate("s", DelegateRequest::background(vec![task("second", probe(600_000))]))
        .await
        .unwrap()
        .call_id()
        .to_string();
    // The second child is admitted once the first ends; the flush of its running mark fails,
    // late, and the child is cancelled while it is written.
    failpoints::arm("start_flush_slow_fail", 1);
    t.kit.gates.open("first");
    wait_for!(
        "the second child's start to be decided",
        (!failpoints::armed("start_flush_slow_fail")).then_some(())
    );
    let cancel = t.b().cancel(
        brood::CancelTarget::Child(brood::child_id(&second, 0)),
        "the test",
        None,
    );
    let cancelled = tokio::time::timeout(DEADLINE, cancel)
        .await
        .expect("the cancel is answered")
        .unwrap();
    assert_eq!(cancelled.cancelled, vec![brood::child_id(&second, 0)]);
    // Its slot is free: a later call runs.
    let third = t
        .b()
        .delegate("s", DelegateRequest::background(vec![task("third", sim(0))]))
        .await
        .unwrap()
        .call_id()
        .to_string();
    let items = collect_results(t.b(), "s", 3).await;
    let status = |call: &str| {
        items
            .iter()
            .find(|i| i.child_id == brood::child_id(call, 0))
            .map(|i| i.status)
    };
    assert_eq!(status(&first), Some(brood::ChildStatus::Succeeded));
    assert_eq!(status(&second), Some(brood::ChildStatus::Cancelled));
    assert_eq!(
        status(&third),
        Some(brood::ChildStatus::Succeeded),
        "the later call ran"
    );
    assert!(
        t.kit.probe.starts.lock().unwrap().is_empty(),
        "the cancelled child never ran"
    );
    assert_eq!(t.b().counts("s").await.unwrap().running, 0);
}
