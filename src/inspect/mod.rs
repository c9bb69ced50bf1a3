//! `brood inspect`: what a brood holds — sessions, their calls, units, children and the dead
//! letters — read from a running server over HTTP ([`from_server`]) or from a data folder no
//! process holds ([`from_data_dir`]), as one [`Inspection`] whichever the source, so a script
//! can read either. [`table`] renders it for people.
//!
//! This module owns the inspection's shape and its errors. It does not decide anything about
//! the data: a server's answers are taken as they are, and a data folder is read with the
//! ledger's own [`load`](brood_actors::ledger::Ledger::load) and recovery's own
//! [`plan`](brood_actors::recovery::plan).
//!
//! Both list every call stored (delivered ones too, until retention removes them). Where the
//! two sources differ (both are what the source knows):
//! - A data folder's `turn`, `wake_capable` and `counts` are what a server opening the folder
//!   would answer at its start (idle; wake-capable only with a stored `wake_url`; claims that
//!   were live are returned), while its children's statuses are as recorded.
//! - The `quarantined` rows are known from a data folder only; a server answers `null`.
//! - Live claims are known from a server only: a server opening a data folder returns them.

mod data_dir;
mod server;
pub mod table;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use self::data_dir::{copy_tree, from_data_dir};
pub use self::server::{from_server, ServerSource};
use brood::{ChildStatus, LedgerError, Mode, Turn};
use brood_server::api::Counts;

/// Everything one inspection found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inspection {
    /// Where it was read: `server` or `data_dir`.
    pub source: Source,
    /// The sessions, in ascending id order.
    pub sessions: Vec<SessionView>,
    /// Items that ran out of delivery attempts (of the inspected sessions).
    pub dead_letters: Vec<DeadLetterView>,
    /// Rows the ledger could not read back (data folder only).
    pub quarantined: Option<Vec<QuarantinedView>>,
}

/// Where an inspection was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// A running server, over HTTP.
    Server,
    /// A data folder no process held.
    DataDir,
}

/// A session, shaped as `GET /v1/sessions/{id}` answers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionView {
    /// The session id.
    pub session_id: String,
    /// `idle` or `busy`.
    pub turn: Turn,
    /// Whether the session may be woken.
    pub wake_capable: bool,
    /// Its counts.
    pub counts: Counts,
    /// The child whose nested session this is; `null` for a top-level session.
    #[serde(default)]
    pub parent_child_id: Option<String>,
    /// Its calls, by set.
    pub calls: Vec<CallView>,
    /// Its live claims (a data folder has none: a server opening it returns them).
    #[serde(default)]
    pub claims: Vec<ClaimView>,
    /// A server's cursor to the next page of calls (read while paging, never shown).
    #[serde(default, skip_serializing)]
    pub calls_next: Option<String>,
}

/// A live claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimView {
    /// Its id.
    pub claim_id: String,
    /// Who made it.
    pub consumer: String,
    /// How many items it holds.
    pub items: usize,
    /// When its lease runs out.
    pub lease_expires_at: u64,
}

/// A call of a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallView {
    /// `deleg_<hex>`.
    pub call_id: String,
    /// Its ordinal in its session.
    pub set: u64,
    /// The mode it runs in.
    pub mode: Mode,
    /// When it was made.
    #[serde(default)]
    pub created_at: Option<u64>,
    /// Its completion units.
    pub units: Vec<UnitView>,
    /// Its children, by task index.
    pub children: Vec<ChildView>,
}

/// A completion unit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitView {
    /// `<call_id>-<k>`.
    pub unit_id: String,
    /// Its group, when it is one.
    pub group: Option<String>,
    /// The task indexes of its members.
    pub tasks: Vec<u32>,
}

/// A child.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildView {
    /// `<call_id>.<index>`.
    pub child_id: String,
    /// Its task's index in the call.
    pub task_index: u32,
    /// Where it is in its life.
    pub status: ChildStatus,
    /// When its runner started.
    pub started_at: Option<u64>,
    /// When it ended.
    pub finished_at: Option<u64>,
    /// Where its result is on its way to the parent.
    #[serde(default)]
    pub delivery: Option<Delivery>,
    /// The delivery attempt its result is at (1 before any failed one).
    #[serde(default)]
    pub delivery_attempt: Option<u32>,
    /// The first line of its summary (or, without one, of its error), cut at 120 characters.
    #[serde(default)]
    pub summary: Option<String>,
}

