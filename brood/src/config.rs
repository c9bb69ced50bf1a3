//! [`BroodConfig`]: how an engine is opened (its ledger, runners, durability, threads, limits,
//! and whether it shares a PostgreSQL ledger with other processes).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use brood_actors::actors::Engine;
use brood_actors::ledger::{Durability, Ledger, LedgerError, PgLedger, SledLedger};
use brood_actors::runner::RunnerFactory;
use brood_actors::wake::WakeFactory;

use crate::{default_routing_threads, Retention, Runners};

/// How to open the engine.
#[derive(Clone)]
pub struct BroodConfig {
    pub(crate) data_dir: PathBuf,
    pub(crate) runners: Arc<dyn RunnerFactory>,
    pub(crate) durability: Durability,
    pub(crate) wakes: Option<Arc<dyn WakeFactory>>,
    pub(crate) commit_window: Duration,
    pub(crate) routing_threads: usize,
    pub(crate) cache_bytes: u64,
    pub(crate) max_depth: u32,
    pub(crate) max_running_children: Option<u32>,
    pub(crate) max_live_children: Option<usize>,
    pub(crate) retention: brood_actors::retention::Retention,
    pub(crate) on_flush: Option<brood_actors::ledger::FlushObserver>,
    pub(crate) on_delivery_timing: Option<brood_actors::totals::DeliveryTimingObserver>,
    /// PostgreSQL's address and schema, when the ledger is there rather than in `data_dir`.
    pub(crate) postgres: Option<(String, String)>,
    /// Who this process is among several sharing the PostgreSQL ledger.
    pub(crate) share: Option<brood_actors::ledger::TenureConfig>,
}

impl std::fmt::Debug for BroodConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BroodConfig")
            .field("data_dir", &self.data_dir)
            .field("durability", &self.durability)
            .finish()
    }
}

impl BroodConfig {
    /// The embedded default: sled in `data_dir`, built-in runners, [`Durability::Fsync`].
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        BroodConfig {
            data_dir: data_dir.into(),
            runners: Arc::new(Runners::builtin()),
            durability: Durability::default(),
            wakes: None,
            commit_window: Duration::ZERO,
            routing_threads: default_routing_threads(),
            cache_bytes: brood_actors::ledger::DEFAULT_CACHE_BYTES,
            max_depth: brood_actors::model::DEFAULT_MAX_DEPTH,
            max_running_children: None,
            max_live_children: None,
            retention: brood_actors::retention::Retention::default(),
            on_flush: None,
            on_delivery_timing: None,
            postgres: None,
            share: None,
        }
    }

    /// Keeps the ledger in the PostgreSQL database at `url` (`postgres://user@host:port/db`,
    /// PostgreSQL 14 or later), in the schema [`brood_actors::ledger::DEFAULT_SCHEMA`], instead
    /// of sled in the data folder. brood creates and migrates its tables itself; a commit is
    /// durable on the server (`synchronous_commit = on`) before anything it holds is reported
    /// as recorded. Several processes may share one database: see [`BroodConfig::share`].
    pub fn postgres(mut self, url: impl Into<String>) -> Self {
        let schema = self
            .postgres
            .take()
            .map_or(brood_actors::ledger::DEFAULT_SCHEMA.to_string(), |p| p.1);
        self.postgres = Some((url.into(), schema));
        self
    }

    /// With [`BroodConfig::postgres`]: the schema its tables are in (lower-case letters,
    /// digits and `_`), so several ledgers can share one database.
    pub fn postgres_schema(mut self, schema: impl Into<String>) -> Self {
        if let Some(p) = &mut self.postgres {
            p.1 = schema.into();
        }
        self
    }

    /// With [`BroodConfig::postgres`]: shares the database with other brood processes. Each
    /// session is served by one process at a time, the holder of its tenure (`ttl` long,
    /// renewed in the background); this one is `node` (named in the tenure rows) and takes
    /// requests at `address`, which the others name in [`BroodError::Moved`](crate::BroodError::Moved). Sessions whose holder died are taken over
    /// within about `ttl` (spread over the survivors), recovered as a restart recovers them;
    /// the live processes hand sessions to each other until each serves about its share; a holder that was paused past
    /// its tenure is refused at its first write and stops serving the session.
    pub fn share(mut self, node: impl Into<String>, address: impl Into<String>, ttl: Duration) -> Self {
        self.share = Some(brood_actors::ledger::TenureConfig {
            node: node.into(),
            address: address.into(),
            ttl,
        });
        self
    }

    /// The deepest call accepted (default 2): a call in a top-level session is depth 1, one in
    /// the nested session of one of its children depth 2, and so on; a deeper one is refused
    /// with [`BroodError::MaxDepthExceeded`](crate::BroodError::MaxDepthExceeded). At least 1.
    pub fn max_depth(mut self, depth: u32) -> Self {
        self.max_depth = depth.max(1);
        self
    }

    /// Bounds the children running at once over every session (default: unbounded), on top of
    /// each session's own `max_concurrent_children`. When it binds, the sessions that want more
    /// are given the freed slots round-robin, one at a time, so a session with many queued
    /// children cannot starve one with few. (Under a bound, a call's children start through
    /// admission, one flush after the call's own.)
    pub fn max_running_children(mut self, limit: Option<u32>) -> Self {
        self.max_running_children = limit.map(|n| n.max(1));
        self
    }

    /// Bounds the children live at once over every session, queued or running (default:
    /// unbounded): a delegate whose tasks would take the engine past it is refused with
    /// [`BroodError::ServerFull`](crate::BroodError::ServerFull) and changes nothing. Nested
    /// calls count alike. Children recovered at a start are counted, never refused. At least 1.
    pub fn max_live_children(mut self, limit: Option<usize>) -> Self {
        self.max_live_children = limit.map(|n| n.max(1));
        self
    }

    /// How long what is over is kept, and how often the background sweep runs (default: calls
    /// delivered 7 days, dead letters 30 days, idle sessions kept, a sweep a minute).
    pub fn retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// Bounds the ledger's page cache (default
    /// [`brood_actors::ledger::DEFAULT_CACHE_BYTES`], 64 MiB): the process does not grow with
    /// its ledger's size past it.
    pub fn cache_bytes(mut self, bytes: u64) -> Self {
        self.cache_bytes = bytes;
        self
    }

    /// Uses another runner registry.
    pub fn runners(mut self, runners: impl RunnerFactory) -> Self {
        self.runners = Arc::new(runners);
        self
    }

    /// What a flush brood relies on guarantees (see [`Durability`]).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// How many threads session owners are spread over (default: one per core; 0 runs them
    /// on the thread of the supervisor and the coalescer). Each session stays on one thread;
    /// a session's work never waits behind another's on a different thread.
    pub fn routing_threads(mut self, threads: usize) -> Self {
        self.routing_threads = threads;
        self
    }

    /// How long completions are gathered before they are written and flushed as one batch
    /// (default zero: a batch starts as soon as the previous flush ended, which already groups
    /// whatever arrived meanwhile). A longer window means fewer flushes and later results.
    pub fn commit_window(mut self, window: Duration) -> Self {
        self.commit_window = window;
        self
    }

    /// Makes webhook wake targets from `wake_url`s (stored with their sessions, and bound
    /// again when the engine opens).
    pub fn wake_factory(mut self, wakes: impl WakeFactory) -> Self {
        self.wakes = Some(Arc::new(wakes));
        self
    }

    /// Tells `observer` how long each successful ledger flush took, fsync included (for
    /// metrics). It runs on the flushing thread, in the path of every durable write: keep it
    /// quick.
    pub fn on_flush(mut self, observer: impl Fn(Duration) + Send + Sync + 'static) -> Self {
        self.on_flush = Some(Arc::new(observer));
        self
    }

    /// Tells `observer` how long each item spent in each [`DeliveryStage`] (for metrics): from
    /// its child's end to being claimable, and from being claimable to the ack that delivered
    /// it, in whole milliseconds of the wall clock. It runs on a session owner's thread, in the
    /// path of every ack: keep it quick.
    ///
    /// [`DeliveryStage`]: crate::DeliveryStage
    pub fn on_delivery_timing(
        mut self,
        observer: impl Fn(crate::DeliveryStage, Duration) + Send + Sync + 'static,
    ) -> Self {
        self.on_delivery_timing = Some(Arc::new(observer));
        self
    }

    /// The ledger folder.
    pub fn data_dir(&self) -> &std::path::Path {
        &self.data_dir
    }
}

