//! The hot pieces one at a time, each beside a raw baseline doing the bare minimum of the same
//! job in the same run (DESIGN.md "Speed"; the whole path is `benches/engine.rs` and
//! `brood bench`):
//!
//! - `ledger/record_terminals_1k` (the coalescer's batch: 1,000 terminal child rows, each read
//!   back first, written, one flush) beside `ledger/raw_batch_1k` (1,000 raw values of the same
//!   encoded size in one sled batch, one flush);
//! - `ledger/ack_row_1k` (one ack row naming 1,000 items, flushed) beside the same raw batch;
//! - `router/claim_10k` (the ready set snapshot into one claim: 10,000 items) beside
//!   `router/raw_claim_10k` (taking 10,000 keys out of a set into a vector and marking each in a
//!   map);
//! - `router/ack_10k` beside `router/raw_ack_10k` (marking 10,000 entries of a map).
//!
//! Run: `cargo bench --bench hot_paths`; compare each pair's time per iteration.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use brood_actors::codec;
use brood_actors::ledger::{Durability, Ledger, SledLedger, Writes};
use brood_actors::model::{child_id, dedup_key, AckRow, ChildRow, ChildStatus, DeliveryRow, ItemKind};
use brood_actors::routing::Router;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

const ROWS: usize = 1_000;
const ITEMS: usize = 10_000;

fn terminal_row(call: &str, i: u32) -> ChildRow {
    ChildRow {
        child_id: child_id(call, i),
        call_id: call.to_string(),
        unit_id: format!("{call}-{}", i + 1),
        session_id: "bench".into(),
        task_index: i,
        status: ChildStatus::Succeeded,
        summary: Some("sim: done".into()),
        error: None,
        started_at_ms: Some(1_796_000_000_000),
        finished_at_ms: Some(1_796_000_000_001),
        attempt: 1,
        recovered: false,
        result: DeliveryRow::default(),
        notice: DeliveryRow::default(),
        output: None,
    }
}

/// A fresh ledger (the flush level of the default, fsync) and its folder.
fn ledger() -> (tempfile::TempDir, SledLedger) {
    let dir = tempfile::TempDir::new().expect("tempdir");
    let ledger = SledLedger::open_with(dir.path(), Durability::Fsync).expect("ledger");
    (dir, ledger)
}

fn ledger_paths(c: &mut Criterion) {
    let mut g = c.benchmark_group("ledger");
    g.sample_size(20);
    g.throughput(Throughput::Elements(ROWS as u64));
    let (_dir, l) = ledger();
    let mut round = 0u32;
    g.bench_function("record_terminals_1k", |b| {
        b.iter_batched(
            || {
                round += 1;
                let call = format!("deleg_{round:016x}");
                (0..ROWS as u32).map(|i| terminal_row(&call, i)).collect::<Vec<_>>()
            },
            |rows| {
                l.record_terminals(rows).expect("record");
                l.flush().expect("flush");
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("ack_row_1k", |b| {
        b.iter_batched(
            || {
                round += 1;
                let call = format!("deleg_{round:016x}");
                Writes {
                    acks: vec![AckRow {
                        claim_id: format!("claim_bench_{round}"),
                        session_id: "bench".into(),
                        items: (0..ROWS as u32)
                            .map(|i| dedup_key(&child_id(&call, i), ItemKind::Result))
                            .collect(),
                        acked_at_ms: 1,
                    }],
                    ..Writes::default()
                }
            },
            |w| {
                l.write(&w).expect("write");
                l.flush().expect("flush");
            },
            BatchSize::LargeInput,
        )
    });
    let value = codec::encode(&terminal_row("deleg_0123456789abcdef", 7)).expect("encode");
    let dir = tempfile::TempDir::new().expect("tempdir");
    let db = sled::open(dir.path()).expect("sled");
    let data = std::fs::File::open(dir.path().join("db")).expect("db file");
    g.bench_function("raw_batch_1k", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                round += 1;
                let mut batch = sled::Batch::default();
                for i in 0..ROWS {
                    batch.insert(format!("bench\0deleg_{round:016x}.{i}").into_bytes(), value.clone());
                }
                let start = Instant::now();
                db.apply_batch(batch).expect("batch");
                db.flush().expect("flush");
                data.sync_data().expect("fsync");
                total += start.elapsed();
            }
            total
        })
    });
    g.finish();
}

fn keys(round: u32) -> Vec<String> {
    (0..ITEMS as u32)
        .map(|i| dedup_key(&child_id(&format!("deleg_{round:016x}"), i), ItemKind::Result))
        .collect()
}

fn router_paths(c: &mut Criterion) {
    let mut g = c.benchmark_group("router");
    g.throughput(Throughput::Elements(ITEMS as u64));
    let ready = |round: u32| {
        let mut r: Router<String> = Router::new(8);
        for k in keys(round) {
            r.publish(k, 0, 0);
        }
        r
    };
    g.bench_function("claim_10k", |b| {
        b.iter_batched(
            || ready(1),
            |mut r| r.claim(0, "claim_bench".into(), 60_000).expect("ready items"),
            BatchSize::LargeInput,
        )
    });
    g.bench_function("raw_claim_10k", |b| {
        b.iter_batched(
            || {
                let ks = keys(1);
                let set: BTreeSet<String> = ks.iter().cloned().collect();
                let map: HashMap<String, u32> = ks.into_iter().map(|k| (k, 0)).collect();
                (set, map)
            },
            |(mut set, mut map)| {
                let taken: Vec<String> = std::mem::take(&mut set).into_iter().collect();
                let mut out = Vec::with_capacity(taken.len());
                for k in &taken {
                    if let Some(v) = map.get_mut(k) {
                        *v = 1;
                        out.push((k.clone(), *v));
                    }
                }
                (taken, out, map)
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("ack_10k", |b| {
        b.iter_batched(
            || {
                let mut r = ready(1);
                r.claim(0, "claim_bench".into(), 60_000).expect("ready items");
                r
            },
            |mut r| {
                r.plan_ack("claim_bench").expect("live");
                r.apply_ack("claim_bench")
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("raw_ack_10k", |b| {
        b.iter_batched(
            || {
                let ks = keys(1);
                let map: HashMap<String, u32> = ks.iter().cloned().map(|k| (k, 1)).collect();
                (ks, map)
            },
            |(ks, mut map)| {
                for k in &ks {
                    if let Some(v) = map.get_mut(k) {
                        *v = 2;
                    }
                }
                map
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(benches, ledger_paths, router_paths);
criterion_main!(benches);
