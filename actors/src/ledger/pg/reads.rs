//! The PostgreSQL ledger's reads: rows by key and by range, decoded (an undecodable row moved
//! aside to the quarantine and named damaged), and the snapshot of one session, of many, or of
//! the whole ledger, as recovery reads it.

use tokio_postgres::types::ToSql;

use super::*;

impl PgLedger {
    pub(super) fn table(&self, tree: &str) -> String {
        self.inner.table(tree)
    }

    /// The rows of `tree` whose keys start with `prefix` (all of them for an empty prefix),
    /// in key order, after `after` (exclusive) and at most `limit` when given. A read of every
    /// row of a tree (the dead letters, the quarantine) runs where the reads of whole sessions
    /// do ([`super::Reads`]), off the ledger's thread.
    pub(super) fn range(
        &self,
        tree: &'static str,
        prefix: Vec<u8>,
        after: Option<Vec<u8>>,
        limit: Option<usize>,
    ) -> Result<Vec<(Key, Vec<u8>)>, LedgerError> {
        self.settle()?;
        let table = self.table(tree);
        let (pool, runtime) = if prefix.is_empty() && after.is_none() && limit.is_none() {
            (&self.reads.pool, &self.reads.runtime)
        } else {
            (&self.inner.pool, &self.runtime)
        };
        let pool = pool.clone();
        self.inner.sent(1);
        runtime.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            // The keys starting with `prefix` are those from it up to (not including) the
            // first key past every such key: the prefix with its last byte below 0xff raised,
            // the bytes after it dropped; none when every byte is 0xff.
            let mut end = prefix.clone();
            while end.last() == Some(&0xff) {
                end.pop();
            }
            if let Some(last) = end.last_mut() {
                *last += 1;
            }
            let lower = after.map_or(prefix.clone(), |mut a| {
                a.push(0);
                a.max(prefix.clone())
            });
            let limit = limit.map_or(i64::MAX, |l| i64::try_from(l).unwrap_or(i64::MAX));
            let rows = if end.is_empty() {
                client
                    .query(
                        &format!("SELECT key, value FROM {table} WHERE key >= $1 ORDER BY key LIMIT $2"),
                        &[&lower, &limit],
                    )
                    .await
            } else {
                client
                    .query(
                        &format!("SELECT key, value FROM {table} WHERE key >= $1 AND key < $2 ORDER BY key LIMIT $3"),
                        &[&lower, &end, &limit],
                    )
                    .await
            }
            .map_err(pg_error(format!("reading {tree}")))?;
            Ok(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
        })
    }

    /// One row of `tree` by key.
    pub(super) fn get(&self, tree: &'static str, key: Vec<u8>) -> Result<Option<Vec<u8>>, LedgerError> {
        self.settle()?;
        let table = self.table(tree);
        let pool = self.inner.pool.clone();
        self.inner.sent(1);
        self.runtime.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            let row = client
                .query_opt(&format!("SELECT value FROM {table} WHERE key = $1"), &[&key])
                .await
                .map_err(pg_error(format!("reading {tree}")))?;
            Ok(row.map(|r| r.get(0)))
        })
    }

    pub(super) fn get_row<T: crate::codec::Stored>(
        &self,
        tree: &'static str,
        session_id: &str,
        id: &str,
    ) -> Result<Option<T>, LedgerError> {
        match self.get(tree, row_key(session_id, id))? {
            None => Ok(None),
            Some(v) => decode_at(tree, id.as_bytes(), &v).map(Some),
        }
    }

    /// Reads a tree back (all of it, or one session's rows), quarantining rows that do not
    /// decode or fail their check, as sled's read does.
    pub(super) fn scan<T: crate::codec::Stored + CheckRow>(
        &self,
        tree: &'static str,
        session: Option<&str>,
    ) -> Result<Vec<T>, LedgerError> {
        let rows = match session {
            None => self.range(tree, Vec::new(), None, None)?,
            Some(s) if crate::ledger::rows::is_scoped(tree) => self.range(tree, session_prefix(s), None, None)?,
            Some(s) => self
                .get(tree, s.as_bytes().to_vec())?
                .map(|v| (s.as_bytes().to_vec(), v))
                .into_iter()
                .collect(),
        };
        self.decoded(tree, rows)
    }

    /// Rows of `tree` as read, decoded; those that do not decode or fail their check are
    /// quarantined (those of this process's sessions: see below) and left out.
    pub(super) fn decoded<T: crate::codec::Stored + CheckRow>(
        &self,
        tree: &'static str,
        rows: Vec<(Key, Vec<u8>)>,
    ) -> Result<Vec<T>, LedgerError> {
        Ok(self.decoded_noting(tree, rows)?.0)
    }

    /// [`PgLedger::decoded`], and the keys of the rows it moved aside.
    pub(super) fn decoded_noting<T: crate::codec::Stored + CheckRow>(
        &self,
        tree: &'static str,
        rows: Vec<(Key, Vec<u8>)>,
    ) -> Result<(Vec<T>, Vec<Key>), LedgerError> {
        let mut out = Vec::with_capacity(rows.len());
        let bad = decode_rows(rows.into_iter().map(Ok::<_, LedgerError>), &mut out)?;
        Ok((out, self.set_aside(tree, bad)?))
    }

    /// Moves aside the rows of `tree` that did not decode or failed their check (those of this
    /// process's sessions: see below); the keys of those it moved.
    fn set_aside(&self, tree: &'static str, bad: Vec<Unreadable>) -> Result<Vec<Key>, LedgerError> {
        let mut moved = Vec::new();
        for (k, v, reason) in bad {
            // Shared: a row of a session another process serves is that one's to move aside
            // (it may be of a newer build's format, during a rolling upgrade); skipped here.
            let others = match (&self.inner.tenures, commit::key_session(tree, &k)) {
                (Some(book), Some(session)) => !book.holds(&session),
                _ => false,
            };
            if others {
                tracing::warn!(
                    tree,
                    "a row of a session served by another process could not be read here; left in place: {reason}"
                );
                continue;
            }
            self.move_aside(tree, &k, &v, &reason)?;
            moved.push(k);
        }
        Ok(moved)
    }

    /// [`Fetched`] rows: the readable ones, the others moved aside.
    fn kept<C>(&self, tree: &'static str, (rows, bad): Fetched<C>) -> Result<C, LedgerError> {
        self.set_aside(tree, bad)?;
        Ok(rows)
    }

    /// Moves a raw row aside to the quarantine tables, in one transaction.
    pub(super) fn move_aside(
        &self,
        tree: &'static str,
        key: &[u8],
        value: &[u8],
        reason: &str,
    ) -> Result<(), LedgerError> {
        let (qkey, row) = quarantine_entry(tree, key, value, reason);
        let encoded = encode(QUARANTINE, key, &row)?;
        let (key, value) = (key.to_vec(), value.to_vec());
        let extra = vec![
            (QUARANTINE_RAW, qkey.clone()),
            (QUARANTINE, qkey.clone()),
            (tree, key.to_vec()),
        ];
        self.commit_staged(BTreeSet::new(), extra, move |tx, this, _| {
            Box::pin(async move {
                for (t, v) in [(QUARANTINE_RAW, &value), (QUARANTINE, &encoded)] {
                    tx.execute(
                        &format!(
                            "INSERT INTO {} (key, value) VALUES ($1, $2)
                             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                            this.table(t)
                        ),
                        &[&qkey, v],
                    )
                    .await
                    .map_err(pg_error("quarantining a row"))?;
                }
                tx.execute(&format!("DELETE FROM {} WHERE key = $1", this.table(tree)), &[&key])
                    .await
                    .map_err(pg_error("quarantining a row"))?;
                // Not staged again if the commit fails: the next load quarantines it again.
                Ok(((), Vec::new()))
            })
        })?;
        tracing::error!(
            tree,
            key = %crate::text::printable(&String::from_utf8_lossy(&row.key)),
            "a stored row could not be used and was moved to the quarantine table: {reason}"
        );
        Ok(())
    }

    /// The whole ledger, as [`PgLedger::read_many`] reads sessions: each table in one
    /// statement, all in one round trip, the scoped tables' rows in key order with no sort.
    pub(super) fn read_all(&self) -> Result<Snapshot, LedgerError> {
        self.read_in(Reading::All)
    }

    /// Reads the rows of `sessions` (sorted, each once) back, for a load of one session or of
    /// many, in one statement per table for all of them: the scoped trees' rows range by range
    /// (each an index range scan, see [`range_statements`]), the trees keyed by session id by
    /// their keys, the damaged children by the ranges of their quarantine keys. The statements
    /// go out together on one connection of the reads' own ([`super::Reads`]: received beside the
    /// commits, not on their thread) in one round trip, each its own transaction, and the rows
    /// are decoded on the caller's thread once received. Delivery state is folded in per
    /// session, as a load of each session alone folds it.
    pub(super) fn read_many(&self, sessions: &[String]) -> Result<Snapshot, LedgerError> {
        if sessions.is_empty() {
            return Ok(Snapshot::default());
        }
        self.read_in(Reading::Sessions(sessions))
    }

    /// [`PgLedger::read_many`] of the sessions `reading` names, or of every row stored.
    fn read_in(&self, reading: Reading<'_>) -> Result<Snapshot, LedgerError> {
        self.settle()?;
        // Each session's rows are the keys from `<session>\0` up to `<session>\1`; every row
        // of a table is read by a statement with no range (a key need not be a session's:
        // one written by something else may start with any byte), every damaged child by the
        // keys from `children/` up to `children0`.
        let ranges = |prefix: &[u8]| -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
            match reading {
                Reading::Sessions(sessions) => sessions
                    .iter()
                    .map(|s| {
                        let mut low = prefix.to_vec();
                        low.extend_from_slice(&session_prefix(s));
                        let mut high = low.clone();
                        if let Some(last) = high.last_mut() {
                            *last = 1;
                        }
                        (low, high)
                    })
                    .unzip(),
                Reading::All => {
                    let mut high = prefix.to_vec();
                    if let Some(last) = high.last_mut() {
                        *last += 1;
                    }
                    (vec![prefix.to_vec()], vec![high])
                }
            }
        };
        let (low, high) = ranges(b"");
        let (damaged_low, damaged_high) = ranges(format!("{CHILDREN}/").as_bytes());
        let names: Vec<Vec<u8>> = match reading {
            Reading::Sessions(sessions) => sessions.iter().map(|s| s.as_bytes().to_vec()).collect(),
            Reading::All => Vec::new(),
        };
        let scoped = [ACKS, DEAD_LETTERS, CALLS, CHILDREN, CLAIMS, STARTS].map(|t| (t, self.table(t)));
        let keyed = [SESSIONS, WAKES, NESTS].map(|t| (t, self.table(t)));
        let quarantine = self.table(QUARANTINE);
        let pool = self.reads.pool.clone();
        // The statements, and the setting of the planner around them (made, reset).
        self.inner.sent(scoped.len() + keyed.len() + 1 + 2);
        // A scoped tree's rows, range by range: each range an index scan in key order, the
        // ranges in the (sorted) order given, so every row in key order, with no sort of them
        // all. SQL does not promise that order, so the rows are checked as they come; should
        // they come otherwise, the statement that sorts them all is the one to trust. The
        // planner is told to avoid sorting: a table just filled has no statistics, and with
        // none it would read a range by bitmap and sort it (on disk, for a million rows)
        // before the first row comes.
        #[cfg(test)]
        let within = if self.unordered_reads.load(std::sync::atomic::Ordering::SeqCst) {
            "DESC"
        } else {
            ""
        };
        #[cfg(not(test))]
        let within = "";
        let scoped = scoped.map(|(tree, table)| {
            let sql = match reading {
                Reading::Sessions(_) => range_statements(&table, within).to_vec(),
                Reading::All => vec![every_row_statement(&table)],
            };
            (tree, sql)
        });
        let keyed = keyed.map(|(tree, table)| {
            let sql = match reading {
                Reading::Sessions(_) => keyed_statement(&table),
                Reading::All => every_row_statement(&table),
            };
            (tree, vec![sql])
        });
        let every = matches!(reading, Reading::All);
        // The rows as received (no copy of them); decoded below, on this thread.
        let (acks, dead, calls, children, claims, starts, sessions_rows, wakes, nests, damaged_keys) =
            self.reads.runtime.run(async move {
                let client = pool.get().await.map_err(pool_error)?;
                let read = async {
                    client
                        .batch_execute(READ_SETTINGS)
                        .await
                        .map_err(pg_error("starting a read of many sessions"))?;
                    let client: &tokio_postgres::Client = &client;
                    let ranges: [&(dyn ToSql + Sync); 2] = [&low, &high];
                    let ranges: &[&(dyn ToSql + Sync)] = if every { &[] } else { &ranges };
                    let names: [&(dyn ToSql + Sync); 1] = [&names];
                    let names: &[&(dyn ToSql + Sync)] = if every { &[] } else { &names };
                    let [acks, dead, calls, children, claims, starts] = scoped;
                    let [sessions, wakes, nests] = keyed;
                    let damaged = async {
                        let sql = damaged_statement(&quarantine);
                        let rows = client
                            .query(&sql, &[&damaged_low, &damaged_high])
                            .await
                            .map_err(pg_error("reading the damaged children of many sessions"))?;
                        Ok::<_, LedgerError>(rows.into_iter().map(|r| r.get::<_, Vec<u8>>(0)).collect::<Vec<_>>())
                    };
                    // Every statement at once, pipelined on the connection, and nothing decoded
                    // here: the children's rows follow the calls' at once (the caller decodes
                    // the calls beside the children, once everything came).
                    let (acks, dead, calls, children, claims, starts, sessions, wakes, nests, damaged) = futures::try_join!(
                        fetch(client, acks, ranges),
                        fetch(client, dead, ranges),
                        fetch(client, calls, ranges),
                        fetch(client, children, ranges),
                        fetch(client, claims, ranges),
                        fetch(client, starts, ranges),
                        fetch(client, sessions, names),
                        fetch(client, wakes, names),
                        fetch(client, nests, names),
                        damaged,
                    )?;
                    let read = (
                        acks, dead, calls, children, claims, starts, sessions, wakes, nests, damaged,
                    );
                    client
                        .batch_execute(READ_RESET)
                        .await
                        .map_err(pg_error("ending a read of many sessions"))?;
                    Ok::<_, LedgerError>(read)
                }
                .await;
                if read.is_err() {
                    // Its setting may still be in force: the connection is closed, not
                    // given back to the pool.
                    drop(deadpool_postgres::Object::take(client));
                }
                read
            })?;
        let acks: Vec<AckRow> = self.kept(ACKS, decoded_rows(&acks))?;
        let dead: Vec<DeadLetterRow> = self.kept(DEAD_LETTERS, decoded_rows(&dead))?;
        let (calls, (mut children, unreadable)): (Fetched<Vec<CallRow>>, Fetched<ChildRuns>) =
            decoded_beside(&calls, &children);
        let calls = self.kept(CALLS, calls)?;
        let moved = self.set_aside(CHILDREN, unreadable)?;
        // The quarantine was read beside the children: those this read moved aside are damaged
        // too, each named once (a row damaged again replaced its earlier quarantine entry).
        let mut damaged: Vec<String> = damaged_keys.iter().map(|k| damaged_child(k)).collect();
        let aside = format!("{CHILDREN}/").into_bytes();
        let named: HashSet<&[u8]> = damaged_keys
            .iter()
            .filter_map(|k| k.strip_prefix(aside.as_slice()))
            .collect();
        for key in moved.iter().filter(|k| !named.contains(k.as_slice())) {
            damaged.push(child_of_row_key(key));
        }
        let claims: Vec<ClaimRow> = self.kept(CLAIMS, decoded_rows(&claims))?;
        let starts: Vec<StartRow> = self.kept(STARTS, decoded_rows(&starts))?;
        fold_delivery_by_session(&mut children, &acks, &dead);
        let acked: HashSet<(&str, &str)> = acks
            .iter()
            .map(|a| (a.session_id.as_str(), a.claim_id.as_str()))
            .collect();
        let claims = claims
            .into_iter()
            .filter(|c| !acked.contains(&(c.session_id.as_str(), c.claim_id.as_str())))
            .collect();
        Ok(Snapshot {
            sessions: self.kept(SESSIONS, decoded_rows(&sessions_rows))?,
            calls,
            children,
            claims,
            starts,
            damaged_children: damaged,
            wakes: self.kept(WAKES, decoded_rows(&wakes))?,
            nests: self.kept(NESTS, decoded_rows(&nests))?,
        })
    }

    /// [`Ledger::oldest_rows`] of up to [`LOAD_CHUNK`] sessions: the first call and the first
    /// ack row of each session's key range (an index range scan each, one row), two
    /// statements sent together.
    pub(super) fn oldest_of(&self, sessions: &[String]) -> Result<Vec<OldestRows>, LedgerError> {
        if sessions.is_empty() {
            return Ok(Vec::new());
        }
        self.settle()?;
        let (low, high): (Vec<Vec<u8>>, Vec<Vec<u8>>) = sessions
            .iter()
            .map(|s| {
                let low = session_prefix(s);
                let mut high = low.clone();
                if let Some(last) = high.last_mut() {
                    *last = 1;
                }
                (low, high)
            })
            .unzip();
        let index: Vec<i32> = (0..sessions.len()).map(|i| i as i32).collect();
        let tables = [CALLS, ACKS].map(|t| (t, self.table(t)));
        let pool = self.inner.pool.clone();
        self.inner.sent(tables.len());
        let mut found = self.runtime.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            let client = &client;
            let (index, low, high) = (&index, &low, &high);
            futures::future::try_join_all(tables.iter().map(|(tree, table)| async move {
                let sql = format!(
                    "SELECT r.i, f.key, f.value FROM unnest($1::int4[], $2::bytea[], $3::bytea[]) AS r(i, low, high)
                     CROSS JOIN LATERAL (SELECT t.key, t.value FROM {table} t
                         WHERE t.key >= r.low AND t.key < r.high ORDER BY t.key LIMIT 1) f"
                );
                let rows = client
                    .query(&sql, &[index, low, high])
                    .await
                    .map_err(pg_error(format!("reading the oldest {tree} of many sessions")))?;
                Ok::<_, LedgerError>(
                    rows.into_iter()
                        .map(|r| {
                            (
                                r.get::<_, i32>(0) as usize,
                                r.get::<_, Vec<u8>>(1),
                                r.get::<_, Vec<u8>>(2),
                            )
                        })
                        .collect::<Vec<_>>(),
                )
            }))
            .await
        })?;
        let mut out: Vec<OldestRows> = sessions
            .iter()
            .map(|s| OldestRows {
                session_id: s.clone(),
                call: None,
                ack: None,
            })
            .collect();
        let acks = found.pop().unwrap_or_default();
        let calls = found.pop().unwrap_or_default();
        for (i, k, v) in calls {
            if let Some(o) = out.get_mut(i) {
                o.call = Some(decode_at(CALLS, &k, &v)?);
            }
        }
        for (i, k, v) in acks {
            if let Some(o) = out.get_mut(i) {
                o.ack = Some(decode_at(ACKS, &k, &v)?);
            }
        }
        Ok(out)
    }

    /// Decoded rows of a key range, an undecodable one an error (as sled's point reads).
    pub(super) fn rows_in<T: crate::codec::Stored>(
        &self,
        tree: &'static str,
        prefix: Vec<u8>,
        after: Option<Vec<u8>>,
        limit: Option<usize>,
    ) -> Result<Vec<T>, LedgerError> {
        self.range(tree, prefix, after, limit)?
            .into_iter()
            .map(|(k, v)| decode_at(tree, &k, &v))
            .collect()
    }
}

