//! Fan-out: a parent delegates five children in the background, keeps working, and takes their
//! results at its turn boundaries, woken by brood when something is ready.
//!
//! Run: `cargo run --example fan_out [data-dir]`

use std::sync::Arc;
use std::time::Duration;

use brood::{Brood, BroodConfig, DelegateRequest, SessionSettings, TaskSpec, Turn};
use serde_json::json;
use tokio::sync::Notify;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).unwrap_or_else(|| "./brood-example-data".into());
    let brood = Brood::open(BroodConfig::new(&dir))?;
    let woken = Arc::new(Notify::new());
    let notify = woken.clone();
    brood
        .open_session("fan-out", SessionSettings::default().wake(move |_| notify.notify_one()))
        .await?;

    let tasks = (1..=5)
        .map(|i| TaskSpec::new(format!("review file {i}"), json!({"kind": "sim", "ms": i * 150})))
        .collect();
    let reply = brood
        .delegate("fan-out", DelegateRequest::background(tasks).independent())
        .await?;
    println!("{}\n", reply.note());

    let mut delivered = 0;
    while delivered < 5 {
        // The parent ends its turn and waits to be woken (a timeout covers a missed wake).
        brood.set_turn("fan-out", Turn::Idle).await?;
        let _ = tokio::time::timeout(Duration::from_secs(2), woken.notified()).await;
        brood.set_turn("fan-out", Turn::Busy).await?;
        if let Some(envelope) = brood.boundary("fan-out", "example", Duration::from_secs(30)).await? {
            println!("{}", envelope.text);
            delivered += brood.ack(&envelope.claim_id).await?;
        }
    }
    brood.shutdown();
    Ok(())
}
