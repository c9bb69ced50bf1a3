//! Model-based property tests of the pure routing state machines in `brood::routing`.
//!
//! The claim state machine ([`Router`]) is driven with random sequences of operations and,
//! after every step, compared with a plain model written here from DESIGN.md (vocabulary,
//! I2, I4, I5): a map of items with an explicit state each, and a map of claims with an
//! explicit status. Independently of the model, the router's own outputs are tracked to
//! check I2 (an item in at most one live claim; a delivered or dead-lettered item is never
//! claimed again) and that a claim that ends hands back exactly what it held.
//!
//! Time moves with `Tick`, which runs `Router::tick` at the new time, and with `Advance`, which
//! does not (the owner's timer has not fired yet) but stops short of the earliest live lease
//! end. So every lease that has run out is processed before the next claim, ack or release
//! (leases are at least 1 ms), while a backoff may have ended without a tick.
//!
//! [`WakeState`] (I7) and [`Capacity`] (I8) get a small model each at the end.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use brood_actors::routing::{failure_backoff_ms, Capacity, ClaimError, ReleaseReason, Router, Turn, WakeState};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
enum ItemState {
    /// Claimable now.
    Ready,
    /// Backed off: claimable from this time on.
    Waiting(u64),
    /// In this live claim.
    Claimed(String),
    /// Acknowledged: final, never delivered again.
    Delivered,
    /// Dead-lettered: final.
    Dead,
    /// Delivered or dead, then forgotten by the router (memory reclaim).
    Forgotten,
}

#[derive(Debug, Clone)]
struct Item {
    state: ItemState,
    /// Delivery attempts that ended in failure (lease expiry or failed release).
    failed: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Status {
    Live,
    Acked(usize),
    Lost,
}

#[derive(Debug, Clone)]
struct Claim {
    items: Vec<u32>,
    expires: u64,
    status: Status,
}

#[derive(Debug)]
struct Model {
    max: u32,
    now: u64,
    items: BTreeMap<u32, Item>,
    claims: BTreeMap<String, Claim>,
}

/// What a claim handed back, in the router's terms, sorted.
type Back = (Vec<(u32, u32)>, Vec<(u32, u32)>);

impl Model {
    fn new(max: u32) -> Self {
        Model {
            max,
            now: 0,
            items: BTreeMap::new(),
            claims: BTreeMap::new(),
        }
    }

    fn is_ready(&self, item: &Item) -> bool {
        match item.state {
            ItemState::Ready => true,
            ItemState::Waiting(at) => at <= self.now,
            _ => false,
        }
    }

    fn publish(&mut self, key: u32, failed: u32) -> bool {
        if self.items.contains_key(&key) {
            return false;
        }
        self.items.insert(
            key,
            Item {
                state: ItemState::Ready,
                failed,
            },
        );
        true
    }

    /// Every item ready right now goes into the claim, or nothing happens.
    fn claim(&mut self, cid: &str, lease: u64) -> Option<(Vec<(u32, u32)>, u64)> {
        let keys: Vec<u32> = self
            .items
            .iter()
            .filter(|(_, it)| self.is_ready(it))
            .map(|(k, _)| *k)
            .collect();
        if keys.is_empty() {
            return None;
        }
        let mut got = Vec::new();
        for k in &keys {
            let it = self.items.get_mut(k).unwrap();
            it.state = ItemState::Claimed(cid.to_string());
            got.push((*k, it.failed + 1));
        }
        let expires = self.now + lease;
        self.claims.insert(
            cid.to_string(),
            Claim {
                items: keys,
                expires,
                status: Status::Live,
            },
        );
        Some((got, expires))
    }

    fn refusal(&self, cid: &str, for_ack: bool) -> ClaimError {
        match self.claims.get(cid).map(|c| &c.status) {
            Some(Status::Lost) => ClaimError::Lost(cid.to_string()),
            Some(Status::Acked(_)) if !for_ack => ClaimError::Acked(cid.to_string()),
            Some(Status::Acked(_)) | Some(Status::Live) => unreachable!("not a refusal"),
            None => ClaimError::Unknown(cid.to_string()),
        }
    }

