//! The resources: each session, as `brood://sessions/{session_id}` (its state, as `GET
//! /v1/sessions/{id}` answers it) and `brood://sessions/{session_id}/events` (its recent events,
//! each as the event stream of `GET /v1/sessions/{id}/events` sends it, with the stream's name
//! under `event`; see [`super::recorder`]). A session id is one path segment of the URI,
//! percent-encoded where a URI needs it.
//!
//! `resources/list` lists the sessions this process routes (those the key reaches), a page of
//! [`PAGE`] at a time with the last id of a page as the cursor of the next;
//! `resources/templates/list` gives the two URI templates. A URI naming nothing brood has is
//! MCP's resource-not-found error.

use serde_json::{json, Map, Value};

use super::rpc::{self, RpcError};
use super::Context;
use crate::api::ApiError;
use brood::BroodError;

/// Sessions per page of `resources/list`.
pub(super) const PAGE: usize = 50;

const SCHEME: &str = "brood://sessions/";

/// What a URI names.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Resource {
    /// A session's state.
    Session(String),
    /// A session's recent events.
    Events(String),
}

/// The bytes a session id keeps as they are in a URI: RFC 3986's unreserved characters and
/// sub-delimiters, `:` and `@`. Every other byte is percent-encoded.
fn kept(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@".contains(&b)
}

