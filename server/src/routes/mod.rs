//! The endpoints of API.md over the embedding API: each handler parses its body, calls one
//! [`Brood`] method and shapes the reply. No handler holds state of its own. A delegate's body is
//! turned into the engine's request by `tasks`.

use std::time::Duration;

use super::api::{self, ApiError, BoundaryBody, DelegateBody, PutSession, ReleaseBody, TurnBody};
use super::scope::Access;
use super::state::{body, State};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use brood::{BroodError, DelegateReply, DelegateRequest, SessionSettings, TaskSpec};

mod tasks;

pub(super) use tasks::tasks;
use tasks::{idempotency_key, traceparent};

type Reply = Result<HttpResponse, ApiError>;

/// The session id of a request's path, checked before anything is looked up: an id no session
/// could have is a 400, and costs no read.
pub(super) fn session_path(path: web::Path<String>) -> Result<String, ApiError> {
    let id = path.into_inner();
    brood_actors::model::validate_session_id(&id).map_err(brood::BroodError::from)?;
    Ok(id)
}

#[utoipa::path(
    put, path = "/v1/sessions/{session_id}", operation_id = "putSession",
    params(("session_id" = String, Path, description = "The session: 1 to 256 characters of printable ASCII without `/`, `?`, `#`, `%` or a space.", pattern = r#"^(?!\.{1,2}$)[!-"$&-.0->@-~]{1,256}$"#)), request_body(content = Option<api::PutSession>, content_type = "application/json"),
    responses((status = 200, description = "The session, made or changed.", body = api::Session))
)]
pub(super) async fn put_session(
    state: web::Data<State>,
    access: Access,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    let session_id = session_path(path)?;
    access.session(&state.brood, &session_id).await?;
    // The body is optional: none, `{}` and `null` change nothing.
    let body: PutSession = api::parse::<Option<PutSession>>(&body(&state, payload).await?)?.unwrap_or_default();
    let mut settings = SessionSettings::default();
    if let Some(url) = body.wake_url.clone() {
        settings = settings.wake_url(url);
    }
    if let Some(n) = body.max_concurrent_children {
        let max = state.config.max_session_capacity;
        if !(1..=max).contains(&n) {
            return Err(ApiError::invalid(format!(
                "`max_concurrent_children` is {n}; this server accepts from 1 to {max} (its max_session_capacity)"
            )));
        }
        settings = settings.max_concurrent_children(n);
    }
    if let Some(addressable) = body.addressable {
        // Default-deny: only an authenticated request (or a server without a key) grants it,
        // and every request that reaches a `/v1` handler passed the key check. The parent
        // reaches the session by polling its boundaries or watching its events; the setting
        // is stored with the session.
        settings = settings.addressable(addressable);
    }
    let info = state
        .brood
        .open_session_with_defaults(
            &session_id,
            settings,
            state.config.max_concurrent_children,
            state.config.max_delivery_attempts,
        )
        .await?;
    Ok(HttpResponse::Ok().json(api::Session::from(&info)))
}

