//! The apply step of decide → persist → apply (DESIGN.md), in one place.
//!
//! What a decision came to is a value, an [`Apply`]: the request's outcome, with what applying
//! it needs (its reply included). A decision that needs durable rows carries one in its
//! [`super::persist::Step`], applied once the step's flush ended (`Ok`), or answered as refused
//! (`Err`: memory is as it was, and only what the decision reserved is given back); one that
//! needs none is applied at once ([`super::persist::Decided::Now`]). Either way it goes through
//! [`SessionOwner::apply`], which checks the owed calls' invariants after each one
//! ([`super::invariants`]): a decision that leaves them broken is caught where it was applied,
//! not at some later change. Each kind's application stays beside its decision, in the file of
//! its part of the owner.

use actix::prelude::*;
use tokio::sync::oneshot;

use super::claims::HandBack;
use super::dispatch::{Configured, Dispatched};
use super::redrive::Redriven;
use super::SessionOwner;
use crate::error::BroodError;
use crate::model::ChildRow;

/// What one decision came to, applied by [`SessionOwner::apply`].
pub(super) enum Apply {
    /// A call accepted: its set taken, the call booked, its children started or queued.
    Dispatch(Box<Dispatched>),
    /// The session's settings changed.
    Configure(Box<Configured>),
    /// A claim acked: its items delivered.
    Ack {
        claim_id: String,
        items: Vec<String>,
        reply: oneshot::Sender<Result<usize, BroodError>>,
    },
    /// A claim handed back (released, or its lease expired): its items queued again or dead.
    HandBack(Box<HandBack>),
    /// A sync call's results received by its caller.
    Receipt {
        call_id: String,
        items: Vec<String>,
        done: oneshot::Sender<()>,
    },
    /// Admitted children's running marks are durable: they start.
    Start { ids: Vec<String>, now: u64 },
    /// A child whose start was lost is queued again.
    Requeue { child_id: String, queued: ChildRow },
    /// A child is run again: its next attempt is queued.
    Retry { child_id: String, queued: ChildRow },
    /// Retention removed old calls.
    Prune {
        removed: usize,
        reply: oneshot::Sender<Result<usize, BroodError>>,
    },
    /// Retention removed the idle session: the owner stops.
    Drop {
        reply: oneshot::Sender<Result<bool, BroodError>>,
    },
    /// Dead letters were redriven: their items are ready again.
    Redrive(Box<Redriven>),
}

impl SessionOwner {
    /// Applies what a decision came to (`res`: how its step's flush ended; `Ok` for one
    /// applied at once), then checks the owed calls' invariants.
    pub(super) fn apply(&mut self, decided: Apply, res: Result<(), BroodError>, ctx: &mut Context<Self>) {
        match decided {
            Apply::Dispatch(d) => self.apply_dispatch(*d, res, ctx),
            Apply::Configure(c) => self.apply_configure(*c, res, ctx),
            Apply::Ack { claim_id, items, reply } => self.apply_ack(claim_id, items, reply, res),
            Apply::HandBack(h) => self.apply_hand_back(*h, res, ctx),
            Apply::Receipt { call_id, items, done } => self.apply_receipt(call_id, items, done, res, ctx),
            Apply::Start { ids, now } => self.apply_start(ids, now, res, ctx),
            Apply::Requeue { child_id, queued } => self.apply_requeue(child_id, queued, res, ctx),
            Apply::Retry { child_id, queued } => self.apply_retry(child_id, queued, res, ctx),
            Apply::Prune { removed, reply } => self.apply_prune(removed, reply, res),
            Apply::Drop { reply } => self.apply_drop(reply, res, ctx),
            Apply::Redrive(r) => self.apply_redrive(*r, res, ctx),
        }
        self.check_owed();
    }
}
