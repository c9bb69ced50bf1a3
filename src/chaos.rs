//! `brood chaos`: a seeded fault campaign against the real engine.
//!
//! The campaign runs a workload — delegations of sim children and racing consumers that ack,
//! release or walk away from their claims — in a worker process, under injected faults and
//! SIGKILLs, restarting the worker until every child is delivered. Then it checks the
//! invariants over the ledger and over what the consumers saw, and prints one summary line.
//!
//! This module owns the plan (pure: the same seed gives the same plan), the worker, the
//! consumers' log and the final check. The engine knows nothing about it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use brood::{Brood, BroodConfig, BroodError, ChildStatus, DelegateError, ItemKind, ReleaseReason, SessionSettings};
use brood_actors::ledger::{Ledger, SledLedger};

use crate::workload::{random_call, Rng};

/// The session every campaign uses.
pub const SESSION: &str = "chaos";
const LOG: &str = "chaos.log";
pub const LEDGER: &str = "ledger";

/// A fault the campaign can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// SIGKILL the worker process.
    Kill,
    /// A ledger write fails.
    LedgerWrite,
    /// A ledger flush fails.
    LedgerFlush,
    /// The coalescer's hand-off to an owner fails.
    CoalescerHandoff,
    /// A session owner's handler panics.
    OwnerHandler,
    /// A runner hangs (its stall clock ends it).
    RunnerHang,
}

impl Fault {
    /// Every fault, in order.
    pub const ALL: [Fault; 6] = [
        Fault::Kill,
        Fault::LedgerWrite,
        Fault::LedgerFlush,
        Fault::CoalescerHandoff,
        Fault::OwnerHandler,
        Fault::RunnerHang,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::LedgerWrite => "ledger_write",
            Fault::LedgerFlush => "ledger_flush",
            Fault::CoalescerHandoff => "coalescer_handoff",
            Fault::OwnerHandler => "owner_handler",
            Fault::RunnerHang => "runner_hang",
        }
    }

    /// Parses a comma-separated list (`kill,ledger_write,…`, or `all`).
    pub fn parse_list(list: &str) -> Result<Vec<Fault>, String> {
        let mut out = BTreeSet::new();
        for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            if word == "all" {
                out.extend(Fault::ALL);
                continue;
            }
            let fault = Fault::ALL.into_iter().find(|f| f.name() == word).ok_or_else(|| {
                let names: Vec<_> = Fault::ALL.iter().map(|f| f.name()).collect();
                format!("unknown fault `{word}`; known faults: {}, or all", names.join(", "))
            })?;
            out.insert(fault);
        }
        Ok(out.into_iter().collect())
    }
}

/// Parses a duration like `500ms`, `2s`, `1m` (a bare number is milliseconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration like 500ms, 2s or 1m"))?;
    let ms = match unit {
        "" | "ms" => n,
        "s" => n.saturating_mul(1000),
        "m" => n.saturating_mul(60_000),
        _ => return Err(format!("`{s}` has an unknown unit `{unit}`; use ms, s or m")),
    };
    if ms == 0 {
        return Err("the duration must be greater than zero".into());
    }
    Ok(Duration::from_millis(ms))
}

/// One life of the worker: when it is killed (if kills are on) and which faults it meets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Life {
    /// Kill the worker this long after it starts (None: it runs until done).
    pub kill_after: Option<Duration>,
    /// (offset from the worker's start, fault point) to arm once.
    pub faults: Vec<(Duration, Fault)>,
}

/// The whole fault plan of a campaign: a function of its seed and settings only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The lives, in order; lives past the end run without faults or kills.
    pub lives: Vec<Life>,
}

/// Lives a plan schedules faults for; later lives run clean so the campaign ends.
pub const PLANNED_LIVES: usize = 12;

