//! Session tenures on PostgreSQL: several brood processes on one database, each session served
//! by one of them at a time, the holder of its tenure.
//!
//! A tenure is what the public contract calls a session lease: it is stored in the table
//! `session_leases`, lasts `session_lease_ms` (the server's configuration key), and a request
//! refused because it lapsed answers the error code `lease_lapsed`
//! ([`crate::error::BroodError::TenureLapsed`]).
//!
//! - **The table.** `session_leases(session, owner, address, epoch, expires_at)`, one row per
//!   session that was ever served. `owner` is a node id, stable across a node's restarts;
//!   `expires_at` is judged by the database's clock only.
//! - **Taking a tenure** is one upsert that succeeds only when the tenure is free: no row, or
//!   expired (also this node's own from before a restart: its old instance may still be alive,
//!   paused, and within its local deadline). Each take raises the epoch.
//! - **Renewal.** A task on the ledger's runtime renews every held tenure at a third of the tenure
//!   time, in one statement that matches each session's epoch: a session missing from its answer
//!   was taken over, and is lost. Locally a tenure is served until the moment the renewal was
//!   *sent* plus the tenure time less a margin, on the monotonic clock: it runs on through a
//!   `SIGSTOP` or a long pause, so a process that wakes up late knows at once that it may not
//!   hand anything out.
//! - **Fencing.** Every commit begins by taking a shared transaction-level advisory lock per
//!   session it writes ([`lock_key`]: one 64-bit key per schema and session), then, in a
//!   statement of its own (so its snapshot is taken once the locks are held), reads their tenure
//!   rows matched with the epochs this process holds — no row lock, so nothing is written for
//!   it. A takeover takes the same locks exclusively before its upsert, in key order, which
//!   waits for every commit holding one; a commit that comes after waits for the takeover to
//!   commit and then finds the old epoch matching nothing. A renewal (of `expires_at` alone)
//!   takes no advisory lock: it never waits for a commit, and a stalled commit of one session
//!   costs no session its tenure. So the new holder, which reads the session after its takeover
//!   committed, sees every write of the old one, and no write of the old one lands after that.
//!   The rows of a session that fails the check are not written, and the session is lost.
//!   Advisory locks take room in the database's lock table, which is small (64 per connection
//!   by default): a commit of many sessions takes the locks of their buckets instead of theirs
//!   (one of [`BUCKETS`] per session, at most that many), a takeover takes both of each session
//!   it takes, and a start or a sweep takes its tenures in batches of [`TAKE_BATCH`].

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;

use super::{pg_error, pool_error, LedgerError};
use crate::ledger::{TenureHolder, Tenures};

/// Who this process is among those sharing the database, and how long its tenures last.
#[derive(Debug, Clone)]
pub struct TenureConfig {
    /// The node id, naming the process in the tenure rows (its address will do).
    pub node: String,
    /// Where this process takes requests (another process forwards them here).
    pub address: String,
    /// How long a tenure lasts without a renewal (renewed at a third of it).
    pub ttl: Duration,
}

/// A tenure this process holds.
#[derive(Debug, Clone, Copy)]
struct Held {
    epoch: i64,
    /// Served until then, by the monotonic clock.
    deadline: Instant,
}

type LostHook = crate::ledger::LostTenures;

/// The advisory lock of `session`'s tenure in the tenure table `table` (schema-qualified): a
/// 64-bit FNV-1a hash of both, the same in every process. Two sessions whose keys collide only
/// make a takeover of one wait for the commits of the other.
pub(super) fn lock_key(table: &str, session: &[u8]) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in table.as_bytes().iter().chain([0u8].iter()).chain(session) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h as i64
}

/// How many buckets the sessions' advisory locks fall into, for commits of many sessions.
const BUCKETS: u64 = 256;

/// A commit of more sessions than this takes the locks of their buckets, not theirs: at most
/// [`BUCKETS`] locks, so a commit never outgrows the database's lock table (whose room is
/// `max_locks_per_transaction`, 64 by default, per connection, shared by all of them).
const PER_SESSION_MOST: usize = 256;

/// A takeover of more sessions than this (a start, or a sweep after a process with many
/// sessions died) takes them in transactions of this many at most, for the same reason.
const TAKE_BATCH: usize = 512;

