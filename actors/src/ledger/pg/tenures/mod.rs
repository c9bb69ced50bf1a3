//! Session tenures on PostgreSQL: several brood processes on one database, each session served
//! by one of them at a time, the holder of its tenure.
//!
//! A tenure is what the public contract calls a session lease: it is stored in the table
//! `session_leases`, lasts `session_lease_ms` (the server's configuration key), and a request
//! refused because it lapsed answers the error code `lease_lapsed`
//! ([`crate::error::BroodError::TenureLapsed`]).
//!
//! - **The table.** `session_leases(session, owner, address, epoch, expires_at, instance)`, one
//!   row per session that was ever served. `owner` is a node id, stable across a node's
//!   restarts; `instance` is the process that took the tenure (random at its start). Times are
//!   the database's clock only.
//! - **A tenure lasts as long as its holder's heartbeat.** `nodes(instance, node, address,
//!   expires_at)` has one row per process instance, its heartbeat (its `held` column is no
//!   longer written: see `held_counts` below). A tenure is held while its
//!   row's `expires_at` has not passed (`'infinity'` once taken; a give-back sets it in the past)
//!   and its instance's heartbeat has not run out ([`HeldTenures::free`]).
//! - **Taking a tenure** is one upsert that succeeds only when the tenure is free: no row, given
//!   back, or its holder's heartbeat ran out (also this node's own earlier instance: it may
//!   still be alive, paused, and within its local deadline, but its heartbeat says otherwise).
//!   Each take raises the epoch, and is made only while this process's own heartbeat is alive.
//! - **Renewal** writes this process's heartbeat and nothing else, at a third of the tenure
//!   time: one row, however many sessions it holds. Locally a tenure is served until the moment
//!   the heartbeat was *sent* plus the tenure time less a margin, on the monotonic clock: it
//!   runs on through a `SIGSTOP` or a long pause, so a process that wakes up late knows at once
//!   that it may not hand anything out. A renewal that finds its heartbeat had run out (or all
//!   but: written within a fifth of a tenure of its end) reads its tenures back by key (the others may have taken some meanwhile) and loses those taken; a
//!   tenure it failed to give back (or a take whose answer was lost) is given back then too, as
//!   nothing runs out by itself while its holder lives.
//! - **Fencing.** Every commit begins by taking a shared transaction-level advisory lock per
//!   session it writes ([`locks::lock_key`]: one 64-bit key per schema and session), then, in a
//!   statement of its own (so its snapshot is taken once the locks are held), reads their tenure
//!   rows matched with the epochs this process holds — no row lock, so nothing is written for
//!   it. A takeover takes the same locks exclusively before its upsert, in key order, which
//!   waits for every commit holding one; a commit that comes after waits for the takeover to
//!   commit and then finds the old epoch matching nothing. A renewal (a heartbeat) locks no
//!   tenure row and takes no advisory lock (but after a lapse, when it reads its tenures back,
//!   their locks shared, as a commit does: that waits for a takeover under way, never for a
//!   commit): it never waits for a commit, and a stalled commit of
//!   one session costs no session its tenure. So the new holder, which reads the session after its takeover
//!   committed, sees every write of the old one, and no write of the old one lands after that.
//!   The rows of a session that fails the check are not written, and the session is lost.
//!   Advisory locks take room in the database's lock table, which is small (64 per connection
//!   by default): a commit of many sessions takes the locks of their buckets instead of theirs
//!   (one of [`locks::BUCKETS`] per session, at most that many), a takeover takes both of each session
//!   it takes, and a start or a sweep takes its tenures in batches of [`locks::TAKE_BATCH`].
//! - **Processes.** Each process instance's count of top-level sessions held is a row of
//!   `held_counts`, beside its heartbeat (never in the heartbeat's row, so no count's write holds
//!   up a renewal, nor waits for one). It is written in the transaction that changes it: a
//!   take's, and a handover's give-back (with its `NOTIFY`), so a process sweeping at the notice
//!   sees the sessions free and the giver's count without them together, never counted twice (a
//!   share too high, taken past, and sessions handed on a second time) nor missing; sessions
//!   whose give-back is under way count as the giver's until it commits. Every sweep writes it
//!   too, and the writes land in the order the counts were worked out (one lock per process,
//!   never held across a statement that may wait for a take). The sweep's one
//!   read ([`Tenures::spread`]) counts the live processes and what they hold from them, and the
//!   free tenures: those given back by the index on `expires_at`, those of dead instances (a few
//!   rows of `nodes`) by the index on `instance` — never a scan of the sessions. It also deletes
//!   a few expired rows of sessions no longer stored (retention). The planner is told the dead
//!   instances as a parameter, and the table is vacuumed (its statistics refreshed) after a take
//!   of many tenures, so free tenures are found by index among free rows only. The heartbeats of instances dead for an
//!   hour that no tenure names any more are deleted every [`RECONCILE_EVERY`].
//! - **Every stored session has a tenure row**: a creation takes the tenure first, a migration
//!   gave every older session a row, and a slow reconciliation ([`RECONCILE_EVERY`]) gives one
//!   to a session some other writer stored without one.
//! - **Handover.** A tenure given back to balance the processes is expired at its epoch, with
//!   a `NOTIFY` in the same transaction: the others' sweeps look at once (they `LISTEN`, as the
//!   work list does). The giver does not take it back for a tenure time (then, if nobody took
//!   it, it is anyone's again). A nested session
//!   given back names its parent session (`parent`): only the holder of the parent takes it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use tokio::sync::watch;

