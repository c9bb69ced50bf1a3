//! `GET /v1/openapi.json`: the OpenAPI 3.1 document of API.md, generated from the contract's
//! types (`api`) and the operations of the routes (`#[utoipa::path]` on each handler), then
//! completed with what holds for every operation alike — the key, the refusals of the guard
//! and of the body read, the error reply — and with the bounds this server's configuration
//! sets (`max_tasks_per_call`, the lease range, `max_session_capacity`, `max_task_timeout_ms`).
//! What the server enforces, the document states: `tests/openapi.rs` holds real replies and
//! refusals to it, and CI runs Schemathesis against it.

use actix_web::{web, HttpResponse};
use serde_json::{json, Map, Value};
use utoipa::OpenApi;

use super::api;
use super::config::ServeConfig;
use super::state::State;

/// The operations and schemas of API.md.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "brood",
        description = "Durable, turn-boundary routing of delegated child work (API.md, version 1).",
        version = "1"
    ),
    paths(
        super::routes::healthz,
        super::routes::readyz,
        super::metrics::scrape,
        super::ui,
        document,
        super::listing::list_sessions,
        super::routes::put_session,
        super::routes::get_session,
        super::routes::list_deliveries,
        super::routes::set_turn,
        super::routes::delegate,
        super::routes::boundary,
        super::events::stream,
        super::routes::ack,
        super::routes::release,
        super::routes::dead_letters,
        super::routes::redrive,
        super::workers::poll,
        super::workers::take,
        super::workers::untake,
        super::listing::peer_sessions,
        super::routes::get_call,
        super::routes::cancel_call,
        super::routes::cancel_unit,
        super::routes::cancel_child,
        super::workers::heartbeat,
        super::workers::complete,
    ),
    components(schemas(
        api::ErrorReply,
        api::events::EventName,
        api::events::ChildEvent,
        api::events::ReadyEvent,
        api::events::FailureNoticeEvent,
        api::events::CancelEvent,
        api::events::ClaimEvent,
        api::events::DroppedEvent,
        api::SessionState,
    ))
)]
struct ApiDoc;

/// Whether requests to `path` must carry the key: those of `/v1` and `/mcp`.
fn keyed(path: &str) -> bool {
    path.starts_with("/v1/") || path == super::mcp::PATH
}

/// A status every `/v1` operation may answer, or every operation with a body: the code, what
/// it means, and which operations.
struct Common {
    status: &'static str,
    description: &'static str,
    applies: fn(path: &str, has_body: bool) -> bool,
}

const COMMON: &[Common] = &[
    Common {
        status: "401",
        description: "No key, or a wrong one (`unauthorized`).",
        applies: |path, _| keyed(path),
    },
    Common {
        status: "403",
        description: "Refused: a request from a web page of another site (`forbidden_host`, `cross_origin`), a key scoped to other sessions (`out_of_scope`), or what the server does not allow.",
        applies: |_, _| true,
    },
    Common {
        status: "400",
        description: "The body or a parameter is malformed or out of bounds (`invalid_request`, …).",
        applies: |_, has_body| has_body,
    },
    Common {
        status: "408",
        description: "The body did not arrive within `body_timeout_ms` (`body_timeout`).",
        applies: |_, has_body| has_body,
    },
    Common {
        status: "413",
        description: "The body is over the limit (`body_too_large`).",
        applies: |_, has_body| has_body,
    },
    Common {
        status: "415",
        description: "A body that is not `Content-Type: application/json` (`unsupported_media_type`).",
        applies: |_, has_body| has_body,
    },
    Common {
        status: "400",
        description: "A session id no session can have (`invalid_request`).",
        applies: |path, _| path.contains("{session_id}"),
    },
    Common {
        status: "503",
        description: "Try again later: the server drains (`draining`), its ledger failed (`ledger_error`), or the session is served elsewhere and could not be reached (`session_moved`, `lease_lapsed`).",
        applies: |path, _| path.starts_with("/v1/") && path != "/v1/openapi.json",
    },
];

