//! The children live over every session of an engine (queued or running, not yet ended), and
//! the bound a delegate is checked against (`max_live_children`).
//!
//! Each session's [`Capacity`](super::Capacity) adds to the count what it holds and takes it
//! away as children end, are withdrawn, or its owner goes (a rebuilt owner counts what it
//! recovered afresh). A delegate reserves its tasks before it is decided: the check and the
//! reservation are one atomic step, so two delegates on different routing threads cannot both
//! pass a bound only one of them fits under. The reservation is given back once the call's
//! children are counted by their session, or when the call is refused or its write fails.
//! Children recovered at a start are counted, never refused: the bound refuses new calls only.

// One atomic, changed by read-modify-write operations only: each sees the latest value
// whatever their ordering, which is all the check needs (it orders nothing else).
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The live children of an engine and their bound (none: unbounded, counted all the same).
#[derive(Debug, Clone, Default)]
pub struct LiveCount {
    count: Arc<AtomicUsize>,
    max: Option<usize>,
}

/// A delegate's tasks, counted as live until this is dropped.
#[derive(Debug)]
#[must_use = "the reservation is given back when it is dropped"]
pub struct Reservation {
    count: Arc<AtomicUsize>,
    n: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.count.fetch_sub(self.n, Ordering::Relaxed);
    }
}

impl LiveCount {
    /// A count bounded by `max` (none: unbounded).
    pub fn new(max: Option<usize>) -> Self {
        LiveCount {
            count: Arc::default(),
            max,
        }
    }

    /// Children live now, reservations included.
    pub fn live(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// The bound.
    pub fn max(&self) -> Option<usize> {
        self.max
    }

    /// Counts `n` more children as live, unless that passes the bound: then the count as it
    /// was is handed back and nothing is counted.
    pub fn reserve(&self, n: usize) -> Result<Reservation, usize> {
        let fits = |live: usize| match self.max {
            Some(max) if live.saturating_add(n) > max => None,
            _ => Some(live.saturating_add(n)),
        };
        self.count
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, fits)
            .map(|_| Reservation {
                count: self.count.clone(),
                n,
            })
    }

    /// A session's count went from `before` to `after`.
    pub(super) fn moved(&self, before: usize, after: usize) {
        if after > before {
            self.count.fetch_add(after - before, Ordering::Relaxed);
        } else if before > after {
            self.count.fetch_sub(before - after, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_fits_under_the_bound_or_counts_nothing() {
        let live = LiveCount::new(Some(10));
        let eight = live.reserve(8).unwrap();
        assert_eq!(live.reserve(5).unwrap_err(), 8, "8 + 5 is over 10");
        assert_eq!(live.live(), 8, "a refused reservation counts nothing");
        let two = live.reserve(2).unwrap();
        assert_eq!(live.live(), 10, "exactly the bound fits");
        drop(eight);
        assert_eq!(live.live(), 2, "a dropped reservation is given back");
        drop(two);
        assert!(LiveCount::new(None).reserve(usize::MAX).is_ok(), "unbounded");
    }

    #[test]
    fn a_capacity_counts_what_it_holds_until_it_is_dropped() {
        let live = LiveCount::new(Some(10));
        let mut a = super::super::Capacity::counted(2, live.clone());
        let mut b = super::super::Capacity::counted(2, live.clone());
        for k in 0..4 {
            a.enqueue(k);
        }
        b.start_now(9);
        assert_eq!(live.live(), 5, "queued and running, over both");
        assert_eq!(a.admit(), [0, 1]);
        a.requeue_front(1);
        assert_eq!(live.live(), 5, "admitting and requeueing move nothing");
        a.finish(&0);
        a.withdraw(&[2].into_iter().collect());
        assert_eq!(live.live(), 3, "an end and a withdrawal leave the count");
        drop(a);
        assert_eq!(live.live(), 1, "a dropped capacity leaves what it held");
        drop(b);
        assert_eq!(live.live(), 0);
    }

    #[test]
    fn concurrent_reservations_never_pass_the_bound_together() {
        let live = LiveCount::new(Some(100));
        let held: Vec<Reservation> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..8)
                .map(|_| s.spawn(|| (0..100).filter_map(|_| live.reserve(3).ok()).collect::<Vec<_>>()))
                .collect();
            threads.into_iter().flat_map(|t| t.join().unwrap()).collect()
        });
        assert_eq!(held.len(), 33, "33 × 3 fit under 100, a 34th does not");
        assert_eq!(live.live(), 99);
    }
}
