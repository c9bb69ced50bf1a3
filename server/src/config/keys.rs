//! What each configuration key accepts, and how a value of a layer (a TOML value, or the text
//! of a variable or a flag) is parsed into [`ServeConfig`]. Which layer a value came from, and
//! which value wins, is not this module's (`layers` and figment's).

use std::fmt;
use std::path::PathBuf;

use figment::value::Value;

use brood_actors::model::MAX_OUTPUT_BYTES;

use super::{ServeConfig, DAY_MS};

/// The keys, with what each accepts (for messages and `--print-config`).
pub(super) const KEYS: &[(&str, &str)] = &[
    ("listen", "an address:port such as 127.0.0.1:7070"),
    ("data_dir", "a folder path"),
    (
        "ledger",
        "a PostgreSQL address postgres://user@host:port/database, or several hosts host1:port1,host2:port2 with ?target_session_attrs=read-write (default: sled in data_dir)",
    ),
    (
        "advertise",
        "an http:// address where the other processes reach this one (default http://<listen>)",
    ),
    (
        "node",
        "a non-empty node id, stable across restarts (default: the advertised address)",
    ),
    ("session_lease_ms", "from 1000 to 600000 (default 10000)"),
    ("api_key", "a non-empty string"),
    (
        "scoped_keys",
        "entries `<prefix>=<key>` (a TOML array of strings, or text separated by commas): each key reaches only the sessions whose id starts with its prefix; needs api_key",
    ),
    (
        "api_key_file",
        "the path of a file holding the API key (one trailing newline is dropped); not with api_key",
    ),
    (
        "peer_key",
        "a non-empty string, the same in every process sharing the ledger (default: derived from api_key)",
    ),
    ("allow_command", "true or false"),
    (
        "allowed_runners",
        "runner kinds from sim, command, external (a TOML array, or comma-separated text)",
    ),
    (
        "allowed_hosts",
        "host names or IP addresses without a port, such as brood.example (a TOML array, or comma-separated text); default: none besides loopback, listen and advertise",
    ),
    (
        "wake_allow",
        "hosts, IP addresses or CIDR networks webhook wakes may go to besides public addresses (a TOML array, or comma-separated text; default none)",
    ),
    (
        "command_env",
        "names of environment variables a command child gets from the server's (a TOML array, or comma-separated text; default PATH, HOME, LANG)",
    ),
    ("durability", "\"fsync\" or \"flush\""),
    ("body_limit", "bytes, from 1024 to 1073741824"),
    ("max_concurrent_children", "from 1 to max_session_capacity (default 8)"),
    ("max_delivery_attempts", "from 1 to 1000"),
    ("max_depth", "from 1 to 64 (default 2)"),
    (
        "max_running_children",
        "from 1 to 1000000, over every session (default: unlimited)",
    ),
    (
        "retain_delivered_ms",
        "from 0 to 315360000000 (default 604800000: 7 days)",
    ),
    ("retain_dead_ms", "from 0 to 315360000000 (default 2592000000: 30 days)"),
    ("drop_idle_sessions_ms", "from 0 (never, the default) to 315360000000"),
    (
        "retention_interval_ms",
        "from 0 (no background sweep) to 86400000 (default 60000)",
    ),
    ("min_lease_ms", "from 100 to 3600000"),
    ("max_lease_ms", "from 100 to 3600000, at least min_lease_ms"),
    ("default_lease_ms", "from min_lease_ms to max_lease_ms"),
    ("default_stall_ms", "from 1 to 86400000"),
    ("default_timeout_ms", "from 0 (no timeout) to 604800000"),
    (
        "max_task_timeout_ms",
        "from 0 (no bound, the default) to 604800000: the longest timeout a task may have",
    ),
    (
        "max_retry_backoff_ms",
        "from 0 to 3600000 (the default): the longest wait a task's retry policy may ask for",
    ),
    ("drain_timeout_ms", "from 0 to 3600000"),
    ("commit_window_ms", "from 0 to 1000"),
    ("routing_threads", "from 0 to 256 (default: one per core)"),
    ("cache_bytes", "bytes, from 1048576 to 1099511627776 (default 67108864)"),
    ("max_tasks_per_call", "from 1 to 1000000 (default 10000)"),
    (
        "max_input_bytes",
        "bytes, from 1 to 8388608 (default 1048576): the most a task's input takes as JSON",
    ),
    (
        "max_output_bytes",
        "bytes, from 1 to 8388608 (default 1048576): the most a worker's output takes as JSON",
    ),
    (
        "max_session_capacity",
        "from 1 to 1000000, at least max_concurrent_children (default 1024)",
    ),
    (
        "max_live_children",
        "from 1 to 100000000, over every session (default 100000)",
    ),
    ("body_timeout_ms", "from 100 to 3600000 (default 30000)"),
];

