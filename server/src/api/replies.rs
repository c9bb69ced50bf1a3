//! The replies of API.md, version 1, and the events of a session's stream: each a type the
//! routes build from the engine's state and serialize as it is, and the OpenAPI document
//! (`openapi`) describes. Times are milliseconds since the Unix epoch.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::wire::{ChildStatus, Delivery, ItemKind, Mode, Turn};

/// Every refusal: the status says the class, `code` the reason clients match on.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorReply {
    /// The refusal.
    pub error: ErrorBody,
}

/// What an [`ErrorReply`] holds.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// A snake_case code: `invalid_request`, `unknown_session`, `claim_lost`, …
    pub code: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// A session's settings: `PUT /v1/sessions/{session_id}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Session {
    /// The session.
    pub session_id: String,
    /// Whether it may be woken (a `wake_url`, or `addressable` from an authenticated binder).
    pub wake_capable: bool,
    /// Whether the client said it can address the session again.
    pub addressable: bool,
    /// Its turn.
    pub turn: Turn,
    /// Its capacity.
    pub max_concurrent_children: u32,
    /// Delivery attempts of an item before it is a dead letter.
    pub max_delivery_attempts: u32,
}

impl From<&brood::SessionInfo> for Session {
    fn from(info: &brood::SessionInfo) -> Self {
        Session {
            session_id: info.session_id.clone(),
            wake_capable: info.wake_capable,
            addressable: info.addressable,
            turn: info.turn.into(),
            max_concurrent_children: info.max_concurrent_children,
            max_delivery_attempts: info.max_delivery_attempts,
        }
    }
}

/// The `counts` object of a session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Counts {
    /// Children waiting for capacity.
    pub queued: u64,
    /// Children running.
    pub running: u64,
    /// Items claimable now.
    pub ready: u64,
    /// Items waiting out a backoff before they are ready again.
    #[serde(default)]
    pub backing_off: u64,
    /// Items in live claims.
    pub claimed: u64,
    /// Items delivered (acked or returned inline).
    pub delivered: u64,
}

impl From<&brood::SessionCounts> for Counts {
    fn from(st: &brood::SessionCounts) -> Self {
        Counts {
            queued: st.queued as u64,
            running: st.running as u64,
            ready: st.ready as u64,
            backing_off: st.backing_off as u64,
            claimed: st.claimed as u64,
            delivered: st.delivered,
        }
    }
}

/// A session's whole state: `GET /v1/sessions/{session_id}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionDetail {
    /// The session.
    pub session_id: String,
    /// Whether it may be woken (a `wake_url`, or `addressable` from an authenticated binder).
    pub wake_capable: bool,
    /// Whether the client said it can address the session again.
    pub addressable: bool,
    /// Its turn.
    pub turn: Turn,
    /// Its capacity.
    pub max_concurrent_children: u32,
    /// Delivery attempts of an item before it is a dead letter.
    pub max_delivery_attempts: u32,
    /// What its children and items are doing.
    pub counts: Counts,
    /// The child whose nested session this is.
    pub parent_child_id: Option<String>,
    /// Its calls: those not yet delivered, or with `delivered=true` every stored one.
    pub calls: Vec<CallView>,
    /// The last call id of a page when more follow.
    pub calls_next: Option<String>,
    /// Its live claims.
    pub claims: Vec<ClaimView>,
}

/// A call as a session shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CallView {
    /// `deleg_<hex>`.
    pub call_id: String,
    /// Its ordinal in the session.
    pub set: u64,
    /// The mode it ran in.
    pub mode: Mode,
    /// When it was made.
    pub created_at: u64,
    /// Its completion units.
    pub units: Vec<UnitView>,
    /// Its children.
    pub children: Vec<ChildView>,
}

impl CallView {
    /// The view of call `c`, its children seen in `around`.
    pub fn of(c: &brood::CallStatus, around: &Around) -> Self {
        CallView {
            call_id: c.call.call_id.clone(),
            set: c.call.set,
            mode: c.call.mode.into(),
            created_at: c.call.created_at_ms,
            units: c.units.iter().map(UnitView::from).collect(),
            children: c
                .children
                .iter()
                .map(|ch| ChildView::of(ch, c.tasks.get(ch.task_index as usize), around))
                .collect(),
        }
    }
}

