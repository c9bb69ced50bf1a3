//! `brood inspect`: what a brood holds — sessions, their calls, units, children and the dead
//! letters — read from a running server over HTTP ([`from_server`]) or from a data folder no
//! process holds ([`from_data_dir`]), as one [`Inspection`] whichever the source, so a script
//! can read either. Two views of it are shown: the [`Summary`] (the default: a few lines per
//! session, whatever the number of its calls) and the tree (`--tree`: the inspection itself,
//! a page of each session's calls, see [`Inspection::page`]). [`table`] renders both for
//! people; `--json` prints either as it is.
//!
//! This module owns the inspection's shape and its errors; the parts of that shape (calls,
//! units, children, claims, counts, dead letters) are the HTTP contract's own types in
//! [`brood_server::api`]. A server's replies are read with them, and a data folder's rows
//! become them by the conversions the server's routes use, so both give the same JSON. It
//! does not decide anything about the data: a server's answers are taken as they are, and a
//! data folder is read with the ledger's own [`load`](brood_actors::ledger::Ledger::load)
//! and recovery's own [`plan`](brood_actors::recovery::plan).
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
pub mod summary;
pub mod table;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use self::data_dir::{copy_tree, from_data_dir};
pub use self::server::{from_server, ServerSource};
pub use self::summary::{SessionSummary, Summary};
use brood::{printable, LedgerError};
use brood_server::api::{CallView, ClaimView, Counts, DeadLetter, SessionDetail, Turn};

/// Everything one inspection found.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Inspection {
    /// Where it was read: `server` or `data_dir`.
    pub source: Source,
    /// The sessions, in ascending id order.
    pub sessions: Vec<SessionView>,
    /// Items that ran out of delivery attempts (of the inspected sessions; in a page, of the
    /// calls it shows).
    pub dead_letters: Vec<DeadLetter>,
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

/// A session as `GET /v1/sessions/{id}?delivered=true` answers it ([`SessionDetail`]), with
/// every page of its calls in one list and without its settings (`addressable`,
/// `max_concurrent_children`, `max_delivery_attempts`), which an inspection does not show.
#[derive(Debug, Clone, Serialize, Deserialize)]
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
    /// Its calls, by set (in a page, the calls it shows).
    pub calls: Vec<CallView>,
    /// How many calls it stores, shown or not.
    #[serde(default)]
    pub calls_total: u64,
    /// How many of its calls come after the last one shown.
    #[serde(default)]
    pub calls_more: u64,
    /// The last call shown when more follow: `--after` it shows the next page.
    #[serde(default)]
    pub calls_next: Option<String>,
    /// Its live claims (a data folder has none: a server opening it returns them).
    #[serde(default)]
    pub claims: Vec<ClaimView>,
}

impl From<SessionDetail> for SessionView {
    /// The session of a server's reply, its calls as they are (the caller joins the pages).
    fn from(s: SessionDetail) -> Self {
        SessionView {
            calls_total: s.calls.len() as u64,
            calls_more: 0,
            calls_next: None,
            session_id: s.session_id,
            turn: s.turn,
            wake_capable: s.wake_capable,
            counts: s.counts,
            parent_child_id: s.parent_child_id,
            calls: s.calls,
            claims: s.claims,
        }
    }
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
        mut dead_letters: Vec<DeadLetter>,
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
        for s in &mut sessions {
            s.calls_total = s.calls.len() as u64;
        }
        Ok(Inspection {
            source,
            sessions,
            dead_letters,
            quarantined,
        })
    }

    /// A page of the tree: of each session, at most `limit` calls (by set), from the first or,
    /// with `after`, from the call after that one — then of the session holding that call only.
    /// Each session says how many calls follow its page and the call to continue after; the
    /// dead letters are those of the calls shown. Fails with [`InspectError::UnknownCall`]
    /// when no inspected session holds `after`.
    pub fn page(mut self, limit: usize, after: Option<&str>) -> Result<Inspection, InspectError> {
        let mut start = 0;
        if let Some(after) = after {
            let found = self.sessions.iter().enumerate().find_map(|(i, s)| {
                let at = s.calls.iter().position(|c| c.call_id == after)?;
                Some((i, at))
            });
            let Some((i, at)) = found else {
                return Err(InspectError::UnknownCall(after.to_string()));
            };
            self.sessions = vec![self.sessions.swap_remove(i)];
            start = at + 1;
        }
        for s in &mut self.sessions {
            let mut shown = s.calls.split_off(start.min(s.calls.len()));
            let more = shown.len().saturating_sub(limit);
            shown.truncate(limit);
            s.calls_more = more as u64;
            s.calls_next = match more {
                0 => None,
                _ => shown.last().map(|c| c.call_id.clone()),
            };
            s.calls = shown;
        }
        let shown: std::collections::HashSet<&str> = self
            .sessions
            .iter()
            .flat_map(|s| s.calls.iter().map(|c| c.call_id.as_str()))
            .collect();
        let dead_letters = std::mem::take(&mut self.dead_letters)
            .into_iter()
            .filter(|d| shown.contains(d.call_id.as_str()))
            .collect();
        Ok(Inspection { dead_letters, ..self })
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
    #[error("the server answered {status} to {url}: {}: {}", printable(.code), printable(.message))]
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
    #[error("no session `{}` here", printable(.0))]
    UnknownSession(String),
    /// `--after` names a call no inspected session holds.
    #[error("no call `{}` in the sessions inspected (give --after a call id that `brood inspect --tree` showed)", printable(.0))]
    UnknownCall(String),
}
