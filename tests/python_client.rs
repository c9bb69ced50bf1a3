//! The Python client against the real `brood serve`: the binary on a free loopback port with a
//! temporary data folder, then `examples/python/parent_loop.py` (a parent woken by webhook that
//! must collect every child's result exactly once) and `clients/python/test_brood_client.py`
//! (error shapes, 401 on a keyed server, delegate → boundary → ack, a busy release, an external
//! worker polling, heartbeating and completing a child).
//!
//! Both need `python3` (3.8 or later, standard library only). Where it is missing these tests
//! fail and say so: a client that was never run is not a client that works.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one Python program may run before it is killed and the test fails.
const PYTHON_TIMEOUT: Duration = Duration::from_secs(25);

mod server;
use server::Server;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `python3`, or a failure that says it is missing.
fn python3() -> Command {
    match Command::new("python3").arg("--version").output() {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "python3 is on PATH but `python3 --version` failed ({}): the Python client tests need python3 \
             (3.8 or later; .ci/run installs it with apt)",
            out.status
        ),
        Err(e) => panic!(
            "python3 is missing ({e}): the Python client tests need python3 (3.8 or later; .ci/run \
             installs it with apt)"
        ),
    }
    let mut cmd = Command::new("python3");
    // No __pycache__ folders left in the source tree.
    cmd.env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    cmd
}

/// Runs a command to its end (killed after [`PYTHON_TIMEOUT`]); answers whether it exited 0,
/// and its stdout and stderr.
fn run(mut cmd: Command) -> (bool, String, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start python3");
    let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + PYTHON_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for python3") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (out, err) = (stdout.join().unwrap(), stderr.join().unwrap());
    match status {
        Some(s) => (s.success(), out, err),
        None => (
            false,
            out,
            format!("{err}\n(killed: still running after {PYTHON_TIMEOUT:?})"),
        ),
    }
}

#[test]
fn the_python_parent_loop_collects_every_result_exactly_once() {
    let mut cmd = python3();
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    cmd.arg(repo("examples/python/parent_loop.py")).args(["--url", &s.base]);
    let (ok, out, err) = run(cmd);
    assert!(ok, "parent_loop.py failed\n--- stdout\n{out}\n--- stderr\n{err}");
    assert!(out.contains("arrived exactly once"), "{out}");
    assert!(out.contains("[set 1 ·"), "the envelopes' text is printed: {out}");
}

#[test]
fn the_python_client_tests_pass_against_the_server() {
    let mut cmd = python3();
    let (open_dir, keyed_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let open = Server::start(open_dir.path(), None);
    let keyed = Server::start(keyed_dir.path(), Some("py-s3cret"));
    cmd.arg(repo("clients/python/test_brood_client.py"))
        .arg("-v")
        .env("BROOD_URL", &open.base)
        .env("BROOD_KEYED_URL", &keyed.base)
        .env("BROOD_API_KEY", "py-s3cret");
    let (ok, out, err) = run(cmd);
    // unittest reports on stderr.
    assert!(ok, "test_brood_client.py failed\n--- stdout\n{out}\n--- stderr\n{err}");
    assert!(
        !err.contains("skipped"),
        "every Python test must run, none skipped:\n{err}"
    );
}
