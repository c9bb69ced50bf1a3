//! The endpoints of API.md over the embedding API: each handler parses its body, calls one
//! [`Brood`] method and shapes the reply. No handler holds state of its own.

use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use super::api::{self, ApiError, BoundaryBody, DelegateBody, PutSession, ReleaseBody, TurnBody};
use super::scope::Access;
use super::state::{body, State};
use brood::{BroodError, DelegateReply, DelegateRequest, SessionOptions, TaskSpec};

type Reply = Result<HttpResponse, ApiError>;

/// The session id of a request's path, checked before anything is looked up: an id no session
/// could have is a 400, and costs no read.
pub(super) fn session_path(path: web::Path<String>) -> Result<String, ApiError> {
    let id = path.into_inner();
    brood_actors::model::validate_session_id(&id).map_err(brood::BroodError::from)?;
    Ok(id)
}

fn session_json(info: &brood::SessionInfo) -> serde_json::Value {
    json!({
        "session_id": info.session_id,
        "wake_capable": info.wake_capable,
        "addressable": info.addressable,
        "turn": info.turn,
        "max_concurrent_children": info.max_concurrent_children,
        "max_delivery_attempts": info.max_delivery_attempts,
    })
}

pub(super) async fn put_session(
    state: web::Data<State>,
    access: Access,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    let session_id = session_path(path)?;
    access.session(&state.brood, &session_id).await?;
    let body: PutSession = api::parse(&body(&state, payload).await?)?;
    let mut options = SessionOptions::default();
    if let Some(url) = body.wake_url.clone() {
        options = options.wake_url(url);
    }
    if let Some(n) = body.max_concurrent_children {
        let max = state.config.max_session_capacity;
        if !(1..=max).contains(&n) {
            return Err(ApiError::invalid(format!(
                "`max_concurrent_children` is {n}; this server accepts from 1 to {max} (its max_session_capacity)"
            )));
        }
        options = options.max_concurrent_children(n);
    }
    if let Some(addressable) = body.addressable {
        // Default-deny: only an authenticated request (or a server without a key) grants it,
        // and every request that reaches a `/v1` handler passed the key check. The parent
        // reaches the session by polling its boundaries or watching its events; the setting
        // is stored with the session.
        options = options.addressable(addressable);
    }
    let info = state
        .brood
        .open_session_with_defaults(
            &session_id,
            options,
            state.config.max_concurrent_children,
            state.config.max_delivery_attempts,
        )
        .await?;
    Ok(HttpResponse::Ok().json(session_json(&info)))
}

/// The query of `GET /v1/sessions/{id}`: `delivered=true` lists every stored call (delivered
/// ones too), a page at a time.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionQuery {
    delivered: Option<String>,
    after: Option<String>,
    limit: Option<String>,
}

pub(super) async fn get_session(
    state: web::Data<State>,
    access: Access,
    path: web::Path<String>,
    req: HttpRequest,
) -> Reply {
    let query = web::Query::<SessionQuery>::from_query(req.query_string())
        .map_err(|e| ApiError::invalid(format!("the query string does not parse: {e}")))?
        .into_inner();
    let delivered = match query.delivered.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "`delivered` is `{other}`; it must be true or false"
            )))
        }
    };
    if !delivered && (query.after.is_some() || query.limit.is_some()) {
        return Err(ApiError::invalid(
            "`after` and `limit` page the calls of `delivered=true` only",
        ));
    }
    let id = session_path(path)?;
    access.session(&state.brood, &id).await?;
    let st = state.brood.status(&id).await?;
    let (calls, next): (Vec<serde_json::Value>, Option<String>) = if delivered {
        let limit = super::listing::limit(query.limit.as_deref())?;
        let (calls, next) = state.brood.session_calls(&id, query.after.as_deref(), limit).await?;
        (calls.iter().map(call_json).collect(), next)
    } else {
        (st.calls.iter().map(call_json).collect(), None)
    };
    Ok(HttpResponse::Ok().json(json!({
        "session_id": st.info.session_id,
        "turn": st.info.turn,
        "wake_capable": st.info.wake_capable,
        "addressable": st.info.addressable,
        "max_concurrent_children": st.info.max_concurrent_children,
        "max_delivery_attempts": st.info.max_delivery_attempts,
        "counts": api::counts_json(&st),
        "parent_child_id": state.brood.nest(&st.info.session_id).map(|n| n.session_id),
        "calls": calls,
        "calls_next": next,
        "claims": st.claims.iter().map(|c| json!({
            "claim_id": c.claim_id,
            "consumer": c.consumer,
            "items": c.items,
            "lease_expires_at": c.lease_expires_at_ms,
        })).collect::<Vec<_>>(),
    })))
}

