//! Reading many rows at once (a load of many sessions): the ledger's runtime runs the
//! statements one after the other on one connection and hands their rows on in batches as they
//! arrive; the thread that asked decodes each batch meanwhile, so decoding overlaps the read
//! instead of following it, and the rows' raw bytes are never copied out of the messages that
//! carried them. The runtime's thread only moves rows; what a row means is the asker's.

use deadpool_postgres::Pool;
use futures::TryStreamExt as _;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::{pg_error, pool_error, LedgerError};

/// Rows handed on at once.
const BATCH: usize = 1024;
/// Batches on their way at most: past them the reading waits for the decoding.
const IN_FLIGHT: usize = 8;

/// One statement of a read: its SQL, its parameters, and what it reads (for an error).
pub(super) struct Statement {
    pub(super) sql: String,
    pub(super) params: Vec<Box<dyn ToSql + Sync + Send>>,
    pub(super) what: String,
}

/// What the runtime hands on.
enum Batch {
    /// Rows of the statement at this index, in the order they came.
    Rows(usize, Vec<Row>),
    /// Every statement was read to its end.
    End,
    /// The read failed.
    Failed(LedgerError),
}

/// Runs `statements` in order on one connection of `pool` (from the runtime of `handle`) and
/// gives `each` their rows, batch by batch, with the index of their statement, on the calling
/// thread (never the runtime's own: it waits there). An error of `each` ends the read.
pub(super) fn read_rows(
    handle: &tokio::runtime::Handle,
    pool: Pool,
    statements: Vec<Statement>,
    mut each: impl FnMut(usize, &[Row]) -> Result<(), LedgerError>,
) -> Result<(), LedgerError> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(IN_FLIGHT);
    handle.spawn(async move {
        let end = match send_rows(pool, statements, &tx).await {
            Ok(()) => Batch::End,
            Err(e) => Batch::Failed(e),
        };
        let _ = tx.send(end).await;
    });
    loop {
        // Not `blocking_recv`: the caller may be inside another runtime (an actor's thread),
        // which that refuses. Unconstrained: that runtime's task budget, once spent, would put
        // off the wake-up until its scheduler runs again, which it does not while this thread
        // waits here.
        match futures::executor::block_on(tokio::task::unconstrained(rx.recv())) {
            Some(Batch::Rows(i, rows)) => each(i, &rows)?,
            Some(Batch::End) => return Ok(()),
            Some(Batch::Failed(e)) => return Err(e),
            None => return Err(LedgerError::storage_msg("the PostgreSQL ledger's runtime stopped")),
        }
    }
}

/// The runtime's side of [`read_rows`]: the statements prepared together (one round trip,
/// once per connection), then run one after the other, their rows sent on in batches. A reader
/// that went away ends it.
async fn send_rows(
    pool: Pool,
    statements: Vec<Statement>,
    tx: &tokio::sync::mpsc::Sender<Batch>,
) -> Result<(), LedgerError> {
    let client = pool.get().await.map_err(pool_error)?;
    let prepared = futures::future::try_join_all(statements.iter().map(|s| client.prepare_cached(&s.sql)))
        .await
        .map_err(pg_error("preparing the statements of a read"))?;
    for (i, (statement, prepared)) in statements.iter().zip(&prepared).enumerate() {
        let params = statement.params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync));
        let rows = client
            .query_raw(prepared, params)
            .await
            .map_err(pg_error(format!("reading {}", statement.what)))?;
        futures::pin_mut!(rows);
        let mut batch = Vec::with_capacity(BATCH);
        loop {
            let row = rows
                .try_next()
                .await
                .map_err(pg_error(format!("reading {}", statement.what)))?;
            let last = row.is_none();
            batch.extend(row);
            if batch.len() == BATCH || (last && !batch.is_empty()) {
                let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                if tx.send(Batch::Rows(i, full)).await.is_err() {
                    return Ok(());
                }
            }
            if last {
                break;
            }
        }
    }
    Ok(())
}