/// The document this server serves: its operations, with the bounds of `config`.
pub(super) fn document_for(config: &ServeConfig) -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_else(|_| json!({}));
    // Not an operation of this API's types: MCP's JSON-RPC, described where it is answered.
    doc["paths"][super::mcp::PATH] = super::mcp::openapi_path();
    add_common_responses(&mut doc);
    doc["security"] = json!([{"bearer": []}]);
    doc["components"]["securitySchemes"] = json!({
        "bearer": {"type": "http", "scheme": "bearer", "description": "The server's API key (`--api-key`), or a scoped key."}
    });
    doc["components"]["schemas"]["RedriveBody"] = redrive_schema();
    // What the derive cannot say: a `command`'s variable names, and its program not empty.
    let command = &mut doc["components"]["schemas"]["CommandRunner"]["properties"];
    command["env"]["propertyNames"] = json!({"minLength": 1, "pattern": r"^[^=\u0000]+$"});
    command["argv"]["prefixItems"] = json!([{"minLength": 1}]);
    unsigned_integers(&mut doc);
    add_event_fields(&mut doc);
    close_replies(&mut doc);
    params_are_never_null(&mut doc);
    bound_idempotency_key_header(&mut doc);
    for (pointer, value) in configured_bounds(config) {
        if let Some(slot) = doc.pointer_mut(pointer) {
            *slot = value;
        }
    }
    // Outside `/v1` and `/mcp` no key is asked for.
    if let Some(paths) = doc["paths"].as_object_mut() {
        for (path, ops) in paths.iter_mut() {
            if keyed(path) {
                continue;
            }
            for op in ops.as_object_mut().into_iter().flat_map(|o| o.values_mut()) {
                op["security"] = json!([]);
            }
        }
    }
    doc
}

/// Every object the server sends names all its fields: a reply with another is not this
/// document's (request bodies refuse unknown fields already).
fn close_replies(doc: &mut Value) {
    let Some(schemas) = doc["components"]["schemas"].as_object_mut() else {
        return;
    };
    for schema in schemas.values_mut() {
        if schema.get("properties").is_some() && schema.get("additionalProperties").is_none() {
            schema["additionalProperties"] = Value::Bool(false);
        }
    }
}

/// A query or header parameter is text or absent, never JSON's `null` (an `Option` of a
/// parameter means it may be left out, which `required: false` says).
fn params_are_never_null(doc: &mut Value) {
    let Some(paths) = doc["paths"].as_object_mut() else {
        return;
    };
    let params = paths
        .values_mut()
        .filter_map(Value::as_object_mut)
        .flat_map(|ops| ops.values_mut())
        .filter_map(|op| op.get_mut("parameters").and_then(Value::as_array_mut))
        .flatten();
    for param in params {
        if let Some(types) = param.pointer_mut("/schema/type").and_then(Value::as_array_mut) {
            types.retain(|t| t != "null");
            if types.len() == 1 {
                let only = types[0].clone();
                param["schema"]["type"] = only;
            }
        }
    }
}

/// The `Idempotency-Key` header has the bounds of the body's `idempotency_key`.
fn bound_idempotency_key_header(doc: &mut Value) {
    let Some(params) = doc
        .pointer_mut("/paths/~1v1~1sessions~1{session_id}~1delegate/post/parameters")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for param in params.iter_mut().filter(|p| p["name"] == "Idempotency-Key") {
        param["schema"] =
            json!({"type": "string", "minLength": 1, "maxLength": 255, "pattern": r"^[!-~]([ -~]*[!-~])?$"});
    }
}

