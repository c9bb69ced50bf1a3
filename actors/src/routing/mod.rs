//! Pure routing decisions: what is ready, what a claim owns, when items come back, what is
//! dead-lettered, when a session is woken, which queued child may start, when a unit publishes.
//!
//! Nothing here does I/O, reads a clock or knows about actors: every function takes `now_ms`
//! and returns what changed, and the [`crate::actors::owner::SessionOwner`] turns that into
//! ledger writes and replies. That is what lets the claim state machine be tested (and
//! property-tested against a plain model) without a running system.

mod capacity;
mod live;
mod shares;
mod wake;

use std::collections::{BTreeSet, VecDeque};

use foldhash::{HashMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;

pub use capacity::{on_child_end, Capacity, Publish};
pub use live::{LiveCount, Reservation};
pub use shares::Shares;
pub use wake::{Turn, WakeState};

/// Why a claim is handed back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseReason {
    /// The consumer could not take the items now; not a delivery attempt.
    Busy,
    /// Delivering them failed; a delivery attempt, with backoff.
    Failed,
}

/// An ack or release that cannot be honoured. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// The claim ended by lease expiry or release; its items may be in another claim now.
    #[error("claim {0} was lost (its lease expired or it was released); its items were returned to the ready set")]
    Lost(String),
    /// The claim was acknowledged already; it cannot be released.
    #[error("claim {0} was already acknowledged")]
    Acked(String),
    /// No such claim was ever made here.
    #[error("claim {0} is unknown")]
    Unknown(String),
}

/// Backoff before an item whose delivery failed `failed_attempts` times is ready again:
/// 100 ms doubling per attempt, at most 60 s.
pub fn failure_backoff_ms(failed_attempts: u32) -> u64 {
    let exp = failed_attempts.saturating_sub(1).min(20);
    (100u64 << exp).min(60_000)
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Ready,
    Waiting(u64),
    /// In a live claim (the claim's item list says which).
    Claimed,
    Delivered,
    Dead,
}

#[derive(Debug, Clone)]
struct Entry {
    state: State,
    failed_attempts: u32,
    /// When it was first made claimable here (published, or revived).
    ready_since_ms: u64,
}

#[derive(Debug, Clone)]
struct LiveClaim<K> {
    items: Vec<K>,
    expires_at_ms: u64,
    claimed_at_ms: u64,
}

/// A live claim as the router holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimHeld<'a, K> {
    /// The claim id.
    pub claim_id: &'a str,
    /// Its items, in the order it took them.
    pub items: &'a [K],
    /// When it was made.
    pub claimed_at_ms: u64,
    /// When its lease runs out.
    pub lease_expires_at_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Acked(usize),
    Lost,
}

/// Items granted by one boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim<K> {
    /// The claim id the caller supplied.
    pub claim_id: String,
    /// Every item that was ready, with its delivery attempt (1 for the first claim).
    pub items: Vec<(K, u32)>,
    /// When the lease runs out.
    pub lease_expires_at_ms: u64,
    /// Ready items were left out (the claim's bound was reached): they go at a later boundary.
    pub more: bool,
}

/// Items a claim handed back (by release or lease expiry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Returned<K> {
    /// Back in the ready set (now or after a backoff), with their failed-attempt counts.
    pub requeued: Vec<(K, u32)>,
    /// Past `max_delivery_attempts`: to be dead-lettered, with their attempt counts.
    pub dead: Vec<(K, u32)>,
    /// For each of `requeued`, in order: when it is ready again (0: at once).
    pub ready_at: Vec<u64>,
}

/// What an ack would do, decided without changing anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckPlan<K> {
    /// The claim is live: these items become delivered once the ack is durable.
    Deliver(Vec<K>),
    /// The claim was acked before and delivered this many items: answer the same.
    Acked(usize),
}

/// What an ack did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acked<K> {
    /// Items newly made delivered (empty when the claim was acked before).
    pub items: Vec<K>,
    /// How many items the claim delivered in all.
    pub delivered: usize,
}