#[utoipa::path(
    get, path = "/v1/sessions/{session_id}", operation_id = "getSession",
    params(("session_id" = String, Path, description = "The session: 1 to 256 characters, none a control character.", pattern = r"^[^\u0000-\u001f\u007f-\u009f]{1,256}$"), api::SessionQuery),
    responses((status = 200, description = "The session's state.", body = api::SessionDetail),
        (status = 400, description = "A bad query or session id (`invalid_request`).", body = api::ErrorReply),
        (status = 404, description = "No such session (`unknown_session`).", body = api::ErrorReply))
)]
pub(super) async fn get_session(
    state: web::Data<State>,
    access: Access,
    path: web::Path<String>,
    req: HttpRequest,
) -> Reply {
    let query: api::SessionQuery = api::query(&req)?;
    let delivered = match query.delivered.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "`delivered` is `{other}`; it must be true or false"
            )))
        }
    };
    let paged = delivered || query.after.is_some() || query.limit.is_some();
    let limit = super::listing::limit(query.limit.as_deref())?;
    let id = session_path(path)?;
    access.session(&state.brood, &id).await?;
    let st = state.brood.status(&id).await?;
    let (calls, calls_next) = match (delivered, paged) {
        (true, _) => {
            let (calls, next) = state.brood.session_calls(&id, query.after.as_deref(), limit).await?;
            let around = api::Around::of(&state.brood, &id, &calls);
            (calls.iter().map(|c| api::CallView::of(c, &around)).collect(), next)
        }
        (false, true) => live_page(&state.brood, &st.calls, query.after.as_deref(), limit),
        (false, false) => {
            let around = api::Around::of(&state.brood, &id, &st.calls);
            (st.calls.iter().map(|c| api::CallView::of(c, &around)).collect(), None)
        }
    };
    let info = &st.counts.info;
    Ok(HttpResponse::Ok().json(api::SessionDetail {
        session_id: info.session_id.clone(),
        wake_capable: info.wake_capable,
        addressable: info.addressable,
        turn: info.turn.into(),
        max_concurrent_children: info.max_concurrent_children,
        max_delivery_attempts: info.max_delivery_attempts,
        counts: api::Counts::from(&st.counts),
        parent_child_id: state.brood.nest(&info.session_id).map(|n| n.session_id),
        calls,
        calls_next,
        claims: st.claims.iter().map(api::ClaimView::from).collect(),
    }))
}

#[utoipa::path(
    get, path = "/v1/sessions/{session_id}/deliveries", operation_id = "listDeliveries",
    params(("session_id" = String, Path, description = "The session: 1 to 256 characters, none a control character.", pattern = r"^[^\u0000-\u001f\u007f-\u009f]{1,256}$"), api::DeliveriesQuery),
    responses((status = 200, description = "A page of the session's acks (the ledger's retained ones), in claim id order: the claims in the order they were made, then the receipts of sync calls (`sync_<call_id>`), whenever they were made.", body = api::Deliveries),
        (status = 400, description = "A bad query or session id (`invalid_request`).", body = api::ErrorReply),
        (status = 404, description = "No such session (`unknown_session`).", body = api::ErrorReply))
)]
pub(super) async fn list_deliveries(
    state: web::Data<State>,
    access: Access,
    path: web::Path<String>,
    req: HttpRequest,
) -> Reply {
    let query: api::DeliveriesQuery = api::query(&req)?;
    let limit = super::listing::limit(query.limit.as_deref())?;
    if query.call_id.as_deref() == Some("") {
        return Err(ApiError::invalid("`call_id` is empty; name a call, or leave it out"));
    }
    let id = session_path(path)?;
    access.session(&state.brood, &id).await?;
    let (acks, next) = state
        .brood
        .deliveries(&id, query.call_id.as_deref(), query.after.as_deref(), limit)
        .await?;
    Ok(HttpResponse::Ok().json(api::Deliveries::of(&acks, next)))
}

