//! The shared list of children waiting for outside workers (see
//! [`crate::ledger::WorkDirectory`]): a table `work_directory(child_id, queue, address,
//! posted_at)`. Posts and withdrawals of one process are applied in the order they were made,
//! by one task on the ledger's runtime (a withdrawal overtaking the post after it would hide a
//! waiting child); a taker deletes the row it takes, `FOR UPDATE SKIP LOCKED`.

use std::sync::Arc;

use deadpool_postgres::Pool;
use tokio::sync::mpsc;

use super::{pg_error, pool_error, LedgerError};

/// One change of the list.
#[derive(Debug)]
enum Change {
    Post { child_id: String, queue: String },
    Withdraw { child_id: String },
}

/// A process's view of the shared list.
#[derive(Debug)]
pub(super) struct PgDirectory {
    table: String,
    address: String,
    pool: Pool,
    changes: mpsc::UnboundedSender<Change>,
    runtime: tokio::runtime::Handle,
}

/// Changes applied together, at most this many in one transaction.
const BATCH: usize = 512;

impl PgDirectory {
    pub(super) fn start(schema: &str, address: String, pool: Pool, runtime: tokio::runtime::Handle) -> Arc<Self> {
        let table = format!("\"{schema}\".work_directory");
        let (changes, mut rx) = mpsc::unbounded_channel::<Change>();
        let (apply_table, apply_pool, apply_address) = (table.clone(), pool.clone(), address.clone());
        runtime.spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                while batch.len() < BATCH {
                    match rx.try_recv() {
                        Ok(c) => batch.push(c),
                        Err(_) => break,
                    }
                }
                if let Err(e) = apply(&apply_pool, &apply_table, &apply_address, &batch).await {
                    // The list is advisory: a child not listed is still handed out by its own
                    // process's polls, and a stale entry is dropped by its taker.
                    tracing::warn!(changes = batch.len(), "updating the shared work list failed: {e}");
                }
            }
        });
        Arc::new(PgDirectory {
            table,
            address,
            pool,
            changes,
            runtime,
        })
    }
}

/// Applies changes in order, in one transaction.
async fn apply(pool: &Pool, table: &str, address: &str, batch: &[Change]) -> Result<(), LedgerError> {
    let mut client = pool.get().await.map_err(pool_error)?;
    let tx = client
        .transaction()
        .await
        .map_err(pg_error("updating the shared work list"))?;
    for change in batch {
        match change {
            Change::Post { child_id, queue } => tx
                .execute(
                    &format!(
                        "INSERT INTO {table} (child_id, queue, address, posted_at) VALUES ($1, $2, $3, now())
                         ON CONFLICT (child_id) DO UPDATE SET queue = EXCLUDED.queue, address = EXCLUDED.address,
                             posted_at = EXCLUDED.posted_at"
                    ),
                    &[child_id, queue, &address],
                )
                .await
                .map_err(pg_error("listing a waiting child"))?,
            Change::Withdraw { child_id } => tx
                .execute(
                    &format!("DELETE FROM {table} WHERE child_id = $1 AND address = $2"),
                    &[child_id, &address],
                )
                .await
                .map_err(pg_error("taking a child off the shared work list"))?,
        };
    }
    tx.commit().await.map_err(pg_error("updating the shared work list"))
}

impl crate::ledger::WorkDirectory for PgDirectory {
    fn post(&self, child_id: &str, queue: &str) {
        let _ = self.changes.send(Change::Post {
            child_id: child_id.to_string(),
            queue: queue.to_string(),
        });
    }

    fn withdraw(&self, child_id: &str) {
        let _ = self.changes.send(Change::Withdraw {
            child_id: child_id.to_string(),
        });
    }

    fn take_elsewhere(&self, queue: &str) -> Result<Option<(String, String)>, LedgerError> {
        let (pool, table, address, queue) = (
            self.pool.clone(),
            self.table.clone(),
            self.address.clone(),
            queue.to_string(),
        );
        super::runtime::run_on(&self.runtime, async move {
            let client = pool.get().await.map_err(pool_error)?;
            let row = client
                .query_opt(
                    &format!(
                        "DELETE FROM {table} WHERE child_id = (
                                 SELECT child_id FROM {table} WHERE queue = $1 AND address <> $2
                                 ORDER BY posted_at LIMIT 1 FOR UPDATE SKIP LOCKED)
                             RETURNING child_id, address"
                    ),
                    &[&queue, &address],
                )
                .await
                .map_err(pg_error("taking a child from the shared work list"))?;
            Ok(row.map(|r| (r.get(0), r.get(1))))
        })
    }
}
