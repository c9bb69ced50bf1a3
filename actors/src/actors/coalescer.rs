//! The Coalescer actor: group commit of child completions.
//!
//! Children hand it their terminal rows. It writes every row that arrived since the last batch
//! in one ledger batch, flushes once for all of them (off the actor thread), then hands each
//! session owner its share and waits for the owner to record it. Only then does each child
//! hear `Ok` and let go of its result (I1: nothing is published before its flush). A write,
//! flush or owner failure answers the children of that batch with an error; they retry.
//!
//! With a commit window (`Engine::commit_window`, zero by default), a batch that could start
//! waits that long first, gathering more completions into one flush: fewer flushes for more
//! latency. A full batch (`MAX_BATCH` rows) never waits.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use actix::prelude::*;
use tokio::sync::oneshot;

use super::child::CallIds;
use super::owner::Recorded;
use super::Owners;
use crate::ledger::{Ledger, LedgerError};
use crate::model::{child_id, unit_id, ChildRow, ChildStatus, DeliveryRow};

/// Rows written per batch at most; more wait for the next batch.
const MAX_BATCH: usize = 8192;

/// Why a hand-off failed. The child keeps its result and retries.
#[derive(Debug, thiserror::Error)]
pub enum HandOffError {
    /// The row could not be written or flushed (what the ledger said).
    #[error("recording the result failed: {0}")]
    Ledger(std::sync::Arc<String>),
    /// The session owner did not take the batch.
    #[error("the session owner did not take the result: {0}")]
    Owner(String),
    /// The coalescer went away before answering.
    #[error("the coalescer stopped before the result was recorded")]
    Stopped,
    /// Another process sharing the ledger took the child's session over: the row was not
    /// written, and the child stops without retrying (its session's new holder recovers it).
    #[error("the child's session is served by another process now; its result was not recorded here")]
    Moved,
}

/// A terminal child row to record and publish. Answered on `reply`, once its owner recorded
/// it, with the status stored: the row's own, or that of a terminal row recorded before it (a
/// retried hand-off, or a child cancelled while it ended); a coalescer that stops first drops
/// `reply` unanswered.
///
/// Sent with `do_send` (`Engine::hand_off`), past the mailbox's
/// bound: what bounds the coalescer's queue is the live children, each of which hands off one
/// row at a time and waits for its answer (and capacity bounds the live children).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct ChildEnded {
    /// The terminal row, or what it is made of.
    pub terminal: Terminal,
    /// Where the answer goes.
    pub reply: Reply,
}

/// A terminal row to record: whole (a cancel the owner decided), or as a child ended.
#[derive(Debug, Clone)]
pub enum Terminal {
    /// The row itself.
    Row(ChildRow),
    /// A child's end, its row made by the coalescer.
    Ended(Ended),
}

impl Terminal {
    /// The row to record.
    fn into_row(self) -> ChildRow {
        match self {
            Terminal::Row(row) => row,
            Terminal::Ended(end) => end.into_row(),
        }
    }
}

/// How a child ended, with what its terminal row repeats of its call: the row is made from
/// these where it is written, so a child neither builds the four ids a row repeats nor copies
/// them to keep them until it is answered.
#[derive(Debug, Clone)]
pub struct Ended {
    /// Its call's ids.
    pub ids: Arc<CallIds>,
    /// Its unit's ordinal in the call (`<call>-<k>`).
    pub unit_k: u32,
    /// Its task's index in the call.
    pub task_index: u32,
    /// Its execution attempt.
    pub attempt: u32,
    /// Whether recovery replayed it.
    pub recovered: bool,
    /// How it ended.
    pub status: ChildStatus,
    /// Its summary (or the partial result it handed back).
    pub summary: Option<String>,
    /// Its data, as JSON text.
    pub output: Option<String>,
    /// What went wrong.
    pub error: Option<String>,
    /// When its runner started.
    pub started_at_ms: Option<u64>,
    /// When it ended.
    pub finished_at_ms: u64,
}

