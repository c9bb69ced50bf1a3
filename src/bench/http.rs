//! The HTTP figure: the durable workload through this binary's `brood serve`; and the child
//! `brood serve` processes the HTTP groups start.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use brood::Durability;
use serde_json::json;

use super::{pg, Figure, CALL};

/// The durable workload over HTTP: this binary's `brood serve` on a free loopback port (with
/// `--ledger`, on a fresh database of that server, as a node of its own).
pub(super) fn http(dir: &Path, durability: Durability, n: usize, embedded: Option<f64>) -> anyhow::Result<Figure> {
    let mut extra = Vec::new();
    if let Some(url) = pg::url() {
        extra = vec![
            "--ledger".to_string(),
            pg::fresh_database(url)?,
            "--node".into(),
            "bench-http".into(),
        ];
    }
    let (mut server, base) = ServerProcess::start(dir, durability, &extra)?;
    let agent = agent(Duration::from_secs(60));
    server.wait_healthy(&agent, &base)?;
    let post = |path: &str, body: serde_json::Value| send(&agent, "POST", &format!("{base}{path}"), &body);
    let mut r = agent
        .put(&format!("{base}/v1/sessions/http"))
        .header("Content-Type", "application/json")
        .send(
            json!({"addressable": true, "max_concurrent_children": 4 * CALL})
                .to_string()
                .as_bytes(),
        )?;
    anyhow::ensure!(r.status() == 200, "PUT session: {}", r.body_mut().read_to_string()?);
    let calls = n.div_ceil(CALL);
    let tasks: Vec<serde_json::Value> = (0..CALL)
        .map(|i| json!({"goal": format!("t{i}"), "runner": {"kind": "sim"}}))
        .collect();
    // Written once, sent as often as there are calls, as a producer repeating one call would.
    let body = json!({"tasks": tasks, "independent_completions": true}).to_string();
    let start = Instant::now();
    let total = calls * CALL;
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let producer = scope.spawn(|| -> anyhow::Result<()> {
            for _ in 0..calls {
                let mut r = post_json(&agent, &format!("{base}/v1/sessions/http/delegate"), body.as_bytes())?;
                let status = r.status().as_u16();
                anyhow::ensure!(
                    status == 202,
                    "delegate answered {status}: {}",
                    r.body_mut().read_to_string()?
                );
            }
            Ok(())
        });
        // Each boundary acks the envelope before it (one request per envelope), as a consumer
        // that has read one and takes the next would.
        let mut delivered = 0usize;
        let mut held: Option<(String, usize)> = None;
        while delivered < total {
            let mut boundary = json!({"consumer": "bench", "lease_ms": 300_000});
            if let Some((claim, _)) = &held {
                boundary["ack"] = json!(claim);
            }
            let answer = read_boundary(&agent, &format!("{base}/v1/sessions/http/boundary"), &boundary)?;
            let status = answer.as_ref().map_or_else(|(status, _)| *status, |_| 200);
            if let (200 | 204, Some((_, n))) = (status, held.take()) {
                delivered += n;
            }
            match answer {
                Ok(env) => {
                    let (claim, items) = (env.claim_id.as_str(), env.items.len());
                    if delivered + items >= total {
                        // The last envelope: acked alone.
                        let (status, acked) = post(&format!("/v1/claims/{claim}/ack"), json!({}))?;
                        anyhow::ensure!(status == 200, "ack answered {status}: {acked}");
                        delivered += acked["delivered"].as_u64().unwrap_or(0) as usize;
                    } else {
                        held = Some((claim.to_string(), items));
                    }
                }
                Err((204, _)) => std::thread::sleep(Duration::from_millis(1)),
                Err((s, answer)) => bail!("boundary answered {s}: {answer}"),
            }
        }
        producer
            .join()
            .map_err(|_| anyhow::anyhow!("the producer thread panicked"))??;
        Ok(())
    })?;
    let per_s = total as f64 / start.elapsed().as_secs_f64();
    drop(server);
    let fig = Figure::new("http_children_per_s", per_s, "children/s").target("ratio ≥ 0.9");
    Ok(match embedded {
        Some(e) => fig.against(e),
        None => fig,
    })
}

