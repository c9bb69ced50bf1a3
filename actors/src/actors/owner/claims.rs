//! Boundaries, acks, releases, lease expiries and dead letters: the claim side of the owner.
//!
//! A boundary claims at once (claims are not flushed by design: a crash returns them anyway).
//! An ack is durable as one ack row for its claim, written and flushed before the router marks
//! its items delivered. A release or an expiry that dead-letters items writes their dead letters
//! and flushes before anything moves; one that does not is applied at once (attempt counts are
//! advisory and written without a flush). Meanwhile the claim is held: it cannot expire.

use std::time::Duration;

use actix::AsyncContext as _;
use tokio::sync::oneshot;

use super::apply::Apply;
use super::persist::{BatchView, Decided, Step};
use super::{answer, claim_made_ms, new_claim_id, Durable, Release, SessionOwner};
use crate::error::BroodError;
use crate::events::{ClaimChange, Event};
use crate::ledger::Writes;
use crate::model::*;
use crate::routing::{AckPlan, ClaimError, ReleaseReason, Returned};
use crate::totals::DeliveryStage;

/// How long an expiry whose dead letters could not be flushed waits before it is tried again.
const EXPIRY_RETRY: Duration = Duration::from_millis(200);

/// A claim handed back, to apply once what it dead-letters is durable.
pub(super) struct HandBack {
    claim_id: String,
    returned: Returned<String>,
    change: ClaimChange,
    /// Why items went dead, when some did (their dead letters are flushed first).
    why: Option<&'static str>,
    asker: HandBackAsker,
}

/// Who asked for a hand-back, and so who is told how it went.
enum HandBackAsker {
    /// A consumer's release, answered.
    Release(oneshot::Sender<Result<(), BroodError>>),
    /// The owner's own expiry of a lease: one whose dead letters failed is tried again later.
    Expiry,
}

impl SessionOwner {
    /// A boundary: every item ready now goes into one new claim, or nothing does.
    pub(super) fn claim(&mut self, consumer: String, lease_ms: u64, limits: EnvelopeLimits) -> Option<Envelope> {
        let now = now_ms();
        self.wake_state.boundary();
        let claim_id = new_claim_id(&self.session.session_id);
        let claim = if limits == EnvelopeLimits::NONE {
            self.router.claim(now, claim_id, lease_ms)?
        } else {
            let (owed, mut fits) = (&self.owed, limits.fits());
            self.router
                .claim_some(now, claim_id, lease_ms, |key| fits(owed.item_bytes(key)))?
        };
        let claimed = claim.items.len();
        let items = self.owed.items(claim.items);
        let row = ClaimRow {
            claim_id: claim.claim_id.clone(),
            session_id: self.session.session_id.clone(),
            consumer: consumer.clone(),
            lease_expires_at_ms: claim.lease_expires_at_ms,
            items: u32::try_from(claimed).unwrap_or(u32::MAX - 1),
        };
        // Cheap by design: a claim is returned at a crash anyway, so its row is not flushed.
        if let Err(e) = self.engine.ledger.put_claim(&row) {
            tracing::warn!(claim = %row.claim_id, "writing the claim row failed: {e}");
        }
        self.emit_claim(&claim.claim_id, ClaimChange::Claimed, items.len());
        // Consumers of claims that ended are forgotten here, so the map holds live claims only.
        let router = &self.router;
        self.consumers.retain(|id, _| router.lease_of(id).is_some());
        self.consumers.insert(claim.claim_id.clone(), consumer.clone());
        Some(Envelope {
            claim_id: claim.claim_id,
            consumer,
            lease_expires_at_ms: claim.lease_expires_at_ms,
            items,
            more: claim.more,
            text: String::new(),
        })
    }

    /// Tells observers what happened to a claim.
    fn emit_claim(&self, claim_id: &str, change: ClaimChange, items: usize) {
        self.emit(|| Event::Claim {
            claim_id: claim_id.to_string(),
            change,
            items,
        });
    }

