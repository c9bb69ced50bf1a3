//! Capacity (I8) and what a child's end publishes for its unit.

use std::collections::VecDeque;
use std::hash::Hash;

use foldhash::HashSet;

use super::live::LiveCount;

/// Capacity (I8): at most `max` running children; the rest wait in arrival order. A queued
/// child's stall clock does not run because it has not started. What it holds, running and
/// queued, is added to the engine's [`LiveCount`] (and taken away again when it is dropped).
#[derive(Debug)]
pub struct Capacity<K: Clone + Eq + Hash> {
    max: usize,
    running: HashSet<K>,
    queue: VecDeque<K>,
    live: LiveCount,
}

impl<K: Clone + Eq + Hash> Capacity<K> {
    /// Room for `max` (at least 1) running children, counted on its own.
    pub fn new(max: usize) -> Self {
        Capacity::counted(max, LiveCount::default())
    }

    /// Room for `max` (at least 1) running children, counted in `live` with those of other
    /// sessions.
    pub fn counted(max: usize, live: LiveCount) -> Self {
        Capacity {
            max: max.max(1),
            running: HashSet::default(),
            queue: VecDeque::new(),
            live,
        }
    }

    /// Children held, running and queued.
    fn held(&self) -> usize {
        self.running.len() + self.queue.len()
    }

    /// Runs a change, keeping the live count in step with it.
    fn counting<R>(&mut self, change: impl FnOnce(&mut Self) -> R) -> R {
        let before = self.held();
        let out = change(self);
        self.live.moved(before, self.held());
        out
    }

    /// Queues a child.
    pub fn enqueue(&mut self, key: K) {
        self.counting(|c| c.queue.push_back(key));
    }

    /// The queued children that may start now, in order; they count as running.
    pub fn admit(&mut self) -> Vec<K> {
        let mut out = Vec::new();
        while self.running.len() < self.max {
            let Some(k) = self.queue.pop_front() else { break };
            self.running.insert(k.clone());
            out.push(k);
        }
        out
    }

    /// As [`Capacity::admit`], at most `n` of them.
    pub fn admit_up_to(&mut self, n: usize) -> Vec<K> {
        let mut out = Vec::new();
        while self.running.len() < self.max && out.len() < n {
            let Some(k) = self.queue.pop_front() else { break };
            self.running.insert(k.clone());
            out.push(k);
        }
        out
    }

    /// How many queued children could start now (free slots with children queued for them).
    pub fn startable(&self) -> usize {
        self.room().min(self.queue.len())
    }

    /// A running child ended (or a queued one was withdrawn); frees its slot.
    pub fn finish(&mut self, key: &K) {
        self.counting(|c| {
            if !c.running.remove(key) {
                c.queue.retain(|k| k != key);
            }
        });
    }

    /// Withdraws children, running or queued (cancelled), in one pass over the queue.
    pub fn withdraw(&mut self, keys: &HashSet<K>) {
        self.counting(|c| {
            for k in keys {
                c.running.remove(k);
            }
            if !keys.is_empty() {
                c.queue.retain(|k| !keys.contains(k));
            }
        });
    }

    /// Free slots: how many more children may run now.
    pub fn room(&self) -> usize {
        self.max.saturating_sub(self.running.len())
    }

    /// Counts a child as running that never was queued (one its dispatch started at once, in
    /// a slot [`Capacity::room`] showed free).
    pub fn start_now(&mut self, key: K) {
        self.counting(|c| c.running.insert(key));
    }

    /// Counts a child as running without queueing it (one adopted after an owner restart).
    pub fn mark_running(&mut self, key: K) {
        self.counting(|c| {
            c.queue.retain(|k| k != &key);
            c.running.insert(key);
        });
    }

    /// Puts a child that was admitted but never started back at the head of the queue.
    pub fn requeue_front(&mut self, key: K) {
        self.counting(|c| {
            c.running.remove(&key);
            c.queue.retain(|k| k != &key);
            c.queue.push_front(key);
        });
    }

    /// The children counted as running, in no order.
    pub fn running_keys(&self) -> impl Iterator<Item = &K> {
        self.running.iter()
    }

    /// The queued children, in the order they start.
    pub fn queued_keys(&self) -> impl Iterator<Item = &K> {
        self.queue.iter()
    }

    /// Running children.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Queued children.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Changes the limit (a session update); takes effect at the next admit.
    pub fn set_max(&mut self, max: usize) {
        self.max = max.max(1);
    }
}

impl<K: Clone + Eq + Hash> Drop for Capacity<K> {
    /// What a session held is no longer its engine's: its owner is gone (a rebuilt one counts
    /// what it recovers afresh).
    fn drop(&mut self) {
        self.live.moved(self.held(), 0);
    }
}

/// What a child's end publishes for its unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publish {
    /// The unit is complete: every member's result is ready.
    UnitComplete,
    /// The child failed and its unit is not complete: an early failure notice is ready.
    FailureNotice,
    /// Nothing yet.
    Nothing,
}

/// Decides what a child's end publishes: `terminal` members of `size` are now terminal,
/// counting this one.
pub fn on_child_end(terminal: usize, size: usize, failed: bool) -> Publish {
    if terminal >= size {
        Publish::UnitComplete
    } else if failed {
        Publish::FailureNotice
    } else {
        Publish::Nothing
    }
}
