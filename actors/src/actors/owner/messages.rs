//! What a session owner is asked, and what it answers. Each message is handled by a few lines
//! in [`super`] that call the owner's parts; the types here carry no behaviour.

use std::sync::{Arc, Mutex};

use actix::prelude::*;

use crate::error::BroodError;
use crate::model::{
    CallInfo, CallRow, CancelTarget, Cancelled, ChildInfo, ChildRow, DelegateReply, DelegateRequest, Envelope,
    EnvelopeLimits, ItemRef, SessionSettings, TaskInfo, UnitInfo, UnitRow,
};
use crate::routing::{ReleaseReason, Turn};

/// Accept a call. The request is shared with the caller, who gets it back when the call is
/// refused; `accepted` is filled with the call id once the dispatch is durable, so a caller
/// whose owner dies while a sync call runs learns which call its results will come under.
#[derive(Debug, Message)]
#[rtype(result = "Result<DelegateReply, BroodError>")]
pub struct Delegate {
    /// The request.
    pub request: Arc<DelegateRequest>,
    /// The call id, once accepted.
    pub accepted: Arc<Mutex<Option<String>>>,
}

/// Terminal rows, flushed by the coalescer, for the owner to record and publish.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Recorded {
    /// The rows.
    pub rows: Vec<ChildRow>,
}

/// A turn boundary: claim everything ready, or nothing. The envelope's `text` is left empty:
/// rendering happens off the routing thread, in the embedding API.
#[derive(Debug, Message)]
#[rtype(result = "Result<Option<Envelope>, BroodError>")]
pub struct ClaimReady {
    /// Who claims.
    pub consumer: String,
    /// Lease length in ms.
    pub lease_ms: u64,
    /// How much one envelope may hold.
    pub limits: EnvelopeLimits,
}

/// Acknowledge a claim.
#[derive(Debug, Message)]
#[rtype(result = "Result<usize, BroodError>")]
pub struct Ack {
    /// The claim.
    pub claim_id: String,
}

/// Hand a claim back.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<(), BroodError>")]
pub struct Release {
    /// The claim.
    pub claim_id: String,
    /// Busy or failed.
    pub reason: ReleaseReason,
    /// Least time before the items are ready again.
    pub retry_after_ms: u64,
}

/// Change the session's turn state.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct SetTurn(pub Turn);

/// Change a session's settings.
#[derive(Debug, Message)]
#[rtype(result = "Result<SessionInfo, BroodError>")]
pub struct Configure(pub SessionSettings);

/// The caller of a sync call received its results: now they count as delivered. Answered once
/// that is durable (or failed, and the results go out at boundaries instead).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct SyncReceived {
    /// The sync call.
    pub call_id: String,
}

/// A session's settings and turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// The session id.
    pub session_id: String,
    /// Whether a background result can reach the parent: a wake target is bound, or the
    /// session is addressable.
    pub wake_capable: bool,
    /// Whether the parent reaches the session by itself (a stored setting).
    pub addressable: bool,
    /// Idle or busy.
    pub turn: Turn,
    /// Capacity.
    pub max_concurrent_children: u32,
    /// Dead-letter limit.
    pub max_delivery_attempts: u32,
}

/// Cancel a call, a unit or a child: every unfinished child under it is recorded `cancelled`.
#[derive(Debug, Message)]
#[rtype(result = "Result<Cancelled, BroodError>")]
pub struct Cancel {
    /// What to cancel.
    pub target: CancelTarget,
    /// Who cancelled, and why: the cancelled children's error text.
    pub reason: String,
    /// The call's stored row, when no owner holds the call in memory (it is over).
    pub stored: Option<CallRow>,
}

/// The child whose session this is ended (or was cancelled): every unfinished child of the
/// session's calls is cancelled, nested descendants included, and the session accepts no more
/// calls. What had finished stays claimable.
#[derive(Debug, Message)]
#[rtype(result = "Result<Cancelled, BroodError>")]
pub struct EndNested {
    /// The cancelled children's error text.
    pub reason: String,
}

/// The status of one child of a call this owner holds; none when it holds no such call (a
/// settled call left memory: every child of it had ended).
#[derive(Debug, Message)]
#[rtype(result = "Option<crate::model::ChildStatus>")]
pub struct GetChildStatus {
    /// The call.
    pub call_id: String,
    /// The child's task index.
    pub task: u32,
}

