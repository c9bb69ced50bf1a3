//! Reads of sessions on PostgreSQL: one, many and the whole ledger, as a start, a sweep and an
//! owner's rebuild read them.

use super::super::super::pg_testkit;
use super::super::reads::{decoded_rows_in, Fetched, Received};
use super::super::*;
use super::own::{session, writes_of};
use super::{held_open, sql};

/// A child row this build cannot decode (a newer build's, say) is moved aside and named among
/// its session's damaged children, whether the session is loaded alone, with others (as a
/// start or a sweep loads them), or with the whole ledger: recovery then marks it unknown
/// rather than running it again as queued.
#[test]
fn an_undecodable_child_row_is_named_damaged_by_every_load() {
    let ledger = pg_testkit::fresh();
    ledger.write(&writes_of("s1")).unwrap();
    ledger.write(&writes_of("s2")).unwrap();
    ledger.flush().unwrap();
    let key = crate::ledger::rows::row_key("s1", "deleg_0123456789abcdef.0");
    let (pool, table) = (
        ledger.inner.pool.clone(),
        format!("\"{}\".children", ledger.inner.schema),
    );
    let undecodable = |pool: deadpool_postgres::Pool, table: String, key: Vec<u8>| async move {
        let client = pool.get().await.map_err(pool_error)?;
        client
            .execute(
                &format!("INSERT INTO {table} (key, value) VALUES ($1, '\\xff00'::bytea)"),
                &[&key],
            )
            .await
            .map_err(pg_error("test insert"))
    };
    let damaged = vec!["deleg_0123456789abcdef.0".to_string()];
    let both = ["s1".to_string(), "s2".to_string()];
    ledger
        .runtime
        .run(undecodable(pool.clone(), table.clone(), key.clone()))
        .unwrap();
    let many = ledger.load_sessions(&both).unwrap();
    assert_eq!(many.damaged_children, damaged, "a load of several sessions");
    assert!(many.children.is_empty(), "{:?}", many.children);
    assert_eq!(ledger.quarantined().unwrap().len(), 1, "moved aside");
    ledger
        .runtime
        .run(undecodable(pool.clone(), table.clone(), key.clone()))
        .unwrap();
    assert_eq!(
        ledger.load_session("s1").unwrap().damaged_children,
        damaged,
        "a load of one"
    );
    ledger.runtime.run(undecodable(pool, table, key)).unwrap();
    assert_eq!(ledger.load().unwrap().damaged_children, damaged, "a load of all");
}

/// A load of the whole ledger reads every row stored, whatever its key: a row whose key
/// starts with a byte no session id starts with (0xFF, written by something other than brood)
/// is read too, and moved aside when it does not decode, as every other row is; a damaged child
/// of such a key is named damaged.
#[test]
fn a_load_of_the_whole_ledger_reads_rows_of_every_key() {
    let ledger = pg_testkit::fresh();
    ledger.write(&writes_of("s1")).unwrap();
    ledger.flush().unwrap();
    let key = b"\xff\0deleg_0123456789abcdef.5".to_vec();
    let (pool, schema) = (ledger.inner.pool.clone(), ledger.inner.schema.clone());
    ledger
        .runtime
        .run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            for table in ["children", "calls"] {
                client
                    .execute(
                        &format!("INSERT INTO \"{schema}\".{table} (key, value) VALUES ($1, '\\xff00'::bytea)"),
                        &[&key],
                    )
                    .await
                    .map_err(pg_error("test insert"))?;
            }
            Ok::<_, LedgerError>(())
        })
        .unwrap();
    let loaded = ledger.load().unwrap();
    assert_eq!(loaded.damaged_children, vec!["deleg_0123456789abcdef.5".to_string()]);
    let mut trees: Vec<String> = ledger.quarantined().unwrap().into_iter().map(|q| q.tree).collect();
    trees.sort();
    assert_eq!(trees, vec![CALLS.to_string(), CHILDREN.to_string()], "moved aside");
    assert_eq!(
        ledger.load().unwrap().damaged_children,
        loaded.damaged_children,
        "named once"
    );
}

