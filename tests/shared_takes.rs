//! Takes between processes sharing a ledger: a worker's poll at one process takes a child the
//! shared work list says waits at another, and asks that process for it
//! (`POST /v1/workers/take`, `POST /v1/workers/untake`). What becomes of the child when the
//! poll is cancelled meanwhile, when the holder stalls or answers with a fault.

mod server;

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server::{psql, Server};

/// The tenure time the tests run with.
const TENURE_MS: &str = "2000";

fn node(dir: &Path, url: &str, name: &str) -> Server {
    Server::node(dir, url, name, TENURE_MS)
}

/// Node `b`, serving a take 1.5 s after it was asked for it (once).
fn stalling_node(dir: &Path, url: &str) -> Server {
    node_b_failing(dir, url, "take_stall=1")
}

/// Node `b`, failing to read the shared work list's clock for its first take with a deadline.
fn clockless_node(dir: &Path, url: &str) -> Server {
    node_b_failing(dir, url, "work_clock_read=1")
}

/// Node `b`, with the fault points `points` armed (`BROOD_FAILPOINTS`).
fn node_b_failing(dir: &Path, url: &str, points: &str) -> Server {
    let b_dir = dir.join("b");
    std::fs::create_dir_all(&b_dir).unwrap();
    Server::start_env(
        &b_dir,
        None,
        &["--ledger", url, "--node", "b", "--session-lease-ms", TENURE_MS],
        &[("BROOD_FAILPOINTS", points)],
    )
}

