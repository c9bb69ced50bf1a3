//! The delivery of webhook wakes: a few threads ([`THREADS`]) take wakes from one queue, POST
//! each over a plain TCP connection to an address the [`Policy`] allowed, and put a failed one
//! on a delayed queue for its retry (no thread sleeps through a backoff). At most
//! [`MAX_IN_FLIGHT`] wakes are in flight (queued, being tried, or waiting for a retry); a wake
//! beyond them is dropped and counted. A session has at most one wake in flight: a later wake
//! of it joins that one (which then carries the newest ready count), and if that one's try had
//! already begun, it is tried again once that try is done — so every wake is followed by a POST
//! begun after it, and a session is never POSTed more often than it is woken (DESIGN.md, I7).
//!
//! Each try resolves the host once, judges every address it resolves to, and connects only to
//! an allowed one; the try (resolving, connecting, writing and reading together) is bounded by
//! [`TIMEOUT`]. A name is resolved on a thread of its own that the try waits for no longer than
//! what is left of its time: a resolution that outlasts it is a failed try, and finishes on its
//! own, and while [`MAX_RESOLVERS`] resolutions run a try that needs one more fails without
//! starting it. Only a 2xx answer delivers: a redirect is a failed try, and is not followed.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs as _};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::target::{Host, Policy, WakeUrl};
use super::WakeCounts;

/// Threads delivering wakes.
pub(crate) const THREADS: usize = 4;
/// Wakes in flight at most; a wake of another session beyond them is dropped.
pub(crate) const MAX_IN_FLIGHT: usize = 64;
/// Tries of one wake before it is given up.
const ATTEMPTS: u32 = 8;
/// The first retry's delay; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
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

/// The wakes in flight, by session, and the order they are tried in.
#[derive(Debug, Default)]
struct Queues {
    wakes: HashMap<String, InFlight>,
    /// Sessions whose wake waits for its first try.
    fresh: VecDeque<String>,
    /// Sessions whose wake's retry is due (tried after every fresh one).
    due: VecDeque<String>,
    /// Retries not yet due, earliest first.
    later: BinaryHeap<Reverse<(Instant, u64, String)>>,
    seq: u64,
}

/// One session's wake in flight.
#[derive(Debug)]
struct InFlight {
    url: String,
    body: String,
    /// Tries made so far.
    tries: u32,
    phase: Phase,
    /// Another wake came while a try was being made: try again after it, whatever it does.
    again: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Queued,
    Trying,
    Waiting,
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

