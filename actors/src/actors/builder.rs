//! The one place an [`Engine`] is assembled: from the ledger, the runner factory and the
//! threads it runs on, with what the configuration sets (wake factory, commit window, depth,
//! retention, the bounds on running and live children, the routing threads, who is told delivery
//! timings). Its shared maps (owners, live children, calls, nests, turns, fences) are made here,
//! empty, and its running totals start from 0.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use actix::ArbiterHandle;
use dashmap::DashMap;

use super::Engine;
use crate::ledger::Ledger;
use crate::runner::RunnerFactory;

/// Sets what an engine is made of; [`EngineBuilder::build`] makes it.
#[must_use = "an engine is made by `build`"]
pub struct EngineBuilder {
    ledger: Arc<dyn Ledger>,
    factory: Arc<dyn RunnerFactory>,
    children_arbiter: ArbiterHandle,
    wake_factory: Option<Arc<dyn crate::wake::WakeFactory>>,
    commit_window: Duration,
    max_depth: u32,
    retention: crate::retention::Retention,
    max_running_children: Option<usize>,
    max_live_children: Option<usize>,
    routing_arbiters: Vec<ArbiterHandle>,
    commit_arbiter: Option<ArbiterHandle>,
    delivery_timing: Option<crate::totals::DeliveryTimingObserver>,
}

impl std::fmt::Debug for EngineBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineBuilder")
            .field("ledger", &self.ledger)
            .field("commit_window", &self.commit_window)
            .field("max_depth", &self.max_depth)
            .field("routing_threads", &self.routing_arbiters.len())
            .finish()
    }
}

impl EngineBuilder {
    pub(super) fn new(
        ledger: Arc<dyn Ledger>,
        factory: Arc<dyn RunnerFactory>,
        children_arbiter: ArbiterHandle,
    ) -> Self {
        EngineBuilder {
            ledger,
            factory,
            children_arbiter,
            wake_factory: None,
            commit_window: Duration::ZERO,
            max_depth: crate::model::DEFAULT_MAX_DEPTH,
            retention: crate::retention::Retention::default(),
            max_running_children: None,
            max_live_children: None,
            routing_arbiters: Vec::new(),
            commit_arbiter: None,
            delivery_timing: None,
        }
    }

    /// Makes wake targets from stored webhook URLs.
    pub fn wake_factory(mut self, factory: Option<Arc<dyn crate::wake::WakeFactory>>) -> Self {
        self.wake_factory = factory;
        self
    }

    /// How long the coalescer gathers completions before it writes a batch (zero, the default:
    /// a batch starts as soon as the previous flush ended).
    pub fn commit_window(mut self, window: Duration) -> Self {
        self.commit_window = window;
        self
    }

    /// The deepest call accepted (a call in a top-level session is depth 1).
    pub fn max_depth(mut self, depth: u32) -> Self {
        self.max_depth = depth;
        self
    }

    /// How long what is over is kept, and how often retention sweeps.
    pub fn retention(mut self, retention: crate::retention::Retention) -> Self {
        self.retention = retention;
        self
    }

    /// The engine-wide bound on running children, shared round-robin between sessions (none,
    /// the default: unlimited).
    pub fn max_running_children(mut self, n: Option<usize>) -> Self {
        self.max_running_children = n;
        self
    }

    /// The bound on children queued or running over every session that a delegate must fit
    /// under (none, the default: unbounded).
    pub fn max_live_children(mut self, n: Option<usize>) -> Self {
        self.max_live_children = n;
        self
    }

    /// The routing threads session owners are spread over, and the coalescer's own thread
    /// (none, the default: both on the system arbiter).
    pub fn threads(mut self, routing: Vec<ArbiterHandle>, commit: Option<ArbiterHandle>) -> Self {
        self.routing_arbiters = routing;
        self.commit_arbiter = commit;
        self
    }

    /// Who is told each item's delivery timing (none, the default: nobody).
    pub fn delivery_timing(mut self, observer: Option<crate::totals::DeliveryTimingObserver>) -> Self {
        self.delivery_timing = observer;
        self
    }

    /// The engine, its shared maps empty and no coalescer yet (the supervisor starts it).
    pub fn build(self) -> Engine {
        Engine {
            tenures: self.ledger.tenures(),
            holders: super::holders::Holders::new(super::holders::Holders::KEPT),
            ledger: self.ledger,
            factory: self.factory,
            wake_factory: self.wake_factory,
            owners: Arc::new(DashMap::new()),
            live_children: Arc::default(),
            children_arbiter: self.children_arbiter,
            routing_arbiters: self.routing_arbiters,
            commit_arbiter: self.commit_arbiter,
            turns: Arc::new(DashMap::new()),
            calls: Arc::new(DashMap::new()),
            nests: Arc::new(DashMap::new()),
            any_nest: Arc::default(),
            embedder: Arc::default(),
            shares: self
                .max_running_children
                .map(|n| Arc::new(crate::routing::Shares::new(n))),
            live: crate::routing::LiveCount::new(self.max_live_children),
            retention: self.retention,
            max_depth: self.max_depth,
            events: crate::events::Events::default(),
            commit_window: self.commit_window,
            admitting: Arc::new(AtomicBool::new(true)),
            fences: Arc::new(DashMap::new()),
            coalescer: Arc::new(RwLock::new(None)),
            counters: Arc::new(crate::totals::Counters::new(self.delivery_timing)),
        }
    }
}
