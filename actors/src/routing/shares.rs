//! Fair shares of a server-wide bound on running children (`max_running_children`), on top of
//! each session's own capacity (I8).
//!
//! Each session's owner tells [`Shares`] how many children it runs and how many more it could
//! start (its free slots with queued children behind them) whenever it admits, and starts only
//! as many as it is allowed. While the bound has room, a session takes what it wants. Once it
//! binds, sessions that want more wait in a ring; every slot that frees goes to the next one in
//! the ring, one at a time, reserved for it until it takes it. So a session with 10,000 queued
//! children gets one slot in turn with a session that has one, never all of them.
//!
//! Plain code under one lock, shared by the owners on every routing thread; the owner pokes the
//! sessions a slot was reserved for, so they admit.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// A server-wide bound on running children, shared round-robin by the sessions that want more.
#[derive(Debug)]
pub struct Shares {
    limit: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    sessions: HashMap<String, Share>,
    /// Sessions that want more than they were given, in the order they get the next slots.
    ring: VecDeque<String>,
    /// Slots running or reserved, over every session.
    used: usize,
}

#[derive(Debug, Default, Clone, Copy)]
struct Share {
    running: usize,
    reserved: usize,
    wants: usize,
}

impl Shares {
    /// A bound of `limit` (at least 1) running children.
    pub fn new(limit: usize) -> Self {
        Shares {
            limit: limit.max(1),
            state: Mutex::default(),
        }
    }

    /// The bound.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// `session` runs `running` children and could start `wants` more now: how many it may
    /// start (it starts exactly those), and the sessions a freed slot was reserved for, to be
    /// told to admit.
    pub fn update(&self, session: &str, running: usize, wants: usize) -> (usize, Vec<String>) {
        let Ok(mut st) = self.state.lock() else {
            return (0, Vec::new());
        };
        let st = &mut *st;
        let mut share = st.sessions.get(session).copied().unwrap_or_default();
        st.used = st.used.saturating_sub(share.running + share.reserved);
        // Its reservation first; what it no longer wants of it goes back to the pool.
        let mut allowed = share.reserved.min(wants);
        share.reserved = 0;
        let others_wait = st.ring.iter().any(|s| s != session);
        let free = self.limit.saturating_sub(st.used + running + allowed);
        if !others_wait {
            allowed += free.min(wants - allowed);
        }
        share.running = running + allowed;
        share.wants = wants - allowed;
        st.used += share.running;
        st.ring.retain(|s| s != session);
        if share.wants > 0 {
            st.ring.push_back(session.to_string());
        }
        if share.running == 0 && share.wants == 0 {
            st.sessions.remove(session);
        } else {
            st.sessions.insert(session.to_string(), share);
        }
        (allowed, self.hand_out(st))
    }

    /// A session is gone (given up): what it held goes back to the pool.
    pub fn forget(&self, session: &str) -> Vec<String> {
        let Ok(mut st) = self.state.lock() else {
            return Vec::new();
        };
        let st = &mut *st;
        if let Some(share) = st.sessions.remove(session) {
            st.used = st.used.saturating_sub(share.running + share.reserved);
        }
        st.ring.retain(|s| s != session);
        self.hand_out(st)
    }

    /// Slots running or reserved, over every session.
    pub fn used(&self) -> usize {
        self.state.lock().map_or(0, |st| st.used)
    }

    /// Reserves free slots for the sessions in the ring, one each in turn; the sessions given
    /// one.
    fn hand_out(&self, st: &mut State) -> Vec<String> {
        let mut poked = Vec::new();
        while st.used < self.limit {
            let Some(next) = st.ring.pop_front() else { break };
            let Some(share) = st.sessions.get_mut(&next) else {
                continue;
            };
            share.reserved += 1;
            share.wants = share.wants.saturating_sub(1);
            st.used += 1;
            if share.wants > 0 {
                st.ring.push_back(next.clone());
            }
            if !poked.contains(&next) {
                poked.push(next);
            }
        }
        poked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_the_bound_a_session_takes_what_it_wants() {
        let s = Shares::new(10);
        assert_eq!(s.update("a", 0, 4), (4, vec![]));
        assert_eq!(s.update("b", 0, 6), (6, vec![]));
        assert_eq!(s.used(), 10);
        assert_eq!(s.update("c", 0, 1), (0, vec![]), "the bound binds");
    }

    #[test]
    fn a_freed_slot_goes_round_robin_to_the_sessions_that_wait() {
        let s = Shares::new(2);
        assert_eq!(s.update("big", 0, 8).0, 2);
        assert_eq!(s.update("small", 0, 1).0, 0);
        // One of big's children ended: big may not take the slot, small waits before it.
        let (allowed, poked) = s.update("big", 1, 7);
        assert_eq!((allowed, poked), (0, vec!["small".to_string()]));
        assert_eq!(s.update("small", 0, 1).0, 1, "its reservation");
        // The next freed slot goes to big, as nobody else waits.
        let (allowed, poked) = s.update("big", 0, 7);
        assert_eq!((allowed, poked.len()), (1, 0));
        assert_eq!(s.used(), 2);
    }

    #[test]
    fn the_bound_holds_and_every_waiting_session_gets_its_turn() {
        let s = Shares::new(3);
        let mut running: HashMap<&str, usize> = HashMap::new();
        let mut queued: HashMap<&str, usize> = [("a", 1000), ("b", 5), ("c", 1)].into_iter().collect();
        let mut starts: Vec<&str> = Vec::new();
        let order = ["a", "b", "c"];
        for &id in &order {
            let (n, _) = s.update(id, 0, queued[id].min(8));
            *running.entry(id).or_default() += n;
            *queued.get_mut(id).unwrap() -= n;
            starts.extend(std::iter::repeat_n(id, n));
        }
        // End a running child each round (of "a" while it runs any); everyone poked admits.
        for _ in 0..6 {
            let id = *order
                .iter()
                .find(|o| running.get(*o).copied().unwrap_or(0) > 0)
                .unwrap();
            *running.get_mut(id).unwrap() -= 1;
            let mut pokes = vec![id];
            while let Some(p) = pokes.pop() {
                let r = running.get(p).copied().unwrap_or(0);
                let (n, more) = s.update(p, r, queued[p].min(8usize.saturating_sub(r)));
                *running.entry(p).or_default() += n;
                *queued.get_mut(p).unwrap() -= n;
                starts.extend(std::iter::repeat_n(p, n));
                for m in more {
                    pokes.push(order.iter().copied().find(|o| *o == m).unwrap());
                }
            }
            assert!(running.values().sum::<usize>() <= 3, "{running:?}");
        }
        let c_at = starts.iter().position(|s| *s == "c").expect("c ran");
        let b_at = starts.iter().position(|s| *s == "b").expect("b ran");
        assert!(b_at <= 4 && c_at <= 4, "b and c got turns early: {starts:?}");
    }

    #[test]
    fn a_forgotten_session_gives_its_slots_to_the_next() {
        let s = Shares::new(1);
        assert_eq!(s.update("a", 0, 1).0, 1);
        assert_eq!(s.update("b", 0, 1).0, 0);
        assert_eq!(s.forget("a"), vec!["b".to_string()]);
        assert_eq!(s.update("b", 0, 1).0, 1);
    }
}
