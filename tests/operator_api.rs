//! What an operator's view reads over HTTP beside a session's state: sessions searched by id
//! prefix and filtered by state (`GET /v1/sessions?prefix=…&state=…`), each with its dead
//! letters; a child's failure notice, whether it waits for a worker, and its nested session;
//! where each result went out (`GET /v1/sessions/{id}/deliveries`); and what a live claim
//! holds.

mod server;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server::{assert_error, sim, Server};

/// A server whose items are dead letters after one failed delivery, with a key scoped to
/// the sessions starting `acme-`.
fn start(dir: &std::path::Path) -> Server {
    Server::start_with(
        dir,
        Some("admin-key"),
        &["--max-delivery-attempts", "1", "--scoped-keys", "acme-=acme-key"],
    )
}

/// The session ids of one page of `GET /v1/sessions?{query}`, and its `next`.
fn list(s: &Server, query: &str) -> (Vec<String>, Option<String>) {
    let (status, page) = s.call("GET", &format!("/v1/sessions?{query}"), None);
    assert_eq!(status, 200, "{query}: {page}");
    let ids = page["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap().to_string())
        .collect();
    (ids, page["next"].as_str().map(str::to_string))
}

/// Every session id `query` lists, a page of `limit` at a time, following `next`: the pages.
fn pages(s: &Server, query: &str, limit: usize) -> Vec<Vec<String>> {
    let (mut out, mut after) = (Vec::new(), String::new());
    loop {
        let (ids, next) = list(s, &format!("{query}&limit={limit}{after}"));
        out.push(ids);
        match next {
            Some(n) => after = format!("&after={n}"),
            None => return out,
        }
        assert!(out.len() < 50, "paging does not end: {out:?}");
    }
}

/// Polls `GET /v1/sessions/{session}` until `done` holds of it (within 20 s); returns it.
fn until(s: &Server, session: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, view) = s.call("GET", &format!("/v1/sessions/{session}"), None);
        assert_eq!(status, 200, "{view}");
        if done(&view) {
            return view;
        }
        assert!(Instant::now() < deadline, "{what}: not within 20 s: {view}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn strings(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

/// The session holds one running child (for a minute); its child id.
fn busy(s: &Server, session: &str) -> String {
    s.open(session);
    let reply = s.delegate_task(session, json!({"goal": "hold", "runner": sim(600_000)}));
    let child = format!("{}.0", reply["call_id"].as_str().unwrap());
    until(s, session, "the child runs", |v| v["counts"]["running"] == 1);
    child
}

/// The session holds one ready result.
fn ready(s: &Server, session: &str) {
    s.open(session);
    s.delegate_sims(session, 1);
    until(s, session, "the result is ready", |v| v["counts"]["ready"] == 1);
}

/// The session's one result is a dead letter (its one delivery attempt failed).
fn dead(s: &Server, session: &str) {
    ready(s, session);
    let env = s.envelope(session, 30_000);
    let claim = env["claim_id"].as_str().unwrap();
    let (status, body) = s.call(
        "POST",
        &format!("/v1/claims/{claim}/release"),
        Some(json!({"reason": "failed"})),
    );
    assert_eq!(status, 200, "{body}");
}

#[test]
fn a_prefix_lists_only_the_sessions_whose_id_starts_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path());
    for id in ["team-a", "team-b", "teams", "other"] {
        s.open(id);
    }
    assert_eq!(list(&s, "prefix=team-").0, strings(&["team-a", "team-b"]));
    assert_eq!(list(&s, "prefix=team").0, strings(&["team-a", "team-b", "teams"]));
    assert_eq!(
        list(&s, "prefix=team-b").0,
        strings(&["team-b"]),
        "a whole id is its own prefix"
    );
    assert_eq!(list(&s, "prefix=nobody").0, Vec::<String>::new());
    assert_eq!(
        list(&s, "prefix=Team").0,
        Vec::<String>::new(),
        "ids are compared as they are"
    );
    let (all, _) = list(&s, "limit=10");
    assert_eq!(all, strings(&["other", "team-a", "team-b", "teams"]));
}

