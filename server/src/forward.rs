//! Forwarding between processes sharing one PostgreSQL ledger: a request for a
//! session another process serves is sent on to that process, and its answer returned as it
//! came, so a client may talk to any of them and never needs to know which serves what.
//!
//! The engine names the holder ([`brood::BroodError::Moved`], its address carried on the error
//! reply as [`MovedTo`]); this middleware kept the request's body, and sends the request again
//! there. A process that gets a forwarded request for a session it no longer serves (it handed
//! the session over, or a stale answer named it) sends it on once more, to a process the
//! request has not been through; past two hops it is answered here (503 `session_moved`, to
//! retry), so processes with stale views never bounce a request around. An event stream is not
//! relayed: it is redirected (307) to the holder.
//!
//! What crosses between processes: only to an address a process wrote itself into the tenure
//! table (or the shared work list), never one a client named; with the peer credential
//! ([`PEER`], see [`super::config::ServeConfig::peer_credential`]) instead of the user's key,
//! and the prefix of a scoped key ([`super::scope::SCOPE`]) when the user's key was one;
//! following no redirect; reading at most the larger of the body limit and 64 MiB of the
//! answer.

use actix_web::body::{BoxBody, EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{header, StatusCode};
use actix_web::middleware::Next;
use actix_web::{web, HttpMessage as _, HttpResponse};
use futures::StreamExt as _;

use super::api::{ApiError, MovedTo};
use super::metrics::{Forwarded, Metrics};
use super::state::State;

/// The header a forwarded request carries: the addresses of the processes that forwarded it,
/// comma-separated, in order.
pub(super) const FORWARDED: &str = "x-brood-forwarded-by";

/// The most processes a request is sent on by: the one it reached, and a holder that handed
/// the session on meanwhile (or that a stale answer named).
const MAX_HOPS: usize = 2;

/// How long a forwarded request may take at its holder.
pub(super) const FORWARD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// The header that carries the peer credential of a request between processes, in place of
/// the end user's key (which never leaves the process it was sent to).
pub(super) const PEER: &str = "x-brood-peer";

/// The request headers sent on (the others are the connection's own, or the user's key): the
/// body's type, what the client accepts, and the caller's W3C trace context.
const SENT_ON: [header::HeaderName; 5] = [
    header::CONTENT_TYPE,
    header::ACCEPT,
    header::HeaderName::from_static("traceparent"),
    header::HeaderName::from_static("tracestate"),
    header::HeaderName::from_static("idempotency-key"),
];

/// The most of a holder's answer read: the body limit, or this when larger (an envelope of
/// many items outgrows a request's limit). A longer answer is not relayed.
const MIN_ANSWER_LIMIT: usize = 64 << 20;

/// The most of another process's answer this one reads ([`MIN_ANSWER_LIMIT`]).
pub(super) fn answer_limit(state: &State) -> usize {
    state.config.body_limit.max(MIN_ANSWER_LIMIT)
}

/// The processes a request was forwarded through, in order (the [`FORWARDED`] header), and the
/// rule for sending it on once more.
#[derive(Debug, Default, PartialEq, Eq)]
struct Hops(Vec<String>);

impl Hops {
    /// The addresses the header names (comma-separated; blanks ignored); none without it.
    fn read(header: Option<&header::HeaderValue>) -> Hops {
        Hops(
            header
                .map(|v| {
                    String::from_utf8_lossy(v.as_bytes())
                        .split(',')
                        .map(|a| a.trim().to_string())
                        .filter(|a| !a.is_empty())
                        .collect()
                })
                .unwrap_or_default(),
        )
    }

    /// Whether another process sent the request here.
    fn forwarded(&self) -> bool {
        !self.0.is_empty()
    }

    /// Whether the process at `me` may send the request on to the one at `to`: always when a
    /// client sent it here; when another process did (it thought this one served the session,
    /// which was handed on meanwhile, or a stale answer named it), once more at most
    /// ([`MAX_HOPS`] in all), never back through a process it came through nor to itself. Else it
    /// is answered here, not bounced around (the client retries; the tenures settle meanwhile).
    fn may_go_to(&self, me: &str, to: &str) -> bool {
        !self.forwarded() || (self.0.len() < MAX_HOPS && to != me && !self.0.iter().any(|a| a == to))
    }

    /// The header the request goes on with from `me`.
    fn header_with(&self, me: &str) -> String {
        self.0
            .iter()
            .map(String::as_str)
            .chain(std::iter::once(me))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The header of an answer about one session that names the process serving it (its advertised
/// address): a client may send that session's next requests there, which spares them a hop
/// between processes. Set only with a ledger shared by several processes, and only for a key
/// that reaches the session (a scoped key is told nothing of a session out of its reach);
/// relayed as the holder set it.
pub const HOLDER: &str = "x-brood-holder";

/// The session a request is about, when its path names one: `/v1/sessions/{id}[/…]`, or a
/// claim's `/v1/claims/{claim}/…` (a claim id names its session). A session id written with
/// percent escapes is not decoded here (the handler's extractor does that): such a request
/// takes the handler's way.
fn session_in(path: &str) -> Option<String> {
    let mut parts = path.strip_prefix("/v1/")?.splitn(3, '/');
    let (kind, id) = (parts.next()?, parts.next()?);
    if id.is_empty() || id.contains('%') {
        return None;
    }
    match kind {
        "sessions" => Some(id.to_string()),
        "claims" => brood_actors::actors::owner::claim_session(id),
        _ => None,
    }
}

/// A request as it goes on to another process.
struct Outbound {
    method: actix_web::http::Method,
    /// Path and query.
    target: String,
    headers: Vec<(header::HeaderName, header::HeaderValue)>,
    body: web::Bytes,
    came_through: Hops,
    /// The prefix of the scoped key it came with, if it did.
    scope: Option<String>,
    metrics: Option<web::Data<Metrics>>,
}

pub(super) async fn forward(
    mut req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody, BoxBody>>, actix_web::Error> {
    let Some(state) = req.app_data::<web::Data<State>>().cloned() else {
        return Ok(next.call(req).await?.map_into_left_body());
    };
    if state.config.ledger.is_none() {
        // One process serves every session.
        return Ok(next.call(req).await?.map_into_left_body());
    }
    // Kept, to send on should the session be served elsewhere (bodies are bounded anyway).
    let mut payload = req.take_payload();
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk?;
        if body.len() + chunk.len() > state.config.body_limit {
            let e = ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!("the body is over the limit of {} bytes", state.config.body_limit),
            );
            let reply = actix_web::ResponseError::error_response(&e).map_into_right_body();
            return Ok(req.into_response(reply));
        }
        body.extend_from_slice(&chunk);
    }
    let body = body.freeze();
    req.set_payload(actix_web::dev::Payload::from(body.clone()));
    let out = Outbound {
        method: req.method().clone(),
        target: req.uri().path_and_query().map_or("/", |p| p.as_str()).to_string(),
        // Every value of each, in order: the holder judges a header given twice (an
        // `Idempotency-Key` twice is refused, a `traceparent` twice ignored) as this process
        // would.
        headers: SENT_ON
            .iter()
            .flat_map(|h| req.headers().get_all(h).map(|v| (h.clone(), v.clone())))
            .collect(),
        body,
        came_through: Hops::read(req.headers().get(FORWARDED)),
        // A scoped key's request goes on with its scope, so the holder judges it as this
        // process did.
        scope: req
            .extensions()
            .get::<super::scope::Access>()
            .and_then(|a| a.prefix().map(str::to_string)),
        metrics: req.app_data::<web::Data<Metrics>>().cloned(),
    };
    let session = session_in(req.path());
    // Whether the request's key reaches the session it names: a scoped key's request for a
    // session out of its reach is neither sent on early nor answered with where the session is
    // served (either would tell the key that the session exists); its handler refuses it.
    let access = req.extensions().get::<super::scope::Access>().cloned();
    let reaches = match (&session, &access) {
        (Some(s), Some(access)) => access.covers(&state.brood, s).await.unwrap_or(false),
        _ => false,
    };
    if !out.came_through.forwarded() && reaches {
        // A client's request for a session another process serves, as this one found out a
        // moment ago: sent on before any handler runs (the holder judges it whole).
        if let Some((session, address)) = session
            .as_ref()
            .and_then(|s| Some((s.clone(), state.brood.holder_elsewhere(s)?)))
        {
            let (request, _) = req.into_parts();
            return Ok(relay(&state, request, Some(session), address, out)
                .await
                .map_into_right_body());
        }
    }
    let mut res = next.call(req).await?;
    let Some(MovedTo { session, address }) = res.response().extensions().get::<MovedTo>().cloned() else {
        if reaches && session.is_some_and(|s| state.brood.serves(&s)) {
            if let Ok(me) = header::HeaderValue::from_str(&state.config.advertised()) {
                res.headers_mut().insert(header::HeaderName::from_static(HOLDER), me);
            }
        }
        return Ok(res.map_into_left_body());
    };
    let me = state.config.advertised();
    if out.came_through.forwarded() {
        // Two processes thought another served it: this one asks the database next time.
        if let Some(session) = &session {
            state.brood.forget_holder(session);
        }
        if !out.came_through.may_go_to(&me, &address) {
            count(&out.metrics, Forwarded::Bounced);
            return Ok(res.map_into_left_body());
        }
    }
    let (request, _) = res.into_parts();
    Ok(relay(&state, request, session, address, out)
        .await
        .map_into_right_body())
}

fn count(metrics: &Option<web::Data<Metrics>>, outcome: Forwarded) {
    if let Some(m) = metrics {
        m.forwarded(outcome);
    }
}

/// Sends `out` on to the process at `address`, which serves `session`, and answers with what it
/// answered (an event stream is redirected there instead).
async fn relay(
    state: &State,
    request: actix_web::HttpRequest,
    session: Option<String>,
    address: String,
    out: Outbound,
) -> ServiceResponse {
    let Outbound {
        method,
        target,
        mut headers,
        body,
        came_through,
        scope,
        metrics,
    } = out;
    let me = state.config.advertised();
    if address == me {
        // The holder named is this process's own address: an earlier run of it there, which
        // stopped without giving the session's tenure back. Neither sent to itself nor
        // redirected there (a client following would come back here, again and again): answered
        // here, to retry once that tenure runs out, when this process takes the session up.
        if let Some(session) = &session {
            state.brood.forget_holder(session);
        }
        let e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "session_moved",
            format!(
                "the session is held by an earlier run of this process at {me}, which stopped without giving it back; retry (it is taken up here once its tenure runs out)"
            ),
        );
        return ServiceResponse::new(request, actix_web::ResponseError::error_response(&e));
    }
    let url = format!("{address}{target}");
    if target.ends_with("/events") {
        // What the client finds there is never known here (a process that died meanwhile is
        // not found out by a redirect): the next stream asked for the session, as a client
        // reconnects, asks the ledger who serves it rather than being sent to a dead holder
        // again, for as long as the answer would be kept.
        if let Some(session) = &session {
            state.brood.forget_holder(session);
        }
        let reply = HttpResponse::TemporaryRedirect()
            .insert_header((header::LOCATION, url))
            .finish();
        count(&metrics, Forwarded::Redirected);
        return ServiceResponse::new(request, reply);
    }
    let through = came_through.header_with(&me);
    let peer = state.config.peer_credential();
    let limit = answer_limit(state);
    if let Some(prefix) = scope {
        // A prefix is printable ASCII (the configuration checks it), so it always makes a
        // header; were it not, the request would go on without its scope: it is refused instead.
        let Ok(value) = header::HeaderValue::from_str(&prefix) else {
            let e = ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the key's scope cannot be sent on",
            );
            return ServiceResponse::new(request, actix_web::ResponseError::error_response(&e));
        };
        headers.push((header::HeaderName::from_static(super::scope::SCOPE), value));
    }
    let sent = send_on(&url, method, headers, body, &through, peer.as_deref(), limit).await;
    count(
        &metrics,
        match &sent {
            Ok(Answer { status, .. }) if *status != StatusCode::UNAUTHORIZED => Forwarded::Relayed,
            _ => Forwarded::Failed,
        },
    );
    // The holder did not answer, or does not serve the session any more (it answers 503
    // `session_moved` or `lease_lapsed`): ask the database who does at the next request.
    let stale = sent
        .as_ref()
        .map_or(true, |a| a.status == StatusCode::SERVICE_UNAVAILABLE);
    if let (true, Some(session)) = (stale, &session) {
        state.brood.forget_holder(session);
    }
    // It was sent on from there to where the session went meanwhile: the next request asks
    // the ledger who serves it, and goes straight there. (The address the answer names is not
    // believed as it is: this process sends its peer credential only to an address a process
    // wrote into the tenure table, never to one an answer named, as it follows no redirect.)
    let named = sent.as_ref().ok().and_then(|a| a.holder.as_ref()?.to_str().ok());
    if let (Some(holder), Some(session), false) = (named, &session, stale) {
        if holder != address {
            state.brood.forget_holder(session);
        }
    }
    let reply = match sent {
        Ok(Answer { status, .. }) if status == StatusCode::UNAUTHORIZED => {
            tracing::warn!(%address, "a peer sharing the ledger refused this process's peer credential");
            actix_web::ResponseError::error_response(&ApiError::new(
                StatusCode::BAD_GATEWAY,
                "peer_refused",
                format!(
                    "the session is served by the process at {address}, which refused this process's peer credential: the processes sharing the ledger need the same api_key (or peer_key)"
                ),
            ))
        }
        Ok(Answer {
            status,
            content_type,
            holder,
            allow,
            body,
        }) => {
            let mut reply = HttpResponse::build(status);
            reply.insert_header((header::CONTENT_TYPE, content_type));
            if let Some(holder) = holder {
                reply.insert_header((header::HeaderName::from_static(HOLDER), holder));
            }
            if let Some(allow) = allow {
                reply.insert_header((header::ALLOW, allow));
            }
            reply.body(body)
        }
        Err(e) => actix_web::ResponseError::error_response(&ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "session_moved",
            format!(
                "the session is served by the process at {address}, which did not answer ({e}); retry (a process that died has its sessions taken over once their tenures run out)"
            ),
        )),
    };
    ServiceResponse::new(request, reply)
}

