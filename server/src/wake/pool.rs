//! The delivery of webhook wakes: a few threads ([`THREADS`]) take wakes from the
//! [`Queues`], POST each over a plain TCP connection to an address the [`Policy`] allowed, and
//! hand a failed one back for its retry (no thread sleeps through a backoff). Which wakes are in
//! flight, which are parked for a slot, which are dropped, and how a later wake of a session
//! joins the one it has, is the queues' (see there): every wake is followed by a POST begun
//! after it, and a session is never POSTed more often than it is woken (DESIGN.md, I7).
//!
//! Each try resolves the host once, judges every address it resolves to, and connects only to
//! an allowed one; the try (resolving, connecting, writing and reading together) is bounded by
//! [`TIMEOUT`]. A name is resolved on a thread of its own that the try waits for no longer than
//! what is left of its time: a resolution that outlasts it is a failed try, and finishes on its
//! own, and while [`MAX_RESOLVERS`] resolutions run a try that needs one more fails without
//! starting it. Only a 2xx answer delivers: a redirect is a failed try, and is not followed.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs as _};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::queues::{Job, Queues, Settled, Submitted, ATTEMPTS, MAX_IN_FLIGHT, MAX_PARKED};
use super::target::{Host, Policy, WakeUrl};
use super::WakeCounts;

/// Threads delivering wakes.
pub(crate) const THREADS: usize = 4;
/// How long one try may take: resolving, connecting, writing the request and reading the
/// status line.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Host name resolutions running at most (those tries wait for, and those that outlasted
/// their try).
const MAX_RESOLVERS: usize = 16;
/// The longest status line read.
const MAX_STATUS_LINE: usize = 1024;

/// The delivery threads and their queues.
#[derive(Debug)]
pub(crate) struct Pool {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    queues: Mutex<Queues>,
    work: Condvar,
    policy: Policy,
    counts: WakeCounts,
    resolvers: Resolvers,
}

/// The host name resolutions running, each on a thread of its own.
#[derive(Debug)]
struct Resolvers {
    running: Arc<AtomicUsize>,
    limit: usize,
}

/// What became of one try.
#[derive(Debug)]
enum Outcome {
    Delivered,
    /// Every address the host stands for is refused by the policy, or the URL cannot be used.
    Refused(String),
    Failed(String),
}

impl Pool {
    /// Starts the delivery threads.
    pub(crate) fn start(policy: Policy, counts: WakeCounts) -> Pool {
        let shared = Arc::new(Shared {
            queues: Mutex::new(Queues::default()),
            work: Condvar::new(),
            policy,
            counts,
            resolvers: Resolvers::new(MAX_RESOLVERS),
        });
        for _ in 0..THREADS {
            let worker = shared.clone();
            let spawned = std::thread::Builder::new()
                .name("brood-wake".into())
                .spawn(move || worker.run());
            if let Err(e) = spawned {
                tracing::error!("could not start a wake delivery thread: {e}");
            }
        }
        Pool { shared }
    }

