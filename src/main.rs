//! The `brood` binary: `brood demo` runs a scripted parent against the embedded engine;
//! `brood mcp` speaks MCP on stdio (`mcp`).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use brood::{Brood, BroodConfig, DelegateReply, DelegateRequest, ItemKind, SessionSettings, TaskSpec, Turn};
use clap::{Parser, Subcommand};
use serde_json::json;

mod bench;
mod chaos;
mod inspect;
mod mcp;
mod workload;

#[derive(Parser, Debug)]
#[command(
    name = "brood",
    version,
    about = "Durable, turn-boundary routing of delegated child work"
)]
struct Cli {
    /// Log filter (also RUST_LOG), e.g. `brood=debug`.
    #[arg(long, global = true, default_value = "warn")]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a scripted parent against the embedded engine and print its timeline.
    Demo {
        /// The ledger folder (sled).
        #[arg(long, default_value = "./brood-data")]
        data_dir: PathBuf,
        /// The parent reaches a turn boundary this often, in ms.
        #[arg(long, default_value_t = 250)]
        turn_ms: u64,
    },
    /// Serve brood's HTTP API (docs/http.md) on the embedded engine.
    Serve(Box<ServeArgs>),
    /// Speak MCP (the Model Context Protocol) on stdin/stdout: brood's tools for an agent
    /// runtime, over an engine in this process (`--data-dir`) or a running server (`--url`).
    Mcp(McpArgs),
    /// Summarise each session (counts, calls by state, oldest unfinished child, dead letters),
    /// or with --tree show its calls, units and children a page at a time; of a running server
    /// (`--server`) or of a data dir no process holds (`--data-dir`, read without changing it).
    Inspect(InspectArgs),
    /// Run a seeded fault campaign (faults and SIGKILLs) and check the invariants.
    Chaos(ChaosArgs),
    /// Measure brood's paths beside raw baselines, in one run, and print each ratio.
    Bench(BenchArgs),
    /// One life of a chaos campaign's worker (started by `brood chaos`).
    #[command(hide = true)]
    ChaosWorker {
        #[command(flatten)]
        args: ChaosArgs,
        /// Which life of the campaign this is.
        #[arg(long)]
        life: usize,
        /// Which of the campaign's worker processes this is.
        #[arg(long, default_value_t = 0)]
        slot: usize,
    },
}

/// Flags of `brood bench`.
#[derive(clap::Args, Debug, Clone)]
struct BenchArgs {
    /// Sizes for CI (well under 2 minutes on 2 cores in a release build).
    #[arg(long)]
    quick: bool,
    /// Where the scratch ledgers go (a fresh folder inside it, removed at the end).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// `fsync` (default) or `flush`.
    #[arg(long, default_value = "fsync")]
    durability: String,
    /// Print one JSON object: {"figures": [{"name", "value", "unit", "baseline", "ratio"}], "machine": {…}}.
    #[arg(long)]
    json: bool,
    /// Write an SVG of the latency distribution and the throughput over time.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Only these groups (durable, latency, claim, recovery, rebuild, rss, sessions, http,
    /// takeover (with --ledger); and growth, which runs only when named), comma-separated.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Routing threads of the engines measured (default: one per core; 0: none).
    #[arg(long)]
    routing_threads: Option<usize>,
    /// Keep the engines' ledgers on this PostgreSQL database (postgres://user@host:port/db), a
    /// fresh schema each, and measure the baselines there too; adds the `takeover` group.
    #[arg(long)]
    ledger: Option<String>,
}

