//! The worker process of the crash tests that kill one (crash.rs, powerloss.rs; `mod
//! crash_worker;`): the test binary re-run as a child that delegates random calls and runs two
//! racing consumers until its parent kills it; the log in which it writes what it delegated, what
//! it was handed and what it acked, one write a line so that a line survives SIGKILL; and the
//! parent's side of a round: starting the worker, waiting for it, killing it, and recovering and
//! draining the ledger it left. What a round checks stays in its own file.
//!
//! `brood chaos` (src/chaos.rs) keeps a log and consumers of its own: its worker lives through
//! many restarts and takeovers, logs the faults it armed, is read while it runs, and its
//! consumers also release with `failed` and wait out errors that these workers treat as fatal.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use brood::{Brood, BroodConfig, DelegateReply, DelegateRequest, Envelope, ReadyItem, ReleaseReason, SessionSettings};
use brood_actors::ledger::{Ledger, SledLedger, Snapshot};

#[path = "../../src/workload.rs"]
mod workload;
pub use workload::{random_call, Rng};

/// How long a worker may take to get going, and a recovered engine to drain.
const PATIENCE: Duration = Duration::from_secs(30);

/// An environment variable as a number, or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// The runtime a worker and a round run on.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

// ---------------------------------------------------------------------------------------------
// The worker's log

/// Appends lines to the worker's log; each line is one write, so it survives SIGKILL.
#[derive(Clone)]
pub struct Log(Arc<Mutex<std::fs::File>>);

impl Log {
    /// The log at `path`, appended to.
    pub fn create(path: &Path) -> Log {
        let file = OpenOptions::new().create(true).append(true).open(path).expect("log");
        Log(Arc::new(Mutex::new(file)))
    }

    /// Writes `s` and a newline in one write.
    pub fn line(&self, s: impl AsRef<str>) {
        if let Ok(mut f) = self.0.lock() {
            f.write_all(format!("{}\n", s.as_ref()).as_bytes()).expect("log write");
        }
    }
}

