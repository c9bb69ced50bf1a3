//! The shared list of children waiting for outside workers (see
//! [`crate::ledger::WorkDirectory`]): a table `work_directory(child_id, queue, address,
//! posted_at)`, a child takeable once `posted_at` has passed. Posts and withdrawals of one
//! process are applied in the order they were made, by one task on the ledger's runtime (a
//! withdrawal overtaking the post after it would hide a waiting child).
//!
//! - A post lands only while its process holds the tenure of the child's session (its row of
//!   `session_leases` names this process instance and was not given back): a process that lost
//!   the session, its runners not dropped yet, lists nothing over the new holder's listing (an
//!   upsert), and a withdrawal deletes only a row this process instance listed (`instance`),
//!   never one of a process started since at the same address.
//! - A taker hides the row it takes (`FOR UPDATE SKIP LOCKED`) by setting its `posted_at` past
//!   the time it waits for the child's process, and a little more: it comes back by itself if
//!   the taker dies before it asks. Its process withdraws it when it hands the child out; the
//!   taker shortens the wait when its process did not answer, and deletes the row when its
//!   process no longer holds the child, or could not be reached and has no live heartbeat at
//!   that address (reached by nobody but alive, it is asked again after a while) — each only
//!   on the row as it took it (its `posted_at`), never on a listing made anew meanwhile. A
//!   look that takes nothing answers how soon a hidden child is takeable again, and whether a
//!   child it found takeable was being taken by another poller: nobody is told when a hidden
//!   child comes back (but this process's own pollers, of one it listed again early).
//!
//! A change that fails to land is tried again (with those made meanwhile, the last of each
//! child's) until it does: the list never loses a waiting child to one failed update.
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
use crate::ledger::{Listed, Look};

/// One change of the list.
#[derive(Debug)]
enum Change {
    Post {
        session_id: String,
        child_id: String,
        queue: String,
    },
    Withdraw {
        child_id: String,
    },
    /// Lists again, after [`RELIST_AFTER_MS`], a child of another process that a poller took
    /// but could not be handed (its process was slow to answer).
    Relist(Listed),
    /// Takes off the list a child of another process that a poller took and its process does
    /// not hold waiting.
    Unlist(Listed),
    /// Takes off the list a child of another process that a poller took and could not reach
    /// its process for, unless a live process has that address (then as [`Change::Relist`]).
    Unreached(Listed),
}

impl Change {
    /// The child whose listing by this process the change sets or clears; none for a change of
    /// a row another process listed (made only on the row as it was taken: it is never
    /// overtaken).
    fn own_child(&self) -> Option<&str> {
        match self {
            Change::Post { child_id, .. } | Change::Withdraw { child_id } => Some(child_id),
            Change::Relist(_) | Change::Unlist(_) | Change::Unreached(_) => None,
        }
    }
}

/// The changes of `batch` that still matter, in order: each post or withdrawal sets or clears
/// a child's listing whatever was before it, so only the last of each child is kept.
fn coalesce(batch: Vec<Change>) -> Vec<Change> {
    let mut last: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (i, c) in batch.iter().enumerate() {
        if let Some(child_id) = c.own_child() {
            last.insert(child_id.to_string(), i);
        }
    }
    batch
        .into_iter()
        .enumerate()
        .filter(|(i, c)| c.own_child().is_none_or(|child_id| last.get(child_id) == Some(i)))
        .map(|(_, c)| c)
        .collect()
}

/// How long a child listed again after its process did not answer is left before pollers
/// elsewhere take it again (its own process's polls hand it out meanwhile); no one is told of
/// it, so a process that keeps failing is not asked in a loop. A take hides its child this
/// much longer than its taker waits for the child's process.
const RELIST_AFTER_MS: u64 = 2_000;

/// How long a child whose process could not be reached, at an address a live process has, is
/// left before pollers take it again.
const UNREACHED_AFTER_MS: u64 = 10_000;

/// How long a failed update of the list waits before it is tried again, at first and at most.
const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_MOST: Duration = Duration::from_secs(5);