/// One value as a layer gives it: the file's values keep their TOML type; environment
/// variables and flags are text, parsed by the key's type.
#[derive(Debug, Clone, Copy)]
pub(super) enum Raw<'a> {
    Typed(&'a Value),
    Text(&'a str),
}

impl fmt::Display for Raw<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Raw::Typed(v) => write!(f, "{}", Shown(v)),
            Raw::Text(s) => write!(f, "{s:?}"),
        }
    }
}

/// A TOML value as the file wrote it, for messages.
struct Shown<'a>(&'a Value);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Value::String(_, s) => write!(f, "{s:?}"),
            Value::Char(_, c) => write!(f, "{:?}", c.to_string()),
            Value::Bool(_, b) => write!(f, "{b}"),
            Value::Num(_, n) => match (n.to_u128_lossy(), n.to_i128(), n.to_f64()) {
                (Some(u), _, _) => write!(f, "{u}"),
                (_, Some(i), _) => write!(f, "{i}"),
                (_, _, Some(x)) => write!(f, "{x:?}"),
                _ => f.write_str("a number"),
            },
            Value::Empty(..) => f.write_str("nothing"),
            Value::Array(_, items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{}", Shown(item))?;
                }
                f.write_str("]")
            }
            // How the TOML reader hands a date and time to a value of any type.
            Value::Dict(_, d) => match d.get("$__toml_private_datetime").and_then(Value::as_str) {
                Some(datetime) => f.write_str(datetime),
                None => f.write_str("a table"),
            },
        }
    }
}

pub(super) fn accepted(key: &str) -> &'static str {
    KEYS.iter().find(|(k, _)| *k == key).map_or("", |(_, a)| a)
}

fn text(raw: &Raw<'_>) -> Option<String> {
    match raw {
        Raw::Text(s) => Some(s.to_string()),
        Raw::Typed(v) => v.as_str().map(str::to_string),
    }
}

fn number(key: &str, raw: &Raw<'_>, min: u64, max: u64) -> Result<u64, String> {
    let n = match raw {
        Raw::Typed(Value::Num(_, n)) => n.to_u128_lossy().and_then(|n| u64::try_from(n).ok()),
        Raw::Text(s) => s.trim().parse::<u64>().ok(),
        Raw::Typed(_) => None,
    };
    match n {
        Some(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!("{raw} is not accepted; {}", accepted(key))),
    }
}

fn flag(key: &str, raw: &Raw<'_>) -> Result<bool, String> {
    match raw {
        Raw::Typed(Value::Bool(_, b)) => Ok(*b),
        Raw::Text("true" | "1") => Ok(true),
        Raw::Text("false" | "0") => Ok(false),
        _ => Err(format!("{raw} is not accepted; {}", accepted(key))),
    }
}

/// A list: a TOML array of strings, or text separated by commas (empty items left out).
fn list(key: &str, raw: &Raw<'_>) -> Result<Vec<String>, String> {
    let bad = || format!("{raw} is not accepted; {}", accepted(key));
    match raw {
        Raw::Typed(Value::Array(_, a)) => a
            .iter()
            .map(|v| v.as_str().map(|s| s.trim().to_string()).ok_or_else(bad))
            .collect(),
        _ => Ok(text(raw)
            .ok_or_else(bad)?
            .split(',')
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty())
            .collect()),
    }
}

/// A list of runner kinds.
fn kinds(key: &str, raw: &Raw<'_>) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for kind in list(key, raw)? {
        if !brood::runners::KINDS.contains(&kind.as_str()) {
            return Err(format!("{kind:?} is not a runner kind; {}", accepted(key)));
        }
        if !out.contains(&kind) {
            out.push(kind);
        }
    }
    Ok(out)
}

