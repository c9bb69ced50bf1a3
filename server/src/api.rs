//! The JSON shapes of API.md, version 1: request bodies (unknown fields refused, so a typo is an
//! error rather than a silent default) and replies, and the error reply every failure answers
//! with: the right status and `{"error": {"code", "message"}}`.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use brood::{BroodError, ChildStatus, ItemKind, ReadyItem};

/// An error reply: a status, a snake_case code and a message that says what to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The code clients match on.
    pub code: &'static str,
    /// What is wrong and how to fix it.
    pub message: String,
    /// Another process sharing the ledger serves the session, here: the request is sent on
    /// there (see `forward`).
    pub moved_to: Option<String>,
}

impl ApiError {
    /// A 400 with code `invalid_request`.
    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            code: "invalid_request",
            message: message.into(),
            moved_to: None,
        }
    }

    /// Any status and code.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            moved_to: None,
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status.as_u16(), self.code, self.message)
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        let mut reply = HttpResponse::build(self.status).json(serde_json::json!({
            "error": {"code": self.code, "message": self.message}
        }));
        if let Some(address) = &self.moved_to {
            reply.extensions_mut().insert(MovedTo(address.clone()));
        }
        reply
    }
}

impl From<BroodError> for ApiError {
    fn from(e: BroodError) -> Self {
        let message = e.to_string();
        let (status, code) = match &e {
            BroodError::Invalid { field, message } => {
                return ApiError::invalid(format!("`{field}` {message}"));
            }
            BroodError::UnknownSession(_) => (StatusCode::NOT_FOUND, "unknown_session"),
            BroodError::UnknownClaim(_) => (StatusCode::NOT_FOUND, "unknown_claim"),
            BroodError::UnknownTarget { .. } => (StatusCode::NOT_FOUND, e.code()),
            BroodError::MaxDepthExceeded { .. } => (StatusCode::BAD_REQUEST, e.code()),
            BroodError::ParentEnded { .. } => (StatusCode::CONFLICT, e.code()),
            // The server, not the request, is at its bound: retry later, as with `draining`.
            BroodError::ServerFull { .. } => (StatusCode::SERVICE_UNAVAILABLE, e.code()),
            BroodError::ClaimLost(_) => (StatusCode::CONFLICT, "claim_lost"),
            BroodError::ClaimAcked(_) => (StatusCode::CONFLICT, "claim_acked"),
            BroodError::EmbedderPanicked { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "runner_factory_panicked"),
            BroodError::Ledger(_) | BroodError::Interrupted { .. } | BroodError::Stopped => {
                (StatusCode::SERVICE_UNAVAILABLE, e.code())
            }
            BroodError::SessionFailed { .. } => (StatusCode::SERVICE_UNAVAILABLE, "session_failed"),
            BroodError::LeaseLapsed { .. } => (StatusCode::SERVICE_UNAVAILABLE, e.code()),
            BroodError::Moved { address, .. } => {
                let mut moved = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.code(), message);
                moved.moved_to = Some(address.clone());
                return moved;
            }
        };
        ApiError::new(status, code, message)
    }
}

/// Parses a JSON body, naming the path of what is wrong (`tasks[2].goal: missing field`).
/// An empty body reads as `{}` where every field is optional.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    let mut de = serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            ApiError::invalid(format!("the body is not valid JSON: {inner}"))
        } else if path == "." {
            ApiError::invalid(format!("the body does not match: {inner}"))
        } else {
            ApiError::invalid(format!("`{path}`: {inner}"))
        }
    })?;
    de.end()
        .map_err(|e| ApiError::invalid(format!("the body has trailing characters: {e}")))?;
    Ok(value)
}

/// `PUT /v1/sessions/{id}`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutSession {
    /// A webhook to wake the session with.
    pub wake_url: Option<String>,
    /// Whether the client can address the session (grants wake capability when authenticated).
    pub addressable: Option<bool>,
    /// Capacity.
    pub max_concurrent_children: Option<u32>,
}

/// `POST /v1/sessions/{id}/turn`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnBody {
    /// `busy` or `idle`.
    pub state: brood::Turn,
}

/// One task of `POST /v1/sessions/{id}/delegate`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskBody {
    /// What the child should do.
    pub goal: String,
    /// The runner spec (`kind` and its fields).
    pub runner: Value,
    /// A completion group.
    pub group: Option<String>,
    /// A timeout.
    pub timeout_ms: Option<u64>,
    /// A stall timeout.
    pub stall_ms: Option<u64>,
    /// Whether recovery may re-run it.
    #[serde(default)]
    pub rerun_on_recovery: bool,
}

