//! The PostgreSQL ledger's commits: what is staged, taken by up to [`COMMITS_IN_FLIGHT`]
//! transactions at once (never two on one key, see `staging`), each fenced by the session
//! tenures first when the database is shared, and staged again when it failed.

use futures::future::BoxFuture;
use tokio_postgres::types::ToSql;

use super::*;

/// What a commit's fencing check found: the sessions it may write (all, when the process does
/// not share the database).
pub(super) struct Fenced(Option<std::collections::HashSet<String>>);

impl Fenced {
    pub(super) fn allows(&self, session_id: &str) -> bool {
        self.0.as_ref().is_none_or(|ok| ok.contains(session_id))
    }
}

/// The session a stored key of `tree` belongs to (none for brood's own tables).
pub(super) fn key_session(tree: &str, key: &[u8]) -> Option<String> {
    if !crate::ledger::ROW_TREES.contains(&tree) {
        return None;
    }
    let id = if crate::ledger::rows::is_scoped(tree) {
        &key[..key.iter().position(|&b| b == 0).unwrap_or(key.len())]
    } else {
        key
    };
    Some(String::from_utf8_lossy(id).into_owned())
}

/// The statement `sql`, prepared once per connection (`what` names it in an error).
pub(super) async fn prepared(tx: &Tx<'_>, sql: &str, what: &str) -> Result<tokio_postgres::Statement, LedgerError> {
    tx.prepare_cached(sql).await.map_err(pg_error(what))
}

/// Puts rows (`keys[i]` → `values[i]`, byte arrays) into `tree` in one statement (prepared
/// once per connection).
pub(super) async fn upsert(
    tx: &Tx<'_>,
    this: &Inner,
    tree: &'static str,
    keys: &(dyn ToSql + Sync),
    values: &(dyn ToSql + Sync),
) -> Result<(), LedgerError> {
    let sql = format!(
        "INSERT INTO {} (key, value) SELECT * FROM unnest($1::bytea[], $2::bytea[])
         ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
        this.table(tree)
    );
    let what = format!("writing rows to {tree}");
    let statement = prepared(tx, &sql, &what).await?;
    tx.execute(&statement, &[keys, values]).await.map_err(pg_error(what))?;
    Ok(())
}

/// Keys and values of rows to put in one table.
type Columns<'a> = (Vec<&'a [u8]>, Vec<&'a [u8]>);

/// Writes a commit's rows (removals and puts, a statement per table), every statement sent at
/// once: one round trip for them all. Staged rows hold one change per key, so their order does
/// not matter. The bytes put.
async fn write_rows(
    tx: &Tx<'_>,
    this: &Inner,
    rows: &[&(staging::Slot, Option<Vec<u8>>)],
) -> Result<usize, LedgerError> {
    let kept = kept_terminal(tx, this, rows).await?;
    let mut bytes = 0;
    let mut puts: HashMap<&'static str, Columns<'_>> = HashMap::new();
    let mut removes: HashMap<&'static str, Vec<&[u8]>> = HashMap::new();
    for ((tree, key), value) in rows {
        if *tree == CHILDREN && kept.contains(key.as_slice()) {
            continue;
        }
        match value {
            Some(value) => {
                bytes += key.len() + value.len();
                let (keys, values) = puts.entry(*tree).or_default();
                keys.push(key);
                values.push(value);
            }
            None => removes.entry(*tree).or_default().push(key),
        }
    }
    let removals = removes.into_iter().map(|(tree, keys)| async move {
        let sql = format!("DELETE FROM {} WHERE key = ANY($1)", this.table(tree));
        let what = format!("removing rows from {tree}");
        let statement = prepared(tx, &sql, &what).await?;
        tx.execute(&statement, &[&keys]).await.map_err(pg_error(what))?;
        Ok::<(), LedgerError>(())
    });
    let puts = puts
        .into_iter()
        .map(|(tree, (keys, values))| async move { upsert(tx, this, tree, &keys, &values).await });
    let statements: Vec<BoxFuture<'_, Result<(), LedgerError>>> = removals
        .map(|f| Box::pin(f) as _)
        .chain(puts.map(|f| Box::pin(f) as _))
        .collect();
    futures::future::try_join_all(statements).await?;
    Ok(bytes)
}

