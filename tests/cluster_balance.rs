//! Several `brood serve` processes on one PostgreSQL database share its sessions evenly: a
//! process joining takes its share by handover (nothing lost, nothing delivered twice, a client
//! sees a retried 503 at most), a killed process's sessions are spread over the survivors, and a
//! nested session moves with its parent session.

mod server;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server::{psql, Server};

/// The tenure time the tests run with: short, so rounds of handovers come quickly.
const TENURE_MS: &str = "2000";

fn node(dir: &Path, url: &str, name: &str) -> Server {
    Server::node(dir, url, name, TENURE_MS)
}

/// How many sessions a process serves, as its `/healthz` says.
fn served(s: &Server) -> u64 {
    let (status, health) = s.call("GET", "/healthz", None);
    assert_eq!(status, 200, "{health}");
    health["sessions"].as_u64().unwrap()
}

/// Whether `held` is within a tenth plus one of `sessions / nodes`.
fn within_bound(held: u64, sessions: u64, nodes: u64) -> bool {
    let mean = sessions as f64 / nodes as f64;
    (held as f64 - mean).abs() <= mean / 10.0 + 1.0
}

/// Waits (60 s at most) until the processes serve `sessions` sessions between them, each within
/// the bound; their counts.
fn settle(nodes: &[&Server], sessions: u64) -> Vec<u64> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let counts: Vec<u64> = nodes.iter().map(|s| served(s)).collect();
        let even = counts.iter().all(|&c| within_bound(c, sessions, nodes.len() as u64));
        if even && counts.iter().sum::<u64>() == sessions {
            return counts;
        }
        assert!(
            Instant::now() < deadline,
            "never settled: the processes serve {counts:?} of {sessions} sessions"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits (60 s at most) until the processes serve `sessions` sessions in a spread none of them
/// changes any more, as the balancing rule has it: none above ⌈M/N⌉ by more than a tenth of
/// M/N, none above ⌊M/N⌋ while another is below it by more than that tenth. [`settle`]'s
/// bound lets a spread through (3, 2, 1 of six) from which a session still moves.
fn settle_kept(nodes: &[&Server], sessions: u64) -> Vec<u64> {
    let n = nodes.len() as u64;
    let (share, floor, slack) = (sessions.div_ceil(n), sessions / n, sessions / (10 * n));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let counts = settle(nodes, sessions);
        let lowest = counts.iter().copied().min().unwrap_or(0);
        let gives = |&c: &u64| c > share + slack || (c > floor && lowest < floor.saturating_sub(slack));
        if !counts.iter().any(gives) {
            return counts;
        }
        assert!(
            Instant::now() < deadline,
            "the processes never stopped handing sessions over: they serve {counts:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Each session's `column` in the tenure table, of the rows matching `filter`.
fn tenure_column(url: &str, column: &str, filter: &str) -> BTreeMap<String, String> {
    psql(
        url,
        &format!("SELECT convert_from(session, 'UTF8') || '|' || {column} FROM brood.session_leases {filter}"),
    )
    .lines()
    .filter_map(|l| l.split_once('|'))
    .map(|(s, o)| (s.to_string(), o.to_string()))
    .collect()
}

/// Who holds each live tenure, as the database says.
fn holders(url: &str) -> BTreeMap<String, String> {
    tenure_column(url, "owner", "WHERE expires_at > now()")
}

/// Each session's tenure epoch, as the database says: one more at every take.
fn epochs(url: &str) -> BTreeMap<String, u64> {
    tenure_column(url, "epoch", "")
        .into_iter()
        .map(|(s, e)| (s, e.parse().unwrap()))
        .collect()
}

/// A tiny random source for the workload (which process, which session).
fn pick(state: &AtomicU64, n: usize) -> usize {
    let mut x = state.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    (x % n as u64) as usize
}

/// What a client does with a session through any process, retrying what a handover answers.
struct Client<'a> {
    nodes: &'a [&'a Server],
    rng: AtomicU64,
    /// Child ids of every call made.
    expected: Mutex<Vec<String>>,
    /// Child ids of every item acknowledged, in order.
    acked: Mutex<Vec<String>>,
    /// Dedup keys of every item acknowledged.
    keys: Mutex<Vec<String>>,
    /// 503s answered (a handover, a takeover), and retried.
    retried: AtomicU64,
    made: AtomicU64,
}

impl<'a> Client<'a> {
    fn new(nodes: &'a [&'a Server], seed: u64) -> Self {
        Client {
            nodes,
            rng: AtomicU64::new(seed),
            expected: Mutex::new(Vec::new()),
            acked: Mutex::new(Vec::new()),
            keys: Mutex::new(Vec::new()),
            retried: AtomicU64::new(0),
            made: AtomicU64::new(0),
        }
    }

    fn any(&self) -> &Server {
        self.nodes[pick(&self.rng, self.nodes.len())]
    }

    /// A 503 (the session between holders, or served by a process that just died): retried.
    fn retry(&self, status: u16, body: &Value) -> bool {
        if status == 503 {
            let code = body["error"]["code"].as_str().unwrap_or("");
            assert!(
                ["session_moved", "lease_lapsed", "interrupted"].contains(&code),
                "a 503 a client is not told to retry: {body}"
            );
            self.retried.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(30));
            return true;
        }
        false
    }

    /// Delegates `n` zero-time sims to `session` through any process, with an idempotency key
    /// so a retry never makes the call twice.
    fn delegate(&self, session: &str, n: usize) {
        let key = format!("k{}", self.made.fetch_add(1, Ordering::Relaxed));
        let key = format!("{session}-{key}-{}", pick(&self.rng, 1 << 30));
        let tasks: Vec<Value> = (0..n)
            .map(|i| json!({"goal": format!("t{i}"), "runner": server::sim(0)}))
            .collect();
        let body = json!({"tasks": tasks, "independent_completions": true});
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (status, reply) = self.any().post_with_header(
                &format!("/v1/sessions/{session}/delegate"),
                &body,
                ("idempotency-key", &key),
            );
            if status == 202 || status == 200 {
                let call = reply["call_id"].as_str().unwrap().to_string();
                self.expected
                    .lock()
                    .unwrap()
                    .extend((0..n).map(|t| format!("{call}.{t}")));
                return;
            }
            assert!(self.retry(status, &reply), "delegate answered {status}: {reply}");
            assert!(Instant::now() < deadline, "a delegate never went through: {reply}");
        }
    }

    /// One boundary of `session` through any process and, when it hands items out, their ack
    /// through any process; whether items were acknowledged.
    fn claim_and_ack(&self, session: &str) -> bool {
        let (status, env) = self.any().call(
            "POST",
            &format!("/v1/sessions/{session}/boundary"),
            Some(json!({"consumer": "balance", "lease_ms": 30000})),
        );
        match status {
            200 => {}
            204 => return false,
            _ => {
                assert!(self.retry(status, &env), "boundary answered {status}: {env}");
                return false;
            }
        }
        let claim = env["claim_id"].as_str().unwrap();
        let (acked, body) = self.any().call("POST", &format!("/v1/claims/{claim}/ack"), None);
        match acked {
            200 => {
                let items = env["items"].as_array().unwrap();
                let children = items.iter().map(|i| i["child_id"].as_str().unwrap().to_string());
                self.acked.lock().unwrap().extend(children);
                let keys = items.iter().map(|i| i["dedup_key"].as_str().unwrap().to_string());
                self.keys.lock().unwrap().extend(keys);
                true
            }
            // The claim was returned by a handover (its taker knows it as lost, or not at
            // all): its items come again.
            409 | 404 => false,
            _ => {
                assert!(self.retry(acked, &body), "ack answered {acked}: {body}");
                false
            }
        }
    }

    /// Claims and acks every session until everything made was acknowledged (60 s at most).
    fn drain(&self, sessions: &[String]) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let want = self.expected.lock().unwrap().len();
            if self.acked.lock().unwrap().len() >= want {
                return;
            }
            for s in sessions {
                while self.claim_and_ack(s) {}
            }
            assert!(
                Instant::now() < deadline,
                "not everything was delivered: {} of {want}",
                self.acked.lock().unwrap().len()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every result made was acknowledged exactly once.
    fn assert_exactly_once(&self) {
        let mut acked = self.acked.lock().unwrap().clone();
        let total = acked.len();
        acked.sort();
        acked.dedup();
        assert_eq!(acked.len(), total, "an item was acknowledged twice");
        let mut keys = self.keys.lock().unwrap().clone();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), total, "a dedup key was acknowledged twice");
        let mut expected = self.expected.lock().unwrap().clone();
        expected.sort();
        assert_eq!(acked, expected, "every result was delivered, once");
    }
}

