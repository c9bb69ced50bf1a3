//! The shared list of children waiting for outside workers (see
//! [`crate::ledger::WorkDirectory`]): a table `work_directory(child_id, queue, address,
//! posted_at)`. Posts and withdrawals of one process are applied in the order they were made,
//! by one task on the ledger's runtime (a withdrawal overtaking the post after it would hide a
//! waiting child); a taker deletes the row it takes, `FOR UPDATE SKIP LOCKED`.
//!
//! A post notifies the other processes (`NOTIFY`, sent when its transaction commits): each keeps
//! one connection that `LISTEN`s, and counts what it hears in [`WorkDirectory::listed`], so a
//! poller that found nothing to take waits for the count to move instead of asking the database
//! again — an idle poll costs no query. When that connection breaks, the count moves once it is
//! back (what was posted meanwhile was not heard), so waiting pollers look again.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::{mpsc, watch};
use tokio_postgres::{AsyncMessage, NoTls};

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
    /// Moves when another process may have listed a child.
    listed: watch::Receiver<u64>,
}

/// Changes applied together, at most this many in one transaction.
const BATCH: usize = 512;

impl PgDirectory {
    pub(super) fn start(
        schema: &str,
        address: String,
        pool: Pool,
        config: tokio_postgres::Config,
        runtime: tokio::runtime::Handle,
    ) -> Arc<Self> {
        let table = format!("\"{schema}\".work_directory");
        let channel = channel(schema);
        let (changes, mut rx) = mpsc::unbounded_channel::<Change>();
        let (heard, listed) = watch::channel(0u64);
        runtime.spawn(listen(config, channel.clone(), address.clone(), heard));
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
                if let Err(e) = apply(&apply_pool, &apply_table, &channel, &apply_address, &batch).await {
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
            listed,
        })
    }
}

/// The notification channel of a schema's work list.
fn channel(schema: &str) -> String {
    format!("brood_work_{schema}")
}

/// How long the listening connection waits before it connects again after it broke.
const LISTEN_RETRY: Duration = Duration::from_secs(1);

/// Keeps one connection listening on `channel` for as long as the ledger's runtime runs, and
/// moves `heard` for every post of another process, and once each time the connection is
/// (re)made. Ends when nobody reads `heard` any more.
async fn listen(config: tokio_postgres::Config, channel: String, address: String, heard: watch::Sender<u64>) {
    let bump = |heard: &watch::Sender<u64>| heard.send_modify(|n| *n = n.wrapping_add(1));
    while !heard.is_closed() {
        match listen_once(&config, &channel, &address, &heard, bump).await {
            Ok(()) => return,
            Err(e) => {
                tracing::debug!("the connection listening for listed children broke: {e}");
                // Posts made until it is back are not heard: pollers look once it is.
                tokio::time::sleep(LISTEN_RETRY).await;
            }
        }
    }
}

/// One listening connection, until it breaks (an error) or nobody reads `heard` (done).
async fn listen_once(
    config: &tokio_postgres::Config,
    channel: &str,
    address: &str,
    heard: &watch::Sender<u64>,
    bump: impl Fn(&watch::Sender<u64>),
) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = config.connect(NoTls).await?;
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    let statement = format!("LISTEN \"{channel}\"");
    let listening = client.batch_execute(&statement);
    tokio::pin!(listening);
    // The connection is driven by reading its messages, so the LISTEN is sent while they are read.
    let mut subscribed = false;
    loop {
        tokio::select! {
            done = &mut listening, if !subscribed => {
                done?;
                subscribed = true;
                // Anything posted before the LISTEN took effect was not heard.
                bump(heard);
            }
            message = futures::StreamExt::next(&mut messages) => match message {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if n.payload() != address {
                        bump(heard);
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e),
                None => return Ok(()),
            },
            _ = heard.closed() => return Ok(()),
        }
    }
}

/// Applies changes in order, in one transaction; the other processes are notified of posts when
/// it commits.
async fn apply(pool: &Pool, table: &str, channel: &str, address: &str, batch: &[Change]) -> Result<(), LedgerError> {
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
    if batch.iter().any(|c| matches!(c, Change::Post { .. })) {
        tx.execute("SELECT pg_notify($1, $2)", &[&channel, &address])
            .await
            .map_err(pg_error("notifying the other processes of a listed child"))?;
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

    fn listed(&self) -> watch::Receiver<u64> {
        self.listed.clone()
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
