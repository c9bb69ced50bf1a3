//! Tests of the PostgreSQL ledger: the conformance suite, and its own behaviours.

use super::PgLedger;

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

    pub(super) fn writes_of(id: &str) -> Writes {
        Writes {
            sessions: vec![session(id)],
            ..Writes::default()
        }
    }

    /// The same schema opened a second time: another process's view of the database.
    pub(super) fn second_view(ledger: &PgLedger) -> PgLedger {
        PgLedger::open_in(&pg_testkit::url(), &ledger.inner.schema).unwrap()
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

/// Runs SQL (`{schema}` is the ledger's) on one of the ledger's own connections, beside its
/// reads and writes (what a paused process cannot stop).
fn sql(ledger: &PgLedger, statement: &str) {
    let pool = ledger.inner.pool.clone();
    let statement = statement.replace("{schema}", &ledger.inner.schema);
    ledger
        .runtime
        .run(async move {
            let client = pool.get().await.map_err(super::pool_error)?;
            client
                .batch_execute(&statement)
                .await
                .map_err(super::pg_error("test SQL"))
        })
        .unwrap();
}

/// Another connection's transaction, on the database at `url`, that runs `statements`
/// (`{schema}` is the ledger's) and stays open until the returned sender is told, then
/// commits: locks it takes, and rows it writes, are held until then.
fn held_open(
    ledger: &PgLedger,
    url: &str,
    statements: &str,
) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let (ran_tx, ran) = std::sync::mpsc::channel::<()>();
    let (go_tx, go) = tokio::sync::oneshot::channel::<()>();
    let (url, sql) = (url.to_string(), statements.replace("{schema}", &ledger.inner.schema));
    let held = ledger.runtime.handle.spawn(async move {
        let (mut client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        let tx = client.transaction().await.unwrap();
        tx.batch_execute(&sql).await.unwrap();
        ran_tx.send(()).unwrap();
        let _ = go.await;
        tx.commit().await.unwrap();
    });
    ran.recv().unwrap();
    (go_tx, held)
}

mod failover;
mod reads;
mod tenures;
mod work_list;
