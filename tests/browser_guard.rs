//! A server without a key trusts loopback, and its user's browser is on loopback too: what a
//! web page of another site can make that browser send must change nothing and read nothing.
//! Each attack is sent as a page (in headless Chromium) or as the raw request a browser would
//! send: a no-cors `fetch` from another origin (text/plain body, `Origin`, `Sec-Fetch-Site`), a
//! foreign `Host` (DNS rebinding), a body not declared JSON. And what must keep working: loopback
//! names, `allowed_hosts`, a keyed server reached by any name, a POST without a body.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

mod browser;
mod server;
use browser::*;
use server::*;

fn port_of(s: &Server) -> u16 {
    s.base.rsplit(':').next().unwrap().parse().unwrap()
}

/// Sends `head` (request line and headers, no blank line) and `body` to the server exactly as
/// given, on a connection of their own; the status and body text of the answer.
fn send_raw(s: &Server, head: &str, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port_of(s))).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(stream, "{head}\r\nConnection: close\r\n\r\n{body}").unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
    (status, body)
}

/// A delegation of one `command` child creating `marker`, as JSON text.
fn delegation_touching(marker: &Path) -> String {
    json!({"tasks": [{"goal": "create a file", "runner": {"kind": "command", "argv": ["touch", marker]}}]}).to_string()
}

/// A POST of `body` to `path` with the extra header lines `extra`.
fn post(s: &Server, path: &str, extra: &[&str], body: &str) -> (u16, String) {
    let port = port_of(s);
    let mut head = format!("POST {path} HTTP/1.1\r\nContent-Length: {}", body.len());
    if !extra.iter().any(|h| h.to_ascii_lowercase().starts_with("host:")) {
        head.push_str(&format!("\r\nHost: 127.0.0.1:{port}"));
    }
    for h in extra {
        head.push_str("\r\n");
        head.push_str(h);
    }
    send_raw(s, &head, body)
}

/// The error code of an answer's body.
fn code(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    v["error"]["code"].as_str().unwrap_or_default().to_string()
}

/// The ids of the sessions the server holds, asked as its own client asks.
fn sessions(s: &Server) -> Vec<String> {
    let (status, body) = s.call("GET", "/v1/sessions", None);
    assert_eq!(status, 200, "{body}");
    let list = body["sessions"].as_array().unwrap();
    list.iter()
        .map(|s| s["session_id"].as_str().unwrap().to_string())
        .collect()
}

/// The calls of `session`, asked as its own client asks.
fn calls(s: &Server, session: &str) -> Vec<Value> {
    let (status, body) = s.call("GET", &format!("/v1/sessions/{session}"), None);
    assert_eq!(status, 200, "{body}");
    body["calls"].as_array().unwrap().clone()
}

/// A web site on another loopback port: `/attack` is `page`, and the first request for `/done`
/// sends its query on the channel.
fn attacker(page: String) -> (String, mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut first = String::new();
            let _ = reader.read_line(&mut first);
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
            }
            let target = first.split(' ').nth(1).unwrap_or("").to_string();
            let answer = if target == "/attack" {
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                    page.len()
                )
            } else {
                if let Some(query) = target.strip_prefix("/done?") {
                    let _ = tx.send(query.to_string());
                }
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_string()
            };
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    (base, rx)
}

