//! Session events (`Brood::subscribe`): what a live observer is told, and when. Each event comes
//! after its change was applied — a child's end only once its row is durable and recorded, an
//! ack once its row is flushed — so an observer never hears of something the ledger lacks. A
//! reader that stops reading is bounded (it lags), and nothing of one session reaches another's
//! subscriber.

mod common;

use std::sync::Arc;
use std::time::Duration;

use brood::{BroodError, ChildStatus, ClaimChange, DelegateRequest, Event, ReleaseReason, SessionEvent};
use common::*;
use tokio::sync::broadcast::error::TryRecvError;
use tokio::sync::broadcast::Receiver;

/// Reads events until `done` holds for what was read (or the deadline passes).
async fn read_until(rx: &mut Receiver<Arc<SessionEvent>>, done: impl Fn(&[Event]) -> bool) -> Vec<Event> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !done(&seen) {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Ok(ev)) => seen.push(ev.event.clone()),
            Ok(Err(e)) => panic!("the event stream failed: {e}; read so far: {seen:?}"),
            Err(_) => panic!("timed out; read so far: {seen:?}"),
        }
    }
    seen
}

fn statuses_of(events: &[Event], child: &str) -> Vec<ChildStatus> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Child { child_id, status, .. } if child_id == child => Some(*status),
            _ => None,
        })
        .collect()
}

fn claims(events: &[Event]) -> Vec<ClaimChange> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Claim { change, .. } => Some(*change),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_told_from_queued_to_acked() {
    let t = TestBrood::new();
    let b = t.b();
    open_wake(b, "ev").await;
    let mut rx = b.subscribe("ev").await.unwrap();
    let reply = b
        .delegate(
            "ev",
            DelegateRequest::background(vec![
                task("good", sim(0)),
                task("bad", sim_outcome(0, "fail")),
                task("slow", gate("g")),
            ]),
        )
        .await
        .unwrap();
    let call = reply.call_id().to_string();
    let (good, bad, slow) = (
        brood::child_id(&call, 0),
        brood::child_id(&call, 1),
        brood::child_id(&call, 2),
    );
    // One unit of three: the failure is noticed early, the unit waits for the gated child.
    let seen = read_until(&mut rx, |ev| {
        ev.iter().any(|e| matches!(e, Event::FailureNotice { .. }))
            && statuses_of(ev, &good).contains(&ChildStatus::Succeeded)
            && statuses_of(ev, &slow).contains(&ChildStatus::Running)
    })
    .await;
    assert_eq!(
        statuses_of(&seen, &good),
        [ChildStatus::Queued, ChildStatus::Running, ChildStatus::Succeeded]
    );
    assert_eq!(
        statuses_of(&seen, &bad),
        [ChildStatus::Queued, ChildStatus::Running, ChildStatus::Failed]
    );
    let notice = seen
        .iter()
        .find_map(|e| match e {
            Event::FailureNotice {
                child_id,
                call_id,
                status,
                error,
            } => Some((child_id, call_id, *status, error)),
            _ => None,
        })
        .unwrap();
    assert_eq!((notice.0, notice.1, notice.2), (&bad, &call, ChildStatus::Failed));
    assert!(
        notice.3.as_deref().is_some_and(|e| e.contains("simulated failure")),
        "{notice:?}"
    );
    // Every child's end was recorded before it was told: the status says so too.
    let st = b.status("ev").await.unwrap();
    assert_eq!(child_status(&st, &call, 0), Some(ChildStatus::Succeeded));

    // The notice is ready: a claim of it, released busy, claimed again and acked.
    let env = next_envelope(b, "ev", "c", Duration::from_secs(30)).await;
    b.release(&env.claim_id, ReleaseReason::Busy, Duration::ZERO)
        .await
        .unwrap();
    let env = next_envelope(b, "ev", "c", Duration::from_secs(30)).await;
    b.ack(&env.claim_id).await.unwrap();
    t.kit.gates.open("g");
    let seen = read_until(&mut rx, |ev| {
        claims(ev).len() >= 4 && ev.contains(&Event::Ready { ready: 3 })
    })
    .await;
    assert_eq!(
        claims(&seen)[..4],
        [
            ClaimChange::Claimed,
            ClaimChange::Released,
            ClaimChange::Claimed,
            ClaimChange::Acked
        ]
    );
    // The whole unit is ready once its last child ended: three results.
    let ready: Vec<usize> = seen
        .iter()
        .filter_map(|e| match e {
            Event::Ready { ready } => Some(*ready),
            _ => None,
        })
        .collect();
    assert_eq!(ready.last(), Some(&3), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_is_told_and_sessions_do_not_hear_each_other() {
    let t = TestBrood::new();
    let b = t.b();
    let log = WakeLog::default();
    b.open_session("a", brood::SessionSettings::default().wake(log.target()))
        .await
        .unwrap();
    open_wake(b, "b").await;
    let mut ra = b.subscribe("a").await.unwrap();
    let mut rb = b.subscribe("b").await.unwrap();
    let reply = b
        .delegate("a", DelegateRequest::background(vec![task("x", sim(0))]))
        .await
        .unwrap();
    let seen = read_until(&mut ra, |ev| ev.iter().any(|e| matches!(e, Event::Wake { .. }))).await;
    assert!(seen.contains(&Event::Wake { ready: 1 }), "{seen:?}");
    let child = brood::child_id(reply.call_id(), 0);
    assert_eq!(statuses_of(&seen, &child).last(), Some(&ChildStatus::Succeeded));
    wait_for!("the wake callback", (log.count() > 0).then_some(()));
    settle(b, "a").await;
    assert_eq!(log.count(), 1);
    assert!(
        matches!(rb.try_recv(), Err(TryRecvError::Empty)),
        "session b heard something of session a"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_reading_lags_and_an_unknown_session_is_refused() {
    let t = TestBrood::new();
    let b = t.b();
    open_wake(b, "busy").await;
    let mut rx = b.subscribe("busy").await.unwrap();
    // Each child is told queued, running and its end: well over the channel's capacity.
    let n = brood::EVENTS_CAPACITY / 3 + 100;
    let tasks = (0..n).map(|i| task(format!("t{i}"), sim(0))).collect();
    b.delegate("busy", DelegateRequest::background(tasks).independent())
        .await
        .unwrap();
    let _ = collect_results(b, "busy", n).await;
    match rx.try_recv() {
        Err(TryRecvError::Lagged(missed)) => assert!(missed > 0),
        other => panic!("expected the unread stream to lag, got {other:?}"),
    }
    // After the lag it reads on, from the oldest event kept.
    assert!(rx.try_recv().is_ok());

    match b.subscribe("nobody").await {
        Err(BroodError::UnknownSession(s)) => assert_eq!(s, "nobody"),
        other => panic!("expected UnknownSession, got {other:?}"),
    }
}
