//! `command` children do not outlive the server and see only what they are given, on the real
//! `brood serve`: a child dies with a server killed with SIGKILL; what it left in its process
//! group is killed by the next start before anything is re-run, so a re-run command runs once;
//! a child's environment holds only the variables `command_env` names, `BROOD_CHILD_ID` and its
//! task's `env`; the server's start-up environment shows neither the API key nor the peer
//! credential; and the key can be read
//! from a file (`--api-key-file`), an empty one being a clear error.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
mod server;
use common::gone;
use server::*;

/// The process group of `pid` (field 5 of its stat).
fn group_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the process runs");
    let rest = &stat[stat.rfind(')').expect("a stat line") + 1..];
    rest.split_whitespace()
        .nth(2)
        .and_then(|g| g.parse().ok())
        .expect("a group id")
}

/// Waits (a liveness wait, not a timed claim) until `done`, failing after `within`.
fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The pid a command wrote to `file`, once it did.
fn pid_in(file: &Path) -> u32 {
    let mut pid = 0;
    wait_until("the command wrote a pid", Duration::from_secs(30), || {
        pid = std::fs::read_to_string(file)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
        pid != 0
    });
    pid
}

/// The processes alive (not zombies) whose arguments are exactly `argv`.
fn running_with_argv(argv: &[&str]) -> Vec<u32> {
    let want: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain([0])).collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want))
        .filter(|pid| !gone(*pid))
        .collect()
}

fn sh(script: &str) -> Value {
    json!({"kind": "command", "argv": ["sh", "-c", script]})
}

#[test]
fn a_command_child_dies_with_a_server_killed_with_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let s = Server::start_with(&dir.path().join("data"), None, &["--allow-command"]);
    s.open("k");
    let script = format!("echo $$ > '{}'; exec sleep 300", pidfile.display());
    s.delegate_task("k", json!({"goal": "sleep", "runner": sh(&script)}));
    let pid = pid_in(&pidfile);
    assert!(!gone(pid), "the command runs");
    s.kill9();
    wait_until(
        "the command child died with its server",
        Duration::from_secs(10),
        || gone(pid),
    );
}

#[test]
fn a_rerun_command_runs_once_after_a_kill_9_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let pidfile = dir.path().join("pid");
    // A number of seconds no other process of the machine sleeps for: the marker.
    let marker = format!("3000.{}", std::process::id());
    // The shell (the group leader) dies with the server; the `sleep` it started in its group
    // does not, until the next start kills the group.
    let script = format!("sleep {marker} & echo $! > '{}'; wait", pidfile.display());
    let task = json!({"goal": "marked", "runner": sh(&script), "rerun_on_recovery": true});
    let s = Server::start_with(&data, None, &["--allow-command"]);
    s.open("r");
    s.delegate_task("r", task);
    let first = pid_in(&pidfile);
    assert_eq!(running_with_argv(&["sleep", &marker]), [first]);
    // The server records the command's group just after it started it (a kill before the
    // record is written leaves the group to run on unrecorded): the kill comes after it.
    let group = group_of(first).to_string();
    wait_until("the command's group recorded", Duration::from_secs(10), || {
        std::fs::read_to_string(data.join("command-groups"))
            .is_ok_and(|t| t.lines().any(|l| l.split_whitespace().nth(1) == Some(group.as_str())))
    });
    s.kill9();
    std::fs::remove_file(&pidfile).unwrap();

    let s = Server::start_with(&data, None, &["--allow-command"]);
    let second = pid_in(&pidfile);
    assert_ne!(first, second, "the command was run again");
    wait_until(
        "the copy the killed server left was killed",
        Duration::from_secs(10),
        || gone(first),
    );
    assert_eq!(running_with_argv(&["sleep", &marker]), [second], "one copy runs");
    // Dropping the server kills it with SIGKILL, which would leave this copy to the next start.
    Command::new("kill")
        .args(["-KILL", &second.to_string()])
        .status()
        .unwrap();
    drop(s);
}

/// The variables a server is started with, beside PATH: secrets, and the three a child gets.
const SERVER_ENV: &[(&str, &str)] = &[
    ("PGPASSWORD", "pg-secret"),
    ("DATABASE_URL", "postgres://u:db-secret@h/db"),
    ("SECRET_X", "x-secret"),
    ("BROOD_API_KEY", "key-secret"),
    ("BROOD_PEER_KEY", "peer-secret"),
    ("HOME", "/tmp/brood-child-home"),
    ("LANG", "C.UTF-8"),
    ("EXTRA_OK", "extra-value"),
];

/// Runs `script` as a command child of a server started with [`SERVER_ENV`] (its key from the
/// environment) and `extra` flags, the task's `env` holding TASK_VAR; the child's id.
fn run_in_env(dir: &Path, extra: &[&str], script: &str) -> String {
    let mut flags = vec!["--allow-command"];
    flags.extend_from_slice(extra);
    let mut s = Server::start_env(&dir.join("data"), None, &flags, SERVER_ENV);
    s.key = Some("key-secret".into());
    s.open("e");
    let mut runner = sh(script);
    runner["env"] = json!({"TASK_VAR": "task-value"});
    s.delegate_task("e", json!({"goal": "env", "runner": runner}));
    let item = s.only_result("e");
    assert_eq!(item["status"], "succeeded", "{item}");
    item["child_id"].as_str().unwrap().to_string()
}

