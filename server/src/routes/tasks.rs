//! A delegate's body turned into the engine's request: each task's runner, timeout, retry
//! policy and data checked against the server's bounds, and the call's trace context and
//! idempotency key taken from the body or the headers.

use super::*;

/// The caller's trace context: the body's `traceparent` when it has one (checked by the engine
/// when the call is made: a malformed one refuses the call), else the `traceparent` header when
/// it is one well-formed value. A header that is not (several, or malformed) is ignored, as W3C
/// Trace Context says a receiver does: the call goes on without a trace context.
pub(super) fn traceparent(http: &HttpRequest, field: Option<String>) -> Option<String> {
    if field.is_some() {
        return field;
    }
    let mut headers = http.headers().get_all("traceparent");
    let (Some(value), None) = (headers.next(), headers.next()) else {
        return None;
    };
    match value.to_str().ok().filter(|v| brood::validate_traceparent(v).is_ok()) {
        Some(v) => Some(v.to_string()),
        None => {
            tracing::debug!("a delegate's traceparent header is malformed; ignored");
            None
        }
    }
}

/// A delegate's idempotency key: the body's `idempotency_key`, else the `Idempotency-Key`
/// header (its bytes read as UTF-8, any other byte as U+FFFD); the header given twice refuses
/// the request.
pub(super) fn idempotency_key(http: &HttpRequest, field: Option<String>) -> Result<Option<String>, ApiError> {
    let mut headers = http.headers().get_all("idempotency-key");
    let header = match (headers.next(), headers.next()) {
        (None, _) => None,
        (Some(value), None) => {
            // Checked whether or not the body has a key: the header has the document's bounds.
            let key = String::from_utf8_lossy(value.as_bytes()).into_owned();
            let chars = key.chars().count();
            let visible = key.bytes().all(|b| (b' '..=b'~').contains(&b));
            if !(1..=brood_actors::model::MAX_IDEMPOTENCY_KEY_CHARS).contains(&chars) || !visible {
                return Err(ApiError::invalid(format!(
                    "the `Idempotency-Key` header has {chars} characters; it must be 1 to 255 visible ASCII characters"
                )));
            }
            Some(key)
        }
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "the `Idempotency-Key` header is given more than once",
            ))
        }
    };
    // The body's wins, as a body's `traceparent` wins over the header.
    Ok(field.or(header))
}

/// The timeout of task `i`, which named `given`: the configured default when it named none,
/// refused when it is over `max_task_timeout_ms`.
fn timeout(config: &crate::config::ServeConfig, i: usize, given: Option<u64>) -> Result<Option<u64>, ApiError> {
    let max = config.max_task_timeout_ms;
    match given {
        Some(ms) if max > 0 && ms > max => Err(ApiError::invalid(format!(
            "`tasks[{i}].timeout_ms` is {ms}; this server runs a child for at most {max} ms (its max_task_timeout_ms)"
        ))),
        Some(ms) => Ok(Some(ms)),
        None if config.default_timeout_ms > 0 => Ok(Some(config.default_timeout_ms)),
        None if max > 0 => Ok(Some(max)),
        None => Ok(None),
    }
}

/// The retry policy of task `i`, its waits refused over `max_retry_backoff_ms`.
fn retry(config: &crate::config::ServeConfig, i: usize, r: api::RetryBody) -> Result<brood::RetryPolicy, ApiError> {
    let max = config.max_retry_backoff_ms;
    let wait = |name: &str, given: Option<u64>, default: u64| {
        match given {
        Some(ms) if ms > max => Err(ApiError::invalid(format!(
            "`tasks[{i}].retry.{name}` is {ms}; this server waits at most {max} ms between attempts (its max_retry_backoff_ms)"
        ))),
        Some(ms) => Ok(ms),
        None => Ok(default.min(max)),
    }
    };
    Ok(brood::RetryPolicy {
        max_attempts: r.max_attempts,
        backoff_ms: wait("backoff_ms", r.backoff_ms, 1_000)?,
        max_backoff_ms: wait("max_backoff_ms", r.max_backoff_ms, 60_000)?,
    })
}

/// The data of task `i` (`null` is none), refused when it takes more than `max_input_bytes` as
/// compact JSON.
fn input(
    config: &crate::config::ServeConfig,
    i: usize,
    given: Option<serde_json::Value>,
) -> Result<Option<serde_json::Value>, ApiError> {
    let Some(value) = given.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let (size, max) = (value.to_string().len(), config.max_input_bytes);
    if size > max {
        return Err(ApiError::invalid(format!(
            "`tasks[{i}].input` takes {size} bytes as JSON; this server takes at most {max} (its max_input_bytes)"
        )));
    }
    Ok(Some(value))
}

/// Turns the request's tasks into the engine's, refusing runner kinds the server does not
/// allow (403) before anything is stored.
pub(crate) fn tasks(state: &State, body: DelegateBody) -> Result<DelegateRequest, ApiError> {
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
        task.timeout_ms = timeout(&state.config, i, task.timeout_ms)?;
        task.rerun_on_recovery = t.rerun_on_recovery;
        task.input = input(&state.config, i, t.input)?;
        task.retry = t.retry.map(|r| retry(&state.config, i, r)).transpose()?;
        out.push(task);
    }
    let mut req = match body.mode {
        api::Mode::Background => DelegateRequest::background(out),
        api::Mode::Sync => DelegateRequest::sync(out),
    };
    if body.independent_completions {
        req = req.independent();
    }
    Ok(req)
}
