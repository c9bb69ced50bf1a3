//! The Python client (`clients/python`, the `brood_client` package) against the real `brood
//! serve`: its pytest suite (`clients/python/tests`, which starts this binary itself, named by
//! `BROOD_BIN`) and `examples/python/parent_loop.py` (a parent woken by webhook that must collect
//! every child's result exactly once) against a server started here.
//!
//! Both run with the interpreter named by `BROOD_TEST_PYTHON`, else the test environment's,
//! `.test-env/python/bin/python` (a venv with `pip install ./clients/python[test]`, made by
//! `.ci/test`). Where it is missing these tests fail and say so: a client that was never run is
//! not a client that works.

use std::io::Read as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod server;
use server::Server;

/// How long the pytest suite may run before it is killed and the test fails.
const SUITE_TIMEOUT: Duration = Duration::from_secs(300);
/// How long the example may run.
const EXAMPLE_TIMEOUT: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The test environment's Python, or a failure that says how to make it.
fn python() -> Command {
    let path = std::env::var_os("BROOD_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".test-env/python/bin/python"));
    assert!(
        path.is_file(),
        "no Python at {}: run `.ci/test` to make the test environment (a venv with \
         `pip install ./clients/python[test]`), or name a Python that has it in BROOD_TEST_PYTHON",
        path.display()
    );
    let mut cmd = Command::new(path);
    // No __pycache__ folders left in the source tree.
    cmd.env("PYTHONDONTWRITEBYTECODE", "1");
    cmd
}

/// Runs a command to its end (killed after `timeout`); answers whether it exited 0, and its
/// stdout and stderr.
fn run(mut cmd: Command, timeout: Duration) -> (bool, String, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start python");
    let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let stderr = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for python") {
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
        None => (false, out, format!("{err}\n(killed: still running after {timeout:?})")),
    }
}

#[test]
fn the_python_client_tests_pass_against_the_server() {
    let mut cmd = python();
    cmd.current_dir(repo().join("clients/python"))
        .args(["-m", "pytest", "-q", "tests"])
        .env("BROOD_BIN", env!("CARGO_BIN_EXE_brood"));
    let (ok, out, err) = run(cmd, SUITE_TIMEOUT);
    assert!(
        ok,
        "the Python client's tests failed\n--- stdout\n{out}\n--- stderr\n{err}"
    );
    assert!(
        out.contains(" passed") && !out.contains(" skipped"),
        "every Python test must run, none skipped:\n{out}"
    );
}

#[test]
fn the_python_parent_loop_collects_every_result_exactly_once() {
    let mut cmd = python();
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), None);
    cmd.current_dir(repo())
        .arg("examples/python/parent_loop.py")
        .args(["--url", &s.base]);
    let (ok, out, err) = run(cmd, EXAMPLE_TIMEOUT);
    assert!(ok, "parent_loop.py failed\n--- stdout\n{out}\n--- stderr\n{err}");
    assert!(out.contains("arrived exactly once"), "{out}");
    assert!(out.contains("[set 1 ·"), "the envelopes' text is printed: {out}");
}
