//! `GET /v1/sessions`: the sessions the engine routes, a page at a time, in ascending id order,
//! each with its turn, wake capability, counts and dead letters (API.md "Lifecycle"), kept to
//! those whose id starts with `prefix` and those in `state` when the query names them. Paging
//! is by id, over the sessions the filters keep: a page starts after the `after` id
//! (exclusive) and `next` names the last id of a page that has more behind it. This file owns
//! the query's bounds, the filters and the page's shape; the counts come from
//! [`Brood::counts`](brood::Brood::counts), shaped as `GET /v1/sessions/{id}` shapes them.

use std::collections::HashMap;

use super::api::{self, ApiError, ListQuery, SessionState};
use super::state::State;
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

/// The ids of `ids` (ascending) a page may hold: those after `after` that start with `prefix`.
fn candidates<'a>(ids: &'a [String], after: Option<&str>, prefix: Option<&'a str>) -> impl Iterator<Item = &'a String> {
    let start = match after {
        Some(a) => ids.partition_point(|id| id.as_str() <= a),
        None => 0,
    };
    ids[start..]
        .iter()
        .filter(move |id| prefix.is_none_or(|p| id.starts_with(p)))
}

#[utoipa::path(
    get, path = "/v1/sessions", operation_id = "listSessions",
    params(api::ListQuery),
    responses((status = 200, description = "A page of sessions, nested ones included, of those the filters keep.", body = api::SessionList),
        (status = 400, description = "A bad query (`invalid_request`): a `limit` out of bounds, a `prefix` no session id starts with, an unknown `state`.", body = api::ErrorReply))
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
    let mut dead: HashMap<String, u64> = HashMap::new();
    for d in state.brood.dead_letters().await? {
        *dead.entry(d.session_id).or_default() += 1;
    }
    let ids = state.brood.sessions();
    let (mut sessions, mut more) = (Vec::new(), false);
    for id in candidates(&ids, query.after.as_deref(), prefix) {
        // A scoped key lists its own sessions only (and those nested in them).
        if !access.is_all() && !access.covers(&state.brood, id).await? {
            continue;
        }
        let st = match state.brood.counts(id).await {
            Ok(st) => st,
            // Given up between the listing and now: it is no longer routed, so not listed; nor
            // is one whose tenure may have run out (it may be served elsewhere now).
            Err(BroodError::UnknownSession(_))
            | Err(BroodError::SessionFailed { .. })
            | Err(BroodError::TenureLapsed { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        let nest = state.brood.nest(id).map(|n| n.session_id);
        let summary = api::SessionSummary::of(&st, nest, dead.get(id).copied().unwrap_or(0));
        if wanted.is_some_and(|w| !w.holds(&summary)) {
            continue;
        }
        if sessions.len() == limit {
            more = true;
            break;
        }
        sessions.push(summary);
    }
    let next = match more {
        true => sessions.last().map(|s: &api::SessionSummary| s.session_id.clone()),
        false => None,
    };
    Ok(HttpResponse::Ok().json(api::SessionList { sessions, next }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("s{i:02}")).collect()
    }

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
    fn candidates_start_after_the_given_id_and_keep_the_prefix() {
        let all = ids(12);
        let got = |after, prefix| candidates(&all, after, prefix).cloned().collect::<Vec<_>>();
        assert_eq!(got(None, None), all);
        assert_eq!(got(Some("s09"), None), all[10..].to_vec());
        // `after` need not be a listed id.
        assert_eq!(got(Some("s015"), Some("s0")), all[2..10].to_vec());
        assert_eq!(got(None, Some("s1")), all[10..].to_vec());
        assert!(got(Some("zzz"), None).is_empty());
        assert!(got(None, Some("t")).is_empty());
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
