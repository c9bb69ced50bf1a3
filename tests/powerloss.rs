//! Power-loss rounds, in the crash test's style, over a file system that forgets what was not
//! fsynced (`forgetfs`, see `forgetfs/src/lib.rs` for its rules). This test binary re-runs
//! itself as a worker process that delegates, claims and acks over a ledger on a forgetfs
//! mount, printing (to a log outside the mount) every item it was handed and every claim whose
//! ack returned `Ok`. The parent kills it with SIGKILL at a random moment — or right after an
//! ack or a hand-out, the moments a power loss hurts most — cuts the power, unmounts, opens the
//! ledger that survived in the backing folder, recovers, drains every boundary and checks
//! DESIGN.md's durability promise:
//!
//! - the ledger opens;
//! - every item the worker was handed (in an envelope, or in a sync delegate's reply) is still
//!   recorded, with the status it was handed (I1: nothing handed out is lost);
//! - no item of a claim whose ack returned `Ok` is delivered again (I2).
//!
//! It runs the rounds at both durability levels. At `fsync` a loss fails the test. At `flush`
//! (sled's `sync_file_range`, which never reaches forgetfs, so only sled's own periodic fsync
//! makes anything durable) the rounds must lose something — the test asserts they do — so a
//! green run shows the file system really forgets.
//!
//! `BROOD_POWERLOSS_ROUNDS` sets the rounds per level (default 20), `BROOD_POWERLOSS_SEED` the
//! seed. It needs FUSE (`/dev/fuse`, and root or Debian's `fuse3`); where that is missing it
//! fails and says so.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "../src/workload.rs"]
mod workload;
use brood::{Brood, BroodConfig, DelegateReply, DelegateRequest, Durability, SessionOptions};
use brood_actors::ledger::{Ledger, SledLedger};
use workload::{random_call, Rng};

const SESSION: &str = "powerloss";
const WORKER_DIR: &str = "BROOD_POWERLOSS_WORKER_DIR";
const WORKER_LOG: &str = "BROOD_POWERLOSS_WORKER_LOG";
const WORKER_SEED: &str = "BROOD_POWERLOSS_WORKER_SEED";
const WORKER_LEVEL: &str = "BROOD_POWERLOSS_WORKER_LEVEL";

