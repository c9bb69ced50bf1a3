//! Requests as the embedder hands them in, and their validation: a delegate request and its
//! tasks, a session's settings, a session id. Validation turns a request into stored rows or
//! says what is wrong; it changes nothing. Embedder code it calls (a runner factory's
//! `validate`) is contained: a panic there refuses the request, it never reaches the owner.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use super::{Mode, RetryPolicy, Task, DEFAULT_STALL_MS, MAX_RETRY_ATTEMPTS, MAX_VALUE_BYTES};
use crate::wake::Wake;

/// Why a request was refused: what the embedding API answers as an invalid request, or as
/// embedder code that panicked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The request is malformed: `field` names what, `message` says how to fix it.
    #[error("invalid `{field}`: {message}")]
    Invalid {
        /// The offending field, as a path (`tasks[2].runner.kind`).
        field: String,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The embedder's check of a runner spec panicked; the request was refused.
    #[error("{hook} panicked: {message}")]
    EmbedderPanicked {
        /// Which hook: `RunnerFactory::validate`.
        hook: &'static str,
        /// The panic message.
        message: String,
    },
}

impl RequestError {
    /// A malformed request: `field` names what, `message` says how to fix it.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        RequestError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Longest session id accepted, in characters (a new id is printable ASCII: as many bytes).
pub const MAX_SESSION_ID_CHARS: usize = 256;

/// A task as submitted, before validation.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSpec {
    /// What the child should do; not empty.
    pub goal: String,
    /// The runner spec: a JSON object with a `kind` the runner factory knows.
    pub runner: serde_json::Value,
    /// Tasks sharing a group form one completion unit.
    pub group: Option<String>,
    /// Per-task timeout in ms (> 0).
    pub timeout_ms: Option<u64>,
    /// Stall timeout in ms (> 0); default 450000.
    pub stall_ms: Option<u64>,
    /// Whether recovery may re-run the task when it was running at a crash.
    pub rerun_on_recovery: bool,
    /// The task's data, handed to its runner (`null` is the same as none).
    pub input: Option<serde_json::Value>,
    /// Runs again of a child that ended `failed` or `timed_out` (see [`RetryPolicy`]).
    pub retry: Option<RetryPolicy>,
}

impl TaskSpec {
    /// A task with defaults for everything but the goal and runner.
    pub fn new(goal: impl Into<String>, runner: serde_json::Value) -> Self {
        TaskSpec {
            goal: goal.into(),
            runner,
            group: None,
            timeout_ms: None,
            stall_ms: None,
            rerun_on_recovery: false,
            input: None,
            retry: None,
        }
    }

    /// Puts the task in a completion group.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Sets the task's timeout.
    pub fn timeout_ms(mut self, ms: u64) -> Self {
        self.timeout_ms = Some(ms);
        self
    }

    /// Sets the task's stall timeout.
    pub fn stall_ms(mut self, ms: u64) -> Self {
        self.stall_ms = Some(ms);
        self
    }

    /// Lets recovery re-run the task when it was running at a crash.
    pub fn rerun_on_recovery(mut self, yes: bool) -> Self {
        self.rerun_on_recovery = yes;
        self
    }

    /// Runs the child again when it ends `failed` or `timed_out`, as `policy` says.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }

    /// Gives the task data, handed to its runner.
    pub fn input(mut self, value: serde_json::Value) -> Self {
        self.input = Some(value);
        self
    }
}

/// One delegate request.
#[derive(Debug, Clone, PartialEq)]
pub struct DelegateRequest {
    /// The tasks; not empty.
    pub tasks: Vec<TaskSpec>,
    /// Background (default) or sync.
    pub mode: Mode,
    /// Whether each ungrouped task is its own unit.
    pub independent_completions: bool,
    /// The caller's W3C trace context (`traceparent`, see [`validate_traceparent`]): stored with
    /// the call, handed to each child's runner (a `command` child's `TRACEPARENT`) and told
    /// with its children's events.
    pub traceparent: Option<String>,
    /// The caller's idempotency key (1 to 255 characters, no control character): a delegate
    /// naming a key an earlier call of the session was made with is answered with that call
    /// (its reply as it was made: id, set, units; a sync call's results) instead of making a
    /// second one, as long as the call is kept; one asking for other tasks, mode or completions
    /// is refused ([`crate::error::BroodError::IdempotencyConflict`]).
    pub idempotency_key: Option<String>,
}

/// The longest idempotency key, in characters.
pub const MAX_IDEMPOTENCY_KEY_CHARS: usize = 255;

impl DelegateRequest {
    /// A background call of `tasks` (one unit for all ungrouped tasks).
    pub fn background(tasks: Vec<TaskSpec>) -> Self {
        DelegateRequest {
            tasks,
            mode: Mode::Background,
            independent_completions: false,
            traceparent: None,
            idempotency_key: None,
        }
    }