fn sessions(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("s{i:02}")).collect()
}

/// Three processes on the database at `url`, serving `n` sessions between them evenly: all
/// opened through the first, then two more started and settled.
fn three_settled(dir: &Path, url: &str, n: usize) -> (Server, Server, Server, Vec<String>) {
    let a = node(dir, url, "a");
    let names = sessions(n);
    for s in &names {
        a.open(s);
    }
    let b = node(dir, url, "b");
    let c = node(dir, url, "c");
    settle(&[&a, &b, &c], n as u64);
    (a, b, c, names)
}

#[test]
fn processes_joining_take_their_share_by_handover_while_a_workload_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let a = node(dir.path(), &url, "a");
    let names = sessions(60);
    let alone = [&a];
    let first = Client::new(&alone, 1);
    for s in &names {
        a.open(s);
        first.delegate(s, 1);
    }
    assert_eq!(served(&a), 60);
    let b = node(dir.path(), &url, "b");
    let c = node(dir.path(), &url, "c");
    let all = [&a, &b, &c];
    let client = Client::new(&all, 7);
    // The first calls' results wait; a workload runs through random processes while the
    // sessions are handed over.
    client
        .expected
        .lock()
        .unwrap()
        .extend(first.expected.into_inner().unwrap());
    let done = AtomicBool::new(false);
    let counts = std::thread::scope(|scope| {
        for _ in 0..3 {
            scope.spawn(|| {
                while !done.load(Ordering::Relaxed) {
                    let s = &names[pick(&client.rng, names.len())];
                    client.delegate(s, 2);
                    client.claim_and_ack(s);
                }
            });
        }
        let counts = settle(&all, 60);
        done.store(true, Ordering::Relaxed);
        counts
    });
    eprintln!(
        "balanced: {counts:?}; {} calls made, {} retried 503s",
        client.made.load(Ordering::Relaxed),
        client.retried.load(Ordering::Relaxed)
    );
    client.drain(&names);
    client.assert_exactly_once();
    // The database agrees: every session held, by the three about evenly.
    let held = holders(&url);
    assert_eq!(held.len(), 60, "{held:?}");
    for n in ["a", "b", "c"] {
        let mine = held.values().filter(|o| *o == n).count() as u64;
        assert!(within_bound(mine, 60, 3), "{n} holds {mine}: {held:?}");
    }
}