/// Flags of `brood serve`; each is also `BROOD_<KEY>` and a key of the `--config` file, and
/// a flag given wins over both.
#[derive(clap::Args, Debug, Clone)]
struct ServeArgs {
    /// A TOML file of settings (keys as the flags, in snake_case).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print the effective configuration and exit.
    #[arg(long)]
    print_config: bool,
    /// Where to listen (default 127.0.0.1:7070).
    #[arg(long)]
    listen: Option<String>,
    /// The ledger folder (default ./brood-data).
    #[arg(long)]
    data_dir: Option<String>,
    /// Keep the ledger in PostgreSQL instead: postgres://user@host:port/database.
    #[arg(long)]
    ledger: Option<String>,
    /// With --ledger: where the other processes on the database reach this one (default
    /// http://<listen>).
    #[arg(long)]
    advertise: Option<String>,
    /// With --ledger: this process's node id, stable across restarts (default: the advertised
    /// address).
    #[arg(long)]
    node: Option<String>,
    /// With --ledger: how long a process's tenure of a session (its session lease) lasts
    /// without a renewal, in ms (default 10000).
    #[arg(long)]
    session_lease_ms: Option<String>,
    /// The key every /v1 request must carry as `Authorization: Bearer <key>` (a flag is seen
    /// by every user of the machine in the process list: prefer --api-key-file).
    #[arg(long)]
    api_key: Option<String>,
    /// Keys limited to some sessions, comma-separated `<prefix>=<key>` entries: each reaches
    /// only the sessions whose id starts with its prefix (needs --api-key).
    #[arg(long)]
    scoped_keys: Option<String>,
    /// With --ledger: the credential of requests between the processes sharing it (default:
    /// derived from the API key).
    #[arg(long)]
    peer_key: Option<String>,
    /// A file holding the key (one trailing newline is dropped).
    #[arg(long)]
    api_key_file: Option<String>,
    /// Allow `command` runners.
    #[arg(long)]
    allow_command: bool,
    /// The runner kinds a delegation may use, comma-separated (default sim,external; plus
    /// command with --allow-command).
    #[arg(long)]
    allowed_runners: Option<String>,
    /// Host names besides loopback a request's Host header may name, comma-separated (the
    /// names of a proxy in front; when set, Host is checked also with an API key).
    #[arg(long)]
    allowed_hosts: Option<String>,
    /// A host, IP address or CIDR network webhook wakes may go to besides public addresses
    /// (loopback and private ones are refused unless listed); repeatable, or comma-separated.
    #[arg(long)]
    wake_allow: Vec<String>,
    /// The names of the server's environment variables a command child gets, comma-separated
    /// (default PATH,HOME,LANG); it gets no others.
    #[arg(long)]
    command_env: Option<String>,
    /// `fsync` (default) or `flush`.
    #[arg(long)]
    durability: Option<String>,
    /// The largest request body, in bytes (default 8 MiB).
    #[arg(long)]
    body_limit: Option<String>,
    /// Capacity of a new session (default 8).
    #[arg(long)]
    max_concurrent_children: Option<String>,
    /// Delivery attempts of a new session's items before they are dead-lettered (default 8).
    #[arg(long)]
    max_delivery_attempts: Option<String>,
    /// The deepest call accepted: a call in a top-level session is depth 1, one in a child's
    /// nested session depth 2 (default 2).
    #[arg(long)]
    max_depth: Option<String>,
    /// The most children running at once over every session; when it binds, sessions are
    /// admitted round-robin (default: unlimited).
    #[arg(long)]
    max_running_children: Option<String>,
    /// How long a call whose items were all delivered is kept after its last child finished, in
    /// ms (default 7 days).
    #[arg(long)]
    retain_delivered_ms: Option<String>,
    /// How long a call with dead letters is kept after the last of them died, in ms (default
    /// 30 days).
    #[arg(long)]
    retain_dead_ms: Option<String>,
    /// How long a session with nothing left and nothing live is kept, in ms (0, the default:
    /// for good).
    #[arg(long)]
    drop_idle_sessions_ms: Option<String>,
    /// How often retention sweeps, in ms (0: never in the background; default 60000).
    #[arg(long)]
    retention_interval_ms: Option<String>,
    /// The shortest lease a boundary may ask for, in ms (default 100).
    #[arg(long)]
    min_lease_ms: Option<String>,
    /// The longest lease a boundary may ask for, in ms (default 3600000).
    #[arg(long)]
    max_lease_ms: Option<String>,
    /// The lease of a boundary that names none, in ms (default 60000).
    #[arg(long)]
    default_lease_ms: Option<String>,
    /// The stall timeout of a task that names none, in ms (default 450000).
    #[arg(long)]
    default_stall_ms: Option<String>,
    /// The timeout of a task that names none, in ms (default 0: none).
    #[arg(long)]
    default_timeout_ms: Option<String>,
    /// The longest timeout a task may have, in ms (default 0: no bound).
    #[arg(long)]
    max_task_timeout_ms: Option<String>,
    /// The longest wait a task's retry policy may ask for, in ms (default 3600000).
    #[arg(long)]
    max_retry_backoff_ms: Option<String>,
    /// How long a shutdown lets running children finish, in ms (default 10000).
    #[arg(long)]
    drain_timeout_ms: Option<String>,
    /// How long completions are gathered into one flush, in ms (default 0: no wait).
    #[arg(long)]
    commit_window_ms: Option<String>,
    /// Threads session owners are spread over (default: one per core).
    #[arg(long)]
    routing_threads: Option<String>,
    /// The bound of the ledger's page cache, in bytes (default 67108864).
    #[arg(long)]
    cache_bytes: Option<String>,
    /// The most tasks one delegate may carry (default 10000).
    #[arg(long)]
    max_tasks_per_call: Option<String>,
    /// The most a task's input may take as JSON, in bytes (default 1048576).
    #[arg(long)]
    max_input_bytes: Option<String>,
    /// The most an external worker's output may take as JSON, in bytes (default 1048576).
    #[arg(long)]
    max_output_bytes: Option<String>,
    /// The largest max_concurrent_children a session may ask for (default 1024).
    #[arg(long)]
    max_session_capacity: Option<String>,
    /// The most children queued or running over every session; a delegate that would pass it
    /// is refused with 503 (default 100000).
    #[arg(long)]
    max_live_children: Option<String>,
    /// How long a request's body may take to arrive whole, in ms (default 30000).
    #[arg(long)]
    body_timeout_ms: Option<String>,
}

