//! The random workload both `brood chaos` and the crash tests drive the engine with: a seeded
//! generator and random calls. A tool, not part of the library: the binary includes it as a
//! module, the crash tests by path.

use brood::{DelegateRequest, TaskSpec};
use serde_json::json;

/// A small deterministic generator (splitmix64): the plan must not depend on anything else.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// A random call of `n` sim children working up to `max_ms` each: about one in twelve fails,
/// a third are grouped (three group names), half may re-run after a crash, and half of the
/// calls complete their ungrouped tasks independently. The chaos worker and the crash test
/// both drive the engine with it.
pub fn random_call(rng: &mut Rng, n: usize, max_ms: u64) -> DelegateRequest {
    let tasks: Vec<TaskSpec> = (0..n)
        .map(|i| {
            let ms = rng.below(max_ms);
            let outcome = if rng.below(12) == 0 { "fail" } else { "ok" };
            let mut t = TaskSpec::new(
                format!("random task {i}"),
                json!({"kind": "sim", "ms": ms, "outcome": outcome}),
            );
            t.stall_ms = Some(1_000);
            if rng.below(3) == 0 {
                t.group = Some(format!("g{}", rng.below(3)));
            }
            t.rerun_on_recovery = rng.below(2) == 0;
            t
        })
        .collect();
    let req = DelegateRequest::background(tasks);
    if rng.below(2) == 0 {
        req.independent()
    } else {
        req
    }
}
