//! Session tenures: two processes' views of one database, each its own node.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::super::super::pg_testkit;
use super::super::*;
use super::own::{second_view, session};
use super::sql;
use crate::ledger::{TenureHolder, Tenures};

pub(super) const TTL: Duration = Duration::from_secs(30);

pub(super) fn node(schema: &str, name: &str, ttl: Duration) -> PgLedger {
    PgLedger::open_shared(
        &pg_testkit::url(),
        schema,
        TenureConfig {
            node: name.into(),
            address: format!("http://{name}"),
            ttl,
        },
    )
    .unwrap()
}

/// Writes and flushes the rows of `sessions`.
fn store_sessions(l: &PgLedger, sessions: &[&str]) {
    l.write(&Writes {
        sessions: sessions.iter().map(|s| session(s)).collect(),
        ..Writes::default()
    })
    .unwrap();
    l.flush().unwrap();
}

fn tenures(l: &PgLedger) -> Arc<dyn Tenures> {
    l.tenures().expect("a shared ledger has tenures")
}

/// The heartbeat of `node` runs out now, as it would had the process been paused past it: every
/// tenure it holds is free.
fn heartbeat_lapses(ledger: &PgLedger, node: &str) {
    sql(
        ledger,
        &format!("UPDATE \"{{schema}}\".nodes SET expires_at = now() - interval '1 second' WHERE node = '{node}'"),
    );
}

/// The tenure of `s` is given back now, as its holder would have.
fn expire(ledger: &PgLedger, s: &str) {
    sql(
        ledger,
        &format!("UPDATE \"{{schema}}\".session_leases SET expires_at = now() - interval '1 second' WHERE session = '{s}'::bytea"),
    );
}

fn child_of(s: &str, call: &str) -> ChildRow {
    let call = crate::ledger::conformance::call_row(s, call, 1);
    let unit = crate::model::plan_units(&call.call_id, &call.tasks, false).remove(0);
    let mut row = crate::recovery::queued_child(&call, &unit, 0);
    row.status = ChildStatus::Succeeded;
    row
}

#[test]
fn a_tenure_is_held_by_one_node_at_a_time_and_named_to_the_others() {
    let schema = pg_testkit::fresh_schema();
    let (a, b) = (node(&schema, "a", TTL), node(&schema, "b", TTL));
    assert_eq!(tenures(&a).acquire("s1").unwrap(), TenureHolder::Here(1));
    assert_eq!(
        tenures(&a).acquire("s1").unwrap(),
        TenureHolder::Here(1),
        "held: the same epoch"
    );
    assert_eq!(
        tenures(&b).acquire("s1").unwrap(),
        TenureHolder::Elsewhere {
            owner: "a".into(),
            address: "http://a".into()
        }
    );
    assert!(tenures(&a).serving("s1") && !tenures(&b).holds("s1"));
    // Given back (without waiting): the other takes it as soon as that landed, at the next
    // epoch.
    tenures(&a).release("s1");
    assert!(!tenures(&a).holds("s1"));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match tenures(&b).acquire("s1") {
            Ok(TenureHolder::Here(epoch)) => break assert_eq!(epoch, 2),
            // Still a's; or given back between b's take and its read of the holder, which
            // answers "free but not taken; retry".
            Ok(TenureHolder::Elsewhere { .. }) | Err(LedgerError::Storage { .. }) => {
                assert!(std::time::Instant::now() < deadline, "never given back")
            }
            Err(e) => panic!("taking s1 after a gave it back: {e}"),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_restarted_node_waits_out_its_own_tenures_and_takes_them_at_a_new_epoch() {
    let schema = pg_testkit::fresh_schema();
    let a = node(&schema, "a", TTL);
    a.write(&Writes {
        sessions: vec![session("s1"), session("s2")],
        ..Writes::default()
    })
    .unwrap();
    assert_eq!(
        tenures(&a).acquire_free(usize::MAX).unwrap().len(),
        0,
        "no session row is committed yet"
    );
    // Rows of sessions not held are not written.
    a.flush().unwrap();
    assert!(second_view(&a).load().unwrap().sessions.is_empty());
    for s in ["s1", "s2"] {
        assert_eq!(tenures(&a).acquire(s).unwrap(), TenureHolder::Here(1));
    }
    store_sessions(&a, &["s1", "s2"]);
    drop(a); // killed: its tenures stay until they run out
             // The same node again: its old instance might still be alive (paused), so it waits too.
    let again = node(&schema, "a", TTL);
    assert!(
        tenures(&again).acquire_free(usize::MAX).unwrap().is_empty(),
        "taken from a live tenure"
    );
    assert!(matches!(
        tenures(&again).acquire("s1").unwrap(),
        TenureHolder::Elsewhere { .. }
    ));
    for s in ["s1", "s2"] {
        expire(&again, s);
    }
    let mut taken = tenures(&again).acquire_free(usize::MAX).unwrap();
    taken.sort();
    assert_eq!(taken, vec!["s1".to_string(), "s2".to_string()]);
    assert_eq!(tenures(&again).acquire("s1").unwrap(), TenureHolder::Here(2));
    let b = node(&schema, "b", TTL);
    assert!(tenures(&b).acquire_free(usize::MAX).unwrap().is_empty(), "held by a");
}

#[test]
fn a_node_whose_tenure_was_taken_over_writes_nothing_more_and_is_told() {
    let schema = pg_testkit::fresh_schema();
    let (a, b) = (node(&schema, "a", TTL), node(&schema, "b", TTL));
    let told = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = told.clone();
    tenures(&a).on_lost(Box::new(move |s| sink.lock().unwrap().extend_from_slice(s)));
    for s in ["s1", "s2"] {
        assert_eq!(tenures(&a).acquire(s).unwrap(), TenureHolder::Here(1));
    }
    store_sessions(&a, &["s1", "s2"]);
    // a is paused past its tenure of s1; b takes it over.
    expire(&a, "s1");
    assert_eq!(tenures(&b).acquire_free(usize::MAX).unwrap(), vec!["s1".to_string()]);
    // a wakes and writes to both sessions in one commit: s2's rows land, s1's do not.
    let call = crate::ledger::conformance::call_row("s1", "deleg_1", 1);
    let call2 = crate::ledger::conformance::call_row("s2", "deleg_2", 1);
    a.write(&Writes {
        calls: vec![call.clone(), call2.clone()],
        ..Writes::default()
    })
    .unwrap();
    a.flush().unwrap();
    assert!(
        b.call("s1", "deleg_1").unwrap().is_none(),
        "the fenced write did not land"
    );
    assert!(
        b.call("s2", "deleg_2").unwrap().is_some(),
        "the held session's write did"
    );
    assert!(!tenures(&a).holds("s1") && tenures(&a).holds("s2"));
    assert_eq!(*told.lock().unwrap(), vec!["s1".to_string()]);
    // Its completions are not recorded either, and come back in their order.
    let rows = vec![child_of("s1", "deleg_1"), child_of("s2", "deleg_2")];
    let stored = a.record_terminals(rows.clone()).unwrap();
    assert_eq!(stored.iter().map(|r| &r.session_id).collect::<Vec<_>>(), ["s1", "s2"]);
    assert!(b.call_children("s1", "deleg_1").unwrap().is_empty());
    assert_eq!(b.call_children("s2", "deleg_2").unwrap().len(), 1);
}

#[test]
fn sessions_lost_together_are_each_told_once_and_the_held_ones_rows_land() {
    let schema = pg_testkit::fresh_schema();
    let (a, b) = (node(&schema, "a", TTL), node(&schema, "b", TTL));
    let told = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = told.clone();
    tenures(&a).on_lost(Box::new(move |s| sink.lock().unwrap().extend_from_slice(s)));
    for s in ["s1", "s2", "s3"] {
        assert_eq!(tenures(&a).acquire(s).unwrap(), TenureHolder::Here(1));
    }
    store_sessions(&a, &["s1", "s2", "s3"]);
    for s in ["s1", "s2"] {
        expire(&a, s);
    }
    let mut taken = tenures(&b).acquire_free(usize::MAX).unwrap();
    taken.sort();
    assert_eq!(taken, ["s1", "s2"]);
    // A running mark of s1's child staged, unflushed: the terminal rows' commit takes it, finds
    // s1 lost, and is written again without it; s2 (named only by its terminal row) is found
    // lost in the same check and must not be told a second time by the retry.
    let mut running = child_of("s1", "deleg_1");
    running.status = ChildStatus::Running;
    a.write(&Writes {
        children: vec![running],
        ..Writes::default()
    })
    .unwrap();
    let rows = vec![
        child_of("s1", "deleg_1"),
        child_of("s2", "deleg_2"),
        child_of("s3", "deleg_3"),
    ];
    a.record_terminals(rows).unwrap();
    let mut lost = told.lock().unwrap().clone();
    lost.sort();
    assert_eq!(lost, ["s1", "s2"], "each lost session told once");
    assert_eq!(a.refusals("s2"), 1);
    assert!(b.call_children("s1", "deleg_1").unwrap().is_empty());
    assert!(b.call_children("s2", "deleg_2").unwrap().is_empty());
    assert_eq!(b.call_children("s3", "deleg_3").unwrap().len(), 1);
}

/// A process whose heartbeat ran out (a pause) finds at its next renewal what the others took
/// meanwhile, and loses it; what they did not take stays its own.
#[test]
fn a_renewal_after_a_lapse_finds_a_tenure_taken_over_and_loses_it() {
    let schema = pg_testkit::fresh_schema();
    let ttl = Duration::from_millis(3000);
    let (a, b) = (node(&schema, "a", ttl), node(&schema, "b", TTL));
    assert_eq!(tenures(&a).acquire("s1").unwrap(), TenureHolder::Here(1));
    assert_eq!(tenures(&a).acquire("s2").unwrap(), TenureHolder::Here(1));
    // Renewed while held: still served past its first tenure time (a renewal delayed by a
    // loaded machine may leave a gap; the next one closes it).
    std::thread::sleep(ttl + ttl / 3);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !tenures(&a).serving("s1") {
        assert!(std::time::Instant::now() < deadline, "never renewed in the background");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(tenures(&a).holds("s1"));
    // a's heartbeat lapses, then b takes s1: a's renewal may land between the two and make it
    // live again, so lapse and take until b has it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        heartbeat_lapses(&a, "a");
        match tenures(&b).acquire("s1") {
            Ok(TenureHolder::Here(epoch)) => break assert_eq!(epoch, 2),
            // Still a's, or free but not taken by this try ("retry").
            other @ (Ok(_) | Err(LedgerError::Storage { .. })) => {
                assert!(std::time::Instant::now() < deadline, "b never took it: {other:?}")
            }
            Err(e) => panic!("b taking s1: {e}"),
        }
    }
    // Noticed at a's next renewal (a third of its tenure on), however late a loaded machine
    // runs it.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while tenures(&a).holds("s1") {
        assert!(std::time::Instant::now() < deadline, "the renewal never noticed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!tenures(&a).serving("s1"));
    assert!(tenures(&a).holds("s2"), "s2 was not taken: still a's");
    assert_eq!(
        tenures(&b)
            .holder("s2")
            .unwrap()
            .map(|h| matches!(h, TenureHolder::Elsewhere { .. })),
        Some(true)
    );
}

/// When the heartbeat of `node` runs out by the database's clock (milliseconds), which the
/// tenures it holds last as long as.
fn heartbeat(ledger: &PgLedger, node: &str) -> i64 {
    let pool = ledger.inner.pool.clone();
    let table = format!("\"{}\".nodes", ledger.inner.schema);
    let node = node.to_string();
    ledger
        .runtime
        .run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            let row = client
                .query_one(
                    &format!("SELECT (extract(epoch FROM max(expires_at)) * 1000)::int8 FROM {table} WHERE node = $1"),
                    &[&node],
                )
                .await
                .map_err(pg_error("reading a heartbeat's expiry"))?;
            Ok(row.get::<_, i64>(0))
        })
        .unwrap()
}

/// The first column of the first row `query` answers, as text (`{schema}` is the ledger's).
fn text(ledger: &PgLedger, query: &str) -> String {
    let pool = ledger.inner.pool.clone();
    let query = query.replace("{schema}", &ledger.inner.schema);
    ledger
        .runtime
        .run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            let row = client.query_one(&query, &[]).await.map_err(pg_error("test query"))?;
            Ok(row.get::<_, Option<String>>(0).unwrap_or_default())
        })
        .unwrap()
}

