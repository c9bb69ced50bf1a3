//! The server's configuration: defaults, then a TOML file (`--config`), then the environment
//! (`BROOD_<KEY>`), then flags, each layer over the one before. Every key is checked when the
//! server starts: an unknown key, a wrong type or a value out of range is an error that names
//! the key, where it came from and what is accepted.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::Durability;

/// The effective configuration of `brood serve`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ServeConfig {
    /// Where to listen.
    pub listen: SocketAddr,
    /// The ledger folder.
    pub data_dir: PathBuf,
    /// The PostgreSQL database the ledger is kept in instead (`postgres://…`), when set; its
    /// password (if the address holds one) is not printed.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "without_password")]
    pub ledger: Option<String>,
    /// With a PostgreSQL ledger (shared by every process on it): where the other processes send
    /// this one the requests of sessions it serves (default `http://<listen>`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise: Option<String>,
    /// With a PostgreSQL ledger: this process's node id, stable across its restarts (default:
    /// the advertised address).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// With a PostgreSQL ledger: how long a session lease lasts without a renewal, in ms (a
    /// dead process's sessions are taken over about this long after its death).
    pub session_lease_ms: u64,
    /// The API key every `/v1` request must carry (`Authorization: Bearer <key>`).
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "redacted")]
    pub api_key: Option<String>,
    /// The file `api_key` was read from, when it was (its content, less one trailing newline,
    /// is the key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key_file: Option<PathBuf>,
    /// The credential requests between processes sharing a ledger carry (`x-brood-peer`)
    /// instead of the user's key; when unset, one is derived from `api_key`.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "redacted")]
    pub peer_key: Option<String>,
    /// Keys limited to the sessions whose id starts with a prefix (and their calls, children,
    /// claims and dead letters), besides `api_key`, which reaches everything.
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "scoped_redacted")]
    pub scoped_keys: Vec<super::scope::ScopedKey>,
    /// Whether `command` runners may run (the same as listing `command` in `allowed_runners`).
    pub allow_command: bool,
    /// The runner kinds a delegation may use; the others are refused with 403.
    pub allowed_runners: Vec<String>,
    /// Host names (or addresses) a request's `Host` may name besides loopback, the listen
    /// address and `advertise`: the names of a proxy in front. When set, `Host` is checked
    /// also on a server with a key (see `guard`).
    pub allowed_hosts: Vec<String>,
    /// Hosts, addresses and networks (CIDR) webhook wakes may go to besides public addresses:
    /// loopback and private addresses are refused unless listed here (see
    /// [`wake`](super::wake)).
    pub wake_allow: Vec<String>,
    /// The names of the server's environment variables a `command` child gets; it gets no
    /// others (but `BROOD_CHILD_ID` and its task's `env`).
    pub command_env: Vec<String>,
    /// What a flush brood relies on guarantees.
    pub durability: Durability,
    /// The largest request body, in bytes.
    pub body_limit: usize,
    /// Capacity of a new session.
    pub max_concurrent_children: u32,
    /// Delivery attempts of a new session's items before they are dead-lettered.
    pub max_delivery_attempts: u32,
    /// The deepest call accepted (a call in a top-level session is depth 1).
    pub max_depth: u32,
    /// The most children running at once over every session, shared round-robin by the
    /// sessions that want more (none: unlimited).
    pub max_running_children: Option<u32>,
    /// How long a call whose items were all delivered is kept after its last child finished, in
    /// ms.
    pub retain_delivered_ms: u64,
    /// How long a call with dead letters is kept after the last of them died, in ms.
    pub retain_dead_ms: u64,
    /// How long a session with nothing left and nothing live is kept, in ms (0: for good).
    pub drop_idle_sessions_ms: u64,
    /// How often retention sweeps, in ms (0: never in the background).
    pub retention_interval_ms: u64,
    /// The shortest lease a boundary may ask for, in ms.
    pub min_lease_ms: u64,
    /// The longest lease a boundary may ask for, in ms.
    pub max_lease_ms: u64,
    /// The lease of a boundary that names none, in ms.
    pub default_lease_ms: u64,
    /// The stall timeout of a task that names none, in ms.
    pub default_stall_ms: u64,
    /// The timeout of a task that names none, in ms (0: no timeout).
    pub default_timeout_ms: u64,
    /// How long a shutdown lets running children finish, in ms.
    pub drain_timeout_ms: u64,
    /// How long completions are gathered into one flush, in ms (0: no wait).
    pub commit_window_ms: u64,
    /// Threads session owners are spread over (0: on the supervisor's thread).
    pub routing_threads: usize,
    /// The bound of the ledger's page cache, in bytes.
    pub cache_bytes: u64,
    // The bounds of what one request and the server hold (see `check_bounds`).
    /// The most tasks one delegate may carry.
    pub max_tasks_per_call: usize,
    /// The largest `max_concurrent_children` a session may have (a `PUT` asking for more is
    /// refused); at least `max_concurrent_children`.
    pub max_session_capacity: u32,
    /// The most children queued or running (not yet ended) over every session; a delegate
    /// that would pass it is refused.
    pub max_live_children: usize,
    /// How long a request's body may take to arrive whole, in ms.
    pub body_timeout_ms: u64,
}

