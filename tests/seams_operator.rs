//! Where the operator views meet the rest of brood: a session's deliveries and its children's
//! `waiting_for_worker` read through a process that does not serve it (forwarded to its holder)
//! and after another process took it over; a scoped key, which must reach no other tenant's
//! deliveries, claims, children or nested sessions through the new endpoints and fields; and
//! the `/ui` page given a session id, goals and errors made to break it, which it shows as text.
//!
//! A session's deliveries of one call, when retention removed a keyed call and the same key
//! made it again (its ack rows rewritten), name only the new call's acks.
//!
//! The tests on a shared ledger start their own PostgreSQL (the test kit's); the page test
//! drives headless Chromium. They run one at a time.

mod browser;
mod common;
mod server;

use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server::{sim, Server};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The children of a session view (or a call's detail), by id.
fn children(view: &Value) -> std::collections::BTreeMap<String, Value> {
    let calls = match view["calls"].as_array() {
        Some(calls) => calls.clone(),
        None => vec![view.clone()],
    };
    calls
        .iter()
        .flat_map(|c| c["children"].as_array().cloned().unwrap_or_default())
        .map(|ch| (ch["child_id"].as_str().unwrap_or_default().to_string(), ch))
        .collect()
}

/// `GET path` through `s` until `done` holds of a 200 reply (a 5xx while a session changes
/// holders is asked again); that reply.
fn until(s: &Server, path: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let (status, reply) = s.call("GET", path, None);
        if status == 200 && done(&reply) {
            return reply;
        }
        assert!(status == 200 || status >= 500, "{path} answered {status}: {reply}");
        assert!(Instant::now() < deadline, "{what}: not within 40 s: {status} {reply}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The claim ids of a page of deliveries.
fn claim_ids(page: &Value) -> Vec<String> {
    page["deliveries"]
        .as_array()
        .unwrap_or_else(|| panic!("no deliveries: {page}"))
        .iter()
        .map(|a| a["claim_id"].as_str().unwrap().to_string())
        .collect()
}

fn node(dir: &Path, url: &str, name: &str) -> Server {
    Server::node(dir, url, name, "2000")
}

#[test]
fn deliveries_and_waiting_children_read_through_any_process_are_the_holders_and_survive_a_takeover() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let a = node(dir.path(), &url, "a");
    let b = node(dir.path(), &url, "b");
    a.open("f");
    // One result delivered, through the holder.
    let first = a.delegate_sims("f", 1);
    let env = a.envelope("f", 30_000);
    let claim = env["claim_id"].as_str().unwrap().to_string();
    let (status, acked) = a.call("POST", &format!("/v1/claims/{claim}/ack"), None);
    assert_eq!(status, 200, "{acked}");
    // Two external children waiting in a's queue: one not safe to re-run, one that is.
    let (status, reply) = b.call(
        "POST",
        "/v1/sessions/f/delegate",
        Some(json!({"tasks": [
            {"goal": "once", "runner": {"kind": "external", "queue": "seams"}},
            {"goal": "again", "runner": {"kind": "external", "queue": "seams"}, "rerun_on_recovery": true},
        ], "independent_completions": true})),
    );
    assert_eq!(status, 202, "{reply}");
    let call = reply["call_id"].as_str().unwrap().to_string();
    let (once, again) = (format!("{call}.0"), format!("{call}.1"));

    // Asked of b, which does not serve `f`: a's answer, a's queue.
    let view = until(&b, "/v1/sessions/f", "both wait for a worker, seen through b", |v| {
        let ch = children(v);
        [&once, &again]
            .iter()
            .all(|c| ch.get(*c).is_some_and(|c| c["waiting_for_worker"] == true))
    });
    assert_eq!(children(&view)[&once]["status"], "running", "{view}");
    let page = until(&b, "/v1/sessions/f/deliveries", "the ack, through b", |p| {
        p["deliveries"].is_array()
    });
    assert_eq!(claim_ids(&page), vec![claim.clone()], "{page}");
    assert_eq!(page["deliveries"][0]["items"][0]["call_id"], first.as_str(), "{page}");
    let (status, page) = b.call("GET", &format!("/v1/sessions/f/deliveries?call_id={call}"), None);
    assert_eq!((status, claim_ids(&page)), (200, vec![]), "{page}");
    // A call of no session of this one's: nothing, not an error.
    let (status, page) = b.call("GET", "/v1/sessions/f/deliveries?call_id=deleg_elsewhere", None);
    assert_eq!((status, claim_ids(&page)), (200, vec![]), "{page}");

    // a dies; b takes `f` over once a's tenure runs out and recovers it as a restart would.
    a.kill9();
    let view = until(&b, "/v1/sessions/f", "b serves f, its children recovered", |v| {
        let ch = children(v);
        ch.get(&once).is_some_and(|c| c["status"] == "unknown")
            && ch.get(&again).is_some_and(|c| c["waiting_for_worker"] == true)
    });
    let ch = children(&view);
    assert_eq!(
        ch[&once]["waiting_for_worker"], false,
        "ended unknown: it waits for nobody: {view}"
    );
    assert_eq!(ch[&again]["status"], "running", "{view}");
    assert_eq!(ch[&again]["attempts"], 2, "{view}");
    // The ack a recorded is in the shared ledger: b lists it as it is.
    let page = until(&b, "/v1/sessions/f/deliveries", "the ack, after the takeover", |p| {
        p["deliveries"].is_array()
    });
    assert_eq!(claim_ids(&page), vec![claim], "{page}");
}

const ADMIN: &str = "admin-key";
const ACME: &str = "acme-key";
const BETA: &str = "beta-key";

fn as_key(s: &Server, key: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    s.raw(method, path, body.map(|b| b.to_string().into_bytes()), Some(key))
}

#[test]
fn a_scoped_key_reaches_no_other_tenants_deliveries_claims_children_or_nested_sessions() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(
        dir.path(),
        Some(ADMIN),
        &["--scoped-keys", "acme-=acme-key,beta-=beta-key"],
    );
    for (key, session) in [(ACME, "acme-1"), (BETA, "beta-1")] {
        let (status, body) = as_key(
            &s,
            key,
            "PUT",
            &format!("/v1/sessions/{session}"),
            Some(json!({"addressable": true})),
        );
        assert_eq!(status, 200, "{body}");
    }
    // acme: one result delivered, one claimed, one child running that opened a nested session.
    let delegate = |session: &str, tasks: Value| {
        let (status, reply) = as_key(
            &s,
            ACME,
            "POST",
            &format!("/v1/sessions/{session}/delegate"),
            Some(json!({"tasks": tasks, "independent_completions": true})),
        );
        assert_eq!(status, 202, "{reply}");
        reply["call_id"].as_str().unwrap().to_string()
    };
    let done = delegate("acme-1", json!([{"goal": "a", "runner": sim(0)}]));
    let env = server::until_envelope("acme-1", 30_000, |m, p, b| as_key(&s, ACME, m, p, b));
    let claim = env["claim_id"].as_str().unwrap().to_string();
    let (status, acked) = as_key(&s, ACME, "POST", &format!("/v1/claims/{claim}/ack"), None);
    assert_eq!(status, 200, "{acked}");
    let held = delegate("acme-1", json!([{"goal": "hold", "runner": sim(600_000)}]));
    let nested = format!("{held}.0");
    let (status, body) = as_key(
        &s,
        ACME,
        "PUT",
        &format!("/v1/sessions/{nested}"),
        Some(json!({"addressable": true})),
    );
    assert_eq!(status, 200, "{body}");
    delegate(&nested, json!([{"goal": "inner", "runner": sim(0)}]));
    let live = server::until_envelope(&nested, 30_000, |m, p, b| as_key(&s, ACME, m, p, b));
    let live_claim = live["claim_id"].as_str().unwrap().to_string();

    // acme sees its own.
    let (status, page) = as_key(&s, ACME, "GET", "/v1/sessions/acme-1/deliveries", None);
    assert_eq!((status, claim_ids(&page)), (200, vec![claim.clone()]), "{page}");
    let (status, view) = as_key(&s, ACME, "GET", "/v1/sessions/acme-1", None);
    assert_eq!(status, 200, "{view}");
    assert_eq!(children(&view)[&nested]["nested_session"], nested.as_str(), "{view}");
    let (status, view) = as_key(&s, ACME, "GET", &format!("/v1/sessions/{nested}"), None);
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["claims"][0]["claim_id"], live_claim.as_str(), "{view}");

    // beta reaches none of it: not the session, its deliveries, its nested session (judged by
    // the session it came from, not by its id), its calls or its children.
    for path in [
        "/v1/sessions/acme-1/deliveries".to_string(),
        format!("/v1/sessions/acme-1/deliveries?call_id={done}"),
        "/v1/sessions/acme-1".to_string(),
        format!("/v1/sessions/{nested}"),
        format!("/v1/sessions/{nested}/deliveries"),
    ] {
        let (status, reply) = as_key(&s, BETA, "GET", &path, None);
        assert_eq!(status, 403, "{path}: {reply}");
        assert!(!reply.to_string().contains(&claim), "{path}: {reply}");
    }
    let (status, reply) = as_key(&s, BETA, "GET", &format!("/v1/calls/{held}"), None);
    assert_eq!(status, 404, "{reply}");
    // Its own session, asked for an acme call: nothing of acme's.
    let (status, page) = as_key(
        &s,
        BETA,
        "GET",
        &format!("/v1/sessions/beta-1/deliveries?call_id={done}"),
        None,
    );
    assert_eq!((status, claim_ids(&page)), (200, vec![]), "{page}");
    // The list, whatever the filters, names none of acme's sessions.
    for query in [
        "",
        "?prefix=acme",
        "?state=nested",
        "?prefix=deleg_",
        "?state=busy",
        "?state=ready",
    ] {
        let (status, list) = as_key(&s, BETA, "GET", &format!("/v1/sessions{query}"), None);
        assert_eq!(status, 200, "{query}: {list}");
        let ids: Vec<&str> = list["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|s| s["session_id"].as_str())
            .collect();
        assert!(ids.iter().all(|id| *id == "beta-1"), "{query}: {list}");
    }
    let (_, list) = as_key(&s, ACME, "GET", "/v1/sessions?state=nested", None);
    assert_eq!(list["sessions"][0]["session_id"], nested.as_str(), "{list}");
}

/// `s` percent-encoded for a URL path or fragment (every byte outside A-Z a-z 0-9 - _ . ~).
fn pct(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn a_session_id_goal_and_error_made_to_break_the_page_are_shown_as_text() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    // A session id may hold quotes, angle brackets and ampersands (not `/`, `#`, `%` or a space).
    let session = r#"q"'<i>x<script>&amp;"#;
    let path = format!("/v1/sessions/{}", pct(session));
    let (status, body) = s.call("PUT", &path, Some(json!({"addressable": true})));
    assert_eq!(status, 200, "{body}");
    let hostile = r#"</script><img src=x onerror="window.pwned=1"><i>y</i>"#;
    let (status, reply) = s.call(
        "POST",
        &format!("{path}/delegate"),
        Some(json!({"tasks": [
            {"goal": hostile, "runner": {"kind": "sim", "ms": 0, "outcome": "fail", "summary": hostile}},
            {"goal": "hold", "runner": sim(600_000)},
        ]})),
    );
    assert_eq!(status, 202, "{reply}");
    let child = format!("{}.0", reply["call_id"].as_str().unwrap());

    let browser = browser::Browser::open(&format!("{}/ui#s={}", s.base, pct(session)));
    let mut tab = browser.page();
    tab.until(
        "document.getElementById('session')?.dataset.session ?? null",
        &json!(session),
    );
    tab.until(
        &format!("document.querySelector('tr[data-child=\"{child}\"]')?.dataset.status ?? null"),
        &json!("failed"),
    );
    // Open the child's details: its goal, summary and error drawn there too.
    let clicked = tab.eval(&format!(
        "(() => {{ const e = document.querySelector('tr[data-child=\"{child}\"]'); if (!e) return false; e.click(); return true; }})()"
    ));
    assert_eq!(clicked, json!(true));
    tab.until(
        "(document.getElementById('details')?.textContent ?? '').includes('onerror')",
        &json!(true),
    );
    // Shown, as text: the session's heading and its entry in the list.
    assert_eq!(
        tab.eval("document.getElementById('session').textContent"),
        json!(session)
    );
    assert_eq!(
        tab.eval(&format!(
            "document.querySelectorAll('nav a[data-session=\"' + CSS.escape({}) + '\"]').length",
            serde_json::to_string(session).unwrap()
        )),
        json!(1)
    );
    // Nothing of it became markup or ran.
    assert_eq!(tab.eval("typeof window.pwned"), json!("undefined"));
    assert_eq!(tab.eval("document.querySelectorAll('img').length"), json!(0));
    assert_eq!(tab.eval("document.querySelectorAll('i').length"), json!(0));
    assert_eq!(
        tab.eval("document.scripts.length"),
        json!(1),
        "the page's own script only"
    );
}

#[test]
fn a_sync_receipt_is_listed_after_a_later_claim_as_the_contract_says() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("o");
    let (status, reply) = s.call(
        "POST",
        "/v1/sessions/o/delegate",
        Some(json!({"tasks": [{"goal": "now", "runner": sim(0)}], "mode": "sync"})),
    );
    assert_eq!(status, 200, "{reply}");
    let receipt = format!("sync_{}", reply["call_id"].as_str().unwrap());
    until(&s, "/v1/sessions/o/deliveries", "the receipt", |p| {
        claim_ids(p) == vec![receipt.clone()]
    });
    // A claim made and acked after the receipt.
    s.delegate_sims("o", 1);
    let env = s.envelope("o", 30_000);
    let claim = env["claim_id"].as_str().unwrap().to_string();
    let (status, acked) = s.call("POST", &format!("/v1/claims/{claim}/ack"), None);
    assert_eq!(status, 200, "{acked}");
    let (_, page) = s.call("GET", "/v1/sessions/o/deliveries", None);
    assert_eq!(claim_ids(&page), vec![claim, receipt], "{page}");
    let acked_at = |i: usize| page["deliveries"][i]["acked_at"].as_u64().unwrap();
    assert!(acked_at(1) <= acked_at(0), "the receipt was recorded first: {page}");
    // Which is the order the contract states.
    let (_, doc) = s.call("GET", "/v1/openapi.json", None);
    let said = doc["paths"]["/v1/sessions/{session_id}/deliveries"]["get"]["responses"]["200"]["description"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        said.contains("then the receipts of sync calls"),
        "the contract says: {said}"
    );
}

