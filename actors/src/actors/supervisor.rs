//! The root Supervisor: opens the engine, recovers every session from the ledger, and owns the
//! map from session id to its [`SessionOwner`].
//!
//! It does not route anything itself; it creates owners (recovered or new), binds session
//! settings, and answers where an owner is.

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;

use super::coalescer::Coalescer;
use super::owner::{split_snapshot, Configure, Engine, OwnerError, SessionInfo, SessionOwner};
use crate::ledger::{Ledger, LedgerError};
use crate::model::{now_ms, DeadLetterRow, SessionRow, DEFAULT_MAX_CONCURRENT_CHILDREN, DEFAULT_MAX_DELIVERY_ATTEMPTS};
use crate::runner::RunnerFactory;
use crate::wake::Wake;

/// Longest session id accepted, in bytes.
pub const MAX_SESSION_ID_BYTES: usize = 256;

/// Create a session, or update one.
#[derive(Message)]
#[rtype(result = "Result<(Addr<SessionOwner>, SessionInfo), OwnerError>")]
pub struct OpenSession {
    /// The session id (1 to 256 bytes, no control characters).
    pub session_id: String,
    /// Capacity (default 8 for a new session).
    pub max_concurrent_children: Option<u32>,
    /// Dead-letter limit (default 8 for a new session).
    pub max_delivery_attempts: Option<u32>,
    /// A wake target: binding one makes the session wake-capable.
    pub wake: Option<Arc<dyn Wake>>,
}

impl std::fmt::Debug for OpenSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenSession")
            .field("session_id", &self.session_id)
            .field("wake", &self.wake.is_some())
            .finish()
    }
}

/// Where a session's owner is, if the session exists.
#[derive(Debug, Message)]
#[rtype(result = "Option<Addr<SessionOwner>>")]
pub struct FindOwner(pub String);

/// Every dead letter.
#[derive(Debug, Message)]
#[rtype(result = "Result<Vec<DeadLetterRow>, OwnerError>")]
pub struct DeadLetters;

/// The root of the actor tree.
pub struct Supervisor {
    engine: Engine,
    owners: HashMap<String, Addr<SessionOwner>>,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("sessions", &self.owners.len())
            .finish()
    }
}

impl Supervisor {
    /// Opens the engine on `ledger`: recovers every session (I6), writes and flushes what
    /// recovery resolved, and starts the actors. Must run inside an actix system.
    pub fn start(ledger: Arc<dyn Ledger>, factory: Arc<dyn RunnerFactory>) -> Result<Addr<Supervisor>, LedgerError> {
        let mut snapshot = ledger.load()?;
        let sessions = std::mem::take(&mut snapshot.sessions);
        let claim_ids: Vec<String> = snapshot.claims.iter().map(|c| c.claim_id.clone()).collect();
        let mut parts = split_snapshot(snapshot);
        let coalescer = Coalescer::new(ledger.clone()).start();
        let engine = Engine {
            ledger: ledger.clone(),
            factory,
            coalescer,
        };
        let mut recovered = Vec::new();
        let mut changed = Vec::new();
        for session in sessions {
            let part = parts.remove(&session.session_id).unwrap_or_default();
            let (owner, rows) = SessionOwner::recover(engine.clone(), session, &part);
            changed.extend(rows);
            recovered.push(owner);
        }
        if !changed.is_empty() || !claim_ids.is_empty() {
            tracing::info!(
                children = changed.len(),
                claims = claim_ids.len(),
                "recovery resolved rows from an earlier process"
            );
            ledger.put_children(&changed)?;
            ledger.remove_claims(&claim_ids)?;
            ledger.flush()?;
        }
        let owners = recovered
            .into_iter()
            .map(|o| (o.session_id().to_string(), o.start()))
            .collect();
        Ok(Supervisor { engine, owners }.start())
    }
}

/// Checks a session id: 1 to 256 bytes, no control characters.
pub fn validate_session_id(id: &str) -> Result<(), OwnerError> {
    let bad = |m: &str| {
        Err(OwnerError::Invalid {
            field: "session_id".into(),
            message: m.into(),
        })
    };
    if id.is_empty() {
        return bad("must not be empty");
    }
    if id.len() > MAX_SESSION_ID_BYTES {
        return bad("must be at most 256 bytes");
    }
    if id.chars().any(char::is_control) {
        return bad("must not contain control characters");
    }
    Ok(())
}

impl Actor for Supervisor {
    type Context = Context<Self>;
}

impl Handler<OpenSession> for Supervisor {
    type Result = ResponseFuture<Result<(Addr<SessionOwner>, SessionInfo), OwnerError>>;

    fn handle(&mut self, msg: OpenSession, _: &mut Context<Self>) -> Self::Result {
        if let Err(e) = validate_session_id(&msg.session_id) {
            return Box::pin(async { Err(e) });
        }
        if msg.max_concurrent_children == Some(0) || msg.max_delivery_attempts == Some(0) {
            let field = if msg.max_concurrent_children == Some(0) {
                "max_concurrent_children"
            } else {
                "max_delivery_attempts"
            };
            return Box::pin(async move {
                Err(OwnerError::Invalid {
                    field: field.into(),
                    message: "must be at least 1".into(),
                })
            });
        }
        let addr = match self.owners.get(&msg.session_id) {
            Some(addr) => addr.clone(),
            None => {
                let row = SessionRow {
                    session_id: msg.session_id.clone(),
                    max_concurrent_children: msg.max_concurrent_children.unwrap_or(DEFAULT_MAX_CONCURRENT_CHILDREN),
                    max_delivery_attempts: msg.max_delivery_attempts.unwrap_or(DEFAULT_MAX_DELIVERY_ATTEMPTS),
                    next_set: 1,
                    created_at_ms: now_ms(),
                };
                if let Err(e) = self
                    .engine
                    .ledger
                    .put_session(&row)
                    .and_then(|_| self.engine.ledger.flush().map(|_| ()))
                {
                    return Box::pin(async move { Err(e.into()) });
                }
                let addr = SessionOwner::new(self.engine.clone(), row).start();
                self.owners.insert(msg.session_id.clone(), addr.clone());
                addr
            }
        };
        let configure = Configure {
            max_concurrent_children: msg.max_concurrent_children,
            max_delivery_attempts: msg.max_delivery_attempts,
            wake: msg.wake,
        };
        Box::pin(async move {
            let info = addr.send(configure).await.map_err(|_| OwnerError::Stopped)??;
            Ok((addr, info))
        })
    }
}

impl Handler<FindOwner> for Supervisor {
    type Result = Option<Addr<SessionOwner>>;

    fn handle(&mut self, FindOwner(id): FindOwner, _: &mut Context<Self>) -> Self::Result {
        self.owners.get(&id).cloned()
    }
}

impl Handler<DeadLetters> for Supervisor {
    type Result = Result<Vec<DeadLetterRow>, OwnerError>;

    fn handle(&mut self, _: DeadLetters, _: &mut Context<Self>) -> Self::Result {
        Ok(self.engine.ledger.dead_letters()?)
    }
}