/// One call this owner holds, with its units and children; none when it holds no such call.
#[derive(Debug, Message)]
#[rtype(result = "Option<CallStatus>")]
pub struct GetCall(pub String);

/// Start what capacity allows now (a server-wide slot was reserved for this session).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Admit;

/// Stops the owner; its supervisor, which asked, rebuilds it from the ledger (see
/// [`crate::actors::supervisor::RestartOwner`]).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Retire;

/// This process lost the session's tenure to another process (see [`crate::ledger::Tenures`]):
/// the owner stops its children without recording anything (the new holder recovers them as a
/// restart would) and stops; its supervisor does not rebuild it.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Moved;

/// Hand the session over to another process, to balance the processes sharing the ledger:
/// unless something is under way in it (a live claim, a running or queued child) and `force`
/// is false, the owner leaves the registry (requests from now on go to the supervisor, which
/// holds them until the handover ended) and answers true once no batch of its is in flight (or
/// after [`HANDOVER_PATIENCE`]); its supervisor then gives the tenure back and tells it
/// [`Moved`]. False: declined, and nothing changed.
#[derive(Debug, Message)]
#[rtype(result = "bool")]
pub struct HandOver {
    /// Hand it over even when something is under way (recovered by its taker as I6 says).
    pub force: bool,
}

/// The longest an owner handing its session over waits for its batch in flight.
pub const HANDOVER_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// A session's counts (cheap: no rows copied).
#[derive(Debug, Message)]
#[rtype(result = "SessionCounts")]
pub struct GetCounts;

/// A session's counts, with its calls in memory and its live claims.
#[derive(Debug, Message)]
#[rtype(result = "SessionStatus")]
pub struct GetStatus;

/// A session's settings and turn, and how many of its children and items are where: cheap
/// enough to poll.
#[derive(Debug, Clone)]
pub struct SessionCounts {
    /// Settings and turn.
    pub info: SessionInfo,
    /// Children waiting for capacity.
    pub queued: usize,
    /// Children running.
    pub running: usize,
    /// Items claimable now (what a wake's `ready` counts too).
    pub ready: usize,
    /// Items waiting out a backoff before they are ready again.
    pub backing_off: usize,
    /// Items in live claims.
    pub claimed: usize,
    /// Items delivered (acked or returned inline).
    pub delivered: u64,
}

/// A session's counts, calls and claims.
#[derive(Debug, Clone)]
pub struct SessionStatus {
    /// Settings, turn and counts.
    pub counts: SessionCounts,
    /// Calls still in memory (not yet fully delivered), by set.
    pub calls: Vec<CallStatus>,
    /// The live claims, oldest first.
    pub claims: Vec<LiveClaim>,
}

/// A live claim of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveClaim {
    /// Its id.
    pub claim_id: String,
    /// Who made it (the boundary's `consumer`).
    pub consumer: String,
    /// How many items it holds.
    pub items: usize,
    /// The items it holds, in the order it took them.
    pub children: Vec<ItemRef>,
    /// When the boundary made it.
    pub claimed_at_ms: u64,
    /// When its lease runs out.
    pub lease_expires_at_ms: u64,
}

/// One call of a session's status.
#[derive(Debug, Clone)]
pub struct CallStatus {
    /// The call.
    pub call: CallInfo,
    /// Its tasks, by index.
    pub tasks: Vec<TaskInfo>,
    /// Its units.
    pub units: Vec<UnitInfo>,
    /// Its children, by task index.
    pub children: Vec<ChildInfo>,
}

impl CallStatus {
    /// The status of a call from its rows: the call's, its units' and its children's (by task
    /// index).
    pub fn from_rows<'a>(
        call: &CallRow,
        units: impl IntoIterator<Item = &'a UnitRow>,
        children: impl IntoIterator<Item = &'a ChildRow>,
    ) -> CallStatus {
        CallStatus {
            call: call.into(),
            tasks: call.tasks.iter().map(TaskInfo::from).collect(),
            units: units.into_iter().map(UnitInfo::from).collect(),
            children: children.into_iter().map(ChildInfo::from).collect(),
        }
    }
}