const DAY_MS: u64 = 24 * 60 * 60 * 1000;

impl ServeConfig {
    /// Where the other processes sharing the ledger reach this one.
    pub fn advertised(&self) -> String {
        self.advertise
            .clone()
            .unwrap_or_else(|| format!("http://{}", self.listen))
    }

    /// The credential of requests between the processes sharing a ledger: `peer_key`, else
    /// an HMAC-SHA256 of a fixed label under `api_key` (so the key itself never crosses, and a
    /// peer answer cannot be replayed as a user's key); none for a keyless server, whose peers
    /// trust loopback as it does.
    pub fn peer_credential(&self) -> Option<String> {
        use hmac::{KeyInit as _, Mac as _};
        if let Some(k) = &self.peer_key {
            return Some(k.clone());
        }
        let key = self.api_key.as_deref()?;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key.as_bytes()).ok()?;
        mac.update(b"brood peer credential 1");
        let tag = mac.finalize().into_bytes();
        Some(format!(
            "bpk_{}",
            tag.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ))
    }

    /// The retention these settings give.
    pub fn retention(&self) -> crate::Retention {
        use std::time::Duration;
        let some = |ms: u64| (ms > 0).then(|| Duration::from_millis(ms));
        crate::Retention {
            delivered: Duration::from_millis(self.retain_delivered_ms),
            dead: Duration::from_millis(self.retain_dead_ms),
            idle_session: some(self.drop_idle_sessions_ms),
            interval: some(self.retention_interval_ms),
            ..crate::Retention::default()
        }
    }
}

fn without_password<S: serde::Serializer>(url: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&hide_password(url.as_deref().unwrap_or_default()))
}

/// A PostgreSQL address with its password shown as `(set)`, whether it is given as
/// `user:password@` or as a `password=` parameter.
fn hide_password(url: &str) -> String {
    let mut shown = match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => match url[scheme + 3..at].find(':') {
            Some(colon) => format!("{}:(set){}", &url[..scheme + 3 + colon], &url[at..]),
            None => url.to_string(),
        },
        _ => url.to_string(),
    };
    if let Some(query) = shown.find('?') {
        let params: Vec<String> = shown[query + 1..]
            .split('&')
            .map(|p| match p.split_once('=') {
                Some(("password", _)) => "password=(set)".to_string(),
                _ => p.to_string(),
            })
            .collect();
        shown = format!("{}?{}", &shown[..query], params.join("&"));
    }
    shown
}

/// Scoped keys as printed: their prefixes, each key shown as `(set)`.
fn scoped_redacted<S: serde::Serializer>(keys: &[super::scope::ScopedKey], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(keys.iter().map(|k| format!("{}=(set)", k.prefix)))
}

