//! Shared helpers of the integration tests: a brood over a temporary sled folder, test runners
//! (gates that finish when the test says so, a probe that measures real concurrency), a wake
//! log, and bounded polling. Nothing here asserts on timings: every wait polls a condition with a
//! generous deadline.
#![allow(dead_code)]

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use brood::{child_id, dedup_key};
use brood::{
    Brood, BroodConfig, ChildStatus, Envelope, ItemKind, ReadyItem, RunContext, RunOutput, Runner, Runners,
    SessionSettings, SessionStatus, TaskSpec, WakeEvent,
};
use futures::future::LocalBoxFuture;
use serde_json::{json, Value};
use tempfile::TempDir;
use tokio::sync::Semaphore;

/// How long any wait may take before the test fails. Generous: CI machines are shared.
pub const DEADLINE: Duration = Duration::from_secs(20);
/// A lease that never runs out during a test.
pub const LONG_LEASE: Duration = Duration::from_secs(60);

/// Polls `$body` (an expression yielding `Option<T>`, may `.await`) until it is `Some`, or
/// panics after [`DEADLINE`] naming `$what`.
#[macro_export]
macro_rules! wait_for {
    ($what:expr, $body:expr) => {{
        let deadline = ::std::time::Instant::now() + $crate::common::DEADLINE;
        loop {
            if let Some(v) = $body {
                break v;
            }
            if ::std::time::Instant::now() > deadline {
                panic!("timed out after {:?} waiting for {}", $crate::common::DEADLINE, $what);
            }
            ::tokio::time::sleep(::std::time::Duration::from_millis(5)).await;
        }
    }};
}

// ---------------------------------------------------------------------------------------------
// Runner specs and tasks

/// A sim child working `ms` and succeeding.
pub fn sim(ms: u64) -> Value {
    json!({"kind": "sim", "ms": ms})
}

/// A sim child working `ms` and ending as `outcome` (`ok`, `fail`, `panic`, `hang`).
pub fn sim_outcome(ms: u64, outcome: &str) -> Value {
    json!({"kind": "sim", "ms": ms, "outcome": outcome})
}

/// A child that waits until the test opens gate `name`, then succeeds.
pub fn gate(name: &str) -> Value {
    json!({"kind": "gate", "gate": name})
}

/// A child that records its start and end in the [`Probe`], heartbeating, working `ms`.
pub fn probe(ms: u64) -> Value {
    json!({"kind": "probe", "ms": ms})
}

/// A task with defaults.
pub fn task(goal: impl Into<String>, runner: Value) -> TaskSpec {
    TaskSpec::new(goal, runner)
}

/// The dedup key of the result of task `index` of `call_id`.
pub fn result_key(call_id: &str, index: u32) -> String {
    dedup_key(&child_id(call_id, index), ItemKind::Result)
}

/// The dedup keys of an envelope.
pub fn keys(env: &Envelope) -> BTreeSet<String> {
    env.items.iter().map(|i| i.dedup_key.clone()).collect()
}

// ---------------------------------------------------------------------------------------------
// Test runners

/// Named gates: a gate child blocks until its gate is opened.
#[derive(Default)]
pub struct Gates {
    sems: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Gates {
    fn sem(&self, name: &str) -> Arc<Semaphore> {
        self.sems
            .lock()
            .unwrap()
            .entry(name.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(0)))
            .clone()
    }

    /// Opens gate `name` for good: every child waiting on it (and any later one) finishes.
    pub fn open(&self, name: &str) {
        self.sem(name).close();
    }
}

struct GateRunner {
    sem: Arc<Semaphore>,
}

impl Runner for GateRunner {
    fn run(self: Box<Self>, ctx: RunContext) -> LocalBoxFuture<'static, RunOutput> {
        Box::pin(async move {
            // A closed semaphore answers every waiter with an error: that is the gate opening.
            let _ = self.sem.acquire().await;
            RunOutput::Succeeded {
                summary: format!("gate passed: {}", ctx.goal),
                output: None,
            }
        })
    }
}