    /// Puts a wake of `session` (POST `body` to `url`) in flight, joins the one it has, or
    /// parks it until a slot frees.
    pub(crate) fn submit(&self, session: &str, url: &str, body: String) {
        let shared = &self.shared;
        let submitted = shared.lock().submit(session, url, body);
        match submitted {
            Submitted::Queued => shared.work.notify_one(),
            Submitted::Joined => {}
            Submitted::Parked => {
                shared.counts.parked.inc();
                tracing::debug!(
                    session = %brood::printable(session),
                    target = %shown(url),
                    "a wake waits for a slot: {MAX_IN_FLIGHT} wakes are in flight, or as many as one host may have"
                );
            }
            Submitted::Dropped => {
                shared.counts.dropped.inc();
                tracing::warn!(
                    session = %brood::printable(session),
                    "a wake was dropped: {MAX_PARKED} sessions' wakes wait for a slot already; the items stay ready"
                );
            }
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn run(&self) {
        loop {
            let job = self.next();
            let outcome = post(&self.policy, &self.resolvers, &job.url, &job.body);
            self.settle(&job, outcome);
        }
    }

    /// Waits for the next wake to try; marks it being tried.
    fn next(&self) -> Job {
        let mut q = self.lock();
        loop {
            let now = Instant::now();
            if let Some(job) = q.take(now) {
                return job;
            }
            q = match q.next_retry() {
                Some(at) => match self.work.wait_timeout(q, at.saturating_duration_since(now)) {
                    Ok((g, _)) => g,
                    Err(poisoned) => poisoned.into_inner().0,
                },
                None => self.work.wait(q).unwrap_or_else(|poisoned| poisoned.into_inner()),
            };
        }
    }

    /// Records what became of `job`'s try, counts and logs it.
    fn settle(&self, job: &Job, outcome: Outcome) {
        let failed = matches!(outcome, Outcome::Failed(_));
        let settled = self.lock().settle(&job.session, failed, Instant::now());
        // Another thread may be waiting without a deadline while a try now is pending.
        self.work.notify_one();
        let session = brood::printable(&job.session);
        let target = shown(&job.url);
        match outcome {
            Outcome::Delivered => {
                self.counts.delivered.inc();
            }
            Outcome::Refused(why) => {
                self.counts.refused.inc();
                tracing::warn!(%session, %target, "a wake was refused: {why}; the items stay ready");
            }
            Outcome::Failed(why) => {
                self.counts.failed_tries.inc();
                tracing::warn!(%session, attempt = job.tries, %target, "the wake could not be delivered: {why}");
            }
        }
        if settled == Settled::GivenUp {
            self.counts.given_up.inc();
            tracing::error!(%session, %target, "a wake was given up after {ATTEMPTS} attempts; the items stay ready");
        }
    }
}

/// `url` as logs show it: scheme, host and port.
fn shown(url: &str) -> String {
    WakeUrl::parse(url).map_or_else(|_| super::target::shown(url), |u| u.shown())
}

impl Resolvers {
    fn new(limit: usize) -> Resolvers {
        Resolvers {
            running: Arc::default(),
            limit,
        }
    }

    /// The addresses `name` resolves to at `port` by `resolve`, run on a thread of its own,
    /// waited for until `deadline` at most.
    fn resolve<F>(&self, name: &str, port: u16, deadline: Instant, resolve: F) -> Result<Vec<SocketAddr>, String>
    where
        F: FnOnce(&str, u16) -> std::io::Result<Vec<SocketAddr>> + Send + 'static,
    {
        let wait = left(deadline).map_err(|e| e.to_string())?;
        let limit = self.limit;
        if self
            .running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1))
            .is_err()
        {
            return Err(format!(
                "`{name}` was not resolved: {limit} resolutions are running already"
            ));
        }
        let running = Running(self.running.clone());
        let (answer, answered) = mpsc::channel();
        let owned = name.to_string();
        let spawned = std::thread::Builder::new()
            .name("brood-wake-dns".into())
            .spawn(move || {
                let _running = running;
                let _ = answer.send(resolve(&owned, port));
            });
        if let Err(e) = spawned {
            return Err(format!("`{name}` was not resolved: no thread to resolve it on ({e})"));
        }
        match answered.recv_timeout(wait) {
            Ok(Ok(found)) => Ok(found),
            Ok(Err(e)) => Err(format!("`{name}` could not be resolved: {e}")),
            Err(RecvTimeoutError::Timeout) => Err(format!("`{name}` was not resolved within {} s", TIMEOUT.as_secs())),
            Err(RecvTimeoutError::Disconnected) => Err(format!("`{name}` could not be resolved")),
        }
    }
}