impl ServeArgs {
    /// The flags given, by configuration key.
    fn flags(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let pairs = [
            ("listen", &self.listen),
            ("data_dir", &self.data_dir),
            ("ledger", &self.ledger),
            ("advertise", &self.advertise),
            ("node", &self.node),
            ("session_lease_ms", &self.session_lease_ms),
            ("api_key", &self.api_key),
            ("scoped_keys", &self.scoped_keys),
            ("peer_key", &self.peer_key),
            ("allowed_runners", &self.allowed_runners),
            ("allowed_hosts", &self.allowed_hosts),
            ("api_key_file", &self.api_key_file),
            ("command_env", &self.command_env),
            ("durability", &self.durability),
            ("body_limit", &self.body_limit),
            ("max_concurrent_children", &self.max_concurrent_children),
            ("max_delivery_attempts", &self.max_delivery_attempts),
            ("max_depth", &self.max_depth),
            ("max_running_children", &self.max_running_children),
            ("retain_delivered_ms", &self.retain_delivered_ms),
            ("retain_dead_ms", &self.retain_dead_ms),
            ("drop_idle_sessions_ms", &self.drop_idle_sessions_ms),
            ("retention_interval_ms", &self.retention_interval_ms),
            ("min_lease_ms", &self.min_lease_ms),
            ("max_lease_ms", &self.max_lease_ms),
            ("default_lease_ms", &self.default_lease_ms),
            ("default_stall_ms", &self.default_stall_ms),
            ("default_timeout_ms", &self.default_timeout_ms),
            ("max_task_timeout_ms", &self.max_task_timeout_ms),
            ("max_retry_backoff_ms", &self.max_retry_backoff_ms),
            ("drain_timeout_ms", &self.drain_timeout_ms),
            ("commit_window_ms", &self.commit_window_ms),
            ("routing_threads", &self.routing_threads),
            ("cache_bytes", &self.cache_bytes),
            ("max_tasks_per_call", &self.max_tasks_per_call),
            ("max_input_bytes", &self.max_input_bytes),
            ("max_output_bytes", &self.max_output_bytes),
            ("max_session_capacity", &self.max_session_capacity),
            ("max_live_children", &self.max_live_children),
            ("body_timeout_ms", &self.body_timeout_ms),
        ];
        for (key, value) in pairs {
            if let Some(v) = value {
                out.insert(key.to_string(), v.clone());
            }
        }
        if self.allow_command {
            out.insert("allow_command".into(), "true".into());
        }
        if !self.wake_allow.is_empty() {
            out.insert("wake_allow".into(), self.wake_allow.join(","));
        }
        out
    }
}