/// A call as a session's `calls[]` shows it.
fn call_json(c: &brood::CallStatus) -> serde_json::Value {
    json!({
        "call_id": c.call.call_id,
        "set": c.call.set,
        "mode": c.call.mode,
        "created_at": c.call.created_at_ms,
        "units": c.units.iter().map(|u| json!({"unit_id": u.unit_id, "group": u.group, "tasks": u.tasks})).collect::<Vec<_>>(),
        "children": c.children.iter().map(|r| json!({
            "child_id": r.child_id,
            "task_index": r.task_index,
            "status": r.status,
            "started_at": r.started_at_ms,
            "finished_at": r.finished_at_ms,
            "delivery": delivery(r),
            "delivery_attempt": r.status.is_terminal().then(|| r.result.failed_attempts.saturating_add(1)),
            "summary": crate::api::summary_line(r.summary.as_deref(), r.error.as_deref()),
        })).collect::<Vec<_>>(),
    })
}

/// Where a child's result is on its way: `null` until it has one.
fn delivery(r: &brood::ChildRow) -> Option<&'static str> {
    if r.result.delivered {
        Some("delivered")
    } else if r.result.dead {
        Some("dead_letter")
    } else if r.status.is_terminal() {
        Some("undelivered")
    } else {
        None
    }
}

/// `GET /v1/calls/{call_id}`: the call as a session shows it, with its session, the mode it
/// ran in and why it was forced to sync, and when it was made; from the ledger once it was
/// delivered.
pub(super) async fn get_call(state: web::Data<State>, access: Access, path: web::Path<String>) -> Reply {
    let call_id = path.into_inner();
    reach_call(&state, &access, "call", &call_id, &call_id).await?;
    let c = state.brood.call(&call_id).await?;
    let mut out = call_json(&c);
    out["session_id"] = json!(c.call.session_id);
    out["forced_sync_reason"] = json!(c.call.forced_sync_reason);
    out["created_at"] = json!(c.call.created_at_ms);
    Ok(HttpResponse::Ok().json(out))
}

pub(super) async fn set_turn(
    state: web::Data<State>,
    access: Access,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    let session_id = session_path(path)?;
    access.session(&state.brood, &session_id).await?;
    let body: TurnBody = api::parse(&body(&state, payload).await?)?;
    state.brood.set_turn(&session_id, body.state).await?;
    Ok(HttpResponse::Ok().json(json!({"session_id": session_id, "turn": body.state})))
}

/// Turns the request's tasks into the engine's, refusing runner kinds the server does not
/// allow (403) before anything is stored.
fn tasks(state: &State, body: DelegateBody) -> Result<DelegateRequest, ApiError> {
    if body.tasks.is_empty() {
        return Err(ApiError::invalid("`tasks` must hold at least one task"));
    }
    let max = state.config.max_tasks_per_call;
    if body.tasks.len() > max {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "too_many_tasks",
            format!(
                "`tasks` holds {} tasks; this server takes at most {max} in one call (its max_tasks_per_call): split the work into several calls",
                body.tasks.len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(body.tasks.len());
    for (i, t) in body.tasks.into_iter().enumerate() {
        let kind = t.runner.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
        if let Some(why) = state.config.refuses_runner(kind) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "runner_not_allowed",
                format!("`tasks[{i}].runner.kind`: {why}"),
            ));
        }
        let mut task = TaskSpec::new(t.goal, t.runner);
        task.group = t.group;
        task.timeout_ms = t.timeout_ms;
        task.stall_ms = Some(t.stall_ms.unwrap_or(state.config.default_stall_ms));
        if task.timeout_ms.is_none() && state.config.default_timeout_ms > 0 {
            task.timeout_ms = Some(state.config.default_timeout_ms);
        }
        task.rerun_on_recovery = t.rerun_on_recovery;
        out.push(task);
    }
    let mut req = match body.mode {
        brood::Mode::Background => DelegateRequest::background(out),
        brood::Mode::Sync => DelegateRequest::sync(out),
    };
    if body.independent_completions {
        req = req.independent();
    }
    Ok(req)
}