/// A read of many sessions answers every tree's rows in key order (recovery files each
/// call's children as one run, and folds each session's delivery state as one): should
/// the range-by-range statement come back otherwise, the rows are read again, sorted.
#[test]
fn a_read_of_many_sessions_answers_in_key_order_even_when_a_range_comes_back_out_of_order() {
    use crate::ledger::conformance::{call_row, child_row};
    for unordered in [false, true] {
        let ledger = pg_testkit::fresh();
        ledger
            .unordered_reads
            .store(unordered, std::sync::atomic::Ordering::SeqCst);
        let ids = ["s1", "s2", "s3"];
        let mut writes = Writes::default();
        for s in ids {
            writes.sessions.push(session(s));
            for call in ["deleg_a", "deleg_b"] {
                writes.calls.push(call_row(s, call, 12));
                writes
                    .children
                    .extend((0..12).map(|i| child_row(s, call, i, ChildStatus::Succeeded)));
            }
        }
        ledger.write(&writes).unwrap();
        ledger.flush().unwrap();
        let read = ledger.load_sessions(&ids.map(String::from)).unwrap();
        let keys: Vec<Vec<u8>> = read
            .children
            .iter()
            .map(|c| row_key(&c.session_id, &c.child_id))
            .collect();
        assert_eq!(keys.len(), 72, "unordered: {unordered}");
        assert!(keys.is_sorted(), "children in key order (unordered: {unordered})");
        let calls: Vec<Vec<u8>> = read.calls.iter().map(|c| row_key(&c.session_id, &c.call_id)).collect();
        assert_eq!(calls.len(), 6);
        assert!(calls.is_sorted(), "calls in key order (unordered: {unordered})");
    }
}

/// Many sessions, each with two rows in every table read range by range, all six answers
/// out of key order at once (each dropped part-way while the statements sent after it on
/// the same connection still have their answers coming, megabytes of them): every later
/// statement still reads its own answer, and the read is the one a sorted read gives, row
/// for row. Sessions whose ids share a prefix (`a`, `a.b`, `a_b`, `ab`) and one with no
/// rows but its session row keep to their own ranges.
#[test]
fn a_read_of_many_sessions_with_every_table_out_of_order_at_once_answers_as_a_sorted_read() {
    use crate::ledger::conformance::Fixture;
    let ledger = pg_testkit::fresh();
    let mut ids: Vec<String> = ["a", "a.b", "a_b", "ab", "bare"].map(String::from).to_vec();
    ids.extend((0..700).map(|i| format!("s{i:04}")));
    let mut writes = Writes::default();
    let mut claims = Vec::new();
    for id in &ids {
        if id == "bare" {
            writes.sessions.push(session(id));
            continue;
        }
        for call in ["deleg_a", "deleg_b"] {
            let f = Fixture::new(id, call);
            let more = f.writes();
            writes.sessions.extend(more.sessions);
            writes.calls.extend(more.calls);
            writes.children.extend(more.children);
            writes.dead_letters.extend(more.dead_letters);
            writes.acks.extend(more.acks);
            writes.starts.extend(more.starts);
            writes.wakes.extend(more.wakes);
            writes.nests.extend(more.nests);
            claims.push(f.claim.clone());
        }
    }
    ledger.write(&writes).unwrap();
    for claim in &claims {
        ledger.put_claim(claim).unwrap();
    }
    ledger.flush().unwrap();
    let mut asked = ids.clone();
    asked.push("deleg_a.0".into());
    let sorted = ledger.load_sessions(&asked).unwrap();
    assert_eq!(sorted.sessions.len(), ids.len());
    assert_eq!(sorted.children.len(), 4 * (ids.len() - 1));
    assert_eq!(sorted.calls.len(), 2 * (ids.len() - 1));
    assert_eq!(sorted.claims.len(), 2 * (ids.len() - 1));
    assert_eq!(sorted.starts.len(), 2 * (ids.len() - 1));
    assert_eq!(sorted.nests.len(), 1, "the nested session asked for");
    let keys = |rows: Vec<(String, String)>| -> bool {
        rows.iter()
            .map(|(s, id)| row_key(s, id))
            .collect::<Vec<_>>()
            .is_sorted()
    };
    let children = sorted
        .children
        .iter()
        .map(|c| (c.session_id.clone(), c.child_id.clone()))
        .collect();
    assert!(keys(children), "children in key order");
    for (session, rows) in [("a", 4), ("a.b", 4), ("a_b", 4), ("ab", 4), ("bare", 0)] {
        assert_eq!(
            sorted.children.iter().filter(|c| c.session_id == session).count(),
            rows,
            "{session}'s own children only"
        );
    }
    ledger.unordered_reads.store(true, std::sync::atomic::Ordering::SeqCst);
    let unordered = ledger.load_sessions(&asked).unwrap();
    assert_eq!(
        format!("{unordered:?}"),
        format!("{sorted:?}"),
        "read out of order, then sorted"
    );
}