    /// Ends the claims whose lease ran out: those that dead-letter nothing at once; the others
    /// are held and returned as requests, to be made durable first.
    pub(super) fn expire_due(&mut self) -> Vec<Durable> {
        let now = now_ms();
        let mut dying = Vec::new();
        for claim_id in self.router.due_claims(now) {
            let Some(returned) = self.router.plan_expiry(now, &claim_id) else {
                continue;
            };
            tracing::debug!(claim = %claim_id, "lease expired");
            if returned.dead.is_empty() {
                self.apply_returned(&claim_id, &returned, ClaimChange::Expired);
            } else {
                self.router.hold(&claim_id);
                dying.push(Durable::Expire(claim_id));
            }
        }
        self.router.promote(now);
        dying
    }

    /// Whether a live claim's lease had run out when a request of it arrived (its expiry may
    /// still be on its way to the disk): the request comes too late.
    fn lease_ran_out(&self, claim_id: &str, arrived: u64) -> bool {
        self.router.lease_of(claim_id).is_some_and(|t| t <= arrived)
    }

    /// Why a claim is refused that the router refused and no ack row names: one it does not
    /// know that was made before this owner took the session was lost with the owner that made
    /// it (its items were returned when this one read the session), whether or not its claim row
    /// was written or is still there.
    fn refusal(&self, refused: ClaimError) -> BroodError {
        match refused {
            ClaimError::Unknown(id) if claim_made_ms(&id).is_some_and(|made| made < self.since_ms) => {
                BroodError::ClaimLost(id)
            }
            refused => refused.into(),
        }
    }

    /// A claim acknowledged durably before (by an earlier owner or process), if it was.
    fn durably_acked(&self, claim_id: &str) -> Result<Option<usize>, BroodError> {
        Ok(self
            .engine
            .ledger
            .ack(&self.session.session_id, claim_id)?
            .map(|row| row.items.len()))
    }

    /// Decides an ack: an ack row for the claim, flushed; then its items are delivered.
    pub(super) fn decide_ack(
        &mut self,
        claim_id: String,
        reply: oneshot::Sender<Result<usize, BroodError>>,
        arrived: u64,
        view: &mut BatchView,
    ) -> Decided<Durable> {
        if view.claims.contains(&claim_id) {
            return Decided::Later(Durable::Ack(claim_id, reply, arrived));
        }
        if self.lease_ran_out(&claim_id, arrived) {
            answer(reply, Err(BroodError::ClaimLost(claim_id)));
            return Decided::Done;
        }
        let items = match self.router.plan_ack(&claim_id) {
            Ok(AckPlan::Acked(n)) => {
                answer(reply, Ok(n));
                return Decided::Done;
            }
            Ok(AckPlan::Deliver(items)) => items,
            Err(refused) => {
                // Retried after an owner restart: the ack row says it took effect.
                let answered = match self.durably_acked(&claim_id) {
                    Ok(Some(n)) => Ok(n),
                    Ok(None) => Err(self.refusal(refused)),
                    Err(e) => Err(e),
                };
                answer(reply, answered);
                return Decided::Done;
            }
        };
        view.take_claim(&claim_id);
        self.router.hold(&claim_id);
        let row = AckRow {
            claim_id: claim_id.clone(),
            session_id: self.session.session_id.clone(),
            items: items.clone(),
            acked_at_ms: now_ms(),
        };
        let restore = Writes {
            remove_acks: vec![self.row_key(&claim_id)],
            ..Writes::default()
        };
        Decided::Step(Step {
            writes: Writes {
                acks: vec![row],
                ..Writes::default()
            },
            restore,
            apply: Apply::Ack { claim_id, items, reply },
        })
    }

