//! What a caller reads of a call, its units and children, a dead letter, a nested session, an
//! item's redrives and a session's acks: the types the embedding API answers with.
//!
//! Each is built from its stored row here and nowhere else, so the rows (and their codec) can
//! change without changing what callers see. The rows themselves stay the ledger's: nothing here
//! is stored, and nothing here is encoded.

use super::*;

/// A call as a caller sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallInfo {
    /// `deleg_<hex>`.
    pub call_id: String,
    /// The session it was made in.
    pub session_id: String,
    /// The call's ordinal inside its session.
    pub set: u64,
    /// The mode it runs in (a background call forced to sync runs as sync).
    pub mode: Mode,
    /// Why a background call was forced to sync, if it was.
    pub forced_sync_reason: Option<String>,
    /// Whether each ungrouped task is its own unit.
    pub independent_completions: bool,
    /// How many tasks it has (n of `[set N · k/n]`).
    pub task_count: u32,
    /// When it was accepted (ms since the epoch).
    pub created_at_ms: u64,
    /// The caller's W3C trace context, which its children run with.
    pub traceparent: Option<String>,
}

impl From<&CallRow> for CallInfo {
    fn from(r: &CallRow) -> Self {
        CallInfo {
            call_id: r.call_id.clone(),
            session_id: r.session_id.clone(),
            set: r.set,
            mode: r.mode,
            forced_sync_reason: r.forced_sync_reason.clone(),
            independent_completions: r.independent_completions,
            task_count: u32::try_from(r.tasks.len()).unwrap_or(u32::MAX),
            created_at_ms: r.created_at_ms,
            traceparent: r.traceparent.clone(),
        }
    }
}

/// A call's task as a caller sees it: what was asked of its child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskInfo {
    /// What the child should do.
    pub goal: String,
    /// The task's data, as JSON text, when it has some.
    pub input: Option<String>,
    /// Its runner's kind (`sim`, `command`, `external`, or an embedder's).
    pub runner: String,
}

impl From<&Task> for TaskInfo {
    fn from(t: &Task) -> Self {
        TaskInfo {
            goal: t.goal.clone(),
            input: t.input.clone(),
            runner: runner_kind(&t.runner_json),
        }
    }
}

/// The `kind` of a runner spec kept as JSON text; empty when it names none (specs are checked
/// when the call is made, so only an unreadable stored spec has none).
fn runner_kind(runner_json: &str) -> String {
    #[derive(Deserialize)]
    struct Kind {
        kind: String,
    }
    serde_json::from_str::<Kind>(runner_json)
        .map(|k| k.kind)
        .unwrap_or_default()
}

/// A completion unit as a caller sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitInfo {
    /// `<call_id>-<k>`, k from 1.
    pub unit_id: String,
    /// The call it belongs to.
    pub call_id: String,
    /// The group name, when the unit is a group.
    pub group: Option<String>,
    /// Task indexes of its members, ascending.
    pub tasks: Vec<u32>,
}

impl From<&UnitRow> for UnitInfo {
    fn from(r: &UnitRow) -> Self {
        UnitInfo {
            unit_id: r.unit_id.clone(),
            call_id: r.call_id.clone(),
            group: r.group.clone(),
            tasks: r.tasks.clone(),
        }
    }
}

/// Where one item of a child (its result, or its failure notice) is in its delivery.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeliveryInfo {
    /// Acknowledged (or returned inline by a sync call): final.
    pub delivered: bool,
    /// Moved to the dead-letter list.
    pub dead: bool,
    /// Claims of it that ended by lease expiry or by a `failed` release.
    pub failed_attempts: u32,
    /// Whether the item was published (made ready: a result once its unit completed, a
    /// failure notice once its child failed while its unit was incomplete), whatever came of it
    /// since; or, for a sync call's result, delivered inline. A child that raised no failure
    /// notice has an unpublished one. So has one still undelivered when its unit completed, once
    /// read back by a restart or an owner rebuild: such a notice is not sent again (its unit's
    /// results carry the failure), and nothing stored says it was published.
    pub published: bool,
}

impl From<&DeliveryRow> for DeliveryInfo {
    /// What the row says; an item still open (ready, claimed, backing off) with no failed
    /// attempt is published too, which only its owner knows (it says so in its views).
    fn from(r: &DeliveryRow) -> Self {
        DeliveryInfo {
            delivered: r.delivered,
            dead: r.dead,
            failed_attempts: r.failed_attempts,
            published: r.delivered || r.dead || r.failed_attempts > 0,
        }
    }
}

/// A child as a caller sees it: its execution and the delivery of its items.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildInfo {
    /// `<call_id>.<index>`.
    pub child_id: String,
    /// The call it belongs to.
    pub call_id: String,
    /// The unit it belongs to.
    pub unit_id: String,
    /// The session of its call.
    pub session_id: String,
    /// Its task's index in the call (k - 1 of `[set N · k/n]`).
    pub task_index: u32,
    /// Where it is in its life.
    pub status: ChildStatus,
    /// The runner's summary (or the partial result it handed back).
    pub summary: Option<String>,
    /// The runner's result data, as JSON text.
    pub output: Option<String>,
    /// What went wrong, for a failed, timed-out or interrupted child.
    pub error: Option<String>,
    /// When its runner started (ms since the epoch).
    pub started_at_ms: Option<u64>,
    /// When it ended (ms since the epoch).
    pub finished_at_ms: Option<u64>,
    /// Execution attempt: 1 for the first run, +1 for each re-run after recovery.
    pub attempt: u32,
    /// Whether recovery replayed or resolved it.
    pub recovered: bool,
    /// The delivery of its result.
    pub result: DeliveryInfo,
    /// The delivery of its failure notice, when it has one.
    pub notice: DeliveryInfo,
}

