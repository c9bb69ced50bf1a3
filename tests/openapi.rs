//! The OpenAPI document (`GET /v1/openapi.json`, generated from the server's contract types)
//! holds to what the real server answers: a realistic sequence of requests — sessions,
//! background and sync delegation, boundaries with and without an envelope, ack, release, a
//! lost claim, a dead letter, an outside worker, every kind of refusal — is checked reply by
//! reply against the document's schema for that path, method and status (with the
//! `jsonschema` crate, JSON Schema 2020-12 as OpenAPI 3.1 has it), and what the server accepted
//! against its request schema. Every path the server answers is in the document with exactly
//! its methods, and any other method is answered 405 naming them in `Allow`.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod server;
use server::*;

const KEY: &str = "openapi-key";

/// The document of a server with the default configuration.
fn document() -> Value {
    brood_server::openapi_document(&brood_server::config::ServeConfig::default())
}

struct Doc {
    root: Value,
}

impl Doc {
    /// What is wrong with `value` against `schema` (a schema of the document: its `$ref`s point
    /// into the document's components); empty when it is valid.
    fn validate(&self, schema: &Value, value: &Value) -> Vec<String> {
        let mut rooted = schema.clone();
        match rooted.as_object_mut() {
            Some(map) => {
                map.insert("components".into(), self.root["components"].clone());
            }
            None => return Vec::new(), // `true` or `false`: nothing to compile.
        }
        let validator = jsonschema::draft202012::new(&rooted)
            .unwrap_or_else(|e| panic!("the document holds a schema that does not compile ({e}): {schema}"));
        validator
            .iter_errors(value)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect()
    }

    /// The path template of the document a request path is an instance of (literal segments
    /// preferred over parameters), with its path item.
    fn path_item(&self, path: &str) -> Option<(&str, &Value)> {
        let path = path.split('?').next().unwrap_or(path);
        let segments: Vec<&str> = path.split('/').collect();
        self.root["paths"]
            .as_object()
            .unwrap()
            .iter()
            .filter_map(|(template, item)| {
                let parts: Vec<&str> = template.split('/').collect();
                if parts.len() != segments.len() {
                    return None;
                }
                let mut literal = 0;
                for (p, s) in parts.iter().zip(&segments) {
                    if p.starts_with('{') && p.ends_with('}') && !s.is_empty() {
                        continue;
                    }
                    if p != s {
                        return None;
                    }
                    literal += 1;
                }
                Some((literal, template.as_str(), item))
            })
            .max_by_key(|(literal, _, _)| *literal)
            .map(|(_, t, item)| (t, item))
    }
}

/// The server, with every exchange checked against the document and recorded.
struct Checked<'a> {
    server: &'a Server,
    doc: Doc,
    seen: RefCell<BTreeSet<(String, String, u16)>>,
}