    /// Applies an ack: its items are delivered, its claim row goes.
    pub(super) fn apply_ack(
        &mut self,
        claim_id: String,
        items: Vec<String>,
        reply: oneshot::Sender<Result<usize, BroodError>>,
        res: Result<(), BroodError>,
    ) {
        if let Err(e) = res {
            self.router.unhold(&claim_id);
            return answer(reply, Err(e));
        }
        let delivered = self.router.apply_ack(&claim_id);
        self.count_delivered(&items, true);
        self.emit_claim(&claim_id, ClaimChange::Acked, delivered);
        let calls = self.owed.mark_calls(&items, |d| d.delivered = true);
        // The ack row is the durable record, folded into the children's rows when they are
        // read back: they are not rewritten. The claim row goes, without a flush of its own.
        self.write_unflushed(Writes {
            remove_claims: vec![self.row_key(&claim_id)],
            ..Writes::default()
        });
        self.collect(calls);
        answer(reply, Ok(delivered));
    }

    /// Counts `items` delivered (their ack, or a sync caller's receipt, is durable), and tells
    /// how long each was claimable before its ack when `timed` (before their calls leave memory).
    pub(super) fn count_delivered(&self, items: &[String], timed: bool) {
        let counters = &self.engine.counters;
        let timed = timed && counters.timed();
        let now = if timed { now_ms() } else { 0 };
        for key in items {
            if let Some((_, kind)) = parse_dedup_key(key) {
                counters.delivered(kind);
            }
            // Looked up only when someone is told: an ack without an observer does no
            // per-item lookup for it.
            if !timed {
                continue;
            }
            if let Some(since) = self.router.ready_since(key.as_str()) {
                counters.time(DeliveryStage::ReadyToAck, since, now);
            }
        }
    }

    /// Decides a release: applied at once unless it dead-letters items, which are made durable
    /// first.
    pub(super) fn decide_release(
        &mut self,
        msg: Release,
        reply: oneshot::Sender<Result<(), BroodError>>,
        arrived: u64,
        view: &mut BatchView,
    ) -> Decided<Durable> {
        if view.claims.contains(&msg.claim_id) {
            return Decided::Later(Durable::Release(msg, reply, arrived));
        }
        if self.lease_ran_out(&msg.claim_id, arrived) {
            answer(reply, Err(BroodError::ClaimLost(msg.claim_id)));
            return Decided::Done;
        }
        let returned = match self
            .router
            .plan_release(now_ms(), &msg.claim_id, msg.reason, msg.retry_after_ms)
        {
            Ok(r) => r,
            Err(refused) => {
                let answered = match self.durably_acked(&msg.claim_id) {
                    Ok(Some(_)) => Err(BroodError::ClaimAcked(msg.claim_id)),
                    Ok(None) => Err(self.refusal(refused)),
                    Err(e) => Err(e),
                };
                answer(reply, answered);
                return Decided::Done;
            }
        };
        let why = match msg.reason {
            ReleaseReason::Busy => "released busy",
            ReleaseReason::Failed => "delivery failed on the last attempt",
        };
        let asker = HandBackAsker::Release(reply);
        if returned.dead.is_empty() {
            return Decided::Now(Apply::HandBack(Box::new(HandBack {
                claim_id: msg.claim_id,
                returned,
                change: ClaimChange::Released,
                why: None,
                asker,
            })));
        }
        view.take_claim(&msg.claim_id);
        self.router.hold(&msg.claim_id);
        self.dead_letter_step(msg.claim_id, returned, why, ClaimChange::Released, asker)
    }

    /// Decides an expiry that dead-letters items (held since its lease ran out).
    pub(super) fn decide_expiry(&mut self, claim_id: String, view: &mut BatchView) -> Decided<Durable> {
        let Some(returned) = self.router.plan_expiry(now_ms(), &claim_id) else {
            return Decided::Done;
        };
        let why = "lease expired on the last delivery attempt";
        if returned.dead.is_empty() {
            return Decided::Now(Apply::HandBack(Box::new(HandBack {
                claim_id,
                returned,
                change: ClaimChange::Expired,
                why: None,
                asker: HandBackAsker::Expiry,
            })));
        }
        view.take_claim(&claim_id);
        self.dead_letter_step(claim_id, returned, why, ClaimChange::Expired, HandBackAsker::Expiry)
    }

