//! [`PgLedger`]: the ledger on PostgreSQL (14 or later), behind the same [`Ledger`] trait as
//! sled, with the same rows, keys and answers (the conformance suite runs on both).
//!
//! - **Tables.** One table per tree in a schema of the ledger's own (`brood` by default), each
//!   `(key bytea PRIMARY KEY, value bytea)`: the keys are sled's keys ([`row_key`], or the
//!   session id), so one session's rows are one key range here too, and a range or a page is
//!   the same bytes in the same (bytewise) order; the values are the same codec rows.
//! - **Schema versions.** Migrations are numbered and applied at open, in one transaction under
//!   an advisory lock (processes starting together wait for each other). A database whose
//!   schema is newer than this build is refused, with nothing changed.
//! - **Writes.** [`Ledger::write`] and [`Ledger::put_claim`] only stage rows in memory (the
//!   last write of a key wins, as in sled). [`Ledger::flush`] commits what is staged in one
//!   transaction with `synchronous_commit = on`, everything that arrived meanwhile together
//!   (group commit). Up to [`COMMITS_IN_FLIGHT`] commits are in flight at once, never two on
//!   one key (see `staging`); a flush returns once every write made before it is committed,
//!   by whichever transaction took it.
//! - **Reads** commit what is staged first, so a read sees every write made before it, as in
//!   sled.
//! - **Threads.** The client is async (tokio-postgres, a deadpool pool): it runs on a runtime
//!   of the ledger's own, on a thread of its own, and each trait method waits for its answer.
//!   The trait's callers are the actors' threads and blocking jobs, none of them that runtime.
//!   Reads of whole sessions and whole tables run on a second runtime and pool of their own
//!   ([`Reads`]), so their rows are received beside the commits, not between them.
//!
//! - **Sharing.** Opened [`PgLedger::shared`], several processes share the database: each
//!   session is served by the holder of its tenure, and every commit is fenced by the tenures
//!   (see `tenures`).
//! - **Failover.** Given several hosts (`postgres://u@h1:p1,h2:p2/db` with
//!   `?target_session_attrs=read-write`), every connection goes to the one that takes writes. A commit that failed
//!   when its server died is staged again and committed on the promoted standby by the next
//!   flush; tenures whose renewals failed meanwhile are renewed at their epoch once a server
//!   answers (nobody took them), and the work list's listening connection is made again there.
//!   With a synchronous standby nothing committed is missing from it (tests: `tests/failover.rs`
//!   here, and the workspace's `tests/failover.rs` through `brood serve`).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

use super::rows::{
    child_write, decode_at, decode_checked, decode_rows, encode, find_call_in, fold_delivery, merge_terminals,
    quarantine_entry, read_quarantined, report_kept, row_key, session_prefix, write_changes, Change, ChildWrite,
};
use super::trees::*;
use super::{CallParts, ChildRuns, Durability, Ledger, LedgerError, OldestRows, RowSink, Snapshot, Writes};
use crate::codec;
use crate::model::*;

mod commit;
mod directory;
mod listing;
mod migrate;
mod reads;
mod runtime;
mod staging;
mod tenures;
mod terminals;

use commit::upsert;
pub use tenures::TenureConfig;
use tenures::{HeldTenures, PgTenures};

use runtime::Runtime;
use terminals::{encode_terminals, record_rows};

/// The schema a ledger opened without one named uses.
pub const DEFAULT_SCHEMA: &str = "brood";

/// The schema's tables: one per tree of rows, then brood's own.
fn tables() -> impl Iterator<Item = &'static str> {
    super::ROW_TREES.into_iter().chain([META, QUARANTINE, QUARANTINE_RAW])
}

/// The index of calls by their id (migration 6), built without blocking the writes of the
/// processes that use the schema meanwhile: `CREATE INDEX CONCURRENTLY` after the migration's
/// transaction, by each process that opens the schema and finds it missing or left invalid by a
/// build that was interrupted. Until it is valid, a lookup by call id reads the whole table.
const CALL_INDEX: &str = "calls_by_call_id";

/// The call id part of a call row's key (after the NUL that ends its session id, which holds
/// no control character), as the index of migration 6 and [`Ledger::find_call`] write it.
const CALL_ID_OF_KEY: &str = "substring(key FROM position('\\x00'::bytea IN key) + 1)";