impl Checked<'_> {
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let body = body.map(|b| b.to_string().into_bytes());
        self.exchange(method, path, body, self.server.key.as_deref())
    }

    /// Sends a request, checks the reply against the document and returns it parsed.
    fn exchange(&self, method: &str, path: &str, body: Option<Vec<u8>>, key: Option<&str>) -> (u16, Value) {
        let reply = self.server.send(method, path, body.clone(), key);
        let what = format!("{method} {path} → {}", reply.status);
        let (template, item) = self
            .doc
            .path_item(path)
            .unwrap_or_else(|| panic!("{what}: the path is not in the document"));
        let op = item
            .get(method.to_ascii_lowercase())
            .unwrap_or_else(|| panic!("{what}: {template} has no {method} in the document"));
        let response = op["responses"].get(reply.status.to_string()).unwrap_or_else(|| {
            panic!(
                "{what}: status {} of {method} {template} is not in the document",
                reply.status
            )
        });
        let value = self.check_reply(&what, response, &reply);
        // What the server accepted, the document must accept too.
        if (200..300).contains(&reply.status) {
            match (&op.get("requestBody"), &body) {
                (Some(request), Some(sent)) => {
                    let sent: Value = serde_json::from_slice(sent).unwrap();
                    let errors = self
                        .doc
                        .validate(&request["content"]["application/json"]["schema"], &sent);
                    assert!(
                        errors.is_empty(),
                        "{what}: the server accepted a body the document refuses:\n{}\n{sent}",
                        errors.join("\n")
                    );
                }
                (None, Some(_)) => panic!("{what}: the server accepted a body the document does not describe"),
                _ => {}
            }
        }
        self.seen
            .borrow_mut()
            .insert((method.to_string(), template.to_string(), reply.status));
        (reply.status, value)
    }

    /// The reply's body checked against the document's response: its media type, and a JSON
    /// body against its schema.
    fn check_reply(&self, what: &str, response: &Value, reply: &Reply) -> Value {
        let Some(content) = response.get("content").and_then(Value::as_object) else {
            assert!(
                reply.text.is_empty(),
                "{what}: the document has no body, the reply has {}",
                reply.text
            );
            return Value::Null;
        };
        assert_eq!(content.len(), 1, "{what}: one media type per response");
        let (media, media_item) = content.iter().next().unwrap();
        let got = reply.content_type.split(';').next().unwrap_or("").trim();
        let want = media.split(';').next().unwrap_or("").trim();
        assert_eq!(got, want, "{what}: Content-Type {}", reply.content_type);
        if media != "application/json" {
            return Value::String(reply.text.clone());
        }
        let value: Value =
            serde_json::from_str(&reply.text).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {}", reply.text));
        let errors = self.doc.validate(&media_item["schema"], &value);
        assert!(
            errors.is_empty(),
            "{what}: the reply does not match the document:\n{}\n{value}",
            errors.join("\n")
        );
        value
    }

    /// Boundaries until one answers with an envelope, each checked.
    fn envelope(&self, session: &str, lease_ms: u64) -> Value {
        until_envelope(session, lease_ms, |m, p, b| self.call(m, p, b))
    }
}

/// A reply with a field the document does not name, or a runner spec of no kind, fails the
/// check: the validation can fail.
#[test]
fn a_field_missing_from_the_document_is_refused() {
    let doc = Doc { root: document() };
    assert_eq!(doc.root["openapi"], "3.1.0");
    let schema = json!({"$ref": "#/components/schemas/ReleaseReply"});
    assert!(doc
        .validate(&schema, &json!({"claim_id": "c", "released": true}))
        .is_empty());
    assert_eq!(
        doc.validate(&schema, &json!({"claim_id": "c", "released": true, "new": 1}))
            .len(),
        1
    );
    let runner = json!({"$ref": "#/components/schemas/Runner"});
    assert!(doc.validate(&runner, &json!({"kind": "sim", "ms": 5})).is_empty());
    assert!(
        !doc.validate(&runner, &json!({"kind": "sim", "argv": ["x"]})).is_empty(),
        "a sim runner with a command's field matches no branch"
    );
    let redrive = json!({"$ref": "#/components/schemas/RedriveBody"});
    assert!(doc.validate(&redrive, &json!({"all": true, "limit": 3})).is_empty());
    assert!(!doc
        .validate(&redrive, &json!({"all": true, "session_id": "s"}))
        .is_empty());
    assert!(!doc.validate(&redrive, &json!({"all": false})).is_empty());
}

