//! `brood bench`: brood's paths and the raw baselines under them, measured in one process and
//! one run, each figure printed beside its baseline and their ratio.
//!
//! Figures (sizes in brackets are `--quick`'s, for CI; the others the full run's):
//! - `durable_children_per_s`: zero-time sim children from delegate to ack in one session
//!   (calls of 1,000, a consumer woken by the session's wakes claiming and acking), at the
//!   chosen durability. Baseline: raw sled inserts of rows of the size brood's child rows have
//!   in the same run, flushed (and, for `fsync`, the data file synced) every 100 rows. The
//!   engine and the baseline take turns over three rounds of a third each; both figures are
//!   the medians of their rounds (a spell of noise then lands on both, not on one).
//! - `claimable_latency_p50_ms` / `_p99_ms` / `_max_ms`: a child's end (its `finished_at`) →
//!   its item claimable (the owner's stamp on the event it emits as it applies the recorded row
//!   and publishes the item, read from `Brood::subscribe`; 1 ms resolution), under a steady
//!   offered load of 10,000 children/s. `claimed_latency_p50_ms` / `_p99_ms`: the same
//!   children's end → their item in a claim of the woken consumer, which claims and acks one
//!   envelope at a time (so an item that becomes ready during an ack waits for it).
//!   `latency_run_children_per_s` says what the engine really took of the offered load.
//! - `claim_1k_ms`, `claim_10k_ms`, `claim_100k_ms` (full run only) and `ack_…`: one boundary
//!   claiming that many ready items, and its ack.
//! - `recovery_s`: open and recover a ledger of 1M (100k) child rows written by the engine
//!   itself. Baseline: raw sled open plus a full scan of every tree of the same folder.
//! - `rss_per_live_child_bytes`: RSS growth per running child, 100k (10k) children live
//!   (hanging sim children), in calls of 1,000 of the default shape: one unit per call.
//!   `rss_per_live_child_independent_bytes`: the same with independent completions, a unit
//!   actor per child beside its child actor. Each in a process of its own.
//! - `sessions_1000_ratio`: the durable workload spread over 1,000 sessions, as a ratio to the
//!   same children in one session (same calls, same consumer), both measured here.
//! - `http_children_per_s`: the durable workload, the same number of children, through
//!   `brood serve` on loopback (this same binary as a child process, a polling consumer that
//!   reads each envelope into the HTTP contract's types).
//!   Baseline: `durable_children_per_s`.
//! - `rebuild_stall_ms`: in the recovery group's ledger of 1M (100k) rows, a session of 10,000
//!   ready children has its owner rebuilt (`Brood::restart_owner`) while four other sessions
//!   each loop delegate → claim → ack of one child; the longest probe cycle that overlapped the
//!   rebuild minus the median cycle of the quiet second before. `rebuild_ms` is how long the
//!   rebuild took, `rebuild_probe_cycle_p50_ms` that median.
//! - `takeover_s` (with `--ledger` only): two `brood serve --ledger … --session-lease-ms 2000`
//!   processes on a fresh database; a session opened and delegated to through one, which is
//!   then killed with SIGKILL; the seconds until a boundary of that session through the other
//!   answers 200 or 204. Baseline: the tenure (2 s).
//! - `cluster_children_per_s`, `cluster_forwarded_share`, `cluster_balance_spread`,
//!   `cluster_settle_s`, `cluster_moved_again`, `cluster_takeover_s` (with `--ledger` only):
//!   three `brood serve` processes on one database and 1,000 sessions, consumers sending each
//!   request to a process drawn at random; see [`cluster`]. The children/s figure's baseline is one process doing the
//!   same in the same run.
//! - `growth` (only when named: `--only growth`): throughput and claim time against children per
//!   call (10 → 100k) and sessions (1 → 10k), and throughput, claim time and RSS against the
//!   ledger's size (10k → 1M delivered rows); each series' ratio is to its first size.
//! - `scale` (only when named: `--only scale`, with `--ledger` only): a `brood serve --ledger`
//!   started on a database of 1k and then 100k (100 and 2k) stored sessions, ten of them with a
//!   call, its children and claims, the rest idle: `scale_start_s_1k` / `_100k`, from its spawn
//!   until `/readyz` answers 200 naming every session; `scale_idle_tx_per_s_1k` / `_100k`, the
//!   transactions per second committed in its database over the 10 s after
//!   (`pg_stat_database.xact_commit`); `scale_idle_rows_per_s_1k` / `_100k`, the rows it read
//!   and wrote per second meanwhile. The larger size's ratio is to the smaller's.
//!
//! With `--ledger postgres://…` every engine keeps its ledger on that database (a schema of
//! its own, shared as `brood serve --ledger` shares it; a `brood serve` gets a database of its
//! own), and the baselines that were raw sled are measured on that database instead:
//! `durable_children_per_s` against a plain `FOR UPDATE SKIP LOCKED` queue doing the same job
//! (see `pg::queue`), `recovery_s` against a fresh connection reading every row of the
//! ledger's tables. `--durability` does not apply there: every commit is durable on the server
//! (`synchronous_commit = on`). What the run made there is dropped at its end.
//!
//! Nothing here is a pass/fail test: the targets are printed beside the figures, and judged by
//! whoever reads them.

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;

