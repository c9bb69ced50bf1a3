//! The TypeScript client (`clients/typescript`) against the real `brood serve`: `npm test` there
//! builds it and runs its tests, which start this build's binary (`BROOD_BIN`) on free loopback
//! ports: errors, delegate → boundary → ack, the event stream, the worker kit, and that the
//! committed OpenAPI document and the types generated from it are this server's.
//!
//! Its tests of several processes on one database (the client following the holder hint) get
//! empty PostgreSQL databases of the test server (`pg_testkit`), their addresses in
//! `BROOD_TEST_PG_DATABASES`, space-separated; without it those tests fail.
//!
//! It needs `node` (18 or later) and `npm`, and the package's dev dependencies installed
//! (`npm ci` in `clients/typescript`, which `.ci/test` runs). Where they are missing this test
//! fails and says so: a client that was never run is not a client that works.

use std::process::{Command, Stdio};
use std::time::Duration;

mod subprocess;
use subprocess::{databases, repo, run, DATABASES_VAR};

/// How long `npm test` may run before it is killed and the test fails.
const NPM_TIMEOUT: Duration = Duration::from_secs(600);

#[test]
fn the_typescript_client_tests_pass_against_the_server() {
    let package = repo("clients/typescript");
    match Command::new("node").arg("--version").output() {
        Ok(out) if out.status.success() => {}
        other => panic!(
            "node is missing or broken ({other:?}): the TypeScript client tests need node 18 or later and npm \
             (.ci/test installs them)"
        ),
    }
    assert!(
        package.join("node_modules").is_dir(),
        "{} is missing: the TypeScript client tests need its dev dependencies; run .ci/test (or `npm ci` in \
         clients/typescript)",
        package.join("node_modules").display()
    );

    let mut npm = Command::new("npm");
    npm.arg("test")
        .current_dir(&package)
        .env("BROOD_BIN", env!("CARGO_BIN_EXE_brood"))
        .env(DATABASES_VAR, databases(2))
        .stdin(Stdio::null());
    let done = run(npm, "`npm test` (npm is installed with node)", NPM_TIMEOUT);
    let (out, err) = (&done.stdout, &done.stderr);
    assert!(
        done.ok(),
        "`npm test` in clients/typescript failed ({:?}; None: killed after {NPM_TIMEOUT:?})\n--- stdout\n{out}\n--- stderr\n{err}",
        done.status
    );
    let passed = out
        .lines()
        .find_map(|l| l.strip_prefix("# pass ")?.trim().parse::<u32>().ok());
    assert!(passed.unwrap_or(0) > 0, "node's test runner ran no test:\n{out}");
}