fn redacted<S: serde::Serializer>(_: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str("(set)")
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            data_dir: PathBuf::from("./brood-data"),
            ledger: None,
            advertise: None,
            node: None,
            session_lease_ms: 10_000,
            api_key: None,
            api_key_file: None,
            peer_key: None,
            scoped_keys: Vec::new(),
            allow_command: false,
            allowed_runners: vec!["sim".into(), "external".into()],
            allowed_hosts: Vec::new(),
            wake_allow: Vec::new(),
            command_env: crate::runners::command::DEFAULT_ENV
                .iter()
                .map(|v| v.to_string())
                .collect(),
            durability: Durability::Fsync,
            body_limit: 8 << 20,
            max_concurrent_children: brood_actors::model::DEFAULT_MAX_CONCURRENT_CHILDREN,
            max_delivery_attempts: brood_actors::model::DEFAULT_MAX_DELIVERY_ATTEMPTS,
            max_depth: brood_actors::model::DEFAULT_MAX_DEPTH,
            max_running_children: None,
            retain_delivered_ms: 7 * DAY_MS,
            retain_dead_ms: 30 * DAY_MS,
            drop_idle_sessions_ms: 0,
            retention_interval_ms: 60_000,
            min_lease_ms: crate::MIN_LEASE_MS,
            max_lease_ms: crate::MAX_LEASE_MS,
            default_lease_ms: 60_000,
            default_stall_ms: brood_actors::model::DEFAULT_STALL_MS,
            default_timeout_ms: 0,
            drain_timeout_ms: 10_000,
            commit_window_ms: 0,
            routing_threads: crate::default_routing_threads(),
            cache_bytes: brood_actors::ledger::DEFAULT_CACHE_BYTES,
            max_tasks_per_call: 10_000,
            max_session_capacity: 1_024,
            max_live_children: 100_000,
            body_timeout_ms: 30_000,
        }
    }
}

/// A configuration that cannot be used, naming the key, its source and what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("configuration key `{key}` (from {source_name}): {problem}")]
pub struct ConfigError {
    /// The key.
    pub key: String,
    /// Where it came from: the file, `BROOD_<KEY>`, or `--flag`.
    pub source_name: String,
    /// What is wrong and what is accepted.
    pub problem: String,
}

/// Where a layer's values came from.
#[derive(Debug, Clone)]
enum Source {
    File(PathBuf),
    Env,
    Flag,
}

impl Source {
    fn name(&self, key: &str) -> String {
        match self {
            Source::File(p) => format!("file {}", p.display()),
            Source::Env => format!("environment variable BROOD_{}", key.to_ascii_uppercase()),
            Source::Flag => format!("flag --{}", key.replace('_', "-")),
        }
    }
}

/// The keys, with what each accepts (for messages and `--print-config`).
const KEYS: &[(&str, &str)] = &[
    ("listen", "an address:port such as 127.0.0.1:7070"),
    ("data_dir", "a folder path"),
    (
        "ledger",
        "a PostgreSQL address postgres://user@host:port/database (default: sled in data_dir)",
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
    ("drain_timeout_ms", "from 0 to 3600000"),
    ("commit_window_ms", "from 0 to 1000"),
    ("routing_threads", "from 0 to 256 (default: one per core)"),
    ("cache_bytes", "bytes, from 1048576 to 1099511627776 (default 67108864)"),
    ("max_tasks_per_call", "from 1 to 1000000 (default 10000)"),
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

/// One value as a layer gives it: TOML values keep their type; environment variables and flags
/// are text, parsed by the key's type.
#[derive(Debug, Clone)]
enum Raw {
    Toml(toml::Value),
    Text(String),
}

impl fmt::Display for Raw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Raw::Toml(v) => write!(f, "{v}"),
            Raw::Text(s) => write!(f, "{s:?}"),
        }
    }
}

