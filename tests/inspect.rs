//! `brood inspect` and the `GET /v1/sessions` listing it pages through: the real binary
//! against a running `brood serve`, then against the data dir that server left, with the same
//! JSON shape from both; the summary (the default view) stays a few lines however many calls a
//! session has; `--tree` shows a page of calls (`--limit`, `--after`) with each child's goal;
//! text from users reaches the terminal escaped; a data dir a server holds is refused and left
//! as it was; a missing one is refused and not created; `limit` and `next` page through every
//! session.

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
    let found = json_of(&inspect(&["--server", &s.base, "--tree", "--json"], Some(KEY)));
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

    let out = inspect(&["--server", &s.base, "--api-key", KEY, "--tree"], None);
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
    let found = json_of(&inspect(&["--server", &s.base, "--tree", "--json"], Some(KEY)));
    let claims = session(&found, "alpha")["claims"].as_array().unwrap().clone();
    assert_eq!(claims.len(), 1, "{found}");
    assert_eq!(
        (claims[0]["consumer"].as_str(), claims[0]["items"].as_u64()),
        (Some("tui-7"), Some(2))
    );
    assert_eq!(claims[0]["claim_id"], env["claim_id"]);
    for view in [&["--tree"][..], &[]] {
        let out = inspect(&[&["--server", &s.base, "--api-key", KEY][..], view].concat(), None);
        let table = String::from_utf8_lossy(&out.stdout);
        assert!(table.contains("live claims") && table.contains("tui-7"), "{table}");
    }
}