impl Plan {
    /// The plan for `seed`: kills spread uniformly around `kill_every`, and in each life one
    /// injected fault per `kill_every` on average, of the kinds in `faults`.
    pub fn new(seed: u64, faults: &[Fault], kill_every: Duration) -> Plan {
        let mut rng = Rng::new(seed ^ 0xc4a0_5eed);
        let kills = faults.contains(&Fault::Kill);
        let injectable: Vec<Fault> = faults.iter().copied().filter(|f| *f != Fault::Kill).collect();
        let every = kill_every.as_millis().max(1) as u64;
        let lives = (0..PLANNED_LIVES)
            .map(|_| {
                let kill_after = kills.then(|| Duration::from_millis(every / 2 + rng.below(every + 1)));
                let span = kill_after.map_or(every * 2, |d| d.as_millis() as u64);
                let mut planned = Vec::new();
                if !injectable.is_empty() {
                    let n = 1 + rng.below(2);
                    for _ in 0..n {
                        let at = Duration::from_millis(rng.below(span.max(1)));
                        let fault = injectable[rng.below(injectable.len() as u64) as usize];
                        planned.push((at, fault));
                    }
                    planned.sort();
                }
                Life {
                    kill_after,
                    faults: planned,
                }
            })
            .collect();
        Plan { lives }
    }

    /// The life `i` (clean past the planned ones).
    pub fn life(&self, i: usize) -> Life {
        self.lives.get(i).cloned().unwrap_or(Life {
            kill_after: None,
            faults: Vec::new(),
        })
    }
}

/// The campaign's settings.
#[derive(Debug, Clone)]
pub struct Campaign {
    /// The seed.
    pub seed: u64,
    /// Children to deliver in all.
    pub children: usize,
    /// Mean time between kills.
    pub kill_every: Duration,
    /// Faults to inject.
    pub faults: Vec<Fault>,
    /// The campaign's folder (must be empty or absent): its consumers' log, and the sled
    /// ledger unless `ledger` is set.
    pub data_dir: PathBuf,
    /// The ledger on PostgreSQL instead: the database's address (the campaign takes a fresh
    /// schema in it).
    pub ledger: Option<String>,
    /// Worker processes at once (with `ledger`: each a node sharing the database, killed and
    /// restarted on its own schedule, the survivors taking the session over).
    pub processes: usize,
}

/// What the campaign found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Children delegated in all.
    pub children: usize,
    /// Faults injected (not counting kills).
    pub faults: usize,
    /// SIGKILLs.
    pub kills: usize,
    /// Results acked exactly once.
    pub delivered_once: usize,
    /// Items handed out again between delivery and ack (same dedup key in several claims).
    pub duplicates: usize,
    /// Children whose result is neither delivered nor dead-lettered.
    pub lost: usize,
    /// Children resolved as `unknown` by recovery.
    pub unknown: usize,
    /// Items acked more than once (an I2 violation).
    pub acked_twice: usize,
    /// Results dead-lettered.
    pub dead: usize,
    /// With a shared PostgreSQL ledger: how many times a worker took the session up (its
    /// tenure's epoch: the first take, then one per takeover).
    pub takeups: Option<u64>,
}

impl Summary {
    /// The campaign's last line.
    pub fn line(&self) -> String {
        format!(
            "chaos: children {}, faults {}, kills {}, delivered-once {}, duplicates {}, lost {}, unknown {}",
            self.children, self.faults, self.kills, self.delivered_once, self.duplicates, self.lost, self.unknown
        )
    }

    /// What the summary's counts mean, for those that are not plain (printed above it):
    /// duplicates and unknowns are expected of a campaign that kills, and are not faults.
    pub fn legend(&self) -> Vec<String> {
        let mut out = vec![
            "  duplicates: results handed out in more than one claim before one claim of them was acked (a kill or a lost lease hands a claim's items out again with the same dedup keys; at-least-once until the ack, never acked twice)".to_string(),
            "  unknown: children running when their process was killed whose task may not run twice; recovery ends them `unknown` and delivers that, instead of running them again".to_string(),
        ];
        if self.broken() {
            out.push("  lost or acked twice: an invariant (I1 or I2) broke; the campaign fails".to_string());
        }
        out
    }

    /// Whether an invariant broke.
    pub fn broken(&self) -> bool {
        self.lost > 0 || self.acked_twice > 0
    }
}

