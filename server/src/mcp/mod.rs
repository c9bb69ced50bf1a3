//! MCP, the Model Context Protocol: brood's turn-boundary routing as tools an agent runtime
//! calls, so that a model can hand sub-agent work to brood and read the results at its turn
//! boundaries.
//!
//! The mapping: each tool is one endpoint of API.md (`delegate`, `boundary`, `ack`,
//! `release`, `cancel`, `status`; see `tools`), checked as that endpoint checks it and
//! refused with its error code; each session is two resources, its state and its recent events
//! (see `resources`). A tool's result carries the reply's JSON as `structuredContent` and, as
//! its text, what a model reads: an envelope's text (with what to do with its claim), a sync
//! call's results, or else the JSON.
//!
//! Transports:
//! - **Streamable HTTP** at `POST /mcp` under `brood serve`: behind the same guard (Host,
//!   Origin, body type), key check (scoped keys too) and body bounds as `/v1`. Stateless: one
//!   JSON-RPC message per request, a request answered with one `application/json` response
//!   (never a stream), a notification with 202; no `Mcp-Session-Id` is issued, so there is no
//!   `GET` stream (405) and nothing to `DELETE`. A message that is not one (bad JSON, a batch,
//!   a missing `method`, an unknown member), or an `MCP-Protocol-Version` header naming a
//!   version this server does not speak, is answered 400 with the JSON-RPC error.
//! - **stdio** (`brood mcp`): newline-delimited messages; [`Embedded`] answers them over an
//!   engine of its own process, opened as `brood serve` opens one. (`brood mcp --url` relays
//!   them to a server's `/mcp` instead, and needs nothing from here.)
//!
//! Versions: the `initialize` handshake, answered with the version the client asks for when it
//! is one of `rpc::VERSIONS`, else the newest of them. The newer per-request protocol (whose
//! clients probe `server/discover` first) is not spoken: the probe is answered as an unknown
//! method (or, over HTTP, refused for its version header), and such clients fall back to
//! `initialize`. No request needs `initialize` first: every request stands alone.
//!
//! Limits: the tools answer for the sessions this process serves; with a ledger shared by
//! several processes, a session another process holds is refused (`session_moved`, naming the
//! holder) rather than forwarded, as `/v1` requests are. The events resource holds only what
//! happened since this process began watching the session.

mod recorder;
mod resources;
mod rpc;
mod tools;

use std::sync::Arc;
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Map, Value};

use self::rpc::{Message, RpcError};
use super::api::{self, ApiError};
use super::config::ServeConfig;
use super::scope::Access;
use super::state::State;
pub(crate) use recorder::Recorder;

/// The path of the MCP endpoint.
pub(super) const PATH: &str = "/mcp";

/// The header a client names the negotiated protocol version in, after `initialize`.
const VERSION_HEADER: &str = "mcp-protocol-version";

/// What a server tells a model about itself in `initialize`.
const INSTRUCTIONS: &str = "brood runs work you delegate as child tasks and hands the results back to you at \
your turn boundaries. Call `delegate` with your session id and the tasks: it returns at once, and the results \
are not in its reply, so finish what does not depend on them and end your turn. At your next turn boundary call \
`boundary` with the same session id: it returns one envelope of every result ready then; read it whole, answer \
once, and `ack` its claim_id (or `release` it when you cannot take it now). `status` shows what is queued, \
running and ready; `cancel` stops work you no longer need.";

/// What a request may reach and where it is answered.
pub(super) struct Context<'a> {
    state: &'a State,
    access: &'a Access,
    recorder: &'a Recorder,
    /// Whether outside workers can reach this process (over its HTTP API).
    workers: bool,
}

/// The answer to `message`: `None` for a notification.
async fn answer(ctx: &Context<'_>, message: Message) -> Option<Value> {
    match message {
        // `notifications/initialized`, `notifications/cancelled` (a request here is answered
        // whole or not at all) and any other: nothing to do, nothing to answer.
        Message::Notification { .. } => None,
        Message::Request { id, method, params } => Some(match call(ctx, &method, params).await {
            Ok(result) => rpc::response(&id, result),
            Err(e) => rpc::error_response(&id, &e),
        }),
    }
}

/// The result of request `method`.
async fn call(ctx: &Context<'_>, method: &str, params: Map<String, Value>) -> Result<Value, RpcError> {
    match method {
        "initialize" => initialize(&params),
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({"tools": tools::list(&ctx.state.config, ctx.workers)})),
        "tools/call" => call_tool(ctx, params).await,
        "resources/list" => resources::list(ctx, &params).await,
        "resources/templates/list" => Ok(resources::templates()),
        "resources/read" => resources::read(ctx, &params).await,
        other => Err(RpcError::new(
            rpc::METHOD_NOT_FOUND,
            format!("no method `{other}`: this server answers initialize, ping, tools/list, tools/call, resources/list, resources/templates/list and resources/read"),
        )),
    }
}

