//! The `scale` group (`brood bench --only scale --ledger postgres://…`; not in a default run):
//! what a `brood serve --ledger` on a database of many stored sessions costs as it starts and
//! while it idles, at two sizes, the larger one against the smaller. Nothing a process does at
//! its start or at rest should cost in proportion to the sessions in its database.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use brood::{Brood, BroodConfig, DelegateRequest, Durability, SessionSettings, TaskSpec};
use brood_actors::ledger::{Ledger as _, PgLedger, Writes, DEFAULT_SCHEMA};
use brood_actors::model::{now_ms, SessionRow};
use serde_json::json;

use super::http::{agent, ServerProcess};
use super::{pg, Figure};

/// Stored sessions of the two sizes (`--quick`: [`QUICK`]), with the names of their figures:
/// start-up seconds, idle transactions per second, idle rows read and written per second.
const FULL: [(usize, &str, &str, &str); 2] = [
    (
        1_000,
        "scale_start_s_1k",
        "scale_idle_tx_per_s_1k",
        "scale_idle_rows_per_s_1k",
    ),
    (
        100_000,
        "scale_start_s_100k",
        "scale_idle_tx_per_s_100k",
        "scale_idle_rows_per_s_100k",
    ),
];
const QUICK: [usize; 2] = [100, 2_000];

/// Sessions made by an engine, with calls, children, acks and live claims: the rest are idle.
const BUSY: usize = 10;

/// Children of each busy session's call.
const BUSY_CHILDREN: usize = 10;

/// Idle session rows written per commit.
const BATCH: usize = 10_000;

/// How long the idle load is measured.
const IDLE: Duration = Duration::from_secs(10);

/// The longest a start is waited for.
const GIVE_UP: Duration = Duration::from_secs(900);

/// The session tenure of the measured process (`--session-lease-ms`; its default).
const TENURE_MS: u64 = 10_000;

/// For each size: a fresh database of that many stored sessions (see [`stored`]), then a
/// `brood serve --ledger` on it, timed from its spawn until `/readyz` answers 200 naming every
/// session as served, then the database's committed transactions over the next [`IDLE`]
/// (`pg_stat_database.xact_commit` of that database alone, read from another: the process is
/// the only one connected to it), per second. A transaction's count says nothing of its size,
/// so the rows the database read and wrote meanwhile (`tup_returned + tup_fetched +
/// tup_inserted + tup_updated + tup_deleted`), per second, are a figure too. The second size's
/// figures have the first's as their baseline.
pub(super) fn scale(dir: &Path, durability: Durability, url: &str, quick: bool) -> anyhow::Result<Vec<Figure>> {
    let mut figures: Vec<Figure> = Vec::new();
    for (i, (full, start_name, tx_name, rows_name)) in FULL.into_iter().enumerate() {
        let sessions = if quick { QUICK[i] } else { full };
        let db = pg::fresh_database(url)?;
        let here = dir.join(format!("s{sessions}"));
        stored(&here, &db, sessions)?;
        let (start, tx, rows) = measure(&here, durability, url, &db, sessions)?;
        let mut these = vec![
            Figure::new(start_name, start, "s"),
            Figure::new(tx_name, tx, "tx/s"),
            Figure::new(rows_name, rows, "rows/s"),
        ];
        if !figures.is_empty() {
            these = these
                .into_iter()
                .zip(&figures)
                .map(|(this, first)| this.against(first.value))
                .collect();
        }
        figures.extend(these);
    }
    Ok(figures)
}