/// Every `$ref` of the document names a schema it holds (a parameter's schema too), so
/// generators of clients can read it whole.
#[test]
fn every_reference_of_the_document_resolves() {
    fn refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    out.push(r);
                }
                m.values().for_each(|v| refs(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let doc = document();
    let mut found = Vec::new();
    refs(&doc, &mut found);
    let dangling: Vec<&str> = found
        .into_iter()
        .filter(|r| r.strip_prefix('#').is_none_or(|p| doc.pointer(p).is_none()))
        .collect();
    assert!(dangling.is_empty(), "references to nothing: {dangling:?}");
}

/// The paths and methods the server registers (its route table) and those of the document are
/// the same.
#[test]
fn every_route_the_server_registers_is_documented_and_nothing_else() {
    let doc = document();
    let mut documented: Vec<(String, Vec<String>)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(path, item)| {
            let mut methods: Vec<String> = item.as_object().unwrap().keys().map(|m| m.to_uppercase()).collect();
            methods.sort();
            (path.clone(), methods)
        })
        .collect();
    documented.sort();
    let mut served: Vec<(String, Vec<String>)> = brood_server::routes()
        .into_iter()
        .map(|(path, methods)| {
            let mut methods: Vec<String> = methods.iter().map(|m| m.to_string()).collect();
            methods.sort();
            (path.to_string(), methods)
        })
        .collect();
    served.sort();
    assert!(served.len() > 20, "{served:?}");
    assert_eq!(served, documented);
}

/// A method a path does not answer is 405, with `Allow` naming those it does, in the error
/// shape; a path the server does not have stays 404.
#[test]
fn undeclared_methods_are_answered_405_with_allow() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), Some(KEY));
    let doc = Doc { root: document() };
    for (path, methods) in brood_server::routes() {
        let url = format!(
            "{}{}",
            server.base,
            path.replace("{session_id}", "s").replace(['{', '}'], "")
        );
        for method in ["DELETE", "PATCH", "PUT", "POST", "GET"] {
            if methods.contains(&method) {
                continue;
            }
            let request = ureq::http::Request::builder()
                .method(method)
                .uri(&url)
                .header("Authorization", format!("Bearer {KEY}"))
                .header("Content-Type", "application/json")
                .body(())
                .unwrap();
            let mut reply = server
                .agent
                .run(request)
                .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
            assert_eq!(reply.status().as_u16(), 405, "{method} {path}");
            let allow = reply
                .headers()
                .get("allow")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let mut allowed: Vec<&str> = allow.split(", ").collect();
            allowed.sort();
            let mut want = methods.to_vec();
            want.sort();
            assert_eq!(allowed, want, "{method} {path}: Allow: {allow}");
            let body: Value = serde_json::from_str(&reply.body_mut().read_to_string().unwrap()).unwrap();
            assert!(
                doc.validate(&json!({"$ref": "#/components/schemas/ErrorReply"}), &body)
                    .is_empty(),
                "{body}"
            );
            assert_eq!(body["error"]["code"], "method_not_allowed", "{body}");
        }
    }
    let (status, _) = server.call("GET", "/v1/no-such-endpoint", None);
    assert_eq!(status, 404);
}

/// The document a server serves states the bounds of its configuration.
#[test]
fn the_document_served_states_the_servers_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), Some(KEY), &["--max-tasks-per-call", "7"]);
    let (status, served) = server.call("GET", "/v1/openapi.json", None);
    assert_eq!(status, 200);
    assert_eq!(
        served["components"]["schemas"]["DelegateBody"]["properties"]["tasks"]["maxItems"],
        7
    );
    let (status, reply) = server.call(
        "POST",
        "/v1/sessions/s/delegate",
        Some(json!({"tasks": vec![json!({"goal": "g", "runner": sim(0)}); 8]})),
    );
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (400, Some("too_many_tasks")),
        "{reply}"
    );
}

#[test]
fn real_replies_validate_against_the_document() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(
        dir.path(),
        Some(KEY),
        &["--body-limit", "4096", "--max-delivery-attempts", "1"],
    );
    let c = Checked {
        server: &server,
        doc: Doc { root: document() },
        seen: RefCell::default(),
    };
    documents_and_probes(&c);
    sessions_and_delegation(&c);
    boundaries_and_claims(&c);
    dead_letters_and_redrive(&c);
    refusals(&c);
    an_outside_worker(&c);
    every_expected_reply_was_seen(&c);
}

