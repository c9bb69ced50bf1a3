//! Running another program to its end from a test: its output gathered while it runs (so a
//! full pipe never stalls it), and killed when it outlives its time. Shared by the tests that
//! drive the Python and TypeScript clients and the MCP SDK; and the test environment's Python.
#![allow(dead_code)]

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How a program run by [`run`] ended.
pub struct Finished {
    /// Its exit status; none when it was killed for running past its time.
    pub status: Option<ExitStatus>,
    /// What it wrote to stdout.
    pub stdout: String,
    /// What it wrote to stderr, with a line saying so when it was killed.
    pub stderr: String,
}

impl Finished {
    /// Whether it exited 0.
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

/// Runs `cmd` to its end with its stdout and stderr read, killing it after `timeout`. `what`
/// names it in a failure to start.
pub fn run(mut cmd: Command, what: &str, timeout: Duration) -> Finished {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("could not start {what}: {e}"));
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
        if let Some(status) = child.try_wait().unwrap_or_else(|e| panic!("waiting for {what}: {e}")) {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, mut stderr) = (stdout.join().unwrap_or_default(), stderr.join().unwrap_or_default());
    if status.is_none() {
        stderr.push_str(&format!("\n(killed: still running after {timeout:?})"));
    }
    Finished { status, stdout, stderr }
}

/// The variable naming the Python interpreter the tests use: their own setting, none of
/// brood's, so the tests keep it from the processes they start.
pub const PYTHON_VAR: &str = "BROOD_TEST_PYTHON";

/// A path inside the repository.
pub fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The interpreter named by [`PYTHON_VAR`], else the test environment's
/// (`.test-env/python/bin/python`, the virtual environment `.ci/test` makes with the Python
/// client and the MCP SDK); a failure that says how to make it when there is none.
pub fn test_python() -> PathBuf {
    let path = std::env::var_os(PYTHON_VAR)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo(".test-env/python/bin/python"));
    assert!(
        path.is_file(),
        "no Python at {}: run `.ci/test` to make the test environment (a venv with \
         `pip install ./clients/python[test]` and the MCP SDK), or name a Python that has them in {PYTHON_VAR}",
        path.display()
    );
    path
}

/// The variable naming, space-separated, the empty PostgreSQL databases a client suite's tests
/// of several processes sharing one database use (one database for each such cluster).
pub const DATABASES_VAR: &str = "BROOD_TEST_PG_DATABASES";

/// `n` new, empty databases of the test PostgreSQL server (`pg_testkit`, started on first use),
/// as the value of [`DATABASES_VAR`].
pub fn databases(n: usize) -> String {
    (0..n)
        .map(|_| brood_actors::ledger::pg_testkit::fresh_database())
        .collect::<Vec<_>>()
        .join(" ")
}