/// What `hold` runners did: which started, and how many were stopped (dropped) before they
/// ended.
#[derive(Default)]
pub struct Holds {
    /// Child ids of the hold runners started, in order.
    pub started: Mutex<Vec<String>>,
    /// Hold runners dropped (a cancel drops its runner).
    pub stopped: AtomicUsize,
    /// The most hold runners that were ever alive at once (counted as each one starts).
    pub most_alive: AtomicUsize,
}

impl Holds {
    /// The child ids started so far.
    pub fn started(&self) -> Vec<String> {
        self.started.lock().unwrap().clone()
    }

    /// How many were stopped so far.
    pub fn stopped(&self) -> usize {
        self.stopped.load(Ordering::SeqCst)
    }

    /// The most that were ever alive at once.
    pub fn most_alive(&self) -> usize {
        self.most_alive.load(Ordering::SeqCst)
    }
}

/// A runner that never ends on its own; dropping it counts as stopped.
struct HoldRunner(Arc<Holds>);

struct Stopped(Arc<Holds>);

impl Drop for Stopped {
    fn drop(&mut self) {
        self.0.stopped.fetch_add(1, Ordering::SeqCst);
    }
}

impl Runner for HoldRunner {
    fn run(self: Box<Self>, ctx: RunContext) -> LocalBoxFuture<'static, RunOutput> {
        let mut started = self.0.started.lock().unwrap();
        started.push(ctx.child_id.clone());
        let alive = started.len().saturating_sub(self.0.stopped());
        self.0.most_alive.fetch_max(alive, Ordering::SeqCst);
        drop(started);
        let guard = Stopped(self.0.clone());
        Box::pin(async move {
            let _guard = guard;
            futures::future::pending::<RunOutput>().await
        })
    }
}

/// A child that runs until it is cancelled.
pub fn hold() -> Value {
    json!({"kind": "hold"})
}

/// Real concurrency of probe children, measured inside the runners themselves.
#[derive(Default)]
pub struct Probe {
    /// Probe runners inside their run right now.
    pub current: AtomicUsize,
    /// The most that were ever inside at once.
    pub max: AtomicUsize,
    /// Child ids in the order their runners started.
    pub starts: Mutex<Vec<String>>,
}

struct ProbeRunner {
    ms: u64,
    probe: Arc<Probe>,
}

impl Runner for ProbeRunner {
    fn run(self: Box<Self>, ctx: RunContext) -> LocalBoxFuture<'static, RunOutput> {
        Box::pin(async move {
            let p = self.probe;
            p.starts.lock().unwrap().push(ctx.child_id.clone());
            let now = p.current.fetch_add(1, Ordering::SeqCst) + 1;
            p.max.fetch_max(now, Ordering::SeqCst);
            // A runner stopped early (a cancel drops it) leaves too.
            let inside = Inside(p.clone());
            let started = Instant::now();
            let total = Duration::from_millis(self.ms);
            while started.elapsed() < total {
                let left = total - started.elapsed();
                tokio::time::sleep(left.min(Duration::from_millis(25))).await;
                ctx.progress.beat();
            }
            // Leave before returning: the engine frees the slot only after the runner returned.
            drop(inside);
            RunOutput::Succeeded {
                summary: format!("probe done: {}", ctx.goal),
                output: None,
            }
        })
    }
}

/// A probe runner inside its run, until dropped.
struct Inside(Arc<Probe>);

