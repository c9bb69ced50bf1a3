//! The cluster figures (with `--ledger` only): `brood serve` processes sharing one database, a
//! thousand sessions spread over them, and consumers that talk to any process at random.
//!
//! One run, these figures:
//! - `cluster_children_per_s`: the workload (every session delegates calls of zero-time sim
//!   children; each consumer thread claims and acks its sessions' results; every request to a
//!   process drawn at random) through three processes. Baseline: the same workload through one
//!   process, on a database of its own, in the same run.
//! - `cluster_forwarded_share`: of the requests the consumers sent during the three-process
//!   workload, the share a process sent on to the holder of their session (its
//!   `brood_requests_forwarded_total{outcome="relayed"}`).
//! - `cluster_hinted_children_per_s` and `cluster_hinted_forwarded_share`: the same workload,
//!   its consumers following the holder each answer names ([`brood_server::HOLDER`], as the
//!   brood clients can): a session's first request goes to a process at random, the next ones
//!   to its holder. Baseline: the same one process.
//! - `cluster_balance_spread`: every session created through one process, then two more
//!   started; once the sessions held no longer change, the largest process's share over the
//!   fair share (sessions / processes), minus 1 (0: even). `cluster_settle_s` is how long the
//!   two took to get their shares; `cluster_moved_again`, how many sessions were handed over
//!   more than once meanwhile (by their tenures' epochs; 0: each moved once at most).
//! - `cluster_takeover_s`: one of the three killed (SIGKILL) after the workload; the seconds
//!   until the two left hold every session between them. Baseline: the tenure.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use brood::Durability;
use serde_json::json;

use super::http::{agent, send_noting, ServerProcess};
use super::{pg, Figure};

/// The session tenure of every process (`--session-lease-ms`).
const TENURE_MS: u64 = 2_000;

/// Consumer threads, each with its own share of the sessions: enough to keep the cores busy
/// (with fewer, one process's figure is bound by the consumers' round trips, not by its work).
const CONSUMERS: usize = 24;

/// The longest a phase (settling, a takeover, a delivery) is waited for.
const GIVE_UP: Duration = Duration::from_secs(120);

/// How big the run is.
#[derive(Debug, Clone, Copy)]
pub(super) struct Size {
    /// Sessions in the database.
    pub sessions: usize,
    /// Calls each session delegates, one after the other.
    pub rounds: usize,
    /// Children per call.
    pub children: usize,
}

pub(super) const QUICK: Size = Size {
    sessions: 1_000,
    rounds: 1,
    children: 5,
};

pub(super) const FULL: Size = Size {
    sessions: 1_000,
    rounds: 4,
    children: 10,
};

/// The `brood serve` processes of one database.
struct Cluster {
    db: String,
    dir: std::path::PathBuf,
    durability: Durability,
    processes: Vec<Option<ServerProcess>>,
    bases: Vec<String>,
}

impl Cluster {
    fn new(dir: &Path, durability: Durability, url: &str) -> anyhow::Result<Self> {
        Ok(Cluster {
            db: pg::fresh_database(url)?,
            dir: dir.to_path_buf(),
            durability,
            processes: Vec::new(),
            bases: Vec::new(),
        })
    }

    /// Starts one more process and waits until it answers.
    fn start(&mut self, http: &ureq::Agent) -> anyhow::Result<()> {
        let node = format!("n{}", self.processes.len());
        let flags = [
            "--ledger",
            self.db.as_str(),
            "--node",
            &node,
            "--session-lease-ms",
            &TENURE_MS.to_string(),
        ]
        .map(str::to_string);
        let (mut p, base) = ServerProcess::start(&self.dir.join(&node), self.durability, &flags)?;
        p.wait_healthy(http, &base)?;
        self.processes.push(Some(p));
        self.bases.push(base);
        Ok(())
    }

    /// The bases of the processes still running.
    fn live(&self) -> Vec<&str> {
        self.bases
            .iter()
            .zip(&self.processes)
            .filter(|(_, p)| p.is_some())
            .map(|(b, _)| b.as_str())
            .collect()
    }

    /// Each session's tenure epoch (one more at every take), as the database says.
    fn epochs(&self) -> anyhow::Result<HashMap<String, i64>> {
        let rows = pg::text_and_number(
            &self.db,
            "SELECT convert_from(session, 'UTF8'), epoch FROM brood.session_leases",
        )
        .context("reading the sessions' tenure epochs")?;
        Ok(rows.into_iter().collect())
    }

