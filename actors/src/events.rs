//! Session events: what happened in a session, for live observers (the event stream of
//! `brood serve`, a TUI, a test).
//!
//! The owner emits an event when a change is *applied* — after its flush where it needed one —
//! so an observer never hears of something the ledger does not hold. Events are a view, not a
//! record: nothing is replayed to a late subscriber, and a subscriber that falls more than
//! [`Events::CAPACITY`] events behind loses the oldest ones (tokio's broadcast `Lagged`), which
//! is how a slow reader is bounded; the server drops such a stream. The durable truth stays in
//! the boundary, the ack and the session's state.
//!
//! Emitting costs one map lookup when nobody watches the session: the event itself is built
//! only for a watched session.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use tokio::sync::broadcast;

use crate::model::ChildStatus;

/// How a claim changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimChange {
    /// A boundary claimed items.
    Claimed,
    /// The claim was acked: its items are delivered.
    Acked,
    /// The consumer released it.
    Released,
    /// Its lease ran out.
    Expired,
}

impl ClaimChange {
    /// The change as a word (`claimed`, `acked`, `released`, `expired`).
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimChange::Claimed => "claimed",
            ClaimChange::Acked => "acked",
            ClaimChange::Released => "released",
            ClaimChange::Expired => "expired",
        }
    }
}

/// One thing that happened in a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A child's status changed (queued, running, or its end).
    Child {
        /// The child.
        child_id: String,
        /// Its call.
        call_id: String,
        /// Its task's index in the call.
        task_index: u32,
        /// Its new status.
        status: ChildStatus,
        /// Its attempt (1, or more when it was run again).
        attempts: u32,
        /// Its result data (JSON text), when it ended with some.
        output: Option<String>,
        /// The W3C trace context its call was delegated with, if any.
        traceparent: Option<String>,
    },
    /// The number of items ready to claim changed.
    Ready {
        /// Items ready now.
        ready: usize,
    },
    /// The session was woken.
    Wake {
        /// Items ready at the wake.
        ready: usize,
    },
    /// A child failed before its unit was complete: an early failure notice is ready.
    FailureNotice {
        /// The failed child.
        child_id: String,
        /// Its call.
        call_id: String,
        /// How it ended.
        status: ChildStatus,
        /// What went wrong.
        error: Option<String>,
    },
    /// A cancel request was applied: the children it cancelled are recorded `cancelled`.
    Cancel {
        /// What was cancelled: `call`, `unit` or `child`.
        kind: &'static str,
        /// Its id.
        id: String,
        /// The children this request cancelled.
        cancelled: Vec<String>,
        /// Who asked, and why.
        reason: String,
    },
    /// A claim was made or ended.
    Claim {
        /// The claim.
        claim_id: String,
        /// What happened to it.
        change: ClaimChange,
        /// Items it holds (claimed) or held.
        items: usize,
    },
}

impl Event {
    /// The event's name on the stream: `child`, `ready`, `wake`, `failure_notice`, `claim`,
    /// `cancel`.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Child { .. } => "child",
            Event::Ready { .. } => "ready",
            Event::Wake { .. } => "wake",
            Event::FailureNotice { .. } => "failure_notice",
            Event::Claim { .. } => "claim",
            Event::Cancel { .. } => "cancel",
        }
    }
}

/// An event as observers get it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionEvent {
    /// The session it happened in.
    pub session_id: String,
    /// Its number in the session's stream since the stream's channel was made (from 1); a gap
    /// tells a subscriber that it missed events.
    pub seq: u64,
    /// When, in ms since the Unix epoch.
    pub at_ms: u64,
    /// What happened.
    pub event: Event,
}

struct Channel {
    tx: broadcast::Sender<Arc<SessionEvent>>,
    seq: AtomicU64,
}

/// The event channels of an engine's sessions, one per watched session.
#[derive(Clone, Default)]
pub struct Events {
    channels: Arc<DashMap<String, Arc<Channel>>>,
    /// At least the number of channels (raised before one is added, lowered after one is
    /// removed): while it is 0, nobody watches any session, and an emit is one atomic load
    /// instead of a lookup. Owners emit several times per child.
    open: Arc<std::sync::atomic::AtomicUsize>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").field("watched", &self.channels.len()).finish()
    }
}

impl Events {
    /// Events a subscriber may fall behind before it loses the oldest.
    pub const CAPACITY: usize = 1024;

    /// Subscribes to a session's events from now on. It joins its channel while it holds the
    /// channel's entry: an emit that removes a channel nobody watches looks under the same
    /// entry, so it sees this subscriber and keeps the channel (a subscriber that joined a
    /// channel just removed would get a stream that is closed at once).
    pub fn subscribe(&self, session_id: &str) -> broadcast::Receiver<Arc<SessionEvent>> {
        let stall = || {
            if crate::failpoints::fires("events_subscribe_stall") {
                std::thread::sleep(std::time::Duration::from_millis(400));
            }
        };
        match self.channels.entry(session_id.to_string()) {
            dashmap::Entry::Occupied(e) => {
                stall();
                e.get().tx.subscribe()
            }
            dashmap::Entry::Vacant(v) => {
                self.open.fetch_add(1, Ordering::SeqCst);
                let channel = v.insert(Arc::new(Channel {
                    tx: broadcast::channel(Self::CAPACITY).0,
                    seq: AtomicU64::new(0),
                }));
                stall();
                channel.tx.subscribe()
            }
        }
    }