/// The reply to a delegate: 202 for a call in the background, 200 with the results of a sync
/// one.
fn delegated(reply: DelegateReply) -> HttpResponse {
    match reply {
        DelegateReply::Background {
            call_id,
            set,
            units,
            note,
        } => HttpResponse::Accepted().json(api::DelegateBackground {
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
        } => HttpResponse::Ok().json(api::DelegateSync {
            call_id,
            set,
            mode: api::Mode::Sync,
            forced_sync_reason,
            results: api::items(&results),
            note,
            text,
        }),
    }
}

/// A page of a session's calls not yet delivered, in the order `delivered=true` pages stored
/// calls (by call id, which follows the order they were made): those after `after`, at most
/// `limit`, and the last id of the page when more follow.
fn live_page(
    brood: &brood::BroodHandle,
    calls: &[brood::CallStatus],
    after: Option<&str>,
    limit: usize,
) -> (Vec<api::CallView>, Option<String>) {
    let mut ids: Vec<&brood::CallStatus> = calls
        .iter()
        .filter(|c| after.is_none_or(|a| c.call.call_id.as_str() > a))
        .collect();
    ids.sort_by(|a, b| a.call.call_id.cmp(&b.call.call_id));
    let more = ids.len() > limit;
    ids.truncate(limit);
    let next = more.then(|| ids.last().map(|c| c.call.call_id.clone())).flatten();
    let Some(session) = ids.first().map(|c| c.call.session_id.as_str()) else {
        return (Vec::new(), next);
    };
    let around = api::Around::of(brood, session, ids.iter().copied());
    (ids.iter().map(|c| api::CallView::of(c, &around)).collect(), next)
}

/// `GET /v1/calls/{call_id}`: the call as a session shows it, with its session, the mode it
/// ran in and why it was forced to sync, and when it was made; from the ledger once it was
/// delivered.
#[utoipa::path(
    get, path = "/v1/calls/{call_id}", operation_id = "getCall",
    params(("call_id" = String, Path, description = "The call: `deleg_<hex>`.")),
    responses((status = 200, description = "The call, also once delivered (until retention removes it).", body = api::CallDetail),
        (status = 404, description = "No such call (`unknown_call`).", body = api::ErrorReply))
)]
pub(super) async fn get_call(state: web::Data<State>, access: Access, path: web::Path<String>) -> Reply {
    let call_id = path.into_inner();
    reach_call(&state, &access, "call", &call_id, &call_id).await?;
    let c = state.brood.call(&call_id).await?;
    let around = api::Around::of(&state.brood, &c.call.session_id, [&c]);
    Ok(HttpResponse::Ok().json(api::CallDetail::of(&c, &around)))
}

#[utoipa::path(
    post, path = "/v1/sessions/{session_id}/turn", operation_id = "setTurn",
    params(("session_id" = String, Path, description = "The session: 1 to 256 characters, none a control character.", pattern = r"^[^\u0000-\u001f\u007f-\u009f]{1,256}$")), request_body(content = api::TurnBody, content_type = "application/json"),
    responses((status = 200, description = "The turn was set.", body = api::TurnReply),
        (status = 404, description = "No such session (`unknown_session`).", body = api::ErrorReply))
)]
pub(super) async fn set_turn(
    state: web::Data<State>,
    access: Access,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    let session_id = session_path(path)?;
    access.session(&state.brood, &session_id).await?;
    let body: TurnBody = api::parse(&body(&state, payload).await?)?;
    state.brood.set_turn(&session_id, body.state.into()).await?;
    Ok(HttpResponse::Ok().json(api::TurnReply {
        session_id,
        turn: body.state,
    }))
}

#[utoipa::path(
    post, path = "/v1/sessions/{session_id}/delegate", operation_id = "delegate",
    params(("session_id" = String, Path, description = "The session: 1 to 256 characters, none a control character.", pattern = r"^[^\u0000-\u001f\u007f-\u009f]{1,256}$"),
        ("traceparent" = Option<String>, Header, description = "The caller's W3C trace context, carried to the call's children and their events; ignored when malformed, and when the body has a `traceparent`."),
        ("Idempotency-Key" = Option<String>, Header, description = "As the body's `idempotency_key`, which wins when both are given.")),
    request_body(content = api::DelegateBody, content_type = "application/json"),
    responses((status = 202, description = "A background call: its results come at the session's boundaries.", body = api::DelegateBackground),
        (status = 200, description = "A sync call (or one forced to sync): its results, delivered.", body = api::DelegateSync),
        (status = 404, description = "No such session (`unknown_session`).", body = api::ErrorReply),
        (status = 409, description = "The child whose nested session this is has ended (`parent_ended`); the idempotency key was used for another request (`idempotency_conflict`); the sync call made with it still runs for another request (`idempotency_in_progress`).", body = api::ErrorReply),
        (status = 500, description = "An embedder's runner factory panicked (`runner_factory_panicked`).", body = api::ErrorReply))
)]
pub(super) async fn delegate(
    state: web::Data<State>,
    access: Access,
    path: web::Path<String>,
    http: HttpRequest,
    payload: web::Payload,
) -> Reply {
    let session_id = session_path(path)?;
    access.session(&state.brood, &session_id).await?;
    state.accepting()?;
    let body: DelegateBody = api::parse(&body(&state, payload).await?)?;
    let traceparent = traceparent(&http, body.traceparent.clone());
    let key = idempotency_key(&http, body.idempotency_key.clone())?;
    let mut request = tasks(&state, body)?;
    if let Some(tp) = traceparent {
        request = request.traceparent(tp);
    }
    if let Some(key) = key {
        request = request.idempotency_key(key);
    }
    let reply = state
        .brood
        .delegate(&session_id, request)
        .await
        .map_err(|e| ApiError::from(e.error))?;
    Ok(delegated(reply))
}