/// Whether this build can inject faults other than kills.
pub fn can_inject() -> bool {
    cfg!(feature = "failpoints")
}

/// How long a worker's tenure of the session lasts when workers share a PostgreSQL ledger: short, so
/// the survivors take the session over soon after a kill.
const CHAOS_TENURE: Duration = Duration::from_millis(1000);

/// Where a campaign's rows are: sled in its folder, or a schema of a PostgreSQL database.
#[derive(Debug, Clone)]
pub enum Store {
    /// The sled folder.
    Sled(PathBuf),
    /// A database's address and the campaign's schema in it.
    Postgres(String, String),
}

impl Store {
    fn open(&self) -> Result<Box<dyn Ledger>, String> {
        match self {
            Store::Sled(dir) => Ok(Box::new(SledLedger::open(dir).map_err(|e| e.to_string())?)),
            Store::Postgres(url, schema) => Ok(Box::new(
                brood_actors::ledger::PgLedger::open_in(url, schema).map_err(|e| e.to_string())?,
            )),
        }
    }
}

/// One worker slot of a campaign: its process, its current life and when that started.
struct Slot {
    child: Option<(std::process::Child, usize, Instant)>,
}

/// Runs a campaign: the workers are `exe chaos-worker …`, each restarted until one is done.
pub fn run(campaign: &Campaign, exe: &Path) -> Result<Summary, String> {
    if campaign.children == 0 {
        return Err("--children must be at least 1".into());
    }
    if campaign.processes == 0 || campaign.processes > 8 {
        return Err(format!("--processes is {}; give 1 to 8", campaign.processes));
    }
    if campaign.processes > 1 && campaign.ledger.is_none() {
        return Err("several worker processes need a shared ledger: give --ledger postgres://…".into());
    }
    if campaign.faults.iter().any(|f| *f != Fault::Kill) && !can_inject() {
        return Err(
            "injecting faults other than `kill` needs a build with the `failpoints` feature: \
                    cargo run --release --features failpoints -- chaos …"
                .into(),
        );
    }
    let dir = &campaign.data_dir;
    if dir.exists()
        && std::fs::read_dir(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .next()
            .is_some()
    {
        return Err(format!(
            "{} is not empty; a campaign needs an empty --data-dir",
            dir.display()
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let store = match &campaign.ledger {
        None => Store::Sled(dir.join(LEDGER)),
        Some(url) => {
            // A schema of the campaign's own, named by its seed and start.
            let started = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis());
            let store = Store::Postgres(url.clone(), format!("chaos_{}_{started}", campaign.seed));
            // Created (and found reachable) before any worker starts.
            store.open()?;
            store
        }
    };
    let plan = Plan::new(campaign.seed, &campaign.faults, campaign.kill_every);
    let faults_arg: Vec<&str> = campaign.faults.iter().map(|f| f.name()).collect();
    let progress = std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut shown = Instant::now() - Duration::from_secs(1);
    let mut kills = 0;
    let mut next_life = 0;
    let mut slots: Vec<Slot> = (0..campaign.processes).map(|_| Slot { child: None }).collect();
    let start = |slot: usize, life: usize| -> Result<std::process::Child, String> {
        let mut cmd = std::process::Command::new(exe);
        cmd.arg("chaos-worker")
            .args(["--data-dir", &dir.display().to_string()])
            .args(["--seed", &campaign.seed.to_string()])
            .args(["--children", &campaign.children.to_string()])
            .args(["--life", &life.to_string()])
            .args(["--slot", &slot.to_string()])
            .args(["--kill-every", &format!("{}ms", campaign.kill_every.as_millis())])
            .args(["--faults", &faults_arg.join(",")]);
        if let Store::Postgres(url, schema) = &store {
            cmd.args(["--ledger", url, "--schema", schema]);
        }
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("starting the worker {}: {e}", exe.display()))
    };
    'campaign: loop {
        for (i, slot) in slots.iter_mut().enumerate() {
            let Some((child, life, born)) = &mut slot.child else {
                if next_life > PLANNED_LIVES + 50 * campaign.processes {
                    return Err(format!("the workload did not finish after {next_life} worker lives"));
                }
                slot.child = Some((start(i, next_life)?, next_life, Instant::now()));
                next_life += 1;
                continue;
            };
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                slot.child = None;
                if status.success() {
                    break 'campaign;
                }
                continue;
            }
            if plan.life(*life).kill_after.is_some_and(|k| born.elapsed() >= k) {
                child.kill().map_err(|e| format!("killing the worker: {e}"))?;
                let _ = child.wait();
                kills += 1;
                slot.child = None;
            }
        }
        if progress && shown.elapsed() >= Duration::from_millis(250) {
            shown = Instant::now();
            let log = read_log(&dir.join(LOG));
            eprint!(
                "\r[chaos] life {next_life}, kills {kills}, {:.0}s: delegated {}/{} children, {} items acked     ",
                started.elapsed().as_secs_f64(),
                log.calls.values().sum::<usize>().min(campaign.children),
                campaign.children,
                log.acked_keys().len()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // One worker saw everything delivered: the others stop (not counted as kills).
    for slot in &mut slots {
        if let Some((child, ..)) = &mut slot.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    if progress {
        eprintln!();
    }
    check(dir, &store, kills)
}

/// Checks the invariants over the ledger and the consumers' log.
fn check(dir: &Path, store: &Store, kills: usize) -> Result<Summary, String> {
    let log = read_log(&dir.join(LOG));
    let ledger = store.open()?;
    let snapshot = ledger.load().map_err(|e| e.to_string())?;
    let dead: BTreeSet<String> = ledger
        .dead_letters()
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|d| d.dedup_key)
        .collect();
    let mut acked_count: BTreeMap<String, usize> = BTreeMap::new();
    for claim in &log.acked {
        for key in log.claims.get(claim).map(Vec::as_slice).unwrap_or(&[]) {
            *acked_count.entry(key.clone()).or_default() += 1;
        }
    }
    let mut claimed_count: BTreeMap<&str, usize> = BTreeMap::new();
    for keys in log.claims.values() {
        for k in keys {
            *claimed_count.entry(k).or_default() += 1;
        }
    }
    let mut s = Summary {
        kills,
        faults: log.faults,
        ..Summary::default()
    };
    for c in snapshot.children.iter().filter(|c| c.session_id == SESSION) {
        s.children += 1;
        let key = brood::dedup_key(&c.child_id, ItemKind::Result);
        if c.status == ChildStatus::Unknown {
            s.unknown += 1;
        }
        if dead.contains(&key) {
            s.dead += 1;
        } else if !c.result.delivered {
            s.lost += 1;
        }
        match acked_count.get(&key) {
            Some(1) => s.delivered_once += 1,
            // Acked just before a kill, before the log line: delivered once all the same.
            None if c.result.delivered => s.delivered_once += 1,
            _ => {}
        }
    }
    if let Store::Postgres(url, schema) = store {
        let pg = brood_actors::ledger::PgLedger::open_in(url, schema).map_err(|e| e.to_string())?;
        s.takeups = pg
            .tenure_of(SESSION)
            .map_err(|e| e.to_string())?
            .map(|(_, epoch)| epoch);
    }
    s.acked_twice = acked_count.values().filter(|&&n| n > 1).count();
    s.duplicates = claimed_count.values().filter(|&&n| n > 1).count();
    Ok(s)
}

#[derive(Debug, Default)]
struct ChaosLog {
    calls: BTreeMap<String, usize>,
    claims: BTreeMap<String, Vec<String>>,
    acked: BTreeSet<String>,
    faults: usize,
}

impl ChaosLog {
    fn acked_keys(&self) -> BTreeSet<&str> {
        self.acked
            .iter()
            .flat_map(|c| self.claims.get(c).into_iter().flatten().map(String::as_str))
            .collect()
    }
}

fn read_log(path: &Path) -> ChaosLog {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut log = ChaosLog::default();
    for line in text.lines() {
        let mut words = line.split(' ');
        match words.next() {
            Some("call") => {
                if let (Some(id), Some(Ok(n))) = (words.next(), words.next().map(str::parse)) {
                    log.calls.insert(id.to_string(), n);
                }
            }
            Some("claim") => {
                if let Some(id) = words.next() {
                    log.claims.insert(id.to_string(), words.map(str::to_string).collect());
                }
            }
            Some("acked") => {
                if let Some(id) = words.next() {
                    log.acked.insert(id.to_string());
                }
            }
            Some("fault") => log.faults += 1,
            _ => {}
        }
    }
    log
}

#[derive(Clone)]
struct Log(Arc<Mutex<std::fs::File>>);

impl Log {
    /// One write per line, so a line survives SIGKILL whole or not at all (but for a torn tail,
    /// which the reader ignores by its shape).
    fn line(&self, s: String) {
        if let Ok(mut f) = self.0.lock() {
            let _ = f.write_all(format!("{s}\n").as_bytes());
        }
    }
}

/// Children already delegated in the session, read from the ledger (before the engine opens
/// on sled; on PostgreSQL whenever this worker takes the session up).
fn delegated_so_far(ledger: &dyn Ledger) -> Result<usize, String> {
    let snapshot = ledger.load_session(SESSION).map_err(|e| e.to_string())?;
    Ok(snapshot.calls.iter().map(|c| c.tasks.len()).sum())
}

/// Whether an error means only that another worker serves the session right now.
fn elsewhere(e: &BroodError) -> bool {
    matches!(
        e,
        BroodError::Moved { .. } | BroodError::TenureLapsed { .. } | BroodError::Interrupted { .. }
    )
}

/// One life of the worker: recover, then delegate the rest of the workload and consume until
/// every child is delivered. Returns when done (exit 0); a kill ends it earlier.
pub async fn worker(
    dir: &Path,
    store: &Store,
    slot: usize,
    seed: u64,
    children: usize,
    life: usize,
    plan: Plan,
) -> Result<(), String> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(LOG))
        .map_err(|e| e.to_string())?;
    let log = Log(Arc::new(Mutex::new(file)));
    let (config, reader) = match store {
        Store::Sled(ledger_dir) => {
            let delegated = match ledger_dir.exists() {
                true => delegated_so_far(&*store.open()?)?,
                false => 0,
            };
            (BroodConfig::new(ledger_dir), Err(delegated))
        }
        Store::Postgres(url, schema) => {
            let node = format!("chaos-worker-{slot}");
            let config = BroodConfig::new(dir)
                .postgres(url)
                .postgres_schema(schema)
                .share(&node, &node, CHAOS_TENURE);
            (config, Ok(store.open()?))
        }
    };
    let brood = Arc::new(Brood::open(config).map_err(|e| e.to_string())?);
    // Sharing: served by one worker at a time; the others wait to take it over.
    loop {
        let opened = brood
            .open_session(
                SESSION,
                SessionSettings::default().wake(|_| {}).max_concurrent_children(16),
            )
            .await;
        match opened {
            Ok(_) => break,
            Err(e) if elsewhere(&e) => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => return Err(e.to_string()),
        }
    }
    // Counted again whenever a delegation failed: another worker may have delegated meanwhile.
    let recount = |reader: &Result<Box<dyn Ledger>, usize>| match reader {
        Ok(ledger) => delegated_so_far(&**ledger),
        Err(n) => Ok(*n),
    };
    let mut delegated = recount(&reader)?;
    // Faults of this life, armed on schedule.
    let this_life = plan.life(life);
    {
        let log = log.clone();
        tokio::spawn(async move {
            let born = Instant::now();
            for (at, fault) in this_life.faults {
                tokio::time::sleep(at.saturating_sub(born.elapsed())).await;
                arm(fault);
                log.line(format!("fault {}", fault.name()));
            }
        });
    }
    for c in 0..2u64 {
        let brood = brood.clone();
        let log = log.clone();
        tokio::spawn(async move {
            let mut rng = Rng::new(seed ^ ((life as u64) << 8) ^ (c + 1));
            loop {
                match brood
                    .boundary(SESSION, &format!("consumer-{c}"), Duration::from_millis(500))
                    .await
                {
                    Ok(Some(env)) => {
                        let keys: Vec<&str> = env.items.iter().map(|i| i.dedup_key.as_str()).collect();
                        log.line(format!("claim {} {}", env.claim_id, keys.join(" ")));
                        match rng.below(8) {
                            0 => {
                                let _ = brood.release(&env.claim_id, ReleaseReason::Busy, Duration::ZERO).await;
                            }
                            1 => {
                                let _ = brood
                                    .release(&env.claim_id, ReleaseReason::Failed, Duration::ZERO)
                                    .await;
                            }
                            2 => {} // walk away: the lease expires
                            _ => {
                                if brood.ack(&env.claim_id).await.is_ok() {
                                    log.line(format!("acked {}", env.claim_id));
                                }
                            }
                        }
                    }
                    Ok(None) | Err(BroodError::Interrupted { .. }) => {
                        tokio::time::sleep(Duration::from_millis(10)).await
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        });
    }
    let mut rng = Rng::new(seed.wrapping_add(life as u64 * 7919));
    loop {
        if delegated < children {
            let n = (1 + rng.below(10) as usize).min(children - delegated);
            let req = random_call(&mut rng, n, 200);
            match brood.delegate(SESSION, req).await {
                Ok(reply) => {
                    delegated += n;
                    log.line(format!("call {} {n}", reply.call_id()));
                }
                // It may have been accepted, or another worker serves the session now (and
                // delegates meanwhile): counted again from the ledger (on sled by the next
                // life).
                Err(DelegateError { error, .. }) if elsewhere(&error) => {
                    if reader.is_ok() {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        delegated = recount(&reader)?;
                    }
                }
                Err(e) => log.line(format!("error delegate {e}")),
            }
            tokio::time::sleep(Duration::from_millis(rng.below(40))).await;
            continue;
        }
        match brood.counts(SESSION).await {
            Ok(st) if st.queued + st.running + st.ready + st.backing_off + st.claimed == 0 => {
                // Everything delegated is delivered (or dead-lettered): this life is the last.
                log.line("done".into());
                return Ok(());
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(25)).await,
            Err(e) if elsewhere(&e) => tokio::time::sleep(Duration::from_millis(25)).await,
            Err(e) => return Err(e.to_string()),
        }
    }
}

#[cfg(feature = "failpoints")]
fn arm(fault: Fault) {
    if fault != Fault::Kill {
        brood::failpoints::arm(fault.name(), 1);
    }
}

#[cfg(not(feature = "failpoints"))]
fn arm(_: Fault) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_plan() {
        let faults = Fault::parse_list("kill,ledger_write,owner_handler").unwrap();
        let a = Plan::new(7, &faults, Duration::from_millis(500));
        assert_eq!(a, Plan::new(7, &faults, Duration::from_millis(500)));
        assert_ne!(a, Plan::new(8, &faults, Duration::from_millis(500)));
        for life in &a.lives {
            let k = life.kill_after.unwrap();
            assert!(
                k >= Duration::from_millis(250) && k <= Duration::from_millis(750),
                "{k:?}"
            );
            assert!(life.faults.iter().all(|(at, f)| *at <= k && *f != Fault::Kill));
        }
        assert_eq!(
            a.life(PLANNED_LIVES + 3),
            Life {
                kill_after: None,
                faults: vec![]
            }
        );
    }

    #[test]
    fn bad_fault_lists_and_durations_are_refused() {
        assert!(Fault::parse_list("kill,flood")
            .unwrap_err()
            .contains("unknown fault `flood`"));
        assert_eq!(Fault::parse_list("all").unwrap(), Fault::ALL.to_vec());
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("250").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("5h").is_err());
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("fast").is_err());
    }

    #[test]
    fn the_summary_line_has_the_documented_shape() {
        let s = Summary {
            children: 5,
            faults: 2,
            kills: 3,
            delivered_once: 5,
            ..Summary::default()
        };
        assert_eq!(
            s.line(),
            "chaos: children 5, faults 2, kills 3, delivered-once 5, duplicates 0, lost 0, unknown 0"
        );
        assert!(!s.broken());
        assert!(Summary { lost: 1, ..s }.broken());
    }
}
