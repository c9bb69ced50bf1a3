//! The request bodies and queries of API.md, version 1, with every bound the server enforces
//! stated on the type, so the OpenAPI document generated from them (`openapi`) says what the
//! server accepts. Unknown fields are refused, so a typo is an error rather than a silent
//! default. Bounds that come from the server's configuration (`max_tasks_per_call`, the lease
//! range, `max_session_capacity`) are written here at their defaults; the document is given the
//! configured ones when it is served.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::wire::{whole, whole_opt, Ended, Mode, ReleaseReason, SessionState, Turn};

/// What the id of a new session is: 1 to 256 characters of printable ASCII without `/`, `?`,
/// `#`, `%` or a space, and not `.` or `..`.
pub const NEW_SESSION_ID_PATTERN: &str = r#"^(?!\.{1,2}$)[!-"$&-.0->@-~]{1,256}$"#;

/// What the id of a session looked up is (every session id ever made, those an embedder made
/// too): 1 to 256 characters, none a control character.
pub const SESSION_ID_PATTERN: &str = r"^[^\u0000-\u001f\u007f-\u009f]{1,256}$";

/// `PUT /v1/sessions/{session_id}`: every field optional.
#[derive(Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutSession {
    /// A webhook (`http://`, at most 2048 characters) to wake the session with; grants wake
    /// capability. Loopback, private and link-local targets are refused (400) unless the
    /// server's `wake_allow` lists them. (An IPv6 literal host is accepted too, though this
    /// pattern does not show it.)
    #[schema(
        max_length = 2048,
        pattern = r"^[Hh][Tt][Tt][Pp]://(?=[^:/?#]{1,253}\.?([:/?#]|$))[A-Za-z0-9_-]{1,63}(\.[A-Za-z0-9_-]{1,63})*\.?(:(0*(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}))?)?([/?#][!-~]*)?$"
    )]
    pub wake_url: Option<String>,
    /// Whether the client can address the session again: grants wake capability.
    pub addressable: Option<bool>,
    /// The session's capacity: running children at most (default 8).
    #[serde(default, deserialize_with = "whole_opt")]
    #[schema(minimum = 1, maximum = 64)]
    pub max_concurrent_children: Option<u32>,
}

/// `POST /v1/sessions/{session_id}/turn`.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TurnBody {
    /// `busy` or `idle`.
    pub state: Turn,
}

/// One task of a delegation.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskBody {
    /// What the child should do; not blank.
    #[schema(
        min_length = 1,
        pattern = r"[^\t-\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
    )]
    pub goal: String,
    /// How the child runs: a runner spec with its `kind`.
    #[schema(value_type = Runner)]
    pub runner: Value,
    /// A completion group: the tasks of one group go out together.
    #[schema(
        min_length = 1,
        pattern = r"[^\t-\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
    )]
    pub group: Option<String>,
    /// The child ends `timed_out` after this long, in ms.
    #[serde(default, deserialize_with = "whole_opt")]
    #[schema(minimum = 1)]
    pub timeout_ms: Option<u64>,
    /// The child ends `interrupted` after this long without a heartbeat, in ms (default 450000).
    #[serde(default, deserialize_with = "whole_opt")]
    #[schema(minimum = 1)]
    pub stall_ms: Option<u64>,
    /// Whether recovery may run the child again when it was running at a crash.
    #[serde(default)]
    pub rerun_on_recovery: bool,
    /// Runs the child again when it ends `failed` or `timed_out`, before its result counts.
    pub retry: Option<RetryBody>,
    /// The task's data, any JSON value (`null` is none), at most the server's
    /// `max_input_bytes` as compact JSON: handed to the child's runner (an external worker's
    /// poll reply, a `command`'s stdin; a `sim` child hands it back as its output).
    #[serde(default)]
    pub input: Option<Value>,
}

