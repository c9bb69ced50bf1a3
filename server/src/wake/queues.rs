//! The wakes the delivery [`pool`](super::pool) holds, and the order it tries them in. Pure
//! state: nothing here opens a connection, starts a thread or reads the clock (callers pass
//! `now`); the pool holds one [`Queues`] behind its lock.
//!
//! A wake is *in flight* from the moment it has a slot until it is delivered, refused or given
//! up: queued for a try, being tried, or waiting for a retry. At most [`MAX_IN_FLIGHT`] wakes are
//! in flight, and at most [`MAX_PER_HOST`] of them to one host and port, so a receiver that never
//! answers keeps only its own slots. A wake that finds no slot is *parked*: at most one parked
//! entry per session (a later wake of it only brings the newest URL and body), up to
//! [`MAX_PARKED`] sessions, beyond which a wake is dropped (the items stay ready). Whenever a
//! slot frees, the oldest parked wake that may take it (its host under its bound) goes into
//! flight.
//!
//! A session has at most one wake here, in flight or parked. A later wake of a session in flight
//! joins it: waiting for a retry, it becomes that later wake's first try, due now; being tried,
//! it is tried again once that try is done, as the later wake's first try whatever the try gave.
//! So every wake is followed by a POST begun after it, and a session is never POSTed more often
//! than it is woken (DESIGN.md, I7).

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::target::WakeUrl;

/// Wakes in flight at most.
pub(crate) const MAX_IN_FLIGHT: usize = 64;
/// Wakes in flight to one host and port at most.
pub(crate) const MAX_PER_HOST: usize = 8;
/// Sessions whose wake is parked, at most; a wake of another session beyond them is dropped.
pub(crate) const MAX_PARKED: usize = 10_000;
/// Tries of one wake before it is given up.
pub(crate) const ATTEMPTS: u32 = 8;
/// The first retry's delay; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// The wakes in flight and parked, by session, and the order they are tried in.
#[derive(Debug, Default)]
pub(super) struct Queues {
    wakes: HashMap<String, InFlight>,
    /// Wakes in flight by the host (`host:port`) they were given a slot for.
    per_host: HashMap<String, usize>,
    /// Sessions whose wake waits for its first try.
    fresh: VecDeque<String>,
    /// Sessions whose wake's retry is due (tried after every fresh one).
    due: VecDeque<String>,
    /// Retries not yet due, earliest first, with the `seq` of the wait they end; an entry whose
    /// wake no longer waits with that `seq` is stale and ignored.
    later: BinaryHeap<Reverse<(Instant, u64, String)>>,
    parked: HashMap<String, Parked>,
    /// Parked sessions by host, oldest first, with the `seq` they were parked at.
    parked_by_host: HashMap<String, VecDeque<(u64, String)>>,
    /// The hosts with a parked wake and a free slot of their own, by their oldest parked `seq`:
    /// where the next free slot goes.
    open: BTreeSet<(u64, String)>,
    seq: u64,
}

/// One session's wake in flight.
#[derive(Debug)]
struct InFlight {
    url: String,
    body: String,
    /// The host its slot is counted against (the URL's when it got the slot).
    host: String,
    /// Tries made so far.
    tries: u32,
    phase: Phase,
    /// Another wake came while a try was being made: try again after it, whatever it does.
    again: bool,
    /// Set at each wait for a retry; the `later` entry holding it is the live one.
    seq: u64,
}

/// One session's wake waiting for a slot.
#[derive(Debug)]
struct Parked {
    url: String,
    body: String,
    host: String,
    seq: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Queued,
    Trying,
    Waiting,
}

/// What became of a submitted wake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Submitted {
    /// It waits for a thread to try it (new in flight, or a waiting retry made due now).
    Queued,
    /// It joined its session's wake, in flight or parked, which now carries its body.
    Joined,
    /// Parked until a slot frees.
    Parked,
    /// Dropped: [`MAX_PARKED`] sessions are parked already.
    Dropped,
}