/// A process's view of the shared list.
#[derive(Debug)]
pub(super) struct PgDirectory {
    table: String,
    /// This process.
    me: Me,
    pool: Pool,
    changes: mpsc::UnboundedSender<Change>,
    runtime: tokio::runtime::Handle,
    /// Moves when another process may have listed a child, and when this one listed a child
    /// of another again soon.
    listed: watch::Receiver<u64>,
}

/// Changes applied together, at most this many in one transaction.
const BATCH: usize = 512;

/// The database's clock now, in whole ms since the Unix epoch, as SQL (`clock_timestamp()`: the
/// moment the statement reads it, not its transaction's start).
const CLOCK_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::int8";

impl PgDirectory {
    pub(super) fn start(
        schema: &str,
        address: String,
        instance: String,
        pool: Pool,
        config: tokio_postgres::Config,
        runtime: tokio::runtime::Handle,
    ) -> Arc<Self> {
        let table = format!("\"{schema}\".work_directory");
        let me = Me {
            address,
            instance,
            tenures: super::tenures::tenure_table(schema),
            nodes: format!("\"{schema}\".nodes"),
        };
        let channel = channel(schema);
        let (changes, mut rx) = mpsc::unbounded_channel::<Change>();
        let (heard, listed) = watch::channel(0u64);
        runtime.spawn(listen(config, channel.clone(), me.address.clone(), heard.clone()));
        let (apply_table, apply_pool, apply_me) = (table.clone(), pool.clone(), me.clone());
        runtime.spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                let mut wait = RETRY_FIRST;
                loop {
                    while batch.len() < BATCH {
                        match rx.try_recv() {
                            Ok(c) => batch.push(c),
                            Err(_) => break,
                        }
                    }
                    match apply(&apply_pool, &apply_table, &channel, &apply_me, &heard, &batch).await {
                        Ok(()) => break,
                        Err(e) => {
                            // Tried again, with what came meanwhile, until it lands: a waiting
                            // child stays listed until it is handed out.
                            tracing::warn!(
                                changes = batch.len(),
                                "updating the shared work list failed (tried again in {wait:?}): {e}"
                            );
                            tokio::time::sleep(wait).await;
                            wait = (wait * 2).min(RETRY_MOST);
                            batch = coalesce(batch);
                        }
                    }
                }
            }
        });
        Arc::new(PgDirectory {
            table,
            me,
            pool,
            changes,
            runtime,
            listed,
        })
    }
}

/// The process a directory lists children for.
#[derive(Debug, Clone)]
struct Me {
    /// Where it takes requests.
    address: String,
    /// Its instance, as its tenures name it.
    instance: String,
    /// The tenure table, schema-qualified.
    tenures: String,
    /// The table of live processes (their heartbeats), schema-qualified.
    nodes: String,
}

/// The notification channel of a schema's work list.
fn channel(schema: &str) -> String {
    format!("brood_work_{schema}")
}

/// The keepalive period of the listening connection.
const LISTEN_KEEPALIVE: Duration = Duration::from_secs(5);

/// How long the listening connection waits before it connects again after it broke.
const LISTEN_RETRY: Duration = Duration::from_secs(1);

