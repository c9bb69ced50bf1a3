//! A randomized model of several `brood serve` processes sharing one PostgreSQL database,
//! driven over HTTP and checked against a plain model of what the clients were told.
//!
//! A case starts two or three processes on a fresh database of a PostgreSQL server of its own,
//! opens a few sessions, and runs a list of operations drawn from a seed: background calls of
//! sim and external-worker children made through any process, boundaries and acks through any
//! process (claims held across other steps, competing with each other), external workers
//! polling and completing through any process, and faults: a holder paused past its lease
//! (`SIGSTOP`, requests sent meanwhile through the others, then `SIGCONT`: it must stop
//! writing), a process killed (`SIGKILL`) and restarted, sometimes with its takes or its
//! commits stalled or failing (fault points), and the database crashed and started again.
//!
//! After every step, once no process is paused: every process shows every session with the
//! same calls, exactly the calls that were accepted (202), and exactly the children whose
//! results were acknowledged as delivered (one holder at a time: a stale one would show an
//! older view); an envelope never holds an item that was acknowledged (200 to an ack), and two
//! acks never both take one item. At the end, with the faults over, everything drains within a
//! deadline: every child of every accepted call is acknowledged exactly once, nothing is left
//! ready, claimed, queued or running, nothing is a dead letter.
//!
//! `BROOD_SHARED_MODEL_CASES` (default 2) cases of `BROOD_SHARED_MODEL_STEPS` (default 12)
//! operations with at most `BROOD_SHARED_MODEL_FAULTS` (default 3) faults run, from seed
//! `BROOD_SHARED_MODEL_SEED` (default 1) on (`BROOD_SHARED_MODEL_LOG` prints what every step
//! answered); a failure prints its seed, its operations and what each answered, to be kept as
//! a named test below. Each process's session lease is 1 s, so a case takes seconds.

mod server;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use brood_actors::ledger::pg_testkit::{execute, fresh_schema, Cluster};
use serde_json::{json, Value};
use server::Server;

/// The session lease of every process: the shortest the server takes, so takeovers are quick.
const LEASE_MS: u64 = 1000;
/// How long the checks after a step wait for the processes to answer (a takeover, a database
/// that came back).
const SETTLE: Duration = Duration::from_secs(30);
/// How long everything may take to drain once the faults stopped.
const DRAIN: Duration = Duration::from_secs(60);
/// A client's patience while a process is paused: requests forwarded to it hang.
const PATIENCE_PAUSED: Duration = Duration::from_millis(2500);

/// What a failed check says.
type Check = Result<(), String>;

/// A small deterministic generator (splitmix64): a seed names its operations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len())]
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// One step of a case. Process indexes (`via`, `node`) name a process; when it is down (or
/// paused, for requests), the next one up serves instead. `held` and `token` pick, modulo
/// their number, one of the claims or worker tokens in hand; with none in hand the step does
/// nothing.
#[derive(Clone, Debug)]
enum Op {
    /// A background call: sim children taking these milliseconds (the first failing when
    /// `fail`), then `externals` external children.
    Delegate {
        session: usize,
        via: usize,
        sims: Vec<u64>,
        fail: bool,
        externals: usize,
        independent: bool,
        rerun: bool,
    },
    /// A boundary with a claim lease of `lease_ms`; its claim acked through `ack_via` at once,
    /// or held.
    Boundary {
        session: usize,
        via: usize,
        lease_ms: u64,
        ack_via: Option<usize>,
    },
    Ack {
        held: usize,
        via: usize,
    },
    Release {
        held: usize,
        via: usize,
    },
    /// A worker's poll, its child leased for `lease_ms`.
    Poll {
        via: usize,
        lease_ms: u64,
    },
    Complete {
        token: usize,
        via: usize,
        ok: bool,
    },
    Heartbeat {
        token: usize,
        via: usize,
    },
    /// `SIGSTOP` for the lease and `past_ms` more, the `during` steps sent meanwhile through
    /// the other processes, then `SIGCONT`; the `woken` steps are sent to the paused process
    /// itself, the first while it is still stopped (answered once it runs again, as it may
    /// still believe it holds its sessions), the others right after.
    Pause {
        node: usize,
        past_ms: u64,
        during: Vec<Op>,
        woken: Vec<Op>,
    },
    Kill {
        node: usize,
    },
    /// A killed process started again on its folder and name, with the fault points
    /// `failpoints` armed (`BROOD_FAILPOINTS`): `take_stall` (every take it serves waits 1.5 s
    /// first), `ledger_flush_stall` (commits 400 ms late), `ledger_flush_slow_fail` (commits
    /// that fail 400 ms late).
    Restart {
        node: usize,
        failpoints: Option<&'static str>,
    },
    /// The database crashes and is started again `down_ms` later.
    DbRestart {
        down_ms: u64,
    },
}

/// A case: how many processes, and what is done.
#[derive(Clone, Debug)]
struct Case {
    processes: usize,
    sessions: usize,
    ops: Vec<Op>,
}

fn delegate(rng: &mut Rng, sessions: usize, processes: usize) -> Op {
    let sims = (0..rng.below(4))
        .map(|_| rng.pick(&[0, 0, 50, 300, 1500]))
        .collect::<Vec<_>>();
    let externals = if sims.is_empty() {
        1 + rng.below(2)
    } else {
        rng.below(3)
    };
    Op::Delegate {
        session: rng.below(sessions),
        via: rng.below(processes),
        fail: !sims.is_empty() && rng.chance(20),
        sims,
        externals,
        independent: rng.chance(60),
        rerun: rng.chance(50),
    }
}

