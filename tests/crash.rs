//! Crash tests that really crash, in the style of sled's: this test binary re-runs itself as a
//! worker process that delegates sim children and runs racing consumers over a ledger; the
//! parent kills it with SIGKILL at a random moment, reopens the ledger, recovers and checks:
//!
//! - every call whose delegate returned is in the ledger (dispatch is durable before the reply);
//! - every acked item is delivered in the ledger and never delivered again (I2);
//! - every item a consumer was handed is still recorded, with the status it was handed (I1);
//! - after recovery every child is accounted for exactly once: delivered before the crash,
//!   delivered after it, or dead-lettered; children that were running re-ran or are `unknown`;
//!   nothing stays queued, running, ready or claimed (I6).
//!
//! `BROOD_CRASH_ROUNDS` sets the number of rounds (default 50), `BROOD_CRASH_SEED` the seed.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "../src/workload.rs"]
mod workload;
use brood::{Brood, BroodConfig, ChildStatus, ItemKind, ReleaseReason, SessionOptions};
use brood_actors::ledger::{Ledger, SledLedger};
use workload::{random_call, Rng};

const SESSION: &str = "crash";
const WORKER_ENV: &str = "BROOD_CRASH_WORKER_DIR";

fn main() {
    if let Ok(dir) = std::env::var(WORKER_ENV) {
        let seed = std::env::var("BROOD_CRASH_WORKER_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(worker(PathBuf::from(dir), seed));
        return;
    }
    let rounds: u64 = std::env::var("BROOD_CRASH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50);
    let seed: u64 = std::env::var("BROOD_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let started = Instant::now();
    let mut totals = Totals::default();
    for round in 0..rounds {
        let t = rt.block_on(round_trip(seed.wrapping_add(round), round));
        totals.add(&t);
    }
    println!(
        "crash: {rounds} rounds in {:.1} s (seed {seed}): {} calls, {} children, {} delivered before a kill, {} after, {} re-run, {} unknown",
        started.elapsed().as_secs_f64(),
        totals.calls,
        totals.children,
        totals.before,
        totals.after,
        totals.rerun,
        totals.unknown
    );
    println!("crash: {rounds} passed, 0 failed");
}

#[derive(Default, Debug)]
struct Totals {
    calls: usize,
    children: usize,
    before: usize,
    after: usize,
    rerun: usize,
    unknown: usize,
}

impl Totals {
    fn add(&mut self, o: &Totals) {
        self.calls += o.calls;
        self.children += o.children;
        self.before += o.before;
        self.after += o.after;
        self.rerun += o.rerun;
        self.unknown += o.unknown;
    }
}

/// Appends lines to the worker's log; each line is one write, so it survives SIGKILL.
#[derive(Clone)]
struct Log(Arc<Mutex<std::fs::File>>);

impl Log {
    fn line(&self, s: String) {
        if let Ok(mut f) = self.0.lock() {
            f.write_all(format!("{s}\n").as_bytes()).expect("log write");
        }
    }
}

/// The worker: delegates calls and runs two consumers until it is killed.
async fn worker(dir: PathBuf, seed: u64) {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("worker.log"))
        .expect("log");
    let log = Log(Arc::new(Mutex::new(file)));
    let brood = Arc::new(Brood::open(BroodConfig::new(dir.join("ledger"))).expect("open"));
    brood
        .open_session(
            SESSION,
            SessionOptions::default().wake(|_| {}).max_concurrent_children(6),
        )
        .await
        .expect("session");
    for c in 0..2u64 {
        let brood = brood.clone();
        let log = log.clone();
        tokio::spawn(async move {
            let mut rng = Rng::new(seed ^ ((c + 1) * 0x1234_5678));
            loop {
                match brood
                    .boundary(SESSION, &format!("consumer-{c}"), Duration::from_millis(300))
                    .await
                {
                    Ok(Some(env)) => {
                        let items: Vec<String> = env
                            .items
                            .iter()
                            .map(|i| format!("{}={}", i.dedup_key, i.status.as_str()))
                            .collect();
                        log.line(format!("claim {} {}", env.claim_id, items.join(" ")));
                        match rng.below(6) {
                            0 => {
                                let _ = brood.release(&env.claim_id, ReleaseReason::Busy, Duration::ZERO).await;
                            }
                            1 => {} // walk away: the lease will expire
                            _ => {
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
        });
    }
    let mut rng = Rng::new(seed);
    loop {
        let n = 1 + rng.below(8) as usize;
        let req = random_call(&mut rng, n, 60);
        let reply = brood.delegate(SESSION, req).await.expect("delegate");
        log.line(format!("call {} {n}", reply.call_id()));
        tokio::time::sleep(Duration::from_millis(rng.below(25))).await;
    }
}

struct WorkerLog {
    calls: BTreeMap<String, usize>,
    /// claim id -> (dedup key, status) handed to a consumer
    claims: BTreeMap<String, Vec<(String, String)>>,
    acked: BTreeSet<String>,
}

fn read_log(path: &Path) -> WorkerLog {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut log = WorkerLog {
        calls: BTreeMap::new(),
        claims: BTreeMap::new(),
        acked: BTreeSet::new(),
    };
    for line in text.lines() {
        // A line cut by the kill has no newline; `lines` still yields it, so check its shape.
        let mut words = line.split(' ');
        match words.next() {
            Some("call") => {
                if let (Some(id), Some(Ok(n))) = (words.next(), words.next().map(str::parse)) {
                    log.calls.insert(id.to_string(), n);
                }
            }
            Some("claim") => {
                let Some(id) = words.next() else { continue };
                let items = words
                    .filter_map(|w| w.split_once('=').map(|(k, s)| (k.to_string(), s.to_string())))
                    .collect();
                log.claims.insert(id.to_string(), items);
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

async fn round_trip(seed: u64, round: u64) -> Totals {
    let tmp = tempfile::TempDir::new().unwrap_or_else(|e| panic!("round {round}: tempdir: {e}"));
    let dir = tmp.path();
    let mut rng = Rng::new(seed.wrapping_mul(31).wrapping_add(7));
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("round {round}: current exe: {e}"));
    let mut child = Command::new(exe)
        .env(WORKER_ENV, dir)
        .env("BROOD_CRASH_WORKER_SEED", seed.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("round {round}: spawn worker: {e}"));
    // Let it get going (opening sled takes a moment), then kill it at a random moment.
    let log_path = dir.join("worker.log");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::metadata(&log_path).map(|m| m.len()).unwrap_or(0) == 0 {
        assert!(Instant::now() < deadline, "round {round}: the worker never started");
        if let Ok(Some(status)) = child.try_wait() {
            panic!("round {round}: the worker exited early: {status}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tokio::time::sleep(Duration::from_millis(rng.below(300))).await;
    child.kill().unwrap_or_else(|e| panic!("round {round}: SIGKILL: {e}"));
    let status = child.wait().unwrap_or_else(|e| panic!("round {round}: wait: {e}"));
    assert!(!status.success(), "round {round}: the worker was supposed to die");

    let log = read_log(&log_path);
    let ledger_dir = dir.join("ledger");

    // The ledger as the dead process left it.
    let before = {
        let ledger = SledLedger::open(&ledger_dir).unwrap_or_else(|e| panic!("round {round}: reopen ledger: {e}"));
        ledger.load().unwrap_or_else(|e| panic!("round {round}: load: {e}"))
    };
    let rows: BTreeMap<&str, _> = before.children.iter().map(|c| (c.child_id.as_str(), c)).collect();
    let calls: BTreeMap<&str, usize> = before
        .calls
        .iter()
        .map(|c| (c.call_id.as_str(), c.tasks.len()))
        .collect();
    for (call, n) in &log.calls {
        // The call row holds its tasks; a child gets a row of its own when it starts.
        assert_eq!(
            calls.get(call.as_str()),
            Some(n),
            "round {round}: accepted call {call} is not in the ledger whole"
        );
    }
    let delivered_key = |key: &str| {
        let (child, kind) = brood::parse_dedup_key(key).unwrap_or_else(|| panic!("round {round}: bad dedup key {key}"));
        rows.get(child).is_some_and(|r| r.delivery(kind).delivered)
    };
    let mut acked_keys = BTreeSet::new();
    for claim in &log.acked {
        for (key, _) in log.claims.get(claim).map(Vec::as_slice).unwrap_or(&[]) {
            assert!(
                delivered_key(key),
                "round {round}: acked item {key} is not delivered in the ledger"
            );
            acked_keys.insert(key.clone());
        }
    }
    for items in log.claims.values() {
        for (key, status) in items {
            let (child, _) =
                brood::parse_dedup_key(key).unwrap_or_else(|| panic!("round {round}: bad dedup key {key}"));
            let row = rows
                .get(child)
                .unwrap_or_else(|| panic!("round {round}: handed-out {key} has no row"));
            assert_eq!(
                row.status.as_str(),
                status,
                "round {round}: recorded result of {key} changed"
            );
        }
    }
    let delivered_before: BTreeSet<String> = before
        .children
        .iter()
        .flat_map(|c| {
            [ItemKind::Result, ItemKind::FailureNotice]
                .into_iter()
                .filter(|&k| c.delivery(k).delivered)
                .map(|k| brood::dedup_key(&c.child_id, k))
        })
        .collect();
    let were_running: BTreeSet<String> = before
        .children
        .iter()
        .filter(|c| c.status == ChildStatus::Running)
        .map(|c| c.child_id.clone())
        .collect();

    // Recover and drain everything.
    let brood = Brood::open(BroodConfig::new(&ledger_dir)).unwrap_or_else(|e| panic!("round {round}: recover: {e}"));
    brood
        .open_session(SESSION, SessionOptions::default().wake(|_| {}))
        .await
        .unwrap_or_else(|e| panic!("round {round}: session: {e}"));
    let mut after: BTreeMap<String, (ChildStatus, bool)> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "round {round}: recovery never drained");
        match brood
            .boundary(SESSION, "checker", Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("round {round}: boundary: {e}"))
        {
            Some(env) => {
                for item in &env.items {
                    assert!(
                        !delivered_before.contains(&item.dedup_key),
                        "round {round}: {} was delivered before the crash and again after it",
                        item.dedup_key
                    );
                    let again = after.insert(item.dedup_key.clone(), (item.status, item.recovered));
                    assert!(
                        again.is_none(),
                        "round {round}: {} delivered twice after recovery",
                        item.dedup_key
                    );
                }
                let acked = brood
                    .ack(&env.claim_id)
                    .await
                    .unwrap_or_else(|e| panic!("round {round}: ack: {e}"));
                assert_eq!(
                    acked,
                    env.items.len(),
                    "round {round}: the claim owned items its envelope did not show"
                );
            }
            None => {
                let st = brood
                    .counts(SESSION)
                    .await
                    .unwrap_or_else(|e| panic!("round {round}: status: {e}"));
                if st.queued + st.running + st.ready + st.backing_off + st.claimed == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
    for key in &acked_keys {
        assert!(!after.contains_key(key), "round {round}: acked {key} delivered again");
    }
    let dead: BTreeSet<String> = match brood.dead_letters().await {
        Ok(d) => d.into_iter().map(|d| d.dedup_key).collect(),
        Err(e) => panic!("dead letters: {e}"),
    };
    brood.shutdown();

    // Every child of every call: its result delivered exactly once, or dead-lettered.
    let final_rows = SledLedger::open(&ledger_dir)
        .unwrap_or_else(|e| panic!("round {round}: reopen: {e}"))
        .load()
        .unwrap_or_else(|e| panic!("round {round}: load: {e}"));
    let mut t = Totals {
        calls: before.calls.len(),
        ..Totals::default()
    };
    for c in &final_rows.children {
        let key = brood::dedup_key(&c.child_id, ItemKind::Result);
        let was_before = delivered_before.contains(&key);
        let was_after = after.contains_key(&key);
        let was_dead = dead.contains(&key);
        assert!(
            c.status.is_terminal(),
            "round {round}: {} left {} (its call in the ledger: {})",
            c.child_id,
            c.status,
            final_rows.calls.iter().any(|call| call.call_id == c.call_id)
        );
        assert_eq!(
            was_before as u8 + was_after as u8 + was_dead as u8,
            1,
            "round {round}: {key} accounted {} times (before {was_before}, after {was_after}, dead {was_dead})",
            was_before as u8 + was_after as u8 + was_dead as u8
        );
        t.children += 1;
        t.before += was_before as usize;
        t.after += was_after as usize;
        if were_running.contains(&c.child_id) {
            match c.status {
                ChildStatus::Unknown => t.unknown += 1,
                _ => {
                    assert!(
                        c.attempt >= 2,
                        "round {round}: {} was running at the kill but did not re-run",
                        c.child_id
                    );
                    t.rerun += 1;
                }
            }
        }
    }
    t
}
