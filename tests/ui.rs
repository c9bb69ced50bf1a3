//! The live web page `/ui` of `brood serve`, driven in headless Chromium (Debian's `chromium`,
//! which `.ci/run` installs) through the DevTools protocol, against a real server changed over
//! HTTP while the page is open: children appear and end live (only the session's event stream
//! can tell the page), each call's timeline grows and gets its delivery marks, a click shows a
//! child's details, cancel and redrive are done from the page through its dialog, delivered
//! calls and the session list page and filter, a child waiting for a worker is told apart from a
//! running one, and the page fits a 400 px window. Each test saves screenshots of what it saw
//! under `CARGO_TARGET_TMPDIR` and prints their paths.
//!
//! The tests of this file run one at a time (each starts a server and a browser; two cores).

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use serde_json::{json, Value};

mod browser;
mod server;
use browser::*;
use server::*;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The page in a browser, with the browser it runs in.
struct Page {
    tab: Devtools,
    _browser: Browser,
}

/// `/ui` opened on `session`, once the page shows it.
fn open_page(s: &Server, session: &str) -> Page {
    let browser = Browser::open(&format!("{}/ui#s={session}", s.base));
    let mut tab = browser.page();
    tab.until(
        "document.getElementById('session')?.dataset.session ?? null",
        &json!(session),
    );
    Page { tab, _browser: browser }
}

/// A JavaScript string literal of `s`.
fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// JavaScript: attribute `name` of the first element `sel` matches, or null.
fn attr(sel: &str, name: &str) -> String {
    format!(
        "(document.querySelector({})?.getAttribute({}) ?? null)",
        q(sel),
        q(name)
    )
}

/// JavaScript: the text of the first element `sel` matches, or null.
fn text(sel: &str) -> String {
    format!("(document.querySelector({})?.textContent ?? null)", q(sel))
}

/// JavaScript: how many elements `sel` matches.
fn count(sel: &str) -> String {
    format!("document.querySelectorAll({}).length", q(sel))
}

/// JavaScript: whether the text of `sel` contains `part` (false when nothing matches).
fn has_text(sel: &str, part: &str) -> String {
    format!(
        "(document.querySelector({})?.textContent ?? '').includes({})",
        q(sel),
        q(part)
    )
}

fn click(tab: &mut Devtools, sel: &str) {
    let clicked = tab.eval(&format!(
        "(() => {{ const e = document.querySelector({}); if (!e) return false; e.click(); return true; }})()",
        q(sel)
    ));
    assert_eq!(clicked, json!(true), "nothing to click at {sel}");
}

/// Sets the value of the input `sel` and tells the page, as typing does.
fn type_into(tab: &mut Devtools, sel: &str, value: &str, event: &str) {
    let done = tab.eval(&format!(
        "(() => {{ const e = document.querySelector({}); e.value = {}; e.dispatchEvent(new Event({})); return e.value; }})()",
        q(sel),
        q(value),
        q(event)
    ));
    assert_eq!(done, json!(value));
}

/// Answers the page's confirmation dialog: `reason` typed when given, then Confirm.
fn confirm(tab: &mut Devtools, reason: Option<&str>) {
    tab.until("document.getElementById('ask').open", &json!(true));
    if let Some(r) = reason {
        type_into(tab, "#ask-reason", r, "input");
    }
    click(tab, "#ask-yes");
    tab.until("document.getElementById('ask').open", &json!(false));
}

/// A screenshot of the page, written to `CARGO_TARGET_TMPDIR/<name>`; its path is printed.
fn shot(tab: &mut Devtools, name: &str) -> PathBuf {
    let shot = tab.call("Page.captureScreenshot", json!({"format": "png"}));
    let png = base64_decode(shot["data"].as_str().expect("screenshot data"));
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&out, &png).unwrap();
    eprintln!("screenshot: {}", out.display());
    out
}

fn delegate(s: &Server, session: &str, body: Value) -> String {
    let (status, reply) = s.call("POST", &format!("/v1/sessions/{session}/delegate"), Some(body));
    assert_eq!(status, 202, "{reply}");
    reply["call_id"].as_str().unwrap().to_string()
}

fn ack(s: &Server, claim: &str) {
    let (status, reply) = s.call("POST", &format!("/v1/claims/{claim}/ack"), None);
    assert_eq!(status, 200, "{reply}");
}