/// Sessions read per statement by [`Ledger::load_sessions`]: their keys are bound as arrays,
/// and the rows of a chunk are read into memory together.
const LOAD_CHUNK: usize = 1000;

/// A commit's transaction (its statements prepared once per connection).
type Tx<'a> = deadpool_postgres::Transaction<'a>;

/// Statements run inside a commit's transaction (given the sessions whose tenure this process
/// no longer holds, when it shares the database: their rows must not be written): their answer,
/// and the rows they wrote (staged again should the commit fail).
type Job<'t, T> = std::pin::Pin<Box<dyn Future<Output = Result<(T, Vec<Change>), LedgerError>> + Send + 't>>;

/// How long connecting to the server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections in the pool: the commits in flight (owners' flushes, the coalescer's terminal
/// rows and its flush), and small reads beside them (a row, a page, a count). With four (three
/// commits in flight), `durable_children_per_s` measured 0.99× the SKIP LOCKED queue against
/// 1.035× with seven (medians of 14 runs taking turns).
const POOL_SIZE: usize = 7;

/// Connections of the reads of whole sessions ([`Reads`]): two at once (a start's or a
/// rebuild's beside a take-up's); a third waits for one of them. Each holds its connection
/// while its rows come (a second or two for a million).
const READ_POOL_SIZE: usize = 2;

/// The ledger on PostgreSQL.
pub struct PgLedger {
    inner: Arc<Inner>,
    /// Writes not yet committed, and the keys the commits in flight hold.
    staging: Mutex<staging::Staging>,
    /// Told whenever a commit ends (flushes and writers of held keys wait for it).
    committed: std::sync::Condvar,
    on_flush: Option<super::FlushObserver>,
    /// Tests: the next commit's answer is lost (it is rolled back and reported failed, as a
    /// commit whose connection died).
    #[cfg(test)]
    lose_next_commit: std::sync::atomic::AtomicBool,
    /// Tests: how many times a flush waited for a commit in flight.
    #[cfg(test)]
    settle_waits: std::sync::atomic::AtomicUsize,
    /// Tests: a read of many sessions reads each range in reverse key order first (as a
    /// server that did not keep the ranges' order would answer).
    #[cfg(test)]
    unordered_reads: std::sync::atomic::AtomicBool,
    /// The ledger's runtime: its commits, tenures, small reads.
    runtime: Runtime,
    reads: Reads,
}

/// Where the reads of whole sessions run (a start's, an owner's rebuild, a take-up's, see
/// [`PgLedger::read_many`]), and of every row of a table (the dead letters, the quarantine): on
/// connections of their own, driven on a thread of their own. Their rows, thousands at a time,
/// are received there, while the ledger's thread goes on with every other session's commits:
/// on the ledger's thread, receiving the 10,000 rows of one rebuilt owner held the other
/// sessions' commits back by several milliseconds.
struct Reads {
    pool: Pool,
    runtime: Runtime,
}