#[test]
fn each_state_lists_only_the_sessions_in_it_and_says_their_dead_letters() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path());
    let child = busy(&s, "s-busy");
    ready(&s, "s-ready");
    dead(&s, "s-dead");
    s.open("s-idle");
    // The running child's own session: nested.
    s.open(&child);
    until(&s, "s-dead", "the result is a dead letter", |v| {
        v["counts"]["ready"] == 0
    });

    assert_eq!(list(&s, "state=busy").0, strings(&["s-busy"]));
    assert_eq!(list(&s, "state=ready").0, strings(&["s-ready"]));
    assert_eq!(list(&s, "state=dead_letters").0, strings(&["s-dead"]));
    assert_eq!(list(&s, "state=nested").0, vec![child.clone()]);
    assert_eq!(
        list(&s, "state=busy&prefix=s-r").0,
        Vec::<String>::new(),
        "both filters hold"
    );

    let (_, page) = s.call("GET", "/v1/sessions", None);
    let dead_letters: Vec<(String, u64)> = page["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["session_id"].as_str().unwrap().to_string(),
                s["dead_letters"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut want: Vec<(String, u64)> = [&child, "s-busy", "s-dead", "s-idle", "s-ready"]
        .iter()
        .map(|id| (id.to_string(), u64::from(*id == "s-dead")))
        .collect();
    want.sort();
    assert_eq!(dead_letters, want, "{page}");
}

#[test]
fn pages_run_over_the_sessions_a_filter_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path());
    // Ready and idle sessions interleaved: a page of ready ones skips the idle between them.
    for i in 0..5 {
        ready(&s, &format!("p{i}-ready"));
        s.open(&format!("p{i}-idle"));
    }
    let got = pages(&s, "state=ready", 2);
    let want = vec![
        strings(&["p0-ready", "p1-ready"]),
        strings(&["p2-ready", "p3-ready"]),
        strings(&["p4-ready"]),
    ];
    assert_eq!(got, want);
    // A page that ends exactly at the last kept session says no more follow.
    assert_eq!(list(&s, "state=ready&limit=5").1, None);
    assert_eq!(list(&s, "state=ready&limit=4").1.as_deref(), Some("p3-ready"));
    let got = pages(&s, "prefix=p1-", 1);
    assert_eq!(got, vec![strings(&["p1-idle"]), strings(&["p1-ready"])]);
}

#[test]
fn a_scoped_key_lists_only_its_own_sessions_through_the_filters() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path());
    ready(&s, "acme-1");
    ready(&s, "beta-1");
    s.open("acme-2");
    let (status, page) = s.raw("GET", "/v1/sessions?state=ready", None, Some("acme-key"));
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["sessions"].as_array().unwrap().len(), 1, "{page}");
    assert_eq!(page["sessions"][0]["session_id"], "acme-1");
    let (status, page) = s.raw("GET", "/v1/sessions?prefix=beta", None, Some("acme-key"));
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["sessions"], json!([]));
}

#[test]
fn an_unknown_state_or_a_bad_prefix_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path());
    s.open("a");
    let message = assert_error(s.call("GET", "/v1/sessions?state=sleepy", None), 400, "invalid_request");
    assert!(message.contains("sleepy"), "{message}");
    for accepted in ["busy", "ready", "dead_letters", "nested"] {
        assert!(message.contains(accepted), "{message}");
    }
    let long = "x".repeat(257);
    for bad in ["prefix=", &format!("prefix={long}"), "prefix=a%07"] {
        let message = assert_error(
            s.call("GET", &format!("/v1/sessions?{bad}"), None),
            400,
            "invalid_request",
        );
        assert!(message.contains("prefix"), "{bad}: {message}");
    }
}

/// The children of the session's view, by child id.
fn children(view: &Value) -> std::collections::BTreeMap<String, Value> {
    view["calls"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["children"].as_array().unwrap().clone())
        .map(|ch| (ch["child_id"].as_str().unwrap().to_string(), ch))
        .collect()
}

/// The view of child `child` in its session's view.
fn child_of(view: &Value, child: &str) -> Value {
    children(view)
        .remove(child)
        .unwrap_or_else(|| panic!("no child {child}: {view}"))
}