/// A task's retry policy: attempt n + 1 starts `backoff_ms × 2^(n-1)` (at most
/// `max_backoff_ms`) after attempt n ended `failed` or `timed_out`, while n < `max_attempts`;
/// the result is the last attempt's and says how many were made (`attempts`).
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryBody {
    /// Attempts in all, the first included (default 1: none again).
    #[serde(default = "one", deserialize_with = "whole")]
    #[schema(minimum = 1, maximum = 20)]
    pub max_attempts: u32,
    /// The wait before the second attempt, in ms (default 1000, or the server's
    /// `max_retry_backoff_ms` when that is less), doubled for each after.
    #[serde(default, deserialize_with = "whole_opt")]
    #[schema(minimum = 0, maximum = 3_600_000)]
    pub backoff_ms: Option<u64>,
    /// The longest wait between attempts, in ms (default 60000, or the server's
    /// `max_retry_backoff_ms` when that is less).
    #[serde(default, deserialize_with = "whole_opt")]
    #[schema(minimum = 0, maximum = 3_600_000)]
    pub max_backoff_ms: Option<u64>,
}

fn one() -> u32 {
    1
}

/// A runner spec: what runs a child, by `kind`. `command` and `external` are refused (403)
/// unless the server allows them. A task's `runner` is read by the engine's runner registry
/// (`brood::runners`, which embedders extend); these types are its contract over HTTP, and
/// `tests/openapi.rs` holds every spec the server accepted to them.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum Runner {
    /// A simulated child.
    Sim(SimRunner),
    /// A local program.
    Command(CommandRunner),
    /// An outside worker.
    External(ExternalRunner),
}

/// `sim`: works `ms` milliseconds, then ends as `outcome` says.
#[derive(Debug, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SimRunner {
    /// `sim`.
    #[schema(pattern = "^sim$")]
    pub kind: String,
    /// How long the child works, in ms (at most one day; default 0).
    #[serde(default)]
    #[schema(minimum = 0, maximum = 86_400_000)]
    pub ms: u64,
    /// How it ends (default `ok`).
    #[serde(default)]
    pub outcome: SimOutcome,
    /// The summary it reports.
    pub summary: Option<String>,
}

/// How a `sim` child ends.
#[derive(Debug, Default, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SimOutcome {
    /// Succeeds.
    #[default]
    Ok,
    /// Fails.
    Fail,
    /// Its runner panics.
    Panic,
    /// Never ends (until its timeout, stall or cancel).
    Hang,
}

/// `command`: runs `argv` in a process group of its own.
#[derive(Debug, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CommandRunner {
    /// `command`.
    #[schema(pattern = "^command$")]
    pub kind: String,
    /// The program (not empty) and its arguments.
    #[schema(min_items = 1)]
    pub argv: Vec<CommandArg>,
    /// Variables set for the program: names not empty, without `=` or a NUL.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, CommandArg>,
    /// The folder it runs in (not empty).
    #[schema(min_length = 1)]
    pub cwd: Option<CommandArg>,
}

/// A program, argument or variable of a `command`: text without a NUL.
#[derive(Debug, Serialize, ToSchema)]
#[schema(pattern = r"^[^\u0000]*$")]
pub struct CommandArg(String);

/// `external`: waits on a queue for an outside worker.
#[derive(Debug, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExternalRunner {
    /// `external`.
    #[schema(pattern = "^external$")]
    pub kind: String,
    /// The queue workers poll for it (default `default`).
    #[serde(default)]
    pub queue: QueueName,
}

/// A queue of outside workers: 1 to 128 characters, no control characters.
#[derive(Debug, Default, Serialize, ToSchema)]
#[schema(min_length = 1, max_length = 128, pattern = r"^[^\u0000-\u001f\u007f-\u009f]*$")]
pub struct QueueName(String);

/// `POST /v1/sessions/{session_id}/delegate`.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DelegateBody {
    /// The tasks: at least one, at most the server's `max_tasks_per_call`.
    #[schema(min_items = 1, max_items = 10_000)]
    pub tasks: Vec<TaskBody>,
    /// `background` (default) or `sync`.
    #[serde(default)]
    pub mode: Mode,
    /// Whether each ungrouped task is its own unit (default: one unit for them all).
    #[serde(default)]
    pub independent_completions: bool,
    /// The caller's W3C trace context (over the `traceparent` header's): carried to every child
    /// of the call (a `command` child's `TRACEPARENT`) and its events. A malformed one refuses
    /// the call.
    #[schema(pattern = r"^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$")]
    pub traceparent: Option<String>,
    /// Makes the call idempotent (or give the `Idempotency-Key` header): a delegate with the
    /// same key and the same request is answered with the call the first one made (its reply,
    /// as it was made) instead of making another — after a lost answer, a restart or a
    /// takeover — as long as the call is kept; the same key with another request is 409
    /// `idempotency_conflict`. 1 to 255 characters, none a control character.
    #[schema(min_length = 1, max_length = 255, pattern = r"^[^\u0000-\u001f\u007f-\u009f]*$")]
    pub idempotency_key: Option<String>,
}

