//! The Coalescer actor: group commit of child completions.
//!
//! Children hand it their terminal rows. It writes every row that arrived since the last batch
//! in one ledger batch, flushes once for all of them (off the actor thread), then hands each
//! session owner its share and waits for the owner to record it. Only then does each child
//! hear `Ok` and let go of its result (I1: nothing is published before its flush). A write,
//! flush or owner failure answers the children of that batch with an error; they retry.

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use futures::future::join_all;
use tokio::sync::oneshot;

use super::owner::{Recorded, SessionOwner};
use super::Owners;
use crate::ledger::{Ledger, LedgerError};
use crate::model::ChildRow;

/// Rows written per batch at most; more wait for the next batch.
const MAX_BATCH: usize = 8192;

/// Why a hand-off failed. The child keeps its result and retries.
#[derive(Debug, thiserror::Error)]
pub enum HandOffError {
    /// The row could not be written or flushed.
    #[error("recording the result failed: {0}")]
    Ledger(#[from] LedgerError),
    /// The session owner did not take the batch.
    #[error("the session owner did not take the result: {0}")]
    Owner(String),
    /// The coalescer went away before answering.
    #[error("the coalescer stopped before the result was recorded")]
    Stopped,
}

/// A terminal child row to record and publish.
#[derive(Debug, Message)]
#[rtype(result = "Result<(), HandOffError>")]
pub struct Completion {
    /// The terminal row.
    pub row: ChildRow,
}

struct Pending {
    row: ChildRow,
    reply: oneshot::Sender<Result<(), HandOffError>>,
}

/// Group commit of completions.
pub struct Coalescer {
    ledger: Arc<dyn Ledger>,
    owners: Owners,
    pending: Vec<Pending>,
    in_flight: bool,
    batches: u64,
}

impl std::fmt::Debug for Coalescer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coalescer")
            .field("pending", &self.pending.len())
            .field("batches", &self.batches)
            .finish()
    }
}

impl Coalescer {
    /// A coalescer writing to `ledger`.
    pub fn new(ledger: Arc<dyn Ledger>, owners: Owners) -> Self {
        Coalescer {
            ledger,
            owners,
            pending: Vec::new(),
            in_flight: false,
            batches: 0,
        }
    }

    fn start_batch(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight || self.pending.is_empty() {
            return;
        }
        let take = self.pending.len().min(MAX_BATCH);
        let batch: Vec<Pending> = self.pending.drain(..take).collect();
        let rows: Vec<ChildRow> = batch.iter().map(|p| p.row.clone()).collect();
        // A retried hand-off of a row already recorded is not written again, and the ledger's
        // delivery state wins over the child's stale copy (an ack may have happened meanwhile).
        let stored = match self.ledger.record_terminals(&rows) {
            Ok(stored) => stored,
            Err(e) => {
                tracing::warn!(rows = rows.len(), "writing completions failed: {e}");
                let msg = e.to_string();
                for p in batch {
                    let _ = p
                        .reply
                        .send(Err(HandOffError::Ledger(LedgerError::Storage(msg.clone()))));
                }
                return self.start_batch(ctx);
            }
        };
        self.in_flight = true;
        self.batches += 1;
        let ledger = self.ledger.clone();
        let owners = self.owners.clone();
        let fut = async move {
            let flushed = crate::actors::flush(ledger).await;
            if let Err(e) = flushed {
                return (batch, Err(e.to_string()));
            }
            // Hand each owner its share and wait for it to be recorded.
            let mut by_owner: HashMap<String, (Option<Addr<SessionOwner>>, Vec<ChildRow>)> = HashMap::new();
            for row in stored {
                by_owner
                    .entry(row.session_id.clone())
                    .or_insert_with(|| (owners.get(&row.session_id).map(|a| a.clone()), Vec::new()))
                    .1
                    .push(row);
            }
            let sends = by_owner.into_iter().map(|(session, (owner, rows))| async move {
                let res = if crate::failpoints::fires("coalescer_handoff") {
                    Err("injected fault: coalescer_handoff".to_string())
                } else if let Some(owner) = owner {
                    owner.send(Recorded { rows }).await.map_err(|e| e.to_string())
                } else {
                    Err(format!("session `{session}` has no live owner"))
                };
                (session, res)
            });
            let results: HashMap<String, Result<(), String>> = join_all(sends).await.into_iter().collect();
            (batch, Ok(results))
        };
        fut.into_actor(self)
            .map(|(batch, outcome), act, ctx| {
                match outcome {
                    Err(e) => {
                        tracing::warn!(rows = batch.len(), "flushing completions failed: {e}");
                        for p in batch {
                            let _ = p.reply.send(Err(HandOffError::Ledger(LedgerError::Storage(e.clone()))));
                        }
                    }
                    Ok(results) => {
                        for p in batch {
                            let res = match results.get(&p.row.session_id) {
                                Some(Ok(())) => Ok(()),
                                Some(Err(e)) => Err(HandOffError::Owner(e.clone())),
                                None => Err(HandOffError::Owner("no owner answered".into())),
                            };
                            let _ = p.reply.send(res);
                        }
                    }
                }
                act.in_flight = false;
                act.start_batch(ctx);
            })
            .spawn(ctx);
    }
}

impl Actor for Coalescer {
    type Context = Context<Self>;
}

impl Handler<Completion> for Coalescer {
    type Result = ResponseFuture<Result<(), HandOffError>>;

    fn handle(&mut self, msg: Completion, ctx: &mut Context<Self>) -> Self::Result {
        if crate::failpoints::fires("coalescer_handler") {
            panic!("injected fault: coalescer_handler");
        }
        let (tx, rx) = oneshot::channel();
        self.pending.push(Pending {
            row: msg.row,
            reply: tx,
        });
        self.start_batch(ctx);
        Box::pin(async move { rx.await.unwrap_or(Err(HandOffError::Stopped)) })
    }
}
