//! The engine's figures: each opens its own engine over a scratch folder, drives one workload
//! and returns what it measured.

use std::io::Read as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use brood::{Brood, BroodConfig, DelegateRequest, Durability, SessionSettings, TaskSpec};
use serde_json::json;

use super::{pg, Figure, Options, Traces, CALL};

/// The engine over the ledger "in" `dir`: the sled folder `dir`, or with `--ledger` the
/// schema of its own that `dir` names on that database, shared as `brood serve --ledger`
/// shares it.
pub(super) fn open(dir: &Path, durability: Durability) -> anyhow::Result<Brood> {
    let mut config = BroodConfig::new(dir).durability(durability);
    if let Some(url) = pg::url() {
        config = config
            .postgres(url)
            .postgres_schema(pg::schema_for(dir))
            .share(pg::node(), pg::ADDRESS, pg::TENURE);
    }
    if let Some(n) = ROUTING_THREADS.get().copied().flatten() {
        config = config.routing_threads(n);
    }
    Ok(Brood::open(config)?)
}

/// The routing threads of the engines measured.
pub(super) fn routing_threads() -> usize {
    ROUTING_THREADS
        .get()
        .copied()
        .flatten()
        .unwrap_or_else(brood::default_routing_threads)
}

/// `--routing-threads`, set once at the start of a run.
pub(super) static ROUTING_THREADS: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();

/// Opens a wake-capable session whose wakes are sent down `tx`.
async fn woken_session(
    b: &Brood,
    session: &str,
    capacity: u32,
    tx: tokio::sync::mpsc::UnboundedSender<String>,
) -> anyhow::Result<()> {
    b.open_session(
        session,
        SessionSettings::default()
            .max_concurrent_children(capacity)
            .wake(move |ev: brood::WakeEvent| {
                let _ = tx.send(ev.session_id);
            }),
    )
    .await?;
    Ok(())
}

pub(super) fn zero_time_call(n: usize) -> DelegateRequest {
    let tasks = (0..n)
        .map(|i| TaskSpec::new(format!("t{i}"), json!({"kind": "sim"})))
        .collect();
    DelegateRequest::background(tasks).independent()
}

/// Claims and acks in the sessions it is woken for until `n` items were delivered; a quiet
/// spell of 50 ms sweeps every session (a wake is never lost, but this costs nothing). Each
/// envelope is handed to `seen`.
async fn consume(
    b: &Brood,
    sessions: &[String],
    mut wakes: tokio::sync::mpsc::UnboundedReceiver<String>,
    n: usize,
    mut seen: impl FnMut(&brood::Envelope),
) -> anyhow::Result<()> {
    let mut delivered = 0;
    let lease = Duration::from_secs(300);
    while delivered < n {
        let due: Vec<String> = match tokio::time::timeout(Duration::from_millis(50), wakes.recv()).await {
            Ok(Some(s)) => vec![s],
            Ok(None) => bail!("the wake channel closed"),
            Err(_) => sessions.to_vec(),
        };
        for s in due {
            if let Some(env) = b.boundary(&s, "bench", lease).await? {
                seen(&env);
                delivered += b.ack(&env.claim_id).await?;
            }
        }
    }
    Ok(())
}

/// `calls` calls of `per_call` zero-time children over `sessions` (round-robin), delegated
/// while a woken consumer claims and acks; the children per second from the first delegate to
/// the last ack.
pub(super) async fn throughput(b: &Brood, sessions: &[String], calls: usize, per_call: usize) -> anyhow::Result<f64> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let capacity = u32::try_from(per_call.max(CALL) * 4).unwrap_or(100_000).min(100_000);
    for s in sessions {
        woken_session(b, s, capacity, tx.clone()).await?;
    }
    let n = calls * per_call;
    let start = Instant::now();
    let produce = async {
        for i in 0..calls {
            b.delegate(&sessions[i % sessions.len()], zero_time_call(per_call))
                .await
                .map_err(|e| e.error)?;
        }
        Ok::<_, anyhow::Error>(())
    };
    let (p, c) = tokio::join!(produce, consume(b, sessions, rx, n, |_| {}));
    p?;
    c?;
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// Rounds of the durable figure: the engine and the raw baseline take turns, so a spell of
/// noise on a shared machine lands on both rather than on one of them.
const DURABLE_ROUNDS: usize = 3;