/// One resolution running; ends with the thread that holds it.
struct Running(Arc<AtomicUsize>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The system's resolution of `name` at `port`.
fn system_resolve(name: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    Ok((name, port).to_socket_addrs()?.collect())
}

/// One try: POSTs `body` to `url` at an address the policy allows.
fn post(policy: &Policy, resolvers: &Resolvers, url: &str, body: &str) -> Outcome {
    let deadline = Instant::now() + TIMEOUT;
    let target = match WakeUrl::parse(url) {
        Ok(t) => t,
        Err(e) => return Outcome::Refused(format!("the wake_url {e}")),
    };
    if let Some(why) = policy.refuses_url(&target) {
        return Outcome::Refused(why);
    }
    let addresses: Vec<SocketAddr> = match &target.host {
        Host::Ip(ip) => vec![SocketAddr::new(*ip, target.port)],
        Host::Name(name) => match resolvers.resolve(name, target.port, deadline, system_resolve) {
            Ok(found) => found,
            Err(why) => return Outcome::Failed(why),
        },
    };
    let mut refusal = None;
    let allowed: Vec<SocketAddr> = addresses
        .into_iter()
        .filter(|a| match policy.refuses(&target.host, a.ip()) {
            None => true,
            Some(why) => {
                refusal.get_or_insert(why);
                false
            }
        })
        .collect();
    if allowed.is_empty() {
        return Outcome::Refused(refusal.unwrap_or_else(|| "the host resolves to no address".into()));
    }
    let mut last = String::new();
    for address in allowed {
        match try_at(&target, address, body, deadline) {
            Ok(status) if (200..300).contains(&status) => return Outcome::Delivered,
            Ok(status) if (300..400).contains(&status) => {
                return Outcome::Failed(format!(
                    "the receiver answered {status}, a redirect, which wakes do not follow"
                ))
            }
            Ok(status) => return Outcome::Failed(format!("the receiver answered {status}")),
            Err(e) => last = format!("{address}: {e}"),
        }
        if Instant::now() >= deadline {
            break;
        }
    }
    Outcome::Failed(last)
}

/// The time left before `deadline`, or a timeout error.
fn left(deadline: Instant) -> std::io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {} s", TIMEOUT.as_secs()),
        ));
    }
    Ok(left)
}

/// POSTs `body` to `target` at `address`; returns the answer's status.
fn try_at(target: &WakeUrl, address: SocketAddr, body: &str, deadline: Instant) -> std::io::Result<u16> {
    let mut stream = TcpStream::connect_timeout(&address, left(deadline)?)?;
    stream.set_nodelay(true)?;
    let request = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nUser-Agent: brood\r\nConnection: close\r\n\r\n{body}",
        target.target,
        target.host_header(),
        body.len()
    );
    stream.set_write_timeout(Some(left(deadline)?))?;
    stream.write_all(request.as_bytes())?;
    let mut line = Vec::with_capacity(64);
    let mut buf = [0u8; 256];
    while !line.contains(&b'\n') {
        if line.len() > MAX_STATUS_LINE {
            return Err(std::io::Error::other("the answer's status line is too long"));
        }
        stream.set_read_timeout(Some(left(deadline)?))?;
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the receiver closed the connection without an answer",
            ));
        }
        line.extend_from_slice(&buf[..n]);
    }
    status_of(&line).ok_or_else(|| std::io::Error::other("the answer does not begin with an HTTP status line"))
}

