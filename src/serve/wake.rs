//! Webhook wakes: a wake is a POST of `{"session_id", "ready"}` to the session's `wake_url`.
//!
//! Each wake is delivered from a thread of its own, so a slow or failing receiver never holds
//! up routing or another session's wakes; a failure (no answer, or a status other than 2xx) is
//! retried with backoff, a bounded number of times, then logged and given up — the items stay
//! ready, and the next boundary finds them whatever became of the wake. What became of each
//! wake is counted in [`WakeCounts`], which `GET /metrics` reports.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;

use crate::{Wake, WakeEvent, WakeFactory};

/// Attempts of one wake before it is given up.
const ATTEMPTS: u32 = 8;
/// The first retry's delay; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// How long one POST may take.
const TIMEOUT: Duration = Duration::from_secs(5);

/// What became of webhook wakes, counted since the server started. Clones share the counts.
#[derive(Debug, Clone, Default)]
pub struct WakeCounts {
    /// Wakes a receiver accepted (a 2xx answer).
    pub(super) delivered: Counter,
    /// Tries that failed (no answer, or not 2xx); a wake may fail several before it is delivered.
    pub(super) failed_tries: Counter,
    /// Wakes given up after their last failed try.
    pub(super) given_up: Counter,
}

/// Makes webhook wake targets: plain `http://` URLs (this build has no TLS client).
#[derive(Debug, Clone)]
pub struct Webhooks {
    agent: ureq::Agent,
    counts: WakeCounts,
}

impl Default for Webhooks {
    fn default() -> Self {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(TIMEOUT))
            .http_status_as_error(false)
            .build()
            .into();
        Webhooks {
            agent,
            counts: WakeCounts::default(),
        }
    }
}

impl Webhooks {
    /// Counts what becomes of the wakes in `counts` (instead of counts of their own).
    pub fn counted(mut self, counts: WakeCounts) -> Self {
        self.counts = counts;
        self
    }
}

impl WakeFactory for Webhooks {
    fn validate(&self, url: &str) -> Result<(), String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("`{url}` is not an http:// URL (https is not supported by this build)"))?;
        let host = rest.split(['/', '?', '#']).next().unwrap_or("");
        if host.is_empty() {
            return Err(format!("`{url}` names no host"));
        }
        if url.len() > 2048 {
            return Err("is longer than 2048 characters".into());
        }
        Ok(())
    }

    fn wake_for(&self, session_id: &str, url: &str) -> Arc<dyn Wake> {
        Arc::new(Webhook {
            agent: self.agent.clone(),
            counts: self.counts.clone(),
            url: url.to_string(),
            session_id: session_id.to_string(),
        })
    }
}

/// One session's webhook.
struct Webhook {
    agent: ureq::Agent,
    counts: WakeCounts,
    url: String,
    session_id: String,
}

impl Wake for Webhook {
    fn wake(&self, event: WakeEvent) {
        let (agent, url, session) = (self.agent.clone(), self.url.clone(), self.session_id.clone());
        let counts = self.counts.clone();
        let body = serde_json::json!({"session_id": event.session_id, "ready": event.ready}).to_string();
        let spawned = std::thread::Builder::new()
            .name("brood-wake".into())
            .spawn(move || deliver(&agent, &counts, &url, &session, &body));
        if let Err(e) = spawned {
            tracing::error!(session = %self.session_id, "could not start delivering a wake: {e}");
        }
    }
}

fn deliver(agent: &ureq::Agent, counts: &WakeCounts, url: &str, session: &str, body: &str) {
    let mut pause = FIRST_BACKOFF;
    for attempt in 1..=ATTEMPTS {
        let outcome = agent
            .post(url)
            .header("Content-Type", "application/json")
            .send(body.as_bytes());
        match outcome {
            Ok(r) if r.status().is_success() => {
                counts.delivered.inc();
                return;
            }
            Ok(r) => tracing::warn!(
                session = %crate::printable(session),
                attempt,
                status = r.status().as_u16(),
                "the wake receiver refused the wake"
            ),
            Err(e) => tracing::warn!(
                session = %crate::printable(session),
                attempt,
                "the wake could not be delivered: {}",
                crate::printable(&e.to_string())
            ),
        }
        counts.failed_tries.inc();
        if attempt < ATTEMPTS {
            std::thread::sleep(pause);
            pause = (pause * 2).min(MAX_BACKOFF);
        }
    }
    counts.given_up.inc();
    tracing::error!(
        session = %crate::printable(session),
        url = %crate::printable(url),
        "a wake was given up after {ATTEMPTS} attempts; the items stay ready"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_urls_with_a_host_are_accepted() {
        let w = Webhooks::default();
        assert!(w.validate("http://127.0.0.1:9000/wake").is_ok());
        assert!(w.validate("https://example.test/").unwrap_err().contains("https"));
        assert!(w.validate("ftp://x").is_err());
        assert!(w.validate("http:///path").unwrap_err().contains("no host"));
    }
}
