//! `brood mcp`: MCP (the Model Context Protocol) over stdin and stdout, one JSON-RPC message a
//! line, for an agent runtime that starts its MCP servers as processes. stdout carries the
//! protocol and nothing else; logs go to stderr.
//!
//! Two ways to answer:
//! - **embedded** (no `--url`): an engine over the data folder runs in this process, opened as
//!   `brood serve` opens one ([`brood_server::mcp::Embedded`]), and answers each message; when
//!   stdin ends, running children get up to `drain_timeout_ms` (or until SIGTERM/SIGINT) and the
//!   engine closes.
//! - **bridge** (`--url`): each message is posted to the server's `/mcp`, with the key, and its
//!   answer written back; the server does everything else. A refusal that is not JSON-RPC (no
//!   key, a wrong one, a body over the limit) or a server out of reach becomes the JSON-RPC
//!   error of the request it answered.
//!
//! Requests are answered as they come, several at once: an answer may overtake an earlier
//! one, as JSON-RPC allows (each carries its request's id).

use std::io::{BufRead as _, Write as _};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use brood_server::config::ServeConfig;
use brood_server::mcp::Embedded;
use serde_json::{json, Value};

/// Requests the bridge has in flight at once.
const BRIDGE_THREADS: usize = 4;

/// How long the bridge waits to connect to the server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The most of one answer the bridge reads.
const ANSWER_LIMIT: u64 = 64 << 20;

/// JSON-RPC's code for an error of the server answering (here: the bridge, or what is behind it).
const INTERNAL_ERROR: i64 = -32603;

/// Writes whole lines to stdout, one writer at a time.
#[derive(Clone)]
struct Out(Arc<Mutex<std::io::Stdout>>);

impl Out {
    fn new() -> Out {
        Out(Arc::new(Mutex::new(std::io::stdout())))
    }

    /// Writes `line` and a newline, and flushes: the client reads it at once.
    fn line(&self, line: &str) {
        let mut out = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let written = writeln!(out, "{line}").and_then(|()| out.flush());
        if let Err(e) = written {
            tracing::warn!("cannot write to stdout ({e}); the client has gone");
        }
    }
}

/// Reads stdin's lines on a thread of their own, each sent to `tx`; blank lines are skipped.
/// Returns when stdin ends (or cannot be read) or nobody takes lines any more.
fn read_lines(tx: impl Fn(String) -> bool) {
    for line in std::io::stdin().lock().lines() {
        match line {
            Ok(line) if line.trim().is_empty() => continue,
            Ok(line) => {
                if !tx(line) {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!("cannot read stdin ({e}); stopping");
                return;
            }
        }
    }
}

/// Serves MCP on stdio over an engine of this process until stdin ends.
pub(crate) fn embedded(config: ServeConfig) -> anyhow::Result<()> {
    let data_dir = config.data_dir.clone();
    let engine = Embedded::open(config).with_context(|| format!("opening the ledger in {}", data_dir.display()))?;
    eprintln!(
        "brood mcp: serving MCP on stdin/stdout, ledger in {}",
        data_dir.display()
    );
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let engine = Arc::new(engine);
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, serve_lines(engine.clone()));
    match Arc::try_unwrap(engine) {
        Ok(engine) => engine.shutdown(),
        Err(_) => {
            tracing::warn!("requests were still being answered at the end; the engine closes as they are dropped")
        }
    }
    Ok(())
}

/// Answers stdin's lines until it ends, then drains the engine (cut short by SIGTERM/SIGINT)
/// and lets go of the answers still in flight.
async fn serve_lines(engine: Arc<Embedded>) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || read_lines(|line| tx.send(line).is_ok()));
    let out = Out::new();
    let mut answering = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            line = rx.recv() => match line {
                Some(line) => {
                    let (engine, out) = (engine.clone(), out.clone());
                    answering.spawn_local(async move {
                        if let Some(answer) = engine.answer(&line).await {
                            out.line(&answer);
                        }
                    });
                }
                None => break,
            },
            Some(_) = answering.join_next() => {}
        }
    }
    let finish = async {
        while answering.join_next().await.is_some() {}
        let left = engine.drain().await;
        if left > 0 {
            tracing::warn!(
                running = left,
                "stdin ended with children still running; the next start resolves them"
            );
        }
    };
    tokio::select! {
        () = finish => {}
        signal = stop_signal() => eprintln!("brood mcp: {signal}: closing without waiting for running children"),
    }
    answering.shutdown().await;
}

/// Waits for SIGTERM or SIGINT; names the one that came.
async fn stop_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut term), Ok(mut int)) => tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        },
        (Err(e), _) | (_, Err(e)) => {
            tracing::warn!("cannot listen for SIGTERM/SIGINT ({e})");
            std::future::pending().await
        }
    }
}