/// A step that is no fault, sent through any process.
fn ordinary(rng: &mut Rng, sessions: usize, processes: usize) -> Op {
    let via = rng.below(processes);
    match rng.below(100) {
        0..=29 => delegate(rng, sessions, processes),
        30..=59 => Op::Boundary {
            session: rng.below(sessions),
            via,
            lease_ms: rng.pick(&[1500, 5000]),
            ack_via: rng.chance(65).then(|| rng.below(processes)),
        },
        60..=69 => Op::Ack {
            held: rng.below(8),
            via,
        },
        70..=74 => Op::Release {
            held: rng.below(8),
            via,
        },
        75..=87 => Op::Poll {
            via,
            lease_ms: rng.pick(&[1500, 5000]),
        },
        88..=91 => Op::Heartbeat {
            token: rng.below(8),
            via,
        },
        _ => Op::Complete {
            token: rng.below(8),
            via,
            ok: rng.chance(80),
        },
    }
}

/// The case a seed names: at most `faults` faults, never more than one process down, and a
/// pause only while another process is up.
fn case(seed: u64, steps: usize, faults: usize) -> Case {
    let mut rng = Rng(seed);
    let processes = 2 + rng.below(2);
    let sessions = 2 + rng.below(2);
    let mut ops = vec![delegate(&mut rng, sessions, processes)];
    let mut down: Option<usize> = None;
    let mut made = 0;
    while ops.len() < steps {
        if made < faults && rng.chance(22) {
            made += 1;
            let node = rng.below(processes);
            let op = match (rng.below(4), down) {
                (0, Some(d)) => {
                    down = None;
                    Op::Restart {
                        node: d,
                        failpoints: rng.pick(&[
                            None,
                            Some("take_stall=1000"),
                            Some("ledger_flush_stall=40"),
                            Some("ledger_flush_slow_fail=3"),
                        ]),
                    }
                }
                (0, None) => {
                    down = Some(node);
                    Op::Kill { node }
                }
                (1, _) => Op::DbRestart {
                    down_ms: rng.pick(&[200, 800, LEASE_MS + 700]),
                },
                (_, d) if d.is_none() || processes == 3 => {
                    let node = if d == Some(node) { (node + 1) % processes } else { node };
                    let during = (0..rng.below(3))
                        .map(|_| ordinary(&mut rng, sessions, processes))
                        .collect();
                    let woken = (0..rng.below(3))
                        .map(|_| through(&ordinary(&mut rng, sessions, processes), node))
                        .collect();
                    Op::Pause {
                        node,
                        past_ms: rng.pick(&[300, 1200]),
                        during,
                        woken,
                    }
                }
                (_, _) => Op::DbRestart {
                    down_ms: rng.pick(&[200, LEASE_MS + 700]),
                },
            };
            ops.push(op);
        } else {
            ops.push(ordinary(&mut rng, sessions, processes));
        }
    }
    Case {
        processes,
        sessions,
        ops,
    }
}

/// One item of an envelope.
#[derive(Clone, Debug)]
struct Item {
    key: String,
    child: String,
    kind: String,
}

/// A claim in hand.
#[derive(Clone, Debug)]
struct Claim {
    id: String,
    session: usize,
    items: Vec<Item>,
}

/// A worker's lease of a child, and the completion it sent once (sent again as it was).
#[derive(Clone, Debug)]
struct Token {
    child: String,
    token: String,
    sent: Option<Value>,
}

/// What the clients were told.
#[derive(Default)]
struct Model {
    /// Accepted calls (202): their session and number of children.
    calls: BTreeMap<String, (usize, usize)>,
    /// Acknowledged items (200 to their claim's ack), by dedup key: their session.
    acked: BTreeMap<String, usize>,
    /// Children whose result was acknowledged, and the claim that did.
    delivered: BTreeMap<String, String>,
    /// Calls whose delegate got no answer (a request left with a paused process): their
    /// session and number of children. A call a view shows that the model does not know is
    /// taken for one of these, of its session and size, or is a violation.
    unsure_calls: Vec<(usize, usize)>,
    held: Vec<Claim>,
    /// Claims whose ack got no answer: acked or not, asked again once every process is up.
    unsure: Vec<Claim>,
    tokens: Vec<Token>,
}

impl Model {
    fn call_of(child: &str) -> &str {
        child.rsplit_once('.').map_or(child, |(call, _)| call)
    }

    /// An envelope handed out: none of its items acknowledged before, all of accepted calls.
    fn handed_out(&self, claim: &Claim) -> Check {
        for item in &claim.items {
            if self.acked.contains_key(&item.key) {
                return Err(format!(
                    "{} ({} of {}) was acknowledged and is handed out again in claim {}",
                    item.key, item.kind, item.child, claim.id
                ));
            }
            match self.calls.get(Self::call_of(&item.child)) {
                Some((s, _)) if *s == claim.session => {}
                None if self.unsure_calls.iter().any(|(s, _)| *s == claim.session) => {}
                _ => {
                    return Err(format!(
                        "{} is no child of an accepted call of this session",
                        item.child
                    ))
                }
            }
        }
        Ok(())
    }

    /// A claim acknowledged (200): its items delivered, none of them twice.
    fn acknowledged(&mut self, claim: &Claim) -> Check {
        for item in &claim.items {
            if self.acked.insert(item.key.clone(), claim.session).is_some() {
                return Err(format!(
                    "{} was acknowledged twice (again in claim {})",
                    item.key, claim.id
                ));
            }
            if item.kind == "result" {
                if let Some(first) = self.delivered.insert(item.child.clone(), claim.id.clone()) {
                    return Err(format!(
                        "the result of {} was delivered by claim {first} and again by claim {}",
                        item.child, claim.id
                    ));
                }
            }
        }
        Ok(())
    }

    fn children(&self, session: usize) -> BTreeSet<String> {
        self.calls
            .iter()
            .filter(|(_, (s, _))| *s == session)
            .flat_map(|(call, (_, n))| (0..*n).map(move |i| format!("{call}.{i}")))
            .collect()
    }
}

