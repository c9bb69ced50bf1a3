use super::*;

#[test]
fn a_ledger_address_is_printed_without_its_password() {
    assert_eq!(
        hide_password("postgres://u:secret@h:5432/db"),
        "postgres://u:(set)@h:5432/db"
    );
    assert_eq!(
        hide_password("postgres://u@h/db?sslmode=disable&password=secret"),
        "postgres://u@h/db?sslmode=disable&password=(set)"
    );
    assert_eq!(hide_password("postgres://u@h/db"), "postgres://u@h/db");
    assert_eq!(
        hide_password("postgres://u:secret@h1:5432,h2:5433/db?target_session_attrs=read-write"),
        "postgres://u:(set)@h1:5432,h2:5433/db?target_session_attrs=read-write"
    );
}

fn flags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// The configuration of a file `brood.toml` holding `text`, and nothing else.
fn resolve_file(text: &str) -> Result<ServeConfig, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("brood.toml");
    std::fs::write(&file, text).unwrap();
    resolve(Some(&file), vec![], BTreeMap::new())
}

#[test]
fn flags_win_over_the_environment_over_the_file_over_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("brood.toml");
    std::fs::write(
        &file,
        "max_delivery_attempts = 3\nmax_concurrent_children = 4\nbody_limit = 4096\n",
    )
    .unwrap();
    let env = vec![
        ("BROOD_MAX_CONCURRENT_CHILDREN".to_string(), "5".to_string()),
        ("BROOD_BODY_LIMIT".to_string(), "5000".to_string()),
        ("BROOD_FAILPOINTS".to_string(), "read elsewhere".to_string()),
        ("PATH".to_string(), "not ours".to_string()),
    ];
    let c = resolve(Some(&file), env, flags(&[("body_limit", "6000")])).unwrap();
    assert_eq!(c.max_delivery_attempts, 3, "from the file");
    assert_eq!(c.max_concurrent_children, 5, "the environment over the file");
    assert_eq!(c.body_limit, 6000, "the flag over both");
    assert_eq!(c.default_lease_ms, 60_000, "a default");
}

#[test]
fn an_unknown_key_names_itself_and_the_file() {
    let e = resolve_file("max_children = 3\n").unwrap_err();
    assert_eq!(e.key, "max_children");
    assert!(e.source_name.contains("brood.toml"), "{e}");
    assert!(e.problem.contains("max_concurrent_children"), "lists the keys: {e}");
}

#[test]
fn a_wrong_type_or_a_value_out_of_range_says_what_is_accepted() {
    let e = resolve_file("max_delivery_attempts = \"many\"\n").unwrap_err();
    assert!(e.problem.contains("from 1 to 1000"), "{e}");
    let e = resolve(
        None,
        vec![("BROOD_DURABILITY".into(), "sometimes".into())],
        BTreeMap::new(),
    )
    .unwrap_err();
    assert_eq!(e.source_name, "environment variable BROOD_DURABILITY");
    assert!(e.problem.contains("\"fsync\" or \"flush\""), "{e}");
    let e = resolve(None, vec![], flags(&[("min_lease_ms", "5")])).unwrap_err();
    assert_eq!(e.source_name, "flag --min-lease-ms");
}

#[test]
fn lifecycle_settings_parse_into_the_engine_they_configure() {
    let c = resolve_file(
        "max_depth = 3\nmax_running_children = 64\nretain_delivered_ms = 1000\nretain_dead_ms = 2000\n\
         drop_idle_sessions_ms = 0\nretention_interval_ms = 0\n",
    )
    .unwrap();
    assert_eq!((c.max_depth, c.max_running_children), (3, Some(64)));
    let r = c.retention();
    assert_eq!(r.delivered, std::time::Duration::from_secs(1));
    assert_eq!(r.dead, std::time::Duration::from_secs(2));
    assert_eq!((r.idle_session, r.interval), (None, None), "0 turns them off");
    let d = resolve(None, vec![], BTreeMap::new()).unwrap();
    assert_eq!(
        (d.max_depth, d.max_running_children),
        (2, None),
        "defaults: depth 2, unlimited"
    );
    assert_eq!(d.retention().delivered, std::time::Duration::from_secs(7 * 86_400));
    assert_eq!(d.retention().idle_session, None, "idle sessions are kept unless asked");
    for bad in [
        "max_depth = 0\n",
        "max_running_children = 0\n",
        "retention_interval_ms = -1\n",
    ] {
        let e = resolve_file(bad).unwrap_err();
        assert!(e.problem.contains("from "), "{bad}: {e}");
    }
}