    /// How many sessions each running process serves (its `/healthz` `sessions`).
    fn held(&self, http: &ureq::Agent) -> anyhow::Result<Vec<usize>> {
        self.live()
            .into_iter()
            .map(|base| {
                let (status, health) = get(http, &format!("{base}/healthz"))?;
                anyhow::ensure!(status == 200, "{base}/healthz answered {status}: {health}");
                Ok(health["sessions"].as_u64().unwrap_or(0) as usize)
            })
            .collect()
    }

    /// Requests the running processes sent on to a session's holder, in all.
    fn relayed(&self, http: &ureq::Agent) -> anyhow::Result<u64> {
        let mut sum = 0;
        for base in self.live() {
            let mut r = http.get(&format!("{base}/metrics")).call()?;
            let text = r.body_mut().read_to_string()?;
            sum += text
                .lines()
                .filter(|l| l.starts_with("brood_requests_forwarded_total{outcome=\"relayed\"}"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>() as u64;
        }
        Ok(sum)
    }

    /// Waits until the running processes hold all `sessions` between them and the counts stop
    /// changing (the same for three looks a tenure apart); the counts, and when that began.
    fn settle(&self, http: &ureq::Agent, sessions: usize) -> anyhow::Result<(Vec<usize>, Instant)> {
        let deadline = Instant::now() + GIVE_UP;
        let mut last: Option<(Vec<usize>, Instant)> = None;
        let mut same = 0;
        loop {
            let held = self.held(http)?;
            let now = Instant::now();
            match &last {
                Some((before, _)) if *before == held && held.iter().sum::<usize>() >= sessions => same += 1,
                _ => {
                    last = Some((held.clone(), now));
                    same = 0;
                }
            }
            if same >= 3 {
                return Ok(last.expect("set above"));
            }
            anyhow::ensure!(
                now < deadline,
                "the processes did not settle in {GIVE_UP:?}: they hold {held:?} of {sessions} sessions"
            );
            std::thread::sleep(Duration::from_millis(TENURE_MS));
        }
    }

    /// The workload through the running processes, sent where `routing` says: the children
    /// delivered per second, and the share of requests a process sent on to another.
    fn measure(&self, http: &ureq::Agent, size: Size, routing: Routing) -> anyhow::Result<(f64, f64)> {
        let relayed_before = self.relayed(http)?;
        let (per_s, sent) = workload(http, &self.live(), size, routing)?;
        let relayed = self.relayed(http)?.saturating_sub(relayed_before);
        let requests = sent.requests.load(Ordering::Relaxed).max(1);
        if sent.retried.load(Ordering::Relaxed) > 0 {
            super::note(&format!(
                "cluster ({routing:?}): {} of {requests} requests were answered 503 and sent again",
                sent.retried.load(Ordering::Relaxed)
            ));
        }
        Ok((per_s, relayed as f64 / requests as f64))
    }

    /// SIGKILLs process `i`.
    fn kill(&mut self, i: usize) -> anyhow::Result<()> {
        if let Some(mut p) = self.processes[i].take() {
            p.0.kill().context("killing a process")?;
            p.0.wait()?;
        }
        Ok(())
    }
}

/// GET `url`: the status and the JSON answered.
fn get(http: &ureq::Agent, url: &str) -> anyhow::Result<(u16, serde_json::Value)> {
    let mut r = http.get(url).call()?;
    let status = r.status().as_u16();
    let text = r.body_mut().read_to_string()?;
    Ok((status, serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)))
}

/// A consumer's pick of a process: xorshift, seeded per thread.
struct Pick(u64);

impl Pick {
    fn next(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// What a workload sent and got.
#[derive(Default)]
struct Sent {
    requests: AtomicU64,
    /// Answered 503 (a session moving, a holder that died): sent again.
    retried: AtomicU64,
}

/// How consumers choose the process a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Routing {
    /// A process drawn at random for every request.
    Random,
    /// The process the last answer about the session named as its holder
    /// ([`brood_server::HOLDER`]), as a client that follows the hint does; at random until one
    /// named it, and again after a 503 or a process that did not answer.
    Hinted,
}

/// One consumer's way to the processes.
struct Router<'a> {
    bases: &'a [&'a str],
    pick: Pick,
    routing: Routing,
    /// The holder each session's last answer named.
    holders: HashMap<String, String>,
}