/// How many ended claims are remembered to tell "lost" and "already acked" from "unknown": the
/// last 4,096, about 0.75 MiB per session at most whatever its history (a claim id twice, its
/// end, the map's own slot). An ack of an older claim is answered by the owner from its
/// durable ack row; a release of one is refused as unknown.
pub const ENDED_MEMORY: usize = 1 << 12;

/// The claim state machine of one session: ready items, waiting (backed-off) items, live claims
/// and the lease/backoff deadlines. `K` identifies an item (the owner uses dedup keys).
#[derive(Debug)]
pub struct Router<K: Clone + Eq + Hash + Ord + Debug> {
    max_delivery_attempts: u32,
    items: HashMap<K, Entry>,
    /// The items in state ready, in the order they became so (each once: an item enters only
    /// on its way into that state). A boundary takes them all; its envelope orders them.
    ready: Vec<K>,
    waiting: BTreeSet<(u64, K)>,
    claims: HashMap<String, LiveClaim<K>>,
    leases: BTreeSet<(u64, String)>,
    ended: HashMap<String, Ended>,
    ended_order: VecDeque<String>,
    /// Claims whose ack or hand-back is being made durable: not expired meanwhile.
    held: HashSet<String>,
}

impl<K: Clone + Eq + Hash + Ord + Debug> Router<K> {
    /// An empty router; items are dead-lettered after `max_delivery_attempts` failed attempts.
    pub fn new(max_delivery_attempts: u32) -> Self {
        Router {
            max_delivery_attempts: max_delivery_attempts.max(1),
            items: HashMap::default(),
            ready: Vec::new(),
            waiting: BTreeSet::new(),
            claims: HashMap::default(),
            leases: BTreeSet::new(),
            ended: HashMap::default(),
            ended_order: VecDeque::new(),
            held: HashSet::default(),
        }
    }

    /// Makes room for `n` more items.
    pub fn reserve(&mut self, n: usize) {
        self.items.reserve(n);
        self.ready.reserve(n);
    }

