//! brood's MCP server (`server/src/mcp`) as an agent runtime meets it: driven by the official
//! MCP Python SDK (`mcp` 2.3.0 on PyPI) over each transport — streamable HTTP to a `brood
//! serve` with a key, stdio to `brood mcp` on an engine of its own, and stdio to `brood mcp
//! --url` relaying to a server — by `tests/mcp/drive.py` (list the tools, delegate sim children,
//! collect their envelope at a boundary, ack it, see them delivered; a bad argument, an unknown
//! tool, the resources). Beside it, the HTTP transport's framing over raw HTTP: the key, the
//! refusals of what is not a message, notifications, `GET`, every reply held to the OpenAPI
//! document's description of `/mcp`.
//!
//! The SDK runs on the interpreter at `BROOD_TEST_PYTHON`, else `.test-env/python/bin/python`
//! (the virtual environment `.ci/test` makes); without one that has the SDK these tests fail and
//! say so. `BROOD_TEST_PYTHON` is kept from every process started here: it is the tests' own
//! setting, none of brood's.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod server;
mod subprocess;
use server::{free_port, Server};
use subprocess::{repo, run, test_python, PYTHON_VAR};

/// The SDK's version the tests are written against.
const SDK_VERSION: &str = "2.3.0";

/// How long one Python run may take before it is killed and the test fails.
const PYTHON_TIMEOUT: Duration = Duration::from_secs(90);

const KEY: &str = "mcp-test-key";

/// The interpreter with the MCP SDK, or a failure that says how to get one.
fn python() -> PathBuf {
    let python = test_python();
    let found = Command::new(&python)
        .args(["-c", "import importlib.metadata as m; print(m.version('mcp'))"])
        .env_remove(PYTHON_VAR)
        .output();
    match found {
        Ok(out) if out.status.success() => {
            let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
            assert_eq!(
                version,
                SDK_VERSION,
                "{} has mcp {version}; these tests are written against mcp {SDK_VERSION} (run .ci/test)",
                python.display()
            );
            python
        }
        _ => panic!(
            "no Python with the MCP SDK at {} (set {PYTHON_VAR}, or run .ci/test, which makes .test-env/python \
             with `pip install mcp=={SDK_VERSION}`)",
            python.display()
        ),
    }
}

/// `brood serve` with `key`, started without [`PYTHON_VAR`] in its environment.
fn serve(dir: &Path, key: Option<&str>) -> Server {
    let port = free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_brood"));
    cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(dir)
        .env_remove("BROOD_API_KEY")
        .env_remove(PYTHON_VAR)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(k) = key {
        cmd.args(["--api-key", k]);
    }
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into();
    let mut server = Server {
        child: cmd.spawn().expect("start brood serve"),
        base: format!("http://127.0.0.1:{port}"),
        key: key.map(str::to_string),
        agent,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
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

/// Runs `tests/mcp/drive.py` with `args` to its end; fails the test with its output unless it
/// passed.
fn drive(args: &[&str]) {
    let mut cmd = Command::new(python());
    cmd.arg(repo("tests/mcp/drive.py"))
        .args(args)
        .env_remove(PYTHON_VAR)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    let done = run(cmd, "the Python interpreter", PYTHON_TIMEOUT);
    let (out, err, status) = (&done.stdout, &done.stderr, done.status);
    let passed = status.is_some_and(|s| s.success()) && out.lines().last() == Some("ok");
    assert!(
        passed,
        "drive.py {args:?} failed ({status:?})\n--- stdout\n{out}\n--- stderr\n{err}"
    );
}

#[test]
fn the_python_sdk_works_with_brood_over_streamable_http() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), Some(KEY));
    drive(&["http", &format!("{}/mcp", server.base), "--key", KEY]);
}

#[test]
fn the_python_sdk_works_with_brood_mcp_over_stdio_on_its_own_engine() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_string_lossy();
    drive(&["stdio", env!("CARGO_BIN_EXE_brood"), "--", "mcp", "--data-dir", &data]);
}

