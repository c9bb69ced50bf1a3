//! The `growth` group (`brood bench --only growth`; not in a default run, it takes minutes):
//! how throughput, claim time and memory grow with children per call, with sessions and with
//! the ledger's size. Each series' baseline is its own first size, so every ratio says how
//! much that figure changed from the smallest case; nothing on a hot path should grow with the
//! ledger's total size.

use std::path::Path;
use std::time::Duration;

use brood::{Brood, Durability, SessionSettings};

use super::engine::{claim_all, fill, open, rss_bytes, throughput, zero_time_call};
use super::Figure;

/// Children per call, with the names of its figures: throughput, one boundary claiming one
/// whole call. (Memory per child is `rss_per_live_child_bytes`, measured in a fresh process:
/// here the allocator's reuse of what earlier sizes freed makes RSS deltas meaningless.)
const PER_CALL: &[(usize, &str, &str)] = &[
    (10, "growth_per_call_10_children_per_s", "growth_per_call_10_claim_ms"),
    (
        100,
        "growth_per_call_100_children_per_s",
        "growth_per_call_100_claim_ms",
    ),
    (
        1_000,
        "growth_per_call_1k_children_per_s",
        "growth_per_call_1k_claim_ms",
    ),
    (
        10_000,
        "growth_per_call_10k_children_per_s",
        "growth_per_call_10k_claim_ms",
    ),
    (
        100_000,
        "growth_per_call_100k_children_per_s",
        "growth_per_call_100k_claim_ms",
    ),
];

/// Sessions the same children (calls of 10) are spread over.
const SESSIONS: &[(usize, &str)] = &[
    (1, "growth_sessions_1_children_per_s"),
    (10, "growth_sessions_10_children_per_s"),
    (100, "growth_sessions_100_children_per_s"),
    (1_000, "growth_sessions_1k_children_per_s"),
    (10_000, "growth_sessions_10k_children_per_s"),
];

/// Delivered child rows already in the ledger, with the names of the figures measured on a
/// fresh session then: throughput, a boundary claiming 1,000 items, the process's RSS (sled's
/// page cache is bounded: `cache_bytes`).
const LEDGER: &[(usize, &str, &str, &str)] = &[
    (
        10_000,
        "growth_ledger_10k_children_per_s",
        "growth_ledger_10k_claim_1k_ms",
        "growth_ledger_10k_rss_bytes",
    ),
    (
        100_000,
        "growth_ledger_100k_children_per_s",
        "growth_ledger_100k_claim_1k_ms",
        "growth_ledger_100k_rss_bytes",
    ),
    (
        1_000_000,
        "growth_ledger_1m_children_per_s",
        "growth_ledger_1m_claim_1k_ms",
        "growth_ledger_1m_rss_bytes",
    ),
];

/// Children each throughput measurement runs (`--quick`: a fifth, and the largest size of the
/// per-call and ledger series left out).
const RUN: usize = 50_000;

/// Each figure against the first of its series.
fn series(figures: Vec<(&'static str, f64, &'static str)>) -> Vec<Figure> {
    let first = figures.first().map(|f| f.1);
    figures
        .into_iter()
        .map(|(name, value, unit)| {
            let f = Figure::new(name, value, unit);
            match first {
                Some(b) => f.against(b),
                None => f,
            }
        })
        .collect()
}

pub(super) async fn growth(dir: &Path, durability: Durability, quick: bool) -> anyhow::Result<Vec<Figure>> {
    let run = if quick { RUN / 5 } else { RUN };
    let mut out = Vec::new();
    // Children per call.
    let (mut thr, mut claim) = (Vec::new(), Vec::new());
    for &(k, thr_name, claim_name) in PER_CALL.iter().filter(|e| !quick || e.0 <= 10_000) {
        let b = open(&dir.join(format!("per-call-{k}")), durability)?;
        let n = run.max(k);
        thr.push((
            thr_name,
            throughput(&b, &["g".to_string()], n / k, k).await?,
            "children/s",
        ));
        claim.push((claim_name, claim_one_call(&b, k).await?, "ms"));
        b.shutdown();
    }
    out.extend(series(thr));
    out.extend(series(claim));
    // Sessions.
    let mut thr = Vec::new();
    for &(s, name) in SESSIONS {
        let b = open(&dir.join(format!("sessions-{s}")), durability)?;
        let ids: Vec<String> = (0..s).map(|i| format!("s{i:05}")).collect();
        thr.push((name, throughput(&b, &ids, (run / 10).max(s), 10).await?, "children/s"));
        b.shutdown();
    }
    out.extend(series(thr));
    // Ledger size: history grows in one session; each measurement runs on a fresh one.
    let (mut thr, mut claim, mut mem) = (Vec::new(), Vec::new(), Vec::new());
    let b = open(&dir.join("ledger"), durability)?;
    let mut history = 0usize;
    for &(rows, thr_name, claim_name, mem_name) in LEDGER.iter().filter(|e| !quick || e.0 <= 100_000) {
        // In rounds of 10,000, so what is measured is the ledger's size, not a backlog's peak.
        while history < rows {
            throughput(&b, &["history".to_string()], 10, 1_000).await?;
            history += 10_000;
        }
        let session = format!("at-{rows}");
        thr.push((
            thr_name,
            throughput(&b, std::slice::from_ref(&session), run / 1_000, 1_000).await?,
            "children/s",
        ));
        let ready = format!("{session}-claim");
        fill(&b, &ready, 1_000).await?;
        claim.push((claim_name, claim_all(&b, &ready).await?.0, "ms"));
        mem.push((mem_name, rss_bytes()? as f64, "bytes"));
    }
    b.shutdown();
    out.extend(series(thr));
    out.extend(series(claim));
    out.extend(series(mem));
    Ok(out)
}

/// One call of `k` zero-time children, all ready, then one boundary claiming them all: the
/// claim's time.
async fn claim_one_call(b: &Brood, k: usize) -> anyhow::Result<f64> {
    let session = "one-call";
    b.open_session(
        session,
        SessionSettings::default()
            .wake(|_| {})
            .max_concurrent_children(u32::try_from(k).unwrap_or(100_000).min(100_000)),
    )
    .await?;
    b.delegate(session, zero_time_call(k)).await.map_err(|e| e.error)?;
    while b.counts(session).await?.ready < k {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (ms, _, items) = claim_all(b, session).await?;
    anyhow::ensure!(items == k, "claimed {items} of {k} items");
    Ok(ms)
}