/// Waits until `f` holds, for up to 20 s.
pub(super) fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(std::time::Instant::now() < deadline, "waited 20 s for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// However many tenures a process holds, its renewal writes its heartbeat and not one of their
/// rows: the database's load of an idle process does not grow with its sessions.
#[test]
fn a_renewal_writes_the_heartbeat_and_no_tenure_row() {
    let schema = pg_testkit::fresh_schema();
    let ttl = Duration::from_millis(600);
    let a = node(&schema, "a", ttl);
    let sessions: Vec<String> = (0..50).map(|i| format!("s{i}")).collect();
    for s in &sessions {
        assert_eq!(tenures(&a).acquire(s).unwrap(), TenureHolder::Here(1));
    }
    let versions = "SELECT string_agg(xmin::text || ctid::text, ',' ORDER BY session) FROM \"{schema}\".session_leases";
    let rows = text(&a, versions);
    for _ in 0..3 {
        let beat = heartbeat(&a, "a");
        until("a renewal", || heartbeat(&a, "a") > beat);
    }
    assert_eq!(text(&a, versions), rows, "a tenure row was written by a renewal");
    for s in &sessions {
        assert!(tenures(&a).holds(s), "{s} kept");
    }
    until("every tenure served", || {
        sessions.iter().all(|s| tenures(&a).serving(s))
    });
}

/// A nested session left to its parent's holder whose give-back failed is given back again
/// naming its parent, as the first give-back would have: else it becomes anyone's to take.
#[test]
fn a_nested_give_back_made_again_still_names_the_parent() {
    let schema = pg_testkit::fresh_schema();
    let ttl = Duration::from_millis(1000);
    let a = node(&schema, "a", ttl);
    let nested = "deleg_0123456789abcdef.0";
    assert_eq!(tenures(&a).acquire("p").unwrap(), TenureHolder::Here(1));
    assert_eq!(tenures(&a).acquire(nested).unwrap(), TenureHolder::Here(1));
    let book = a.inner.tenures.clone().expect("shared");
    let (unlock, locker) = table_locked(&a, "session_leases");
    tenures(&a).leave_to_parent(nested, "p");
    until("the give-back to fail", || book.strays() == 1);
    unlock.send(()).unwrap();
    a.runtime
        .run(async move { locker.await.map_err(|e| LedgerError::storage("test", e)) })
        .unwrap();
    until("the give-back to be made again", || book.strays() == 0);
    let row = text(
        &a,
        &format!(
            "SELECT coalesce(convert_from(parent, 'UTF8'), '-') || ' ' || (expires_at < now())::text FROM \"{{schema}}\".session_leases WHERE session = '{nested}'::bytea"
        ),
    );
    assert_eq!(row, "p true", "given back, naming its parent");
}

/// A give-back that fails (its rows locked past the lock timeout) is made again at a later
/// renewal: a tenure does not run out by itself while its holder lives, so the session would
/// otherwise be nobody's to serve until this process stops.
#[test]
fn a_give_back_that_failed_is_made_again_at_a_renewal() {
    let schema = pg_testkit::fresh_schema();
    let ttl = Duration::from_millis(1000);
    let (a, b) = (node(&schema, "a", ttl), node(&schema, "b", ttl));
    assert_eq!(tenures(&a).acquire("s1").unwrap(), TenureHolder::Here(1));
    let book = a.inner.tenures.clone().expect("shared");
    let (unlock, locker) = table_locked(&a, "session_leases");
    tenures(&a).release("s1");
    until("the give-back to fail", || book.strays() == 1);
    unlock.send(()).unwrap();
    a.runtime
        .run(async move { locker.await.map_err(|e| LedgerError::storage("test", e)) })
        .unwrap();
    until("the give-back to be made again", || book.strays() == 0);
    assert_eq!(tenures(&b).acquire("s1").unwrap(), TenureHolder::Here(2));
    assert!(!tenures(&a).holds("s1"));
}

/// The heartbeats of process instances dead for an hour are deleted, but only once no tenure
/// names them any more (a tenure naming a missing instance would look held forever).
#[test]
fn heartbeats_dead_for_an_hour_go_once_no_tenure_names_them() {
    let schema = pg_testkit::fresh_schema();
    let a = node(&schema, "a", TTL);
    sql(
        &a,
        "INSERT INTO \"{schema}\".nodes (instance, node, address, held, expires_at) VALUES
             ('old1', 'x', 'http://x', 0, now() - interval '2 hours'),
             ('old2', 'y', 'http://y', 0, now() - interval '2 hours'),
             ('recent', 'z', 'http://z', 0, now() - interval '1 minute');
         INSERT INTO \"{schema}\".held_counts (instance, held) VALUES ('old1', 3), ('old2', 1), ('recent', 2), ('left', 4);
         INSERT INTO \"{schema}\".session_leases (session, owner, address, epoch, expires_at, instance)
             VALUES ('named'::bytea, 'y', 'http://y', 1, 'infinity', 'old2')",
    );
    let left = "SELECT string_agg(instance, ',' ORDER BY instance) FROM \"{schema}\".nodes WHERE node <> 'a'";
    let book = a.inner.tenures.clone().expect("shared");
    let forget = |book: Arc<HeldTenures>| a.runtime.run(async move { book.forget_dead_nodes().await }).unwrap();
    let counted = "SELECT string_agg(instance, ',' ORDER BY instance) FROM \"{schema}\".held_counts
                   WHERE instance <> (SELECT instance FROM \"{schema}\".nodes WHERE node = 'a')";
    assert_eq!(forget(book.clone()), 1);
    assert_eq!(text(&a, left), "old2,recent");
    assert_eq!(text(&a, counted), "old2,recent");
    // `named` (no session stored) is deleted by a sweep; then old2 goes too.
    tenures(&a).spread().unwrap();
    assert_eq!(forget(book), 1);
    assert_eq!(text(&a, left), "recent");
    assert_eq!(text(&a, counted), "recent", "their counts went with them");
}

/// Another connection's transaction that holds `table` locked `IN SHARE MODE` (as a `CREATE
/// INDEX` does: writes to it wait) until the returned sender is told.
fn table_locked(ledger: &PgLedger, table: &str) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    held_open(ledger, &format!("LOCK TABLE \"{{schema}}\".\"{table}\" IN SHARE MODE"))
}

/// As [`table_locked`], against reads too.
fn table_locked_exclusively(
    ledger: &PgLedger,
    table: &str,
) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    held_open(
        ledger,
        &format!("LOCK TABLE \"{{schema}}\".\"{table}\" IN ACCESS EXCLUSIVE MODE"),
    )
}