use super::{pg_error, pool_error, LedgerError};
use crate::ledger::{Spread, TenureHolder, Tenures};

mod face;
mod heartbeat;
mod locks;
mod sweep;

pub(super) use face::PgTenures;
#[cfg(any(test, feature = "failpoints"))]
use locks::lock_key;
use locks::{commit_keys, take_keys, TAKE_BATCH};

/// The tenure table of the ledger in `schema`, schema-qualified.
pub(super) fn tenure_table(schema: &str) -> String {
    format!("\"{schema}\".session_leases")
}

/// The advisory lock a commit writing `session` alone, in the ledger in `schema`, takes shared
/// (and a takeover of it exclusively): for tests that hold it as a commit in flight does.
#[cfg(any(test, feature = "failpoints"))]
pub(super) fn commit_lock_key(schema: &str, session: &str) -> i64 {
    lock_key(&tenure_table(schema), session.as_bytes())
}

/// How often every stored session is looked at for a missing tenure row (one that a writer not
/// sharing the schema stored): slow, the sweeps never look for them.
pub(super) const RECONCILE_EVERY: Duration = Duration::from_secs(120);

/// How many expired rows of sessions no longer stored one sweep deletes, at most.
const GONE_PER_SWEEP: i64 = 100;

/// A take of at least this many tenures cleans the tenure table (`VACUUM (ANALYZE)`).
const VACUUM_AFTER: usize = 1_000;

/// How long the row of `nodes` of a process instance whose heartbeat ran out is kept once no
/// tenure names it any more (an hour, in milliseconds): a process paused that long finds at its
/// next renewal that its heartbeat lapsed either way.
const DEAD_NODES_KEPT_MS: i64 = 3_600_000;

/// Whether the tenure row `l` is a nested session's, by its id (`deleg_<hex>.<index>`, the id of
/// the child it belongs to: [`crate::model::nest_parent`]). Nested sessions are not counted in
/// the spread: each moves with its parent session.
const NESTED: &str = "(substring(l.session FROM 1 FOR 6) = 'deleg_'::bytea AND position('.'::bytea IN l.session) > 0)";

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

