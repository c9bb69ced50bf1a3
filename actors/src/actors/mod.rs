//! The actor tree (DESIGN.md "Shape"): a root [`supervisor::Supervisor`], one
//! [`owner::SessionOwner`] per live session, one [`unit::Unit`] per completion unit, one
//! [`child::Child`] per task execution, and the [`coalescer::Coalescer`] that group-commits
//! completions. Each module holds one actor: its state, messages and handlers;
//! [`supervise`] holds the restart policy they run under.

pub mod child;
pub mod coalescer;
pub mod owner;
pub mod supervise;
pub mod supervisor;
pub mod unit;

use std::sync::{Arc, RwLock};

use actix::Addr;
use dashmap::{DashMap, DashSet};

use crate::ledger::{Ledger, LedgerError};
use crate::runner::RunnerFactory;

/// The live session owners by session id. A restarted owner replaces its entry, so whoever
/// looks an owner up here (the coalescer, the embedding API) reaches the current one.
pub type Owners = Arc<DashMap<String, Addr<owner::SessionOwner>>>;

/// What every actor of one engine shares.
#[derive(Clone)]
pub struct Engine {
    /// The ledger.
    pub ledger: Arc<dyn Ledger>,
    /// Runner construction.
    pub factory: Arc<dyn RunnerFactory>,
    /// The live owners.
    pub owners: Owners,
    /// Children whose actor is alive (started by a unit and not yet stopped).
    pub live_children: Arc<DashSet<String>>,
    /// The last turn state of each session, so a restarted owner keeps it.
    pub turns: Arc<DashMap<String, crate::routing::Turn>>,
    coalescer: Arc<RwLock<Option<Addr<coalescer::Coalescer>>>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("ledger", &self.ledger)
            .field("sessions", &self.owners.len())
            .finish()
    }
}

impl Engine {
    /// An engine with no coalescer yet (the supervisor starts it).
    pub fn new(ledger: Arc<dyn Ledger>, factory: Arc<dyn RunnerFactory>) -> Self {
        Engine {
            ledger,
            factory,
            owners: Arc::new(DashMap::new()),
            live_children: Arc::new(DashSet::new()),
            turns: Arc::new(DashMap::new()),
            coalescer: Arc::new(RwLock::new(None)),
        }
    }

    /// The current coalescer (a restarted one replaces the old).
    pub fn coalescer(&self) -> Option<Addr<coalescer::Coalescer>> {
        self.coalescer.read().ok().and_then(|c| c.clone())
    }

    pub(crate) fn set_coalescer(&self, addr: Option<Addr<coalescer::Coalescer>>) {
        if let Ok(mut c) = self.coalescer.write() {
            *c = addr;
        }
    }

    /// The current owner of a session.
    pub fn owner(&self, session_id: &str) -> Option<Addr<owner::SessionOwner>> {
        self.owners.get(session_id).map(|a| a.clone())
    }
}

/// Flushes the ledger off the actor thread.
pub(crate) async fn flush(ledger: Arc<dyn Ledger>) -> Result<usize, LedgerError> {
    match tokio::task::spawn_blocking(move || ledger.flush()).await {
        Ok(res) => res,
        Err(e) => Err(LedgerError::Storage(format!("flush task failed: {e}"))),
    }
}