#[test]
fn allowed_runners_default_to_sim_and_external_and_grow_with_allow_command() {
    let c = resolve(None, vec![], BTreeMap::new()).unwrap();
    assert_eq!(c.allowed_runners, ["sim", "external"]);
    assert!(c.refuses_runner("command").unwrap().contains("--allow-command"));
    assert_eq!(c.refuses_runner("external"), None);
    assert_eq!(
        c.refuses_runner("no-such-kind"),
        None,
        "the registry refuses unknown kinds"
    );
    let c = resolve(None, vec![], flags(&[("allow_command", "true")])).unwrap();
    assert_eq!(c.allowed_runners, ["sim", "external", "command"]);
    assert_eq!(c.refuses_runner("command"), None);
    let c = resolve(
        None,
        vec![("BROOD_ALLOWED_RUNNERS".into(), "command, sim,command".into())],
        BTreeMap::new(),
    )
    .unwrap();
    assert_eq!(c.allowed_runners, ["command", "sim"]);
    assert!(c.allow_command, "listing command allows it");
    assert!(c.refuses_runner("external").unwrap().contains("allowed: command, sim"));
    assert!(
        c.to_toml().contains("allowed_runners = [\"command\", \"sim\"]"),
        "{}",
        c.to_toml()
    );
}

#[test]
fn allowed_runners_from_a_file_are_an_array_of_known_kinds() {
    let c = resolve_file("allowed_runners = [\"external\"]\n").unwrap();
    assert_eq!(c.allowed_runners, ["external"]);
    assert!(c.refuses_runner("sim").is_some());
    let e = resolve_file("allowed_runners = [\"sim\", \"shell\"]\n").unwrap_err();
    assert_eq!(e.key, "allowed_runners");
    assert!(
        e.problem.contains("\"shell\"") && e.problem.contains("sim, command, external"),
        "{e}"
    );
    let e = resolve_file("allowed_runners = [1]\n").unwrap_err();
    assert!(e.problem.contains("runner kinds from"), "{e}");
}

#[test]
fn scoped_keys_need_an_admin_key_differ_from_it_and_are_never_printed() {
    let both = flags(&[("api_key", "admin"), ("scoped_keys", "acme-=k1, beta-=k2")]);
    let c = resolve(None, vec![], both).unwrap();
    assert_eq!(
        c.scoped_keys
            .iter()
            .map(|k| (k.prefix.as_str(), k.key.as_str()))
            .collect::<Vec<_>>(),
        [("acme-", "k1"), ("beta-", "k2")]
    );
    let printed = c.to_toml();
    assert!(printed.contains("acme-=(set)") && !printed.contains("k1"), "{printed}");
    let from_file = resolve_file("api_key = \"admin\"\nscoped_keys = [\"acme-=k1\"]\n").unwrap();
    assert_eq!(from_file.scoped_keys.len(), 1);
    let e = resolve(None, vec![], flags(&[("scoped_keys", "acme-=k1")])).unwrap_err();
    assert_eq!(e.key, "scoped_keys");
    let e = resolve(None, vec![], flags(&[("api_key", "k1"), ("scoped_keys", "acme-=k1")])).unwrap_err();
    assert!(e.problem.contains("key of its own"), "{e}");
    let e = resolve(
        None,
        vec![],
        flags(&[("api_key", "a"), ("scoped_keys", "acme-=k1,beta-=k1")]),
    )
    .unwrap_err();
    assert!(e.problem.contains("same key") && !e.problem.contains("k1"), "{e}");
    let e = resolve(
        None,
        vec![],
        flags(&[("api_key", "a"), ("scoped_keys", "secretwithoutprefix")]),
    )
    .unwrap_err();
    assert!(!e.to_string().contains("secretwithoutprefix"), "{e}");
}