/// A pool of at most `size` connections made as `config` says, its timers and connections
/// on `runtime`.
fn pool_on(runtime: &Runtime, config: &tokio_postgres::Config, size: usize) -> Result<Pool, LedgerError> {
    let manager = Manager::from_config(
        config.clone(),
        NoTls,
        ManagerConfig {
            // A connection is checked only for being closed when it is taken from the pool,
            // not with a query: connections are made only to a server that takes writes
            // (with `target_session_attrs=read-write`), a server stays so until it stops
            // (which breaks them), and one whose server died is closed by then, so dropped
            // and replaced, never reused after a failover.
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let _entered = runtime.handle.enter();
    Pool::builder(manager)
        .max_size(size)
        .create_timeout(Some(CONNECT_TIMEOUT))
        .recycle_timeout(Some(CONNECT_TIMEOUT))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .map_err(|e| LedgerError::storage("making the PostgreSQL connection pool", e))
}

/// A stored key: sled's bytes.
type Key = Vec<u8>;

/// Commits in flight at once, at most: the pool keeps a connection for reads.
const COMMITS_IN_FLIGHT: usize = POOL_SIZE - 1;

/// What the jobs on the ledger's runtime share.
struct Inner {
    schema: String,
    pool: Pool,
    /// How the pool connects (for the work list's listening connection).
    config: tokio_postgres::Config,
    /// The session tenures, when several processes share the database.
    tenures: Option<Arc<HeldTenures>>,
    /// The shared list of children waiting for outside workers, then.
    directory: Option<Arc<directory::PgDirectory>>,
    /// Statements sent ([`PgLedger::statements`]).
    statements: Arc<std::sync::atomic::AtomicU64>,
}

impl Inner {
    /// The schema's table of `tree`, quoted.
    fn table(&self, tree: &str) -> String {
        format!("\"{}\".\"{tree}\"", self.schema)
    }

    /// Counts `n` statements sent ([`PgLedger::statements`]).
    fn sent(&self, n: usize) {
        self.statements
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The statements sent by every ledger of this process, by schema: tests read how many a
/// start sent ([`statements_in`]).
#[cfg(any(test, feature = "failpoints"))]
fn counters(schema: &str) -> Arc<std::sync::atomic::AtomicU64> {
    static BY_SCHEMA: std::sync::OnceLock<Mutex<HashMap<String, Arc<std::sync::atomic::AtomicU64>>>> =
        std::sync::OnceLock::new();
    let mut all = BY_SCHEMA
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    all.entry(schema.to_string()).or_default().clone()
}

/// How many statements the PostgreSQL ledgers of this process opened in `schema` sent so far
/// (as [`PgLedger::statements`] counts them, added up): for tests.
#[cfg(any(test, feature = "failpoints"))]
pub fn statements_in(schema: &str) -> u64 {
    counters(schema).load(std::sync::atomic::Ordering::Relaxed)
}

/// The advisory lock a commit writing `session` alone, in the ledger in `schema`, takes shared
/// (and a takeover of it exclusively): for tests that hold it as a commit in flight does.
#[cfg(any(test, feature = "failpoints"))]
pub fn commit_lock_key(schema: &str, session: &str) -> i64 {
    tenures::commit_lock_key(schema, session)
}

impl Drop for PgLedger {
    /// A clean close commits what is staged (claims, marks), as sled's close flushes: a claim a
    /// boundary made before a shutdown is known as lost after it, not unknown.
    fn drop(&mut self) {
        if let Err(e) = self.settle() {
            tracing::warn!("committing the PostgreSQL ledger's last writes at close failed: {e}");
        }
    }
}

impl std::fmt::Debug for PgLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLedger").field("schema", &self.inner.schema).finish()
    }
}

fn pg_error(context: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> LedgerError {
    let context = context.into();
    move |e| LedgerError::storage(context, e)
}

fn pool_error(e: deadpool_postgres::PoolError) -> LedgerError {
    LedgerError::storage("getting a PostgreSQL connection", e)
}

impl PgLedger {
    /// Opens the ledger in the database `url` (`postgres://user@host:port/db`), in the schema
    /// [`DEFAULT_SCHEMA`], creating or migrating its tables.
    pub fn open(url: &str) -> Result<Self, LedgerError> {
        Self::open_in(url, DEFAULT_SCHEMA)
    }

    /// As [`PgLedger::open`], in the schema `schema` (lower-case letters, digits and `_`,
    /// starting with a letter): several ledgers can share one database.
    pub fn open_in(url: &str, schema: &str) -> Result<Self, LedgerError> {
        Self::open_with(url, schema, None)
    }

    /// As [`PgLedger::open_in`], shared with other brood processes: sessions are served under
    /// tenures ([`TenureConfig`]), every commit is fenced by them, and they are renewed in the
    /// background from now on. The connections give up a lock wait after a tenure time, and the
    /// server ends a transaction of this process left idle for half a tenure (the process was
    /// paused mid-commit): its row locks would otherwise keep a takeover waiting as long as the
    /// pause lasts.
    pub fn open_shared(url: &str, schema: &str, config: TenureConfig) -> Result<Self, LedgerError> {
        if config.ttl < Duration::from_millis(300) {
            return Err(LedgerError::storage_msg(format!(
                "a session tenure (`session_lease_ms`) of {:?} is too short to renew; give at least 300 ms",
                config.ttl
            )));
        }
        let ledger = Self::open_with(url, schema, Some(config.ttl))?;
        ledger.shared(config)
    }

    fn open_with(url: &str, schema: &str, tenure: Option<Duration>) -> Result<Self, LedgerError> {
        let valid = schema.chars().next().is_some_and(|c| c.is_ascii_lowercase())
            && schema
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            && schema.len() <= 48;
        if !valid {
            return Err(LedgerError::storage_msg(format!(
                "the schema name `{schema}` is not lower-case letters, digits and `_`, starting with a letter (at most 48)"
            )));
        }
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
            LedgerError::storage(
                "reading the PostgreSQL address (expected postgres://user@host:port/database)",
                e,
            )
        })?;
        // Nothing is reported as recorded before its commit is durable on the server (I1);
        // after whatever options the address gave.
        let mut ours = "-c synchronous_commit=on".to_string();
        if let Some(ttl) = tenure {
            ours = format!(
                "{ours} -c lock_timeout={} -c idle_in_transaction_session_timeout={}",
                ttl.as_millis(),
                (ttl / 2).as_millis().max(100)
            );
        }
        let options = match config.get_options() {
            Some(given) => format!("{given} {ours}"),
            None => ours,
        };
        config.options(&options);
        // A server that went away without a word (power, a partition) is noticed, not waited
        // on for hours.
        config.connect_timeout(CONNECT_TIMEOUT);
        config.keepalives_idle(Duration::from_secs(10));
        config.application_name("brood");
        let runtime = Runtime::start("brood-pg", false)?;
        let pool = pool_on(&runtime, &config, POOL_SIZE)?;
        let reads = {
            // Large reads (a start, an owner's rebuild, a take-up) are received behind the
            // commits and the routing when they meet.
            let runtime = Runtime::start("brood-pg-read", true)?;
            Reads {
                pool: pool_on(&runtime, &config, READ_POOL_SIZE)?,
                runtime,
            }
        };
        let ledger = PgLedger {
            inner: Arc::new(Inner {
                schema: schema.to_string(),
                pool,
                config,
                tenures: None,
                directory: None,
                #[cfg(any(test, feature = "failpoints"))]
                statements: counters(schema),
                #[cfg(not(any(test, feature = "failpoints")))]
                statements: Default::default(),
            }),
            staging: Mutex::new(staging::Staging::default()),
            committed: std::sync::Condvar::new(),
            on_flush: None,
            #[cfg(test)]
            lose_next_commit: Default::default(),
            #[cfg(test)]
            settle_waits: Default::default(),
            #[cfg(test)]
            unordered_reads: Default::default(),
            runtime,
            reads,
        };
        ledger.migrate()?;
        Ok(ledger)
    }

    /// Shares the database with other brood processes (see [`PgLedger::open_shared`]).
    fn shared(mut self, config: TenureConfig) -> Result<Self, LedgerError> {
        let book = HeldTenures::new(
            config.clone(),
            &self.inner.schema,
            self.inner.table(SESSIONS),
            self.inner.pool.clone(),
            pool_on(&self.runtime, &self.inner.config, 1)?,
            self.inner.config.clone(),
            self.runtime.handle.clone(),
        );
        let Some(inner) = Arc::get_mut(&mut self.inner) else {
            return Err(LedgerError::storage_msg(
                "the ledger is in use already; share it before using it",
            ));
        };
        inner.directory = Some(directory::PgDirectory::start(
            &inner.schema,
            config.address.clone(),
            book.instance().to_string(),
            inner.pool.clone(),
            inner.config.clone(),
            self.runtime.handle.clone(),
        ));
        inner.tenures = Some(book.clone());
        // Counted among the live processes before its first sweep.
        book.join()?;
        book.start_renewing();
        Ok(self)
    }

    /// Who holds the tenure of `session_id` and at which epoch (how many times the session was
    /// taken up), when processes shared the database; none when it was never held.
    pub fn tenure_of(&self, session_id: &str) -> Result<Option<(String, u64)>, LedgerError> {
        let (pool, table) = (
            self.inner.pool.clone(),
            format!("\"{}\".session_leases", self.inner.schema),
        );
        let name = session_id.as_bytes().to_vec();
        self.inner.sent(1);
        self.runtime.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            let row = client
                .query_opt(
                    &format!("SELECT owner, epoch FROM {table} WHERE session = $1"),
                    &[&name],
                )
                .await
                .map_err(pg_error("reading a session tenure"))?;
            Ok(row.map(|r| (r.get(0), r.get::<_, i64>(1) as u64)))
        })
    }

    /// How many statements this ledger sent to the server so far to read and commit rows: each
    /// read one (a batched read of many sessions one per table and chunk), each commit's
    /// transaction one, whatever it holds. The session tenures' statements (taking, renewing,
    /// giving back) and the shared work list's are not counted. Opened twice on one schema in
    /// one process (in tests), the two ledgers share one count.
    pub fn statements(&self) -> u64 {
        self.inner.statements.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Tells `observer` how long each successful flush took (its commit included).
    pub fn on_flush(mut self, observer: super::FlushObserver) -> Self {
        self.on_flush = Some(observer);
        self
    }
}