#[test]
fn a_failure_notice_shows_undelivered_then_delivered_once_acked() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path());
    s.open("n");
    // One unit of two: one fails at once, the other holds the unit open.
    let tasks = json!([
        {"goal": "fail", "runner": {"kind": "sim", "ms": 0, "outcome": "fail"}},
        {"goal": "hold", "runner": sim(600_000)},
    ]);
    let (status, reply) = s.call("POST", "/v1/sessions/n/delegate", Some(json!({"tasks": tasks})));
    assert_eq!(status, 202, "{reply}");
    let call = reply["call_id"].as_str().unwrap();
    let (failed, held) = (format!("{call}.0"), format!("{call}.1"));
    let view = until(&s, "n", "the notice is ready", |v| v["counts"]["ready"] == 1);
    assert_eq!(child_of(&view, &failed)["notice"], "undelivered", "{view}");
    assert_eq!(
        child_of(&view, &held)["notice"],
        Value::Null,
        "a running child raised none"
    );

    let env = s.envelope("n", 30_000);
    assert_eq!(env["items"][0]["kind"], "failure_notice", "{env}");
    let claim = env["claim_id"].as_str().unwrap();
    let (_, view) = s.call("GET", "/v1/sessions/n", None);
    assert_eq!(
        child_of(&view, &failed)["notice"],
        "undelivered",
        "claimed, not yet acked"
    );
    let (status, acked) = s.call("POST", &format!("/v1/claims/{claim}/ack"), None);
    assert_eq!(status, 200, "{acked}");
    let (_, view) = s.call("GET", "/v1/sessions/n", None);
    assert_eq!(child_of(&view, &failed)["notice"], "delivered", "{view}");
    // Its result waits for its unit still.
    assert_eq!(child_of(&view, &failed)["delivery"], "undelivered", "{view}");
    assert_eq!(child_of(&view, &held)["notice"], Value::Null);
}

#[test]
fn a_child_that_ends_well_or_fails_in_a_unit_of_its_own_raises_no_notice() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path());
    s.open("q");
    let tasks = json!([
        {"goal": "ok", "runner": sim(0)},
        {"goal": "fail", "runner": {"kind": "sim", "ms": 0, "outcome": "fail"}},
    ]);
    let (status, reply) = s.call(
        "POST",
        "/v1/sessions/q/delegate",
        Some(json!({"tasks": tasks, "independent_completions": true})),
    );
    assert_eq!(status, 202, "{reply}");
    let view = until(&s, "q", "both results are ready", |v| v["counts"]["ready"] == 2);
    for (id, child) in children(&view) {
        assert_eq!(child["notice"], Value::Null, "{id}: {view}");
        assert_eq!(child["delivery"], "undelivered", "{id}: {view}");
    }
}

#[test]
fn an_external_child_waits_for_a_worker_until_one_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path());
    s.open("x");
    let reply = s.delegate_task("x", json!({"goal": "render", "runner": {"kind": "external"}}));
    let child = format!("{}.0", reply["call_id"].as_str().unwrap());
    let view = until(&s, "x", "the child waits", |v| {
        children(v).get(&child).is_some_and(|c| c["waiting_for_worker"] == true)
    });
    assert_eq!(child_of(&view, &child)["status"], "running", "{view}");
    let (taken, _token) = s.poll_work();
    assert_eq!(taken, child);
    let (_, view) = s.call("GET", "/v1/sessions/x", None);
    assert_eq!(child_of(&view, &child)["waiting_for_worker"], false, "{view}");
    let (_, detail) = s.call(
        "GET",
        &format!("/v1/calls/{}", reply["call_id"].as_str().unwrap()),
        None,
    );
    assert_eq!(detail["children"][0]["waiting_for_worker"], false, "{detail}");
    // A sim child never waits for one.
    let sim_call = s.delegate_task("x", json!({"goal": "hold", "runner": sim(600_000)}));
    let sim_child = format!("{}.0", sim_call["call_id"].as_str().unwrap());
    let view = until(&s, "x", "the sim child runs", |v| v["counts"]["running"] == 2);
    assert_eq!(child_of(&view, &sim_child)["waiting_for_worker"], false, "{view}");
}

