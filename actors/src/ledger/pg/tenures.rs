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
//! - **A tenure lasts as long as its holder's heartbeat.** `nodes(instance, node, address, held,
//!   expires_at)` has one row per process instance, its heartbeat. A tenure is held while its
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
//!   session it writes ([`lock_key`]: one 64-bit key per schema and session), then, in a
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
//!   (one of [`BUCKETS`] per session, at most that many), a takeover takes both of each session
//!   it takes, and a start or a sweep takes its tenures in batches of [`TAKE_BATCH`].
//! - **Processes.** The heartbeats carry how many tenures each process holds. The sweep's one
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

/// How often every stored session is looked at for a missing tenure row (one that a writer not
/// sharing the schema stored): slow, the sweeps never look for them.
pub(super) const RECONCILE_EVERY: Duration = Duration::from_secs(120);

/// How many expired rows of sessions no longer stored one sweep deletes, at most (and how many
/// rows of `nodes` of process instances long dead).
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
    /// The table of live processes.
    nodes_table: String,
    /// The channel a give-back is told on.
    channel: String,
    /// The sessions handed over lately, and when.
    given: Mutex<HashMap<String, Instant>>,
    /// Moves when another process gave tenures back.
    freed: watch::Receiver<u64>,
    /// Tenures this process may still hold in the table without holding them here: given back
    /// at the next renewal ([`HeldTenures::stray`]).
    strays: Mutex<HashSet<String>>,
    /// The local deadline of the last heartbeat written ([`HeldTenures::deadline`] of the
    /// renewal that wrote it): every tenure lasts as long as that heartbeat, so none taken
    /// since is served past it.
    beat: Mutex<Option<Instant>>,
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
            table: format!("\"{schema}\".session_leases"),
            sessions_table,
            pool,
            held: Mutex::new(HashMap::new()),
            on_lost: OnceLock::new(),
            runtime,
            taking: tokio::sync::Mutex::new(()),
            refusals: Mutex::new(HashMap::new()),
            instance: format!("{}{}", crate::model::random_hex(), crate::model::random_hex()),
            nodes_table: format!("\"{schema}\".nodes"),
            channel,
            given: Mutex::new(HashMap::new()),
            freed,
            strays: Mutex::new(HashSet::new()),
            beat: Mutex::new(None),
        })
    }

    /// How many top-level sessions' tenures this process holds: what the spread counts (a
    /// nested session moves with its parent, never on its own).
    fn top_level_held(&self) -> i64 {
        self.held()
            .keys()
            .filter(|s| crate::model::nest_parent(s).is_none())
            .count() as i64
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

    /// SQL: whether the tenure row `l` (its alias) is free to take: given back or run out by its
    /// own expiry (a give-back, a session stored without a tenure, a tenure taken before tenures
    /// lasted as long as their holder's heartbeat), or held by a process instance whose
    /// heartbeat ran out. The dead instances are a few rows of `nodes`, their tenures found by
    /// the index on `instance`, the others' by the index on `expires_at`.
    fn free(&self, l: &str) -> String {
        format!(
            "({l}.expires_at < now() OR {l}.instance = ANY(ARRAY(SELECT hb.instance FROM {} hb WHERE hb.expires_at < now())))",
            self.nodes_table
        )
    }

    /// As [`HeldTenures::free`], for a statement that looks for free tenures among all of them
    /// (a sweep): the dead instances given as the parameter `dead` ([`HeldTenures::dead`]), so
    /// the planner knows them and finds their few tenures by the index on `instance` (given by
    /// a subquery it would guess that they hold their share of every row, and scan them all).
    fn free_among(l: &str, dead: &str) -> String {
        format!("({l}.expires_at < now() OR {l}.instance = ANY({dead}::text[]))")
    }

    /// The process instances whose heartbeat ran out (a few rows of `nodes`).
    async fn dead(client: &deadpool_postgres::Object, nodes: &str) -> Result<Vec<String>, LedgerError> {
        let row = client
            .query_one(
                &format!("SELECT coalesce(array_agg(instance), '{{}}') FROM {nodes} WHERE expires_at < now()"),
                &[],
            )
            .await
            .map_err(pg_error("reading which processes' heartbeats ran out"))?;
        Ok(row.get(0))
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

    /// How many tenures wait to be given back again ([`HeldTenures::stray`]).
    #[cfg(test)]
    pub(super) fn strays(&self) -> usize {
        self.strays.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Renews now, as the renewal task does at its turn.
    #[cfg(test)]
    pub(super) fn renew_now(self: &Arc<Self>) -> Result<(), LedgerError> {
        let tenures = self.clone();
        self.run(async move { tenures.renew().await })
    }

    /// Remembers `session` as a tenure to give back again ([`HeldTenures::stray`]).
    #[cfg(test)]
    pub(super) fn add_stray(&self, session: &str) {
        self.stray([session.to_string()]);
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
        let given = self.give_back_once(back, tell).await;
        if given.is_err() {
            self.stray(names);
        }
        given
    }

    async fn give_back_once(&self, back: GiveBack, tell: bool) -> Result<u64, LedgerError> {
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
        if tell && given > 0 {
            tx.execute("SELECT pg_notify($1, $2)", &[&self.channel, &self.config.address])
                .await
                .map_err(pg_error("telling the other processes of tenures given back"))?;
        }
        tx.commit().await.map_err(pg_error(what))?;
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
            }
        }
        back
    }

    /// Gives back every tenure of this process's instance (those it holds, and any it failed
    /// to give back), and leaves the table of processes: a clean stop. Should it fail, the
    /// heartbeat runs out within a tenure, and the tenures with it.
    async fn leave(&self) -> Result<u64, LedgerError> {
        self.held().clear();
        self.give_back_own(None, true).await
    }

    /// Gives back the tenures of this process's instance (of `only` those sessions, when
    /// named; with `leave`, every one, and its row of `nodes` goes too), and tells the others
    /// when any was given. How many were.
    async fn give_back_own(&self, only: Option<Vec<Vec<u8>>>, leave: bool) -> Result<u64, LedgerError> {
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
        let given = tx
            .execute(
                &format!(
                    "UPDATE {} SET expires_at = now() - interval '1 millisecond'
                     WHERE instance = $1 AND expires_at >= now() AND ($2::bytea[] IS NULL OR session = ANY($2))",
                    self.table
                ),
                &[&self.instance, &only],
            )
            .await
            .map_err(pg_error(what))?;
        if given > 0 {
            tx.execute("SELECT pg_notify($1, $2)", &[&self.channel, &self.config.address])
                .await
                .map_err(pg_error("telling the other processes of tenures given back"))?;
        }
        tx.commit().await.map_err(pg_error(what))?;
        Ok(given)
    }

    /// Writes this process's row of `nodes` (its heartbeat): at start, before any sweep counts
    /// the processes; then with every renewal.
    pub(super) fn join(self: &Arc<Self>) -> Result<(), LedgerError> {
        let tenures = self.clone();
        self.run(async move {
            tenures.renew().await?;
            tenures.reconcile().await.map(|_| ())
        })
    }

    /// Deletes the heartbeats of process instances dead for [`DEAD_NODES_KEPT_MS`] that no
    /// tenure names any more (a tenure naming an instance without a heartbeat would look held
    /// for ever), each judged by its own row as the delete finds it (a heartbeat renewed
    /// meanwhile, by a process paused that long, is kept). Returns how many it deleted.
    pub(super) async fn forget_dead_nodes(&self) -> Result<u64, LedgerError> {
        let client = self.pool.get().await.map_err(pool_error)?;
        client
            .execute(
                &format!(
                    "DELETE FROM {nodes} n WHERE n.expires_at < now() - $1::int8 * interval '1 millisecond'
                       AND NOT EXISTS (SELECT 1 FROM {t} r WHERE r.instance = n.instance AND r.expires_at >= now())",
                    nodes = self.nodes_table,
                    t = self.table,
                ),
                &[&DEAD_NODES_KEPT_MS],
            )
            .await
            .map_err(pg_error("deleting the heartbeats of processes long dead"))
    }

    /// Gives every stored session without a tenure row one, free: the sweeps find free tenures
    /// by their expiry alone. Returns how many it wrote.
    async fn reconcile(&self) -> Result<u64, LedgerError> {
        let client = self.pool.get().await.map_err(pool_error)?;
        let written = client
            .execute(
                &format!(
                    "INSERT INTO {t} (session, owner, address, epoch, expires_at, instance)
                     SELECT s.key, '', '', 0, '-infinity', '' FROM {sessions} s
                     WHERE NOT EXISTS (SELECT 1 FROM {t} l WHERE l.session = s.key)
                     ON CONFLICT (session) DO NOTHING",
                    t = self.table,
                    sessions = self.sessions_table
                ),
                &[],
            )
            .await
            .map_err(pg_error("giving stored sessions without a tenure row one"))?;
        if written > 0 {
            tracing::info!(
                sessions = written,
                "stored sessions without a tenure row were given one (free)"
            );
        }
        Ok(written)
    }

    /// What the live processes hold and what is free; writes this process's held count first
    /// when it changed, and deletes a few expired rows of sessions no longer stored.
    async fn spread(&self) -> Result<Spread, LedgerError> {
        let client = self.pool.get().await.map_err(pool_error)?;
        let held = self.top_level_held();
        let given = self.recently_given();
        let stored = format!(
            "EXISTS (SELECT 1 FROM {} s WHERE s.key = l.session)",
            self.sessions_table
        );
        let dead = Self::dead(&client, &self.nodes_table).await?;
        // The rows to delete are found with the dead instances named (by index), and each is
        // judged again as the delete finds it with the heartbeats as they are then: a tenure
        // taken meanwhile by an instance revived since is kept.
        let (free, free_d) = (Self::free_among("l", "$6"), self.free("d"));
        let row = client
            .query_one(
                &format!(
                    "WITH beat AS (
                         UPDATE {nodes} SET held = $3 WHERE instance = $2 AND held <> $3),
                     gone AS (
                         DELETE FROM {t} d WHERE d.session IN (
                             SELECT l.session FROM {t} l WHERE {free} AND NOT {stored} LIMIT $4)
                           AND {free_d})
                     SELECT
                         (SELECT count(*) FROM {t} l WHERE {free} AND l.parent IS NULL AND NOT {NESTED}
                              AND {stored}),
                         (SELECT count(*) FROM {t} l WHERE {free} AND l.parent IS NULL AND NOT {NESTED}
                              AND NOT (l.session = ANY($5)) AND {stored}),
                         (SELECT count(*) FROM {t} l JOIN {t} p ON p.session = l.parent
                              WHERE {free} AND p.owner = $1 AND p.instance = $2
                                AND p.expires_at >= now() AND {stored})
                         + (SELECT count(*) FROM {t} l WHERE {free} AND l.parent IS NULL AND {NESTED}
                              AND NOT (l.session = ANY($5)) AND {stored}),
                         coalesce((SELECT array_agg(n.held) FROM {nodes} n WHERE n.expires_at >= now() AND n.node <> $1),
                                  '{{}}'::bigint[])",
                    nodes = self.nodes_table,
                    t = self.table,
                ),
                &[
                    &self.config.node,
                    &self.instance,
                    &held,
                    &GONE_PER_SWEEP,
                    &given,
                    &dead,
                ],
            )
            .await
            .map_err(pg_error("reading how the sessions are spread"))?;
        let count = |i: usize| u64::try_from(row.get::<_, i64>(i)).unwrap_or(0);
        Ok(Spread {
            free: count(0),
            takeable: count(1),
            nests: count(2),
            others: row
                .get::<_, Vec<i64>>(3)
                .into_iter()
                .map(|h| u64::try_from(h).unwrap_or(0))
                .collect(),
        })
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

    /// Renews this process's heartbeat, which every tenure it holds lasts as long as: one row
    /// written, whatever it holds. When the heartbeat had run out (a pause or an outage longer
    /// than a tenure), the others may have taken tenures meanwhile: the held ones are read back
    /// by key, and those taken over are lost. Then the tenures this process failed to give back
    /// are given back.
    async fn renew(self: &Arc<Self>) -> Result<(), LedgerError> {
        let (names, epochs): (Vec<Vec<u8>>, Vec<i64>) = self
            .held()
            .iter()
            .map(|(s, h)| (s.as_bytes().to_vec(), h.epoch))
            .unzip();
        let held = self.top_level_held();
        let sent = Instant::now();
        let mut client = self.pool.get().await.map_err(pool_error)?;
        let what = "renewing this process's heartbeat";
        let alive: bool = client
            .query_one(
                &format!(
                    "WITH before AS (SELECT expires_at FROM {nodes} WHERE instance = $3),
                     beat AS (
                         INSERT INTO {nodes} AS n (node, address, instance, held, expires_at)
                         VALUES ($1, $2, $3, $4, now() + $5::int8 * interval '1 millisecond')
                         ON CONFLICT (instance) DO UPDATE SET node = EXCLUDED.node, address = EXCLUDED.address,
                             held = EXCLUDED.held, expires_at = EXCLUDED.expires_at
                         RETURNING clock_timestamp() AS written)
                     SELECT coalesce((SELECT expires_at FROM before), '-infinity')
                         > (SELECT written FROM beat) + $5::int8 / 5 * interval '1 millisecond'",
                    nodes = self.nodes_table,
                ),
                &[
                    &self.config.node,
                    &self.config.address,
                    &self.instance,
                    &held,
                    &self.ttl_ms(),
                ],
            )
            .await
            .map_err(pg_error(what))?
            .get(0);
        // Alive throughout only when the old heartbeat outlived this one's writing by a fifth
        // of a tenure (the commit follows at once): a statement sent in time but held up past
        // the heartbeat's end (a lock, a stalled server) counts as a lapse, as another process
        // may have seen the heartbeat out meanwhile and taken tenures.
        // After a lapse, what is still this process's at the epoch it holds. A takeover begun
        // while the heartbeat was out may not have committed yet: the tenures' advisory locks
        // are taken shared first, as a commit's check takes them, so the read waits for every
        // takeover under way (and one that comes after sees the heartbeat alive again).
        let kept: Option<HashSet<Vec<u8>>> = if alive || names.is_empty() {
            None
        } else {
            let what = "reading the session tenures held through a lapsed heartbeat";
            let tx = client.transaction().await.map_err(pg_error(what))?;
            tx.query(
                "SELECT count(pg_advisory_xact_lock_shared(k)) FROM unnest($1::int8[]) AS k",
                &[&commit_keys(&self.table, &names)],
            )
            .await
            .map_err(pg_error(what))?;
            let rows = tx
                .query(
                    &format!(
                        "SELECT l.session FROM {t} l JOIN unnest($1::bytea[], $2::int8[]) AS f(session, epoch)
                         ON l.session = f.session AND l.epoch = f.epoch AND l.owner = $3 AND l.instance = $4",
                        t = self.table
                    ),
                    &[&names, &epochs, &self.config.node, &self.instance],
                )
                .await
                .map_err(pg_error(what))?;
            tx.commit().await.map_err(pg_error(what))?;
            Some(rows.into_iter().map(|r| r.get(0)).collect())
        };
        drop(client);
        let deadline = self.deadline(sent);
        {
            let mut beat = self.beat.lock().unwrap_or_else(|p| p.into_inner());
            *beat = Some(beat.map_or(deadline, |b| b.max(deadline)));
        }
        let mut lost = Vec::new();
        {
            let mut held = self.held();
            for (name, epoch) in names.iter().zip(&epochs) {
                let shown = String::from_utf8_lossy(name).into_owned();
                // Taken again meanwhile, at a new epoch, or lost already: as it is.
                let Some(h) = held.get_mut(&shown).filter(|h| h.epoch == *epoch) else {
                    continue;
                };
                if kept.as_ref().is_some_and(|k| !k.contains(name)) {
                    lost.push(shown);
                } else {
                    h.deadline = h.deadline.max(deadline);
                }
            }
        }
        self.lose(lost);
        self.give_back_strays().await
    }

    /// Remembers tenures that may still be this process's in the table although it no longer
    /// holds them (a give-back that failed, a take whose answer was lost): given back at the
    /// next renewal, as a tenure does not run out by itself while its holder is alive.
    fn stray(&self, sessions: impl IntoIterator<Item = String>) {
        self.strays.lock().unwrap_or_else(|p| p.into_inner()).extend(sessions);
    }

    /// Gives back the tenures of [`HeldTenures::stray`] that are still this process's
    /// instance's and are not held again.
    async fn give_back_strays(&self) -> Result<(), LedgerError> {
        if self.strays.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
            return Ok(());
        }
        // Not while a take is under way (it may wait for others' commits for up to a tenure):
        // the renewals go on meanwhile, and a later one gives these back.
        let Ok(_turn) = self.taking.try_lock() else {
            return Ok(());
        };
        let names: Vec<Vec<u8>> = {
            let held = self.held();
            let mut strays = self.strays.lock().unwrap_or_else(|p| p.into_inner());
            strays.retain(|s| !held.contains_key(s));
            strays.iter().map(|s| s.as_bytes().to_vec()).collect()
        };
        if names.is_empty() {
            return Ok(());
        }
        let given = self.give_back_own(Some(names.clone()), false).await?;
        let mut strays = self.strays.lock().unwrap_or_else(|p| p.into_inner());
        for name in &names {
            strays.remove(String::from_utf8_lossy(name).as_ref());
        }
        if given > 0 {
            tracing::info!(sessions = given, "session tenures not held any more were given back");
        }
        Ok(())
    }

    /// Starts the renewal task on the ledger's runtime; it ends when the held tenures are dropped.
    pub(super) fn start_renewing(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let every = self.config.ttl / 3;
        self.runtime.spawn(async move {
            let mut reconciled = Instant::now();
            loop {
                tokio::time::sleep(every).await;
                let Some(tenures) = weak.upgrade() else { return };
                if let Err(e) = tenures.renew().await {
                    tracing::warn!("renewing session tenures failed (retried at the next turn): {e}");
                }
                if reconciled.elapsed() >= RECONCILE_EVERY {
                    reconciled = Instant::now();
                    if let Err(e) = tenures.reconcile().await {
                        tracing::warn!(
                            "looking for stored sessions without a tenure row failed (tried again later): {e}"
                        );
                    }
                    if let Err(e) = tenures.forget_dead_nodes().await {
                        tracing::warn!(
                            "deleting the heartbeats of processes long dead failed (tried again later): {e}"
                        );
                    }
                }
            }
        });
    }

    /// Takes tenures by one upsert: for `session` alone, or (none) for up to `limit` stored
    /// top-level sessions whose tenure is free and which this process did not give back, and
    /// every free nested session whose parent session this process holds. Free tenures are
    /// found by their expiry (an index range), not by a scan of the sessions.
    async fn take(self: Arc<Self>, session: Option<String>, limit: usize) -> Result<Vec<(String, i64)>, LedgerError> {
        let _turn = self.taking.lock().await;
        let sent = Instant::now();
        let mut client = self.pool.get().await.map_err(pool_error)?;
        let what = "taking session tenures";
        let held: Vec<Vec<u8>> = self.held().keys().map(|s| s.as_bytes().to_vec()).collect();
        let one = session.map(String::into_bytes);
        let candidates: Vec<Vec<u8>> = match &one {
            Some(name) => vec![name.clone()],
            None => {
                let stored = format!(
                    "EXISTS (SELECT 1 FROM {} s WHERE s.key = l.session)",
                    self.sessions_table
                );
                // Top-level sessions up to the limit; nested ones given back to the holder of
                // their parent (this process); nested ones whose parent is not named (taken by
                // any process, which leaves each to the holder of its parent: see adopt.rs).
                let dead = Self::dead(&client, &self.nodes_table).await?;
                let free = Self::free_among("l", "$6");
                let sql = format!(
                    "(SELECT l.session FROM {t} l
                      WHERE {free} AND l.parent IS NULL AND NOT {NESTED}
                        AND NOT (l.session = ANY($2)) AND NOT (l.session = ANY($5)) AND {stored}
                      ORDER BY l.expires_at, l.session LIMIT $4)
                     UNION
                     (SELECT l.session FROM {t} l JOIN {t} p ON p.session = l.parent
                      WHERE {free} AND NOT (l.session = ANY($2)) AND p.owner = $1 AND p.instance = $3
                        AND p.expires_at >= now() AND {stored})
                     UNION
                     (SELECT l.session FROM {t} l
                      WHERE {free} AND l.parent IS NULL AND {NESTED}
                        AND NOT (l.session = ANY($2)) AND NOT (l.session = ANY($5)) AND {stored})
                     ORDER BY 1",
                    t = self.table
                );
                let limit = i64::try_from(limit).unwrap_or(i64::MAX);
                let given = self.recently_given();
                client
                    .query(&sql, &[&self.config.node, &held, &self.instance, &limit, &given, &dead])
                    .await
                    .map_err(pg_error(what))?
                    .into_iter()
                    .map(|r| r.get(0))
                    .collect()
            }
        };
        // In batches, each a transaction of its own: a batch taken stays taken (and held) when a
        // later one fails, and is answered, so the caller serves it; the next sweep takes the rest.
        let mut taken: Vec<(String, i64)> = Vec::new();
        for batch in candidates.chunks(TAKE_BATCH) {
            let answer = self.take_batch(&mut client, batch, &held, sent).await;
            if answer.is_err() {
                // Its commit may have gone through unanswered: what it took is given back.
                self.stray(batch.iter().map(|n| String::from_utf8_lossy(n).into_owned()));
            }
            match answer {
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
        if taken.len() >= VACUUM_AFTER {
            // Their rows changed from free to held at once. Cleaned now, not at the next
            // automatic vacuum: until then the index on expiry still holds their free versions
            // (every sweep would read them all to find none free), and the planner's statistics
            // still count them free.
            if let Err(e) = client.batch_execute(&format!("VACUUM (ANALYZE) {}", self.table)).await {
                tracing::warn!("cleaning the tenure table after a large take failed: {e}");
            }
        }
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
        // Held as long as this process's heartbeat is: taken only while it is alive, its row
        // of `nodes` locked against a delete until this commits (so no tenure ever names an
        // instance without one: [`HeldTenures::leave`] deletes it first), and never running out
        // by itself ('infinity') until given back.
        let sql = format!(
            "INSERT INTO {t} AS l (session, owner, address, epoch, expires_at, instance)
             SELECT src.key, $1, $2, 1, 'infinity', $4 FROM unnest($5::bytea[]) AS src(key)
             WHERE EXISTS (SELECT 1 FROM {nodes} me WHERE me.instance = $4 AND me.expires_at >= now()
                           FOR KEY SHARE)
             ON CONFLICT (session) DO UPDATE SET owner = EXCLUDED.owner, address = EXCLUDED.address,
                 epoch = l.epoch + 1, expires_at = EXCLUDED.expires_at, instance = EXCLUDED.instance
               WHERE ({free} OR l.instance = $4) AND NOT (l.session = ANY($3))
             RETURNING l.session, l.epoch",
            t = self.table,
            nodes = self.nodes_table,
            free = self.free("l"),
        );
        let rows = tx
            .query(
                &sql,
                &[&self.config.node, &self.config.address, &held, &self.instance, &batch],
            )
            .await
            .map_err(pg_error(what))?;
        tx.commit().await.map_err(pg_error(what))?;
        // Served no longer than the heartbeat it lasts as long as (its take found it alive).
        let beat = *self.beat.lock().unwrap_or_else(|p| p.into_inner());
        let deadline = beat.map_or(sent, |b| b.min(self.deadline(sent)));
        let taken: Vec<(String, i64)> = rows
            .into_iter()
            .map(|r| (String::from_utf8_lossy(r.get::<_, &[u8]>(0)).into_owned(), r.get(1)))
            .collect();
        let mut mine = self.held();
        let mut given = self.given();
        for (s, epoch) in &taken {
            given.remove(s);
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

/// Tenures to give back: each session, the epoch it was held at, and its parent session when
/// it is a nested one given back to the parent's holder.
#[derive(Debug, Default)]
struct GiveBack {
    names: Vec<Vec<u8>>,
    epochs: Vec<i64>,
    parents: Vec<Option<Vec<u8>>>,
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
            let taken = tenures.clone().take(Some(name.clone()), 1).await?;
            if let Some((_, epoch)) = taken.first() {
                return Ok(TenureHolder::Here(*epoch as u64));
            }
            // A sweep of this process may have taken it just before.
            if let Some(h) = tenures.held().get(&name) {
                return Ok(TenureHolder::Here(h.epoch as u64));
            }
            // A live holder only: a free tenure was not taken because it was given back (or
            // its holder's heartbeat ran out) since, or because this process's own heartbeat
            // is out (it takes nothing then), and is nobody's to send the request to.
            match tenures.holder_row(name.as_bytes().to_vec(), true, true).await? {
                Some(elsewhere) => Ok(elsewhere),
                None => Err(LedgerError::storage_msg(format!(
                    "the tenure of session `{name}` was free but not taken (it changed hands meanwhile, or this process's heartbeat ran out); retry"
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
        self.0.run(async move { tenures.holder_row(name, true, true).await })
    }

    fn recorded_holder(&self, session_id: &str) -> Result<Option<TenureHolder>, LedgerError> {
        let tenures = self.0.clone();
        let name = session_id.as_bytes().to_vec();
        self.0.run(async move { tenures.holder_row(name, true, false).await })
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
        let (pool, table, live, me) = (
            self.0.pool.clone(),
            self.0.table.clone(),
            self.0.free("l"),
            self.0.instance.clone(),
        );
        let rows: Vec<(Vec<u8>, String, String)> = self.0.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            let rows = client
                .query(
                    // Rows of this process's own that it does not hold (a take under way, a
                    // give-back) name nobody else: left out.
                    &format!(
                        "SELECT session, owner, address FROM {table} l
                         WHERE session = ANY($1) AND NOT {live} AND instance <> $2"
                    ),
                    &[&ask, &me],
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

    fn acquire_free(&self, limit: usize) -> Result<Vec<String>, LedgerError> {
        let tenures = self.0.clone();
        let taken = self.0.run(async move { tenures.take(None, limit).await })?;
        Ok(taken.into_iter().map(|(s, _)| s).collect())
    }

    fn spread(&self) -> Result<Spread, LedgerError> {
        let tenures = self.0.clone();
        self.0.run(async move { tenures.spread().await })
    }

    fn held_count(&self) -> usize {
        usize::try_from(self.0.top_level_held()).unwrap_or(0)
    }

    fn hand_over(&self, sessions: &[(String, Option<String>)]) -> Result<(), LedgerError> {
        let back = self.0.unhold(sessions);
        {
            let now = Instant::now();
            let ttl = self.0.config.ttl;
            let mut given = self.0.given();
            given.retain(|_, at| now.duration_since(*at) < ttl);
            for (s, _) in sessions {
                given.insert(s.clone(), now);
            }
        }
        let tenures = self.0.clone();
        let given = self.0.run(async move { tenures.give_back(back, true).await })?;
        tracing::info!(sessions = given, "session tenures handed over to the other processes");
        Ok(())
    }

    fn handed_over(&self, session_id: &str) -> bool {
        self.0
            .given()
            .get(session_id)
            .is_some_and(|at| at.elapsed() < self.0.config.ttl)
    }

    fn leave_to_parent(&self, session_id: &str, parent: &str) {
        let back = self.0.unhold(&[(session_id.to_string(), Some(parent.to_string()))]);
        if back.names.is_empty() {
            return;
        }
        let tenures = self.0.clone();
        let shown = session_id.to_string();
        // Not waited for: a tenure not given back runs out by itself (and is then anyone's).
        self.0.runtime.spawn(async move {
            if let Err(e) = tenures.give_back(back, true).await {
                tracing::warn!(session = %shown, "giving a nested session's tenure back failed (it runs out by itself): {e}");
            }
        });
    }

    fn freed(&self) -> Option<watch::Receiver<u64>> {
        Some(self.0.freed.clone())
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
        let shown = session_id.to_string();
        let back = GiveBack {
            names: vec![session_id.as_bytes().to_vec()],
            epochs: vec![held.epoch],
            parents: vec![None],
        };
        self.0.runtime.spawn(async move {
            if let Err(e) = tenures.give_back(back, false).await {
                tracing::warn!(session = %shown, "giving a session tenure back failed (it runs out by itself): {e}");
            }
        });
    }

    fn release_all(&self) {
        let tenures = self.0.clone();
        match self.0.run(async move { tenures.leave().await }) {
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
