//! Decide → persist → apply (DESIGN.md): the one place where an owner's durable decisions are
//! written, flushed, and only then applied to memory.
//!
//! A mutating request is first *decided* from the current state by plain code (the owner's
//! parts and [`crate::routing`]), without changing anything. A decision that needs durable rows
//! becomes a [`Step`]: the rows to write, the rows that put the ledger back as memory has it
//! (for a failed flush: sled's background flusher could otherwise make the refused rows durable
//! later), and what the decision came to, applied in one place ([`super::apply`]) once the flush
//! succeeded or failed. [`Persist`] writes and flushes
//! steps in batches (group commit): one flush in flight at a time; durable requests that arrive
//! meanwhile are parked *undecided* and decided together when it ends, so every decision sees
//! the applied outcome of the ones before it. A refused or failed request changed nothing — set
//! numbers included, because the next set is only taken when its dispatch applies.
//!
//! While a step waits for its flush, what it touches is reserved, not changed: its claim is held
//! (no lease expiry), its children keep their capacity slots.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use actix::prelude::*;

use super::apply::Apply;
use super::{Durable, Release, SessionOwner};
use crate::error::BroodError;
use crate::ledger::{Ledger, LedgerError, Writes};
use crate::model::SessionRow;

/// One durable decision.
pub(super) struct Step {
    /// The rows the decision needs durable.
    pub(super) writes: Writes,
    /// The rows that put the ledger back as memory has it, should the flush fail.
    pub(super) restore: Writes,
    /// What the decision came to: applied once the flush succeeded, or answered as refused
    /// (memory is as it was) when it failed.
    pub(super) apply: Apply,
}

/// What deciding a request came to.
// A decision lives only while its batch forms; boxing the step would buy nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Decided<R> {
    /// Answered already (refused), or nothing to do.
    Done,
    /// Nothing to make durable: applied at once, before the next decision of the batch.
    Now(Apply),
    /// A step to persist.
    Step(Step),
    /// It touches something a step of this batch touches: decide it again after the batch.
    Later(R),
}

/// What the steps of one batch decided so far, for the next decision in the same batch.
pub(super) struct BatchView {
    /// The session row as the batch leaves it (its next set, its settings).
    pub(super) session: SessionRow,
    /// Claims a step of the batch touches.
    pub(super) claims: HashSet<String>,
    /// Capacity slots the batch's dispatches take for children they start at once.
    pub(super) admitted: usize,
    /// Dead items a redrive of the batch puts back (a second redrive of one waits for it).
    pub(super) redriven: HashSet<String>,
    /// Calls out of memory a redrive of the batch brings back (retention keeps them).
    pub(super) revived: HashSet<String>,
    /// Calls retention removes in this batch (a redrive skips them).
    pub(super) pruned: HashSet<String>,
    /// Calls the batch's dispatches make (a keyed delegate of one of them waits for it).
    pub(super) calls: HashSet<String>,
    /// Whether a dispatch of the batch leaves children queued (a later one then starts none
    /// of its own at once: queued children go first).
    pub(super) queued: bool,
}

impl BatchView {
    /// Marks `claim_id` as touched by a step of this batch.
    pub(super) fn take_claim(&mut self, claim_id: &str) {
        self.claims.insert(claim_id.to_string());
    }
}

/// The owner's group commit: at most one flush in flight, requests parked meanwhile.
pub(super) struct Persist<R> {
    in_flight: bool,
    parked: VecDeque<R>,
}

impl<R> Default for Persist<R> {
    fn default() -> Self {
        Persist {
            in_flight: false,
            parked: VecDeque::new(),
        }
    }
}

impl<R> Persist<R> {
    /// Whether a flush is in flight (durable requests are parked).
    pub(super) fn busy(&self) -> bool {
        self.in_flight
    }

    /// Parks a request until the flush in flight ended.
    pub(super) fn park(&mut self, request: R) {
        self.parked.push_back(request);
    }

