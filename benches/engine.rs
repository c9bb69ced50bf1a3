//! Throughput and latency of the engine against raw sled, as DESIGN.md "Speed" states them:
//! durable end-to-end children/s next to raw flushed sled inserts (the ratio is the target),
//! and the time of one boundary claiming 10,000 ready items.
//!
//! Run: `cargo bench --bench engine` (compare `durable_end_to_end/fsync` with
//! `raw_sled_flushed_inserts`: both report elements per second; `durable_end_to_end/flush` is the
//! same workload with `durability = "flush"`, so the pair gives the cost of fsync).

use std::time::{Duration, Instant};

use brood::{Brood, BroodConfig, DelegateRequest, Durability, SessionSettings, TaskSpec};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use serde_json::json;

const CHILDREN: usize = 1_000;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn raw_sled(c: &mut Criterion) {
    let mut g = c.benchmark_group("ledger");
    g.throughput(Throughput::Elements(CHILDREN as u64));
    g.sample_size(10);
    let row = vec![7u8; 216];
    g.bench_function("raw_sled_flushed_inserts", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let dir = tempfile::TempDir::new().expect("tempdir");
                let db = sled::open(dir.path()).expect("sled");
                let start = Instant::now();
                for i in 0..CHILDREN {
                    db.insert(format!("deleg_0123456789abcdef.{i}"), row.clone())
                        .expect("insert");
                    if i % 100 == 99 {
                        db.flush().expect("flush");
                    }
                }
                db.flush().expect("flush");
                total += start.elapsed();
            }
            total
        })
    });
    g.finish();
}

/// Delegates `n` zero-time children and claims and acks until every result is delivered.
async fn delegate_and_drain(brood: &Brood, n: usize) {
    let tasks = (0..n)
        .map(|i| TaskSpec::new(format!("t{i}"), json!({"kind": "sim"})))
        .collect();
    brood
        .delegate("bench", DelegateRequest::background(tasks).independent())
        .await
        .expect("delegate");
    let mut delivered = 0;
    while delivered < n {
        match brood
            .boundary("bench", "bench", Duration::from_secs(60))
            .await
            .expect("boundary")
        {
            Some(env) => delivered += brood.ack(&env.claim_id).await.expect("ack"),
            None => tokio::time::sleep(Duration::from_micros(200)).await,
        }
    }
}

fn end_to_end(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("durable_end_to_end");
    g.throughput(Throughput::Elements(CHILDREN as u64));
    g.sample_size(10);
    for (name, durability) in [("fsync", Durability::Fsync), ("flush", Durability::Flush)] {
        let dir = tempfile::TempDir::new().expect("tempdir");
        let brood = Brood::open(BroodConfig::new(dir.path()).durability(durability)).expect("open");
        rt.block_on(
            brood.open_session(
                "bench",
                SessionSettings::default()
                    .wake(|_| {})
                    .max_concurrent_children(CHILDREN as u32),
            ),
        )
        .expect("session");
        g.bench_function(name, |b| b.iter(|| rt.block_on(delegate_and_drain(&brood, CHILDREN))));
        brood.shutdown();
    }
    g.finish();
}

fn boundary_10k(c: &mut Criterion) {
    const READY: usize = 10_000;
    let rt = runtime();
    let dir = tempfile::TempDir::new().expect("tempdir");
    let brood = Brood::open(BroodConfig::new(dir.path())).expect("open");
    rt.block_on(brood.open_session(
        "bench",
        SessionSettings::default().wake(|_| {}).max_concurrent_children(2_000),
    ))
    .expect("session");
    let mut g = c.benchmark_group("engine");
    g.sample_size(10);
    g.bench_function("boundary_claiming_10k_ready_items", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                rt.block_on(async {
                    let tasks = (0..READY)
                        .map(|i| TaskSpec::new(format!("t{i}"), json!({"kind": "sim"})))
                        .collect();
                    brood
                        .delegate("bench", DelegateRequest::background(tasks).independent())
                        .await
                        .expect("delegate");
                    while brood.counts("bench").await.expect("status").ready < READY {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    let start = Instant::now();
                    let env = brood
                        .boundary("bench", "bench", Duration::from_secs(60))
                        .await
                        .expect("boundary");
                    total += start.elapsed();
                    let env = env.expect("items are ready");
                    assert_eq!(env.items.len(), READY);
                    brood.ack(&env.claim_id).await.expect("ack");
                });
            }
            total
        })
    });
    g.finish();
    brood.shutdown();
}

criterion_group!(benches, raw_sled, end_to_end, boundary_10k);
criterion_main!(benches);