#[test]
fn allowed_hosts_are_bare_host_names() {
    let c = resolve(None, vec![], BTreeMap::new()).unwrap();
    assert!(c.allowed_hosts.is_empty(), "none by default");
    let c = resolve(
        None,
        vec![(
            "BROOD_ALLOWED_HOSTS".into(),
            "Brood.Example, [::1],10.0.0.5,brood.example".into(),
        )],
        BTreeMap::new(),
    )
    .unwrap();
    assert_eq!(c.allowed_hosts, ["brood.example", "::1", "10.0.0.5"]);
    let c = resolve_file("allowed_hosts = [\"a.example\", \"b.example.\"]\n").unwrap();
    assert_eq!(c.allowed_hosts, ["a.example", "b.example"]);
    for bad in [
        "https://brood.example",
        "brood.example:443",
        "brood.example/x",
        "a b",
        "*.example",
    ] {
        let e = resolve(None, vec![], flags(&[("allowed_hosts", bad)])).unwrap_err();
        assert_eq!(e.source_name, "flag --allowed-hosts");
        assert!(e.problem.contains("is not a host name"), "{bad}: {e}");
    }
    let e = resolve_file("allowed_hosts = [\"\"]\n").unwrap_err();
    assert!(e.problem.contains("is not a host name"), "{e}");
    let c = resolve_file("allowed_hosts = \"x\"\n").unwrap();
    assert_eq!(c.allowed_hosts, ["x"], "text is a list of one");
}

#[test]
fn wake_allow_is_a_list_of_hosts_addresses_and_networks() {
    let c = resolve(None, vec![], BTreeMap::new()).unwrap();
    assert!(c.wake_allow.is_empty(), "none by default");
    let c = resolve(
        None,
        vec![("BROOD_WAKE_ALLOW".into(), "127.0.0.1, 10.0.0.0/8,Hooks.Internal".into())],
        BTreeMap::new(),
    )
    .unwrap();
    assert_eq!(c.wake_allow, ["127.0.0.1", "10.0.0.0/8", "hooks.internal"]);
    let c = resolve_file("wake_allow = [\"fd00::/8\", \"::1\"]\n").unwrap();
    assert_eq!(c.wake_allow, ["fd00::/8", "::1"]);
    assert!(
        c.to_toml().contains("wake_allow = [\"fd00::/8\", \"::1\"]"),
        "{}",
        c.to_toml()
    );
    let e = resolve(None, vec![], flags(&[("wake_allow", "10.0.0.0/40")])).unwrap_err();
    assert_eq!(
        (e.key.as_str(), e.source_name.as_str()),
        ("wake_allow", "flag --wake-allow")
    );
    assert!(e.problem.contains("prefix"), "{e}");
    let e = resolve_file("wake_allow = \"not a host\"\n").unwrap_err();
    assert!(e.problem.contains("CIDR"), "{e}");
}

#[test]
fn bounds_default_to_what_a_laptop_affords_and_parse_in_range() {
    let d = resolve(None, vec![], BTreeMap::new()).unwrap();
    assert_eq!(
        (
            d.max_tasks_per_call,
            d.max_session_capacity,
            d.max_live_children,
            d.body_timeout_ms
        ),
        (10_000, 1_024, 100_000, 30_000)
    );
    let c = resolve(
        None,
        vec![("BROOD_MAX_LIVE_CHILDREN".into(), "10".into())],
        flags(&[
            ("max_tasks_per_call", "5"),
            ("max_session_capacity", "16"),
            ("body_timeout_ms", "1000"),
        ]),
    )
    .unwrap();
    assert_eq!(
        (
            c.max_tasks_per_call,
            c.max_session_capacity,
            c.max_live_children,
            c.body_timeout_ms
        ),
        (5, 16, 10, 1_000)
    );
    for (key, bad) in [
        ("max_tasks_per_call", "0"),
        ("max_tasks_per_call", "1000001"),
        ("max_session_capacity", "0"),
        ("max_session_capacity", "1000001"),
        ("max_live_children", "0"),
        ("body_timeout_ms", "99"),
        ("body_timeout_ms", "3600001"),
        ("max_concurrent_children", "1000001"),
    ] {
        let e = resolve(None, vec![], flags(&[(key, bad)])).unwrap_err();
        assert_eq!(e.key, key, "{e}");
        assert!(e.problem.contains("from "), "{key} = {bad}: {e}");
    }
}