/// The document itself, and the probes outside `/v1`.
fn documents_and_probes(c: &Checked<'_>) {
    // The document served is the generated one.
    let (_, served) = c.call("GET", "/v1/openapi.json", None);
    assert_eq!(served, c.doc.root);
    c.exchange("GET", "/v1/openapi.json", None, None);
    c.exchange("GET", "/healthz", None, None);
    c.exchange("GET", "/metrics", None, None);
}

/// Sessions, wake-capable and not; background, sync and forced-sync delegation; listings.
fn sessions_and_delegation(c: &Checked<'_>) {
    // Sessions: wake-capable, and one that is not.
    c.call(
        "PUT",
        "/v1/sessions/o",
        Some(json!({"addressable": true, "max_concurrent_children": 4})),
    );
    c.call("PUT", "/v1/sessions/plain", None);
    c.call("POST", "/v1/sessions/o/turn", Some(json!({"state": "busy"})));
    c.call("POST", "/v1/sessions/o/turn", Some(json!({"state": "idle"})));

    // Delegation: background, sync, and background forced to sync.
    let tasks = json!([
        {"goal": "a", "runner": {"kind": "sim", "ms": 0, "summary": "done a"}, "group": "g", "timeout_ms": 60000},
        {"goal": "b", "runner": {"kind": "sim", "outcome": "fail"}, "stall_ms": 60000, "rerun_on_recovery": true},
    ]);
    let (status, _) = c.call(
        "POST",
        "/v1/sessions/o/delegate",
        Some(json!({"tasks": tasks, "independent_completions": true})),
    );
    assert_eq!(status, 202);
    let (status, _) = c.call(
        "POST",
        "/v1/sessions/o/delegate",
        Some(json!({"tasks": [{"goal": "s", "runner": sim(0)}], "mode": "sync"})),
    );
    assert_eq!(status, 200);
    let (status, forced) = c.call(
        "POST",
        "/v1/sessions/plain/delegate",
        Some(json!({"tasks": [{"goal": "p", "runner": sim(0)}]})),
    );
    assert_eq!((status, forced["mode"].as_str()), (200, Some("sync")));
    c.call("GET", "/v1/sessions/o", None);
    let (_, page) = c.call("GET", "/v1/sessions?limit=1", None);
    assert_eq!(page["next"], "o", "{page}");
    let (_, page) = c.call("GET", "/v1/sessions?after=o", None);
    assert_eq!(page["next"], Value::Null, "{page}");
    let (status, _) = c.call("GET", "/v1/sessions?limit=0", None);
    assert_eq!(status, 400);
    let (status, _) = c.call("GET", "/v1/sessions?prefix=o&state=busy", None);
    assert_eq!(status, 200);
    let (status, _) = c.call("GET", "/v1/sessions?state=sleepy", None);
    assert_eq!(status, 400);
}

/// A boundary with nothing ready, then envelopes: ack, ack again, a busy release, a lost claim.
fn boundaries_and_claims(c: &Checked<'_>) {
    // A boundary with nothing ready, then envelopes: ack, ack again, a busy release.
    let (status, _) = c.call("POST", "/v1/sessions/plain/boundary", Some(json!({"consumer": "t"})));
    assert_eq!(status, 204);
    let env = c.envelope("o", 30_000);
    let claim = env["claim_id"].as_str().unwrap().to_string();
    c.call("GET", "/v1/sessions/o", None);
    c.call("POST", &format!("/v1/claims/{claim}/ack"), None);
    c.call("POST", &format!("/v1/claims/{claim}/ack"), None);
    let (_, page) = c.call("GET", "/v1/sessions/o/deliveries", None);
    assert!(!page["deliveries"].as_array().unwrap().is_empty(), "{page}");
    let (status, _) = c.call("GET", "/v1/sessions/o/deliveries?limit=0", None);
    assert_eq!(status, 400);
    let (status, _) = c.call("GET", "/v1/sessions/nobody/deliveries", None);
    assert_eq!(status, 404);
    c.call(
        "POST",
        "/v1/sessions/o/delegate",
        Some(json!({"tasks": [{"goal": "r", "runner": sim(0)}]})),
    );
    let env = c.envelope("o", 30_000);
    let claim = env["claim_id"].as_str().unwrap().to_string();
    c.call(
        "POST",
        &format!("/v1/claims/{claim}/release"),
        Some(json!({"reason": "busy", "retry_after_ms": 0})),
    );
    // The released claim is lost: its ack is refused.
    let (status, _) = c.call("POST", &format!("/v1/claims/{claim}/ack"), None);
    assert_eq!(status, 409);
    let (status, _) = c.call(
        "POST",
        &format!("/v1/claims/{claim}/release"),
        Some(json!({"reason": "busy"})),
    );
    assert_eq!(status, 409);
}

