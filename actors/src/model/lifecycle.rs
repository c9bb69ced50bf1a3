//! The lifecycle's types: what a cancel names and did, a nested session's row, a redrive's
//! selection and record, and the delivery state a settled call had.

use serde::{Deserialize, Serialize};

use super::*;

/// What a cancel request names: a call, one of its units, or one child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelTarget {
    /// Every child of the call.
    Call(String),
    /// Every member of the unit.
    Unit(String),
    /// One child.
    Child(String),
}

impl CancelTarget {
    /// `call`, `unit` or `child`.
    pub fn kind(&self) -> &'static str {
        match self {
            CancelTarget::Call(_) => "call",
            CancelTarget::Unit(_) => "unit",
            CancelTarget::Child(_) => "child",
        }
    }

    /// The id it names.
    pub fn id(&self) -> &str {
        match self {
            CancelTarget::Call(id) | CancelTarget::Unit(id) | CancelTarget::Child(id) => id,
        }
    }

    /// The call it is in; none when the id is not one brood makes.
    pub fn call_id(&self) -> Option<&str> {
        match self {
            CancelTarget::Call(id) => Some(id),
            CancelTarget::Unit(id) => parse_unit_id(id).map(|(c, _)| c),
            CancelTarget::Child(id) => parse_child_id(id).map(|(c, _)| c),
        }
    }

    /// The task indexes of `call` it covers; none when it names nothing in that call.
    pub fn tasks(&self, call: &CallRow) -> Option<Vec<u32>> {
        let n = u32::try_from(call.tasks.len()).unwrap_or(u32::MAX);
        match self {
            CancelTarget::Call(_) => Some((0..n).collect()),
            CancelTarget::Child(id) => parse_child_id(id).map(|(_, i)| i).filter(|&i| i < n).map(|i| vec![i]),
            CancelTarget::Unit(id) => {
                let (_, k) = parse_unit_id(id)?;
                plan_units(&call.call_id, &call.tasks, call.independent_completions)
                    .into_iter()
                    .nth(k as usize - 1)
                    .map(|u| u.tasks)
            }
        }
    }
}

/// What a cancel request did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cancelled {
    /// The children this request cancelled (they are recorded `cancelled`), by task index.
    pub cancelled: Vec<String>,
    /// Children under the target that had already ended when the request came.
    pub already_finished: usize,
}

impl Cancelled {
    /// Adds what another cancel (of a call, or of a nested session) did to this one's.
    pub fn absorb(&mut self, other: Cancelled) {
        self.cancelled.extend(other.cancelled);
        self.already_finished += other.already_finished;
    }
}

/// A nested session: the session of a child that delegates in its own right (its id is the
/// child's id). Stored when the session is first opened, keyed by its id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NestRow {
    /// The nested session (the child's id).
    pub session_id: String,
    /// The session the child's call is in.
    pub parent_session_id: String,
    /// How deep the session is: 1 for the session of a child of a top-level call, one more for
    /// each level below. A call in it is one level deeper still.
    pub depth: u32,
    /// When it was opened.
    pub created_at_ms: u64,
}

impl NestRow {
    /// The child whose session this is (its id is the session's).
    pub fn parent_child_id(&self) -> &str {
        &self.session_id
    }
}

/// Default `max_depth`: a call in a top-level session is depth 1, a call in the session of one
/// of its children depth 2; deeper calls are refused.
pub const DEFAULT_MAX_DEPTH: u32 = 2;

/// The call and task of the child a session id names, when the session is nested: the id is a
/// child id brood makes (`deleg_<hex>.<index>`).
pub fn nest_parent(session_id: &str) -> Option<(&str, u32)> {
    parse_child_id(session_id).filter(|(call, _)| call.starts_with("deleg_") && call.len() > "deleg_".len())
}

/// Why a nested session's calls are cancelled when `child`, the child it is named after, ended.
pub fn parent_ended_reason(child: &str) -> String {
    format!("its parent child `{child}` ended")
}

/// Whether the child a nested session is named after has ended, as the ledger stores it (`call`
/// and `child` are its call's row and its own, when stored): its row is terminal, or its call
/// is stored no more (retention removed it with everything under it). A child without a row of
/// its own has not ended: it is queued, or running under its call's start row.
pub fn stored_child_ended(call: Option<&CallRow>, child: Option<&ChildRow>) -> bool {
    match child {
        Some(row) => row.status.is_terminal(),
        None => call.is_none(),
    }
}

/// The redrives of one item: each time it was put back from the dead-letter list, with what
/// its dead letter said then (the newest last; at most [`MAX_REDRIVE_HISTORY`] kept).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedriveRow {
    /// The item's dedup key.
    pub dedup_key: String,
    /// Its session.
    pub session_id: String,
    /// Redrives made, all told.
    pub count: u32,
    /// The latest ones.
    pub history: Vec<Redriven>,
}

/// One redrive of an item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Redriven {
    /// When it was redriven.
    pub at_ms: u64,
    /// Why it had been given up (its dead letter's reason).
    pub dead_reason: String,
    /// The delivery attempts it had made.
    pub attempts: u32,
    /// When it had been given up.
    pub dead_at_ms: u64,
}

/// The most redrives of one item whose details are kept.
pub const MAX_REDRIVE_HISTORY: usize = 32;

impl RedriveRow {
    /// This row with one more redrive of `dead` at `now` (a fresh row when there was none).
    pub fn after(previous: Option<RedriveRow>, dead: &DeadLetterRow, now: u64) -> RedriveRow {
        let mut row = previous.unwrap_or_else(|| RedriveRow {
            dedup_key: dead.dedup_key.clone(),
            session_id: dead.session_id.clone(),
            count: 0,
            history: Vec::new(),
        });
        row.count = row.count.saturating_add(1);
        row.history.push(Redriven {
            at_ms: now,
            dead_reason: dead.reason.clone(),
            attempts: dead.attempts,
            dead_at_ms: dead.dead_at_ms,
        });
        let over = row.history.len().saturating_sub(MAX_REDRIVE_HISTORY);
        row.history.drain(..over);
        row
    }
}

/// The children of a call that left memory settled, with their delivery state as it was then:
/// every result delivered unless it is dead (its dedup key in `dead_keys`), a failure notice
/// dead if its dead letter says so (else as its row has it). (Acks are rows of their own, not
/// folded into a child's row: a settled call's results are delivered by definition.)
pub fn fold_settled(children: &mut [ChildRow], dead_keys: &std::collections::HashSet<String>) {
    for row in children {
        let result_dead = dead_keys.contains(&dedup_key(&row.child_id, ItemKind::Result));
        row.result.dead = result_dead;
        row.result.delivered = !result_dead;
        if dead_keys.contains(&dedup_key(&row.child_id, ItemKind::FailureNotice)) {
            row.notice.dead = true;
            row.notice.delivered = false;
        }
    }
}

/// Which dead letters a redrive puts back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedriveSelect {
    /// The items of these children.
    Children(Vec<String>),
    /// Every dead letter of one session.
    Session(String),
    /// Every dead letter.
    All,
}

impl RedriveSelect {
    /// Whether `dead` is among those selected.
    pub fn selects(&self, dead: &DeadLetterInfo) -> bool {
        match self {
            RedriveSelect::Children(ids) => ids.contains(&dead.child_id),
            RedriveSelect::Session(s) => *s == dead.session_id,
            RedriveSelect::All => true,
        }
    }
}
