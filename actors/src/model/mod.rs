//! The vocabulary of DESIGN.md as data: sessions, calls, tasks, units, children, ready items and
//! the rows the ledger stores for them.
//!
//! This module owns the shapes and the id scheme only. It does not decide anything (that is
//! [`crate::routing`]) and does not encode anything (that is [`crate::codec`]). Stored rows keep
//! arbitrary JSON (a runner spec) as a string, never as `serde_json::Value`, because bincode has
//! no field tags.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

mod check;
mod ids;
mod info;
mod lifecycle;
mod policies;
mod request;

pub use check::CheckRow;
pub use ids::*;
pub use info::*;
pub use lifecycle::*;
pub use policies::*;
pub(crate) use request::panic_message;
pub use request::{
    validate, validate_new_session_id, validate_session_id, validate_traceparent, DelegateRequest, RequestError,
    SessionSettings, TaskSpec, MAX_IDEMPOTENCY_KEY_CHARS, MAX_RETRY_BACKOFF_MS, MAX_SESSION_ID_CHARS,
};

/// Milliseconds since the Unix epoch, the one clock stored rows use.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Default `max_concurrent_children` of a session.
pub const DEFAULT_MAX_CONCURRENT_CHILDREN: u32 = 8;
/// Default `max_delivery_attempts` before an item moves to the dead-letter tree.
pub const DEFAULT_MAX_DELIVERY_ATTEMPTS: u32 = 8;
/// Default stall timeout of a task (API.md: `stall_ms` 450000).
pub const DEFAULT_STALL_MS: u64 = 450_000;

/// The largest value brood writes or reads, in bytes (a call of many long goals stays far below):
/// the codec's limit, and what a call's rows must fit in.
pub const MAX_VALUE_BYTES: usize = 32 << 20;

/// The most a child's output (its data, as JSON text) may take: a runner that returns more
/// ends its child `failed`, saying so, so that its row always fits in [`MAX_VALUE_BYTES`].
pub const MAX_OUTPUT_BYTES: usize = 8 << 20;

/// How a call delivers its results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Results arrive at the parent's turn boundaries.
    Background,
    /// Results are returned inline by the delegating call.
    Sync,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Background => "background",
            Mode::Sync => "sync",
        })
    }
}

/// The life of a child: `queued → running → terminal`, or `unknown` after recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChildStatus {
    /// Waiting for a capacity slot.
    Queued,
    /// Its runner has been started.
    Running,
    /// The runner finished with a result.
    Succeeded,
    /// The runner reported a failure or panicked.
    Failed,
    /// The task's `timeout_ms` ran out.
    TimedOut,
    /// The child was silent past its stall timeout.
    Interrupted,
    /// The child was cancelled.
    Cancelled,
    /// Recovery found the child unfinished and its task not safe to re-run.
    Unknown,
}

impl ChildStatus {
    /// Every status, in declaration (and stored-tag) order.
    pub const ALL: [ChildStatus; 8] = [
        ChildStatus::Queued,
        ChildStatus::Running,
        ChildStatus::Succeeded,
        ChildStatus::Failed,
        ChildStatus::TimedOut,
        ChildStatus::Interrupted,
        ChildStatus::Cancelled,
        ChildStatus::Unknown,
    ];

    /// Whether the child has ended.
    pub fn is_terminal(self) -> bool {
        !matches!(self, ChildStatus::Queued | ChildStatus::Running)
    }

    /// Whether the child ended badly, which earns its unit an early failure notice.
    pub fn is_failure(self) -> bool {
        matches!(
            self,
            ChildStatus::Failed | ChildStatus::TimedOut | ChildStatus::Interrupted
        )
    }

    /// The snake_case name used in the API and the rendered text.
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

impl fmt::Display for ChildStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a ready item carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemKind {
    /// A child's result, ready once its unit is complete.
    Result,
    /// An early notice that a child failed while its unit is still incomplete.
    FailureNotice,
}

impl ItemKind {
    /// The snake_case name used in the API and in dedup keys.
    pub fn as_str(self) -> &'static str {
        match self {
            ItemKind::Result => "result",
            ItemKind::FailureNotice => "failure_notice",
        }
    }
}

