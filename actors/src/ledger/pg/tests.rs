//! Tests of the PostgreSQL ledger: the conformance suite, and its own behaviours.

mod conformance {
    use super::super::super::{pg_testkit, Ledger};

    /// Fresh PostgreSQL ledgers, each in a schema of its own on the test server.
    fn fresh_ledgers() -> impl Fn() -> Box<dyn Ledger> {
        || Box::new(pg_testkit::fresh()) as Box<dyn Ledger>
    }

    crate::ledger::conformance::ledger_conformance_tests!(fresh_ledgers());
}

mod own {
    use super::super::super::pg_testkit;
    use super::super::*;

    pub(super) fn session(id: &str) -> SessionRow {
        SessionRow {
            session_id: id.into(),
            max_concurrent_children: 4,
            max_delivery_attempts: 3,
            next_set: 1,
            created_at_ms: 0,
            addressable: false,
        }
    }

    fn writes_of(id: &str) -> Writes {
        Writes {
            sessions: vec![session(id)],
            ..Writes::default()
        }
    }

    /// The same schema opened a second time: another process's view of the database.
    pub(super) fn second_view(ledger: &PgLedger) -> PgLedger {
        PgLedger::open_in(&pg_testkit::url(), &ledger.inner.schema).unwrap()
    }

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
    /// quarantine, made at every read.
    #[test]
    fn every_statement_of_a_read_of_many_sessions_reads_only_the_ranges_asked_for() {
        let ledger = pg_testkit::fresh();
        let (children, quarantine, sessions) =
            (ledger.table(CHILDREN), ledger.table(QUARANTINE), ledger.table(SESSIONS));
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
                    ("damaged", damaged, [&damaged_low, &damaged_high]),
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
                Ok(plans)
            })
            .unwrap();
        for (what, plan) in plans {
            assert!(
                plan.contains("Index Cond") && !plan.contains("Join Filter"),
                "{what}: {plan}"
            );
        }
    }

    /// Another connection's transaction that runs `statements` on the database at `url` and
    /// stays open until the returned sender is told, then rolls back.
    fn held_open(
        ledger: &PgLedger,
        url: &str,
        statements: &str,
    ) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
        let (ran_tx, ran) = std::sync::mpsc::channel::<()>();
        let (go_tx, go) = tokio::sync::oneshot::channel::<()>();
        let (url, sql) = (url.to_string(), statements.to_string());
        let held = ledger.runtime.handle.spawn(async move {
            let (mut client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(connection);
            let tx = client.transaction().await.unwrap();
            tx.batch_execute(&sql).await.unwrap();
            ran_tx.send(()).unwrap();
            let _ = go.await;
            tx.rollback().await.unwrap();
        });
        ran.recv().unwrap();
        (go_tx, held)
    }

    fn until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "never: {what}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
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
            let ids: Vec<String> = (0..40).map(|i| format!("s{i:02}")).collect();
            let mut writes = Writes::default();
            for id in &ids {
                writes.sessions.push(session(id));
                writes
                    .calls
                    .push(crate::ledger::conformance::call_row(id, "deleg_c", 3));
                writes.children.extend(
                    (0..3).map(|i| crate::ledger::conformance::child_row(id, "deleg_c", i, ChildStatus::Succeeded)),
                );
            }
            ledger.write(&writes).unwrap();
            ledger.flush().unwrap();
            let expected = format!("{:?}", ledger.load_sessions(&ids).unwrap());
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
            let waiter = "SELECT pid::text FROM pg_stat_activity WHERE datname = current_database()
                 AND application_name = 'brood' AND wait_event_type = 'Lock'";
            let mut pid = None;
            until("the read waits on the lock", || {
                pid = pg_testkit::query_value(&url, waiter).unwrap();
                pid.is_some()
            });
            let pid = pid.unwrap();
            pg_testkit::query_value(&url, &format!("SELECT {end}({pid})::text")).unwrap();
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
            for _ in 0..=POOL_SIZE {
                match ledger.load_sessions(&ids) {
                    Ok(read) => assert!(format!("{read:?}") == expected, "{end}: a read answered other rows"),
                    Err(e) => panic!("{end}: a read after failed: {e:?}"),
                }
            }
            // No connection of the pool is left with the read's setting, whether its read
            // failed or answered.
            let pool = ledger.inner.pool.clone();
            let settings = ledger
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
                "{end}: {settings:?}"
            );
        }
    }

    /// A load of one session (an owner's rebuild, a take-up) makes room for its children from
    /// its calls' tasks: a call row that does not decode adds none, and a call with more
    /// children than tasks is outgrown. Every child row of the session is answered all the
    /// same, and the undecodable call is moved aside.
    #[test]
    fn a_load_of_one_session_answers_every_child_whatever_room_its_calls_made() {
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
        sql_in(
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

    fn sql_in(ledger: &PgLedger, statement: &str) {
        let (pool, statement) = (ledger.inner.pool.clone(), statement.to_string());
        ledger
            .runtime
            .run(async move {
                let client = pool.get().await.map_err(pool_error)?;
                client.batch_execute(&statement).await.map_err(pg_error("test"))
            })
            .unwrap();
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
        let waiter = "SELECT pid::text FROM pg_stat_activity WHERE datname = current_database()
             AND application_name = 'brood' AND wait_event_type = 'Lock'";
        let mut pid = None;
        until("the load waits on the lock", || {
            pid = pg_testkit::query_value(&url, waiter).unwrap();
            pid.is_some()
        });
        let pid = pid.unwrap();
        pg_testkit::query_value(&url, &format!("SELECT pg_terminate_backend({pid})::text")).unwrap();
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
        for _ in 0..=POOL_SIZE {
            assert_eq!(format!("{:?}", ledger.load_session("a").unwrap()), expected);
        }
        let pool = ledger.inner.pool.clone();
        let settings = ledger
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
            "{settings:?}"
        );
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
        let ids: Vec<String> = (0..10).map(|i| format!("s{i:02}")).collect();
        let mut writes = Writes::default();
        for id in &ids {
            writes.sessions.push(session(id));
            writes
                .calls
                .push(crate::ledger::conformance::call_row(id, "deleg_c", 2));
            writes.children.extend(
                (0..2).map(|i| crate::ledger::conformance::child_row(id, "deleg_c", i, ChildStatus::Succeeded)),
            );
        }
        ledger.write(&writes).unwrap();
        ledger.flush().unwrap();
        let expected = format!("{:?}", ledger.load_sessions(&ids).unwrap());
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

    #[test]
    fn a_write_is_seen_elsewhere_only_once_flushed() {
        let ledger = pg_testkit::fresh();
        let other = second_view(&ledger);
        ledger.write(&writes_of("s1")).unwrap();
        assert!(other.load().unwrap().sessions.is_empty(), "staged, not committed");
        assert!(ledger.flush().unwrap() > 0, "the flush wrote the row");
        assert_eq!(other.load().unwrap().sessions, vec![session("s1")]);
        assert_eq!(ledger.flush().unwrap(), 0, "nothing left to write");
    }

    #[test]
    fn flushes_from_many_threads_each_return_once_their_writes_are_committed() {
        let ledger = std::sync::Arc::new(pg_testkit::fresh());
        let other = second_view(&ledger);
        let threads: Vec<_> = (0..16)
            .map(|t| {
                let ledger = ledger.clone();
                std::thread::spawn(move || {
                    let mut last = String::new();
                    for i in 0..10 {
                        last = format!("s{t}_{i}");
                        ledger.write(&writes_of(&last)).unwrap();
                        ledger.flush().unwrap();
                    }
                    last
                })
            })
            .collect();
        for t in threads {
            let last = t.join().unwrap();
            // Committed before its flush returned: another connection reads it.
            let seen = other.load().unwrap().sessions;
            assert!(seen.iter().any(|s| s.session_id == last), "{last} committed");
        }
        assert_eq!(other.load().unwrap().sessions.len(), 160);
    }

    #[test]
    fn a_schema_newer_than_this_build_is_refused_and_left_as_it_was() {
        let ledger = pg_testkit::fresh();
        let schema = ledger.inner.schema.clone();
        let pool = ledger.inner.pool.clone();
        ledger
            .runtime
            .run(async move {
                let client = pool.get().await.map_err(pool_error)?;
                client
                    .execute(
                        &format!("INSERT INTO \"{schema}\".migrations (version, name) VALUES (99, 'from the future')"),
                        &[],
                    )
                    .await
                    .map_err(pg_error("faking a newer schema"))?;
                Ok(())
            })
            .unwrap();
        let err = PgLedger::open_in(&pg_testkit::url(), &ledger.inner.schema)
            .unwrap_err()
            .to_string();
        assert!(err.contains("version 99") && err.contains("upgrade brood"), "{err}");
        // Still readable by this build's ledger that had it open, and still at 99.
        assert!(ledger.load().is_ok());
        let again = PgLedger::open_in(&pg_testkit::url(), &ledger.inner.schema)
            .unwrap_err()
            .to_string();
        assert!(again.contains("version 99"), "{again}");
    }

    /// `ledger`'s schema as a build before migration `version` left it, with `value` stored as
    /// it is under `key` in `table`; then the schema opened again, migrated.
    fn reopened_before_migration(
        ledger: &PgLedger,
        version: i32,
        table: &str,
        key: Vec<u8>,
        value: Vec<u8>,
    ) -> PgLedger {
        let (schema, pool, table) = (
            ledger.inner.schema.clone(),
            ledger.inner.pool.clone(),
            table.to_string(),
        );
        ledger
            .runtime
            .run(async move {
                let client = pool.get().await.map_err(pool_error)?;
                client
                    .batch_execute(&format!(
                        "DELETE FROM \"{schema}\".migrations WHERE version = {version}"
                    ))
                    .await
                    .map_err(pg_error("forgetting a migration"))?;
                client
                    .execute(
                        &format!("INSERT INTO \"{schema}\".\"{table}\" (key, value) VALUES ($1, $2)"),
                        &[&key, &value],
                    )
                    .await
                    .map_err(pg_error("storing a row of an older version"))?;
                Ok(())
            })
            .unwrap();
        PgLedger::open_in(&pg_testkit::url(), &ledger.inner.schema).unwrap()
    }

    /// A schema of a build that wrote session rows of version 1 (before `addressable`, and
    /// before migration 7): it is migrated, and its sessions load as they were, not
    /// addressable.
    #[test]
    fn a_session_row_of_version_1_loads_after_the_migration() {
        let ledger = pg_testkit::fresh();
        // Session `old`: capacity 8, 3 delivery attempts, next set 2, created at 9.
        let v1: Vec<u8> = vec![1, 3, b'o', b'l', b'd', 8, 3, 2, 9];
        let reopened = reopened_before_migration(&ledger, 7, SESSIONS, b"old".to_vec(), v1);
        assert_eq!(
            reopened.load().unwrap().sessions,
            vec![SessionRow {
                session_id: "old".into(),
                max_concurrent_children: 8,
                max_delivery_attempts: 3,
                next_set: 2,
                created_at_ms: 9,
                addressable: false,
            }]
        );
        assert!(reopened.quarantined().unwrap().is_empty());
    }

    /// A schema of a build that wrote call rows of version 1 (before `traceparent`, and before
    /// migration 8): it is migrated, and its calls load as they were, without a trace context.
    #[test]
    fn a_call_row_of_version_1_loads_after_the_migration() {
        let ledger = pg_testkit::fresh();
        let mut call = crate::ledger::conformance::call_row("s", "deleg_old", 2);
        // Version 1 kept no task data.
        call.tasks.iter_mut().for_each(|t| t.input = None);
        assert!(call.traceparent.is_none() && call.tasks.iter().all(|t| t.input.is_none()));
        let v1 = codec::call_row_v1(&call);
        let key = crate::ledger::row_key("s", "deleg_old");
        let reopened = reopened_before_migration(&ledger, 8, CALLS, key, v1);
        assert_eq!(reopened.load().unwrap().calls, vec![call.clone()]);
        assert_eq!(reopened.find_call("deleg_old").unwrap(), Some(call));
        assert!(reopened.quarantined().unwrap().is_empty());
    }

    #[test]
    fn row_values_are_compressed_with_lz4_where_the_server_has_it() {
        let ledger = pg_testkit::fresh();
        let schema = ledger.inner.schema.clone();
        let pool = ledger.inner.pool.clone();
        let (has_lz4, methods) = ledger
            .runtime
            .run(async move {
                let client = pool.get().await.map_err(pool_error)?;
                let has = client
                    .query_one(
                        "SELECT 'lz4' = ANY (enumvals) FROM pg_settings WHERE name = 'default_toast_compression'",
                        &[],
                    )
                    .await
                    .map_err(pg_error("reading the server's compressions"))?
                    .get::<_, bool>(0);
                let rows = client
                    .query(
                        "SELECT c.relname::text, a.attcompression::text FROM pg_attribute a
                         JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE n.nspname = $1 AND a.attname = 'value' AND c.relkind = 'r'",
                        &[&schema],
                    )
                    .await
                    .map_err(pg_error("reading the columns' compression"))?;
                let methods: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
                Ok((has, methods))
            })
            .unwrap();
        assert_eq!(
            methods.len(),
            tables().count(),
            "every table has a value column: {methods:?}"
        );
        let expected = if has_lz4 { "l" } else { "" };
        for (table, method) in &methods {
            assert_eq!(method, expected, "{table}'s values (lz4 on the server: {has_lz4})");
        }
        // A large row round-trips.
        let call = crate::ledger::conformance::call_row("s1", "deleg_big", 3000);
        ledger
            .write(&Writes {
                calls: vec![call.clone()],
                ..Writes::default()
            })
            .unwrap();
        ledger.flush().unwrap();
        assert_eq!(second_view(&ledger).call("s1", "deleg_big").unwrap(), Some(call));
    }

    /// Whether the schema's index of calls by id is there and valid (None: not there).
    fn call_index_valid(ledger: &PgLedger) -> Option<bool> {
        let (pool, schema) = (ledger.inner.pool.clone(), ledger.inner.schema.clone());
        ledger
            .runtime
            .run(async move {
                let client = pool.get().await.map_err(pool_error)?;
                super::super::migrate::call_index_valid(&client, &schema).await
            })
            .unwrap()
    }

    /// The index of calls by id is built outside the migration's transaction, so a schema
    /// whose build of it was interrupted (the index left invalid) or that lacks it gets it at the
    /// next open, and a lookup by call id finds its call all along.
    #[test]
    fn an_index_of_calls_left_invalid_or_missing_is_built_at_the_next_open() {
        let ledger = pg_testkit::fresh();
        let call = crate::ledger::conformance::call_row("s1", "deleg_00000000000000c1", 1);
        ledger
            .write(&Writes {
                calls: vec![call.clone()],
                ..Writes::default()
            })
            .unwrap();
        ledger.flush().unwrap();
        assert_eq!(call_index_valid(&ledger), Some(true), "built at the first open");
        let schema = ledger.inner.schema.clone();
        // As an interrupted CREATE INDEX CONCURRENTLY leaves it.
        pg_testkit::execute(
            &pg_testkit::url(),
            &format!("UPDATE pg_index SET indisvalid = false WHERE indexrelid = '\"{schema}\".{CALL_INDEX}'::regclass"),
        );
        assert_eq!(call_index_valid(&ledger), Some(false));
        assert_eq!(ledger.find_call(&call.call_id).unwrap(), Some(call.clone()));
        let reopened = second_view(&ledger);
        assert_eq!(call_index_valid(&reopened), Some(true), "built again");
        pg_testkit::execute(&pg_testkit::url(), &format!("DROP INDEX \"{schema}\".{CALL_INDEX}"));
        assert_eq!(call_index_valid(&ledger), None);
        let reopened = second_view(&ledger);
        assert_eq!(call_index_valid(&reopened), Some(true), "built where it was missing");
        assert_eq!(reopened.find_call(&call.call_id).unwrap(), Some(call));
    }

    #[test]
    fn reopening_a_schema_applies_nothing_twice() {
        let ledger = pg_testkit::fresh();
        ledger.write(&writes_of("kept")).unwrap();
        ledger.flush().unwrap();
        let again = second_view(&ledger);
        assert_eq!(again.load().unwrap().sessions, vec![session("kept")]);
    }

    #[test]
    fn writes_whose_commit_failed_while_the_server_was_down_are_committed_once_it_is_back() {
        let mut cluster = pg_testkit::Cluster::private();
        let ledger = PgLedger::open_in(&cluster.url(), "brood").unwrap();
        ledger.write(&writes_of("before")).unwrap();
        ledger.flush().unwrap();
        // A crash of the server, not a clean stop.
        cluster.stop();
        ledger.write(&writes_of("during")).unwrap();
        ledger.write(&writes_of("only_then")).unwrap();
        let err = ledger.flush().expect_err("nothing answers");
        assert!(
            format!("{err:?}").to_lowercase().contains("connect") || format!("{err:?}").contains("closed"),
            "{err:?}"
        );
        // A later change of the same key wins over the failed one.
        let mut later = session("during");
        later.next_set = 7;
        ledger
            .write(&Writes {
                sessions: vec![later.clone()],
                ..Writes::default()
            })
            .unwrap();
        cluster.start();
        // The pool's broken connections are replaced: the first flush after may still meet one.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while let Err(e) = ledger.flush() {
            assert!(
                std::time::Instant::now() < deadline,
                "the ledger never recovered: {e:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let mut sessions = ledger.load().unwrap().sessions;
        sessions.sort_by(|a, b| a.session_id.cmp(&b.session_id));
        assert_eq!(
            sessions,
            vec![session("before"), later, session("only_then")],
            "nothing lost, the later write kept"
        );
    }

    #[test]
    fn terminal_rows_whose_commit_was_lost_win_over_the_rows_staged_before_them() {
        let ledger = pg_testkit::fresh();
        let call = CallRow {
            call_id: "deleg_c".into(),
            session_id: "s".into(),
            set: 1,
            mode: Mode::Background,
            forced_sync_reason: None,
            independent_completions: true,
            tasks: vec![Task {
                goal: "g".into(),
                runner_json: "{}".into(),
                group: None,
                timeout_ms: None,
                stall_ms: DEFAULT_STALL_MS,
                rerun_on_recovery: true,
                input: None,
                retry: None,
            }],
            created_at_ms: 0,
            traceparent: None,
            idempotency: None,
        };
        let unit = plan_units(&call.call_id, &call.tasks, true).remove(0);
        let running = ChildRow {
            status: ChildStatus::Running,
            ..crate::recovery::queued_child(&call, &unit, 0)
        };
        let done = ChildRow {
            status: ChildStatus::Succeeded,
            summary: Some("done".into()),
            ..running.clone()
        };
        ledger
            .write(&Writes {
                sessions: vec![session("s")],
                calls: vec![call],
                ..Writes::default()
            })
            .unwrap();
        ledger.flush().unwrap();
        // A running mark staged without a flush, then the child's end recorded in a commit
        // whose answer is lost: both are staged again, the terminal row over the mark.
        ledger
            .write(&Writes {
                children: vec![running],
                ..Writes::default()
            })
            .unwrap();
        ledger.lose_next_commit.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(ledger.record_terminals(vec![done.clone()]).is_err());
        ledger.flush().unwrap();
        assert_eq!(ledger.load().unwrap().children, vec![done]);
    }

    /// A session row with `next_set` as its distinguishing value.
    fn session_at(id: &str, next_set: u64) -> Writes {
        let mut row = session(id);
        row.next_set = next_set;
        Writes {
            sessions: vec![row],
            ..Writes::default()
        }
    }

    /// The stored `next_set` of session `id`, read by another connection.
    fn stored_next_set(ledger: &PgLedger, id: &str) -> Option<u64> {
        second_view(ledger)
            .load()
            .unwrap()
            .sessions
            .into_iter()
            .find(|s| s.session_id == id)
            .map(|s| s.next_set)
    }

    /// A transaction of another connection that holds the row of session `id` `FOR UPDATE`
    /// until the sender it returns is told (or dropped).
    fn lock_session_row(ledger: &PgLedger, id: &str) -> tokio::sync::oneshot::Sender<()> {
        let (locked_tx, locked) = std::sync::mpsc::channel::<()>();
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let (pool, table, key) = (
            ledger.inner.pool.clone(),
            ledger.table(SESSIONS),
            id.as_bytes().to_vec(),
        );
        ledger.runtime.handle.spawn(async move {
            let mut client = pool.get().await.unwrap();
            let tx = client.transaction().await.unwrap();
            tx.query(&format!("SELECT 1 FROM {table} WHERE key = $1 FOR UPDATE"), &[&key])
                .await
                .unwrap();
            locked_tx.send(()).unwrap();
            let _ = released.await;
            tx.rollback().await.unwrap();
        });
        locked.recv().unwrap();
        release
    }

    /// The server process of the commit waiting for a row lock on the sessions table, once
    /// there is one.
    fn backend_waiting_on_sessions(ledger: &PgLedger) -> i32 {
        let pool = ledger.inner.pool.clone();
        let pattern = format!("%{}%", ledger.table(SESSIONS));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let (pool, pattern) = (pool.clone(), pattern.clone());
            let found = ledger
                .runtime
                .run(async move {
                    let client = pool.get().await.map_err(pool_error)?;
                    let row = client
                        .query_opt(
                            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1",
                            &[&pattern],
                        )
                        .await
                        .map_err(pg_error("looking for a waiting commit"))?;
                    Ok(row.map(|r| r.get::<_, i32>(0)))
                })
                .unwrap();
            if let Some(pid) = found {
                return pid;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the commit never waited on the row lock"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Starts a flush on a thread of its own and returns once it waits for a commit in flight.
    fn flush_waiting(ledger: &std::sync::Arc<PgLedger>) -> std::thread::JoinHandle<Result<usize, LedgerError>> {
        let before = ledger.settle_waits.load(std::sync::atomic::Ordering::SeqCst);
        let flushing = {
            let ledger = ledger.clone();
            std::thread::spawn(move || ledger.flush())
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while ledger.settle_waits.load(std::sync::atomic::Ordering::SeqCst) == before {
            assert!(std::time::Instant::now() < deadline, "the flush never waited");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        flushing
    }

    #[test]
    fn a_flush_whose_write_was_in_a_failed_commit_hidden_by_a_newer_write_does_not_return_ok_unwritten() {
        let ledger = std::sync::Arc::new(pg_testkit::fresh());
        ledger.write(&session_at("s", 1)).unwrap();
        ledger.flush().unwrap();
        let release = lock_session_row(&ledger, "s");
        // The second write's commit waits on the row lock.
        ledger.write(&session_at("s", 2)).unwrap();
        let first = {
            let ledger = ledger.clone();
            std::thread::spawn(move || ledger.flush())
        };
        let pid = backend_waiting_on_sessions(&ledger);
        // A flush of the second write, waiting for the commit that holds it; then a newer
        // write of the same key, staged behind that commit.
        let second = flush_waiting(&ledger);
        ledger.write(&session_at("s", 3)).unwrap();
        // The commit holding the second write dies.
        pg_testkit::execute(&pg_testkit::url(), &format!("SELECT pg_terminate_backend({pid})"));
        assert!(first.join().unwrap().is_err(), "its own flush is told");
        release.send(()).unwrap();
        match second.join().unwrap() {
            Ok(_) => assert_eq!(
                stored_next_set(&ledger, "s"),
                Some(3),
                "the flush returned Ok, so the second write (carried by the third) is committed"
            ),
            Err(e) => tracing::info!("the flush failed, as it may: {e}"),
        }
    }

    #[test]
    fn a_flush_whose_staged_write_a_newer_write_replaced_returns_once_that_one_is_committed() {
        let ledger = std::sync::Arc::new(pg_testkit::fresh());
        ledger.write(&session_at("s", 1)).unwrap();
        ledger.flush().unwrap();
        let release = lock_session_row(&ledger, "s");
        ledger.write(&session_at("s", 2)).unwrap();
        let first = {
            let ledger = ledger.clone();
            std::thread::spawn(move || ledger.flush())
        };
        backend_waiting_on_sessions(&ledger);
        // Staged behind the commit in flight: a third write, a flush of it, then a fourth
        // write of the same key that replaces it before anything took it.
        ledger.write(&session_at("s", 3)).unwrap();
        let second = flush_waiting(&ledger);
        ledger.write(&session_at("s", 4)).unwrap();
        release.send(()).unwrap();
        first.join().unwrap().unwrap();
        second.join().unwrap().unwrap();
        assert_eq!(
            stored_next_set(&ledger, "s"),
            Some(4),
            "the third write (carried by the fourth) is committed once the flush returned"
        );
    }

    #[test]
    fn bad_addresses_and_schema_names_are_refused_clearly() {
        let err = PgLedger::open("mysql://nowhere").unwrap_err().to_string();
        assert!(err.contains("postgres://"), "{err}");
        let err = PgLedger::open_in(&pg_testkit::url(), "Bad-Name")
            .unwrap_err()
            .to_string();
        assert!(err.contains("schema name"), "{err}");
        // Nobody listens there: the open fails, it does not hang or panic.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let err = PgLedger::open(&format!("postgres://brood@127.0.0.1:{port}/postgres")).unwrap_err();
        assert!(format!("{err:?}").contains("onnect"), "{err:?}");
    }
}

mod failover;
mod tenures;