/// Waits until the shared work list holds `n` rows.
fn until_listed(url: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while psql(url, "SELECT count(*) FROM brood.work_directory") != n.to_string() {
        assert!(Instant::now() < deadline, "the list never held {n} children");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `n` children in the shared work list are takeable (a child a poll took is
/// hidden while the poll asks its process for it).
fn until_takeable(url: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let takeable = "SELECT count(*) FROM brood.work_directory WHERE posted_at <= now()";
    while psql(url, takeable) != n.to_string() {
        assert!(Instant::now() < deadline, "the list never held {n} takeable children");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until no child in the shared work list is takeable: a poll took the one listed.
fn until_taken(url: &str) {
    until_takeable(url, 0);
}

/// Delegates `n` external children (queue `gpu`) to session `x`, served by `b`, and waits until
/// they are listed in the shared work list; their ids.
fn listed_at(b: &Server, url: &str, n: usize) -> Vec<String> {
    let task = json!({"goal": "render", "runner": {"kind": "external", "queue": "gpu"}});
    tasks_listed_at(b, url, vec![task; n])
}

/// Delegates `tasks` to session `x`, served by `b`, and waits until as many children are listed
/// in the shared work list; their ids.
fn tasks_listed_at(b: &Server, url: &str, tasks: Vec<Value>) -> Vec<String> {
    b.open("x");
    let n = tasks.len();
    let (status, reply) = b.call("POST", "/v1/sessions/x/delegate", Some(json!({"tasks": tasks})));
    assert_eq!(status, 202, "{reply}");
    until_listed(url, n);
    (0..n)
        .map(|i| format!("{}.{i}", reply["call_id"].as_str().unwrap()))
        .collect()
}

/// Nodes `names` sharing `url`, with tenures long enough that the second (`b`) keeps its session
/// through a pause: `b` serves session `x` with one child listed in the shared work list, and is
/// paused (`SIGSTOP`). The nodes, and the child's id.
fn paused_holder<const N: usize>(dir: &Path, url: &str, names: [&str; N]) -> ([Server; N], String) {
    let nodes = names.map(|name| Server::node(dir, url, name, "20000"));
    let child = listed_at(&nodes[1], url, 1).remove(0);
    nodes[1].signal("-STOP");
    (nodes, child)
}

/// A poll of queue `gpu` at `s`, waiting up to `wait_ms`, holding the child for `lease_ms`.
fn poll_gpu(s: &Server, wait_ms: u64, lease_ms: u64) -> (u16, Value) {
    s.call(
        "POST",
        "/v1/workers/poll",
        Some(json!({"worker": "w", "queue": "gpu", "wait_ms": wait_ms, "lease_ms": lease_ms})),
    )
}

/// How a worker hangs up.
#[derive(Clone, Copy)]
enum HangUp {
    /// It closes its connection (a FIN: it sends nothing more).
    Close,
    /// It resets its connection (an RST).
    Reset,
}

/// A worker polls `a` (with ten minutes' hold) for a child listed by `b`, and hangs up while
/// `a` asks `b` for it, well before `b` serves the take: the child must not be held by the take
/// nobody got. Once `b` would have served it, a worker polling `b` gets it.
fn a_worker_hangs_up_while_its_poll_asks_another_process(hang_up: HangUp) {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let a = node(dir.path(), &url, "a");
    let b = stalling_node(dir.path(), &url);
    let child = listed_at(&b, &url, 1).remove(0);
    let body = json!({"worker": "w", "queue": "gpu", "wait_ms": 5000, "lease_ms": 600_000}).to_string();
    let mut stream = TcpStream::connect(("127.0.0.1", a.port())).unwrap();
    write!(
        stream,
        "POST /v1/workers/poll HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // The child is hidden from the other pollers when a asks b for it.
    until_taken(&url);
    std::thread::sleep(Duration::from_millis(300));
    if let HangUp::Reset = hang_up {
        use std::os::fd::AsRawFd as _;
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: a valid socket and a `linger` of the size given.
        let set = unsafe {
            libc::setsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        assert_eq!(set, 0, "SO_LINGER");
    }
    drop(stream);
    std::thread::sleep(Duration::from_millis(2500));
    let (status, work) = poll_gpu(&b, 20_000, 30_000);
    assert_eq!(status, 200, "the child is held by a take nobody got: {work}");
    assert_eq!(work["child_id"], child);
}

#[test]
fn a_poll_its_worker_reset_while_asking_another_process_leaves_the_child_waiting() {
    a_worker_hangs_up_while_its_poll_asks_another_process(HangUp::Reset);
}

#[test]
fn a_poll_its_worker_closed_while_asking_another_process_leaves_the_child_waiting() {
    a_worker_hangs_up_while_its_poll_asks_another_process(HangUp::Close);
}

#[test]
fn a_poll_its_worker_closed_while_waiting_hands_it_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let b = node(dir.path(), &url, "b");
    b.open("x");
    // A worker polls b (with ten minutes' hold), and hangs up while its poll waits.
    let body = json!({"worker": "w", "queue": "gpu", "wait_ms": 20_000, "lease_ms": 600_000}).to_string();
    let mut stream = TcpStream::connect(("127.0.0.1", b.port())).unwrap();
    write!(
        stream,
        "POST /v1/workers/poll HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    drop(stream);
    std::thread::sleep(Duration::from_millis(300));
    // A child queued now is not handed to the poll of a worker gone.
    let task = json!({"goal": "render", "runner": {"kind": "external", "queue": "gpu"}});
    let (status, reply) = b.call("POST", "/v1/sessions/x/delegate", Some(json!({"tasks": [task]})));
    assert_eq!(status, 202, "{reply}");
    let (status, work) = poll_gpu(&b, 20_000, 30_000);
    assert_eq!(status, 200, "the child was handed to a worker that hung up: {work}");
    assert_eq!(work["child_id"], format!("{}.0", reply["call_id"].as_str().unwrap()));
}

#[test]
fn a_take_asked_again_of_a_holder_that_stalled_is_answered_with_its_own_child() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let a = node(dir.path(), &url, "a");
    let b = stalling_node(dir.path(), &url);
    let children = listed_at(&b, &url, 2);
    // a asks b for the first listed child and gives up before b serves the take (it is listed
    // again, a little later); a asks b at once for the other one.
    let (status, reply) = poll_gpu(&a, 0, 30_000);
    assert_eq!(status, 204, "{reply}");
    let (status, work) = poll_gpu(&a, 5_000, 30_000);
    let mut got = Vec::new();
    if status == 200 {
        got.push(work);
    } else {
        assert_eq!(status, 204, "{work}");
    }
    // Every child is handed out, once, each with its own token: none answered with another
    // take's answer.
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < 2 {
        assert!(Instant::now() < deadline, "not every child was handed out: {got:?}");
        let (status, work) = poll_gpu(&a, 5_000, 30_000);
        match status {
            200 => got.push(work),
            204 => {}
            s => panic!("poll answered {s}: {work}"),
        }
    }
    let mut ids: Vec<String> = got
        .iter()
        .map(|w| w["child_id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    let mut expected = children.clone();
    expected.sort();
    assert_eq!(ids, expected, "each child handed out once");
    for w in &got {
        let id = w["child_id"].as_str().unwrap();
        let (status, beat) = a.call(
            "POST",
            &format!("/v1/children/{id}/heartbeat"),
            Some(json!({"token": w["token"]})),
        );
        assert_eq!(status, 200, "{id}'s token does not hold it: {beat}");
    }
}

#[test]
fn a_take_of_a_paused_holder_is_given_up_and_the_child_waits_once_it_wakes() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let ([a, b], child) = paused_holder(dir.path(), &url, ["a", "b"]);
    // b is paused (well inside its tenure): a's poll asks it for the child (with ten minutes'
    // hold), gives up, and tells it so, in vain as well.
    let (status, reply) = poll_gpu(&a, 0, 600_000);
    assert_eq!(status, 204, "{reply}");
    // Listed again, takeable by a later poll.
    until_takeable(&url, 1);
    // Past the wait of the untake too.
    std::thread::sleep(Duration::from_millis(2500));
    b.signal("-CONT");
    // b reads the take and the untake once it wakes: the child is not held by the take
    // nobody got, and a worker polling either process gets it.
    let (status, work) = poll_gpu(&a, 20_000, 30_000);
    assert_eq!(status, 200, "the child is held by a take nobody got: {work}");
    assert_eq!(work["child_id"], child);
}

#[test]
fn a_take_of_a_paused_holder_whose_asker_was_killed_meanwhile_is_refused_and_the_child_waits() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let ([a, b, c], child) = paused_holder(dir.path(), &url, ["a", "b", "c"]);
    // b is paused: a's poll (waiting 2 s, for a ten minutes' hold) takes the child off the list
    // and asks b for it; a is killed while it waits, so b is never told the take was given up,
    // and nobody lists the child again.
    std::thread::scope(|scope| {
        let asking = scope.spawn(|| poll_gpu(&a, 2_000, 600_000));
        until_taken(&url);
        std::thread::sleep(Duration::from_millis(300));
        a.signal("-KILL");
        let _ = asking.join();
    });
    // Past the take's deadline (the 2.5 s a waited for the answer), b wakes and reads the take:
    // refused, the child is neither held for a take nobody waits for nor left off the list, and
    // a worker polling another process gets it.
    std::thread::sleep(Duration::from_millis(3_500));
    b.signal("-CONT");
    std::thread::sleep(Duration::from_millis(1_000));
    let (status, work) = poll_gpu(&c, 20_000, 30_000);
    assert_eq!(
        status, 200,
        "the child is held by a take nobody waits for, or listed nowhere: {work}"
    );
    assert_eq!(work["child_id"], child);
}

#[test]
fn a_take_read_after_its_answer_by_time_hands_nothing_out() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let b = node(dir.path(), &url, "b");
    let child = listed_at(&b, &url, 1).remove(0);
    let take = |answer_by_ms: Value| {
        b.call(
            "POST",
            "/v1/workers/take",
            Some(json!({"child_id": child, "worker": "w", "lease_ms": 600_000,
                        "take_id": format!("t-{answer_by_ms}"), "answer_by_ms": answer_by_ms})),
        )
    };
    // One read after its time: refused, and nothing is handed out.
    let (status, reply) = take(json!(1_000));
    assert_eq!(status, 409, "{reply}");
    assert_eq!(reply["error"]["code"], "take_expired", "{reply}");
    let (status, reply) = take(json!("soon"));
    assert_eq!(status, 400, "a time that is no number: {reply}");
    let (status, reply) = b.call(
        "POST",
        "/v1/workers/take",
        Some(json!({"child_id": child, "worker": "w", "lease_ms": 600_000, "answer_by_ms": 1_000})),
    );
    assert_eq!(status, 409, "a late take without a take id: {reply}");
    // One read in time is served (the database's clock is far from the year 2400).
    let (status, work) = take(json!(13_569_465_600_000u64));
    assert_eq!(status, 200, "{work}");
    assert_eq!(work["child_id"], child);
}

#[test]
fn a_take_of_a_paused_holder_whose_asker_stopped_meanwhile_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let ([a, b], child) = paused_holder(dir.path(), &url, ["a", "b"]);
    let body = json!({"worker": "w", "queue": "gpu", "wait_ms": 2_000, "lease_ms": 600_000}).to_string();
    let mut stream = TcpStream::connect(("127.0.0.1", a.port())).unwrap();
    write!(
        stream,
        "POST /v1/workers/poll HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    until_taken(&url);
    std::thread::sleep(Duration::from_millis(300));
    // a stops for good as far as b can tell (its host gone): its connection to b stays open,
    // and it never tells b that it gave the take up.
    a.signal("-STOP");
    std::thread::sleep(Duration::from_millis(3_500));
    b.signal("-CONT");
    std::thread::sleep(Duration::from_millis(1_000));
    let (status, work) = poll_gpu(&b, 20_000, 30_000);
    assert_eq!(status, 200, "the child is held by a take nobody waits for: {work}");
    assert_eq!(work["child_id"], child);
    drop(stream);
}

#[test]
fn a_take_handed_out_after_its_answer_by_time_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    // b serves a take 1.5 s after it read it (and checked its time): a pause between the two.
    let b = stalling_node(dir.path(), &url);
    let child = listed_at(&b, &url, 1).remove(0);
    // An asker takes the child off the list, waiting 500 ms for the answer (a poll with
    // `wait_ms` 0), and dies before it can give the take up.
    let now: u64 = psql(
        &url,
        "DELETE FROM brood.work_directory; SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8",
    )
    .lines()
    .last()
    .unwrap()
    .parse()
    .unwrap();
    let (status, reply) = b.call(
        "POST",
        "/v1/workers/take",
        Some(json!({"child_id": child, "worker": "w", "lease_ms": 600_000,
                    "take_id": "t1", "answer_by_ms": now + 500})),
    );
    assert_eq!(status, 409, "handed out ~1 s after its asker stopped waiting: {reply}");
    let (status, work) = poll_gpu(&b, 5_000, 30_000);
    assert_eq!(status, 200, "the child is held by a take nobody waits for: {work}");
}

#[test]
fn a_take_whose_deadline_cannot_be_checked_hands_nothing_out_and_lists_the_child_again() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let b = clockless_node(dir.path(), &url);
    let child = listed_at(&b, &url, 1).remove(0);
    // An asker took the child off the list; b cannot read the database's clock to check its time.
    psql(&url, "DELETE FROM brood.work_directory");
    let (status, reply) = b.call(
        "POST",
        "/v1/workers/take",
        Some(json!({"child_id": child, "worker": "w", "lease_ms": 600_000,
                    "take_id": "t1", "answer_by_ms": 13_569_465_600_000u64})),
    );
    assert_eq!(status, 503, "{reply}");
    assert_eq!(reply["error"]["code"], "ledger_unavailable", "{reply}");
    // Listed again, and not held: a worker polling gets it.
    until_takeable(&url, 1);
    let (status, work) = poll_gpu(&b, 5_000, 30_000);
    assert_eq!(status, 200, "{work}");
    assert_eq!(work["child_id"], child);
}

/// A take its holder refused as late (409 `take_expired`, as a holder answers a take that
/// reached it after its asker's time while the asker still waited): the child still waits
/// there, so it is listed again, and the take is given up.
#[test]
fn a_take_refused_as_expired_lists_the_child_again_and_is_given_up() {
    a_faulty_answer_relists_the_child_and_untakes(Answer::Expired, Untakes::Answered);
}

#[test]
fn a_take_of_a_holder_restarted_at_its_address_is_answered_by_the_new_process() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let a = node(dir.path(), &url, "a");
    let b = node(dir.path(), &url, "b");
    // a takes a child of b's, over a connection it keeps.
    let first = listed_at(&b, &url, 1).remove(0);
    let (status, work) = poll_gpu(&a, 5_000, 30_000);
    assert_eq!(status, 200, "{work}");
    assert_eq!(work["child_id"], first);
    // b is killed and started again on its port; a child of a new session is listed there.
    let port = b.port();
    b.kill9();
    let b = Server::node_on(dir.path(), &url, "b", TENURE_MS, port);
    b.open("y");
    let task = json!({"goal": "render", "runner": {"kind": "external", "queue": "gpu"}});
    let (status, reply) = b.call("POST", "/v1/sessions/y/delegate", Some(json!({"tasks": [task]})));
    assert_eq!(status, 202, "{reply}");
    let second = format!("{}.0", reply["call_id"].as_str().unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    while psql(
        &url,
        &format!("SELECT count(*) FROM brood.work_directory WHERE child_id = '{second}'"),
    ) != "1"
    {
        assert!(Instant::now() < deadline, "the child was never listed");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Asked at once (a poll that waits for nothing): answered by the new process, never from
    // the connection to the killed one.
    let (status, work) = poll_gpu(&a, 0, 30_000);
    assert_eq!(status, 200, "{work}");
    assert_eq!(work["child_id"], second);
    let (status, beat) = a.call(
        "POST",
        &format!("/v1/children/{second}/heartbeat"),
        Some(json!({"token": work["token"]})),
    );
    assert_eq!(status, 200, "{beat}");
}

/// What a fake holder answers a take.
#[derive(Clone, Copy)]
enum Answer {
    Status500,
    /// 200 with a body longer than any answer is read.
    Huge,
    /// 200 with a body that is no work item.
    Malformed,
    /// 409 `take_expired`.
    Expired,
}

/// The requests a fake holder was sent: path and JSON body of each.
type Heard = Arc<Mutex<Vec<(String, Value)>>>;

/// What a fake holder answers the untakes it is sent.
#[derive(Clone, Copy)]
enum Untakes {
    /// 204.
    Answered,
    /// It hangs up without an answer on the first so many, then answers 204.
    HungUpOn(usize),
    /// 401, as a process that takes another peer key.
    Refused,
}

impl Untakes {
    /// How many untakes the fake holder is sent in all, once its process is done telling it.
    fn sent(self) -> usize {
        match self {
            Untakes::Answered | Untakes::Refused => 1,
            Untakes::HungUpOn(n) => n + 1,
        }
    }
}

/// A process that is not brood listening on loopback, answering every take with `answer`, every
/// untake as `untakes` says and every other request with 204; its address and the paths and
/// bodies of what it was sent.
fn fake_holder(answer: Answer, untakes: Untakes) -> (String, Heard) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let heard = Arc::new(Mutex::new(Vec::new()));
    let log = heard.clone();
    let unanswered = match untakes {
        Untakes::HungUpOn(n) => n,
        Untakes::Answered | Untakes::Refused => 0,
    };
    let unanswered = Arc::new(std::sync::atomic::AtomicUsize::new(unanswered));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let (log, unanswered) = (log.clone(), unanswered.clone());
            std::thread::spawn(move || serve_fake(stream, answer, untakes, &log, &unanswered));
        }
    });
    (address, heard)
}