/// A task as the embedder hands it in (and as it is stored, with the runner spec as JSON text).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// What the child should do.
    pub goal: String,
    /// The runner spec, a JSON object with at least `kind`, kept as text.
    pub runner_json: String,
    /// Tasks with the same group form one completion unit.
    pub group: Option<String>,
    /// Per-task timeout; the child ends `timed_out` past it.
    pub timeout_ms: Option<u64>,
    /// Stall timeout, counted from the runner's start and reset by heartbeats.
    pub stall_ms: u64,
    /// Whether recovery may run the task again when it was running at a crash.
    pub rerun_on_recovery: bool,
    /// The task's data, as JSON text (any JSON value but `null`), handed to its runner.
    pub input: Option<String>,
    /// Runs again of a child that ended `failed` or `timed_out`, before its result counts.
    pub retry: Option<RetryPolicy>,
}

/// The stored row of a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRow {
    /// The session id the embedder chose.
    pub session_id: String,
    /// Capacity: running children of this session at most.
    pub max_concurrent_children: u32,
    /// Delivery attempts before an item is dead-lettered.
    pub max_delivery_attempts: u32,
    /// The set ordinal the next call of this session gets (1 for the first).
    pub next_set: u64,
    /// When the session was first created.
    pub created_at_ms: u64,
    /// The parent reaches the session by itself (it polls its boundaries, or watches its
    /// events): the session is wake-capable without a wake target. Kept here, so it holds
    /// across restarts, unlike an embedded callback.
    pub addressable: bool,
}

/// The stored row of a call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallRow {
    /// `deleg_<hex>`.
    pub call_id: String,
    /// The owning session.
    pub session_id: String,
    /// The call's ordinal inside its session.
    pub set: u64,
    /// The mode the call actually runs in (background forced to sync is stored as sync).
    pub mode: Mode,
    /// Why a background call was forced to sync, if it was.
    pub forced_sync_reason: Option<String>,
    /// Whether each ungrouped task is its own unit.
    pub independent_completions: bool,
    /// The tasks, in order (index = position).
    pub tasks: Vec<Task>,
    /// When the call was accepted.
    pub created_at_ms: u64,
    /// The caller's W3C trace context, checked when the call was accepted: every child of the
    /// call is run with it, a re-run after a restart too.
    pub traceparent: Option<String>,
    /// The idempotency key the call was delegated with, and what it asked: a delegate naming
    /// the same key is answered with this call (the call id is made from the key), or refused
    /// when it asks for something else.
    pub idempotency: Option<Idempotency>,
}

/// The stored row of a completion unit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitRow {
    /// `<call_id>-<k>`, k from 1.
    pub unit_id: String,
    /// The call it belongs to.
    pub call_id: String,
    /// The group name, when the unit is a group.
    pub group: Option<String>,
    /// Task indexes of its members, ascending.
    pub tasks: Vec<u32>,
}

/// Delivery state of one ready item (a result or a failure notice) of a child.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryRow {
    /// Acknowledged: final.
    pub delivered: bool,
    /// Moved to the dead-letter tree.
    pub dead: bool,
    /// Claims of it that ended by lease expiry or by a `failed` release.
    pub failed_attempts: u32,
}

/// The stored row of a child: its execution and the delivery of its items.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildRow {
    /// `<call_id>.<index>`.
    pub child_id: String,
    /// The call it belongs to.
    pub call_id: String,
    /// The unit it belongs to.
    pub unit_id: String,
    /// The owning session.
    pub session_id: String,
    /// Its task's index in the call.
    pub task_index: u32,
    /// Where it is in its life.
    pub status: ChildStatus,
    /// The runner's summary (or the partial result it handed back).
    pub summary: Option<String>,
    /// The runner's result data, as JSON text (any JSON value but `null`).
    pub output: Option<String>,
    /// What went wrong, for a failed, timed-out or interrupted child.
    pub error: Option<String>,
    /// When its runner started.
    pub started_at_ms: Option<u64>,
    /// When it became terminal.
    pub finished_at_ms: Option<u64>,
    /// Execution attempt (1 for the first run, +1 for each re-run after recovery).
    pub attempt: u32,
    /// Whether recovery replayed or resolved this child.
    pub recovered: bool,
    /// Delivery of its result item.
    pub result: DeliveryRow,
    /// Delivery of its failure notice, when it has one.
    pub notice: DeliveryRow,
}

impl ChildRow {
    /// The delivery row of one of its items.
    pub fn delivery(&self, kind: ItemKind) -> &DeliveryRow {
        match kind {
            ItemKind::Result => &self.result,
            ItemKind::FailureNotice => &self.notice,
        }
    }

