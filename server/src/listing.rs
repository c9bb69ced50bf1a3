//! `GET /v1/sessions`: the sessions the engine routes, a page at a time, in ascending id order,
//! each with its turn, wake capability and counts (API.md "Lifecycle"). Paging is by id: a page
//! starts after the `after` id (exclusive) and `next` names the last id of a page that has more
//! behind it. This file owns the query's bounds and the page's shape; the counts come from
//! [`Brood::counts`](brood::Brood::counts), shaped as `GET /v1/sessions/{id}` shapes them.

use super::api::{self, ApiError, ListQuery};
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

/// The ids of one page of `ids` (ascending): those after `after`, at most `limit`, and whether
/// more follow.
fn page<'a>(ids: &'a [String], after: Option<&str>, limit: usize) -> (&'a [String], bool) {
    let start = match after {
        Some(a) => ids.partition_point(|id| id.as_str() <= a),
        None => 0,
    };
    let end = start.saturating_add(limit).min(ids.len());
    (&ids[start..end], end < ids.len())
}

#[utoipa::path(
    get, path = "/v1/sessions", operation_id = "listSessions",
    params(api::ListQuery),
    responses((status = 200, description = "A page of sessions, nested ones included.", body = api::SessionList),
        (status = 400, description = "A bad query (`invalid_request`).", body = api::ErrorReply))
)]
pub(super) async fn list_sessions(
    state: web::Data<State>,
    access: super::scope::Access,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let query: ListQuery = api::query(&req)?;
    let limit = limit(query.limit.as_deref())?;
    let mut ids = state.brood.sessions();
    if !access.is_all() {
        // A scoped key lists its own sessions only (and those nested in them).
        let mut reached = Vec::new();
        for id in ids {
            if access.covers(&state.brood, &id).await? {
                reached.push(id);
            }
        }
        ids = reached;
    }
    let (ids, more) = page(&ids, query.after.as_deref(), limit);
    let mut sessions = Vec::with_capacity(ids.len());
    for id in ids {
        let st = match state.brood.counts(id).await {
            Ok(st) => st,
            // Given up between the listing and now: it is no longer routed, so not listed; nor
            // is one whose tenure may have run out (it may be served elsewhere now).
            Err(BroodError::UnknownSession(_))
            | Err(BroodError::SessionFailed { .. })
            | Err(BroodError::TenureLapsed { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        sessions.push(api::SessionSummary {
            session_id: st.info.session_id.clone(),
            turn: st.info.turn.into(),
            wake_capable: st.info.wake_capable,
            counts: api::Counts::from(&st),
            parent_child_id: state.brood.nest(id).map(|n| n.session_id),
        });
    }
    let next = if more { ids.last().cloned() } else { None };
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
    fn pages_start_after_the_given_id_and_say_whether_more_follow() {
        let all = ids(5);
        assert_eq!(page(&all, None, 2), (&all[0..2], true));
        assert_eq!(page(&all, Some("s01"), 2), (&all[2..4], true));
        assert_eq!(page(&all, Some("s03"), 2), (&all[4..5], false));
        // `after` need not be a listed id.
        assert_eq!(page(&all, Some("s015"), 10), (&all[2..5], false));
        assert_eq!(page(&all, Some("zzz"), 10).0.len(), 0);
    }
}