impl From<&brood::CallStatus> for CallView {
    /// The view of a call with no engine to ask (see [`Around::default`]).
    fn from(c: &brood::CallStatus) -> Self {
        CallView::of(c, &Around::default())
    }
}

/// What the views of a session's children read beside their calls, once per view: which of
/// them wait for an outside worker, and which opened a nested session. By default (no engine
/// to ask): none of either.
#[derive(Debug, Clone, Default)]
pub struct Around {
    /// The children waiting in a queue for a worker.
    pub waiting: HashSet<String>,
    /// The children with a nested session.
    pub nested: HashSet<String>,
}

impl Around {
    /// What `brood` knows of the children of `calls`, of session `session_id`.
    pub fn of<'a>(
        brood: &brood::BroodHandle,
        session_id: &str,
        calls: impl IntoIterator<Item = &'a brood::CallStatus>,
    ) -> Self {
        let children = calls.into_iter().flat_map(|c| &c.children);
        Around {
            waiting: brood.waiting_for_workers(session_id),
            nested: children
                .filter(|ch| brood.nest(&ch.child_id).is_some())
                .map(|ch| ch.child_id.clone())
                .collect(),
        }
    }
}

/// A call on its own: `GET /v1/calls/{call_id}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CallDetail {
    /// `deleg_<hex>`.
    pub call_id: String,
    /// Its ordinal in the session.
    pub set: u64,
    /// The mode it ran in.
    pub mode: Mode,
    /// When it was made.
    pub created_at: u64,
    /// Its completion units.
    pub units: Vec<UnitView>,
    /// Its children.
    pub children: Vec<ChildView>,
    /// Its session.
    pub session_id: String,
    /// Why a background call ran as sync.
    pub forced_sync_reason: Option<String>,
}

impl From<&brood::CallStatus> for CallDetail {
    /// The view of a call with no engine to ask (see [`Around::default`]).
    fn from(c: &brood::CallStatus) -> Self {
        CallDetail::of(c, &Around::default())
    }
}

impl CallDetail {
    /// The view of call `c` with its session, its children seen in `around`.
    pub fn of(c: &brood::CallStatus, around: &Around) -> Self {
        let view = CallView::of(c, around);
        CallDetail {
            call_id: view.call_id,
            set: view.set,
            mode: view.mode,
            created_at: view.created_at,
            units: view.units,
            children: view.children,
            session_id: c.call.session_id.clone(),
            forced_sync_reason: c.call.forced_sync_reason.clone(),
        }
    }
}

/// A completion unit of a call.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UnitView {
    /// `<call_id>-<k>`.
    pub unit_id: String,
    /// Its group, when the tasks named one.
    pub group: Option<String>,
    /// The indexes of its tasks.
    pub tasks: Vec<u32>,
}

impl From<&brood::UnitInfo> for UnitView {
    fn from(u: &brood::UnitInfo) -> Self {
        UnitView {
            unit_id: u.unit_id.clone(),
            group: u.group.clone(),
            tasks: u.tasks.clone(),
        }
    }
}