/// `initialize`: the version, what this server offers, who it is and how to use it.
fn initialize(params: &Map<String, Value>) -> Result<Value, RpcError> {
    let Some(asked) = params.get("protocolVersion").and_then(Value::as_str) else {
        return Err(RpcError::new(
            rpc::INVALID_PARAMS,
            "`protocolVersion` is missing or not a string",
        ));
    };
    Ok(json!({
        "protocolVersion": rpc::negotiate(asked),
        "capabilities": {
            "tools": {"listChanged": false},
            "resources": {"subscribe": false, "listChanged": false},
        },
        "serverInfo": {"name": "brood", "title": "brood", "version": env!("CARGO_PKG_VERSION")},
        "instructions": INSTRUCTIONS,
    }))
}

/// `tools/call`: an unknown tool is a JSON-RPC error; anything else a tool result.
async fn call_tool(ctx: &Context<'_>, mut params: Map<String, Value>) -> Result<Value, RpcError> {
    let Some(Value::String(name)) = params.remove("name") else {
        return Err(RpcError::new(rpc::INVALID_PARAMS, "`name` is missing or not a string"));
    };
    let arguments = params.remove("arguments").unwrap_or(Value::Null);
    match tools::parse(&name, arguments) {
        Ok(call) => Ok(tools::result(tools::run(ctx, call).await)),
        Err(tools::Refusal::Arguments(e)) => Ok(tools::result(Err(e))),
        Err(tools::Refusal::UnknownTool(name)) => Err(RpcError::new(
            rpc::INVALID_PARAMS,
            format!("unknown tool `{name}`: the tools are {}", tools::NAMES.join(", ")),
        )),
    }
}

/// `value` as JSON.
fn to_json(value: impl serde::Serialize) -> Result<Value, ApiError> {
    serde_json::to_value(value).map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))
}

/// A session's state, as `GET /v1/sessions/{id}` answers it (its calls not yet delivered).
async fn session_detail(ctx: &Context<'_>, id: &str) -> Result<api::SessionDetail, ApiError> {
    let brood = &ctx.state.brood;
    brood_actors::model::validate_session_id(id).map_err(brood::BroodError::from)?;
    ctx.access.session(brood, id).await?;
    let st = brood.status(id).await?;
    let around = api::Around::of(brood, id, &st.calls);
    let info = &st.counts.info;
    Ok(api::SessionDetail {
        session_id: info.session_id.clone(),
        wake_capable: info.wake_capable,
        addressable: info.addressable,
        turn: info.turn.into(),
        max_concurrent_children: info.max_concurrent_children,
        max_delivery_attempts: info.max_delivery_attempts,
        counts: api::Counts::from(&st.counts),
        parent_child_id: brood.nest(&info.session_id).map(|n| n.session_id),
        calls: st.calls.iter().map(|c| api::CallView::of(c, &around)).collect(),
        calls_next: None,
        claims: st.claims.iter().map(api::ClaimView::from).collect(),
    })
}

/// The refusal of a request whose `MCP-Protocol-Version` names a version this server does not
/// speak (none named: the client has not negotiated one, or is older than the header).
fn version_refusal(req: &HttpRequest) -> Option<Value> {
    let given = req.headers().get(VERSION_HEADER)?;
    let given = given.to_str().unwrap_or("\u{fffd}");
    if rpc::VERSIONS.contains(&given) {
        return None;
    }
    let e = RpcError::new(
        rpc::INVALID_REQUEST,
        format!(
            "MCP-Protocol-Version `{given}` is not spoken here; this server speaks {} (negotiated by initialize)",
            rpc::VERSIONS.join(", ")
        ),
    )
    .with_data(json!({"supported": rpc::VERSIONS, "requested": given}));
    Some(rpc::error_response(&Value::Null, &e))
}

/// `POST /mcp`: one JSON-RPC message, answered with one JSON response (200), nothing for a
/// notification (202), or 400 with the JSON-RPC error when it is not a message this server
/// takes.
pub(super) async fn post(
    state: web::Data<State>,
    recorder: web::Data<Recorder>,
    access: Access,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = super::state::body(&state, payload).await?;
    if let Some(refusal) = version_refusal(&req) {
        return Ok(HttpResponse::BadRequest().json(refusal));
    }
    let message = match rpc::parse(&body) {
        Ok(message) => message,
        Err(refusal) => return Ok(HttpResponse::BadRequest().json(refusal)),
    };
    let ctx = Context {
        state: &state,
        access: &access,
        recorder: &recorder,
        workers: true,
    };
    Ok(match answer(&ctx, message).await {
        Some(reply) => HttpResponse::Ok().json(reply),
        None => HttpResponse::Accepted().finish(),
    })
}