    /// Ok((items newly delivered, delivered count)).
    fn ack(&mut self, cid: &str) -> Result<(Vec<u32>, usize), ClaimError> {
        match self.claims.get(cid).map(|c| c.status.clone()) {
            Some(Status::Live) => {
                let claim = self.claims.get_mut(cid).unwrap();
                let n = claim.items.len();
                claim.status = Status::Acked(n);
                let items = claim.items.clone();
                for k in &items {
                    self.items.get_mut(k).unwrap().state = ItemState::Delivered;
                }
                Ok((items, n))
            }
            // Acking an acked claim again answers the same count and changes nothing.
            Some(Status::Acked(n)) => Ok((Vec::new(), n)),
            _ => Err(self.refusal(cid, true)),
        }
    }

    /// An item whose attempt failed: dead once its failed attempts reach the limit, else back
    /// after `wait` ms (0: at once).
    fn attempt_failed(&mut self, k: u32, wait: impl Fn(u32) -> u64, back: &mut Back) {
        let now = self.now;
        let max = self.max;
        let it = self.items.get_mut(&k).unwrap();
        it.failed += 1;
        if it.failed >= max {
            it.state = ItemState::Dead;
            back.1.push((k, it.failed));
        } else {
            let w = wait(it.failed);
            it.state = if w == 0 {
                ItemState::Ready
            } else {
                ItemState::Waiting(now + w)
            };
            back.0.push((k, it.failed));
        }
    }

    fn release(&mut self, cid: &str, reason: ReleaseReason, retry_after: u64) -> Result<Back, ClaimError> {
        if self.claims.get(cid).map(|c| &c.status) != Some(&Status::Live) {
            return Err(self.refusal(cid, false));
        }
        let claim = self.claims.get_mut(cid).unwrap();
        claim.status = Status::Lost;
        let items = claim.items.clone();
        let mut back = (Vec::new(), Vec::new());
        for k in items {
            match reason {
                // Not a delivery attempt: back after `retry_after`, attempts unchanged.
                ReleaseReason::Busy => {
                    let now = self.now;
                    let it = self.items.get_mut(&k).unwrap();
                    it.state = if retry_after == 0 {
                        ItemState::Ready
                    } else {
                        ItemState::Waiting(now + retry_after)
                    };
                    back.0.push((k, it.failed));
                }
                // A delivery attempt: back after max(retry_after, backoff(attempts)).
                ReleaseReason::Failed => {
                    self.attempt_failed(k, |failed| retry_after.max(failure_backoff_ms(failed)), &mut back)
                }
            }
        }
        back.0.sort();
        back.1.sort();
        Ok(back)
    }

    /// Time moves to `now`: every live claim whose lease ran out is lost (a delivery attempt,
    /// ready again at once); backed-off items whose time came are ready.
    fn tick(&mut self, now: u64) -> BTreeMap<String, Back> {
        self.now = now;
        let expired: Vec<String> = self
            .claims
            .iter()
            .filter(|(_, c)| c.status == Status::Live && c.expires <= now)
            .map(|(id, _)| id.clone())
            .collect();
        let mut out = BTreeMap::new();
        for cid in expired {
            let claim = self.claims.get_mut(&cid).unwrap();
            claim.status = Status::Lost;
            let items = claim.items.clone();
            let mut back = (Vec::new(), Vec::new());
            for k in items {
                self.attempt_failed(k, |_| 0, &mut back);
            }
            back.0.sort();
            back.1.sort();
            out.insert(cid, back);
        }
        for it in self.items.values_mut() {
            if let ItemState::Waiting(at) = it.state {
                if at <= now {
                    it.state = ItemState::Ready;
                }
            }
        }
        out
    }

    fn forget(&mut self, k: u32) {
        if let Some(it) = self.items.get_mut(&k) {
            if matches!(it.state, ItemState::Delivered | ItemState::Dead) {
                it.state = ItemState::Forgotten;
            }
        }
    }

    fn ready_count(&self) -> usize {
        self.items.values().filter(|it| self.is_ready(it)).count()
    }

    fn pending_count(&self) -> usize {
        self.items
            .values()
            .filter(|it| matches!(it.state, ItemState::Ready | ItemState::Waiting(_)))
            .count()
    }