/// A child of a call.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ChildView {
    /// `<call_id>.<index>`.
    pub child_id: String,
    /// Its task's index in the call.
    pub task_index: u32,
    /// Its task's goal.
    pub goal: String,
    /// Its task's data, when it has some.
    pub input: Option<serde_json::Value>,
    /// Its runner's kind.
    pub runner: String,
    /// Its status.
    pub status: ChildStatus,
    /// When its runner started.
    pub started_at: Option<u64>,
    /// When it ended.
    pub finished_at: Option<u64>,
    /// Where its result is on its way, once it has one.
    pub delivery: Option<Delivery>,
    /// The delivery attempt its result is on, once it has one; for a dead letter, the attempts
    /// it used (as `GET /v1/dead-letters` counts them).
    pub delivery_attempt: Option<u32>,
    /// The first line of its summary, or of its error.
    pub summary: Option<String>,
    /// What went wrong, whole, for a child that failed, timed out or was interrupted.
    pub error: Option<String>,
    /// Its result as data, once it ended with some.
    pub output: Option<serde_json::Value>,
    /// How many times it was run (1, or more when recovery ran it again).
    pub attempts: u32,
    /// Where its early failure notice is on its way, when it raised one. A notice still
    /// undelivered when its unit completed is not sent after a restart or an owner rebuild (the
    /// unit's results carry the failure): read back then, it is null.
    pub notice: Option<Delivery>,
    /// Whether it waits in its queue for an outside worker to take it (an `external` child
    /// not handed out yet).
    pub waiting_for_worker: bool,
    /// The nested session opened under it (whose id is the child's).
    pub nested_session: Option<String>,
}

/// Where an item is on its way, by its delivery state.
fn delivery_of(d: &brood::DeliveryInfo) -> Delivery {
    match (d.delivered, d.dead) {
        (true, _) => Delivery::Delivered,
        (false, true) => Delivery::DeadLetter,
        (false, false) => Delivery::Undelivered,
    }
}

impl ChildView {
    /// The view of child `r` of a call, whose task is `task` (its goal and input, its runner's
    /// kind; without one those read empty), seen in `around`.
    pub fn of(r: &brood::ChildInfo, task: Option<&brood::TaskInfo>, around: &Around) -> Self {
        let ended = r.status.is_terminal();
        let delivery = (ended || r.result.delivered || r.result.dead).then(|| delivery_of(&r.result));
        ChildView {
            child_id: r.child_id.clone(),
            task_index: r.task_index,
            goal: task.map(|t| t.goal.clone()).unwrap_or_default(),
            input: task.and_then(|t| data(t.input.as_deref())),
            runner: task.map(|t| t.runner.clone()).unwrap_or_default(),
            status: r.status.into(),
            started_at: r.started_at_ms,
            finished_at: r.finished_at_ms,
            delivery,
            // A dead letter's is the attempts it used, as the dead-letter list counts them; an
            // item on its way is on the next one.
            delivery_attempt: ended.then(|| match r.result.dead {
                true => r.result.failed_attempts,
                false => r.result.failed_attempts.saturating_add(1),
            }),
            summary: summary_line(r.summary.as_deref(), r.error.as_deref()),
            error: r.error.clone(),
            output: data(r.output.as_deref()),
            attempts: r.attempt,
            notice: r.notice.published.then(|| delivery_of(&r.notice)),
            waiting_for_worker: around.waiting.contains(&r.child_id),
            nested_session: around.nested.contains(&r.child_id).then(|| r.child_id.clone()),
        }
    }
}

/// A live claim of a session.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ClaimView {
    /// The claim.
    pub claim_id: String,
    /// Who claimed.
    pub consumer: String,
    /// How many items it holds.
    pub items: u64,
    /// When its lease runs out.
    pub lease_expires_at: u64,
    /// When the boundary made it.
    pub claimed_at: u64,
    /// The items it holds.
    pub children: Vec<ItemRef>,
}

impl From<&brood::LiveClaim> for ClaimView {
    fn from(c: &brood::LiveClaim) -> Self {
        ClaimView {
            claim_id: c.claim_id.clone(),
            consumer: c.consumer.clone(),
            items: c.items as u64,
            lease_expires_at: c.lease_expires_at_ms,
            claimed_at: c.claimed_at_ms,
            children: c.children.iter().map(ItemRef::from).collect(),
        }
    }
}

/// An item, named: its child, its call, which of the child's items.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ItemRef {
    /// Its child.
    pub child_id: String,
    /// Its call.
    pub call_id: String,
    /// A result or a failure notice.
    pub kind: ItemKind,
}

impl From<&brood::ItemRef> for ItemRef {
    fn from(i: &brood::ItemRef) -> Self {
        ItemRef {
            child_id: i.child_id.clone(),
            call_id: i.call_id.clone(),
            kind: i.kind.into(),
        }
    }
}