/// The keys of the children's rows among `rows` that would move an ended child back: their
/// stored rows (read under a row lock, so a recording beside this commit waits) are ended and
/// the staged ones are not, so they are not written ([`child_write`]; each is reported). Only
/// unended rows are looked up: a commit without one reads nothing.
async fn kept_terminal<'a>(
    tx: &Tx<'_>,
    this: &Inner,
    rows: &[&'a (staging::Slot, Option<Vec<u8>>)],
) -> Result<HashSet<&'a [u8]>, LedgerError> {
    let mut unended: HashMap<&'a [u8], ChildRow> = HashMap::new();
    for ((tree, key), value) in rows.iter().copied() {
        if *tree != CHILDREN {
            continue;
        }
        if let Some(row) = value.as_ref().and_then(|v| codec::decode::<ChildRow>(v).ok()) {
            if !row.status.is_terminal() {
                unended.insert(key.as_slice(), row);
            }
        }
    }
    let mut kept = HashSet::new();
    if unended.is_empty() {
        return Ok(kept);
    }
    let what = "reading children's rows";
    let sql = format!(
        "SELECT key, value FROM {} WHERE key = ANY($1) FOR UPDATE",
        this.table(CHILDREN)
    );
    let select = prepared(tx, &sql, what).await?;
    let keys: Vec<&[u8]> = unended.keys().copied().collect();
    let found = tx.query(&select, &[&keys]).await.map_err(pg_error(what))?;
    for r in found {
        let key: Vec<u8> = r.get(0);
        let value: Vec<u8> = r.get(1);
        let Some(stored) = codec::decode::<ChildRow>(&value).ok() else {
            continue;
        };
        if let Some((&k, row)) = unended.get_key_value(key.as_slice()) {
            if child_write(Some((stored.status, stored.attempt)), (row.status, row.attempt)) == ChildWrite::KeepTerminal
            {
                report_kept(stored.status, row);
                kept.insert(k);
            }
        }
    }
    Ok(kept)
}

