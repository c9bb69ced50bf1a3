//! The six tools: what each is called, what its arguments are (a JSON Schema a model reads),
//! how its arguments become one request of the engine, and how the answer becomes a tool
//! result. Each tool is one endpoint of API.md, checked as that endpoint checks it (the same
//! types, bounds, key scope and error codes):
//!
//! | tool       | API.md                                          |
//! |------------|-------------------------------------------------|
//! | `delegate` | `POST /v1/sessions/{id}/delegate` (after `PUT /v1/sessions/{id}` `{"addressable": true}` when the session does not exist) |
//! | `boundary` | `POST /v1/sessions/{id}/boundary`                |
//! | `ack`      | `POST /v1/claims/{id}/ack`                       |
//! | `release`  | `POST /v1/claims/{id}/release`                   |
//! | `cancel`   | `POST /v1/{calls,units,children}/{id}/cancel`    |
//! | `status`   | `GET /v1/sessions/{id}` or `GET /v1/calls/{id}`  |
//!
//! The path's ids are arguments beside the body's fields. A task's `runner` has no default:
//! what runs a child is the caller's choice, and the schema lists the kinds this server runs.
//! A refusal is a tool result with `isError: true` whose text is brood's code and message
//! (`invalid_request: ...`, `unknown_claim: ...`), so the model can correct its call; an unknown
//! tool name is a JSON-RPC error (the caller's mistake, not the model's).

use std::time::Duration;

use actix_web::http::StatusCode;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::Context;
use crate::api::{self, ApiError};
use crate::config::ServeConfig;
use brood::{BroodError, CancelTarget, DelegateReply, SessionSettings};

/// The tools, in the order they are listed.
pub(super) const NAMES: [&str; 6] = ["delegate", "boundary", "ack", "release", "cancel", "status"];

/// The consumer a boundary names when its caller names none.
const DEFAULT_CONSUMER: &str = "mcp";

/// A tool call, its arguments checked: one engine request each.
#[derive(Debug)]
pub(super) enum ToolCall {
    Delegate {
        session_id: String,
        body: api::DelegateBody,
    },
    Boundary {
        session_id: String,
        body: api::BoundaryBody,
    },
    Ack {
        claim_id: String,
    },
    Release {
        claim_id: String,
        body: api::ReleaseBody,
    },
    Cancel {
        target: CancelTarget,
        body: api::CancelBody,
    },
    SessionStatus {
        session_id: String,
    },
    CallStatus {
        call_id: String,
    },
}

/// Why a tool call was not made.
#[derive(Debug)]
pub(super) enum Refusal {
    /// No tool has this name.
    UnknownTool(String),
    /// The arguments are wrong: a tool result with `isError`.
    Arguments(ApiError),
}

/// What a tool answered: the text a model reads, and the JSON of the reply.
#[derive(Debug)]
pub(super) struct Reply {
    text: String,
    json: Value,
}

impl Reply {
    /// A reply whose text is its JSON.
    fn json(value: impl serde::Serialize) -> Result<Reply, ApiError> {
        let json = super::to_json(value)?;
        Ok(Reply {
            text: json.to_string(),
            json,
        })
    }
}