/// `id` as one path segment.
fn encode(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if kept(b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A path segment's text, its percent-encodings decoded; `None` when one is malformed or the
/// result is not UTF-8.
fn decode(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = segment.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The URI of a session's state.
pub(super) fn session_uri(id: &str) -> String {
    format!("{SCHEME}{}", encode(id))
}

/// The URI of a session's events.
pub(super) fn events_uri(id: &str) -> String {
    format!("{SCHEME}{}/events", encode(id))
}

/// What `uri` names, or `None` when it is none of brood's.
pub(super) fn parse(uri: &str) -> Option<Resource> {
    let rest = uri.strip_prefix(SCHEME)?;
    let (segment, events) = match rest.split_once('/') {
        None => (rest, false),
        Some((segment, "events")) => (segment, true),
        Some(_) => return None,
    };
    let id = decode(segment).filter(|id| !id.is_empty())?;
    Some(if events {
        Resource::Events(id)
    } else {
        Resource::Session(id)
    })
}

/// `resources/templates/list`.
pub(super) fn templates() -> Value {
    json!({"resourceTemplates": [
        {
            "uriTemplate": format!("{SCHEME}{{session_id}}"),
            "name": "session",
            "title": "A brood session",
            "description": "The session's state: its turn, counts (queued, running, ready, claimed, delivered), calls not yet delivered with their units and children, and live claims.",
            "mimeType": "application/json",
        },
        {
            "uriTemplate": format!("{SCHEME}{{session_id}}/events"),
            "name": "session-events",
            "title": "A brood session's recent events",
            "description": "What happened in the session lately (children starting and ending, results ready, claims, cancels, failure notices), oldest first, from when this server began watching it (its first delegate or events read through MCP; brood keeps no history of events), with the count ready now.",
            "mimeType": "application/json",
        },
    ]})
}

/// The error of a resource read: not found (an unknown id, or one out of the key's reach), a
/// bad id, or another refusal, with brood's code and message.
fn refusal(uri: &str, e: ApiError) -> RpcError {
    let code = match e.status.as_u16() {
        404 => rpc::RESOURCE_NOT_FOUND,
        400 => rpc::INVALID_PARAMS,
        _ => rpc::INTERNAL_ERROR,
    };
    RpcError::new(code, format!("{}: {}", e.code, e.message)).with_data(json!({"uri": uri, "code": e.code}))
}

/// `resources/list`: a page of the sessions the key reaches, two resources each.
pub(super) async fn list(ctx: &Context<'_>, params: &Map<String, Value>) -> Result<Value, RpcError> {
    let after = match params.get("cursor") {
        None | Some(Value::Null) => None,
        Some(Value::String(c)) => Some(c.as_str()),
        Some(other) => {
            return Err(RpcError::new(
                rpc::INVALID_PARAMS,
                format!("`cursor` must be a string, not {}", rpc::kind(other)),
            ))
        }
    };
    let brood = &ctx.state.brood;
    let mut page = Vec::with_capacity(PAGE);
    let mut more = false;
    for id in brood.sessions() {
        if after.is_some_and(|a| id.as_str() <= a) {
            continue;
        }
        let reached = ctx
            .access
            .covers(brood, &id)
            .await
            .map_err(|e| refusal(&session_uri(&id), e))?;
        if !reached {
            continue;
        }
        if page.len() == PAGE {
            more = true;
            break;
        }
        page.push(id);
    }
    let resources: Vec<Value> = page
        .iter()
        .flat_map(|id| {
            [
                json!({"uri": session_uri(id), "name": id, "title": format!("Session {id}"), "mimeType": "application/json"}),
                json!({"uri": events_uri(id), "name": format!("{id} events"), "title": format!("Recent events of session {id}"), "mimeType": "application/json"}),
            ]
        })
        .collect();
    let mut out = json!({"resources": resources});
    if let (true, Some(last)) = (more, page.last()) {
        out["nextCursor"] = json!(last);
    }
    Ok(out)
}

/// `resources/read`.
pub(super) async fn read(ctx: &Context<'_>, params: &Map<String, Value>) -> Result<Value, RpcError> {
    let Some(uri) = params.get("uri").and_then(Value::as_str) else {
        return Err(RpcError::new(rpc::INVALID_PARAMS, "`uri` is missing or not a string"));
    };
    let not_found = || {
        RpcError::new(
            rpc::RESOURCE_NOT_FOUND,
            format!("no resource `{uri}`: brood's are {SCHEME}{{session_id}} and {SCHEME}{{session_id}}/events"),
        )
        .with_data(json!({"uri": uri}))
    };
    let content = match parse(uri).ok_or_else(not_found)? {
        Resource::Session(id) => super::session_detail(ctx, &id).await.and_then(super::to_json),
        Resource::Events(id) => events(ctx, &id).await,
    }
    .map_err(|e| refusal(uri, e))?;
    Ok(json!({"contents": [{"uri": uri, "mimeType": "application/json", "text": content.to_string()}]}))
}

/// A session's recent events, and the count ready now (as the event stream opens with).
async fn events(ctx: &Context<'_>, id: &str) -> Result<Value, ApiError> {
    let brood = &ctx.state.brood;
    brood_actors::model::validate_session_id(id).map_err(BroodError::from)?;
    ctx.access.session(brood, id).await?;
    ctx.recorder.watch(brood, id).await;
    let counts = brood.counts(id).await?;
    let recent = ctx
        .recorder
        .recent(id)
        .ok_or_else(|| BroodError::UnknownSession(id.to_string()))?;
    let events: Vec<Value> = recent
        .events
        .iter()
        .map(|ev| {
            let mut data: Value = serde_json::from_str(&crate::api::events::data(ev)).unwrap_or_else(|_| json!({}));
            data["event"] = json!(ev.event.name());
            data
        })
        .collect();
    Ok(json!({
        "session_id": id,
        "ready": counts.ready,
        "watched_since": recent.since_ms,
        "missed": recent.missed,
        "events": events,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uri_names_a_session_or_its_events() {
        assert_eq!(
            parse("brood://sessions/chat-1"),
            Some(Resource::Session("chat-1".into()))
        );
        assert_eq!(
            parse("brood://sessions/chat-1/events"),
            Some(Resource::Events("chat-1".into()))
        );
        for other in [
            "brood://sessions/",
            "brood://sessions//events",
            "brood://sessions/a/b",
            "brood://sessions/a/events/x",
            "brood://calls/a",
            "file:///etc/passwd",
            "brood://sessions/%zz",
        ] {
            assert_eq!(parse(other), None, "{other}");
        }
    }

    #[test]
    fn an_id_goes_into_its_uri_and_comes_back_out_whole() {
        for id in [
            "chat-1",
            "a:b@c",
            "x\"y<z>{w}|v^`",
            "deleg_1f.0",
            "with%percent",
            "with/slash",
            "ünï",
        ] {
            let uri = session_uri(id);
            assert!(!uri[SCHEME.len()..].contains(['/', '"', '<', ' ', '{']), "{uri}");
            assert_eq!(parse(&uri), Some(Resource::Session(id.into())), "{uri}");
            assert_eq!(parse(&events_uri(id)), Some(Resource::Events(id.into())));
        }
        assert_eq!(session_uri("a b"), "brood://sessions/a%20b");
    }

    #[test]
    fn a_client_may_encode_what_need_not_be() {
        assert_eq!(parse("brood://sessions/a%3Ab"), Some(Resource::Session("a:b".into())));
    }
}
