//! Built-in runners and the registry that turns runner specs into runners.
//!
//! [`Runners`] is the [`RunnerFactory`] brood uses by default. It knows the `sim` kind, a
//! simulated child for demos, tests and fault drills, and any kind an embedder registers with
//! [`Runners::register`]. Two more built-in kinds are registered on request, because each gives
//! callers power the embedder must choose to grant: [`command`] (a local process, with
//! [`Runners::register_command`] or [`Runners::register_command_with`]) and [`external`] (a child run by an outside worker through
//! shared [`WorkQueues`], with [`Runners::register_external`]); `brood serve` registers those its
//! configuration allows. Specs are checked strictly when a call is accepted: an unknown kind, an
//! unknown field or a mistyped value is refused with a message that names it.

pub mod command;
pub mod external;
pub mod groups;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use brood_actors::runner::{RecordOutcome, RunContext, RunOutput, Runner, RunnerFactory};
use futures::future::LocalBoxFuture;
use serde::Deserialize;

pub use self::command::{CommandRunner, CommandSettings, CommandSpec};
pub use self::external::{ExternalRunner, ExternalSpec, Handout, WorkError, WorkQueues};

/// The runner kinds brood itself provides.
pub const KINDS: &[&str] = &["sim", "command", "external"];

/// How a simulated child ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SimOutcome {
    /// Succeeds with its summary.
    #[default]
    Ok,
    /// Fails with an error.
    Fail,
    /// Panics (only its own child fails).
    Panic,
    /// Never finishes and never heartbeats (its stall or task timeout ends it).
    Hang,
}

/// The `sim` runner spec: `{"kind": "sim", "ms": 50, "outcome": "ok", "summary": "…"}`. A sim
/// child that succeeds hands its task's `input` back as its `output`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimSpec {
    /// Always `sim`.
    pub kind: String,
    /// How long the child works, in ms (default 0).
    #[serde(default, deserialize_with = "crate::whole::whole")]
    pub ms: u64,
    /// How it ends (default `ok`).
    #[serde(default)]
    pub outcome: SimOutcome,
    /// The summary it reports (default: one naming its goal).
    #[serde(default)]
    pub summary: Option<String>,
}

/// Reads a runner spec of `kind` strictly, naming the path of what is wrong (`env.A: invalid
/// type …`). A spec is read once when its call is accepted and once per child run, so a good
/// one is read directly; the path is tracked only to word the error of a bad one (tracking it
/// costs an allocation per field).
fn parse_spec<T: serde::de::DeserializeOwned>(kind: &str, spec: &serde_json::Value) -> Result<T, String> {
    if let Ok(parsed) = T::deserialize(spec) {
        return Ok(parsed);
    }
    serde_path_to_error::deserialize(spec).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            format!("bad `{kind}` runner spec: {}", e.into_inner())
        } else {
            format!("bad `{kind}` runner spec: `{path}`: {}", e.into_inner())
        }
    })
}

/// Longest simulated work accepted: one day.
pub const SIM_MAX_MS: u64 = 86_400_000;

impl SimSpec {
    fn parse(spec: &serde_json::Value) -> Result<Self, String> {
        let sim: SimSpec = parse_spec("sim", spec)?;
        if sim.ms > SIM_MAX_MS {
            return Err(format!("`ms` is {}, at most {SIM_MAX_MS} (one day) is allowed", sim.ms));
        }
        Ok(sim)
    }
}

/// A simulated child: works `ms` milliseconds, heartbeating, then ends as its spec says.
#[derive(Debug, Clone)]
pub struct SimRunner {
    spec: SimSpec,
}

impl SimRunner {
    /// A sim runner for a checked spec.
    pub fn new(spec: SimSpec) -> Self {
        SimRunner { spec }
    }
}

/// Heartbeat interval of a working sim child.
const SIM_BEAT: Duration = Duration::from_millis(500);