/// The advisory lock of the bucket `session`'s lock falls into (see [`PER_SESSION_MOST`]).
fn bucket_key(table: &str, session: &[u8]) -> i64 {
    let bucket = (lock_key(table, session) as u64) % BUCKETS;
    lock_key(&format!("{table}/buckets"), &bucket.to_be_bytes())
}

/// Sorted and without repeats: every statement here takes its locks in this order, so
/// transactions never wait for each other's advisory locks in a cycle.
fn sorted(mut keys: Vec<i64>) -> Vec<i64> {
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// The advisory locks a commit writing `sessions` takes shared: each session's own, or, for
/// more than [`PER_SESSION_MOST`] sessions, their buckets'.
fn commit_keys(table: &str, sessions: &[Vec<u8>]) -> Vec<i64> {
    let key = if sessions.len() <= PER_SESSION_MOST {
        lock_key
    } else {
        bucket_key
    };
    sorted(sessions.iter().map(|s| key(table, s)).collect())
}

/// The advisory locks a takeover of `sessions` takes exclusively: each session's own and its
/// bucket's, so it waits for every commit writing one of them, whichever locks that took.
fn take_keys(table: &str, sessions: &[Vec<u8>]) -> Vec<i64> {
    sorted(
        sessions
            .iter()
            .flat_map(|s| [lock_key(table, s), bucket_key(table, s)])
            .collect(),
    )
}

/// The tenures of one process: what it holds, and the statements that take, renew and check
/// them.
pub(super) struct HeldTenures {
    config: TenureConfig,
    table: String,
    sessions_table: String,
    pool: Pool,
    held: Mutex<HashMap<String, Held>>,
    on_lost: OnceLock<LostHook>,
    runtime: tokio::runtime::Handle,
    /// One take at a time in this process: two takes of one tenure would each raise its epoch.
    taking: tokio::sync::Mutex<()>,
    /// How many times each session's tenure was lost (its rows refused at a commit, or a renewal
    /// found it taken over).
    refusals: Mutex<HashMap<String, u64>>,
    /// This process's own id (random at its start), on the tenures it takes: a tenure it gave
    /// back is its to take again at once, unlike a live one of this node's earlier instance.
    instance: String,
}

impl std::fmt::Debug for HeldTenures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldTenures")
            .field("node", &self.config.node)
            .field("held", &self.held.lock().map(|h| h.len()).unwrap_or(0))
            .finish()
    }
}

impl HeldTenures {
    pub(super) fn new(
        config: TenureConfig,
        schema: &str,
        sessions_table: String,
        pool: Pool,
        runtime: tokio::runtime::Handle,
    ) -> Arc<Self> {
        Arc::new(HeldTenures {
            config,
            table: format!("\"{schema}\".session_leases"),
            sessions_table,
            pool,
            held: Mutex::new(HashMap::new()),
            on_lost: OnceLock::new(),
            runtime,
            taking: tokio::sync::Mutex::new(()),
            refusals: Mutex::new(HashMap::new()),
            instance: format!("{}{}", crate::model::random_hex(), crate::model::random_hex()),
        })
    }

    /// How long a tenure lasts, in milliseconds, for SQL.
    fn ttl_ms(&self) -> i64 {
        i64::try_from(self.config.ttl.as_millis()).unwrap_or(i64::MAX)
    }

    /// The local deadline of a tenure taken or renewed by a statement sent at `sent`: the tenure
    /// time less a fifth of it, for the clocks' drift and the statement's own time.
    fn deadline(&self, sent: Instant) -> Instant {
        sent + self.config.ttl - self.config.ttl / 5
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets `sessions` as held, and tells the engine.
    fn lose(&self, sessions: Vec<String>) {
        if sessions.is_empty() {
            return;
        }
        {
            // Counted before anyone is answered: a flush that returns after this sees it.
            let mut refusals = self.refusals.lock().unwrap_or_else(|p| p.into_inner());
            let mut held = self.held();
            for s in &sessions {
                held.remove(s);
                *refusals.entry(s.clone()).or_default() += 1;
            }
        }
        tracing::warn!(sessions = ?sessions, "session tenures lost to another process; their sessions are no longer served here");
        if let Some(hook) = self.on_lost.get() {
            hook(&sessions);
        }
    }

    /// Whether this process holds `session`'s tenure.
    /// The advisory lock key of `session`'s tenure (see [`lock_key`]).
    #[cfg(test)]
    pub(super) fn lock_key_of(&self, session: &str) -> i64 {
        lock_key(&self.table, session.as_bytes())
    }

    pub(super) fn holds(&self, session: &str) -> bool {
        self.held().contains_key(session)
    }

    /// How many times `session`'s tenure was lost so far.
    pub(super) fn refusals(&self, session: &str) -> u64 {
        self.refusals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(session)
            .copied()
            .unwrap_or(0)
    }

    /// Runs `job` on the ledger's runtime and waits for it (from any other thread).
    fn run<T: Send + 'static>(
        &self,
        job: impl std::future::Future<Output = Result<T, LedgerError>> + Send + 'static,
    ) -> Result<T, LedgerError> {
        super::runtime::run_on(&self.runtime, job)
    }