#[test]
fn the_python_sdk_works_with_brood_mcp_over_stdio_relaying_to_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), Some(KEY));
    drive(&[
        "stdio",
        env!("CARGO_BIN_EXE_brood"),
        "--",
        "mcp",
        "--url",
        &server.base,
        "--api-key",
        KEY,
    ]);
}

/// `POST /mcp` with `body` and `headers` (the key added when `key`): status, parsed body
/// (`null` when empty), checked against the document's description of `/mcp`.
fn post(server: &Server, body: &str, key: bool, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut r = server
        .agent
        .post(&format!("{}/mcp", server.base))
        .header("Content-Type", "application/json");
    if key {
        r = r.header("Authorization", format!("Bearer {KEY}"));
    }
    for (name, value) in headers {
        r = r.header(*name, *value);
    }
    let mut reply = r.send(body.as_bytes()).expect("POST /mcp");
    let status = reply.status().as_u16();
    let text = reply.body_mut().read_to_string().unwrap_or_default();
    let value = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
    };
    conforms(status, &value);
    (status, value)
}

/// Holds a reply of `POST /mcp` to the OpenAPI document.
fn conforms(status: u16, body: &Value) {
    let doc = brood_server::openapi_document(&brood_server::config::ServeConfig::default());
    let response = &doc["paths"]["/mcp"]["post"]["responses"][status.to_string()];
    assert!(response.is_object(), "{status} is not a documented reply of POST /mcp");
    let Some(schema) = response.pointer("/content/application~1json/schema") else {
        assert_eq!(*body, Value::Null, "{status} has no documented body");
        return;
    };
    let mut rooted = schema.clone();
    rooted["components"] = doc["components"].clone();
    let validator = jsonschema::draft202012::new(&rooted).expect("the schema compiles");
    let errors: Vec<String> = validator.iter_errors(body).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{status} {body}: {errors:?}");
}

const INITIALIZE: &str = r#"{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}"#;

#[test]
fn a_request_without_the_key_is_refused_401() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), Some(KEY));
    let (status, body) = post(&server, INITIALIZE, false, &[]);
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("unauthorized")),
        "{body}"
    );
    let (status, body) = post(&server, INITIALIZE, true, &[]);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["protocolVersion"], "2025-06-18", "{body}");
}

#[test]
fn what_is_not_a_message_is_answered_400_with_the_json_rpc_error() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), Some(KEY));
    for (body, code) in [
        ("{not json", -32700),
        (r#"[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]"#, -32600),
        (r#"{"jsonrpc": "2.0", "id": 1}"#, -32600),
        (r#"{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": 3}"#, -32602),
    ] {
        let (status, reply) = post(&server, body, true, &[]);
        assert_eq!(
            (status, reply["error"]["code"].as_i64()),
            (400, Some(code)),
            "{body}: {reply}"
        );
    }
    let ping = r#"{"jsonrpc": "2.0", "id": 2, "method": "ping"}"#;
    let (status, reply) = post(&server, ping, true, &[("MCP-Protocol-Version", "2026-07-28")]);
    assert_eq!(status, 400, "{reply}");
    assert_eq!(reply["error"]["data"]["requested"], "2026-07-28", "{reply}");
    let (status, reply) = post(&server, ping, true, &[("MCP-Protocol-Version", "2025-11-25")]);
    assert_eq!((status, &reply["result"]), (200, &json!({})), "{reply}");
}

#[test]
fn unknown_methods_and_tools_are_json_rpc_errors_and_notifications_are_taken_202() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), Some(KEY));
    let (status, reply) = post(
        &server,
        r#"{"jsonrpc": "2.0", "id": "d", "method": "server/discover"}"#,
        true,
        &[],
    );
    assert_eq!(
        (status, reply["error"]["code"].as_i64(), &reply["id"]),
        (200, Some(-32601), &json!("d"))
    );
    let call = r#"{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "deploy"}}"#;
    let (status, reply) = post(&server, call, true, &[]);
    assert_eq!(
        (status, reply["error"]["code"].as_i64()),
        (200, Some(-32602)),
        "{reply}"
    );
    let note = r#"{"jsonrpc": "2.0", "method": "notifications/initialized"}"#;
    assert_eq!(post(&server, note, true, &[]), (202, Value::Null));
    let mut get = server
        .agent
        .get(&format!("{}/mcp", server.base))
        .header("Authorization", format!("Bearer {KEY}"))
        .call()
        .expect("GET /mcp");
    assert_eq!(get.status().as_u16(), 405, "{:?}", get.body_mut().read_to_string());
    assert_eq!(get.headers().get("allow").and_then(|v| v.to_str().ok()), Some("POST"));
}