#[test]
fn a_child_that_delegated_in_its_own_session_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path());
    let child = busy(&s, "outer");
    let reply = s.delegate_task("outer", json!({"goal": "hold too", "runner": sim(600_000)}));
    let other = format!("{}.0", reply["call_id"].as_str().unwrap());
    s.open(&child);
    let (status, reply) = s.call(
        "POST",
        &format!("/v1/sessions/{child}/delegate"),
        Some(json!({"tasks": [{"goal": "inner", "runner": sim(0)}]})),
    );
    assert_eq!(status, 202, "{reply}");
    let (_, view) = s.call("GET", "/v1/sessions/outer", None);
    assert_eq!(child_of(&view, &child)["nested_session"], child.as_str(), "{view}");
    assert_eq!(child_of(&view, &other)["nested_session"], Value::Null, "{view}");
    let call = child.rsplit_once('.').unwrap().0;
    let (_, detail) = s.call("GET", &format!("/v1/calls/{call}"), None);
    assert_eq!(detail["children"][0]["nested_session"], child.as_str(), "{detail}");
}

/// A delegate of one zero-time child to `session`, its result claimed at the next boundary and
/// acked: the call id and the claim id.
fn delivered_once(s: &Server, session: &str) -> (String, String) {
    let call = s.delegate_sims(session, 1);
    let env = s.envelope(session, 30_000);
    let claim = env["claim_id"].as_str().unwrap().to_string();
    let (status, acked) = s.call("POST", &format!("/v1/claims/{claim}/ack"), None);
    assert_eq!(status, 200, "{acked}");
    (call, claim)
}

/// One page of `GET /v1/sessions/{session}/deliveries?{query}`.
fn deliveries(s: &Server, session: &str, query: &str) -> Value {
    let (status, page) = s.call("GET", &format!("/v1/sessions/{session}/deliveries?{query}"), None);
    assert_eq!(status, 200, "{query}: {page}");
    page
}

/// `items` (item refs) by child id: a claim holds its items in the order they became ready.
fn sorted(items: &Value) -> Value {
    let mut items = items.as_array().expect("items").clone();
    items.sort_by_key(|i| i["child_id"].as_str().unwrap_or("").to_string());
    Value::Array(items)
}

fn claim_ids(page: &Value) -> Vec<String> {
    page["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["claim_id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_deliveries_list_each_acked_claim_in_order_with_its_items_and_when() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path());
    s.open("d");
    let (first_call, first) = delivered_once(&s, "d");
    let (second_call, second) = delivered_once(&s, "d");
    let page = deliveries(&s, "d", "");
    assert_eq!(claim_ids(&page), vec![first.clone(), second.clone()], "{page}");
    assert_eq!(page["next"], Value::Null);
    let acks = page["deliveries"].as_array().unwrap();
    for (ack, call) in acks.iter().zip([&first_call, &second_call]) {
        assert_eq!(
            ack["items"],
            json!([{"child_id": format!("{call}.0"), "call_id": call, "kind": "result"}]),
            "{page}"
        );
    }
    let (a, b) = (
        acks[0]["acked_at"].as_u64().unwrap(),
        acks[1]["acked_at"].as_u64().unwrap(),
    );
    assert!(a > 0 && a <= b, "{page}");
}

#[test]
fn a_call_id_keeps_only_the_acks_of_that_calls_items_and_only_those_items() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path());
    s.open("c");
    let (alone, alone_claim) = delivered_once(&s, "c");
    // Two calls whose results go out in one claim.
    let a = s.delegate_sims("c", 1);
    let b = s.delegate_sims("c", 2);
    until(&s, "c", "three results are ready", |v| v["counts"]["ready"] == 3);
    let env = s.envelope("c", 30_000);
    let both = env["claim_id"].as_str().unwrap();
    let (status, _) = s.call("POST", &format!("/v1/claims/{both}/ack"), None);
    assert_eq!(status, 200);

    let page = deliveries(&s, "c", &format!("call_id={b}"));
    let want = json!([
        {"child_id": format!("{b}.0"), "call_id": b, "kind": "result"},
        {"child_id": format!("{b}.1"), "call_id": b, "kind": "result"},
    ]);
    assert_eq!(claim_ids(&page), vec![both.to_string()], "{page}");
    assert_eq!(sorted(&page["deliveries"][0]["items"]), want, "{page}");
    let page = deliveries(&s, "c", &format!("call_id={a}"));
    assert_eq!(page["deliveries"][0]["items"].as_array().unwrap().len(), 1, "{page}");
    assert_eq!(
        claim_ids(&deliveries(&s, "c", &format!("call_id={alone}"))),
        vec![alone_claim]
    );
    assert_eq!(
        claim_ids(&deliveries(&s, "c", "call_id=deleg_00")),
        Vec::<String>::new()
    );
    // Unfiltered, the shared claim holds all three.
    let page = deliveries(&s, "c", "");
    assert_eq!(page["deliveries"][1]["items"].as_array().unwrap().len(), 3, "{page}");
}