/// The children of `session` (undelivered calls), by id: their status.
fn statuses(s: &Server, session: &str) -> std::collections::BTreeMap<String, String> {
    let (status, detail) = s.call("GET", &format!("/v1/sessions/{session}"), None);
    assert_eq!(status, 200, "{detail}");
    let calls = detail["calls"].as_array().unwrap();
    calls
        .iter()
        .flat_map(|c| c["children"].as_array().unwrap().iter())
        .map(|ch| {
            (
                ch["child_id"].as_str().unwrap().to_string(),
                ch["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn the_page_shows_a_delegated_child_appear_and_succeed_live() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("web");
    let page = s.send("GET", "/ui", None, None);
    assert_eq!(page.status, 200);
    assert!(page.content_type.starts_with("text/html"), "{}", page.content_type);
    assert!(
        !page.text.contains("https://"),
        "no CDN: the page loads nothing from elsewhere"
    );

    let Page { mut tab, _browser } = open_page(&s, "web");
    tab.until(&count("nav a[data-session=\"web\"]"), &json!(1));

    // Only now the call: the page learns of it from the event stream.
    let call = delegate(
        &s,
        "web",
        json!({"tasks": [{"goal": "slow enough to watch", "runner": {"kind": "sim", "ms": 1500}}]}),
    );
    let row = format!("tr[data-child=\"{call}.0\"]");
    let seen = tab.until(&attr(&row, "data-status"), &json!("running"));
    assert_eq!(
        seen.first(),
        Some(&Value::Null),
        "the child was not on the page before: {seen:?}"
    );
    let seen = tab.until(&attr(&row, "data-status"), &json!("succeeded"));
    assert_eq!(seen.first(), Some(&json!("running")), "{seen:?}");
    // The tree drawn again after the event, with the child's end time.
    let finished = format!("{} !== '–'", text(&format!("{row} td:nth-child(4)")));
    tab.until(&finished, &json!(true));
    tab.until(&has_text("#log", "succeeded"), &json!(true));

    // A failure inside an unfinished unit: its early failure notice is marked on the page.
    let call = delegate(
        &s,
        "web",
        json!({"tasks": [
            {"goal": "fails at once", "runner": {"kind": "sim", "outcome": "fail"}, "group": "pair"},
            {"goal": "keeps the unit open", "runner": {"kind": "sim", "ms": 3000}, "group": "pair"}
        ]}),
    );
    let failed = format!("tr[data-child=\"{call}.0\"] [data-mark=\"notice\"]");
    tab.until(&count(&failed), &json!(1));
    shot(&mut tab, "ui-succeeded.png");
}

#[test]
fn the_timeline_grows_with_the_children_and_marks_each_delivery() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("tl");
    let Page { mut tab, _browser } = open_page(&s, "tl");
    let call = delegate(
        &s,
        "tl",
        json!({"independent_completions": true, "tasks": [
            {"goal": "quick", "runner": sim(0)},
            {"goal": "slow", "runner": sim(2500)}
        ]}),
    );
    let slow = format!(".bar[data-child=\"{call}.1\"]");
    let seen = tab.until(&attr(&slow, "data-status"), &json!("running"));
    assert_eq!(seen.first(), Some(&Value::Null), "no bar before the call: {seen:?}");
    // A running child's bar ends at now: its end moves on.
    let first_end = tab.eval(&attr(&slow, "data-end"));
    tab.until(&format!("{} !== {first_end}", attr(&slow, "data-end")), &json!(true));
    shot(&mut tab, "ui-timeline.png");

    // The quick child's result, claimed: a dashed mark for the live claim; acked: a delivery mark.
    let env = s.envelope("tl", 30_000);
    let claim = env["claim_id"].as_str().unwrap();
    let mark = format!(".timeline[data-timeline=\"{call}\"] .tmark[data-claim=\"{claim}\"]");
    tab.until(&attr(&mark, "class"), &json!("tmark live"));
    ack(&s, claim);
    tab.until(&attr(&mark, "class"), &json!("tmark"));

    let seen = tab.until(&attr(&slow, "data-status"), &json!("succeeded"));
    assert!(seen.contains(&json!("running")), "{seen:?}");
    let (_, detail) = s.call("GET", "/v1/sessions/tl", None);
    let children = detail["calls"][0]["children"].as_array().unwrap();
    let ended = children
        .iter()
        .find(|c| c["child_id"] == format!("{call}.1"))
        .expect("the slow child");
    let finished = ended["finished_at"].as_u64().expect("ended");
    tab.until(&attr(&slow, "data-end"), &json!(finished.to_string()));
    let width = tab.eval(&format!(
        "document.querySelector({}).getBoundingClientRect().width > 10",
        q(&slow)
    ));
    assert_eq!(width, json!(true), "the ended child's bar spans its run");
    shot(&mut tab, "ui-timeline-ended.png");
}

#[test]
fn a_click_on_a_child_shows_its_goal_data_and_the_claim_it_went_out_in() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("det");
    let call = delegate(
        &s,
        "det",
        json!({"tasks": [{"goal": "echo <b>this</b>", "runner": sim(0), "input": {"n": 7, "tag": "<i>x</i>"}}]}),
    );
    let env = s.envelope("det", 30_000);
    let claim = env["claim_id"].as_str().unwrap().to_string();
    let Page { mut tab, _browser } = open_page(&s, "det");
    let row = format!("tr[data-child=\"{call}.0\"]");
    tab.until(&attr(&row, "data-status"), &json!("succeeded"));
    click(&mut tab, &row);

    tab.until(&text("#details [data-field=goal]"), &json!("echo <b>this</b>"));
    assert_eq!(tab.eval(&count("#details b")), json!(0), "escaped, not markup");
    let input = tab.eval(&text("#details [data-field=input]"));
    let parsed: Value = serde_json::from_str(input.as_str().unwrap()).unwrap();
    assert_eq!(parsed, json!({"n": 7, "tag": "<i>x</i>"}));
    let output = tab.eval(&text("#details [data-field=output]"));
    assert_eq!(
        serde_json::from_str::<Value>(output.as_str().unwrap()).unwrap(),
        parsed,
        "a sim hands its input back"
    );
    assert_eq!(tab.eval(&text("#details [data-field=runner]")), json!("sim"));
    // Held by the live claim; then, acked, delivered in it (the call moves to the delivered list).
    let held = format!("#details [data-field=claim] [data-claim=\"{claim}\"]");
    tab.until(&attr(&held, "data-live"), &json!("true"));
    shot(&mut tab, "ui-details.png");
    ack(&s, &claim);
    tab.until(&attr(&held, "data-live"), &json!("false"));
    tab.until(&count(&format!("#delivered {row}")), &json!(1));
    assert_eq!(tab.eval(&text("#details [data-field=goal]")), json!("echo <b>this</b>"));
    shot(&mut tab, "ui-details-delivered.png");
}

#[test]
fn cancel_from_the_page_ends_the_calls_running_children_and_shows_the_reply() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("can");
    let hang = json!({"kind": "sim", "outcome": "hang"});
    let call = delegate(
        &s,
        "can",
        json!({"tasks": [{"goal": "a", "runner": hang}, {"goal": "b", "runner": hang}]}),
    );
    let Page { mut tab, _browser } = open_page(&s, "can");
    for i in 0..2 {
        tab.until(
            &attr(&format!("tr[data-child=\"{call}.{i}\"]"), "data-status"),
            &json!("running"),
        );
    }
    let button = format!("button[data-act=cancel][data-kind=call][data-id=\"{call}\"]");

    // Backing out of the dialog cancels nothing.
    click(&mut tab, &button);
    tab.until("document.getElementById('ask').open", &json!(true));
    click(&mut tab, "#ask-no");
    tab.until("document.getElementById('ask').open", &json!(false));
    assert!(statuses(&s, "can").values().all(|st| st == "running"));

    click(&mut tab, &button);
    confirm(&mut tab, Some("not needed after all"));
    tab.until(&attr("#reply", "data-ok"), &json!("true"));
    let listed = tab.eval(&text("#reply [data-cancelled]"));
    for i in 0..2 {
        assert!(listed.as_str().unwrap().contains(&format!("{call}.{i}")), "{listed}");
    }
    let now = statuses(&s, "can");
    assert_eq!(now.len(), 2, "{now:?}");
    assert!(now.values().all(|st| st == "cancelled"), "{now:?}");
    let (_, detail) = s.call("GET", "/v1/sessions/can", None);
    let error = detail["calls"][0]["children"][0]["error"].as_str().unwrap_or("");
    assert!(error.contains("not needed after all"), "the reason is kept: {error}");
    for i in 0..2 {
        let row = format!("tr[data-child=\"{call}.{i}\"]");
        tab.until(&attr(&row, "data-status"), &json!("cancelled"));
        tab.until(&has_text(&row, "cancelled"), &json!(true));
    }
    shot(&mut tab, "ui-cancel.png");

    // A refusal is shown with its code.
    tab.eval("cancel('child', 'deleg_0.9')");
    confirm(&mut tab, None);
    tab.until(&attr("#reply", "data-ok"), &json!("false"));
    assert_eq!(
        tab.eval(&attr("#reply [data-code]", "data-code")),
        json!("unknown_child")
    );
    shot(&mut tab, "ui-cancel-refused.png");
}

#[test]
fn a_redrive_from_the_page_brings_a_dead_letter_back() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("brood.toml");
    std::fs::write(&config, "max_delivery_attempts = 1\n").unwrap();
    let s = Server::start_with(&dir.path().join("data"), None, &["--config", config.to_str().unwrap()]);
    s.open("dl");
    // Before the page opens: a result made a dead letter, and a failure notice.
    let call = delegate(&s, "dl", json!({"tasks": [{"goal": "lost once", "runner": sim(0)}]}));
    let env = s.envelope("dl", 30_000);
    let claim = env["claim_id"].as_str().unwrap();
    let (status, reply) = s.call(
        "POST",
        &format!("/v1/claims/{claim}/release"),
        Some(json!({"reason": "failed"})),
    );
    assert_eq!(status, 200, "{reply}");
    let (_, dead) = s.call("GET", "/v1/dead-letters?session_id=dl", None);
    assert_eq!(dead["items"].as_array().unwrap().len(), 1, "{dead}");
    let noticed = delegate(
        &s,
        "dl",
        json!({"tasks": [
            {"goal": "fails", "runner": {"kind": "sim", "outcome": "fail"}, "group": "g"},
            {"goal": "holds the unit", "runner": {"kind": "sim", "outcome": "hang"}, "group": "g"}
        ]}),
    );
    s.envelope("dl", 30_000); // the failure notice, claimed before the page opens

    let Page { mut tab, _browser } = open_page(&s, "dl");
    let child = format!("{call}.0");
    tab.until(
        &count(&format!("tr[data-child=\"{child}\"] [data-mark=dead]")),
        &json!(1),
    );
    tab.until(
        &count(&format!("tr[data-child=\"{noticed}.0\"] [data-mark=notice]")),
        &json!(1),
    );
    tab.until(&count(&format!("tr[data-dead=\"{child}\"]")), &json!(1));
    tab.until(&attr("nav a[data-session=\"dl\"]", "data-dead"), &json!("1"));
    shot(&mut tab, "ui-dead-letter.png");

    click(&mut tab, &format!("button[data-act=redrive][data-id=\"{child}\"]"));
    confirm(&mut tab, None);
    tab.until(&attr("#reply [data-redriven]", "data-redriven"), &json!("1"));
    let (_, dead) = s.call("GET", "/v1/dead-letters?session_id=dl", None);
    assert_eq!(dead["items"], json!([]), "{dead}");
    let again = s.envelope("dl", 30_000);
    let items: Vec<&str> = again["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["child_id"].as_str().unwrap())
        .collect();
    assert_eq!(items, vec![child.as_str()], "ready again: {again}");
    tab.until(&count(&format!("tr[data-dead=\"{child}\"]")), &json!(0));
    shot(&mut tab, "ui-redrive.png");
}

#[test]
fn at_400_px_wide_nothing_overflows_the_window() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    let long = "a-session-with-a-very-long-name-".repeat(5);
    s.open(&long);
    for i in 0..12 {
        s.open(&format!("other-{i}"));
    }
    let call = delegate(
        &s,
        &long,
        json!({"tasks": [
            {"goal": "x".repeat(300), "runner": sim(0), "input": {"long": "y".repeat(400)}},
            {"goal": "runs", "runner": {"kind": "sim", "outcome": "hang"}}
        ]}),
    );
    let Page { mut tab, _browser } = open_page(&s, &long);
    tab.call(
        "Emulation.setDeviceMetricsOverride",
        json!({"width": 400, "height": 800, "deviceScaleFactor": 1, "mobile": false}),
    );
    let row = format!("tr[data-child=\"{call}.0\"]");
    tab.until(&attr(&row, "data-status"), &json!("succeeded"));
    click(&mut tab, &row);
    tab.until(&count("#details [data-field=input]"), &json!(1));
    let fits = "document.documentElement.scrollWidth <= document.documentElement.clientWidth";
    assert_eq!(tab.eval("window.innerWidth"), json!(400));
    let widths = tab.eval("[document.documentElement.scrollWidth, document.documentElement.clientWidth]");
    assert_eq!(tab.eval(fits), json!(true), "scroll and client width: {widths}");
    // The session list sits above the view.
    let above = "document.querySelector('nav').getBoundingClientRect().bottom <= document.getElementById('main').getBoundingClientRect().top";
    assert_eq!(tab.eval(above), json!(true));
    shot(&mut tab, "ui-narrow.png");
}