#[test]
fn scaling_out_from_two_processes_to_four_moves_each_session_at_most_once() {
    const N: u64 = 160;
    // Rounds of handovers a third of it apart, and the two joining started together: they take
    // their places within one round of each other however slowly a loaded machine starts them
    // (one joining a round before the other would take a three-process share, and rightly
    // hand some on).
    const TENURE: &str = "6000";
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let a = Server::node(dir.path(), &url, "a", TENURE);
    let names = sessions(N as usize);
    for s in &names {
        a.open(s);
    }
    let b = Server::node(dir.path(), &url, "b", TENURE);
    settle_kept(&[&a, &b], N);
    let before = epochs(&url);
    // Two join: each of the first two hands over about half of what it holds, a few per round,
    // and every round's givers and takers sweep together at the handover's notice.
    let (c, d) = std::thread::scope(|scope| {
        let c = scope.spawn(|| Server::node(dir.path(), &url, "c", TENURE));
        let d = Server::node(dir.path(), &url, "d", TENURE);
        (c.join().unwrap(), d)
    });
    let counts = settle_kept(&[&a, &b, &c, &d], N);
    let after = epochs(&url);
    let moves: BTreeMap<&String, u64> = names.iter().map(|s| (s, after[s].saturating_sub(before[s]))).collect();
    let moved = moves.values().filter(|&&m| m > 0).count() as u64;
    let again: Vec<_> = moves.iter().filter(|(_, &m)| m > 1).collect();
    eprintln!("settled at {counts:?}; {moved} sessions moved");
    assert!(
        again.is_empty(),
        "sessions moved more than once (a process took past its share and handed them on): {again:?}"
    );
    assert!(
        moved >= N / 2 - N / 10,
        "the newcomers' shares came by handover: {moved} moved"
    );
}