/// `n` children through the engine against `n` raw inserts (with `--ledger`: `n` jobs through
/// a plain SKIP LOCKED queue on the same database, [`pg::queue`], with a worker per routing
/// thread), in [`DURABLE_ROUNDS`] alternating rounds (each on folders or schemas of its own);
/// the medians of the rounds.
pub(super) async fn durable(dir: &Path, durability: Durability, n: usize) -> anyhow::Result<(Figure, Figure)> {
    let per_round = n.div_ceil(DURABLE_ROUNDS);
    let (mut engine, mut raw, mut row) = (Vec::new(), Vec::new(), 0);
    for round in 0..DURABLE_ROUNDS {
        let ledger = dir.join(format!("ledger-{round}"));
        let b = open(&ledger, durability)?;
        engine.push(throughput(&b, &["bench".to_string()], per_round.div_ceil(CALL), CALL).await?);
        b.shutdown();
        match pg::url() {
            Some(url) => {
                row = pg::mean_row_len(url, &pg::schema_for(&ledger), "children").await?;
                let queue = pg::schema_for(&dir.join(format!("queue-{round}")));
                raw.push(pg::queue(url, &queue, per_round, row, routing_threads().max(1)).await?);
            }
            None => {
                row = mean_row_len(&ledger, "children")?;
                raw.push(raw_sled_inserts(
                    &dir.join(format!("raw-{round}")),
                    per_round,
                    row,
                    durability,
                )?);
            }
        }
    }
    let target = if pg::url().is_some() {
        "ratio ≥ 1.3"
    } else {
        "ratio ≥ 0.6"
    };
    Ok((
        Figure::new("durable_children_per_s", median(engine), "children/s")
            .against(median(raw))
            .target(target),
        Figure::new("durable_row_bytes", row as f64, "bytes"),
    ))
}

/// The median of some measurements.
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    percentile(&xs, 0.5)
}

/// The mean length of the values of a tree in a closed ledger folder.
fn mean_row_len(dir: &Path, tree: &str) -> anyhow::Result<usize> {
    // sled releases a closed folder's lock from a background thread moments later: waited
    // out, as the ledger's own open does.
    let started = Instant::now();
    let db = loop {
        match sled::open(dir) {
            Err(e)
                if e.to_string().contains("could not acquire lock")
                    && started.elapsed() < brood_actors::ledger::LOCK_WAIT =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            opened => break opened.context("opening the ledger to size its rows")?,
        }
    };
    let t = db.open_tree(tree)?;
    let (mut n, mut bytes) = (0usize, 0usize);
    for kv in t.iter() {
        let (_, v) = kv?;
        n += 1;
        bytes += v.len();
    }
    bytes
        .checked_div(n)
        .with_context(|| format!("the ledger in {} holds no rows in `{tree}` to size", dir.display()))
}