    /// Takes every parked request, in arrival order.
    pub(super) fn take_parked(&mut self) -> Vec<R> {
        self.parked.drain(..).collect()
    }

    pub(super) fn set_in_flight(&mut self, yes: bool) {
        self.in_flight = yes;
    }
}

impl SessionOwner {
    /// Takes a request that may need durable rows: decided now, or parked until the flush in
    /// flight ended.
    pub(super) fn submit(&mut self, request: Durable, ctx: &mut Context<Self>) {
        if !self.persist.busy() {
            return self.run_batch(vec![request], ctx);
        }
        // An ack or release that arrived inside its claim's lease keeps the claim from expiring
        // while it waits: it is decided as of its arrival.
        if let Durable::Ack(claim_id, _, arrived) | Durable::Release(Release { claim_id, .. }, _, arrived) = &request {
            if self.router.lease_of(claim_id).is_some_and(|t| t > *arrived) {
                self.router.hold(claim_id);
            }
        }
        self.persist.park(request);
    }

    /// Decides `requests` in order (lease expiries first), then writes, flushes and applies
    /// the steps they came to as one batch.
    fn run_batch(&mut self, mut requests: Vec<Durable>, ctx: &mut Context<Self>) {
        // Deciding counts as busy: what a decision submits (an admission's running marks) is
        // parked and decided after this batch, never in a batch of its own beside it.
        self.persist.set_in_flight(true);
        let expiring = self.expire_due();
        requests.splice(0..0, expiring);
        let mut view = BatchView {
            session: self.session.clone(),
            claims: HashSet::new(),
            admitted: 0,
            calls: HashSet::new(),
            queued: false,
            redriven: HashSet::new(),
            revived: HashSet::new(),
            pruned: HashSet::new(),
        };
        let mut steps: Vec<Step> = Vec::new();
        for request in requests {
            let decided = match request {
                Durable::Delegate(msg, reply) => self.decide_delegate(msg, reply, &mut view),
                Durable::Ack(claim_id, reply, arrived) => self.decide_ack(claim_id, reply, arrived, &mut view),
                Durable::Release(msg, reply, arrived) => self.decide_release(msg, reply, arrived, &mut view),
                Durable::Expire(claim_id) => self.decide_expiry(claim_id, &mut view),
                Durable::Configure(settings, reply) => self.decide_configure(settings, reply, &mut view),
                Durable::SyncReceived(call_id, done) => self.decide_receipt(call_id, done),
                Durable::Start(ids) => self.decide_start(ids),
                Durable::Requeue(child_id) => self.decide_requeue(child_id),
                Durable::Retry(child_id) => self.decide_retry(child_id),
                Durable::EndNested(reason, reply) => self.decide_end_nested(reason, reply, &view, ctx),
                Durable::Redrive(loaded, reply) => self.decide_redrive(loaded, reply, &mut view),
                Durable::Prune(prune, reply) => self.decide_prune(prune, reply, &mut view),
                Durable::Drop(msg, reply) => self.decide_drop(msg, reply, &view),
            };
            match decided {
                Decided::Done => {}
                Decided::Now(decided) => self.apply(decided, Ok(()), ctx),
                Decided::Step(step) => steps.push(step),
                Decided::Later(request) => self.persist.park(request),
            }
        }
        if steps.is_empty() {
            self.persist.set_in_flight(false);
            let parked = self.persist.take_parked();
            if parked.is_empty() || !crate::actors::running(ctx) {
                self.after_change(ctx);
            } else {
                self.run_batch(parked, ctx);
            }
            return;
        }
        let (mut writes, mut restore, mut applies) = (Writes::default(), Writes::default(), Vec::new());
        for step in steps {
            writes.extend(step.writes);
            restore.extend(step.restore);
            applies.push(step.apply);
        }
        let next_set = view.session.next_set;
        let session = self.session.session_id.clone();
        write_and_flush(self.engine.ledger.clone(), self.fence.clone(), session, writes, restore)
            .into_actor(self)
            .map(move |(res, unrestored), act, ctx| {
                // Still "in flight" while the steps apply: what they submit is parked and
                // decided with the rest, after every step of this batch applied.
                let res = match res {
                    // Fenced: this process lost the session's tenure, so the rows may not have
                    // been written; the owner stops (it was told) and answers nothing more.
                    res if matches!(res, Err(LedgerError::Fenced(_))) || !act.engine.holds(&act.session.session_id) => {
                        Err(BroodError::TenureLapsed {
                            session: act.session.session_id.clone(),
                        })
                    }
                    res => res.map_err(BroodError::from),
                };
                if res.is_err() && unrestored {
                    // The refused rows may surface after a restart: never reuse what they took.
                    act.session.next_set = act.session.next_set.max(next_set);
                }
                for decided in applies {
                    act.apply(decided, res.clone(), ctx);
                }
                act.persist.set_in_flight(false);
                if act.moved {
                    // Taken over while this batch was written: answered, and nothing more.
                    act.engine.supersede(&act.session.session_id);
                    return ctx.stop();
                }
                let parked = act.persist.take_parked();
                if !parked.is_empty() && crate::actors::running(ctx) {
                    act.run_batch(parked, ctx);
                } else {
                    act.after_change(ctx);
                }
            })
            .spawn(ctx);
    }
}

