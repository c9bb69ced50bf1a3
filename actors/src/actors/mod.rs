//! The actor tree (DESIGN.md "Shape"): a root [`supervisor::Supervisor`], one
//! [`owner::SessionOwner`] per live session, one [`unit::Unit`] per completion unit, one
//! [`child::Child`] per task execution, and the [`coalescer::Coalescer`] that group-commits
//! completions. Each module holds one actor: its state, messages and handlers.

pub mod child;
pub mod coalescer;
pub mod owner;
pub mod supervisor;
pub mod unit;

use std::sync::Arc;

use crate::ledger::{Ledger, LedgerError};

/// Flushes the ledger off the actor thread.
pub(crate) async fn flush(ledger: Arc<dyn Ledger>) -> Result<usize, LedgerError> {
    match tokio::task::spawn_blocking(move || ledger.flush()).await {
        Ok(res) => res,
        Err(e) => Err(LedgerError::Storage(format!("flush task failed: {e}"))),
    }
}
