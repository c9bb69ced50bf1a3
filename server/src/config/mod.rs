//! The server's configuration: defaults, then a TOML file (`--config`), then the environment
//! (`BROOD_<KEY>`), then flags, each layer over the one before (merged by figment, which
//! remembers which layer each value came from). Every key is checked when the server starts:
//! an unknown key (a `BROOD_` variable naming none too), a wrong type or a value out of range
//! is an error that names the key, where it came from (the file with the line and column, the
//! variable, the flag) and what is accepted. The layers are `layers`; what each key accepts is
//! `keys`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use brood::Durability;

mod keys;
mod layers;
#[cfg(test)]
mod tests;

use figment::Figment;
use keys::{apply, KEYS};
use layers::Layer;

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
    /// With a PostgreSQL ledger: how long a process's tenure of a session (the key's session
    /// lease) lasts without a renewal, in ms (a dead process's sessions are taken over about
    /// this long after its death).
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
    pub scoped_keys: Vec<crate::scope::ScopedKey>,
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
    /// The longest timeout a task may have, in ms (0: no bound): a task naming a longer one is
    /// refused, and one naming none gets `default_timeout_ms`, or this when that is 0. It
    /// bounds how long any child runs, and so how long a sync call holds its request.
    pub max_task_timeout_ms: u64,
    /// The longest wait a task's retry policy may ask for between attempts, in ms: with
    /// `max_task_timeout_ms`, it bounds how long a retried child takes, and so a sync call.
    pub max_retry_backoff_ms: u64,
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
    /// The most a task's `input` may take, as compact JSON, in bytes.
    pub max_input_bytes: usize,
    /// The most an external worker's `output` may take, as compact JSON, in bytes.
    pub max_output_bytes: usize,
    /// The largest `max_concurrent_children` a session may have (a `PUT` asking for more is
    /// refused); at least `max_concurrent_children`.
    pub max_session_capacity: u32,
    /// The most children queued or running (not yet ended) over every session; a delegate
    /// that would pass it is refused.
    pub max_live_children: usize,
    /// How long a request's body may take to arrive whole, in ms.
    pub body_timeout_ms: u64,
}

pub(super) const DAY_MS: u64 = 24 * 60 * 60 * 1000;

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
    pub fn retention(&self) -> brood::Retention {
        use std::time::Duration;
        let some = |ms: u64| (ms > 0).then(|| Duration::from_millis(ms));
        brood::Retention {
            delivered: Duration::from_millis(self.retain_delivered_ms),
            dead: Duration::from_millis(self.retain_dead_ms),
            idle_session: some(self.drop_idle_sessions_ms),
            interval: some(self.retention_interval_ms),
            ..brood::Retention::default()
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
fn scoped_redacted<S: serde::Serializer>(keys: &[crate::scope::ScopedKey], s: S) -> Result<S::Ok, S::Error> {
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
            command_env: brood::runners::command::DEFAULT_ENV
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
            min_lease_ms: brood::MIN_LEASE_MS,
            max_lease_ms: brood::MAX_LEASE_MS,
            default_lease_ms: 60_000,
            default_stall_ms: brood_actors::model::DEFAULT_STALL_MS,
            default_timeout_ms: 0,
            max_task_timeout_ms: 0,
            max_retry_backoff_ms: 3_600_000,
            drain_timeout_ms: 10_000,
            commit_window_ms: 0,
            routing_threads: brood::default_routing_threads(),
            cache_bytes: brood_actors::ledger::DEFAULT_CACHE_BYTES,
            max_tasks_per_call: 10_000,
            max_input_bytes: 1 << 20,
            max_output_bytes: 1 << 20,
            max_session_capacity: 1_024,
            max_live_children: 100_000,
            body_timeout_ms: 30_000,
        }
    }
}