impl Drop for Inside {
    fn drop(&mut self) {
        self.0.current.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The test runners shared by one test (across reopens).
#[derive(Clone, Default)]
pub struct Kit {
    /// The gates of `gate` children.
    pub gates: Arc<Gates>,
    /// The probe of `probe` children.
    pub probe: Arc<Probe>,
    /// What `hold` children did.
    pub holds: Arc<Holds>,
    /// The delivery timings the engine told.
    pub timings: Arc<Timings>,
}

/// The stages of items' delivery the engine timed (`BroodConfig::on_delivery_timing`), in the
/// order told. Only counted: no test looks at a duration.
#[derive(Default)]
pub struct Timings(Mutex<Vec<brood::DeliveryStage>>);

impl Timings {
    /// How many times `stage` was told.
    pub fn count(&self, stage: brood::DeliveryStage) -> usize {
        self.0.lock().unwrap().iter().filter(|s| **s == stage).count()
    }
}

impl Kit {
    /// `sim` plus `gate`, `probe` and `hold`.
    pub fn runners(&self) -> Runners {
        let mut r = Runners::builtin();
        let holds = self.holds.clone();
        r.register("hold", move |_| {
            Ok(Box::new(HoldRunner(holds.clone())) as Box<dyn Runner>)
        });
        let gates = self.gates.clone();
        r.register("gate", move |spec| {
            let name = spec
                .get("gate")
                .and_then(Value::as_str)
                .ok_or("a gate runner needs a string `gate`")?;
            Ok(Box::new(GateRunner { sem: gates.sem(name) }) as Box<dyn Runner>)
        });
        let probe = self.probe.clone();
        r.register("probe", move |spec| {
            let ms = spec
                .get("ms")
                .and_then(Value::as_u64)
                .ok_or("a probe runner needs a number `ms`")?;
            Ok(Box::new(ProbeRunner {
                ms,
                probe: probe.clone(),
            }) as Box<dyn Runner>)
        });
        r
    }
}

// ---------------------------------------------------------------------------------------------
// Wakes

/// Records every wake of the sessions it is bound to.
#[derive(Clone, Default)]
pub struct WakeLog(Arc<Mutex<Vec<WakeEvent>>>);

impl WakeLog {
    /// A wake target appending to this log.
    pub fn target(&self) -> impl Fn(WakeEvent) + Send + Sync + 'static {
        let log = self.0.clone();
        move |ev| log.lock().unwrap().push(ev)
    }

    /// Wakes so far.
    pub fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// The wakes so far.
    pub fn events(&self) -> Vec<WakeEvent> {
        self.0.lock().unwrap().clone()
    }
}

// ---------------------------------------------------------------------------------------------
// The engine under test

/// A brood over a temporary sled folder, reopenable; on PostgreSQL instead, in a schema of
/// its own on the test server, when `BROOD_TEST_LEDGER=postgres` (`.ci/run` runs the
/// invariant tests a second time so).
pub struct TestBrood {
    // Declared first so that it is dropped (and the ledger closed) before the folder goes.
    brood: Option<Arc<Brood>>,
    /// The test runners.
    pub kit: Kit,
    dir: TempDir,
    /// The PostgreSQL schema of the ledger, when it is there.
    schema: Option<String>,
    /// The retention policy, when not the default.
    retention: Option<brood::Retention>,
}

/// Whether the tests' engines keep their ledger on PostgreSQL (`BROOD_TEST_LEDGER=postgres`).
pub fn on_postgres() -> bool {
    match std::env::var("BROOD_TEST_LEDGER").as_deref() {
        Ok("postgres") => true,
        Ok("sled") | Err(_) => false,
        Ok(other) => panic!("BROOD_TEST_LEDGER={other:?}: expected postgres or sled"),
    }
}

impl TestBrood {
    /// A fresh engine over an empty folder.
    pub fn new() -> Self {
        Self::build(None)
    }

    /// A fresh engine over an empty folder, keeping what is over as `retention` says (also
    /// across reopens).
    pub fn with_retention(retention: brood::Retention) -> Self {
        Self::build(Some(retention))
    }

    fn build(retention: Option<brood::Retention>) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut t = TestBrood {
            brood: None,
            kit: Kit::default(),
            dir,
            schema: on_postgres().then(brood_actors::ledger::pg_testkit::fresh_schema),
            retention,
        };
        t.open_again();
        t
    }

