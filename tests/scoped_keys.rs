//! Keys scoped to a prefix of session ids (`scoped_keys`): one tenant's key can neither see nor
//! act on another's sessions, calls, children, claims or dead letters, whether it asks the
//! process serving them or another process sharing the ledger, which forwards the request.

mod server;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server::{assert_error, until_envelope, Server};

const ADMIN: &str = "admin-key";
const ACME: &str = "acme-key";
const BETA: &str = "beta-key";

fn scoped(dir: &Path, extra: &[&str]) -> Server {
    let mut flags = vec![
        "--scoped-keys",
        "acme-=acme-key,beta-=beta-key",
        "--max-delivery-attempts",
        "1",
    ];
    flags.extend_from_slice(extra);
    Server::start_with(dir, Some(ADMIN), &flags)
}

fn as_key(s: &Server, key: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    s.raw(method, path, body.map(|b| b.to_string().into_bytes()), Some(key))
}

/// Session `acme-1` (opened by acme's key) with one call of two zero-time children: one result
/// dead-lettered (released `failed` once), the other held by a claim. Returns the call id and
/// that claim's id.
fn acme_session(s: &Server) -> (String, String) {
    let (status, body) = as_key(
        s,
        ACME,
        "PUT",
        "/v1/sessions/acme-1",
        Some(json!({"addressable": true})),
    );
    assert_eq!(status, 200, "{body}");
    let tasks = json!([{"goal": "a", "runner": {"kind": "sim", "ms": 0}}]);
    let (status, reply) = as_key(
        s,
        ACME,
        "POST",
        "/v1/sessions/acme-1/delegate",
        Some(json!({"tasks": tasks, "independent_completions": true})),
    );
    assert_eq!(status, 202, "{reply}");
    let first = until_envelope("acme-1", 60_000, |m, p, b| as_key(s, ACME, m, p, b));
    let claim = first["claim_id"].as_str().unwrap();
    let (status, body) = as_key(
        s,
        ACME,
        "POST",
        &format!("/v1/claims/{claim}/release"),
        Some(json!({"reason": "failed"})),
    );
    assert_eq!(status, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while as_key(s, ACME, "GET", "/v1/dead-letters", None).1["items"]
        .as_array()
        .map(Vec::len)
        != Some(1)
    {
        assert!(Instant::now() < deadline, "the released item was never dead-lettered");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, reply) = as_key(
        s,
        ACME,
        "POST",
        "/v1/sessions/acme-1/delegate",
        Some(json!({"tasks": tasks, "independent_completions": true})),
    );
    assert_eq!(status, 202, "{reply}");
    let call = reply["call_id"].as_str().unwrap().to_string();
    let held = until_envelope("acme-1", 60_000, |m, p, b| as_key(s, ACME, m, p, b));
    (call, held["claim_id"].as_str().unwrap().to_string())
}

/// Everything beta's key tries on acme's session, each refused, through `s`.
fn beta_reaches_nothing_of_acme(s: &Server, call: &str, claim: &str) {
    let out = |reply| assert_error(reply, 403, "out_of_scope");
    out(as_key(s, BETA, "GET", "/v1/sessions/acme-1", None));
    out(as_key(s, BETA, "PUT", "/v1/sessions/acme-2", Some(json!({}))));
    out(as_key(
        s,
        BETA,
        "POST",
        "/v1/sessions/acme-1/turn",
        Some(json!({"turn": "idle"})),
    ));
    out(as_key(
        s,
        BETA,
        "POST",
        "/v1/sessions/acme-1/delegate",
        Some(json!({"tasks": [{"goal": "x", "runner": {"kind": "sim", "ms": 0}}]})),
    ));
    out(as_key(
        s,
        BETA,
        "POST",
        "/v1/sessions/acme-1/boundary",
        Some(json!({"consumer": "beta", "lease_ms": 1000})),
    ));
    out(as_key(s, BETA, "GET", "/v1/sessions/acme-1/events", None));
    out(as_key(s, BETA, "GET", "/v1/dead-letters?session_id=acme-1", None));
    out(as_key(
        s,
        BETA,
        "POST",
        "/v1/dead-letters/redrive",
        Some(json!({"session_id": "acme-1"})),
    ));
    // Its calls, children and claims are unknown to beta's key.
    assert_eq!(as_key(s, BETA, "GET", &format!("/v1/calls/{call}"), None).0, 404);
    for target in [
        format!("calls/{call}"),
        format!("units/{call}-1"),
        format!("children/{call}.0"),
    ] {
        let reply = as_key(s, BETA, "POST", &format!("/v1/{target}/cancel"), Some(json!({})));
        assert_eq!(reply.0, 404, "{target}: {}", reply.1);
    }
    assert_eq!(as_key(s, BETA, "POST", &format!("/v1/claims/{claim}/ack"), None).0, 404);
    let release = as_key(
        s,
        BETA,
        "POST",
        &format!("/v1/claims/{claim}/release"),
        Some(json!({"reason": "busy"})),
    );
    assert_eq!(release.0, 404, "{}", release.1);
    // Listings show beta's own only.
    let (status, list) = as_key(s, BETA, "GET", "/v1/sessions", None);
    assert_eq!(status, 200);
    assert!(
        list["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|x| x["session_id"].as_str().unwrap().starts_with("beta-")),
        "{list}"
    );
    let (_, dead) = as_key(s, BETA, "GET", "/v1/dead-letters", None);
    assert_eq!(dead["items"], json!([]), "{dead}");
    // Redriving everything, or acme's child by id, redrives nothing of acme's.
    for select in [json!({"all": true}), json!({"child_ids": [format!("{call}.0")]})] {
        let (status, r) = as_key(s, BETA, "POST", "/v1/dead-letters/redrive", Some(select));
        assert_eq!((status, r["redriven"].as_u64()), (200, Some(0)), "{r}");
    }
    // Outside workers are handed children of every session: not with a scoped key.
    out(as_key(
        s,
        BETA,
        "POST",
        "/v1/workers/poll",
        Some(json!({"worker": "w", "wait_ms": 0})),
    ));
}

/// What acme's session looks like to acme's key afterwards: untouched.
fn acme_is_untouched(s: &Server, call: &str, claim: &str) {
    let (status, st) = as_key(s, ACME, "GET", "/v1/sessions/acme-1", None);
    assert_eq!(status, 200, "{st}");
    assert_eq!(st["claims"][0]["claim_id"], claim, "{st}");
    let (status, c) = as_key(s, ACME, "GET", &format!("/v1/calls/{call}"), None);
    assert_eq!(status, 200, "{c}");
    assert!(
        c["children"]
            .as_array()
            .unwrap()
            .iter()
            .all(|ch| ch["status"] == "succeeded"),
        "{c}"
    );
    let (_, dead) = as_key(s, ACME, "GET", "/v1/dead-letters", None);
    assert_eq!(dead["items"].as_array().map(Vec::len), Some(1), "{dead}");
    let (status, acked) = as_key(s, ACME, "POST", &format!("/v1/claims/{claim}/ack"), None);
    assert_eq!(status, 200, "{acked}");
}

#[test]
fn a_scoped_key_cannot_read_claim_cancel_or_redrive_another_tenants_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let s = scoped(dir.path(), &[]);
    let (status, body) = as_key(&s, BETA, "PUT", "/v1/sessions/beta-1", Some(json!({})));
    assert_eq!(status, 200, "{body}");
    let (call, claim) = acme_session(&s);
    beta_reaches_nothing_of_acme(&s, &call, &claim);
    acme_is_untouched(&s, &call, &claim);
    // The admin key sees both tenants.
    let (_, list) = s.call("GET", "/v1/sessions", None);
    let ids: Vec<&str> = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["acme-1", "beta-1"], "{list}");
    // A session nested in acme's (its id is the id of a child of acme's) is acme's too.
    let task = json!({"goal": "n", "runner": {"kind": "external"}});
    let (status, reply) = as_key(
        &s,
        ACME,
        "POST",
        "/v1/sessions/acme-1/delegate",
        Some(json!({"tasks": [task], "independent_completions": true})),
    );
    assert_eq!(status, 202, "{reply}");
    let nested = format!("/v1/sessions/{}.0", reply["call_id"].as_str().unwrap());
    let (status, body) = as_key(&s, ACME, "PUT", &nested, Some(json!({})));
    assert_eq!(status, 200, "{body}");
    let (status, body) = as_key(&s, ACME, "GET", &nested, None);
    assert_eq!(status, 200, "{body}");
    assert_error(as_key(&s, BETA, "GET", &nested, None), 403, "out_of_scope");
    // A key that is no key of the server's is still refused.
    assert_error(as_key(&s, "acme-", "GET", "/v1/sessions", None), 401, "unauthorized");
}

