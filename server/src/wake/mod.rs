//! Webhook wakes: a wake is a POST of `{"session_id", "ready"}` to the session's `wake_url`.
//!
//! This module owns the [`WakeFactory`] of `brood serve`: which URLs a session may bind
//! (`target`: plain `http://`, no userinfo, no control characters, and no target inside the
//! network unless `wake_allow` lets it), and the delivery of wakes (`pool`: a few threads, no
//! redirects followed, retries with backoff; `queues`: a bounded number of wakes in flight, and
//! fewer to any one host, the others parked — one per session — until a slot frees). A failure
//! (no answer, or a status other than 2xx) is retried a bounded number of times, then logged and
//! given up — the items stay ready, and the next boundary finds them whatever became of the
//! wake; so are they when a wake is dropped, which happens only when 10,000 sessions' wakes are
//! parked already. When the wake is sent is not this module's: the session owner decides
//! (DESIGN.md, I7). What became of each wake is counted in [`WakeCounts`], which `GET /metrics`
//! reports; logs show a `wake_url` as scheme, host and port only (its path and query may hold a
//! token).

use std::sync::{Arc, OnceLock};

use prometheus_client::metrics::counter::Counter;

use brood::{Wake, WakeEvent, WakeFactory};

mod pool;
mod queues;
pub(crate) mod target;

pub(crate) use target::allow_entry;

/// What became of webhook wakes, counted since the server started. Clones share the counts.
#[derive(Debug, Clone, Default)]
pub struct WakeCounts {
    /// Wakes a receiver accepted (a 2xx answer).
    pub(super) delivered: Counter,
    /// Tries that failed (no answer, or not 2xx); a wake may fail several before it is delivered.
    pub(super) failed_tries: Counter,
    /// Wakes given up after their last failed try.
    pub(super) given_up: Counter,
    /// Wakes not sent because every address of their target is refused (see `target`).
    pub(super) refused: Counter,
    /// Wakes that waited for a slot: as many wakes as are allowed were in flight, to all hosts or
    /// to theirs (a wake joining its session's parked one is not counted again).
    pub(super) parked: Counter,
    /// Wakes dropped because as many sessions' wakes as are allowed were parked already.
    pub(super) dropped: Counter,
}

/// Makes webhook wake targets: plain `http://` URLs (this build has no TLS client), to public
/// addresses and to those `wake_allow` lists.
#[derive(Debug, Clone, Default)]
pub struct Webhooks {
    policy: target::Policy,
    counts: WakeCounts,
    /// Started at the first wake.
    pool: Arc<OnceLock<pool::Pool>>,
}

impl Webhooks {
    /// Webhooks that may also reach the hosts, addresses and CIDR networks of `wake_allow`;
    /// the error names an entry that is none of them.
    pub fn allowing(wake_allow: &[String]) -> Result<Self, String> {
        Ok(Webhooks {
            policy: target::Policy::new(wake_allow)?,
            ..Webhooks::default()
        })
    }

    /// Counts what becomes of the wakes in `counts` (instead of counts of their own).
    pub fn counted(mut self, counts: WakeCounts) -> Self {
        self.counts = counts;
        self
    }
}

impl WakeFactory for Webhooks {
    /// Refuses a URL that is not plain `http://`, holds userinfo, control characters or
    /// spaces, or names an address (or a metadata host) wakes may not reach; a host name is
    /// judged by what it resolves to when a wake is delivered.
    fn validate(&self, url: &str) -> Result<(), String> {
        let parsed = target::WakeUrl::parse(url)?;
        match self.policy.refuses_url(&parsed) {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    fn wake_for(&self, session_id: &str, url: &str) -> Arc<dyn Wake> {
        Arc::new(Webhook {
            hooks: self.clone(),
            url: url.to_string(),
            session_id: session_id.to_string(),
        })
    }
}

/// One session's webhook.
struct Webhook {
    hooks: Webhooks,
    url: String,
    session_id: String,
}

impl Wake for Webhook {
    fn wake(&self, event: WakeEvent) {
        let hooks = &self.hooks;
        let pool = hooks
            .pool
            .get_or_init(|| pool::Pool::start(hooks.policy.clone(), hooks.counts.clone()));
        let body = serde_json::json!({"session_id": event.session_id, "ready": event.ready}).to_string();
        pool.submit(&self.session_id, &self.url, body);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_urls_with_a_host_are_accepted() {
        let w = Webhooks::default();
        assert!(w.validate("http://93.184.215.14:9000/wake").is_ok());
        assert!(w.validate("https://example.test/").unwrap_err().contains("https"));
        assert!(w.validate("ftp://x").is_err());
        assert!(w.validate("http:///path").unwrap_err().contains("no host"));
        assert!(w.validate("http://10.0.0.1/").unwrap_err().contains("wake_allow"));
        assert!(
            w.validate("http://hooks.example/").is_ok(),
            "a name is judged at delivery"
        );
        let allowing = Webhooks::allowing(&["10.0.0.0/8".into()]).unwrap();
        assert!(allowing.validate("http://10.0.0.1/").is_ok());
    }
}