    /// The engine's configuration: its folder (or its PostgreSQL schema) and the test runners.
    fn config(&self) -> BroodConfig {
        let timings = self.kit.timings.clone();
        let mut config = BroodConfig::new(self.dir.path().join("ledger"))
            .runners(self.kit.runners())
            .on_delivery_timing(move |stage, _| timings.0.lock().unwrap().push(stage));
        if let Some(retention) = &self.retention {
            config = config.retention(retention.clone());
        }
        match &self.schema {
            Some(schema) => config
                .postgres(brood_actors::ledger::pg_testkit::url())
                .postgres_schema(schema),
            None => config,
        }
    }

    /// The engine.
    pub fn b(&self) -> &Brood {
        self.brood.as_deref().expect("brood is open")
    }

    /// The engine, shareable with spawned tasks (give every clone back before [`Self::reopen`]).
    pub fn arc(&self) -> Arc<Brood> {
        self.brood.clone().expect("brood is open")
    }

    /// The folder a crashed process may have written next to the ledger.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// `shutdown()` and `Brood::open` the same folder again (what a restart does).
    pub fn reopen(&mut self) {
        self.shut_down();
        self.open_again();
    }

    /// `shutdown()` the engine, leaving its ledger closed (for a test to read it), until
    /// [`Self::open_again`].
    pub fn shut_down(&mut self) {
        let brood = self.brood.take().expect("brood is open");
        match Arc::try_unwrap(brood) {
            Ok(b) => b.shutdown(),
            Err(_) => panic!("the brood is still shared by a task; cannot shut it down"),
        }
    }

    /// The engine's ledger opened directly (after [`Self::shut_down`]), whichever backend it
    /// is on.
    pub fn open_ledger(&self) -> Box<dyn brood_actors::ledger::Ledger> {
        assert!(self.brood.is_none(), "shut the engine down first");
        match &self.schema {
            Some(schema) => Box::new(
                brood_actors::ledger::PgLedger::open_in(&brood_actors::ledger::pg_testkit::url(), schema)
                    .expect("open the PostgreSQL ledger"),
            ),
            None => Box::new(brood_actors::ledger::SledLedger::open(self.ledger_dir()).expect("open the sled ledger")),
        }
    }

    /// The ledger's folder.
    pub fn ledger_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("ledger")
    }

    /// `Brood::open` the folder again after [`Self::shut_down`].
    pub fn open_again(&mut self) {
        assert!(self.brood.is_none(), "brood is still open");
        let brood = Brood::open(self.config()).expect("open brood on its ledger");
        self.brood = Some(Arc::new(brood));
    }
}

/// Opens (or re-binds) a wake-capable session with a no-op wake target.
pub async fn open_wake(b: &Brood, session: &str) {
    b.open_session(session, SessionSettings::default().wake(|_| {}))
        .await
        .expect("open session");
}

/// Opens (or re-binds) `session` with a no-op wake target, running at most `capacity` children
/// at once.
pub async fn open_capped(b: &Brood, session: &str, capacity: u32) {
    b.open_session(
        session,
        SessionSettings::default()
            .wake(|_| {})
            .max_concurrent_children(capacity),
    )
    .await
    .unwrap();
}

/// Delegates `request` in `session`, which must accept it; the call's id.
pub async fn delegated(b: &Brood, session: &str, request: brood::DelegateRequest) -> String {
    b.delegate(session, request)
        .await
        .map_err(|e| e.error)
        .unwrap()
        .call_id()
        .to_string()
}

/// Polls boundaries until one returns an envelope.
pub async fn next_envelope(b: &Brood, session: &str, consumer: &str, lease: Duration) -> Envelope {
    wait_for!(
        format!("an envelope for session `{session}`"),
        b.boundary(session, consumer, lease).await.expect("boundary")
    )
}