#[utoipa::path(
    post, path = "/v1/sessions/{session_id}/boundary", operation_id = "boundary",
    params(("session_id" = String, Path, description = "The session: 1 to 256 characters, none a control character.", pattern = r"^[^\u0000-\u001f\u007f-\u009f]{1,256}$")), request_body(content = api::BoundaryBody, content_type = "application/json"),
    responses((status = 200, description = "The envelope: every item ready now (or as many as `max_items` and `max_bytes` let in, the oldest first), claimed.", body = api::Envelope),
        (status = 204, description = "Nothing is ready."),
        (status = 404, description = "No such session (`unknown_session`), or the claim to ack first is unknown (`unknown_claim`).", body = api::ErrorReply),
        (status = 409, description = "The claim to ack first was lost (`claim_lost`): nothing was claimed.", body = api::ErrorReply))
)]
pub(super) async fn boundary(
    state: web::Data<State>,
    access: Access,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    let session_id = session_path(path)?;
    access.session(&state.brood, &session_id).await?;
    let body: BoundaryBody = api::parse(&body(&state, payload).await?)?;
    match take_boundary(&state, &access, &session_id, &body).await? {
        None => Ok(HttpResponse::NoContent().finish()),
        Some(env) => Ok(HttpResponse::Ok().json(api::Envelope::from(&env))),
    }
}

/// A boundary of `session_id` (within reach of `access`) as `body` asks: its lease within the
/// server's bounds, its envelope within its limits, the previous claim it names acked first.
/// What the HTTP route and the MCP tool both answer.
pub(super) async fn take_boundary(
    state: &State,
    access: &Access,
    session_id: &str,
    body: &BoundaryBody,
) -> Result<Option<brood::Envelope>, ApiError> {
    let lease_ms = body.lease_ms.unwrap_or(state.config.default_lease_ms);
    let (min, max) = (state.config.min_lease_ms, state.config.max_lease_ms);
    if !(min..=max).contains(&lease_ms) {
        return Err(ApiError::invalid(format!(
            "`lease_ms` is {lease_ms}; it must be from {min} to {max}"
        )));
    }
    let limits = brood::EnvelopeLimits {
        max_items: body.max_items.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        max_bytes: body.max_bytes.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
    };
    if let Some(claim_id) = &body.ack {
        ack_first(state, access, session_id, claim_id).await?;
    }
    Ok(state
        .brood
        .boundary_within(session_id, &body.consumer, Duration::from_millis(lease_ms), limits)
        .await?)
}

/// The ack a boundary asks for before it claims: of a claim of that same session only (a
/// claim of another is refused as bad input, and nothing is acked or claimed).
async fn ack_first(state: &State, access: &Access, session_id: &str, claim_id: &str) -> Result<(), ApiError> {
    if claim_id.is_empty() || claim_id.len() > 512 || claim_id.chars().any(char::is_control) {
        return Err(ApiError::invalid(
            "`ack` must be a claim id: 1 to 512 characters, none a control character",
        ));
    }
    match brood_actors::actors::owner::claim_session(claim_id) {
        Some(of) if of == session_id => {}
        Some(of) => {
            return Err(ApiError::invalid(format!(
                "`ack` names a claim of session `{of}`; a boundary of `{session_id}` acks only its own session's claims"
            )))
        }
        None => return Err(BroodError::UnknownClaim(claim_id.to_string()).into()),
    }
    reach_claim(state, access, claim_id).await?;
    state.brood.ack(claim_id).await?;
    Ok(())
}