use anyhow::{bail, Context as _};
use brood::Durability;
use serde_json::json;

mod cluster;
mod engine;
mod growth;
mod http;
mod pg;
mod plot;
mod scale;
mod takeover;

use engine::{claims, durable, latency, rebuild, recovery, rss, rss_in_child, sessions, ROUTING_THREADS, RSS_CHILD};

/// One measured figure.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Figure {
    /// Its name (stable: scripts read it).
    pub name: &'static str,
    /// The measured value.
    pub value: f64,
    /// Its unit.
    pub unit: &'static str,
    /// The baseline measured in the same run, if the figure has one.
    pub baseline: Option<f64>,
    /// `value / baseline`.
    pub ratio: Option<f64>,
    /// The target the speed issue sets, as text (not judged here).
    #[serde(skip)]
    pub target: Option<&'static str>,
}

impl Figure {
    fn new(name: &'static str, value: f64, unit: &'static str) -> Self {
        Figure {
            name,
            value,
            unit,
            baseline: None,
            ratio: None,
            target: None,
        }
    }

    fn against(mut self, baseline: f64) -> Self {
        self.baseline = Some(baseline);
        self.ratio = (baseline > 0.0).then(|| self.value / baseline);
        self
    }

    fn target(mut self, target: &'static str) -> Self {
        self.target = Some(target);
        self
    }

    /// Whether the figure meets its target (`≤ 5`, `≥ 0.8`, `ratio ≥ 0.5`: the ratio to its
    /// baseline when the target says so, else the value); none without a target, or without the
    /// number it names.
    pub fn met(&self) -> Option<bool> {
        let target = self.target?;
        let (measured, rule) = match target.strip_prefix("ratio ") {
            Some(rule) => (self.ratio?, rule),
            None => (self.value, target),
        };
        let (at_most, bound) = if let Some(n) = rule.strip_prefix("≤ ") {
            (true, n)
        } else {
            (false, rule.strip_prefix("≥ ")?)
        };
        let bound: f64 = bound.trim().parse().ok()?;
        if !measured.is_finite() {
            return Some(false);
        }
        Some(if at_most { measured <= bound } else { measured >= bound })
    }
}

/// What a table says of a figure's target: met, missed, or nothing.
fn verdict(f: &Figure) -> &'static str {
    match f.met() {
        Some(true) => "met",
        Some(false) => "MISSED",
        None => "",
    }
}

/// What `brood bench` was asked for.
#[derive(Debug, Clone)]
pub struct Options {
    /// CI sizes.
    pub quick: bool,
    /// Where the ledgers go (a fresh folder inside it, removed at the end).
    pub data_dir: Option<PathBuf>,
    /// The durability of every engine measured.
    pub durability: Durability,
    /// Only these groups of figures (empty: all).
    pub only: Vec<String>,
    /// Write an SVG of the latency distribution and the throughput over time here.
    pub plot: Option<PathBuf>,
    /// Routing threads of every engine measured (None: the engine's default).
    pub routing_threads: Option<usize>,
    /// Keep every engine's ledger on this PostgreSQL database (`postgres://…`) instead of sled.
    pub ledger: Option<String>,
}