/// Polls the status until `pred` holds.
pub async fn status_until(
    b: &Brood,
    session: &str,
    what: &str,
    pred: impl Fn(&SessionStatus) -> bool,
) -> SessionStatus {
    wait_for!(what, {
        let st = b.status(session).await.expect("status");
        pred(&st).then_some(st)
    })
}

/// Waits until `call_id` left its session's memory (delivered whole, or removed).
pub async fn call_left_memory(b: &Brood, session: &str, call_id: &str) {
    status_until(b, session, &format!("call {call_id} left memory"), |st| {
        st.calls.iter().all(|c| c.call.call_id != call_id)
    })
    .await;
}

/// The status of task `index` of `call_id`, if the call is still in memory.
pub fn child_status(st: &SessionStatus, call_id: &str, index: u32) -> Option<ChildStatus> {
    st.calls
        .iter()
        .find(|c| c.call.call_id == call_id)?
        .children
        .iter()
        .find(|c| c.task_index == index)
        .map(|c| c.status)
}

/// Takes and acks envelopes until `n` result items arrived; returns every item seen (results
/// and failure notices), in arrival order.
pub async fn collect_results(b: &Brood, session: &str, n: usize) -> Vec<ReadyItem> {
    let mut seen = Vec::new();
    let mut results = 0;
    while results < n {
        let env = next_envelope(b, session, "collector", LONG_LEASE).await;
        let acked = b.ack(&env.claim_id).await.expect("ack");
        assert_eq!(acked, env.items.len(), "an ack delivers every item of its claim");
        results += env.items.iter().filter(|i| i.kind == ItemKind::Result).count();
        seen.extend(env.items);
    }
    assert_eq!(results, n, "more results arrived than the calls had tasks");
    seen
}

