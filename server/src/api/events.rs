//! The events of `GET /v1/sessions/{session_id}/events`, as JSON: each event's `data` is one
//! of these bodies with the session, its sequence number and when it happened
//! ([`EventData`]); [`SseEvent`] describes one event of the stream as the OpenAPI document
//! states it (its `event` name, its `id`, its `data` as text holding the JSON).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::wire::ChildStatus;

/// The name of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventName {
    /// A child's status changed ([`ChildEvent`]).
    Child,
    /// The count of ready items changed; also the first event of a stream ([`ReadyEvent`]).
    Ready,
    /// The session was woken ([`ReadyEvent`]).
    Wake,
    /// A child failed while its unit is incomplete ([`FailureNoticeEvent`]).
    FailureNotice,
    /// A claim was made or ended ([`ClaimEvent`]).
    Claim,
    /// A cancel was applied ([`CancelEvent`]).
    Cancel,
    /// The last event of a stream that fell too far behind ([`DroppedEvent`]).
    Dropped,
}

/// An event's `data`: its body with the session, its sequence number and when it happened.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EventData<T> {
    /// The session.
    pub session_id: String,
    /// The event's number in the session's stream (0 for a stream's first `ready`).
    pub seq: u64,
    /// When it happened.
    pub at: u64,
    /// What happened.
    #[serde(flatten)]
    pub body: T,
}

/// `child`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ChildEvent {
    /// The child.
    pub child_id: String,
    /// Its call.
    pub call_id: String,
    /// Its task's index.
    pub task_index: u32,
    /// Its status now.
    pub status: ChildStatus,
    /// Its attempt: 1, or more when it was run again (a retry, or recovery).
    pub attempts: u32,
    /// Its result data, once it ended with some.
    pub output: Option<serde_json::Value>,
    /// The W3C trace context its call was delegated with; absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")]
    pub traceparent: Option<String>,
}

/// `ready` and `wake`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ReadyEvent {
    /// Items ready now.
    pub ready: u64,
}

/// `failure_notice`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FailureNoticeEvent {
    /// The child that failed.
    pub child_id: String,
    /// Its call.
    pub call_id: String,
    /// How it ended.
    pub status: ChildStatus,
    /// Why.
    pub error: Option<String>,
}

/// `cancel`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CancelEvent {
    /// What was cancelled: `call`, `unit` or `child`.
    pub kind: String,
    /// Its id.
    pub id: String,
    /// The children the cancel ended.
    pub cancelled: Vec<String>,
    /// Who asked, and why.
    pub reason: String,
}

/// What happened to a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClaimChange {
    /// A boundary claimed items.
    Claimed,
    /// Its items were delivered.
    Acked,
    /// The consumer released it.
    Released,
    /// Its lease ran out.
    Expired,
}

impl From<brood::ClaimChange> for ClaimChange {
    fn from(c: brood::ClaimChange) -> Self {
        match c {
            brood::ClaimChange::Claimed => ClaimChange::Claimed,
            brood::ClaimChange::Acked => ClaimChange::Acked,
            brood::ClaimChange::Released => ClaimChange::Released,
            brood::ClaimChange::Expired => ClaimChange::Expired,
        }
    }
}

/// `claim`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ClaimEvent {
    /// The claim.
    pub claim_id: String,
    /// What happened to it.
    pub change: ClaimChange,
    /// The items it holds.
    pub items: u64,
}

/// `dropped`: the client fell more than the stream's buffer behind; it reconnects and reads
/// the session's state.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DroppedEvent {
    /// `lagged`.
    pub reason: String,
    /// Events it missed.
    pub missed: u64,
}

/// One event of the stream, as server-sent events frame it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SseEvent {
    /// The event's `seq` (none on `dropped`).
    #[schema(pattern = "^[0-9]+$")]
    pub id: Option<String>,
    /// Its name.
    pub event: EventName,
    /// Its JSON: the session's id, `seq`, `at`, and the fields of the event's body.
    #[schema(content_media_type = "application/json")]
    pub data: String,
}

/// An event's `data` as the stream sends it: one line of JSON.
pub fn data(ev: &brood::SessionEvent) -> String {
    use brood::Event;
    let (session_id, seq, at) = (ev.session_id.clone(), ev.seq, ev.at_ms);
    let json = |body| -> String {
        serde_json::to_string(&EventData {
            session_id,
            seq,
            at,
            body,
        })
        .unwrap_or_default()
    };
    match &ev.event {
        Event::Child {
            child_id,
            call_id,
            task_index,
            status,
            attempts,
            output,
            traceparent,
        } => json(Body::Child(ChildEvent {
            child_id: child_id.clone(),
            call_id: call_id.clone(),
            task_index: *task_index,
            status: (*status).into(),
            attempts: *attempts,
            output: super::replies::data(output.as_deref()),
            traceparent: traceparent.clone(),
        })),
        Event::Ready { ready } | Event::Wake { ready } => json(Body::Ready(ReadyEvent { ready: *ready as u64 })),
        Event::FailureNotice {
            child_id,
            call_id,
            status,
            error,
        } => json(Body::FailureNotice(FailureNoticeEvent {
            child_id: child_id.clone(),
            call_id: call_id.clone(),
            status: (*status).into(),
            error: error.clone(),
        })),
        Event::Cancel {
            kind,
            id,
            cancelled,
            reason,
        } => json(Body::Cancel(CancelEvent {
            kind: kind.to_string(),
            id: id.clone(),
            cancelled: cancelled.clone(),
            reason: reason.clone(),
        })),
        Event::Claim {
            claim_id,
            change,
            items,
        } => json(Body::Claim(ClaimEvent {
            claim_id: claim_id.clone(),
            change: (*change).into(),
            items: *items as u64,
        })),
    }
}

/// The body of one event, written as its fields (the event's name is in its frame).
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Body {
    Child(ChildEvent),
    Ready(ReadyEvent),
    FailureNotice(FailureNoticeEvent),
    Cancel(CancelEvent),
    Claim(ClaimEvent),
}