/// `POST /v1/sessions/{session_id}/boundary`.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BoundaryBody {
    /// Who claims: any name, not blank.
    #[schema(
        min_length = 1,
        pattern = r"[^\t-\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
    )]
    pub consumer: String,
    /// The claim's lease, in ms (default 60000).
    #[serde(default, deserialize_with = "whole_opt")]
    #[schema(minimum = 100, maximum = 3_600_000)]
    pub lease_ms: Option<u64>,
    /// At most this many items in the envelope (the oldest ready first); the rest stay ready.
    #[serde(default, deserialize_with = "whole_opt")]
    #[schema(minimum = 1)]
    pub max_items: Option<u64>,
    /// At most about this many bytes of items (their texts and data, and a few hundred bytes
    /// each for their ids); the first item goes whatever its size; the rest stay ready.
    #[serde(default, deserialize_with = "whole_opt")]
    #[schema(minimum = 1)]
    pub max_bytes: Option<u64>,
    /// A claim of this session to ack first, as `POST /v1/claims/{claim_id}/ack` would: a
    /// consumer acks what it read and claims what is ready next in one request. Should the ack
    /// be refused, its error is the answer and nothing is claimed.
    #[schema(min_length = 1, max_length = 512, pattern = r"^[^\u0000-\u001f\u007f-\u009f]*$")]
    pub ack: Option<String>,
}

/// `POST /v1/claims/{claim_id}/release`.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    /// `busy` (not a delivery attempt) or `failed` (an attempt; backs off).
    pub reason: ReleaseReason,
    /// The least time before the items are ready again, in ms.
    #[serde(default, deserialize_with = "whole")]
    pub retry_after_ms: u64,
}

/// `POST /v1/{calls,units,children}/{id}/cancel`; the body is optional.
#[derive(Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    /// Why: kept in each cancelled child's error.
    #[serde(default)]
    #[schema(max_length = 1000)]
    pub reason: Option<String>,
}

/// `POST /v1/dead-letters/redrive`: exactly one of `child_ids`, `session_id`, `"all": true`,
/// and optionally `limit`. (The document states "exactly one" as a `oneOf`; see `openapi`.)
#[derive(Debug, Default, Deserialize, Serialize, ToSchema)]
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
    #[serde(default, deserialize_with = "whole_opt")]
    #[schema(minimum = 1, maximum = 4_294_967_295_u64)]
    pub limit: Option<u64>,
}

impl RedriveBody {
    /// Which dead letters it names; refused unless exactly one selector is given.
    pub fn select(self) -> Result<brood::RedriveSelect, super::ApiError> {
        use super::ApiError;
        use brood::RedriveSelect;
        match (self.child_ids, self.session_id, self.all) {
            (Some(ids), None, None) if ids.is_empty() => {
                Err(ApiError::invalid("`child_ids` must name at least one child"))
            }
            (Some(ids), None, None) => Ok(RedriveSelect::Children(ids)),
            (None, Some(s), None) => {
                brood_actors::model::validate_session_id(&s).map_err(brood::BroodError::from)?;
                Ok(RedriveSelect::Session(s))
            }
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

/// `POST /v1/workers/poll`.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PollBody {
    /// The worker's name: 1 to 256 characters.
    #[schema(min_length = 1, max_length = 256)]
    pub worker: String,
    /// The queue to take from (default `default`).
    #[schema(value_type = Option<QueueName>)]
    pub queue: Option<String>,
    /// How long to wait for a child, in ms.
    #[serde(default, deserialize_with = "whole")]
    #[schema(minimum = 0, maximum = 30_000)]
    pub wait_ms: u64,
    /// The lease of the child handed out, in ms (default 30000); renewed by heartbeats.
    #[serde(default, deserialize_with = "whole_opt")]
    #[schema(minimum = 1_000, maximum = 3_600_000)]
    pub lease_ms: Option<u64>,
}

/// `POST /v1/children/{child_id}/heartbeat`.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatBody {
    /// The token the poll handed out.
    pub token: String,
    /// What the worker is doing.
    pub progress: Option<String>,
}

/// `POST /v1/children/{child_id}/complete`.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteBody {
    /// The token the poll handed out.
    pub token: String,
    /// How the child ended.
    pub status: Ended,
    /// What came of it.
    pub summary: Option<String>,
    /// Why it failed.
    pub error: Option<String>,
    /// The result as data, any JSON value (`null` is none), at most the server's
    /// `max_output_bytes` as compact JSON.
    #[serde(default)]
    pub output: Option<Value>,
}