/// Keeps one connection listening on `channel` for as long as the ledger's runtime runs, and
/// moves `heard` for every notification of another process (its payload is not `address`), and
/// once each time the connection is (re)made. Ends when nobody reads `heard` any more. (The
/// tenures listen for give-backs this way too.)
pub(super) async fn listen(
    mut config: tokio_postgres::Config,
    channel: String,
    address: String,
    heard: watch::Sender<u64>,
) {
    // A connection that went half-open (a partition, a server gone without a word) only ever
    // reads nothing: found out within about half a minute, and made again.
    config
        .keepalives_idle(LISTEN_KEEPALIVE)
        .keepalives_interval(LISTEN_KEEPALIVE)
        .keepalives_retries(3);
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

/// Makes a child of another process that a poller took (the row as it took it) takeable again
/// in `after_ms`; how many rows that changed (none when its process withdrew it or listed it
/// anew meanwhile).
async fn listed_again(tx: &super::Tx<'_>, table: &str, taken: &Listed, after_ms: u64) -> Result<u64, LedgerError> {
    tx.execute(
        &format!(
            "UPDATE {table} SET posted_at = now() + interval '{after_ms} milliseconds'
             WHERE child_id = $1 AND address = $2 AND posted_at = $3"
        ),
        &[&taken.child_id, &taken.address, &taken.hidden_until],
    )
    .await
    .map_err(pg_error("listing a waiting child again"))
}

/// Applies changes in order, in one transaction; the other processes are notified of posts when
/// it commits, and this process's own pollers, through `heard`, of children listed again soon.
async fn apply(
    pool: &Pool,
    table: &str,
    channel: &str,
    me: &Me,
    heard: &watch::Sender<u64>,
    batch: &[Change],
) -> Result<(), LedgerError> {
    let mut client = pool.get().await.map_err(pool_error)?;
    let tx = client
        .transaction()
        .await
        .map_err(pg_error("updating the shared work list"))?;
    let (mut posted, mut relisted) = (0, 0);
    for change in batch {
        match change {
            Change::Post {
                session_id,
                child_id,
                queue,
            } => {
                posted += tx
                    .execute(
                        &format!(
                            "INSERT INTO {table} (child_id, queue, address, posted_at, instance)
                             SELECT $1, $2, $3, now(), $5 WHERE EXISTS (
                                 SELECT 1 FROM {tenures} WHERE session = $4 AND instance = $5 AND expires_at > now())
                             ON CONFLICT (child_id) DO UPDATE SET queue = EXCLUDED.queue, address = EXCLUDED.address,
                                 posted_at = EXCLUDED.posted_at, instance = EXCLUDED.instance",
                            tenures = me.tenures
                        ),
                        &[child_id, queue, &me.address, &session_id.as_bytes(), &me.instance],
                    )
                    .await
                    .map_err(pg_error("listing a waiting child"))?;
            }
            Change::Relist(taken) => {
                // This process's own pollers are told (those that looked while it was taken
                // wait for the end of the take's wait, later than this); the others' look
                // again by then, untold: a process that answers every take with a fault would
                // otherwise wake every waiting poll of every process at each relisting.
                relisted += listed_again(&tx, table, taken, RELIST_AFTER_MS).await?;
            }
            Change::Unlist(taken) => tx
                .execute(
                    &format!("DELETE FROM {table} WHERE child_id = $1 AND address = $2 AND posted_at = $3"),
                    &[&taken.child_id, &taken.address, &taken.hidden_until],
                )
                .await
                .map(drop)
                .map_err(pg_error("taking a child of another process off the shared work list"))?,
            Change::Unreached(taken) => {
                tx.execute(
                    &format!(
                        "DELETE FROM {table} WHERE child_id = $1 AND address = $2 AND posted_at = $3
                             AND NOT EXISTS (SELECT 1 FROM {nodes} WHERE address = $2 AND expires_at > now())",
                        nodes = me.nodes
                    ),
                    &[&taken.child_id, &taken.address, &taken.hidden_until],
                )
                .await
                .map_err(pg_error(
                    "taking a child of a process that is gone off the shared work list",
                ))?;
                // Still there: a live process has the address (a restart, a brief failure).
                // Asked for again after a while, untold (the take's wait ends about then): an
                // address a live process has but nobody reaches costs a look that long.
                listed_again(&tx, table, taken, UNREACHED_AFTER_MS).await?;
            }
            Change::Withdraw { child_id } => tx
                .execute(
                    &format!(
                        "DELETE FROM {table} WHERE child_id = $1
                             AND (instance = $2 OR (instance = '' AND address = $3))"
                    ),
                    &[child_id, &me.instance, &me.address],
                )
                .await
                .map(drop)
                .map_err(pg_error("taking a child off the shared work list"))?,
        }
    }
    if posted > 0 {
        tx.execute("SELECT pg_notify($1, $2)", &[&channel, &me.address])
            .await
            .map_err(pg_error("notifying the other processes of a listed child"))?;
    }
    tx.commit().await.map_err(pg_error("updating the shared work list"))?;
    if relisted > 0 {
        // A child of another process listed again: this process's pollers look too (the
        // listening connection hears only the others).
        heard.send_modify(|n| *n = n.wrapping_add(1));
    }
    Ok(())
}

impl crate::ledger::WorkDirectory for PgDirectory {
    fn post(&self, session_id: &str, child_id: &str, queue: &str) {
        let _ = self.changes.send(Change::Post {
            session_id: session_id.to_string(),
            child_id: child_id.to_string(),
            queue: queue.to_string(),
        });
    }

    fn withdraw(&self, child_id: &str) {
        let _ = self.changes.send(Change::Withdraw {
            child_id: child_id.to_string(),
        });
    }

    fn relist(&self, taken: &Listed) {
        let _ = self.changes.send(Change::Relist(taken.clone()));
    }

    fn unlist(&self, taken: &Listed) {
        let _ = self.changes.send(Change::Unlist(taken.clone()));
    }

    fn unreached(&self, taken: &Listed) {
        let _ = self.changes.send(Change::Unreached(taken.clone()));
    }

    fn listed(&self) -> watch::Receiver<u64> {
        self.listed.clone()
    }

    fn take_elsewhere(&self, queue: &str, answer: Duration) -> Result<Look, LedgerError> {
        let (pool, table, address, queue) = (
            self.pool.clone(),
            self.table.clone(),
            self.me.address.clone(),
            queue.to_string(),
        );
        let hidden_ms = answer.as_millis() as f64 + RELIST_AFTER_MS as f64;
        super::runtime::run_on(&self.runtime, async move {
            let client = pool.get().await.map_err(pool_error)?;
            // One row, whether a child was taken or not; the earliest hidden row, and whether a
            // row was takeable, are read in the statement's snapshot, before the take (a row
            // takeable there but not taken was being taken by another poller: locked, skipped).
            let row = client
                .query_one(
                    &format!(
                        "WITH taken AS (
                             UPDATE {table} SET posted_at = clock_timestamp() + $3::float8 * interval '1 millisecond'
                             WHERE child_id = (
                                 SELECT child_id FROM {table} WHERE queue = $1 AND address <> $2 AND posted_at <= now()
                                 ORDER BY posted_at LIMIT 1 FOR UPDATE SKIP LOCKED)
                             RETURNING child_id, address, posted_at)
                         SELECT t.child_id, t.address, {CLOCK_MS}, t.posted_at,
                             (SELECT (extract(epoch FROM min(w.posted_at) - now()) * 1000)::int8 FROM {table} w
                              WHERE w.queue = $1 AND w.address <> $2 AND w.posted_at > now()),
                             EXISTS (SELECT 1 FROM {table} w
                                     WHERE w.queue = $1 AND w.address <> $2 AND w.posted_at <= now())
                         FROM (SELECT 1) AS one LEFT JOIN taken t ON true"
                    ),
                    &[&queue, &address, &hidden_ms],
                )
                .await
                .map_err(pg_error("taking a child from the shared work list"))?;
            let taken = row.get::<_, Option<String>>(0).map(|child_id| Listed {
                child_id,
                address: row.get(1),
                taken_at_ms: row.get::<_, i64>(2).max(0) as u64,
                hidden_until: row.get(3),
            });
            let (hidden_for, raced) = match taken {
                Some(_) => (None, false),
                None => (
                    row.get::<_, Option<i64>>(4)
                        .map(|ms| Duration::from_millis(ms.max(0) as u64)),
                    row.get(5),
                ),
            };
            Ok(Look {
                taken,
                hidden_for,
                raced,
            })
        })
    }

    fn clock_ms(&self) -> Result<u64, LedgerError> {
        crate::failpoint!("work_clock_read");
        let pool = self.pool.clone();
        super::runtime::run_on(&self.runtime, async move {
            let client = pool.get().await.map_err(pool_error)?;
            let row = client
                .query_one(&format!("SELECT {CLOCK_MS}"), &[])
                .await
                .map_err(pg_error("reading the database's clock"))?;
            Ok(row.get::<_, i64>(0).max(0) as u64)
        })
    }
}