/// A claim of a session out of reach of the request's key is answered as an unknown one.
pub(super) async fn reach_claim(state: &State, access: &Access, claim_id: &str) -> Result<(), ApiError> {
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

#[utoipa::path(
    post, path = "/v1/claims/{claim_id}/ack", operation_id = "ack",
    params(("claim_id" = String, Path, description = "The claim, from an envelope.")),
    responses((status = 200, description = "The claim's items are delivered (acking again answers the same).", body = api::AckReply),
        (status = 404, description = "No such claim (`unknown_claim`).", body = api::ErrorReply),
        (status = 409, description = "The claim was lost: expired, released, or returned by a restart or a takeover (`claim_lost`).", body = api::ErrorReply))
)]
pub(super) async fn ack(state: web::Data<State>, access: Access, path: web::Path<String>) -> Reply {
    let claim_id = path.into_inner();
    reach_claim(&state, &access, &claim_id).await?;
    let delivered = state.brood.ack(&claim_id).await?;
    Ok(HttpResponse::Ok().json(api::AckReply {
        delivered: delivered as u64,
    }))
}

#[utoipa::path(
    post, path = "/v1/claims/{claim_id}/release", operation_id = "release",
    params(("claim_id" = String, Path, description = "The claim, from an envelope.")), request_body(content = api::ReleaseBody, content_type = "application/json"),
    responses((status = 200, description = "The claim's items are ready again (after any backoff).", body = api::ReleaseReply),
        (status = 404, description = "No such claim (`unknown_claim`).", body = api::ErrorReply),
        (status = 409, description = "The claim was lost or acked (`claim_lost`, `claim_acked`).", body = api::ErrorReply))
)]
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
        .release(
            &claim_id,
            body.reason.into(),
            Duration::from_millis(body.retry_after_ms),
        )
        .await?;
    Ok(HttpResponse::Ok().json(api::ReleaseReply {
        claim_id,
        released: true,
    }))
}

/// `POST /v1/calls/{id}/cancel`.
#[utoipa::path(
    post, path = "/v1/calls/{call_id}/cancel", operation_id = "cancelCall",
    params(("call_id" = String, Path, description = "The call: `deleg_<hex>`.")), request_body(content = Option<api::CancelBody>, content_type = "application/json"),
    responses((status = 200, description = "The children this request cancelled.", body = api::CancelReply),
        (status = 404, description = "No such call (`unknown_call`).", body = api::ErrorReply))
)]
pub(super) async fn cancel_call(
    state: web::Data<State>,
    access: Access,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    cancel(state, access, brood::CancelTarget::Call(path.into_inner()), payload).await
}

/// `POST /v1/units/{id}/cancel`.
#[utoipa::path(
    post, path = "/v1/units/{unit_id}/cancel", operation_id = "cancelUnit",
    params(("unit_id" = String, Path, description = "The unit: `<call_id>-<k>`.")), request_body(content = Option<api::CancelBody>, content_type = "application/json"),
    responses((status = 200, description = "The children this request cancelled.", body = api::CancelReply),
        (status = 404, description = "No such unit (`unknown_unit`).", body = api::ErrorReply))
)]
pub(super) async fn cancel_unit(
    state: web::Data<State>,
    access: Access,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    cancel(state, access, brood::CancelTarget::Unit(path.into_inner()), payload).await
}