/// Scoped keys: a TOML array of `<prefix>=<key>` strings, or text of them separated by commas;
/// no key twice.
fn scoped_keys(key: &str, raw: &Raw<'_>) -> Result<Vec<crate::scope::ScopedKey>, String> {
    let entries: Vec<String> = match raw {
        Raw::Typed(Value::Array(_, a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| format!("holds something that is not a string; {}", accepted(key)))?,
        Raw::Text(s) => s
            .split(',')
            .map(|e| e.trim().to_string())
            .filter(|e| !e.is_empty())
            .collect(),
        Raw::Typed(_) => return Err(format!("is not an array of strings; {}", accepted(key))),
    };
    let mut out: Vec<crate::scope::ScopedKey> = Vec::new();
    for entry in entries {
        let scoped = crate::scope::ScopedKey::parse(&entry)?;
        if let Some(other) = out
            .iter()
            .find(|k| k.prefix.starts_with(&scoped.prefix) || scoped.prefix.starts_with(&k.prefix))
        {
            return Err(format!(
                "the prefixes `{}` and `{}` overlap: a session of one would be the other's too",
                other.prefix, scoped.prefix
            ));
        }
        if out.iter().any(|k| k.key == scoped.key) {
            return Err(format!(
                "two entries have the same key (prefixes `{}` and `{}`)",
                out.iter().find(|k| k.key == scoped.key).map_or("", |k| &k.prefix),
                scoped.prefix
            ));
        }
        out.push(scoped);
    }
    Ok(out)
}

/// A list of host names: a TOML array of strings, or text separated by commas; each lower-cased,
/// without the brackets of an IPv6 address, and refused when it holds a port, a scheme or a
/// path.
fn hosts(key: &str, raw: &Raw<'_>) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for entry in list(key, raw)? {
        let trimmed = entry.as_str();
        let bare = trimmed
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(trimmed);
        let bare = bare.strip_suffix('.').unwrap_or(bare).to_ascii_lowercase();
        let is_v6 = bare.parse::<std::net::Ipv6Addr>().is_ok();
        let fine = !bare.is_empty()
            && (is_v6
                || bare
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_'));
        if !fine {
            return Err(format!(
                "{entry:?} is not a host name (give the name alone: no scheme, port or path); {}",
                accepted(key)
            ));
        }
        if !out.contains(&bare) {
            out.push(bare);
        }
    }
    Ok(out)
}

/// A list of hosts, addresses and networks wakes may go to, each checked.
fn wake_allow(key: &str, raw: &Raw<'_>) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for entry in list(key, raw)? {
        let entry = crate::wake::allow_entry(&entry).map_err(|e| format!("{e}; {}", accepted(key)))?;
        if !out.contains(&entry) {
            out.push(entry);
        }
    }
    Ok(out)
}

/// A list of environment variable names: a TOML array of strings, or text separated by commas.
/// A name is letters, digits and `_`, not starting with a digit.
fn variable_names(key: &str, raw: &Raw<'_>) -> Result<Vec<String>, String> {
    let bad = || format!("{raw} is not accepted; {}", accepted(key));
    let given: Vec<String> = match raw {
        Raw::Typed(Value::Array(_, a)) => a
            .iter()
            .map(|v| v.as_str().map(|s| s.trim().to_string()).ok_or_else(bad))
            .collect::<Result<_, _>>()?,
        _ => text(raw)
            .ok_or_else(bad)?
            .split(',')
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty())
            .collect(),
    };
    let mut out: Vec<String> = Vec::new();
    for name in given {
        let good = name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && name.chars().next().is_some_and(|c| !c.is_ascii_digit());
        if !good {
            return Err(format!(
                "{name:?} is not a variable name (letters, digits and `_`, not starting with a digit); {}",
                accepted(key)
            ));
        }
        if name == "BROOD_API_KEY" {
            return Err("BROOD_API_KEY is never passed to a command child; take it out of the list".into());
        }
        if !out.contains(&name) {
            out.push(name);
        }
    }
    Ok(out)
}

/// The largest session capacity any configuration accepts.
const MAX_CAPACITY: u64 = 1_000_000;