/// Every statement of a read of many sessions, under the settings of its transaction
/// (sorting avoided), reads its table by an index range scan of each range asked for, not
/// by a scan of the whole table with each row tested against every range: so does the
/// statement that sorts, read again when an answer came out of order, and the read of the
/// quarantine, made at every read. A read of the whole ledger (every row of every table, and
/// the damaged children's range of the quarantine) reads by index, in key order, and sorts
/// nothing.
#[test]
fn every_statement_of_a_read_of_many_sessions_reads_only_the_ranges_asked_for() {
    let ledger = pg_testkit::fresh();
    let (children, quarantine, sessions) = (ledger.table(CHILDREN), ledger.table(QUARANTINE), ledger.table(SESSIONS));
    // 40,000 rows in each table, of 2,000 sessions; a read of 1,000 of them.
    let fill = format!(
        "INSERT INTO {children} (key, value)
             SELECT convert_to('s' || lpad((i / 20)::text, 5, '0'), 'UTF8') || '\\x00'::bytea
                    || convert_to('c' || lpad((i % 20)::text, 3, '0'), 'UTF8'), '\\x00'::bytea
             FROM generate_series(0, 39999) i;
         INSERT INTO {quarantine} (key, value) SELECT 'children/'::bytea || key, value FROM {children};
         INSERT INTO {sessions} (key, value)
             SELECT convert_to('s' || lpad(i::text, 5, '0') || '.' || (i % 20)::text, 'UTF8'), '\\x00'::bytea
             FROM generate_series(0, 39999) i"
    );
    let asked: Vec<String> = (0..1000).map(|i| format!("s{:05}", i * 2)).collect();
    let ranges = |prefix: &[u8]| -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
        asked
            .iter()
            .map(|s| {
                let mut low = prefix.to_vec();
                low.extend_from_slice(&session_prefix(s));
                let mut high = low.clone();
                *high.last_mut().unwrap() = 1;
                (low, high)
            })
            .unzip()
    };
    let (low, high) = ranges(b"");
    let (damaged_low, damaged_high) = ranges(b"children/");
    let names: Vec<Vec<u8>> = asked.iter().map(|s| s.as_bytes().to_vec()).collect();
    let [by_range, sorted] = super::super::reads::range_statements(&children, "");
    let damaged = super::super::reads::damaged_statement(&quarantine);
    let keyed = super::super::reads::keyed_statement(&sessions);
    let every = [&sessions, &children].map(|t| super::super::reads::every_row_statement(t));
    let (all_damaged_low, all_damaged_high) = (vec![b"children/".to_vec()], vec![b"children0".to_vec()]);
    let pool = ledger.inner.pool.clone();
    let plans = ledger
        .runtime
        .run(async move {
            let mut client = pool.get().await.map_err(pool_error)?;
            client.batch_execute(&fill).await.map_err(pg_error("filling"))?;
            let tx = client.transaction().await.map_err(pg_error("test"))?;
            tx.batch_execute(super::super::reads::READ_SETTINGS)
                .await
                .map_err(pg_error("test"))?;
            let mut plans = Vec::new();
            for (what, sql, params) in [
                ("range by range", by_range, [&low, &high]),
                ("sorted", sorted, [&low, &high]),
                ("damaged", damaged.clone(), [&damaged_low, &damaged_high]),
                ("every damaged row", damaged, [&all_damaged_low, &all_damaged_high]),
            ] {
                let rows = tx
                    .query(&format!("EXPLAIN {sql}"), &[params[0], params[1]])
                    .await
                    .map_err(pg_error("explaining"))?;
                plans.push((
                    what,
                    rows.iter()
                        .map(|r| r.get::<_, String>(0))
                        .collect::<Vec<_>>()
                        .join("\n"),
                ));
            }
            let rows = tx
                .query(&format!("EXPLAIN {keyed}"), &[&names])
                .await
                .map_err(pg_error("explaining"))?;
            plans.push((
                "keyed",
                rows.iter()
                    .map(|r| r.get::<_, String>(0))
                    .collect::<Vec<_>>()
                    .join("\n"),
            ));
            let mut explained = Vec::new();
            for sql in every {
                let rows = tx
                    .query(&format!("EXPLAIN {sql}"), &[])
                    .await
                    .map_err(pg_error("explaining"))?;
                explained.push(
                    rows.iter()
                        .map(|r| r.get::<_, String>(0))
                        .collect::<Vec<_>>()
                        .join("\n"),
                );
            }
            Ok((plans, explained))
        })
        .unwrap();
    let (plans, every) = plans;
    for (what, plan) in plans {
        assert!(
            plan.contains("Index Cond") && !plan.contains("Join Filter"),
            "{what}: {plan}"
        );
        if what.starts_with("every") {
            assert!(!plan.contains("Sort"), "{what}: {plan}");
        }
    }
    for every in every {
        assert!(
            every.contains("Index Scan") && !every.contains("Sort"),
            "every row of a table: {every}"
        );
    }
}

fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Once a read of the ledger at `url` waits on a lock, ends it by `end` (`pg_cancel_backend`:
/// its statement; `pg_terminate_backend`: its connection, as a failover ends it).
fn end_the_waiting_read(url: &str, end: &str) {
    let waiter = "SELECT pid::text FROM pg_stat_activity WHERE datname = current_database()
         AND application_name = 'brood' AND wait_event_type = 'Lock'";
    let mut pid = None;
    until("the read waits on the lock", || {
        pid = pg_testkit::query_value(url, waiter).unwrap();
        pid.is_some()
    });
    let pid = pid.unwrap();
    pg_testkit::query_value(url, &format!("SELECT {end}({pid})::text")).unwrap();
}

/// `sessions` sessions stored (`s00`, `s01`, …), each with one call of `children` children
/// that succeeded, flushed; their ids, and what a load of them all answers (as text).
fn sessions_stored(ledger: &PgLedger, sessions: usize, children: u32) -> (Vec<String>, String) {
    use crate::ledger::conformance::{call_row, child_row};
    let ids: Vec<String> = (0..sessions).map(|i| format!("s{i:02}")).collect();
    let mut writes = Writes::default();
    for id in &ids {
        writes.sessions.push(session(id));
        writes.calls.push(call_row(id, "deleg_c", children));
        writes
            .children
            .extend((0..children).map(|i| child_row(id, "deleg_c", i, ChildStatus::Succeeded)));
    }
    ledger.write(&writes).unwrap();
    ledger.flush().unwrap();
    let expected = format!("{:?}", ledger.load_sessions(&ids).unwrap());
    (ids, expected)
}

/// Asserts that no connection of the ledger's reads is left with a read's planner setting:
/// `enable_sort` is on on every one (all taken at once, so each answers). `what` names the
/// case in the message.
fn assert_pool_sorts(ledger: &PgLedger, what: &str) {
    let pool = ledger.reads.pool.clone();
    let settings = ledger
        .reads
        .runtime
        .run(async move {
            let size = pool.status().size;
            let mut held = Vec::new();
            for _ in 0..size {
                held.push(pool.get().await.map_err(pool_error)?);
            }
            let mut settings = Vec::new();
            for client in &held {
                let row = client
                    .query_one("SHOW enable_sort", &[])
                    .await
                    .map_err(pg_error("test"))?;
                settings.push(row.get::<_, String>(0));
            }
            Ok(settings)
        })
        .unwrap();
    assert!(
        !settings.is_empty() && settings.iter().all(|s| s == "on"),
        "{what}: {settings:?}"
    );
}

/// A read of many sessions ended part-way by the server, its statement cancelled (the
/// connection kept) or its connection ended (as a failover ends it): the read reports it,
/// no connection of the ledger is left inside a transaction (the pool would give it to the
/// next statement, which would fail) or with the read's planner setting, and the next
/// reads answer everything.
#[test]
fn a_read_of_many_sessions_ended_part_way_reports_it_and_leaves_no_connection_in_its_state() {
    for end in ["pg_cancel_backend", "pg_terminate_backend"] {
        let url = pg_testkit::fresh_database();
        let ledger = std::sync::Arc::new(PgLedger::open_in(&url, "brood").unwrap());
        let (ids, expected) = sessions_stored(&ledger, 40, 3);
        // Every connection of the pool made, so the failed one is among several.
        let many: Vec<_> = (0..4)
            .map(|_| {
                let (l, ids) = (ledger.clone(), ids.clone());
                std::thread::spawn(move || l.load_sessions(&ids).map(|s| format!("{s:?}")))
            })
            .collect();
        for read in many {
            assert_eq!(read.join().unwrap().unwrap(), expected);
        }
        // The read's statement on `nests` waits behind another transaction's lock, the
        // statements before it already answered.
        let (go, held) = held_open(&ledger, &url, "LOCK TABLE brood.nests IN ACCESS EXCLUSIVE MODE");
        let reading = {
            let (l, ids) = (ledger.clone(), ids.clone());
            std::thread::spawn(move || l.load_sessions(&ids).map(|s| format!("{s:?}")))
        };
        end_the_waiting_read(&url, end);
        let err = reading.join().unwrap().expect_err("the read was ended");
        assert!(format!("{err:?}").contains("many sessions"), "{end}: {err:?}");
        go.send(()).unwrap();
        ledger
            .runtime
            .run(async move { held.await.map_err(|e| LedgerError::storage("test", e)) })
            .unwrap();
        let in_transaction = "SELECT count(*)::text FROM pg_stat_activity WHERE datname = current_database()
             AND application_name = 'brood' AND state LIKE 'idle in transaction%'";
        until("no connection of the ledger inside a transaction", || {
            pg_testkit::query_value(&url, in_transaction).unwrap().as_deref() == Some("0")
        });
        for _ in 0..=READ_POOL_SIZE {
            match ledger.load_sessions(&ids) {
                Ok(read) => assert!(format!("{read:?}") == expected, "{end}: a read answered other rows"),
                Err(e) => panic!("{end}: a read after failed: {e:?}"),
            }
        }
        // No connection of the pool is left with the read's setting, whether its read
        // failed or answered.
        assert_pool_sorts(&ledger, end);
    }
}

/// A load of one session (an owner's rebuild, a take-up) answers every child row of the
/// session whatever its calls say: beside a call row that does not decode (moved aside), and
/// beyond a call's tasks.
#[test]
fn a_load_of_one_session_answers_every_child_whatever_its_calls_say() {
    use crate::ledger::conformance::{call_row, child_row};
    let ledger = pg_testkit::fresh();
    let mut writes = writes_of("s");
    writes.calls.push(call_row("s", "deleg_a", 2));
    writes
        .children
        .extend((0..5).map(|i| child_row("s", "deleg_a", i, ChildStatus::Succeeded)));
    writes
        .children
        .extend((0..3).map(|i| child_row("s", "deleg_bad", i, ChildStatus::Succeeded)));
    ledger.write(&writes).unwrap();
    ledger.flush().unwrap();
    sql(
        &ledger,
        &format!(
            "INSERT INTO \"{}\".calls (key, value) VALUES
             (convert_to('s', 'UTF8') || '\\x00'::bytea || convert_to('deleg_bad', 'UTF8'), '\\xff00'::bytea)",
            ledger.inner.schema
        ),
    );
    let one = ledger.load_session("s").unwrap();
    assert_eq!(one.children.len(), 8, "every child row");
    assert_eq!(one.calls.len(), 1, "the readable call");
    assert!(one.damaged_children.is_empty(), "{:?}", one.damaged_children);
    assert_eq!(ledger.quarantined().unwrap().len(), 1, "the call moved aside");
    assert_eq!(format!("{:?}", ledger.load_session("s").unwrap()), format!("{one:?}"));
}

/// A load of one session (an owner's rebuild) ended part-way by the server, its
/// connection ended as a failover ends it: the error is a storage error with its cause
/// (the rebuild retries those), no connection is left with the read's planner setting,
/// and the next loads answer what the first did.
#[test]
fn a_load_of_one_session_ended_part_way_is_a_storage_error_and_the_next_answers() {
    use crate::ledger::conformance::{call_row, child_row};
    let url = pg_testkit::fresh_database();
    let ledger = std::sync::Arc::new(PgLedger::open_in(&url, "brood").unwrap());
    let mut writes = writes_of("a");
    writes.sessions.push(session("ab"));
    for s in ["a", "ab"] {
        writes.calls.push(call_row(s, "deleg_c", 3));
        writes
            .children
            .extend((0..3).map(|i| child_row(s, "deleg_c", i, ChildStatus::Succeeded)));
    }
    ledger.write(&writes).unwrap();
    ledger.flush().unwrap();
    let expected = format!("{:?}", ledger.load_session("a").unwrap());
    let (go, held) = held_open(&ledger, &url, "LOCK TABLE brood.children IN ACCESS EXCLUSIVE MODE");
    let reading = {
        let l = ledger.clone();
        std::thread::spawn(move || l.load_session("a").map(|s| format!("{s:?}")))
    };
    end_the_waiting_read(&url, "pg_terminate_backend");
    let err = reading.join().unwrap().expect_err("the load was ended");
    assert!(
        matches!(err, LedgerError::Storage { source: Some(_), .. }),
        "a storage error with its cause: {err:?}"
    );
    go.send(()).unwrap();
    ledger
        .runtime
        .run(async move { held.await.map_err(|e| LedgerError::storage("test", e)) })
        .unwrap();
    for _ in 0..=READ_POOL_SIZE {
        assert_eq!(format!("{:?}", ledger.load_session("a").unwrap()), expected);
    }
    assert_pool_sorts(&ledger, "after the ended load");
}

/// A read of many sessions meets a change of the schema by another process (a newer
/// build's migration, at a rolling upgrade, while this one adopts the sessions the
/// upgraded process gave back), which locks the tables one after another in an order of
/// its own: the change goes through and the read answers once it is committed. Neither is
/// ended as a deadlock: a statement of the read holds its table only while it runs.
#[test]
fn a_read_of_many_sessions_waits_for_a_schema_change_that_locks_its_tables_in_another_order() {
    let url = pg_testkit::fresh_database();
    let ledger = std::sync::Arc::new(PgLedger::open_in(&url, "brood").unwrap());
    let (ids, expected) = sessions_stored(&ledger, 10, 2);
    // The change: `nests` locked first, `acks` once told.
    let (locked_tx, locked) = std::sync::mpsc::channel::<()>();
    let (go_tx, go) = tokio::sync::oneshot::channel::<()>();
    let change = {
        let url = url.clone();
        ledger.runtime.handle.spawn(async move {
            let (mut client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(connection);
            let tx = client.transaction().await.unwrap();
            tx.batch_execute("LOCK TABLE brood.nests IN ACCESS EXCLUSIVE MODE")
                .await
                .unwrap();
            locked_tx.send(()).unwrap();
            let _ = go.await;
            match tx.batch_execute("LOCK TABLE brood.acks IN ACCESS EXCLUSIVE MODE").await {
                Ok(()) => tx.commit().await.map_err(|e| format!("{e:?}")),
                Err(e) => Err(format!("{e:?}")),
            }
        })
    };
    locked.recv().unwrap();
    let reading = {
        let (l, ids) = (ledger.clone(), ids.clone());
        std::thread::spawn(move || l.load_sessions(&ids).map(|s| format!("{s:?}")))
    };
    let waiter = "SELECT pid::text FROM pg_stat_activity WHERE datname = current_database()
         AND application_name = 'brood' AND wait_event_type = 'Lock'";
    until("the read waits on the change's lock", || {
        pg_testkit::query_value(&url, waiter).unwrap().is_some()
    });
    go_tx.send(()).unwrap();
    let changed = ledger
        .runtime
        .run(async move { change.await.map_err(|e| LedgerError::storage("test", e)) })
        .unwrap();
    assert_eq!(changed, Ok(()), "the change went through");
    match reading.join().unwrap() {
        Ok(read) => assert!(read == expected, "the read answered other rows"),
        Err(e) => panic!("the read failed: {e:?}"),
    }
}

/// Rows decoded a share per core come back as one pass decodes them: in the order received,
/// with the rows that do not decode set apart in that order too, whatever the number of
/// shares (more shares than rows, too).
#[test]
fn rows_decoded_a_share_per_core_come_back_as_one_pass_decodes_them() {
    use crate::ledger::conformance::{call_row, child_row};
    let ledger = pg_testkit::fresh();
    let mut writes = writes_of("s");
    for call in ["deleg_a", "deleg_b", "deleg_c"] {
        writes.calls.push(call_row("s", call, 7));
        writes
            .children
            .extend((0..7).map(|i| child_row("s", call, i, ChildStatus::Succeeded)));
    }
    ledger.write(&writes).unwrap();
    ledger.flush().unwrap();
    let table = format!("\"{}\".children", ledger.inner.schema);
    for (call, at) in [("deleg_a", 3), ("deleg_c", 6)] {
        sql(
            &ledger,
            &format!(
                "UPDATE {table} SET value = '\\xff00'::bytea
                 WHERE key = convert_to('s', 'UTF8') || '\\x00'::bytea || convert_to('{call}.{at}', 'UTF8')"
            ),
        );
    }
    let pool = ledger.inner.pool.clone();
    let received = ledger
        .runtime
        .run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            client
                .query(&format!("SELECT key, value FROM {table} ORDER BY key"), &[])
                .await
                .map_err(pg_error("test read"))
        })
        .unwrap();
    // Received in pieces of uneven sizes, as a read keeps them.
    let count = received.len();
    let mut rows = received.into_iter();
    let received: Received = [1, 4, 2, usize::MAX]
        .into_iter()
        .map(|n| rows.by_ref().take(n).collect::<Vec<_>>())
        .collect();
    assert_eq!(received.iter().map(Vec::len).sum::<usize>(), count);
    let one: Fetched<Vec<ChildRow>> = decoded_rows_in(&received, 1);
    assert_eq!(one.0.len() + one.1.len(), count);
    assert_eq!(one.1.len(), 2, "the two rows that do not decode");
    assert!(one
        .0
        .windows(2)
        .all(|w| (&w[0].call_id, w[0].task_index) < (&w[1].call_id, w[1].task_index)));
    for parts in [2, 3, 4, count, count + 5] {
        let shared: Fetched<Vec<ChildRow>> = decoded_rows_in(&received, parts);
        assert_eq!(format!("{shared:?}"), format!("{one:?}"), "{parts} shares");
        // Into runs, the same rows, each run of one call.
        let (runs, bad): Fetched<ChildRuns> = decoded_rows_in(&received, parts);
        assert_eq!(runs, one.0, "{parts} shares into runs");
        assert_eq!(format!("{bad:?}"), format!("{:?}", one.1));
        assert!(runs
            .runs()
            .iter()
            .all(|run| run.iter().all(|c| c.call_id == run[0].call_id)));
    }
    // No thread to be had for two of the shares: they are decoded on this thread, the same.
    #[cfg(feature = "failpoints")]
    {
        let _point = DECODE_POINT.lock().unwrap_or_else(|e| e.into_inner());
        crate::failpoints::arm("decode_thread_refused", 2);
        let refused: Fetched<Vec<ChildRow>> = decoded_rows_in(&received, 4);
        assert_eq!(
            crate::failpoints::remaining("decode_thread_refused"),
            0,
            "two shares had no thread"
        );
        crate::failpoints::arm("decode_thread_refused", 0);
        assert_eq!(format!("{refused:?}"), format!("{one:?}"), "shares without a thread");
    }
    let none: Fetched<Vec<ChildRow>> = decoded_rows_in(&[], 2);
    assert!(none.0.is_empty() && none.1.is_empty());
}