pub(super) async fn delegate(
    state: web::Data<State>,
    access: Access,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    let session_id = session_path(path)?;
    access.session(&state.brood, &session_id).await?;
    state.accepting()?;
    let body: DelegateBody = api::parse(&body(&state, payload).await?)?;
    let request = tasks(&state, body)?;
    let reply = state
        .brood
        .delegate(&session_id, request)
        .await
        .map_err(|e| ApiError::from(e.error))?;
    Ok(match reply {
        DelegateReply::Background {
            call_id,
            set,
            units,
            note,
        } => HttpResponse::Accepted().json(json!({
            "call_id": call_id,
            "set": set,
            "mode": "background",
            "units": units.iter().map(|u| json!({"unit_id": u.unit_id, "tasks": u.tasks})).collect::<Vec<_>>(),
            "note": note,
        })),
        DelegateReply::Sync {
            call_id,
            set,
            forced_sync_reason,
            results,
            note,
            text,
            ..
        } => HttpResponse::Ok().json(json!({
            "call_id": call_id,
            "set": set,
            "mode": "sync",
            "forced_sync_reason": forced_sync_reason,
            "results": api::items(&results),
            "note": note,
            "text": text,
        })),
    })
}

pub(super) async fn boundary(
    state: web::Data<State>,
    access: Access,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    let session_id = session_path(path)?;
    access.session(&state.brood, &session_id).await?;
    let body: BoundaryBody = api::parse(&body(&state, payload).await?)?;
    let lease_ms = body.lease_ms.unwrap_or(state.config.default_lease_ms);
    let (min, max) = (state.config.min_lease_ms, state.config.max_lease_ms);
    if !(min..=max).contains(&lease_ms) {
        return Err(ApiError::invalid(format!(
            "`lease_ms` is {lease_ms}; it must be from {min} to {max}"
        )));
    }
    match state
        .brood
        .boundary(&session_id, &body.consumer, Duration::from_millis(lease_ms))
        .await?
    {
        None => Ok(HttpResponse::NoContent().finish()),
        Some(env) => Ok(HttpResponse::Ok().json(json!({
            "claim_id": env.claim_id,
            "lease_expires_at": env.lease_expires_at_ms,
            "items": api::items(&env.items),
            "text": env.text,
        }))),
    }
}

/// A claim of a session out of reach of the request's key is answered as an unknown one.
async fn reach_claim(state: &State, access: &Access, claim_id: &str) -> Result<(), ApiError> {
    if access.is_all() {
        return Ok(());
    }
    let session = brood_actors::actors::owner::claim_session(claim_id);
    let unknown = || BroodError::UnknownClaim(claim_id.to_string()).into();
    access.owned(&state.brood, session.as_deref(), unknown).await
}

/// A call (or a unit or child of it, `kind` `id`) of a session out of reach of the request's key
/// is answered as an unknown one. Looked up only for a scoped key.
pub(super) async fn reach_call(
    state: &State,
    access: &Access,
    kind: &'static str,
    id: &str,
    call_id: &str,
) -> Result<(), ApiError> {
    if access.is_all() {
        return Ok(());
    }
    let session = state.brood.call_session(call_id).await?;
    let unknown = || {
        BroodError::UnknownTarget {
            kind,
            id: id.to_string(),
        }
        .into()
    };
    access.owned(&state.brood, session.as_deref(), unknown).await
}

pub(super) async fn ack(state: web::Data<State>, access: Access, path: web::Path<String>) -> Reply {
    let claim_id = path.into_inner();
    reach_claim(&state, &access, &claim_id).await?;
    let delivered = state.brood.ack(&claim_id).await?;
    Ok(HttpResponse::Ok().json(json!({"delivered": delivered})))
}

pub(super) async fn release(
    state: web::Data<State>,
    access: Access,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    let claim_id = path.into_inner();
    reach_claim(&state, &access, &claim_id).await?;
    let body: ReleaseBody = api::parse(&body(&state, payload).await?)?;
    state
        .brood
        .release(&claim_id, body.reason, Duration::from_millis(body.retry_after_ms))
        .await?;
    Ok(HttpResponse::Ok().json(json!({"claim_id": claim_id, "released": true})))
}