/// Lets anything already decided (a wake spawned by the owner) run: a few round trips through
/// the owner's mailbox and a short pause. Only ever used before asserting that something did
/// *not* happen, so a slow machine can make it miss a bug but never fail a correct engine.
pub async fn settle(b: &Brood, session: &str) {
    for _ in 0..3 {
        b.status(session).await.expect("status");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Processes

/// Whether a process is gone: no such pid, or a zombie nobody reaped yet (it is dead).
pub fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

// ---------------------------------------------------------------------------------------------
// Fault points

/// Takes the fault-point lock and starts from a clean slate (nothing armed). Fault points are
/// process-wide, so the tests of a file that arms them run one at a time, each holding this
/// guard for its whole run.
#[cfg(feature = "failpoints")]
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    brood::failpoints::disarm_all();
    guard
}

// ---------------------------------------------------------------------------------------------
// Fixtures shared by several invariant files

/// A lease that runs out within a test (the shortest brood accepts).
pub const SHORT_LEASE: Duration = Duration::from_millis(100);

/// A session holding one item of each delivery state, just before a restart: two acked items,
/// one claimed and unacked (`held`, under a long lease), two ready and never claimed.
pub struct Mixed {
    /// Dedup keys of the acked items.
    pub acked: BTreeSet<String>,
    /// Dedup key of the claimed item.
    pub claimed: String,
    /// The envelope that still holds `claimed`.
    pub held: Envelope,
    /// Dedup keys of the items that were ready and never claimed.
    pub ready: BTreeSet<String>,
}

/// Builds a [`Mixed`] session `session` (opened wake-capable here) through the API.
pub async fn acked_claimed_and_ready(b: &Brood, session: &str) -> Mixed {
    use brood::DelegateRequest;
    open_wake(b, session).await;
    let acked = b
        .delegate(
            session,
            DelegateRequest::background(vec![task("a0", sim(0)), task("a1", sim(0))]),
        )
        .await
        .unwrap();
    let acked: BTreeSet<String> = (0..2).map(|i| result_key(acked.call_id(), i)).collect();
    let env = next_envelope(b, session, "c", LONG_LEASE).await;
    assert_eq!(keys(&env), acked);
    assert_eq!(b.ack(&env.claim_id).await.unwrap(), 2);

    let claimed = b
        .delegate(session, DelegateRequest::background(vec![task("c0", sim(0))]))
        .await
        .unwrap();
    let claimed = result_key(claimed.call_id(), 0);
    let held = next_envelope(b, session, "c", LONG_LEASE).await;
    assert_eq!(keys(&held), BTreeSet::from([claimed.clone()]));

    let ready = b
        .delegate(
            session,
            DelegateRequest::background(vec![task("r0", sim(0)), task("r1", sim(0))]),
        )
        .await
        .unwrap();
    let ready: BTreeSet<String> = (0..2).map(|i| result_key(ready.call_id(), i)).collect();
    status_until(b, session, "two ready items and one claimed", |st| {
        st.counts.ready == 2 && st.counts.claimed == 1
    })
    .await;
    Mixed {
        acked,
        claimed,
        held,
        ready,
    }
}

/// Reopens the brood and `session` (wake-capable) and takes the first boundary's envelope
/// under a long lease: it must have one, else "expected {what}".
pub async fn reopened_envelope(t: &mut TestBrood, session: &str, what: &str) -> Envelope {
    t.reopen();
    let b = t.b();
    open_wake(b, session).await;
    b.boundary(session, "c", LONG_LEASE).await.unwrap().expect(what)
}

/// Item A's claim, released busy while its sibling unit B still ran, and the envelope of the
/// next boundary once B finished.
pub struct Reclaimed {
    pub first: Envelope,
    pub second: Envelope,
    /// A's and B's result keys.
    pub a: String,
    pub b: String,
}

/// Builds a [`Reclaimed`] in session "r" (opened wake-capable here): A (`sim`) and B (gate
/// "b") in one independent call; A's claim holds A alone and is released busy; B finishes and
/// is recorded; the next boundary's envelope is taken.
pub async fn released_busy_then_reclaimed(t: &TestBrood) -> Reclaimed {
    use brood::{DelegateRequest, ReleaseReason};
    let b = t.b();
    open_wake(b, "r").await;
    let reply = b
        .delegate(
            "r",
            DelegateRequest::background(vec![task("A", sim(0)), task("B", gate("b"))]).independent(),
        )
        .await
        .unwrap();
    let call = reply.call_id().to_string();
    let (a, bk) = (result_key(&call, 0), result_key(&call, 1));
    let first = next_envelope(b, "r", "c", LONG_LEASE).await;
    assert_eq!(keys(&first), BTreeSet::from([a.clone()]), "B is still running");
    b.release(&first.claim_id, ReleaseReason::Busy, Duration::ZERO)
        .await
        .unwrap();
    t.kit.gates.open("b");
    status_until(b, "r", "B to be recorded", |st| {
        child_status(st, &call, 1) == Some(ChildStatus::Succeeded) && st.counts.ready == 2
    })
    .await;
    let second = b
        .boundary("r", "c", LONG_LEASE)
        .await
        .unwrap()
        .expect("A and B are ready");
    Reclaimed {
        first,
        second,
        a,
        b: bk,
    }
}

/// Delegates four independent children with a summary each on `session` (opened wake-capable
/// here) and takes every result as it arrives, acking nothing. Returns the call id and the
/// items by dedup key.
pub async fn take_four_unacked(b: &Brood, session: &str) -> (String, HashMap<String, ReadyItem>) {
    use brood::DelegateRequest;
    open_wake(b, session).await;
    let tasks = (0..4)
        .map(|i| {
            task(
                format!("t{i}"),
                json!({"kind": "sim", "ms": i * 10, "summary": format!("summary {i}")}),
            )
        })
        .collect();
    let reply = b
        .delegate(session, DelegateRequest::background(tasks).independent())
        .await
        .unwrap();
    let mut returned = HashMap::new();
    while returned.len() < 4 {
        let env = next_envelope(b, session, "c", LONG_LEASE).await;
        for item in env.items {
            assert!(returned.insert(item.dedup_key.clone(), item).is_none());
        }
    }
    (reply.call_id().to_string(), returned)
}