#[test]
fn a_page_of_another_site_can_neither_run_a_command_nor_read_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), None, &["--allow-command"]);
    let port = port_of(&s);
    // The user's sessions: a page that knows (or guesses) their names delegates into them.
    s.open("same-site");
    s.open("cross-site");
    let markers = tempfile::tempdir().unwrap();
    // Same-site (another port of 127.0.0.1) and cross-site (localhost) targets.
    let targets: Vec<Value> = [("127.0.0.1", "same-site"), ("localhost", "cross-site")]
        .iter()
        .map(|(host, session)| {
            let marker = markers.path().join(session);
            json!([format!("http://{host}:{port}"), session, delegation_touching(&marker)])
        })
        .collect();
    let page = format!(
        r#"<!doctype html><title>a page of another site</title><script>
const targets = {targets};
(async () => {{
  const read = [];
  for (const [base, session, body] of targets) {{
    // A "simple" request: no preflight, the body goes as text/plain.
    try {{ await fetch(base + "/v1/sessions/" + session + "/delegate", {{method: "POST", mode: "no-cors", body}}); }} catch (e) {{}}
    try {{ const r = await fetch(base + "/v1/sessions"); read.push(await r.text()); }} catch (e) {{ read.push("unreadable"); }}
    try {{ const r = await fetch(base + "/v1/sessions", {{mode: "no-cors"}}); read.push(r.type + ":" + (await r.text())); }} catch (e) {{ read.push("unreadable"); }}
  }}
  // Every request above was answered: tell the test.
  new Image().src = "/done?" + encodeURIComponent(read.join("|"));
}})();
</script>"#,
        targets = Value::Array(targets)
    );
    let (site, done) = attacker(page);
    let _browser = Browser::open(&format!("{site}/attack"));
    let read = done
        .recv_timeout(Duration::from_secs(120))
        .expect("the page never finished its requests");

    for session in ["same-site", "cross-site"] {
        assert!(
            !markers.path().join(session).exists(),
            "the {session} page ran a command on the server"
        );
    }
    for session in ["same-site", "cross-site"] {
        assert_eq!(calls(&s, session), Vec::<Value>::new(), "the {session} page delegated");
    }
    assert_eq!(sessions(&s), ["cross-site", "same-site"], "the pages created sessions");
    assert!(!read.contains("session"), "the page read: {read}");
}

#[test]
fn a_foreign_host_is_refused_without_a_key_and_loopback_names_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("private");
    let port = port_of(&s);
    let (status, body) = send_raw(&s, "GET /v1/sessions HTTP/1.1\r\nHost: evil.example", "");
    assert_eq!(status, 403, "{body}");
    assert_eq!(code(&body), "forbidden_host", "{body}");
    assert!(!body.contains("private"), "the refusal shows session data: {body}");
    assert!(body.contains("evil.example"), "it names the Host refused: {body}");
    let (status, body) = send_raw(
        &s,
        &format!("GET /v1/sessions/private HTTP/1.1\r\nHost: evil.example:{port}"),
        "",
    );
    assert_eq!((status, code(&body).as_str()), (403, "forbidden_host"), "{body}");

    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        "localhost".into(),
    ] {
        let (status, body) = send_raw(&s, &format!("GET /v1/sessions HTTP/1.1\r\nHost: {host}"), "");
        assert_eq!(status, 200, "Host: {host}: {body}");
        assert!(body.contains("private"), "{body}");
    }
}

#[test]
fn a_post_from_another_origin_is_refused_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), None, &["--allow-command"]);
    s.open("s");
    let marker = dir.path().join("marker");
    let body = delegation_touching(&marker);
    let json = "Content-Type: application/json";
    let (status, answer) = post(
        &s,
        "/v1/sessions/s/delegate",
        &[json, "Origin: http://evil.example"],
        &body,
    );
    assert_eq!(status, 403, "{answer}");
    assert_eq!(code(&answer), "cross_origin", "{answer}");
    assert!(answer.contains("evil.example"), "it names the origin: {answer}");
    assert!(!marker.exists(), "the command ran");
    assert_eq!(calls(&s, "s"), Vec::<Value>::new());
    let (status, answer) = post(
        &s,
        "/v1/sessions/t/turn",
        &[json, "Origin: null"],
        r#"{"state": "busy"}"#,
    );
    assert_eq!((status, code(&answer).as_str()), (403, "cross_origin"), "{answer}");
    assert_eq!(sessions(&s), ["s"], "nothing created");
}