#[test]
fn a_default_capacity_above_max_session_capacity_is_refused() {
    let e = resolve_file("max_concurrent_children = 32\nmax_session_capacity = 16\n").unwrap_err();
    assert_eq!(e.key, "max_concurrent_children");
    assert!(e.problem.contains("max_session_capacity 16"), "{e}");
    let c = resolve_file("max_concurrent_children = 2000\nmax_session_capacity = 4000\n").unwrap();
    assert_eq!((c.max_concurrent_children, c.max_session_capacity), (2_000, 4_000));
    let e = resolve(None, vec![], flags(&[("max_concurrent_children", "2000")])).unwrap_err();
    assert_eq!(e.key, "max_concurrent_children", "above the default bound of 1024: {e}");
}

#[test]
fn without_a_key_only_loopback_is_served() {
    let e = resolve(None, vec![], flags(&[("listen", "0.0.0.0:7070")])).unwrap_err();
    assert_eq!(e.key, "listen");
    assert!(e.problem.contains("loopback"), "{e}");
    let c = resolve(None, vec![], flags(&[("listen", "0.0.0.0:7070"), ("api_key", "k")])).unwrap();
    assert!(!c.listen.ip().is_loopback());
    assert!(c.to_toml().contains("api_key = \"(set)\""), "the key is never printed");
}

#[test]
fn command_env_defaults_to_path_home_lang_and_takes_names_only() {
    let c = resolve(None, vec![], BTreeMap::new()).unwrap();
    assert_eq!(c.command_env, ["PATH", "HOME", "LANG"]);
    let c = resolve(
        None,
        vec![("BROOD_COMMAND_ENV".into(), "PATH, TZ,PATH,LC_ALL".into())],
        BTreeMap::new(),
    )
    .unwrap();
    assert_eq!(c.command_env, ["PATH", "TZ", "LC_ALL"], "trimmed, once each");
    let c = resolve_file("command_env = [\"PATH\"]\n").unwrap();
    assert_eq!(c.command_env, ["PATH"]);
    let c = resolve(None, vec![], flags(&[("command_env", "")])).unwrap();
    assert!(c.command_env.is_empty(), "an empty list passes nothing");
    for bad in ["PATH HOME", "A=B", "1X", "BROOD_API_KEY"] {
        let e = resolve(None, vec![], flags(&[("command_env", bad)])).unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.source_name.as_str()),
            ("command_env", "flag --command-env")
        );
        assert!(
            e.problem.contains("variable name") || e.problem.contains("never passed"),
            "{bad}: {e}"
        );
    }
    let e = resolve_file("command_env = [1]\n").unwrap_err();
    assert!(e.problem.contains("names of environment variables"), "{e}");
}

