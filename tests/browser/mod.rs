//! Headless Chromium driven over the DevTools protocol, for the tests of what a browser does
//! with `brood serve`: Debian's `chromium` (which `.ci/run` installs), or `BROOD_CHROMIUM`.
//! Shared by the browser test files (`mod browser;`, beside `mod server;`, whose free ports it
//! takes).
#![allow(dead_code)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The Chromium binary: `BROOD_CHROMIUM`, else `chromium` or `chromium-browser` on the PATH.
pub fn chromium() -> String {
    if let Ok(path) = std::env::var("BROOD_CHROMIUM") {
        return path;
    }
    for name in ["chromium", "chromium-browser"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if found {
            return name.to_string();
        }
    }
    panic!(
        "headless Chromium is needed for this test: install Debian's `chromium` (.ci/run does) or set BROOD_CHROMIUM"
    );
}

/// Headless Chromium on `url` with its DevTools port open, killed when dropped.
pub struct Browser {
    child: Child,
    port: u16,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    pub fn open(url: &str) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let port = crate::server::free_port();
        let child = Command::new(chromium())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--window-size=1280,900",
                &format!("--remote-debugging-port={port}"),
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(url)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromium");
        Browser {
            child,
            port,
            _profile: profile,
        }
    }

    /// The DevTools connection of the page it opened.
    pub fn page(&self) -> Devtools {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let list: Option<Value> = ureq::get(&format!("http://127.0.0.1:{}/json/list", self.port))
                .call()
                .ok()
                .and_then(|mut r| r.body_mut().read_to_string().ok())
                .and_then(|t| serde_json::from_str(&t).ok());
            let ws = list.as_ref().and_then(|l| {
                l.as_array()?
                    .iter()
                    .find(|t| t["type"] == "page")?
                    .get("webSocketDebuggerUrl")?
                    .as_str()
                    .map(str::to_string)
            });
            if let Some(ws) = ws {
                return Devtools::connect(&ws);
            }
            assert!(Instant::now() < deadline, "chromium opened no page in 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A DevTools protocol session over a minimal WebSocket client (text frames, masked as a client
/// must, unmasked from the server; enough for request and reply).
pub struct Devtools {
    stream: TcpStream,
    next_id: u64,
}

impl Devtools {
    fn connect(url: &str) -> Devtools {
        let rest = url.strip_prefix("ws://").expect("a ws:// URL");
        let (host, path) = rest.split_once('/').expect("a path");
        let mut stream = TcpStream::connect(host).expect("connect to devtools");
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            stream,
            "GET /{path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut status = String::new();
        reader.read_line(&mut status).unwrap();
        assert!(status.contains(" 101 "), "no WebSocket upgrade: {status}");
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
        }
        Devtools { stream, next_id: 1 }
    }

    fn send_text(&mut self, text: &str) {
        let payload = text.as_bytes();
        let mut frame = vec![0x81u8];
        match payload.len() {
            n if n < 126 => frame.push(0x80 | n as u8),
            n if n < 65536 => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let mask = [0x12u8, 0x34, 0x56, 0x78];
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.stream.write_all(&frame).unwrap();
    }

    fn read_message(&mut self) -> String {
        let mut message = Vec::new();
        loop {
            let mut head = [0u8; 2];
            self.stream.read_exact(&mut head).unwrap();
            let (fin, opcode) = (head[0] & 0x80 != 0, head[0] & 0x0f);
            let len = match head[1] & 0x7f {
                126 => {
                    let mut b = [0u8; 2];
                    self.stream.read_exact(&mut b).unwrap();
                    u64::from(u16::from_be_bytes(b))
                }
                127 => {
                    let mut b = [0u8; 8];
                    self.stream.read_exact(&mut b).unwrap();
                    u64::from_be_bytes(b)
                }
                n => u64::from(n),
            };
            let mut payload = vec![0u8; len as usize];
            self.stream.read_exact(&mut payload).unwrap();
            if opcode == 0x1 || opcode == 0x0 {
                message.extend_from_slice(&payload);
                if fin {
                    return String::from_utf8(message).unwrap();
                }
            }
        }
    }

    /// Calls a DevTools method and returns its `result`.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send_text(&json!({"id": id, "method": method, "params": params}).to_string());
        loop {
            let reply: Value = serde_json::from_str(&self.read_message()).unwrap();
            if reply["id"] == id {
                assert!(reply.get("error").is_none(), "{method}: {reply}");
                return reply["result"].clone();
            }
        }
    }

    /// The value of a JavaScript expression in the page.
    pub fn eval(&mut self, expression: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true}),
        );
        r["result"]["value"].clone()
    }

    /// Polls `expression` until it yields `want`, for up to 30 s; the values it went through.
    pub fn until(&mut self, expression: &str, want: &Value) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = Vec::new();
        loop {
            let v = self.eval(expression);
            if seen.last() != Some(&v) {
                seen.push(v.clone());
            }
            if &v == want {
                return seen;
            }
            assert!(
                Instant::now() < deadline,
                "the page never showed {want} for {expression}; it showed {seen:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Standard base64, as DevTools sends a screenshot.
pub fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let bytes: Vec<u8> = text
        .bytes()
        .filter(|&c| c != b'=' && !c.is_ascii_whitespace())
        .collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let v: Vec<u32> = chunk.iter().map(|&c| u32::from(value(c))).collect();
        let n = v.iter().enumerate().fold(0u32, |acc, (i, x)| acc | x << (18 - 6 * i));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}
