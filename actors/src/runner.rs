//! Runners: what a child actually executes. The embedder implements [`Runner`] (or uses the
//! built-in ones of the `brood` crate) and hands the engine a [`RunnerFactory`] that turns a
//! task's runner spec into a runner.
//!
//! A runner runs as its own task on the actor thread; its panic is contained there and ends
//! only its child, as `failed`, with the panic message. It reports progress through
//! [`Progress`], which resets its child's stall clock and may carry a partial result that is
//! kept if the child is interrupted. A runner runs inside its child's tracing span (the
//! session's, call's and child's ids): its log lines carry them; work it moves to another task
//! or thread takes [`RunContext::span`] with it.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::future::LocalBoxFuture;

/// How a runner ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutput {
    /// Done, with a summary.
    Succeeded {
        /// What the child found or did.
        summary: String,
        /// The result as data, handed to the parent with the summary (a JSON `null` is none).
        output: Option<serde_json::Value>,
    },
    /// Failed, with what went wrong and whatever partial summary there is.
    Failed {
        /// What went wrong.
        error: String,
        /// A partial result, if any.
        summary: Option<String>,
        /// Partial result data, if any.
        output: Option<serde_json::Value>,
    },
}

impl RunOutput {
    /// Succeeded with `summary` and no data.
    pub fn succeeded(summary: impl Into<String>) -> Self {
        RunOutput::Succeeded {
            summary: summary.into(),
            output: None,
        }
    }

    /// Failed with `error`, no partial summary and no data.
    pub fn failed(error: impl Into<String>) -> Self {
        RunOutput::Failed {
            error: error.into(),
            summary: None,
            output: None,
        }
    }

    /// The same end, carrying `output` as its data.
    pub fn with_output(mut self, value: serde_json::Value) -> Self {
        match &mut self {
            RunOutput::Succeeded { output, .. } | RunOutput::Failed { output, .. } => *output = Some(value),
        }
        self
    }
}

/// A heartbeat handle given to a runner; cheap to clone, safe to move to other threads.
#[derive(Clone)]
pub struct Progress {
    inner: Arc<ProgressInner>,
}

struct ProgressInner {
    origin: Instant,
    last_beat_ms: AtomicU64,
    partial: Mutex<Option<String>>,
    /// The child's span: here, in the one allocation a child has for its running state, so
    /// that the child's actor (and its task) stays its size; boxed, and kept only when some
    /// subscriber records it, so that a child whose span nobody records pays one word for it.
    span: Option<Box<tracing::Span>>,
}

/// The span of a child whose span nobody records.
fn disabled_span() -> &'static tracing::Span {
    static NONE: std::sync::OnceLock<tracing::Span> = std::sync::OnceLock::new();
    NONE.get_or_init(tracing::Span::none)
}

impl fmt::Debug for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Progress")
            .field("last_beat_ms", &self.last_beat_ms())
            .finish()
    }
}

impl Progress {
    /// A fresh heartbeat handle of the child that runs in `span`: its clock starts now.
    pub(crate) fn new(span: tracing::Span) -> Self {
        Progress {
            inner: Arc::new(ProgressInner {
                origin: Instant::now(),
                last_beat_ms: AtomicU64::new(0),
                partial: Mutex::new(None),
                span: (!span.is_disabled()).then(|| Box::new(span)),
            }),
        }
    }

    /// The span of the child this handle beats for.
    pub fn span(&self) -> &tracing::Span {
        self.inner.span.as_deref().unwrap_or_else(|| disabled_span())
    }

    /// Reports that the runner is alive; resets the stall clock.
    pub fn beat(&self) {
        let ms = self.inner.origin.elapsed().as_millis() as u64;
        self.inner.last_beat_ms.store(ms, Ordering::Relaxed);
    }

    /// Reports progress with a partial result, kept if the child is interrupted.
    pub fn partial(&self, summary: impl Into<String>) {
        if let Ok(mut p) = self.inner.partial.lock() {
            *p = Some(summary.into());
        }
        self.beat();
    }

    /// Milliseconds from the runner's start to its last heartbeat (0: none yet).
    pub fn last_beat_ms(&self) -> u64 {
        self.inner.last_beat_ms.load(Ordering::Relaxed)
    }

    /// Milliseconds since the runner started.
    pub fn elapsed_ms(&self) -> u64 {
        self.inner.origin.elapsed().as_millis() as u64
    }

    /// The last partial result reported.
    pub fn take_partial(&self) -> Option<String> {
        self.inner.partial.lock().ok().and_then(|mut p| p.take())
    }
}