#[test]
fn the_api_key_is_read_from_a_file_less_one_trailing_newline() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("key");
    let with_file = |file: &Path| resolve(None, vec![], flags(&[("api_key_file", file.to_str().unwrap())]));
    std::fs::write(&file, "s3cret\n").unwrap();
    assert_eq!(with_file(&file).unwrap().api_key.as_deref(), Some("s3cret"));
    std::fs::write(&file, "s3cret\r\n").unwrap();
    assert_eq!(with_file(&file).unwrap().api_key.as_deref(), Some("s3cret"));
    std::fs::write(&file, "s3cret\n\n").unwrap();
    assert_eq!(
        with_file(&file).unwrap().api_key.as_deref(),
        Some("s3cret\n"),
        "one newline only"
    );
    let c = with_file(&file).unwrap();
    assert!(!c.to_toml().contains("s3cret"), "the key is never printed");
    for empty in ["", "\n"] {
        std::fs::write(&file, empty).unwrap();
        let e = with_file(&file).unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.source_name.as_str()),
            ("api_key_file", "flag --api-key-file")
        );
        assert!(
            e.problem.contains("is empty") && e.problem.contains(file.to_str().unwrap()),
            "{e}"
        );
    }
    let missing = dir.path().join("no-such-key");
    let e = with_file(&missing).unwrap_err();
    assert!(
        e.problem.contains("cannot be read") && e.problem.contains("no-such-key"),
        "{e}"
    );
    std::fs::write(&file, "k").unwrap();
    let e = resolve(
        None,
        vec![("BROOD_API_KEY".into(), "other".into())],
        flags(&[("api_key_file", file.to_str().unwrap())]),
    )
    .unwrap_err();
    assert!(
        e.problem.contains("api_key (from environment variable BROOD_API_KEY)"),
        "{e}"
    );
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

#[test]
fn an_unknown_key_in_the_file_names_the_file_its_line_and_a_near_key() {
    let e = resolve_file("max_depth = 3\nmax_concurent_children = 4\n").unwrap_err();
    assert_eq!(e.key, "max_concurent_children");
    assert!(
        e.source_name.starts_with("file ") && e.source_name.ends_with("brood.toml, line 2, column 26"),
        "{e}"
    );
    assert!(e.problem.contains("did you mean `max_concurrent_children`?"), "{e}");
}

#[test]
fn a_wrong_type_in_the_file_names_its_line_and_column_and_what_is_accepted() {
    let e = resolve_file("# limits\nmax_depth = 2\n  max_delivery_attempts = \"many\"\n").unwrap_err();
    assert_eq!(e.key, "max_delivery_attempts");
    assert!(e.source_name.ends_with("brood.toml, line 3, column 27"), "{e}");
    assert_eq!(e.problem, "\"many\" is not accepted; from 1 to 1000");
    let e = resolve_file("allow_command = \"true\"\n").unwrap_err();
    assert!(
        e.source_name.ends_with("line 1, column 17"),
        "text is not a boolean in a file: {e}"
    );
    let e = resolve_file("max_depth = 2.5\n").unwrap_err();
    assert!(e.problem.starts_with("2.5 is not accepted"), "{e}");
    let e = resolve_file("max_depth = 1979-05-27\n").unwrap_err();
    assert!(e.problem.starts_with("1979-05-27 is not accepted"), "{e}");
}

#[test]
fn a_toml_syntax_error_names_the_file_its_line_and_column() {
    let e = resolve_file("max_depth = 2\nbody_limit = \n").unwrap_err();
    assert_eq!(e.key, "config");
    assert!(e.source_name.ends_with("brood.toml, line 2, column 14"), "{e}");
    assert!(e.problem.starts_with("is not valid TOML: "), "{e}");
    assert!(std::error::Error::source(&e).is_some(), "the TOML error is the cause");
    let e = resolve_file("max_depth = 2\nmax_depth = 3\n").unwrap_err();
    assert!(e.problem.contains("duplicate key"), "{e}");
}

#[test]
fn a_value_out_of_range_in_the_environment_names_the_variable() {
    let e = resolve(None, env(&[("BROOD_MAX_DEPTH", "65")]), BTreeMap::new()).unwrap_err();
    assert_eq!(
        (e.key.as_str(), e.source_name.as_str()),
        ("max_depth", "environment variable BROOD_MAX_DEPTH")
    );
    assert_eq!(e.problem, "\"65\" is not accepted; from 1 to 64 (default 2)");
}