/// Tests that count the hits of `decode_thread_refused` hold this while they do.
#[cfg(feature = "failpoints")]
static DECODE_POINT: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A read of sessions decodes their calls in one share, however many, on the reader's thread (or
/// on one it makes beside a large read's children, which keeps its priority: an owner's rebuild
/// reads at a lowered one), never on the thread receiving them. Every share made for a thread
/// passes `decode_thread_refused`, armed here to count them (it cannot fail on a machine of one
/// core: no shares are made).
#[cfg(feature = "failpoints")]
#[test]
fn a_read_decodes_its_calls_in_one_share() {
    use crate::ledger::conformance::call_row;
    const CALLS: usize = 40_000;
    let ledger = pg_testkit::fresh();
    let mut writes = writes_of("s");
    writes.calls = (0..CALLS)
        .map(|i| {
            let mut call = call_row("s", &format!("deleg_{i:06}"), 1);
            call.set = i as u64 + 1;
            call
        })
        .collect();
    writes.children.clear();
    ledger.write(&writes).unwrap();
    ledger.flush().unwrap();
    let _point = DECODE_POINT.lock().unwrap_or_else(|e| e.into_inner());
    const ARMED: u64 = 1_000_000;
    crate::failpoints::arm("decode_thread_refused", ARMED);
    let read = ledger.load_session("s");
    let left = crate::failpoints::remaining("decode_thread_refused");
    crate::failpoints::arm("decode_thread_refused", 0);
    assert_eq!(read.unwrap().calls.len(), CALLS);
    assert_eq!(left, ARMED, "no share of the calls was made for a thread");
}