impl Ended {
    /// Its terminal row; its delivery state empty (the ledger keeps a stored one).
    pub fn into_row(self) -> ChildRow {
        let call_id = &self.ids.call_id;
        ChildRow {
            child_id: child_id(call_id, self.task_index),
            call_id: call_id.clone(),
            unit_id: unit_id(call_id, self.unit_k as usize),
            session_id: self.ids.session_id.clone(),
            task_index: self.task_index,
            status: self.status,
            summary: self.summary,
            output: self.output,
            error: self.error,
            started_at_ms: self.started_at_ms,
            finished_at_ms: Some(self.finished_at_ms),
            attempt: self.attempt,
            recovered: self.recovered,
            result: DeliveryRow::default(),
            notice: DeliveryRow::default(),
        }
    }
}

/// How a child hears what became of its completion.
pub type Reply = oneshot::Sender<Result<ChildStatus, HandOffError>>;

struct Pending {
    terminal: Terminal,
    reply: Reply,
}

/// Group commit of completions.
pub struct Coalescer {
    ledger: Arc<dyn Ledger>,
    owners: Owners,
    pending: Vec<Pending>,
    in_flight: bool,
    /// The timer of a batch waiting out the commit window.
    gathering: Option<SpawnHandle>,
    window: std::time::Duration,
    batches: u64,
    /// Whether the ledger is shared with other processes (its rows may then be refused).
    shared: bool,
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
    /// A coalescer writing to `ledger`, gathering each batch for `window` first.
    pub fn new(ledger: Arc<dyn Ledger>, owners: Owners, window: std::time::Duration) -> Self {
        Coalescer {
            shared: ledger.tenures().is_some(),
            ledger,
            owners,
            pending: Vec::new(),
            in_flight: false,
            gathering: None,
            window,
            batches: 0,
        }
    }

    /// Starts a batch now, or once the commit window has passed.
    fn start_batch(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight || self.gathering.is_some() || self.pending.is_empty() {
            return;
        }
        if !self.window.is_zero() && self.pending.len() < MAX_BATCH {
            self.gathering = Some(ctx.run_later(self.window, |act, ctx| {
                act.gathering = None;
                act.write_batch(ctx);
            }));
            return;
        }
        self.write_batch(ctx);
    }

    fn write_batch(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight || self.pending.is_empty() {
            return;
        }
        let take = self.pending.len().min(MAX_BATCH);
        // The rows go to the ledger (the children keep their own copies until answered).
        let (rows, batch): (Vec<ChildRow>, Vec<Reply>) = self
            .pending
            .drain(..take)
            .map(|p| (p.terminal.into_row(), p.reply))
            .unzip();
        self.in_flight = true;
        self.batches += 1;
        let ledger = self.ledger.clone();
        let owners = self.owners.clone();
        // Written and flushed off this thread (a ledger write may be a network round trip), one
        // batch at a time, so batches reach the ledger in the order they were taken. A retried
        // hand-off of a row already recorded is not written again, and the ledger's delivery
        // state wins over the child's stale copy (an ack may have happened meanwhile).
        let shared = self.shared;
        crate::ledger::off_thread("recording completions", move || {
            // The refusals of the batch's sessions before it is written, when the ledger is
            // shared: a session refused by the time the flush returned may not have had its
            // rows written.
            let before: HashMap<String, u64> = match shared {
                true => rows
                    .iter()
                    .map(|r| r.session_id.as_str())
                    .collect::<HashSet<&str>>()
                    .into_iter()
                    .map(|s| (s.to_string(), ledger.refusals(s)))
                    .collect(),
                false => HashMap::new(),
            };
            let recorded = ledger
                .record_terminals(rows)
                .map_err(|e| ("writing", e))
                .and_then(|stored| ledger.flush().map(|_| stored).map_err(|e| ("flushing", e)));
            let refused: HashSet<String> = before
                .into_iter()
                .filter(|(s, n)| ledger.refusals(s) != *n)
                .map(|(s, _)| s)
                .collect();
            Ok(recorded.map(|stored| (stored, refused)))
        })
        .into_actor(self)
        .map(move |recorded, act, ctx| {
            act.in_flight = false;
            match recorded.unwrap_or_else(|e| Err(("recording", e))) {
                Err((what, e)) => fail_all(batch, what, &e),
                // Durable: hand each owner its share from a task of its own, so the next
                // batch is written and flushed meanwhile, and a slow owner delays only
                // its own session's children.
                // Shutting down: the children keep their results; the ledger has them.
                Ok(_) if !super::running(ctx) => {}
                Ok((stored, refused)) => {
                    // Refused rows were not written: their children stop, unpublished.
                    let (batch, stored) = match refused.is_empty() {
                        true => (batch, stored),
                        false => batch
                            .into_iter()
                            .zip(stored)
                            .filter_map(|(p, row)| match refused.contains(&row.session_id) {
                                true => {
                                    let _ = p.send(Err(HandOffError::Moved));
                                    None
                                }
                                false => Some((p, row)),
                            })
                            .unzip(),
                    };
                    for handoff in hand_offs(&owners, stored, batch) {
                        actix::spawn(handoff);
                    }
                }
            }
            act.start_batch(ctx);
        })
        .spawn(ctx);
    }
}