/// A process of the case: up (`server`), or down.
struct Node {
    name: String,
    dir: PathBuf,
    server: Option<Server>,
}

/// What is running, the model, and what each step answered.
struct World<'c> {
    cluster: &'c mut Cluster,
    url: String,
    nodes: Vec<Node>,
    sessions: Vec<String>,
    /// The client of ordinary steps, and the impatient one of steps sent during a pause.
    agent: ureq::Agent,
    brief: ureq::Agent,
    model: Model,
    log: Vec<String>,
    _dir: tempfile::TempDir,
}

fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .build()
        .into()
}

/// A request: its status and body (Null when empty), or why none came.
fn request(
    agent: &ureq::Agent,
    base: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, Value), String> {
    let url = format!("{base}{path}");
    let response = match method {
        "GET" => agent.get(&url).call(),
        _ => {
            let r = match method {
                "PUT" => agent.put(&url),
                _ => agent.post(&url),
            }
            .header("Content-Type", "application/json");
            match body {
                Some(b) => r.send(b.to_string().as_bytes()),
                None => r.send_empty(),
            }
        }
    };
    let mut response = response.map_err(|e| format!("{method} {path}: {e}"))?;
    let status = response.status().as_u16();
    let mut text = String::new();
    response
        .body_mut()
        .as_reader()
        .read_to_string(&mut text)
        .map_err(|e| format!("{method} {path}: reading the reply: {e}"))?;
    let value = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).map_err(|e| format!("{method} {path}: not JSON ({e}): {text}"))?
    };
    Ok((status, value))
}

fn items_of(env: &Value) -> Vec<Item> {
    env["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| Item {
            key: i["dedup_key"].as_str().unwrap_or_default().to_string(),
            child: i["child_id"].as_str().unwrap_or_default().to_string(),
            kind: i["kind"].as_str().unwrap_or_default().to_string(),
        })
        .collect()
}

fn start(node: &Node, url: &str, failpoints: Option<&str>) -> Server {
    let env: Vec<(&str, &str)> = failpoints.map(|f| ("BROOD_FAILPOINTS", f)).into_iter().collect();
    Server::start_env(
        &node.dir,
        None,
        &[
            "--ledger",
            url,
            "--node",
            &node.name,
            "--session-lease-ms",
            &LEASE_MS.to_string(),
            "--max-delivery-attempts",
            "1000",
        ],
        &env,
    )
}