/// A commit of `ledger`'s on `session`: its fencing check made (the tenure row locked as every
/// commit locks it), then a write to `calls` that waits on that table's lock for as long as it
/// is held. Ends (rolled back) once its write went through.
fn commit_stalled_on_calls(ledger: &PgLedger, session: &str) -> tokio::task::JoinHandle<()> {
    let (checked_tx, checked) = std::sync::mpsc::channel::<()>();
    let pool = ledger.inner.pool.clone();
    let book = ledger.inner.tenures.clone().expect("shared");
    let calls = ledger.inner.table(CALLS);
    let session = session.to_string();
    let in_flight = ledger.runtime.handle.spawn(async move {
        let mut client = pool.get().await.unwrap();
        let tx = client.transaction().await.unwrap();
        // The commit's own check, as `commit_staged` runs it.
        let ok = book.check(&tx, [session.clone()].into_iter().collect()).await.unwrap();
        assert!(ok.contains(&session), "still held");
        checked_tx.send(()).unwrap();
        // Stalled for longer than a tenure (not given up after one, as the pool's lock
        // timeout would).
        tx.batch_execute(&format!(
            "SET LOCAL lock_timeout = 0; INSERT INTO {calls} (key, value) VALUES ('\\x00'::bytea, '\\x00'::bytea)"
        ))
        .await
        .unwrap();
        tx.rollback().await.unwrap();
    });
    checked.recv().unwrap();
    in_flight
}