    /// Whether anyone watches the session.
    pub fn watched(&self, session_id: &str) -> bool {
        self.open.load(Ordering::SeqCst) > 0 && self.channels.get(session_id).is_some_and(|c| c.tx.receiver_count() > 0)
    }

    /// Emits an event to the session's subscribers; `event` is called only if there are any.
    /// A channel nobody listens to any more is dropped.
    pub fn emit(&self, session_id: &str, event: impl FnOnce() -> Event) {
        if self.open.load(Ordering::SeqCst) == 0 {
            return;
        }
        let Some(channel) = self.channels.get(session_id).map(|c| c.clone()) else {
            return;
        };
        if channel.tx.receiver_count() == 0 {
            if self
                .channels
                .remove_if(session_id, |_, c| c.tx.receiver_count() == 0)
                .is_some()
            {
                self.open.fetch_sub(1, Ordering::SeqCst);
            }
            return;
        }
        let seq = channel.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let _ = channel.tx.send(Arc::new(SessionEvent {
            session_id: session_id.to_string(),
            seq,
            at_ms: crate::model::now_ms(),
            event: event(),
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(n: usize) -> Event {
        Event::Ready { ready: n }
    }

    #[test]
    fn nobody_watching_builds_nothing() {
        let events = Events::default();
        events.emit("s", || panic!("built for a session nobody watches"));
        let rx = events.subscribe("s");
        drop(rx);
        events.emit("s", || panic!("built after the last subscriber left"));
        assert!(!events.watched("s"));
        assert!(events.channels.is_empty(), "the unwatched channel was dropped");
        assert_eq!(events.open.load(Ordering::SeqCst), 0, "and counted out");
        let mut again = events.subscribe("s");
        events.emit("s", || ready(3));
        assert_eq!(again.try_recv().unwrap().event, ready(3), "a new subscriber is served");
    }

    #[test]
    fn subscribers_get_events_of_their_session_in_order() {
        let events = Events::default();
        let mut a = events.subscribe("a");
        let mut b = events.subscribe("b");
        events.emit("a", || ready(1));
        events.emit("b", || ready(7));
        events.emit("a", || ready(2));
        let first = a.try_recv().unwrap();
        let second = a.try_recv().unwrap();
        assert_eq!((first.seq, &first.event), (1, &ready(1)));
        assert_eq!((second.seq, &second.event), (2, &ready(2)));
        assert!(a.try_recv().is_err());
        assert_eq!(b.try_recv().unwrap().event, ready(7));
    }

    /// A subscriber that joins while the last one's channel is being removed (the removal of
    /// an unwatched channel on an emit) is served: its stream is not closed at once.
    #[cfg(feature = "failpoints")]
    #[test]
    fn a_subscriber_racing_the_removal_of_an_unwatched_channel_is_served() {
        let events = Events::default();
        drop(events.subscribe("s")); // the channel stays, watched by nobody
        crate::failpoints::arm("events_subscribe_stall", 1);
        let joining = events.clone();
        let subscriber = std::thread::spawn(move || joining.subscribe("s"));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while crate::failpoints::remaining("events_subscribe_stall") > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the subscriber never reached its channel"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // The subscriber found the channel and has not joined it yet: an emit now finds it
        // unwatched.
        events.emit("s", || ready(1));
        let mut rx = subscriber.join().expect("the subscriber");
        events.emit("s", || ready(2));
        let mut got = Vec::new();
        loop {
            match rx.try_recv() {
                Ok(ev) => got.push(ev.event.clone()),
                Err(broadcast::error::TryRecvError::Empty) => break,
                Err(e) => panic!("the new subscriber's stream failed ({e}) after {got:?}"),
            }
        }
        assert_eq!(
            got.last(),
            Some(&ready(2)),
            "the new subscriber hears later events: {got:?}"
        );
        assert!(events.watched("s"));
    }

    #[test]
    fn a_slow_subscriber_lags_instead_of_growing_without_bound() {
        let events = Events::default();
        let mut slow = events.subscribe("s");
        for i in 0..Events::CAPACITY + 10 {
            events.emit("s", || ready(i));
        }
        match slow.try_recv() {
            Err(broadcast::error::TryRecvError::Lagged(n)) => assert_eq!(n, 10),
            other => panic!("expected a lag, got {other:?}"),
        }
        // What is left is the newest CAPACITY events, in order.
        assert_eq!(slow.try_recv().unwrap().seq, 11);
    }
}