    /// The delivery row of one of its items, to change.
    pub fn delivery_mut(&mut self, kind: ItemKind) -> &mut DeliveryRow {
        match kind {
            ItemKind::Result => &mut self.result,
            ItemKind::FailureNotice => &mut self.notice,
        }
    }
}

/// A claim as stored: cheap, not flushed, only read back by recovery to refuse late acks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRow {
    /// The opaque claim id.
    pub claim_id: String,
    /// The owning session.
    pub session_id: String,
    /// Who claimed.
    pub consumer: String,
    /// When the lease runs out.
    pub lease_expires_at_ms: u64,
    /// How many items it owns (the items themselves are the owner's; a crash returns them all).
    pub items: u32,
}

/// An item that ran out of delivery attempts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetterRow {
    /// The item's dedup key.
    pub dedup_key: String,
    /// The child it came from.
    pub child_id: String,
    /// Its session.
    pub session_id: String,
    /// Its call.
    pub call_id: String,
    /// Result or failure notice.
    pub kind: ItemKind,
    /// Why it was given up (the last failure).
    pub reason: String,
    /// Delivery attempts made.
    pub attempts: u32,
    /// When it was given up.
    pub dead_at_ms: u64,
}

/// An acknowledged claim, or the confirmed receipt of a sync call's results: the durable record
/// that its items are delivered. One row per claim: the children's rows are never rewritten for
/// it; a load folds it into them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckRow {
    /// The claim id (for a sync call: [`sync_receipt_id`] of the call).
    pub claim_id: String,
    /// The owning session.
    pub session_id: String,
    /// The dedup keys the ack delivered.
    pub items: Vec<String>,
    /// When the ack was recorded.
    pub acked_at_ms: u64,
}

/// The durable start of children of one call admitted together (an admission batch): one row
/// for them all, instead of a running mark in each child's row. A load folds it in: a child
/// this row names and no child row of its own was running when the row was written. A child
/// that has a row of its own (requeued, or recovered) is marked in that row instead, so the
/// two never disagree about which is newer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartRow {
    /// `<call_id>/<ordered hex>`: sorts by call, then in the order the starts were made.
    pub start_id: String,
    /// The owning session.
    pub session_id: String,
    /// The call whose children started.
    pub call_id: String,
    /// Their task indices, ascending.
    pub tasks: Vec<u32>,
    /// When they started.
    pub started_at_ms: u64,
}

impl StartRow {
    /// A start row for `tasks` of `call_id`, started at `started_at_ms`.
    pub fn new(session_id: &str, call_id: &str, mut tasks: Vec<u32>, started_at_ms: u64) -> Self {
        tasks.sort_unstable();
        StartRow {
            start_id: format!("{call_id}/{}", ordered_hex()),
            session_id: session_id.to_string(),
            call_id: call_id.to_string(),
            tasks,
            started_at_ms,
        }
    }
}

/// A session's webhook wake target, stored so that a restarted server still wakes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WakeRow {
    /// The session.
    pub session_id: String,
    /// Where its wakes are POSTed.
    pub url: String,
    /// When it was bound.
    pub bound_at_ms: u64,
}

/// The id under which a sync call's confirmed receipt is recorded among the acks.
pub fn sync_receipt_id(call_id: &str) -> String {
    format!("sync_{call_id}")
}

/// A stored row that could not be read back, moved aside: what is known of it. Its raw bytes
/// are kept as they were, unencoded, beside this row (they may be as large as anything sled
/// holds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuarantineRow {
    /// The tree it was found in.
    pub tree: String,
    /// Its key, as stored.
    pub key: Vec<u8>,
    /// How many bytes its value had.
    pub value_len: u64,
    /// Why it could not be used.
    pub reason: String,
    /// When it was moved aside.
    pub quarantined_at_ms: u64,
}

/// A quarantined row with its raw value, as [`crate::ledger::Ledger::quarantined`] lists it:
/// what its [`QuarantineRow`] says of it, and the bytes it had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantined {
    /// The tree it was found in.
    pub tree: String,
    /// Its key, as stored.
    pub key: Vec<u8>,
    /// How many bytes its value had.
    pub value_len: u64,
    /// Why it could not be used.
    pub reason: String,
    /// When it was moved aside (ms since the epoch; 0 when its quarantine row did not decode).
    pub quarantined_at_ms: u64,
    /// Its value, as stored.
    pub value: Vec<u8>,
}

