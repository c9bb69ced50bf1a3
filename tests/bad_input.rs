//! Bad input — DESIGN.md, decide → persist → apply: "A refused or failed request changed
//! nothing, set numbers included."
//!
//! Proven here for requests refused as invalid (calls, boundaries, session settings) and for
//! requests naming a session or claim that does not exist: each is refused with a typed error
//! naming the field, and leaves the session as it was. Requests that fail on a ledger fault are
//! in faults.rs and api_model.rs.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use brood::{Brood, BroodError, DelegateReply, DelegateRequest, SessionSettings};
use common::*;
use serde_json::json;

/// Asserts `r` was refused as invalid `field` (or a sub-field of it), with a message.
fn invalid<T: std::fmt::Debug, E: Into<BroodError>>(r: Result<T, E>, field: &str) {
    match r.map_err(Into::into) {
        Err(BroodError::Invalid { field: f, message }) => {
            assert!(f.starts_with(field), "expected field {field}, got {f}: {message}");
            assert!(!message.is_empty());
        }
        other => panic!("expected invalid `{field}`, got {other:?}"),
    }
}

/// Session `bad` with one accepted call (set 1) whose result is ready.
async fn one_ready(b: &Brood) -> DelegateReply {
    open_wake(b, "bad").await;
    let first = b
        .delegate("bad", DelegateRequest::background(vec![task("ok", sim(0))]))
        .await
        .unwrap();
    assert_eq!(first.set(), 1);
    status_until(b, "bad", "the first result to be ready", |st| st.counts.ready == 1).await;
    first
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_calls_are_not_stored_and_take_no_set_number() {
    let t = TestBrood::new();
    let b = t.b();
    one_ready(b).await;
    invalid(b.delegate("bad", DelegateRequest::background(vec![])).await, "tasks");
    invalid(
        b.delegate(
            "bad",
            DelegateRequest::background(vec![task("ok", sim(0)), task("x", json!({"kind": "nope"}))]),
        )
        .await,
        "tasks[1].runner",
    );
    invalid(
        b.delegate(
            "bad",
            DelegateRequest::background(vec![task("x", json!({"kind": "sim", "msec": 1}))]),
        )
        .await,
        "tasks[0].runner",
    );
    invalid(
        b.delegate("bad", DelegateRequest::background(vec![task("  ", sim(0))]))
            .await,
        "tasks[0].goal",
    );
    let mut zero = task("x", sim(0));
    zero.timeout_ms = Some(0);
    invalid(
        b.delegate("bad", DelegateRequest::background(vec![zero])).await,
        "tasks[0].timeout_ms",
    );
    let mut zero = task("x", sim(0));
    zero.stall_ms = Some(0);
    invalid(
        b.delegate("bad", DelegateRequest::sync(vec![zero])).await,
        "tasks[0].stall_ms",
    );

    let st = b.status("bad").await.unwrap();
    assert_eq!(st.calls.len(), 1, "no refused call was stored");
    assert_eq!((st.counts.ready, st.counts.claimed, st.counts.queued), (1, 0, 0));
    let next = b
        .delegate("bad", DelegateRequest::background(vec![task("ok", sim(0))]))
        .await
        .unwrap();
    assert_eq!(next.set(), 2, "refused calls took no set number");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_boundaries_claim_nothing_and_are_no_delivery_attempt() {
    let t = TestBrood::new();
    let b = t.b();
    let first = one_ready(b).await;
    invalid(b.boundary("bad", "c", Duration::from_millis(50)).await, "lease_ms");
    invalid(b.boundary("bad", "c", Duration::from_secs(3601)).await, "lease_ms");
    invalid(b.boundary("bad", " ", LONG_LEASE).await, "consumer");
    let st = b.status("bad").await.unwrap();
    assert_eq!((st.counts.ready, st.counts.claimed), (1, 0));
    let env = b.boundary("bad", "c", LONG_LEASE).await.unwrap().expect("still ready");
    assert_eq!(keys(&env), BTreeSet::from([result_key(first.call_id(), 0)]));
    assert_eq!(
        env.items[0].delivery_attempt, 1,
        "the refused boundaries were no attempts"
    );
    b.ack(&env.claim_id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_session_settings_change_nothing() {
    let t = TestBrood::new();
    let b = t.b();
    one_ready(b).await;
    invalid(
        b.open_session("bad", SessionSettings::default().max_concurrent_children(0))
            .await,
        "max_concurrent_children",
    );
    invalid(
        b.open_session("bad", SessionSettings::default().max_delivery_attempts(0))
            .await,
        "max_delivery_attempts",
    );
    invalid(b.open_session("", SessionSettings::default()).await, "session_id");
    let st = b.status("bad").await.unwrap();
    assert_eq!(st.counts.info.max_concurrent_children, 8);
    assert_eq!(st.counts.info.max_delivery_attempts, 8);
    assert!(st.counts.info.wake_capable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_naming_an_unknown_session_or_claim_are_refused() {
    let t = TestBrood::new();
    let b = t.b();
    one_ready(b).await;
    assert!(matches!(
        b.delegate("nobody", DelegateRequest::background(vec![task("x", sim(0))]))
            .await
            .map_err(|e| e.error),
        Err(BroodError::UnknownSession(_))
    ));
    assert!(matches!(b.ack("clm_6c61_nope").await, Err(BroodError::UnknownClaim(_))));
    let st = b.status("bad").await.unwrap();
    assert_eq!((st.counts.ready, st.counts.claimed, st.counts.delivered), (1, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_id_must_be_printable_ascii_but_a_stored_one_is_still_reached() {
    use brood_actors::ledger::{Ledger as _, SledLedger, Writes};
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("ledger");
    {
        // Stored by a build that took any id without control characters.
        let ledger = SledLedger::open(&folder).unwrap();
        let row = brood_actors::model::SessionRow {
            session_id: "user 42".into(),
            max_concurrent_children: 8,
            max_delivery_attempts: 8,
            next_set: 1,
            created_at_ms: 1,
            addressable: false,
        };
        ledger
            .write(&Writes {
                sessions: vec![row],
                ..Writes::default()
            })
            .unwrap();
        ledger.flush().unwrap();
    }
    let b = Brood::open(brood::BroodConfig::new(&folder)).unwrap();
    assert_eq!(b.status("user 42").await.unwrap().counts.info.session_id, "user 42");
    b.open_session("user 42", SessionSettings::default()).await.unwrap();
    for id in ["user 43", "café", "a/b", "50%", "a?b", "a#b"] {
        invalid(b.open_session(id, SessionSettings::default()).await, "session_id");
        assert!(b.status(id).await.is_err(), "{id} was made");
    }
    b.shutdown();
}