/// Where a child's result is on its way to the parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// Recorded, not acknowledged yet.
    Undelivered,
    /// Acknowledged: final.
    Delivered,
    /// Out of delivery attempts: in the dead-letter list.
    DeadLetter,
}

impl Delivery {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::Undelivered => "undelivered",
            Delivery::Delivered => "delivered",
            Delivery::DeadLetter => "dead_letter",
        }
    }
}

/// A dead letter, shaped as `GET /v1/dead-letters` answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetterView {
    /// The child it came from.
    pub child_id: String,
    /// Its session.
    pub session_id: String,
    /// Its call.
    pub call_id: String,
    /// `result` or `failure_notice`.
    pub kind: brood::ItemKind,
    /// Why it was given up.
    pub reason: String,
    /// Delivery attempts made.
    pub attempts: u32,
    /// When it was given up.
    pub dead_at: u64,
}

/// A stored row the ledger could not use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuarantinedView {
    /// The tree it was in.
    pub tree: String,
    /// Its key, lossily as text.
    pub key: String,
    /// Why it could not be used.
    pub reason: String,
    /// When it was moved aside; `null` for a row the next open will move aside.
    pub quarantined_at: Option<u64>,
}

impl Inspection {
    /// The inspection of what a source found, in order (sessions by id, dead letters by
    /// session and child), of every session or only of `only` (and its dead letters).
    fn assemble(
        source: Source,
        mut sessions: Vec<SessionView>,
        mut dead_letters: Vec<DeadLetterView>,
        quarantined: Option<Vec<QuarantinedView>>,
        only: Option<&str>,
    ) -> Result<Inspection, InspectError> {
        if let Some(id) = only {
            sessions.retain(|s| s.session_id == id);
            dead_letters.retain(|d| d.session_id == id);
            if sessions.is_empty() {
                return Err(InspectError::UnknownSession(id.to_string()));
            }
        }
        sessions.sort_by(|a, b| a.session_id.cmp(&b.session_id));
        dead_letters.sort_by(|a, b| (&a.session_id, &a.child_id).cmp(&(&b.session_id, &b.child_id)));
        Ok(Inspection {
            source,
            sessions,
            dead_letters,
            quarantined,
        })
    }
}

/// An inspection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The data folder does not exist (and was not created).
    #[error("the data dir {} does not exist (nothing was created); give --data-dir the folder `brood serve` uses", .0.display())]
    NoDataDir(PathBuf),
    /// The folder exists but holds no ledger.
    #[error("the data dir {} holds no brood ledger (no `db` file in it)", .0.display())]
    NotALedger(PathBuf),
    /// A running process (a server) holds the folder's lock.
    #[error("the data dir {} is in use by another process; use --server URL", .0.display())]
    InUse(PathBuf),
    /// Reading or copying the folder failed.
    #[error("{context}")]
    Io {
        /// What inspect was doing.
        context: String,
        /// What the file system said.
        #[source]
        source: std::io::Error,
    },
    /// The ledger could not be read.
    #[error("reading the ledger")]
    Ledger(#[from] LedgerError),
    /// The server could not be reached (or its answer not read).
    #[error("the server at {url} could not be reached")]
    Unreachable {
        /// The URL asked.
        url: String,
        /// What the HTTP client said.
        #[source]
        source: Box<ureq::Error>,
    },
    /// The server answered with an error.
    #[error("the server answered {status} to {url}: {code}: {message}")]
    Server {
        /// The URL asked.
        url: String,
        /// The HTTP status.
        status: u16,
        /// API.md's error code (empty when the body was not API.md's error shape).
        code: String,
        /// What it said.
        message: String,
    },
    /// The server's answer was not the JSON API.md promises.
    #[error("the server's answer to {url} is not what API.md describes")]
    BadReply {
        /// The URL asked.
        url: String,
        /// What the JSON decoder said.
        #[source]
        source: serde_json::Error,
    },
    /// `--session` names a session the source does not hold.
    #[error("no session `{0}` here")]
    UnknownSession(String),
}