    /// A sync call of `tasks`.
    pub fn sync(tasks: Vec<TaskSpec>) -> Self {
        DelegateRequest {
            mode: Mode::Sync,
            ..Self::background(tasks)
        }
    }

    /// Makes each ungrouped task its own unit.
    pub fn independent(mut self) -> Self {
        self.independent_completions = true;
        self
    }

    /// Carries the caller's W3C trace context to the call's children. Checked when the call
    /// is delegated: a malformed one refuses the call ([`RequestError::Invalid`] naming
    /// `traceparent`), which changes nothing.
    pub fn traceparent(mut self, traceparent: impl Into<String>) -> Self {
        self.traceparent = Some(traceparent.into());
        self
    }

    /// Makes the call idempotent under `key` (see [`DelegateRequest::idempotency_key`]).
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }
}

/// Checks a W3C trace context header value (`traceparent`, version `00`):
/// `00-<trace id: 32 hex digits>-<parent id: 16 hex digits>-<flags: 2 hex digits>`, lowercase,
/// neither id all zeros. The error names the field `traceparent` and says what is wrong.
pub fn validate_traceparent(value: &str) -> Result<(), RequestError> {
    let bad = |what: String| {
        Err(RequestError::invalid(
            "traceparent",
            format!("{what}; a traceparent is `00-<32 hex digits>-<16 hex digits>-<2 hex digits>`, lowercase, neither id all zeros (W3C Trace Context)"),
        ))
    };
    let parts: Vec<&str> = value.split('-').collect();
    let [version, trace_id, parent_id, flags] = parts[..] else {
        return bad(format!("has {} parts separated by `-`, not 4", parts.len()));
    };
    let hex = |s: &str| s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    for (name, part, len) in [
        ("version", version, 2),
        ("trace id", trace_id, 32),
        ("parent id", parent_id, 16),
        ("flags", flags, 2),
    ] {
        if part.len() != len || !hex(part) {
            return bad(format!("its {name} is not {len} lowercase hex digits"));
        }
    }
    if version != "00" {
        return bad(format!(
            "its version is {version:?}; version \"00\" is the one accepted"
        ));
    }
    for (name, id) in [("trace id", trace_id), ("parent id", parent_id)] {
        if id.bytes().all(|b| b == b'0') {
            return bad(format!("its {name} is all zeros"));
        }
    }
    Ok(())
}

/// The message of a panic payload, as text.
pub(crate) fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panicked with a non-text payload".to_string()
    }
}

/// Checks a request and turns it into stored tasks, each task's runner spec checked by
/// `check_runner` (the runner factory's `validate`: a panic there refuses the request).
/// Changes nothing.
pub fn validate(
    req: &DelegateRequest,
    check_runner: &dyn Fn(&serde_json::Value) -> Result<(), String>,
) -> Result<Vec<Task>, RequestError> {
    if req.tasks.is_empty() {
        return Err(RequestError::invalid("tasks", "must hold at least one task"));
    }
    if let Some(traceparent) = &req.traceparent {
        validate_traceparent(traceparent)?;
    }
    if let Some(key) = &req.idempotency_key {
        let chars = key.chars().count();
        if chars == 0 || chars > MAX_IDEMPOTENCY_KEY_CHARS {
            return Err(RequestError::invalid(
                "idempotency_key",
                format!("has {chars} characters; it must have 1 to {MAX_IDEMPOTENCY_KEY_CHARS}"),
            ));
        }
        if key.chars().any(char::is_control) {
            return Err(RequestError::invalid(
                "idempotency_key",
                "must not contain control characters",
            ));
        }
    }
    if req.tasks.len() >= u32::MAX as usize {
        return Err(RequestError::invalid(
            "tasks",
            format!("holds {} tasks; at most {} are accepted", req.tasks.len(), u32::MAX - 1),
        ));
    }
    let mut out = Vec::with_capacity(req.tasks.len());
    for (i, t) in req.tasks.iter().enumerate() {
        if t.goal.trim().is_empty() {
            return Err(RequestError::invalid(format!("tasks[{i}].goal"), "must not be empty"));
        }
        if !t.runner.is_object() {
            return Err(RequestError::invalid(
                format!("tasks[{i}].runner"),
                "must be an object with a `kind`",
            ));
        }
        match catch_unwind(AssertUnwindSafe(|| check_runner(&t.runner))) {
            Ok(Ok(())) => {}
            Ok(Err(m)) => return Err(RequestError::invalid(format!("tasks[{i}].runner"), m)),
            Err(panic) => {
                return Err(RequestError::EmbedderPanicked {
                    hook: "RunnerFactory::validate",
                    message: panic_message(panic),
                })
            }
        }
        if t.group.as_deref().is_some_and(|g| g.trim().is_empty()) {
            return Err(RequestError::invalid(
                format!("tasks[{i}].group"),
                "must not be empty when given",
            ));
        }
        if t.timeout_ms == Some(0) {
            return Err(RequestError::invalid(
                format!("tasks[{i}].timeout_ms"),
                "must be greater than 0",
            ));
        }
        if t.stall_ms == Some(0) {
            return Err(RequestError::invalid(
                format!("tasks[{i}].stall_ms"),
                "must be greater than 0",
            ));
        }
        if let Some(policy) = &t.retry {
            check_retry(i, policy)?;
        }
        out.push(Task {
            goal: t.goal.clone(),
            runner_json: t.runner.to_string(),
            group: t.group.clone(),
            timeout_ms: t.timeout_ms,
            stall_ms: t.stall_ms.unwrap_or(DEFAULT_STALL_MS),
            rerun_on_recovery: t.rerun_on_recovery,
            input: t
                .input
                .as_ref()
                .filter(|v| !v.is_null())
                .map(serde_json::Value::to_string),
            retry: t.retry.filter(|p| p.max_attempts > 1),
        });
    }
    // The call is stored as one row: refuse what the ledger could not hold, naming the field,
    // rather than failing the write of every other request in the same group commit.
    let stored: usize = out
        .iter()
        .map(|t| {
            t.goal.len()
                + t.runner_json.len()
                + t.group.as_ref().map_or(0, String::len)
                + t.input.as_ref().map_or(0, String::len)
                + 32
        })
        .sum();
    let limit = MAX_VALUE_BYTES - 64 * 1024;
    if stored > limit {
        return Err(RequestError::invalid(
            "tasks",
            format!(
                "make a call of about {stored} bytes; at most {limit} bytes of goals, runner specs and inputs fit in one call"
            ),
        ));
    }
    Ok(out)
}