#[test]
fn a_brood_variable_that_names_no_key_is_refused_by_name() {
    let e = resolve(
        None,
        env(&[("BROOD_MAX_DEPTH", "3"), ("BROOD_MAX_CONCURENT_CHILDREN", "4")]),
        BTreeMap::new(),
    )
    .unwrap_err();
    assert_eq!(e.key, "max_concurent_children");
    assert_eq!(e.source_name, "environment variable BROOD_MAX_CONCURENT_CHILDREN");
    assert!(
        e.problem.contains("did you mean BROOD_MAX_CONCURRENT_CHILDREN?") && e.problem.contains("BROOD_FAILPOINTS"),
        "{e}"
    );
    let e = resolve(None, env(&[("BROOD_", "x")]), BTreeMap::new()).unwrap_err();
    assert_eq!(e.source_name, "environment variable BROOD_");
}

#[test]
fn the_brood_variables_read_elsewhere_are_not_configuration() {
    let names = layers::READ_ELSEWHERE.iter().chain(layers::READ_BY_TESTS);
    let all: Vec<(String, String)> = names
        .clone()
        .map(|(name, _)| (name.to_string(), "1".to_string()))
        .collect();
    assert_eq!(resolve(None, all, BTreeMap::new()).unwrap(), ServeConfig::default());
    for (name, _) in names {
        let key = name.trim_start_matches("BROOD_").to_ascii_lowercase();
        assert!(!keys::is_key(&key), "{name} is also a key");
    }
}

#[test]
fn a_value_a_later_layer_overrides_is_still_checked() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("brood.toml");
    std::fs::write(&file, "max_depth = 0\n").unwrap();
    let e = resolve(Some(&file), vec![], flags(&[("max_depth", "3")])).unwrap_err();
    assert!(e.source_name.ends_with("brood.toml, line 1, column 13"), "{e}");
    let e = resolve(None, env(&[("BROOD_MAX_DEPTH", "deep")]), flags(&[("max_depth", "3")])).unwrap_err();
    assert_eq!(e.source_name, "environment variable BROOD_MAX_DEPTH");
}

#[test]
fn the_api_key_and_its_file_from_two_layers_name_both() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("brood.toml");
    std::fs::write(&file, "api_key = \"k\"\n").unwrap();
    let e = resolve(Some(&file), vec![], flags(&[("api_key_file", "/nowhere")])).unwrap_err();
    assert_eq!(
        (e.key.as_str(), e.source_name.as_str()),
        ("api_key_file", "flag --api-key-file")
    );
    assert!(e.problem.contains("brood.toml, line 1, column 11"), "{e}");
}

/// The `BROOD_` names the workspace's code, scripts and docs hold (the refused ones its tests
/// spell on purpose left out): each is a key's variable or one read elsewhere, so a variable
/// added to brood or its tests without its place in `layers` fails here, not in a user's start.
#[test]
fn every_brood_variable_in_the_workspace_is_a_key_or_read_elsewhere() {
    const MISSPELT_ON_PURPOSE: &[&str] = &["BROOD_MAX_CONCURENT_CHILDREN"];
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut folders = vec![root];
    let mut unknown = BTreeMap::new();
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if path.is_dir() {
                if !matches!(name, "target" | ".git" | "node_modules") {
                    folders.push(path);
                }
                continue;
            }
            let ext = path.extension().and_then(|e| e.to_str()).unwrap_or_default();
            if !matches!(ext, "rs" | "py" | "md" | "sh" | "toml") && name != "run" {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            for (at, _) in text.match_indices("BROOD_") {
                let rest = &text[at + "BROOD_".len()..];
                let len = rest
                    .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                    .unwrap_or(rest.len());
                let variable = &text[at..at + "BROOD_".len() + len];
                let key = rest[..len].to_ascii_lowercase();
                if len > 0
                    && !keys::is_key(&key)
                    && !layers::read_elsewhere(variable)
                    && !MISSPELT_ON_PURPOSE.contains(&variable)
                {
                    unknown.insert(variable.to_string(), path.display().to_string());
                }
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "BROOD_ variables that are no key and not listed in config/layers.rs (brood serve would refuse them): {unknown:?}"
    );
}