/// Sends a request of this process's own (a part of a listing or of a redrive) to the process
/// at `address`, which wrote itself into the tenure table, as a forwarded request goes: with
/// the peer credential and [`FORWARDED`] (so it is not sent on again), following no redirect.
/// Its answer when it answered 200, else an error that names it and says what to do: 502
/// `peer_refused` when it refused the peer credential, 503 `session_moved` otherwise (it did
/// not answer, or answered another status). `what` names the sessions concerned.
pub(super) async fn ask_peer(
    state: &State,
    address: &str,
    path: &str,
    body: Vec<u8>,
    what: &str,
) -> Result<Vec<u8>, ApiError> {
    let url = format!("{address}{path}");
    let me = state.config.advertised();
    let peer = state.config.peer_credential();
    let limit = answer_limit(state);
    let headers = vec![(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    )];
    let sent = send_on(
        &url,
        actix_web::http::Method::POST,
        headers,
        web::Bytes::from(body),
        &me,
        peer.as_deref(),
        limit,
    )
    .await;
    match sent {
        Ok(Answer { status, body, .. }) if status == StatusCode::OK => Ok(body.to_vec()),
        Ok(Answer { status, .. }) if status == StatusCode::UNAUTHORIZED => {
            tracing::warn!(%address, "a peer sharing the ledger refused this process's peer credential");
            Err(ApiError::new(
                StatusCode::BAD_GATEWAY,
                "peer_refused",
                format!(
                    "{what} served by the process at {address}, which refused this process's peer credential: the processes sharing the ledger need the same api_key (or peer_key)"
                ),
            ))
        }
        Ok(Answer { status, body, .. }) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "session_moved",
            format!(
                "{what} served by the process at {address}, which answered {status}: {}; retry",
                String::from_utf8_lossy(&body[..body.len().min(512)])
            ),
        )),
        Err(e) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "session_moved",
            format!(
                "{what} served by the process at {address}, which did not answer ({e}); retry (a process that died has its sessions taken over once their leases run out)"
            ),
        )),
    }
}

