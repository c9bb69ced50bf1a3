//! The real `brood serve` as a test's child process: started on a free loopback port over a
//! temporary data folder, driven over HTTP with ureq, killed when dropped. Shared by the HTTP
//! test files (`mod server;`).
#![allow(dead_code)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// A running `brood serve`, killed when dropped.
pub struct Server {
    pub child: Child,
    pub base: String,
    pub key: Option<String>,
    pub agent: ureq::Agent,
}

/// A reply as it came: status, Content-Type and body text.
pub struct Reply {
    pub status: u16,
    pub content_type: String,
    /// The process the answer names as serving its session (`x-brood-holder`), if it names one.
    pub holder: Option<String>,
    pub text: String,
}

/// A port free now and never handed out before in this test process: the port is released
/// before the server binds it, and the kernel may give the same one to a test running beside
/// this one (whose client would then talk to this server).
pub fn free_port() -> u16 {
    static GIVEN: Mutex<std::collections::BTreeSet<u16>> = Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if GIVEN.lock().unwrap_or_else(|e| e.into_inner()).insert(port) {
            return port;
        }
    }
}

/// What `sql` returns on the PostgreSQL database at `url`, through Debian's `psql`: tuples only,
/// unaligned (columns separated by `|`, a row a line), trimmed.
pub fn psql(url: &str, sql: &str) -> String {
    let out = Command::new("psql")
        .args([url, "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .expect("psql runs (Debian's postgresql-client)");
    assert!(
        out.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

impl Server {
    /// Sends the server process signal `sig` with `kill` (`-STOP`, `-CONT`, `-KILL`, …).
    pub fn signal(&self, sig: &str) {
        let pid = self.child.id();
        let ok = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    }

    pub fn start(dir: &Path, key: Option<&str>) -> Server {
        Server::start_with(dir, key, &[])
    }

    /// A server with extra flags (`--allow-command`, `--config f.toml`, …), whose wakes may
    /// go to loopback (`--wake-allow 127.0.0.1`), where the tests' wake receivers listen.
    pub fn start_with(dir: &Path, key: Option<&str>, extra: &[&str]) -> Server {
        Server::start_env(dir, key, extra, &[])
    }

    /// A process of several sharing the PostgreSQL ledger at `url`: node `name`, in a folder
    /// of its own under `dir`, with session tenures of `lease_ms`.
    pub fn node(dir: &Path, url: &str, name: &str, lease_ms: &str) -> Server {
        Server::node_with(dir, url, name, lease_ms, None, &[])
    }

    /// As [`Server::node`], with the API key `key` and flags `extra` besides.
    pub fn node_with(dir: &Path, url: &str, name: &str, lease_ms: &str, key: Option<&str>, extra: &[&str]) -> Server {
        let dir = dir.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let mut flags = vec!["--ledger", url, "--node", name, "--session-lease-ms", lease_ms];
        flags.extend_from_slice(extra);
        Server::start_with(&dir, key, &flags)
    }

    /// As [`Server::start_with`], with variables added to the server's environment.
    pub fn start_env(dir: &Path, key: Option<&str>, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut flags = vec!["--wake-allow", "127.0.0.1"];
        flags.extend_from_slice(extra);
        Server::spawn(dir, key, &flags, Stdio::null(), env)
    }

    /// A server with exactly the flags given (wakes to loopback refused, as by default), its
    /// stderr going to `stderr`.
    pub fn start_exactly(dir: &Path, key: Option<&str>, extra: &[&str], stderr: Stdio) -> Server {
        Server::spawn(dir, key, extra, stderr, &[])
    }

    /// As [`Server::node`], listening on `port` (that of a process stopped a moment ago: a
    /// restart at the same address).
    pub fn node_on(dir: &Path, url: &str, name: &str, lease_ms: &str, port: u16) -> Server {
        let dir = dir.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let flags = [
            "--wake-allow",
            "127.0.0.1",
            "--ledger",
            url,
            "--node",
            name,
            "--session-lease-ms",
            lease_ms,
        ];
        Server::spawn_on(port, &dir, None, &flags, Stdio::null(), &[])
    }

    /// The port this server listens on.
    pub fn port(&self) -> u16 {
        self.base
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("a port")
    }

    fn spawn(dir: &Path, key: Option<&str>, extra: &[&str], stderr: Stdio, env: &[(&str, &str)]) -> Server {
        Server::spawn_on(free_port(), dir, key, extra, stderr, env)
    }

    fn spawn_on(
        port: u16,
        dir: &Path,
        key: Option<&str>,
        extra: &[&str],
        stderr: Stdio,
        env: &[(&str, &str)],
    ) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_brood"));
        cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
            .arg(dir)
            .env_remove("BROOD_API_KEY")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(stderr);
        if let Some(k) = key {
            cmd.args(["--api-key", k]);
        }
        cmd.args(extra);
        let child = cmd.spawn().expect("start brood serve");
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into();
        let mut server = Server {
            child,
            base: format!("http://127.0.0.1:{port}"),
            key: key.map(str::to_string),
            agent,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // One that could not bind its port exited: what answers there is not this server.
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("brood serve exited before it answered /healthz: {status}");
            }
            if let Ok(r) = server.agent.get(&format!("{}/healthz", server.base)).call() {
                if r.status() == 200 {
                    return server;
                }
            }
            assert!(Instant::now() < deadline, "brood serve did not answer /healthz in 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and returns at once.
    pub fn sigterm(&self) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().expect("run kill");
        assert!(sent.success(), "kill -TERM {pid} failed");
    }

    /// SIGTERM, then the exit status (within 30 s).
    pub fn terminate(self) -> std::process::ExitStatus {
        self.sigterm();
        self.wait_exit()
    }

    /// The exit status, within 30 s.
    pub fn wait_exit(mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "brood serve did not stop within 30 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A request with an optional JSON body; returns the status and the parsed body (Null for
    /// an empty one).
    pub fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.raw(
            method,
            path,
            body.map(|b| b.to_string().into_bytes()),
            self.key.as_deref(),
        )
    }

    pub fn raw(&self, method: &str, path: &str, body: Option<Vec<u8>>, key: Option<&str>) -> (u16, Value) {
        let reply = self.send(method, path, body, key);
        let value = if reply.text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&reply.text)
                .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {}", reply.text))
        };
        (reply.status, value)
    }

    /// A `POST` of the JSON `body` with one more header: the status and the parsed body.
    pub fn post_with_header(&self, path: &str, body: &Value, (name, value): (&str, &str)) -> (u16, Value) {
        let mut r = self
            .agent
            .post(&format!("{}{path}", self.base))
            .header("Content-Type", "application/json")
            .header(name, value);
        if let Some(k) = &self.key {
            r = r.header("Authorization", &format!("Bearer {k}"));
        }
        let mut response = r
            .send(body.to_string().as_bytes())
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        let mut text = String::new();
        response.body_mut().as_reader().read_to_string(&mut text).unwrap();
        let value = serde_json::from_str(&text).unwrap_or(Value::Null);
        (response.status().as_u16(), value)
    }

    /// A request as [`Server::raw`] sends it, answered as it came (not parsed).
    pub fn send(&self, method: &str, path: &str, body: Option<Vec<u8>>, key: Option<&str>) -> Reply {
        let url = format!("{}{path}", self.base);
        let auth = key.map(|k| format!("Bearer {k}"));
        let response = match method {
            "GET" => {
                let mut r = self.agent.get(&url);
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.call()
            }
            m => {
                let mut r = match m {
                    "PUT" => self.agent.put(&url),
                    _ => self.agent.post(&url),
                };
                r = r.header("Content-Type", "application/json");
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                match body {
                    Some(b) => r.send(&b[..]),
                    None => r.send_empty(),
                }
            }
        };
        let mut response = response.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let holder = response
            .headers()
            .get(brood_server::HOLDER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let mut text = String::new();
        response.body_mut().as_reader().read_to_string(&mut text).unwrap();
        Reply {
            status,
            content_type,
            holder,
            text,
        }
    }

    pub fn open(&self, session: &str) {
        let (status, body) = self.call(
            "PUT",
            &format!("/v1/sessions/{session}"),
            Some(json!({"addressable": true})),
        );
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["wake_capable"], true);
    }

    /// Delegates `n` zero-time sim children with independent completions to `session` (opened
    /// wake-capable, so the call runs in the background); returns the call id.
    pub fn delegate_sims(&self, session: &str, n: usize) -> String {
        self.delegate_timed(session, &vec![0; n])
    }

    /// As [`Server::delegate_sims`], child `i` taking `ms[i]` milliseconds.
    pub fn delegate_timed(&self, session: &str, ms: &[u64]) -> String {
        let tasks: Vec<Value> = ms
            .iter()
            .enumerate()
            .map(|(i, &ms)| json!({"goal": format!("t{i}"), "runner": sim(ms)}))
            .collect();
        let (status, reply) = self.call(
            "POST",
            &format!("/v1/sessions/{session}/delegate"),
            Some(json!({"tasks": tasks, "independent_completions": true})),
        );
        assert_eq!(status, 202, "{reply}");
        reply["call_id"].as_str().unwrap().to_string()
    }

    /// Delegates the one task `task` (a task object) to `session`, which must accept it (202);
    /// the reply.
    pub fn delegate_task(&self, session: &str, task: Value) -> Value {
        let (status, reply) = self.call(
            "POST",
            &format!("/v1/sessions/{session}/delegate"),
            Some(json!({"tasks": [task]})),
        );
        assert_eq!(status, 202, "{reply}");
        reply
    }

    /// The one result of `session`'s next envelope, acked.
    pub fn only_result(&self, session: &str) -> Value {
        let env = self.envelope(session, 30_000);
        let items = env["items"].as_array().expect("items");
        assert_eq!(items.len(), 1, "{env}");
        let claim = env["claim_id"].as_str().unwrap();
        let (status, acked) = self.call("POST", &format!("/v1/claims/{claim}/ack"), None);
        assert_eq!((status, acked["delivered"].as_u64()), (200, Some(1)), "{acked}");
        items[0].clone()
    }

    /// A poll of worker `w` waiting up to 20 s, which must be handed a child: its id and token.
    pub fn poll_work(&self) -> (String, String) {
        let (status, work) = self.call(
            "POST",
            "/v1/workers/poll",
            Some(json!({"worker": "w", "wait_ms": 20_000})),
        );
        assert_eq!(status, 200, "{work}");
        (
            work["child_id"].as_str().unwrap().to_string(),
            work["token"].as_str().unwrap().to_string(),
        )
    }

    /// Boundaries until one answers 200.
    pub fn envelope(&self, session: &str, lease_ms: u64) -> Value {
        until_envelope(session, lease_ms, |m, p, b| self.call(m, p, b))
    }
}

/// Boundaries of `session`, sent with `call` (method, path, body), until one answers 200
/// (within 20 s); returns that envelope. A status other than 200 or 204 fails.
pub fn until_envelope(
    session: &str,
    lease_ms: u64,
    mut call: impl FnMut(&str, &str, Option<Value>) -> (u16, Value),
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = call(
            "POST",
            &format!("/v1/sessions/{session}/boundary"),
            Some(json!({"consumer": "t", "lease_ms": lease_ms})),
        );
        match status {
            200 => return body,
            204 => {}
            s => panic!("boundary answered {s}: {body}"),
        }
        assert!(Instant::now() < deadline, "no envelope in 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn sim(ms: u64) -> Value {
    json!({"kind": "sim", "ms": ms})
}

pub fn assert_error(reply: (u16, Value), status: u16, code: &str) -> String {
    let (got, body) = reply;
    assert_eq!(got, status, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    let message = body["error"]["message"]
        .as_str()
        .expect("an error has a message")
        .to_string();
    assert!(!message.is_empty());
    message
}

/// Reads one HTTP request from `stream` (its head, then a body of its Content-Length): the
/// body, if it is JSON.
pub fn read_json_body(stream: &std::net::TcpStream) -> Option<Value> {
    let mut reader = BufReader::new(stream);
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    serde_json::from_slice(&body).ok()
}

/// A wake receiver on loopback: answers 500 to the first `refuse` POSTs and 200 to the rest,
/// and records the body of every POST it accepted.
pub fn wake_receiver(refuse: usize) -> (String, Arc<Mutex<Vec<Value>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/wake", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for (n, stream) in listener.incoming().enumerate() {
            let Ok(mut stream) = stream else { continue };
            let body = read_json_body(&stream);
            let answer: &[u8] = if n < refuse {
                b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            } else {
                log.lock().unwrap().extend(body);
                b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            };
            let _ = stream.write_all(answer);
        }
    });
    (url, seen)
}

// ---- /metrics ----

/// The OpenMetrics text of a scrape.
pub fn scrape(s: &Server) -> String {
    let reply = s.send("GET", "/metrics", None, None);
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert!(
        reply.content_type.starts_with("application/openmetrics-text"),
        "{}",
        reply.content_type
    );
    assert!(reply.text.ends_with("# EOF\n"), "{}", reply.text);
    reply.text
}

/// The value of one sample, named with its labels as encoded (`name{a="x"}`).
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap_or_else(|e| panic!("{series}: {v}: {e}")))
}

pub fn value(text: &str, series: &str) -> f64 {
    sample(text, series).unwrap_or_else(|| panic!("no sample {series} in\n{text}"))
}

/// Scrapes until `series` reaches `at_least` (the engine gets there on its own time).
pub fn scrape_until(s: &Server, series: &str, at_least: f64) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = scrape(s);
        if sample(&text, series).is_some_and(|v| v >= at_least) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{series} did not reach {at_least} in 20 s:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