/// The listing of `tools/list`, with this server's bounds; `workers` says whether outside
/// workers can reach this process (the `external` kind runs nothing otherwise).
pub(super) fn list(config: &ServeConfig, workers: bool) -> Value {
    let kinds = runner_kinds(config, workers);
    json!([
        {
            "name": "delegate",
            "title": "Delegate work to child tasks",
            "description": "Hand tasks to brood to run as children of your session, and go on with your turn. \
    In the background (the default) this returns at once with a call id; the results are NOT in the reply: \
    brood hands them to you at your next turn boundary (the `boundary` tool), all that is ready then in one \
    envelope, so do not wait or poll. Tasks that share a `group` come back together; the other tasks come back \
    together as one unit unless `independent_completions` is true. `mode: \"sync\"` runs the tasks now and \
    returns their results in the reply instead. The session is opened if it does not exist.",
            "inputSchema": delegate_schema(config, &kinds),
            "annotations": {"readOnlyHint": false, "destructiveHint": false, "idempotentHint": false, "openWorldHint": true},
        },
        {
            "name": "boundary",
            "title": "Collect results at a turn boundary",
            "description": "Call at a turn boundary (the start of a turn, or between turns) to collect the results of \
    work you delegated: every result ready now, in one envelope whose text you read whole and answer once. The \
    envelope is claimed for `lease_ms`: `ack` it with its `claim_id` once its results are taken into account, or \
    `release` it; an envelope neither acked nor released comes back at a later boundary when its lease runs out. \
    When nothing is ready it says so and claims nothing.",
            "inputSchema": boundary_schema(config),
            "annotations": {"readOnlyHint": false, "destructiveHint": false, "idempotentHint": false, "openWorldHint": false},
        },
        {
            "name": "ack",
            "title": "Acknowledge an envelope",
            "description": "Acknowledge the envelope of a boundary by its `claim_id`: its results are delivered, for good, \
    and never handed out again. Acking again answers the same.",
            "inputSchema": object(json!({"claim_id": claim_id()}), &["claim_id"]),
            "annotations": {"readOnlyHint": false, "destructiveHint": false, "idempotentHint": true, "openWorldHint": false},
        },
        {
            "name": "release",
            "title": "Hand an envelope back",
            "description": "Hand the envelope of a boundary back undelivered, by its `claim_id`: its results are ready \
    again at a later boundary. `busy`: you cannot take them now (no delivery attempt is counted). `failed`: taking \
    them went wrong (an attempt is counted, and they come back after a backoff; after too many attempts they are \
    dead-lettered).",
            "inputSchema": object(
                json!({
                    "claim_id": claim_id(),
                    "reason": {"enum": ["busy", "failed"], "description": "`busy` (not now) or `failed` (taking them went wrong)."},
                    "retry_after_ms": {"type": "integer", "minimum": 0, "description": "The least time before the results are ready again, in ms (default 0)."},
                }),
                &["claim_id", "reason"],
            ),
            "annotations": {"readOnlyHint": false, "destructiveHint": false, "idempotentHint": false, "openWorldHint": false},
        },
        {
            "name": "cancel",
            "title": "Cancel delegated work",
            "description": "Cancel work you no longer need: a whole call (`call_id`), one unit of it (`unit_id`) or one \
    child (`child_id`); give exactly one. Every unfinished child under it stops (queued ones never start) and comes \
    back as a result with status `cancelled` at a boundary. Cancelling again, or what already ended, changes nothing.",
            "inputSchema": object(
                json!({
                    "call_id": {"type": "string", "description": "A call, as `delegate` returned it (`deleg_<hex>`)."},
                    "unit_id": {"type": "string", "description": "A unit of a call (`<call_id>-<k>`)."},
                    "child_id": {"type": "string", "description": "A child of a call (`<call_id>.<index>`)."},
                    "reason": {"type": "string", "maxLength": brood::MAX_CANCEL_REASON, "description": "Why, kept in each cancelled child's error."},
                }),
                &[],
            ),
            "annotations": {"readOnlyHint": false, "destructiveHint": true, "idempotentHint": true, "openWorldHint": false},
        },
        {
            "name": "status",
            "title": "Show delegated work",
            "description": "Show what delegated work is doing, without claiming anything. With `session_id`: the \
    session's counts (queued, running, ready, claimed, delivered), its turn, its calls not yet delivered and its \
    live claims. With `call_id`: that call and each child's status and delivery, also once it was delivered. Give \
    exactly one.",
            "inputSchema": object(json!({"session_id": session_id(), "call_id": {"type": "string", "description": "A call, as `delegate` returned it (`deleg_<hex>`)."}}), &[]),
            "annotations": {"readOnlyHint": true, "destructiveHint": false, "idempotentHint": true, "openWorldHint": false},
        },
    ])
}

