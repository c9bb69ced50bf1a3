//! The W3C trace context over HTTP: a delegate's `traceparent` body field, or else its header,
//! reaches the call's children — a `command` child reads it as `TRACEPARENT` — also when the
//! request is forwarded to the process serving the session. A malformed body field refuses the
//! call (400, nothing stored); a header that is malformed, or given twice, is ignored.

mod server;

use serde_json::{json, Value};
use server::*;

const KEY: &str = "trace-key";
const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// A delegate of one `command` child printing its `TRACEPARENT`, with `headers`, to session `t`.
fn delegate_with(s: &Server, headers: &[(&str, &str)], extra: Value) -> (u16, Value) {
    let mut body = json!({"tasks": [{"goal": "say", "runner": {"kind": "command", "argv": ["sh", "-c", "printf %s \"$TRACEPARENT\""]}}]});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let mut request = s
        .agent
        .post(format!("{}/v1/sessions/t/delegate", s.base))
        .header("Authorization", format!("Bearer {KEY}"))
        .header("Content-Type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let mut reply = request.send(body.to_string().as_bytes()).unwrap();
    let status = reply.status().as_u16();
    let text = reply.body_mut().read_to_string().unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[test]
fn a_delegates_traceparent_header_reaches_its_command_child() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), Some(KEY), &["--allow-command"]);
    s.open("t");
    let (status, reply) = delegate_with(&s, &[("traceparent", TP)], json!({}));
    assert_eq!(status, 202, "{reply}");
    assert_eq!(s.only_result("t")["summary"], TP);
    // The body's field does the same, and wins over a header (an instrumented client's span).
    let other = "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01";
    let (status, reply) = delegate_with(&s, &[("traceparent", other)], json!({"traceparent": TP}));
    assert_eq!(status, 202, "{reply}");
    assert_eq!(s.only_result("t")["summary"], TP);
    // A header that is malformed, or given twice, is ignored: the call goes on without one.
    for headers in [
        &[("traceparent", "00-zz-00f067aa0ba902b7-01")][..],
        &[("traceparent", TP), ("traceparent", TP)],
    ] {
        let (status, reply) = delegate_with(&s, headers, json!({}));
        assert_eq!(status, 202, "{headers:?}: {reply}");
        assert_eq!(s.only_result("t")["summary"], "", "{headers:?}");
    }
    // Without one, the child has none.
    let (status, reply) = delegate_with(&s, &[], json!({}));
    assert_eq!(status, 202, "{reply}");
    assert_eq!(s.only_result("t")["summary"], "");
}

#[test]
fn a_malformed_traceparent_in_the_body_is_refused_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), Some(KEY), &["--allow-command"]);
    s.open("t");
    for bad in [
        "00-zz-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ] {
        let (status, reply) = delegate_with(&s, &[("traceparent", TP)], json!({"traceparent": bad}));
        assert_eq!(
            (status, reply["error"]["code"].as_str()),
            (400, Some("invalid_request")),
            "{bad}: {reply}"
        );
        assert!(
            reply["error"]["message"].as_str().unwrap().contains("traceparent"),
            "{reply}"
        );
    }
    // Nothing was stored: the next call is set 1.
    let (status, reply) = delegate_with(&s, &[("traceparent", TP)], json!({}));
    assert_eq!((status, reply["set"].as_u64()), (202, Some(1)), "{reply}");
}

#[test]
fn a_forwarded_delegate_keeps_its_traceparent() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let node = |name: &str| {
        let dir = dir.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        Server::start_with(&dir, None, &["--ledger", &url, "--node", name, "--allow-command"])
    };
    let (a, b) = (node("a"), node("b"));
    // `a` takes the session up; `b` sends the delegate on to it.
    a.open("t");
    let (status, reply) = delegate_with(&b, &[("traceparent", TP)], json!({}));
    assert_eq!(status, 202, "{reply}");
    assert_eq!(a.only_result("t")["summary"], TP);
}