    /// Puts a wake of `session` (POST `body` to `url`) in flight, or joins the one it has.
    pub(crate) fn submit(&self, session: &str, url: &str, body: String) {
        let shared = &self.shared;
        let mut q = shared.lock();
        if let Some(wake) = q.wakes.get_mut(session) {
            wake.url = url.to_string();
            wake.body = body;
            wake.again |= wake.phase == Phase::Trying;
            return;
        }
        if q.wakes.len() >= MAX_IN_FLIGHT {
            drop(q);
            shared.counts.dropped.inc();
            tracing::warn!(
                session = %crate::printable(session),
                "a wake was dropped: {MAX_IN_FLIGHT} wakes are in flight already; the items stay ready"
            );
            return;
        }
        q.wakes.insert(
            session.to_string(),
            InFlight {
                url: url.to_string(),
                body,
                tries: 0,
                phase: Phase::Queued,
                again: false,
            },
        );
        q.fresh.push_back(session.to_string());
        shared.check(&q);
        drop(q);
        shared.work.notify_one();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every wake in flight is in exactly the queue its phase says.
    fn check(&self, q: &Queues) {
        debug_assert!(q.wakes.len() <= MAX_IN_FLIGHT);
        debug_assert_eq!(
            q.fresh.len() + q.due.len(),
            q.wakes.values().filter(|w| w.phase == Phase::Queued).count()
        );
        debug_assert_eq!(
            q.later.len(),
            q.wakes.values().filter(|w| w.phase == Phase::Waiting).count()
        );
    }

    fn run(&self) {
        loop {
            let (session, url, body, tries) = self.next();
            let outcome = post(&self.policy, &self.resolvers, &url, &body);
            self.settle(&session, &url, tries, outcome);
        }
    }

    /// Waits for the next wake to try; marks it being tried.
    fn next(&self) -> (String, String, String, u32) {
        let mut guard = self.lock();
        loop {
            let now = Instant::now();
            let q = &mut *guard;
            while q.later.peek().is_some_and(|Reverse((at, _, _))| *at <= now) {
                let Some(Reverse((_, _, session))) = q.later.pop() else {
                    break;
                };
                if let Some(w) = q.wakes.get_mut(&session) {
                    w.phase = Phase::Queued;
                }
                q.due.push_back(session);
            }
            while let Some(session) = q.fresh.pop_front().or_else(|| q.due.pop_front()) {
                if let Some(w) = q.wakes.get_mut(&session) {
                    w.phase = Phase::Trying;
                    w.tries += 1;
                    let job = (session, w.url.clone(), w.body.clone(), w.tries);
                    self.check(q);
                    return job;
                }
            }
            let wait = q
                .later
                .peek()
                .map(|Reverse((at, _, _))| at.saturating_duration_since(now));
            guard = match wait {
                Some(d) => match self.work.wait_timeout(guard, d) {
                    Ok((g, _)) => g,
                    Err(poisoned) => poisoned.into_inner().0,
                },
                None => self.work.wait(guard).unwrap_or_else(|poisoned| poisoned.into_inner()),
            };
        }
    }

    /// Records what became of a try of `session`'s wake (to `url`, its `tries`th).
    fn settle(&self, session: &str, url: &str, tries: u32, outcome: Outcome) {
        let shown = WakeUrl::parse(url).map_or_else(|_| super::target::shown(url), |u| u.shown());
        let mut guard = self.lock();
        let q = &mut *guard;
        let Some(wake) = q.wakes.get_mut(session) else { return };
        let again = std::mem::take(&mut wake.again);
        let retry = match outcome {
            Outcome::Delivered => {
                self.counts.delivered.inc();
                false
            }
            Outcome::Refused(why) => {
                self.counts.refused.inc();
                tracing::warn!(session = %crate::printable(session), target = %shown, "a wake was refused: {why}; the items stay ready");
                false
            }
            Outcome::Failed(why) => {
                self.counts.failed_tries.inc();
                tracing::warn!(session = %crate::printable(session), attempt = tries, target = %shown, "the wake could not be delivered: {why}");
                if tries >= ATTEMPTS {
                    self.counts.given_up.inc();
                    tracing::error!(
                        session = %crate::printable(session),
                        target = %shown,
                        "a wake was given up after {ATTEMPTS} attempts; the items stay ready"
                    );
                }
                tries < ATTEMPTS
            }
        };
        if retry {
            // The retry carries the wake that came meanwhile.
            wake.phase = Phase::Waiting;
            let at = Instant::now() + backoff(tries);
            q.seq += 1;
            let seq = q.seq;
            q.later.push(Reverse((at, seq, session.to_string())));
        } else if again {
            wake.phase = Phase::Queued;
            wake.tries = 0;
            q.fresh.push_back(session.to_string());
        } else {
            q.wakes.remove(session);
        }
        self.check(q);
        drop(guard);
        // Another thread may be waiting without a deadline while a retry now is pending.
        self.work.notify_one();
    }
}

/// The delay before the retry that follows failed try `tries`.
fn backoff(tries: u32) -> Duration {
    FIRST_BACKOFF
        .saturating_mul(1 << tries.saturating_sub(1).min(16))
        .min(MAX_BACKOFF)
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
    fn backoff_doubles_from_100_ms_up_to_10_s() {
        let ms: Vec<u128> = (1..=8).map(|t| backoff(t).as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1600, 3200, 6400, 10_000]);
        assert_eq!(backoff(40), MAX_BACKOFF);
    }

    #[test]
    fn a_status_line_gives_its_status() {
        assert_eq!(status_of(b"HTTP/1.1 204 No Content\r\n"), Some(204));
        assert_eq!(status_of(b"HTTP/1.0 302 Found\r\nlocation: x"), Some(302));
        assert_eq!(status_of(b"SSH-2.0-OpenSSH\r\n"), None);
        assert_eq!(status_of(b"HTTP/1.1 99999\r\n"), None);
    }

    /// Waits (up to 60 s) until `done` holds.
    fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done() {
            assert!(Instant::now() < deadline, "{what} did not happen within 60 s");
            std::thread::sleep(Duration::from_millis(10));
        }
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