/// The longest wait a retry policy may ask for between attempts, in ms (one hour).
pub const MAX_RETRY_BACKOFF_MS: u64 = 3_600_000;

/// Checks task `i`'s retry policy; the error names the field.
fn check_retry(i: usize, p: &RetryPolicy) -> Result<(), RequestError> {
    if !(1..=MAX_RETRY_ATTEMPTS).contains(&p.max_attempts) {
        return Err(RequestError::invalid(
            format!("tasks[{i}].retry.max_attempts"),
            format!("is {}; it must be from 1 to {MAX_RETRY_ATTEMPTS}", p.max_attempts),
        ));
    }
    for (name, ms) in [("backoff_ms", p.backoff_ms), ("max_backoff_ms", p.max_backoff_ms)] {
        if ms > MAX_RETRY_BACKOFF_MS {
            return Err(RequestError::invalid(
                format!("tasks[{i}].retry.{name}"),
                format!("is {ms}; it must be at most {MAX_RETRY_BACKOFF_MS} (one hour)"),
            ));
        }
    }
    Ok(())
}

/// Checks the id of a session to look up: 1 to 256 characters, none a control character (what
/// every stored session id is, those made before [`validate_new_session_id`] was the rule too).
pub fn validate_session_id(id: &str) -> Result<(), RequestError> {
    let bad = |m: &str| Err(RequestError::invalid("session_id", m));
    if id.is_empty() {
        return bad("must not be empty");
    }
    if id.chars().count() > MAX_SESSION_ID_CHARS {
        return bad("must be at most 256 characters");
    }
    if id.chars().any(char::is_control) {
        return bad("must not contain control characters");
    }
    Ok(())
}

/// Checks the id of a session to create: 1 to 256 bytes of printable ASCII, without `/`, `?`,
/// `#`, `%` or a space, and not `.` or `..` (so it goes into a URL path as it is, and prints as
/// it is).
pub fn validate_new_session_id(id: &str) -> Result<(), RequestError> {
    validate_session_id(id)?;
    if id == "." || id == ".." {
        // A URL path's dot segments: clients remove them, so such a session could not be
        // reached.
        return Err(RequestError::invalid(
            "session_id",
            "must not be `.` or `..`, which URL paths do not keep",
        ));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !c.is_ascii_graphic() || matches!(c, '/' | '?' | '#' | '%'))
    {
        let what = match c {
            ' ' => "a space".to_string(),
            c if !c.is_ascii() => format!("{c:?}, which is not ASCII"),
            c => format!("{c:?}"),
        };
        return Err(RequestError::invalid(
            "session_id",
            format!("must be printable ASCII without `/`, `?`, `#`, `%` or spaces; it holds {what}"),
        ));
    }
    Ok(())
}

