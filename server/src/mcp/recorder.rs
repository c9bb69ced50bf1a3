//! The recent events of the sessions MCP clients work with, for the events resource. The engine
//! replays nothing to a late subscriber ([`brood::Brood::subscribe`]), so this holds a
//! subscription per session — the same broadcast the event stream of `GET
//! /v1/sessions/{id}/events` reads — from the first `delegate` or events read through MCP on,
//! and keeps the latest [`RECENT`] events of each. The subscription itself is the buffer: events
//! are taken off it when the resource is read. A subscriber that fell more than
//! [`brood::EVENTS_CAPACITY`] events behind missed the oldest, and says how many.
//!
//! At most [`WATCHED`] sessions are watched; past that, the one used longest ago is let go.
//! Nothing here is durable: the durable truth stays in the session's state and its boundaries.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast::{error::TryRecvError, Receiver};

use brood::{Brood, SessionEvent};

/// The most events kept per session.
pub(super) const RECENT: usize = 256;

/// The most sessions watched at once.
pub(super) const WATCHED: usize = 64;

/// The recent events of the sessions watched.
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    sessions: Mutex<Watched>,
}

#[derive(Debug, Default)]
struct Watched {
    by_session: HashMap<String, Recording>,
    /// Counts uses, to find the session used longest ago.
    clock: u64,
}

#[derive(Debug)]
struct Recording {
    rx: Receiver<Arc<SessionEvent>>,
    recent: VecDeque<Arc<SessionEvent>>,
    since_ms: u64,
    missed: u64,
    used: u64,
}

/// What a session's recording holds now.
#[derive(Debug, Clone)]
pub(super) struct Recent {
    /// When the recording began, ms since the Unix epoch.
    pub(super) since_ms: u64,
    /// Events that were never seen (the subscription fell behind) or were let go past
    /// [`RECENT`].
    pub(super) missed: u64,
    /// The events, oldest first.
    pub(super) events: Vec<Arc<SessionEvent>>,
}

impl Recording {
    /// Takes what the subscription holds into `recent`.
    fn catch_up(&mut self) {
        loop {
            match self.rx.try_recv() {
                Ok(ev) => {
                    if self.recent.len() == RECENT {
                        self.recent.pop_front();
                        self.missed += 1;
                    }
                    self.recent.push_back(ev);
                }
                Err(TryRecvError::Lagged(n)) => self.missed += n,
                Err(TryRecvError::Empty) | Err(TryRecvError::Closed) => return,
            }
        }
    }
}

impl Recorder {
    fn lock(&self) -> std::sync::MutexGuard<'_, Watched> {
        // A panic elsewhere while it was held leaves a map that is still whole.
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Watches `session_id` from now on, when it is not watched yet. A session the engine does
    /// not know is not watched (there is nothing to record).
    pub(super) async fn watch(&self, brood: &Brood, session_id: &str) {
        if self.touch(session_id) {
            return;
        }
        if let Ok(rx) = brood.subscribe(session_id).await {
            self.keep(session_id, rx);
        }
    }

    /// Records `session_id` from `rx` on (unless it is recorded already), letting go of the
    /// session used longest ago when [`WATCHED`] are.
    fn keep(&self, session_id: &str, rx: Receiver<Arc<SessionEvent>>) {
        let mut w = self.lock();
        w.clock += 1;
        let used = w.clock;
        if !w.by_session.contains_key(session_id) && w.by_session.len() >= WATCHED {
            let oldest = w
                .by_session
                .iter()
                .min_by_key(|(_, r)| r.used)
                .map(|(id, _)| id.clone());
            if let Some(oldest) = oldest {
                w.by_session.remove(&oldest);
            }
        }
        w.by_session.entry(session_id.to_string()).or_insert_with(|| Recording {
            rx,
            recent: VecDeque::new(),
            since_ms: brood_actors::model::now_ms(),
            missed: 0,
            used,
        });
    }

    /// Marks `session_id` used; answers whether it is watched.
    fn touch(&self, session_id: &str) -> bool {
        let mut w = self.lock();
        w.clock += 1;
        let now = w.clock;
        match w.by_session.get_mut(session_id) {
            Some(r) => {
                r.used = now;
                true
            }
            None => false,
        }
    }

    /// The recent events of `session_id`, when it is watched.
    pub(super) fn recent(&self, session_id: &str) -> Option<Recent> {
        let mut w = self.lock();
        let r = w.by_session.get_mut(session_id)?;
        r.catch_up();
        Some(Recent {
            since_ms: r.since_ms,
            missed: r.missed,
            events: r.recent.iter().cloned().collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brood::Event;
    use tokio::sync::broadcast;

    fn recording(rx: Receiver<Arc<SessionEvent>>) -> Recording {
        Recording {
            rx,
            recent: VecDeque::new(),
            since_ms: 1,
            missed: 0,
            used: 0,
        }
    }

    fn event(seq: u64) -> Arc<SessionEvent> {
        Arc::new(SessionEvent {
            session_id: "s".into(),
            seq,
            at_ms: seq,
            event: Event::Ready { ready: 1 },
        })
    }

    #[test]
    fn the_latest_events_are_kept_and_the_others_counted_as_missed() {
        let (tx, rx) = broadcast::channel(RECENT * 2);
        let mut r = recording(rx);
        for seq in 0..(RECENT as u64 + 3) {
            tx.send(event(seq)).unwrap();
        }
        r.catch_up();
        assert_eq!(r.recent.len(), RECENT);
        assert_eq!(r.missed, 3);
        assert_eq!(r.recent.front().map(|e| e.seq), Some(3));
    }

    #[test]
    fn past_the_bound_the_session_used_longest_ago_is_let_go() {
        let recorder = Recorder::default();
        let (tx, _) = broadcast::channel::<Arc<SessionEvent>>(4);
        for i in 0..WATCHED {
            recorder.keep(&format!("s{i}"), tx.subscribe());
        }
        assert!(recorder.touch("s0"));
        recorder.keep("new", tx.subscribe());
        assert!(recorder.recent("s0").is_some(), "used last, kept");
        assert!(recorder.recent("s1").is_none(), "used longest ago, let go");
        assert!(recorder.recent("new").is_some());
        assert_eq!(recorder.lock().by_session.len(), WATCHED);
    }

    #[test]
    fn a_subscription_that_fell_behind_says_how_many_it_missed() {
        let (tx, rx) = broadcast::channel(2);
        let mut r = recording(rx);
        for seq in 0..5 {
            tx.send(event(seq)).unwrap();
        }
        r.catch_up();
        assert_eq!(r.missed, 3);
        assert_eq!(r.recent.iter().map(|e| e.seq).collect::<Vec<_>>(), [3, 4]);
    }
}