#[test]
fn a_stalled_commit_of_one_session_does_not_stop_the_renewal_of_any_tenure() {
    let schema = pg_testkit::fresh_schema();
    let ttl = Duration::from_millis(1500);
    let a = node(&schema, "a", ttl);
    let sessions = ["s1", "s2", "s3"];
    for s in sessions {
        assert_eq!(tenures(&a).acquire(s).unwrap(), TenureHolder::Here(1));
    }
    // s2's commit is stalled behind a table lock, its tenure row locked.
    let (unlock, locker) = table_locked(&a, CALLS);
    let in_flight = commit_stalled_on_calls(&a, "s2");
    let before = heartbeat(&a, "a");
    let deadline = std::time::Instant::now() + 6 * ttl;
    loop {
        let now = heartbeat(&a, "a");
        if now > before {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "tenures not renewed while one session's commit was stalled: {before:?} -> {now:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!in_flight.is_finished(), "the commit was stalled throughout");
    for s in sessions {
        assert!(tenures(&a).holds(s), "{s} kept");
    }
    unlock.send(()).unwrap();
    a.runtime
        .run(async move {
            locker.await.map_err(|e| LedgerError::storage("test", e))?;
            in_flight.await.map_err(|e| LedgerError::storage("test", e))
        })
        .unwrap();
}

#[test]
fn a_takeover_waits_for_a_commit_in_flight_of_the_old_holder() {
    let schema = pg_testkit::fresh_schema();
    let (a, b) = (node(&schema, "a", TTL), Arc::new(node(&schema, "b", TTL)));
    assert_eq!(tenures(&a).acquire("s1").unwrap(), TenureHolder::Here(1));
    expire(&a, "s1");
    // A commit of a's in flight: it checked its tenure (the row held FOR SHARE) and has not
    // committed yet.
    let (checked_tx, checked) = std::sync::mpsc::channel::<()>();
    let (go_tx, go) = tokio::sync::oneshot::channel::<()>();
    let pool = a.inner.pool.clone();
    let book = a.inner.tenures.clone().expect("shared");
    let in_flight = a.runtime.handle.spawn(async move {
        let mut client = pool.get().await.unwrap();
        let tx = client.transaction().await.unwrap();
        // The commit's own check, as `commit_staged` runs it.
        let ok = book.check(&tx, ["s1".to_string()].into_iter().collect()).await.unwrap();
        assert!(ok.contains("s1"), "still held at epoch 1");
        checked_tx.send(()).unwrap();
        let _ = go.await;
        tx.commit().await.unwrap();
    });
    checked.recv().unwrap();
    let taker = {
        let b = b.clone();
        std::thread::spawn(move || tenures(&b).acquire("s1"))
    };
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !taker.is_finished(),
        "the takeover did not wait for the commit in flight"
    );
    go_tx.send(()).unwrap();
    assert_eq!(taker.join().unwrap().unwrap(), TenureHolder::Here(2));
    a.runtime
        .run(async move { in_flight.await.map_err(|e| LedgerError::storage("test", e)) })
        .unwrap();
}

#[test]
fn a_commit_that_comes_during_a_takeover_waits_for_it_and_is_refused() {
    let schema = pg_testkit::fresh_schema();
    let a = node(&schema, "a", TTL);
    assert_eq!(tenures(&a).acquire("s1").unwrap(), TenureHolder::Here(1));
    let book = a.inner.tenures.clone().expect("shared");
    let key = book.lock_key_of("s1");
    // A takeover under way, as another process's would be: the session's advisory lock held
    // exclusively and the epoch raised, not committed yet.
    let (taken_tx, taken) = std::sync::mpsc::channel::<()>();
    let (go_tx, go) = tokio::sync::oneshot::channel::<()>();
    let pool = a.inner.pool.clone();
    let table = format!("\"{schema}\".session_leases");
    let takeover = a.runtime.handle.spawn(async move {
        let mut client = pool.get().await.unwrap();
        let tx = client.transaction().await.unwrap();
        tx.query("SELECT pg_advisory_xact_lock($1)", &[&key]).await.unwrap();
        tx.execute(
            &format!("UPDATE {table} SET owner = 'b', epoch = epoch + 1 WHERE session = 's1'::bytea"),
            &[],
        )
        .await
        .unwrap();
        taken_tx.send(()).unwrap();
        let _ = go.await;
        tx.commit().await.unwrap();
    });
    taken.recv().unwrap();
    // a's commit checks its tenure meanwhile: it waits for the takeover, then finds it lost.
    let (pool, checker) = (a.inner.pool.clone(), book.clone());
    let check = a.runtime.handle.spawn(async move {
        let mut client = pool.get().await.unwrap();
        let tx = client.transaction().await.unwrap();
        let ok = checker
            .check(&tx, ["s1".to_string()].into_iter().collect())
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        ok
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !check.is_finished(),
        "the commit's check did not wait for the takeover under way"
    );
    go_tx.send(()).unwrap();
    let ok = a
        .runtime
        .run(async move {
            takeover.await.map_err(|e| LedgerError::storage("test", e))?;
            check.await.map_err(|e| LedgerError::storage("test", e))
        })
        .unwrap();
    assert!(ok.is_empty(), "the check saw the epoch the takeover replaced: {ok:?}");
    assert!(!tenures(&a).holds("s1"), "s1 was lost");
}

#[test]
fn a_row_that_cannot_be_read_is_moved_aside_only_by_its_sessions_holder() {
    let schema = pg_testkit::fresh_schema();
    let (a, b) = (node(&schema, "a", TTL), node(&schema, "b", TTL));
    assert_eq!(tenures(&a).acquire("s1").unwrap(), TenureHolder::Here(1));
    // A dead letter of s1 in a format this build cannot read (a newer build's, say).
    sql(
        &a,
        "INSERT INTO \"{schema}\".dead_letters (key, value) VALUES ('\\x73310078'::bytea, '\\xff00'::bytea)",
    );
    let count = |l: &PgLedger| -> i64 {
        let pool = l.inner.pool.clone();
        let table = format!("\"{}\".dead_letters", l.inner.schema);
        l.runtime
            .run(async move {
                let client = pool.get().await.map_err(pool_error)?;
                let row = client
                    .query_one(&format!("SELECT count(*) FROM {table}"), &[])
                    .await
                    .map_err(pg_error("test count"))?;
                Ok(row.get::<_, i64>(0))
            })
            .unwrap()
    };
    assert!(b.dead_letters().unwrap().is_empty());
    assert_eq!(count(&b), 1, "not b's to move aside: s1 is a's");
    assert!(b.quarantined().unwrap().is_empty());
    assert!(a.dead_letters().unwrap().is_empty());
    assert_eq!(count(&a), 0, "its holder moved it aside");
    assert_eq!(a.quarantined().unwrap().len(), 1);
}

/// Every process reads the others in one order they all agree on (by instance), each count
/// beside whether its process comes first.
#[test]
fn the_spread_orders_the_processes_alike_for_all() {
    let schema = pg_testkit::fresh_schema();
    let nodes = ["a", "b", "c"].map(|n| node(&schema, n, TTL));
    // Held 1, 2 and 3: each count names its process.
    for (k, l) in nodes.iter().enumerate() {
        for s in 0..=k {
            assert_eq!(tenures(l).acquire(&format!("s{k}-{s}")).unwrap(), TenureHolder::Here(1));
        }
    }
    let instance = |l: &PgLedger| l.inner.tenures.as_ref().unwrap().instance().to_string();
    for (k, l) in nodes.iter().enumerate() {
        let me = instance(l);
        let mut expected: Vec<(String, u64)> = nodes
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != k)
            .map(|(j, o)| (instance(o), j as u64 + 1))
            .collect();
        expected.sort();
        let spread = tenures(l).spread().unwrap();
        let got: Vec<(u64, bool)> = spread
            .others
            .iter()
            .copied()
            .zip(spread.others_before.iter().copied())
            .collect();
        let want: Vec<(u64, bool)> = expected.iter().map(|(i, held)| (*held, *i < me)).collect();
        assert_eq!(got, want, "as process {k} reads them");
    }
}

#[test]
fn a_sweep_takes_free_sessions_only_up_to_its_limit_and_counts_the_spread() {
    let schema = pg_testkit::fresh_schema();
    let (a, b) = (node(&schema, "a", TTL), node(&schema, "b", TTL));
    let names = ["s1", "s2", "s3", "s4", "s5", "s6"];
    for s in names {
        assert_eq!(tenures(&a).acquire(s).unwrap(), TenureHolder::Here(1));
    }
    store_sessions(&a, &names);
    // a "dies": every tenure of its runs out.
    for s in names {
        expire(&a, s);
    }
    let spread = tenures(&b).spread().unwrap();
    assert_eq!(
        (spread.free, spread.takeable, spread.others.len()),
        (6, 6, 1),
        "{spread:?}"
    );
    let mut taken = tenures(&b).acquire_free(2).unwrap();
    assert_eq!(taken.len(), 2, "no more than the limit: {taken:?}");
    taken.extend(tenures(&b).acquire_free(usize::MAX).unwrap());
    taken.sort();
    assert_eq!(taken, names, "the rest taken by a second sweep");
    assert_eq!(tenures(&b).held_count(), 6);
    assert_eq!(tenures(&b).spread().unwrap().free, 0);
}

#[test]
fn a_handover_tells_the_others_and_is_not_taken_back_by_the_giver() {
    let schema = pg_testkit::fresh_schema();
    let (a, b) = (node(&schema, "a", TTL), node(&schema, "b", TTL));
    for s in ["s1", "s2"] {
        assert_eq!(tenures(&a).acquire(s).unwrap(), TenureHolder::Here(1));
    }
    store_sessions(&a, &["s1", "s2"]);
    let mut freed = tenures(&b).freed().expect("a shared ledger tells of give-backs");
    freed.mark_unchanged();
    tenures(&a).hand_over(&[("s1".to_string(), None)]).unwrap();
    assert!(tenures(&a).handed_over("s1") && !tenures(&a).holds("s1"));
    // b hears of it (its listening connection may connect first: that moves it too).
    let heard = b.runtime.run(async move {
        tokio::time::timeout(Duration::from_secs(10), freed.changed())
            .await
            .map_err(|_| LedgerError::storage_msg("never told"))?
            .map_err(|_| LedgerError::storage_msg("closed"))
    });
    assert!(heard.is_ok(), "{heard:?}");
    // The giver's own sweep leaves it to the others; b takes it, at a new epoch.
    assert!(tenures(&a).acquire_free(usize::MAX).unwrap().is_empty());
    assert_eq!(tenures(&a).spread().unwrap().takeable, 0);
    assert_eq!(tenures(&b).acquire_free(usize::MAX).unwrap(), ["s1"]);
    assert_eq!(b.tenure_of("s1").unwrap(), Some(("b".to_string(), 2)));
}

#[test]
fn a_nested_session_given_back_is_taken_only_by_the_holder_of_its_parent() {
    let schema = pg_testkit::fresh_schema();
    let (a, b, c) = (
        node(&schema, "a", TTL),
        node(&schema, "b", TTL),
        node(&schema, "c", TTL),
    );
    let nested = "deleg_00ff.0";
    for s in ["p", nested] {
        assert_eq!(tenures(&a).acquire(s).unwrap(), TenureHolder::Here(1));
    }
    store_sessions(&a, &["p", nested]);
    tenures(&a)
        .hand_over(&[("p".to_string(), None), (nested.to_string(), Some("p".to_string()))])
        .unwrap();
    // Only p is anyone's: the nested session waits for p's taker.
    assert_eq!(tenures(&c).spread().unwrap().free, 1);
    assert_eq!(tenures(&b).acquire_free(usize::MAX).unwrap(), ["p"]);
    assert!(tenures(&c).acquire_free(usize::MAX).unwrap().is_empty());
    assert_eq!(tenures(&b).spread().unwrap().nests, 1);
    assert_eq!(tenures(&b).acquire_free(0).unwrap(), [nested], "whatever its share");
    assert_eq!(
        tenures(&b).held_count(),
        1,
        "a nested session is not counted in the spread"
    );
}

#[test]
fn a_session_stored_without_a_tenure_row_is_given_a_free_one_and_a_removed_ones_row_goes() {
    let schema = pg_testkit::fresh_schema();
    // Stored by a process not sharing the schema: no tenure row.
    let plain = PgLedger::open_in(&pg_testkit::url(), &schema).unwrap();
    store_sessions(&plain, &["old"]);
    drop(plain);
    let a = node(&schema, "a", TTL);
    assert_eq!(
        tenures(&a).acquire_free(usize::MAX).unwrap(),
        ["old"],
        "reconciled as it joined"
    );
    // A tenure row whose session is no longer stored goes at a sweep's read.
    sql(
        &a,
        "INSERT INTO \"{schema}\".session_leases (session, owner, address, epoch, expires_at, instance)
         VALUES ('gone'::bytea, 'x', 'x', 3, now() - interval '1 second', 'x')",
    );
    tenures(&a).spread().unwrap();
    assert!(a.tenure_of("gone").unwrap().is_none());
}

#[test]
fn a_session_handed_over_that_nobody_took_is_the_givers_again_after_a_tenure_time() {
    let schema = pg_testkit::fresh_schema();
    let ttl = Duration::from_millis(1000);
    let a = node(&schema, "a", ttl);
    assert_eq!(tenures(&a).acquire("s1").unwrap(), TenureHolder::Here(1));
    store_sessions(&a, &["s1"]);
    // Handed over, and the process meant to take it died at once: nobody takes it.
    tenures(&a).hand_over(&[("s1".to_string(), None)]).unwrap();
    assert!(
        tenures(&a).acquire_free(usize::MAX).unwrap().is_empty(),
        "left to the others"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while tenures(&a).handed_over("s1") {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(tenures(&a).acquire_free(usize::MAX).unwrap(), ["s1"], "anyone's again");
    assert_eq!(a.tenure_of("s1").unwrap(), Some(("a".to_string(), 2)));
}

/// Many sessions at once: a start (or a sweep) that takes the tenures of more sessions than
/// the database's lock table holds advisory locks (64 per connection by default), and then a
/// commit writing rows of every one of them, each go through.
#[test]
fn tenures_and_commits_of_more_sessions_than_the_lock_table_holds_go_through() {
    const MANY: usize = 40_000;
    let schema = pg_testkit::fresh_schema();
    let a = node(&schema, "a", TTL);
    sql(
        &a,
        &format!(
            "INSERT INTO \"{{schema}}\".\"{SESSIONS}\" (key, value)
             SELECT convert_to('s' || i, 'UTF8'), '\\x00'::bytea FROM generate_series(1, {MANY}) AS i;
             INSERT INTO \"{{schema}}\".session_leases (session, owner, address, epoch, expires_at, instance)
             SELECT convert_to('s' || i, 'UTF8'), 'gone', 'http://gone', 1, now() - interval '1 second', 'gone'
             FROM generate_series(1, {MANY}) AS i"
        ),
    );
    let taken = tenures(&a).acquire_free(usize::MAX).expect("the free tenures taken");
    assert_eq!(taken.len(), MANY);
    let ids: Vec<String> = (1..=MANY).map(|i| format!("s{i}")).collect();
    a.write(&Writes {
        sessions: ids.iter().map(|s| session(s)).collect(),
        ..Writes::default()
    })
    .unwrap();
    a.flush().expect("the commit of every session's row");
    let refused = ids.iter().filter(|s| a.refusals(s) > 0).count();
    assert_eq!(refused, 0, "sessions refused at the commit");
    assert_eq!(second_view(&a).load().unwrap().sessions.len(), MANY);
}

/// A commit of more sessions than take a lock each (it takes their buckets' locks) still holds
/// off a takeover of any one of them until it committed.
#[test]
fn a_takeover_waits_for_a_commit_in_flight_of_many_sessions() {
    let schema = pg_testkit::fresh_schema();
    let (a, b) = (node(&schema, "a", TTL), Arc::new(node(&schema, "b", TTL)));
    let ids: Vec<String> = (0..400).map(|i| format!("m{i}")).collect();
    for s in &ids {
        assert_eq!(tenures(&a).acquire(s).unwrap(), TenureHolder::Here(1));
    }
    expire(&a, "m7");
    let (checked_tx, checked) = std::sync::mpsc::channel::<()>();
    let (go_tx, go) = tokio::sync::oneshot::channel::<()>();
    let pool = a.inner.pool.clone();
    let book = a.inner.tenures.clone().expect("shared");
    let all = ids.clone();
    let in_flight = a.runtime.handle.spawn(async move {
        let mut client = pool.get().await.unwrap();
        let tx = client.transaction().await.unwrap();
        let ok = book.check(&tx, all.into_iter().collect()).await.unwrap();
        assert_eq!(ok.len(), 400, "every one still held at epoch 1");
        checked_tx.send(()).unwrap();
        let _ = go.await;
        tx.commit().await.unwrap();
    });
    checked.recv().unwrap();
    let taker = {
        let b = b.clone();
        std::thread::spawn(move || tenures(&b).acquire("m7"))
    };
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !taker.is_finished(),
        "the takeover did not wait for the commit in flight"
    );
    go_tx.send(()).unwrap();
    assert_eq!(taker.join().unwrap().unwrap(), TenureHolder::Here(2));
    a.runtime
        .run(async move { in_flight.await.map_err(|e| LedgerError::storage("test", e)) })
        .unwrap();
}

/// [`super::held_open`] on the test server's database.
fn held_open(ledger: &PgLedger, statements: &str) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    super::held_open(ledger, &pg_testkit::url(), statements)
}

/// How many statements naming the ledger's schema wait for a lock, plus how many wait for the
/// advisory lock `key`.
fn waiting(ledger: &PgLedger, key: Option<i64>) -> i64 {
    let schema = ledger.inner.schema.clone();
    let query = format!(
        "SELECT ((SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
                    AND position('\"{schema}\".' in query) > 0)
               + (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
                    AND ((classid::int8 << 32) | objid::int8) = {}))::text",
        key.unwrap_or(0)
    );
    text(ledger, &query).parse().unwrap()
}