impl Quarantined {
    /// A quarantined row from its quarantine row and the value it kept.
    pub fn new(row: QuarantineRow, value: Vec<u8>) -> Quarantined {
        Quarantined {
            tree: row.tree,
            key: row.key,
            value_len: row.value_len,
            reason: row.reason,
            quarantined_at_ms: row.quarantined_at_ms,
            value,
        }
    }
}

/// One ready item as a consumer receives it in an envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadyItem {
    /// `result` or `failure_notice`.
    pub kind: ItemKind,
    /// Stable across deliveries: `<child_id>:<kind>`.
    pub dedup_key: String,
    /// 1 at the first claim, +1 per expiry or failed release.
    pub delivery_attempt: u32,
    /// The call.
    pub call_id: String,
    /// The call's set ordinal in its session.
    pub set: u64,
    /// The unit.
    pub unit_id: String,
    /// The unit's group, if any.
    pub group: Option<String>,
    /// The child.
    pub child_id: String,
    /// The task index (k - 1 of `[set N · k/n]`).
    pub task_index: u32,
    /// The call's task count (n of `[set N · k/n]`).
    pub of: u32,
    /// Members of the item's unit.
    pub unit_size: u32,
    /// The child's status.
    pub status: ChildStatus,
    /// The goal the child was given.
    pub goal: String,
    /// The child's summary.
    pub summary: Option<String>,
    /// The child's result data, as JSON text.
    pub output: Option<String>,
    /// The child's execution attempts (1, or more when recovery ran it again).
    pub attempts: u32,
    /// The child's error.
    pub error: Option<String>,
    /// Whether recovery replayed it.
    pub recovered: bool,
    /// When the child finished.
    pub finished_at_ms: Option<u64>,
    /// For recovered units: how many of the unit's children were recorded before the owner
    /// exited (k of "k/n child results were recorded before the owner exited").
    pub recorded_before_exit: Option<u32>,
}

/// Everything ready at one boundary, owned by one claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// The claim that owns the items; ack or release it.
    pub claim_id: String,
    /// Who holds the claim.
    pub consumer: String,
    /// When the lease runs out (ms since the epoch).
    pub lease_expires_at_ms: u64,
    /// The items, by set, unit, task and kind.
    pub items: Vec<ReadyItem>,
    /// Ready items were left out by the envelope's bounds: they go at a later boundary.
    pub more: bool,
    /// What a model reads. The session owner leaves it empty; the embedding API renders it
    /// off the routing thread.
    pub text: String,
}

/// What a delegate call answers. The session owner leaves `note` (and a sync call's `text`)
/// empty; the embedding API renders them off the routing thread, as it does an envelope's text.
#[derive(Debug, Clone)]
pub enum DelegateReply {
    /// Accepted in the background: results come at turn boundaries.
    Background {
        /// `deleg_<hex>`.
        call_id: String,
        /// The call's set ordinal in its session.
        set: u64,
        /// Its completion units.
        units: Vec<UnitInfo>,
        /// What the model should do now (finish independent work, end the turn).
        note: String,
    },
    /// Ran synchronously: the results are here and count as delivered once received.
    Sync {
        /// `deleg_<hex>`.
        call_id: String,
        /// The call's set ordinal in its session.
        set: u64,
        /// Its completion units.
        units: Vec<UnitInfo>,
        /// Why a background call was forced to sync, if it was.
        forced_sync_reason: Option<String>,
        /// Every child's result.
        results: Vec<ReadyItem>,
        /// The note for the model.
        note: String,
        /// The results rendered as an envelope's text.
        text: String,
    },
}

impl DelegateReply {
    /// The call id.
    pub fn call_id(&self) -> &str {
        match self {
            DelegateReply::Background { call_id, .. } | DelegateReply::Sync { call_id, .. } => call_id,
        }
    }

    /// The set ordinal.
    pub fn set(&self) -> u64 {
        match self {
            DelegateReply::Background { set, .. } | DelegateReply::Sync { set, .. } => *set,
        }
    }

    /// The note for the model.
    pub fn note(&self) -> &str {
        match self {
            DelegateReply::Background { note, .. } | DelegateReply::Sync { note, .. } => note,
        }
    }
}