impl From<&ChildRow> for ChildInfo {
    fn from(r: &ChildRow) -> Self {
        ChildInfo {
            child_id: r.child_id.clone(),
            call_id: r.call_id.clone(),
            unit_id: r.unit_id.clone(),
            session_id: r.session_id.clone(),
            task_index: r.task_index,
            status: r.status,
            summary: r.summary.clone(),
            output: r.output.clone(),
            error: r.error.clone(),
            started_at_ms: r.started_at_ms,
            finished_at_ms: r.finished_at_ms,
            attempt: r.attempt,
            recovered: r.recovered,
            result: (&r.result).into(),
            notice: (&r.notice).into(),
        }
    }
}

/// An item named by its dedup key: its child, its call, and which of the child's items it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemRef {
    /// The child it came from.
    pub child_id: String,
    /// The child's call.
    pub call_id: String,
    /// A result or a failure notice.
    pub kind: ItemKind,
}

impl ItemRef {
    /// The item a dedup key names; `None` for a key that names none.
    pub fn parse(dedup_key: &str) -> Option<ItemRef> {
        let (child, kind) = parse_dedup_key(dedup_key)?;
        let (call, _) = parse_child_id(child)?;
        Some(ItemRef {
            child_id: child.to_string(),
            call_id: call.to_string(),
            kind,
        })
    }
}

/// An ack of a session, as a caller sees it: which claim delivered which items, when. A sync
/// call's receipt is one too, its claim id [`sync_receipt_id`] of the call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckInfo {
    /// The claim acked.
    pub claim_id: String,
    /// When the ack was recorded (ms since the epoch).
    pub acked_at_ms: u64,
    /// The items it delivered, as the claim held them.
    pub items: Vec<ItemRef>,
}

impl From<&AckRow> for AckInfo {
    fn from(r: &AckRow) -> Self {
        AckInfo {
            claim_id: r.claim_id.clone(),
            acked_at_ms: r.acked_at_ms,
            // A stored ack's keys were checked when it was read back: each names an item.
            items: r.items.iter().filter_map(|k| ItemRef::parse(k)).collect(),
        }
    }
}

/// An item that ran out of delivery attempts, as a caller sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterInfo {
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
    /// When it was given up (ms since the epoch).
    pub dead_at_ms: u64,
}

impl From<&DeadLetterRow> for DeadLetterInfo {
    fn from(r: &DeadLetterRow) -> Self {
        DeadLetterInfo {
            dedup_key: r.dedup_key.clone(),
            child_id: r.child_id.clone(),
            session_id: r.session_id.clone(),
            call_id: r.call_id.clone(),
            kind: r.kind,
            reason: r.reason.clone(),
            attempts: r.attempts,
            dead_at_ms: r.dead_at_ms,
        }
    }
}

/// A nested session as a caller sees it: the session of a child that delegates in its own
/// right (its id is the child's id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NestInfo {
    /// The nested session (the child's id).
    pub session_id: String,
    /// The session the child's call is in.
    pub parent_session_id: String,
    /// How deep the session is: 1 for the session of a child of a top-level call, one more for
    /// each level below.
    pub depth: u32,
    /// When it was opened (ms since the epoch).
    pub created_at_ms: u64,
}

impl NestInfo {
    /// The child whose session this is (its id is the session's).
    pub fn parent_child_id(&self) -> &str {
        &self.session_id
    }
}

impl From<&NestRow> for NestInfo {
    fn from(r: &NestRow) -> Self {
        NestInfo {
            session_id: r.session_id.clone(),
            parent_session_id: r.parent_session_id.clone(),
            depth: r.depth,
            created_at_ms: r.created_at_ms,
        }
    }
}

/// The redrives of one item, as a caller sees them: each time it was put back from the
/// dead-letter list (the newest last; at most [`MAX_REDRIVE_HISTORY`] kept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedriveInfo {
    /// The item's dedup key.
    pub dedup_key: String,
    /// Its session.
    pub session_id: String,
    /// Redrives made, all told.
    pub count: u32,
    /// The latest ones.
    pub history: Vec<RedriveEntry>,
}

/// One redrive of an item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedriveEntry {
    /// When it was redriven (ms since the epoch).
    pub at_ms: u64,
    /// Why it had been given up (its dead letter's reason).
    pub dead_reason: String,
    /// The delivery attempts it had made.
    pub attempts: u32,
    /// When it had been given up (ms since the epoch).
    pub dead_at_ms: u64,
}

impl From<&RedriveRow> for RedriveInfo {
    fn from(r: &RedriveRow) -> Self {
        RedriveInfo {
            dedup_key: r.dedup_key.clone(),
            session_id: r.session_id.clone(),
            count: r.count,
            history: r
                .history
                .iter()
                .map(|h| RedriveEntry {
                    at_ms: h.at_ms,
                    dead_reason: h.dead_reason.clone(),
                    attempts: h.attempts,
                    dead_at_ms: h.dead_at_ms,
                })
                .collect(),
        }
    }
}