    fn claimed_count(&self) -> usize {
        self.claims
            .values()
            .filter(|c| c.status == Status::Live)
            .map(|c| c.items.len())
            .sum()
    }

    fn next_deadline(&self) -> Option<u64> {
        let leases = self
            .claims
            .values()
            .filter(|c| c.status == Status::Live)
            .map(|c| c.expires);
        let backoffs = self.items.values().filter_map(|it| match it.state {
            ItemState::Waiting(at) => Some(at),
            _ => None,
        });
        leases.chain(backoffs).min()
    }

    fn ids_with(&self, f: impl Fn(&Status) -> bool) -> Vec<String> {
        self.claims
            .iter()
            .filter(|(_, c)| f(&c.status))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// The model's own consistency: a live claim's items are claimed by it and by no other.
    fn self_check(&self) {
        let mut holder: HashMap<u32, &str> = HashMap::new();
        for (id, c) in &self.claims {
            if c.status == Status::Live {
                for k in &c.items {
                    assert!(holder.insert(*k, id).is_none(), "model: {k} in two live claims");
                    assert_eq!(self.items[k].state, ItemState::Claimed(id.clone()), "model: {k}");
                }
            }
        }
        for (k, it) in &self.items {
            if let ItemState::Claimed(id) = &it.state {
                assert_eq!(
                    holder.get(k),
                    Some(&id.as_str()),
                    "model: {k} claimed by a claim that is not live"
                );
            }
            if matches!(
                it.state,
                ItemState::Ready | ItemState::Waiting(_) | ItemState::Claimed(_)
            ) {
                assert!(it.failed < self.max, "model: open item {k} is past the limit");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// What the router said, tracked independently of the model (I2, I4, nothing lost by a claim)
// ---------------------------------------------------------------------------------------------

#[derive(Default, Debug)]
struct Observed {
    live: HashMap<String, BTreeSet<u32>>,
    holder: HashMap<u32, String>,
    delivered: HashSet<u32>,
    dead: HashSet<u32>,
}

impl Observed {
    fn granted(&mut self, cid: &str, items: &[(u32, u32)]) {
        let keys: BTreeSet<u32> = items.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            keys.len(),
            items.len(),
            "I2: claim {cid} holds an item twice: {items:?}"
        );
        for k in &keys {
            assert!(
                !self.delivered.contains(k),
                "I2: delivered item {k} claimed again by {cid}"
            );
            assert!(
                !self.dead.contains(k),
                "I5: dead-lettered item {k} claimed again by {cid}"
            );
            if let Some(other) = self.holder.insert(*k, cid.to_string()) {
                panic!("I2/I4: item {k} granted to {cid} while in live claim {other}");
            }
        }
        assert!(
            self.live.insert(cid.to_string(), keys).is_none(),
            "claim id {cid} granted twice"
        );
    }

    fn ended(&mut self, cid: &str) -> BTreeSet<u32> {
        let keys = self
            .live
            .remove(cid)
            .unwrap_or_else(|| panic!("claim {cid} ended but was not live"));
        for k in &keys {
            self.holder.remove(k);
        }
        keys
    }

    fn acked(&mut self, cid: &str, items: &[u32]) {
        let keys = self.ended(cid);
        let got: BTreeSet<u32> = items.iter().copied().collect();
        assert_eq!(got, keys, "ack of {cid} delivered other items than it held");
        self.delivered.extend(keys);
    }

    fn handed_back(&mut self, cid: &str, requeued: &[(u32, u32)], dead: &[(u32, u32)]) {
        let keys = self.ended(cid);
        let got: BTreeSet<u32> = requeued.iter().chain(dead).map(|(k, _)| *k).collect();
        assert_eq!(
            got.len(),
            requeued.len() + dead.len(),
            "claim {cid} handed an item back twice"
        );
        assert_eq!(got, keys, "claim {cid} handed back other items than it held");
        self.dead.extend(dead.iter().map(|(k, _)| *k));
    }
}

// ---------------------------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------------------------

/// Picks one of the things that exist when the operation runs (an item, a claim).
#[derive(Debug, Clone, Copy)]
struct Ix(u16);

impl Ix {
    fn of(&self, len: usize) -> usize {
        self.0 as usize % len
    }
}

#[derive(Debug, Clone)]
enum Target {
    Live(Ix),
    Lost(Ix),
    Acked(Ix),
    Any(Ix),
    Unknown(u8),
}

#[derive(Debug, Clone)]
enum Op {
    /// A new item; `history` failed attempts (recovery), reduced below the limit.
    Publish {
        history: u32,
    },
    /// A unit completes: several items at once.
    Complete(u8),
    /// An item already known is published again (a duplicate completion): nothing changes.
    Republish(Ix),
    /// A boundary at the current time.
    Claim {
        lease: u64,
    },
    Ack(Target),
    /// A live claim's ack, release and expiry are decided (and the claim held, then let go)
    /// without being applied, as when their durable write fails: nothing changes.
    DecidedOnly(Ix),
    Release(Target, ReleaseReason, u64),
    /// The clock moves on and the router ticks.
    Tick(u64),
    /// The clock moves on but the owner's timer has not fired yet: no tick. Kept short of the
    /// earliest live lease end, so only backoffs can end meanwhile (`claim` must see them).
    Advance(u64),
    Forget(Ix),
    /// A claim id from an earlier process, remembered as lost.
    RememberLost,
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        6 => any::<u16>().prop_map(Ix).prop_map(Target::Live),
        2 => any::<u16>().prop_map(Ix).prop_map(Target::Lost),
        2 => any::<u16>().prop_map(Ix).prop_map(Target::Acked),
        1 => any::<u16>().prop_map(Ix).prop_map(Target::Any),
        1 => any::<u8>().prop_map(Target::Unknown),
    ]
}

fn duration(zero: u32) -> impl Strategy<Value = u64> {
    prop_oneof![
        zero => Just(0u64),
        3 => 1..50u64,
        3 => 50..2_000u64,
        2 => 2_000..70_000u64,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => prop_oneof![5 => Just(0u32), 1 => 0..12u32].prop_map(|history| Op::Publish { history }),
        2 => (1..6u8).prop_map(Op::Complete),
        1 => any::<u16>().prop_map(Ix).prop_map(Op::Republish),
        8 => prop_oneof![1..50u64, 50..5_000u64, 5_000..100_000u64].prop_map(|lease| Op::Claim { lease }),
        6 => target().prop_map(Op::Ack),
        1 => any::<u16>().prop_map(Ix).prop_map(Op::DecidedOnly),
        6 => (target(), prop_oneof![Just(ReleaseReason::Busy), Just(ReleaseReason::Failed)], duration(3))
            .prop_map(|(t, r, after)| Op::Release(t, r, after)),
        7 => duration(1).prop_map(Op::Tick),
        2 => duration(1).prop_map(Op::Advance),
        1 => any::<u16>().prop_map(Ix).prop_map(Op::Forget),
        1 => Just(Op::RememberLost),
    ]
}

/// Everything the router lets one observe, to check that a refusal changed nothing.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    ready: usize,
    pending: usize,
    claimed: usize,
    deadline: Option<u64>,
    leases: Vec<Option<u64>>,
    open: Vec<bool>,
    delivered: Vec<bool>,
}

fn snapshot(r: &Router<u32>, m: &Model) -> Snapshot {
    Snapshot {
        ready: r.ready_count(m.now),
        pending: r.pending_count(),
        claimed: r.claimed_count(),
        deadline: r.next_deadline(),
        leases: m.claims.keys().map(|id| r.lease_of(id)).collect(),
        open: m.items.keys().map(|k| r.is_open(k)).collect(),
        delivered: m.items.keys().map(|k| r.is_delivered(k)).collect(),
    }
}

/// The router and the model agree on everything observable.
fn agree(r: &Router<u32>, m: &Model) {
    m.self_check();
    assert_eq!(r.ready_count(m.now), m.ready_count(), "ready_count at {}", m.now);
    assert_eq!(r.pending_count(), m.pending_count(), "pending_count");
    assert_eq!(r.claimed_count(), m.claimed_count(), "claimed_count");
    assert_eq!(
        r.next_deadline(),
        m.next_deadline(),
        "next_deadline (earliest lease end or backoff end)"
    );
    for (id, c) in &m.claims {
        let lease = if c.status == Status::Live {
            Some(c.expires)
        } else {
            None
        };
        assert_eq!(r.lease_of(id), lease, "lease_of({id}) with the claim {:?}", c.status);
    }
    for (k, it) in &m.items {
        let open = matches!(
            it.state,
            ItemState::Ready | ItemState::Waiting(_) | ItemState::Claimed(_)
        );
        assert_eq!(r.is_open(k), open, "is_open({k}) in state {:?}", it.state);
        assert_eq!(
            r.is_delivered(k),
            it.state == ItemState::Delivered,
            "is_delivered({k}) in state {:?}",
            it.state
        );
    }
}

fn pick(ids: &[String], i: &Ix) -> Option<String> {
    if ids.is_empty() {
        None
    } else {
        Some(ids[i.of(ids.len())].clone())
    }
}

fn resolve(m: &Model, t: &Target) -> String {
    let chosen = match t {
        Target::Live(i) => pick(&m.ids_with(|s| *s == Status::Live), i),
        Target::Lost(i) => pick(&m.ids_with(|s| *s == Status::Lost), i),
        Target::Acked(i) => pick(&m.ids_with(|s| matches!(s, Status::Acked(_))), i),
        Target::Any(i) => pick(&m.ids_with(|_| true), i),
        Target::Unknown(_) => None,
    };
    chosen.unwrap_or_else(|| match t {
        Target::Unknown(n) => format!("unknown-{n}"),
        _ => "unknown".to_string(),
    })
}

fn sorted<T: Ord + Clone>(v: &[T]) -> Vec<T> {
    let mut v = v.to_vec();
    v.sort();
    v
}

/// Runs `ops` on a router and on the model side by side; they must agree after every step.
fn run(max: u32, ops: &[Op]) {
    let mut run = Run::new(max);
    for op in ops {
        run.step(op);
        agree(&run.r, &run.m);
    }
}

/// The router under test, the model it must match, what consumers were seen to be handed, and
/// the next fresh names.
struct Run {
    max: u32,
    r: Router<u32>,
    m: Model,
    seen: Observed,
    next_key: u32,
    next_claim: u32,
    next_remembered: u32,
}

impl Run {
    fn new(max: u32) -> Run {
        Run {
            max,
            r: Router::new(max),
            m: Model::new(max),
            seen: Observed::default(),
            next_key: 0,
            next_claim: 0,
            next_remembered: 0,
        }
    }

    /// One step on both sides, checking what each answered.
    fn step(&mut self, op: &Op) {
        match op {
            Op::Publish { history } => self.publish(history % self.max),
            Op::Complete(n) => {
                for _ in 0..*n {
                    self.publish(0);
                }
            }
            Op::Republish(i) => self.republish(i),
            Op::Claim { lease } => self.claim(*lease),
            Op::Ack(t) => self.ack(t),
            Op::DecidedOnly(i) => self.decided_only(i),
            Op::Release(t, reason, after) => self.release(t, *reason, *after),
            Op::Tick(dt) => self.tick(*dt),
            Op::Advance(dt) => self.advance(*dt),
            Op::Forget(i) => {
                let keys: Vec<u32> = self.m.items.keys().copied().collect();
                if !keys.is_empty() {
                    let k = keys[i.of(keys.len())];
                    self.r.forget(&k);
                    self.m.forget(k);
                }
            }
            Op::RememberLost => {
                let cid = format!("earlier-{}", self.next_remembered);
                self.next_remembered += 1;
                self.r.remember_lost(cid.clone());
                self.m.claims.insert(
                    cid,
                    Claim {
                        items: Vec::new(),
                        expires: 0,
                        status: Status::Lost,
                    },
                );
            }
        }
    }

    /// A new item with `failed` earlier attempts: both take it.
    fn publish(&mut self, failed: u32) {
        assert!(self.r.publish(self.next_key, failed, 0));
        assert!(self.m.publish(self.next_key, failed));
        self.next_key += 1;
    }

    /// An item already known, published again: refused, and nothing changes.
    fn republish(&mut self, i: &Ix) {
        let (r, m) = (&mut self.r, &mut self.m);
        let known: Vec<u32> = m
            .items
            .iter()
            .filter(|(_, it)| it.state != ItemState::Forgotten)
            .map(|(k, _)| *k)
            .collect();
        if known.is_empty() {
            return;
        }
        let k = known[i.of(known.len())];
        let before = snapshot(r, m);
        assert!(
            !r.publish(k, 0, 0),
            "a known item ({k}, {:?}) was published again",
            m.items[&k]
        );
        assert!(!m.publish(k, 0));
        assert_eq!(snapshot(r, m), before, "republishing {k} changed something");
    }

    /// A boundary: the same items (with their attempts) and the same lease end, or nothing on
    /// both sides.
    fn claim(&mut self, lease: u64) {
        let (r, m) = (&mut self.r, &mut self.m);
        let cid = format!("c{}", self.next_claim);
        self.next_claim += 1;
        let got = r.claim(m.now, cid.clone(), lease);
        let want = m.claim(&cid, lease);
        match (got, want) {
            (None, None) => {}
            (Some(g), Some((items, expires))) => {
                assert_eq!(g.claim_id, cid);
                assert_eq!(sorted(&g.items), items, "claim {cid} at {}: items with attempts", m.now);
                assert_eq!(g.lease_expires_at_ms, expires, "claim {cid}: lease end");
                self.seen.granted(&cid, &g.items);
            }
            (got, want) => panic!("claim {cid} at {}: router {got:?}, model {want:?}", m.now),
        }
    }

    /// An ack: the same items delivered, or the same refusal that changed nothing; acking an
    /// acked claim again changes nothing either.
    fn ack(&mut self, t: &Target) {
        let (r, m) = (&mut self.r, &mut self.m);
        let cid = resolve(m, t);
        let before = snapshot(r, m);
        let got = r.ack(&cid);
        let want = m.ack(&cid);
        match (&got, &want) {
            (Ok(a), Ok((items, n))) => {
                assert_eq!(sorted(&a.items), *items, "ack {cid}: items");
                assert_eq!(a.delivered, *n, "ack {cid}: delivered count");
                if items.is_empty() {
                    assert_eq!(snapshot(r, m), before, "acking acked {cid} again changed something");
                } else {
                    self.seen.acked(&cid, &a.items);
                }
            }
            (Err(e), Err(w)) => {
                assert_eq!(e, w, "ack {cid}: refusal");
                assert_eq!(snapshot(r, m), before, "refused ack of {cid} changed something");
            }
            _ => panic!("ack {cid}: router {got:?}, model {want:?}"),
        }
    }

    /// A live claim's ack, releases and expiry decided but never applied: nothing changes.
    fn decided_only(&mut self, i: &Ix) {
        let (r, m) = (&mut self.r, &self.m);
        let Some(cid) = pick(&m.ids_with(|s| *s == Status::Live), i) else {
            return;
        };
        let before = snapshot(r, m);
        r.hold(&cid);
        r.plan_ack(&cid).expect("a live claim can be acked");
        r.plan_release(m.now, &cid, ReleaseReason::Failed, 0)
            .expect("a live claim can be released");
        r.plan_release(m.now, &cid, ReleaseReason::Busy, 0)
            .expect("a live claim can be released");
        assert!(r.plan_expiry(m.now, &cid).is_some(), "a live claim can expire");
        r.unhold(&cid);
        assert_eq!(snapshot(r, m), before, "deciding about {cid} changed something");
    }

    /// A release: the same items requeued and dead, or the same refusal that changed nothing.
    fn release(&mut self, t: &Target, reason: ReleaseReason, after: u64) {
        let (r, m) = (&mut self.r, &mut self.m);
        let cid = resolve(m, t);
        let before = snapshot(r, m);
        let got = r.release(m.now, &cid, reason, after);
        let want = m.release(&cid, reason, after);
        match (&got, &want) {
            (Ok(b), Ok((requeued, dead))) => {
                assert_eq!(
                    (sorted(&b.requeued), sorted(&b.dead)),
                    (requeued.clone(), dead.clone()),
                    "release {cid} {reason:?} retry_after {after} at {}: (requeued, dead)",
                    m.now
                );
                self.seen.handed_back(&cid, &b.requeued, &b.dead);
            }
            (Err(e), Err(w)) => {
                assert_eq!(e, w, "release {cid}: refusal");
                assert_eq!(snapshot(r, m), before, "refused release of {cid} changed something");
            }
            _ => panic!("release {cid}: router {got:?}, model {want:?}"),
        }
    }

    /// The clock moves on by `dt` and the router ticks: the same claims end, each once, with the
    /// same items requeued and dead.
    fn tick(&mut self, dt: u64) {
        let now = self.m.now + dt;
        let got = self.r.tick(now);
        let want = self.m.tick(now);
        let mut ended = BTreeMap::new();
        for (cid, b) in &got {
            self.seen.handed_back(cid, &b.requeued, &b.dead);
            let again = ended.insert(cid.clone(), (sorted(&b.requeued), sorted(&b.dead)));
            assert!(again.is_none(), "tick ended {cid} twice");
        }
        assert_eq!(
            ended, want,
            "tick to {now}: claims whose lease ran out, (requeued, dead)"
        );
    }

    /// The clock moves on by `dt` without a tick, short of the earliest live lease end.
    fn advance(&mut self, dt: u64) {
        let m = &mut self.m;
        let earliest_lease = m
            .claims
            .values()
            .filter(|c| c.status == Status::Live)
            .map(|c| c.expires)
            .min();
        let limit = earliest_lease.map_or(u64::MAX, |t| t - 1);
        m.now = (m.now + dt).min(limit).max(m.now);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The router behaves as the model on every step: what each boundary gets, attempts,
    /// refusals, dead-lettering, backoff, counts, deadlines; and I2 holds throughout.
    #[test]
    fn router_matches_the_model(
        max in prop_oneof![2 => 1..=4u32, 1 => Just(8u32), 1 => 5..=12u32],
        ops in prop::collection::vec(op(), 1..60),
    ) {
        run(max, &ops);
    }
}

/// A few fixed sequences the generator may take a while to reach.
#[test]
fn backoff_and_dead_letter_edges() {
    use ReleaseReason::*;
    let live = || Target::Live(Ix(0));
    // Failed release with retry_after below and above the backoff; then lease expiry.
    run(
        8,
        &[
            Op::Publish { history: 0 },
            Op::Claim { lease: 10 },
            Op::Release(live(), Failed, 0),
            Op::Tick(99),
            Op::Claim { lease: 10 },
            Op::Tick(1),
            Op::Claim { lease: 10 },
            Op::Release(live(), Failed, 5_000),
            Op::Tick(4_999),
            Op::Claim { lease: 10 },
            Op::Advance(1),
            Op::Claim { lease: 10 },
            Op::Tick(10),
            Op::Claim { lease: 10 },
            Op::Release(live(), Busy, 0),
            Op::Claim { lease: 10 },
            Op::Ack(live()),
            Op::Ack(Target::Acked(Ix(0))),
            Op::Release(Target::Acked(Ix(0)), Busy, 0),
            Op::Ack(Target::Lost(Ix(0))),
            Op::Claim { lease: 10 },
        ],
    );
    // Dead-lettered exactly at the limit, by lease expiry and by failed release.
    run(
        2,
        &[
            Op::Complete(2),
            Op::Claim { lease: 10 },
            Op::Tick(10),
            Op::Claim { lease: 10 },
            Op::Release(live(), Failed, 0),
            Op::Tick(1_000_000),
            Op::Claim { lease: 10 },
            Op::Forget(Ix(0)),
            Op::Republish(Ix(1)),
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// WakeState (I7)
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum WakeOp {
    Turn(Turn),
    Boundary,
    Decide { capable: bool, ready: usize },
}

fn wake_op() -> impl Strategy<Value = WakeOp> {
    prop_oneof![
        2 => prop_oneof![Just(Turn::Idle), Just(Turn::Busy)].prop_map(WakeOp::Turn),
        1 => Just(WakeOp::Boundary),
        5 => (prop::bool::weighted(0.8), prop_oneof![1 => Just(0usize), 3 => 1..100usize])
            .prop_map(|(capable, ready)| WakeOp::Decide { capable, ready }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// A session is woken exactly when it is idle, capable, has ready items and was not woken
    /// since its last boundary or busy → idle change: at most one wake per such period, none
    /// while busy or not capable.
    #[test]
    fn wakes_follow_the_discipline(ops in prop::collection::vec(wake_op(), 1..80)) {
        let mut w = WakeState::default();
        let mut turn = Turn::Idle;
        let mut wakes_this_period = 0u32;
        for op in &ops {
            match op {
                WakeOp::Turn(t) => {
                    if turn == Turn::Busy && *t == Turn::Idle {
                        wakes_this_period = 0;
                    }
                    turn = *t;
                    w.set_turn(*t);
                }
                WakeOp::Boundary => {
                    wakes_this_period = 0;
                    w.boundary();
                }
                WakeOp::Decide { capable, ready } => {
                    let woke = w.decide(*capable, *ready);
                    let should = *capable && turn == Turn::Idle && *ready > 0 && wakes_this_period == 0;
                    prop_assert_eq!(woke, should, "decide(capable {}, ready {}) while {:?}", capable, ready, turn);
                    if woke {
                        wakes_this_period += 1;
                    }
                    prop_assert!(wakes_this_period <= 1);
                }
            }
            prop_assert_eq!(w.turn(), turn);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Capacity (I8)
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum CapOp {
    Enqueue,
    Admit,
    /// A running child ends.
    FinishRunning(Ix),
    /// A queued child is withdrawn.
    Withdraw(Ix),
    SetMax(usize),
}

fn cap_op() -> impl Strategy<Value = CapOp> {
    prop_oneof![
        5 => Just(CapOp::Enqueue),
        4 => Just(CapOp::Admit),
        3 => any::<u16>().prop_map(Ix).prop_map(CapOp::FinishRunning),
        1 => any::<u16>().prop_map(Ix).prop_map(CapOp::Withdraw),
        1 => (0..6usize).prop_map(CapOp::SetMax),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Admission is FIFO and fills exactly the free slots; an admit never takes the running
    /// count over the limit (a lowered limit does not preempt, it only stops admissions).
    #[test]
    fn capacity_admits_fifo_up_to_the_limit(
        max in 1..6usize,
        ops in prop::collection::vec(cap_op(), 1..80),
    ) {
        let mut c: Capacity<u32> = Capacity::new(max);
        let mut limit = max;
        let mut running: BTreeSet<u32> = BTreeSet::new();
        let mut queue: VecDeque<u32> = VecDeque::new();
        let mut admitted_order: Vec<u32> = Vec::new();
        let mut next = 0u32;
        for op in &ops {
            match op {
                CapOp::Enqueue => {
                    c.enqueue(next);
                    queue.push_back(next);
                    next += 1;
                }
                CapOp::Admit => {
                    let before = running.len();
                    let got = c.admit();
                    let free = limit.saturating_sub(before);
                    let want: Vec<u32> = queue.drain(..free.min(queue.len())).collect();
                    prop_assert_eq!(&got, &want, "admit with {} running of {}", before, limit);
                    running.extend(want.iter().copied());
                    if !got.is_empty() {
                        prop_assert!(running.len() <= limit, "admit went over the limit");
                    }
                    admitted_order.extend(got);
                }
                CapOp::FinishRunning(i) => {
                    if !running.is_empty() {
                        let k = *running.iter().nth(i.of(running.len())).unwrap();
                        running.remove(&k);
                        c.finish(&k);
                    }
                }
                CapOp::Withdraw(i) => {
                    if !queue.is_empty() {
                        let k = queue.remove(i.of(queue.len())).unwrap();
                        c.finish(&k);
                    }
                }
                CapOp::SetMax(m) => {
                    limit = (*m).max(1);
                    c.set_max(*m);
                }
            }
            prop_assert_eq!(c.running(), running.len());
            prop_assert_eq!(c.queued(), queue.len());
        }
        // FIFO across the whole run: children start in the order they were queued.
        let mut in_order = admitted_order.clone();
        in_order.sort();
        prop_assert_eq!(admitted_order, in_order);
    }
}
