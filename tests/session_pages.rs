//! A session's calls a page at a time (`GET /v1/sessions/{id}?limit=…&after=…`): with
//! `delivered=true` every stored call, without it only the calls not yet delivered — full
//! pages of those, whatever number of delivered calls the ledger still keeps, each call once.

mod server;

use serde_json::Value;
use server::*;

/// The call ids of every page of `query` (`limit=1`), following `calls_next`.
fn pages(s: &Server, query: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut after = String::new();
    loop {
        let path = format!("/v1/sessions/p?{query}&limit=1{after}");
        let (status, view) = s.call("GET", &path, None);
        assert_eq!(status, 200, "{path}: {view}");
        let ids: Vec<String> = view["calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["call_id"].as_str().unwrap().to_string())
            .collect();
        out.push(ids);
        match &view["calls_next"] {
            Value::String(next) => after = format!("&after={next}"),
            _ => return out,
        }
        assert!(out.len() < 50, "paging does not end: {out:?}");
    }
}

#[test]
fn pages_of_undelivered_calls_are_full_whatever_the_ledger_keeps_of_delivered_ones() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("p");
    // Five calls delivered (kept in the ledger until retention), then two still running.
    let mut delivered = Vec::new();
    for _ in 0..5 {
        delivered.push(s.delegate_sims("p", 1));
        s.only_result("p");
    }
    let live: Vec<String> = (0..2).map(|_| s.delegate_timed("p", &[600_000])).collect();

    let undelivered = pages(&s, "delivered=false");
    assert_eq!(undelivered, vec![vec![live[0].clone()], vec![live[1].clone()]]);
    let every = pages(&s, "delivered=true");
    let every: Vec<String> = every.into_iter().flatten().collect();
    let mut want = delivered.clone();
    want.extend(live.iter().cloned());
    assert_eq!(every, want, "every stored call, in the order they were made, each once");
    // Without paging the view is the undelivered calls, as before.
    let (_, view) = s.call("GET", "/v1/sessions/p", None);
    assert_eq!(view["calls"].as_array().unwrap().len(), 2, "{view}");
    assert_eq!(view["calls_next"], Value::Null);
}