/// The status of an answer beginning `HTTP/1.x NNN`.
fn status_of(answer: &[u8]) -> Option<u16> {
    let line = answer.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.split(' ');
    parts.next().filter(|v| v.starts_with("HTTP/1."))?;
    parts.next()?.trim().parse().ok().filter(|s| (100..600).contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_line_gives_its_status() {
        assert_eq!(status_of(b"HTTP/1.1 204 No Content\r\n"), Some(204));
        assert_eq!(status_of(b"HTTP/1.0 302 Found\r\nlocation: x"), Some(302));
        assert_eq!(status_of(b"SSH-2.0-OpenSSH\r\n"), None);
        assert_eq!(status_of(b"HTTP/1.1 99999\r\n"), None);
    }

    use std::collections::VecDeque;
    use std::io::{BufRead as _, BufReader};
    use std::net::TcpListener;

    use super::super::queues::MAX_PER_HOST;

    /// Waits (up to 60 s) until `done` holds.
    fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done() {
            assert!(Instant::now() < deadline, "{what} did not happen within 60 s");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// What a [`Receiver`] answers: the statuses of `next` in turn, then `then` to every request
    /// (holding a request while it is `None`).
    #[derive(Default)]
    struct Script {
        next: VecDeque<u16>,
        then: Option<u16>,
        /// The session of each request, in the order they came.
        seen: Vec<String>,
    }

    /// A receiver on 127.0.0.1 answering as its script says, each connection on a thread of
    /// its own. A request is recorded in `seen` only once its status is chosen (or it is held).
    #[derive(Clone)]
    struct Receiver {
        url: String,
        script: Arc<(Mutex<Script>, Condvar)>,
    }

    impl Receiver {
        fn start(next: &[u16], then: Option<u16>) -> Receiver {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let url = format!("http://{}/wake", listener.local_addr().unwrap());
            let script = Arc::new((
                Mutex::new(Script {
                    next: next.iter().copied().collect(),
                    then,
                    seen: Vec::new(),
                }),
                Condvar::new(),
            ));
            let shared = script.clone();
            std::thread::spawn(move || {
                for stream in listener.incoming().flatten() {
                    let script = shared.clone();
                    std::thread::spawn(move || Receiver::answer(stream, &script));
                }
            });
            Receiver { url, script }
        }

        fn answer(mut stream: TcpStream, script: &(Mutex<Script>, Condvar)) {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut length = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                if line == "\r\n" {
                    break;
                }
            }
            let mut body = vec![0; length];
            if reader.read_exact(&mut body).is_err() {
                return;
            }
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let (lock, changed) = script;
            let mut s = lock.lock().unwrap();
            let mut status = s.next.pop_front().or(s.then);
            s.seen.push(body["session_id"].as_str().unwrap().to_string());
            while status.is_none() {
                s = changed.wait(s).unwrap();
                status = s.next.pop_front().or(s.then);
            }
            drop(s);
            let status = status.unwrap_or(500);
            let _ = write!(
                stream,
                "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            );
        }

        /// Answers as `next`, then `then`, from here on.
        fn script(&self, next: &[u16], then: Option<u16>) {
            let mut s = self.script.0.lock().unwrap();
            s.next = next.iter().copied().collect();
            s.then = then;
            self.script.1.notify_all();
        }

        fn seen(&self) -> Vec<String> {
            self.script.0.lock().unwrap().seen.clone()
        }
    }

    fn pool() -> (Pool, WakeCounts) {
        let counts = WakeCounts::default();
        let policy = Policy::new(&["127.0.0.1".to_string()]).unwrap();
        (Pool::start(policy, counts.clone()), counts)
    }

    fn body(session: &str) -> String {
        serde_json::json!({"session_id": session, "ready": 1}).to_string()
    }

    #[test]
    fn a_wake_beyond_the_in_flight_bound_is_delivered_once_a_slot_frees() {
        let (pool, counts) = pool();
        let held: Vec<Receiver> = (0..MAX_IN_FLIGHT / MAX_PER_HOST)
            .map(|_| Receiver::start(&[], None))
            .collect();
        for i in 0..MAX_IN_FLIGHT {
            let session = format!("s{i}");
            pool.submit(&session, &held[i % held.len()].url, body(&session));
        }
        let good = Receiver::start(&[], Some(204));
        pool.submit("late", &good.url, body("late"));
        assert_eq!(counts.dropped.get(), 0, "the wake beyond the bound was dropped");
        assert_eq!(counts.parked.get(), 1);
        for r in &held {
            r.script(&[], Some(204));
        }
        wait_until("the parked wake's POST", || good.seen().contains(&"late".to_string()));
    }

    #[test]
    fn a_receiver_that_fails_every_try_keeps_only_its_own_slots() {
        let (pool, counts) = pool();
        let bad = Receiver::start(&[], Some(503));
        for i in 0..MAX_IN_FLIGHT {
            let session = format!("b{i}");
            pool.submit(&session, &bad.url, body(&session));
        }
        let good = Receiver::start(&[], Some(204));
        pool.submit("good", &good.url, body("good"));
        assert_eq!(counts.dropped.get(), 0, "the other receiver's wake was dropped");
        assert_eq!(counts.parked.get(), (MAX_IN_FLIGHT - MAX_PER_HOST) as u64);
        wait_until("the other receiver's POST", || !good.seen().is_empty());
        assert_eq!(good.seen(), ["good"]);
    }

    /// Waits until `s`'s wake was delivered or given up; returns (delivered, given up).
    fn ended(counts: &WakeCounts) -> (u64, u64) {
        wait_until("the wake's end", || counts.delivered.get() + counts.given_up.get() >= 1);
        (counts.delivered.get(), counts.given_up.get())
    }

    #[test]
    fn a_wake_joining_a_retry_of_a_receiver_back_up_gets_every_try() {
        let (pool, counts) = pool();
        let r = Receiver::start(&[], Some(503));
        pool.submit("s", &r.url, body("s"));
        // Down for all tries but the last; the wake waits for that one.
        wait_until("all tries but the last", || {
            counts.failed_tries.get() == u64::from(ATTEMPTS - 1)
        });
        // Back up, but for one more failure: a new wake joins the waiting one.
        r.script(&[503], Some(204));
        pool.submit("s", &r.url, body("s"));
        assert_eq!(ended(&counts), (1, 0), "the new wake was given up after its first try");
    }

    #[test]
    fn a_wake_joining_a_try_that_fails_gets_every_try() {
        let (pool, counts) = pool();
        let tries = usize::try_from(ATTEMPTS).unwrap();
        let r = Receiver::start(&vec![503; tries - 2], None);
        pool.submit("s", &r.url, body("s"));
        wait_until("the try before the last being made", || r.seen().len() == tries - 1);
        pool.submit("s", &r.url, body("s"));
        // That try fails, and so does the next.
        r.script(&[503, 503], Some(204));
        assert_eq!(ended(&counts), (1, 0), "the new wake was given up after its first try");
    }

    fn address() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 9))
    }

    /// A resolver that answers once `gate` is sent to or dropped.
    fn gated() -> (
        mpsc::Sender<()>,
        impl FnOnce(&str, u16) -> std::io::Result<Vec<SocketAddr>> + Send + 'static,
    ) {
        let (open, gate) = mpsc::channel::<()>();
        let resolve = move |_: &str, _: u16| {
            let _ = gate.recv_timeout(Duration::from_secs(60));
            Ok(vec![address()])
        };
        (open, resolve)
    }

    #[test]
    fn a_resolution_that_outlasts_the_try_is_a_failed_try() {
        let resolvers = Resolvers::new(2);
        let (open, resolve) = gated();
        let deadline = Instant::now() + Duration::from_millis(100);
        let result = resolvers.resolve("slow.example", 80, deadline, resolve);
        let why = result.expect_err("the try waited for the resolution past its deadline");
        assert!(why.contains("not resolved within"), "{why}");
        drop(open);
        wait_until("the resolution's end", || resolvers.running.load(Ordering::SeqCst) == 0);
        let found = resolvers.resolve("fast.example", 80, Instant::now() + TIMEOUT, |_, _| Ok(vec![address()]));
        assert_eq!(found, Ok(vec![address()]));
    }

    #[test]
    fn resolutions_beyond_the_bound_are_not_started() {
        let resolvers = Resolvers::new(2);
        let mut gates = Vec::new();
        for _ in 0..2 {
            let (open, resolve) = gated();
            gates.push(open);
            let deadline = Instant::now() + Duration::from_millis(20);
            assert!(resolvers.resolve("slow.example", 80, deadline, resolve).is_err());
        }
        let started = Arc::new(AtomicUsize::new(0));
        let count = started.clone();
        let why = resolvers
            .resolve("third.example", 80, Instant::now() + TIMEOUT, move |_, _| {
                count.fetch_add(1, Ordering::SeqCst);
                Ok(vec![address()])
            })
            .expect_err("a third resolution ran beside two that outlasted their tries");
        assert!(why.contains("2 resolutions are running already"), "{why}");
        assert_eq!(started.load(Ordering::SeqCst), 0);
        drop(gates);
        wait_until("the resolutions' end", || resolvers.running.load(Ordering::SeqCst) == 0);
    }
}