    /// Publishes an item as ready at `now_ms`. `failed_attempts` carries its history
    /// (recovery). An item already known is left as it is.
    pub fn publish(&mut self, key: K, failed_attempts: u32, now_ms: u64) -> bool {
        match self.items.entry(key) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(slot) => {
                self.ready.push(slot.key().clone());
                slot.insert(Entry {
                    state: State::Ready,
                    failed_attempts,
                    ready_since_ms: now_ms,
                });
                true
            }
        }
    }

    /// Puts a dead item back in the ready set with its delivery attempts counted afresh (a
    /// redrive); an item the router does not hold (its call had left memory) is published anew.
    /// False when the item is not dead. Its time ready counts from `now_ms`.
    pub fn revive(&mut self, key: K, now_ms: u64) -> bool {
        match self.items.get_mut(&key) {
            Some(e) if matches!(e.state, State::Dead) => {
                e.state = State::Ready;
                e.failed_attempts = 0;
                e.ready_since_ms = now_ms;
                self.ready.push(key);
                true
            }
            Some(_) => false,
            None => self.publish(key, 0, now_ms),
        }
    }

    /// When a known item was first made claimable (published, or revived): a release or a
    /// backoff since does not change it.
    pub fn ready_since<Q>(&self, key: &Q) -> Option<u64>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.items.get(key).map(|e| e.ready_since_ms)
    }

    /// Remembers a claim id from an earlier process as lost, so a late ack of it is refused as
    /// lost rather than unknown.
    pub fn remember_lost(&mut self, claim_id: String) {
        self.end(claim_id, Ended::Lost);
    }

    /// Items claimable at `now_ms`.
    pub fn ready_count(&self, now_ms: u64) -> usize {
        self.ready.len() + self.waiting.iter().take_while(|(t, _)| *t <= now_ms).count()
    }

    /// Items in live claims.
    pub fn claimed_count(&self) -> usize {
        self.claims.values().map(|c| c.items.len()).sum()
    }

    /// Items ready or waiting out a backoff.
    pub fn pending_count(&self) -> usize {
        self.ready.len() + self.waiting.len()
    }

    /// Whether the item was acknowledged.
    pub fn is_delivered(&self, key: &K) -> bool {
        matches!(
            self.items.get(key),
            Some(Entry {
                state: State::Delivered,
                ..
            })
        )
    }

    /// Whether the item is known and not yet delivered or dead.
    pub fn is_open<Q>(&self, key: &Q) -> bool
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.items
            .get(key)
            .is_some_and(|e| !matches!(e.state, State::Delivered | State::Dead))
    }

    /// Changes the dead-letter limit; applies from the next attempt that ends.
    pub fn set_max_delivery_attempts(&mut self, max: u32) {
        self.max_delivery_attempts = max.max(1);
    }

    /// Forgets a delivered or dead item (memory reclaim once its call is done).
    pub fn forget<Q>(&mut self, key: &Q)
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if let Some(e) = self.items.get(key) {
            if matches!(e.state, State::Delivered | State::Dead) {
                self.items.remove(key);
            }
        }
    }

    fn promote_due(&mut self, now_ms: u64) {
        while let Some((t, _)) = self.waiting.first() {
            if *t > now_ms {
                break;
            }
            let Some((_, key)) = self.waiting.pop_first() else {
                break;
            };
            if let Some(e) = self
                .items
                .get_mut(&key)
                .filter(|e| matches!(e.state, State::Waiting(_)))
            {
                e.state = State::Ready;
                self.ready.push(key);
            }
        }
    }

    /// A boundary: every item ready at `now_ms` goes into one new claim, or nothing does.
    pub fn claim(&mut self, now_ms: u64, claim_id: String, lease_ms: u64) -> Option<Claim<K>> {
        self.claim_some(now_ms, claim_id, lease_ms, |_| true)
    }

    /// A bounded boundary: the items ready at `now_ms`, in the order they became ready, go into
    /// one new claim while `take` says the next one still fits; the first always goes (so that
    /// an item larger than any bound is still delivered), and from the first that does not fit
    /// on, the rest stay ready, in their order.
    pub fn claim_some(
        &mut self,
        now_ms: u64,
        claim_id: String,
        lease_ms: u64,
        mut take: impl FnMut(&K) -> bool,
    ) -> Option<Claim<K>> {
        self.promote_due(now_ms);
        if self.ready.is_empty() {
            return None;
        }
        let ready: Vec<K> = std::mem::take(&mut self.ready);
        let mut keys = Vec::with_capacity(ready.len());
        let mut items = Vec::with_capacity(ready.len());
        let mut full = false;
        for key in ready {
            let Some(e) = self.items.get_mut(&key).filter(|e| e.state == State::Ready) else {
                continue; // no longer ready: dropped from the list
            };
            if full || (!keys.is_empty() && !take(&key)) {
                full = true;
                self.ready.push(key);
                continue;
            }
            if keys.is_empty() {
                // The first goes whatever its size; it still counts against the bound.
                take(&key);
            }
            e.state = State::Claimed;
            items.push((key.clone(), e.failed_attempts.saturating_add(1)));
            keys.push(key);
        }
        if keys.is_empty() {
            return None;
        }
        let lease_expires_at_ms = now_ms.saturating_add(lease_ms);
        self.leases.insert((lease_expires_at_ms, claim_id.clone()));
        self.claims.insert(
            claim_id.clone(),
            LiveClaim {
                items: keys,
                expires_at_ms: lease_expires_at_ms,
                claimed_at_ms: now_ms,
            },
        );
        Some(Claim {
            claim_id,
            items,
            lease_expires_at_ms,
            more: !self.ready.is_empty(),
        })
    }

    fn end(&mut self, claim_id: String, how: Ended) {
        if self.ended.insert(claim_id.clone(), how).is_none() {
            self.ended_order.push_back(claim_id);
            while self.ended_order.len() > ENDED_MEMORY {
                if let Some(old) = self.ended_order.pop_front() {
                    self.ended.remove(&old);
                }
            }
        }
    }

    fn refuse(&self, claim_id: &str) -> ClaimError {
        match self.ended.get(claim_id) {
            Some(Ended::Lost) => ClaimError::Lost(claim_id.to_string()),
            Some(Ended::Acked(_)) => ClaimError::Acked(claim_id.to_string()),
            None => ClaimError::Unknown(claim_id.to_string()),
        }
    }

    /// Decides an ack without changing anything: the items the claim would deliver, or (for a
    /// claim acked before) the count it delivered, or why it cannot be acked.
    pub fn plan_ack(&self, claim_id: &str) -> Result<AckPlan<K>, ClaimError> {
        if let Some(Ended::Acked(n)) = self.ended.get(claim_id) {
            return Ok(AckPlan::Acked(*n));
        }
        let claim = self.claims.get(claim_id).ok_or_else(|| self.refuse(claim_id))?;
        Ok(AckPlan::Deliver(claim.items.clone()))
    }

    /// Applies an ack decided by [`Router::plan_ack`] (its record is durable now): the claim's
    /// items are delivered, for good. Returns how many.
    pub fn apply_ack(&mut self, claim_id: &str) -> usize {
        self.held.remove(claim_id);
        let Some(claim) = self.claims.remove(claim_id) else {
            return match self.ended.get(claim_id) {
                Some(Ended::Acked(n)) => *n,
                _ => 0,
            };
        };
        self.leases.remove(&(claim.expires_at_ms, claim_id.to_string()));
        for key in &claim.items {
            if let Some(e) = self.items.get_mut(key) {
                e.state = State::Delivered;
            }
        }
        let delivered = claim.items.len();
        self.end(claim_id.to_string(), Ended::Acked(delivered));
        delivered
    }

    /// Acknowledges a live claim at once ([`Router::plan_ack`] then [`Router::apply_ack`]).
    /// Acking an acked claim answers the same count and changes nothing.
    pub fn ack(&mut self, claim_id: &str) -> Result<Acked<K>, ClaimError> {
        match self.plan_ack(claim_id)? {
            AckPlan::Acked(delivered) => Ok(Acked {
                items: Vec::new(),
                delivered,
            }),
            AckPlan::Deliver(items) => {
                let delivered = self.apply_ack(claim_id);
                Ok(Acked { items, delivered })
            }
        }
    }

    /// Remembers a claim that an earlier process acknowledged durably, so a retried ack of it
    /// answers the same count.
    pub fn remember_acked(&mut self, claim_id: String, delivered: usize) {
        self.end(claim_id, Ended::Acked(delivered));
    }

    /// Keeps a live claim from expiring while its ack or hand-back is made durable.
    pub fn hold(&mut self, claim_id: &str) {
        if self.claims.contains_key(claim_id) {
            self.held.insert(claim_id.to_string());
        }
    }

    /// Lets a held claim expire again (its durable write failed; it is as it was).
    pub fn unhold(&mut self, claim_id: &str) {
        self.held.remove(claim_id);
    }

    /// The live claims, in no order.
    pub fn live_claims(&self) -> impl Iterator<Item = ClaimHeld<'_, K>> + '_ {
        self.claims.iter().map(|(id, c)| ClaimHeld {
            claim_id: id.as_str(),
            items: &c.items,
            claimed_at_ms: c.claimed_at_ms,
            lease_expires_at_ms: c.expires_at_ms,
        })
    }

    /// When a live claim's lease runs out.
    pub fn lease_of(&self, claim_id: &str) -> Option<u64> {
        self.claims.get(claim_id).map(|c| c.expires_at_ms)
    }

    /// Decides a release without changing anything. `busy` is no delivery attempt; `failed`
    /// is one, and backs off. `retry_after_ms` is the least time before the items are ready
    /// again.
    pub fn plan_release(
        &self,
        now_ms: u64,
        claim_id: &str,
        reason: ReleaseReason,
        retry_after_ms: u64,
    ) -> Result<Returned<K>, ClaimError> {
        let claim = self.claims.get(claim_id).ok_or_else(|| self.refuse(claim_id))?;
        Ok(self.plan_hand_back(
            now_ms,
            &claim.items,
            reason == ReleaseReason::Failed,
            true,
            retry_after_ms,
        ))
    }

    /// Decides what the expiry of a live claim's lease hands back (each item a delivery
    /// attempt, no backoff), without changing anything.
    pub fn plan_expiry(&self, now_ms: u64, claim_id: &str) -> Option<Returned<K>> {
        let claim = self.claims.get(claim_id)?;
        Some(self.plan_hand_back(now_ms, &claim.items, true, false, 0))
    }

    /// Ends a live claim as lost and places its items as `returned` (from
    /// [`Router::plan_release`] or [`Router::plan_expiry`]) decided.
    pub fn apply_returned(&mut self, claim_id: &str, returned: &Returned<K>) {
        self.held.remove(claim_id);
        let Some(claim) = self.claims.remove(claim_id) else {
            return;
        };
        self.leases.remove(&(claim.expires_at_ms, claim_id.to_string()));
        self.end(claim_id.to_string(), Ended::Lost);
        for ((key, attempts), &at) in returned.requeued.iter().zip(&returned.ready_at) {
            let Some(e) = self.items.get_mut(key) else { continue };
            e.failed_attempts = *attempts;
            if at == 0 {
                e.state = State::Ready;
                self.ready.push(key.clone());
            } else {
                e.state = State::Waiting(at);
                self.waiting.insert((at, key.clone()));
            }
        }
        for (key, attempts) in &returned.dead {
            if let Some(e) = self.items.get_mut(key) {
                e.failed_attempts = *attempts;
                e.state = State::Dead;
            }
        }
    }

    /// Hands a live claim back at once ([`Router::plan_release`] then
    /// [`Router::apply_returned`]).
    pub fn release(
        &mut self,
        now_ms: u64,
        claim_id: &str,
        reason: ReleaseReason,
        retry_after_ms: u64,
    ) -> Result<Returned<K>, ClaimError> {
        let returned = self.plan_release(now_ms, claim_id, reason, retry_after_ms)?;
        self.apply_returned(claim_id, &returned);
        Ok(returned)
    }

    fn plan_hand_back(&self, now_ms: u64, keys: &[K], failed: bool, backoff: bool, min_wait_ms: u64) -> Returned<K> {
        let mut out = Returned {
            requeued: Vec::new(),
            dead: Vec::new(),
            ready_at: Vec::new(),
        };
        for key in keys {
            let Some(e) = self.items.get(key) else { continue };
            let attempts = if failed {
                e.failed_attempts.saturating_add(1)
            } else {
                e.failed_attempts
            };
            // Only an attempt can exhaust the attempts: a busy release never dead-letters,
            // even when the limit was lowered below the item's count.
            if failed && attempts >= self.max_delivery_attempts {
                out.dead.push((key.clone(), attempts));
                continue;
            }
            let mut wait = min_wait_ms;
            if failed && backoff {
                wait = wait.max(failure_backoff_ms(attempts));
            }
            out.requeued.push((key.clone(), attempts));
            out.ready_at.push(if wait == 0 {
                0
            } else {
                now_ms.saturating_add(wait).max(1)
            });
        }
        out
    }

    /// Live claims whose lease ran out by `now_ms` and that are not held, earliest first.
    pub fn due_claims(&self, now_ms: u64) -> Vec<String> {
        self.leases
            .iter()
            .take_while(|(t, _)| *t <= now_ms)
            .filter(|(_, c)| !self.held.contains(c))
            .map(|(_, c)| c.clone())
            .collect()
    }

    /// Moves backed-off items whose time came into the ready set.
    pub fn promote(&mut self, now_ms: u64) {
        self.promote_due(now_ms);
    }

    /// Ends every claim whose lease ran out by `now_ms` (each a delivery attempt, no backoff)
    /// and moves backed-off items whose time came into the ready set, at once.
    pub fn tick(&mut self, now_ms: u64) -> Vec<(String, Returned<K>)> {
        let mut out = Vec::new();
        for claim_id in self.due_claims(now_ms) {
            if let Some(returned) = self.plan_expiry(now_ms, &claim_id) {
                self.apply_returned(&claim_id, &returned);
                out.push((claim_id, returned));
            }
        }
        self.promote_due(now_ms);
        out
    }

    /// The next moment [`Router::tick`] has something to do: a lease end or a backoff end.
    pub fn next_deadline(&self) -> Option<u64> {
        let lease = self
            .leases
            .iter()
            .find(|(_, c)| !self.held.contains(c))
            .map(|(t, _)| *t);
        let wait = self.waiting.first().map(|(t, _)| *t);
        match (lease, wait) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests;