/// Two processes with the scoped keys sharing a fresh database, in folders of `dir`.
fn two_scoped_nodes(dir: &Path) -> (Server, Server) {
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let node = |name: &str| {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        scoped(&d, &["--ledger", &url, "--node", name, "--session-lease-ms", "2000"])
    };
    (node("a"), node("b"))
}

#[test]
fn a_scoped_key_is_judged_the_same_through_a_process_that_forwards() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_scoped_nodes(dir.path());
    // acme's session is served by a; beta's key tries it through b.
    let (call, claim) = acme_session(&a);
    beta_reaches_nothing_of_acme(&b, &call, &claim);
    // acme's own key through b is forwarded to a, and reaches it.
    acme_is_untouched(&b, &call, &claim);
}

#[test]
fn a_scoped_key_needs_an_admin_key_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_brood"))
        .args(["serve", "--data-dir"])
        .arg(dir.path())
        .args(["--listen", "127.0.0.1:0", "--scoped-keys", "acme-=acme-key"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("scoped_keys") && !err.contains("acme-key"), "{err}");
}

#[test]
fn where_a_session_is_served_is_told_only_to_a_key_that_reaches_it() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_scoped_nodes(dir.path());
    let (call, claim) = acme_session(&a);
    // acme's key is told which process serves its session, through either process; b has
    // found out meanwhile, so its next request for it goes straight there.
    let holder = a.send("GET", "/v1/sessions/acme-1", None, Some(ACME)).holder;
    assert!(holder.is_some(), "acme's answer names no holder");
    for s in [&a, &b] {
        let reply = s.send("GET", "/v1/sessions/acme-1", None, Some(ACME));
        assert_eq!((reply.status, &reply.holder), (200, &holder), "{}", reply.text);
    }
    // A holder a client names on its request is no holder to anyone: the answer names the
    // process that serves the session, and b's next request still goes there.
    for _ in 0..2 {
        let reply = b
            .agent
            .get(&format!("{}/v1/sessions/acme-1", b.base))
            .header("Authorization", format!("Bearer {ACME}"))
            .header("X-Brood-Holder", "http://127.0.0.1:9")
            .call()
            .unwrap();
        assert_eq!(reply.status(), 200);
        let named = reply.headers().get("x-brood-holder").and_then(|v| v.to_str().ok());
        assert_eq!(named, holder.as_deref());
    }
    // A request without a key, or with a wrong one, is refused before anything is sent on, and
    // the refusal names nobody.
    for s in [&a, &b] {
        for key in [None, Some("acme-")] {
            let reply = s.send("GET", "/v1/sessions/acme-1/events", None, key);
            assert_eq!((reply.status, reply.holder), (401, None), "{}", reply.text);
        }
    }
    // beta's key is refused everything of acme's at either process, b's early way included, as
    // it was before b knew where acme-1 is served; and no refusal says where it is served (which
    // would tell beta's key that it exists).
    let ack = format!("/v1/claims/{claim}/ack");
    for s in [&a, &b] {
        for (method, path, want) in [
            ("GET", "/v1/sessions/acme-1", 403),
            ("GET", "/v1/sessions/acme-1/events", 403),
            ("POST", "/v1/sessions/acme-1/turn", 403),
            ("POST", ack.as_str(), 404),
        ] {
            let body = (method == "POST").then(|| json!({"turn": "idle"}).to_string().into_bytes());
            let reply = s.send(method, path, body, Some(BETA));
            assert_eq!(reply.status, want, "{method} {path} through {}: {}", s.base, reply.text);
            assert_eq!(
                reply.holder, None,
                "{method} {path} through {} names the holder",
                s.base
            );
        }
    }
    beta_reaches_nothing_of_acme(&b, &call, &claim);
    beta_reaches_nothing_of_acme(&a, &call, &claim);
    acme_is_untouched(&b, &call, &claim);
}
