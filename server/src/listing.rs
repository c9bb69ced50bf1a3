//! `GET /v1/sessions`: every session stored in the ledger, a page at a time, in ascending id
//! order, each with its turn, wake capability, counts and dead letters (API.md "Lifecycle"),
//! kept to those whose id starts with `prefix` and those in `state` when the query names them.
//! Paging is by id, over the sessions the filters keep: a page starts after the `after` id
//! (exclusive) and `next` names the last id of a page that has more behind it. This file owns
//! the query's bounds, the filters, the page's shape, and how a page is filled when several
//! processes share a PostgreSQL ledger:
//!
//! - the page's session ids are read from the ledger (one key range: every stored session,
//!   whichever process serves it), a batch at a time until the filters kept a page and one more;
//! - who serves each is read from the session leases in one statement; the sessions served
//!   here are summarized from the engine (as `GET /v1/sessions/{id}` shapes them), and those
//!   served elsewhere by one request per other holder (`POST /v1/peers/sessions`, with the peer
//!   credential); a session nobody serves now is taken up here, as any read of it would;
//! - its dead letters are counted for the whole batch in one grouped read.
//!
//! A session that changed hands meanwhile is looked up and asked for once more; a holder that
//! does not answer fails the page (503 `session_moved`, to retry), so no session is silently
//! left out of a page.

use std::collections::{BTreeMap, HashMap};

use super::api::{self, ApiError, ListQuery, SessionState};
use super::state::State;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use brood::BroodError;

/// The page size when the query names none.
pub(super) const DEFAULT_LIMIT: usize = 100;
/// The largest page.
pub(super) const MAX_LIMIT: usize = 1000;

/// `limit` as given, checked against 1..=[`MAX_LIMIT`].
pub(super) fn limit(given: Option<&str>) -> Result<usize, ApiError> {
    let Some(text) = given else {
        return Ok(DEFAULT_LIMIT);
    };
    match text.parse::<usize>() {
        Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
        _ => Err(ApiError::invalid(format!(
            "`limit` is `{text}`; it must be a whole number from 1 to {MAX_LIMIT}"
        ))),
    }
}

/// `state` as given: one of [`SessionState::ALL`].
fn session_state(given: Option<&str>) -> Result<Option<SessionState>, ApiError> {
    let Some(text) = given else {
        return Ok(None);
    };
    SessionState::parse(text).map(Some).ok_or_else(|| {
        let accepted: Vec<&str> = SessionState::ALL.iter().map(|s| s.as_str()).collect();
        ApiError::invalid(format!(
            "`state` is `{text}`; it must be one of {}",
            accepted.join(", ")
        ))
    })
}

/// `prefix` as given: what a session id may be (1 to 256 characters, none a control character).
fn prefix(given: Option<&str>) -> Result<Option<&str>, ApiError> {
    let Some(text) = given else {
        return Ok(None);
    };
    match brood_actors::model::validate_session_id(text) {
        Ok(()) => Ok(Some(text)),
        Err(brood::RequestError::Invalid { message, .. }) => Err(ApiError::invalid(format!("`prefix` {message}"))),
        Err(e) => Err(ApiError::invalid(format!("`prefix`: {e}"))),
    }
}

