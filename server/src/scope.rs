//! What a request's key may touch. The admin key (`api_key`), the peer credential and a
//! keyless server reach everything; a scoped key (`scoped_keys`) reaches only the sessions
//! whose id starts with its prefix, and their calls, units, children, claims and dead letters.
//!
//! The key check (`require_key`) puts an `Access` on every `/v1` request; each
//! handler asks it before it touches anything. A session named by the request is judged by its
//! id (a 403 that says so: it tells nothing about whether the session exists), or, for a nested
//! session (whose id is its parent child's), by the session its parent call was made in; a call,
//! unit, child or claim of a session out of reach is answered as an unknown one (404), so ids of
//! other tenants are neither confirmed nor refused. A request a process forwards to the holder
//! of its session was judged where it came in, and carries its scope (`SCOPE`) beside the
//! peer credential, so the holder judges it again.

use std::future::{ready, Ready};

use actix_web::http::StatusCode;
use actix_web::{FromRequest, HttpMessage as _, HttpRequest};

use super::api::ApiError;
use brood::Brood;

/// The header a forwarded request carries the prefix of its scoped key in (only believed
/// beside a valid peer credential).
pub(super) const SCOPE: &str = "x-brood-scope";

/// What one request may touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Access {
    /// Every session.
    All,
    /// The sessions whose id starts with this prefix.
    Prefix(String),
}

/// How every child id, so every nested session's id, starts.
const CHILD_ID_START: &str = "deleg_";

/// The most levels of nesting followed up from a session to the session it was delegated from.
const MAX_NESTING: usize = 64;

impl Access {
    /// Whether session `id` is within reach: a top-level session whose id starts with the
    /// prefix, or a nested session (its id is its child's) of a session within reach. A nested
    /// session is judged by the session it came from, never by its own id, so no prefix reaches
    /// another tenant's nested sessions by the shape of their ids.
    pub(super) async fn covers(&self, brood: &Brood, id: &str) -> Result<bool, ApiError> {
        let Access::Prefix(prefix) = self else {
            return Ok(true);
        };
        let mut id = id.to_string();
        for _ in 0..=MAX_NESTING {
            let Some((call_id, _)) = brood_actors::model::parse_child_id(&id) else {
                return Ok(id.starts_with(prefix.as_str()));
            };
            // The nest row, kept while the session is; else the call's own row.
            let parent = match brood.nest(&id) {
                Some(nest) => Some(nest.parent_session_id),
                None => brood.call_session(call_id).await?,
            };
            match parent {
                Some(parent) => id = parent,
                None => return Ok(false),
            }
        }
        Ok(false)
    }

    /// Session `id`, named by the request itself: a 403 when it is out of reach.
    pub(super) async fn session(&self, brood: &Brood, id: &str) -> Result<(), ApiError> {
        match self {
            Access::Prefix(p) if !self.covers(brood, id).await? => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "out_of_scope",
                format!(
                    "this key reaches only the sessions whose id starts with `{p}` (and the sessions nested in them)"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// A thing (call, unit, child, claim) of session `of`, when it is known: out of reach it is
    /// answered as `unknown` answers an id nobody knows.
    pub(super) async fn owned(
        &self,
        brood: &Brood,
        of: Option<&str>,
        unknown: impl FnOnce() -> ApiError,
    ) -> Result<(), ApiError> {
        match of {
            Some(session) if !self.covers(brood, session).await? => Err(unknown()),
            _ => Ok(()),
        }
    }

    /// The prefix, for a scoped key.
    pub(super) fn prefix(&self) -> Option<&str> {
        match self {
            Access::All => None,
            Access::Prefix(p) => Some(p),
        }
    }

    /// Whether this reaches everything.
    pub(super) fn is_all(&self) -> bool {
        matches!(self, Access::All)
    }
}

/// Read from the request, where the key check put it; a request it never saw reaches nothing.
impl FromRequest for Access {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        ready(req.extensions().get::<Access>().cloned().ok_or_else(|| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the request was not checked for a key; it is refused",
            )
        }))
    }
}

/// A key limited to a prefix, as the configuration gives it (`<prefix>=<key>`).
#[derive(Clone, PartialEq, Eq)]
pub struct ScopedKey {
    /// The start of every session id the key reaches.
    pub prefix: String,
    /// The key.
    pub key: String,
}

/// Shows the prefix, never the key.
impl std::fmt::Debug for ScopedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScopedKey")
            .field("prefix", &self.prefix)
            .field("key", &"(set)")
            .finish()
    }
}

impl ScopedKey {
    /// Parses `<prefix>=<key>`: the prefix is what comes before the first `=`, 1 to 128 bytes
    /// of what a session id may hold; the key is the rest, not empty.
    pub fn parse(text: &str) -> Result<Self, String> {
        let Some((prefix, key)) = text.split_once('=') else {
            return Err(format!("{} is not `<prefix>=<key>`", redact(text)));
        };
        if prefix.is_empty() || prefix.len() > 128 {
            return Err("a scoped key's prefix must be 1 to 128 bytes (the admin key reaches everything)".into());
        }
        if let Some(c) = prefix
            .chars()
            .find(|c| !c.is_ascii_graphic() || matches!(c, '/' | '?' | '#' | '%'))
        {
            return Err(format!(
                "the prefix {prefix:?} holds {c:?}, which no session id may hold"
            ));
        }
        if CHILD_ID_START.starts_with(prefix) || prefix.starts_with(CHILD_ID_START) {
            return Err(format!(
                "the prefix {prefix:?} overlaps `{CHILD_ID_START}`, the start of brood's own child ids (the ids of nested sessions)"
            ));
        }
        if key.trim().is_empty() {
            return Err(format!("the key of prefix {prefix:?} is empty"));
        }
        Ok(ScopedKey {
            prefix: prefix.to_string(),
            key: key.to_string(),
        })
    }
}

/// An entry that is not `<prefix>=<key>`, shown without giving away what may be a key.
fn redact(text: &str) -> String {
    format!("an entry of {} bytes", text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scoped_key_is_a_prefix_and_a_key() {
        assert_eq!(
            ScopedKey::parse("acme-=k=1").unwrap(),
            ScopedKey {
                prefix: "acme-".into(),
                key: "k=1".into()
            }
        );
        for bad in [
            "=key",
            "ac me=key",
            "a/b=key",
            "acme-= ",
            "d=key",
            "deleg_=key",
            "deleg_1=key",
        ] {
            assert!(ScopedKey::parse(bad).is_err(), "{bad}");
        }
        // Without `=` the whole text may be a key: it is not echoed.
        let e = ScopedKey::parse("acme-secret").unwrap_err();
        assert!(!e.contains("secret"), "{e}");
    }
}
