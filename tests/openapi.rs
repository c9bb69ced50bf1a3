//! The OpenAPI document (`GET /v1/openapi.json`, kept in server/src/openapi.json) holds to what
//! the real server answers: a realistic sequence of requests — sessions, background and sync
//! delegation, boundaries with and without an envelope, ack, release, a lost claim, a dead
//! letter, every kind of refusal — is checked reply by reply against the document's schema for
//! that path, method and status, and what the server accepted against its request schema.
//! Every route the server registers (server/src/lib.rs) must be in the document.
//!
//! The validator is written here for exactly the JSON Schema keywords the document uses, and a
//! keyword it does not know fails the test rather than passing unchecked.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod server;
use server::*;

const KEY: &str = "openapi-key";

/// The keywords [`Doc::validate`] checks, and the annotations it may skip.
const CHECKED: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "$ref",
    "minimum",
    "maximum",
    "minItems",
    "minLength",
    "oneOf",
];
const ANNOTATIONS: &[&str] = &["description", "default"];

fn document_file() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/server/src/openapi.json");
    let text = std::fs::read_to_string(path).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path} is not JSON: {e}"))
}

struct Doc {
    root: Value,
}

impl Doc {
    /// What a local `$ref` (`#/components/…`) points at.
    fn resolve<'a>(&'a self, reference: &str) -> &'a Value {
        let pointer = reference
            .strip_prefix('#')
            .unwrap_or_else(|| panic!("only local references are understood, not `{reference}`"));
        self.root
            .pointer(pointer)
            .unwrap_or_else(|| panic!("`{reference}` points at nothing"))
    }

    /// A response or parameter object, its `$ref` followed.
    fn follow<'a>(&'a self, v: &'a Value) -> &'a Value {
        match v.get("$ref").and_then(Value::as_str) {
            Some(r) => self.resolve(r),
            None => v,
        }
    }

    /// Every schema keyword below `schema` is one this validator knows; references resolve.
    fn check_keywords(&self, schema: &Value, at: &str) {
        let Some(map) = schema.as_object() else {
            panic!("{at}: a schema must be an object, not {schema}");
        };
        for (k, v) in map {
            assert!(
                CHECKED.contains(&k.as_str()) || ANNOTATIONS.contains(&k.as_str()),
                "{at}: the document uses the keyword `{k}`, which this test's validator does not check; teach it"
            );
            match k.as_str() {
                "$ref" => {
                    self.resolve(v.as_str().expect("$ref is a string"));
                }
                "properties" => {
                    for (name, sub) in v.as_object().expect("properties is an object") {
                        self.check_keywords(sub, &format!("{at}.properties.{name}"));
                    }
                }
                "items" => self.check_keywords(v, &format!("{at}.items")),
                "additionalProperties" if v.is_object() => {
                    self.check_keywords(v, &format!("{at}.additionalProperties"))
                }
                "oneOf" => {
                    for (i, sub) in v.as_array().expect("oneOf is an array").iter().enumerate() {
                        self.check_keywords(sub, &format!("{at}.oneOf[{i}]"));
                    }
                }
                _ => {}
            }
        }
    }

    /// Every schema of the document: components, parameters, request bodies and responses.
    fn all_schemas(&self) -> Vec<(String, &Value)> {
        fn walk<'a>(v: &'a Value, at: String, out: &mut Vec<(String, &'a Value)>) {
            match v {
                Value::Object(map) => {
                    for (k, sub) in map {
                        if k == "schema" {
                            out.push((format!("{at}.schema"), sub));
                        } else {
                            walk(sub, format!("{at}.{k}"), out);
                        }
                    }
                }
                Value::Array(items) => {
                    for (i, sub) in items.iter().enumerate() {
                        walk(sub, format!("{at}[{i}]"), out);
                    }
                }
                _ => {}
            }
        }
        let mut out = Vec::new();
        walk(&self.root["paths"], "paths".into(), &mut out);
        walk(&self.root["components"]["responses"], "responses".into(), &mut out);
        walk(&self.root["components"]["parameters"], "parameters".into(), &mut out);
        for (name, schema) in self.root["components"]["schemas"]
            .as_object()
            .expect("components.schemas")
        {
            out.push((format!("schemas.{name}"), schema));
        }
        out
    }

    /// Whether `v` is valid against `schema`; what is wrong goes to `errors`.
    fn validate(&self, schema: &Value, v: &Value, at: &str, errors: &mut Vec<String>) {
        let map = schema.as_object().expect("a schema is an object");
        for (k, rule) in map {
            match k.as_str() {
                "$ref" => self.validate(self.resolve(rule.as_str().unwrap()), v, at, errors),
                "type" => {
                    let types: Vec<&str> = match rule {
                        Value::String(t) => vec![t.as_str()],
                        Value::Array(ts) => ts.iter().map(|t| t.as_str().unwrap()).collect(),
                        _ => panic!("{at}: `type` must be a string or a list"),
                    };
                    if !types.iter().any(|t| has_type(v, t)) {
                        errors.push(format!("{at}: {v} is not of type {rule}"));
                    }
                }
                "enum" => {
                    if !rule.as_array().unwrap().contains(v) {
                        errors.push(format!("{at}: {v} is not one of {rule}"));
                    }
                }
                "minimum" | "maximum" => {
                    if let (Some(x), Some(bound)) = (v.as_f64(), rule.as_f64()) {
                        if (k == "minimum" && x < bound) || (k == "maximum" && x > bound) {
                            errors.push(format!("{at}: {v} is out of its {k} {rule}"));
                        }
                    }
                }
                "minItems" => {
                    if let Some(items) = v.as_array() {
                        if (items.len() as u64) < rule.as_u64().unwrap() {
                            errors.push(format!("{at}: fewer than {rule} items"));
                        }
                    }
                }
                "minLength" => {
                    if let Some(s) = v.as_str() {
                        if (s.chars().count() as u64) < rule.as_u64().unwrap() {
                            errors.push(format!("{at}: shorter than {rule}"));
                        }
                    }
                }
                "required" => {
                    if let Some(obj) = v.as_object() {
                        for name in rule.as_array().unwrap() {
                            if !obj.contains_key(name.as_str().unwrap()) {
                                errors.push(format!("{at}: `{}` is missing", name.as_str().unwrap()));
                            }
                        }
                    }
                }
                "properties" => {
                    if let Some(obj) = v.as_object() {
                        for (name, sub) in rule.as_object().unwrap() {
                            if let Some(field) = obj.get(name) {
                                self.validate(sub, field, &format!("{at}.{name}"), errors);
                            }
                        }
                    }
                }
                "additionalProperties" => {
                    if let Some(obj) = v.as_object() {
                        let known = map.get("properties").and_then(Value::as_object);
                        for (name, field) in obj {
                            if known.is_some_and(|p| p.contains_key(name)) {
                                continue;
                            }
                            match rule {
                                Value::Bool(false) => errors.push(format!("{at}: `{name}` is not in the document")),
                                Value::Bool(true) => {}
                                sub => self.validate(sub, field, &format!("{at}.{name}"), errors),
                            }
                        }
                    }
                }
                "items" => {
                    if let Some(items) = v.as_array() {
                        for (i, item) in items.iter().enumerate() {
                            self.validate(rule, item, &format!("{at}[{i}]"), errors);
                        }
                    }
                }
                "oneOf" => {
                    let matching = rule
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter(|sub| {
                            let mut e = Vec::new();
                            self.validate(sub, v, at, &mut e);
                            e.is_empty()
                        })
                        .count();
                    if matching != 1 {
                        errors.push(format!(
                            "{at}: {v} matches {matching} of the oneOf schemas, not exactly 1"
                        ));
                    }
                }
                k if ANNOTATIONS.contains(&k) => {}
                k => panic!("{at}: the validator does not know the keyword `{k}`"),
            }
        }
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

fn has_type(v: &Value, t: &str) -> bool {
    match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        other => panic!("unknown type `{other}`"),
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
        let response = self
            .doc
            .follow(op["responses"].get(reply.status.to_string()).unwrap_or_else(|| {
                panic!(
                    "{what}: status {} of {method} {template} is not in the document",
                    reply.status
                )
            }));
        let value = match response.get("content").and_then(Value::as_object) {
            None => {
                assert!(
                    reply.text.is_empty(),
                    "{what}: the document has no body, the reply has {}",
                    reply.text
                );
                Value::Null
            }
            Some(content) => {
                assert_eq!(content.len(), 1, "{what}: one media type per response");
                let (media, media_item) = content.iter().next().unwrap();
                let got = reply.content_type.split(';').next().unwrap_or("").trim();
                assert_eq!(got, media, "{what}: Content-Type {}", reply.content_type);
                if media == "application/json" {
                    let value: Value = serde_json::from_str(&reply.text)
                        .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {}", reply.text));
                    let mut errors = Vec::new();
                    self.doc.validate(&media_item["schema"], &value, "reply", &mut errors);
                    assert!(
                        errors.is_empty(),
                        "{what}: the reply does not match the document:\n{}\n{value}",
                        errors.join("\n")
                    );
                    value
                } else {
                    Value::String(reply.text.clone())
                }
            }
        };
        // What the server accepted, the document must accept too.
        if (200..300).contains(&reply.status) {
            match (&op.get("requestBody"), &body) {
                (Some(request), Some(sent)) => {
                    let sent: Value = serde_json::from_slice(sent).unwrap();
                    let schema = &request["content"]["application/json"]["schema"];
                    let mut errors = Vec::new();
                    self.doc.validate(schema, &sent, "request", &mut errors);
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

    /// Boundaries until one answers with an envelope, each checked.
    fn envelope(&self, session: &str, lease_ms: u64) -> Value {
        until_envelope(session, lease_ms, |m, p, b| self.call(m, p, b))
    }
}

#[test]
fn the_document_uses_only_keywords_the_validator_checks() {
    let doc = Doc { root: document_file() };
    assert_eq!(doc.root["openapi"], "3.1.0");
    let schemas = doc.all_schemas();
    assert!(schemas.len() > 40, "the walk found only {} schemas", schemas.len());
    for (at, schema) in schemas {
        doc.check_keywords(schema, &at);
    }
}

#[test]
fn every_v1_operation_documents_the_missing_key_reply() {
    let doc = Doc { root: document_file() };
    for (template, item) in doc.root["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            if template.starts_with("/v1/") {
                assert!(op["responses"].get("401").is_some(), "{method} {template} has no 401");
            }
        }
    }
}

/// A server reply with a field the document does not name fails the check: the test can fail.
#[test]
fn a_field_missing_from_the_document_is_refused() {
    let doc = Doc { root: document_file() };
    let schema = json!({"$ref": "#/components/schemas/ReleaseReply"});
    let mut errors = Vec::new();
    doc.validate(&schema, &json!({"claim_id": "c", "released": true}), "r", &mut errors);
    assert!(errors.is_empty(), "{errors:?}");
    doc.validate(
        &schema,
        &json!({"claim_id": "c", "released": true, "new": 1}),
        "r",
        &mut errors,
    );
    assert_eq!(errors.len(), 1, "{errors:?}");
    let runner = json!({"$ref": "#/components/schemas/Runner"});
    let mut errors = Vec::new();
    doc.validate(&runner, &json!({"kind": "sim", "argv": ["x"]}), "r", &mut errors);
    assert_eq!(
        errors.len(),
        1,
        "a sim runner with a command's field matches no branch: {errors:?}"
    );
}

/// The `.route("…", web::METHOD()…)` registrations of server/src/lib.rs, with their scope
/// prefixes, as (method, path).
fn registered_routes() -> Vec<(String, String)> {
    let source = include_str!("../server/src/lib.rs");
    for unknown in ["web::resource(", ".configure(", ".service(web::resource"] {
        assert!(
            !source.contains(unknown),
            "server/src/lib.rs registers routes with `{unknown}`, which this test does not read: teach registered_routes"
        );
    }
    let mut routes = Vec::new();
    // (prefix, the paren depth the scope's chain lives at)
    let mut scopes: Vec<(String, i32)> = Vec::new();
    let mut depth = 0i32;
    let mut rest = source;
    while let Some(c) = rest.chars().next() {
        if let Some(after) = rest.strip_prefix("web::scope(\"") {
            let end = after.find('"').unwrap();
            scopes.push((after[..end].to_string(), depth));
        } else if let Some(after) = rest.strip_prefix(".route(\"") {
            let end = after.find('"').unwrap();
            let path = &after[..end];
            let call = &after[end..];
            let method = ["get", "put", "post", "delete", "patch"]
                .into_iter()
                .filter_map(|m| call.find(&format!("web::{m}()")).map(|at| (at, m)))
                .min()
                .map(|(_, m)| m.to_string())
                .unwrap_or_else(|| panic!("no method for the route {path}"));
            let prefix: String = scopes.iter().map(|(p, _)| p.as_str()).collect();
            routes.push((method, format!("{prefix}{path}")));
        }
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                // A scope ends with the `.service(` call that holds it.
                while scopes.last().is_some_and(|(_, d)| depth < *d) {
                    scopes.pop();
                }
            }
            _ => {}
        }
        rest = &rest[c.len_utf8()..];
    }
    routes
}