/// MCP over an engine of this process: what `brood mcp` without `--url` serves on stdio.
/// Every request reaches every session (the process's user holds the data folder); no outside
/// worker can reach it, so the `external` runner is refused.
pub struct Embedded {
    state: State,
    recorder: Recorder,
    stop: tokio::sync::watch::Sender<bool>,
}

impl std::fmt::Debug for Embedded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedded")
            .field("data_dir", &self.state.config.data_dir)
            .finish()
    }
}

impl Embedded {
    /// Opens the engine `config` describes, as `brood serve` opens its own (its ledger, its
    /// runners, what an earlier process left recovered).
    pub fn open(config: ServeConfig) -> std::io::Result<Embedded> {
        let queues = Arc::new(brood::runners::WorkQueues::new());
        let brood = super::open_engine(&config, &queues)?;
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let openapi = Arc::new(super::openapi_document(&config));
        Ok(Embedded {
            state: State {
                brood: Arc::new(brood),
                config,
                stopping,
                openapi,
                probe: Default::default(),
            },
            recorder: Recorder::default(),
            stop,
        })
    }

    /// The answer to one line of newline-delimited JSON-RPC (itself one line), or `None` for a
    /// notification.
    pub async fn answer(&self, line: &str) -> Option<String> {
        let reply = match rpc::parse(line.as_bytes()) {
            Ok(message) => {
                let ctx = Context {
                    state: &self.state,
                    access: &Access::All,
                    recorder: &self.recorder,
                    workers: false,
                };
                answer(&ctx, message).await?
            }
            Err(refusal) => refusal,
        };
        Some(reply.to_string())
    }

    /// Stops taking calls and waits, up to the configuration's `drain_timeout_ms`, for the
    /// running children to end. Returns how many still run.
    pub async fn drain(&self) -> usize {
        let _ = self.stop.send(true);
        let timeout = Duration::from_millis(self.state.config.drain_timeout_ms);
        self.state.brood.drain(timeout).await
    }

    /// Closes the engine (what is recorded stays recorded; a child still running is resolved by
    /// the next start).
    pub fn shutdown(self) {
        match Arc::try_unwrap(self.state.brood) {
            Ok(brood) => brood.shutdown(),
            Err(_) => tracing::warn!("the engine was still shared at shutdown; it closes when dropped"),
        }
    }
}

/// The OpenAPI path item of `POST /mcp`.
pub(super) fn openapi_path() -> Value {
    let id = json!({"type": ["string", "integer"], "description": "The request's id (a whole number or a string)."});
    let message = json!({
        "type": "object",
        "description": "One JSON-RPC 2.0 message of MCP (the Model Context Protocol): a request (with an `id`) or a notification (without).",
        "required": ["jsonrpc", "method"],
        "properties": {
            "jsonrpc": {"const": "2.0"},
            "id": id,
            "method": {"type": "string", "description": "initialize, ping, tools/list, tools/call, resources/list, resources/templates/list, resources/read; or a notification."},
            "params": {"type": "object"},
        },
        "additionalProperties": false,
    });
    let error = json!({
        "type": "object",
        "required": ["code", "message"],
        "properties": {"code": {"type": "integer"}, "message": {"type": "string"}, "data": {}},
        "additionalProperties": false,
    });
    let answer_id = json!({"type": ["string", "integer", "null"]});
    let result = json!({
        "type": "object",
        "required": ["jsonrpc", "id", "result"],
        "properties": {"jsonrpc": {"const": "2.0"}, "id": answer_id, "result": {"type": "object"}},
        "additionalProperties": false,
    });
    let failure = json!({
        "type": "object",
        "required": ["jsonrpc", "id", "error"],
        "properties": {"jsonrpc": {"const": "2.0"}, "id": answer_id, "error": error},
        "additionalProperties": false,
    });
    json!({"post": {
        "operationId": "mcp",
        "summary": "MCP over streamable HTTP",
        "description": "The Model Context Protocol's streamable HTTP transport, stateless: one message per request, answered with one JSON response. The tools (delegate, boundary, ack, release, cancel, status) are this API's endpoints; a tool's refusal is a result with `isError`.",
        "parameters": [{
            "name": "MCP-Protocol-Version",
            "in": "header",
            "required": false,
            "description": "The protocol version negotiated by initialize.",
            "schema": {"enum": rpc::VERSIONS},
        }],
        "requestBody": {"required": true, "content": {"application/json": {"schema": message}}},
        "responses": {
            "200": {"description": "The answer to a request: its result, or a JSON-RPC error (an unknown method or tool, bad params).", "content": {"application/json": {"schema": {"oneOf": [result, failure]}}}},
            "202": {"description": "A notification was taken."},
            "400": {"description": "Not a message this server takes (not JSON, a batch, not JSON-RPC 2.0), or a protocol version it does not speak: the JSON-RPC error.", "content": {"application/json": {"schema": failure}}},
        },
    }})
}