/// What a read of sessions reads ([`PgLedger::read_in`]).
#[derive(Debug, Clone, Copy)]
enum Reading<'a> {
    /// The rows of these sessions (sorted, each once).
    Sessions(&'a [String]),
    /// Every row stored, of whatever session.
    All,
}

/// The rows a read receives in one piece: a large read's rows are kept in pieces as they come,
/// never grown and copied as a million of them arrive.
const PIECE: usize = 1 << 14;

/// A statement's rows as received, in pieces of [`PIECE`] rows, in order.
pub(super) type Received = Vec<Vec<tokio_postgres::Row>>;

/// What a read of many sessions sets on its connection while it reads: no sort of every row
/// read (see [`range_statements`]). Set on the connection, not in a transaction around the
/// read's statements: each statement holds its table only while it runs, as each of its own
/// transaction, so a change of the schema (a newer build's migration) that locks the tables in
/// another order waits for it or it for the change, and neither is ended as a deadlock.
pub(super) const READ_SETTINGS: &str = "SET enable_sort = off";

/// What a read of many sessions resets once it read everything ([`READ_SETTINGS`]); a read that
/// failed closes its connection instead.
const READ_RESET: &str = "RESET enable_sort";

/// The statements that read the rows of `table` (columns `key, value`) in the key ranges
/// `$1..$2`, in key order: first range by range, each an index scan in key order, the ranges
/// in the order given (`within` a range: `""`, or `"DESC"` for tests), with no sort of the rows
/// at all; then, trusted, the same with its rows sorted. Both read each range by an index range
/// scan under [`READ_SETTINGS`]: a join of the ranges with the table that sorts, with sorting
/// avoided, is planned as a scan of the whole table in key order, each row tested against every
/// range (a million rows times a thousand ranges). The subquery's own `ORDER BY` keeps it from
/// being merged into such a join.
pub(super) fn range_statements(table: &str, within: &str) -> [String; 2] {
    let ranges = format!(
        "SELECT f.key, f.value FROM unnest($1::bytea[], $2::bytea[]) AS r(low, high)
         CROSS JOIN LATERAL (SELECT t.key, t.value FROM {table} t
             WHERE t.key >= r.low AND t.key < r.high ORDER BY t.key {within}) f"
    );
    let sorted = format!("{ranges} ORDER BY f.key");
    [ranges, sorted]
}