/// Splits tasks into completion units (DESIGN.md "Unit"): one per distinct group in order of
/// first appearance; ungrouped tasks form one unit together, or one each when
/// `independent_completions` is set. Units are numbered in order of their first task.
pub fn plan_units(call_id: &str, tasks: &[Task], independent_completions: bool) -> Vec<UnitRow> {
    let (unit_of, groups) = unit_numbers(tasks, independent_completions);
    let mut units: Vec<UnitRow> = groups
        .into_iter()
        .enumerate()
        .map(|(k, group)| UnitRow {
            unit_id: unit_id(call_id, k + 1),
            call_id: call_id.to_string(),
            group: group.map(str::to_string),
            tasks: Vec::new(),
        })
        .collect();
    for (i, &k) in unit_of.iter().enumerate() {
        units[k as usize - 1].tasks.push(i as u32);
    }
    units
}

/// The unit of each task as [`plan_units`] numbers them (from 1), and each unit's group name,
/// without making the units: what checking a stored child's unit needs.
pub fn unit_numbers(tasks: &[Task], independent_completions: bool) -> (Vec<u32>, Vec<Option<&str>>) {
    // Units in order of first appearance; groups found by name in O(1).
    let mut groups: Vec<Option<&str>> = Vec::new();
    let mut group_unit: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
    let mut ungrouped: Option<u32> = None;
    fn new_unit<'a>(groups: &mut Vec<Option<&'a str>>, group: Option<&'a str>) -> u32 {
        groups.push(group);
        groups.len() as u32
    }
    let unit_of = tasks
        .iter()
        .map(|task| match task.group.as_deref() {
            Some(g) => *group_unit.entry(g).or_insert_with(|| new_unit(&mut groups, Some(g))),
            None if independent_completions => new_unit(&mut groups, None),
            None => *ungrouped.get_or_insert_with(|| new_unit(&mut groups, None)),
        })
        .collect();
    (unit_of, groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task of `group` (shared with the other model modules' tests).
    pub(super) fn task(group: Option<&str>) -> Task {
        Task {
            goal: "g".into(),
            runner_json: "{}".into(),
            group: group.map(str::to_string),
            timeout_ms: None,
            stall_ms: DEFAULT_STALL_MS,
            rerun_on_recovery: false,
            input: None,
            retry: None,
        }
    }

    #[test]
    fn ungrouped_tasks_share_one_unit_by_default() {
        let tasks = vec![task(None), task(Some("a")), task(None), task(Some("a"))];
        let units = plan_units("deleg_1", &tasks, false);
        assert_eq!(units.len(), 2);
        assert_eq!(units[0].unit_id, "deleg_1-1");
        assert_eq!(units[0].tasks, vec![0, 2]);
        assert_eq!(units[1].group.as_deref(), Some("a"));
        assert_eq!(units[1].tasks, vec![1, 3]);
    }

    #[test]
    fn independent_completions_make_one_unit_per_ungrouped_task() {
        let tasks = vec![task(None), task(Some("a")), task(None), task(Some("a"))];
        let units = plan_units("deleg_1", &tasks, true);
        let members: Vec<_> = units.iter().map(|u| u.tasks.clone()).collect();
        assert_eq!(members, vec![vec![0], vec![1, 3], vec![2]]);
    }
}

#[cfg(test)]
mod nest_tests {
    use super::*;
    use crate::ledger::conformance::{call_row, child_row};

    #[test]
    fn a_nested_sessions_child_has_ended_when_its_row_is_terminal_or_its_call_is_gone() {
        let call = call_row("p", "deleg_00000000000000aa", 1);
        let mut row = child_row("p", &call.call_id, 0, ChildStatus::Queued);
        assert!(
            !stored_child_ended(Some(&call), None),
            "queued or running under a start row"
        );
        for status in [ChildStatus::Queued, ChildStatus::Running] {
            row.status = status;
            assert!(!stored_child_ended(Some(&call), Some(&row)), "{status:?}");
        }
        for status in [
            ChildStatus::Succeeded,
            ChildStatus::Failed,
            ChildStatus::Cancelled,
            ChildStatus::Unknown,
        ] {
            row.status = status;
            assert!(stored_child_ended(Some(&call), Some(&row)), "{status:?}");
        }
        assert!(
            stored_child_ended(None, None),
            "its call was removed with everything under it"
        );
    }
}