    /// A step writing the dead letters of a hand-back; applied (the claim ended, its items
    /// placed) once they are durable.
    fn dead_letter_step(
        &mut self,
        claim_id: String,
        returned: Returned<String>,
        why: &'static str,
        change: ClaimChange,
        asker: HandBackAsker,
    ) -> Decided<Durable> {
        let now = now_ms();
        let dead: Vec<DeadLetterRow> = returned
            .dead
            .iter()
            .filter_map(|(key, attempts)| {
                let (child, kind) = parse_dedup_key(key)?;
                let row = self.owed.child(child)?;
                Some(DeadLetterRow {
                    dedup_key: key.clone(),
                    child_id: child.to_string(),
                    session_id: row.session_id.clone(),
                    call_id: row.call_id.clone(),
                    kind,
                    reason: why.to_string(),
                    attempts: *attempts,
                    dead_at_ms: now,
                })
            })
            .collect();
        let restore = Writes {
            remove_dead_letters: dead.iter().map(|d| self.row_key(&d.dedup_key)).collect(),
            ..Writes::default()
        };
        Decided::Step(Step {
            writes: Writes {
                dead_letters: dead,
                ..Writes::default()
            },
            restore,
            apply: Apply::HandBack(Box::new(HandBack {
                claim_id,
                returned,
                change,
                why: Some(why),
                asker,
            })),
        })
    }

    /// Applies a hand-back once what it dead-letters is durable (at once when it dead-letters
    /// nothing), and tells whoever asked for it. A failed one leaves the claim held: a release
    /// is answered the failure (the claim is live again), an expiry is tried again later.
    pub(super) fn apply_hand_back(&mut self, h: HandBack, res: Result<(), BroodError>, ctx: &mut actix::Context<Self>) {
        let HandBack {
            claim_id,
            returned,
            change,
            why,
            asker,
        } = h;
        if res.is_ok() {
            if let Some(why) = why {
                tracing::warn!(
                    items = returned.dead.len(),
                    "items moved to the dead-letter tree: {why}"
                );
            }
            self.apply_returned(&claim_id, &returned, change);
        }
        match asker {
            HandBackAsker::Release(reply) => {
                if res.is_err() {
                    self.router.unhold(&claim_id);
                }
                answer(reply, res);
            }
            // Still held: try again a little later, not in a loop against a failing disk.
            HandBackAsker::Expiry if res.is_err() => {
                ctx.run_later(EXPIRY_RETRY, move |act, ctx| act.submit(Durable::Expire(claim_id), ctx));
            }
            HandBackAsker::Expiry => {}
        }
    }

    /// Applies a hand-back: the claim ends, its items are placed as decided, attempt counts and
    /// dead marks are copied to the children's rows (without a flush: the dead letters, already
    /// durable, are the record), the claim row goes.
    pub(super) fn apply_returned(&mut self, claim_id: &str, returned: &Returned<String>, change: ClaimChange) {
        self.router.apply_returned(claim_id, returned);
        self.emit_claim(claim_id, change, returned.requeued.len() + returned.dead.len());
        let mut rows = Vec::new();
        for (key, attempts) in &returned.requeued {
            let attempts = *attempts;
            rows.extend(self.owed.mark(std::iter::once(key), |d| d.failed_attempts = attempts));
        }
        for (key, attempts) in &returned.dead {
            let attempts = *attempts;
            rows.extend(self.owed.mark(std::iter::once(key), |d| {
                d.failed_attempts = attempts;
                d.dead = true;
            }));
        }
        let calls: Vec<String> = rows.iter().map(|r| r.call_id.clone()).collect();
        self.write_unflushed(Writes {
            children: rows,
            remove_claims: vec![self.row_key(claim_id)],
            ..Writes::default()
        });
        if !returned.dead.is_empty() {
            self.collect(calls);
        }
    }
}