impl Runner for SimRunner {
    fn run(self: Box<Self>, ctx: RunContext) -> LocalBoxFuture<'static, RunOutput> {
        let SimSpec {
            ms, outcome, summary, ..
        } = self.spec;
        if outcome == SimOutcome::Hang {
            // Silent for good: no heartbeat, no end. Only a timeout or the stall clock ends it,
            // so it keeps nothing of its spec or context (a live child is small).
            return Box::pin(futures::future::pending());
        }
        // What the end needs, and nothing more, is kept while it works.
        let RunContext {
            child_id,
            goal,
            input,
            progress,
            ..
        } = ctx;
        let summary = match (outcome, summary) {
            (SimOutcome::Ok, Some(summary)) => summary,
            (SimOutcome::Ok, None) => format!("done: {goal}"),
            // A failing or panicking child names itself.
            _ => child_id,
        };
        drop(goal);
        Box::pin(async move {
            let mut left = Duration::from_millis(ms);
            while !left.is_zero() {
                let step = left.min(SIM_BEAT);
                tokio::time::sleep(step).await;
                left -= step;
                progress.beat();
            }
            match outcome {
                // A simulated child hands its task's data back as its own.
                SimOutcome::Ok | SimOutcome::Hang => RunOutput::Succeeded { summary, output: input },
                SimOutcome::Fail => RunOutput::failed(format!("simulated failure of {summary}")),
                SimOutcome::Panic => panic!("simulated panic in {summary}"),
            }
        })
    }
}

/// Builds a runner from a spec of one kind.
pub type BuildFn = dyn Fn(&serde_json::Value) -> Result<Box<dyn Runner>, String> + Send + Sync;

/// The runner registry: `sim` built in, more kinds registered by the embedder.
#[derive(Clone)]
pub struct Runners {
    kinds: HashMap<String, Arc<BuildFn>>,
    /// Told of each running child cancelled ([`RunnerFactory::cancelled`]).
    on_cancel: Vec<Arc<CancelHook>>,
    /// Told of each ended child's row answered ([`RunnerFactory::recorded`]).
    on_record: Vec<Arc<RecordHook>>,
    /// Asked which children of a session wait for an outside worker
    /// ([`RunnerFactory::waiting_for_workers`]).
    waiting: Vec<Arc<WaitingHook>>,
}

/// Answers the children of a session waiting for an outside worker.
type WaitingHook = dyn Fn(&str) -> HashSet<String> + Send + Sync;

/// Told a cancelled child's id.
type CancelHook = dyn Fn(&str) + Send + Sync;

/// Told an ended child's id and what became of its row.
type RecordHook = dyn Fn(&str, RecordOutcome) + Send + Sync;

impl fmt::Debug for Runners {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut kinds: Vec<_> = self.kinds.keys().collect();
        kinds.sort();
        f.debug_struct("Runners").field("kinds", &kinds).finish()
    }
}

impl Default for Runners {
    fn default() -> Self {
        Self::builtin()
    }
}

impl Runners {
    /// The built-in kinds: `sim`.
    pub fn builtin() -> Self {
        let mut r = Runners {
            kinds: HashMap::new(),
            on_cancel: Vec::new(),
            on_record: Vec::new(),
            waiting: Vec::new(),
        };
        r.register("sim", |spec| {
            Ok(Box::new(SimRunner::new(SimSpec::parse(spec)?)) as Box<dyn Runner>)
        });
        r
    }

    /// Adds (or replaces) a kind. `build` must refuse a bad spec with a clear message; it is
    /// called once when a call is accepted (to validate) and once per child run.
    pub fn register(
        &mut self,
        kind: &str,
        build: impl Fn(&serde_json::Value) -> Result<Box<dyn Runner>, String> + Send + Sync + 'static,
    ) -> &mut Self {
        self.kinds.insert(kind.to_string(), Arc::new(build));
        self
    }