/// How long putting the ledger back after a failed flush is retried before the owner gives up
/// on it (and then never reuses what the refused rows took).
const RESTORE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// Writes a batch's rows, flushes, and on failure puts the ledger back (and flushes that),
/// retrying with backoff for up to [`RESTORE_PATIENCE`]: no decision is made meanwhile, so the
/// next one never meets the refused rows. Runs off the actor thread. Returns the batch's
/// outcome, and whether putting back failed for good (then the refused rows may surface after a
/// restart, and the owner must never reuse what they took).
pub(super) async fn write_and_flush(
    ledger: Arc<dyn Ledger>,
    (fence, epoch): (crate::actors::Fence, u64),
    session: String,
    writes: Writes,
    restore: Writes,
) -> (Result<(), LedgerError>, bool) {
    let job = move || {
        // Held for the whole write, flush and restore: a successor's read of the ledger waits
        // for it, and once a successor was made, nothing of this owner's is written any more.
        let current = fence.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        if *current != epoch {
            return (
                Err(LedgerError::storage_msg(
                    "this session's owner was replaced; nothing was written",
                )),
                false,
            );
        }
        // Another process took the session over if its refusals moved meanwhile: the rows may
        // not have been written (even if this process took the session back since).
        let refusals = ledger.refusals(&session);
        let res = ledger.write(&writes).and_then(|_| ledger.flush().map(|_| ()));
        if ledger.refusals(&session) != refusals {
            // Nothing of this owner's is written any more, a restore neither.
            return (Err(LedgerError::Fenced(session)), false);
        }
        let Err(e) = res else {
            return (Ok(()), false);
        };
        let started = std::time::Instant::now();
        let mut pause = std::time::Duration::from_millis(10);
        loop {
            match ledger.write(&restore).and_then(|_| ledger.flush().map(|_| ())) {
                Ok(()) => return (Err(e), false),
                Err(r) if started.elapsed() >= RESTORE_PATIENCE => {
                    tracing::error!("a refused write could not be taken back from the ledger ({r}); its rows may surface after a restart");
                    return (Err(e), true);
                }
                Err(r) => {
                    tracing::warn!(retry_in = ?pause, "taking a refused write back from the ledger failed ({r})");
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_millis(500));
                }
            }
        }
    };
    match tokio::task::spawn_blocking(job).await {
        Ok(out) => out,
        Err(e) => (Err(LedgerError::storage("the ledger flush task failed", e)), true),
    }
}