/// Answers every child of a batch that could not be recorded: each keeps its result and retries.
fn fail_all(batch: Vec<Reply>, what: &str, e: &LedgerError) {
    tracing::warn!(rows = batch.len(), "{what} completions failed: {e}");
    let e = std::sync::Arc::new(e.to_string());
    for p in batch {
        let _ = p.send(Err(HandOffError::Ledger(e.clone())));
    }
}

/// A session's share of a batch: its rows as stored, and each child with its stored status.
type SessionShare = (Vec<ChildRow>, Vec<(Reply, ChildStatus)>);

/// One future per session: give its owner the recorded rows, then answer their children.
fn hand_offs(
    owners: &Owners,
    stored: Vec<ChildRow>,
    batch: Vec<Reply>,
) -> Vec<impl std::future::Future<Output = ()> + 'static> {
    let mut by_session: HashMap<String, SessionShare> = HashMap::new();
    for (row, pending) in stored.into_iter().zip(batch) {
        let entry = by_session.entry(row.session_id.clone()).or_default();
        entry.1.push((pending, row.status));
        entry.0.push(row);
    }
    by_session
        .into_iter()
        .map(|(session, (rows, pending))| {
            let owner = owners.get(&session).map(|a| a.clone());
            async move {
                let res = if crate::failpoints::fires("coalescer_handoff") {
                    Err("injected fault: coalescer_handoff".to_string())
                } else if let Some(owner) = owner {
                    owner.send(Recorded { rows }).await.map_err(|e| e.to_string())
                } else {
                    // The session was given up by its supervisor: the row is durable, and the
                    // next start of the engine publishes it. Nothing more can be done here.
                    tracing::warn!(session = %session, "recorded results of a session no owner serves");
                    Ok(())
                };
                for (p, status) in pending {
                    let _ = p.send(res.clone().map(|()| status).map_err(HandOffError::Owner));
                }
            }
        })
        .collect()
}

impl Actor for Coalescer {
    type Context = Context<Self>;
}

impl Handler<ChildEnded> for Coalescer {
    type Result = ();

    fn handle(&mut self, msg: ChildEnded, ctx: &mut Context<Self>) {
        if crate::failpoints::fires("coalescer_handler") {
            panic!("injected fault: coalescer_handler");
        }
        self.pending.push(Pending {
            terminal: msg.terminal,
            reply: msg.reply,
        });
        if self.pending.len() >= MAX_BATCH {
            if let Some(timer) = self.gathering.take() {
                // Full: no reason to wait out the window.
                ctx.cancel_future(timer);
                self.write_batch(ctx);
            }
        }
        self.start_batch(ctx);
    }
}
