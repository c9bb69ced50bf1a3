//! Who serves the sessions another process holds, as this process last found out: so a request
//! for such a session is sent on to its holder without asking the database each time (which
//! takes a few statements: is it stored, is it nested, who holds its tenure).
//!
//! An answer is kept until it is found wrong, and for [`Holders::KEPT`] at most: a request sent
//! on to a holder that does not answer, or that answers it no longer serves the session (503
//! `session_moved`, which the client retries), has the server forget it
//! ([`super::ForgetHolder`]), and the next request asks the database again. (A holder is the
//! authority on what it serves: a stale answer costs one refused request, never a wrong one.)

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Where sessions served elsewhere were found, and when.
#[derive(Debug)]
pub(super) struct Holders {
    kept: Duration,
    found: HashMap<String, (String, Instant)>,
}

impl Holders {
    /// The longest an answer is kept.
    pub(super) const KEPT: Duration = Duration::from_secs(60);

    /// Past this many answers, the stale ones are dropped as a new one is kept.
    const PRUNE_ABOVE: usize = 4096;

    /// Answers kept for `kept` at most.
    pub(super) fn new(kept: Duration) -> Self {
        Holders {
            kept,
            found: HashMap::new(),
        }
    }

    /// The address of the process that served `session` a moment ago, if one did.
    pub(super) fn get(&self, session: &str, now: Instant) -> Option<&str> {
        self.found
            .get(session)
            .filter(|(_, at)| now.saturating_duration_since(*at) < self.kept)
            .map(|(address, _)| address.as_str())
    }

    /// `session` was found served at `address`.
    pub(super) fn found(&mut self, session: &str, address: &str, now: Instant) {
        if self.found.len() >= Self::PRUNE_ABOVE {
            let kept = self.kept;
            self.found
                .retain(|_, (_, at)| now.saturating_duration_since(*at) < kept);
        }
        self.found.insert(session.to_string(), (address.to_string(), now));
    }

    /// `session` is served here now, or by nobody known: forgotten.
    pub(super) fn forget(&mut self, session: &str) {
        self.found.remove(session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_kept_for_a_while_at_most_or_until_forgotten() {
        let mut h = Holders::new(Duration::from_secs(2));
        let t = Instant::now();
        h.found("s", "http://b", t);
        assert_eq!(h.get("s", t + Duration::from_millis(1999)), Some("http://b"));
        assert_eq!(h.get("s", t + Duration::from_secs(2)), None);
        assert_eq!(h.get("other", t), None);
        h.forget("s");
        assert_eq!(h.get("s", t), None);
    }

    #[test]
    fn stale_answers_are_dropped_once_there_are_many() {
        let mut h = Holders::new(Duration::from_secs(10));
        let t = Instant::now();
        for i in 0..Holders::PRUNE_ABOVE {
            h.found(&format!("s{i}"), "http://b", t);
        }
        let later = t + Duration::from_secs(10);
        h.found("new", "http://c", later);
        assert_eq!(h.found.len(), 1);
        assert_eq!(h.get("new", later), Some("http://c"));
    }
}