/// What the pool does with a try's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Settled {
    /// The wake is done (delivered or refused) and left flight.
    Done,
    /// It failed and waits for its retry.
    Retry,
    /// It failed its last try and left flight.
    GivenUp,
    /// A later wake came during the try: it is queued as that wake's first try.
    Again,
}

/// A try to make: the `tries`th of `session`'s wake, a POST of `body` to `url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Job {
    pub(super) session: String,
    pub(super) url: String,
    pub(super) body: String,
    pub(super) tries: u32,
}

/// The host a wake to `url` is counted against: `host:port` (a URL that does not parse, which
/// fails at its first try, counts against the empty host).
fn host_of(url: &str) -> String {
    WakeUrl::parse(url).map_or_else(|_| String::new(), |u| format!("{}:{}", u.host, u.port))
}

/// The delay before the retry that follows failed try `tries`.
pub(super) fn backoff(tries: u32) -> Duration {
    FIRST_BACKOFF
        .saturating_mul(1 << tries.saturating_sub(1).min(16))
        .min(MAX_BACKOFF)
}

impl Queues {
    /// Puts a wake of `session` (POST `body` to `url`) in flight, joins the one it has, or
    /// parks it.
    pub(super) fn submit(&mut self, session: &str, url: &str, body: String) -> Submitted {
        if let Some(wake) = self.wakes.get_mut(session) {
            wake.url = url.to_string();
            wake.body = body;
            // The joined wake is this one now: its tries so far were another's.
            let submitted = match wake.phase {
                Phase::Trying => {
                    wake.again = true;
                    Submitted::Joined
                }
                Phase::Queued => {
                    wake.tries = 0;
                    Submitted::Joined
                }
                Phase::Waiting => {
                    wake.tries = 0;
                    wake.phase = Phase::Queued;
                    // Its `later` entry is stale from here on.
                    self.seq += 1;
                    wake.seq = self.seq;
                    self.fresh.push_back(session.to_string());
                    Submitted::Queued
                }
            };
            self.check();
            return submitted;
        }
        let host = host_of(url);
        if let Some(parked) = self.parked.get_mut(session) {
            if parked.host == host {
                parked.url = url.to_string();
                parked.body = body;
                return Submitted::Joined;
            }
            // Bound to another host meanwhile: it parks anew, behind that host's.
            self.unpark(session);
        }
        let submitted = if self.has_room(&host) {
            self.admit(session, url.to_string(), body, host);
            Submitted::Queued
        } else if self.parked.len() < MAX_PARKED {
            self.park(session, url.to_string(), body, host);
            Submitted::Parked
        } else {
            Submitted::Dropped
        };
        self.check();
        submitted
    }

    /// Makes every retry due by `now` due, and takes the next wake to try; marks it being tried.
    pub(super) fn take(&mut self, now: Instant) -> Option<Job> {
        while self.later.peek().is_some_and(|Reverse((at, _, _))| *at <= now) {
            let Some(Reverse((_, seq, session))) = self.later.pop() else {
                break;
            };
            match self.wakes.get_mut(&session) {
                Some(w) if w.phase == Phase::Waiting && w.seq == seq => {
                    w.phase = Phase::Queued;
                    self.due.push_back(session);
                }
                _ => {}
            }
        }
        while let Some(session) = self.fresh.pop_front().or_else(|| self.due.pop_front()) {
            match self.wakes.get_mut(&session) {
                Some(w) if w.phase == Phase::Queued => {
                    w.phase = Phase::Trying;
                    w.tries += 1;
                    let job = Job {
                        url: w.url.clone(),
                        body: w.body.clone(),
                        tries: w.tries,
                        session,
                    };
                    self.check();
                    return Some(job);
                }
                _ => debug_assert!(false, "a queued session has no queued wake"),
            }
        }
        None
    }