#[test]
fn inspect_of_one_session_shows_that_session_only() {
    let dir = tempfile::tempdir().unwrap();
    let (s, [_, _, c]) = populated(dir.path());
    let found = json_of(&inspect(
        &["--server", &s.base, "--tree", "--json", "--session", "beta"],
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
    let served = json_of(&inspect(&["--server", &s.base, "--tree", "--json"], Some(KEY)));
    assert!(s.terminate().success());
    let data = dir.path().to_str().unwrap();
    let stored = json_of(&inspect(&["--data-dir", data, "--tree", "--json"], None));
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

    let out = inspect(&["--data-dir", data, "--tree"], None);
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
    json_of(&inspect(
        &["--data-dir", dir.path().to_str().unwrap(), "--tree", "--json"],
        None,
    ));
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

    let out = inspect(&["--server", &s.base, "--tree"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        !table.contains(['\x1b', '\r', '\x07']),
        "the table holds the raw controls: {table:?}"
    );
    assert!(table.contains(r"before\u{1b}[2J\rafter\u{7}"), "{table}");

    let json = json_of(&inspect(&["--server", &s.base, "--tree", "--json"], None));
    let child = &call(&json, "controls", reply["call_id"].as_str().unwrap())["children"][0];
    assert_eq!(child["summary"], summary, "JSON keeps the text as it is: {child}");
}

/// The lines of a successful `brood inspect`'s output.
fn text_of(out: &Output) -> String {
    assert!(
        out.status.success(),
        "brood inspect failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("inspect prints UTF-8")
}

/// A goal longer than the tree's goal column.
const LONG_GOAL: &str = "read every log line of the nightly build and name the step that failed first";

/// The calls a `--tree` table shows, in order.
fn shown_calls(table: &str) -> Vec<String> {
    table
        .lines()
        .filter_map(|l| l.strip_prefix("  call "))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect()
}

/// A server (no key) whose session `many` holds 30 calls of one finished, undelivered child
/// each, then a 31st whose one child waits for an external worker that never comes (its goal
/// [`LONG_GOAL`]). Returns the server and the ids of the 31 calls by set.
fn many_calls(dir: &Path) -> (Server, Vec<String>) {
    let s = Server::start(dir, None);
    s.open("many");
    let mut calls: Vec<String> = (0..30).map(|_| s.delegate_sims("many", 1)).collect();
    wait_ready(&s, "many", 30);
    let reply = s.delegate_task("many", json!({"goal": LONG_GOAL, "runner": {"kind": "external"}}));
    calls.push(reply["call_id"].as_str().unwrap().to_string());
    (s, calls)
}

#[test]
fn the_summary_of_a_session_with_many_calls_stays_a_few_lines_from_either_source() {
    let dir = tempfile::tempdir().unwrap();
    let (s, calls) = many_calls(dir.path());
    let waiting = format!("{}.0", calls[30]);
    let served = json_of(&inspect(&["--server", &s.base, "--json"], None));
    let many = session(&served, "many");
    assert_eq!(
        many["calls"],
        json!({"total": 31, "unfinished": 1, "undelivered": 30, "dead_lettered": 0, "delivered": 0}),
        "{many}"
    );
    assert_eq!(many["counts"]["ready"], 30, "{many}");
    assert_eq!(many["oldest_unfinished"]["child_id"], waiting.as_str(), "{many}");
    assert_eq!(many["oldest_unfinished"]["goal"], LONG_GOAL, "{many}");
    assert_eq!(many["dead_letters"], json!({"total": 0, "first": []}), "{many}");
    let status = many["oldest_unfinished"]["status"].as_str().unwrap().to_string();

    let table = text_of(&inspect(&["--server", &s.base], None));
    assert!(table.lines().count() <= 10, "the summary is long:\n{table}");
    assert!(
        table.contains("calls 31: unfinished 1  undelivered 30  dead_lettered 0  delivered 0"),
        "{table}"
    );
    assert!(table.contains("ready 30"), "{table}");
    assert!(
        table.contains(&format!("oldest unfinished child: {waiting}  {status} for ")),
        "{table}"
    );
    // No call is listed, and the goal is cut to the column's 40 characters.
    for call in &calls[..30] {
        assert!(!table.contains(call.as_str()), "the summary lists {call}:\n{table}");
    }
    let cut: String = LONG_GOAL.chars().take(39).collect::<String>() + "…";
    assert!(table.contains(&format!("goal: {cut}\n")), "{table}");

    // The data dir the server leaves gives the same view.
    s.kill9();
    let data = dir.path().to_str().unwrap();
    let stored = json_of(&inspect(&["--data-dir", data, "--json"], None));
    assert_eq!(session(&stored, "many")["calls"]["total"], 31, "{stored}");
    assert_eq!(
        session(&stored, "many")["oldest_unfinished"]["child_id"],
        waiting.as_str(),
        "{stored}"
    );
    let table = text_of(&inspect(&["--data-dir", data], None));
    assert!(table.lines().count() <= 12, "the summary is long:\n{table}");
    assert!(table.contains("calls 31: "), "{table}");
}

#[test]
fn the_tree_shows_a_page_of_calls_says_how_many_follow_and_after_continues() {
    let dir = tempfile::tempdir().unwrap();
    let (s, calls) = many_calls(dir.path());
    let table = text_of(&inspect(&["--server", &s.base, "--tree", "--limit", "5"], None));
    assert_eq!(shown_calls(&table), calls[..5], "{table}");
    assert!(table.contains("calls 1-5 of 31"), "{table}");
    assert!(
        table.contains(&format!("… 26 more calls: add --after {} to see", calls[4])),
        "{table}"
    );
    // The child's goal is a column, cut to 40 characters.
    assert!(table.contains("GOAL") && table.contains(" t0 "), "{table}");

    let next = text_of(&inspect(
        &["--server", &s.base, "--tree", "--limit", "5", "--after", &calls[4]],
        None,
    ));
    assert_eq!(shown_calls(&next), calls[5..10], "{next}");
    assert!(next.contains("calls 6-10 of 31"), "{next}");
    assert!(next.contains(&format!("add --after {} to see", calls[9])), "{next}");

    let page = json_of(&inspect(
        &[
            "--server", &s.base, "--tree", "--json", "--limit", "5", "--after", &calls[27],
        ],
        None,
    ));
    let many = session(&page, "many");
    let ids: Vec<&str> = many["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["call_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, calls[28..], "{page}");
    assert_eq!(
        (&many["calls_total"], &many["calls_more"], &many["calls_next"]),
        (&json!(31), &json!(0), &Value::Null)
    );
    assert_eq!(many["calls"][2]["children"][0]["goal"], LONG_GOAL);
    let last = text_of(&inspect(&["--server", &s.base, "--tree", "--after", &calls[27]], None));
    let cut: String = LONG_GOAL.chars().take(39).collect::<String>() + "…";
    assert!(last.contains(&cut) && !last.contains(LONG_GOAL), "{last}");
    assert!(!last.contains("more calls"), "{last}");

    // The default page is 20 calls.
    let first = text_of(&inspect(&["--server", &s.base, "--tree"], None));
    assert_eq!(shown_calls(&first), calls[..20], "{first}");
    assert!(first.contains("… 11 more calls"), "{first}");

    let err = failure(&inspect(
        &["--server", &s.base, "--tree", "--after", "deleg_nope"],
        None,
    ));
    assert!(err.contains("no call `deleg_nope`"), "{err}");
    let err = failure(&inspect(&["--server", &s.base, "--limit", "5"], None));
    assert!(err.contains("--tree"), "{err}");
    let err = failure(&inspect(&["--server", &s.base, "--tree", "--limit", "0"], None));
    assert!(err.contains("--limit"), "{err}");

    // A data dir pages the same way.
    s.kill9();
    let data = dir.path().to_str().unwrap();
    let stored = text_of(&inspect(
        &["--data-dir", data, "--tree", "--limit", "5", "--after", &calls[4]],
        None,
    ));
    assert_eq!(shown_calls(&stored), calls[5..10], "{stored}");
    assert!(
        stored.contains(&format!("… 21 more calls: add --after {}", calls[9])),
        "{stored}"
    );
}

#[test]
fn the_summary_shows_call_states_and_the_first_dead_letters_with_their_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (s, [_, _, c]) = populated(dir.path());
    let served = json_of(&inspect(&["--server", &s.base, "--json"], Some(KEY)));
    let alpha = session(&served, "alpha");
    assert_eq!(
        alpha["calls"],
        json!({"total": 2, "unfinished": 0, "undelivered": 1, "dead_lettered": 0, "delivered": 1}),
        "{alpha}"
    );
    assert_eq!(alpha["oldest_unfinished"], Value::Null);
    let beta = session(&served, "beta");
    assert_eq!(beta["calls"]["dead_lettered"], 1, "{beta}");
    assert_eq!(beta["dead_letters"]["total"], 1, "{beta}");
    let dead = &beta["dead_letters"]["first"][0];
    assert_eq!(dead["child_id"], format!("{c}.0"));
    let reason = dead["reason"].as_str().unwrap().to_string();
    assert!(!reason.is_empty(), "{dead}");

    let table = text_of(&inspect(&["--server", &s.base], Some(KEY)));
    let beta_block = table.split("session beta").nth(1).expect("a beta block");
    assert!(beta_block.contains("dead letters 1"), "{table}");
    let row = beta_block
        .lines()
        .find(|l| l.contains(&format!("{c}.0")))
        .unwrap_or_else(|| panic!("no dead letter row:\n{table}"));
    assert!(row.contains(&reason) && row.contains("result"), "{row}");
    assert!(table.contains("oldest unfinished child: none"), "{table}");

    // The data dir the server leaves summarises the same.
    assert!(s.terminate().success());
    let stored = json_of(&inspect(&["--data-dir", dir.path().to_str().unwrap(), "--json"], None));
    for id in ["alpha", "beta"] {
        let (now, then) = (session(&stored, id), session(&served, id));
        for field in ["calls", "counts", "dead_letters", "oldest_unfinished"] {
            assert_eq!(now[field], then[field], "{id} {field}");
        }
    }
    assert_eq!(stored["quarantined"], json!({"total": 0, "first": []}));
}

#[test]
fn goals_and_errors_holding_terminal_controls_are_shown_escaped_in_every_view() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    s.open("controls");
    let goal = "wipe\x1b[2J\rgoal";
    let error = "bad\x1b[2J\rerror";
    let (status, reply) = s.call(
        "POST",
        "/v1/sessions/controls/delegate",
        Some(json!({"tasks": [
            {"goal": goal, "runner": {"kind": "external", "queue": "doomed"}},
            {"goal": goal, "runner": {"kind": "external"}},
        ]})),
    );
    assert_eq!(status, 202, "{reply}");
    let call_id = reply["call_id"].as_str().unwrap().to_string();
    // A worker takes the first child and fails it with the error.
    let (status, work) = s.call(
        "POST",
        "/v1/workers/poll",
        Some(json!({"worker": "w", "queue": "doomed", "wait_ms": 20_000})),
    );
    assert_eq!(status, 200, "{work}");
    let (status, done) = s.call(
        "POST",
        &format!("/v1/children/{}/complete", work["child_id"].as_str().unwrap()),
        Some(json!({"token": work["token"], "status": "failed", "summary": null, "error": error})),
    );
    assert_eq!(status, 200, "{done}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let failed = loop {
        let found = json_of(&inspect(&["--server", &s.base, "--tree", "--json"], None));
        let child = call(&found, "controls", &call_id)["children"][0].clone();
        if child["status"] == "failed" {
            break child;
        }
        assert!(Instant::now() < deadline, "the child never failed: {child}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(failed["error"], error, "{failed}");
    assert_eq!(failed["goal"], goal, "JSON keeps the text as it is");

    let escaped_goal = r"wipe\u{1b}[2J\rgoal";
    let views: [&[&str]; 2] = [&[], &["--tree"]];
    for view in views {
        let table = text_of(&inspect(&[&["--server", &s.base][..], view].concat(), None));
        assert!(
            !table.contains(['\x1b', '\r', '\x07']),
            "{view:?} holds raw controls: {table:?}"
        );
        assert!(table.contains(escaped_goal), "{view:?}:\n{table}");
    }
    let tree = text_of(&inspect(&["--server", &s.base, "--tree"], None));
    assert!(tree.contains(r"bad\u{1b}[2J\rerror"), "{tree}");
    // An id given back in an error is escaped too.
    let err = failure(&inspect(&["--server", &s.base, "--session", "x\x1b[2J"], None));
    assert!(!err.contains(['\x1b', '\r']), "{err:?}");
    let err = failure(&inspect(
        &["--server", &s.base, "--tree", "--after", "y\x1b[2J\r"],
        None,
    ));
    assert!(
        !err.contains(['\x1b', '\r']) && err.contains(r"y\u{1b}[2J\r"),
        "{err:?}"
    );

    s.kill9();
    for view in views {
        let args = [&["--data-dir", dir.path().to_str().unwrap()][..], view].concat();
        let table = text_of(&inspect(&args, None));
        assert!(
            !table.contains(['\x1b', '\r']),
            "{view:?} holds raw controls: {table:?}"
        );
        assert!(table.contains(escaped_goal), "{view:?}:\n{table}");
    }
}