/// The groups of figures, in the order they run.
pub const GROUPS: &[&str] = &[
    "durable", "latency", "claim", "recovery", "rebuild", "rss", "sessions", "http", "takeover", "cluster",
];

/// Groups run only when `--only` names them (they take minutes).
pub const OPTIONAL_GROUPS: &[&str] = &["growth", "scale"];

struct Sizes {
    durable: usize,
    latency_s: u64,
    claims: &'static [usize],
    recovery: usize,
    live: usize,
    sessions_children: usize,
    cluster: cluster::Size,
}

const QUICK: Sizes = Sizes {
    durable: 20_000,
    latency_s: 3,
    claims: &[1_000, 10_000],
    recovery: 100_000,
    live: 10_000,
    sessions_children: 20_000,
    cluster: cluster::QUICK,
};

const FULL: Sizes = Sizes {
    durable: 200_000,
    latency_s: 10,
    claims: &[1_000, 10_000, 100_000],
    recovery: 1_000_000,
    live: 100_000,
    sessions_children: 100_000,
    cluster: cluster::FULL,
};

/// Children per call in every throughput workload.
const CALL: usize = 1_000;

/// A progress line on stderr when it is a terminal.
struct Progress {
    on: bool,
    total: usize,
    done: usize,
}

impl Progress {
    fn step(&mut self, what: &str) {
        if self.on {
            let width = 24;
            let filled = width * self.done / self.total.max(1);
            eprint!(
                "\r[{}{}] {}/{} {what:<40}",
                "#".repeat(filled),
                "-".repeat(width - filled),
                self.done,
                self.total
            );
            let _ = std::io::stderr().flush();
        }
        self.done += 1;
    }

    fn finish(&self) {
        if self.on {
            eprintln!("\r{:<80}", "");
        }
    }
}

/// What the run gathered for the plot.
#[derive(Default)]
struct Traces {
    /// Claimable latencies of the latency run, in ms.
    latencies: Vec<f64>,
    /// Children delivered per 100 ms of the latency run.
    throughput: Vec<u32>,
}