/// `POST /v1/sessions/{id}/delegate`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelegateBody {
    /// The tasks; not empty.
    pub tasks: Vec<TaskBody>,
    /// `background` (default) or `sync`.
    #[serde(default = "background")]
    pub mode: brood::Mode,
    /// Whether each ungrouped task is its own unit.
    #[serde(default)]
    pub independent_completions: bool,
}

fn background() -> brood::Mode {
    brood::Mode::Background
}

/// `POST /v1/sessions/{id}/boundary`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoundaryBody {
    /// Who claims.
    pub consumer: String,
    /// The lease.
    pub lease_ms: Option<u64>,
}

/// `POST /v1/claims/{id}/release`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    /// `busy` or `failed`.
    pub reason: brood::ReleaseReason,
    /// Least time before the items are ready again.
    #[serde(default)]
    pub retry_after_ms: u64,
}

/// `POST /v1/{calls,units,children}/{id}/cancel` (the body is optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    /// Why: kept in each cancelled child's error.
    #[serde(default)]
    pub reason: Option<String>,
}

/// `POST /v1/dead-letters/redrive`: exactly one of `child_ids`, `session_id`, `all`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedriveBody {
    /// The children whose dead items to put back.
    #[serde(default)]
    pub child_ids: Option<Vec<String>>,
    /// The session whose dead items to put back.
    #[serde(default)]
    pub session_id: Option<String>,
    /// Every dead item.
    #[serde(default)]
    pub all: Option<bool>,
    /// At most this many (the oldest dead first).
    #[serde(default)]
    pub limit: Option<usize>,
}

impl RedriveBody {
    /// Which dead letters it names; refused unless exactly one selector is given.
    pub fn select(self) -> Result<brood::RedriveSelect, ApiError> {
        use brood::RedriveSelect;
        match (self.child_ids, self.session_id, self.all) {
            (Some(ids), None, None) if ids.is_empty() => {
                Err(ApiError::invalid("`child_ids` must name at least one child"))
            }
            (Some(ids), None, None) => Ok(RedriveSelect::Children(ids)),
            (None, Some(s), None) if s.is_empty() => Err(ApiError::invalid("`session_id` must not be empty")),
            (None, Some(s), None) => Ok(RedriveSelect::Session(s)),
            (None, None, Some(true)) => Ok(RedriveSelect::All),
            (None, None, Some(false)) => Err(ApiError::invalid(
                "`all` is false; to redrive everything send `\"all\": true`, or name `child_ids` or a `session_id`",
            )),
            _ => Err(ApiError::invalid(
                "give exactly one of `child_ids` (a list), `session_id`, or `\"all\": true`",
            )),
        }
    }
}

/// An item as an envelope (or a sync reply) carries it.
#[derive(Debug, Serialize)]
pub struct ItemJson<'a> {
    kind: ItemKind,
    dedup_key: &'a str,
    delivery_attempt: u32,
    call_id: &'a str,
    set: u64,
    unit_id: &'a str,
    group: Option<&'a str>,
    child_id: &'a str,
    task_index: u32,
    of: u32,
    status: ChildStatus,
    summary: Option<&'a str>,
    error: Option<&'a str>,
    recovered: bool,
}

impl<'a> From<&'a ReadyItem> for ItemJson<'a> {
    fn from(i: &'a ReadyItem) -> Self {
        ItemJson {
            kind: i.kind,
            dedup_key: &i.dedup_key,
            delivery_attempt: i.delivery_attempt,
            call_id: &i.call_id,
            set: i.set,
            unit_id: &i.unit_id,
            group: i.group.as_deref(),
            child_id: &i.child_id,
            task_index: i.task_index,
            of: i.of,
            status: i.status,
            summary: i.summary.as_deref(),
            error: i.error.as_deref(),
            recovered: i.recovered,
        }
    }
}

/// Items as JSON.
pub fn items(items: &[ReadyItem]) -> Vec<ItemJson<'_>> {
    items.iter().map(ItemJson::from).collect()
}

/// The `counts` object of a session (`GET /v1/sessions/{id}`, `GET /v1/sessions`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
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

impl From<&brood::SessionStatus> for Counts {
    fn from(st: &brood::SessionStatus) -> Self {
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

/// Where the session of a refused request is served (on the error reply's extensions, for
/// the forwarding middleware to send the request on).
#[derive(Debug, Clone)]
pub(super) struct MovedTo(pub(super) String);

/// A session's `counts` object, as `GET /v1/sessions/{id}` and `GET /v1/sessions` answer it.
pub(super) fn counts_json(st: &brood::SessionStatus) -> serde_json::Value {
    serde_json::json!(Counts::from(st))
}