/// `POST /v1/children/{id}/cancel`.
#[utoipa::path(
    post, path = "/v1/children/{child_id}/cancel", operation_id = "cancelChild",
    params(("child_id" = String, Path, description = "The child: `<call_id>.<index>`.")), request_body(content = Option<api::CancelBody>, content_type = "application/json"),
    responses((status = 200, description = "The children this request cancelled.", body = api::CancelReply),
        (status = 404, description = "No such child (`unknown_child`).", body = api::ErrorReply))
)]
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
    let body = api::parse::<Option<api::CancelBody>>(&body(&state, payload).await?)?.unwrap_or_default();
    let done = state
        .brood
        .cancel(target, "an API request", body.reason.as_deref())
        .await?;
    Ok(HttpResponse::Ok().json(api::CancelReply::from(done)))
}

#[utoipa::path(
    get, path = "/v1/dead-letters", operation_id = "deadLetters",
    params(api::DeadLetterQuery),
    responses((status = 200, description = "Items that ran out of delivery attempts.", body = api::DeadLetters),
        (status = 400, description = "A bad query (`invalid_request`).", body = api::ErrorReply),
        (status = 404, description = "No such session (`unknown_session`).", body = api::ErrorReply))
)]
pub(super) async fn dead_letters(state: web::Data<State>, access: Access, req: HttpRequest) -> Reply {
    let query: api::DeadLetterQuery = api::query(&req)?;
    let mut rows = match &query.session_id {
        Some(s) => {
            brood_actors::model::validate_session_id(s).map_err(BroodError::from)?;
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
    let items = reached.iter().map(api::DeadLetter::from).collect();
    Ok(HttpResponse::Ok().json(api::DeadLetters { items }))
}

#[utoipa::path(
    post, path = "/v1/dead-letters/redrive", operation_id = "redriveDeadLetters",
    request_body(content = api::RedriveBody, content_type = "application/json"),
    responses((status = 200, description = "The items put back in their sessions' ready sets, each session's by the process that serves it.", body = api::RedriveReply),
        (status = 404, description = "No such session (`unknown_session`).", body = api::ErrorReply),
        (status = 502, description = "A process serving some of the sessions refused this one's peer credential (`peer_refused`): the others' items were redriven, the message says how many.", body = api::ErrorReply))
)]
pub(super) async fn redrive(
    state: web::Data<State>,
    access: Access,
    http: HttpRequest,
    payload: web::Payload,
) -> Reply {
    let raw = body(&state, payload).await?;
    let body: api::RedriveBody = api::parse(&raw)?;
    let limit = body.limit;
    if let Some(n) = limit.filter(|n| !(1..=u64::from(u32::MAX)).contains(n)) {
        return Err(ApiError::invalid(format!(
            "`limit` is {n}; it must be from 1 to {} when given",
            u32::MAX
        )));
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
            return Ok(HttpResponse::Ok().json(api::RedriveReply { redriven: 0 }));
        }
        select = brood::RedriveSelect::Children(ids);
    }
    let limit = limit.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    // Each session's part is done by the process that serves it: here, or by its holder.
    let split = state.brood.redrive_split(select, limit).await?;
    let mut redriven = split.redriven as u64;
    if split.elsewhere.is_empty() {
        return Ok(HttpResponse::Ok().json(api::RedriveReply { redriven }));
    }
    let sessions_of = |parts: &[(String, Vec<String>)]| {
        parts
            .iter()
            .map(|(s, _)| format!("`{s}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if http.headers().contains_key(super::forward::FORWARDED) {
        // Sent here as the holder of these sessions, which changed hands since: answered, not
        // sent on again.
        let (address, parts) = split
            .elsewhere
            .iter()
            .next()
            .map(|(a, p)| (a.clone(), p.clone()))
            .unwrap_or_default();
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "session_moved",
            format!(
                "{redriven} item(s) were redriven here; the sessions {} are served by the process at {address} now; retry",
                sessions_of(&parts)
            ),
        ));
    }
    let asked = split.elsewhere.iter().map(|(address, parts)| {
        let state = state.clone();
        async move {
            let child_ids: Vec<String> = parts.iter().flat_map(|(_, c)| c.iter().cloned()).collect();
            let body = serde_json::json!({ "child_ids": child_ids }).to_string().into_bytes();
            let what = format!("the dead letters of the sessions {} are", sessions_of(parts));
            let answer = super::forward::ask_peer(&state, address, "/v1/dead-letters/redrive", body, &what).await?;
            serde_json::from_slice::<api::RedriveReply>(&answer).map_err(|e| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "session_moved",
                    format!("{what} served by the process at {address}, whose answer does not parse ({e}); retry"),
                )
            })
        }
    });
    let mut failed: Vec<ApiError> = Vec::new();
    for answer in futures::future::join_all(asked).await {
        match answer {
            Ok(reply) => redriven += reply.redriven,
            Err(e) => failed.push(e),
        }
    }
    match failed.first() {
        None => Ok(HttpResponse::Ok().json(api::RedriveReply { redriven })),
        // Reported, not skipped: what the others redrove is done, and a retry of the same
        // request redrives the rest (what is no dead letter any more is skipped).
        Some(first) => Err(ApiError::new(
            first.status,
            first.code,
            format!(
                "{redriven} item(s) were redriven, but not all: {}; retry the same request (items redriven already are no dead letters any more, and are skipped)",
                failed.iter().map(|e| e.message.as_str()).collect::<Vec<_>>().join("; ")
            ),
        )),
    }
}

