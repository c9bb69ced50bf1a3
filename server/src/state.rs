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
    /// The ledger's last answer to readiness's round trip.
    pub(super) probe: LedgerProbe,
}

/// How long the ledger's answer to a round trip stands for readiness: probes more often than
/// this (a load balancer's, several at once) cost the database nothing more.
const PROBE_FRESH: std::time::Duration = std::time::Duration::from_secs(1);

/// How long readiness waits for the ledger's answer: a database that does not answer within
/// it is unavailable.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The ledger's last answer to a round trip ([`brood::BroodHandle::ledger_answers`]) and when
/// it came.
#[derive(Debug, Default)]
pub(super) struct LedgerProbe(tokio::sync::Mutex<Option<(std::time::Instant, Result<(), String>)>>);

impl State {
    /// Whether the ledger answers a round trip (PostgreSQL: `SELECT 1`, within
    /// [`PROBE_TIMEOUT`]), asked at most once per [`PROBE_FRESH`]: probes that come meanwhile
    /// get the last answer (or wait for the one under way).
    pub(super) async fn ledger_answers(&self) -> Result<(), String> {
        let mut last = self.probe.0.lock().await;
        if let Some((at, answer)) = last.as_ref() {
            if at.elapsed() < PROBE_FRESH {
                return answer.clone();
            }
        }
        let answer = self
            .brood
            .ledger_answers(PROBE_TIMEOUT)
            .await
            .map_err(|e| e.to_string());
        *last = Some((std::time::Instant::now(), answer.clone()));
        answer
    }

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
