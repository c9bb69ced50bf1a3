//! The one error type of the embedding API, [`BroodError`], and [`DelegateError`], which hands a
//! refused call's request back to its caller. Every variant says what went wrong; causes are
//! kept as `#[source]` chains, so no caller needs to read an error's text to tell them apart.

use std::sync::Arc;

use crate::ledger::LedgerError;
use crate::model::DelegateRequest;
use crate::routing::ClaimError;

/// What went wrong. A refused request changed nothing.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BroodError {
    /// The request is malformed: `field` names what, `message` says how to fix it.
    #[error("invalid `{field}`: {message}")]
    Invalid {
        /// The offending field, as a path (`tasks[2].runner.kind`).
        field: String,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// A piece of the embedder's code (a runner factory's `validate`, a wake callback)
    /// panicked while serving this request; the request was refused and nothing changed.
    #[error("{hook} panicked: {message}; the request was refused and nothing changed")]
    EmbedderPanicked {
        /// Which hook: `RunnerFactory::validate`, …
        hook: &'static str,
        /// The panic message.
        message: String,
    },
    /// No session with that id was opened.
    #[error("unknown session `{0}`; open it first")]
    UnknownSession(String),
    /// No call, unit or child with that id is known (in memory or in the ledger).
    #[error("unknown {kind} `{id}`")]
    UnknownTarget {
        /// `call`, `unit` or `child`.
        kind: &'static str,
        /// The id asked for.
        id: String,
    },
    /// A call in this session would be nested deeper than the engine allows.
    #[error("a call in session `{session}` would be at depth {depth}, deeper than max_depth {max}; delegate from a shallower session, or raise max_depth")]
    MaxDepthExceeded {
        /// The (nested) session.
        session: String,
        /// The depth the call would have.
        depth: u32,
        /// The engine's `max_depth`.
        max: u32,
    },
    /// A nested session's child ended: it delegates no more (its calls were cancelled as it
    /// ended; what they had finished stays claimable).
    #[error(
        "session `{session}` is the session of child `{session}`, which has ended; an ended child delegates no more"
    )]
    ParentEnded {
        /// The nested session (the child's id).
        session: String,
    },
    /// A delegate named an idempotency key an earlier call of the session was made with, but
    /// asked for something else: nothing was changed.
    #[error("idempotency key {key:?} was used for call `{call_id}` of another request (other tasks, mode or completions); use a new key for a new call")]
    IdempotencyConflict {
        /// The key.
        key: String,
        /// The call made with it.
        call_id: String,
    },
    /// A sync delegate named the idempotency key of a sync call that another request is still
    /// waiting for: nothing was changed; retry once that request has its answer.
    #[error("the sync call `{call_id}` made with this idempotency key is still running for another request that waits for it; retry once it has its answer")]
    IdempotencyInProgress {
        /// The call made with the key.
        call_id: String,
    },
    /// The engine holds as many live children (queued or running, over every session) as its
    /// `max_live_children` allows, or this call's would take it past them. Nothing was changed;
    /// retry once children have ended.
    #[error("{live} children are live (queued or running, over every session) and a call of {asked} more would pass max_live_children ({max}); retry once some have ended, or raise max_live_children")]
    ServerFull {
        /// Children live when the call came.
        live: usize,
        /// The call's tasks.
        asked: usize,
        /// The engine's `max_live_children`.
        max: usize,
    },
    /// No such claim was made.
    #[error("unknown claim `{0}`")]
    UnknownClaim(String),
    /// The claim ended (lease expiry or release) before this ack or release; its items were
    /// returned to the ready set and may be claimed by someone else.
    #[error("claim `{0}` was lost: its lease expired or it was released, and its items went back to the ready set")]
    ClaimLost(String),
    /// The claim was acknowledged already and cannot be released.
    #[error("claim `{0}` was already acknowledged")]
    ClaimAcked(String),
    /// The ledger failed; nothing was reported as done.
    #[error("the ledger failed, so nothing was reported as done")]
    Ledger(#[source] Arc<LedgerError>),
    /// The session's owner failed while handling the request and was restarted from the
    /// ledger; the request may or may not have taken effect. `call_id` names the call when a
    /// delegate had been accepted (its results then come at boundaries under that id).
    #[error("the owner of session `{session}` failed while handling the request and was restarted from the ledger{}; retry", accepted(.call_id))]
    Interrupted {
        /// The session.
        session: String,
        /// The call that had been accepted, if any.
        call_id: Option<String>,
    },
    /// The session's owner kept failing and its supervisor gave it up.
    #[error("session `{session}` failed and is no longer served: {reason}")]
    SessionFailed {
        /// The session.
        session: String,
        /// The last failure.
        reason: String,
    },
    /// The engine is not running (shut down, or it failed to start).
    #[error("the brood engine is not running")]
    Stopped,
    /// Another process sharing the ledger serves this session (it holds the session's tenure):
    /// send the request to `address`. Nothing was changed here.
    #[error("session `{session}` is served by another process, at {address}; send the request there")]
    Moved {
        /// The session.
        session: String,
        /// Where its holder takes requests.
        address: String,
    },
    /// This process shares the ledger and does not serve the session right now: its tenure could
    /// not be renewed in time (the database is slow or out of reach, or the process was paused),
    /// or another process took it over while the request was handled. A request refused before
    /// it was decided changed nothing; one refused at its write may not have taken effect.
    /// Retry: the retry reaches whoever holds the session then. Its code is `lease_lapsed`
    /// (API.md calls a tenure a session lease).
    #[error("session `{session}` is not served here right now (this process's tenure of it lapsed, or it moved to another process); retry")]
    TenureLapsed {
        /// The session.
        session: String,
    },
}