/// Raw sled: `n` inserts of `row`-byte values, flushed every 100 (and the data file synced, for
/// `fsync`); rows per second.
fn raw_sled_inserts(dir: &Path, n: usize, row: usize, durability: Durability) -> anyhow::Result<f64> {
    let db = sled::open(dir)?;
    let value = vec![7u8; row];
    let data = std::fs::File::open(dir.join("db")).ok();
    let sync = |db: &sled::Db| -> anyhow::Result<()> {
        db.flush()?;
        if durability == Durability::Fsync {
            if let Some(f) = &data {
                f.sync_data()?;
            }
        }
        Ok(())
    };
    let start = Instant::now();
    for i in 0..n {
        db.insert(format!("deleg_0123456789abcdef.{i}"), value.clone())?;
        if i % 100 == 99 {
            sync(&db)?;
        }
    }
    sync(&db)?;
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

pub(super) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn now_ms_f64() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

/// Calls of 100 zero-time children every 10 ms (10,000/s offered) for `secs`; a woken consumer
/// claims at once. Latency: the claim's moment minus each item's `finished_at`.
pub(super) async fn latency(
    dir: &Path,
    durability: Durability,
    secs: u64,
    traces: &mut Traces,
) -> anyhow::Result<Vec<Figure>> {
    const PER_TICK: usize = 100;
    let b = open(&dir.join("ledger"), durability)?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    woken_session(&b, "lat", 100_000, tx).await?;
    // When each child's end was applied (its item claimable, for these one-child units): the
    // owner stamps the event as it applies the recorded row and publishes the item.
    let mut events = b.subscribe("lat").await?;
    let ticks = (secs * 100) as usize;
    let n = ticks * PER_TICK;
    let start = Instant::now();
    let produce = async {
        let mut every = tokio::time::interval(Duration::from_millis(10));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        for _ in 0..ticks {
            every.tick().await;
            b.delegate("lat", zero_time_call(PER_TICK)).await.map_err(|e| e.error)?;
        }
        Ok::<_, anyhow::Error>(())
    };
    let mut claimed_after = Vec::with_capacity(n);
    let mut finished: Vec<(String, u64)> = Vec::with_capacity(n);
    let mut buckets: Vec<u32> = Vec::new();
    let sessions = ["lat".to_string()];
    let done = std::cell::Cell::new(false);
    let consumer = async {
        let res = consume(&b, &sessions, rx, n, |env| {
            let now = now_ms_f64();
            let bucket = (start.elapsed().as_millis() / 100) as usize;
            if buckets.len() <= bucket {
                buckets.resize(bucket + 1, 0);
            }
            buckets[bucket] += env.items.len() as u32;
            for item in &env.items {
                if let Some(f) = item.finished_at_ms {
                    claimed_after.push((now - f as f64).max(0.0));
                    finished.push((item.child_id.clone(), f));
                }
            }
        })
        .await;
        done.set(true);
        res
    };
    let watch = async {
        let mut applied: std::collections::HashMap<String, u64> = std::collections::HashMap::with_capacity(n);
        let mut missed = 0u64;
        while !done.get() {
            match tokio::time::timeout(Duration::from_millis(20), events.recv()).await {
                Ok(Ok(ev)) => {
                    if let brood::Event::Child { child_id, status, .. } = &ev.event {
                        if status.is_terminal() {
                            applied.insert(child_id.clone(), ev.at_ms);
                        }
                    }
                }
                Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(k))) => missed += k,
                Ok(Err(tokio::sync::broadcast::error::RecvError::Closed)) => break,
                Err(_) => {}
            }
        }
        (applied, missed)
    };
    let (p, c, (applied, missed)) = tokio::join!(produce, consumer, watch);
    p?;
    c?;
    let took = start.elapsed().as_secs_f64();
    b.shutdown();
    let mut latencies: Vec<f64> = finished
        .iter()
        .filter_map(|(id, f)| applied.get(id).map(|&at| at.saturating_sub(*f) as f64))
        .collect();
    anyhow::ensure!(
        latencies.len() * 100 >= finished.len() * 99,
        "the event stream lost {missed} events: only {} of {} children's ends were seen applied",
        latencies.len(),
        finished.len()
    );
    latencies.sort_by(|a, b| a.total_cmp(b));
    claimed_after.sort_by(|a, b| a.total_cmp(b));
    let figures = vec![
        Figure::new("claimable_latency_p50_ms", percentile(&latencies, 0.5), "ms"),
        Figure::new("claimable_latency_p99_ms", percentile(&latencies, 0.99), "ms").target("≤ 5"),
        Figure::new(
            "claimable_latency_max_ms",
            latencies.last().copied().unwrap_or(f64::NAN),
            "ms",
        ),
        Figure::new("claimed_latency_p50_ms", percentile(&claimed_after, 0.5), "ms"),
        Figure::new("claimed_latency_p99_ms", percentile(&claimed_after, 0.99), "ms"),
        Figure::new("latency_run_children_per_s", n as f64 / took, "children/s").against(10_000.0),
    ];
    traces.latencies = latencies;
    traces.throughput = buckets;
    Ok(figures)
}