impl<'a> Router<'a> {
    fn new(bases: &'a [&'a str], seed: u64, routing: Routing) -> Self {
        Router {
            bases,
            pick: Pick(seed),
            routing,
            holders: HashMap::new(),
        }
    }

    /// Sends `body` to `path`, about `session`, until it is answered other than 503 (a session
    /// moving between processes; a client retries it).
    fn send(
        &mut self,
        http: &ureq::Agent,
        sent: &Sent,
        session: &str,
        method: &str,
        path: &str,
        body: &serde_json::Value,
    ) -> anyhow::Result<(u16, serde_json::Value)> {
        let deadline = Instant::now() + GIVE_UP;
        loop {
            let hinted = self.holders.get(session).cloned();
            let base = hinted
                .clone()
                .unwrap_or_else(|| self.bases[self.pick.next(self.bases.len())].to_string());
            sent.requests.fetch_add(1, Ordering::Relaxed);
            let answer = send_noting(http, method, &format!("{base}{path}"), body, brood_server::HOLDER);
            let (status, reply, holder) = match answer {
                Err(_) if hinted.is_some() => {
                    // The process named did not answer: back to any.
                    self.holders.remove(session);
                    continue;
                }
                a => a?,
            };
            if status != 503 {
                if let (Routing::Hinted, Some(holder)) = (self.routing, holder) {
                    self.holders.insert(session.to_string(), holder);
                }
                return Ok((status, reply));
            }
            self.holders.remove(session);
            sent.retried.fetch_add(1, Ordering::Relaxed);
            anyhow::ensure!(
                Instant::now() < deadline,
                "{method} {path} was answered 503 for {GIVE_UP:?}: {reply}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The session ids.
fn ids(size: Size) -> Vec<String> {
    (0..size.sessions).map(|i| format!("c{i:05}")).collect()
}

/// Opens every session through `bases` (at random), from the consumer threads.
fn open_sessions(http: &ureq::Agent, bases: &[&str], size: Size) -> anyhow::Result<()> {
    let ids = ids(size);
    let sent = Sent::default();
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let threads: Vec<_> = (0..CONSUMERS)
            .map(|t| {
                let (ids, sent) = (&ids, &sent);
                scope.spawn(move || -> anyhow::Result<()> {
                    let mut router = Router::new(bases, 0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1), Routing::Random);
                    for id in ids.iter().skip(t).step_by(CONSUMERS) {
                        let body = json!({"addressable": true, "max_concurrent_children": size.children});
                        let (status, reply) =
                            router.send(http, sent, id, "PUT", &format!("/v1/sessions/{id}"), &body)?;
                        anyhow::ensure!(status == 200, "PUT session {id} answered {status}: {reply}");
                    }
                    Ok(())
                })
            })
            .collect();
        for t in threads {
            t.join().map_err(|_| anyhow::anyhow!("a consumer thread panicked"))??;
        }
        Ok(())
    })
}

