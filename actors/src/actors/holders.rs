//! Who serves the sessions another process holds, as this process last found out: so a request
//! for such a session is sent on to its holder without asking the database each time (which
//! takes a few statements: is it stored, is it nested, who holds its tenure).
//!
//! An answer is kept until it is found wrong, and for [`Holders::KEPT`] at most: a request sent
//! on to a holder that does not answer, or that answers it no longer serves the session (503
//! `session_moved`, which the client retries), has the server forget it, and the next request
//! asks the database again; so does an event stream redirected there (whether the client got
//! through is never known to the server). (A holder is the authority on what it serves: a stale answer costs
//! one refused request, never a wrong one.)
//!
//! The supervisor writes what it finds; the embedding API reads it without a message to the
//! supervisor (a server sends a request on before any handler runs), so it is shared behind a
//! lock held for one lookup or one insert.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Where sessions served elsewhere were found, and when. Clones share one record.
#[derive(Debug, Clone)]
pub struct Holders {
    kept: Duration,
    found: Arc<Mutex<HashMap<String, (String, Instant)>>>,
}

impl Holders {
    /// The longest an answer is kept.
    pub const KEPT: Duration = Duration::from_secs(60);

    /// Past this many answers, the stale ones are dropped as a new one is kept.
    const PRUNE_ABOVE: usize = 4096;

    /// Answers kept for `kept` at most.
    pub fn new(kept: Duration) -> Self {
        Holders {
            kept,
            found: Arc::default(),
        }
    }

    /// The record; a panic while it was held left nothing half-written (each change is one
    /// insert or one removal), so a poisoned lock is used as it is.
    fn record(&self) -> MutexGuard<'_, HashMap<String, (String, Instant)>> {
        self.found.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The address of the process that served `session` a moment ago, if one did.
    pub fn get(&self, session: &str, now: Instant) -> Option<String> {
        self.record()
            .get(session)
            .filter(|(_, at)| now.saturating_duration_since(*at) < self.kept)
            .map(|(address, _)| address.clone())
    }

    /// `session` was found served at `address`.
    pub fn found(&self, session: &str, address: &str, now: Instant) {
        let mut found = self.record();
        if found.len() >= Self::PRUNE_ABOVE {
            let kept = self.kept;
            found.retain(|_, (_, at)| now.saturating_duration_since(*at) < kept);
        }
        found.insert(session.to_string(), (address.to_string(), now));
    }

    /// `session` is served here now, or by nobody known: forgotten.
    pub fn forget(&self, session: &str) {
        self.record().remove(session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_kept_for_a_while_at_most_or_until_forgotten() {
        let h = Holders::new(Duration::from_secs(2));
        let t = Instant::now();
        h.found("s", "http://b", t);
        assert_eq!(h.get("s", t + Duration::from_millis(1999)).as_deref(), Some("http://b"));
        assert_eq!(h.get("s", t + Duration::from_secs(2)), None);
        assert_eq!(h.get("other", t), None);
        h.forget("s");
        assert_eq!(h.get("s", t), None);
    }

    #[test]
    fn stale_answers_are_dropped_once_there_are_many() {
        let h = Holders::new(Duration::from_secs(10));
        let t = Instant::now();
        for i in 0..Holders::PRUNE_ABOVE {
            h.found(&format!("s{i}"), "http://b", t);
        }
        let later = t + Duration::from_secs(10);
        h.found("new", "http://c", later);
        assert_eq!(h.record().len(), 1);
        assert_eq!(h.get("new", later).as_deref(), Some("http://c"));
    }
}