/// The statement that reads the rows of `table` (keyed by session id) of the sessions `$1`,
/// in key order.
pub(super) fn keyed_statement(table: &str) -> String {
    format!("SELECT key, value FROM {table} WHERE key = ANY($1) ORDER BY key")
}

/// The statement that reads every row of `table`, in key order: by its index under
/// [`READ_SETTINGS`], not sorted.
pub(super) fn every_row_statement(table: &str) -> String {
    format!("SELECT key, value FROM {table} ORDER BY key")
}

/// The statement that reads the keys of the quarantine table `table` in the key ranges
/// `$1..$2`, range by range (as [`range_statements`] reads them: by an index range scan each,
/// under [`READ_SETTINGS`]). Their order is not relied on.
pub(super) fn damaged_statement(table: &str) -> String {
    format!(
        "SELECT f.key FROM unnest($1::bytea[], $2::bytea[]) AS r(low, high)
         CROSS JOIN LATERAL (SELECT t.key FROM {table} t
             WHERE t.key >= r.low AND t.key < r.high ORDER BY t.key) f"
    )
}

/// A row that does not decode or fails its check: its key, its bytes, and why.
type Unreadable = (Key, Vec<u8>, String);

/// A statement's rows decoded (into `C`: a vector, or [`ChildRuns`]), and those that were not
/// readable (moved aside by the caller, outside the ledger's runtime).
pub(super) type Fetched<C> = (C, Vec<Unreadable>);