/// Every integer of the contract is unsigned, of 32 or 64 bits: the document says so by its
/// bounds (`format: int32`/`int64` would say signed ones).
fn unsigned_integers(doc: &mut Value) {
    fn walk(v: &mut Value) {
        match v {
            Value::Object(map) => {
                let max = match map.get("format").and_then(Value::as_str) {
                    Some("int32") => Some(json!(u32::MAX)),
                    Some("int64") => Some(json!(u64::MAX)),
                    _ => None,
                };
                if let Some(max) = max {
                    map.remove("format");
                    map.entry("minimum").or_insert(json!(0));
                    map.entry("maximum").or_insert(max);
                }
                map.values_mut().for_each(walk);
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(doc);
}

/// An event's `data` holds its body's fields and the session, its `seq` and when (`at`).
fn add_event_fields(doc: &mut Value) {
    let events = [
        "ChildEvent",
        "ReadyEvent",
        "FailureNoticeEvent",
        "CancelEvent",
        "ClaimEvent",
    ];
    for name in events {
        let schema = &mut doc["components"]["schemas"][name];
        schema["properties"]["session_id"] = json!({"type": "string", "description": "The session."});
        schema["properties"]["seq"] = json!({"type": "integer", "minimum": 0, "description": "The event's number in the session's stream (0 for a stream's first `ready`)."});
        schema["properties"]["at"] = json!({"type": "integer", "minimum": 0, "description": "When it happened."});
        if let Some(required) = schema["required"].as_array_mut() {
            required.extend(["session_id", "seq", "at"].map(Value::from));
        }
    }
}

/// Where the configuration's bounds go in the document.
fn configured_bounds(config: &ServeConfig) -> Vec<(&'static str, Value)> {
    vec![
        (
            "/components/schemas/DelegateBody/properties/tasks/maxItems",
            json!(config.max_tasks_per_call),
        ),
        (
            "/components/schemas/BoundaryBody/properties/lease_ms/minimum",
            json!(config.min_lease_ms),
        ),
        (
            "/components/schemas/BoundaryBody/properties/lease_ms/maximum",
            json!(config.max_lease_ms),
        ),
        (
            "/components/schemas/PutSession/properties/max_concurrent_children/maximum",
            json!(config.max_session_capacity),
        ),
    ]
    .into_iter()
    .chain(
        [
            "/components/schemas/RetryBody/properties/backoff_ms/maximum",
            "/components/schemas/RetryBody/properties/max_backoff_ms/maximum",
        ]
        .map(|pointer| (pointer, json!(config.max_retry_backoff_ms))),
    )
    .chain((config.max_task_timeout_ms > 0).then(|| {
        (
            "/components/schemas/TaskBody/properties/timeout_ms/maximum",
            json!(config.max_task_timeout_ms),
        )
    }))
    .collect()
}

/// The error reply on every status from 400 up that an operation answers, and the statuses
/// every operation of its kind may answer ([`COMMON`]).
fn add_common_responses(doc: &mut Value) {
    let error = json!({"application/json": {"schema": {"$ref": "#/components/schemas/ErrorReply"}}});
    let Some(paths) = doc["paths"].as_object_mut() else {
        return;
    };
    for (path, ops) in paths.iter_mut() {
        let Some(ops) = ops.as_object_mut() else {
            continue;
        };
        for op in ops.values_mut() {
            // One document, one API: no grouping by the module a handler sits in.
            if let Some(op) = op.as_object_mut() {
                op.remove("tags");
            }
            let has_body = op.get("requestBody").is_some();
            let responses = op["responses"].as_object_mut().map(std::mem::take).unwrap_or_default();
            let mut responses: Map<String, Value> = responses;
            for common in COMMON {
                if (common.applies)(path, has_body) && !responses.contains_key(common.status) {
                    responses.insert(common.status.to_string(), json!({"description": common.description}));
                }
            }
            for (status, response) in responses.iter_mut() {
                let refusal = status.parse::<u16>().is_ok_and(|s| s >= 400);
                if refusal && response.get("content").is_none() {
                    response["content"] = error.clone();
                }
            }
            op["responses"] = Value::Object(responses);
        }
    }
}

/// `POST /v1/dead-letters/redrive`'s body: exactly one selector (which a derived schema cannot
/// say), and an optional `limit`.
fn redrive_schema() -> Value {
    let limit = json!({
        "type": ["integer", "null"],
        "minimum": 1,
        "maximum": u32::MAX,
        "description": "At most this many (the oldest dead first).",
    });
    // One selector given; the others absent or `null`.
    let one = |name: &str, schema: Value| {
        let mut properties = json!({"child_ids": {"type": "null"}, "session_id": {"type": "null"}, "all": {"type": "null"}, "limit": limit});
        properties[name] = schema;
        json!({
            "type": "object",
            "required": [name],
            "properties": properties,
            "additionalProperties": false,
        })
    };
    json!({
        "description": "Which dead letters to put back in their sessions' ready sets: exactly one of `child_ids`, `session_id`, `\"all\": true`.",
        "oneOf": [
            one("child_ids", json!({"type": "array", "minItems": 1, "items": {"type": "string"}, "description": "The children whose dead items to put back."})),
            one("session_id", json!({"type": "string", "pattern": api::SESSION_ID_PATTERN, "description": "The session whose dead items to put back."})),
            one("all", json!({"const": true, "description": "Every dead item."})),
        ]
    })
}

/// The OpenAPI document of this server.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    operation_id = "openapi",
    responses((status = 200, description = "The OpenAPI 3.1 document of this API, with this server's bounds.", content_type = "application/json", body = Object))
)]
pub(super) async fn document(state: web::Data<State>) -> HttpResponse {
    HttpResponse::Ok().json(&*state.openapi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_states_the_configured_bounds() {
        let config = ServeConfig {
            max_tasks_per_call: 7,
            max_session_capacity: 12,
            ..ServeConfig::default()
        };
        let doc = document_for(&config);
        let schemas = &doc["components"]["schemas"];
        assert_eq!(schemas["DelegateBody"]["properties"]["tasks"]["maxItems"], 7);
        assert_eq!(
            schemas["PutSession"]["properties"]["max_concurrent_children"]["maximum"],
            12
        );
        assert_eq!(
            schemas["BoundaryBody"]["properties"]["lease_ms"]["minimum"],
            json!(config.min_lease_ms)
        );
    }

    /// The bounds written as literals on the contract's types are the server's own.
    #[test]
    fn the_documents_bounds_are_the_ones_the_server_enforces() {
        use crate::workers::{MAX_WAIT_MS, MAX_WORKER_CHARS, MAX_WORKER_HOLD_MS, MIN_WORKER_HOLD_MS};
        let doc = document_for(&ServeConfig::default());
        let schema = |name: &str, field: &str| doc["components"]["schemas"][name]["properties"][field].clone();
        assert_eq!(schema("PollBody", "wait_ms")["maximum"], MAX_WAIT_MS);
        assert_eq!(schema("PollBody", "worker")["maxLength"], MAX_WORKER_CHARS);
        for body in ["PollBody", "TakeBody"] {
            assert_eq!(schema(body, "lease_ms")["minimum"], MIN_WORKER_HOLD_MS, "{body}");
            assert_eq!(schema(body, "lease_ms")["maximum"], MAX_WORKER_HOLD_MS, "{body}");
        }
        assert_eq!(
            schema("PeerSessionsBody", "session_ids")["maxItems"],
            crate::listing::MAX_PEER_SESSIONS
        );
        assert_eq!(schema("SimRunner", "ms")["maximum"], brood::runners::SIM_MAX_MS);
        assert_eq!(
            doc["components"]["schemas"]["QueueName"]["maxLength"],
            brood::runners::external::MAX_QUEUE_CHARS
        );
        assert_eq!(schema("CancelBody", "reason")["maxLength"], brood::MAX_CANCEL_REASON);
        assert_eq!(
            schema("PutSession", "wake_url")["maxLength"],
            crate::wake::target::MAX_URL
        );
        assert_eq!(
            schema("TaskBody", "goal")["pattern"],
            schema("TaskBody", "group")["pattern"],
            "one pattern for text that is not blank"
        );
        // Every session id of a path or query is one the server looks up, or makes (PUT).
        for (path, ops) in doc["paths"].as_object().unwrap() {
            for (method, op) in ops.as_object().unwrap() {
                for param in op["parameters"].as_array().into_iter().flatten() {
                    if param["name"] != "session_id" {
                        continue;
                    }
                    let want = match method.as_str() {
                        "put" => api::NEW_SESSION_ID_PATTERN,
                        _ => api::SESSION_ID_PATTERN,
                    };
                    assert_eq!(param["schema"]["pattern"], want, "{method} {path}");
                }
            }
        }
    }

    /// A blank goal is what the engine refuses: white space as Rust's `trim` has it.
    #[test]
    fn the_not_blank_pattern_names_the_white_space_trim_removes() {
        let doc = document_for(&ServeConfig::default());
        let pattern = doc["components"]["schemas"]["TaskBody"]["properties"]["goal"]["pattern"]
            .as_str()
            .unwrap()
            .to_string();
        let class: Vec<char> = (0..=0x3000u32)
            .filter_map(char::from_u32)
            .filter(|c| c.is_whitespace())
            .collect();
        for c in class {
            let escaped = format!("\\u{:04x}", c as u32);
            let named = match c {
                '\t'..='\r' => true,
                ' ' => pattern.contains(" \\u0085"),
                '\u{2000}'..='\u{200a}' => pattern.contains("\\u2000-\\u200a"),
                _ => pattern.contains(&escaped),
            };
            assert!(named, "U+{:04X} is white space to trim but not in {pattern}", c as u32);
        }
    }

    #[test]
    fn every_keyed_operation_answers_the_missing_key_reply_and_every_body_the_refusals_of_a_body() {
        let doc = document_for(&ServeConfig::default());
        for (path, ops) in doc["paths"].as_object().unwrap() {
            for (method, op) in ops.as_object().unwrap() {
                let responses = op["responses"].as_object().unwrap();
                assert_eq!(
                    responses.contains_key("401"),
                    path.starts_with("/v1/") || path == "/mcp",
                    "{method} {path}"
                );
                if op.get("requestBody").is_some() {
                    for status in ["400", "408", "413", "415"] {
                        assert!(responses.contains_key(status), "{method} {path} {status}");
                    }
                }
            }
        }
    }
}
