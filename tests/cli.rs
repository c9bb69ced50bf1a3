//! The `brood` binary: the demo (the main job), `brood chaos`, `brood bench` and the
//! configuration of `brood serve`, run as a user runs them.

use std::process::Command;

fn brood() -> Command {
    Command::new(env!("CARGO_BIN_EXE_brood"))
}

#[test]
fn the_demo_delivers_every_child_once_and_exits_zero() {
    let dir = tempfile::TempDir::new().unwrap();
    let out = brood()
        .args(["demo", "--data-dir"])
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tally = stdout.lines().find(|l| l.starts_with("tally:")).expect("a tally line");
    assert!(tally.contains("children 12, results delivered once 12"), "{tally}");
    assert!(tally.contains("failure notices 1, duplicates 0, lost 0"), "{tally}");
    assert!(stdout.contains("FAILURE NOTICE"), "{stdout}");
    assert!(stdout.contains("[set 1 · "), "{stdout}");
    assert!(stdout.contains("only after you end your turn"), "{stdout}");
}

/// Parses `chaos: children N, faults F, kills K, delivered-once D, duplicates U, lost L, unknown X`.
fn parse_summary(line: &str) -> Vec<(String, u64)> {
    let rest = line
        .strip_prefix("chaos: ")
        .unwrap_or_else(|| panic!("not a chaos line: {line}"));
    rest.split(", ")
        .map(|part| {
            let (name, n) = part
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad part `{part}` in {line}"));
            (
                name.to_string(),
                n.parse().unwrap_or_else(|_| panic!("bad number in {line}")),
            )
        })
        .collect()
}

/// Runs a campaign of `children` with `extra` flags; its output, and its last line's fields.
fn chaos(children: u64, extra: &[&str]) -> (String, Vec<(String, u64)>) {
    let dir = tempfile::TempDir::new().unwrap();
    let faults = if cfg!(feature = "failpoints") { "all" } else { "kill" };
    let out = brood()
        .args(["chaos", "--seed", "4", "--kill-every", "300ms", "--faults", faults])
        .args(["--children", &children.to_string()])
        .args(extra)
        .arg("--data-dir")
        .arg(dir.path().join("campaign"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "chaos failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().expect("a last line");
    let fields = parse_summary(last);
    let names: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "children",
            "faults",
            "kills",
            "delivered-once",
            "duplicates",
            "lost",
            "unknown"
        ],
        "{last}"
    );
    let get = |name: &str| {
        fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .unwrap_or(u64::MAX)
    };
    assert_eq!(get("children"), children, "{last}");
    assert_eq!(get("lost"), 0, "{last}");
    assert_eq!(get("delivered-once"), children, "{last}");
    assert!(get("kills") >= 1, "the campaign killed nothing: {last}");
    (stdout, fields)
}

#[test]
fn chaos_survives_kills_and_faults_and_reports_one_line() {
    chaos(120, &[]);
}

#[test]
fn chaos_on_a_shared_postgres_ledger_survives_kills_of_whole_processes() {
    let url = brood_actors::ledger::pg_testkit::url();
    let (stdout, _) = chaos(300, &["--ledger", &url, "--processes", "3"]);
    let taken = stdout
        .lines()
        .find_map(|l| l.strip_prefix("chaos: the session was taken up "))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no take-up count: {stdout}"));
    assert!(taken >= 2, "no worker ever took the session over: {stdout}");
}