/// Builds the effective configuration from a file (optional), the environment and flags.
/// `flags` holds only the flags given on the command line, by key.
pub fn resolve(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
    flags: BTreeMap<String, String>,
) -> Result<ServeConfig, ConfigError> {
    let mut layers: Vec<(Source, BTreeMap<String, Raw>)> = Vec::new();
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            key: "config".into(),
            source_name: format!("file {}", path.display()),
            problem: format!("cannot be read: {e}"),
        })?;
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| ConfigError {
            key: "config".into(),
            source_name: format!("file {}", path.display()),
            problem: format!("is not valid TOML: {}", e.message()),
        })?;
        let layer = table.into_iter().map(|(k, v)| (k, Raw::Toml(v))).collect();
        layers.push((Source::File(path.to_path_buf()), layer));
    }
    let mut from_env = BTreeMap::new();
    for (name, value) in env {
        let Some(key) = name.strip_prefix("BROOD_") else {
            continue;
        };
        let key = key.to_ascii_lowercase();
        // Variables of other tools may share the prefix; only known keys are configuration.
        if KEYS.iter().any(|(k, _)| *k == key) {
            from_env.insert(key, Raw::Text(value));
        }
    }
    layers.push((Source::Env, from_env));
    layers.push((
        Source::Flag,
        flags.into_iter().map(|(k, v)| (k, Raw::Text(v))).collect(),
    ));

    let mut config = ServeConfig::default();
    let mut key_sources = (None, None);
    for (source, layer) in &layers {
        for (key, raw) in layer {
            apply(&mut config, key, raw).map_err(|problem| ConfigError {
                key: key.clone(),
                source_name: source.name(key),
                problem,
            })?;
            match key.as_str() {
                "api_key" => key_sources.0 = Some(source.name(key)),
                "api_key_file" => key_sources.1 = Some(source.name(key)),
                _ => {}
            }
        }
    }
    if let (Some(file), Some(from)) = (config.api_key_file.clone(), key_sources.1) {
        if let Some(key_from) = key_sources.0 {
            return Err(ConfigError {
                key: "api_key_file".into(),
                source_name: from,
                problem: format!("is set, and so is api_key (from {key_from}); give the key one way"),
            });
        }
        config.api_key = Some(read_key_file(&file).map_err(|problem| ConfigError {
            key: "api_key_file".into(),
            source_name: from,
            problem,
        })?);
    }
    allow_command_either_way(&mut config);
    check(&config)?;
    Ok(config)
}

/// The key a key file holds: its text less one trailing newline, not empty.
fn read_key_file(file: &Path) -> Result<String, String> {
    let text =
        std::fs::read_to_string(file).map_err(|e| format!("the key file {} cannot be read: {e}", file.display()))?;
    let key = text
        .strip_suffix('\n')
        .map_or(text.as_str(), |k| k.strip_suffix('\r').unwrap_or(k));
    if key.is_empty() {
        return Err(format!(
            "the key file {} is empty; it must hold the API key",
            file.display()
        ));
    }
    Ok(key.to_string())
}

/// `allow_command` and `command` in `allowed_runners` say the same: either one sets both.
fn allow_command_either_way(c: &mut ServeConfig) {
    let listed = c.allowed_runners.iter().any(|k| k == "command");
    if c.allow_command && !listed {
        c.allowed_runners.push("command".into());
    }
    c.allow_command |= listed;
}

fn accepted(key: &str) -> &'static str {
    KEYS.iter().find(|(k, _)| *k == key).map_or("", |(_, a)| a)
}

fn text(raw: &Raw) -> Option<String> {
    match raw {
        Raw::Text(s) => Some(s.clone()),
        Raw::Toml(toml::Value::String(s)) => Some(s.clone()),
        Raw::Toml(_) => None,
    }
}

fn number(key: &str, raw: &Raw, min: u64, max: u64) -> Result<u64, String> {
    let n = match raw {
        Raw::Toml(toml::Value::Integer(i)) => u64::try_from(*i).ok(),
        Raw::Text(s) => s.trim().parse::<u64>().ok(),
        Raw::Toml(_) => None,
    };
    match n {
        Some(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!("{raw} is not accepted; {}", accepted(key))),
    }
}

