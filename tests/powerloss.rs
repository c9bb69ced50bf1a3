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

mod crash_worker;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use brood::{BroodConfig, Durability};
use brood_actors::ledger::Snapshot;
use crash_worker::{env_u64, runtime, Answer, Rng, Worker, WorkerLog, Workload};

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

/// The worker's calls: 1 to 6 sim children of up to 40 ms, one call in five sync; its consumers
/// ack seven claims in eight and walk away from the eighth (its lease expires).
fn workload(seed: u64) -> Workload {
    Workload {
        session: SESSION,
        seed,
        most_tasks: 6,
        most_ms: 40,
        sync_one_in: Some(5),
        most_pause_ms: 20,
        lease: Duration::from_millis(500),
        answer: |rng| match rng.below(8) {
            0 => Answer::WalkAway,
            _ => Answer::Ack,
        },
    }
}

fn main() {
    if let Ok(dir) = std::env::var(WORKER_DIR) {
        let log = std::env::var(WORKER_LOG).expect("the worker's log path");
        let level: Durability = std::env::var(WORKER_LEVEL)
            .expect("the worker's durability")
            .parse()
            .expect("a durability level");
        let config = BroodConfig::new(&dir).durability(level);
        runtime().block_on(crash_worker::work(
            config,
            Path::new(&log),
            workload(env_u64(WORKER_SEED, 1)),
        ));
        return;
    }
    if let Err(e) = forgetfs::check_fuse() {
        panic!("powerloss: cannot run: {e}");
    }
    let rounds = env_u64("BROOD_POWERLOSS_ROUNDS", 20);
    let seed = env_u64("BROOD_POWERLOSS_SEED", 0x9011);
    let rt = runtime();
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

/// One round at `level`: a worker on a forgetfs mount killed as `kill_at` draws, the power cut,
/// and what survived checked against what the worker was handed and acked.
async fn round_trip(seed: u64, round: u64, level: Durability) -> Totals {
    let tag = format!("round {round} ({})", name(level));
    let tempdir = || tempfile::TempDir::new().unwrap_or_else(|e| panic!("{tag}: tempdir: {e}"));
    let (backing, mountpoint, logs) = (tempdir(), tempdir(), tempdir());
    let mount = forgetfs::Mount::new(backing.path(), mountpoint.path()).unwrap_or_else(|e| panic!("{tag}: {e}"));
    let mut rng = Rng::new(
        seed.wrapping_mul(0x2545_f491)
            .wrapping_add(u64::from(level == Durability::Flush)),
    );
    let kill_at = match rng.below(3) {
        0 => KillAt::After(Duration::from_millis(100 + rng.below(600))),
        1 => KillAt::Ack(1 + rng.below(12) as usize),
        _ => KillAt::Handout(1 + rng.below(12) as usize),
    };
    let log_path = logs.path().join("worker.log");
    let seed = seed.to_string();
    let ledger_in_mount = mount.path().join("ledger");
    let env = [
        (WORKER_DIR, ledger_in_mount.as_os_str()),
        (WORKER_LOG, log_path.as_os_str()),
        (WORKER_SEED, seed.as_ref()),
        (WORKER_LEVEL, name(level).as_ref()),
    ];
    let worker = Worker::spawn(&tag, &env, &log_path, &logs.path().join("worker.stderr"));
    kill_when_due(worker, kill_at, &log_path).await;

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
    count_losses(&mut t, &log, &crash_worker::load_ledger(&ledger_dir, &tag), &tag);
    count_acked_delivered_again(&mut t, &tag, &ledger_dir, level, &acked_keys).await;
    t
}

/// Waits for the worker to open its ledger, then for the moment `kill_at` names (5 s at the
/// most), and kills it.
async fn kill_when_due(mut worker: Worker, kill_at: KillAt, log_path: &Path) {
    worker.wait_until("opened its ledger", |log| log.started).await;
    let started = Instant::now();
    // Give up waiting for the n-th ack or hand-out after a while: kill anyway.
    let latest = started + Duration::from_secs(5);
    loop {
        worker.check_alive();
        let now = Instant::now();
        let due = now >= latest
            || match kill_at {
                KillAt::After(d) => now >= started + d,
                KillAt::Ack(n) => count_lines(log_path, "acked ") >= n,
                KillAt::Handout(n) => count_lines(log_path, "claim ") + count_lines(log_path, "sync ") >= n,
            };
        if due {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    worker.kill();
}

/// Counts in `t` the accepted calls that are gone from `before` and the items handed out that
/// are not recorded there with the status they were handed with.
fn count_losses(t: &mut Totals, log: &WorkerLog, before: &Snapshot, tag: &str) {
    let rows: BTreeMap<&str, &brood_actors::model::ChildRow> =
        before.children.iter().map(|c| (c.child_id.as_str(), c)).collect();
    let calls: BTreeSet<&str> = before.calls.iter().map(|c| c.call_id.as_str()).collect();
    for call in log.calls.keys() {
        if !calls.contains(call.as_str()) {
            t.calls_lost += 1;
            t.detail.push(format!("accepted call {call} is gone"));
        }
    }
    for (key, statuses) in &log.handed {
        let (child, _) = brood::parse_dedup_key(key).unwrap_or_else(|| panic!("{tag}: bad dedup key {key}"));
        for status in statuses {
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
    }
}

/// Recovers and drains every boundary, counting in `t` the acked items that come out again.
async fn count_acked_delivered_again(
    t: &mut Totals,
    tag: &str,
    ledger_dir: &Path,
    level: Durability,
    acked_keys: &BTreeSet<String>,
) {
    let brood = crash_worker::recover(BroodConfig::new(ledger_dir).durability(level), SESSION, tag).await;
    crash_worker::drain(&brood, SESSION, tag, |env, _| {
        for item in &env.items {
            if acked_keys.contains(&item.dedup_key) {
                t.acked_again += 1;
                t.detail.push(format!("acked {} delivered again", item.dedup_key));
            }
        }
    })
    .await;
    brood.shutdown();
}