/// Ends the transaction of [`held_open`] and waits for it.
fn commit_held(ledger: &PgLedger, go: tokio::sync::oneshot::Sender<()>, held: tokio::task::JoinHandle<()>) {
    go.send(()).unwrap();
    ledger
        .runtime
        .run(async move { held.await.map_err(|e| LedgerError::storage("test", e)) })
        .unwrap();
}

/// A process paused past its heartbeat wakes while another one's takeover of its session is
/// under way (begun while the heartbeat was out, not committed yet): its renewal, which finds
/// the heartbeat had lapsed, waits for the takeover and loses the session, rather than reading
/// its old row, keeping the session and serving it beside its new holder.
#[test]
fn a_renewal_after_a_lapse_waits_for_a_takeover_under_way_and_loses_what_it_took() {
    let schema = pg_testkit::fresh_schema();
    let a = node(&schema, "a", TTL);
    assert_eq!(tenures(&a).acquire("s1").unwrap(), TenureHolder::Here(1));
    assert_eq!(tenures(&a).acquire("s2").unwrap(), TenureHolder::Here(1));
    heartbeat_lapses(&a, "a");
    let book = a.inner.tenures.clone().expect("shared");
    let key = book.lock_key_of("s1");
    // b's takeover of s1, as its upsert leaves it: the advisory lock held exclusively, the row
    // b's at the next epoch, not committed yet.
    let (go, takeover) = held_open(
        &a,
        &format!(
            "INSERT INTO \"{{schema}}\".nodes (instance, node, address, held, expires_at)
                 VALUES ('b1', 'b', 'http://b', 1, now() + interval '1 hour');
             SELECT pg_advisory_xact_lock({key});
             UPDATE \"{{schema}}\".session_leases SET owner = 'b', address = 'http://b', epoch = epoch + 1,
                 instance = 'b1' WHERE session = 's1'::bytea"
        ),
    );
    let renewal = {
        let book = book.clone();
        std::thread::spawn(move || book.renew_now())
    };
    until("the renewal to end or wait for the takeover", || {
        renewal.is_finished() || waiting(&a, Some(key)) > 0
    });
    commit_held(&a, go, takeover);
    renewal.join().unwrap().unwrap();
    assert!(!tenures(&a).holds("s1"), "s1 kept beside its new holder");
    assert!(tenures(&a).holds("s2"), "s2 was not taken: still a's");
}