#[test]
fn a_killed_processs_sessions_are_spread_over_the_survivors() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let (a, b, c, names) = three_settled(dir.path(), &url, 60);
    let dead: HashSet<String> = holders(&url)
        .into_iter()
        .filter(|(_, o)| o == "c")
        .map(|(s, _)| s)
        .collect();
    assert!(!dead.is_empty());
    c.kill9();
    let counts = settle(&[&a, &b], 60);
    // Its sessions went to both survivors, not all to the first to sweep.
    let held = holders(&url);
    let to_a = dead
        .iter()
        .filter(|s| held.get(*s).map(String::as_str) == Some("a"))
        .count();
    let to_b = dead
        .iter()
        .filter(|s| held.get(*s).map(String::as_str) == Some("b"))
        .count();
    assert_eq!(
        to_a + to_b,
        dead.len(),
        "every session of the dead process is held: {held:?}"
    );
    assert!(to_a > 0 && to_b > 0, "{} went to a, {} to b ({counts:?})", to_a, to_b);
    // And every session answers through either.
    for s in &names {
        let (status, view) = a.call("GET", &format!("/v1/sessions/{s}"), None);
        assert_eq!(status, 200, "{view}");
    }
}

#[test]
fn a_nested_session_moves_with_its_parent_session() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let a = node(dir.path(), &url, "a");
    // p's child, delivered; the child's own (nested) session opened, then q: both idle, p picked
    // first (by id) when a hands one over.
    a.open("p");
    let call = a.delegate_sims("p", 1);
    a.only_result("p");
    let nested = format!("{call}.0");
    let (status, body) = a.call("PUT", &format!("/v1/sessions/{nested}"), Some(json!({})));
    assert_eq!(status, 200, "{body}");
    a.open("q");
    let before = holders(&url);
    assert_eq!(before.get(&nested).map(String::as_str), Some("a"), "{before:?}");
    let b = node(dir.path(), &url, "b");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let held = holders(&url);
        let at = |s: &str| held.get(s).cloned().unwrap_or_default();
        if at("p") == "b" && at(&nested) == "b" && at("q") == "a" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the nested session did not follow its parent: {held:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Served where its parent is, through either process, and the answers name b.
    for s in [&a, &b] {
        let (status, view) = s.call("GET", &format!("/v1/sessions/{nested}"), None);
        assert_eq!(status, 200, "{view}");
        assert_eq!(
            named_holder(s, &nested),
            b.base,
            "the nested session, through {}",
            s.base
        );
        assert_eq!(named_holder(s, "p"), b.base, "its parent, through {}", s.base);
    }
    assert_eq!(served(&a), 1, "q alone");
}