/// Where the embedder's handle of the engine will be (set once it is made; weak, so it never
/// keeps the engine open).
pub type Embedder = Arc<std::sync::OnceLock<std::sync::Weak<dyn std::any::Any + Send + Sync>>>;

/// What a runner is given.
#[derive(Debug, Clone)]
pub struct RunContext {
    /// The child being run.
    pub child_id: String,
    /// The session whose call made the child (its parent's).
    pub parent_session_id: String,
    /// The call that made the child.
    pub call_id: String,
    /// The task's goal text.
    pub goal: String,
    /// The task's data, when it was given some.
    pub input: Option<serde_json::Value>,
    /// Execution attempt (1 for the first run).
    pub attempt: u32,
    /// When the child times out (ms since the epoch), when its task has a timeout.
    pub deadline_at_ms: Option<u64>,
    /// The heartbeat handle.
    pub progress: Progress,
    /// The call's W3C trace context, when its caller gave one (see [`RunContext::traceparent`]).
    pub(crate) traceparent: Option<Arc<str>>,
    /// The embedder's handle of the engine, for nested delegation (see `brood::BroodHandle::of`):
    /// read when asked, so a child started while the engine opened finds it too.
    pub(crate) embedder: Embedder,
}

impl RunContext {
    /// The child's tracing span, with its session's, call's and own id: the runner's future
    /// runs inside it; a runner that moves work to another task or thread instruments that
    /// work with it (`tracing::Instrument::instrument(work, ctx.span().clone())`).
    pub fn span(&self) -> &tracing::Span {
        self.progress.span()
    }

    /// The W3C trace context (`traceparent`) the call was delegated with, if any: the same for
    /// every child of the call, and for a child run again after a restart. A runner hands it on
    /// to what it calls (a `command` child gets it as `TRACEPARENT`).
    pub fn traceparent(&self) -> Option<&str> {
        self.traceparent.as_deref()
    }

    /// The id of the session this child delegates through in its own right: its child id.
    pub fn session_id(&self) -> &str {
        &self.child_id
    }

    /// The embedder's handle of the engine this child runs under, while the engine is open.
    pub fn embedder(&self) -> Option<std::sync::Arc<dyn std::any::Any + Send + Sync>> {
        self.embedder.get()?.upgrade()
    }
}

/// What became of a child's terminal row once its runner ended (or brood ended it), as
/// [`RunnerFactory::recorded`] is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordOutcome {
    /// The row is durable, with this status: the child's own end, or that of a terminal row
    /// recorded before it (a cancel, a timeout) — the first terminal row of a child is final.
    Stored(crate::model::ChildStatus),
    /// The row was not written: another process sharing the ledger took the child's session
    /// over, and its new holder decides what becomes of the child (recovery, I6).
    Refused,
}

/// A task execution. Dropping the returned future cancels the runner.
pub trait Runner: 'static {
    /// Runs the task to its end.
    fn run(self: Box<Self>, ctx: RunContext) -> LocalBoxFuture<'static, RunOutput>;
}

/// Turns runner specs (JSON objects with a `kind`) into runners. Validation happens when a call
/// is accepted, so a bad spec is refused before anything is stored.
pub trait RunnerFactory: Send + Sync + 'static {
    /// Checks a spec; the error says what is wrong with it.
    fn validate(&self, spec: &serde_json::Value) -> Result<(), String>;
    /// Builds the runner for one child.
    fn build(&self, spec: &serde_json::Value) -> Result<Box<dyn Runner>, String>;

    /// A running child was cancelled. Called when the cancel is decided, before it is answered
    /// (the child's runner is dropped soon after, on the children's thread): what the runner
    /// handed out elsewhere is taken back here, so that from the answer on nobody outside
    /// works on the child (an external worker hears 409). Nothing by default.
    fn cancelled(&self, child_id: &str) {
        let _ = child_id;
    }

    /// A child's terminal row was recorded, or refused ([`RecordOutcome`]). Called on the
    /// children's thread once the child's end was answered, for every child that ended in this
    /// process (not for one the engine stopped before its row was answered): what a runner
    /// handed out elsewhere learns here whether the end it was given holds. Nothing by default.
    fn recorded(&self, child_id: &str, outcome: RecordOutcome) {
        let _ = (child_id, outcome);
    }

    /// The children of session `session_id` whose runners wait for someone outside to take
    /// their work up (an outside worker's poll), for views that show it: read once per view,
    /// so it must be cheap. None by default.
    fn waiting_for_workers(&self, session_id: &str) -> std::collections::HashSet<String> {
        let _ = session_id;
        std::collections::HashSet::new()
    }
}