    /// Who holds `name`'s tenure by its row (only a live one when `live`), as held elsewhere.
    async fn holder_row(&self, name: Vec<u8>, live: bool) -> Result<Option<TenureHolder>, LedgerError> {
        let client = self.pool.get().await.map_err(pool_error)?;
        let alive = if live { " AND expires_at >= now()" } else { "" };
        let row = client
            .query_opt(
                &format!("SELECT owner, address FROM {} WHERE session = $1{alive}", self.table),
                &[&name],
            )
            .await
            .map_err(pg_error("reading a session tenure"))?;
        Ok(row.map(|r| TenureHolder::Elsewhere {
            owner: r.get(0),
            address: r.get(1),
        }))
    }

    /// Gives tenures back (each at the epoch this process held it): they run out now.
    async fn give_back(&self, names: Vec<Vec<u8>>, epochs: Vec<i64>) -> Result<u64, LedgerError> {
        let client = self.pool.get().await.map_err(pool_error)?;
        client
            .execute(
                &format!(
                    "UPDATE {} l SET expires_at = now() - interval '1 millisecond'
                     FROM unnest($1::bytea[], $2::int8[]) AS f(session, epoch)
                     WHERE l.session = f.session AND l.epoch = f.epoch AND l.owner = $3",
                    self.table
                ),
                &[&names, &epochs, &self.config.node],
            )
            .await
            .map_err(pg_error("giving session tenures back"))
    }