/// The reads of whole sessions (and of whole tables) are received on a thread of their own:
/// while that thread is busy (here: held by a job until told), a read waits, and commits go on
/// meanwhile, as every other session's commits go on while an owner's rebuild receives its rows.
#[test]
fn commits_go_on_while_the_thread_receiving_a_read_is_busy() {
    let ledger = std::sync::Arc::new(pg_testkit::fresh());
    ledger.write(&writes_of("a")).unwrap();
    ledger.flush().unwrap();
    let (go, told) = std::sync::mpsc::channel::<()>();
    ledger.reads.runtime.handle.spawn(async move {
        let _ = told.recv();
    });
    let reading = {
        let l = ledger.clone();
        std::thread::spawn(move || l.load_session("a"))
    };
    // A read of every row of a table (the dead letters) is received there too.
    let listing = {
        let l = ledger.clone();
        std::thread::spawn(move || l.dead_letters())
    };
    let (committed, commit) = std::sync::mpsc::channel();
    {
        let l = ledger.clone();
        std::thread::spawn(move || {
            let _ = committed.send(l.write(&writes_of("b")).and_then(|()| l.flush()));
        });
    }
    // Were commits on the thread held, the commit would wait for as long as it is held.
    let answer = commit.recv_timeout(Duration::from_secs(60));
    // A read not held by that thread would be answered by now.
    std::thread::sleep(Duration::from_millis(300));
    assert!(!reading.is_finished(), "the read waits for the thread receiving reads");
    assert!(
        !listing.is_finished(),
        "the listing waits for the thread receiving reads"
    );
    go.send(()).unwrap();
    assert!(listing.join().unwrap().unwrap().is_empty());
    answer
        .expect("the commit went through while the thread receiving reads was held")
        .unwrap();
    assert_eq!(reading.join().unwrap().unwrap().sessions.len(), 1);
    assert_eq!(ledger.load_session("b").unwrap().sessions.len(), 1);
}