/// An object schema of `properties`, `required` of them required, no others.
fn object(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false})
}

fn session_id() -> Value {
    json!({
        "type": "string",
        "minLength": 1,
        "maxLength": 256,
        "description": "Your session: the conversation or agent the results go back to. 1 to 256 printable ASCII characters without `/`, `?`, `#`, `%` or a space; the same id at every call.",
    })
}

fn claim_id() -> Value {
    json!({"type": "string", "minLength": 1, "description": "The `claim_id` of the envelope a boundary returned."})
}

/// The runner kinds a delegation here may use.
fn runner_kinds(config: &ServeConfig, workers: bool) -> Vec<&'static str> {
    brood::runners::KINDS
        .iter()
        .copied()
        .filter(|k| config.refuses_runner(k).is_none() && (workers || *k != "external"))
        .collect()
}

/// The schema of a runner spec of each kind in `kinds`.
fn runner_schema(kinds: &[&str]) -> Value {
    let one = |kind: &str| match kind {
        "sim" => object(
            json!({
                "kind": {"const": "sim"},
                "ms": {"type": "integer", "minimum": 0, "maximum": 86_400_000, "description": "How long the child works, in ms (default 0)."},
                "outcome": {"enum": ["ok", "fail", "panic", "hang"], "description": "How it ends (default ok)."},
                "summary": {"type": "string", "description": "The result it reports."},
            }),
            &["kind"],
        ),
        "command" => object(
            json!({
                "kind": {"const": "command"},
                "argv": {"type": "array", "minItems": 1, "items": {"type": "string"}, "description": "The program and its arguments."},
                "env": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Variables set for the program."},
                "cwd": {"type": "string", "minLength": 1, "description": "The folder it runs in."},
            }),
            &["kind", "argv"],
        ),
        _ => object(
            json!({
                "kind": {"const": "external"},
                "queue": {"type": "string", "minLength": 1, "maxLength": 128, "description": "The queue outside workers poll for it (default `default`)."},
            }),
            &["kind"],
        ),
    };
    json!({
        "description": "What runs the child: `sim` a simulated child that works `ms` then ends as `outcome` says; \
    `command` a program on the server; `external` an outside worker (an agent) polling brood's queue. Only the kinds \
    listed here are allowed.",
        "oneOf": kinds.iter().map(|k| one(k)).collect::<Vec<_>>(),
    })
}

fn delegate_schema(config: &ServeConfig, kinds: &[&str]) -> Value {
    let mut timeout =
        json!({"type": "integer", "minimum": 1, "description": "The child ends `timed_out` after this long, in ms."});
    if config.max_task_timeout_ms > 0 {
        timeout["maximum"] = json!(config.max_task_timeout_ms);
    }
    let task = object(
        json!({
            "goal": {"type": "string", "minLength": 1, "description": "What the child should do, in words it can act on alone."},
            "runner": runner_schema(kinds),
            "group": {"type": "string", "minLength": 1, "description": "A completion group: the tasks of one group come back together."},
            "timeout_ms": timeout,
            "stall_ms": {"type": "integer", "minimum": 1, "description": "The child ends `timed_out` after this long without a sign of life, in ms."},
            "rerun_on_recovery": {"type": "boolean", "description": "Whether the child may run again when brood restarted while it ran (default false)."},
            "input": {"description": format!("The task's data, any JSON (at most {} bytes as JSON): handed to the child's runner (an external worker sees it).", config.max_input_bytes)},
            "retry": object(
                json!({
                    "max_attempts": {"type": "integer", "minimum": 1, "maximum": 20, "description": "Attempts in all, the first included (default 1)."},
                    "backoff_ms": {"type": "integer", "minimum": 0, "maximum": config.max_retry_backoff_ms, "description": "The wait before the second attempt, in ms, doubled for each after."},
                    "max_backoff_ms": {"type": "integer", "minimum": 0, "maximum": config.max_retry_backoff_ms, "description": "The longest wait between attempts, in ms."},
                }),
                &[],
            ),
        }),
        &["goal", "runner"],
    );
    object(
        json!({
            "session_id": session_id(),
            "tasks": {"type": "array", "minItems": 1, "maxItems": config.max_tasks_per_call, "items": task, "description": "The work, one task per child."},
            "mode": {"enum": ["background", "sync"], "description": "`background` (default): results at your next turn boundary. `sync`: run now, results in the reply."},
            "independent_completions": {"type": "boolean", "description": "Whether each task without a group comes back on its own as soon as it ends (default false: together)."},
            "traceparent": {"type": "string", "description": "A W3C trace context to carry to the children."},
            "idempotency_key": {"type": "string", "minLength": 1, "maxLength": 255, "description": "Makes the call idempotent: delegating again with the same key and the same tasks answers the call made the first time instead of making another (use it when you retry after an error)."},
        }),
        &["session_id", "tasks"],
    )
}