    /// The fencing check at the start of a commit: of `sessions` (those the commit writes),
    /// the ones whose tenure this process still holds at its epoch, their advisory locks held
    /// shared until the commit ends. The others are lost; their rows must not be written.
    pub(super) async fn check(
        &self,
        tx: &super::Tx<'_>,
        sessions: BTreeSet<String>,
    ) -> Result<HashSet<String>, LedgerError> {
        if sessions.is_empty() {
            return Ok(HashSet::new());
        }
        let (names, epochs): (Vec<Vec<u8>>, Vec<i64>) = {
            let held = self.held();
            sessions
                .iter()
                .filter_map(|s| held.get(s).map(|h| (s.as_bytes().to_vec(), h.epoch)))
                .unzip()
        };
        let what = "checking the session tenures of a commit";
        let keys = commit_keys(&self.table, &names);
        let lock = super::commit::prepared(
            tx,
            "SELECT count(pg_advisory_xact_lock_shared(k)) FROM unnest($1::int8[]) AS k",
            what,
        )
        .await?;
        let sql = format!(
            "SELECT l.session FROM {} l JOIN unnest($1::bytea[], $2::int8[]) AS f(session, epoch)
             ON l.session = f.session AND l.epoch = f.epoch AND l.owner = $3",
            self.table
        );
        let statement = super::commit::prepared(tx, &sql, what).await?;
        // Sent together, run one after the other: the check's snapshot is taken once the locks
        // are held.
        let lock_params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&keys];
        let check_params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&names, &epochs, &self.config.node];
        let (_, rows) = futures::try_join!(tx.query(&lock, &lock_params), tx.query(&statement, &check_params))
            .map_err(pg_error(what))?;
        let ok: HashSet<String> = rows
            .into_iter()
            .map(|r| String::from_utf8_lossy(r.get::<_, &[u8]>(0)).into_owned())
            .collect();
        let lost: Vec<String> = sessions.into_iter().filter(|s| !ok.contains(s)).collect();
        if !lost.is_empty() {
            tracing::warn!(sessions = ?lost, "a commit held rows of sessions whose tenure this process no longer holds; they were not written");
            self.lose(lost);
        }
        Ok(ok)
    }

    /// Renews every held tenure once; loses those taken over meanwhile.
    async fn renew(self: &Arc<Self>) -> Result<(), LedgerError> {
        let (names, epochs): (Vec<Vec<u8>>, Vec<i64>) = self
            .held()
            .iter()
            .map(|(s, h)| (s.as_bytes().to_vec(), h.epoch))
            .unzip();
        if names.is_empty() {
            return Ok(());
        }
        let sent = Instant::now();
        let client = self.pool.get().await.map_err(pool_error)?;
        let rows = client
            .query(
                &format!(
                    // Rows locked in key order, as the takeovers lock them.
                    "WITH mine AS (
                         SELECT l.session FROM {t} l JOIN unnest($1::bytea[], $2::int8[]) AS f(session, epoch)
                         ON l.session = f.session AND l.epoch = f.epoch AND l.owner = $4
                         ORDER BY l.session FOR NO KEY UPDATE OF l)
                     UPDATE {t} l SET expires_at = now() + $3::int8 * interval '1 millisecond'
                     FROM mine WHERE l.session = mine.session
                     RETURNING l.session, l.epoch",
                    t = self.table
                ),
                &[&names, &epochs, &self.ttl_ms(), &self.config.node],
            )
            .await
            .map_err(pg_error("renewing session tenures"))?;
        let renewed: HashMap<String, i64> = rows
            .into_iter()
            .map(|r| (String::from_utf8_lossy(r.get::<_, &[u8]>(0)).into_owned(), r.get(1)))
            .collect();
        let deadline = self.deadline(sent);
        let mut lost = Vec::new();
        {
            let mut held = self.held();
            for (name, epoch) in names.iter().zip(&epochs) {
                let name = String::from_utf8_lossy(name).into_owned();
                match renewed.get(&name) {
                    Some(_) => {
                        if let Some(h) = held.get_mut(&name) {
                            if h.epoch == *epoch {
                                h.deadline = h.deadline.max(deadline);
                            }
                        }
                    }
                    // Taken since it was read above (acquired again at a new epoch) or lost.
                    None if held.get(&name).is_some_and(|h| h.epoch == *epoch) => lost.push(name),
                    None => {}
                }
            }
        }
        self.lose(lost);
        Ok(())
    }

    /// Starts the renewal task on the ledger's runtime; it ends when the held tenures are dropped.
    pub(super) fn start_renewing(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let every = self.config.ttl / 3;
        self.runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(tenures) = weak.upgrade() else { return };
                if let Err(e) = tenures.renew().await {
                    tracing::warn!("renewing session tenures failed (retried at the next turn): {e}");
                }
            }
        });
    }

    /// Takes tenures by one upsert: for `session` alone, or for every stored session whose tenure
    /// is free and which this process does not hold.
    async fn take(self: Arc<Self>, session: Option<String>) -> Result<Vec<(String, i64)>, LedgerError> {
        let _turn = self.taking.lock().await;
        let sent = Instant::now();
        let mut client = self.pool.get().await.map_err(pool_error)?;
        let what = "taking session tenures";
        let held: Vec<Vec<u8>> = self.held().keys().map(|s| s.as_bytes().to_vec()).collect();
        // Free: no tenure row, expired, or given back (or left) by this very process, whose
        // held tenures are excluded. Not a live tenure of this node's earlier instance: it may
        // be paused, alive.
        let one = session.map(String::into_bytes);
        let candidates: Vec<Vec<u8>> = match &one {
            Some(name) => vec![name.clone()],
            None => client
                .query(
                    &format!(
                        "SELECT s.key FROM {sessions} s LEFT JOIN {t} l ON l.session = s.key
                         WHERE (l.session IS NULL OR l.expires_at < now() OR l.instance = $2) AND NOT (s.key = ANY($1))
                         ORDER BY s.key",
                        sessions = self.sessions_table,
                        t = self.table
                    ),
                    &[&held, &self.instance],
                )
                .await
                .map_err(pg_error(what))?
                .into_iter()
                .map(|r| r.get(0))
                .collect(),
        };
        // In batches, each a transaction of its own: a batch taken stays taken (and held) when a
        // later one fails, and is answered, so the caller serves it; the next sweep takes the rest.
        let mut taken: Vec<(String, i64)> = Vec::new();
        for batch in candidates.chunks(TAKE_BATCH) {
            match self.take_batch(&mut client, batch, &held, sent).await {
                Ok(more) => taken.extend(more),
                Err(e) if taken.is_empty() => return Err(e),
                Err(e) => {
                    tracing::warn!(
                        taken = taken.len(),
                        "taking session tenures stopped part way (the rest is taken at a later sweep): {e}"
                    );
                    break;
                }
            }
        }
        tracing::debug!(asked = ?one.as_ref().map(|n| String::from_utf8_lossy(n).into_owned()), ?taken, "session tenures taken");
        Ok(taken)
    }

    /// Takes the tenures of `batch` that are free (see [`HeldTenures::take`]) in one
    /// transaction, and holds them from now on.
    async fn take_batch(
        &self,
        client: &mut deadpool_postgres::Object,
        batch: &[Vec<u8>],
        held: &[Vec<u8>],
        sent: Instant,
    ) -> Result<Vec<(String, i64)>, LedgerError> {
        let what = "taking session tenures";
        // Their advisory locks first, exclusively and in key order: this waits for every commit
        // of the tenures' holders that is under way, and holds off those that come after until
        // this one committed (see the module's "Fencing").
        let keys = take_keys(&self.table, batch);
        let tx = client.transaction().await.map_err(pg_error(what))?;
        tx.query(
            "SELECT count(pg_advisory_xact_lock(k)) FROM unnest($1::int8[]) AS k",
            &[&keys],
        )
        .await
        .map_err(pg_error(what))?;
        let sql = format!(
            "INSERT INTO {t} AS l (session, owner, address, epoch, expires_at, instance)
             SELECT src.key, $1, $2, 1, now() + $3::int8 * interval '1 millisecond', $5 FROM unnest($6::bytea[]) AS src(key)
             ON CONFLICT (session) DO UPDATE SET owner = EXCLUDED.owner, address = EXCLUDED.address,
                 epoch = l.epoch + 1, expires_at = EXCLUDED.expires_at, instance = EXCLUDED.instance
               WHERE (l.expires_at < now() OR l.instance = $5) AND NOT (l.session = ANY($4))
             RETURNING l.session, l.epoch",
            t = self.table
        );
        let ttl = self.ttl_ms();
        let rows = tx
            .query(
                &sql,
                &[
                    &self.config.node,
                    &self.config.address,
                    &ttl,
                    &held,
                    &self.instance,
                    &batch,
                ],
            )
            .await
            .map_err(pg_error(what))?;
        tx.commit().await.map_err(pg_error(what))?;
        let deadline = self.deadline(sent);
        let taken: Vec<(String, i64)> = rows
            .into_iter()
            .map(|r| (String::from_utf8_lossy(r.get::<_, &[u8]>(0)).into_owned(), r.get(1)))
            .collect();
        let mut mine = self.held();
        for (s, epoch) in &taken {
            mine.insert(
                s.clone(),
                Held {
                    epoch: *epoch,
                    deadline,
                },
            );
        }
        Ok(taken)
    }
}