#[test]
fn delivered_calls_are_listed_paged_and_filtered_and_sessions_are_searched() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    for name in ["alpha-1", "alpha-2", "beta-1"] {
        s.open(name);
    }
    // 22 calls delivered before the page opens: a page of 20, and more.
    let calls: Vec<String> = (0..22)
        .map(|i| {
            delegate(
                &s,
                "alpha-1",
                json!({"tasks": [{"goal": format!("t{i}"), "runner": sim(0)}]}),
            )
        })
        .collect();
    let mut acked = 0;
    while acked < 22 {
        let env = s.envelope("alpha-1", 30_000);
        acked += env["items"].as_array().unwrap().len();
        ack(&s, env["claim_id"].as_str().unwrap());
    }
    let Page { mut tab, _browser } = open_page(&s, "alpha-1");
    tab.until(&count("#delivered .call"), &json!(20));
    click(&mut tab, "#delivered-more");
    tab.until(&count("#delivered .call"), &json!(22));
    assert_eq!(
        tab.eval("document.getElementById('delivered-more').hidden"),
        json!(true)
    );
    for call in &calls {
        assert_eq!(
            tab.eval(&count(&format!("#delivered [data-call=\"{call}\"]"))),
            json!(1),
            "{call}"
        );
    }

    // One more, seen open, then delivered after its ack.
    let call = delegate(
        &s,
        "alpha-1",
        json!({"tasks": [{"goal": "late", "runner": {"kind": "sim", "outcome": "fail"}}]}),
    );
    tab.until(&count(&format!("#view [data-call=\"{call}\"]")), &json!(1));
    let env = s.envelope("alpha-1", 30_000);
    ack(&s, env["claim_id"].as_str().unwrap());
    tab.until(&count(&format!("#delivered [data-call=\"{call}\"]")), &json!(1));
    assert_eq!(tab.eval(&count(&format!("#view [data-call=\"{call}\"]"))), json!(0));
    // The status filter: only the failed one.
    type_into(&mut tab, "#filter", "failed", "change");
    tab.until(&count("#delivered .call"), &json!(1));
    assert_eq!(
        tab.eval(&count(&format!("#delivered [data-call=\"{call}\"]"))),
        json!(1)
    );
    type_into(&mut tab, "#filter", "", "change");
    tab.until(&count("#delivered .call"), &json!(23));
    shot(&mut tab, "ui-delivered.png");

    // The session list: by id prefix, then by state.
    tab.until(&count("nav a[data-session]"), &json!(3));
    type_into(&mut tab, "#search", "alpha", "input");
    tab.until(&count("nav a[data-session]"), &json!(2));
    // Busy: children queued or running.
    delegate(
        &s,
        "alpha-2",
        json!({"tasks": [{"goal": "runs", "runner": {"kind": "sim", "outcome": "hang"}}]}),
    );
    type_into(&mut tab, "#state", "busy", "change");
    tab.until(&count("nav a[data-session]"), &json!(1));
    assert_eq!(tab.eval(&count("nav a[data-session=\"alpha-2\"]")), json!(1));
    shot(&mut tab, "ui-sessions.png");

    // Picking another session: the view and the event log are that session's only.
    assert_eq!(tab.eval(&has_text("#log", &call)), json!(true));
    click(&mut tab, "nav a[data-session=\"alpha-2\"]");
    tab.until(&attr("#session", "data-session"), &json!("alpha-2"));
    tab.until(&count("#view .call"), &json!(1));
    assert_eq!(
        tab.eval(&has_text("#log", &call)),
        json!(false),
        "the log of alpha-1 is gone"
    );
    assert_eq!(tab.eval(&count("#delivered .call")), json!(0));
}

#[test]
fn a_child_waiting_for_a_worker_shows_as_waiting_until_a_worker_polls_it() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("ext");
    let Page { mut tab, _browser } = open_page(&s, "ext");
    let call = delegate(
        &s,
        "ext",
        json!({"tasks": [{"goal": "for a worker", "runner": {"kind": "external"}}]}),
    );
    let row = format!("tr[data-child=\"{call}.0\"]");
    tab.until(&attr(&row, "data-state"), &json!("waiting"));
    tab.until(&has_text(&row, "waiting for a worker"), &json!(true));
    let bar = format!(".bar[data-child=\"{call}.0\"]");
    assert_eq!(tab.eval(&attr(&bar, "data-state")), json!("waiting"));
    shot(&mut tab, "ui-waiting.png");

    let (child, token) = s.poll_work();
    assert_eq!(child, format!("{call}.0"));
    tab.until(&attr(&row, "data-state"), &json!("running"));
    let (status, reply) = s.call(
        "POST",
        &format!("/v1/children/{child}/complete"),
        Some(json!({"token": token, "status": "succeeded", "output": {"ok": true}})),
    );
    assert_eq!(status, 200, "{reply}");
    tab.until(&attr(&row, "data-state"), &json!("succeeded"));
}