fn boundary_schema(config: &ServeConfig) -> Value {
    object(
        json!({
            "session_id": session_id(),
            "consumer": {"type": "string", "minLength": 1, "description": format!("Who collects (default `{DEFAULT_CONSUMER}`).")},
            "lease_ms": {
                "type": "integer",
                "minimum": config.min_lease_ms,
                "maximum": config.max_lease_ms,
                "description": format!("How long the envelope stays claimed before it comes back unacked, in ms (default {}).", config.default_lease_ms),
            },
            "max_items": {"type": "integer", "minimum": 1, "description": "At most this many results in the envelope; the rest stay ready for the next boundary (`more` says there are some)."},
            "max_bytes": {"type": "integer", "minimum": 1, "description": "At most about this many bytes of results; the first always comes; the rest stay ready."},
            "ack": {"type": "string", "minLength": 1, "maxLength": 512, "description": "The `claim_id` of this session's previous envelope, acked before this boundary collects (one call where `ack` then `boundary` would be two). Should the ack be refused, that is the answer and nothing is collected."},
        }),
        &["session_id"],
    )
}

/// Reads `T` from `value`, naming the path of what is wrong (`tasks[0].runner: missing field`).
fn read<T: DeserializeOwned>(value: Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        match path.as_str() {
            "." => ApiError::invalid(format!("the arguments do not match: {}", e.inner())),
            _ => ApiError::invalid(format!("`{path}`: {}", e.inner())),
        }
    })
}