pub(super) fn apply(c: &mut ServeConfig, key: &str, raw: &Raw<'_>) -> Result<(), String> {
    let bad = || format!("{raw} is not accepted; {}", accepted(key));
    match key {
        "listen" => c.listen = text(raw).and_then(|s| s.parse().ok()).ok_or_else(bad)?,
        "data_dir" => c.data_dir = text(raw).filter(|s| !s.is_empty()).map(PathBuf::from).ok_or_else(bad)?,
        "ledger" => {
            c.ledger = Some(
                text(raw)
                    .filter(|s| s.starts_with("postgres://") || s.starts_with("postgresql://"))
                    .ok_or_else(bad)?,
            )
        }
        "advertise" => {
            c.advertise = Some(
                text(raw)
                    .filter(|s| (s.starts_with("http://") || s.starts_with("https://")) && s.len() > 8)
                    .map(|s| s.trim_end_matches('/').to_string())
                    .ok_or_else(bad)?,
            )
        }
        "node" => c.node = Some(text(raw).filter(|s| !s.trim().is_empty()).ok_or_else(bad)?),
        "session_lease_ms" => c.session_lease_ms = number(key, raw, 1_000, 600_000)?,
        "api_key" => c.api_key = Some(text(raw).filter(|s| !s.is_empty()).ok_or_else(bad)?),
        "scoped_keys" => c.scoped_keys = scoped_keys(key, raw)?,
        "peer_key" => c.peer_key = Some(text(raw).filter(|s| !s.is_empty()).ok_or_else(bad)?),
        "allow_command" => c.allow_command = flag(key, raw)?,
        "allowed_runners" => c.allowed_runners = kinds(key, raw)?,
        "allowed_hosts" => c.allowed_hosts = hosts(key, raw)?,
        "wake_allow" => c.wake_allow = wake_allow(key, raw)?,
        "api_key_file" => {
            c.api_key_file = Some(text(raw).filter(|s| !s.is_empty()).map(PathBuf::from).ok_or_else(bad)?)
        }
        "command_env" => c.command_env = variable_names(key, raw)?,
        "durability" => c.durability = text(raw).and_then(|s| s.parse().ok()).ok_or_else(bad)?,
        "body_limit" => c.body_limit = number(key, raw, 1024, 1 << 30)? as usize,
        "max_concurrent_children" => c.max_concurrent_children = number(key, raw, 1, MAX_CAPACITY)? as u32,
        "max_delivery_attempts" => c.max_delivery_attempts = number(key, raw, 1, 1_000)? as u32,
        "max_depth" => c.max_depth = number(key, raw, 1, 64)? as u32,
        "max_running_children" => c.max_running_children = Some(number(key, raw, 1, 1_000_000)? as u32),
        "retain_delivered_ms" => c.retain_delivered_ms = number(key, raw, 0, 10 * 365 * DAY_MS)?,
        "retain_dead_ms" => c.retain_dead_ms = number(key, raw, 0, 10 * 365 * DAY_MS)?,
        "drop_idle_sessions_ms" => c.drop_idle_sessions_ms = number(key, raw, 0, 10 * 365 * DAY_MS)?,
        "retention_interval_ms" => c.retention_interval_ms = number(key, raw, 0, DAY_MS)?,
        "min_lease_ms" => c.min_lease_ms = number(key, raw, 100, 3_600_000)?,
        "max_lease_ms" => c.max_lease_ms = number(key, raw, 100, 3_600_000)?,
        "default_lease_ms" => c.default_lease_ms = number(key, raw, 100, 3_600_000)?,
        "default_stall_ms" => c.default_stall_ms = number(key, raw, 1, 86_400_000)?,
        "default_timeout_ms" => c.default_timeout_ms = number(key, raw, 0, 604_800_000)?,
        "max_task_timeout_ms" => c.max_task_timeout_ms = number(key, raw, 0, 604_800_000)?,
        "max_retry_backoff_ms" => c.max_retry_backoff_ms = number(key, raw, 0, 3_600_000)?,
        "drain_timeout_ms" => c.drain_timeout_ms = number(key, raw, 0, 3_600_000)?,
        "commit_window_ms" => c.commit_window_ms = number(key, raw, 0, 1_000)?,
        "routing_threads" => c.routing_threads = number(key, raw, 0, 256)? as usize,
        "cache_bytes" => c.cache_bytes = number(key, raw, 1 << 20, 1 << 40)?,
        "max_tasks_per_call" => c.max_tasks_per_call = number(key, raw, 1, 1_000_000)? as usize,
        "max_input_bytes" => c.max_input_bytes = number(key, raw, 1, MAX_OUTPUT_BYTES as u64)? as usize,
        "max_output_bytes" => c.max_output_bytes = number(key, raw, 1, MAX_OUTPUT_BYTES as u64)? as usize,
        "max_session_capacity" => c.max_session_capacity = number(key, raw, 1, MAX_CAPACITY)? as u32,
        "max_live_children" => c.max_live_children = number(key, raw, 1, 100_000_000)? as usize,
        "body_timeout_ms" => c.body_timeout_ms = number(key, raw, 100, 3_600_000)?,
        _ => return Err(unknown_key(key)),
    }
    Ok(())
}

/// Whether `key` is a configuration key.
pub(super) fn is_key(key: &str) -> bool {
    KEYS.iter().any(|(k, _)| *k == key)
}

/// The configuration keys, as a message lists them.
pub(super) fn key_list() -> String {
    KEYS.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
}

/// Why `key` is not a configuration key, naming the nearest key when one is near.
pub(super) fn unknown_key(key: &str) -> String {
    let hint = nearest_key(key).map_or(String::new(), |k| format!(" (did you mean `{k}`?)"));
    format!("is not a configuration key{hint}; the keys are: {}", key_list())
}

/// The key `key` is most likely a misspelling of, if any is near enough.
pub(super) fn nearest_key(key: &str) -> Option<&'static str> {
    KEYS.iter()
        .map(|(k, _)| (edits(key, k), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 8))
        .min()
        .map(|(_, k)| k)
}

/// The Levenshtein distance of two keys (ASCII in practice; counted in characters).
fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diagonal + usize::from(ca != *cb)).min(row[j] + 1).min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}