#[utoipa::path(
    get, path = "/v1/sessions", operation_id = "listSessions",
    params(api::ListQuery),
    responses((status = 200, description = "A page of the sessions stored in the ledger (whichever process serves them), nested ones included, of those the filters keep.", body = api::SessionList),
        (status = 400, description = "A bad query (`invalid_request`): a `limit` out of bounds, a `prefix` no session id starts with, an unknown `state`.", body = api::ErrorReply),
        (status = 502, description = "A process serving sessions of the page refused this one's peer credential (`peer_refused`).", body = api::ErrorReply))
)]
pub(super) async fn list_sessions(
    state: web::Data<State>,
    access: super::scope::Access,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let query: ListQuery = api::query(&req)?;
    let limit = limit(query.limit.as_deref())?;
    let wanted = session_state(query.state.as_deref())?;
    let prefix = prefix(query.prefix.as_deref())?;
    // A page and one more tell whether more follow; filters that may drop sessions read on in
    // larger batches.
    let batch = match wanted.is_some() || !access.is_all() {
        true => (limit + 1).max(FILTERED_BATCH),
        false => limit + 1,
    };
    let (mut sessions, mut cursor) = (Vec::new(), query.after.clone());
    loop {
        let ids = state.brood.stored_session_ids(cursor.as_deref(), prefix, batch).await?;
        let exhausted = ids.len() < batch;
        cursor = ids.last().cloned();
        let mut reached = Vec::with_capacity(ids.len());
        for id in ids {
            // A scoped key lists its own sessions only (and those nested in them).
            if access.is_all() || access.covers(&state.brood, &id).await? {
                reached.push(id);
            }
        }
        for summary in summaries(&state, &reached).await? {
            if wanted.is_some_and(|w| !w.holds(&summary)) {
                continue;
            }
            sessions.push(summary);
            if sessions.len() > limit {
                break;
            }
        }
        if sessions.len() > limit || exhausted {
            break;
        }
    }
    let more = sessions.len() > limit;
    sessions.truncate(limit);
    let next = match more {
        true => sessions.last().map(|s: &api::SessionSummary| s.session_id.clone()),
        false => None,
    };
    Ok(HttpResponse::Ok().json(api::SessionList { sessions, next }))
}

/// How many session ids a listing reads at a time when a filter may drop some.
const FILTERED_BATCH: usize = 256;

/// The summaries of `ids` (ascending, as the ledger listed them), in that order: those served
/// here from the engine, the others from their holders, one request per holder; their dead
/// letters counted in one read. A session removed meanwhile (or given up after its owner kept
/// failing) is left out, as it is not listed any more.
async fn summaries(state: &State, ids: &[String]) -> Result<Vec<api::SessionSummary>, ApiError> {
    let (Some(first), Some(last)) = (ids.first(), ids.last()) else {
        return Ok(Vec::new());
    };
    let dead = state.brood.dead_letter_counts(first, last).await?;
    let mut found: HashMap<String, api::SessionSummary> = HashMap::with_capacity(ids.len());
    let mut asking = ids.to_vec();
    // A session that changed hands between the look-up of its holder and the question is looked
    // up and asked once more.
    for round in 0..2 {
        let away = state.brood.served_elsewhere(&asking).await?;
        let mut remote: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut again = Vec::new();
        for id in asking {
            if let Some(address) = away.get(&id) {
                remote.entry(address.clone()).or_default().push(id);
                continue;
            }
            match summary_here(state, &id).await? {
                Here::Summary(s) => {
                    found.insert(id, s);
                }
                Here::Gone => {}
                Here::Elsewhere => again.push(id),
            }
        }
        let asked = remote.iter().map(|(address, ids)| ask_holder(state, address, ids));
        for answer in futures::future::join_all(asked).await {
            let answer = answer?;
            again.extend(answer.elsewhere);
            for s in answer.sessions {
                found.insert(s.session_id.clone(), s);
            }
        }
        if again.is_empty() {
            break;
        }
        if round == 1 {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "session_moved",
                format!(
                    "sessions of this page changed hands while it was listed ({}); retry",
                    again.join(", ")
                ),
            ));
        }
        asking = again;
    }
    Ok(ids
        .iter()
        .filter_map(|id| found.remove(id))
        .map(|mut s| {
            s.dead_letters = dead.get(&s.session_id).copied().unwrap_or(0);
            s
        })
        .collect())
}

/// What this process can say of one session.
enum Here {
    /// It serves it: its summary (without its dead letters).
    Summary(api::SessionSummary),
    /// Another process serves it, or this one's lease of it may have run out.
    Elsewhere,
    /// It is not stored any more, or was given up after its owner kept failing.
    Gone,
}

/// The summary of session `id` as this process serves it (taking it up when nobody does).
async fn summary_here(state: &State, id: &str) -> Result<Here, ApiError> {
    match state.brood.counts(id).await {
        Ok(st) => {
            let nest = state.brood.nest(id).map(|n| n.session_id);
            Ok(Here::Summary(api::SessionSummary::of(&st, nest, 0)))
        }
        Err(BroodError::UnknownSession(_)) | Err(BroodError::SessionFailed { .. }) => Ok(Here::Gone),
        Err(BroodError::Moved { .. }) | Err(BroodError::TenureLapsed { .. }) => Ok(Here::Elsewhere),
        Err(e) => Err(e.into()),
    }
}

