//! The summary of an [`Inspection`], `brood inspect`'s default view: per session its counts,
//! its calls by state, its oldest unfinished child, its first dead letters and live claims — a
//! few lines whatever the number of its calls. It only counts and picks from what the source
//! read; the whole tree is the inspection itself (`--tree`).

use serde::{Deserialize, Serialize};

use super::{Inspection, QuarantinedView, SessionView, Source};
use brood_server::api::{CallView, ChildStatus, ClaimView, Counts, DeadLetter, Delivery, Turn};

/// How many of a session's dead letters a summary lists (the oldest first).
pub const FIRST_DEAD_LETTERS: usize = 3;
/// How many of a session's live claims a summary lists.
pub const FIRST_CLAIMS: usize = 3;
/// How many quarantined rows a summary lists.
pub const FIRST_QUARANTINED: usize = 5;

/// The summary of everything one inspection found.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// Where it was read: `server` or `data_dir`.
    pub source: Source,
    /// The sessions, in ascending id order.
    pub sessions: Vec<SessionSummary>,
    /// Rows the ledger could not read back (data folder only; a server answers `null`).
    pub quarantined: Option<Listed<QuarantinedView>>,
}

/// The first few of a list, and how long the list is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Listed<T> {
    /// How many there are.
    pub total: u64,
    /// The first of them.
    pub first: Vec<T>,
}

impl<T: Clone> Listed<T> {
    fn of(all: &[T], first: usize) -> Self {
        Listed {
            total: all.len() as u64,
            first: all.iter().take(first).cloned().collect(),
        }
    }
}

/// One session in a few lines.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionSummary {
    /// The session id.
    pub session_id: String,
    /// `idle` or `busy`.
    pub turn: Turn,
    /// Whether the session may be woken.
    pub wake_capable: bool,
    /// The child whose nested session this is; `null` for a top-level session.
    pub parent_child_id: Option<String>,
    /// Its counts, as the source gives them.
    pub counts: Counts,
    /// Its stored calls by state.
    pub calls: CallStates,
    /// Of its children that have not ended, the one waiting longest; `null` when none.
    pub oldest_unfinished: Option<Unfinished>,
    /// Its dead letters, the oldest first.
    pub dead_letters: Listed<DeadLetter>,
    /// Its live claims (a data folder has none).
    pub claims: Listed<ClaimView>,
}

/// A session's stored calls by how far they got. Each call is in exactly one state, the first
/// that fits: `unfinished`, `undelivered`, `dead_lettered`, `delivered`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallStates {
    /// Every stored call.
    pub total: u64,
    /// Calls with a child that has not ended (queued or running).
    pub unfinished: u64,
    /// Calls whose children all ended, with a result or notice still on its way (ready,
    /// claimed, backing off, or waiting for the rest of its unit).
    pub undelivered: u64,
    /// Calls whose children all ended and whose results are all delivered or dead letters,
    /// at least one a dead letter.
    pub dead_lettered: u64,
    /// Calls whose every result was delivered.
    pub delivered: u64,
}

/// The state of one call, as [`CallStates`] counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CallState {
    Unfinished,
    Undelivered,
    DeadLettered,
    Delivered,
}

fn state(call: &CallView) -> CallState {
    let deliveries = || call.children.iter().map(|c| c.delivery);
    if deliveries().any(|d| d.is_none()) {
        CallState::Unfinished
    } else if deliveries().any(|d| d == Some(Delivery::Undelivered)) {
        CallState::Undelivered
    } else if deliveries().any(|d| d == Some(Delivery::DeadLetter)) {
        CallState::DeadLettered
    } else {
        CallState::Delivered
    }
}

impl CallStates {
    /// The states of `calls`.
    pub fn of(calls: &[CallView]) -> Self {
        let mut states = CallStates {
            total: calls.len() as u64,
            ..CallStates::default()
        };
        for call in calls {
            let n = match state(call) {
                CallState::Unfinished => &mut states.unfinished,
                CallState::Undelivered => &mut states.undelivered,
                CallState::DeadLettered => &mut states.dead_lettered,
                CallState::Delivered => &mut states.delivered,
            };
            *n += 1;
        }
        states
    }
}

/// A child that has not ended.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Unfinished {
    /// The child.
    pub child_id: String,
    /// Its call.
    pub call_id: String,
    /// Its task's goal.
    pub goal: String,
    /// `queued` or `running`.
    pub status: ChildStatus,
    /// Since when it is so (ms since the epoch): a running child's start; a queued child's
    /// call's creation.
    pub since: u64,
}

/// Of the children of `calls` that have not ended, the one waiting longest (the earliest
/// `since`; the first in call and task order among equals).
pub fn oldest_unfinished(calls: &[CallView]) -> Option<Unfinished> {
    calls
        .iter()
        .flat_map(|call| call.children.iter().map(move |child| (call, child)))
        .filter(|(_, child)| matches!(child.status, ChildStatus::Queued | ChildStatus::Running))
        .map(|(call, child)| Unfinished {
            child_id: child.child_id.clone(),
            call_id: call.call_id.clone(),
            goal: child.goal.clone(),
            status: child.status,
            since: match child.status {
                ChildStatus::Running => child.started_at.unwrap_or(call.created_at),
                _ => call.created_at,
            },
        })
        .min_by_key(|u| u.since)
}

impl SessionSummary {
    /// The summary of `session`, whose dead letters are `dead`.
    fn of(session: &SessionView, dead: &[&DeadLetter]) -> Self {
        let mut dead: Vec<DeadLetter> = dead.iter().map(|d| (*d).clone()).collect();
        dead.sort_by(|a, b| (a.dead_at, &a.child_id).cmp(&(b.dead_at, &b.child_id)));
        SessionSummary {
            session_id: session.session_id.clone(),
            turn: session.turn,
            wake_capable: session.wake_capable,
            parent_child_id: session.parent_child_id.clone(),
            counts: session.counts,
            calls: CallStates::of(&session.calls),
            oldest_unfinished: oldest_unfinished(&session.calls),
            dead_letters: Listed::of(&dead, FIRST_DEAD_LETTERS),
            claims: Listed::of(&session.claims, FIRST_CLAIMS),
        }
    }
}

impl Summary {
    /// The summary of `inspection`.
    pub fn of(inspection: &Inspection) -> Self {
        let sessions = inspection
            .sessions
            .iter()
            .map(|s| {
                let dead: Vec<&DeadLetter> = inspection
                    .dead_letters
                    .iter()
                    .filter(|d| d.session_id == s.session_id)
                    .collect();
                SessionSummary::of(s, &dead)
            })
            .collect();
        Summary {
            source: inspection.source,
            sessions,
            quarantined: inspection
                .quarantined
                .as_ref()
                .map(|rows| Listed::of(rows, FIRST_QUARANTINED)),
        }
    }
}
