//! The PostgreSQL ledger's reads for listings and probes: a page of stored session ids, the dead
//! letters counted by session, and a bounded round trip to the server. Each is one statement
//! over one key range (or none), whatever the tables hold besides.

use std::time::Duration;

use super::{pg_error, pool_error, PgLedger, SESSIONS};
use crate::ledger::LedgerError;

/// The first key past every key that starts with `prefix`: the prefix with its last byte below
/// 0xff raised, the bytes after it dropped; empty when every byte is 0xff (no such key).
fn past(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while end.last() == Some(&0xff) {
        end.pop();
    }
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    end
}

impl PgLedger {
    /// See [`crate::ledger::Ledger::session_ids`]: the keys of the sessions' table only.
    pub(super) fn session_id_page(
        &self,
        after: Option<&str>,
        prefix: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, LedgerError> {
        self.settle()?;
        let table = self.table(SESSIONS);
        let pool = self.inner.pool.clone();
        let prefix = prefix.unwrap_or("").as_bytes().to_vec();
        let lower = match after {
            Some(a) => {
                let mut k = a.as_bytes().to_vec();
                k.push(0);
                k.max(prefix.clone())
            }
            None => prefix.clone(),
        };
        let end = past(&prefix);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let keys: Vec<Vec<u8>> = self.runtime.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            let rows = if end.is_empty() {
                client
                    .query(
                        &format!("SELECT key FROM {table} WHERE key >= $1 ORDER BY key LIMIT $2"),
                        &[&lower, &limit],
                    )
                    .await
            } else {
                client
                    .query(
                        &format!("SELECT key FROM {table} WHERE key >= $1 AND key < $2 ORDER BY key LIMIT $3"),
                        &[&lower, &end, &limit],
                    )
                    .await
            }
            .map_err(pg_error("reading a page of session ids"))?;
            Ok(rows.into_iter().map(|r| r.get(0)).collect())
        })?;
        Ok(keys.into_iter().filter_map(|k| String::from_utf8(k).ok()).collect())
    }

    /// See [`crate::ledger::Ledger::dead_letter_counts`]: one grouped statement.
    pub(super) fn dead_letters_by_session(&self, first: &str, last: &str) -> Result<Vec<(String, u64)>, LedgerError> {
        self.settle()?;
        let table = self.table(super::DEAD_LETTERS);
        let pool = self.inner.pool.clone();
        let lower = crate::ledger::row_key(first, "");
        let end = past(&crate::ledger::row_key(last, ""));
        let counted: Vec<(Vec<u8>, i64)> = self.runtime.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            let rows = client
                .query(
                    &format!(
                        "SELECT substring(key FROM 1 FOR position('\\x00'::bytea IN key) - 1) AS session, count(*)
                         FROM {table} WHERE key >= $1 AND key < $2 GROUP BY session ORDER BY session"
                    ),
                    &[&lower, &end],
                )
                .await
                .map_err(pg_error("counting dead letters by session"))?;
            Ok(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
        })?;
        Ok(counted
            .into_iter()
            .filter_map(|(s, n)| Some((String::from_utf8(s).ok()?, u64::try_from(n).ok()?)))
            .collect())
    }

    /// How many rows the table of `tree` holds (what this process staged committed first).
    pub(super) fn count_rows(&self, tree: &str) -> Result<u64, LedgerError> {
        self.settle()?;
        let table = self.table(tree);
        let pool = self.inner.pool.clone();
        let n: i64 = self.runtime.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            let row = client
                .query_one(&format!("SELECT count(*) FROM {table}"), &[])
                .await
                .map_err(pg_error("counting rows"))?;
            Ok(row.get(0))
        })?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// See [`crate::ledger::Ledger::ping`]: `SELECT 1`, given up after `timeout` (a connection
    /// that cannot be made counts as no answer).
    pub(super) fn round_trip(&self, timeout: Duration) -> Result<(), LedgerError> {
        let pool = self.inner.pool.clone();
        self.runtime.run(async move {
            let ask = async {
                let client = pool.get().await.map_err(pool_error)?;
                client
                    .simple_query("SELECT 1")
                    .await
                    .map_err(pg_error("asking the database for SELECT 1"))?;
                Ok(())
            };
            match tokio::time::timeout(timeout, ask).await {
                Ok(answer) => answer,
                Err(_) => Err(LedgerError::storage_msg(format!(
                    "the database did not answer SELECT 1 within {} ms",
                    timeout.as_millis()
                ))),
            }
        })
    }
}