/// Relays MCP on stdio to the server at `url` (its base, or its `/mcp` endpoint) until stdin
/// ends.
pub(crate) fn bridge(url: &str, key: Option<String>) -> anyhow::Result<()> {
    let base = url.trim_end_matches('/');
    let endpoint = if base.ends_with("/mcp") {
        base.to_string()
    } else {
        format!("{base}/mcp")
    };
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .build()
        .into();
    let relay = Arc::new(Relay {
        agent,
        endpoint,
        auth: key.map(|k| format!("Bearer {k}")),
        out: Out::new(),
    });
    eprintln!("brood mcp: relaying MCP on stdin/stdout to {}", relay.endpoint);
    let (tx, rx) = mpsc::channel::<String>();
    let rx = Arc::new(Mutex::new(rx));
    let workers: Vec<_> = (0..BRIDGE_THREADS)
        .map(|_| {
            let (relay, rx) = (relay.clone(), rx.clone());
            std::thread::spawn(move || loop {
                let next = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                match next {
                    Ok(line) => relay.relay(&line),
                    Err(_) => return,
                }
            })
        })
        .collect();
    read_lines(|line| tx.send(line).is_ok());
    drop(tx);
    for worker in workers {
        let _ = worker.join();
    }
    Ok(())
}

/// Sends messages on to a server's `/mcp`.
struct Relay {
    agent: ureq::Agent,
    endpoint: String,
    auth: Option<String>,
    out: Out,
}

impl Relay {
    /// Posts `line` and writes the answer, if any.
    fn relay(&self, line: &str) {
        match self.post(line) {
            Ok(Some(answer)) => self.out.line(&answer),
            Ok(None) => {}
            Err(problem) => match request_id(line) {
                Some(id) => {
                    let error = json!({"code": INTERNAL_ERROR, "message": problem.message, "data": problem.data});
                    self.out
                        .line(&json!({"jsonrpc": "2.0", "id": id, "error": error}).to_string());
                }
                None => tracing::warn!("a notification was not taken: {}", problem.message),
            },
        }
    }

    /// The server's JSON-RPC answer to `line`, on one line (`None`: it had none, as for a
    /// notification), or why there is none.
    fn post(&self, line: &str) -> Result<Option<String>, Problem> {
        let mut request = self
            .agent
            .post(&self.endpoint)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream");
        if let Some(auth) = &self.auth {
            request = request.header("Authorization", auth);
        }
        let mut response = request.send(line.as_bytes()).map_err(|e| Problem {
            message: format!("cannot reach the brood server at {}: {e}", self.endpoint),
            data: Value::Null,
        })?;
        let status = response.status().as_u16();
        let json_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("application/json"));
        let text = response
            .body_mut()
            .with_config()
            .limit(ANSWER_LIMIT)
            .read_to_string()
            .unwrap_or_default();
        if status == 202 {
            return Ok(None);
        }
        let answer: Option<Value> = json_type.then(|| serde_json::from_str(&text).ok()).flatten();
        match answer {
            // A JSON-RPC answer, whatever its status (a refused message is answered 400).
            Some(answer) if answer.get("jsonrpc").is_some() => Ok(Some(answer.to_string())),
            // brood's own refusal: `{"error": {"code", "message"}}`.
            Some(refusal) => Err(Problem {
                message: format!(
                    "the brood server refused the request ({status} {}): {}",
                    refusal["error"]["code"].as_str().unwrap_or("?"),
                    refusal["error"]["message"].as_str().unwrap_or(&text)
                ),
                data: json!({"status": status, "error": refusal["error"]}),
            }),
            None => Err(Problem {
                message: format!("the brood server answered {status} with something other than JSON-RPC"),
                data: json!({"status": status}),
            }),
        }
    }
}

/// Why a message got no answer from the server.
struct Problem {
    message: String,
    data: Value,
}

/// The id of the request `line` holds, when it is one (a message with a `method` and an id).
fn request_id(line: &str) -> Option<Value> {
    let message: Value = serde_json::from_str(line).ok()?;
    message.get("method")?;
    message.get("id").filter(|id| !id.is_null()).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_request_has_an_id_to_answer() {
        assert_eq!(
            request_id(r#"{"jsonrpc": "2.0", "id": 4, "method": "ping"}"#),
            Some(json!(4))
        );
        assert_eq!(
            request_id(r#"{"jsonrpc": "2.0", "method": "notifications/initialized"}"#),
            None
        );
        assert_eq!(request_id(r#"{"jsonrpc": "2.0", "id": 4, "result": {}}"#), None);
        assert_eq!(request_id("not json"), None);
    }
}