/// `POST /v1/workers/take`: between processes sharing a ledger, not for workers.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TakeBody {
    /// The child listed in the shared work list.
    #[schema(min_length = 1)]
    pub child_id: String,
    /// The worker that polled.
    pub worker: String,
    /// The lease to hand out, in ms.
    #[serde(deserialize_with = "whole")]
    #[schema(minimum = 1_000, maximum = 3_600_000)]
    pub lease_ms: u64,
    /// Names the take, so that its asker can give it up.
    #[serde(default)]
    #[schema(min_length = 1)]
    pub take_id: Option<String>,
    /// When its asker stops waiting for the answer, in ms since the Unix epoch on the shared
    /// database's clock: a take read after it is refused (409 `take_expired`), so one that waited
    /// in the socket of a paused process is not served for an asker that stopped meanwhile.
    #[serde(default, deserialize_with = "whole_opt")]
    pub answer_by_ms: Option<u64>,
}

/// `POST /v1/workers/untake`: between processes sharing a ledger, not for workers.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UntakeBody {
    /// The child of the take.
    #[schema(min_length = 1)]
    pub child_id: String,
    /// The take given up.
    #[schema(min_length = 1)]
    pub take_id: String,
}

/// `POST /v1/peers/sessions`: between processes sharing a ledger, not for clients.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PeerSessionsBody {
    /// The sessions to summarize, as the asking process found them in the ledger.
    #[schema(min_items = 1, max_items = 1001)]
    pub session_ids: Vec<String>,
}

/// The query of `GET /v1/sessions`, as text: `limit` is checked by the handler, so a bad one
/// is a 400 in API.md's shape.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Sessions per page (default 100).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    pub limit: Option<String>,
    /// The page starts after this session id.
    pub after: Option<String>,
    /// Only the sessions whose id starts with this: 1 to 256 characters, none a control
    /// character.
    #[param(pattern = r"^[^\u0000-\u001f\u007f-\u009f]{1,256}$")]
    pub prefix: Option<String>,
    /// Only the sessions in this state.
    #[param(value_type = Option<SessionState>)]
    pub state: Option<String>,
}

/// The query of `GET /v1/sessions/{session_id}/deliveries`, as text (checked by the handler).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DeliveriesQuery {
    /// Only the acks that delivered items of this call, each with only those.
    #[param(min_length = 1)]
    pub call_id: Option<String>,
    /// The page starts after this claim id.
    pub after: Option<String>,
    /// Acks per page (default 100).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    pub limit: Option<String>,
}

/// The query of `GET /v1/sessions/{session_id}`, as text (checked by the handler).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct SessionQuery {
    /// `true`: every stored call, delivered ones too; otherwise the calls not yet delivered.
    #[param(value_type = Option<bool>)]
    pub delivered: Option<String>,
    /// The page of calls starts after this call id.
    pub after: Option<String>,
    /// Calls per page (default 100).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    pub limit: Option<String>,
}

/// The query of `GET /v1/dead-letters`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterQuery {
    /// Only this session's dead letters.
    #[param(pattern = r"^[^\u0000-\u001f\u007f-\u009f]{1,256}$")]
    pub session_id: Option<String>,
}