#[test]
fn a_busy_session_is_handed_over_only_when_none_is_idle_and_its_claim_comes_back_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let a = node(dir.path(), &url, "a");
    // Two sessions, each with a live claim (busy): when b joins, a must give one, and none is
    // idle, so after a few rounds it gives a busy one.
    let mut claims = BTreeMap::new();
    for s in ["p1", "p2"] {
        a.open(s);
        a.delegate_sims(s, 1);
        let env = a.envelope(s, 600_000);
        assert_eq!(env["items"].as_array().unwrap().len(), 1, "{env}");
        claims.insert(s.to_string(), env);
    }
    let b = node(dir.path(), &url, "b");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let counts = [served(&a), served(&b)];
        if counts == [1, 1] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a never handed a busy session over: {counts:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let held = holders(&url);
    let moved = ["p1", "p2"]
        .into_iter()
        .find(|s| held.get(*s).map(String::as_str) == Some("b"))
        .expect("one session went to b");
    // Its claim was returned by the handover: the ack is refused, through either process.
    let env = &claims[moved];
    let claim = env["claim_id"].as_str().unwrap();
    let (status, body) = a.call("POST", &format!("/v1/claims/{claim}/ack"), None);
    assert!(
        status == 409 || status == 404,
        "the ack of a returned claim answered {status}: {body}"
    );
    // Its items come again, with the same dedup keys, and are acknowledged once.
    let keys = |env: &Value| -> Vec<String> {
        let mut k: Vec<String> = env["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["dedup_key"].as_str().unwrap().to_string())
            .collect();
        k.sort();
        k
    };
    let again = b.envelope(moved, 30_000);
    assert_eq!(keys(&again), keys(env));
    let (status, body) = a.call(
        "POST",
        &format!("/v1/claims/{}/ack", again["claim_id"].as_str().unwrap()),
        None,
    );
    assert_eq!(status, 200, "{body}");
    let (status, _) = b.call(
        "POST",
        &format!("/v1/sessions/{moved}/boundary"),
        Some(json!({"consumer": "t", "lease_ms": 1000})),
    );
    assert_eq!(status, 204, "nothing acknowledged comes again");
    // The session that stayed kept its claim.
    let stayed = if moved == "p1" { "p2" } else { "p1" };
    let claim = claims[stayed]["claim_id"].as_str().unwrap();
    let (status, body) = b.call("POST", &format!("/v1/claims/{claim}/ack"), None);
    assert_eq!(status, 200, "{body}");
}

/// `GET /v1/sessions/{id}` through `via` (a 503, a session moving, retried): the holder the
/// answer names.
fn named_holder(via: &Server, id: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let reply = via.send("GET", &format!("/v1/sessions/{id}"), None, None);
        if reply.status == 503 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(25));
            continue;
        }
        assert_eq!(reply.status, 200, "{}", reply.text);
        return reply
            .holder
            .unwrap_or_else(|| panic!("the answer about {id} through {} names no holder", via.base));
    }
}