impl Ledger for PgLedger {
    fn write(&self, w: &Writes) -> Result<(), LedgerError> {
        crate::failpoint!("ledger_write");
        if crate::failpoints::fires("ledger_write_stall") {
            // A slow server: the write goes through, late.
            std::thread::sleep(Duration::from_millis(400));
        }
        let changes = write_changes(w)?;
        let mut st = self.staging();
        for (tree, key, value) in changes {
            st.stage((tree, key), value);
        }
        Ok(())
    }

    fn record_terminals(&self, rows: Vec<ChildRow>) -> Result<Vec<ChildRow>, LedgerError> {
        crate::failpoint!("ledger_write");
        let sessions = rows.iter().map(|r| r.session_id.clone()).collect();
        // In one transaction with the staged writes of the same children (a running mark), not
        // with the rest of what is staged. The rows are inserted as they are (the usual case:
        // no child has a stored row, one statement, nothing read); should any child have one,
        // the insert is taken back whole, and the stored rows are read under a row lock,
        // decided as sled decides them, and written. The rows of a session whose tenure this
        // process lost are not written (its owner here publishes nothing more: it was told).
        let extra = rows
            .iter()
            .map(|r| (CHILDREN, row_key(&r.session_id, &r.child_id)))
            .collect();
        // Encoded here, not on the ledger's thread, which every commit in flight shares.
        let encoded = encode_terminals(&rows)?;
        let (_, stored) = self.commit_staged(sessions, extra, move |tx, this, fenced| {
            Box::pin(async move {
                let all = rows;
                if all.iter().all(|r| fenced.allows(&r.session_id)) {
                    return record_rows(tx, this, all, encoded).await;
                }
                let rows: Vec<ChildRow> = all.iter().filter(|r| fenced.allows(&r.session_id)).cloned().collect();
                let encoded = encode_terminals(&rows)?;
                let (stored, written) = record_rows(tx, this, rows, encoded).await?;
                // In input order; a refused row answers as it came (nobody publishes it).
                let mut stored = stored.into_iter();
                let stored = all
                    .into_iter()
                    .map(|r| match fenced.allows(&r.session_id) {
                        true => stored.next().unwrap_or(r),
                        false => r,
                    })
                    .collect();
                Ok((stored, written))
            })
        })?;
        Ok(stored)
    }