/// The trait's face of a process's tenures.
#[derive(Debug, Clone)]
pub(super) struct PgTenures(pub(super) Arc<HeldTenures>);

impl Tenures for PgTenures {
    fn node(&self) -> &str {
        &self.0.config.node
    }

    fn ttl(&self) -> Duration {
        self.0.config.ttl
    }

    fn acquire(&self, session_id: &str) -> Result<TenureHolder, LedgerError> {
        if let Some(h) = self.0.held().get(session_id) {
            return Ok(TenureHolder::Here(h.epoch as u64));
        }
        let tenures = self.0.clone();
        let name = session_id.to_string();
        self.0.run(async move {
            let taken = tenures.clone().take(Some(name.clone())).await?;
            if let Some((_, epoch)) = taken.first() {
                return Ok(TenureHolder::Here(*epoch as u64));
            }
            // A sweep of this process may have taken it just before.
            if let Some(h) = tenures.held().get(&name) {
                return Ok(TenureHolder::Here(h.epoch as u64));
            }
            match tenures.holder_row(name.as_bytes().to_vec(), false).await? {
                Some(elsewhere) => Ok(elsewhere),
                // Given back between the two statements: free now; the caller asks again.
                None => Err(LedgerError::storage_msg(format!(
                    "the tenure of session `{name}` changed hands while it was taken; retry"
                ))),
            }
        })
    }