#[test]
fn chaos_refuses_bad_settings_with_a_reason() {
    let dir = tempfile::TempDir::new().unwrap();
    let out = brood()
        .args(["chaos", "--faults", "kill,flood", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown fault `flood`"));

    std::fs::write(dir.path().join("precious.txt"), "keep me").unwrap();
    let out = brood()
        .args(["chaos", "--children", "5", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not empty"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("precious.txt")).unwrap(),
        "keep me"
    );

    let out = brood()
        .args(["chaos", "--kill-every", "soon", "--data-dir"])
        .arg(dir.path().join("x"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a duration"));
}

#[test]
fn bench_prints_each_figure_beside_its_baseline_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_brood"))
        .args([
            "bench",
            "--quick",
            "--json",
            "--only",
            "durable,claim,latency,rss",
            "--data-dir",
        ])
        .arg(dir.path())
        .output()
        .expect("run brood bench");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let figures = report["figures"].as_array().expect("figures");
    let named = |name: &str| {
        figures
            .iter()
            .find(|f| f["name"] == name)
            .unwrap_or_else(|| panic!("no figure {name} in {report}"))
    };
    let durable = named("durable_children_per_s");
    let (value, baseline) = (
        durable["value"].as_f64().unwrap(),
        durable["baseline"].as_f64().unwrap(),
    );
    assert!(value > 0.0 && baseline > 0.0, "{durable}");
    let ratio = durable["ratio"].as_f64().unwrap();
    assert!((ratio - value / baseline).abs() < 1e-9 * ratio.max(1.0), "{durable}");
    for name in ["claim_1k_ms", "ack_1k_ms", "claim_10k_ms", "ack_10k_ms"] {
        let f = named(name);
        assert_eq!(f["unit"], "ms");
        assert!(f["value"].as_f64().unwrap() > 0.0, "{f}");
        assert!(f["baseline"].is_null() && f["ratio"].is_null(), "{f}");
    }
    // Completion → claimable is read from the owner's own stamps, completion → claimed by the
    // woken consumer; both are there, and each distribution is ordered.
    let ms = |name: &str| named(name)["value"].as_f64().unwrap();
    assert!(ms("claimable_latency_p50_ms") >= 0.0);
    assert!(ms("claimable_latency_p50_ms") <= ms("claimable_latency_p99_ms"));
    assert!(ms("claimable_latency_p99_ms") <= ms("claimable_latency_max_ms"));
    assert!(ms("claimed_latency_p50_ms") <= ms("claimed_latency_p99_ms"));
    // Live children's memory, sharing one unit per call and each its own unit, each measured
    // in a process of its own.
    assert!(ms("rss_per_live_child_bytes") > 0.0);
    assert!(ms("rss_per_live_child_independent_bytes") > 0.0);
    assert!(report["machine"]["cpus"].as_u64().unwrap() >= 1);
    assert_eq!(report["machine"]["durability"], "fsync");
    // The scratch ledgers are gone; only the folder given stays.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_brood"))
        .args(["bench", "--quick", "--only", "speed"])
        .output()
        .expect("run brood bench");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown group `speed`") && err.contains("durable"),
        "{err}"
    );
}

/// `brood serve --print-config` with `args`, in an environment holding only `env`: its exit
/// status, what it printed, and its error output.
fn print_config(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = brood()
        .args(["serve", "--print-config"])
        .args(args)
        .env_clear()
        .env("RUST_BACKTRACE", "0")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A `brood.toml` holding `text`, in a folder of its own.
fn config_file(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("brood.toml");
    std::fs::write(&file, text).unwrap();
    let path = file.to_str().unwrap().to_string();
    (dir, path)
}

#[test]
fn serve_settings_come_from_flags_over_the_environment_over_the_file() {
    let (_dir, file) = config_file("max_depth = 3\nmax_delivery_attempts = 4\nbody_limit = 4096\n");
    let (ok, printed, err) = print_config(
        &["--config", &file, "--body-limit", "6000"],
        &[("BROOD_MAX_DELIVERY_ATTEMPTS", "5"), ("BROOD_BODY_LIMIT", "5000")],
    );
    assert!(ok, "{err}");
    let lines: Vec<&str> = printed.lines().collect();
    for line in [
        "max_depth = 3",
        "max_delivery_attempts = 5",
        "body_limit = 6000",
        "max_concurrent_children = 8",
    ] {
        assert!(lines.contains(&line), "{line} in {printed}");
    }
}

#[test]
fn serve_refuses_an_unknown_key_in_the_file_naming_the_file() {
    let (_dir, file) = config_file("max_children = 3\n");
    let (ok, printed, err) = print_config(&["--config", &file], &[]);
    assert!(!ok && printed.is_empty(), "{printed}");
    assert!(
        err.contains("`max_children`") && err.contains(&format!("file {file}, line 1")),
        "{err}"
    );
}

#[test]
fn serve_refuses_a_wrong_type_in_the_file_with_its_line_and_column() {
    let (_dir, file) = config_file("max_depth = 2\nmax_delivery_attempts = \"many\"\n");
    let (ok, _, err) = print_config(&["--config", &file], &[]);
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "`max_delivery_attempts` (from file {file}, line 2, column 25)"
        )) && err.contains("from 1 to 1000"),
        "{err}"
    );
    let (_dir, file) = config_file("max_depth = \n");
    let (ok, _, err) = print_config(&["--config", &file], &[]);
    assert!(!ok);
    assert!(
        err.contains(&format!("file {file}, line 1, column 13")) && err.contains("not valid TOML"),
        "{err}"
    );
}

#[test]
fn serve_refuses_a_value_out_of_range_from_the_environment_naming_the_variable() {
    let (ok, _, err) = print_config(&[], &[("BROOD_MAX_DEPTH", "65")]);
    assert!(!ok);
    assert!(
        err.contains("`max_depth` (from environment variable BROOD_MAX_DEPTH)") && err.contains("from 1 to 64"),
        "{err}"
    );
}

#[test]
fn serve_refuses_a_mistyped_brood_variable() {
    let (ok, printed, err) = print_config(&[], &[("BROOD_MAX_CONCURENT_CHILDREN", "4")]);
    assert!(!ok && printed.is_empty(), "{printed}");
    assert!(
        err.contains("environment variable BROOD_MAX_CONCURENT_CHILDREN")
            && err.contains("did you mean BROOD_MAX_CONCURRENT_CHILDREN?"),
        "{err}"
    );
}

#[test]
fn serve_accepts_the_brood_variables_that_are_not_settings() {
    let (ok, printed, err) = print_config(
        &[],
        &[
            ("BROOD_FAILPOINTS", "none=0"),
            ("BROOD_TEST_LEDGER", "sled"),
            ("BROOD_TEST_PG", "postgres://nowhere/db"),
            ("BROOD_CHILD_ID", "deleg_1.0"),
        ],
    );
    assert!(ok, "{err}");
    assert!(printed.contains("max_depth = 2"), "{printed}");
}