/// Flags of `brood mcp`.
#[derive(clap::Args, Debug, Clone)]
struct McpArgs {
    /// A running server (http://host:port, or its http://host:port/mcp) whose `/mcp` answers;
    /// without it an engine over --data-dir runs in this process.
    #[arg(long, conflicts_with_all = ["data_dir", "config"])]
    url: Option<String>,
    /// The server's key (also BROOD_API_KEY).
    #[arg(long, requires = "url")]
    api_key: Option<String>,
    /// The ledger folder of the engine in this process (default ./brood-data).
    #[arg(long)]
    data_dir: Option<String>,
    /// A TOML file of settings for the engine in this process, as `brood serve --config`.
    #[arg(long)]
    config: Option<PathBuf>,
}

/// Flags of `brood inspect`.
#[derive(clap::Args, Debug, Clone)]
struct InspectArgs {
    /// A running server's URL (http://host:port); without it, a data dir is read.
    #[arg(long, conflicts_with = "data_dir")]
    server: Option<String>,
    /// The server's key (also BROOD_API_KEY).
    #[arg(long, requires = "server")]
    api_key: Option<String>,
    /// A data dir no process holds (default ./brood-data); it is read, never changed.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Show this session only.
    #[arg(long)]
    session: Option<String>,
    /// Show the tree instead of the summary: each session's calls (by set) with their units
    /// and children (goal, status, times, delivery, first line), its live claims, and the
    /// dead letters of the calls shown.
    #[arg(long)]
    tree: bool,
    /// With --tree: show at most N calls per session, and say how many more there are.
    #[arg(long, value_name = "N", default_value_t = 20, requires = "tree",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    limit: u64,
    /// With --tree: show the calls after this one, of the session holding it (the call id a
    /// tree's "more calls" line names).
    #[arg(long, value_name = "CALL_ID", requires = "tree")]
    after: Option<String>,
    /// Print the view (summary or tree) as one JSON document instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug, Clone)]
struct ChaosArgs {
    /// The seed: the same seed gives the same fault plan.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Children to deliver in all.
    #[arg(long, default_value_t = 500)]
    children: usize,
    /// Mean time between SIGKILLs (e.g. 500ms, 2s).
    #[arg(long, default_value = "1s", value_parser = chaos::parse_duration)]
    kill_every: Duration,
    /// Faults to inject: kill, ledger_write, ledger_flush, coalescer_handoff, owner_handler,
    /// runner_hang, or all. Faults other than kill need a build with `--features failpoints`.
    #[arg(long, default_value = "kill")]
    faults: String,
    /// The campaign's folder; must be empty or absent.
    #[arg(long, default_value = "./brood-chaos")]
    data_dir: PathBuf,
    /// Keep the ledger in PostgreSQL (postgres://user@host:port/database; the campaign takes
    /// a fresh schema in it), shared by several worker processes.
    #[arg(long)]
    ledger: Option<String>,
    /// Worker processes at once, each killed on its own schedule (default 1; 3 with --ledger).
    #[arg(long)]
    processes: Option<usize>,
    /// The campaign's schema (set by `brood chaos` for its workers).
    #[arg(long, hide = true)]
    schema: Option<String>,
}

/// The variables of secrets brood reads from its environment: the API key, the peer
/// credential, and the ledger's address (which may hold a password).
const SECRET_VARIABLES: [&std::ffi::CStr; 3] = [c"BROOD_API_KEY", c"BROOD_PEER_KEY", c"BROOD_LEDGER"];

/// Takes the [`SECRET_VARIABLES`] out of the environment, so no child process inherits them,
/// and blanks their values in the environment block the process started with, which the
/// kernel shows in `/proc/<pid>/environ` to every process of the same user (a `command` child
/// among them) whatever the environment holds later. Returns those that were set, by name.
/// Must run before any thread starts.
fn take_secrets() -> anyhow::Result<BTreeMap<String, String>> {
    extern "C" {
        /// The process's environment: a NULL-terminated array of `NAME=value` strings.
        static mut environ: *mut *mut libc::c_char;
    }
    let mut taken = BTreeMap::new();
    for name in SECRET_VARIABLES {
        let text = name.to_string_lossy().into_owned();
        let prefix = format!("{text}=");
        // SAFETY: no other thread exists yet (this is the first thing `main` does, and nothing
        // before `main` starts one), so nothing reads or changes the environment meanwhile.
        // Each entry is a NUL-terminated string in the process's memory (the start-up block,
        // for what the process was started with); blanking its value in place keeps it one.
        // Every entry of the name is blanked, not only the first (which is the one `getenv`
        // gives, and so the one taken): a name given twice leaves no value behind. unsetenv
        // then takes the entries out of the environment without freeing them.
        let value = unsafe {
            let mut first: Option<Vec<u8>> = None;
            let mut entry = environ;
            while !entry.is_null() && !(*entry).is_null() {
                let bytes = std::ffi::CStr::from_ptr(*entry).to_bytes();
                if let Some(value) = bytes.strip_prefix(prefix.as_bytes()) {
                    let len = value.len();
                    first.get_or_insert_with(|| value.to_vec());
                    std::ptr::write_bytes((*entry).add(prefix.len()), 0, len);
                }
                entry = entry.add(1);
            }
            let Some(value) = first else { continue };
            std::env::remove_var(&text);
            value
        };
        let value = String::from_utf8(value).map_err(|_| anyhow::anyhow!("{text} is not UTF-8 text"))?;
        taken.insert(text, value);
    }
    Ok(taken)
}

/// The environment as text, for the configuration. A variable whose name or value is not
/// UTF-8 can be no setting: one named `BROOD_…` is refused, the others are left out.
fn text_environment() -> anyhow::Result<Vec<(String, String)>> {
    let mut vars = Vec::new();
    for (name, value) in std::env::vars_os() {
        match (name.into_string(), value.into_string()) {
            (Ok(name), Ok(value)) => vars.push((name, value)),
            (Ok(name), Err(_)) if name.starts_with("BROOD_") => {
                bail!("the environment variable {name} is not UTF-8 text")
            }
            _ => {}
        }
    }
    Ok(vars)
}

fn main() -> anyhow::Result<()> {
    let mut secrets = take_secrets()?;
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&cli.log))
        .context("bad --log filter")?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Command::Demo { data_dir, turn_ms } => {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(demo(data_dir, turn_ms))
        }
        Command::Serve(args) => {
            let env = text_environment()?.into_iter().chain(secrets);
            let config = brood_server::config::resolve(args.config.as_deref(), env, args.flags())?;
            if args.print_config {
                print!("{}", config.to_toml());
                return Ok(());
            }
            actix_web::rt::System::new()
                .block_on(brood_server::serve(config))
                .context("serving")?;
            Ok(())
        }
        Command::Mcp(args) => match args.url {
            Some(url) => mcp::bridge(&url, args.api_key.or(secrets.remove("BROOD_API_KEY"))),
            None => {
                let env = text_environment()?.into_iter().chain(secrets);
                let flags = args.data_dir.map(|d| ("data_dir".to_string(), d)).into_iter().collect();
                mcp::embedded(brood_server::config::resolve(args.config.as_deref(), env, flags)?)
            }
        },
        Command::Inspect(args) => inspect(args, secrets.remove("BROOD_API_KEY")),
        Command::Chaos(args) => {
            let faults = chaos::Fault::parse_list(&args.faults).map_err(anyhow::Error::msg)?;
            let campaign = chaos::Campaign {
                seed: args.seed,
                children: args.children,
                kill_every: args.kill_every,
                faults,
                data_dir: args.data_dir,
                processes: args.processes.unwrap_or(if args.ledger.is_some() { 3 } else { 1 }),
                ledger: args.ledger,
            };
            let exe = std::env::current_exe().context("finding the brood executable")?;
            let summary = chaos::run(&campaign, &exe).map_err(anyhow::Error::msg)?;
            if summary.acked_twice > 0 {
                println!("chaos: {} items were acked twice (I2 broken)", summary.acked_twice);
            }
            if let Some(n) = summary.takeups {
                println!("chaos: the session was taken up {n} times by the worker processes");
            }
            if summary.dead > 0 {
                println!(
                    "chaos: {} results ran out of delivery attempts and were dead-lettered",
                    summary.dead
                );
            }
            // What the counts mean, then the campaign's one line, last.
            for line in summary.legend() {
                println!("{line}");
            }
            println!("{}", summary.line());
            if summary.broken() {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Bench(args) => {
            let opts = bench::Options {
                quick: args.quick,
                data_dir: args.data_dir,
                durability: args.durability.parse().map_err(anyhow::Error::msg)?,
                only: args.only,
                plot: args.plot,
                routing_threads: args.routing_threads,
                ledger: args.ledger,
            };
            let (figures, machine) = bench::run(&opts)?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&bench::to_json(&figures, machine))?);
            } else {
                print!("{}", bench::table(&figures));
                if let Some(p) = &opts.plot {
                    println!("plot written to {}", p.display());
                }
            }
            Ok(())
        }
        Command::ChaosWorker { args, life, slot } => {
            let faults = chaos::Fault::parse_list(&args.faults).map_err(anyhow::Error::msg)?;
            let plan = chaos::Plan::new(args.seed, &faults, args.kill_every);
            let store = match (args.ledger, args.schema) {
                (Some(url), Some(schema)) => chaos::Store::Postgres(url, schema),
                _ => chaos::Store::Sled(args.data_dir.join(chaos::LEDGER)),
            };
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(chaos::worker(
                &args.data_dir,
                &store,
                slot,
                args.seed,
                args.children,
                life,
                plan,
            ))
            .map_err(anyhow::Error::msg)
        }
    }
}