#[utoipa::path(
    get, path = "/healthz", operation_id = "healthz",
    responses((status = 200, description = "The process runs: its actors answer (a liveness probe: the ledger is not asked, so a database outage does not fail it; `/readyz` says whether to send work).", body = api::Health),
        (status = 503, description = "The engine stopped or its ledger failed (`unhealthy`).", body = api::ErrorReply))
)]
pub(super) async fn healthz(state: web::Data<State>) -> Reply {
    match state.brood.health().await {
        Ok(h) => Ok(HttpResponse::Ok().json(api::Health {
            status: "ok".to_string(),
            sessions: h.sessions as u64,
            failed_sessions: h.failed_sessions as u64,
        })),
        Err(e @ BroodError::Stopped) | Err(e @ BroodError::Ledger(_)) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unhealthy",
            e.to_string(),
        )),
        Err(e) => Err(e.into()),
    }
}

#[utoipa::path(
    get, path = "/readyz", operation_id = "readyz",
    responses((status = 200, description = "The server admits work: it is not draining, its actors answer, and its ledger answered a round trip (PostgreSQL: `SELECT 1` within 2 s; the answer stands for 1 s).", body = api::Health),
        (status = 503, description = "Send work elsewhere: the server drains (`draining`), or its engine stopped or its ledger failed (`ledger_unavailable`).", body = api::ErrorReply))
)]
pub(super) async fn readyz(state: web::Data<State>) -> Reply {
    state.accepting()?;
    let h = state.brood.health().await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ledger_unavailable",
            format!("the server cannot take work now: {e}"),
        )
    })?;
    // The engine's health reads nothing: the ledger (a database, shared) is asked itself.
    state.ledger_answers().await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ledger_unavailable",
            format!("the server cannot take work now: its ledger does not answer ({e})"),
        )
    })?;
    Ok(HttpResponse::Ok().json(api::Health {
        status: "ready".to_string(),
        sessions: h.sessions as u64,
        failed_sessions: h.failed_sessions as u64,
    }))
}

pub(super) async fn not_found(req: HttpRequest) -> Reply {
    Err(ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!(
            "no endpoint {} {}; GET /v1/openapi.json lists them",
            req.method(),
            req.path()
        ),
    ))
}

/// 405 for a method a path does not answer, naming those it does in `Allow`.
pub(super) async fn not_allowed(allow: &'static str) -> HttpResponse {
    let e = ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("this path answers {allow} only"),
    );
    let mut reply = actix_web::ResponseError::error_response(&e);
    if let Ok(value) = actix_web::http::header::HeaderValue::from_str(allow) {
        reply.headers_mut().insert(actix_web::http::header::ALLOW, value);
    }
    reply
}
