//! The engine's running totals: counts that only grow, of what session owners applied —
//! children ended (by status), items delivered (by kind), wakes, redriven items and retries —
//! and the hook that is told each item's delivery timing ([`DeliveryStage`]).
//!
//! Each count is bumped where the owner applies a decision, once what it needs is durable: a
//! request whose flush failed changed nothing, and counts nothing. The totals are kept since
//! the engine started and held in memory only: a restart starts them from 0 (what an earlier
//! process counted is not read back), and a rebuilt owner reading rows that were counted
//! already counts none of them again. This module owns the counters and their snapshot
//! ([`Totals`]), not what they are exported as (the server's `/metrics` does that).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::model::{ChildStatus, ItemKind};

/// A stage of an item's way out, whose length [`DeliveryTimingObserver`] is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeliveryStage {
    /// From a child's end (its `finished_at_ms`) to its item being claimable: a result waits
    /// for its unit's last child, a failure notice for nothing. Told as the item becomes
    /// claimable because a child ended in this process; an item an owner rebuilt from the
    /// ledger publishes again (after a restart, or an owner restart) is not told again.
    EndToReady,
    /// From an item being first made claimable in this process (published, or redriven) to
    /// the ack that delivered it: failed delivery attempts and backoffs between them included.
    /// An item recovered at a restart is timed from when the new process made it claimable.
    /// Sync calls' results, delivered inline without a claim, are not timed.
    ReadyToAck,
}

impl DeliveryStage {
    /// The snake_case name of the stage.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryStage::EndToReady => "end_to_ready",
            DeliveryStage::ReadyToAck => "ready_to_ack",
        }
    }
}

/// Told each item's [`DeliveryStage`]s as they end (whole milliseconds of the wall clock). It
/// runs on a session owner's thread, in the path of every ack: keep it quick.
pub type DeliveryTimingObserver = Arc<dyn Fn(DeliveryStage, Duration) + Send + Sync>;

/// The statuses a child can end in, in [`ChildStatus::ALL`]'s order.
const ENDED: [ChildStatus; 6] = [
    ChildStatus::Succeeded,
    ChildStatus::Failed,
    ChildStatus::TimedOut,
    ChildStatus::Interrupted,
    ChildStatus::Cancelled,
    ChildStatus::Unknown,
];

fn ended_index(status: ChildStatus) -> Option<usize> {
    ENDED.iter().position(|s| *s == status)
}

fn kind_index(kind: ItemKind) -> usize {
    match kind {
        ItemKind::Result => 0,
        ItemKind::FailureNotice => 1,
    }
}

/// A snapshot of the engine's running totals (see the module's documentation: since the engine
/// started, never going down).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    ended: [u64; 6],
    delivered: [u64; 2],
    /// Wakes fired: a session idle with ready items woken once (whatever its wake target — a
    /// webhook, the event stream, an embedded callback).
    pub wakes: u64,
    /// Dead letters put back in their session's ready set.
    pub redriven: u64,
    /// Children run again by their task's retry policy (each attempt queued again once it is
    /// durable is one).
    pub retries: u64,
}

impl Totals {
    /// Children that ended in `status` (0 for `queued` and `running`). A child run again by
    /// its retry policy ended once, as its last attempt ended; `unknown` counts the children
    /// this process's recovery resolved so.
    pub fn ended(&self, status: ChildStatus) -> u64 {
        ended_index(status).map_or(0, |i| self.ended[i])
    }

    /// Items of `kind` delivered: acked, or (results of sync calls) received inline by the
    /// caller.
    pub fn delivered(&self, kind: ItemKind) -> u64 {
        self.delivered[kind_index(kind)]
    }
}

/// The engine's counters, shared by its owners (one instance per engine).
#[derive(Default)]
pub struct Counters {
    ended: [AtomicU64; 6],
    delivered: [AtomicU64; 2],
    wakes: AtomicU64,
    redriven: AtomicU64,
    retries: AtomicU64,
    timing: Option<DeliveryTimingObserver>,
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counters")
            .field("totals", &self.totals())
            .field("timed", &self.timing.is_some())
            .finish()
    }
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    /// Counters from zero, telling `timing` (if any) each item's delivery stages.
    pub fn new(timing: Option<DeliveryTimingObserver>) -> Self {
        Counters {
            timing,
            ..Counters::default()
        }
    }

    /// What they hold now.
    pub fn totals(&self) -> Totals {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Totals {
            ended: self.ended.each_ref().map(load),
            delivered: self.delivered.each_ref().map(load),
            wakes: load(&self.wakes),
            redriven: load(&self.redriven),
            retries: load(&self.retries),
        }
    }

    /// `n` children ended in `status` (a status that is not an end counts nothing).
    pub(crate) fn ended(&self, status: ChildStatus, n: u64) {
        if let Some(i) = ended_index(status) {
            add(&self.ended[i], n);
        }
    }

    /// An item of `kind` was delivered.
    pub(crate) fn delivered(&self, kind: ItemKind) {
        add(&self.delivered[kind_index(kind)], 1);
    }

    /// A session was woken.
    pub(crate) fn woke(&self) {
        add(&self.wakes, 1);
    }

    /// `n` dead letters were redriven.
    pub(crate) fn redriven(&self, n: u64) {
        add(&self.redriven, n);
    }

    /// A child's next attempt was queued by its retry policy.
    pub(crate) fn retried(&self) {
        add(&self.retries, 1);
    }

    /// Whether anyone is told the delivery timings (so the owner skips looking them up).
    pub(crate) fn timed(&self) -> bool {
        self.timing.is_some()
    }

    /// An item's `stage` ran from `from_ms` to `to_ms` (a clock that went back: zero).
    pub(crate) fn time(&self, stage: DeliveryStage, from_ms: u64, to_ms: u64) {
        if let Some(observe) = &self.timing {
            observe(stage, Duration::from_millis(to_ms.saturating_sub(from_ms)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_end_counts_under_its_own_status_and_nothing_else_counts() {
        let c = Counters::new(None);
        for (n, status) in ChildStatus::ALL.into_iter().enumerate() {
            c.ended(status, n as u64 + 1);
        }
        let t = c.totals();
        assert_eq!(t.ended(ChildStatus::Queued), 0);
        assert_eq!(t.ended(ChildStatus::Running), 0);
        for (n, status) in ChildStatus::ALL.into_iter().enumerate().skip(2) {
            assert_eq!(t.ended(status), n as u64 + 1, "{status}");
        }
    }

    #[test]
    fn deliveries_count_by_kind() {
        let c = Counters::new(None);
        c.delivered(ItemKind::Result);
        c.delivered(ItemKind::Result);
        c.delivered(ItemKind::FailureNotice);
        let t = c.totals();
        assert_eq!(
            (t.delivered(ItemKind::Result), t.delivered(ItemKind::FailureNotice)),
            (2, 1)
        );
    }

    #[test]
    fn a_stage_is_told_its_length_and_a_clock_gone_back_is_zero() {
        let told = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = told.clone();
        let c = Counters::new(Some(Arc::new(move |stage, d| {
            log.lock().unwrap().push((stage, d));
        })));
        c.time(DeliveryStage::EndToReady, 10, 25);
        c.time(DeliveryStage::ReadyToAck, 30, 20);
        assert_eq!(
            *told.lock().unwrap(),
            vec![
                (DeliveryStage::EndToReady, Duration::from_millis(15)),
                (DeliveryStage::ReadyToAck, Duration::ZERO)
            ]
        );
    }
}