fn serve_fake(
    stream: TcpStream,
    answer: Answer,
    untakes: Untakes,
    log: &Mutex<Vec<(String, Value)>>,
    unanswered: &std::sync::atomic::AtomicUsize,
) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut out = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split(' ').nth(1).unwrap_or("").to_string();
        let mut length = 0;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            if h == "\r\n" {
                break;
            }
            if let Some((name, value)) = h.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        log.lock()
            .unwrap()
            .push((path.clone(), serde_json::from_slice(&body).unwrap_or(Value::Null)));
        let hang_up =
            path == "/v1/workers/untake" && unanswered.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok();
        if hang_up {
            return;
        }
        let reply = if path == "/v1/workers/take" {
            match answer {
                Answer::Status500 => "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n".to_string(),
                Answer::Huge => {
                    // The head says 100 MiB; the body never comes whole.
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 104857600\r\n\r\n{\"child_id\":"
                        .to_string()
                }
                Answer::Expired => {
                    let body = r#"{"error":{"code":"take_expired","message":"late"}}"#;
                    format!(
                        "HTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    )
                }
                Answer::Malformed => {
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\nnot json!"
                        .to_string()
                }
            }
        } else if path == "/v1/workers/untake" && matches!(untakes, Untakes::Refused) {
            "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n".to_string()
        } else {
            "HTTP/1.1 204 No Content\r\n\r\n".to_string()
        };
        if out.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// A child listed as waiting at a fake holder answering `answer` (and its untakes as `untakes`
/// says), asked for through `a`: the poll answers nothing, the child is listed again, and the
/// fake holder is told that the take was given up until it answers (or refuses it), and no
/// more.
fn a_faulty_answer_relists_the_child_and_untakes(answer: Answer, untakes: Untakes) {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let a = node(dir.path(), &url, "a");
    let (address, heard) = fake_holder(answer, untakes);
    psql(
        &url,
        &format!(
            "INSERT INTO brood.work_directory (child_id, queue, address, posted_at) VALUES ('call_f.0', 'gpu', '{address}', now())"
        ),
    );
    let (status, reply) = poll_gpu(&a, 0, 30_000);
    assert_eq!(status, 204, "{reply}");
    // Listed again (takeable by a later poll) at the same address.
    let deadline = Instant::now() + Duration::from_secs(20);
    while psql(
        &url,
        "SELECT address FROM brood.work_directory WHERE child_id = 'call_f.0' AND posted_at <= now()",
    ) != address
    {
        assert!(Instant::now() < deadline, "the child was not listed again");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Told that the take was given up, naming it.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = heard.lock().unwrap().clone();
        let take = log
            .iter()
            .find(|(p, _)| p == "/v1/workers/take")
            .expect("asked for the take");
        let told: Vec<&Value> = log
            .iter()
            .filter(|(p, _)| p == "/v1/workers/untake")
            .map(|(_, body)| body)
            .collect();
        if told.len() >= untakes.sent() {
            for untake in told {
                assert_eq!(untake["child_id"], "call_f.0", "{untake}");
                assert_eq!(untake["take_id"], take.1["take_id"], "{untake}");
            }
            break;
        }
        assert!(Instant::now() < deadline, "no untake answered: {log:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // And told no more (a try more would come within 2 s).
    std::thread::sleep(Duration::from_secs(3));
    let log = heard.lock().unwrap().clone();
    let told = log.iter().filter(|(p, _)| p == "/v1/workers/untake").count();
    assert_eq!(told, untakes.sent(), "{log:?}");
}

#[test]
fn a_take_answered_500_lists_the_child_again_and_is_given_up() {
    a_faulty_answer_relists_the_child_and_untakes(Answer::Status500, Untakes::Answered);
}

#[test]
fn a_take_answered_with_more_than_is_read_lists_the_child_again_and_is_given_up() {
    a_faulty_answer_relists_the_child_and_untakes(Answer::Huge, Untakes::Answered);
}

#[test]
fn a_take_answered_with_no_work_item_lists_the_child_again_and_is_given_up() {
    a_faulty_answer_relists_the_child_and_untakes(Answer::Malformed, Untakes::Answered);
}

#[test]
fn a_give_up_its_holder_hung_up_on_is_told_again_until_it_answers() {
    a_faulty_answer_relists_the_child_and_untakes(Answer::Status500, Untakes::HungUpOn(2));
}

#[test]
fn a_give_up_its_holder_refuses_is_told_once() {
    a_faulty_answer_relists_the_child_and_untakes(Answer::Status500, Untakes::Refused);
}

/// A child hidden by a poll whose process died (it took the child and never asked for it) is
/// handed to a poll already waiting at another process once it is takeable again: nobody tells
/// of that, and the waiting poll looks again by itself then.
#[test]
fn a_poll_waiting_elsewhere_gets_a_child_a_dead_poller_hid_once_it_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let a = node(dir.path(), &url, "a");
    let b = node(dir.path(), &url, "b");
    let child = listed_at(&b, &url, 1).remove(0);
    // As a poll that took it and died leaves it: hidden for a while.
    psql(
        &url,
        "UPDATE brood.work_directory SET posted_at = now() + interval '2 seconds'",
    );
    let (status, work) = poll_gpu(&a, 15_000, 30_000);
    assert_eq!(status, 200, "the child never came back to the waiting poll: {work}");
    assert_eq!(work["child_id"], child);
}

/// The external children of the sessions a process recovers as it starts (queued before its
/// work list is there) are listed for the other processes' workers too.
#[test]
fn children_recovered_as_a_process_starts_are_listed() {
    let dir = tempfile::tempdir().unwrap();
    let url = brood_actors::ledger::pg_testkit::fresh_database();
    let b = node(dir.path(), &url, "b");
    // Safe to run again: recovered, it is queued anew.
    let task = json!({"goal": "render", "rerun_on_recovery": true, "runner": {"kind": "external", "queue": "gpu"}});
    let child = tasks_listed_at(&b, &url, vec![task]).remove(0);
    b.kill9();
    // Once its heartbeat ran out, b started again takes its session back as it starts, on
    // another port, and runs the child again (queued while b is slow to list its queues).
    std::thread::sleep(Duration::from_millis(2_500));
    let b = node_b_failing(dir.path(), &url, "share_stall=1");
    let a = node(dir.path(), &url, "a");
    let (status, work) = poll_gpu(&a, 15_000, 30_000);
    assert_eq!(status, 200, "the recovered child is not listed: {work}");
    assert_eq!(work["child_id"], child);
    drop(b);
}