/// Asks the process at `address` for the summaries of `ids`, sessions it serves.
async fn ask_holder(state: &State, address: &str, ids: &[String]) -> Result<api::PeerSessions, ApiError> {
    let body = serde_json::to_vec(&api::PeerSessionsBody {
        session_ids: ids.to_vec(),
    })
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
    let what = format!("{} session(s) of this page are", ids.len());
    let answer = super::forward::ask_peer(state, address, "/v1/peers/sessions", body, &what).await?;
    serde_json::from_slice(&answer).map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "session_moved",
            format!("the process at {address}, which serves sessions of this page, answered what does not parse ({e}); retry"),
        )
    })
}

/// The most sessions one `POST /v1/peers/sessions` names: a page and one more, of the largest
/// batch.
pub(super) const MAX_PEER_SESSIONS: usize = MAX_LIMIT + 1;

/// `POST /v1/peers/sessions` (between processes sharing a ledger, not for clients): the
/// summaries of the sessions named that this process serves, and which of them it does not.
#[utoipa::path(
    post, path = "/v1/peers/sessions", operation_id = "peerSessions",
    request_body(content = api::PeerSessionsBody, content_type = "application/json"),
    responses((status = 200, description = "The summaries of the sessions named served here (between processes sharing a ledger).", body = api::PeerSessions))
)]
pub(super) async fn peer_sessions(
    state: web::Data<State>,
    access: super::scope::Access,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    if let Some(p) = access.prefix() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "out_of_scope",
            format!("this key reaches only the sessions whose id starts with `{p}`; this route is for the processes sharing a ledger"),
        ));
    }
    let body: api::PeerSessionsBody = api::parse(&super::state::body(&state, payload).await?)?;
    let n = body.session_ids.len();
    if !(1..=MAX_PEER_SESSIONS).contains(&n) {
        return Err(ApiError::invalid(format!(
            "`session_ids` names {n} sessions; name from 1 to {MAX_PEER_SESSIONS}"
        )));
    }
    let (mut sessions, mut elsewhere) = (Vec::new(), Vec::new());
    for id in body.session_ids {
        // An id no session may have names no stored session: nothing of it is answered.
        if brood_actors::model::validate_session_id(&id).is_err() {
            continue;
        }
        match summary_here(&state, &id).await? {
            Here::Summary(s) => sessions.push(s),
            Here::Elsewhere => elsewhere.push(id),
            Here::Gone => {}
        }
    }
    Ok(HttpResponse::Ok().json(api::PeerSessions { sessions, elsewhere }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_outside_1_to_1000_or_not_a_number_is_refused() {
        assert_eq!(limit(None).unwrap(), DEFAULT_LIMIT);
        assert_eq!(limit(Some("1")).unwrap(), 1);
        assert_eq!(limit(Some("1000")).unwrap(), 1000);
        for bad in ["0", "1001", "-1", "ten", ""] {
            assert_eq!(limit(Some(bad)).unwrap_err().code, "invalid_request", "{bad}");
        }
    }

    #[test]
    fn a_state_outside_the_four_or_a_bad_prefix_is_refused() {
        assert_eq!(
            session_state(Some("dead_letters")).unwrap(),
            Some(SessionState::DeadLetters)
        );
        assert_eq!(session_state(None).unwrap(), None);
        let e = session_state(Some("sleepy")).unwrap_err();
        assert!(
            e.message.contains("sleepy") && e.message.contains("busy, ready, dead_letters, nested"),
            "{}",
            e.message
        );
        assert_eq!(prefix(Some("a/b")).unwrap(), Some("a/b"));
        for bad in ["", "a\u{7}", &"x".repeat(257)] {
            assert_eq!(prefix(Some(bad)).unwrap_err().code, "invalid_request", "{bad:?}");
        }
    }
}