/// Items as the log writes them: `dedup_key=status`, space-separated.
fn items_text(items: &[ReadyItem]) -> String {
    items
        .iter()
        .map(|i| format!("{}={}", i.dedup_key, i.status.as_str()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// What a worker's log says it did, read back after the kill.
#[derive(Default, Debug)]
pub struct WorkerLog {
    /// The worker opened its ledger and session.
    pub started: bool,
    /// call id -> task count, for every delegate that returned.
    pub calls: BTreeMap<String, usize>,
    /// Items handed out, from envelopes and sync replies: dedup key -> every status it was
    /// handed with (one, unless a result changed).
    pub handed: BTreeMap<String, BTreeSet<String>>,
    /// claim id -> its items' dedup keys.
    pub claims: BTreeMap<String, Vec<String>>,
    /// Claims whose ack returned `Ok`.
    pub acked: BTreeSet<String>,
}

impl WorkerLog {
    /// Reads the log at `path` (none yet reads as empty).
    pub fn read(path: &Path) -> WorkerLog {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let mut log = WorkerLog::default();
        for line in text.lines() {
            // A line cut by the kill has no newline; `lines` still yields it, so check its shape.
            let mut words = line.split(' ');
            match words.next() {
                Some("started") => log.started = true,
                Some("call") => {
                    if let (Some(id), Some(Ok(n))) = (words.next(), words.next().map(str::parse)) {
                        log.calls.insert(id.to_string(), n);
                    }
                }
                Some(kind @ ("claim" | "sync")) => {
                    let Some(id) = words.next() else { continue };
                    let mut keys = Vec::new();
                    for (key, status) in words.filter_map(|w| w.split_once('=')) {
                        if brood::parse_dedup_key(key).is_some() && !status.is_empty() {
                            log.handed
                                .entry(key.to_string())
                                .or_default()
                                .insert(status.to_string());
                            keys.push(key.to_string());
                        }
                    }
                    if kind == "claim" {
                        log.claims.insert(id.to_string(), keys);
                    }
                }
                Some("acked") => {
                    if let Some(id) = words.next() {
                        log.acked.insert(id.to_string());
                    }
                }
                _ => {}
            }
        }
        log
    }

    /// The dedup keys of every claim whose ack returned `Ok`.
    pub fn acked_keys(&self) -> BTreeSet<String> {
        self.acked
            .iter()
            .filter_map(|claim| self.claims.get(claim))
            .flatten()
            .cloned()
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// The worker

/// What a consumer does with a claim it was handed.
#[derive(Debug, Clone, Copy)]
pub enum Answer {
    /// Acks it (and logs `acked` if the ack returned `Ok`).
    Ack,
    /// Releases it as busy (not a delivery attempt).
    ReleaseBusy,
    /// Walks away: its lease expires.
    WalkAway,
}

/// How a worker drives its session.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    pub session: &'static str,
    pub seed: u64,
    /// Tasks a call: 1 to this many.
    pub most_tasks: u64,
    /// How long a sim child works at the most (below this many ms).
    pub most_ms: u64,
    /// One call in this many is sync (`None`: all are background calls).
    pub sync_one_in: Option<u64>,
    /// The pause between calls (below this many ms).
    pub most_pause_ms: u64,
    /// The consumers' lease.
    pub lease: Duration,
    /// What a consumer does with each claim, drawn from its own generator.
    pub answer: fn(&mut Rng) -> Answer,
}

/// The worker: opens `config` (its session of capacity 6), logs `started`, then delegates and
/// runs two consumers until it is killed, logging every call, hand-out and ack to `log`.
pub async fn work(config: BroodConfig, log: &Path, w: Workload) {
    let log = Log::create(log);
    let brood = Arc::new(Brood::open(config).expect("the worker opens its ledger"));
    brood
        .open_session(
            w.session,
            SessionSettings::default().wake(|_| {}).max_concurrent_children(6),
        )
        .await
        .expect("session");
    log.line("started");
    for c in 0..2u64 {
        let rng = Rng::new(w.seed ^ ((c + 1) * 0x1234_5678));
        tokio::spawn(consume(brood.clone(), log.clone(), format!("consumer-{c}"), rng, w));
    }
    let mut rng = Rng::new(w.seed);
    loop {
        let n = 1 + rng.below(w.most_tasks) as usize;
        let mut req = random_call(&mut rng, n, w.most_ms);
        if w.sync_one_in.is_some_and(|k| rng.below(k) == 0) {
            req = DelegateRequest::sync(req.tasks);
        }
        match brood.delegate(w.session, req).await.expect("delegate") {
            DelegateReply::Sync { call_id, results, .. } => {
                log.line(format!("call {call_id} {n}"));
                log.line(format!("sync {call_id} {}", items_text(&results)));
            }
            reply => log.line(format!("call {} {n}", reply.call_id())),
        }
        tokio::time::sleep(Duration::from_millis(rng.below(w.most_pause_ms))).await;
    }
}

/// One consumer: takes every boundary it can, logs what it was handed and answers as
/// `w.answer` draws.
async fn consume(brood: Arc<Brood>, log: Log, consumer: String, mut rng: Rng, w: Workload) {
    loop {
        match brood.boundary(w.session, &consumer, w.lease).await {
            Ok(Some(env)) => {
                log.line(format!("claim {} {}", env.claim_id, items_text(&env.items)));
                match (w.answer)(&mut rng) {
                    Answer::ReleaseBusy => {
                        let _ = brood.release(&env.claim_id, ReleaseReason::Busy, Duration::ZERO).await;
                    }
                    Answer::WalkAway => {}
                    Answer::Ack => {
                        if brood.ack(&env.claim_id).await.is_ok() {
                            log.line(format!("acked {}", env.claim_id));
                        }
                    }
                }
            }
            Ok(None) => tokio::time::sleep(Duration::from_millis(3)).await,
            Err(e) => panic!("boundary failed in the worker: {e}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The parent's side

/// A worker process, killed when dropped (so a failed check cannot leave it running, holding a
/// mount).
pub struct Worker {
    child: Child,
    log: PathBuf,
    stderr: PathBuf,
    tag: String,
}

impl Worker {
    /// Re-runs this test binary with `env` set, as a worker that writes its log to `log`; its
    /// stderr goes to the file `stderr`, shown if it exits early. `tag` names the round in
    /// failures.
    pub fn spawn(tag: &str, env: &[(&str, &OsStr)], log: &Path, stderr: &Path) -> Worker {
        let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{tag}: current exe: {e}"));
        let err = std::fs::File::create(stderr).unwrap_or_else(|e| panic!("{tag}: stderr file: {e}"));
        let child = Command::new(exe)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("{tag}: spawn worker: {e}"));
        Worker {
            child,
            log: log.to_path_buf(),
            stderr: stderr.to_path_buf(),
            tag: tag.to_string(),
        }
    }

    /// Panics, with the worker's stderr, if it exited.
    pub fn check_alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            let err = std::fs::read_to_string(&self.stderr).unwrap_or_default();
            panic!("{}: the worker exited early ({status}):\n{err}", self.tag);
        }
    }

    /// Waits until the worker's log shows `ready` (it "never {what}" after 30 s).
    pub async fn wait_until(&mut self, what: &str, ready: impl Fn(&WorkerLog) -> bool) {
        let deadline = Instant::now() + PATIENCE;
        while !ready(&WorkerLog::read(&self.log)) {
            assert!(Instant::now() < deadline, "{}: the worker never {what}", self.tag);
            self.check_alive();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// SIGKILLs the worker and reaps it; it must not have exited by itself.
    pub fn kill(mut self) {
        let tag = &self.tag;
        self.child.kill().unwrap_or_else(|e| panic!("{tag}: SIGKILL: {e}"));
        let status = self.child.wait().unwrap_or_else(|e| panic!("{tag}: wait: {e}"));
        assert!(!status.success(), "{tag}: the worker was supposed to die");
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The sled ledger at `dir` as it is on disk, read without recovering anything.
pub fn load_ledger(dir: &Path, tag: &str) -> Snapshot {
    let ledger = SledLedger::open(dir).unwrap_or_else(|e| panic!("{tag}: the ledger does not open: {e}"));
    ledger
        .load()
        .unwrap_or_else(|e| panic!("{tag}: the ledger does not load: {e}"))
}

/// Opens `config` (recovering what a killed worker left) and `session` in it.
pub async fn recover(config: BroodConfig, session: &str, tag: &str) -> Brood {
    let brood = Brood::open(config).unwrap_or_else(|e| panic!("{tag}: recover: {e}"));
    brood
        .open_session(session, SessionSettings::default().wake(|_| {}))
        .await
        .unwrap_or_else(|e| panic!("{tag}: session: {e}"));
    brood
}

/// Claims and acks every boundary of `session` until nothing is queued, running, ready, backing
/// off or claimed (30 s at most); `seen` is shown each envelope and what its ack returned.
pub async fn drain(brood: &Brood, session: &str, tag: &str, mut seen: impl FnMut(&Envelope, usize)) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        assert!(Instant::now() < deadline, "{tag}: recovery never drained");
        match brood
            .boundary(session, "checker", Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("{tag}: boundary: {e}"))
        {
            Some(env) => {
                let acked = brood
                    .ack(&env.claim_id)
                    .await
                    .unwrap_or_else(|e| panic!("{tag}: ack: {e}"));
                seen(&env, acked);
            }
            None => {
                let st = brood
                    .counts(session)
                    .await
                    .unwrap_or_else(|e| panic!("{tag}: status: {e}"));
                if st.queued + st.running + st.ready + st.backing_off + st.claimed == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}