fn inspect(args: InspectArgs, env_key: Option<String>) -> anyhow::Result<()> {
    let session = args.session.as_deref();
    let found = match &args.server {
        Some(url) => {
            let mut source = inspect::ServerSource::new(url);
            if let Some(key) = args.api_key.or(env_key) {
                source = source.api_key(key);
            }
            inspect::from_server(&source, session).with_context(|| format!("inspecting the server at {url}"))?
        }
        None => {
            let dir = args.data_dir.unwrap_or_else(|| PathBuf::from("./brood-data"));
            inspect::from_data_dir(&dir, session).with_context(|| format!("inspecting {}", dir.display()))?
        }
    };
    if args.tree {
        let limit = usize::try_from(args.limit).unwrap_or(usize::MAX);
        let page = found.page(limit, args.after.as_deref())?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&page)?);
        } else {
            print!("{}", inspect::table::tree(&page));
        }
    } else {
        let summary = inspect::Summary::of(&found);
        if args.json {
            println!("{}", serde_json::to_string_pretty(&summary)?);
        } else {
            print!("{}", inspect::table::summary(&summary));
        }
    }
    Ok(())
}

/// The demo's call: 12 sim children, 50 ms to 3 s, one failure inside a group of 3.
fn demo_tasks() -> Vec<TaskSpec> {
    let plain = [
        ("read the failing test log", 50),
        ("grep the codebase for the panic site", 120),
        ("check the CI history of the branch", 400),
        ("summarise the open issues about flush", 700),
        ("bisect the regression range", 3000),
        ("draft the release note", 900),
        ("list the callers of Ledger::flush", 250),
        ("read the sled changelog", 1500),
        ("benchmark the write path", 2200),
    ];
    let mut tasks: Vec<TaskSpec> = plain
        .iter()
        .map(|(goal, ms)| {
            let summary = format!("{goal}: finished after {ms} ms of simulated work");
            TaskSpec::new(*goal, json!({"kind": "sim", "ms": ms, "summary": summary}))
        })
        .collect();
    for (goal, ms, outcome) in [
        ("triage: reproduce the crash", 300, "fail"),
        ("triage: collect core dumps", 1200, "ok"),
        ("triage: write the post-mortem", 2600, "ok"),
    ] {
        let mut t = TaskSpec::new(goal, json!({"kind": "sim", "ms": ms, "outcome": outcome}));
        t.group = Some("triage".into());
        tasks.push(t);
    }
    tasks
}