    /// When the earliest retry not yet due is due (it may be a stale entry's: an early look).
    pub(super) fn next_retry(&self) -> Option<Instant> {
        self.later.peek().map(|Reverse((at, _, _))| *at)
    }

    /// Records the end of the try of `session`'s wake being made; `failed` when it failed (not
    /// when it was delivered or refused).
    pub(super) fn settle(&mut self, session: &str, failed: bool, now: Instant) -> Settled {
        let Some(wake) = self.wakes.get_mut(session) else {
            debug_assert!(false, "a try of a wake not in flight");
            return Settled::Done;
        };
        debug_assert_eq!(wake.phase, Phase::Trying);
        let settled = if std::mem::take(&mut wake.again) {
            wake.phase = Phase::Queued;
            wake.tries = 0;
            self.fresh.push_back(session.to_string());
            Settled::Again
        } else if failed && wake.tries < ATTEMPTS {
            wake.phase = Phase::Waiting;
            self.seq += 1;
            wake.seq = self.seq;
            let at = now + backoff(wake.tries);
            self.later.push(Reverse((at, self.seq, session.to_string())));
            Settled::Retry
        } else {
            self.leave(session);
            if failed {
                Settled::GivenUp
            } else {
                Settled::Done
            }
        };
        self.check();
        settled
    }

    /// Wakes in flight and sessions parked.
    #[cfg(test)]
    pub(super) fn sizes(&self) -> (usize, usize) {
        (self.wakes.len(), self.parked.len())
    }

    /// The phase and tries of `session`'s wake in flight.
    #[cfg(test)]
    pub(super) fn state(&self, session: &str) -> Option<(Phase, u32)> {
        self.wakes.get(session).map(|w| (w.phase, w.tries))
    }

    fn has_room(&self, host: &str) -> bool {
        self.wakes.len() < MAX_IN_FLIGHT && self.per_host.get(host).copied().unwrap_or(0) < MAX_PER_HOST
    }

    /// Gives `session`'s wake a slot: queued for its first try.
    fn admit(&mut self, session: &str, url: String, body: String, host: String) {
        self.unindex(&host);
        *self.per_host.entry(host.clone()).or_default() += 1;
        self.index(&host);
        self.wakes.insert(
            session.to_string(),
            InFlight {
                url,
                body,
                host,
                tries: 0,
                phase: Phase::Queued,
                again: false,
                seq: 0,
            },
        );
        self.fresh.push_back(session.to_string());
    }

    /// Takes `session`'s wake out of flight, and gives its slot to the oldest parked wake that
    /// may take it.
    fn leave(&mut self, session: &str) {
        let Some(wake) = self.wakes.remove(session) else { return };
        self.unindex(&wake.host);
        if let Some(n) = self.per_host.get_mut(&wake.host) {
            *n -= 1;
            if *n == 0 {
                self.per_host.remove(&wake.host);
            }
        }
        self.index(&wake.host);
        while self.wakes.len() < MAX_IN_FLIGHT {
            let Some((_, host)) = self.open.pop_first() else { break };
            let Some((_, next)) = self.parked_by_host.get_mut(&host).and_then(VecDeque::pop_front) else {
                debug_assert!(false, "an open host has no parked wake");
                continue;
            };
            if self.parked_by_host.get(&host).is_some_and(VecDeque::is_empty) {
                self.parked_by_host.remove(&host);
            }
            // `admit` indexes the host again if it still has room and parked wakes.
            if let Some(p) = self.parked.remove(&next) {
                self.admit(&next, p.url, p.body, p.host);
            }
        }
    }

    fn park(&mut self, session: &str, url: String, body: String, host: String) {
        self.seq += 1;
        let seq = self.seq;
        self.unindex(&host);
        self.parked_by_host
            .entry(host.clone())
            .or_default()
            .push_back((seq, session.to_string()));
        self.index(&host);
        self.parked.insert(session.to_string(), Parked { url, body, host, seq });
    }