impl BroodConfig {
    /// Refuses a configuration that cannot open, naming what is wrong.
    pub(crate) fn check(&self) -> Result<(), crate::BroodError> {
        if self.share.is_some() && self.postgres.is_none() {
            return Err(crate::BroodError::invalid(
                "share",
                "sharing the ledger between processes needs a PostgreSQL ledger (a sled folder is one process's)",
            ));
        }
        Ok(())
    }

    /// Opens the ledger: PostgreSQL's when the configuration names one (shared with other
    /// processes or not), else sled in the data folder; each with the flush observer.
    pub(crate) fn open_ledger(&self) -> Result<Arc<dyn Ledger>, LedgerError> {
        let on_flush = self.on_flush.clone();
        Ok(match &self.postgres {
            Some((url, schema)) => {
                let mut pg = match self.share.clone() {
                    Some(share) => PgLedger::open_shared(url, schema, share)?,
                    None => PgLedger::open_in(url, schema)?,
                };
                if let Some(observer) = on_flush {
                    pg = pg.on_flush(observer);
                }
                Arc::new(pg)
            }
            None => {
                let mut sled = SledLedger::open_with_cache(&self.data_dir, self.durability, self.cache_bytes)?;
                if let Some(observer) = on_flush {
                    sled = sled.on_flush(observer);
                }
                Arc::new(sled)
            }
        })
    }

    /// The engine this configuration describes, on `ledger`, its units and children on
    /// `children`, its owners and coalescer on `routing`.
    pub(crate) fn engine(
        &self,
        ledger: Arc<dyn Ledger>,
        children: actix::ArbiterHandle,
        routing: (Vec<actix::ArbiterHandle>, Option<actix::ArbiterHandle>),
    ) -> Engine {
        Engine::builder(ledger, self.runners.clone(), children)
            .wake_factory(self.wakes.clone())
            .commit_window(self.commit_window)
            .max_depth(self.max_depth)
            .retention(self.retention.clone())
            .max_running_children(self.max_running_children.map(|n| n as usize))
            .max_live_children(self.max_live_children)
            .threads(routing.0, routing.1)
            .delivery_timing(self.on_delivery_timing.clone())
            .build()
    }
}