/// A boundary (`body`) at `url`: the envelope of a 200 read into the HTTP contract's own
/// types, every item and the text, as a typed client reads it; else the status and the
/// answer's text.
fn read_boundary(
    agent: &ureq::Agent,
    url: &str,
    body: &serde_json::Value,
) -> anyhow::Result<Result<brood_server::api::Envelope, (u16, String)>> {
    let mut r = post_json(agent, url, body.to_string().as_bytes())?;
    let status = r.status().as_u16();
    let text = r.body_mut().read_to_string()?;
    if status != 200 {
        return Ok(Err((status, text)));
    }
    let env = serde_json::from_str(&text).with_context(|| format!("an envelope that does not read: {text}"))?;
    Ok(Ok(env))
}

/// A POST of the JSON `body` to `url`.
fn post_json(agent: &ureq::Agent, url: &str, body: &[u8]) -> Result<ureq::http::Response<ureq::Body>, ureq::Error> {
    agent.post(url).header("Content-Type", "application/json").send(body)
}

/// `method` (POST or PUT) of `body` to `url`: the status and the JSON answered (null when
/// the body is empty).
pub(super) fn send(
    agent: &ureq::Agent,
    method: &str,
    url: &str,
    body: &serde_json::Value,
) -> anyhow::Result<(u16, serde_json::Value)> {
    send_noting(agent, method, url, body, "").map(|(status, value, _)| (status, value))
}

/// [`send`], noting the answer's header `header` too, if it has one.
pub(super) fn send_noting(
    agent: &ureq::Agent,
    method: &str,
    url: &str,
    body: &serde_json::Value,
    header: &str,
) -> anyhow::Result<(u16, serde_json::Value, Option<String>)> {
    let bytes = body.to_string();
    let mut r = match method {
        "PUT" => agent
            .put(url)
            .header("Content-Type", "application/json")
            .send(bytes.as_bytes())?,
        _ => post_json(agent, url, bytes.as_bytes())?,
    };
    let status = r.status().as_u16();
    let noted = (!header.is_empty())
        .then(|| r.headers().get(header)?.to_str().ok().map(str::to_string))
        .flatten();
    let text = r.body_mut().read_to_string()?;
    let value = if text.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text))
    };
    Ok((status, value, noted))
}

/// An HTTP client that takes every status as an answer. It keeps an idle connection per
/// consumer thread to each server (ureq keeps 3 by default, and a connection made and closed
/// for each request beyond them would be measured too), for less than a server keeps an idle
/// one open (actix-web's default keep-alive, 5 s).
pub(super) fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .max_idle_connections(256)
        .max_idle_connections_per_host(64)
        .max_idle_age(Duration::from_secs(4))
        .build()
        .into()
}

/// A child `brood serve`, killed when dropped.
pub(super) struct ServerProcess(pub(super) std::process::Child);

impl ServerProcess {
    /// This binary's `brood serve` (or that of the binary `BROOD_BENCH_SERVE` names, to measure
    /// another build's server) on a free loopback port, its ledger in `dir` (or where `extra`,
    /// further flags, says); the process and its base address.
    pub(super) fn start(dir: &Path, durability: Durability, extra: &[String]) -> anyhow::Result<(Self, String)> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let binary = match std::env::var_os("BROOD_BENCH_SERVE") {
            Some(other) => std::path::PathBuf::from(other),
            None => std::env::current_exe()?,
        };
        let child = std::process::Command::new(binary)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--durability"])
            .arg(durability.to_string())
            .arg("--data-dir")
            .arg(dir)
            // A bench session runs thousands at once, and its producer may run far ahead of
            // the children: the bounds of a laptop's default would refuse both.
            .args(["--max-session-capacity", "100000", "--max-live-children", "100000000"])
            .args(extra)
            .env_remove("BROOD_API_KEY")
            // A server refuses a BROOD_ variable that names none of its keys.
            .env_remove("BROOD_BENCH_SERVE")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("starting brood serve")?;
        Ok((ServerProcess(child), format!("http://127.0.0.1:{port}")))
    }

    /// Waits until it answers `/healthz` with 200 (30 s at most).
    pub(super) fn wait_healthy(&mut self, agent: &ureq::Agent, base: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !agent
            .get(&format!("{base}/healthz"))
            .call()
            .is_ok_and(|r| r.status() == 200)
        {
            if let Some(status) = self.0.try_wait()? {
                bail!("brood serve exited with {status} before it answered");
            }
            anyhow::ensure!(Instant::now() < deadline, "brood serve did not answer in 30 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
