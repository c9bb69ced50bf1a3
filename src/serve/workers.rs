//! The endpoints of outside workers (API.md, "External workers"): poll a queue for a child of an
//! `external` runner, heartbeat to keep its lease, complete it with an output. The queues and
//! their lease decisions are [`crate::runners::external`]'s; this module parses the bodies,
//! checks their bounds and shapes the replies.
//!
//! A token that is not the child's current lease (the lease ran out, or the token is wrong)
//! answers 409 `stale_token`; a child brood ended while a worker held it (cancelled, timed out,
//! stalled) answers 409 `child_ended`; a child no queue holds otherwise — an id that was never
//! queued, or one its worker completed — answers 404 `unknown_child`.

use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::api::{self, ApiError};
use super::routes::{body, State};
use crate::runners::external::{check_queue, DEFAULT_QUEUE};
use crate::runners::{WorkError, WorkQueues};
use crate::RunOutput;

/// The longest a poll may wait for a child, in ms.
const MAX_WAIT_MS: u64 = 30_000;
/// The lease of a poll that names none, in ms.
const DEFAULT_WORKER_LEASE_MS: u64 = 30_000;
/// The shortest worker lease, in ms.
const MIN_WORKER_LEASE_MS: u64 = 1_000;
/// The longest worker lease, in ms.
const MAX_WORKER_LEASE_MS: u64 = 3_600_000;
/// The longest worker name, in bytes.
const MAX_WORKER_BYTES: usize = 256;

type Reply = Result<HttpResponse, ApiError>;

/// `POST /v1/workers/poll`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PollBody {
    worker: String,
    queue: Option<String>,
    #[serde(default)]
    wait_ms: u64,
    lease_ms: Option<u64>,
}

/// `POST /v1/children/{id}/heartbeat`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeartbeatBody {
    token: String,
    progress: Option<String>,
}

/// How a worker says its child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
enum Ended {
    Succeeded,
    Failed,
}

/// `POST /v1/children/{id}/complete`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CompleteBody {
    token: String,
    status: Ended,
    summary: Option<String>,
    error: Option<String>,
}

impl CompleteBody {
    fn output(self) -> RunOutput {
        match self.status {
            Ended::Succeeded => RunOutput::Succeeded {
                summary: self.summary.unwrap_or_default(),
            },
            Ended::Failed => RunOutput::Failed {
                error: self
                    .error
                    .unwrap_or_else(|| "the worker reported a failure and gave no error".into()),
                summary: self.summary,
            },
        }
    }
}

impl From<WorkError> for ApiError {
    fn from(e: WorkError) -> Self {
        let (status, code) = match &e {
            WorkError::UnknownChild(_) => (StatusCode::NOT_FOUND, "unknown_child"),
            WorkError::StaleToken(_) => (StatusCode::CONFLICT, "stale_token"),
            WorkError::Ended(_) => (StatusCode::CONFLICT, "child_ended"),
        };
        ApiError::new(status, code, e.to_string())
    }
}

fn within(field: &str, value: u64, min: u64, max: u64) -> Result<u64, ApiError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(ApiError::invalid(format!(
            "`{field}` is {value}; it must be from {min} to {max}"
        )))
    }
}

pub(super) async fn poll(state: web::Data<State>, queues: web::Data<WorkQueues>, payload: web::Payload) -> Reply {
    let body: PollBody = api::parse(&body(&state, payload).await?)?;
    if body.worker.is_empty() || body.worker.len() > MAX_WORKER_BYTES {
        return Err(ApiError::invalid(format!(
            "`worker` must name the worker in 1 to {MAX_WORKER_BYTES} bytes"
        )));
    }
    let queue = body.queue.unwrap_or_else(|| DEFAULT_QUEUE.to_string());
    check_queue(&queue).map_err(ApiError::invalid)?;
    let wait_ms = within("wait_ms", body.wait_ms, 0, MAX_WAIT_MS)?;
    let lease_ms = within(
        "lease_ms",
        body.lease_ms.unwrap_or(DEFAULT_WORKER_LEASE_MS),
        MIN_WORKER_LEASE_MS,
        MAX_WORKER_LEASE_MS,
    )?;
    let handed = queues
        .poll(
            &queue,
            &body.worker,
            Duration::from_millis(wait_ms),
            Duration::from_millis(lease_ms),
        )
        .await;
    Ok(match handed {
        None => HttpResponse::NoContent().finish(),
        Some(h) => HttpResponse::Ok().json(json!({
            "child_id": h.child_id,
            "goal": h.goal,
            "token": h.token,
            "lease_ms": h.lease_ms,
        })),
    })
}

/// The child id of the path and the parsed body of a heartbeat or completion.
async fn child_request<T: serde::de::DeserializeOwned>(
    state: &State,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<(String, T), ApiError> {
    let body = api::parse(&body(state, payload).await?)?;
    Ok((path.into_inner(), body))
}

pub(super) async fn heartbeat(
    state: web::Data<State>,
    queues: web::Data<WorkQueues>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    let (child_id, body): (String, HeartbeatBody) = child_request(&state, path, payload).await?;
    let lease = queues.heartbeat(&child_id, &body.token, body.progress)?;
    Ok(HttpResponse::Ok().json(json!({"child_id": child_id, "lease_ms": lease.as_millis() as u64})))
}

pub(super) async fn complete(
    state: web::Data<State>,
    queues: web::Data<WorkQueues>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    let (child_id, body): (String, CompleteBody) = child_request(&state, path, payload).await?;
    let (token, status) = (body.token.clone(), body.status);
    queues.complete(&child_id, &token, body.output())?;
    Ok(HttpResponse::Ok().json(json!({"child_id": child_id, "status": status})))
}
