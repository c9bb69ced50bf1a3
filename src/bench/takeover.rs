//! The takeover figure (with `--ledger` only): how long a session whose process died stays
//! unanswered by the other process sharing its database.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use brood::Durability;
use serde_json::json;

use super::http::{agent, send, ServerProcess};
use super::{pg, Figure};

/// The session tenure of both processes (`--session-lease-ms`).
const TENURE_MS: u64 = 2_000;

/// Children delegated to the session before its process is killed.
const CHILDREN: usize = 100;

/// The longest the takeover is waited for.
const GIVE_UP: Duration = Duration::from_secs(60);

/// Two `brood serve --ledger <fresh database> --node a|b --session-lease-ms 2000`; a session
/// opened through a, children delegated to it (one boundary claimed and acked through b,
/// forwarded to a, to see the route work), more delegated, then a killed with SIGKILL. The
/// figure: from the kill until a boundary of that session through b answers 200 or 204 (it
/// answers 503 `session_moved` while it still forwards to the dead a). Baseline: the tenure.
/// (The tenure runs from a's last renewal, every third of it, or its last commit, which may
/// be moments before the kill: the figure can be under the tenure.)
pub(super) fn takeover(dir: &Path, durability: Durability, url: &str) -> anyhow::Result<Figure> {
    let db = pg::fresh_database(url)?;
    let start = |node: &str| {
        let flags = [
            "--ledger",
            db.as_str(),
            "--node",
            node,
            "--session-lease-ms",
            &TENURE_MS.to_string(),
        ]
        .map(str::to_string);
        ServerProcess::start(&dir.join(node), durability, &flags)
    };
    let (mut a, base_a) = start("a")?;
    let (mut b, base_b) = start("b")?;
    let http = agent(Duration::from_secs(30));
    a.wait_healthy(&http, &base_a)?;
    b.wait_healthy(&http, &base_b)?;
    let session = "takeover";
    let (status, reply) = send(
        &http,
        "PUT",
        &format!("{base_a}/v1/sessions/{session}"),
        &json!({"addressable": true, "max_concurrent_children": CHILDREN}),
    )?;
    anyhow::ensure!(status == 200, "PUT session through a answered {status}: {reply}");
    let tasks: Vec<serde_json::Value> = (0..CHILDREN)
        .map(|i| json!({"goal": format!("t{i}"), "runner": {"kind": "sim"}}))
        .collect();
    let delegate = json!({"tasks": tasks, "independent_completions": true});
    let boundary = json!({"consumer": "bench", "lease_ms": 60_000});
    let (status, reply) = send(
        &http,
        "POST",
        &format!("{base_a}/v1/sessions/{session}/delegate"),
        &delegate,
    )?;
    anyhow::ensure!(status == 202, "delegate through a answered {status}: {reply}");
    // Through b, forwarded to a, until something was claimed.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, env) = send(
            &http,
            "POST",
            &format!("{base_b}/v1/sessions/{session}/boundary"),
            &boundary,
        )?;
        match status {
            200 => {
                let claim = env["claim_id"].as_str().context("an envelope has a claim id")?;
                let (status, acked) = send(&http, "POST", &format!("{base_b}/v1/claims/{claim}/ack"), &json!({}))?;
                anyhow::ensure!(status == 200, "ack through b answered {status}: {acked}");
                break;
            }
            204 if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            s => bail!("a boundary through b, before the kill, answered {s}: {env}"),
        }
    }
    let (status, reply) = send(
        &http,
        "POST",
        &format!("{base_a}/v1/sessions/{session}/delegate"),
        &delegate,
    )?;
    anyhow::ensure!(
        status == 202,
        "the second delegate through a answered {status}: {reply}"
    );
    std::thread::sleep(Duration::from_millis(50));
    // SIGKILL: nothing of a's lets go of its tenures.
    a.0.kill().context("killing a")?;
    let killed = Instant::now();
    a.0.wait()?;
    let quick = agent(Duration::from_secs(10));
    let mut moved = 0usize;
    let took = loop {
        let (status, env) = send(
            &quick,
            "POST",
            &format!("{base_b}/v1/sessions/{session}/boundary"),
            &boundary,
        )?;
        match status {
            200 | 204 => break killed.elapsed(),
            503 if killed.elapsed() < GIVE_UP => {
                moved += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            s => bail!("a boundary through b after the kill answered {s}: {env}"),
        }
    };
    drop(b);
    if moved == 0 {
        eprintln!("brood bench: note: takeover: b never answered 503 after the kill");
    }
    Ok(Figure::new("takeover_s", took.as_secs_f64(), "s")
        .against(TENURE_MS as f64 / 1000.0)
        .target("≤ tenure + 1 s (3 s)"))
}