async fn demo(data_dir: PathBuf, turn_ms: u64) -> anyhow::Result<()> {
    let brood = Brood::open(BroodConfig::new(&data_dir))
        .with_context(|| format!("opening the ledger in {}", data_dir.display()))?;
    let t0 = Instant::now();
    let at = move || t0.elapsed().as_millis();
    let wakes = Arc::new(Mutex::new(Vec::<u128>::new()));
    let wake_log = wakes.clone();
    let session = "demo-parent";
    brood
        .open_session(
            session,
            SessionSettings::default().wake(move |_| {
                if let Ok(mut w) = wake_log.lock() {
                    w.push(t0.elapsed().as_millis());
                }
            }),
        )
        .await?;

    println!("brood demo — ledger in {}", data_dir.display());
    let tasks = demo_tasks();
    let n = tasks.len();
    let reply = brood
        .delegate(session, DelegateRequest::background(tasks).independent())
        .await?;
    let DelegateReply::Background {
        call_id,
        set,
        units,
        note,
    } = &reply
    else {
        bail!(
            "the demo session is wake-capable, yet the call ran synchronously: {}",
            reply.note()
        );
    };
    println!(
        "t={:>5} ms  delegated {n} children as set {set} ({call_id}), {} units",
        at(),
        units.len()
    );
    println!("            reply note: {note}");

    let mut delivered: BTreeMap<String, (u128, u64)> = BTreeMap::new(); // dedup key -> (boundary t, latency)
    let mut seen: HashMap<String, u32> = HashMap::new();
    let mut notices = 0;
    let mut boundaries = 0;
    let mut shown_text = false;
    let deadline = Instant::now() + Duration::from_secs(60);
    while delivered
        .keys()
        .filter(|k| k.ends_with(":result") && k.starts_with(call_id.as_str()))
        .count()
        < n
    {
        if Instant::now() > deadline {
            break;
        }
        // The parent's turn: it works, then reaches a boundary.
        brood.set_turn(session, Turn::Busy).await?;
        tokio::time::sleep(Duration::from_millis(turn_ms)).await;
        brood.set_turn(session, Turn::Idle).await?;
        let Some(env) = brood.boundary(session, "demo-cli", Duration::from_secs(30)).await? else {
            continue;
        };
        boundaries += 1;
        let now_ms = brood_actors::model::now_ms();
        println!(
            "t={:>5} ms  boundary #{boundaries}: {} item(s) claimed",
            at(),
            env.items.len()
        );
        for item in &env.items {
            let waited = item.finished_at_ms.map(|f| now_ms.saturating_sub(f)).unwrap_or(0);
            let label = match item.kind {
                ItemKind::Result => "result",
                ItemKind::FailureNotice => {
                    notices += 1;
                    "FAILURE NOTICE"
                }
            };
            println!(
                "            {} {:<14} {:<10} {:<40} finished {waited} ms before this boundary",
                brood::render::tag(item),
                label,
                item.status.as_str(),
                brood::printable(&item.goal)
            );
            *seen.entry(item.dedup_key.clone()).or_default() += 1;
            delivered.insert(item.dedup_key.clone(), (at(), waited));
        }
        if !shown_text && env.items.iter().any(|i| i.kind == ItemKind::FailureNotice) {
            shown_text = true;
            println!("            --- what the model reads at this boundary ---");
            for line in env.text.lines() {
                println!("            | {line}");
            }
        }
        let acked = brood.ack(&env.claim_id).await?;
        println!("            acked {acked} item(s)");
    }

    let results: Vec<&String> = delivered
        .keys()
        .filter(|k| k.starts_with(call_id.as_str()) && k.ends_with(":result"))
        .collect();
    let duplicates = seen.values().filter(|&&c| c > 1).count();
    let lost = n - results.len();
    let status = brood.status(session).await?;
    let worst = delivered.values().map(|(_, w)| *w).max().unwrap_or(0);
    println!();
    println!(
        "tally: children {n}, results delivered once {}, failure notices {notices}, duplicates {duplicates}, lost {lost}; \
         boundaries {boundaries}, wakes {}, longest wait from finish to boundary {worst} ms; session still holds {} ready, {} claimed",
        results.len(),
        wakes.lock().map(|w| w.len()).unwrap_or(0),
        status.counts.ready,
        status.counts.claimed,
    );
    brood.shutdown();
    if lost > 0 || duplicates > 0 {
        bail!("demo failed: {lost} lost, {duplicates} duplicated");
    }
    Ok(())
}

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