/// An acked claim: which items it delivered, when.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AckedClaim {
    /// The claim (`sync_<call_id>` for a sync call's receipt).
    pub claim_id: String,
    /// When the ack was recorded.
    pub acked_at: u64,
    /// The items it delivered.
    pub items: Vec<ItemRef>,
}

impl From<&brood::AckInfo> for AckedClaim {
    fn from(a: &brood::AckInfo) -> Self {
        AckedClaim {
            claim_id: a.claim_id.clone(),
            acked_at: a.acked_at_ms,
            items: a.items.iter().map(ItemRef::from).collect(),
        }
    }
}

/// `GET /v1/sessions/{session_id}/deliveries`: a page of a session's acks, in claim id order (the
/// claims in the order they were made, then sync calls' receipts).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Deliveries {
    /// The page.
    pub deliveries: Vec<AckedClaim>,
    /// The last claim id of the page when more follow.
    pub next: Option<String>,
}

impl Deliveries {
    /// The page `acks`, with more behind it after `next`.
    pub fn of(acks: &[brood::AckInfo], next: Option<String>) -> Self {
        Deliveries {
            deliveries: acks.iter().map(AckedClaim::from).collect(),
            next,
        }
    }
}

/// One session of a listing.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionSummary {
    /// The session.
    pub session_id: String,
    /// Its turn.
    pub turn: Turn,
    /// Whether it may be woken.
    pub wake_capable: bool,
    /// What its children and items are doing.
    pub counts: Counts,
    /// The child whose nested session this is.
    pub parent_child_id: Option<String>,
    /// Its dead letters now.
    pub dead_letters: u64,
}

impl SessionSummary {
    /// The summary of a session with counts `st`, nested under `parent_child_id` when it is,
    /// holding `dead_letters` dead letters.
    pub fn of(st: &brood::SessionCounts, parent_child_id: Option<String>, dead_letters: u64) -> Self {
        SessionSummary {
            session_id: st.info.session_id.clone(),
            turn: st.info.turn.into(),
            wake_capable: st.info.wake_capable,
            counts: Counts::from(st),
            parent_child_id,
            dead_letters,
        }
    }
}

/// `GET /v1/sessions`: a page of sessions in ascending id order.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionList {
    /// The page.
    pub sessions: Vec<SessionSummary>,
    /// The last id of the page when more follow.
    pub next: Option<String>,
}

/// `POST /v1/peers/sessions`: the summaries of the sessions asked for that this process serves.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PeerSessions {
    /// The sessions served here, in the order asked; `dead_letters` is 0 (the asker counts
    /// them for its whole page at once).
    pub sessions: Vec<SessionSummary>,
    /// The sessions asked for that another process serves now (or whose lease here may have
    /// run out): the asker looks their holder up again.
    pub elsewhere: Vec<String>,
}

/// `POST /v1/sessions/{session_id}/turn`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TurnReply {
    /// The session.
    pub session_id: String,
    /// Its turn now.
    pub turn: Turn,
}

/// A unit of a call just made, and its tasks.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UnitRef {
    /// `<call_id>-<k>`.
    pub unit_id: String,
    /// The indexes of its tasks.
    pub tasks: Vec<u32>,
}

/// 202: a background call was made; its results come at the session's boundaries.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DelegateBackground {
    /// The call.
    pub call_id: String,
    /// Its ordinal in the session.
    pub set: u64,
    /// `background`.
    pub mode: Mode,
    /// Its units.
    pub units: Vec<UnitRef>,
    /// What the parent must do to receive the results, in words a model obeys.
    pub note: String,
}

/// 200: a sync call ran; its results are here and count as delivered.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DelegateSync {
    /// The call.
    pub call_id: String,
    /// Its ordinal in the session.
    pub set: u64,
    /// `sync`.
    pub mode: Mode,
    /// Why a background call ran as sync (the session cannot be woken).
    pub forced_sync_reason: Option<String>,
    /// Its results.
    pub results: Vec<Item>,
    /// What the results are.
    pub note: String,
    /// The results as a model reads them.
    pub text: String,
}

