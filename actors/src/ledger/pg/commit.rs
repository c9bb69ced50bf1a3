//! The PostgreSQL ledger's commits: what is staged, taken by up to [`COMMITS_IN_FLIGHT`]
//! transactions at once (never two on one key, see `staging`), each fenced by the session
//! leases first when the database is shared, and staged again when it failed.

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

/// Puts rows (`keys[i]` → `values[i]`) into `tree` in one statement.
pub(super) async fn upsert(
    tx: &tokio_postgres::Transaction<'_>,
    this: &Inner,
    tree: &'static str,
    keys: &[Key],
    values: &[Vec<u8>],
) -> Result<(), LedgerError> {
    tx.execute(
        &format!(
            "INSERT INTO {} (key, value) SELECT * FROM unnest($1::bytea[], $2::bytea[])
             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            this.table(tree)
        ),
        &[&keys, &values],
    )
    .await
    .map_err(pg_error(format!("writing rows to {tree}")))?;
    Ok(())
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
        then: impl for<'t> FnOnce(&'t tokio_postgres::Transaction<'t>, &'t Inner, &'t Fenced) -> Job<'t, T> + Send + 'static,
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
        if this.leases.is_some() {
            sessions.extend(
                taken
                    .rows
                    .iter()
                    .filter_map(|((tree, key), _, _)| key_session(tree, key)),
            );
        }
        let mut rows: Vec<(staging::Slot, Option<Vec<u8>>)> = taken
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
            let tx = client.transaction().await.map_err(pg_error("starting a commit"))?;
            // Fenced first: the rows of a session this process no longer holds are not written.
            let fenced = match &this.leases {
                Some(book) => Fenced(Some(book.check(&tx, sessions).await?)),
                None => Fenced(None),
            };
            if fenced.0.is_some() {
                rows.retain(|((tree, key), _)| key_session(tree, key).is_none_or(|s| fenced.allows(&s)));
            }
            let mut bytes = 0;
            let mut puts: HashMap<&'static str, (Vec<Key>, Vec<Vec<u8>>)> = HashMap::new();
            let mut removes: HashMap<&'static str, Vec<Vec<u8>>> = HashMap::new();
            for ((tree, key), value) in rows {
                match value {
                    Some(value) => {
                        bytes += key.len() + value.len();
                        let (keys, values) = puts.entry(tree).or_default();
                        keys.push(key);
                        values.push(value);
                    }
                    None => removes.entry(tree).or_default().push(key),
                }
            }
            for (tree, keys) in removes {
                tx.execute(
                    &format!("DELETE FROM {} WHERE key = ANY($1)", this.table(tree)),
                    &[&keys],
                )
                .await
                .map_err(pg_error(format!("removing rows from {tree}")))?;
            }
            for (tree, (keys, values)) in puts {
                upsert(&tx, this, tree, &keys, &values).await?;
            }
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
                st = self.committed.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        }
    }
}