/// Takes the string argument `name` out of `args`.
fn take_id(args: &mut Map<String, Value>, name: &str) -> Result<String, ApiError> {
    match args.remove(name) {
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(ApiError::invalid(format!(
            "`{name}` must be a string, not {}",
            super::rpc::kind(&other)
        ))),
        None => Err(ApiError::invalid(format!("`{name}` is missing"))),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AckArgs {
    claim_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelArgs {
    call_id: Option<String>,
    unit_id: Option<String>,
    child_id: Option<String>,
    reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StatusArgs {
    session_id: Option<String>,
    call_id: Option<String>,
}

/// The call tool `name` with `arguments` asks for.
pub(super) fn parse(name: &str, arguments: Value) -> Result<ToolCall, Refusal> {
    if !NAMES.contains(&name) {
        return Err(Refusal::UnknownTool(name.to_string()));
    }
    let mut args = match arguments {
        Value::Object(args) => args,
        Value::Null => Map::new(),
        other => {
            return Err(Refusal::Arguments(ApiError::invalid(format!(
                "the arguments must be an object, not {}",
                super::rpc::kind(&other)
            ))))
        }
    };
    arguments_of(name, &mut args).map_err(Refusal::Arguments)
}

fn arguments_of(name: &str, args: &mut Map<String, Value>) -> Result<ToolCall, ApiError> {
    let rest = |args: &mut Map<String, Value>| Value::Object(std::mem::take(args));
    Ok(match name {
        "delegate" => ToolCall::Delegate {
            session_id: take_id(args, "session_id")?,
            body: read(rest(args))?,
        },
        "boundary" => {
            let session_id = take_id(args, "session_id")?;
            args.entry("consumer").or_insert_with(|| json!(DEFAULT_CONSUMER));
            ToolCall::Boundary {
                session_id,
                body: read(rest(args))?,
            }
        }
        "ack" => ToolCall::Ack {
            claim_id: read::<AckArgs>(rest(args))?.claim_id,
        },
        "release" => ToolCall::Release {
            claim_id: take_id(args, "claim_id")?,
            body: read(rest(args))?,
        },
        "cancel" => {
            let a: CancelArgs = read(rest(args))?;
            let target = match (a.call_id, a.unit_id, a.child_id) {
                (Some(id), None, None) => CancelTarget::Call(id),
                (None, Some(id), None) => CancelTarget::Unit(id),
                (None, None, Some(id)) => CancelTarget::Child(id),
                _ => {
                    return Err(ApiError::invalid(
                        "give exactly one of `call_id`, `unit_id` and `child_id`",
                    ))
                }
            };
            ToolCall::Cancel {
                target,
                body: api::CancelBody { reason: a.reason },
            }
        }
        _ => match read::<StatusArgs>(rest(args))? {
            StatusArgs {
                session_id: Some(session_id),
                call_id: None,
            } => ToolCall::SessionStatus { session_id },
            StatusArgs {
                session_id: None,
                call_id: Some(call_id),
            } => ToolCall::CallStatus { call_id },
            _ => return Err(ApiError::invalid("give exactly one of `session_id` and `call_id`")),
        },
    })
}

/// The `CallToolResult` of a tool's answer.
pub(super) fn result(answer: Result<Reply, ApiError>) -> Value {
    match answer {
        Ok(reply) => json!({
            "content": [{"type": "text", "text": reply.text}],
            "structuredContent": reply.json,
            "isError": false,
        }),
        Err(e) => json!({
            "content": [{"type": "text", "text": format!("{}: {}", e.code, e.message)}],
            "structuredContent": {"error": {"code": e.code, "message": e.message}},
            "isError": true,
        }),
    }
}

/// Makes the call.
pub(super) async fn run(ctx: &Context<'_>, call: ToolCall) -> Result<Reply, ApiError> {
    match call {
        ToolCall::Delegate { session_id, body } => delegate(ctx, &session_id, body).await,
        ToolCall::Boundary { session_id, body } => boundary(ctx, &session_id, body).await,
        ToolCall::Ack { claim_id } => {
            crate::routes::reach_claim(ctx.state, ctx.access, &claim_id).await?;
            let delivered = ctx.state.brood.ack(&claim_id).await?;
            Reply::json(api::AckReply {
                delivered: delivered as u64,
            })
        }
        ToolCall::Release { claim_id, body } => {
            crate::routes::reach_claim(ctx.state, ctx.access, &claim_id).await?;
            let retry_after = Duration::from_millis(body.retry_after_ms);
            ctx.state
                .brood
                .release(&claim_id, body.reason.into(), retry_after)
                .await?;
            Reply::json(api::ReleaseReply {
                claim_id,
                released: true,
            })
        }
        ToolCall::Cancel { target, body } => {
            if let Some(call_id) = target.call_id() {
                crate::routes::reach_call(ctx.state, ctx.access, target.kind(), target.id(), call_id).await?;
            }
            let done = ctx
                .state
                .brood
                .cancel(target, "an MCP request", body.reason.as_deref())
                .await?;
            Reply::json(api::CancelReply::from(done))
        }
        ToolCall::SessionStatus { session_id } => Reply::json(super::session_detail(ctx, &session_id).await?),
        ToolCall::CallStatus { call_id } => {
            crate::routes::reach_call(ctx.state, ctx.access, "call", &call_id, &call_id).await?;
            let call = ctx.state.brood.call(&call_id).await?;
            let around = api::Around::of(&ctx.state.brood, &call.call.session_id, [&call]);
            Reply::json(api::CallDetail::of(&call, &around))
        }
    }
}

/// `external` refused where no outside worker can reach this process.
fn workers_reach(ctx: &Context<'_>, body: &api::DelegateBody) -> Result<(), ApiError> {
    if ctx.workers {
        return Ok(());
    }
    match body.tasks.iter().position(|t| t.runner.get("kind") == Some(&json!("external"))) {
        None => Ok(()),
        Some(i) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "runner_not_allowed",
            format!(
                "`tasks[{i}].runner.kind`: `external` children are run by outside workers polling brood's HTTP API, which \
this process does not serve (`brood mcp` without --url); run `brood serve` and `brood mcp --url`, or use another runner"
            ),
        )),
    }
}

async fn delegate(ctx: &Context<'_>, session_id: &str, body: api::DelegateBody) -> Result<Reply, ApiError> {
    let state = ctx.state;
    brood_actors::model::validate_session_id(session_id).map_err(BroodError::from)?;
    ctx.access.session(&state.brood, session_id).await?;
    state.accepting()?;
    workers_reach(ctx, &body)?;
    let traceparent = body.traceparent.clone();
    let mut request = crate::routes::tasks(state, body)?;
    if let Some(tp) = traceparent {
        request = request.traceparent(tp);
    }
    open_if_missing(ctx, session_id).await?;
    ctx.recorder.watch(&state.brood, session_id).await;
    let reply = state
        .brood
        .delegate(session_id, request)
        .await
        .map_err(|e| ApiError::from(e.error))?;
    delegated(reply)
}

/// Opens the session as `PUT /v1/sessions/{id}` `{"addressable": true}` does when it does not
/// exist: addressable, so its calls stay in the background (the caller reaches it again through
/// `boundary`). A session that exists keeps its settings.
async fn open_if_missing(ctx: &Context<'_>, session_id: &str) -> Result<(), ApiError> {
    let state = ctx.state;
    match state.brood.counts(session_id).await {
        Ok(_) => Ok(()),
        Err(BroodError::UnknownSession(_)) => {
            state
                .brood
                .open_session_with_defaults(
                    session_id,
                    SessionSettings::default().addressable(true),
                    state.config.max_concurrent_children,
                    state.config.max_delivery_attempts,
                )
                .await?;
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// A delegation's reply, as `POST …/delegate` answers it; a sync call's text is its note and
/// its results as a model reads them.
fn delegated(reply: DelegateReply) -> Result<Reply, ApiError> {
    match reply {
        DelegateReply::Background {
            call_id,
            set,
            units,
            note,
        } => Reply::json(api::DelegateBackground {
            call_id,
            set,
            mode: api::Mode::Background,
            units: units
                .into_iter()
                .map(|u| api::UnitRef {
                    unit_id: u.unit_id,
                    tasks: u.tasks,
                })
                .collect(),
            note,
        }),
        DelegateReply::Sync {
            call_id,
            set,
            forced_sync_reason,
            results,
            note,
            text,
            ..
        } => {
            let shown = format!("{note}\n\n{text}");
            let mut reply = Reply::json(api::DelegateSync {
                call_id,
                set,
                mode: api::Mode::Sync,
                forced_sync_reason,
                results: api::items(&results),
                note,
                text,
            })?;
            reply.text = shown;
            Ok(reply)
        }
    }
}

async fn boundary(ctx: &Context<'_>, session_id: &str, body: api::BoundaryBody) -> Result<Reply, ApiError> {
    let state = ctx.state;
    brood_actors::model::validate_session_id(session_id).map_err(BroodError::from)?;
    ctx.access.session(&state.brood, session_id).await?;
    let claimed = crate::routes::take_boundary(state, ctx.access, session_id, &body).await?;
    envelope_reply(claimed.as_ref().map(api::Envelope::from))
}

/// A boundary's reply: the envelope, its text followed by what to do with its claim; or, when
/// nothing was ready, an envelope of nothing that claims nothing.
fn envelope_reply(envelope: Option<api::Envelope>) -> Result<Reply, ApiError> {
    Ok(match envelope {
        Some(env) => {
            let text = format!(
                "{}\n[brood] claim_id: {} — once these results are taken into account, call `ack` with it; to have them \
handed out again, call `release` with it (reason `busy`: not now, `failed`: taking them went wrong).",
                env.text.trim_end(),
                env.claim_id
            );
            Reply {
                text,
                json: super::to_json(&env)?,
            }
        }
        None => {
            let text = "Nothing is ready at this boundary: no results arrived since the last one was claimed.";
            Reply {
                text: text.to_string(),
                json: json!({"claim_id": null, "items": [], "text": text}),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(name: &str, args: Value) -> ApiError {
        match parse(name, args) {
            Err(Refusal::Arguments(e)) => e,
            other => panic!("{name}: {other:?}"),
        }
    }

    #[test]
    fn each_tool_is_listed_with_an_object_schema_and_a_description() {
        let tools = list(&ServeConfig::default(), true);
        let names: Vec<&str> = tools
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["name"].as_str())
            .collect();
        assert_eq!(names, NAMES);
        for tool in tools.as_array().into_iter().flatten() {
            assert_eq!(tool["inputSchema"]["type"], "object", "{tool}");
            assert!(tool["description"].as_str().is_some_and(|d| d.len() > 80), "{tool}");
        }
    }

    #[test]
    fn the_runner_kinds_listed_are_those_the_server_runs() {
        let kinds = |config: &ServeConfig, workers: bool| -> Vec<Value> {
            let tools = list(config, workers);
            tools[0]["inputSchema"]["properties"]["tasks"]["items"]["properties"]["runner"]["oneOf"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| r["properties"]["kind"]["const"].clone())
                .collect()
        };
        let config = ServeConfig::default();
        assert_eq!(kinds(&config, true), [json!("sim"), json!("external")]);
        assert_eq!(
            kinds(&config, false),
            [json!("sim")],
            "no worker reaches an embedded engine"
        );
        let commands = ServeConfig {
            allow_command: true,
            ..ServeConfig::default()
        };
        assert_eq!(
            kinds(&commands, true),
            [json!("sim"), json!("command"), json!("external")]
        );
    }

    #[test]
    fn every_property_the_delegate_schema_names_is_one_the_api_takes() {
        let args = json!({
            "session_id": "s",
            "tasks": [{"goal": "g", "runner": {"kind": "sim"}, "group": "x", "timeout_ms": 5, "stall_ms": 5, "rerun_on_recovery": true}],
            "mode": "sync", "independent_completions": true,
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        });
        let schema = &list(&ServeConfig::default(), true)[0]["inputSchema"];
        for key in args.as_object().into_iter().flat_map(|a| a.keys()) {
            assert!(schema["properties"].get(key).is_some(), "{key}");
        }
        match parse("delegate", args) {
            Ok(ToolCall::Delegate { session_id, body }) => {
                assert_eq!(session_id, "s");
                assert_eq!(body.tasks[0].group.as_deref(), Some("x"));
                assert_eq!(body.mode, api::Mode::Sync);
                assert!(body.independent_completions);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unknown_tool_is_not_a_tool_result() {
        assert!(matches!(parse("deploy", json!({})), Err(Refusal::UnknownTool(n)) if n == "deploy"));
    }

    #[test]
    fn a_bad_argument_is_refused_naming_it() {
        for (name, args, named) in [
            ("delegate", json!({"tasks": []}), "`session_id` is missing"),
            (
                "delegate",
                json!({"session_id": 7, "tasks": []}),
                "`session_id` must be a string, not a number",
            ),
            (
                "delegate",
                json!({"session_id": "s", "tasks": [{"goal": "g"}]}),
                "missing field `runner`",
            ),
            (
                "delegate",
                json!({"session_id": "s", "tasks": [{"goal": "g", "runner": {}, "colour": 1}]}),
                "`tasks[0].colour`: unknown field `colour`",
            ),
            ("delegate", json!({"session_id": "s"}), "missing field `tasks`"),
            ("boundary", json!({"session_id": "s", "lease_ms": "soon"}), "`lease_ms`"),
            ("ack", json!({}), "missing field `claim_id`"),
            ("ack", json!({"claim_id": "c", "extra": 1}), "unknown field `extra`"),
            (
                "release",
                json!({"claim_id": "c", "reason": "tired"}),
                "`reason`: unknown variant `tired`",
            ),
            (
                "cancel",
                json!({"call_id": "a", "child_id": "b"}),
                "exactly one of `call_id`, `unit_id` and `child_id`",
            ),
            ("status", json!({}), "exactly one of `session_id` and `call_id`"),
            ("status", json!([]), "the arguments must be an object, not an array"),
        ] {
            let e = refused(name, args.clone());
            assert_eq!(e.code, "invalid_request", "{name} {args}");
            assert!(e.message.contains(named), "{name} {args}: {}", e.message);
        }
    }

    #[test]
    fn calls_name_their_target() {
        assert!(matches!(
            parse("boundary", json!({"session_id": "s"})),
            Ok(ToolCall::Boundary { session_id, body }) if session_id == "s" && body.consumer == DEFAULT_CONSUMER && body.lease_ms.is_none()
        ));
        assert!(matches!(
            parse("ack", json!({"claim_id": "c"})),
            Ok(ToolCall::Ack { claim_id }) if claim_id == "c"
        ));
        assert!(matches!(
            parse("release", json!({"claim_id": "c", "reason": "busy", "retry_after_ms": 5})),
            Ok(ToolCall::Release { claim_id, body }) if claim_id == "c" && body.retry_after_ms == 5
        ));
        assert!(matches!(
            parse("cancel", json!({"unit_id": "u", "reason": "done"})),
            Ok(ToolCall::Cancel { target: CancelTarget::Unit(u), body }) if u == "u" && body.reason.as_deref() == Some("done")
        ));
        assert!(matches!(
            parse("status", json!({"call_id": "d"})),
            Ok(ToolCall::CallStatus { call_id }) if call_id == "d"
        ));
        assert!(matches!(
            parse("status", json!({"session_id": "s"})),
            Ok(ToolCall::SessionStatus { session_id }) if session_id == "s"
        ));
    }

    #[test]
    fn a_refusal_is_an_error_result_saying_brood_s_code_and_message() {
        let r = result(Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_claim",
            "no claim `c`",
        )));
        assert_eq!(r["isError"], true);
        assert_eq!(r["content"][0]["text"], "unknown_claim: no claim `c`");
        assert_eq!(r["structuredContent"]["error"]["code"], "unknown_claim");
    }

    #[test]
    fn an_envelope_s_text_says_what_to_do_with_its_claim() {
        let env = api::Envelope {
            claim_id: "claim-1".into(),
            lease_expires_at: 9,
            items: vec![],
            more: false,
            text: "[brood] Results…\n".into(),
        };
        let reply = envelope_reply(Some(env)).unwrap();
        assert!(
            reply.text.starts_with("[brood] Results…\n[brood] claim_id: claim-1"),
            "{}",
            reply.text
        );
        assert_eq!(reply.json["claim_id"], "claim-1");
        let nothing = envelope_reply(None).unwrap();
        assert_eq!(nothing.json["claim_id"], Value::Null);
        assert!(nothing.text.starts_with("Nothing is ready"));
        let r = result(Ok(nothing));
        assert_eq!(r["isError"], false);
        assert_eq!(r["content"][0]["type"], "text");
    }
}