/// The lines `NAME=value` of a file `env` wrote.
fn variables(file: &Path) -> Vec<String> {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn a_command_child_gets_path_home_lang_its_id_and_its_env_and_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("env");
    let child_id = run_in_env(dir.path(), &[], &format!("env > '{}'", out.display()));
    let env = variables(&out);
    for want in [
        "HOME=/tmp/brood-child-home".to_string(),
        "LANG=C.UTF-8".to_string(),
        "TASK_VAR=task-value".to_string(),
        format!("BROOD_CHILD_ID={child_id}"),
    ] {
        assert!(env.contains(&want), "{want} missing from {env:?}");
    }
    assert!(env.iter().any(|v| v.starts_with("PATH=")), "{env:?}");
    for secret in [
        "pg-secret",
        "db-secret",
        "x-secret",
        "key-secret",
        "peer-secret",
        "extra-value",
    ] {
        assert!(!env.iter().any(|v| v.contains(secret)), "{secret} leaked: {env:?}");
    }
}

#[test]
fn command_env_names_the_variables_a_child_gets() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("env");
    run_in_env(
        dir.path(),
        &["--command-env", "PATH,EXTRA_OK"],
        &format!("env > '{}'", out.display()),
    );
    let env = variables(&out);
    assert!(env.contains(&"EXTRA_OK=extra-value".to_string()), "{env:?}");
    assert!(env.contains(&"TASK_VAR=task-value".to_string()), "{env:?}");
    assert!(
        !env.iter()
            .any(|v| v.starts_with("HOME=/tmp/brood-child-home") || v.starts_with("LANG=")),
        "only the variables named pass: {env:?}"
    );
}

#[test]
fn the_servers_start_up_environment_shows_neither_key_to_a_child() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("server-env");
    // The shell's parent is the server: its environment block as the kernel shows it.
    let script = format!("tr '\\000' '\\n' < /proc/$PPID/environ > '{}'", out.display());
    run_in_env(dir.path(), &[], &script);
    let env = variables(&out);
    assert!(
        env.iter().any(|v| v == "SECRET_X=x-secret"),
        "the file is the server's environment: {env:?}"
    );
    assert!(
        !env.iter().any(|v| v.contains("key-secret")),
        "the key is readable: {env:?}"
    );
}

#[test]
fn a_key_given_twice_in_the_environment_leaves_neither_value_readable() {
    use std::ffi::CString;
    use std::os::unix::process::CommandExt as _;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let binary = CString::new(env!("CARGO_BIN_EXE_brood")).unwrap();
    let args: Vec<CString> = [
        env!("CARGO_BIN_EXE_brood").to_string(),
        "serve".into(),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
        "--data-dir".into(),
        dir.path().join("data").display().to_string(),
    ]
    .into_iter()
    .map(|a| CString::new(a).unwrap())
    .collect();
    // An environment no `Command` builds: one name twice (execve takes it as given).
    let env: Vec<CString> = [
        "PATH=/usr/bin:/bin",
        "BROOD_API_KEY=first-k3y",
        "BROOD_API_KEY=second-k3y",
    ]
    .into_iter()
    .map(|v| CString::new(v).unwrap())
    .collect();
    // Pointers kept as addresses (a closure given to pre_exec must be Send), NULL-terminated.
    let addresses =
        |strings: &[CString]| -> Vec<usize> { strings.iter().map(|a| a.as_ptr() as usize).chain([0]).collect() };
    let (argv, envp) = (addresses(&args), addresses(&env));
    let mut command = Command::new("/bin/false");
    command
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: execve is async-signal-safe, and the pointers point into vectors that outlive
    // the spawn (the child is a copy of this process until execve replaces it).
    unsafe {
        command.pre_exec(move || {
            libc::execve(
                binary.as_ptr(),
                argv.as_ptr().cast::<*const libc::c_char>(),
                envp.as_ptr().cast::<*const libc::c_char>(),
            );
            Err(std::io::Error::last_os_error())
        });
    }
    let mut child = command.spawn().unwrap();
    drop((args, env));
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let url = format!("http://127.0.0.1:{port}/v1/sessions");
    wait_until("the server to answer", Duration::from_secs(30), || {
        agent
            .get(&url)
            .header("Authorization", "Bearer first-k3y")
            .call()
            .is_ok_and(|r| r.status() == 200)
    });
    let block = std::fs::read(format!("/proc/{}/environ", child.id())).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let block = String::from_utf8_lossy(&block);
    assert!(
        block.contains("PATH=/usr/bin:/bin"),
        "the block is the server's: {block:?}"
    );
    for value in ["first-k3y", "second-k3y"] {
        assert!(!block.contains(value), "{value} is readable: {block:?}");
    }
}

#[test]
fn the_api_key_is_read_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("key");
    std::fs::write(&file, "file-key\n").unwrap();
    let s = Server::start_with(
        &dir.path().join("data"),
        None,
        &["--api-key-file", file.to_str().unwrap()],
    );
    let (status, body) = s.raw("GET", "/v1/sessions", None, Some("file-key"));
    assert_eq!(status, 200, "the key of the file passes: {body}");
    assert_error(s.raw("GET", "/v1/sessions", None, None), 401, "unauthorized");
    assert_error(s.raw("GET", "/v1/sessions", None, Some("file-ke")), 401, "unauthorized");
}

#[test]
fn an_empty_api_key_file_is_a_configuration_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("empty-key");
    std::fs::write(&file, "").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_brood"))
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port()), "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--api-key-file")
        .arg(&file)
        .env_remove("BROOD_API_KEY")
        .output()
        .unwrap();
    assert!(!out.status.success(), "a server with an empty key file must not start");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("api_key_file") && stderr.contains("is empty") && stderr.contains(file.to_str().unwrap()),
        "{stderr}"
    );
}