#[test]
fn every_answer_names_the_holder_and_a_process_learns_where_a_session_went() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let a = node(dir.path(), &url, "a");
    let names = sessions(6);
    for s in &names {
        a.open(s);
    }
    // Two processes join, one after the other. b reads every session as soon as it is up,
    // before it has taken its share: the answers name a, the holder b sent them on to.
    let b = node(dir.path(), &url, "b");
    let seen: Vec<String> = names.iter().map(|s| named_holder(&b, s)).collect();
    for (s, holder) in names.iter().zip(&seen) {
        assert!([&a.base, &b.base].contains(&holder), "{s}: {holder}");
    }
    let c = node(dir.path(), &url, "c");
    // The sessions are spread: some that b sent on to a are served by c now. b's first read of
    // each finds where it went (a sends it on, once more, and c's answer names c); b's next
    // read goes straight to c, so a sends nothing on. (Waited for until nothing moves any more:
    // the reads below compare what each process names.)
    settle_kept(&[&a, &b, &c], 6);
    let first: Vec<String> = names.iter().map(|s| named_holder(&b, s)).collect();
    assert!(
        seen.iter()
            .zip(&first)
            .any(|(then, now)| *then == a.base && *now == c.base),
        "no session went from a to c: then {seen:?}, now {first:?}"
    );
    let relayed = r#"brood_requests_forwarded_total{outcome="relayed"}"#;
    let count = |s: &Server| server::sample(&server::scrape(s), relayed).unwrap_or(0.0);
    let (a0, b0) = (count(&a), count(&b));
    let second: Vec<String> = names.iter().map(|s| named_holder(&b, s)).collect();
    assert_eq!(first, second, "the sessions stayed where they were");
    assert_eq!(count(&a), a0, "a sent nothing on: b sent each request to its holder");
    let elsewhere = second.iter().filter(|h| **h != b.base).count() as f64;
    assert_eq!(
        count(&b),
        b0 + elsewhere,
        "b sent on each request for a session it does not serve"
    );
    for (s, holder) in names.iter().zip(&second) {
        assert_eq!(&named_holder(&a, s), holder, "{s}: a names the same holder");
    }
    // A claim's answers name its session's holder too.
    let call = b.delegate_sims(&names[0], 2);
    let holder = &second[0];
    let deadline = Instant::now() + Duration::from_secs(30);
    let envelope = loop {
        let reply = b.send(
            "POST",
            &format!("/v1/sessions/{}/boundary", names[0]),
            Some(json!({"consumer": "c", "lease_ms": 30000}).to_string().into_bytes()),
            None,
        );
        if reply.status == 200 {
            assert_eq!(reply.holder.as_ref(), Some(holder), "the boundary names the holder");
            break serde_json::from_str::<Value>(&reply.text).unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "no result of {call}: {} {}",
            reply.status,
            reply.text
        );
        std::thread::sleep(Duration::from_millis(25));
    };
    let claim = envelope["claim_id"].as_str().unwrap();
    let acked = c.send("POST", &format!("/v1/claims/{claim}/ack"), None, None);
    assert_eq!(acked.status, 200, "{}", acked.text);
    assert_eq!(acked.holder.as_ref(), Some(holder), "the ack names the holder");
    // An answer about no session served anywhere names nobody.
    let unknown = b.send("GET", "/v1/sessions/nowhere", None, None);
    assert_eq!(unknown.status, 404, "{}", unknown.text);
    assert_eq!(unknown.holder, None);
}

#[test]
fn a_process_restarted_at_its_address_sends_nothing_to_itself() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    // Tenures far longer than the test: the session stays held by the process that was killed.
    let a = Server::node(dir.path(), &url, "a", "600000");
    a.open("s1");
    let port = a.port();
    a.kill9();
    let again = Server::node_on(dir.path(), &url, "a", "600000", port);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .build()
        .into();
    // Neither a request nor an event stream is sent back here (a client following a redirect
    // to the same address would go round for as long as the tenure lasts): each is answered
    // 503 `session_moved`, to retry, until this process takes the session up.
    for path in [
        "/v1/sessions/s1/events",
        "/v1/sessions/s1",
        "/v1/sessions/s1/events",
        "/v1/sessions/s1",
    ] {
        let r = agent.get(&format!("{}{path}", again.base)).call().unwrap();
        assert_eq!(r.status().as_u16(), 503, "{path}: {:?}", r.headers().get("location"));
        let body = r.into_body().read_to_string().unwrap();
        assert!(
            body.contains("session_moved") && body.contains("earlier run"),
            "{path}: {body}"
        );
    }
    let metrics = server::scrape(&again);
    for outcome in ["relayed", "redirected", "bounced"] {
        let series = format!("brood_requests_forwarded_total{{outcome=\"{outcome}\"}}");
        assert_eq!(server::sample(&metrics, &series), Some(0.0), "{series}");
    }
}

