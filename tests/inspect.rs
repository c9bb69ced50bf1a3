//! `brood inspect` and the `GET /v1/sessions` listing it pages through: the real binary
//! against a running `brood serve`, then against the data dir that server left, with the same
//! JSON shape from both; a data dir a server holds is refused and left as it was; a missing one
//! is refused and not created; `limit` and `next` page through every session.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod server;
use server::*;

const KEY: &str = "inspect-key";

/// `brood inspect` with `args`, without a key or a backtrace from the environment.
fn inspect(args: &[&str], env_key: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_brood"));
    cmd.arg("inspect")
        .args(args)
        .env_remove("BROOD_API_KEY")
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE");
    if let Some(k) = env_key {
        cmd.env("BROOD_API_KEY", k);
    }
    cmd.output().expect("run brood inspect")
}

fn json_of(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "brood inspect failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

fn failure(out: &Output) -> String {
    assert!(!out.status.success(), "brood inspect should have failed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn wait_ready(s: &Server, session: &str, ready: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, view) = s.call("GET", &format!("/v1/sessions/{session}"), None);
        if view["counts"]["ready"] == ready {
            return;
        }
        assert!(Instant::now() < deadline, "{session} never had {ready} ready: {view}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A server (with a key, and one delivery attempt per item) holding: session `alpha` with
/// call A (1 child, acked) and call B (2 children, ready); session `beta` with call C, whose
/// one result was released `failed` and so dead-lettered. Returns the call ids A, B, C.
fn populated(dir: &Path) -> (Server, [String; 3]) {
    let s = Server::start_with(dir, Some(KEY), &["--max-delivery-attempts", "1"]);
    s.open("alpha");
    s.open("beta");
    let a = s.delegate_sims("alpha", 1);
    let env = s.envelope("alpha", 30_000);
    let (status, _) = s.call(
        "POST",
        &format!("/v1/claims/{}/ack", env["claim_id"].as_str().unwrap()),
        None,
    );
    assert_eq!(status, 200);
    let b = s.delegate_sims("alpha", 2);
    wait_ready(&s, "alpha", 2);
    let c = s.delegate_sims("beta", 1);
    let env = s.envelope("beta", 30_000);
    let (status, body) = s.call(
        "POST",
        &format!("/v1/claims/{}/release", env["claim_id"].as_str().unwrap()),
        Some(json!({"reason": "failed"})),
    );
    assert_eq!(status, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.call("GET", "/v1/dead-letters", None).1["items"]
        .as_array()
        .map(Vec::len)
        != Some(1)
    {
        assert!(Instant::now() < deadline, "the released item was never dead-lettered");
        std::thread::sleep(Duration::from_millis(20));
    }
    (s, [a, b, c])
}

fn session<'a>(inspection: &'a Value, id: &str) -> &'a Value {
    inspection["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["session_id"] == id)
        .unwrap_or_else(|| panic!("no session {id} in {inspection}"))
}

fn call<'a>(inspection: &'a Value, session_id: &str, call_id: &str) -> &'a Value {
    session(inspection, session_id)["calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["call_id"] == call_id)
        .unwrap_or_else(|| panic!("no call {call_id} in {inspection}"))
}

fn ids(inspection: &Value) -> Vec<String> {
    inspection["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap().to_string())
        .collect()
}

/// A call's children with the fields both sources know.
fn children(call: &Value) -> Vec<Value> {
    call["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            json!([
                c["child_id"],
                c["task_index"],
                c["status"],
                c["started_at"],
                c["finished_at"]
            ])
        })
        .collect()
}

#[test]
fn inspect_of_a_server_shows_its_sessions_calls_children_and_dead_letters() {
    let dir = tempfile::tempdir().unwrap();
    let (s, [a, b, c]) = populated(dir.path());
    let found = json_of(&inspect(&["--server", &s.base, "--json"], Some(KEY)));
    assert_eq!(found["source"], "server");
    // The whole tree: the delivered call too, with where each result is.
    assert_eq!(call(&found, "alpha", &a)["children"][0]["delivery"], "delivered");
    assert_eq!(call(&found, "alpha", &b)["children"][1]["delivery"], "undelivered");
    assert_eq!(call(&found, "beta", &c)["children"][0]["delivery"], "dead_letter");
    assert_eq!(ids(&found), ["alpha", "beta"]);
    let alpha = session(&found, "alpha");
    assert_eq!(alpha["counts"]["ready"], 2, "{alpha}");
    assert_eq!(alpha["counts"]["delivered"], 1, "{alpha}");
    assert_eq!(alpha["parent_child_id"], Value::Null);
    let call_b = call(&found, "alpha", &b);
    assert_eq!(call_b["set"], 2);
    assert_eq!(call_b["mode"], "background");
    assert_eq!(call_b["units"].as_array().unwrap().len(), 2, "{call_b}");
    let statuses: Vec<&Value> = call_b["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["status"])
        .collect();
    assert_eq!(statuses, ["succeeded", "succeeded"]);
    let dead = found["dead_letters"].as_array().unwrap();
    assert_eq!(dead.len(), 1, "{found}");
    assert_eq!(dead[0]["child_id"], format!("{c}.0"));
    assert_eq!(dead[0]["session_id"], "beta");
    assert_eq!(dead[0]["attempts"], 1);

    let out = inspect(&["--server", &s.base, "--api-key", KEY], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    for id in [
        "session alpha",
        "session beta",
        &b,
        &format!("{b}.0"),
        &format!("{b}-2"),
        &format!("{c}.0"),
    ] {
        assert!(table.contains(id), "the table lacks {id}:\n{table}");
    }
    let first = &call_b["children"][0];
    assert_eq!(first["delivery_attempt"], 1, "{first}");
    assert!(
        first["summary"]
            .as_str()
            .is_some_and(|t| !t.is_empty() && !t.contains('\n')),
        "{first}"
    );
    assert!(call_b["created_at"].as_u64().is_some(), "{call_b}");
    assert!(
        table.contains("ATTEMPT") && table.contains("SUMMARY") && table.contains("age "),
        "{table}"
    );

    // A live claim is shown with its consumer and lease.
    let (status, env) = s.call(
        "POST",
        "/v1/sessions/alpha/boundary",
        Some(json!({"consumer": "tui-7", "lease_ms": 60000})),
    );
    assert_eq!(status, 200, "{env}");
    let found = json_of(&inspect(&["--server", &s.base, "--json"], Some(KEY)));
    let claims = session(&found, "alpha")["claims"].as_array().unwrap().clone();
    assert_eq!(claims.len(), 1, "{found}");
    assert_eq!(
        (claims[0]["consumer"].as_str(), claims[0]["items"].as_u64()),
        (Some("tui-7"), Some(2))
    );
    assert_eq!(claims[0]["claim_id"], env["claim_id"]);
    let out = inspect(&["--server", &s.base, "--api-key", KEY], None);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("live claims") && table.contains("tui-7"), "{table}");
}

#[test]
fn inspect_of_one_session_shows_that_session_only() {
    let dir = tempfile::tempdir().unwrap();
    let (s, [_, _, c]) = populated(dir.path());
    let found = json_of(&inspect(
        &["--server", &s.base, "--json", "--session", "beta"],
        Some(KEY),
    ));
    assert_eq!(ids(&found), ["beta"]);
    assert_eq!(found["dead_letters"][0]["child_id"], format!("{c}.0"));
    let err = failure(&inspect(&["--server", &s.base, "--session", "nobody"], Some(KEY)));
    assert!(err.contains("no session `nobody`"), "{err}");
}

#[test]
fn inspect_of_the_data_dir_a_stopped_server_left_matches_what_the_server_showed() {
    let dir = tempfile::tempdir().unwrap();
    let (s, [a, b, c]) = populated(dir.path());
    let served = json_of(&inspect(&["--server", &s.base, "--json"], Some(KEY)));
    assert!(s.terminate().success());
    let data = dir.path().to_str().unwrap();
    let stored = json_of(&inspect(&["--data-dir", data, "--json"], None));
    assert_eq!(stored["source"], "data_dir");
    assert_eq!(ids(&stored), ids(&served));
    for id in ["alpha", "beta"] {
        let (now, then) = (session(&stored, id), session(&served, id));
        assert_eq!(now["counts"], then["counts"], "{id}: {now} vs {then}");
        assert_eq!(now["turn"], then["turn"]);
    }
    // Every call the server still routed is stored with the same units and children.
    for sess in served["sessions"].as_array().unwrap() {
        for then in sess["calls"].as_array().unwrap() {
            let sid = sess["session_id"].as_str().unwrap();
            let now = call(&stored, sid, then["call_id"].as_str().unwrap());
            assert_eq!(
                (&now["set"], &now["mode"], &now["units"]),
                (&then["set"], &then["mode"], &then["units"])
            );
            assert_eq!(children(now), children(then));
        }
    }
    // The data dir also knows where each result is: acked, recorded, dead-lettered.
    assert_eq!(call(&stored, "alpha", &a)["children"][0]["delivery"], "delivered");
    assert_eq!(call(&stored, "alpha", &b)["children"][1]["delivery"], "undelivered");
    assert_eq!(call(&stored, "beta", &c)["children"][0]["delivery"], "dead_letter");
    assert_eq!(stored["dead_letters"], served["dead_letters"]);
    assert_eq!(stored["quarantined"], json!([]));

    let out = inspect(&["--data-dir", data], None);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for id in [&a, &b, &c] {
        assert!(table.contains(id.as_str()), "the table lacks {id}:\n{table}");
    }
    assert!(
        table.contains("dead_letter") && table.contains("quarantined rows: none"),
        "{table}"
    );
}

/// Every file under `dir` with its bytes.
fn contents(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.insert(path.display().to_string(), std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

#[test]
fn inspect_of_a_data_dir_a_server_holds_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = populated(dir.path());
    // The server is idle now; wait until its files stop changing.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut before = contents(dir.path());
    loop {
        std::thread::sleep(Duration::from_millis(600));
        let again = contents(dir.path());
        if again == before {
            break;
        }
        before = again;
        assert!(Instant::now() < deadline, "the idle server kept writing");
    }
    let err = failure(&inspect(&["--data-dir", dir.path().to_str().unwrap()], None));
    assert!(
        err.contains("the data dir") && err.contains("is in use by another process; use --server URL"),
        "{err}"
    );
    assert!(contents(dir.path()) == before, "inspect changed the data dir");
    let (status, _) = s.call("GET", "/v1/sessions/alpha", None);
    assert_eq!(status, 200, "the server is undisturbed");
}

#[test]
fn inspect_of_a_data_dir_leaves_it_byte_for_byte_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = populated(dir.path());
    assert!(s.terminate().success());
    let before = contents(dir.path());
    json_of(&inspect(&["--data-dir", dir.path().to_str().unwrap(), "--json"], None));
    assert!(contents(dir.path()) == before, "inspect changed the data dir");
}

#[test]
fn inspect_of_a_missing_data_dir_is_refused_and_creates_nothing() {
    let cwd = tempfile::tempdir().unwrap();
    let missing = cwd.path().join("nope");
    let err = failure(&inspect(&["--data-dir", missing.to_str().unwrap()], None));
    assert!(err.contains("does not exist"), "{err}");
    assert!(!missing.exists(), "inspect created {}", missing.display());
    // Without --server and --data-dir it reads ./brood-data, and creates it no more.
    let out = Command::new(env!("CARGO_BIN_EXE_brood"))
        .arg("inspect")
        .current_dir(cwd.path())
        .env_remove("BROOD_API_KEY")
        .output()
        .unwrap();
    let err = failure(&out);
    assert!(err.contains("brood-data") && err.contains("does not exist"), "{err}");
    assert_eq!(std::fs::read_dir(cwd.path()).unwrap().count(), 0);
}

#[test]
fn inspect_of_an_unreachable_server_or_with_a_wrong_key_fails_clearly() {
    let nobody = format!("http://127.0.0.1:{}", free_port());
    let err = failure(&inspect(&["--server", &nobody], None));
    assert!(err.contains("could not be reached"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Some(KEY));
    let err = failure(&inspect(&["--server", &s.base], Some("wrong")));
    assert!(err.contains("401") && err.contains("unauthorized"), "{err}");
}

#[test]
fn the_session_list_pages_by_limit_and_next_in_id_order() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    let mut made: Vec<String> = ["s3", "s1", "s5", "s2", "s4"].iter().map(|x| x.to_string()).collect();
    for id in &made {
        s.open(id);
    }
    made.sort();
    let mut walked = Vec::new();
    let mut path = "/v1/sessions?limit=1".to_string();
    loop {
        let (status, page) = s.call("GET", &path, None);
        assert_eq!(status, 200, "{page}");
        let listed = page["sessions"].as_array().unwrap();
        assert_eq!(listed.len(), 1, "{page}");
        let first = &listed[0];
        assert_eq!(first["turn"], "idle");
        assert_eq!(first["wake_capable"], true);
        assert_eq!(first["counts"]["queued"], 0);
        assert_eq!(first["parent_child_id"], Value::Null);
        walked.push(first["session_id"].as_str().unwrap().to_string());
        match page["next"].as_str() {
            Some(next) => {
                assert_eq!(next, walked.last().unwrap());
                path = format!("/v1/sessions?limit=1&after={next}");
            }
            None => break,
        }
        assert!(walked.len() <= made.len(), "next never ended: {walked:?}");
    }
    assert_eq!(walked, made);
    let (status, all) = s.call("GET", "/v1/sessions", None);
    assert_eq!((status, &all["next"]), (200, &Value::Null));
    assert_eq!(all["sessions"].as_array().unwrap().len(), 5);
}

#[test]
fn a_session_list_limit_outside_1_to_1000_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    for bad in ["0", "1001", "ten", "-1"] {
        let message = assert_error(
            s.call("GET", &format!("/v1/sessions?limit={bad}"), None),
            400,
            "invalid_request",
        );
        assert!(message.contains("limit"), "{message}");
    }
}

#[test]
fn inspect_shows_a_summary_holding_terminal_controls_escaped_and_json_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("controls");
    let summary = "before\x1b[2J\rafter\x07";
    let (status, reply) = s.call(
        "POST",
        "/v1/sessions/controls/delegate",
        Some(json!({"tasks": [{"goal": "say it", "runner": {"kind": "sim", "summary": summary}}]})),
    );
    assert_eq!(status, 202, "{reply}");
    wait_ready(&s, "controls", 1);

    let out = inspect(&["--server", &s.base], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        !table.contains(['\x1b', '\r', '\x07']),
        "the table holds the raw controls: {table:?}"
    );
    assert!(table.contains(r"before\u{1b}[2J\rafter\u{7}"), "{table}");

    let json = json_of(&inspect(&["--server", &s.base, "--json"], None));
    let child = &call(&json, "controls", reply["call_id"].as_str().unwrap())["children"][0];
    assert_eq!(child["summary"], summary, "JSON keeps the text as it is: {child}");
}