/// A ready item, as an envelope or a sync reply carries it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Item {
    /// A result, or an early failure notice.
    pub kind: ItemKind,
    /// Stable across deliveries of the same item.
    pub dedup_key: String,
    /// 1 at the first claim; +1 for each claim of it that expired or was released `failed`.
    pub delivery_attempt: u32,
    /// Its call.
    pub call_id: String,
    /// Its call's ordinal.
    pub set: u64,
    /// Its unit.
    pub unit_id: String,
    /// Its unit's group.
    pub group: Option<String>,
    /// Its child.
    pub child_id: String,
    /// Its task's index.
    pub task_index: u32,
    /// The call's task count.
    pub of: u32,
    /// How the child ended.
    pub status: ChildStatus,
    /// What came of it.
    pub summary: Option<String>,
    /// What came of it, as data.
    pub output: Option<serde_json::Value>,
    /// How many times the child was run (1, or more when recovery ran it again).
    pub attempts: u32,
    /// Why it failed.
    pub error: Option<String>,
    /// Whether recovery resolved it after a restart.
    pub recovered: bool,
}

/// A child's data (JSON text as the engine keeps it) as a reply carries it.
pub fn data(text: Option<&str>) -> Option<serde_json::Value> {
    text.and_then(|t| serde_json::from_str(t).ok())
}

impl From<&brood::ReadyItem> for Item {
    fn from(i: &brood::ReadyItem) -> Self {
        Item {
            kind: i.kind.into(),
            dedup_key: i.dedup_key.clone(),
            delivery_attempt: i.delivery_attempt,
            call_id: i.call_id.clone(),
            set: i.set,
            unit_id: i.unit_id.clone(),
            group: i.group.clone(),
            child_id: i.child_id.clone(),
            task_index: i.task_index,
            of: i.of,
            status: i.status.into(),
            summary: i.summary.clone(),
            output: data(i.output.as_deref()),
            attempts: i.attempts,
            error: i.error.clone(),
            recovered: i.recovered,
        }
    }
}

/// Items as replies carry them.
pub fn items(items: &[brood::ReadyItem]) -> Vec<Item> {
    items.iter().map(Item::from).collect()
}

/// 200 at a boundary: every item ready then, claimed.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Envelope {
    /// The claim of the items: ack or release it.
    pub claim_id: String,
    /// When the claim's lease runs out.
    pub lease_expires_at: u64,
    /// The items.
    pub items: Vec<Item>,
    /// Ready items were left out by the boundary's `max_items` or `max_bytes`: they go at the
    /// next boundary.
    pub more: bool,
    /// What a model reads: the header, one block per call, the tags `[set N · k/n]`.
    pub text: String,
}

impl From<&brood::Envelope> for Envelope {
    fn from(env: &brood::Envelope) -> Self {
        Envelope {
            claim_id: env.claim_id.clone(),
            lease_expires_at: env.lease_expires_at_ms,
            items: items(&env.items),
            more: env.more,
            text: env.text.clone(),
        }
    }
}

/// `POST /v1/claims/{claim_id}/ack`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AckReply {
    /// The items the claim delivered.
    pub delivered: u64,
}

/// `POST /v1/claims/{claim_id}/release`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ReleaseReply {
    /// The claim.
    pub claim_id: String,
    /// Always true: its items are ready again (after any backoff).
    pub released: bool,
}

/// A cancel: `POST /v1/{calls,units,children}/{id}/cancel`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CancelReply {
    /// The children this request cancelled.
    pub cancelled: Vec<String>,
    /// Children under the target that had already ended.
    pub already_finished: u64,
}

impl From<brood::Cancelled> for CancelReply {
    fn from(c: brood::Cancelled) -> Self {
        CancelReply {
            cancelled: c.cancelled,
            already_finished: c.already_finished as u64,
        }
    }
}

