//! The live web page `/ui` of `brood serve`, driven in headless Chromium (Debian's `chromium`,
//! which `.ci/run` installs): the page is opened on a session first, a call is delegated over
//! HTTP afterwards, and the page is watched (through the DevTools protocol) while its child
//! appears and turns `succeeded` — which only the session's event stream can tell it, as the
//! page renders a session's tree again only when an event comes — and while a failure inside an
//! unfinished unit is marked with its early failure notice. A screenshot is saved.

use serde_json::{json, Value};

mod browser;
mod server;
use browser::*;
use server::*;

#[test]
fn the_page_shows_a_delegated_child_appear_and_succeed_live() {
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

    let browser = Browser::open(&format!("{}/ui#s=web", s.base));
    let mut tab = browser.page();
    tab.until(
        "document.getElementById('session')?.dataset.session ?? null",
        &json!("web"),
    );
    tab.until(
        "document.querySelector('nav a[data-session=\"web\"]') ? 'listed' : null",
        &json!("listed"),
    );

    // Only now the call: the page learns of it from the event stream.
    let (status, reply) = s.call(
        "POST",
        "/v1/sessions/web/delegate",
        Some(json!({"tasks": [{"goal": "slow enough to watch", "runner": {"kind": "sim", "ms": 1500}}]})),
    );
    assert_eq!(status, 202, "{reply}");
    let child = format!("{}.0", reply["call_id"].as_str().unwrap());
    let status_of = format!("document.querySelector('tr[data-child=\"{child}\"]')?.dataset.status ?? null");
    let seen = tab.until(&status_of, &json!("running"));
    assert_eq!(
        seen.first(),
        Some(&Value::Null),
        "the child was not on the page before: {seen:?}"
    );
    let seen = tab.until(&status_of, &json!("succeeded"));
    assert_eq!(seen.first(), Some(&json!("running")), "{seen:?}");
    // The tree drawn again after the event, with the child's end time.
    let finished = format!(
        "document.querySelector('tr[data-child=\"{child}\"] td:nth-child(4)')?.textContent !== '–' ? 'finished' : null"
    );
    tab.until(&finished, &json!("finished"));
    let logged = tab.eval("document.getElementById('log').textContent");
    assert!(logged.as_str().is_some_and(|t| t.contains("succeeded")), "{logged}");

    // A failure inside an unfinished unit: its early failure notice is marked on the page.
    let (status, reply) = s.call(
        "POST",
        "/v1/sessions/web/delegate",
        Some(json!({"tasks": [
            {"goal": "fails at once", "runner": {"kind": "sim", "outcome": "fail"}, "group": "pair"},
            {"goal": "keeps the unit open", "runner": {"kind": "sim", "ms": 3000}, "group": "pair"}
        ]})),
    );
    assert_eq!(status, 202, "{reply}");
    let failed = format!("{}.0", reply["call_id"].as_str().unwrap());
    let marked = format!(
        "document.querySelector('tr[data-child=\"{failed}\"]')?.textContent.includes('failure notice') ? 'marked' : null"
    );
    tab.until(&marked, &json!("marked"));

    let shot = tab.call("Page.captureScreenshot", json!({"format": "png"}));
    let png = base64_decode(shot["data"].as_str().expect("screenshot data"));
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-succeeded.png");
    std::fs::write(&out, &png).unwrap();
    eprintln!("screenshot: {}", out.display());
}