/// A take under way when the process leaves (a clean stop) must not commit a tenure naming
/// the instance whose heartbeat the leaving deleted: it would look held forever.
#[test]
fn a_take_under_way_when_the_process_leaves_leaves_no_tenure_held_forever() {
    let schema = pg_testkit::fresh_schema();
    let a = Arc::new(node(&schema, "a", TTL));
    // s1's tenure given back by a process long gone, its row locked for a moment by another
    // statement (a sweep's retention, say).
    sql(
        &a,
        "INSERT INTO \"{schema}\".session_leases (session, owner, address, epoch, expires_at, instance)
             VALUES ('s1'::bytea, 'x', 'http://x', 1, now() - interval '1 second', 'x1')",
    );
    let (go, locker) = held_open(
        &a,
        "SELECT 1 FROM \"{schema}\".session_leases WHERE session = 's1'::bytea FOR UPDATE",
    );
    let take = {
        let a = a.clone();
        std::thread::spawn(move || tenures(&a).acquire("s1"))
    };
    until("the take to wait for the row", || waiting(&a, None) == 1);
    let leave = {
        let a = a.clone();
        std::thread::spawn(move || tenures(&a).release_all())
    };
    until("the leaving to end or wait for the take", || {
        leave.is_finished() || waiting(&a, None) == 2
    });
    commit_held(&a, go, locker);
    let _ = take.join().unwrap();
    leave.join().unwrap();
    assert_eq!(
        text(
            &a,
            "SELECT count(*)::text FROM \"{schema}\".session_leases l WHERE l.expires_at >= now()
               AND NOT EXISTS (SELECT 1 FROM \"{schema}\".nodes n WHERE n.instance = l.instance)"
        ),
        "0",
        "a tenure names an instance without a heartbeat"
    );
    assert_eq!(
        text(
            &a,
            "SELECT count(*)::text FROM \"{schema}\".held_counts c
             WHERE NOT EXISTS (SELECT 1 FROM \"{schema}\".nodes n WHERE n.instance = c.instance)"
        ),
        "0",
        "a count of sessions held is left without its heartbeat"
    );
}

/// A process that stopped cleanly while its handle lives on (an embedder that stops brood and
/// keeps going) never writes its heartbeat again: it does not look alive, holding nothing, to
/// the others' balancing, which would hand it sessions it never takes.
#[test]
fn a_process_that_left_writes_no_heartbeat_again() {
    let schema = pg_testkit::fresh_schema();
    let a = node(&schema, "a", Duration::from_millis(600));
    assert_eq!(tenures(&a).acquire("s1").unwrap(), TenureHolder::Here(1));
    tenures(&a).release_all();
    let gone = "SELECT count(*)::text FROM \"{schema}\".nodes WHERE node = 'a'";
    assert_eq!(text(&a, gone), "0");
    // Several renewal periods (a third of the tenure each) later.
    std::thread::sleep(Duration::from_millis(1_000));
    assert_eq!(
        text(&a, gone),
        "0",
        "the heartbeat was written again after the process left"
    );
    drop(a);
}

/// A clean stop while a handover is under way (its give-back has locked its tenure row and
/// waits to write the count of sessions held, whose lock a sweep holds, its own write of the
/// count waiting a moment): the stop gives back the handover's tenure after it, and every
/// other, without a deadlock for the database to break (and the stop to lose).
#[test]
fn a_clean_stop_beside_a_handover_under_way_gives_every_tenure_back() {
    let schema = pg_testkit::fresh_schema();
    let a = Arc::new(node(&schema, "a", TTL));
    for s in ["s1", "s2"] {
        assert_eq!(tenures(&a).acquire(s).unwrap(), TenureHolder::Here(1));
    }
    store_sessions(&a, &["s1", "s2"]);
    let (go, locker) = held_open(
        &a,
        "SELECT 1 FROM \"{schema}\".held_counts c JOIN \"{schema}\".nodes n USING (instance)
         WHERE n.node = 'a' FOR UPDATE OF c",
    );
    let sweep = {
        let a = a.clone();
        std::thread::spawn(move || tenures(&a).spread())
    };
    until("the sweep's count to wait for its row", || waiting(&a, None) == 1);
    let handover = {
        let a = a.clone();
        std::thread::spawn(move || tenures(&a).hand_over(&[("s1".to_string(), None)]))
    };
    until("the give-back to lock s1", || {
        text(
            &a,
            "SELECT count(*)::text FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
               JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = '{schema}' AND c.relname = 'session_leases'
               AND l.mode = 'RowExclusiveLock' AND l.granted",
        ) != "0"
    });
    let leave = {
        let a = a.clone();
        std::thread::spawn(move || tenures(&a).release_all())
    };
    until("the stop to wait for the give-back", || waiting(&a, None) == 2);
    commit_held(&a, go, locker);
    sweep.join().unwrap().unwrap();
    handover.join().unwrap().unwrap();
    leave.join().unwrap();
    assert_eq!(
        text(
            &a,
            "SELECT count(*)::text FROM \"{schema}\".session_leases WHERE expires_at >= now()"
        ),
        "0",
        "every tenure given back"
    );
}

/// A process paused for over an hour wakes and renews its heartbeat while the slow cleanup
/// deletes the heartbeats dead that long: the renewed one is kept (its tenures, taken once it is back,
/// would otherwise name an instance without a heartbeat, held forever).
#[test]
fn a_heartbeat_renewed_while_the_long_dead_ones_are_deleted_is_kept() {
    let schema = pg_testkit::fresh_schema();
    let a = Arc::new(node(&schema, "a", TTL));
    sql(
        &a,
        "INSERT INTO \"{schema}\".nodes (instance, node, address, held, expires_at)
             VALUES ('old1', 'x', 'http://x', 0, now() - interval '2 hours')",
    );
    let (go, renewal) = held_open(
        &a,
        "UPDATE \"{schema}\".nodes SET expires_at = now() + interval '1 hour' WHERE instance = 'old1'",
    );
    let sweep = {
        let a = a.clone();
        std::thread::spawn(move || {
            let book = a.inner.tenures.clone().expect("shared");
            a.runtime.run(async move { book.forget_dead_nodes().await })
        })
    };
    until("the cleanup to end or wait for the renewal", || {
        sweep.is_finished() || waiting(&a, None) == 1
    });
    commit_held(&a, go, renewal);
    sweep.join().unwrap().unwrap();
    assert_eq!(
        text(
            &a,
            "SELECT string_agg(instance, ',') FROM \"{schema}\".nodes WHERE node = 'x'"
        ),
        "old1",
        "a live heartbeat was deleted"
    );
}

/// While this process's own heartbeat is out (an outage of the database longer than a tenure,
/// a pause), it takes nothing; a free tenure it asks for is then not answered as held by
/// whoever held it last (a process that gave it back, or died), for a request to be sent
/// there: it is an error, asked again later.
#[test]
fn a_take_refused_for_a_lapsed_own_heartbeat_names_no_holder_of_a_free_tenure() {
    let schema = pg_testkit::fresh_schema();
    let (a, b) = (node(&schema, "a", TTL), node(&schema, "b", TTL));
    assert_eq!(tenures(&b).acquire("s1").unwrap(), TenureHolder::Here(1));
    expire(&a, "s1");
    heartbeat_lapses(&a, "a");
    let answer = tenures(&a).acquire("s1");
    assert!(answer.is_err(), "answered {answer:?}");
    assert!(!tenures(&a).holds("s1"));
    // Alive again (its next renewal): taken.
    a.inner.tenures.clone().expect("shared").renew_now().unwrap();
    assert_eq!(tenures(&a).acquire("s1").unwrap(), TenureHolder::Here(2));
}

/// A renewal that lands just as the heartbeat runs out (sent before, held up past it, here by
/// a lock on its row): another process may have seen it out meanwhile and taken a tenure. The
/// renewal reads its tenures back then, though its statement began while the heartbeat was
/// alive, and loses the one taken.
#[test]
fn a_renewal_held_up_past_the_heartbeats_end_reads_its_tenures_back() {
    let schema = pg_testkit::fresh_schema();
    let (a, b) = (node(&schema, "a", TTL), node(&schema, "b", TTL));
    assert_eq!(tenures(&a).acquire("s1").unwrap(), TenureHolder::Here(1));
    // a's heartbeat runs out in a moment; its row is locked meanwhile (by a statement of
    // another connection), so a's renewal, sent now, waits for it.
    sql(
        &a,
        "UPDATE \"{schema}\".nodes SET expires_at = now() + interval '300 milliseconds' WHERE node = 'a'",
    );
    let (go, locker) = held_open(&a, "SELECT 1 FROM \"{schema}\".nodes WHERE node = 'a' FOR UPDATE");
    let book = a.inner.tenures.clone().expect("shared");
    let renewal = {
        let book = book.clone();
        std::thread::spawn(move || book.renew_now())
    };
    until("the renewal to wait for the row", || waiting(&a, None) == 1);
    until("a's heartbeat to run out", || {
        text(
            &a,
            "SELECT (expires_at < now())::text FROM \"{schema}\".nodes WHERE node = 'a'",
        ) == "true"
    });
    // b sees a's heartbeat out and takes s1 over.
    assert_eq!(tenures(&b).acquire("s1").unwrap(), TenureHolder::Here(2));
    commit_held(&a, go, locker);
    renewal.join().unwrap().unwrap();
    assert!(!tenures(&a).holds("s1"), "s1 kept beside its new holder");
}

/// A tenure taken after the last renewal that went through is served no longer than the
/// heartbeat that renewal wrote, which the tenure lasts as long as: once the renewals stop
/// going through (here: the table of processes locked), every tenure stops being served
/// together, the ones taken since too (another process takes them all when the heartbeat
/// runs out).
#[test]
fn a_tenure_taken_after_the_last_renewal_is_served_no_longer_than_its_heartbeat() {
    let schema = pg_testkit::fresh_schema();
    let a = node(&schema, "a", Duration::from_millis(3000));
    assert_eq!(tenures(&a).acquire("s1").unwrap(), TenureHolder::Here(1));
    let (unlock, locker) = table_locked(&a, "nodes");
    // A renewal waits on the lock: the last one that went through was sent a turn before. A
    // take goes through (its count of sessions held is a table of its own).
    until("a renewal to wait for the table", || waiting(&a, None) >= 1);
    assert_eq!(tenures(&a).acquire("s2").unwrap(), TenureHolder::Here(1));
    until("s1 to stop being served", || !tenures(&a).serving("s1"));
    assert!(
        !tenures(&a).serving("s2"),
        "s2 served past the heartbeat it lasts as long as"
    );
    unlock.send(()).unwrap();
    a.runtime
        .run(async move { locker.await.map_err(|e| LedgerError::storage("test", e)) })
        .unwrap();
}

/// A take of this process's that waits (here for a commit of another process's, holding the
/// session's advisory lock) holds up no renewal: the heartbeat, which every tenure lasts as
/// long as, is renewed on; a tenure waiting to be given back again waits for a later renewal.
#[test]
fn a_take_that_waits_holds_up_no_renewal() {
    let schema = pg_testkit::fresh_schema();
    let a = Arc::new(node(&schema, "a", TTL));
    let book = a.inner.tenures.clone().expect("shared");
    book.add_stray("gone");
    let key = book.lock_key_of("s2");
    let (go, commit) = held_open(&a, &format!("SELECT pg_advisory_xact_lock_shared({key})"));
    let take = {
        let a = a.clone();
        std::thread::spawn(move || tenures(&a).acquire("s2"))
    };
    until("the take to wait for the commit", || waiting(&a, Some(key)) > 0);
    let renewal = {
        let book = book.clone();
        std::thread::spawn(move || book.renew_now())
    };
    until("the renewal to end", || renewal.is_finished());
    renewal.join().unwrap().unwrap();
    assert_eq!(book.strays(), 1, "left for a later renewal");
    commit_held(&a, go, commit);
    assert_eq!(take.join().unwrap().unwrap(), TenureHolder::Here(1));
    book.renew_now().unwrap();
    assert_eq!(book.strays(), 0);
}

/// A read of many sessions (a start's, a sweep's, an adoption's) meets rows it cannot read in
/// a session another process holds and in one this process holds: it leaves the former in
/// place (the holder's to move aside) and names none of its children damaged; it moves the
/// latter aside and names its child damaged.
#[test]
fn a_read_of_many_sessions_moves_aside_only_the_unreadable_rows_of_the_sessions_held_here() {
    let schema = pg_testkit::fresh_schema();
    let (a, b) = (node(&schema, "a", TTL), node(&schema, "b", TTL));
    assert_eq!(tenures(&a).acquire("s1").unwrap(), TenureHolder::Here(1));
    assert_eq!(tenures(&b).acquire("s2").unwrap(), TenureHolder::Here(1));
    store_sessions(&a, &["s1"]);
    store_sessions(&b, &["s2"]);
    // A child row, a dead letter and a wake row of each in a format this build cannot read.
    for s in ["s1", "s2"] {
        for (table, key) in [
            (
                "children",
                format!("convert_to('{s}', 'UTF8') || '\\x00'::bytea || convert_to('deleg_x.0', 'UTF8')"),
            ),
            (
                "dead_letters",
                format!("convert_to('{s}', 'UTF8') || '\\x00'::bytea || convert_to('x', 'UTF8')"),
            ),
            ("wakes", format!("convert_to('{s}', 'UTF8')")),
        ] {
            sql(
                &a,
                &format!("INSERT INTO \"{{schema}}\".{table} (key, value) VALUES ({key}, '\\xff00'::bytea)"),
            );
        }
    }
    let rows = |l: &PgLedger| -> String {
        text(
            l,
            &format!(
                "SELECT (SELECT count(*) FROM \"{0}\".children) || ',' || (SELECT count(*) FROM \"{0}\".dead_letters)
                     || ',' || (SELECT count(*) FROM \"{0}\".wakes)",
                l.inner.schema
            ),
        )
    };
    let both = ["s1".to_string(), "s2".to_string()];
    // A load of the whole ledger leaves them in place as well.
    let whole = b.load().unwrap();
    assert_eq!(
        whole.damaged_children,
        vec!["deleg_x.0".to_string()],
        "a load: s2's child only"
    );
    assert!(whole.children.is_empty() && whole.wakes.is_empty(), "{whole:?}");
    assert_eq!(rows(&b), "1,1,1", "a load: s1's rows left in place, s2's moved aside");
    let read = b.load_sessions(&both).unwrap();
    assert_eq!(read.damaged_children, vec!["deleg_x.0".to_string()], "s2's child only");
    assert!(read.children.is_empty() && read.wakes.is_empty(), "{read:?}");
    assert_eq!(rows(&b), "1,1,1", "s1's rows left in place, s2's moved aside");
    assert_eq!(b.quarantined().unwrap().len(), 3);
    let read = a.load_sessions(&both).unwrap();
    assert_eq!(
        read.damaged_children,
        vec!["deleg_x.0".to_string(), "deleg_x.0".to_string()],
        "s2's, already aside, and s1's"
    );
    assert_eq!(rows(&a), "0,0,0", "s1's moved aside by its holder");
    assert_eq!(a.quarantined().unwrap().len(), 6);
}

/// How many sessions `node`'s row of `nodes` says it holds.
fn written_held(ledger: &PgLedger, node: &str) -> u64 {
    text(
        ledger,
        &format!(
            "SELECT c.held::text FROM \"{{schema}}\".held_counts c JOIN \"{{schema}}\".nodes n USING (instance)
             WHERE n.node = '{node}'"
        ),
    )
    .parse()
    .unwrap()
}

/// Two processes, a and b, of a fresh schema with six sessions stored (s1 to s6), every one
/// taken by a.
fn six_taken_by_a() -> (PgLedger, PgLedger) {
    let schema = pg_testkit::fresh_schema();
    // Stored by a process not sharing the schema: their tenures are anyone's once shared.
    let plain = PgLedger::open_in(&pg_testkit::url(), &schema).unwrap();
    store_sessions(&plain, &["s1", "s2", "s3", "s4", "s5", "s6"]);
    drop(plain);
    let (a, b) = (node(&schema, "a", TTL), node(&schema, "b", TTL));
    assert_eq!(tenures(&a).acquire_free(usize::MAX).unwrap().len(), 6);
    (a, b)
}

/// The count of sessions a process holds is written as a take or a handover changes it, not
/// only at its next sweep: a process sweeping at the handover's notice reads the giver's count
/// without the sessions given (counted twice, as the giver's and as free, they raised the share
/// the others took up to, and sessions moved again).
#[test]
fn a_take_and_a_handover_write_the_count_of_sessions_held_at_once() {
    let (a, b) = six_taken_by_a();
    assert_eq!(written_held(&a, "a"), 6, "written by the take's transaction");
    let nested = "deleg_00ff.0";
    assert_eq!(tenures(&a).acquire(nested).unwrap(), TenureHolder::Here(1));
    assert_eq!(written_held(&a, "a"), 6, "a nested session is not counted");
    tenures(&a)
        .hand_over(&[("s1".to_string(), None), ("s2".to_string(), None)])
        .unwrap();
    assert_eq!(written_held(&a, "a"), 4, "written by the give-back's transaction");
    // b, sweeping at the notice, counts what a holds now and what is free: 6 in all.
    let spread = tenures(&b).spread().unwrap();
    assert_eq!((spread.others.clone(), spread.free), (vec![4], 2), "{spread:?}");
    assert_eq!(tenures(&b).acquire_free(usize::MAX).unwrap(), ["s1", "s2"]);
    assert_eq!(written_held(&b, "b"), 2);
    assert_eq!(tenures(&a).spread().unwrap().others, [2]);
}

/// A handover while a renewal holds the process's heartbeat row: the give-back neither waits
/// for it nor leaves its count unwritten (the count is a row of its own), so a process sweeping
/// at the notice counts the sessions given once.
#[test]
fn a_handover_beside_a_renewal_is_counted_once() {
    let (a, b) = six_taken_by_a();
    // As a renewal's upsert holds it for its statement's time.
    let (unlock, locker) = held_open(
        &a,
        "SELECT 1 FROM \"{schema}\".nodes WHERE node = 'a' FOR NO KEY UPDATE",
    );
    tenures(&a)
        .hand_over(&[("s1".to_string(), None), ("s2".to_string(), None)])
        .unwrap();
    let spread = tenures(&b).spread().unwrap();
    commit_held(&a, unlock, locker);
    assert_eq!((spread.others.clone(), spread.free), (vec![4], 2), "{spread:?}");
}

/// A sweep's read that waits (here for a table it reads, locked) holds up no take of the same
/// process: the sweep writes its count of sessions held and lets the count's lock go before
/// its read, whose delete of tenure rows may wait for a take that waits for that lock.
#[test]
fn a_sweep_that_waits_holds_up_no_take() {
    let schema = pg_testkit::fresh_schema();
    let a = node(&schema, "a", TTL);
    let (unlock, locker) = table_locked_exclusively(&a, "sessions");
    let sweeping = {
        let t = tenures(&a);
        std::thread::spawn(move || t.spread())
    };
    until("the sweep's read to wait for the table", || waiting(&a, None) >= 1);
    let taking = {
        let t = tenures(&a);
        std::thread::spawn(move || t.acquire("s1"))
    };
    until("the take to go through", || taking.is_finished());
    commit_held(&a, unlock, locker);
    assert_eq!(taking.join().unwrap().unwrap(), TenureHolder::Here(1));
    sweeping.join().unwrap().unwrap();
}

/// Every connection of `ledger`'s pool, taken (given back when dropped).
fn every_pool_connection(ledger: &PgLedger) -> Vec<deadpool_postgres::Object> {
    let pool = ledger.inner.pool.clone();
    ledger
        .runtime
        .run(async move {
            let mut taken = Vec::new();
            for _ in 0..POOL_SIZE {
                taken.push(pool.get().await.map_err(pool_error)?);
            }
            Ok(taken)
        })
        .unwrap()
}

/// A renewal never waits for a connection of the pool: with every one of them taken (by
/// commits in flight, a take waiting for another process's commit, small reads), the
/// heartbeat is renewed on a connection of its own.
#[test]
fn a_renewal_goes_through_with_every_connection_of_the_pool_taken() {
    let schema = pg_testkit::fresh_schema();
    let a = node(&schema, "a", TTL);
    sql(
        &a,
        "UPDATE \"{schema}\".nodes SET expires_at = now() + interval '2 seconds' WHERE node = 'a'",
    );
    let taken = every_pool_connection(&a);
    let book = a.inner.tenures.clone().expect("shared");
    let renewal = std::thread::spawn(move || book.renew_now());
    until("the renewal to go through", || renewal.is_finished());
    renewal.join().unwrap().unwrap();
    drop(taken);
    assert_eq!(
        text(
            &a,
            "SELECT (expires_at > now() + interval '20 seconds')::text FROM \"{schema}\".nodes WHERE node = 'a'"
        ),
        "true",
        "renewed for a tenure"
    );
}

/// The renewals go on while every connection of the pool stays taken for longer than a tenure
/// (commits, takes waiting for other processes' commits) with a tenure left to give back: the
/// give-back, and the other upkeep on the pool, wait beside the renewals, never before them.
#[test]
fn renewals_go_on_while_the_pool_stays_taken_with_a_tenure_left_to_give_back() {
    let schema = pg_testkit::fresh_schema();
    let ttl = Duration::from_millis(3000);
    let a = node(&schema, "a", ttl);
    assert_eq!(tenures(&a).acquire("s1").unwrap(), TenureHolder::Here(1));
    let book = a.inner.tenures.clone().expect("shared");
    book.add_stray("gone");
    let taken = every_pool_connection(&a);
    // Past the local deadline of a renewal made as the pool was taken (four fifths of a tenure
    // after it): served only if renewals went on since.
    std::thread::sleep(ttl * 3 / 2);
    assert!(tenures(&a).serving("s1"), "the heartbeat ran out: the renewals stopped");
    drop(taken);
    until("the stray tenure to be given back", || book.strays() == 0);
}
