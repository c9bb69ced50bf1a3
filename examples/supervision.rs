//! Supervision: a custom runner that heartbeats with partial results, one that panics and one
//! that stalls. The panic fails only its own child; the stalled child is interrupted and keeps
//! its partial result; the unit still goes out whole.
//!
//! Run: `cargo run --example supervision [data-dir]`

use std::time::Duration;

use brood::{Brood, BroodConfig, DelegateRequest, RunContext, RunOutput, Runner, Runners, SessionSettings, TaskSpec};
use futures::future::LocalBoxFuture;
use serde_json::json;

/// Reads `files` files, 50 ms each, reporting progress; `stall_after` makes it go silent.
struct Reader {
    files: u64,
    stall_after: Option<u64>,
    panic_after: Option<u64>,
}

impl Runner for Reader {
    fn run(self: Box<Self>, ctx: RunContext) -> LocalBoxFuture<'static, RunOutput> {
        Box::pin(async move {
            for i in 1..=self.files {
                if self.stall_after == Some(i) {
                    futures::future::pending::<()>().await;
                }
                if self.panic_after == Some(i) {
                    panic!("file {i} is not UTF-8");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                ctx.progress.partial(format!("read {i} of {} files", self.files));
            }
            RunOutput::Succeeded {
                summary: format!("read all {} files", self.files),
                output: None,
            }
        })
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).unwrap_or_else(|| "./brood-example-data".into());
    let mut runners = Runners::builtin();
    runners.register("reader", |spec| {
        let n = |k: &str| spec.get(k).and_then(|v| v.as_u64());
        Ok(Box::new(Reader {
            files: n("files").ok_or("`files` is required")?,
            stall_after: n("stall_after"),
            panic_after: n("panic_after"),
        }) as Box<dyn Runner>)
    });
    let brood = Brood::open(BroodConfig::new(&dir).runners(runners))?;
    brood
        .open_session("supervision", SessionSettings::default().wake(|_| {}))
        .await?;

    let mut tasks = vec![
        TaskSpec::new("read the docs", json!({"kind": "reader", "files": 6})),
        TaskSpec::new(
            "read the tests",
            json!({"kind": "reader", "files": 6, "panic_after": 3}),
        ),
        TaskSpec::new("read the logs", json!({"kind": "reader", "files": 6, "stall_after": 4})),
    ];
    tasks[2].stall_ms = Some(300);
    // One unit: the three results go out together, with an early notice for the panic.
    brood
        .delegate("supervision", DelegateRequest::background(tasks))
        .await?;

    let mut results = 0;
    while results < 3 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Some(envelope) = brood
            .boundary("supervision", "example", Duration::from_secs(30))
            .await?
        {
            println!("{}", envelope.text);
            results += envelope
                .items
                .iter()
                .filter(|i| i.kind == brood::ItemKind::Result)
                .count();
            brood.ack(&envelope.claim_id).await?;
        }
    }
    brood.shutdown();
    Ok(())
}