/// The workload: each consumer thread, for each round, delegates one call to each of its
/// sessions, then claims and acks until every child of the round was delivered, each request
/// sent where `routing` says. The children delivered per second, and what was sent.
fn workload(http: &ureq::Agent, bases: &[&str], size: Size, routing: Routing) -> anyhow::Result<(f64, Sent)> {
    let ids = ids(size);
    let sent = Sent::default();
    let delivered = AtomicUsize::new(0);
    let tasks: Vec<serde_json::Value> = (0..size.children)
        .map(|i| json!({"goal": format!("t{i}"), "runner": {"kind": "sim"}}))
        .collect();
    let call = json!({"tasks": tasks, "independent_completions": true});
    let boundary = json!({"consumer": "bench", "lease_ms": 300_000});
    let start = Instant::now();
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let threads: Vec<_> = (0..CONSUMERS)
            .map(|t| {
                let (ids, sent, delivered, call, boundary) = (&ids, &sent, &delivered, &call, &boundary);
                scope.spawn(move || -> anyhow::Result<()> {
                    let mut router = Router::new(bases, 0xD1B5_4A32_D192_ED03 ^ (t as u64 + 1), routing);
                    let mine: Vec<&String> = ids.iter().skip(t).step_by(CONSUMERS).collect();
                    for _ in 0..size.rounds {
                        for id in &mine {
                            let (status, reply) =
                                router.send(http, sent, id, "POST", &format!("/v1/sessions/{id}/delegate"), call)?;
                            anyhow::ensure!(status == 202, "delegate to {id} answered {status}: {reply}");
                        }
                        let mut owed: Vec<(&String, usize)> = mine.iter().map(|id| (*id, size.children)).collect();
                        let deadline = Instant::now() + GIVE_UP;
                        while !owed.is_empty() {
                            anyhow::ensure!(Instant::now() < deadline, "results still owed after {GIVE_UP:?}");
                            let mut idle = true;
                            for (id, left) in owed.iter_mut() {
                                let (status, env) = router.send(
                                    http,
                                    sent,
                                    id,
                                    "POST",
                                    &format!("/v1/sessions/{id}/boundary"),
                                    boundary,
                                )?;
                                match status {
                                    200 => {
                                        idle = false;
                                        let claim = env["claim_id"].as_str().context("an envelope has a claim id")?;
                                        let (status, acked) = router.send(
                                            http,
                                            sent,
                                            id,
                                            "POST",
                                            &format!("/v1/claims/{claim}/ack"),
                                            &json!({}),
                                        )?;
                                        anyhow::ensure!(status == 200, "ack of {claim} answered {status}: {acked}");
                                        let n = acked["delivered"].as_u64().unwrap_or(0) as usize;
                                        *left = left.saturating_sub(n);
                                        delivered.fetch_add(n, Ordering::Relaxed);
                                    }
                                    204 => {}
                                    s => bail!("a boundary of {id} answered {s}: {env}"),
                                }
                            }
                            owed.retain(|(_, left)| *left > 0);
                            if idle {
                                std::thread::sleep(Duration::from_millis(2));
                            }
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for t in threads {
            t.join().map_err(|_| anyhow::anyhow!("a consumer thread panicked"))??;
        }
        Ok(())
    })?;
    let took = start.elapsed().as_secs_f64();
    Ok((delivered.load(Ordering::Relaxed) as f64 / took, sent))
}

/// The cluster figures: one process's workload (the baseline), then three processes' settle,
/// workload and takeover.
pub(super) fn cluster(dir: &Path, durability: Durability, url: &str, size: Size) -> anyhow::Result<Vec<Figure>> {
    let http = agent(Duration::from_secs(120));
    // One process.
    let one = {
        let mut single = Cluster::new(&dir.join("one"), durability, url)?;
        single.start(&http)?;
        let bases = single.live();
        open_sessions(&http, &bases, size)?;
        let (per_s, _) = workload(&http, &bases, size, Routing::Random)?;
        per_s
    };
    // Three: every session opened through the first, then two more join.
    let mut three = Cluster::new(&dir.join("three"), durability, url)?;
    three.start(&http)?;
    open_sessions(&http, &three.live(), size)?;
    let before = three.epochs()?;
    let joined = Instant::now();
    three.start(&http)?;
    three.start(&http)?;
    let (held, settled) = three.settle(&http, size.sessions)?;
    let after = three.epochs()?;
    let moved_again = after
        .iter()
        .filter(|(s, e)| **e > before.get(*s).copied().unwrap_or(0) + 1)
        .count();
    let settle_s = settled.saturating_duration_since(joined).as_secs_f64();
    let fair = size.sessions as f64 / held.len() as f64;
    let spread = held.iter().copied().max().unwrap_or(0) as f64 / fair - 1.0;
    let (per_s, forwarded) = three.measure(&http, size, Routing::Random)?;
    let (hinted_per_s, hinted_forwarded) = three.measure(&http, size, Routing::Hinted)?;
    // A takeover: the process holding the most killed.
    let held = three.held(&http)?;
    let victim = held.iter().enumerate().max_by_key(|(_, n)| **n).map_or(0, |(i, _)| i);
    three.kill(victim)?;
    let killed = Instant::now();
    let took = loop {
        let held = three.held(&http)?;
        if held.iter().sum::<usize>() >= size.sessions {
            break killed.elapsed();
        }
        anyhow::ensure!(
            killed.elapsed() < GIVE_UP,
            "the two processes left hold {held:?} of {} sessions after {GIVE_UP:?}",
            size.sessions
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(vec![
        Figure::new("cluster_children_per_s", per_s, "children/s")
            .against(one)
            .target("ratio ≥ 0.8 (three processes on one machine)"),
        Figure::new("cluster_forwarded_share", forwarded, "share"),
        Figure::new("cluster_hinted_children_per_s", hinted_per_s, "children/s").against(one),
        Figure::new("cluster_hinted_forwarded_share", hinted_forwarded, "share"),
        Figure::new("cluster_balance_spread", spread, "ratio").target("≤ 0.1 + 1/fair share"),
        Figure::new("cluster_settle_s", settle_s, "s").against(TENURE_MS as f64 / 1000.0),
        Figure::new("cluster_moved_again", moved_again as f64, "sessions"),
        Figure::new("cluster_takeover_s", took.as_secs_f64(), "s")
            .against(TENURE_MS as f64 / 1000.0)
            .target("≤ tenure + 1 s (3 s)"),
    ])
}