/// The thread receiving large reads runs at a lowered priority (an owner's rebuild, a take-up
/// yield the CPU to routing and commits); the thread of the commits does not.
#[cfg(target_os = "linux")]
#[test]
fn large_reads_are_received_at_a_lowered_priority_and_commits_are_not() {
    let _nice = NICE_POINT.lock().unwrap_or_else(|e| e.into_inner());
    let ledger = pg_testkit::fresh();
    // Each thread of this process by name, with its nice value.
    let nice_of = |name: &str| -> Vec<i64> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("stat")).ok())
            .filter_map(|stat| {
                let (comm, _) = stat.split_once(" (")?.1.rsplit_once(") ")?;
                (comm == name).then(|| nice_in_stat(&stat))?
            })
            .collect()
    };
    // The read runtime lowers its thread as that thread starts.
    until("the reads' threads at nice 10", || {
        let read = nice_of("brood-pg-read");
        !read.is_empty() && read.iter().all(|&v| v == 10)
    });
    let commits = nice_of("brood-pg");
    assert!(!commits.is_empty() && commits.iter().all(|&v| v == 0), "{commits:?}");
    drop(ledger);
}

/// Tests that start ledgers at a priority of their own hold this while they do (the test above
/// reads every ledger thread of the process).
#[cfg(target_os = "linux")]
static NICE_POINT: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// In a process started at a lowered priority (nice 15 here: a thread at 15 starts the
/// ledger, whose threads take its priority), large reads are lowered below the commits (to
/// 19), not set to a fixed value that could put them above the commits.
#[cfg(target_os = "linux")]
#[test]
fn large_reads_stay_below_commits_in_a_process_started_at_a_lowered_priority() {
    let _nice = NICE_POINT.lock().unwrap_or_else(|e| e.into_inner());
    let nice_of_tid = |tid: i64| -> i64 {
        nice_in_stat(&std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap()).unwrap()
    };
    let (commits, reads) = std::thread::spawn(move || {
        // SAFETY: gettid has no arguments; setpriority only reads its arguments (lowering a
        // thread's own priority needs no privilege).
        unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            assert_eq!(libc::setpriority(libc::PRIO_PROCESS, tid, 15), 0);
        }
        let ledger = pg_testkit::fresh();
        // SAFETY: as above.
        let tid = || async { Ok(unsafe { libc::syscall(libc::SYS_gettid) }) };
        let commits = ledger.runtime.run(tid()).unwrap();
        let reads = ledger.reads.runtime.run(tid()).unwrap();
        let niced = (nice_of_tid(commits), nice_of_tid(reads));
        drop(ledger);
        niced
    })
    .join()
    .unwrap();
    assert_eq!(commits, 15);
    assert_eq!(
        reads, 19,
        "the reads' thread at nice {reads}, the commits' at {commits}"
    );
}

/// The nice value in a thread's `/proc` stat line: field 19, counted after the thread's name,
/// which is in parentheses (and may hold spaces or parentheses itself).
#[cfg(target_os = "linux")]
fn nice_in_stat(stat: &str) -> Option<i64> {
    stat.rsplit_once(") ")?.1.split(' ').nth(16)?.parse().ok()
}
