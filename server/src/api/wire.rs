//! The enumerations of the HTTP contract (a session's turn, a call's mode, a child's status,
//! an item's kind, a release's reason, a worker's outcome, where a result is on its way), and
//! the reading of whole numbers. They are the contract's own: the engine's types convert into
//! them, so the engine can change without changing what clients read.
//! Its number fields are read by [`whole`]: `20416.0` is the integer 20416, as JSON Schema
//! has it.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A session's turn state: woken only while `idle`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Turn {
    /// Between turns.
    Idle,
    /// In a turn.
    Busy,
}

impl Turn {
    /// Its name on the wire, for text that shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Turn::Idle => "idle",
            Turn::Busy => "busy",
        }
    }
}

impl From<brood::Turn> for Turn {
    fn from(t: brood::Turn) -> Self {
        match t {
            brood::Turn::Idle => Turn::Idle,
            brood::Turn::Busy => Turn::Busy,
        }
    }
}

impl From<Turn> for brood::Turn {
    fn from(t: Turn) -> Self {
        match t {
            Turn::Idle => brood::Turn::Idle,
            Turn::Busy => brood::Turn::Busy,
        }
    }
}

/// How a call runs: in the `background` (results at boundaries) or `sync` (inline).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Results at the session's boundaries.
    #[default]
    Background,
    /// Results in the reply.
    Sync,
}

impl Mode {
    /// Its name on the wire, for text that shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Background => "background",
            Mode::Sync => "sync",
        }
    }
}

impl From<brood::Mode> for Mode {
    fn from(m: brood::Mode) -> Self {
        match m {
            brood::Mode::Background => Mode::Background,
            brood::Mode::Sync => Mode::Sync,
        }
    }
}

impl From<Mode> for brood::Mode {
    fn from(m: Mode) -> Self {
        match m {
            Mode::Background => brood::Mode::Background,
            Mode::Sync => brood::Mode::Sync,
        }
    }
}

/// A child's status: `queued → running →` one of the ended ones; `unknown` when recovery found
/// it unfinished and not safe to run again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChildStatus {
    /// Waiting for capacity.
    Queued,
    /// Its runner runs.
    Running,
    /// Ended well.
    Succeeded,
    /// Ended with an error.
    Failed,
    /// Ran past its task's timeout.
    TimedOut,
    /// Stalled (no sign of life within its `stall_ms`), or its runner was stopped.
    Interrupted,
    /// Cancelled before it ended.
    Cancelled,
    /// Unfinished at a restart and not safe to run again.
    Unknown,
}

impl ChildStatus {
    /// Its name on the wire, for text that shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            ChildStatus::Queued => "queued",
            ChildStatus::Running => "running",
            ChildStatus::Succeeded => "succeeded",
            ChildStatus::Failed => "failed",
            ChildStatus::TimedOut => "timed_out",
            ChildStatus::Interrupted => "interrupted",
            ChildStatus::Cancelled => "cancelled",
            ChildStatus::Unknown => "unknown",
        }
    }
}

impl From<brood::ChildStatus> for ChildStatus {
    fn from(s: brood::ChildStatus) -> Self {
        use brood::ChildStatus as S;
        match s {
            S::Queued => ChildStatus::Queued,
            S::Running => ChildStatus::Running,
            S::Succeeded => ChildStatus::Succeeded,
            S::Failed => ChildStatus::Failed,
            S::TimedOut => ChildStatus::TimedOut,
            S::Interrupted => ChildStatus::Interrupted,
            S::Cancelled => ChildStatus::Cancelled,
            S::Unknown => ChildStatus::Unknown,
        }
    }
}

/// What a ready item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ItemKind {
    /// A child's result, its unit complete.
    Result,
    /// A child that failed while its unit is incomplete.
    FailureNotice,
}

impl ItemKind {
    /// Its name on the wire, for text that shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            ItemKind::Result => "result",
            ItemKind::FailureNotice => "failure_notice",
        }
    }
}

impl From<brood::ItemKind> for ItemKind {
    fn from(k: brood::ItemKind) -> Self {
        match k {
            brood::ItemKind::Result => ItemKind::Result,
            brood::ItemKind::FailureNotice => ItemKind::FailureNotice,
        }
    }
}

/// Why a claim is released: `busy` is not a delivery attempt, `failed` is (and backs off).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseReason {
    /// The consumer could not take the items now.
    Busy,
    /// Delivering them failed.
    Failed,
}

impl From<ReleaseReason> for brood::ReleaseReason {
    fn from(r: ReleaseReason) -> Self {
        match r {
            ReleaseReason::Busy => brood::ReleaseReason::Busy,
            ReleaseReason::Failed => brood::ReleaseReason::Failed,
        }
    }
}

/// How an outside worker says its child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Ended {
    /// The work is done; `summary` says what came of it.
    Succeeded,
    /// The work failed; `error` says why.
    Failed,
}

/// Where a child's result is on its way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// Ready, claimed or waiting for its unit.
    Undelivered,
    /// Acked, or returned inline.
    Delivered,
    /// Out of delivery attempts: on the dead-letter list.
    DeadLetter,
}

impl Delivery {
    /// Its name on the wire, for text that shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::Undelivered => "undelivered",
            Delivery::Delivered => "delivered",
            Delivery::DeadLetter => "dead_letter",
        }
    }
}

/// Which sessions a listing keeps (`GET /v1/sessions?state=…`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// Children queued or running.
    Busy,
    /// Items ready to claim.
    Ready,
    /// At least one dead letter.
    DeadLetters,
    /// A nested session (of a child that delegated in its own right).
    Nested,
}

impl SessionState {
    /// Every state, as the wire names them.
    pub const ALL: [SessionState; 4] = [
        SessionState::Busy,
        SessionState::Ready,
        SessionState::DeadLetters,
        SessionState::Nested,
    ];

    /// Its name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionState::Busy => "busy",
            SessionState::Ready => "ready",
            SessionState::DeadLetters => "dead_letters",
            SessionState::Nested => "nested",
        }
    }

    /// The state a query names; `None` when it names none of them.
    pub fn parse(text: &str) -> Option<SessionState> {
        SessionState::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// Whether the session `summary` is in this state.
    pub fn holds(self, summary: &super::SessionSummary) -> bool {
        let c = &summary.counts;
        match self {
            SessionState::Busy => c.queued + c.running > 0,
            SessionState::Ready => c.ready > 0,
            SessionState::DeadLetters => summary.dead_letters > 0,
            SessionState::Nested => summary.parent_child_id.is_some(),
        }
    }
}

pub use brood::whole::{whole, whole_opt};