/// `POST /v1/calls/{id}/cancel`.
pub(super) async fn cancel_call(
    state: web::Data<State>,
    access: Access,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    cancel(state, access, brood::CancelTarget::Call(path.into_inner()), payload).await
}

/// `POST /v1/units/{id}/cancel`.
pub(super) async fn cancel_unit(
    state: web::Data<State>,
    access: Access,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    cancel(state, access, brood::CancelTarget::Unit(path.into_inner()), payload).await
}

/// `POST /v1/children/{id}/cancel`.
pub(super) async fn cancel_child(
    state: web::Data<State>,
    access: Access,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    cancel(state, access, brood::CancelTarget::Child(path.into_inner()), payload).await
}

async fn cancel(state: web::Data<State>, access: Access, target: brood::CancelTarget, payload: web::Payload) -> Reply {
    if let Some(call_id) = target.call_id() {
        reach_call(&state, &access, target.kind(), target.id(), call_id).await?;
    }
    let body: api::CancelBody = api::parse(&body(&state, payload).await?)?;
    let done = state
        .brood
        .cancel(target, "an API request", body.reason.as_deref())
        .await?;
    Ok(HttpResponse::Ok().json(done))
}

/// The query of `GET /v1/dead-letters`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DeadLetterQuery {
    session_id: Option<String>,
}

pub(super) async fn dead_letters(state: web::Data<State>, access: Access, req: HttpRequest) -> Reply {
    let query = web::Query::<DeadLetterQuery>::from_query(req.query_string())
        .map_err(|e| ApiError::invalid(format!("the query string does not parse: {e}")))?
        .into_inner();
    let mut rows = match &query.session_id {
        Some(s) => {
            access.session(&state.brood, s).await?;
            state.brood.dead_letters_of(s).await?
        }
        None => state.brood.dead_letters().await?,
    };
    let mut reached = Vec::with_capacity(rows.len());
    for d in rows.drain(..) {
        if access.is_all() || access.covers(&state.brood, &d.session_id).await? {
            reached.push(d);
        }
    }
    let rows = reached;
    let items: Vec<serde_json::Value> = rows
        .iter()
        .map(|d| {
            json!({
                "child_id": d.child_id,
                "session_id": d.session_id,
                "call_id": d.call_id,
                "kind": d.kind,
                "reason": d.reason,
                "attempts": d.attempts,
                "dead_at": d.dead_at_ms,
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({"items": items})))
}

pub(super) async fn redrive(state: web::Data<State>, access: Access, payload: web::Payload) -> Reply {
    let raw = body(&state, payload).await?;
    let body: api::RedriveBody = api::parse(&raw)?;
    let limit = body.limit;
    if limit == Some(0) {
        return Err(ApiError::invalid("`limit` must be at least 1 when given"));
    }
    let mut select = body.select()?;
    if let brood::RedriveSelect::Session(s) = &select {
        access.session(&state.brood, s).await?;
    } else if !access.is_all() {
        // A scoped key redrives the dead letters of its own sessions only: those selected,
        // named by child.
        let mut ids: Vec<String> = Vec::new();
        for d in state.brood.dead_letters().await? {
            if select.selects(&d) && access.covers(&state.brood, &d.session_id).await? {
                ids.push(d.child_id);
            }
        }
        if ids.is_empty() {
            return Ok(HttpResponse::Ok().json(json!({"redriven": 0})));
        }
        select = brood::RedriveSelect::Children(ids);
    }
    let redriven = state.brood.redrive(select, limit).await?;
    Ok(HttpResponse::Ok().json(json!({"redriven": redriven})))
}

pub(super) async fn healthz(state: web::Data<State>) -> Reply {
    match state.brood.health().await {
        Ok(h) => Ok(HttpResponse::Ok().json(json!({
            "status": "ok",
            "sessions": h.sessions,
            "failed_sessions": h.failed_sessions,
        }))),
        Err(e @ BroodError::Stopped) | Err(e @ BroodError::Ledger(_)) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unhealthy",
            e.to_string(),
        )),
        Err(e) => Err(e.into()),
    }
}

pub(super) async fn not_found(req: HttpRequest) -> Reply {
    Err(ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no endpoint {} {}; see API.md", req.method(), req.path()),
    ))
}