/// Settings of a session; unset fields keep their current (or default) value.
#[derive(Clone, Default)]
pub struct SessionSettings {
    /// Running children at most (default 8).
    pub max_concurrent_children: Option<u32>,
    /// Delivery attempts before dead-lettering (default 8).
    pub max_delivery_attempts: Option<u32>,
    /// The wake target; binding one makes the session wake-capable.
    pub wake: Option<Arc<dyn Wake>>,
    /// A webhook to wake the session with, stored durably and bound again after a restart
    /// (through the engine's [`crate::wake::WakeFactory`]); makes the session wake-capable.
    pub wake_url: Option<String>,
    /// Whether the parent reaches the session by itself, polling its boundaries or watching
    /// its events: `true` makes the session wake-capable without a wake target, `false` takes
    /// that back. Stored durably, so it holds after a restart.
    pub addressable: Option<bool>,
}

impl std::fmt::Debug for SessionSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionSettings")
            .field("max_concurrent_children", &self.max_concurrent_children)
            .field("max_delivery_attempts", &self.max_delivery_attempts)
            .field("wake", &self.wake.is_some())
            .field("wake_url", &self.wake_url)
            .field("addressable", &self.addressable)
            .finish()
    }
}

impl SessionSettings {
    /// Sets the capacity.
    pub fn max_concurrent_children(mut self, n: u32) -> Self {
        self.max_concurrent_children = Some(n);
        self
    }

    /// Sets the dead-letter limit.
    pub fn max_delivery_attempts(mut self, n: u32) -> Self {
        self.max_delivery_attempts = Some(n);
        self
    }

    /// Binds a wake target (an embedded callback).
    pub fn wake(mut self, wake: impl Wake) -> Self {
        self.wake = Some(Arc::new(wake));
        self
    }

    /// Binds a webhook wake target, kept in the ledger (the engine needs a wake factory).
    pub fn wake_url(mut self, url: impl Into<String>) -> Self {
        self.wake_url = Some(url.into());
        self
    }

    /// Sets whether the parent reaches the session by itself (stored; see the field
    /// `addressable`).
    pub fn addressable(mut self, addressable: bool) -> Self {
        self.addressable = Some(addressable);
        self
    }

    /// Refuses limits out of range (0, or the counts' maximum), naming the field.
    pub fn validate(&self) -> Result<(), RequestError> {
        for (field, value) in [
            ("max_concurrent_children", self.max_concurrent_children),
            ("max_delivery_attempts", self.max_delivery_attempts),
        ] {
            if let Some(v) = value {
                if v == 0 || v == u32::MAX {
                    return Err(RequestError::invalid(
                        field,
                        format!("is {v}; must be from 1 to {}", u32::MAX - 1),
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_w3c_traceparent_is_accepted() {
        assert_eq!(validate_traceparent(GOOD), Ok(()));
        assert_eq!(validate_traceparent(&GOOD.replace("-01", "-00")), Ok(()));
    }

    #[test]
    fn a_malformed_traceparent_is_refused_naming_the_field() {
        let zeros = "00-00000000000000000000000000000000-00f067aa0ba902b7-01";
        let no_parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01";
        for (bad, says) in [
            ("", "1 parts"),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", "3 parts"),
            (&*format!("{GOOD}-00"), "5 parts"),
            (&*GOOD.to_uppercase(), "trace id is not 32 lowercase hex digits"),
            (&*GOOD.replace("4bf9", "4bf"), "trace id is not 32"),
            (&*GOOD.replace("00f0", "00g0"), "parent id is not 16"),
            (&*GOOD.replace("-01", "-1"), "flags is not 2"),
            (&*GOOD.replacen("00", "01", 1), "version is \"01\""),
            (&*GOOD.replacen("00", "ff", 1), "version is \"ff\""),
            (zeros, "trace id is all zeros"),
            (no_parent, "parent id is all zeros"),
        ] {
            match validate_traceparent(bad) {
                Err(RequestError::Invalid { field, message }) => {
                    assert_eq!(field, "traceparent", "{bad:?}");
                    assert!(message.contains(says), "{bad:?}: {message}");
                }
                other => panic!("{bad:?} was not refused: {other:?}"),
            }
        }
    }

    #[test]
    fn a_delegate_with_a_malformed_traceparent_is_refused() {
        let req = DelegateRequest::background(vec![TaskSpec::new("g", serde_json::json!({"kind": "sim"}))])
            .traceparent("nope");
        let err = validate(&req, &|_| Ok(())).unwrap_err();
        assert!(
            matches!(err, RequestError::Invalid { ref field, .. } if field == "traceparent"),
            "{err:?}"
        );
        assert!(validate(&req.traceparent(GOOD), &|_| Ok(())).is_ok());
    }
}