/// With one delivery attempt allowed, a failed release makes a dead letter; its listing and
/// redrive, and the call read from the ledger.
fn dead_letters_and_redrive(c: &Checked<'_>) {
    // With one delivery attempt allowed, a failed release makes a dead letter.
    let env = c.envelope("o", 30_000);
    let claim = env["claim_id"].as_str().unwrap().to_string();
    c.call(
        "POST",
        &format!("/v1/claims/{claim}/release"),
        Some(json!({"reason": "failed"})),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, dead) = c.call("GET", "/v1/dead-letters", None);
        if !dead["items"].as_array().unwrap().is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "no dead letter in 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, mine) = c.call("GET", "/v1/dead-letters?session_id=o", None);
    assert_eq!(
        (status, mine["items"].as_array().map(Vec::len)),
        (200, Some(1)),
        "{mine}"
    );
    let (status, _) = c.call("GET", "/v1/dead-letters?session=o", None);
    assert_eq!(status, 400, "an unknown query key is refused");
    for bad in [
        json!({}),
        json!({"all": false}),
        json!({"child_ids": []}),
        json!({"all": true, "session_id": "o"}),
        json!({"all": true, "limit": 0}),
        json!({"all": true, "every": true}),
    ] {
        let (status, body) = c.call("POST", "/v1/dead-letters/redrive", Some(bad.clone()));
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (400, Some("invalid_request")),
            "{bad}: {body}"
        );
    }
    let (status, none) = c.call(
        "POST",
        "/v1/dead-letters/redrive",
        Some(json!({"child_ids": ["deleg_00000000000000ff.0"]})),
    );
    assert_eq!((status, none["redriven"].as_u64()), (200, Some(0)), "{none}");
    let (status, redriven) = c.call(
        "POST",
        "/v1/dead-letters/redrive",
        Some(json!({"session_id": "o", "limit": 5})),
    );
    assert_eq!((status, redriven["redriven"].as_u64()), (200, Some(1)), "{redriven}");
    let env = c.envelope("o", 30_000);
    assert_eq!(env["items"][0]["delivery_attempt"], 1, "{env}");
    let call = env["items"][0]["call_id"].as_str().unwrap().to_string();
    let (status, all) = c.call("GET", "/v1/sessions/o?delivered=true&limit=1", None);
    assert_eq!((status, all["calls"].as_array().map(Vec::len)), (200, Some(1)), "{all}");
    let (status, _) = c.call("GET", "/v1/sessions/o?delivered=maybe", None);
    assert_eq!(status, 400);
    let (status, view) = c.call("GET", &format!("/v1/calls/{call}"), None);
    assert_eq!((status, view["session_id"].as_str()), (200, Some("o")), "{view}");
    let (status, _) = c.call("GET", "/v1/calls/deleg_00000000000000ff", None);
    assert_eq!(status, 404);
    let claim = env["claim_id"].as_str().unwrap().to_string();
    c.call(
        "POST",
        &format!("/v1/claims/{claim}/release"),
        Some(json!({"reason": "failed"})),
    );
}