#[test]
fn a_notice_still_undelivered_when_its_unit_completed_reads_null_after_a_restart_as_the_contract_says() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("n");
    let (status, reply) = s.call(
        "POST",
        "/v1/sessions/n/delegate",
        Some(json!({"tasks": [
            {"goal": "fail", "runner": {"kind": "sim", "ms": 0, "outcome": "fail"}},
            {"goal": "end later", "runner": sim(1000)},
        ]})),
    );
    assert_eq!(status, 202, "{reply}");
    let failed = format!("{}.0", reply["call_id"].as_str().unwrap());
    until(&s, "/v1/sessions/n", "the notice raised", |v| {
        children(v).get(&failed).is_some_and(|c| c["notice"] == "undelivered")
    });
    let view = until(&s, "/v1/sessions/n", "the unit's results ready beside it", |v| {
        v["counts"]["ready"] == 3
    });
    assert_eq!(children(&view)[&failed]["notice"], "undelivered", "{view}");
    drop(s);
    // Recovered, the unit's results go out; the notice is not sent again, and reads null.
    let s = Server::start(dir.path(), None);
    let view = until(&s, "/v1/sessions/n", "the results ready again", |v| {
        v["counts"]["ready"] == 2
    });
    assert_eq!(children(&view)[&failed]["notice"], Value::Null, "{view}");
    // Which is what the contract says of it.
    let (_, doc) = s.call("GET", "/v1/openapi.json", None);
    let said = doc["components"]["schemas"]["ChildView"]["properties"]["notice"]["oneOf"][0]["description"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        said.contains("after a restart or an owner rebuild"),
        "the contract says: {said}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_made_again_under_its_key_lists_only_its_own_deliveries_once_retention_rewrote_the_acks() {
    use brood::DelegateRequest;
    use common::{call_left_memory, delegated, next_envelope, open_wake, status_until, task, TestBrood, LONG_LEASE};
    let t = TestBrood::with_retention(brood::Retention {
        delivered: Duration::from_millis(50),
        dead: Duration::from_secs(3_600),
        idle_session: None,
        interval: None,
        batch: 2,
    });
    let b = t.b();
    open_wake(b, "s").await;
    let keyed = || DelegateRequest::background(vec![task("once", common::sim(0))]).idempotency_key("k");
    let first = delegated(b, "s", keyed()).await;
    // Another call's item acked in the same claim: that call stays (a child of it runs).
    let other = delegated(
        b,
        "s",
        DelegateRequest::background(vec![task("quick", common::sim(0)), task("runs", common::hold())]).independent(),
    )
    .await;
    status_until(b, "s", "two results ready", |st| st.counts.ready == 2).await;
    let env = next_envelope(b, "s", "t", LONG_LEASE).await;
    assert_eq!(env.items.len(), 2);
    b.ack(&env.claim_id).await.unwrap();
    let (acks, _) = b.deliveries("s", Some(&first), None, 100).await.unwrap();
    assert_eq!(acks.len(), 1, "{acks:?}");
    assert_eq!(acks[0].items.len(), 1, "only the keyed call's item: {acks:?}");
    call_left_memory(b, "s", &first).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(b.sweep().await.unwrap().calls, 1);
    // The shared ack row stays, naming the other call's item only.
    let (acks, _) = b.deliveries("s", None, None, 100).await.unwrap();
    assert_eq!(acks.len(), 1, "{acks:?}");
    assert!(acks[0].items.iter().all(|i| i.call_id == other), "{acks:?}");
    // Made again under its key, with the same id: none of the first one's acks is its.
    let again = delegated(b, "s", keyed()).await;
    assert_eq!(again, first);
    let (acks, next) = b.deliveries("s", Some(&again), None, 100).await.unwrap();
    assert!(acks.is_empty() && next.is_none(), "{acks:?}");
    let st = status_until(b, "s", "the new result ready", |st| st.counts.ready == 1).await;
    let call = st.calls.iter().find(|c| c.call.call_id == again).unwrap();
    let result = &call.children[0].result;
    assert!(result.published && !result.delivered, "{result:?}");
    let env = next_envelope(b, "s", "t", LONG_LEASE).await;
    b.ack(&env.claim_id).await.unwrap();
    let (acks, _) = b.deliveries("s", Some(&again), None, 100).await.unwrap();
    let ids: Vec<&str> = acks.iter().map(|a| a.claim_id.as_str()).collect();
    assert_eq!(ids, vec![env.claim_id.as_str()], "{acks:?}");
}