fn accepted(call_id: &Option<String>) -> String {
    match call_id {
        Some(c) => format!(" (call {c} had been accepted; its results come at boundaries)"),
        None => String::new(),
    }
}

impl BroodError {
    /// The snake_case code API.md uses for this error.
    pub fn code(&self) -> &'static str {
        match self {
            BroodError::Invalid { .. } => "invalid_request",
            BroodError::EmbedderPanicked { .. } => "embedder_panicked",
            BroodError::UnknownSession(_) => "unknown_session",
            BroodError::UnknownClaim(_) => "unknown_claim",
            BroodError::UnknownTarget { kind: "call", .. } => "unknown_call",
            BroodError::UnknownTarget { kind: "unit", .. } => "unknown_unit",
            BroodError::UnknownTarget { .. } => "unknown_child",
            BroodError::MaxDepthExceeded { .. } => "max_depth_exceeded",
            BroodError::ParentEnded { .. } => "parent_ended",
            BroodError::IdempotencyConflict { .. } => "idempotency_conflict",
            BroodError::IdempotencyInProgress { .. } => "idempotency_in_progress",
            BroodError::ServerFull { .. } => "server_full",
            BroodError::ClaimLost(_) => "claim_lost",
            BroodError::ClaimAcked(_) => "claim_acked",
            BroodError::Ledger(_) => "ledger_error",
            BroodError::Interrupted { .. } => "interrupted",
            BroodError::SessionFailed { .. } => "session_failed",
            BroodError::Stopped => "stopped",
            BroodError::Moved { .. } => "session_moved",
            BroodError::TenureLapsed { .. } => "lease_lapsed",
        }
    }

    /// An invalid request.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        BroodError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl From<crate::model::RequestError> for BroodError {
    fn from(e: crate::model::RequestError) -> Self {
        match e {
            crate::model::RequestError::Invalid { field, message } => BroodError::Invalid { field, message },
            crate::model::RequestError::EmbedderPanicked { hook, message } => {
                BroodError::EmbedderPanicked { hook, message }
            }
        }
    }
}

impl From<LedgerError> for BroodError {
    fn from(e: LedgerError) -> Self {
        BroodError::Ledger(Arc::new(e))
    }
}

impl From<ClaimError> for BroodError {
    fn from(e: ClaimError) -> Self {
        match e {
            ClaimError::Lost(c) => BroodError::ClaimLost(c),
            ClaimError::Acked(c) => BroodError::ClaimAcked(c),
            ClaimError::Unknown(c) => BroodError::UnknownClaim(c),
        }
    }
}

/// A delegate that did not go through, with the request handed back (as tokio's `SendError`
/// does), so the caller can retry it or report it without having kept a copy.
#[derive(Debug, thiserror::Error)]
#[error("delegate refused: {error}")]
pub struct DelegateError {
    /// The request, as the caller gave it.
    pub request: DelegateRequest,
    /// Why it did not go through.
    #[source]
    pub error: BroodError,
}

impl From<DelegateError> for BroodError {
    fn from(e: DelegateError) -> Self {
        e.error
    }
}

impl From<actix::MailboxError> for BroodError {
    fn from(_: actix::MailboxError) -> Self {
        BroodError::Stopped
    }
}