/// An item that ran out of delivery attempts.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DeadLetter {
    /// Its child.
    pub child_id: String,
    /// Its session.
    pub session_id: String,
    /// Its call.
    pub call_id: String,
    /// A result or a failure notice.
    pub kind: ItemKind,
    /// Why it was given up.
    pub reason: String,
    /// The delivery attempts made.
    pub attempts: u32,
    /// When it was given up.
    pub dead_at: u64,
}

impl From<&brood::DeadLetterInfo> for DeadLetter {
    fn from(d: &brood::DeadLetterInfo) -> Self {
        DeadLetter {
            child_id: d.child_id.clone(),
            session_id: d.session_id.clone(),
            call_id: d.call_id.clone(),
            kind: d.kind.into(),
            reason: d.reason.clone(),
            attempts: d.attempts,
            dead_at: d.dead_at_ms,
        }
    }
}

/// `GET /v1/dead-letters`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DeadLetters {
    /// The dead letters.
    pub items: Vec<DeadLetter>,
}

/// `POST /v1/dead-letters/redrive`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RedriveReply {
    /// The items put back in their sessions' ready sets.
    pub redriven: u64,
}

/// `GET /healthz`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok` (`/healthz`) or `ready` (`/readyz`).
    pub status: String,
    /// Sessions routed here.
    pub sessions: u64,
    /// Sessions whose owner could not be rebuilt.
    pub failed_sessions: u64,
}

/// A child handed to an outside worker: `POST /v1/workers/poll` (and `take`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WorkItem {
    /// The child.
    pub child_id: String,
    /// What to do.
    pub goal: String,
    /// The task's data, when it has some.
    pub input: Option<serde_json::Value>,
    /// The session whose call made the child.
    pub session_id: String,
    /// The call that made the child.
    pub call_id: String,
    /// Which run of the child this is: 1, or more when recovery runs it again.
    pub attempt: u32,
    /// When the child times out (ms since the epoch), when its task has a timeout: a
    /// completion after it is refused.
    pub deadline_at: Option<u64>,
    /// Send it with every heartbeat and the completion.
    pub token: String,
    /// The lease, renewed by heartbeats.
    pub lease_ms: u64,
}

impl From<brood::runners::external::Handout> for WorkItem {
    fn from(h: brood::runners::external::Handout) -> Self {
        let work = h.work;
        WorkItem {
            child_id: h.child_id,
            goal: work.goal,
            input: work.input,
            session_id: work.session_id,
            call_id: work.call_id,
            attempt: work.attempt,
            deadline_at: work.deadline_at_ms,
            token: h.token,
            lease_ms: h.hold_ms,
        }
    }
}

impl From<WorkItem> for brood::runners::external::Handout {
    fn from(w: WorkItem) -> Self {
        brood::runners::external::Handout {
            child_id: w.child_id,
            work: brood::runners::external::Work {
                goal: w.goal,
                input: w.input,
                session_id: w.session_id,
                call_id: w.call_id,
                attempt: w.attempt,
                deadline_at_ms: w.deadline_at,
            },
            token: w.token,
            hold_ms: w.lease_ms,
        }
    }
}

/// `POST /v1/children/{child_id}/heartbeat`: the lease was renewed.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HeartbeatReply {
    /// The child.
    pub child_id: String,
    /// The lease from now.
    pub lease_ms: u64,
}

/// `POST /v1/children/{child_id}/complete`: the outcome recorded.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CompleteReply {
    /// The child.
    pub child_id: String,
    /// How it ended.
    pub status: ChildStatus,
    /// What came of it.
    pub summary: Option<String>,
    /// What came of it, as data.
    pub output: Option<serde_json::Value>,
    /// Why it failed.
    pub error: Option<String>,
}

/// The first line of a child's summary, or of its error when it has none, cut at 120
/// characters: what a tree of many children can show of each.
pub fn summary_line(summary: Option<&str>, error: Option<&str>) -> Option<String> {
    let text = summary.filter(|s| !s.trim().is_empty()).or(error)?;
    let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
    let mut out: String = line.chars().take(120).collect();
    if line.chars().count() > 120 {
        out.push('…');
    }
    Some(out)
}