#[test]
fn every_route_the_server_registers_is_documented() {
    let doc = Doc { root: document_file() };
    let routes = registered_routes();
    assert!(
        routes.contains(&("get".into(), "/healthz".into()))
            && routes.contains(&("post".into(), "/v1/sessions/{session_id}/delegate".into())),
        "the route parser misread server/src/lib.rs: {routes:?}"
    );
    for (method, path) in routes {
        let documented = doc.root["paths"].get(&path).and_then(|item| item.get(&method));
        assert!(
            documented.is_some(),
            "{} {path} is served but not in server/src/openapi.json",
            method.to_uppercase()
        );
    }
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
        doc: Doc { root: document_file() },
        seen: RefCell::default(),
    };

    // The document served is the file.
    let (_, served) = c.call("GET", "/v1/openapi.json", None);
    assert_eq!(served, c.doc.root);
    c.exchange("GET", "/v1/openapi.json", None, None);
    c.exchange("GET", "/healthz", None, None);
    c.exchange("GET", "/metrics", None, None);

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

    // A boundary with nothing ready, then envelopes: ack, ack again, a busy release.
    let (status, _) = c.call("POST", "/v1/sessions/plain/boundary", Some(json!({"consumer": "t"})));
    assert_eq!(status, 204);
    let env = c.envelope("o", 30_000);
    let claim = env["claim_id"].as_str().unwrap().to_string();
    c.call("GET", "/v1/sessions/o", None);
    c.call("POST", &format!("/v1/claims/{claim}/ack"), None);
    c.call("POST", &format!("/v1/claims/{claim}/ack"), None);
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
    let (status, reply) = server.call("GET", "/v1/no-such-endpoint", None);
    assert_eq!(status, 404);
    let mut errors = Vec::new();
    c.doc.validate(
        &json!({"$ref": "#/components/schemas/Error"}),
        &reply,
        "reply",
        &mut errors,
    );
    assert!(errors.is_empty(), "{errors:?}");

    // The sequence reached what it set out to check.
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