/// A configuration that cannot be used, naming the key, its source and what is accepted.
#[derive(Debug, thiserror::Error)]
#[error("configuration key `{key}` (from {source_name}): {problem}")]
pub struct ConfigError {
    /// The key.
    pub key: String,
    /// Where it came from: the file (with the line and column of the value, when it has one),
    /// `environment variable BROOD_<KEY>`, `flag --<key>`, or the effective configuration.
    pub source_name: String,
    /// What is wrong and what is accepted.
    pub problem: String,
    /// The error underneath, when there is one (the file's read or its TOML).
    #[source]
    pub cause: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl ConfigError {
    fn new(key: &str, source_name: String, problem: String) -> ConfigError {
        ConfigError {
            key: key.into(),
            source_name,
            problem,
            cause: None,
        }
    }
}

/// Builds the effective configuration from a file (optional), the environment and flags,
/// each layer over the one before, over the defaults. `flags` holds only the flags given on
/// the command line, by key. Every value given is checked, also one a later layer overrides.
pub fn resolve(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
    flags: BTreeMap<String, String>,
) -> Result<ServeConfig, ConfigError> {
    let mut given = Vec::new();
    if let Some(path) = file {
        given.push(Layer::file(path)?);
    }
    given.push(Layer::environment(env)?);
    given.push(Layer::flags(flags));
    let mut figment = Figment::new();
    for layer in given {
        check(&layer)?;
        figment = figment.merge(layer);
    }

    // Each key as the highest layer that gives it has it.
    let mut config = ServeConfig::default();
    let unknown_source = figment::Metadata::default();
    for (key, _) in KEYS {
        let Ok(value) = figment.find_value(key) else {
            continue;
        };
        let metadata = figment.get_metadata(value.tag()).unwrap_or(&unknown_source);
        apply(&mut config, key, &layers::raw(metadata, &value))
            .map_err(|problem| ConfigError::new(key, layers::source_name(metadata, key), problem))?;
    }
    let source_of = |key: &str| figment.find_metadata(key).map(|m| layers::source_name(m, key));
    if let (Some(file), Some(from)) = (config.api_key_file.clone(), source_of("api_key_file")) {
        if let Some(key_from) = source_of("api_key") {
            return Err(ConfigError::new(
                "api_key_file",
                from,
                format!("is set, and so is api_key (from {key_from}); give the key one way"),
            ));
        }
        config.api_key = Some(read_key_file(&file, from)?);
    }
    allow_command_either_way(&mut config);
    check_effective(&config)?;
    Ok(config)
}

/// Every value of `layer` is one its key accepts.
fn check(layer: &Layer) -> Result<(), ConfigError> {
    let mut scratch = ServeConfig::default();
    for (key, raw) in layer.values() {
        apply(&mut scratch, key, &raw).map_err(|problem| ConfigError::new(key, layer.source_name(key), problem))?;
    }
    Ok(())
}

/// The key a key file holds: its text less one trailing newline, not empty. `from` is where
/// `api_key_file` was set.
fn read_key_file(file: &Path, from: String) -> Result<String, ConfigError> {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) => {
            return Err(ConfigError {
                problem: format!("the key file {} cannot be read: {e}", file.display()),
                cause: Some(Box::new(e)),
                ..ConfigError::new("api_key_file", from, String::new())
            })
        }
    };
    let key = text
        .strip_suffix('\n')
        .map_or(text.as_str(), |k| k.strip_suffix('\r').unwrap_or(k));
    if key.is_empty() {
        return Err(ConfigError::new(
            "api_key_file",
            from,
            format!("the key file {} is empty; it must hold the API key", file.display()),
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

/// Checks what no single key can: the lease bounds among themselves, and a key for any
/// address that is not loopback.
fn check_effective(c: &ServeConfig) -> Result<(), ConfigError> {
    let err = |key: &str, problem: String| ConfigError::new(key, EFFECTIVE.into(), problem);
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
    if c.max_task_timeout_ms > 0 && c.default_timeout_ms > c.max_task_timeout_ms {
        return Err(err(
            "default_timeout_ms",
            format!(
                "{} is above max_task_timeout_ms {}",
                c.default_timeout_ms, c.max_task_timeout_ms
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

/// The source named by an error of keys together.
const EFFECTIVE: &str = "the effective configuration";

/// The bounds among themselves: a new session's capacity is one a `PUT` could ask for.
fn check_bounds(c: &ServeConfig) -> Result<(), ConfigError> {
    if c.max_concurrent_children > c.max_session_capacity {
        return Err(ConfigError::new(
            "max_concurrent_children",
            EFFECTIVE.into(),
            format!(
                "{} is above max_session_capacity {}: a new session's capacity must be one a session may have (raise max_session_capacity, or lower max_concurrent_children)",
                c.max_concurrent_children, c.max_session_capacity
            ),
        ));
    }
    Ok(())
}

impl ServeConfig {
    /// Why a delegation may not use runner `kind` here, or `None` when it may. Kinds brood
    /// does not know are not this decision's: the runner registry refuses them (400).
    pub fn refuses_runner(&self, kind: &str) -> Option<String> {
        let allowed = self.allowed_runners.iter().any(|k| k == kind) || (kind == "command" && self.allow_command);
        if allowed || !brood::runners::KINDS.contains(&kind) {
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