/// How long an idle connection to another process is kept: less than the keep-alive of an idle
/// connection at the other end (actix-web's default, 5 s), so one it closed is never reused.
pub(super) const IDLE_AGE: std::time::Duration = std::time::Duration::from_secs(4);

/// How long connecting to another process may take.
pub(super) const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The client of every request between the processes sharing a ledger (requests sent on,
/// listings, redrives, takes of children listed elsewhere): one per worker thread (it lives on
/// the thread that made it), so they go out from the worker's own event loop, over connections
/// to the other processes it keeps and reuses. A status is an
/// answer, not an error, and a redirect is an answer too: it is never followed.
pub(super) fn peers() -> awc::Client {
    thread_local! {
        static CLIENT: awc::Client = awc::Client::builder()
            .disable_redirects()
            .timeout(FORWARD_TIMEOUT)
            .connector(
                awc::Connector::new()
                    .timeout(CONNECT_TIMEOUT)
                    .conn_keep_alive(IDLE_AGE)
                    // As many connections at once as requests are sent on (each came on a
                    // connection of its own): a cap (awc's default is 100) would hold every
                    // request past it, to any process, behind those a slow process holds.
                    .limit(0),
            )
            .finish();
    }
    CLIENT.with(Clone::clone)
}

/// What the holder answered.
struct Answer {
    status: StatusCode,
    content_type: header::HeaderValue,
    /// The process it named as serving the session ([`HOLDER`]), if it named one.
    holder: Option<header::HeaderValue>,
    /// The methods the path answers, with a 405: what the holder said, as it said it.
    allow: Option<header::HeaderValue>,
    body: web::Bytes,
}

/// Sends the request on to its session's holder and returns the holder's answer as it came.
async fn send_on(
    url: &str,
    method: actix_web::http::Method,
    headers: Vec<(header::HeaderName, header::HeaderValue)>,
    body: web::Bytes,
    me: &str,
    peer: Option<&str>,
    limit: usize,
) -> Result<Answer, String> {
    let mut request = peers().request(method, url).insert_header((FORWARDED, me));
    if let Some(credential) = peer {
        request = request.insert_header((PEER, credential));
    }
    for (name, value) in headers {
        request = request.append_header((name, value));
    }
    let mut answer = request.send_body(body).await.map_err(|e| e.to_string())?;
    let status = answer.status();
    if status.is_redirection() {
        // brood never redirects a peer's request: not followed, and not relayed either.
        return Err(format!("it answered {status}, a redirect, which is not followed"));
    }
    let content_type = answer
        .headers()
        .get(header::CONTENT_TYPE)
        .cloned()
        .unwrap_or_else(|| header::HeaderValue::from_static("application/json"));
    let holder = answer.headers().get(HOLDER).cloned();
    let allow = answer.headers().get(header::ALLOW).cloned();
    let body = answer
        .body()
        .limit(limit)
        .await
        .map_err(|e| format!("its answer could not be read whole (at most {limit} bytes are relayed): {e}"))?;
    Ok(Answer {
        status,
        content_type,
        holder,
        allow,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hops(header: &str) -> Hops {
        Hops::read(Some(&header::HeaderValue::from_str(header).unwrap()))
    }

    #[test]
    fn the_header_names_each_process_once_in_order_and_blanks_are_ignored() {
        assert_eq!(Hops::read(None), Hops::default());
        assert_eq!(
            hops(" http://a:1 ,, http://b:2 "),
            Hops(vec!["http://a:1".into(), "http://b:2".into()])
        );
        assert_eq!(hops(""), Hops::default());
        assert_eq!(Hops::default().header_with("http://a"), "http://a");
        assert_eq!(hops("http://a").header_with("http://b"), "http://a, http://b");
    }

    #[test]
    fn a_request_goes_on_once_more_at_most_never_back_nor_to_itself() {
        // From a client: anywhere (even to itself: the next process bounces it).
        assert!(Hops::default().may_go_to("http://a", "http://b"));
        assert!(Hops::default().may_go_to("http://a", "http://a"));
        // From a: on to c, not back to a, not to b itself.
        let from_a = hops("http://a");
        assert!(from_a.may_go_to("http://b", "http://c"));
        assert!(!from_a.may_go_to("http://b", "http://a"));
        assert!(!from_a.may_go_to("http://b", "http://b"));
        // Through a and b already: answered here.
        assert!(!hops("http://a, http://b").may_go_to("http://c", "http://d"));
    }
}