/// Runs the benchmark; returns the figures and the machine they were measured on.
pub fn run(opts: &Options) -> anyhow::Result<(Vec<Figure>, serde_json::Value)> {
    for g in &opts.only {
        if !GROUPS.contains(&g.as_str()) && !OPTIONAL_GROUPS.contains(&g.as_str()) {
            bail!(
                "--only: unknown group `{g}`; the groups are {} (and, only when named, {})",
                GROUPS.join(", "),
                OPTIONAL_GROUPS.join(", ")
            );
        }
    }
    let root = match &opts.data_dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            tempfile::TempDir::new_in(d)
        }
        None => tempfile::TempDir::new(),
    }
    .context("creating the bench folder")?;
    let _ = ROUTING_THREADS.set(opts.routing_threads);
    if let Some(url) = &opts.ledger {
        anyhow::ensure!(
            url.starts_with("postgres://") || url.starts_with("postgresql://"),
            "--ledger: a PostgreSQL address postgres://user@host:port/database"
        );
    }
    let _ = pg::LEDGER.set(opts.ledger.clone());
    // Drops the schemas and databases the run made, however it ends.
    let _cleanup = pg::Cleanup;
    let sizes = if opts.quick { &QUICK } else { &FULL };
    let wanted = |g: &str| opts.only.is_empty() || opts.only.iter().any(|o| o == g);
    let optional = |g: &str| opts.only.iter().any(|o| o == g);
    let groups: Vec<&str> = GROUPS
        .iter()
        .copied()
        .filter(|g| wanted(g))
        .chain(OPTIONAL_GROUPS.iter().copied().filter(|g| optional(g)))
        .collect();
    let mut progress = Progress {
        on: std::io::stderr().is_terminal(),
        total: groups.len(),
        done: 0,
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut figures = Vec::new();
    let mut traces = Traces::default();
    let mut embedded = None;
    // The recovery group's ledger of `sizes.recovery` rows, which the rebuild group reuses.
    let mut recovered: Option<std::path::PathBuf> = None;
    for group in groups {
        progress.step(group);
        let dir = root.path().join(group);
        match group {
            "durable" => {
                let (fig, base) = rt.block_on(durable(&dir, opts.durability, sizes.durable))?;
                embedded = Some(fig.value);
                figures.push(fig);
                figures.push(base);
            }
            "latency" => figures.extend(rt.block_on(latency(&dir, opts.durability, sizes.latency_s, &mut traces))?),
            "claim" => figures.extend(rt.block_on(claims(&dir, opts.durability, sizes.claims))?),
            "recovery" => {
                figures.push(rt.block_on(recovery(&dir, opts.durability, sizes.recovery))?);
                recovered = Some(dir.join("ledger"));
            }
            "rebuild" => {
                figures.extend(rt.block_on(rebuild(&dir, opts.durability, sizes.recovery, recovered.as_deref()))?)
            }
            // In a process of its own: memory the groups before it freed stays with this
            // process's allocator and would be reused, hiding the children's growth.
            "rss" => match std::env::var(RSS_CHILD).ok().as_deref() {
                Some(shape) => figures.push(rt.block_on(rss(&dir, opts.durability, sizes.live, shape == "grouped"))?),
                None => {
                    figures.push(rss_in_child(&dir, opts, false)?);
                    figures.push(rss_in_child(&dir, opts, true)?);
                }
            },
            "sessions" => figures.push(rt.block_on(sessions(&dir, opts.durability, sizes.sessions_children))?),
            // As many children as the embedded figure had: throughput falls as a session's
            // history grows, so only the same size compares.
            "http" => figures.push(http::http(&dir, opts.durability, sizes.durable, embedded)?),
            "takeover" => match &opts.ledger {
                Some(url) => figures.push(takeover::takeover(&dir, opts.durability, url)?),
                None => note("takeover: skipped: it needs --ledger postgres://… (two processes sharing one database)"),
            },
            "cluster" => match &opts.ledger {
                Some(url) => figures.extend(cluster::cluster(&dir, opts.durability, url, sizes.cluster)?),
                None => note("cluster: skipped: it needs --ledger postgres://… (three processes sharing one database)"),
            },
            "growth" => figures.extend(rt.block_on(growth::growth(&dir, opts.durability, opts.quick))?),
            "scale" => match &opts.ledger {
                Some(url) => figures.extend(scale::scale(&dir, opts.durability, url, opts.quick)?),
                None => note("scale: skipped: it needs --ledger postgres://… (sessions stored on a shared database)"),
            },
            _ => unreachable!("checked against GROUPS"),
        }
    }
    progress.finish();
    if let Some(path) = &opts.plot {
        plot::plot(path, &traces)?;
    }
    Ok((figures, machine(opts)))
}

/// A note on stderr (stdout may be the JSON).
fn note(what: &str) {
    eprintln!("brood bench: note: {what}");
}

/// What the figures were measured on.
fn machine(opts: &Options) -> serde_json::Value {
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string()).ok();
    let mem_total_kib = read("/proc/meminfo").and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    });
    let cpu = read("/proc/cpuinfo").and_then(|c| {
        c.lines().find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
    });
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "cpu": cpu,
        "memory_bytes": mem_total_kib.map(|k| k * 1024),
        "os": std::env::consts::OS,
        "arch": std::env::consts::ARCH,
        "kernel": read("/proc/sys/kernel/osrelease"),
        "brood": env!("CARGO_PKG_VERSION"),
        "durability": opts.durability.to_string(),
        "ledger": if opts.ledger.is_some() { "postgres" } else { "sled" },
        "quick": opts.quick,
        "debug_build": cfg!(debug_assertions),
        "routing_threads": opts
            .routing_threads
            .unwrap_or_else(brood::default_routing_threads),
    })
}