#[test]
fn the_bridge_answers_a_request_the_server_refused_with_a_json_rpc_error() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), Some(KEY));
    // The endpoint's own URL works as well as the server's.
    let endpoint = format!("{}/mcp", server.base);
    let mut bridge = Command::new(env!("CARGO_BIN_EXE_brood"))
        .args(["mcp", "--url", &endpoint, "--api-key", "wrong-key"])
        .env_remove("BROOD_API_KEY")
        .env_remove(PYTHON_VAR)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start brood mcp --url");
    let mut stdin = bridge.stdin.take().expect("stdin");
    writeln!(stdin, "{INITIALIZE}").expect("write a request");
    drop(stdin);
    let mut line = String::new();
    BufReader::new(bridge.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read the answer");
    let _ = bridge.wait();
    let answer: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    assert_eq!(answer["id"], 1, "{answer}");
    assert_eq!(answer["error"]["data"]["status"], 401, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("unauthorized")),
        "{answer}"
    );
}

/// Calls tool `name` with `arguments` over `POST /mcp`: its result (`structuredContent`, or the
/// whole result when it is an error).
fn tool(server: &Server, name: &str, arguments: Value) -> Value {
    let body =
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": name, "arguments": arguments}});
    let (status, reply) = post(server, &body.to_string(), true, &[]);
    assert_eq!(status, 200, "{reply}");
    let result = &reply["result"];
    if result["isError"] == json!(true) {
        return result.clone();
    }
    result["structuredContent"].clone()
}

/// The `boundary` tool keeps the envelope within `max_items`, and with `ack` acks the session's
/// previous envelope before it collects the next (one call where two were needed); an `ack` of
/// a claim that is not the session's is refused, and nothing is collected.
#[test]
fn the_boundary_tool_bounds_its_envelope_and_acks_the_previous_one() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), Some(KEY));
    let tasks: Vec<Value> = (0..3)
        .map(|i| json!({"goal": format!("t{i}"), "runner": {"kind": "sim"}}))
        .collect();
    let delegated = tool(
        &server,
        "delegate",
        json!({"session_id": "m", "tasks": tasks, "independent_completions": true}),
    );
    assert!(delegated["call_id"].is_string(), "{delegated}");
    // Until all three results are ready, bounded to one item each time.
    let first = loop {
        let status = tool(&server, "status", json!({"session_id": "m"}));
        if status["counts"]["ready"] == 3 {
            break tool(&server, "boundary", json!({"session_id": "m", "max_items": 1}));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(first["items"].as_array().map(Vec::len), Some(1), "{first}");
    assert_eq!(first["more"], true, "{first}");
    let claim = first["claim_id"].as_str().expect("a claim").to_string();
    let refused = tool(&server, "boundary", json!({"session_id": "other", "ack": claim}));
    assert_eq!(refused["isError"], true, "{refused}");
    let second = tool(
        &server,
        "boundary",
        json!({"session_id": "m", "ack": claim, "max_items": 5}),
    );
    assert_eq!(second["items"].as_array().map(Vec::len), Some(2), "{second}");
    let counts = &tool(&server, "status", json!({"session_id": "m"}))["counts"];
    assert_eq!(
        (counts["delivered"].as_u64(), counts["claimed"].as_u64()),
        (Some(1), Some(2)),
        "{counts}"
    );
}