    fn unpark(&mut self, session: &str) {
        let Some(p) = self.parked.remove(session) else { return };
        self.unindex(&p.host);
        if let Some(queue) = self.parked_by_host.get_mut(&p.host) {
            queue.retain(|(seq, _)| *seq != p.seq);
            if queue.is_empty() {
                self.parked_by_host.remove(&p.host);
            }
        }
        self.index(&p.host);
    }

    /// Takes `host` out of `open` (before its slots or parked wakes change).
    fn unindex(&mut self, host: &str) {
        if let Some(&(seq, _)) = self.parked_by_host.get(host).and_then(VecDeque::front) {
            self.open.remove(&(seq, host.to_string()));
        }
    }

    /// Puts `host` in `open` if it has a parked wake and a free slot of its own (after they
    /// changed).
    fn index(&mut self, host: &str) {
        let room = self.per_host.get(host).copied().unwrap_or(0) < MAX_PER_HOST;
        if let Some(&(seq, _)) = self.parked_by_host.get(host).and_then(VecDeque::front) {
            if room {
                self.open.insert((seq, host.to_string()));
            }
        }
    }

    /// Every wake in flight is in exactly the queue its phase says, within the bounds, and a
    /// parked wake waits only for a slot it may take.
    fn check(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        let count = |phase| self.wakes.values().filter(|w| w.phase == phase).count();
        debug_assert!(self.wakes.len() <= MAX_IN_FLIGHT);
        debug_assert!(self.parked.len() <= MAX_PARKED);
        debug_assert_eq!(self.fresh.len() + self.due.len(), count(Phase::Queued));
        debug_assert!(self.later.len() >= count(Phase::Waiting));
        debug_assert_eq!(self.per_host.values().sum::<usize>(), self.wakes.len());
        debug_assert!(self.per_host.values().all(|n| (1..=MAX_PER_HOST).contains(n)));
        debug_assert_eq!(
            self.parked_by_host.values().map(VecDeque::len).sum::<usize>(),
            self.parked.len()
        );
        debug_assert!(self.wakes.keys().all(|s| !self.parked.contains_key(s)));
        debug_assert!(self.open.is_empty() || self.wakes.len() == MAX_IN_FLIGHT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(port: u16) -> String {
        format!("http://127.0.0.1:{port}/wake")
    }

    /// Takes every queued wake, as busy threads would, and returns their sessions.
    fn take_all(q: &mut Queues, now: Instant) -> Vec<String> {
        std::iter::from_fn(|| q.take(now)).map(|j| j.session).collect()
    }

    #[test]
    fn backoff_doubles_from_100_ms_up_to_10_s() {
        let ms: Vec<u128> = (1..=8).map(|t| backoff(t).as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1600, 3200, 6400, 10_000]);
        assert_eq!(backoff(40), MAX_BACKOFF);
    }

    #[test]
    fn a_parked_wake_takes_the_first_slot_that_frees_oldest_first() {
        let now = Instant::now();
        let mut q = Queues::default();
        for i in 0..MAX_IN_FLIGHT {
            let port = 1000 + (i / MAX_PER_HOST) as u16;
            assert_eq!(q.submit(&format!("s{i}"), &url(port), "{}".into()), Submitted::Queued);
        }
        assert_eq!(q.submit("late1", &url(2000), "1".into()), Submitted::Parked);
        assert_eq!(q.submit("late2", &url(2001), "2".into()), Submitted::Parked);
        assert_eq!(q.submit("late1", &url(2000), "newest".into()), Submitted::Joined);
        assert_eq!(q.sizes(), (MAX_IN_FLIGHT, 2), "one parked entry per session");
        assert_eq!(take_all(&mut q, now).len(), MAX_IN_FLIGHT);
        assert_eq!(q.settle("s0", false, now), Settled::Done);
        let promoted = q.take(now).unwrap();
        assert_eq!((promoted.session.as_str(), promoted.body.as_str()), ("late1", "newest"));
        assert_eq!(q.settle("s1", true, now), Settled::Retry, "a retry keeps its slot");
        assert_eq!(q.take(now), None);
        assert_eq!(q.settle("s2", false, now), Settled::Done);
        assert_eq!(q.take(now).unwrap().session, "late2");
        assert_eq!(q.sizes(), (MAX_IN_FLIGHT, 0));
    }

    #[test]
    fn a_host_with_its_slots_taken_parks_its_wakes_until_one_of_its_own_frees() {
        let now = Instant::now();
        let mut q = Queues::default();
        for i in 0..MAX_PER_HOST {
            assert_eq!(q.submit(&format!("h{i}"), &url(1), "{}".into()), Submitted::Queued);
        }
        assert_eq!(q.submit("h-more", &url(1), "{}".into()), Submitted::Parked);
        assert_eq!(q.submit("other", &url(2), "{}".into()), Submitted::Queued);
        let taken = take_all(&mut q, now);
        assert_eq!(taken.len(), MAX_PER_HOST + 1);
        assert_eq!(q.settle("other", false, now), Settled::Done);
        assert_eq!(q.take(now), None, "another host's slot is not this host's");
        assert_eq!(q.settle("h3", false, now), Settled::Done);
        assert_eq!(q.take(now).unwrap().session, "h-more");
    }

    #[test]
    fn wakes_beyond_the_parked_bound_are_dropped() {
        let mut q = Queues::default();
        for i in 0..MAX_PER_HOST + MAX_PARKED {
            assert_ne!(q.submit(&format!("s{i}"), &url(1), "{}".into()), Submitted::Dropped);
        }
        assert_eq!(q.submit("one-more", &url(2), "{}".into()), Submitted::Queued);
        for i in 0..MAX_IN_FLIGHT {
            q.submit(&format!("t{i}"), &url(3 + (i / MAX_PER_HOST) as u16), "{}".into());
        }
        assert_eq!(q.sizes().1, MAX_PARKED);
        assert_eq!(q.submit("s0", &url(1), "{}".into()), Submitted::Joined);
        assert_eq!(q.submit("beyond", &url(99), "{}".into()), Submitted::Dropped);
    }

    #[test]
    fn a_wake_joining_a_waiting_retry_is_its_first_try_and_due_now() {
        let mut at = Instant::now();
        let mut q = Queues::default();
        q.submit("s", &url(1), "old".into());
        for tries in 1..ATTEMPTS {
            assert_eq!(q.take(at).map(|j| j.tries), Some(tries));
            assert_eq!(q.settle("s", true, at), Settled::Retry);
            at += backoff(tries);
        }
        // Waiting for its last try, due at `at`; a later wake joins it before then.
        let joined = at - backoff(ATTEMPTS - 1);
        assert_eq!(q.state("s"), Some((Phase::Waiting, ATTEMPTS - 1)));
        assert_eq!(q.submit("s", &url(1), "new".into()), Submitted::Queued);
        let job = q.take(joined).expect("due now, not after the old backoff");
        assert_eq!((job.tries, job.body.as_str()), (1, "new"));
        // That try fails long after: its retry is due later than the old wait's entry.
        let failed = at + MAX_BACKOFF;
        assert_eq!(q.settle("s", true, failed), Settled::Retry);
        assert_eq!(q.take(at), None, "the old wait's entry is stale");
        assert_eq!(q.take(failed + FIRST_BACKOFF).map(|j| j.tries), Some(2));
    }

    #[test]
    fn a_wake_joining_a_try_that_fails_is_retried_now_as_its_first_try() {
        let now = Instant::now();
        let mut q = Queues::default();
        q.submit("s", &url(1), "old".into());
        q.take(now).unwrap();
        assert_eq!(q.submit("s", &url(1), "new".into()), Submitted::Joined);
        assert_eq!(q.settle("s", true, now), Settled::Again);
        let job = q.take(now).expect("tried now");
        assert_eq!((job.tries, job.body.as_str()), (1, "new"));
    }
}