/// The name of a durability level, as `BroodConfig` and the CLI spell it.
fn name(level: Durability) -> &'static str {
    match level {
        Durability::Fsync => "fsync",
        Durability::Flush => "flush",
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn main() {
    if let Ok(dir) = std::env::var(WORKER_DIR) {
        let log = std::env::var(WORKER_LOG).expect("the worker's log path");
        let level: Durability = std::env::var(WORKER_LEVEL)
            .expect("the worker's durability")
            .parse()
            .expect("a durability level");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(worker(
            PathBuf::from(dir),
            PathBuf::from(log),
            env_u64(WORKER_SEED, 1),
            level,
        ));
        return;
    }
    if let Err(e) = forgetfs::check_fuse() {
        panic!("powerloss: cannot run: {e}");
    }
    let rounds = env_u64("BROOD_POWERLOSS_ROUNDS", 20);
    let seed = env_u64("BROOD_POWERLOSS_SEED", 0x9011);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut lines = Vec::new();
    for level in [Durability::Fsync, Durability::Flush] {
        let mut totals = Totals::default();
        for round in 0..rounds {
            let t = rt.block_on(round_trip(seed.wrapping_add(round), round, level));
            if t.lost + t.acked_again + t.calls_lost > 0 {
                totals.rounds_with_loss += 1;
                if level == Durability::Fsync {
                    let shown: Vec<&str> = t.detail.iter().take(6).map(String::as_str).collect();
                    let more = t.detail.len().saturating_sub(shown.len());
                    failures.push(format!("round {round} (fsync): {} (and {more} more)", shown.join("; ")));
                }
            }
            totals.add(&t);
        }
        let line = format!(
            "powerloss [{}]: {rounds} rounds, {} items handed out, {} acked, {} lost, {} acked delivered again, \
             {} accepted calls lost; {} rounds lost something, {} lost the ledger's db file whole",
            name(level),
            totals.handed,
            totals.acked,
            totals.lost,
            totals.acked_again,
            totals.calls_lost,
            totals.rounds_with_loss,
            totals.db_gone
        );
        println!("{line}");
        lines.push((level, totals));
    }
    println!(
        "powerloss: {} rounds in {:.1} s (seed {seed})",
        rounds * 2,
        started.elapsed().as_secs_f64()
    );
    for (level, t) in &lines {
        if *level == Durability::Flush {
            assert!(
                t.lost + t.acked_again + t.calls_lost > 0,
                "the flush rounds lost nothing: the power cut did not bite, so a clean fsync run would prove nothing"
            );
        }
    }
    assert!(
        failures.is_empty(),
        "durability = \"fsync\" lost what brood reported as recorded:\n{}",
        failures.join("\n")
    );
    println!("powerloss: passed");
}

#[derive(Default, Debug)]
struct Totals {
    handed: usize,
    acked: usize,
    lost: usize,
    acked_again: usize,
    calls_lost: usize,
    rounds_with_loss: usize,
    /// Rounds after whose cut the ledger folder had no `db` file (its name was never fsynced).
    db_gone: usize,
    /// What went missing, for the failure message.
    detail: Vec<String>,
}

impl Totals {
    fn add(&mut self, o: &Totals) {
        self.handed += o.handed;
        self.acked += o.acked;
        self.lost += o.lost;
        self.acked_again += o.acked_again;
        self.calls_lost += o.calls_lost;
        self.db_gone += o.db_gone;
    }
}

/// Appends lines to the worker's log (outside the mount); one write per line.
#[derive(Clone)]
struct Log(Arc<Mutex<std::fs::File>>);

impl Log {
    fn line(&self, s: String) {
        if let Ok(mut f) = self.0.lock() {
            f.write_all(format!("{s}\n").as_bytes()).expect("log write");
        }
    }
}

fn items_text(items: &[brood::ReadyItem]) -> String {
    items
        .iter()
        .map(|i| format!("{}={}", i.dedup_key, i.status.as_str()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The worker: delegates (mostly background calls, some sync) and runs two consumers that ack
/// most claims, until it is killed.
async fn worker(dir: PathBuf, log: PathBuf, seed: u64, level: Durability) {
    let file = OpenOptions::new().create(true).append(true).open(log).expect("log");
    let log = Log(Arc::new(Mutex::new(file)));
    let config = BroodConfig::new(&dir).durability(level);
    let brood = Arc::new(Brood::open(config).expect("open the ledger on forgetfs"));
    brood
        .open_session(
            SESSION,
            SessionOptions::default().wake(|_| {}).max_concurrent_children(6),
        )
        .await
        .expect("session");
    log.line("started".into());
    for c in 0..2u64 {
        let brood = brood.clone();
        let log = log.clone();
        tokio::spawn(async move {
            let mut rng = Rng::new(seed ^ ((c + 1) * 0x1234_5678));
            loop {
                match brood
                    .boundary(SESSION, &format!("consumer-{c}"), Duration::from_millis(500))
                    .await
                {
                    Ok(Some(env)) => {
                        log.line(format!("claim {} {}", env.claim_id, items_text(&env.items)));
                        // Walk away from one claim in eight: its lease expires.
                        if rng.below(8) != 0 && brood.ack(&env.claim_id).await.is_ok() {
                            log.line(format!("acked {}", env.claim_id));
                        }
                    }
                    Ok(None) => tokio::time::sleep(Duration::from_millis(3)).await,
                    Err(e) => panic!("boundary failed in the worker: {e}"),
                }
            }
        });
    }
    let mut rng = Rng::new(seed);
    loop {
        let n = 1 + rng.below(6) as usize;
        let mut req = random_call(&mut rng, n, 40);
        let sync = rng.below(5) == 0;
        if sync {
            req = DelegateRequest::sync(req.tasks);
        }
        match brood.delegate(SESSION, req).await.expect("delegate") {
            DelegateReply::Sync { call_id, results, .. } => {
                log.line(format!("call {call_id} {n}"));
                log.line(format!("sync {call_id} {}", items_text(&results)));
            }
            reply => log.line(format!("call {} {n}", reply.call_id())),
        }
        tokio::time::sleep(Duration::from_millis(rng.below(20))).await;
    }
}

#[derive(Default)]
struct WorkerLog {
    started: bool,
    /// call id -> task count, for every delegate that returned.
    calls: BTreeMap<String, usize>,
    /// Items handed out: dedup key -> status, from envelopes and sync replies.
    handed: BTreeMap<String, String>,
    /// claim id -> its items' dedup keys.
    claims: BTreeMap<String, Vec<String>>,
    acked: BTreeSet<String>,
}

impl WorkerLog {
    fn read(path: &Path) -> WorkerLog {
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
                            log.handed.insert(key.to_string(), status.to_string());
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

    fn acked_keys(&self) -> BTreeSet<String> {
        self.acked
            .iter()
            .filter_map(|claim| self.claims.get(claim))
            .flatten()
            .cloned()
            .collect()
    }
}

/// Kills the worker if a round ends early (a failed check), so it cannot hold the mount.
struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// When a round pulls the plug.
#[derive(Debug, Clone, Copy)]
enum KillAt {
    /// This long after the worker started.
    After(Duration),
    /// Right after the worker logged its n-th ack.
    Ack(usize),
    /// Right after the worker logged its n-th hand-out.
    Handout(usize),
}

fn count_lines(path: &Path, prefix: &str) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(prefix))
        .count()
}

async fn round_trip(seed: u64, round: u64, level: Durability) -> Totals {
    let tag = format!("round {round} ({})", name(level));
    let backing = tempfile::TempDir::new().unwrap_or_else(|e| panic!("{tag}: tempdir: {e}"));
    let mountpoint = tempfile::TempDir::new().unwrap_or_else(|e| panic!("{tag}: tempdir: {e}"));
    let logs = tempfile::TempDir::new().unwrap_or_else(|e| panic!("{tag}: tempdir: {e}"));
    let mount = forgetfs::Mount::new(backing.path(), mountpoint.path()).unwrap_or_else(|e| panic!("{tag}: {e}"));
    let ledger_in_mount = mount.path().join("ledger");
    let log_path = logs.path().join("worker.log");
    let err_path = logs.path().join("worker.stderr");
    let mut rng = Rng::new(
        seed.wrapping_mul(0x2545_f491)
            .wrapping_add(u64::from(level == Durability::Flush)),
    );
    let kill_at = match rng.below(3) {
        0 => KillAt::After(Duration::from_millis(100 + rng.below(600))),
        1 => KillAt::Ack(1 + rng.below(12) as usize),
        _ => KillAt::Handout(1 + rng.below(12) as usize),
    };

    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{tag}: current exe: {e}"));
    let stderr = std::fs::File::create(&err_path).unwrap_or_else(|e| panic!("{tag}: stderr file: {e}"));
    let child = Command::new(exe)
        .env(WORKER_DIR, &ledger_in_mount)
        .env(WORKER_LOG, &log_path)
        .env(WORKER_SEED, seed.to_string())
        .env(WORKER_LEVEL, name(level))
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("{tag}: spawn worker: {e}"));
    let mut worker = Worker(child);
    let early_exit = |worker: &mut Worker| {
        if let Ok(Some(status)) = worker.0.try_wait() {
            let err = std::fs::read_to_string(&err_path).unwrap_or_default();
            panic!("{tag}: the worker exited early ({status}):\n{err}");
        }
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !WorkerLog::read(&log_path).started {
        assert!(Instant::now() < deadline, "{tag}: the worker never opened its ledger");
        early_exit(&mut worker);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let started = Instant::now();
    // Give up waiting for the n-th ack or hand-out after a while: kill anyway.
    let latest = started + Duration::from_secs(5);
    loop {
        early_exit(&mut worker);
        let now = Instant::now();
        let due = now >= latest
            || match kill_at {
                KillAt::After(d) => now >= started + d,
                KillAt::Ack(n) => count_lines(&log_path, "acked ") >= n,
                KillAt::Handout(n) => count_lines(&log_path, "claim ") + count_lines(&log_path, "sync ") >= n,
            };
        if due {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    worker.0.kill().unwrap_or_else(|e| panic!("{tag}: SIGKILL: {e}"));
    let status = worker.0.wait().unwrap_or_else(|e| panic!("{tag}: wait: {e}"));
    assert!(!status.success(), "{tag}: the worker was supposed to die");
    drop(worker);

    // The power goes; what survives is in the backing folder.
    mount.cut().unwrap_or_else(|e| panic!("{tag}: power cut: {e}"));
    mount.unmount().unwrap_or_else(|e| panic!("{tag}: unmount: {e}"));
    let ledger_dir = backing.path().join("ledger");
    let log = WorkerLog::read(&log_path);
    let acked_keys = log.acked_keys();
    let mut t = Totals {
        handed: log.handed.len(),
        acked: acked_keys.len(),
        db_gone: usize::from(!ledger_dir.join("db").exists()),
        ..Totals::default()
    };
    if t.db_gone > 0 {
        t.detail
            .push("the ledger's db file is gone: its name was never made durable (no fsync of its folder)".into());
    }

    // The ledger as the power cut left it: it must open; what was handed out must be in it.
    let before = {
        let ledger = SledLedger::open(&ledger_dir)
            .unwrap_or_else(|e| panic!("{tag}: the ledger does not open after the power cut: {e}"));
        ledger
            .load()
            .unwrap_or_else(|e| panic!("{tag}: the ledger does not load after the power cut: {e}"))
    };
    let rows: BTreeMap<&str, &brood::ChildRow> = before.children.iter().map(|c| (c.child_id.as_str(), c)).collect();
    let calls: BTreeSet<&str> = before.calls.iter().map(|c| c.call_id.as_str()).collect();
    for call in log.calls.keys() {
        if !calls.contains(call.as_str()) {
            t.calls_lost += 1;
            t.detail.push(format!("accepted call {call} is gone"));
        }
    }
    for (key, status) in &log.handed {
        let (child, _) = brood::parse_dedup_key(key).unwrap_or_else(|| panic!("{tag}: bad dedup key {key}"));
        match rows.get(child) {
            Some(row) if row.status.as_str() == status => {}
            Some(row) => {
                t.lost += 1;
                t.detail
                    .push(format!("handed-out {key} was {status}, is now {}", row.status.as_str()));
            }
            None => {
                t.lost += 1;
                t.detail.push(format!("handed-out {key} has no row"));
            }
        }
    }

    // Recover and drain every boundary: an acked item must not come out again.
    let brood =
        Brood::open(BroodConfig::new(&ledger_dir).durability(level)).unwrap_or_else(|e| panic!("{tag}: recover: {e}"));
    brood
        .open_session(SESSION, SessionOptions::default().wake(|_| {}))
        .await
        .unwrap_or_else(|e| panic!("{tag}: session: {e}"));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "{tag}: recovery never drained");
        match brood
            .boundary(SESSION, "checker", Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("{tag}: boundary: {e}"))
        {
            Some(env) => {
                for item in &env.items {
                    if acked_keys.contains(&item.dedup_key) {
                        t.acked_again += 1;
                        t.detail.push(format!("acked {} delivered again", item.dedup_key));
                    }
                }
                brood
                    .ack(&env.claim_id)
                    .await
                    .unwrap_or_else(|e| panic!("{tag}: ack: {e}"));
            }
            None => {
                let st = brood
                    .counts(SESSION)
                    .await
                    .unwrap_or_else(|e| panic!("{tag}: status: {e}"));
                if st.queued + st.running + st.ready + st.claimed == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
    brood.shutdown();
    t
}