/// Runs the statements `sql` of `tree` (their columns `key, value`) in turn until one answers
/// in key order (the last is trusted: it sorts), and takes its rows as received, without
/// copying them out of the connection's buffers. They are decoded by the caller, on its own
/// thread ([`decoded_rows`]): the thread receiving them receives every large read (a start, an
/// owner's rebuild, a sweep taking sessions over), which the decoding of one must not hold up.
async fn fetch(
    client: &tokio_postgres::Client,
    (tree, sql): (&'static str, Vec<String>),
    params: &[&(dyn ToSql + Sync)],
) -> Result<Received, LedgerError> {
    use futures::TryStreamExt;
    let what = || format!("reading {tree} of many sessions");
    let mut statements = sql.iter().peekable();
    while let Some(sql) = statements.next() {
        let trusted = statements.peek().is_none();
        let stream = client
            .query_raw(sql.as_str(), params.iter().copied())
            .await
            .map_err(pg_error(what()))?;
        futures::pin_mut!(stream);
        let mut rows: Received = Vec::new();
        let mut in_order = true;
        while let Some(row) = stream.try_next().await.map_err(pg_error(what()))? {
            let last = rows.last().and_then(|piece| piece.last());
            if !trusted && last.is_some_and(|last| row.get::<_, &[u8]>(0) <= last.get::<_, &[u8]>(0)) {
                // The rest of this answer is dropped (the connection skips it).
                in_order = false;
                break;
            }
            match rows.last_mut() {
                Some(piece) if piece.len() < PIECE => piece.push(row),
                // The first piece grows as rows come (most statements answer a few); the
                // others are made whole, once a piece is full.
                full => {
                    let mut piece = Vec::with_capacity(if full.is_some() { PIECE } else { 0 });
                    piece.push(row);
                    rows.push(piece);
                }
            }
        }
        if in_order {
            return Ok(rows);
        }
        tracing::debug!(
            tree,
            "rows read range by range came out of key order; read again, sorted"
        );
    }
    Ok(Vec::new())
}

/// Rows as [`fetch`] took them (columns `key, value`), decoded, in the order received; those
/// that do not decode or fail their check set apart with their bytes. Many rows are decoded a
/// share per core ([`crate::parallel::threads_for`]): a large session's million children are
/// read before any is decoded, so the other cores are free by then.
fn decoded_rows<C: RowSink + Send>(received: &Received) -> Fetched<C>
where
    C::Row: crate::codec::Stored + CheckRow,
{
    let rows = received.iter().map(Vec::len).sum();
    decoded_rows_in(received, crate::parallel::threads_for(rows, rows))
}

/// The calls' rows and the children's, decoded at once: the calls on a thread of their own
/// (made here, so it keeps this thread's priority: an owner's rebuild reads at a lowered one)
/// when the children are many enough to be decoded a share per core, else one after the other
/// on this thread.
fn decoded_beside<A, B>(calls: &Received, children: &Received) -> (Fetched<A>, Fetched<B>)
where
    A: RowSink + Send,
    B: RowSink + Send,
    A::Row: crate::codec::Stored + CheckRow,
    B::Row: crate::codec::Stored + CheckRow,
{
    let rows: usize = children.iter().map(Vec::len).sum();
    let parts = crate::parallel::threads_for(rows, rows);
    if parts == 1 || crate::failpoints::fires("decode_thread_refused") {
        return (decoded_rows_in(calls, 1), decoded_rows_in(children, parts));
    }
    std::thread::scope(|scope| {
        let beside = std::thread::Builder::new()
            .name("brood-decode".into())
            .spawn_scoped(scope, || decoded_rows_in(calls, 1));
        let children = decoded_rows_in(children, parts);
        let calls = match beside {
            Ok(t) => t.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            Err(_) => decoded_rows_in(calls, 1),
        };
        (calls, children)
    })
}

/// [`decoded_rows`] in `parts` shares of consecutive rows (about as many rows each), each on a
/// thread of its own but the first; joined in order.
pub(super) fn decoded_rows_in<C: RowSink + Send>(received: &[Vec<tokio_postgres::Row>], parts: usize) -> Fetched<C>
where
    C::Row: crate::codec::Stored + CheckRow,
{
    let total: usize = received.iter().map(Vec::len).sum();
    let share = total.div_ceil(parts.max(1)).max(1);
    // Each share: the pieces of rows it decodes, `share` rows in all (the last fewer).
    let mut shares: Vec<Vec<&[tokio_postgres::Row]>> = Vec::new();
    let mut left = 0;
    for piece in received {
        let mut rest = piece.as_slice();
        while !rest.is_empty() {
            if left == 0 {
                shares.push(Vec::new());
                left = share;
            }
            let (now, later) = rest.split_at(left.min(rest.len()));
            shares.last_mut().expect("a share was made").push(now);
            left -= now.len();
            rest = later;
        }
    }
    let mut out = (C::with_room(total), Vec::new());
    let Some((first, shares)) = shares.split_first() else {
        return out;
    };
    let rest = std::thread::scope(|scope| {
        // A share no thread could be made for (the system is out of them) is decoded here.
        let others: Vec<_> = shares
            .iter()
            .map(|rows| {
                if crate::failpoints::fires("decode_thread_refused") {
                    return Err(rows);
                }
                std::thread::Builder::new()
                    .name("brood-decode".into())
                    .spawn_scoped(scope, move || decoded_share(rows))
                    .map_err(|_| rows)
            })
            .collect();
        for rows in first {
            decode_into(rows, &mut out);
        }
        others
            .into_iter()
            .map(|share| match share {
                Ok(t) => t.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                Err(rows) => decoded_share(rows),
            })
            .collect::<Vec<_>>()
    });
    for (rows, mut bad) in rest {
        out.0.put_all(rows);
        out.1.append(&mut bad);
    }
    out
}

/// A share of [`decoded_rows_in`], decoded.
fn decoded_share<C: RowSink>(received: &[&[tokio_postgres::Row]]) -> Fetched<C>
where
    C::Row: crate::codec::Stored + CheckRow,
{
    let mut decoded = (C::with_room(received.iter().map(|r| r.len()).sum()), Vec::new());
    for rows in received {
        decode_into(rows, &mut decoded);
    }
    decoded
}

/// Decodes `received` onto the end of `out`.
fn decode_into<C: RowSink>(received: &[tokio_postgres::Row], out: &mut Fetched<C>)
where
    C::Row: crate::codec::Stored + CheckRow,
{
    for row in received {
        let value: &[u8] = row.get(1);
        match decode_checked::<C::Row>(value) {
            Ok(decoded) => out.0.put(decoded),
            Err(reason) => out.1.push((row.get::<_, Vec<u8>>(0), value.to_vec(), reason)),
        }
    }
}

/// The id of the child a quarantine key of a child row names (`children/<session>\0<id>`).
pub(super) fn damaged_child(key: &[u8]) -> String {
    child_of_row_key(&key[(CHILDREN.len() + 1).min(key.len())..])
}

/// The id of the child a child row's key names (`<session>\0<id>`).
fn child_of_row_key(key: &[u8]) -> String {
    let id = key.iter().position(|&b| b == 0).map_or(key, |nul| &key[nul + 1..]);
    String::from_utf8_lossy(id).into_owned()
}

/// Folds delivery state into the children of many sessions as [`fold_delivery`] folds it into
/// one session's: each session's children take only its own ack rows and dead letters.
pub(super) fn fold_delivery_by_session(children: &mut ChildRuns, acks: &[AckRow], dead: &[DeadLetterRow]) {
    if acks.is_empty() && dead.is_empty() {
        return;
    }
    let mut acks_of: HashMap<&str, Vec<AckRow>> = HashMap::new();
    for a in acks {
        acks_of.entry(&a.session_id).or_default().push(a.clone());
    }
    let mut dead_of: HashMap<&str, Vec<DeadLetterRow>> = HashMap::new();
    for d in dead {
        dead_of.entry(&d.session_id).or_default().push(d.clone());
    }
    // Rows come in key order: each session's children are consecutive runs (a run is of one
    // session), folded together.
    let mut runs = children.runs_mut().peekable();
    while let Some(first) = runs.next() {
        let Some(session) = first.first().map(|c| c.session_id.clone()) else {
            continue;
        };
        let mut group = vec![first];
        while let Some(next) = runs.next_if(|r| r.first().is_some_and(|c| c.session_id == session)) {
            group.push(next);
        }
        let (a, d) = (acks_of.get(session.as_str()), dead_of.get(session.as_str()));
        if a.is_some() || d.is_some() {
            let rows = group.into_iter().flat_map(|run| run.iter_mut());
            fold_delivery(rows, a.map_or(&[], Vec::as_slice), d.map_or(&[], Vec::as_slice));
        }
    }
}
