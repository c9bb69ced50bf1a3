//! JSON-RPC 2.0 as MCP uses it: one message in, at most one message out. This file owns the
//! envelope — what a message a client sends must be, the error codes, the shape of a reply —
//! and the choice of protocol version; it knows no method.
//!
//! A message is an object of `jsonrpc: "2.0"`, a string `method`, an object `params` (optional)
//! and an `id` (a string or a whole number; without one the message is a notification).
//! Nothing else is taken: not a batch (which MCP 2025-06-18 removed), not a response (this
//! server sends no requests, so it awaits no answers), not a member JSON-RPC does not define.
//! A message refused here is answered with the error and the request's id when it had a usable
//! one, else `null`.

use serde_json::{json, Map, Value};

/// The text is not JSON.
pub(super) const PARSE_ERROR: i64 = -32700;
/// The JSON is not a message this server takes.
pub(super) const INVALID_REQUEST: i64 = -32600;
/// No such method.
pub(super) const METHOD_NOT_FOUND: i64 = -32601;
/// The method's params are wrong (an unknown tool among them).
pub(super) const INVALID_PARAMS: i64 = -32602;
/// The server could not answer.
pub(super) const INTERNAL_ERROR: i64 = -32603;
/// MCP's code for a resource that does not exist.
pub(super) const RESOURCE_NOT_FOUND: i64 = -32002;

/// The protocol versions this server speaks, newest first: those of the `initialize`
/// handshake. The first is what a client asking for another one is offered.
pub(super) const VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// The version to answer a client's `initialize` with: the one it asked for when this server
/// speaks it, else the newest this server speaks (the client then decides whether to go on).
pub(super) fn negotiate(asked: &str) -> &'static str {
    VERSIONS.iter().find(|v| **v == asked).copied().unwrap_or(VERSIONS[0])
}

/// A message from the client.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Message {
    /// A request: answered with a result or an error carrying its id.
    Request {
        /// Its id, given back in the answer.
        id: Value,
        /// The method.
        method: String,
        /// Its params (`{}` when it had none).
        params: Map<String, Value>,
    },
    /// A notification: never answered.
    Notification {
        /// The method.
        method: String,
    },
}

/// A JSON-RPC error.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct RpcError {
    /// The code.
    pub(super) code: i64,
    /// What is wrong, for the reader.
    pub(super) message: String,
    /// What else helps, when anything does.
    pub(super) data: Option<Value>,
}

impl RpcError {
    pub(super) fn new(code: i64, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub(super) fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }
}