fn flag(key: &str, raw: &Raw) -> Result<bool, String> {
    match raw {
        Raw::Toml(toml::Value::Boolean(b)) => Ok(*b),
        Raw::Text(s) if s == "true" || s == "1" => Ok(true),
        Raw::Text(s) if s == "false" || s == "0" => Ok(false),
        _ => Err(format!("{raw} is not accepted; {}", accepted(key))),
    }
}

/// A list: a TOML array of strings, or text separated by commas (empty items left out).
fn list(key: &str, raw: &Raw) -> Result<Vec<String>, String> {
    let bad = || format!("{raw} is not accepted; {}", accepted(key));
    match raw {
        Raw::Toml(toml::Value::Array(a)) => a
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
fn kinds(key: &str, raw: &Raw) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for kind in list(key, raw)? {
        if !crate::runners::KINDS.contains(&kind.as_str()) {
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
fn scoped_keys(key: &str, raw: &Raw) -> Result<Vec<super::scope::ScopedKey>, String> {
    let entries: Vec<String> = match raw {
        Raw::Toml(toml::Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| format!("holds something that is not a string; {}", accepted(key)))?,
        Raw::Text(s) => s
            .split(',')
            .map(|e| e.trim().to_string())
            .filter(|e| !e.is_empty())
            .collect(),
        Raw::Toml(_) => return Err(format!("is not an array of strings; {}", accepted(key))),
    };
    let mut out: Vec<super::scope::ScopedKey> = Vec::new();
    for entry in entries {
        let scoped = super::scope::ScopedKey::parse(&entry)?;
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
fn hosts(key: &str, raw: &Raw) -> Result<Vec<String>, String> {
    let bad = || format!("{raw} is not accepted; {}", accepted(key));
    let given: Vec<String> = match raw {
        Raw::Toml(toml::Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or_else(bad))
            .collect::<Result<_, _>>()?,
        _ => text(raw).ok_or_else(bad)?.split(',').map(str::to_string).collect(),
    };
    let mut out: Vec<String> = Vec::new();
    for entry in given {
        let trimmed = entry.trim();
        if trimmed.is_empty() && !matches!(raw, Raw::Toml(toml::Value::Array(_))) {
            continue;
        }
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
fn wake_allow(key: &str, raw: &Raw) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for entry in list(key, raw)? {
        let entry = super::wake::allow_entry(&entry).map_err(|e| format!("{e}; {}", accepted(key)))?;
        if !out.contains(&entry) {
            out.push(entry);
        }
    }
    Ok(out)
}

/// A list of environment variable names: a TOML array of strings, or text separated by commas.
/// A name is letters, digits and `_`, not starting with a digit.
fn variable_names(key: &str, raw: &Raw) -> Result<Vec<String>, String> {
    let bad = || format!("{raw} is not accepted; {}", accepted(key));
    let given: Vec<String> = match raw {
        Raw::Toml(toml::Value::Array(a)) => a
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

fn apply(c: &mut ServeConfig, key: &str, raw: &Raw) -> Result<(), String> {
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
        "drain_timeout_ms" => c.drain_timeout_ms = number(key, raw, 0, 3_600_000)?,
        "commit_window_ms" => c.commit_window_ms = number(key, raw, 0, 1_000)?,
        "routing_threads" => c.routing_threads = number(key, raw, 0, 256)? as usize,
        "cache_bytes" => c.cache_bytes = number(key, raw, 1 << 20, 1 << 40)?,
        "max_tasks_per_call" => c.max_tasks_per_call = number(key, raw, 1, 1_000_000)? as usize,
        "max_session_capacity" => c.max_session_capacity = number(key, raw, 1, MAX_CAPACITY)? as u32,
        "max_live_children" => c.max_live_children = number(key, raw, 1, 100_000_000)? as usize,
        "body_timeout_ms" => c.body_timeout_ms = number(key, raw, 100, 3_600_000)?,
        _ => {
            let known: Vec<&str> = KEYS.iter().map(|(k, _)| *k).collect();
            return Err(format!(
                "is not a configuration key; the keys are: {}",
                known.join(", ")
            ));
        }
    }
    Ok(())
}

/// Checks what no single key can: the lease bounds among themselves, and a key for any
/// address that is not loopback.
fn check(c: &ServeConfig) -> Result<(), ConfigError> {
    let err = |key: &str, problem: String| ConfigError {
        key: key.into(),
        source_name: "the effective configuration".into(),
        problem,
    };
    check_bounds(c)?;
    if c.max_lease_ms < c.min_lease_ms {
        return Err(err(
            "max_lease_ms",
            format!("{} is below min_lease_ms {}", c.max_lease_ms, c.min_lease_ms),
        ));
    }
    if !(c.min_lease_ms..=c.max_lease_ms).contains(&c.default_lease_ms) {
        return Err(err(
            "default_lease_ms",
            format!(
                "{} is outside min_lease_ms..=max_lease_ms ({}..={})",
                c.default_lease_ms, c.min_lease_ms, c.max_lease_ms
            ),
        ));
    }
    if c.ledger.is_some() && c.advertise.is_none() && c.listen.ip().is_unspecified() {
        return Err(err(
            "advertise",
            format!(
                "is not set, and {} listens on every interface: the other processes sharing the ledger must reach this one at an address of its own (set --advertise http://<host>:<port>)",
                c.listen
            ),
        ));
    }
    if !c.scoped_keys.is_empty() && c.api_key.is_none() {
        return Err(err(
            "scoped_keys",
            "are set but api_key is not: a server without a key lets every request reach everything, so a key limited to some sessions would limit nothing (set --api-key too)".into(),
        ));
    }
    if c.scoped_keys
        .iter()
        .any(|k| Some(&k.key) == c.api_key.as_ref() || Some(&k.key) == c.peer_key.as_ref())
    {
        return Err(err(
            "scoped_keys",
            "one of them is also the api_key or the peer_key: a scoped key must be a key of its own".into(),
        ));
    }
    if c.api_key.is_none() && !c.listen.ip().is_loopback() {
        return Err(err(
            "listen",
            format!(
                "{} is not a loopback address, and no api_key is set: without a key brood serves loopback only (set --api-key-file, --api-key or BROOD_API_KEY)",
                c.listen
            ),
        ));
    }
    Ok(())
}

/// The largest session capacity any configuration accepts.
const MAX_CAPACITY: u64 = 1_000_000;

/// The bounds among themselves: a new session's capacity is one a `PUT` could ask for.
fn check_bounds(c: &ServeConfig) -> Result<(), ConfigError> {
    if c.max_concurrent_children > c.max_session_capacity {
        return Err(ConfigError {
            key: "max_concurrent_children".into(),
            source_name: "the effective configuration".into(),
            problem: format!(
                "{} is above max_session_capacity {}: a new session's capacity must be one a session may have (raise max_session_capacity, or lower max_concurrent_children)",
                c.max_concurrent_children, c.max_session_capacity
            ),
        });
    }
    Ok(())
}

impl ServeConfig {
    /// Why a delegation may not use runner `kind` here, or `None` when it may. Kinds brood
    /// does not know are not this decision's: the runner registry refuses them (400).
    pub fn refuses_runner(&self, kind: &str) -> Option<String> {
        let allowed = self.allowed_runners.iter().any(|k| k == kind) || (kind == "command" && self.allow_command);
        if allowed || !crate::runners::KINDS.contains(&kind) {
            return None;
        }
        let hint = if kind == "command" {
            "start it with --allow-command, or list `command` in allowed_runners"
        } else {
            "list it in allowed_runners"
        };
        Some(format!(
            "`{kind}` runners are not allowed on this server (allowed: {}); {hint}",
            if self.allowed_runners.is_empty() {
                "none".to_string()
            } else {
                self.allowed_runners.join(", ")
            }
        ))
    }

    /// The configuration as TOML (the key shown as `(set)`), for `--print-config`.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot print the configuration: {e}\n"))
    }
}

#[cfg(test)]
mod tests {
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
            ("BROOD_SOMETHING_ELSE".to_string(), "ignored".to_string()),
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
}