/// Refusals, each in the error shape of its status.
fn refusals(c: &Checked<'_>) {
    // Refusals, each in the error shape of its status.
    let bad: [(&str, &str, Value); 6] = [
        ("POST", "/v1/sessions/o/delegate", json!({"tasks": []})),
        (
            "POST",
            "/v1/sessions/o/delegate",
            json!({"tasks": [{"goal": "x", "runner": {"kind": "nope"}}]}),
        ),
        (
            "POST",
            "/v1/sessions/o/boundary",
            json!({"consumer": "t", "lease_ms": 5}),
        ),
        ("POST", "/v1/sessions/o/turn", json!({"state": "asleep"})),
        ("PUT", "/v1/sessions/o", json!({"max_concurrent_children": "many"})),
        ("POST", "/v1/claims/x/release", json!({})),
    ];
    for (method, path, body) in bad {
        let (status, reply) = c.call(method, path, Some(body));
        assert_eq!(status, 400, "{method} {path}: {reply}");
    }
    let (status, _) = c.exchange(
        "POST",
        "/v1/sessions/o/delegate",
        Some(b"{not json".to_vec()),
        Some(KEY),
    );
    assert_eq!(status, 400);
    let command = json!({"tasks": [{"goal": "x", "runner": {"kind": "command", "argv": ["true"]}}]});
    let (status, _) = c.call("POST", "/v1/sessions/o/delegate", Some(command));
    assert_eq!(status, 403);
    let (status, _) = c.call("GET", "/v1/sessions/nobody", None);
    assert_eq!(status, 404);
    let (status, _) = c.call("POST", "/v1/sessions/nobody/boundary", Some(json!({"consumer": "t"})));
    assert_eq!(status, 404);
    let (status, _) = c.call("POST", "/v1/claims/nothing/ack", None);
    assert_eq!(status, 404);
    let (status, _) = c.exchange("GET", "/v1/sessions/o", None, Some("wrong"));
    assert_eq!(status, 401);
    let (status, _) = c.exchange("POST", "/v1/sessions/o/delegate", None, None);
    assert_eq!(status, 401);
    let big = json!({"tasks": [{"goal": "x".repeat(5000), "runner": sim(0)}]});
    let (status, _) = c.call("POST", "/v1/sessions/o/delegate", Some(big));
    assert_eq!(status, 413);
    // A path no route matches answers 404 in the error shape too.
    let (status, reply) = c.server.call("GET", "/v1/no-such-endpoint", None);
    assert_eq!(status, 404);
    let errors = c
        .doc
        .validate(&json!({"$ref": "#/components/schemas/ErrorReply"}), &reply);
    assert!(errors.is_empty(), "{errors:?}");
}

/// An outside worker's round trip, and its refusals.
fn an_outside_worker(c: &Checked<'_>) {
    // An external worker's round trip, and its refusals.
    let (status, _) = c.call(
        "POST",
        "/v1/sessions/o/delegate",
        Some(json!({"tasks": [{"goal": "outside", "runner": {"kind": "external", "queue": "oa"}}]})),
    );
    assert_eq!(status, 202);
    let (status, work) = c.call(
        "POST",
        "/v1/workers/poll",
        Some(json!({"worker": "w", "queue": "oa", "wait_ms": 20000})),
    );
    assert_eq!(status, 200, "{work}");
    let (child, token) = (work["child_id"].as_str().unwrap(), work["token"].as_str().unwrap());
    let (status, _) = c.call("POST", "/v1/workers/poll", Some(json!({"worker": "w", "queue": "oa"})));
    assert_eq!(status, 204);
    c.call("POST", "/v1/workers/poll", Some(json!({"queue": "oa"})));
    let heartbeat = format!("/v1/children/{child}/heartbeat");
    let (status, _) = c.call("POST", &heartbeat, Some(json!({"token": token, "progress": "half"})));
    assert_eq!(status, 200);
    let (status, _) = c.call("POST", &heartbeat, Some(json!({"token": "not-the-token"})));
    assert_eq!(status, 409);
    let (status, _) = c.call(
        "POST",
        "/v1/children/deleg_00.0/heartbeat",
        Some(json!({"token": token})),
    );
    assert_eq!(status, 404);
    let complete = format!("/v1/children/{child}/complete");
    c.call("POST", &complete, Some(json!({"token": token, "status": "maybe"})));
    let (status, _) = c.call(
        "POST",
        &complete,
        Some(json!({"token": token, "status": "succeeded", "summary": "done outside"})),
    );
    assert_eq!(status, 200);
}

