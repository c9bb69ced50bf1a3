//! A database failover: the ledger on a primary with a synchronous standby, given both hosts
//! (`target_session_attrs=read-write`); the primary killed, the standby promoted.

use std::time::{Duration, Instant};

use super::super::super::pg_testkit::Replicated;
use super::super::*;
use super::own::session;
use crate::ledger::TenureHolder;

/// How long any wait here may take on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(60);

fn writes_of(id: &str) -> Writes {
    Writes {
        sessions: vec![session(id)],
        ..Writes::default()
    }
}

fn node(url: &str, schema: &str, name: &str, ttl: Duration) -> PgLedger {
    PgLedger::open_shared(
        url,
        schema,
        TenureConfig {
            node: name.into(),
            address: format!("http://{name}"),
            ttl,
        },
    )
    .unwrap()
}

/// Waits until `done` holds, failing with `what` past [`PATIENCE`].
fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn what_was_flushed_survives_a_failover_and_what_failed_in_it_is_committed_on_the_new_primary() {
    let mut pair = Replicated::start();
    let ledger = PgLedger::open_in(&pair.fresh_database(), DEFAULT_SCHEMA).unwrap();
    ledger.write(&writes_of("before")).unwrap();
    ledger.flush().unwrap();
    // A connection of the reads of whole sessions is made to the old primary too.
    assert_eq!(ledger.load().unwrap().sessions, vec![session("before")]);
    pair.kill_primary();
    ledger.write(&writes_of("during")).unwrap();
    ledger.flush().expect_err("no server takes writes");
    pair.promote_standby();
    // The pools' connections to the old primary are gone; new ones go to the new primary.
    until("the ledger never committed on the promoted standby", || {
        ledger.flush().is_ok()
    });
    let mut sessions = ledger.load().unwrap().sessions;
    sessions.sort_by(|a, b| a.session_id.cmp(&b.session_id));
    assert_eq!(sessions, vec![session("before"), session("during")]);
}

#[test]
fn a_process_whose_tenures_lapsed_in_a_failover_serves_its_sessions_again_at_the_same_epoch() {
    let mut pair = Replicated::start();
    let url = pair.fresh_database();
    let a = node(&url, DEFAULT_SCHEMA, "a", Duration::from_millis(1000));
    let tenures = a.tenures().unwrap();
    assert_eq!(tenures.acquire("s1").unwrap(), TenureHolder::Here(1));
    pair.kill_primary();
    // No renewal lands: past its local deadline it hands nothing out, but keeps the tenure
    // (nobody took it).
    until("the tenure was still served", || !tenures.serving("s1"));
    assert!(tenures.holds("s1"));
    pair.promote_standby();
    until("the tenure was never served again", || tenures.serving("s1"));
    assert_eq!(
        a.tenure_of("s1").unwrap(),
        Some(("a".to_string(), 1)),
        "renewed, not taken anew"
    );
    // Its commits pass the fencing check on the new primary.
    a.write(&writes_of("s1")).unwrap();
    until("a commit of the session never passed", || a.flush().is_ok());
    assert_eq!(a.refusals("s1"), 0);
}

#[test]
fn the_listening_connection_follows_the_failover_to_the_promoted_standby() {
    let mut pair = Replicated::start();
    let url = pair.fresh_database();
    let ttl = Duration::from_secs(30);
    let (a, b) = (
        node(&url, DEFAULT_SCHEMA, "a", ttl),
        node(&url, DEFAULT_SCHEMA, "b", ttl),
    );
    let (here, there) = (a.work_directory().unwrap(), b.work_directory().unwrap());
    // Only a session's holder lists its children.
    assert_eq!(b.tenures().unwrap().acquire("s1").unwrap(), TenureHolder::Here(1));
    let listed = here.listed();
    // Listening (the count moves once the LISTEN took effect).
    until("a never listened", || *listed.borrow() >= 1);
    let before = *listed.borrow();
    pair.kill_primary();
    pair.promote_standby();
    // Listening again, on the new primary.
    until("a never listened again", || *listed.borrow() > before);
    let again = *listed.borrow();
    there.post("s1", "c1", "q");
    until("a never heard of b's post", || *listed.borrow() > again);
    assert_eq!(
        here.take_elsewhere("q", Duration::ZERO)
            .unwrap()
            .taken
            .map(|l| (l.child_id, l.address)),
        Some(("c1".to_string(), "http://b".to_string()))
    );
}