#[test]
fn a_sync_calls_receipt_is_among_the_deliveries() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path());
    s.open("y");
    let (status, reply) = s.call(
        "POST",
        "/v1/sessions/y/delegate",
        Some(json!({"tasks": [{"goal": "now", "runner": sim(0)}], "mode": "sync"})),
    );
    assert_eq!(status, 200, "{reply}");
    let call = reply["call_id"].as_str().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let page = loop {
        let page = deliveries(&s, "y", "");
        if !claim_ids(&page).is_empty() {
            break page;
        }
        assert!(Instant::now() < deadline, "no receipt within 20 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(claim_ids(&page), vec![format!("sync_{call}")], "{page}");
    assert_eq!(
        page["deliveries"][0]["items"],
        json!([{"child_id": format!("{call}.0"), "call_id": call, "kind": "result"}])
    );
}

#[test]
fn deliveries_page_after_a_claim_id_and_within_a_limit() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path());
    s.open("g");
    let claims: Vec<String> = (0..3).map(|_| delivered_once(&s, "g").1).collect();
    let mut got = Vec::new();
    let mut after = String::new();
    loop {
        let page = deliveries(&s, "g", &format!("limit=1{after}"));
        got.push(claim_ids(&page));
        match page["next"].as_str() {
            Some(n) => after = format!("&after={n}"),
            None => break,
        }
        assert!(got.len() < 10, "{got:?}");
    }
    let want: Vec<Vec<String>> = claims.iter().map(|c| vec![c.clone()]).collect();
    assert_eq!(got, want);
    assert_eq!(
        claim_ids(&deliveries(&s, "g", &format!("after={}", claims[0]))),
        claims[1..].to_vec()
    );
    let page = deliveries(&s, "g", "limit=2");
    assert_eq!(page["next"].as_str(), Some(claims[1].as_str()));
    // The same bounds as the other pages.
    for bad in ["limit=0", "limit=1001", "limit=x", "call_id="] {
        assert_error(
            s.call("GET", &format!("/v1/sessions/g/deliveries?{bad}"), None),
            400,
            "invalid_request",
        );
    }
}

#[test]
fn the_deliveries_of_an_unknown_session_are_404() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path());
    assert_error(
        s.call("GET", "/v1/sessions/nobody/deliveries", None),
        404,
        "unknown_session",
    );
    // A scoped key reaches its own sessions' deliveries only.
    s.open("other");
    let (status, body) = s.raw("GET", "/v1/sessions/other/deliveries", None, Some("acme-key"));
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("out_of_scope")),
        "{body}"
    );
}

#[test]
fn a_live_claim_says_when_it_was_made_and_which_items_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path());
    s.open("l");
    let call = s.delegate_sims("l", 2);
    until(&s, "l", "both results are ready", |v| v["counts"]["ready"] == 2);
    let env = s.envelope("l", 60_000);
    let (_, view) = s.call("GET", "/v1/sessions/l", None);
    let claim = &view["claims"][0];
    assert_eq!(claim["claim_id"], env["claim_id"], "{view}");
    assert_eq!(
        sorted(&claim["children"]),
        json!([
            {"child_id": format!("{call}.0"), "call_id": call, "kind": "result"},
            {"child_id": format!("{call}.1"), "call_id": call, "kind": "result"},
        ]),
        "{view}"
    );
    let (made, ends) = (
        claim["claimed_at"].as_u64().unwrap(),
        claim["lease_expires_at"].as_u64().unwrap(),
    );
    assert_eq!(
        ends - made,
        60_000,
        "the lease runs from when the claim was made: {view}"
    );
}