/// One boundary claiming `n` ready items, and its ack, for each size.
pub(super) async fn claims(dir: &Path, durability: Durability, sizes: &[usize]) -> anyhow::Result<Vec<Figure>> {
    let b = open(&dir.join("ledger"), durability)?;
    b.open_session(
        "claims",
        SessionSettings::default().wake(|_| {}).max_concurrent_children(10_000),
    )
    .await?;
    let mut out = Vec::new();
    for &n in sizes {
        for _ in 0..n.div_ceil(CALL) {
            b.delegate("claims", zero_time_call(CALL.min(n)))
                .await
                .map_err(|e| e.error)?;
        }
        let want = n.div_ceil(CALL) * CALL.min(n);
        while b.counts("claims").await?.ready < want {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (claim, ack, _) = claim_all(&b, "claims").await?;
        let (claim_name, ack_name, target) = match n {
            1_000 => ("claim_1k_ms", "ack_1k_ms", None),
            10_000 => ("claim_10k_ms", "ack_10k_ms", Some("≤ 20")),
            _ => ("claim_100k_ms", "ack_100k_ms", None),
        };
        let mut c = Figure::new(claim_name, claim, "ms");
        if let Some(t) = target {
            c = c.target(t);
        }
        out.push(c);
        out.push(Figure::new(ack_name, ack, "ms"));
    }
    b.shutdown();
    Ok(out)
}

/// One boundary claiming every item ready in `session`, then its ack: the claim's and the
/// ack's times in ms, and the items claimed.
pub(super) async fn claim_all(b: &Brood, session: &str) -> anyhow::Result<(f64, f64, usize)> {
    let start = Instant::now();
    let env = b
        .boundary(session, "bench", Duration::from_secs(600))
        .await?
        .context("items were ready")?;
    let claim = start.elapsed().as_secs_f64() * 1000.0;
    let start = Instant::now();
    b.ack(&env.claim_id).await?;
    Ok((claim, start.elapsed().as_secs_f64() * 1000.0, env.items.len()))
}

/// A ledger of `n` recorded, undelivered children written by the engine; then the time to open
/// and recover it until its session answers with every item ready, against raw sled opening
/// a copy of the same folder and reading every tree. Each opens the folder as the writer left
/// it: the first open of a folder replays sled's log (a later one finds the snapshot the first
/// wrote), so one folder opened twice would favour whichever came second.
///
/// With `--ledger`: the engine reopens its schema (the same node, so it takes its sessions
/// back at once), against a fresh connection reading every row of every table of that schema.
pub(super) async fn recovery(dir: &Path, durability: Durability, n: usize) -> anyhow::Result<Figure> {
    let ledger = dir.join("ledger");
    fill_ledger(&ledger, durability, "rec", n).await?;
    if let Some(url) = pg::url() {
        let start = Instant::now();
        let b = open(&ledger, durability)?;
        b.open_session("rec", SessionSettings::default().wake(|_| {})).await?;
        let ready = b.counts("rec").await?.ready;
        let took = start.elapsed().as_secs_f64();
        b.shutdown();
        anyhow::ensure!(ready >= n, "recovery found {ready} ready items of {n}");
        let (rows, raw) = pg::scan(url, &pg::schema_for(&ledger)).await?;
        anyhow::ensure!(rows >= n, "the raw scan read {rows} rows, fewer than the {n} children");
        return Ok(Figure::new("recovery_s", took, "s").against(raw).target("ratio ≤ 2"));
    }
    let copy = dir.join("ledger-raw");
    crate::inspect::copy_tree(&ledger, &copy)?;
    let start = Instant::now();
    let b = open(&ledger, durability)?;
    b.open_session("rec", SessionSettings::default().wake(|_| {})).await?;
    let ready = b.counts("rec").await?.ready;
    let took = start.elapsed().as_secs_f64();
    b.shutdown();
    anyhow::ensure!(ready >= n, "recovery found {ready} ready items of {n}");
    let start = Instant::now();
    let db = sled::open(&copy)?;
    let mut rows = 0usize;
    for name in db.tree_names() {
        for kv in db.open_tree(name)?.iter() {
            let (k, v) = kv?;
            rows += usize::from(!k.is_empty() || !v.is_empty());
        }
    }
    let raw = start.elapsed().as_secs_f64();
    drop(db);
    std::fs::remove_dir_all(&copy)?;
    anyhow::ensure!(rows >= n, "the raw scan read {rows} rows, fewer than the {n} children");
    Ok(Figure::new("recovery_s", took, "s").against(raw).target("ratio ≤ 2"))
}

/// Children of the session whose owner the `rebuild` group restarts.
const REBUILT: usize = 10_000;
/// Sessions probing, each with its own loop, while it is rebuilt.
const PROBES: usize = 4;

/// The longest extra delay other sessions see while one owner is rebuilt in a ledger of `n`
/// child rows. The ledger: the recovery group's (`n` ready children in one session), or one
/// built alike; a session of [`REBUILT`] ready children is added and its owner restarted
/// ([`brood::BroodHandle::restart_owner`]: rebuilt from its own rows). Meanwhile [`PROBES`] other sessions
/// each loop: delegate one zero-time child, claim its result, ack. The figure is the longest
/// probe cycle that overlapped the rebuild minus the median cycle of the quiet second before.
pub(super) async fn rebuild(
    dir: &Path,
    durability: Durability,
    n: usize,
    built: Option<&Path>,
) -> anyhow::Result<Vec<Figure>> {
    let ledger = match built {
        Some(path) => path.to_path_buf(),
        None => {
            let path = dir.join("ledger");
            fill_ledger(&path, durability, "rec", n).await?;
            path
        }
    };
    let b = open(&ledger, durability)?;
    b.open_session("rec", SessionSettings::default().wake(|_| {})).await?;
    fill(&b, "rebuilt", REBUILT).await?;
    let probes: Vec<String> = (0..PROBES).map(|i| format!("probe-{i}")).collect();
    for p in &probes {
        b.open_session(p, SessionSettings::default().wake(|_| {})).await?;
    }
    let stop = std::cell::Cell::new(false);
    let cycles: std::cell::RefCell<Vec<(Instant, Duration)>> = Default::default();
    let probe = |session: &str| {
        let (stop, cycles, b) = (&stop, &cycles, &b);
        let session = session.to_string();
        async move {
            while !stop.get() {
                let start = Instant::now();
                b.delegate(&session, zero_time_call(1)).await.map_err(|e| e.error)?;
                let env = loop {
                    if let Some(env) = b.boundary(&session, "probe", Duration::from_secs(60)).await? {
                        break env;
                    }
                    tokio::time::sleep(Duration::from_micros(200)).await;
                };
                b.ack(&env.claim_id).await?;
                cycles.borrow_mut().push((start, start.elapsed()));
            }
            Ok::<_, anyhow::Error>(())
        }
    };
    let quiet_from = Instant::now();
    let mut window = (quiet_from, quiet_from);
    let drive = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let from = Instant::now();
        b.restart_owner("rebuilt").await?;
        window = (from, Instant::now());
        // The probe cycles that began during the rebuild end on their own.
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.set(true);
        Ok::<_, anyhow::Error>(())
    };
    let runs = futures::future::join_all(probes.iter().map(|p| probe(p)));
    let (d, results) = tokio::join!(drive, runs);
    d?;
    for r in results {
        r?;
    }
    let ready = b.counts("rebuilt").await?.ready;
    anyhow::ensure!(
        ready == REBUILT,
        "the rebuilt owner holds {ready} of {REBUILT} ready items"
    );
    b.shutdown();
    let cycles = cycles.into_inner();
    let (from, to) = window;
    let mut quiet: Vec<f64> = cycles
        .iter()
        .filter(|(start, took)| *start + *took < from && *start >= quiet_from)
        .map(|(_, took)| took.as_secs_f64() * 1000.0)
        .collect();
    quiet.sort_by(|a, b| a.total_cmp(b));
    let during = cycles
        .iter()
        .filter(|(start, took)| *start < to && *start + *took > from)
        .map(|(_, took)| took.as_secs_f64() * 1000.0)
        .fold(f64::NAN, f64::max);
    anyhow::ensure!(
        !quiet.is_empty() && during.is_finite(),
        "no probe cycle overlapped the rebuild"
    );
    let median = percentile(&quiet, 0.5);
    Ok(vec![
        Figure::new("rebuild_stall_ms", (during - median).max(0.0), "ms").target("≤ 10"),
        Figure::new("rebuild_ms", (to - from).as_secs_f64() * 1000.0, "ms"),
        Figure::new("rebuild_probe_cycle_p50_ms", median, "ms"),
    ])
}