/// The sequence reached what it set out to check.
fn every_expected_reply_was_seen(c: &Checked<'_>) {
    let seen = c.seen.borrow();
    let expected: &[(&str, &str, u16)] = &[
        ("POST", "/v1/workers/poll", 200),
        ("POST", "/v1/workers/poll", 204),
        ("POST", "/v1/workers/poll", 400),
        ("POST", "/v1/children/{child_id}/heartbeat", 200),
        ("POST", "/v1/children/{child_id}/heartbeat", 404),
        ("POST", "/v1/children/{child_id}/heartbeat", 409),
        ("POST", "/v1/children/{child_id}/complete", 200),
        ("POST", "/v1/children/{child_id}/complete", 400),
        ("GET", "/healthz", 200),
        ("GET", "/metrics", 200),
        ("GET", "/v1/openapi.json", 200),
        ("GET", "/v1/openapi.json", 401),
        ("GET", "/v1/sessions", 200),
        ("GET", "/v1/sessions", 400),
        ("PUT", "/v1/sessions/{session_id}", 200),
        ("PUT", "/v1/sessions/{session_id}", 400),
        ("GET", "/v1/sessions/{session_id}", 200),
        ("GET", "/v1/sessions/{session_id}", 401),
        ("GET", "/v1/sessions/{session_id}", 404),
        ("POST", "/v1/sessions/{session_id}/turn", 200),
        ("POST", "/v1/sessions/{session_id}/turn", 400),
        ("POST", "/v1/sessions/{session_id}/delegate", 200),
        ("POST", "/v1/sessions/{session_id}/delegate", 202),
        ("POST", "/v1/sessions/{session_id}/delegate", 400),
        ("POST", "/v1/sessions/{session_id}/delegate", 401),
        ("POST", "/v1/sessions/{session_id}/delegate", 403),
        ("POST", "/v1/sessions/{session_id}/delegate", 413),
        ("POST", "/v1/sessions/{session_id}/boundary", 200),
        ("POST", "/v1/sessions/{session_id}/boundary", 204),
        ("POST", "/v1/sessions/{session_id}/boundary", 400),
        ("POST", "/v1/sessions/{session_id}/boundary", 404),
        ("POST", "/v1/claims/{claim_id}/ack", 200),
        ("POST", "/v1/claims/{claim_id}/ack", 404),
        ("POST", "/v1/claims/{claim_id}/ack", 409),
        ("POST", "/v1/claims/{claim_id}/release", 200),
        ("POST", "/v1/claims/{claim_id}/release", 400),
        ("POST", "/v1/claims/{claim_id}/release", 409),
        ("GET", "/v1/dead-letters", 200),
        ("GET", "/v1/dead-letters", 400),
        ("POST", "/v1/dead-letters/redrive", 200),
        ("GET", "/v1/calls/{call_id}", 200),
        ("GET", "/v1/sessions/{session_id}", 400),
        ("GET", "/v1/sessions/{session_id}/deliveries", 200),
        ("GET", "/v1/sessions/{session_id}/deliveries", 400),
        ("GET", "/v1/sessions/{session_id}/deliveries", 404),
        ("GET", "/v1/calls/{call_id}", 404),
        ("POST", "/v1/dead-letters/redrive", 400),
    ];
    for (method, template, status) in expected {
        assert!(
            seen.contains(&(method.to_string(), template.to_string(), *status)),
            "the sequence never got {status} from {method} {template}; it got {seen:?}"
        );
    }
}