    fn put_claim(&self, row: &ClaimRow) -> Result<(), LedgerError> {
        let key = row_key(&row.session_id, &row.claim_id);
        let value = encode(CLAIMS, &key, row)?;
        self.staging().stage((CLAIMS, key), Some(value));
        Ok(())
    }

    fn ack(&self, session_id: &str, claim_id: &str) -> Result<Option<AckRow>, LedgerError> {
        self.get_row(ACKS, session_id, claim_id)
    }

    fn find_call(&self, call_id: &str) -> Result<Option<CallRow>, LedgerError> {
        // One read of the index on the call id part of the keys (migration 6), not a scan.
        self.settle()?;
        let table = self.table(CALLS);
        let pool = self.inner.pool.clone();
        let id = call_id.as_bytes().to_vec();
        self.inner.sent(1);
        let found = self.runtime.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            client
                .query(
                    &format!("SELECT key, value FROM {table} WHERE {CALL_ID_OF_KEY} = $1"),
                    &[&id],
                )
                .await
                .map_err(pg_error("looking a call up by its id"))
                .map(|rows| {
                    rows.into_iter()
                        .map(|r| (r.get::<_, Vec<u8>>(0), r.get::<_, Vec<u8>>(1)))
                        .collect::<Vec<_>>()
                })
        })?;
        find_call_in(found.into_iter().map(Ok), call_id)
    }

    fn has_session(&self, session_id: &str) -> Result<bool, LedgerError> {
        Ok(self.get(SESSIONS, session_id.as_bytes().to_vec())?.is_some())
    }

    fn call(&self, session_id: &str, call_id: &str) -> Result<Option<CallRow>, LedgerError> {
        self.get_row(CALLS, session_id, call_id)
    }

    fn dead_letters(&self) -> Result<Vec<DeadLetterRow>, LedgerError> {
        self.scan(DEAD_LETTERS, None)
    }

    fn dead_letter_total(&self) -> Result<u64, LedgerError> {
        self.count_rows(DEAD_LETTERS)
    }

    fn session_ids(&self, after: Option<&str>, prefix: Option<&str>, limit: usize) -> Result<Vec<String>, LedgerError> {
        self.session_id_page(after, prefix, limit)
    }

    fn dead_letter_counts(&self, first: &str, last: &str) -> Result<Vec<(String, u64)>, LedgerError> {
        self.dead_letters_by_session(first, last)
    }

    fn ping(&self, timeout: Duration) -> Result<(), LedgerError> {
        self.round_trip(timeout)
    }

    fn child(&self, session_id: &str, child_id: &str) -> Result<Option<ChildRow>, LedgerError> {
        self.get_row(CHILDREN, session_id, child_id)
    }

    fn call_children(&self, session_id: &str, call_id: &str) -> Result<Vec<ChildRow>, LedgerError> {
        let mut out: Vec<ChildRow> = self
            .rows_in(CHILDREN, row_key(session_id, &format!("{call_id}.")), None, None)?
            .into_iter()
            .filter(|r: &ChildRow| r.call_id == call_id)
            .collect();
        out.sort_by_key(|r| r.task_index);
        Ok(out)
    }

    fn calls_page(&self, session_id: &str, after: Option<&str>, limit: usize) -> Result<Vec<CallRow>, LedgerError> {
        self.rows_in(
            CALLS,
            session_prefix(session_id),
            after.map(|a| row_key(session_id, a)),
            Some(limit),
        )
    }

    fn call_parts(&self, session_id: &str, call_id: &str) -> Result<CallParts, LedgerError> {
        let items = row_key(session_id, &format!("{call_id}."));
        let scope = session_prefix(session_id).len();
        let id_of = |k: &[u8]| String::from_utf8_lossy(&k[scope..]).into_owned();
        Ok(CallParts {
            children: self.call_children(session_id, call_id)?,
            dead_letters: self
                .rows_in(DEAD_LETTERS, items.clone(), None, None)?
                .into_iter()
                .filter(|d: &DeadLetterRow| d.call_id == call_id)
                .collect(),
            redrives: self
                .range(REDRIVES, items, None, None)?
                .iter()
                .map(|(k, _)| id_of(k))
                .collect(),
            starts: self
                .range(STARTS, row_key(session_id, &format!("{call_id}/")), None, None)?
                .iter()
                .map(|(k, _)| id_of(k))
                .collect(),
        })
    }

    fn acks_page(&self, session_id: &str, after: Option<&str>, limit: usize) -> Result<Vec<AckRow>, LedgerError> {
        self.rows_in(
            ACKS,
            session_prefix(session_id),
            after.map(|a| row_key(session_id, a)),
            Some(limit),
        )
    }

    fn row_counts(&self) -> Result<Vec<(&'static str, usize)>, LedgerError> {
        self.settle()?;
        let trees = super::ROW_TREES;
        let tables: Vec<String> = trees.iter().map(|t| self.table(t)).collect();
        let pool = self.inner.pool.clone();
        self.inner.sent(tables.len());
        let counts = self.runtime.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            let mut out = Vec::with_capacity(tables.len());
            for table in &tables {
                let row = client
                    .query_one(&format!("SELECT count(*) FROM {table}"), &[])
                    .await
                    .map_err(pg_error(format!("counting {table}")))?;
                out.push(row.get::<_, i64>(0) as usize);
            }
            Ok(out)
        })?;
        Ok(trees.into_iter().zip(counts).collect())
    }

    fn redrive(&self, session_id: &str, dedup_key: &str) -> Result<Option<RedriveRow>, LedgerError> {
        self.get_row(REDRIVES, session_id, dedup_key)
    }

    fn flush(&self) -> Result<usize, LedgerError> {
        crate::failpoint!("ledger_flush");
        if crate::failpoints::fires("ledger_flush_slow_fail") {
            // A slow server that gives up.
            std::thread::sleep(std::time::Duration::from_millis(400));
            return Err(LedgerError::Injected("ledger_flush_slow_fail"));
        }
        let started = std::time::Instant::now();
        if crate::failpoints::fires("ledger_flush_stall") {
            // A slow server: the flush succeeds, late.
            std::thread::sleep(Duration::from_millis(400));
        }
        let bytes = self.settle()?;
        if let Some(observe) = &self.on_flush {
            observe(started.elapsed());
        }
        Ok(bytes)
    }

    fn durability(&self) -> Durability {
        // A commit with synchronous_commit on is on the server's disk.
        Durability::Fsync
    }

    fn load(&self) -> Result<Snapshot, LedgerError> {
        self.read_all()
    }

    fn load_session(&self, session_id: &str) -> Result<Snapshot, LedgerError> {
        // As a read of many: every table in one round trip, each in key order with no sort.
        self.read_many(&[session_id.to_string()])
    }

    fn oldest_rows(&self, session_ids: &[String]) -> Result<Vec<OldestRows>, LedgerError> {
        let mut out = Vec::with_capacity(session_ids.len());
        for chunk in session_ids.chunks(LOAD_CHUNK) {
            out.extend(self.oldest_of(chunk)?);
        }
        Ok(out)
    }

    fn load_sessions(&self, session_ids: &[String]) -> Result<Snapshot, LedgerError> {
        let ids: BTreeSet<&String> = session_ids.iter().collect();
        let ids: Vec<String> = ids.into_iter().cloned().collect();
        let mut snapshot = Snapshot::default();
        for chunk in ids.chunks(LOAD_CHUNK) {
            snapshot.absorb(self.read_many(chunk)?);
        }
        Ok(snapshot)
    }

    fn quarantine(&self, tree: &str, session_id: &str, id: &str, reason: &str) -> Result<(), LedgerError> {
        let Some(tree) = super::ROW_TREES.into_iter().find(|t| *t == tree) else {
            return Err(LedgerError::storage_msg(format!("no tree `{tree}` to quarantine from")));
        };
        let key = if super::rows::is_scoped(tree) {
            row_key(session_id, id)
        } else {
            id.as_bytes().to_vec()
        };
        match self.get(tree, key.clone())? {
            Some(v) => self.move_aside(tree, &key, &v, reason),
            None => Ok(()),
        }
    }

    fn tenures(&self) -> Option<Arc<dyn super::Tenures>> {
        self.inner
            .tenures
            .as_ref()
            .map(|book| Arc::new(PgTenures(book.clone())) as Arc<dyn super::Tenures>)
    }

    fn refusals(&self, session_id: &str) -> u64 {
        self.inner.tenures.as_ref().map_or(0, |book| book.refusals(session_id))
    }

    fn work_directory(&self) -> Option<Arc<dyn super::WorkDirectory>> {
        self.inner
            .directory
            .as_ref()
            .map(|d| d.clone() as Arc<dyn super::WorkDirectory>)
    }

    fn quarantined(&self) -> Result<Vec<Quarantined>, LedgerError> {
        let raw: HashMap<Vec<u8>, Vec<u8>> = self
            .range(QUARANTINE_RAW, Vec::new(), None, None)?
            .into_iter()
            .collect();
        Ok(self
            .range(QUARANTINE, Vec::new(), None, None)?
            .into_iter()
            .map(|(k, v)| read_quarantined(&k, &v, raw.get(&k).cloned().unwrap_or_default()))
            .collect())
    }
}

#[cfg(test)]
mod tests;