    fn holder(&self, session_id: &str) -> Result<Option<TenureHolder>, LedgerError> {
        if let Some(h) = self.0.held().get(session_id) {
            return Ok(Some(TenureHolder::Here(h.epoch as u64)));
        }
        let tenures = self.0.clone();
        let name = session_id.as_bytes().to_vec();
        self.0.run(async move { tenures.holder_row(name, true).await })
    }

    fn recorded_holder(&self, session_id: &str) -> Result<Option<TenureHolder>, LedgerError> {
        let tenures = self.0.clone();
        let name = session_id.as_bytes().to_vec();
        self.0.run(async move { tenures.holder_row(name, true).await })
    }

    fn holders(&self, session_ids: &[String]) -> Result<Vec<(String, TenureHolder)>, LedgerError> {
        let mut out = Vec::new();
        let mut ask: Vec<Vec<u8>> = Vec::new();
        {
            let held = self.0.held();
            for id in session_ids {
                match held.get(id) {
                    Some(h) => out.push((id.clone(), TenureHolder::Here(h.epoch as u64))),
                    None => ask.push(id.as_bytes().to_vec()),
                }
            }
        }
        if ask.is_empty() {
            return Ok(out);
        }
        let (pool, table) = (self.0.pool.clone(), self.0.table.clone());
        let rows: Vec<(Vec<u8>, String, String)> = self.0.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            let rows = client
                .query(
                    &format!(
                        "SELECT session, owner, address FROM {table} WHERE session = ANY($1) AND expires_at >= now()"
                    ),
                    &[&ask],
                )
                .await
                .map_err(pg_error("reading session tenures"))?;
            Ok(rows.into_iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect())
        })?;
        for (name, owner, address) in rows {
            if let Ok(id) = String::from_utf8(name) {
                out.push((id, TenureHolder::Elsewhere { owner, address }));
            }
        }
        Ok(out)
    }

    fn acquire_free(&self) -> Result<Vec<String>, LedgerError> {
        let tenures = self.0.clone();
        let taken = self.0.run(async move { tenures.take(None).await })?;
        Ok(taken.into_iter().map(|(s, _)| s).collect())
    }

    fn holds(&self, session_id: &str) -> bool {
        self.0.held().contains_key(session_id)
    }

    fn serving(&self, session_id: &str) -> bool {
        self.0
            .held()
            .get(session_id)
            .is_some_and(|h| Instant::now() < h.deadline)
    }

    fn release(&self, session_id: &str) {
        let Some(held) = self.0.held().remove(session_id) else {
            return;
        };
        tracing::debug!(session = %session_id, epoch = held.epoch, "session tenure given back");
        // Not waited for: a tenure not given back runs out by itself.
        let tenures = self.0.clone();
        let (name, shown) = (session_id.as_bytes().to_vec(), session_id.to_string());
        self.0.runtime.spawn(async move {
            if let Err(e) = tenures.give_back(vec![name], vec![held.epoch]).await {
                tracing::warn!(session = %shown, "giving a session tenure back failed (it runs out by itself): {e}");
            }
        });
    }

    fn release_all(&self) {
        let held: Vec<(String, Held)> = self.0.held().drain().collect();
        if held.is_empty() {
            return;
        }
        let tenures = self.0.clone();
        let (names, epochs): (Vec<Vec<u8>>, Vec<i64>) =
            held.iter().map(|(s, h)| (s.as_bytes().to_vec(), h.epoch)).unzip();
        match self.0.run(async move { tenures.give_back(names, epochs).await }) {
            Ok(n) => tracing::info!(tenures = n, "session tenures given back"),
            Err(e) => tracing::warn!("giving session tenures back failed (they run out by themselves): {e}"),
        }
    }

    fn on_lost(&self, lost: crate::ledger::LostTenures) {
        if self.0.on_lost.set(lost).is_err() {
            tracing::warn!("a second lost-tenure hook was not set");
        }
    }
}