/// The answer to request `id`: its result.
pub(super) fn response(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// The answer to request `id` (`null` when it is not known): an error.
pub(super) fn error_response(id: &Value, e: &RpcError) -> Value {
    let mut error = json!({"code": e.code, "message": e.message});
    if let Some(data) = &e.data {
        error["data"] = data.clone();
    }
    json!({"jsonrpc": "2.0", "id": id, "error": error})
}

/// Whether `id` is one JSON-RPC and MCP allow: a string or a whole number (never `null`).
fn usable_id(id: &Value) -> bool {
    match id {
        Value::String(_) => true,
        Value::Number(n) => n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => false,
    }
}

/// The message `text` holds, or the error answer (with the id, when the message had a usable
/// one) saying why it is refused.
pub(super) fn parse(text: &[u8]) -> Result<Message, Value> {
    let value: Value = serde_json::from_slice(text).map_err(|e| {
        error_response(
            &Value::Null,
            &RpcError::new(PARSE_ERROR, format!("the message is not JSON: {e}")),
        )
    })?;
    let id = value
        .get("id")
        .filter(|id| usable_id(id))
        .cloned()
        .unwrap_or(Value::Null);
    message(value).map_err(|e| error_response(&id, &e))
}

/// Reads a message from its JSON.
fn message(value: Value) -> Result<Message, RpcError> {
    let invalid = |m: String| Err(RpcError::new(INVALID_REQUEST, m));
    let mut fields = match value {
        Value::Object(fields) => fields,
        Value::Array(_) => return invalid("a batch (a JSON array) is not taken: send one message per request".into()),
        other => return invalid(format!("a message is a JSON object, not {}", kind(&other))),
    };
    if fields.contains_key("result") || fields.contains_key("error") {
        return invalid("this server sends no requests, so it takes no responses".into());
    }
    if let Some(name) = fields
        .keys()
        .find(|k| !matches!(k.as_str(), "jsonrpc" | "id" | "method" | "params"))
    {
        return invalid(format!(
            "`{name}` is not a member of a JSON-RPC message (jsonrpc, id, method, params)"
        ));
    }
    if fields.get("jsonrpc") != Some(&json!("2.0")) {
        return invalid("`jsonrpc` must be \"2.0\"".into());
    }
    let method = match fields.remove("method") {
        Some(Value::String(m)) => m,
        Some(other) => return invalid(format!("`method` must be a string, not {}", kind(&other))),
        None => return invalid("the message has no `method`".into()),
    };
    let params = match fields.remove("params") {
        None => Map::new(),
        Some(Value::Object(p)) => p,
        Some(other) => {
            return Err(RpcError::new(
                INVALID_PARAMS,
                format!("`params` must be an object, not {}", kind(&other)),
            ))
        }
    };
    match fields.remove("id") {
        None => Ok(Message::Notification { method }),
        Some(id) if usable_id(&id) => Ok(Message::Request { id, method, params }),
        Some(other) => invalid(format!("`id` must be a string or a whole number, not {}", kind(&other))),
    }
}

/// What a JSON value is, in words.
pub(super) fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str) -> (Value, i64) {
        let reply = parse(text.as_bytes()).expect_err(text);
        (reply["id"].clone(), reply["error"]["code"].as_i64().unwrap_or(0))
    }

    #[test]
    fn requests_carry_their_id_and_notifications_have_none() {
        assert_eq!(
            parse(br#"{"jsonrpc": "2.0", "id": 7, "method": "ping"}"#),
            Ok(Message::Request {
                id: json!(7),
                method: "ping".into(),
                params: Map::new()
            })
        );
        assert_eq!(
            parse(br#"{"jsonrpc": "2.0", "id": "a", "method": "tools/list", "params": {"cursor": "x"}}"#),
            Ok(Message::Request {
                id: json!("a"),
                method: "tools/list".into(),
                params: json!({"cursor": "x"}).as_object().cloned().unwrap_or_default()
            })
        );
        assert_eq!(
            parse(br#"{"jsonrpc": "2.0", "method": "notifications/initialized"}"#),
            Ok(Message::Notification {
                method: "notifications/initialized".into()
            })
        );
    }

    #[test]
    fn what_is_not_json_is_a_parse_error_without_an_id() {
        assert_eq!(refused("{\"jsonrpc\": "), (Value::Null, PARSE_ERROR));
        assert_eq!(refused(""), (Value::Null, PARSE_ERROR));
    }

    #[test]
    fn what_is_not_a_message_is_an_invalid_request_answered_with_its_id_when_usable() {
        for (text, id) in [
            (r#"[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]"#, Value::Null),
            ("7", Value::Null),
            (r#"{"jsonrpc": "1.0", "id": 1, "method": "ping"}"#, json!(1)),
            (r#"{"id": 1, "method": "ping"}"#, json!(1)),
            (r#"{"jsonrpc": "2.0", "id": 1, "method": 5}"#, json!(1)),
            (r#"{"jsonrpc": "2.0", "id": "x"}"#, json!("x")),
            (r#"{"jsonrpc": "2.0", "id": null, "method": "ping"}"#, Value::Null),
            (r#"{"jsonrpc": "2.0", "id": 1.5, "method": "ping"}"#, Value::Null),
            (r#"{"jsonrpc": "2.0", "id": [1], "method": "ping"}"#, Value::Null),
            (r#"{"jsonrpc": "2.0", "id": 2, "method": "ping", "extra": 1}"#, json!(2)),
            (r#"{"jsonrpc": "2.0", "id": 3, "result": {}}"#, json!(3)),
        ] {
            assert_eq!(refused(text), (id, INVALID_REQUEST), "{text}");
        }
    }

    #[test]
    fn params_that_are_not_an_object_are_invalid_params() {
        assert_eq!(
            refused(r#"{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": [1]}"#),
            (json!(1), INVALID_PARAMS)
        );
        assert_eq!(
            refused(r#"{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": null}"#),
            (json!(1), INVALID_PARAMS)
        );
    }

    #[test]
    fn a_whole_number_id_written_as_a_float_is_usable() {
        assert!(matches!(
            parse(br#"{"jsonrpc": "2.0", "id": 1e3, "method": "ping"}"#),
            Ok(Message::Request { .. })
        ));
    }

    #[test]
    fn the_version_asked_for_is_answered_when_spoken_else_the_newest() {
        assert_eq!(negotiate("2025-06-18"), "2025-06-18");
        assert_eq!(negotiate("2024-11-05"), "2024-11-05");
        assert_eq!(negotiate("2026-07-28"), VERSIONS[0]);
        assert_eq!(negotiate("nonsense"), VERSIONS[0]);
    }

    #[test]
    fn errors_carry_their_data_only_when_given() {
        let plain = error_response(&json!(1), &RpcError::new(METHOD_NOT_FOUND, "no"));
        assert_eq!(
            plain,
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "no"}})
        );
        let with = error_response(
            &Value::Null,
            &RpcError::new(INTERNAL_ERROR, "x").with_data(json!({"a": 1})),
        );
        assert_eq!(with["error"]["data"], json!({"a": 1}));
    }
}
