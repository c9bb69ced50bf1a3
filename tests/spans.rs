//! Every actor runs in one tracing span named for it, with its ids as fields, inside its
//! parent's: supervisor → session_owner (session_id) → unit (call_id, unit_id) → child
//! (child_id). A line a runner logs inside a child carries the session's, call's and child's
//! ids from those spans, with no field of its own. The library installs no subscriber: this
//! test installs one that records every event with the fields of the spans it is in.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use brood::{Brood, BroodConfig, DelegateRequest, RunContext, RunOutput, Runner, Runners, SessionSettings, TaskSpec};
use futures::future::LocalBoxFuture;
use serde_json::json;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// An event as recorded: its message, its own fields, and the spans it was in (outermost
/// first), each with its name and fields.
#[derive(Debug, Clone)]
struct Seen {
    message: String,
    fields: HashMap<String, String>,
    spans: Vec<(String, HashMap<String, String>)>,
}

impl Seen {
    /// The value of `field` in the innermost span that has it.
    fn span_field(&self, field: &str) -> Option<&str> {
        self.spans
            .iter()
            .rev()
            .find_map(|(_, f)| f.get(field))
            .map(String::as_str)
    }

    fn span_names(&self) -> Vec<&str> {
        self.spans.iter().map(|(n, _)| n.as_str()).collect()
    }
}

#[derive(Default)]
struct Fields(HashMap<String, String>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_string(), format!("{value:?}"));
    }
}

/// Records every event with the fields of its spans.
struct Capture(Arc<Mutex<Vec<Seen>>>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(fields) = span.extensions_mut().get_mut::<Fields>() {
                values.record(fields);
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut own = Fields::default();
        event.record(&mut own);
        let spans = ctx
            .event_scope(event)
            .map(|scope| {
                scope
                    .from_root()
                    .map(|span| {
                        let fields = span
                            .extensions()
                            .get::<Fields>()
                            .map(|f| f.0.clone())
                            .unwrap_or_default();
                        (span.name().to_string(), fields)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let message = own.0.remove("message").unwrap_or_default();
        if let Ok(mut seen) = self.0.lock() {
            seen.push(Seen {
                message,
                fields: own.0,
                spans,
            });
        }
    }
}

/// The events recorded in this test binary (its one global subscriber, installed once).
fn captured() -> Arc<Mutex<Vec<Seen>>> {
    static SEEN: OnceLock<Arc<Mutex<Vec<Seen>>>> = OnceLock::new();
    SEEN.get_or_init(|| {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let subscriber = tracing_subscriber::registry().with(Capture(seen.clone()));
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber of this test binary");
        seen
    })
    .clone()
}

/// A runner that logs one line, `said`, with its goal and nothing of its child, then succeeds.
struct Say;

impl Runner for Say {
    fn run(self: Box<Self>, ctx: RunContext) -> LocalBoxFuture<'static, RunOutput> {
        Box::pin(async move {
            tracing::info!(goal = %ctx.goal, "said");
            tokio::task::yield_now().await;
            RunOutput::Succeeded {
                summary: ctx.goal,
                output: None,
            }
        })
    }
}

fn open(dir: &std::path::Path) -> Brood {
    let mut runners = Runners::builtin();
    runners.register("say", |_| Ok(Box::new(Say) as Box<dyn Runner>));
    Brood::open(BroodConfig::new(dir.join("ledger")).runners(runners)).expect("open brood")
}

/// The events so far that `pick` chooses.
fn seen(all: &Mutex<Vec<Seen>>, pick: impl Fn(&Seen) -> bool) -> Vec<Seen> {
    all.lock().unwrap().iter().filter(|s| pick(s)).cloned().collect()
}

/// Runs one call of `say` tasks, one per goal (delegated with `traceparent`, if given), in a
/// fresh engine's session `session` until its results are ready; answers the call's id.
async fn say_in(session: &str, goals: &[&str], traceparent: Option<&str>) -> String {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path());
    b.open_session(session, SessionSettings::default().wake(|_| {}))
        .await
        .unwrap();
    let tasks = goals
        .iter()
        .map(|g| TaskSpec::new(*g, json!({"kind": "say"})))
        .collect();
    let mut request = DelegateRequest::background(tasks);
    request.traceparent = traceparent.map(str::to_string);
    let reply = b.delegate(session, request).await.unwrap();
    common::collect_results(&b, session, goals.len()).await;
    b.shutdown();
    reply.call_id().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runners_log_line_carries_the_session_call_and_child_from_its_spans() {
    let all = captured();
    let call = say_in("spans-1", &["first words", "second words"], None).await;
    for (index, goal) in [(0, "first words"), (1, "second words")] {
        let said = seen(&all, |s| {
            s.message == "said" && s.fields.get("goal").map(String::as_str) == Some(goal)
        });
        assert_eq!(said.len(), 1, "one line per runner: {said:?}");
        let said = &said[0];
        assert_eq!(said.span_field("session_id"), Some("spans-1"), "{said:?}");
        assert_eq!(said.span_field("call_id"), Some(call.as_str()), "{said:?}");
        assert_eq!(
            said.span_field("unit_id"),
            Some(brood::unit_id(&call, 1).as_str()),
            "{said:?}"
        );
        let child = brood::child_id(&call, index);
        assert_eq!(said.span_field("child_id"), Some(child.as_str()), "{said:?}");
        assert_eq!(
            said.span_names(),
            ["supervisor", "session_owner", "unit", "child"],
            "the spans nest as the actors do: {said:?}"
        );
        assert!(
            !said.fields.contains_key("child_id") && !said.fields.contains_key("session_id"),
            "the line has no such fields of its own: {said:?}"
        );
    }
}

/// The actors' own lines carry their ids from their spans, not from hand-written fields: a
/// child's end is logged in its child's span, the owner's start in its session's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_actors_own_lines_are_in_their_spans() {
    let all = captured();
    let call = say_in("spans-2", &["words"], None).await;
    let child = brood::child_id(&call, 0);
    let ended = seen(&all, |s| {
        s.message == "child ended" && s.span_field("child_id") == Some(child.as_str())
    });
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert_eq!(ended[0].span_field("session_id"), Some("spans-2"));
    assert_eq!(ended[0].fields.get("status").map(String::as_str), Some("succeeded"));
    assert!(!ended[0].fields.contains_key("child"), "{ended:?}");
    let started = seen(&all, |s| {
        s.message == "session owner started" && s.span_field("session_id") == Some("spans-2")
    });
    assert!(!started.is_empty(), "the owner's start is logged in its span");
    assert!(!started[0].fields.contains_key("session"), "{started:?}");
    assert_eq!(started[0].span_names(), ["supervisor", "session_owner"]);
}

/// A call delegated with a trace context names it in its units' spans: what its children log
/// carries it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calls_traceparent_is_a_field_of_its_units_span() {
    let all = captured();
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let call = say_in("spans-3", &["traced words"], Some(tp)).await;
    let said = seen(&all, |s| {
        s.message == "said" && s.span_field("call_id") == Some(call.as_str())
    });
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!(said[0].span_field("traceparent"), Some(tp), "{said:?}");
    let plain = say_in("spans-4", &["plain words"], None).await;
    let other = seen(&all, |s| {
        s.message == "said" && s.span_field("call_id") == Some(plain.as_str())
    });
    assert_eq!(other.len(), 1, "{other:?}");
    assert_eq!(
        other[0].span_field("traceparent"),
        None,
        "a call without one has no such field: {other:?}"
    );
}