/// Stores `sessions` sessions in the database `db`: [`BUSY`] of them made by an engine sharing
/// it (each a call of [`BUSY_CHILDREN`] zero-time children, one envelope claimed, and acked in
/// every other session, left live in the rest; the engine then stops cleanly, its tenures given
/// back), the others idle session rows written through the ledger's own API, [`BATCH`] a
/// commit, as the sessions an engine opens are stored.
fn stored(dir: &Path, db: &str, sessions: usize) -> anyhow::Result<()> {
    let busy = BUSY.min(sessions);
    let config = BroodConfig::new(dir.join("maker"))
        .postgres(db)
        .postgres_schema(DEFAULT_SCHEMA)
        .share(pg::node(), pg::ADDRESS, pg::TENURE);
    let b = Brood::open(config)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        for s in 0..busy {
            let id = format!("busy{s}");
            b.open_session(&id, SessionSettings::default().wake(|_| {})).await?;
            let tasks = (0..BUSY_CHILDREN)
                .map(|i| TaskSpec::new(format!("t{i}"), json!({"kind": "sim"})))
                .collect();
            b.delegate(&id, DelegateRequest::background(tasks).independent())
                .await
                .map_err(|e| e.error)?;
            let deadline = Instant::now() + Duration::from_secs(30);
            let envelope = loop {
                if let Some(env) = b.boundary(&id, "bench", Duration::from_secs(3600)).await? {
                    break env;
                }
                anyhow::ensure!(Instant::now() < deadline, "nothing became ready in {id}");
                tokio::time::sleep(Duration::from_millis(5)).await;
            };
            if s % 2 == 0 {
                b.ack(&envelope.claim_id).await?;
            }
        }
        Ok::<_, anyhow::Error>(())
    })?;
    b.shutdown();
    let ledger = PgLedger::open_in(db, DEFAULT_SCHEMA)?;
    let idle: Vec<String> = (busy..sessions).map(|i| format!("idle{i:06}")).collect();
    for batch in idle.chunks(BATCH) {
        let rows = batch
            .iter()
            .map(|id| SessionRow {
                session_id: id.clone(),
                max_concurrent_children: 16,
                max_delivery_attempts: 5,
                next_set: 1,
                created_at_ms: now_ms(),
                addressable: false,
            })
            .collect();
        ledger.write(&Writes {
            sessions: rows,
            ..Writes::default()
        })?;
        ledger.flush()?;
    }
    Ok(())
}

/// Starts `brood serve` on `db` holding `sessions` sessions: the seconds until it is ready
/// with every one served, and the transactions committed and the rows read and written in `db`
/// per second while it idles.
fn measure(
    dir: &Path,
    durability: Durability,
    url: &str,
    db: &str,
    sessions: usize,
) -> anyhow::Result<(f64, f64, f64)> {
    let flags = [
        "--ledger",
        db,
        "--node",
        "scale",
        "--session-lease-ms",
        &TENURE_MS.to_string(),
    ]
    .map(str::to_string);
    let started = Instant::now();
    let (mut server, base) = ServerProcess::start(&dir.join("serve"), durability, &flags)?;
    let http = agent(Duration::from_secs(30));
    loop {
        let ready = http
            .get(&format!("{base}/readyz"))
            .call()
            .ok()
            .filter(|r| r.status() == 200);
        if let Some(mut reply) = ready {
            let health: serde_json::Value = serde_json::from_str(&reply.body_mut().read_to_string()?)?;
            if health["sessions"].as_u64() == Some(sessions as u64) {
                break;
            }
        }
        if let Some(status) = server.0.try_wait()? {
            bail!("brood serve exited with {status} before it was ready");
        }
        anyhow::ensure!(
            started.elapsed() < GIVE_UP,
            "brood serve was not ready with {sessions} sessions in {GIVE_UP:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let start = started.elapsed().as_secs_f64();
    let name = database_name(db)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let idle = rt.block_on(async {
        let client = pg::connect(url).await?;
        let committed = || async {
            let row = client
                .query_one(
                    "SELECT xact_commit, tup_returned + tup_fetched + tup_inserted + tup_updated + tup_deleted
                     FROM pg_stat_database WHERE datname = $1",
                    &[&name],
                )
                .await?;
            Ok::<_, anyhow::Error>((Instant::now(), row.get::<_, i64>(0), row.get::<_, i64>(1)))
        };
        // What the start committed reaches the statistics first (a backend reports them when
        // idle, at most once a second).
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (t0, c0, r0) = committed().await?;
        tokio::time::sleep(IDLE).await;
        let (t1, c1, r1) = committed().await?;
        let seconds = (t1 - t0).as_secs_f64();
        Ok::<_, anyhow::Error>(((c1 - c0) as f64 / seconds, (r1 - r0) as f64 / seconds))
    })?;
    drop(server);
    Ok((start, idle.0, idle.1))
}

/// The database named in a `postgres://…/<name>` address.
fn database_name(url: &str) -> anyhow::Result<String> {
    let path = url.split_once('?').map_or(url, |(head, _)| head);
    let name = path
        .rsplit_once('/')
        .map(|(_, n)| n)
        .context("no database in the address")?;
    anyhow::ensure!(!name.is_empty() && !name.contains(':'), "no database in {url}");
    Ok(name.to_string())
}