#[test]
fn a_request_a_browser_marks_cross_site_or_same_site_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("s");
    let body = json!({"tasks": [{"goal": "g", "runner": sim(0)}]}).to_string();
    for site in ["cross-site", "same-site"] {
        let header = format!("Sec-Fetch-Site: {site}");
        let (status, answer) = post(
            &s,
            "/v1/sessions/s/delegate",
            &["Content-Type: application/json", &header],
            &body,
        );
        assert_eq!(
            (status, code(&answer).as_str()),
            (403, "cross_origin"),
            "{site}: {answer}"
        );
    }
    assert_eq!(calls(&s, "s"), Vec::<Value>::new());
}

#[test]
fn the_servers_own_origin_and_same_origin_requests_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("s");
    let port = port_of(&s);
    let origin = format!("Origin: http://127.0.0.1:{port}");
    let (status, answer) = post(
        &s,
        "/v1/sessions/s/turn",
        &["Content-Type: application/json", &origin, "Sec-Fetch-Site: same-origin"],
        r#"{"state": "busy"}"#,
    );
    assert_eq!(status, 200, "{answer}");
    let (status, page) = send_raw(
        &s,
        &format!("GET /ui HTTP/1.1\r\nHost: localhost:{port}\r\nSec-Fetch-Site: cross-site"),
        "",
    );
    assert_eq!(status, 200, "a link from elsewhere opens the page: {page}");
}

#[test]
fn a_body_not_declared_json_is_refused_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), None, &["--allow-command"]);
    s.open("s");
    let marker = dir.path().join("marker");
    let body = delegation_touching(&marker);
    for extra in [&["Content-Type: text/plain;charset=UTF-8"][..], &[]] {
        let (status, answer) = post(&s, "/v1/sessions/s/delegate", extra, &body);
        assert_eq!(status, 415, "{extra:?}: {answer}");
        assert_eq!(code(&answer), "unsupported_media_type", "{answer}");
        assert!(answer.contains("application/json"), "it says what to send: {answer}");
    }
    assert!(!marker.exists(), "the command ran");
    assert_eq!(calls(&s, "s"), Vec::<Value>::new());
    let (status, answer) = post(
        &s,
        "/v1/sessions/s/turn",
        &["Content-Type: application/json; charset=utf-8"],
        r#"{"state": "busy"}"#,
    );
    assert_eq!(status, 200, "a charset is fine: {answer}");
}

#[test]
fn a_post_without_a_body_needs_no_content_type() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("s");
    let call = s.delegate_timed("s", &[60_000]);
    let (status, answer) = post(&s, &format!("/v1/calls/{call}/cancel"), &[], "");
    assert_eq!(status, 200, "{answer}");
    let port = port_of(&s);
    let (status, answer) = send_raw(
        &s,
        &format!("POST /v1/calls/{call}/cancel HTTP/1.1\r\nHost: 127.0.0.1:{port}"),
        "",
    );
    assert_eq!(status, 200, "no Content-Length at all: {answer}");
}

#[test]
fn allowed_hosts_are_served_and_others_still_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), None, &["--allowed-hosts", "brood.example"]);
    let (status, body) = send_raw(&s, "GET /v1/sessions HTTP/1.1\r\nHost: brood.example", "");
    assert_eq!(status, 200, "{body}");
    let (status, body) = send_raw(&s, "GET /v1/sessions HTTP/1.1\r\nHost: evil.example", "");
    assert_eq!((status, code(&body).as_str()), (403, "forbidden_host"), "{body}");
    assert!(body.contains("brood.example"), "it lists the names served: {body}");
}

#[test]
fn a_server_with_a_key_answers_any_host_unless_allowed_hosts_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Some("k"));
    let (status, body) = send_raw(
        &s,
        "GET /v1/sessions HTTP/1.1\r\nHost: 10.1.2.3:7070\r\nAuthorization: Bearer k",
        "",
    );
    assert_eq!(status, 200, "reached by another address: {body}");
    drop(s);
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), Some("k"), &["--allowed-hosts", "brood.example"]);
    let (status, body) = send_raw(
        &s,
        "GET /v1/sessions HTTP/1.1\r\nHost: 10.1.2.3:7070\r\nAuthorization: Bearer k",
        "",
    );
    assert_eq!((status, code(&body).as_str()), (403, "forbidden_host"), "{body}");
}