/// Delegates `n` zero-time children to a new session and waits until all are ready.
pub(super) async fn fill(b: &Brood, session: &str, n: usize) -> anyhow::Result<()> {
    b.open_session(
        session,
        SessionSettings::default().wake(|_| {}).max_concurrent_children(10_000),
    )
    .await?;
    for _ in 0..n.div_ceil(CALL) {
        b.delegate(session, zero_time_call(CALL)).await.map_err(|e| e.error)?;
    }
    while b.counts(session).await?.ready < n.div_ceil(CALL) * CALL {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// A closed ledger of `n` recorded, undelivered children in `session`.
async fn fill_ledger(path: &Path, durability: Durability, session: &str, n: usize) -> anyhow::Result<()> {
    let b = open(path, durability)?;
    fill(&b, session, n).await?;
    b.shutdown();
    Ok(())
}

/// Set in the environment of the process `rss_in_child` starts.
pub(super) const RSS_CHILD: &str = "BROOD_BENCH_RSS_CHILD";

/// Runs the `rss` group in a fresh `brood bench` process and takes its figure, for calls of
/// one unit per call (`grouped`: the default call shape) or one unit per child.
pub(super) fn rss_in_child(dir: &Path, opts: &Options, grouped: bool) -> anyhow::Result<Figure> {
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(["bench", "--json", "--only", "rss", "--durability"])
        .arg(opts.durability.to_string())
        .args(opts.ledger.iter().flat_map(|url| ["--ledger", url.as_str()]))
        .arg("--data-dir")
        .arg(dir)
        .env(RSS_CHILD, if grouped { "grouped" } else { "independent" })
        .stderr(std::process::Stdio::inherit());
    if opts.quick {
        cmd.arg("--quick");
    }
    if let Some(n) = opts.routing_threads {
        cmd.arg("--routing-threads").arg(n.to_string());
    }
    let out = cmd.output().context("starting the rss measurement")?;
    anyhow::ensure!(out.status.success(), "the rss measurement failed ({})", out.status);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).context("reading the rss measurement")?;
    let name = rss_figure_name(grouped);
    let value = report["figures"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["name"] == name))
        .and_then(|f| f["value"].as_f64())
        .context("the rss measurement printed no figure")?;
    Ok(rss_figure(grouped, value))
}

