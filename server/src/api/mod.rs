//! The HTTP contract of API.md, version 1, as Rust types: the request bodies and queries
//! ([`requests`]), the replies and events ([`replies`], [`events`]), the enumerations they
//! share ([`wire`]), and the error every refusal answers with ([`ApiError`]: the right status
//! and `{"error": {"code", "message"}}`). The routes parse into these types and reply with
//! them, the OpenAPI document is generated from them, and `brood inspect` reads a server's
//! replies with them.

pub mod events;
pub mod replies;
pub mod requests;
pub mod wire;

pub use self::replies::*;
pub use self::requests::*;
pub use self::wire::*;

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use brood::BroodError;

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
    pub moved_to: Option<MovedTo>,
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
        let mut reply = HttpResponse::build(self.status).json(ErrorReply {
            error: ErrorBody {
                code: self.code.to_string(),
                message: self.message.clone(),
            },
        });
        if let Some(moved) = &self.moved_to {
            reply.extensions_mut().insert(moved.clone());
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
            BroodError::ParentEnded { .. }
            | BroodError::IdempotencyConflict { .. }
            | BroodError::IdempotencyInProgress { .. } => (StatusCode::CONFLICT, e.code()),
            // The server, not the request, is at its bound: retry later, as with `draining`.
            BroodError::ServerFull { .. } => (StatusCode::SERVICE_UNAVAILABLE, e.code()),
            BroodError::ClaimLost(_) => (StatusCode::CONFLICT, "claim_lost"),
            BroodError::ClaimAcked(_) => (StatusCode::CONFLICT, "claim_acked"),
            BroodError::EmbedderPanicked { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "runner_factory_panicked"),
            BroodError::Ledger(_) | BroodError::Interrupted { .. } | BroodError::Stopped => {
                (StatusCode::SERVICE_UNAVAILABLE, e.code())
            }
            BroodError::SessionFailed { .. } => (StatusCode::SERVICE_UNAVAILABLE, "session_failed"),
            BroodError::TenureLapsed { .. } => (StatusCode::SERVICE_UNAVAILABLE, e.code()),
            BroodError::Moved { address, session } => {
                let mut moved = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.code(), message);
                moved.moved_to = Some(MovedTo {
                    session: Some(session.clone()),
                    address: address.clone(),
                });
                return moved;
            }
        };
        ApiError::new(status, code, message)
    }
}

/// Parses a JSON body, naming the path of what is wrong (`tasks[2].goal: missing field`).
/// An empty body (no bytes at all) reads as `{}` where every field is optional; a body of
/// only whitespace is not JSON, and is refused like any other.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let body: &[u8] = if body.is_empty() { b"{}" } else { body };
    // serde reads a struct from an array of its fields too; a body is an object (or `null`
    // where the body is optional), never that.
    if body.iter().copied().find(|b| !json_whitespace(*b)) == Some(b'[') {
        return Err(ApiError::invalid("the body must be a JSON object, not an array"));
    }
    // Read once as it is; only a body that does not read is read again with its path noted
    // for the message (noting the path of every value took a third of the read of a call of
    // 1,000 tasks).
    if let Ok(value) = serde_json::from_slice(body) {
        return Ok(value);
    }
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

/// JSON's whitespace (RFC 8259 §2): narrower than ASCII's, which also counts a form feed.
fn json_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// Parses a request's query string into `T`; what does not parse is a 400 saying why.
pub fn query<T: serde::de::DeserializeOwned>(req: &actix_web::HttpRequest) -> Result<T, ApiError> {
    actix_web::web::Query::<T>::from_query(req.query_string())
        .map(actix_web::web::Query::into_inner)
        .map_err(|e| ApiError::invalid(format!("the query string does not parse: {e}")))
}

/// Where the session of a refused request is served (on the error reply's extensions, for
/// the forwarding middleware to send the request on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedTo {
    /// The session, when the refusal named it.
    pub session: Option<String>,
    /// The address of the process that serves it.
    pub address: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Optional {
        #[serde(default)]
        n: Option<u32>,
    }

    #[test]
    fn an_empty_body_reads_as_an_empty_object() {
        assert_eq!(parse::<Optional>(b"").map(|o| o.n).ok(), Some(None));
        assert_eq!(
            parse::<Option<Optional>>(b"").map(|o| o.map(|o| o.n)).ok(),
            Some(Some(None))
        );
        assert_eq!(parse::<Optional>(b" {\"n\": 3}\n").map(|o| o.n).ok(), Some(Some(3)));
    }

    #[test]
    fn a_body_that_does_not_read_is_refused_naming_where_and_why() {
        #[derive(Debug, serde::Deserialize)]
        struct Outer {
            #[allow(dead_code)]
            items: Vec<Optional>,
        }
        let e = parse::<Outer>(br#"{"items": [{"n": 1}, {"n": "two"}]}"#).unwrap_err();
        assert!(e.message.starts_with("`items[1].n`: invalid type"), "{}", e.message);
        let e = parse::<Outer>(br#"{"items": [{"m": 1}]}"#).unwrap_err();
        assert!(e.message.starts_with("`items[0].m`: unknown field"), "{}", e.message);
        let e = parse::<Outer>(br#"{}"#).unwrap_err();
        assert!(
            e.message.contains("does not match: missing field `items`"),
            "{}",
            e.message
        );
        let e = parse::<Outer>(br#"{"items": []} {}"#).unwrap_err();
        assert!(e.message.contains("trailing characters"), "{}", e.message);
        let e = parse::<Outer>(br#"{"items": ["#).unwrap_err();
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        assert_eq!(
            parse::<Outer>(br#"{"items": [{}, {"n": 2}]}"#).unwrap().items[1].n,
            Some(2)
        );
    }

    #[test]
    fn a_body_of_only_whitespace_is_refused_as_not_json() {
        for body in [&b" "[..], b"\t", b"\r\n\t "] {
            let e = parse::<Option<Optional>>(body).unwrap_err();
            assert_eq!(e.status, actix_web::http::StatusCode::BAD_REQUEST, "{body:?}");
            assert!(e.message.contains("not valid JSON"), "{body:?}: {}", e.message);
        }
    }

    #[test]
    fn a_form_feed_or_other_non_json_whitespace_is_refused_as_not_json() {
        for body in [&b"\x0c"[..], b"\x0b", b" \x0c{}", b"\xa0"] {
            let e = parse::<Option<Optional>>(body).unwrap_err();
            assert_eq!(e.status, actix_web::http::StatusCode::BAD_REQUEST, "{body:?}");
            assert!(e.message.contains("not valid JSON"), "{body:?}: {}", e.message);
        }
    }

    #[test]
    fn an_array_is_refused_even_after_leading_whitespace() {
        let e = parse::<Optional>(b" \n[1]").unwrap_err();
        assert!(e.message.contains("not an array"), "{}", e.message);
    }
}
