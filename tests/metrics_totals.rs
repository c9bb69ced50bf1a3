//! `GET /metrics` of the real `brood serve`: the engine's running totals as counters that only
//! grow (children ended by status, items delivered by kind, wakes, redriven items, retries),
//! the two delivery-stage histograms, and docs/http.md naming every metric a scrape shows.
//! Counts only: no duration is looked at.

use std::collections::BTreeSet;

use serde_json::{json, Value};

mod server;
use server::*;

fn ended(status: &str) -> String {
    format!(r#"brood_children_ended_total{{status="{status}"}}"#)
}

fn delivered(kind: &str) -> String {
    format!(r#"brood_items_delivered_total{{kind="{kind}"}}"#)
}

/// Everything the totals count, as one scrape has them.
fn totals(text: &str) -> Vec<(String, f64)> {
    let mut series: Vec<String> = [
        "succeeded",
        "failed",
        "timed_out",
        "interrupted",
        "cancelled",
        "unknown",
    ]
    .into_iter()
    .map(ended)
    .collect();
    series.extend(["result", "failure_notice"].map(delivered));
    series.extend(
        [
            "brood_wakes_total",
            "brood_items_redriven_total",
            "brood_child_retries_total",
            "brood_item_end_to_ready_seconds_count",
            "brood_item_ready_to_ack_seconds_count",
        ]
        .map(String::from),
    );
    series.into_iter().map(|s| (s.clone(), value(text, &s))).collect()
}

fn post(s: &Server, path: &str, body: Value) -> Value {
    let (status, reply) = s.call("POST", path, Some(body));
    assert_eq!(status, 200, "{path}: {reply}");
    reply
}

/// Every end, delivery, wake, redrive and retry of one session's life, counted exactly: a
/// child that succeeds, one that fails after a retry (its failure notice out while its unit
/// waits for an external worker, who completes twice), one cancelled; every item dead-lettered
/// by a failed delivery, redriven, then acked.
#[test]
fn the_totals_count_what_the_engine_applied_and_never_go_down() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir.path(), None, &["--max-delivery-attempts", "1"]);
    let zero = totals(&scrape(&s));
    assert!(zero.iter().all(|(_, v)| *v == 0.0), "{zero:?}");
    s.open("m");
    let tasks = json!([
        {"goal": "a", "runner": sim(0), "group": "one"},
        {"goal": "b", "runner": {"kind": "sim", "outcome": "fail"}, "group": "two",
         "retry": {"max_attempts": 2, "backoff_ms": 0}},
        {"goal": "c", "runner": {"kind": "external"}, "group": "two"},
    ]);
    let (status, reply) = s.call("POST", "/v1/sessions/m/delegate", Some(json!({"tasks": tasks})));
    assert_eq!(status, 202, "{reply}");
    let hang = s.delegate_task("m", json!({"goal": "d", "runner": {"kind": "sim", "outcome": "hang"}}));
    let hang_call = hang["call_id"].as_str().unwrap();
    // b fails twice (one retry) while c waits: its failure notice is ready at once.
    scrape_until(&s, &ended("failed"), 1.0);
    let (child, token) = s.poll_work();
    let done = json!({"token": token, "status": "succeeded", "summary": "c done"});
    post(&s, &format!("/v1/children/{child}/complete"), done.clone());
    // Its answer lost, the worker completes again: answered as recorded, not counted again.
    post(&s, &format!("/v1/children/{child}/complete"), done);
    // d is cancelled, queued or running.
    post(&s, &format!("/v1/calls/{hang_call}/cancel"), json!({}));
    // a, b (notice and result), c, d: five items, claimed together once all are ready.
    scrape_until(&s, "brood_ready_items", 5.0);
    let env = s.envelope("m", 30_000);
    assert_eq!(env["items"].as_array().unwrap().len(), 5, "{env}");
    let claim = env["claim_id"].as_str().unwrap();
    post(&s, &format!("/v1/claims/{claim}/release"), json!({"reason": "failed"}));
    let redriven = post(&s, "/v1/dead-letters/redrive", json!({"session_id": "m"}));
    assert_eq!(redriven["redriven"], 5, "{redriven}");
    let before_ack = scrape(&s);
    assert_eq!(value(&before_ack, r#"brood_children{status="succeeded"}"#), 2.0);
    let env = s.envelope("m", 30_000);
    assert_eq!(env["items"].as_array().unwrap().len(), 5, "{env}");
    let claim = env["claim_id"].as_str().unwrap();
    let (status, acked) = s.call("POST", &format!("/v1/claims/{claim}/ack"), None);
    assert_eq!((status, &acked["delivered"]), (200, &json!(5)), "{acked}");

    let text = scrape(&s);
    let expected = [
        (ended("succeeded"), 2.0),
        (ended("failed"), 1.0),
        (ended("timed_out"), 0.0),
        (ended("interrupted"), 0.0),
        (ended("cancelled"), 1.0),
        (ended("unknown"), 0.0),
        (delivered("result"), 4.0),
        (delivered("failure_notice"), 1.0),
        // One as the first item was ready, one as the redriven ones were.
        ("brood_wakes_total".to_string(), 2.0),
        ("brood_items_redriven_total".to_string(), 5.0),
        ("brood_child_retries_total".to_string(), 1.0),
        // Each item made ready once by a child's end, and timed once to the ack that delivered it.
        ("brood_item_end_to_ready_seconds_count".to_string(), 5.0),
        ("brood_item_ready_to_ack_seconds_count".to_string(), 5.0),
    ];
    assert_eq!(totals(&text), expected.to_vec(), "\n{text}");
    // The delivered calls left memory: the gauges went down, the totals did not.
    assert_eq!(value(&text, r#"brood_children{status="succeeded"}"#), 0.0);
    assert_eq!(value(&text, "brood_item_ready_to_ack_seconds_bucket{le=\"+Inf\"}"), 5.0);
}

/// The metric families of a scrape as a client names their samples: counters with `_total`,
/// the others as they are typed (a histogram's unit is in its family name).
fn families(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .map(|rest| {
            let mut words = rest.split_whitespace();
            let (name, kind) = (words.next().unwrap(), words.next().unwrap());
            if kind == "counter" {
                format!("{name}_total")
            } else {
                name.to_string()
            }
        })
        .collect()
}

/// docs/http.md's `GET /metrics` section.
fn metrics_section() -> String {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/http.md")).unwrap();
    let from = page.find("### `GET /metrics`").expect("a GET /metrics section");
    let rest = &page[from + 3..];
    rest[..rest.find("\n### ").unwrap_or(rest.len())].to_string()
}

#[test]
fn http_md_names_every_metric_a_scrape_shows_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    let shown = families(&scrape(&s));
    let section = metrics_section();
    let named: BTreeSet<String> = section
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("brood_"))
        .map(str::to_string)
        .collect();
    let missing: Vec<&String> = shown.difference(&named).collect();
    assert!(missing.is_empty(), "docs/http.md does not name {missing:?}");
    let stray: Vec<&String> = named.difference(&shown).collect();
    assert!(
        stray.is_empty(),
        "docs/http.md names metrics a scrape does not show: {stray:?}"
    );
}

#[test]
fn the_sample_dashboard_queries_only_metrics_a_scrape_shows() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/grafana-dashboard.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert!(
        dashboard["schemaVersion"].is_u64(),
        "an importable dashboard has a schemaVersion"
    );
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    let shown = families(&scrape(&s));
    let mut queried = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{target}");
            let expr = target["expr"].as_str().unwrap();
            queried.extend(
                expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .filter(|w| w.starts_with("brood_"))
                    .map(|w| w.strip_suffix("_bucket").unwrap_or(w).to_string()),
            );
        }
    }
    let unknown: Vec<&String> = queried.difference(&shown).collect();
    assert!(
        unknown.is_empty(),
        "the dashboard queries metrics a scrape does not show: {unknown:?}"
    );
    for wanted in [
        "brood_children_ended_total",
        "brood_items_delivered_total",
        "brood_wakes_total",
        "brood_items_redriven_total",
        "brood_child_retries_total",
        "brood_item_end_to_ready_seconds",
        "brood_item_ready_to_ack_seconds",
    ] {
        assert!(queried.contains(wanted), "the dashboard does not plot {wanted}");
    }
}