/// The memory figure for `bytes` per live child: the default call shape's carries the target.
fn rss_figure(grouped: bool, bytes: f64) -> Figure {
    let figure = Figure::new(rss_figure_name(grouped), bytes, "bytes");
    if grouped {
        figure.target("≤ 2048")
    } else {
        figure
    }
}

/// `rss_per_live_child_bytes` for calls in the default shape (one unit per call), and
/// `rss_per_live_child_independent_bytes` for calls of independent completions (a unit actor
/// per child).
fn rss_figure_name(grouped: bool) -> &'static str {
    if grouped {
        "rss_per_live_child_bytes"
    } else {
        "rss_per_live_child_independent_bytes"
    }
}

/// This process's resident set, in bytes.
pub(super) fn rss_bytes() -> anyhow::Result<u64> {
    let mut s = String::new();
    std::fs::File::open("/proc/self/statm")?.read_to_string(&mut s)?;
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .context("/proc/self/statm has no resident field")?
        .parse()?;
    Ok(pages * 4096)
}

/// RSS growth per running child with `n` children live (hanging sim children, which only the
/// shutdown ends).
pub(super) async fn rss(dir: &Path, durability: Durability, n: usize, grouped: bool) -> anyhow::Result<Figure> {
    let b = open(&dir.join("ledger"), durability)?;
    let cap = u32::try_from(n).unwrap_or(100_000).min(100_000);
    b.open_session(
        "live",
        SessionSettings::default().wake(|_| {}).max_concurrent_children(cap),
    )
    .await?;
    // Warm the engine's paths first, so their one-time allocations are not counted.
    b.delegate("live", zero_time_call(100)).await.map_err(|e| e.error)?;
    while b.counts("live").await?.ready < 100 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let before = rss_bytes()?;
    for start in (0..n).step_by(CALL) {
        let tasks = (start..(start + CALL).min(n))
            .map(|i| {
                let mut t = TaskSpec::new(format!("live {i}"), json!({"kind": "sim", "outcome": "hang"}));
                t.stall_ms = Some(86_400_000);
                t.rerun_on_recovery = true;
                t
            })
            .collect();
        let call = DelegateRequest::background(tasks);
        b.delegate("live", if grouped { call } else { call.independent() })
            .await
            .map_err(|e| e.error)?;
    }
    while b.counts("live").await?.running < n {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Admitted is not yet started: the child actors and runner tasks come up on their own
    // thread. Wait until the resident set stops growing (within 1% over 300 ms).
    let mut after = rss_bytes()?;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = rss_bytes()?;
        if now <= after + after / 100 {
            after = after.max(now);
            break;
        }
        after = now;
    }
    b.shutdown();
    Ok(rss_figure(grouped, after.saturating_sub(before) as f64 / n as f64))
}

/// The same children in 1,000 sessions and in one (same calls, same consumer).
pub(super) async fn sessions(dir: &Path, durability: Durability, n: usize) -> anyhow::Result<Figure> {
    const SESSIONS: usize = 1_000;
    let per_call = (n / SESSIONS).max(1);
    let b = open(&dir.join("one"), durability)?;
    let one = throughput(&b, &["one".to_string()], SESSIONS, per_call).await?;
    b.shutdown();
    let b = open(&dir.join("many"), durability)?;
    let ids: Vec<String> = (0..SESSIONS).map(|i| format!("s{i:04}")).collect();
    let many = throughput(&b, &ids, SESSIONS, per_call).await?;
    b.shutdown();
    Ok(Figure::new("sessions_1000_ratio", many / one, "ratio").target("≥ 0.8"))
}
