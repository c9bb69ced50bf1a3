//! What every handler shares: the engine, the configuration and whether the server drains;
//! and the bounded read of a request's body.

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::web;
use futures::StreamExt as _;

use super::api::ApiError;
use super::config::ServeConfig;
use brood::Brood;

/// What every handler shares.
pub(super) struct State {
    pub(super) brood: Arc<Brood>,
    pub(super) config: ServeConfig,
    /// Turns true when the server starts to drain (SIGTERM/SIGINT).
    pub(super) stopping: tokio::sync::watch::Receiver<bool>,
    /// The OpenAPI document, with this server's bounds (made once, at the start).
    pub(super) openapi: Arc<serde_json::Value>,
}

impl State {
    /// Refuses new work once the server drains.
    pub(super) fn accepting(&self) -> Result<(), ApiError> {
        if *self.stopping.borrow() {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "draining",
                "the server is shutting down and takes no new calls; retry against it once it is back",
            ));
        }
        Ok(())
    }
}

/// Reads a body up to the configured limit: over it is a 413 in API.md's shape.
pub(super) async fn body(state: &State, mut payload: web::Payload) -> Result<web::BytesMut, ApiError> {
    let mut out = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| ApiError::invalid(format!("the body could not be read: {e}")))?;
        if out.len() + chunk.len() > state.config.body_limit {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!("the body is over the limit of {} bytes", state.config.body_limit),
            ));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}
