//! The Python client (`clients/python`, the `brood_client` package) against the real `brood
//! serve`: its pytest suite (`clients/python/tests`, which starts this binary itself, named by
//! `BROOD_BIN`) and `examples/python/parent_loop.py` (a parent woken by webhook that must collect
//! every child's result exactly once) against a server started here.
//!
//! The suite's tests of several processes on one database (the client following the holder
//! hint) get empty PostgreSQL databases of the test server (`pg_testkit`), their addresses in
//! `BROOD_TEST_PG_DATABASES`, space-separated; without it those tests fail.
//!
//! Both run with the interpreter named by `BROOD_TEST_PYTHON`, else the test environment's,
//! `.test-env/python/bin/python` (a venv with `pip install ./clients/python[test]`, made by
//! `.ci/test`). Where it is missing these tests fail and say so: a client that was never run is
//! not a client that works.

use std::process::Command;
use std::time::Duration;

mod server;
mod subprocess;
use server::Server;
use subprocess::{databases, repo, run, test_python, DATABASES_VAR};

/// How long the pytest suite may run before it is killed and the test fails.
const SUITE_TIMEOUT: Duration = Duration::from_secs(300);
/// How long the example may run.
const EXAMPLE_TIMEOUT: Duration = Duration::from_secs(60);

/// How many empty databases the suite is given.
const PYTHON_DATABASES: usize = 3;

/// The test environment's Python, writing no `__pycache__` folders into the source tree.
fn python() -> Command {
    let mut cmd = Command::new(test_python());
    cmd.env("PYTHONDONTWRITEBYTECODE", "1");
    cmd
}

#[test]
fn the_python_client_tests_pass_against_the_server() {
    let mut cmd = python();
    cmd.current_dir(repo("clients/python"))
        .args(["-m", "pytest", "-q", "tests"])
        .env("BROOD_BIN", env!("CARGO_BIN_EXE_brood"))
        .env(DATABASES_VAR, databases(PYTHON_DATABASES));
    let done = run(cmd, "python", SUITE_TIMEOUT);
    let (out, err) = (&done.stdout, &done.stderr);
    assert!(
        done.ok(),
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
    cmd.current_dir(repo(""))
        .arg("examples/python/parent_loop.py")
        .args(["--url", &s.base]);
    let done = run(cmd, "python", EXAMPLE_TIMEOUT);
    let (out, err) = (&done.stdout, &done.stderr);
    assert!(done.ok(), "parent_loop.py failed\n--- stdout\n{out}\n--- stderr\n{err}");
    assert!(out.contains("arrived exactly once"), "{out}");
    assert!(out.contains("[set 1 ·"), "the envelopes' text is printed: {out}");
}
