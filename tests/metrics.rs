//! `GET /metrics` of the real `brood serve`, scraped after real traffic: the engine's gauges
//! (children by status, ready and claimed items, dead letters, quarantined rows), the HTTP
//! requests by matched route (never the raw path), the webhook wakes, the ledger flushes.

use serde_json::json;

mod server;
use server::*;

/// A background call of one sim task.
fn delegate_one(s: &Server, session: &str) {
    let (status, reply) = s.call(
        "POST",
        &format!("/v1/sessions/{session}/delegate"),
        Some(json!({"tasks": [{"goal": "a", "runner": sim(0)}]})),
    );
    assert_eq!(status, 202, "{reply}");
}

#[test]
fn ended_children_ready_and_claimed_items_are_gauged_from_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("m");
    let tasks = json!([
        {"goal": "a", "runner": sim(0)},
        {"goal": "b", "runner": {"kind": "sim", "outcome": "fail"}},
        {"goal": "c", "runner": {"kind": "sim", "outcome": "hang"}, "group": "slow"},
    ]);
    let (status, _) = s.call("POST", "/v1/sessions/m/delegate", Some(json!({"tasks": tasks})));
    assert_eq!(status, 202);
    // a and b form one unit, ready once both ended (with b's failure notice, if b ended first);
    // c's unit hangs.
    scrape_until(&s, "brood_ready_items", 2.0);
    // c's runner starts on the engine's own time too.
    let text = scrape_until(&s, r#"brood_children{status="running"}"#, 1.0);
    assert_eq!(value(&text, "brood_sessions"), 1.0);
    assert_eq!(value(&text, "brood_failed_sessions"), 0.0);
    assert_eq!(value(&text, r#"brood_children{status="succeeded"}"#), 1.0);
    assert_eq!(value(&text, r#"brood_children{status="failed"}"#), 1.0);
    assert_eq!(value(&text, r#"brood_children{status="running"}"#), 1.0);
    assert_eq!(value(&text, r#"brood_children{status="queued"}"#), 0.0);
    assert_eq!(value(&text, "brood_claimed_items"), 0.0);
    let env = s.envelope("m", 30_000);
    let claimed = env["items"].as_array().unwrap().len() as f64;
    let text = scrape(&s);
    assert_eq!(value(&text, "brood_claimed_items"), claimed);
    assert_eq!(value(&text, "brood_ready_items"), 0.0);
    assert_eq!(value(&text, "brood_dead_letters"), 0.0);
    assert_eq!(value(&text, "brood_quarantined_rows"), 0.0);
}

#[test]
fn a_dead_letter_is_gauged() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), None, &["--max-delivery-attempts", "1"]);
    s.open("d");
    delegate_one(&s, "d");
    let env = s.envelope("d", 30_000);
    let claim = env["claim_id"].as_str().unwrap();
    let (status, _) = s.call(
        "POST",
        &format!("/v1/claims/{claim}/release"),
        Some(json!({"reason": "failed"})),
    );
    assert_eq!(status, 200);
    scrape_until(&s, "brood_dead_letters", 1.0);
}

#[test]
fn http_requests_are_counted_by_route_pattern_method_and_status() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("h");
    delegate_one(&s, "h");
    delegate_one(&s, "h");
    let (status, _) = s.call("POST", "/v1/sessions/h/delegate", Some(json!({"tasks": []})));
    assert_eq!(status, 400);
    let (status, _) = s.call("GET", "/v1/no-such-endpoint-7f3a", None);
    assert_eq!(status, 404);
    let text = scrape(&s);
    let delegate = r#"route="/v1/sessions/{session_id}/delegate",method="POST""#;
    assert_eq!(
        value(
            &text,
            &format!(r#"brood_http_requests_total{{{delegate},status="202"}}"#)
        ),
        2.0
    );
    assert_eq!(
        value(
            &text,
            &format!(r#"brood_http_requests_total{{{delegate},status="400"}}"#)
        ),
        1.0
    );
    assert_eq!(
        value(
            &text,
            r#"brood_http_requests_total{route="unmatched",method="GET",status="404"}"#
        ),
        1.0
    );
    assert!(!text.contains("no-such-endpoint"), "a raw path became a label:\n{text}");
    assert!(!text.contains("/v1/sessions/h/"), "a raw path became a label:\n{text}");
}

#[test]
fn ledger_flushes_are_timed() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("f");
    let before = value(&scrape(&s), "brood_ledger_flush_seconds_count");
    delegate_one(&s, "f");
    s.envelope("f", 30_000);
    let text = scrape(&s);
    assert!(value(&text, "brood_ledger_flush_seconds_count") > before, "{text}");
    assert!(value(&text, "brood_ledger_flush_seconds_sum") > 0.0, "{text}");
    assert_eq!(
        value(&text, r#"brood_ledger_flush_seconds_bucket{le="+Inf"}"#),
        value(&text, "brood_ledger_flush_seconds_count")
    );
}

#[test]
fn webhook_wakes_delivered_and_failed_tries_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    // The receiver refuses the first try; the retry is accepted.
    let (url, seen) = wake_receiver(1);
    let (status, body) = s.call("PUT", "/v1/sessions/w", Some(json!({"wake_url": url})));
    assert_eq!(status, 200, "{body}");
    delegate_one(&s, "w");
    let text = scrape_until(&s, "brood_wakes_delivered_total", 1.0);
    assert_eq!(value(&text, "brood_wakes_delivered_total"), 1.0);
    assert_eq!(value(&text, "brood_wake_tries_failed_total"), 1.0);
    assert_eq!(value(&text, "brood_wakes_given_up_total"), 0.0);
    assert_eq!(seen.lock().unwrap().len(), 1);
}