impl<'c> World<'c> {
    /// `processes` processes on a fresh database of `cluster`, `sessions` sessions opened.
    fn new(cluster: &'c mut Cluster, processes: usize, sessions: usize) -> World<'c> {
        let name = fresh_schema();
        let base = cluster.url();
        execute(&base, &format!("CREATE DATABASE {name}"));
        let url = format!(
            "{}/{name}",
            &base[..base.rfind('/').expect("a database in the address")]
        );
        let dir = tempfile::tempdir().expect("a temporary folder");
        let nodes = (0..processes)
            .map(|i| {
                let name = ["a", "b", "c"][i].to_string();
                let node_dir = dir.path().join(&name);
                std::fs::create_dir_all(&node_dir).expect("a node folder");
                let mut node = Node {
                    name,
                    dir: node_dir,
                    server: None,
                };
                node.server = Some(start(&node, &url, None));
                node
            })
            .collect();
        let world = World {
            cluster,
            url,
            nodes,
            sessions: (0..sessions).map(|i| format!("s{i}")).collect(),
            agent: agent(Duration::from_secs(30)),
            brief: agent(PATIENCE_PAUSED),
            model: Model::default(),
            log: Vec::new(),
            _dir: dir,
        };
        for i in 0..sessions {
            let session = world.sessions[i].clone();
            let reply = world.until_answered(
                i,
                "PUT",
                &format!("/v1/sessions/{session}"),
                Some(&json!({"addressable": true})),
            );
            assert!(matches!(&reply, Ok((200, _))), "opening {session}: {reply:?}");
        }
        world
    }

    /// The process `via`, or the next one up that is not `avoid`.
    fn up(&self, via: usize, avoid: Option<usize>) -> usize {
        let n = self.nodes.len();
        (0..n)
            .map(|k| (via + k) % n)
            .find(|&i| self.nodes[i].server.is_some() && Some(i) != avoid)
            .expect("a process is up")
    }

    fn base(&self, i: usize) -> String {
        self.nodes[i]
            .server
            .as_ref()
            .map(|s| s.base.clone())
            .unwrap_or_default()
    }

    /// A request through process `via` (or the next one up, not `paused`), with the patience
    /// the moment calls for.
    fn send(
        &self,
        via: usize,
        paused: Option<usize>,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> (usize, Result<(u16, Value), String>) {
        let i = self.up(via, paused);
        let agent = if paused.is_some() { &self.brief } else { &self.agent };
        (i, request(agent, &self.base(i), method, path, body))
    }

    /// A request through `via` and then the others, retried while it answers 503 or nothing,
    /// for [`SETTLE`] at most; the last answer.
    fn until_answered(
        &self,
        via: usize,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), String> {
        let deadline = Instant::now() + SETTLE;
        let mut k = via;
        loop {
            let (_, reply) = self.send(k, None, method, path, body);
            match &reply {
                Ok((503, _)) | Err(_) if Instant::now() < deadline => {}
                _ => return reply,
            }
            k += 1;
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs one step; `paused` is the process paused meanwhile, if any.
    fn apply(&mut self, op: &Op, paused: Option<usize>) -> Check {
        match op {
            Op::Delegate {
                session,
                via,
                sims,
                fail,
                externals,
                independent,
                rerun,
            } => {
                let tasks = delegated_tasks(sims, *fail, *externals, *rerun);
                self.delegate(*session, *via, paused, tasks, *independent)
            }
            Op::Boundary {
                session,
                via,
                lease_ms,
                ack_via,
            } => self.boundary(*session, *via, paused, *lease_ms, *ack_via),
            Op::Ack { held, via } => match self.take_held(*held) {
                Some(claim) => self.ack(claim, *via, paused),
                None => Ok(()),
            },
            Op::Release { held, via } => match self.take_held(*held) {
                Some(claim) => self.release(claim, *via, paused),
                None => Ok(()),
            },
            Op::Poll { via, lease_ms } => self.poll(*via, paused, *lease_ms),
            Op::Complete { token, via, ok } => self.complete(*token, *via, paused, *ok),
            Op::Heartbeat { token, via } => self.heartbeat(*token, *via, paused),
            Op::Pause {
                node,
                past_ms,
                during,
                woken,
            } => self.pause(*node, *past_ms, during, woken),
            Op::Kill { node } => {
                let node = self.up(*node, None);
                if let Some(server) = self.nodes[node].server.take() {
                    server.kill9();
                }
                Ok(())
            }
            Op::Restart { node, failpoints } => {
                let node = *node % self.nodes.len();
                if self.nodes[node].server.is_none() {
                    let server = start(&self.nodes[node], &self.url, *failpoints);
                    self.nodes[node].server = Some(server);
                }
                Ok(())
            }
            Op::DbRestart { down_ms } => {
                self.cluster.stop();
                std::thread::sleep(Duration::from_millis(*down_ms));
                self.cluster.start();
                Ok(())
            }
        }
    }

    /// A POST through `via` (see [`World::send`]), its answer logged as `what`'s.
    fn post(
        &mut self,
        what: &str,
        via: usize,
        paused: Option<usize>,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), String> {
        let (i, reply) = self.send(via, paused, "POST", path, body);
        self.log
            .push(format!("  {what} through {}: {}", self.nodes[i].name, brief(&reply)));
        reply
    }

    /// Delegates `tasks` in session number `session`: an accepted call joins the model, a
    /// refused one must change nothing (which the views check), an unanswered one may have
    /// been accepted.
    fn delegate(
        &mut self,
        session: usize,
        via: usize,
        paused: Option<usize>,
        tasks: Vec<Value>,
        independent: bool,
    ) -> Check {
        let session = session % self.sessions.len();
        let n = tasks.len();
        let body = json!({"tasks": tasks, "independent_completions": independent});
        let path = format!("/v1/sessions/{}/delegate", self.sessions[session]);
        match self.post("delegate", via, paused, &path, Some(&body)) {
            Ok((202, r)) => {
                let call = r["call_id"].as_str().ok_or("a 202 without a call id")?.to_string();
                self.model.calls.insert(call, (session, n));
            }
            // Refused: it must change nothing, which the views check.
            Ok((503, _)) => {}
            Err(_) => self.model.unsure_calls.push((session, n)),
            other => return Err(format!("delegate answered {other:?}")),
        }
        Ok(())
    }

    /// A boundary of session number `session`: its envelope handed out in the model, then
    /// acked through `ack_via` or held.
    fn boundary(
        &mut self,
        session: usize,
        via: usize,
        paused: Option<usize>,
        lease_ms: u64,
        ack_via: Option<usize>,
    ) -> Check {
        let session = session % self.sessions.len();
        let path = format!("/v1/sessions/{}/boundary", self.sessions[session]);
        let body = json!({"consumer": format!("c{via}"), "lease_ms": lease_ms});
        match self.post("boundary", via, paused, &path, Some(&body)) {
            Ok((200, env)) => {
                let claim = Claim {
                    id: env["claim_id"]
                        .as_str()
                        .ok_or("an envelope without a claim id")?
                        .to_string(),
                    session,
                    items: items_of(&env),
                };
                self.model.handed_out(&claim)?;
                match ack_via {
                    Some(a) => self.ack(claim, a, paused)?,
                    None => self.model.held.push(claim),
                }
            }
            Ok((204 | 503, _)) => {}
            // A boundary nobody heard the answer of: its claim lapses.
            Err(_) if paused.is_some() => {}
            other => return Err(format!("boundary answered {other:?}")),
        }
        Ok(())
    }

    /// The held claim number `held` (modulo those held), taken out of the model's hand.
    fn take_held(&mut self, held: usize) -> Option<Claim> {
        if self.model.held.is_empty() {
            return None;
        }
        let k = held % self.model.held.len();
        Some(self.model.held.remove(k))
    }

    /// Releases `claim` as busy through `via`.
    fn release(&mut self, claim: Claim, via: usize, paused: Option<usize>) -> Check {
        let path = format!("/v1/claims/{}/release", claim.id);
        match self.post("release", via, paused, &path, Some(&json!({"reason": "busy"}))) {
            Ok((200 | 409 | 503, _)) => Ok(()),
            Ok((404, e)) if lost(&e) => Ok(()),
            Err(_) if paused.is_some() => Ok(()),
            other => Err(format!("release answered {other:?}")),
        }
    }

    /// A worker's poll: the child it is handed must be of an accepted call (or of one that may
    /// have been); its token joins the model's.
    fn poll(&mut self, via: usize, paused: Option<usize>, lease_ms: u64) -> Check {
        let body = json!({"worker": "w", "wait_ms": 0, "lease_ms": lease_ms});
        match self.post("poll", via, paused, "/v1/workers/poll", Some(&body)) {
            Ok((200, work)) => {
                let child = work["child_id"].as_str().unwrap_or_default().to_string();
                if !self.model.calls.contains_key(Model::call_of(&child)) && self.model.unsure_calls.is_empty() {
                    return Err(format!("a worker was handed {child}, of no accepted call"));
                }
                self.model.tokens.push(Token {
                    child,
                    token: work["token"].as_str().unwrap_or_default().to_string(),
                    sent: None,
                });
            }
            Ok((204 | 503, _)) => {}
            Err(_) if paused.is_some() => {}
            other => return Err(format!("poll answered {other:?}")),
        }
        Ok(())
    }

    /// Completes the child of token number `token` (modulo those held), with the same body
    /// every time it is sent; the token is let go once an answer says the end was taken.
    fn complete(&mut self, token: usize, via: usize, paused: Option<usize>, ok: bool) -> Check {
        if self.model.tokens.is_empty() {
            return Ok(());
        }
        let k = token % self.model.tokens.len();
        let t = &mut self.model.tokens[k];
        let body = t
            .sent
            .get_or_insert_with(|| {
                let status = if ok { "succeeded" } else { "failed" };
                json!({"token": t.token, "status": status, "summary": "done", "error": (!ok).then_some("no")})
            })
            .clone();
        let path = format!("/v1/children/{}/complete", t.child);
        match self.post("complete", via, paused, &path, Some(&body)) {
            Ok((200 | 409, _)) => {
                self.model.tokens.remove(k);
            }
            // Sent again later, as it was.
            Ok((503, _)) => {}
            Err(_) if paused.is_some() => {}
            other => return Err(format!("complete answered {other:?}")),
        }
        Ok(())
    }

    /// A heartbeat of the child of token number `token`: never renewed once its result went
    /// out.
    fn heartbeat(&mut self, token: usize, via: usize, paused: Option<usize>) -> Check {
        if self.model.tokens.is_empty() {
            return Ok(());
        }
        let t = self.model.tokens[token % self.model.tokens.len()].clone();
        let path = format!("/v1/children/{}/heartbeat", t.child);
        let body = json!({"token": t.token, "progress": "half"});
        match self.post("heartbeat", via, paused, &path, Some(&body)) {
            // A lease renewed for a child whose result went out: a stale holder's.
            Ok((200, _)) if self.model.delivered.contains_key(&t.child) => {
                Err(format!("a heartbeat of {}, delivered, was answered 200", t.child))
            }
            Ok((200 | 409 | 503, _)) => Ok(()),
            Err(_) if paused.is_some() => Ok(()),
            other => Err(format!("heartbeat answered {other:?}")),
        }
    }

    /// Pauses process `node` (see [`Op::Pause`]): the `during` steps sent through the others
    /// while it is stopped, the `woken` ones to it as it resumes.
    fn pause(&mut self, node: usize, past_ms: u64, during: &[Op], woken: &[Op]) -> Check {
        let node = self.up(node, None);
        let server = self.nodes[node].server.as_ref().expect("up");
        server.signal("-STOP");
        let stopped = Instant::now();
        std::thread::sleep(Duration::from_millis(LEASE_MS + past_ms));
        for op in during {
            self.log.push(format!("  during the pause: {op:?}"));
            let sent = self.apply(op, Some(node));
            if sent.is_err() {
                self.nodes[node].server.as_ref().expect("up").signal("-CONT");
                return sent;
            }
        }
        self.log.push(format!("  resumed after {:?}", stopped.elapsed()));
        let pid = self.nodes[node].server.as_ref().expect("up").child.id().to_string();
        let delay = Duration::from_millis(if woken.is_empty() { 0 } else { 300 });
        // Resumed from another thread a little later, while the first woken step waits for its
        // answer.
        let resume = std::thread::spawn(move || {
            std::thread::sleep(delay);
            std::process::Command::new("kill").args(["-CONT", &pid]).status()
        });
        let mut sent = Ok(());
        for op in woken {
            self.log.push(format!("  to the woken process: {op:?}"));
            sent = self.apply(&through(op, node), None);
            if sent.is_err() {
                break;
            }
        }
        let resumed = resume.join().map(|r| r.map(|s| s.success()));
        assert!(matches!(resumed, Ok(Ok(true))), "kill -CONT: {resumed:?}");
        sent
    }

    /// Acks `claim` through `via`: delivered at 200, back in the ready set at 409, unsure when
    /// no answer came.
    fn ack(&mut self, claim: Claim, via: usize, paused: Option<usize>) -> Check {
        let path = format!("/v1/claims/{}/ack", claim.id);
        match self.post("ack", via, paused, &path, None) {
            Ok((200, _)) => self.model.acknowledged(&claim),
            Ok((409, _)) => Ok(()),
            Ok((404, e)) if lost(&e) => Ok(()),
            Ok((503, _)) | Err(_) => {
                self.model.unsure.push(claim);
                Ok(())
            }
            other => Err(format!("ack answered {other:?}")),
        }
    }

    /// Once every process that is up runs: unsure acks asked again, then every session's view
    /// through every process.
    fn settle(&mut self) -> Check {
        for claim in std::mem::take(&mut self.model.unsure) {
            let path = format!("/v1/claims/{}/ack", claim.id);
            let reply = self.until_answered(0, "POST", &path, None);
            self.log.push(format!("  ack again: {}", brief(&reply)));
            match reply {
                Ok((200, _)) => self.model.acknowledged(&claim)?,
                Ok((409, _)) => {}
                Ok((404, e)) if lost(&e) => {}
                other => return Err(format!("an ack asked again answered {other:?}")),
            }
        }
        self.adopt()?;
        for session in 0..self.sessions.len() {
            self.views_agree(session)?;
        }
        Ok(())
    }

    /// The calls of unanswered delegates that were accepted after all, taken into the model.
    fn adopt(&mut self) -> Check {
        for session in 0..self.sessions.len() {
            if !self.model.unsure_calls.iter().any(|(s, _)| *s == session) {
                continue;
            }
            let path = format!("/v1/sessions/{}?delivered=true&limit=1000", self.sessions[session]);
            let view = match self.until_answered(0, "GET", &path, None) {
                Ok((200, view)) => view,
                other => return Err(format!("{}: {other:?}", self.sessions[session])),
            };
            for c in view["calls"].as_array().into_iter().flatten() {
                let call = c["call_id"].as_str().unwrap_or_default();
                let n = c["children"].as_array().map_or(0, Vec::len);
                if self.model.calls.contains_key(call) {
                    continue;
                }
                if let Some(k) = self.model.unsure_calls.iter().position(|u| *u == (session, n)) {
                    self.model.unsure_calls.remove(k);
                    self.model.calls.insert(call.to_string(), (session, n));
                    self.log
                        .push(format!("  {call}, of a delegate that got no answer, was accepted"));
                }
            }
        }
        Ok(())
    }

    /// Every process shows `session` with the accepted calls and no other, and with the
    /// acknowledged children delivered and no other.
    fn views_agree(&self, session: usize) -> Check {
        let s = &self.sessions[session];
        let path = format!("/v1/sessions/{s}?delivered=true&limit=1000");
        let calls: BTreeSet<String> = self
            .model
            .calls
            .iter()
            .filter(|(_, (k, _))| *k == session)
            .map(|(c, _)| c.clone())
            .collect();
        let delivered: BTreeSet<String> = self
            .model
            .children(session)
            .into_iter()
            .filter(|c| self.model.delivered.contains_key(c))
            .collect();
        for i in 0..self.nodes.len() {
            if self.nodes[i].server.is_none() {
                continue;
            }
            let deadline = Instant::now() + SETTLE;
            let view = loop {
                let reply = request(&self.agent, &self.base(i), "GET", &path, None);
                match reply {
                    Ok((200, view)) => break view,
                    Ok((503, _)) | Err(_) if Instant::now() < deadline => {}
                    other => return Err(format!("{s} through {}: {other:?}", self.nodes[i].name)),
                }
                std::thread::sleep(Duration::from_millis(100));
            };
            let shown: BTreeSet<String> = view["calls"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["call_id"].as_str().map(str::to_string))
                .collect();
            if shown != calls {
                return Err(format!(
                    "{} shows the calls {shown:?} of {s}; accepted were {calls:?}",
                    self.nodes[i].name
                ));
            }
            let shown = delivered_in(&view);
            if shown != delivered {
                return Err(format!(
                    "{} shows {shown:?} of {s} delivered; acknowledged were {delivered:?} (leases: {})",
                    self.nodes[i].name,
                    self.tenures()
                ));
            }
        }
        Ok(())
    }

    /// The lease table as the database has it: session, holder, epoch, whether it is live.
    fn tenures(&self) -> String {
        server::psql(
            &self.url,
            "SELECT convert_from(session, 'UTF8'), owner, epoch, expires_at > now() FROM brood.session_leases ORDER BY 1",
        )
        .replace('\n', "; ")
    }

    /// With every process up and no more faults: workers complete every external child,
    /// consumers take and ack everything, through any process, until every child of every
    /// accepted call was delivered once and nothing is left.
    fn drain(&mut self) -> Check {
        for node in 0..self.nodes.len() {
            self.apply(&Op::Restart { node, failpoints: None }, None)?;
        }
        for claim in std::mem::take(&mut self.model.held) {
            let _ = self.until_answered(
                0,
                "POST",
                &format!("/v1/claims/{}/release", claim.id),
                Some(&json!({"reason": "busy"})),
            );
        }
        self.settle()?;
        let expected: BTreeSet<String> = (0..self.sessions.len()).flat_map(|s| self.model.children(s)).collect();
        let bases: Vec<String> = (0..self.nodes.len()).map(|i| self.base(i)).collect();
        let stop = AtomicBool::new(false);
        let worker_errors = Mutex::new(Vec::<String>::new());
        let tokens = std::mem::take(&mut self.model.tokens);
        let calls: BTreeSet<String> = self.model.calls.keys().cloned().collect();
        let deadline = Instant::now() + DRAIN;
        let drained = std::thread::scope(|scope| {
            let (stop, worker_errors, bases, calls) = (&stop, &worker_errors, &bases, &calls);
            let agent = self.agent.clone();
            scope.spawn(move || work(&agent, bases, calls, tokens, stop, worker_errors));
            let done = self.consume(&expected, deadline);
            stop.store(true, Ordering::Relaxed);
            done
        });
        let errors = worker_errors.into_inner().unwrap_or_default();
        if !errors.is_empty() {
            return Err(errors.join("; "));
        }
        drained?;
        let missing: Vec<&String> = expected
            .iter()
            .filter(|c| !self.model.delivered.contains_key(*c))
            .collect();
        if !missing.is_empty() {
            return Err(format!("not delivered within {DRAIN:?}: {missing:?}"));
        }
        self.settle()?;
        let (_, dead) = self.send(0, None, "GET", "/v1/dead-letters", None);
        match dead {
            Ok((200, d)) if d["items"].as_array().is_some_and(|a| a.is_empty()) => {}
            other => return Err(format!("dead letters: {other:?}")),
        }
        for session in 0..self.sessions.len() {
            let s = &self.sessions[session];
            let mut seen = Vec::new();
            for i in 0..self.nodes.len() {
                let (_, reply) = self.send(i, None, "GET", &format!("/v1/sessions/{s}"), None);
                match reply {
                    Ok((200, view)) => seen.push(view["counts"].clone()),
                    other => return Err(format!("{s} through {}: {other:?}", self.nodes[i].name)),
                }
            }
            // Items: results and failure notices.
            let n = self.model.acked.values().filter(|s| **s == session).count();
            let want = json!({"queued": 0, "running": 0, "ready": 0, "claimed": 0, "delivered": n});
            if seen.iter().any(|c| {
                ["queued", "running", "ready", "claimed", "delivered"]
                    .iter()
                    .any(|k| c[k] != want[k])
            }) {
                return Err(format!("{s} counts through each process: {seen:?}; want {want}"));
            }
        }
        Ok(())
    }

    /// Boundaries and acks of every session through every process, until every expected child
    /// was delivered and a whole round found nothing ready, or `deadline` passed.
    fn consume(&mut self, expected: &BTreeSet<String>, deadline: Instant) -> Check {
        let mut round = 0usize;
        loop {
            let mut quiet = true;
            for session in 0..self.sessions.len() {
                for via in 0..self.nodes.len() {
                    let path = format!("/v1/sessions/{}/boundary", self.sessions[session]);
                    let body = json!({"consumer": "drain", "lease_ms": 30_000});
                    let (_, reply) = self.send(via, None, "POST", &path, Some(&body));
                    match reply {
                        Ok((204, _)) => {}
                        Ok((200, env)) => {
                            quiet = false;
                            let claim = Claim {
                                id: env["claim_id"].as_str().unwrap_or_default().to_string(),
                                session,
                                items: items_of(&env),
                            };
                            self.model.handed_out(&claim)?;
                            let path = format!("/v1/claims/{}/ack", claim.id);
                            match self.until_answered(via + round, "POST", &path, None) {
                                Ok((200, _)) => self.model.acknowledged(&claim)?,
                                Ok((409, _)) => {}
                                Ok((404, e)) if lost(&e) => {}
                                other => return Err(format!("a drain's ack answered {other:?}")),
                            }
                        }
                        Ok((503, _)) | Err(_) => quiet = false,
                        other => return Err(format!("a drain's boundary answered {other:?}")),
                    }
                }
            }
            let all = expected.iter().all(|c| self.model.delivered.contains_key(c));
            if quiet && all {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Ok(());
            }
            round += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// An external worker polling every process in turn and completing what it gets (first the
/// leases it was handed before), until `stop`.
fn work(
    agent: &ureq::Agent,
    bases: &[String],
    calls: &BTreeSet<String>,
    tokens: Vec<Token>,
    stop: &AtomicBool,
    errors: &Mutex<Vec<String>>,
) {
    let complete = |k: usize, t: &Token| {
        let body = t
            .sent
            .clone()
            .unwrap_or_else(|| json!({"token": t.token, "status": "succeeded", "summary": "done"}));
        let path = format!("/v1/children/{}/complete", t.child);
        let deadline = Instant::now() + SETTLE;
        let mut k = k;
        loop {
            match request(agent, &bases[k % bases.len()], "POST", &path, Some(&body)) {
                Ok((200 | 409, _)) => return,
                Ok((503, _)) | Err(_) if Instant::now() < deadline => {}
                other => {
                    if let Ok(mut e) = errors.lock() {
                        e.push(format!("a worker's completion of {} answered {other:?}", t.child));
                    }
                    return;
                }
            }
            k += 1;
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    for (k, t) in tokens.iter().enumerate() {
        complete(k, t);
    }
    let mut k = 0;
    while !stop.load(Ordering::Relaxed) {
        k += 1;
        let body = json!({"worker": "drain", "wait_ms": 200, "lease_ms": 20_000});
        match request(agent, &bases[k % bases.len()], "POST", "/v1/workers/poll", Some(&body)) {
            Ok((200, w)) => {
                let t = Token {
                    child: w["child_id"].as_str().unwrap_or_default().to_string(),
                    token: w["token"].as_str().unwrap_or_default().to_string(),
                    sent: None,
                };
                if !calls.contains(Model::call_of(&t.child)) {
                    if let Ok(mut e) = errors.lock() {
                        e.push(format!("a worker was handed {}, of no accepted call", t.child));
                    }
                }
                complete(k, &t);
            }
            Ok((204 | 503, _)) | Err(_) => {}
            other => {
                if let Ok(mut e) = errors.lock() {
                    e.push(format!("a worker's poll answered {other:?}"));
                }
                return;
            }
        }
    }
}

/// The tasks of a delegate: sim children taking `sims` milliseconds (the first failing when
/// `fail`), then `externals` external children, each re-run after a crash when `rerun`.
fn delegated_tasks(sims: &[u64], fail: bool, externals: usize, rerun: bool) -> Vec<Value> {
    let mut tasks: Vec<Value> = sims
        .iter()
        .enumerate()
        .map(|(i, ms)| {
            let outcome = if fail && i == 0 { "fail" } else { "ok" };
            json!({"goal": format!("sim {i}"), "runner": {"kind": "sim", "ms": ms, "outcome": outcome},
                   "rerun_on_recovery": rerun})
        })
        .collect();
    tasks.extend(
        (0..externals).map(
            |i| json!({"goal": format!("external {i}"), "runner": {"kind": "external"}, "rerun_on_recovery": rerun}),
        ),
    );
    tasks
}

/// `op` sent through process `node`.
fn through(op: &Op, node: usize) -> Op {
    let mut op = op.clone();
    match &mut op {
        Op::Delegate { via, .. }
        | Op::Ack { via, .. }
        | Op::Release { via, .. }
        | Op::Poll { via, .. }
        | Op::Complete { via, .. }
        | Op::Heartbeat { via, .. } => *via = node,
        Op::Boundary { via, ack_via, .. } => {
            *via = node;
            *ack_via = ack_via.map(|_| node);
        }
        Op::Pause { .. } | Op::Kill { .. } | Op::Restart { .. } | Op::DbRestart { .. } => {}
    }
    op
}

/// A claim its holder no longer knows: one returned by a takeover (or a restart) is not
/// remembered by the process that took the session up, and is answered as an unknown one.
fn lost(error: &Value) -> bool {
    error["error"]["code"] == "unknown_claim"
}

/// A reply in a line of the log.
fn brief(reply: &Result<(u16, Value), String>) -> String {
    match reply {
        Ok((status, body)) => {
            let mut text = body.to_string();
            text.truncate(160);
            format!("{status} {text}")
        }
        Err(e) => format!("no answer: {e}"),
    }
}

/// Runs `case` on `cluster`: every step, the checks after it, the drain; what failed, with the
/// case and its log.
fn run(cluster: &mut Cluster, label: &str, case: &Case) -> Check {
    let started = Instant::now();
    let mut world = World::new(cluster, case.processes, case.sessions);
    let mut outcome = Ok(());
    for (n, op) in case.ops.iter().enumerate() {
        world.log.push(format!("step {n} at {:?}: {op:?}", started.elapsed()));
        outcome = world.apply(op, None).and_then(|_| world.settle());
        if outcome.is_err() {
            break;
        }
    }
    if outcome.is_ok() {
        world.log.push(format!("drain at {:?}", started.elapsed()));
        outcome = world.drain();
    }
    world.log.push(format!("done at {:?}", started.elapsed()));
    if std::env::var_os("BROOD_SHARED_MODEL_LOG").is_some() {
        eprintln!("{label}:\n{}", world.log.join("\n"));
    }
    outcome.map_err(|e| {
        format!(
            "{label} failed: {e}\n{} processes, {} sessions; steps {:#?}\nlog:\n{}",
            case.processes,
            case.sessions,
            case.ops,
            world.log.join("\n")
        )
    })
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn processes_sharing_a_database_lose_nothing_repeat_nothing_and_drain_under_faults() {
    let cases = env_or("BROOD_SHARED_MODEL_CASES", 2);
    let steps = env_or("BROOD_SHARED_MODEL_STEPS", 12) as usize;
    let first = env_or("BROOD_SHARED_MODEL_SEED", 1);
    let faults = env_or("BROOD_SHARED_MODEL_FAULTS", 3) as usize;
    let mut cluster = Cluster::private();
    for seed in first..first + cases {
        let case = case(seed, steps, faults);
        let started = Instant::now();
        if let Err(e) = run(&mut cluster, &format!("seed {seed}"), &case) {
            panic!("{e}");
        }
        eprintln!(
            "seed {seed}: {} steps passed in {:?}",
            case.ops.len(),
            started.elapsed()
        );
    }
}

/// The children a session's view shows delivered.
fn delivered_in(view: &Value) -> BTreeSet<String> {
    view["calls"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["children"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["delivery"] == "delivered")
        .filter_map(|c| c["child_id"].as_str().map(str::to_string))
        .collect()
}

/// Found by the model (a database restart longer than a lease, then a takeover): the process
/// that held a session answered a read of it from its memory after another had taken it over
/// and acked in it, showing the acked children undelivered. Here the holder is paused past
/// its lease instead, the read reaching it before it runs again: whatever it answers, it is
/// not a view older than the new holder's ack.
#[test]
fn a_holder_whose_lease_ran_out_answers_no_view_older_than_the_new_holders() {
    let mut cluster = Cluster::private();
    let mut world = World::new(&mut cluster, 2, 1);
    world.apply(&sims(0, 0, &[0]), None).unwrap();
    world.settle().unwrap();
    // a opened the session and holds it; b takes it over while a is stopped, and acks its
    // result.
    let a = world.nodes[0].server.as_ref().unwrap();
    a.signal("-STOP");
    std::thread::sleep(Duration::from_millis(LEASE_MS + 1200));
    let path = "/v1/sessions/s0/boundary";
    let body = json!({"consumer": "b", "lease_ms": 5000});
    let env = match world.until_answered(1, "POST", path, Some(&body)) {
        Ok((200, env)) => env,
        other => panic!("no envelope through b: {other:?}"),
    };
    let claim = env["claim_id"].as_str().unwrap();
    let acked = request(
        &world.agent,
        &world.base(1),
        "POST",
        &format!("/v1/claims/{claim}/ack"),
        None,
    );
    assert!(matches!(acked, Ok((200, _))), "{acked:?}");
    // A read of the session sent to a while it is stopped, answered once it runs again.
    let base = world.base(0);
    let agent = world.agent.clone();
    let read = std::thread::spawn(move || request(&agent, &base, "GET", "/v1/sessions/s0", None));
    std::thread::sleep(Duration::from_millis(300));
    a.signal("-CONT");
    let read = read.join().unwrap();
    match read {
        Ok((200, view)) => assert_eq!(
            delivered_in(&view),
            items_of(&env).into_iter().map(|i| i.child).collect::<BTreeSet<_>>(),
            "a view older than the ack: {view}"
        ),
        Ok((503, _)) => {}
        other => panic!("{other:?}"),
    }
}

fn sims(session: usize, via: usize, ms: &[u64]) -> Op {
    Op::Delegate {
        session,
        via,
        sims: ms.to_vec(),
        fail: false,
        externals: 0,
        independent: true,
        rerun: true,
    }
}

fn take(session: usize, via: usize, ack_via: usize) -> Op {
    Op::Boundary {
        session,
        via,
        lease_ms: 5000,
        ack_via: Some(ack_via),
    }
}

/// The case the model found, as it found it: a database restart outlasting the lease, a
/// takeover, an ack through the new holder; then every process's view agrees.
#[test]
fn after_a_database_restart_longer_than_a_lease_every_process_shows_the_acks_of_the_new_holder() {
    let mut cluster = Cluster::private();
    let case = Case {
        processes: 3,
        sessions: 1,
        ops: vec![sims(0, 2, &[0, 50]), Op::DbRestart { down_ms: 1700 }, take(0, 2, 2)],
    };
    if let Err(e) = run(&mut cluster, "a database restart, a takeover, an ack", &case) {
        panic!("{e}");
    }
}
