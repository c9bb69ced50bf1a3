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
//! The worker and the parent's side of a round are in crash_worker/mod.rs.

mod crash_worker;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use brood::{BroodConfig, ChildStatus, ItemKind};
use brood_actors::ledger::Snapshot;
use crash_worker::{env_u64, runtime, Answer, Rng, Worker, WorkerLog, Workload};

const SESSION: &str = "crash";
const WORKER_ENV: &str = "BROOD_CRASH_WORKER_DIR";
const WORKER_SEED: &str = "BROOD_CRASH_WORKER_SEED";

/// The worker's calls: 1 to 8 sim children of up to 60 ms, all in the background; its consumers
/// ack four claims in six, release one as busy and walk away from one.
fn workload(seed: u64) -> Workload {
    Workload {
        session: SESSION,
        seed,
        most_tasks: 8,
        most_ms: 60,
        sync_one_in: None,
        most_pause_ms: 25,
        lease: Duration::from_millis(300),
        answer: |rng| match rng.below(6) {
            0 => Answer::ReleaseBusy,
            1 => Answer::WalkAway,
            _ => Answer::Ack,
        },
    }
}

fn main() {
    if let Ok(dir) = std::env::var(WORKER_ENV) {
        let dir = Path::new(&dir);
        let config = BroodConfig::new(dir.join("ledger"));
        runtime().block_on(crash_worker::work(
            config,
            &dir.join("worker.log"),
            workload(env_u64(WORKER_SEED, 1)),
        ));
        return;
    }
    let rounds = env_u64("BROOD_CRASH_ROUNDS", 50);
    let seed = env_u64("BROOD_CRASH_SEED", 0x5eed);
    let rt = runtime();
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

/// One round: a worker killed at a random moment, its ledger checked as it left it, recovered,
/// drained, and every child accounted for.
async fn round_trip(seed: u64, round: u64) -> Totals {
    let tag = format!("round {round}");
    let tmp = tempfile::TempDir::new().unwrap_or_else(|e| panic!("{tag}: tempdir: {e}"));
    let dir = tmp.path();
    let log = kill_a_worker(seed, &tag, dir).await;
    let ledger_dir = dir.join("ledger");
    let before = crash_worker::load_ledger(&ledger_dir, &tag);
    check_what_the_kill_left(&tag, &log, &before);
    let delivered_before = delivered(&before);
    let drained = drain_after_recovery(&tag, &ledger_dir, &delivered_before, &log.acked_keys()).await;
    let after = crash_worker::load_ledger(&ledger_dir, &tag);
    let mut totals = account_for_every_child(&tag, &after, &before, &delivered_before, &drained);
    totals.calls = before.calls.len();
    totals
}

/// Starts a worker over `dir`, lets it get going (opening sled takes a moment), kills it at a
/// random moment, and reads back its log.
async fn kill_a_worker(seed: u64, tag: &str, dir: &Path) -> WorkerLog {
    let mut rng = Rng::new(seed.wrapping_mul(31).wrapping_add(7));
    let log_path = dir.join("worker.log");
    let seed = seed.to_string();
    let env = [(WORKER_ENV, dir.as_os_str()), (WORKER_SEED, seed.as_ref())];
    let mut worker = Worker::spawn(tag, &env, &log_path, &dir.join("worker.stderr"));
    worker.wait_until("delegated a call", |log| !log.calls.is_empty()).await;
    tokio::time::sleep(Duration::from_millis(rng.below(300))).await;
    worker.kill();
    WorkerLog::read(&log_path)
}

/// The ledger as the dead process left it: every call whose delegate returned is there whole,
/// every acked item is delivered, and every item handed out is recorded with the status it was
/// handed with.
fn check_what_the_kill_left(tag: &str, log: &WorkerLog, before: &Snapshot) {
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
            "{tag}: accepted call {call} is not in the ledger whole"
        );
    }
    let row = |key: &str| {
        let (child, kind) = brood::parse_dedup_key(key).unwrap_or_else(|| panic!("{tag}: bad dedup key {key}"));
        rows.get(child).map(|r| (r, kind))
    };
    for key in log.acked_keys() {
        assert!(
            row(&key).is_some_and(|(r, kind)| r.delivery(kind).delivered),
            "{tag}: acked item {key} is not delivered in the ledger"
        );
    }
    for (key, statuses) in &log.handed {
        let (r, _) = row(key).unwrap_or_else(|| panic!("{tag}: handed-out {key} has no row"));
        for status in statuses {
            assert_eq!(r.status.as_str(), status, "{tag}: recorded result of {key} changed");
        }
    }
}