/// The tenures of one process: what it holds, and the statements that take, renew and check
/// them.
pub(super) struct HeldTenures {
    config: TenureConfig,
    table: String,
    sessions_table: String,
    pool: Pool,
    /// The heartbeat's own connection: a renewal never waits for one of the pool's, all taken
    /// by commits, takes waiting for other processes' commits, and small reads.
    heartbeat: Pool,
    held: Mutex<HashMap<String, Held>>,
    on_lost: OnceLock<LostHook>,
    runtime: tokio::runtime::Handle,
    /// One take at a time in this process: two takes of one tenure would each raise its epoch.
    taking: tokio::sync::Mutex<()>,
    /// Held while this process's count of held sessions is worked out and written to its row of
    /// `held_counts`, until the write commits: writes of the count land in the order they were worked
    /// out, so none overwrites a later one with an earlier.
    counting: tokio::sync::Mutex<()>,
    /// Top-level sessions no longer held here whose give-back has not ended: the others still
    /// see their tenures as this process's, so they are in its count until it commits.
    giving: std::sync::atomic::AtomicI64,
    /// How many times each session's tenure was lost (its rows refused at a commit, or a renewal
    /// found it taken over).
    refusals: Mutex<HashMap<String, u64>>,
    /// This process's own id (random at its start), on the tenures it takes: a tenure it gave
    /// back is its to take again at once, unlike a live one of this node's earlier instance.
    instance: String,
    /// The table of live processes.
    nodes_table: String,
    /// How many sessions each process instance holds.
    counts_table: String,
    /// The channel a give-back is told on.
    channel: String,
    /// The sessions handed over lately, and when.
    given: Mutex<HashMap<String, Instant>>,
    /// Moves when another process gave tenures back.
    freed: watch::Receiver<u64>,
    /// Tenures this process may still hold in the table without holding them here: given back
    /// at the next renewal ([`HeldTenures::stray`]).
    strays: Mutex<HashMap<String, Option<Vec<u8>>>>,
    /// The local deadline of the last heartbeat written ([`HeldTenures::deadline`] of the
    /// renewal that wrote it): every tenure lasts as long as that heartbeat, so none taken
    /// since is served past it.
    beat: Mutex<Option<Instant>>,
    /// Whether this process left (a clean stop gave every tenure back and deleted its
    /// heartbeat): its renewal ends, and never writes the heartbeat again.
    left: std::sync::atomic::AtomicBool,
    /// Held shared by a renewal, exclusively by the leave (for at most a tenure: a renewal
    /// stalled longer does not hold a stop up), so none is under way when the leave deletes the
    /// heartbeat.
    renewing: tokio::sync::RwLock<()>,
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
        heartbeat: Pool,
        listen: tokio_postgres::Config,
        runtime: tokio::runtime::Handle,
    ) -> Arc<Self> {
        let channel = format!("brood_leases_{schema}");
        let (heard, freed) = watch::channel(0u64);
        runtime.spawn(super::directory::listen(
            listen,
            channel.clone(),
            config.address.clone(),
            heard,
        ));
        Arc::new(HeldTenures {
            config,
            table: tenure_table(schema),
            sessions_table,
            pool,
            heartbeat,
            held: Mutex::new(HashMap::new()),
            on_lost: OnceLock::new(),
            runtime,
            taking: tokio::sync::Mutex::new(()),
            counting: tokio::sync::Mutex::new(()),
            giving: std::sync::atomic::AtomicI64::new(0),
            refusals: Mutex::new(HashMap::new()),
            instance: format!("{}{}", crate::model::random_hex(), crate::model::random_hex()),
            nodes_table: format!("\"{schema}\".nodes"),
            counts_table: format!("\"{schema}\".held_counts"),
            channel,
            given: Mutex::new(HashMap::new()),
            freed,
            strays: Mutex::new(HashMap::new()),
            beat: Mutex::new(None),
            left: std::sync::atomic::AtomicBool::new(false),
            renewing: tokio::sync::RwLock::new(()),
        })
    }

    /// How many top-level sessions' tenures this process holds: what the spread counts (a
    /// nested session moves with its parent, never on its own).
    fn top_level_held(&self) -> i64 {
        top_level_in(self.held().keys())
    }

    /// The count of top-level sessions the others should see this process hold: those held,
    /// and those whose give-back has not ended (their tenures are still this process's).
    fn counted(&self) -> i64 {
        let held = self.held();
        // Read under `held`'s lock, as `unhold` moves sessions from one to the other.
        top_level_in(held.keys()) + self.giving.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn given(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.given.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The sessions this process handed over within a tenure time: its sweeps leave them to
    /// the others (after that, one nobody took is anyone's again, this process's too).
    fn recently_given(&self) -> Vec<Vec<u8>> {
        let ttl = self.config.ttl;
        let mut given = self.given();
        given.retain(|_, at| at.elapsed() < ttl);
        given.keys().map(|s| s.as_bytes().to_vec()).collect()
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
    /// The advisory lock key of `session`'s tenure (see [`locks::lock_key`]).
    #[cfg(test)]
    pub(super) fn lock_key_of(&self, session: &str) -> i64 {
        lock_key(&self.table, session.as_bytes())
    }

    /// How many tenures wait to be given back again ([`HeldTenures::stray`]).
    #[cfg(test)]
    pub(super) fn strays(&self) -> usize {
        self.strays.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Renews now, then gives back the tenures left to give back, as the renewal task and its
    /// upkeep do at their turn.
    #[cfg(test)]
    pub(super) fn renew_now(self: &Arc<Self>) -> Result<(), LedgerError> {
        let tenures = self.clone();
        self.run(async move {
            tenures.renew().await?;
            tenures.give_back_strays().await
        })
    }

    /// Remembers `session` as a tenure to give back again ([`HeldTenures::stray`]).
    #[cfg(test)]
    pub(super) fn add_stray(&self, session: &str) {
        self.stray([(session.to_string(), None)]);
    }

    pub(super) fn holds(&self, session: &str) -> bool {
        self.held().contains_key(session)
    }

    /// This process instance, as the tenures it takes name it.
    pub(super) fn instance(&self) -> &str {
        &self.instance
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

    /// Who holds `name`'s tenure by its row (only a live one when `live`), as held elsewhere;
    /// with `as_seen_here`, a row of this process's own instance is answered as this process
    /// holds it (`Here` when held, else none) rather than as recorded.
    async fn holder_row(
        &self,
        name: Vec<u8>,
        live: bool,
        as_seen_here: bool,
    ) -> Result<Option<TenureHolder>, LedgerError> {
        let client = self.pool.get().await.map_err(pool_error)?;
        let alive = if live {
            format!(" AND NOT {}", self.free("l"))
        } else {
            String::new()
        };
        let row = client
            .query_opt(
                &format!(
                    "SELECT owner, address, instance FROM {} l WHERE session = $1{alive}",
                    self.table
                ),
                &[&name],
            )
            .await
            .map_err(pg_error("reading a session tenure"))?;
        let Some(row) = row else { return Ok(None) };
        if as_seen_here && row.get::<_, &str>(2) == self.instance {
            // Taken by this process: by a take under way (committed, not yet held here: it is
            // waited for), or given back, or left over from a take whose answer was lost (given
            // back at the next renewal). Never another process's.
            drop(client);
            let _turn = self.taking.lock().await;
            let name = String::from_utf8_lossy(&name).into_owned();
            return Ok(self.held().get(&name).map(|h| TenureHolder::Here(h.epoch as u64)));
        }
        Ok(Some(TenureHolder::Elsewhere {
            owner: row.get(0),
            address: row.get(1),
        }))
    }

    /// Gives tenures back (each at the epoch this process held it, a nested one naming its
    /// parent session when given): they run out now. With `tell`, the other processes are told
    /// when it commits. When it fails, they are given back at the next renewal.
    async fn give_back(&self, back: GiveBack, tell: bool) -> Result<u64, LedgerError> {
        let names: Vec<String> = back
            .names
            .iter()
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect();
        let parents = back.parents.clone();
        let given = self.give_back_once(back, tell).await;
        if given.is_err() {
            self.stray(names.into_iter().zip(parents));
        }
        given
    }

    async fn give_back_once(&self, back: GiveBack, tell: bool) -> Result<u64, LedgerError> {
        let given = self.give_back_counted(&back, tell).await;
        if given.is_err() {
            self.giving.fetch_sub(back.counted, std::sync::atomic::Ordering::SeqCst);
        }
        given
    }

    /// Gives `back` back in one transaction which, when it tells the others, also writes this
    /// process's count of sessions without them: the others, sweeping at the notice, see the
    /// sessions free and the count without them together, never counted twice (as this
    /// process's and as free: a share too high, taken past, and sessions handed on again) nor
    /// missing (a share too low).
    async fn give_back_counted(&self, back: &GiveBack, tell: bool) -> Result<u64, LedgerError> {
        let mut client = self.pool.get().await.map_err(pool_error)?;
        let what = "giving session tenures back";
        let tx = client.transaction().await.map_err(pg_error(what))?;
        let given = tx
            .execute(
                &format!(
                    "UPDATE {} l SET expires_at = now() - interval '1 millisecond', parent = coalesce(f.parent, l.parent)
                     FROM unnest($1::bytea[], $2::int8[], $4::bytea[]) AS f(session, epoch, parent)
                     WHERE l.session = f.session AND l.epoch = f.epoch AND l.owner = $3",
                    self.table
                ),
                &[&back.names, &back.epochs, &self.config.node, &back.parents],
            )
            .await
            .map_err(pg_error(what))?;
        let ended = || self.giving.fetch_sub(back.counted, std::sync::atomic::Ordering::SeqCst);
        if !(tell && given > 0) {
            tx.commit().await.map_err(pg_error(what))?;
            ended();
            return Ok(given);
        }
        let _counting = self.counting.lock().await;
        let held = self.counted() - back.counted;
        tx.query_one(
            &format!("WITH counted AS ({}) SELECT pg_notify($3, $4)", self.held_written()),
            &[&self.instance, &held, &self.channel, &self.config.address],
        )
        .await
        .map_err(pg_error("telling the other processes of tenures given back"))?;
        tx.commit().await.map_err(pg_error(what))?;
        ended();
        Ok(given)
    }

    /// Forgets `sessions` as held (those held), for a give-back: what to give back.
    fn unhold(&self, sessions: &[(String, Option<String>)]) -> GiveBack {
        let mut back = GiveBack::default();
        let mut held = self.held();
        for (s, parent) in sessions {
            if let Some(h) = held.remove(s) {
                back.names.push(s.as_bytes().to_vec());
                back.epochs.push(h.epoch);
                back.parents.push(parent.as_ref().map(|p| p.as_bytes().to_vec()));
                back.counted += top_level_in([s]);
            }
        }
        // Counted as this process's until the give-back ends (taken under `held`'s lock: a
        // count worked out meanwhile has them in one place or the other).
        self.giving.fetch_add(back.counted, std::sync::atomic::Ordering::SeqCst);
        back
    }

    /// Gives back every tenure of this process's instance (those it holds, and any it failed
    /// to give back), and leaves the table of processes: a clean stop. Should it fail, the
    /// heartbeat runs out within a tenure, and the tenures with it.
    async fn leave(&self) -> Result<u64, LedgerError> {
        // Marked first, and a renewal under way waited for: no renewal writes the heartbeat
        // back after it is deleted, which would have this process look alive, holding nothing,
        // to the others' balancing for a tenure (and each session handed over to it wait as
        // long).
        self.left.store(true, std::sync::atomic::Ordering::SeqCst);
        let _quiet = tokio::time::timeout(self.config.ttl, self.renewing.write()).await;
        self.held().clear();
        self.give_back_own(None, true).await
    }

    /// Gives back the tenures of this process's instance (of `only` those sessions, when
    /// named; with `leave`, every one, and its row of `nodes` goes too), and tells the others
    /// when any was given. How many were.
    async fn give_back_own(&self, only: Option<Named>, leave: bool) -> Result<u64, LedgerError> {
        let mut client = self.pool.get().await.map_err(pool_error)?;
        let what = "giving session tenures back";
        let tx = client.transaction().await.map_err(pg_error(what))?;
        if leave {
            // The heartbeat first: that waits for every take of this instance under way (each
            // locks it), and no take comes after; then the tenures, with those takes' in sight.
            tx.execute(
                &format!("DELETE FROM {} WHERE instance = $1", self.nodes_table),
                &[&self.instance],
            )
            .await
            .map_err(pg_error("leaving the table of processes"))?;
        }
        let given = match &only {
            None => tx
                .execute(
                    &format!(
                        "UPDATE {} SET expires_at = now() - interval '1 millisecond'
                         WHERE instance = $1 AND expires_at >= now()",
                        self.table
                    ),
                    &[&self.instance],
                )
                .await,
            Some((names, parents)) => tx
                .execute(
                    &format!(
                        "UPDATE {} l SET expires_at = now() - interval '1 millisecond', parent = coalesce(f.parent, l.parent)
                         FROM unnest($2::bytea[], $3::bytea[]) AS f(session, parent)
                         WHERE l.instance = $1 AND l.expires_at >= now() AND l.session = f.session",
                        self.table
                    ),
                    &[&self.instance, names, parents],
                )
                .await,
        }
        .map_err(pg_error(what))?;
        if leave {
            // Its count last, once its tenures are given back: a give-back of this process's
            // under way (its tenure row locked, waiting to write this count) is not waited for
            // by a leave that holds the count's row.
            tx.execute(
                &format!("DELETE FROM {} WHERE instance = $1", self.counts_table),
                &[&self.instance],
            )
            .await
            .map_err(pg_error("leaving the table of processes"))?;
        }
        if given > 0 {
            tx.execute("SELECT pg_notify($1, $2)", &[&self.channel, &self.config.address])
                .await
                .map_err(pg_error("telling the other processes of tenures given back"))?;
        }
        tx.commit().await.map_err(pg_error(what))?;
        Ok(given)
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
        // The rows by their key alone (an index lookup whatever the table's statistics say),
        // matched with the epochs here.
        let sql = format!(
            "SELECT session, epoch, owner FROM {} WHERE session = ANY($1)",
            self.table
        );
        let statement = super::commit::prepared(tx, &sql, what).await?;
        // Sent together, run one after the other: the check's snapshot is taken once the locks
        // are held.
        let lock_params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&keys];
        let check_params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&names];
        let (_, rows) = futures::try_join!(tx.query(&lock, &lock_params), tx.query(&statement, &check_params))
            .map_err(pg_error(what))?;
        let mine: HashMap<&[u8], i64> = names.iter().map(Vec::as_slice).zip(epochs.iter().copied()).collect();
        let ok: HashSet<String> = rows
            .iter()
            .filter(|r| {
                let (session, epoch, owner): (&[u8], i64, &str) = (r.get(0), r.get(1), r.get(2));
                owner == self.config.node && mine.get(session) == Some(&epoch)
            })
            .map(|r| String::from_utf8_lossy(r.get::<_, &[u8]>(0)).into_owned())
            .collect();
        let lost: Vec<String> = sessions.into_iter().filter(|s| !ok.contains(s)).collect();
        if !lost.is_empty() {
            tracing::warn!(sessions = ?lost, "a commit held rows of sessions whose tenure this process no longer holds; they were not written");
            self.lose(lost);
        }
        Ok(ok)
    }
}

/// Sessions by name, each with the parent session its give-back names (a nested one's).
type Named = (Vec<Vec<u8>>, Vec<Option<Vec<u8>>>);

/// How many of `sessions` are top-level ones: what a process's count of sessions held counts
/// (a nested session moves with its parent, never on its own).
fn top_level_in<'a>(sessions: impl IntoIterator<Item = &'a String>) -> i64 {
    sessions
        .into_iter()
        .filter(|s| crate::model::nest_parent(s).is_none())
        .count() as i64
}

/// Tenures to give back: each session, the epoch it was held at, and its parent session when
/// it is a nested one given back to the parent's holder.
#[derive(Debug, Default)]
struct GiveBack {
    names: Vec<Vec<u8>>,
    epochs: Vec<i64>,
    parents: Vec<Option<Vec<u8>>>,
    /// How many of them are top-level sessions counted in [`HeldTenures::giving`].
    counted: i64,
}