#[test]
fn an_event_stream_is_not_sent_on_to_a_dead_holder_once_its_sessions_were_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let (a, b, c, names) = three_settled(dir.path(), &url, 12);
    // b and c find out who serves each session; then a dies, and they take its sessions over.
    let seen: Vec<String> = names.iter().map(|s| named_holder(&b, s)).collect();
    for s in &names {
        named_holder(&c, s);
    }
    let dead = a.base.clone();
    assert!(seen.contains(&dead), "a serves none of {names:?}: {seen:?}");
    a.kill9();
    settle(&[&b, &c], 12);
    let of_a: Vec<&String> = names
        .iter()
        .zip(&seen)
        .filter(|(_, h)| **h == dead)
        .map(|(s, _)| s)
        .collect();
    // An event stream asked of either survivor goes where the session is served now (there, or
    // redirected to the other): neither keeps redirecting it to the dead process (a client
    // reconnecting would never get through).
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into();
    for (s, via) in of_a.iter().flat_map(|s| [(s, &b), (s, &c)]) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let reply = agent
                .get(&format!("{}/v1/sessions/{s}/events", via.base))
                .call()
                .unwrap();
            let status = reply.status().as_u16();
            let location = reply
                .headers()
                .get("location")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            drop(reply);
            let survivor = |x: &Server| location.as_deref() == Some(&format!("{}/v1/sessions/{s}/events", x.base));
            if status == 200 || (status == 307 && (survivor(&b) || survivor(&c))) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{s} through {}: the stream is sent to {location:?} ({status}), a dead process",
                via.base
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn a_delegate_retried_with_its_idempotency_key_through_any_process_makes_one_call() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let a = node(dir.path(), &url, "a");
    let names = sessions(6);
    for s in &names {
        a.open(s);
    }
    let b = node(dir.path(), &url, "b");
    let delegate = |via: &Server, s: &str| -> String {
        let body = json!({"tasks": [{"goal": "g", "runner": {"kind": "sim", "ms": 0}}]});
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let key = ("Idempotency-Key", &*format!("key-{s}"));
            let (status, reply) = via.post_with_header(&format!("/v1/sessions/{s}/delegate"), &body, key);
            if status == 503 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(25));
                continue;
            }
            assert_eq!(status, 202, "{s} through {}: {reply}", via.base);
            return reply["call_id"].as_str().unwrap().to_string();
        }
    };
    // b finds out where each session is served, then sends each delegate straight there.
    for s in &names {
        named_holder(&b, s);
    }
    let calls: Vec<String> = names.iter().map(|s| delegate(&b, s)).collect();
    for (s, call) in names.iter().zip(&calls) {
        assert_eq!(&delegate(&a, s), call, "{s}: a retry through a made another call");
    }
    // A third process joins and takes its share by handover: retries through any process,
    // b's remembered holders stale for some, still find the one call.
    let c = node(dir.path(), &url, "c");
    settle(&[&a, &b, &c], 6);
    for via in [&b, &c, &a, &b] {
        for (s, call) in names.iter().zip(&calls) {
            assert_eq!(
                &delegate(via, s),
                call,
                "{s}: a retry through {} made another call",
                via.base
            );
        }
    }
}

#[test]
fn a_process_that_stops_leaves_no_remembered_holder_behind() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let (a, b, c, names) = three_settled(dir.path(), &url, 6);
    // b finds out where each session is served; then c stops, handing its sessions on.
    let seen: Vec<String> = names.iter().map(|s| named_holder(&b, s)).collect();
    let gone = c.base.clone();
    assert!(seen.contains(&gone), "c serves none of {names:?}: {seen:?}");
    assert!(c.terminate().success());
    settle(&[&a, &b], 6);
    // Every session answers through either survivor again (after a 503 at most, retried),
    // naming a survivor (the two may still hand a session on meanwhile, so either).
    for s in &names {
        for via in [&b, &a, &b] {
            let holder = named_holder(via, s);
            assert!(
                [&a.base, &b.base].contains(&&holder),
                "{s} through {}: {holder}",
                via.base
            );
        }
    }
}
