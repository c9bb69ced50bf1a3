//! Dead-letter redrive through the embedding API: a redriven item is ready again with its
//! delivery attempts counted afresh and is delivered once; each redrive is recorded with its
//! item; a redrive outlives a restart; selection by children, by session, all, with a limit;
//! ids that are not dead letters are skipped; bad selections are refused and change nothing.

use std::time::Duration;

use brood::*;

mod common;
use common::*;

/// Opens `session` with one delivery attempt, delegates `n` independent sim children, and
/// dead-letters their results (one failed release): their child ids.
async fn dead_results(b: &Brood, session: &str, n: usize) -> Vec<String> {
    b.open_session(
        session,
        SessionSettings::default().wake(|_| {}).max_delivery_attempts(1),
    )
    .await
    .unwrap();
    let tasks = (0..n).map(|i| task(format!("t{i}"), sim(0))).collect();
    let reply = b
        .delegate(session, DelegateRequest::background(tasks).independent())
        .await
        .unwrap();
    let call = reply.call_id().to_string();
    let mut seen = 0;
    while seen < n {
        let env = next_envelope(b, session, "t", LONG_LEASE).await;
        seen += env.items.len();
        b.release(&env.claim_id, ReleaseReason::Failed, Duration::ZERO)
            .await
            .unwrap();
    }
    let ids: Vec<String> = (0..n as u32).map(|i| child_id(&call, i)).collect();
    wait_for!(
        "the results are dead letters",
        (b.dead_letters_of(session).await.unwrap().len() == n).then_some(())
    );
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redriven_dead_letter_is_delivered_once_with_its_attempts_counted_afresh() {
    let t = TestBrood::new();
    let b = t.b();
    let ids = dead_results(b, "s", 2).await;
    let key = dedup_key(&ids[0], ItemKind::Result);
    assert!(
        b.boundary("s", "t", LONG_LEASE).await.unwrap().is_none(),
        "dead items are not ready"
    );

    let n = b
        .redrive(RedriveSelect::Children(vec![ids[0].clone()]), None)
        .await
        .unwrap();
    assert_eq!(n, 1);
    let left = b.dead_letters_of("s").await.unwrap();
    assert_eq!(
        left.iter().map(|d| d.child_id.as_str()).collect::<Vec<_>>(),
        vec![ids[1].as_str()]
    );
    let env = next_envelope(b, "s", "t", LONG_LEASE).await;
    assert_eq!(env.items.len(), 1, "{:?}", env.items);
    assert_eq!(
        (env.items[0].dedup_key.as_str(), env.items[0].delivery_attempt),
        (key.as_str(), 1)
    );
    assert_eq!(env.items[0].status, ChildStatus::Succeeded);
    assert_eq!(b.ack(&env.claim_id).await.unwrap(), 1);
    assert!(
        b.boundary("s", "t", LONG_LEASE).await.unwrap().is_none(),
        "delivered once"
    );
    assert_eq!(b.counts("s").await.unwrap().delivered, 1);
    // Not a dead letter any more: skipped.
    let again = b
        .redrive(RedriveSelect::Children(vec![ids[0].clone()]), None)
        .await
        .unwrap();
    assert_eq!(again, 0);
    let record = b.redrive_record("s", &key).unwrap().expect("the redrive is recorded");
    assert_eq!((record.count, record.history.len()), (1, 1));
    assert_eq!(record.history[0].attempts, 1);
    assert!(!record.history[0].dead_reason.is_empty());

    // The other one: redriven, failed again (its first attempt afresh), dead again, redriven.
    assert_eq!(b.redrive(RedriveSelect::All, None).await.unwrap(), 1);
    let env = next_envelope(b, "s", "t", LONG_LEASE).await;
    assert_eq!(env.items[0].delivery_attempt, 1);
    b.release(&env.claim_id, ReleaseReason::Failed, Duration::ZERO)
        .await
        .unwrap();
    wait_for!(
        "dead again",
        (b.dead_letters_of("s").await.unwrap().len() == 1).then_some(())
    );
    assert_eq!(b.redrive(RedriveSelect::Session("s".into()), None).await.unwrap(), 1);
    let key1 = dedup_key(&ids[1], ItemKind::Result);
    assert_eq!(b.redrive_record("s", &key1).unwrap().map(|r| r.count), Some(2));
    let env = next_envelope(b, "s", "t", LONG_LEASE).await;
    assert_eq!(b.ack(&env.claim_id).await.unwrap(), 1);
    assert_eq!(b.counts("s").await.unwrap().delivered, 2);
    assert!(b.dead_letters().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_outlives_a_restart_and_what_it_delivered_is_not_delivered_again() {
    let mut t = TestBrood::new();
    let ids = dead_results(t.b(), "s", 2).await;
    assert_eq!(t.b().redrive(RedriveSelect::All, None).await.unwrap(), 2);
    t.reopen();
    let b = t.b();
    assert!(
        b.dead_letters().await.unwrap().is_empty(),
        "the dead letters stay removed"
    );
    let env = next_envelope(b, "s", "t", LONG_LEASE).await;
    let mut got: Vec<String> = env.items.iter().map(|i| i.child_id.clone()).collect();
    got.sort();
    assert_eq!(got, ids, "both ready again after the restart");
    assert!(env.items.iter().all(|i| i.delivery_attempt == 1), "{:?}", env.items);
    assert_eq!(b.ack(&env.claim_id).await.unwrap(), 2);
    t.reopen();
    let b = t.b();
    assert!(b.boundary("s", "t", LONG_LEASE).await.unwrap().is_none());
    assert_eq!(b.counts("s").await.unwrap().delivered, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_selects_by_session_with_a_limit_and_refuses_bad_selections() {
    let t = TestBrood::new();
    let b = t.b();
    let a = dead_results(b, "a", 3).await;
    dead_results(b, "b", 2).await;
    for (bad, field) in [
        (RedriveSelect::Children(vec![]), "child_ids"),
        (RedriveSelect::Session(String::new()), "session_id"),
    ] {
        let err = b.redrive(bad, None).await.unwrap_err();
        assert!(
            matches!(&err, BroodError::Invalid { field: f, .. } if f == field),
            "{err:?}"
        );
    }
    let err = b.redrive(RedriveSelect::All, Some(0)).await.unwrap_err();
    assert!(
        matches!(&err, BroodError::Invalid { field, .. } if field == "limit"),
        "{err:?}"
    );
    assert_eq!(
        b.dead_letters().await.unwrap().len(),
        5,
        "a refused redrive changed nothing"
    );

    let unknown = RedriveSelect::Children(vec!["deleg_00000000000000ff.0".into(), "nonsense".into()]);
    assert_eq!(b.redrive(unknown, None).await.unwrap(), 0, "not dead letters: skipped");
    assert_eq!(b.redrive(RedriveSelect::Session("a".into()), Some(2)).await.unwrap(), 2);
    assert_eq!(b.dead_letters_of("a").await.unwrap().len(), 1);
    assert_eq!(
        b.dead_letters_of("b").await.unwrap().len(),
        2,
        "the other session untouched"
    );
    assert_eq!(b.counts("a").await.unwrap().ready, 2);
    assert_eq!(b.redrive(RedriveSelect::All, None).await.unwrap(), 3);
    assert!(b.dead_letters().await.unwrap().is_empty());
    let env = next_envelope(b, "a", "t", LONG_LEASE).await;
    assert_eq!(env.items.len(), 3);
    let mut got: Vec<String> = env.items.iter().map(|i| i.child_id.clone()).collect();
    got.sort();
    assert_eq!(got, a);
}