/// The dedup keys the ledger holds as delivered.
fn delivered(snapshot: &Snapshot) -> BTreeSet<String> {
    snapshot
        .children
        .iter()
        .flat_map(|c| {
            [ItemKind::Result, ItemKind::FailureNotice]
                .into_iter()
                .filter(|&k| c.delivery(k).delivered)
                .map(|k| brood::dedup_key(&c.child_id, k))
        })
        .collect()
}

/// What the drain after recovery delivered, and what was dead-lettered.
struct Drained {
    /// dedup key -> (status, recovered) of every item delivered after recovery.
    after: BTreeMap<String, (ChildStatus, bool)>,
    dead: BTreeSet<String>,
}

/// Recovers and drains everything: nothing delivered before the kill comes out again, nothing
/// comes out twice, a claim owns exactly the items its envelope shows, and no acked item is
/// delivered again.
async fn drain_after_recovery(
    tag: &str,
    ledger_dir: &Path,
    delivered_before: &BTreeSet<String>,
    acked_keys: &BTreeSet<String>,
) -> Drained {
    let brood = crash_worker::recover(BroodConfig::new(ledger_dir), SESSION, tag).await;
    let mut after: BTreeMap<String, (ChildStatus, bool)> = BTreeMap::new();
    crash_worker::drain(&brood, SESSION, tag, |env, acked| {
        for item in &env.items {
            assert!(
                !delivered_before.contains(&item.dedup_key),
                "{tag}: {} was delivered before the crash and again after it",
                item.dedup_key
            );
            let again = after.insert(item.dedup_key.clone(), (item.status, item.recovered));
            assert!(
                again.is_none(),
                "{tag}: {} delivered twice after recovery",
                item.dedup_key
            );
        }
        assert_eq!(
            acked,
            env.items.len(),
            "{tag}: the claim owned items its envelope did not show"
        );
    })
    .await;
    for key in acked_keys {
        assert!(!after.contains_key(key), "{tag}: acked {key} delivered again");
    }
    let dead: BTreeSet<String> = match brood.dead_letters().await {
        Ok(d) => d.into_iter().map(|d| d.dedup_key).collect(),
        Err(e) => panic!("{tag}: dead letters: {e}"),
    };
    brood.shutdown();
    Drained { after, dead }
}

/// Every child of every call, in the ledger after the drain: terminal, its result delivered
/// exactly once (before the kill or after it) or dead-lettered; a child that was running at the
/// kill re-ran or is `unknown`.
fn account_for_every_child(
    tag: &str,
    final_rows: &Snapshot,
    before: &Snapshot,
    delivered_before: &BTreeSet<String>,
    drained: &Drained,
) -> Totals {
    let were_running: BTreeSet<&str> = before
        .children
        .iter()
        .filter(|c| c.status == ChildStatus::Running)
        .map(|c| c.child_id.as_str())
        .collect();
    let mut t = Totals::default();
    for c in &final_rows.children {
        let key = brood::dedup_key(&c.child_id, ItemKind::Result);
        let was_before = delivered_before.contains(&key);
        let was_after = drained.after.contains_key(&key);
        let was_dead = drained.dead.contains(&key);
        assert!(
            c.status.is_terminal(),
            "{tag}: {} left {} (its call in the ledger: {})",
            c.child_id,
            c.status,
            final_rows.calls.iter().any(|call| call.call_id == c.call_id)
        );
        assert_eq!(
            was_before as u8 + was_after as u8 + was_dead as u8,
            1,
            "{tag}: {key} accounted {} times (before {was_before}, after {was_after}, dead {was_dead})",
            was_before as u8 + was_after as u8 + was_dead as u8
        );
        t.children += 1;
        t.before += was_before as usize;
        t.after += was_after as usize;
        if were_running.contains(c.child_id.as_str()) {
            match c.status {
                ChildStatus::Unknown => t.unknown += 1,
                _ => {
                    assert!(
                        c.attempt >= 2,
                        "{tag}: {} was running at the kill but did not re-run",
                        c.child_id
                    );
                    t.rerun += 1;
                }
            }
        }
    }
    t
}