    /// Adds the `command` kind: children that run a local program ([`command`]), with the
    /// default [`CommandSettings`] (`PATH`, `HOME` and `LANG` passed through, no record of
    /// process groups).
    pub fn register_command(&mut self) -> &mut Self {
        self.register_command_with(CommandSettings::default())
    }

    /// Adds the `command` kind, its children run as `settings` say.
    pub fn register_command_with(&mut self, settings: CommandSettings) -> &mut Self {
        let settings = Arc::new(settings);
        self.register("command", move |spec| {
            let spec = CommandSpec::parse(spec)?;
            Ok(Box::new(CommandRunner::with_settings(spec, settings.clone())) as Box<dyn Runner>)
        })
    }

    /// Adds the `external` kind: children put on `queues` for outside workers ([`external`]).
    pub fn register_external(&mut self, queues: Arc<WorkQueues>) -> &mut Self {
        let told = queues.clone();
        self.on_cancel.push(Arc::new(move |child_id| told.cancelled(child_id)));
        let told = queues.clone();
        self.on_record
            .push(Arc::new(move |child_id, outcome| told.recorded(child_id, outcome)));
        let asked = queues.clone();
        self.waiting
            .push(Arc::new(move |session_id| asked.waiting_of(session_id)));
        self.register("external", move |spec| {
            let spec = ExternalSpec::parse(spec)?;
            Ok(Box::new(ExternalRunner::new(spec, queues.clone())) as Box<dyn Runner>)
        })
    }

    fn builder(&self, spec: &serde_json::Value) -> Result<&Arc<BuildFn>, String> {
        let kind = spec
            .get("kind")
            .ok_or("missing `kind`")?
            .as_str()
            .ok_or("`kind` must be a string")?;
        self.kinds.get(kind).ok_or_else(|| {
            let mut known: Vec<_> = self.kinds.keys().map(String::as_str).collect();
            known.sort();
            format!("unknown runner kind `{kind}`; known kinds: {}", known.join(", "))
        })
    }
}

impl RunnerFactory for Runners {
    fn validate(&self, spec: &serde_json::Value) -> Result<(), String> {
        let build = self.builder(spec)?;
        build(spec).map(|_| ())
    }

    fn build(&self, spec: &serde_json::Value) -> Result<Box<dyn Runner>, String> {
        let build = self.builder(spec)?;
        build(spec)
    }

    fn cancelled(&self, child_id: &str) {
        for told in &self.on_cancel {
            told(child_id);
        }
    }

    fn recorded(&self, child_id: &str, outcome: RecordOutcome) {
        for told in &self.on_record {
            told(child_id, outcome);
        }
    }

    fn waiting_for_workers(&self, session_id: &str) -> HashSet<String> {
        let mut waiting = HashSet::new();
        for asked in &self.waiting {
            waiting.extend(asked(session_id));
        }
        waiting
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sim_specs_are_checked_strictly() {
        let r = Runners::builtin();
        assert!(r.validate(&json!({"kind": "sim"})).is_ok());
        assert!(r
            .validate(&json!({"kind": "sim", "ms": 5, "outcome": "panic", "summary": "x"}))
            .is_ok());
        let err = r.validate(&json!({"kind": "simm"})).unwrap_err();
        assert!(err.contains("unknown runner kind `simm`"), "{err}");
        let err = r.validate(&json!({"kind": "sim", "outcome": "maybe"})).unwrap_err();
        assert!(err.contains("maybe"), "{err}");
        let err = r.validate(&json!({"kind": "sim", "msec": 5})).unwrap_err();
        assert!(err.contains("msec"), "{err}");
        assert!(r.validate(&json!({"kind": "sim", "ms": -1})).is_err());
        assert!(r.validate(&json!({"kind": "sim", "ms": SIM_MAX_MS + 1})).is_err());
        assert_eq!(r.validate(&json!({"ms": 1})).unwrap_err(), "missing `kind`");
    }
}
