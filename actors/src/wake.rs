//! Wake targets: how a session is told that results are waiting (I7).
//!
//! The owner decides *when* (see [`crate::routing::WakeState`]); a [`Wake`] decides *how*: an
//! embedded callback today, a webhook or an event stream as further implementations. A session
//! without a wake target is not wake-capable, and its background calls run synchronously.

use std::fmt;

/// What a wake says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WakeEvent {
    /// The session to wake.
    pub session_id: String,
    /// Items ready at the moment of the wake.
    pub ready: usize,
}

/// Something that can wake a parent. Called off the owner's handler; must not block long.
pub trait Wake: Send + Sync + 'static {
    /// Wakes the parent.
    fn wake(&self, event: WakeEvent);
}

impl<F: Fn(WakeEvent) + Send + Sync + 'static> Wake for F {
    fn wake(&self, event: WakeEvent) {
        self(event)
    }
}

/// Makes wake targets from stored webhook URLs: when a session binds a `wake_url`, and again
/// for every stored one when the engine opens, so a restarted engine still wakes its sessions.
pub trait WakeFactory: Send + Sync + 'static {
    /// Checks a URL; the error says what is wrong with it.
    fn validate(&self, url: &str) -> Result<(), String>;
    /// The wake target of `session_id` for `url` (already validated).
    fn wake_for(&self, session_id: &str, url: &str) -> std::sync::Arc<dyn Wake>;
}

/// A named wake target, for debug output.
pub(crate) struct WakeTarget(pub(crate) std::sync::Arc<dyn Wake>);

impl fmt::Debug for WakeTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WakeTarget")
    }
}