/// The figures as a table: value, baseline, ratio, target.
pub fn table(figures: &[Figure]) -> String {
    let fmt = |v: f64| {
        if v.is_nan() {
            "-".to_string()
        } else if v.abs() >= 100.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.3}")
        }
    };
    let mut out = format!(
        "{:<30} {:>14} {:<11} {:>14} {:>9}  {}\n",
        "figure", "value", "unit", "baseline", "ratio", "target"
    );
    for f in figures {
        let line = format!(
            "{:<30} {:>14} {:<11} {:>14} {:>9}  {:<12} {}",
            f.name,
            fmt(f.value),
            f.unit,
            f.baseline.map(fmt).unwrap_or_else(|| "-".into()),
            f.ratio.map(|r| format!("{r:.3}×")).unwrap_or_else(|| "-".into()),
            f.target.unwrap_or(""),
            verdict(f)
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
    let (met, missed) = figures.iter().fold((0, 0), |(m, x), f| match f.met() {
        Some(true) => (m + 1, x),
        Some(false) => (m, x + 1),
        None => (m, x),
    });
    if met + missed > 0 {
        out.push_str(&format!("targets: {met} met, {missed} missed\n"));
    }
    out
}

/// The figures as `{"figures": [...], "machine": {...}}`.
pub fn to_json(figures: &[Figure], machine: serde_json::Value) -> serde_json::Value {
    let figures: Vec<serde_json::Value> = figures
        .iter()
        .map(|f| {
            let num = |v: f64| {
                if v.is_finite() {
                    json!(v)
                } else {
                    serde_json::Value::Null
                }
            };
            json!({
                "name": f.name,
                "value": num(f.value),
                "unit": f.unit,
                "baseline": f.baseline.map(num),
                "ratio": f.ratio.map(num),
                "target": f.target,
                "met": f.met(),
            })
        })
        .collect();
    json!({"figures": figures, "machine": machine})
}

#[cfg(test)]
mod tests {
    use super::engine::percentile;
    use super::*;

    #[test]
    fn a_figure_meets_its_target_by_value_or_by_ratio() {
        let f = |value: f64, baseline: Option<f64>, target: &'static str| {
            let f = Figure::new("x", value, "u");
            let f = match baseline {
                Some(b) => f.against(b),
                None => f,
            };
            f.target(target).met()
        };
        assert_eq!(f(4.0, None, "≤ 5"), Some(true));
        assert_eq!(f(6.0, None, "≤ 5"), Some(false));
        assert_eq!(f(0.8, None, "≥ 0.8"), Some(true));
        assert_eq!(f(10.0, Some(30.0), "ratio ≥ 0.5"), Some(false));
        assert_eq!(f(20.0, Some(30.0), "ratio ≥ 0.5"), Some(true));
        assert_eq!(f(3.0, Some(1.0), "ratio ≤ 2"), Some(false));
        assert_eq!(f(f64::NAN, None, "≤ 5"), Some(false));
        assert_eq!(f(1.0, None, "ratio ≥ 0.5"), None, "no baseline, no ratio");
        assert_eq!(Figure::new("x", 1.0, "u").met(), None);
        let table = table(&[
            Figure::new("a", 4.0, "ms").target("≤ 5"),
            Figure::new("b", 9.0, "ms").target("≤ 5"),
        ]);
        assert!(
            table.contains("≤ 5          met") && table.contains("MISSED"),
            "{table}"
        );
        assert!(table.ends_with("targets: 1 met, 1 missed\n"), "{table}");
    }

    #[test]
    fn a_ratio_is_the_value_over_its_baseline() {
        let f = Figure::new("x", 5.0, "u").against(20.0);
        assert_eq!(f.ratio, Some(0.25));
        assert_eq!(Figure::new("x", 5.0, "u").against(0.0).ratio, None);
        let j = to_json(&[f, Figure::new("y", f64::NAN, "ms")], json!({}));
        assert_eq!(j["figures"][0]["ratio"], 0.25);
        assert_eq!(j["figures"][1]["baseline"], serde_json::Value::Null);
        assert_eq!(j["figures"][1]["value"], serde_json::Value::Null);
    }

    #[test]
    fn percentiles_pick_from_the_sorted_values() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 51.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 1.0), 100.0);
        assert!(percentile(&[], 0.5).is_nan());
    }
}