impl PgLedger {
    pub(super) fn staging(&self) -> std::sync::MutexGuard<'_, staging::Staging> {
        self.staging.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Commits what is staged that no commit in flight holds (and `then`'s statements, which
    /// write the keys `extra`, in the same transaction); returns the bytes written and what
    /// `then` answered. Up to [`COMMITS_IN_FLIGHT`] run at once, never two on one key.
    pub(super) fn commit_staged<T: Send + 'static>(
        &self,
        writes_to: BTreeSet<String>,
        extra: Vec<staging::Slot>,
        then: impl for<'t> FnOnce(&'t Tx<'t>, &'t Inner, &'t Fenced) -> Job<'t, T> + Send + 'static,
    ) -> Result<(usize, T), LedgerError> {
        let taken = {
            let mut st = self.staging();
            while !st.can_start(&extra, COMMITS_IN_FLIGHT) {
                st = self.committed.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            st.take(&extra)
        };
        let this = self.inner.clone();
        let mut sessions = writes_to;
        if this.tenures.is_some() {
            sessions.extend(
                taken
                    .rows
                    .iter()
                    .filter_map(|((tree, key), _, _)| key_session(tree, key)),
            );
        }
        let rows: Vec<(staging::Slot, Option<Vec<u8>>)> = taken
            .rows
            .iter()
            .map(|(slot, _, v)| (slot.clone(), v.clone()))
            .collect();
        #[cfg(test)]
        let lose = self.lose_next_commit.swap(false, std::sync::atomic::Ordering::SeqCst);
        #[cfg(not(test))]
        let lose = false;
        // The error, with what `then` wrote when it got as far as the commit.
        type Failed = (LedgerError, Vec<Change>);
        let committed: Result<Result<(usize, T), Failed>, LedgerError> = self.runtime.run(async move {
            let this = &*this;
            let mut client = this.pool.get().await.map_err(pool_error)?;
            // Sessions found lost by an earlier attempt of this commit: their rows are left out,
            // and they are not checked again (a session found lost is told once).
            let mut lost: HashSet<String> = HashSet::new();
            let (tx, fenced, bytes) = loop {
                this.sent(1);
                let tx = client.transaction().await.map_err(pg_error("starting a commit"))?;
                let mine: Vec<&(staging::Slot, Option<Vec<u8>>)> = rows
                    .iter()
                    .filter(|((tree, key), _)| key_session(tree, key).is_none_or(|s| !lost.contains(&s)))
                    .collect();
                // The tenure check and the rows go out together, in one round trip: the check
                // holds the tenures it found (FOR SHARE) until the commit ends, and the rows of
                // a session it did not find are taken back (the transaction is rolled back and
                // written again without them) before anything commits.
                let checked: BTreeSet<String> = sessions.iter().filter(|s| !lost.contains(*s)).cloned().collect();
                let check = async {
                    match &this.tenures {
                        Some(book) => book.check(&tx, checked.clone()).await.map(|ok| Fenced(Some(ok))),
                        None => Ok(Fenced(None)),
                    }
                };
                let (fenced, written) = futures::join!(check, write_rows(&tx, this, &mine));
                let (fenced, written) = match (fenced, written) {
                    // A failed write aborts the transaction, and a check sent after it fails
                    // for that: the write's error is the one to report.
                    (Err(_), Err(e)) => return Err(e),
                    (fenced, written) => (fenced?, written),
                };
                let refused = mine
                    .iter()
                    .filter_map(|((tree, key), _)| key_session(tree, key))
                    .any(|s| !fenced.allows(&s));
                if !refused {
                    break (tx, fenced, written?);
                }
                lost.extend(checked.into_iter().filter(|s| !fenced.allows(s)));
            };
            let (answer, written) = then(&tx, this, &fenced).await?;
            if lose {
                drop(tx);
                return Ok(Err((
                    LedgerError::storage_msg("the commit's answer was lost (test)"),
                    written,
                )));
            }
            Ok(match tx.commit().await {
                Ok(()) => Ok((bytes, answer)),
                Err(e) => Err((pg_error("committing")(e), written)),
            })
        });
        let (e, written) = match committed {
            Ok(Ok(done)) => {
                self.staging().finish(taken, None);
                self.committed.notify_all();
                return Ok(done);
            }
            Ok(Err(failed)) => failed,
            Err(e) => (e, Vec::new()),
        };
        // Not known to be committed (the server may have gone mid-commit): staged again, with
        // what `then` wrote over it (it came later in the transaction), and under what was
        // staged since, so the next flush writes them, as sled's next flush writes what a
        // failed one left in memory. A later change of a key wins.
        let written = written
            .into_iter()
            .map(|(tree, key, value)| ((tree, key), value))
            .collect();
        self.staging().finish(taken, Some(written));
        self.committed.notify_all();
        Err(e)
    }

    /// Returns once every write made before it is committed (committing what it must itself,
    /// or waiting for commits in flight that took it); the bytes its own commits wrote.
    pub(super) fn settle(&self) -> Result<usize, LedgerError> {
        let mut bytes = 0;
        let mut st = self.staging();
        let mark = st.mark();
        loop {
            if st.settled(mark) {
                return Ok(bytes);
            }
            if st.takeable_below(mark) && st.can_start(&[], COMMITS_IN_FLIGHT) {
                drop(st);
                let (b, ()) = self.commit_staged(BTreeSet::new(), Vec::new(), |_, _, _| {
                    Box::pin(async { Ok(((), Vec::new())) })
                })?;
                bytes += b;
                st = self.staging();
            } else {
                #[cfg(test)]
                self.settle_waits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                st = self.committed.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        }
    }
}
