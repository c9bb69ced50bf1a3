//! The `command` runner: a child that is a local process.
//!
//! `{"kind": "command", "argv": ["prog", "arg", …], "env": {"K": "V"}, "cwd": "/path"}` runs
//! `argv` (no shell) in a process group of its own, with stdout and stderr captured together.
//! Its stdin is the task's `input` as JSON text (then closed), or `/dev/null` when the task has
//! none. Every chunk of output beats the child's stall clock. The summary is the tail of the
//! output (the last [`TAIL_BYTES`] bytes, cut on a character boundary): exit code 0 is
//! `succeeded`; a nonzero code or a signal is `failed`, with an error naming it and the tail as
//! the partial summary. A program that cannot be started (not found, a bad `cwd`) is `failed`
//! with an error that says so.
//!
//! Result data: `BROOD_OUTPUT` names an empty file (mode 0600, in the system's temporary
//! folder) made for this run. JSON the program writes there is the child's `output`; a file
//! left empty is no output; anything else ends the child `failed`, saying what was wrong. The
//! file is removed when the run ends.
//!
//! The process group does not outlive the runner, nor the server. When the command exits,
//! whatever it left running in its group is killed (so nothing holds the output pipes open);
//! when the runner is dropped — task timeout, stall, cancel, shutdown of the engine — the whole
//! group is killed with SIGKILL and the process is reaped. The leader is started with
//! `PR_SET_PDEATHSIG(SIGKILL)`, so a server killed outright takes it along; what the leader
//! started in its group is killed by the server's next start, from the record of running groups
//! ([`CommandGroups`], when the settings name one). The group is recorded just after it was
//! started: a server killed in between (a few milliseconds, the record's write and fsync)
//! leaves what the leader started by then unrecorded, to run on. A program that leaves its
//! group on purpose (`setsid`, a daemon) escapes all of this, as it would escape a terminal's
//! job control.
//!
//! The death signal is tied to the thread that forked the leader, not to the process: brood
//! starts children on the engine's children thread, which lives as long as the engine (a
//! runner's panic is caught there and fails only its child), so a leader dies when the server
//! does or when the engine shuts down, and not before.
//!
//! The environment is empty but for the variables [`CommandSettings`] passes through from the
//! server's (by default `PATH`, `HOME` and `LANG`), `BROOD_CHILD_ID` (the child's id),
//! `BROOD_OUTPUT` (the file for its result data),
//! `TRACEPARENT` (the W3C trace context the call was delegated with, when it has one) and the
//! spec's `env`, in that order, a later one replacing an earlier of the same name. Whether
//! `command` may run at all is the server's decision (`allowed_runners`), not this module's.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt as _;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use brood_actors::runner::{RunContext, RunOutput, Runner};
use futures::future::LocalBoxFuture;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt as _};

use super::groups::{CommandGroups, Entry};

/// How much of the output's end is kept as the summary, in bytes.
pub const TAIL_BYTES: usize = 4096;

/// How long the output is still read once the command exited and its group was killed (only a
/// process that left the group can hold the pipes open longer).
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// The `command` runner spec.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandSpec {
    /// Always `command`.
    pub kind: String,
    /// The program and its arguments; not empty.
    pub argv: Vec<String>,
    /// Variables set for the program, over those passed through from the server's.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The folder it runs in (default: the server's).
    #[serde(default)]
    pub cwd: Option<String>,
}

impl CommandSpec {
    /// Checks a spec; the error names the field that is wrong.
    pub fn parse(spec: &serde_json::Value) -> Result<Self, String> {
        let c: CommandSpec = super::parse_spec("command", spec)?;
        match c.argv.first() {
            None => return Err("`argv` must hold at least the program to run".into()),
            Some(p) if p.is_empty() => return Err("`argv[0]` (the program) must not be empty".into()),
            Some(_) => {}
        }
        if let Some(i) = c.argv.iter().position(|a| a.contains('\0')) {
            return Err(format!("`argv[{i}]` contains a NUL byte"));
        }
        for (k, v) in &c.env {
            if k.is_empty() || k.contains(['=', '\0']) {
                return Err(format!("`env` key {k:?} must be non-empty, without `=` or NUL"));
            }
            if v.contains('\0') {
                return Err(format!("`env.{k}` contains a NUL byte"));
            }
        }
        match &c.cwd {
            Some(d) if d.is_empty() || d.contains('\0') => {
                Err("`cwd` must be a non-empty path without NUL bytes".into())
            }
            _ => Ok(c),
        }
    }
}

/// The variables a command child gets from the server's environment when none are named.
pub const DEFAULT_ENV: &[&str] = &["PATH", "HOME", "LANG"];

/// How `command` children are run: which of the server's variables they get, and where their
/// process groups are recorded.
#[derive(Debug, Clone)]
pub struct CommandSettings {
    env: Vec<String>,
    groups: Option<Arc<CommandGroups>>,
}

impl Default for CommandSettings {
    /// [`DEFAULT_ENV`] passed through, no record of groups.
    fn default() -> Self {
        CommandSettings {
            env: DEFAULT_ENV.iter().map(|v| v.to_string()).collect(),
            groups: None,
        }
    }
}

impl CommandSettings {
    /// The default settings: [`DEFAULT_ENV`] passed through, no record of groups.
    pub fn new() -> Self {
        Self::default()
    }

    /// The names of the server's variables a child gets (those the server has); none else.
    pub fn pass_env<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.env = names.into_iter().map(Into::into).collect();
        self
    }

    /// Records each child's process group in `groups`, so the next start of a server on the
    /// same data folder kills what a killed one left running.
    pub fn record_groups(mut self, groups: Arc<CommandGroups>) -> Self {
        self.groups = Some(groups);
        self
    }

    /// The names passed through.
    pub fn env(&self) -> &[String] {
        &self.env
    }
}

/// A child that runs a local program.
#[derive(Debug, Clone)]
pub struct CommandRunner {
    spec: CommandSpec,
    settings: Arc<CommandSettings>,
}

impl CommandRunner {
    /// A command runner for a checked spec, with the default settings.
    pub fn new(spec: CommandSpec) -> Self {
        Self::with_settings(spec, Arc::new(CommandSettings::default()))
    }

    /// A command runner for a checked spec, run as `settings` say.
    pub fn with_settings(spec: CommandSpec, settings: Arc<CommandSettings>) -> Self {
        CommandRunner { spec, settings }
    }
}

impl Runner for CommandRunner {
    fn run(self: Box<Self>, ctx: RunContext) -> LocalBoxFuture<'static, RunOutput> {
        Box::pin(run(self.spec, self.settings, ctx))
    }
}

/// A process group that is killed with SIGKILL when this is dropped, unless it already was;
/// taken out of the record of running groups once killed.
#[derive(Debug)]
struct Group {
    pgid: libc::pid_t,
    killed: bool,
    recorded: Option<(Arc<CommandGroups>, Entry)>,
}

impl Group {
    fn kill(&mut self) {
        if !self.killed {
            self.killed = true;
            // SAFETY: killpg only sends a signal; the group is the one this runner created.
            // ESRCH (nothing left in the group) is the expected answer once everything exited.
            unsafe {
                libc::killpg(self.pgid, libc::SIGKILL);
            }
            if let Some((groups, entry)) = self.recorded.take() {
                groups.ended(&entry);
            }
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Run in the forked child before it execs the program: it is to get SIGKILL when the thread
/// that forked it ends, and if the server already died (before the death signal was set,
/// which would then never come), it does not start at all. Only async-signal-safe calls, and
/// nothing allocated.
fn die_with(server: libc::pid_t) -> std::io::Result<()> {
    // SAFETY: prctl and getppid are async-signal-safe system calls without pointers.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) == -1 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::getppid() != server {
            return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
        }
    }
    Ok(())
}

async fn run(spec: CommandSpec, settings: Arc<CommandSettings>, ctx: RunContext) -> RunOutput {
    let program = spec.argv[0].clone();
    let mut cmd = tokio::process::Command::new(&program);
    cmd.args(&spec.argv[1..]).env_clear();
    for name in &settings.env {
        if let Some(value) = std::env::var_os(name) {
            cmd.env(name, value);
        }
    }
    cmd.env("BROOD_CHILD_ID", &ctx.child_id);
    let output_file = match OutputFile::make(&ctx.child_id, ctx.attempt) {
        Ok(file) => file,
        Err(e) => return RunOutput::failed(format!("the file for `{program}`'s output could not be made: {e}")),
    };
    cmd.env("BROOD_OUTPUT", &output_file.path);
    if let Some(traceparent) = ctx.traceparent() {
        cmd.env("TRACEPARENT", traceparent);
    }
    let input = ctx.input.as_ref().map(|v| v.to_string().into_bytes());
    cmd.envs(&spec.env)
        .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        // The group kill below covers the leader too; this makes tokio reap it when dropped.
        .kill_on_drop(true);
    if let Some(dir) = &spec.cwd {
        cmd.current_dir(dir);
    }
    let server = std::process::id() as libc::pid_t;
    // SAFETY: `die_with` makes only async-signal-safe calls and allocates nothing, as code
    // between fork and exec must.
    unsafe {
        cmd.pre_exec(move || die_with(server));
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let place = spec.cwd.as_deref().map(|d| format!(" in `{d}`")).unwrap_or_default();
            return RunOutput::failed(format!("`{program}` could not be started{place}: {e}"));
        }
    };
    let Some(pid) = child.id() else {
        return RunOutput::failed(format!("`{program}` exited before its process group was known"));
    };
    if let (Some(bytes), Some(mut stdin)) = (input, child.stdin.take()) {
        // Written beside the run, so that a program that does not read its stdin (or reads it
        // late) never holds the run up; a program that closed it early ends the write.
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt as _;
            let _ = stdin.write_all(&bytes).await;
        });
    }
    // process_group(0): the group's id is the leader's pid.
    let pgid = pid as libc::pid_t;
    let mut group = Group {
        pgid,
        killed: false,
        recorded: settings
            .groups
            .as_ref()
            .and_then(|groups| Some((groups.clone(), groups.started(pgid)?))),
    };
    let mut output = Tail::default();
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let (mut out_buf, mut err_buf) = ([0u8; 4096], [0u8; 4096]);
    let status = loop {
        tokio::select! {
            n = read_some(&mut stdout, &mut out_buf) => if let Some(n) = n {
                output.push(&out_buf[..n]);
                ctx.progress.beat();
            },
            n = read_some(&mut stderr, &mut err_buf) => if let Some(n) = n {
                output.push(&err_buf[..n]);
                ctx.progress.beat();
            },
            status = child.wait() => break status,
        }
    };
    // The leader is gone: what it left in its group goes too, which closes the pipes they held.
    // (The group id stays allocated while any member lives, so this cannot reach a stranger
    // unless every member exited and the number was reused in between, a window of microseconds
    // against a pid space that cycles.)
    group.kill();
    let _ = tokio::time::timeout(DRAIN_GRACE, drain(&mut stdout, &mut stderr, &mut output)).await;
    let summary = output.summary();
    let partial = (!summary.is_empty()).then_some(summary.clone());
    let data = output_file.read();
    match (status, data) {
        (Ok(status), Ok(output)) if status.success() => RunOutput::Succeeded { summary, output },
        (Ok(status), Err(e)) if status.success() => RunOutput::Failed {
            error: format!("`{program}` exited 0, but {e}"),
            summary: partial,
            output: None,
        },
        (Ok(status), data) => RunOutput::Failed {
            error: format!("`{program}` {}", how_it_ended(status)),
            summary: partial,
            output: data.unwrap_or(None),
        },
        (Err(e), _) => RunOutput::Failed {
            error: format!("`{program}` could not be waited for: {e}"),
            summary: partial,
            output: None,
        },
    }
}

/// The file a command writes its result data to (`BROOD_OUTPUT`), removed when dropped.
struct OutputFile {
    path: std::path::PathBuf,
}

impl OutputFile {
    /// An empty file only this user may read or write, new for this run of `child_id`.
    fn make(child_id: &str, attempt: u32) -> std::io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let name = format!(
            "brood-output-{}-{}-{attempt}-{:x}",
            std::process::id(),
            child_id.replace(|c: char| !c.is_ascii_alphanumeric() && c != '.' && c != '_', "-"),
            brood_actors::model::now_ms()
        );
        let path = std::env::temp_dir().join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        Ok(OutputFile { path })
    }

    /// What the program wrote: none for an empty file, else its JSON value; an error saying what
    /// is wrong with anything else.
    fn read(&self) -> Result<Option<serde_json::Value>, String> {
        use std::io::Read as _;
        let limit = brood_actors::model::MAX_OUTPUT_BYTES;
        let mut text = Vec::new();
        std::fs::File::open(&self.path)
            .and_then(|f| f.take(limit as u64 + 1).read_to_end(&mut text))
            .map_err(|e| format!("its BROOD_OUTPUT file could not be read: {e}"))?;
        if text.len() > limit {
            return Err(format!("its BROOD_OUTPUT file holds more than {limit} bytes"));
        }
        if text.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        serde_json::from_slice(&text)
            .map(|v: serde_json::Value| (!v.is_null()).then_some(v))
            .map_err(|e| format!("its BROOD_OUTPUT file is not JSON: {e}"))
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Reads what is left in the pipes still open into `output`, both at once, until each is at
/// its end. A pipe that reached its end before is not waited for (it never answers again), and
/// one held open elsewhere does not keep the other from being read.
async fn drain<O: AsyncRead + Unpin, E: AsyncRead + Unpin>(
    stdout: &mut Option<O>,
    stderr: &mut Option<E>,
    output: &mut Tail,
) {
    let (mut out_buf, mut err_buf) = ([0u8; 4096], [0u8; 4096]);
    while stdout.is_some() || stderr.is_some() {
        tokio::select! {
            n = read_some(stdout, &mut out_buf) => if let Some(n) = n {
                output.push(&out_buf[..n]);
            },
            n = read_some(stderr, &mut err_buf) => if let Some(n) = n {
                output.push(&err_buf[..n]);
            },
        }
    }
}

/// Reads one chunk from a pipe; `None` at its end (closing it) or when it is closed already.
/// A pipe that is closed never answers, so `select!` waits on the others.
async fn read_some<R: AsyncRead + Unpin>(pipe: &mut Option<R>, buf: &mut [u8]) -> Option<usize> {
    let Some(p) = pipe.as_mut() else {
        return futures::future::pending().await;
    };
    match p.read(buf).await {
        Ok(n) if n > 0 => Some(n),
        _ => {
            *pipe = None;
            None
        }
    }
}

/// "exited with code 3", "was killed by signal 9 (SIGKILL)".
fn how_it_ended(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exited with code {code}");
    }
    match status.signal() {
        Some(sig) => match signal_name(sig) {
            Some(name) => format!("was killed by signal {sig} ({name})"),
            None => format!("was killed by signal {sig}"),
        },
        None => format!("ended as {status}"),
    }
}

fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        _ => return None,
    })
}

/// The end of a stream of bytes: keeps at most twice [`TAIL_BYTES`], and remembers whether
/// anything was cut.
#[derive(Debug, Default)]
struct Tail {
    bytes: Vec<u8>,
    cut: bool,
}

impl Tail {
    fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend_from_slice(chunk);
        if self.bytes.len() > 2 * TAIL_BYTES {
            let excess = self.bytes.len() - TAIL_BYTES;
            self.bytes.drain(..excess);
            self.cut = true;
        }
    }

    /// The summary: the output's last [`TAIL_BYTES`] bytes at most, trailing whitespace
    /// trimmed, with a leading `…` when earlier output was cut.
    fn summary(&self) -> String {
        let cut = self.cut || self.bytes.len() > TAIL_BYTES;
        if !cut {
            return String::from_utf8_lossy(&self.bytes).trim_end().to_string();
        }
        let mark = "…";
        format!("{mark}{}", tail(&self.bytes, TAIL_BYTES - mark.len()).trim_end())
    }
}

/// The last `max` bytes at most of `bytes` as text, starting on a character boundary (bytes
/// that are not UTF-8 become U+FFFD, and the result still fits in `max`).
fn tail(bytes: &[u8], max: usize) -> String {
    let mut start = bytes.len().saturating_sub(max);
    // Skip the rest of a character cut in two (at most 3 continuation bytes).
    for _ in 0..3 {
        if start > 0 && start < bytes.len() && bytes[start] & 0xC0 == 0x80 {
            start += 1;
        }
    }
    let text = String::from_utf8_lossy(&bytes[start..]);
    let mut from = text.len().saturating_sub(max);
    while !text.is_char_boundary(from) {
        from += 1;
    }
    text[from..].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn specs_are_checked_naming_the_field() {
        let ok =
            CommandSpec::parse(&json!({"kind": "command", "argv": ["echo", "hi"], "env": {"A": "1"}, "cwd": "/tmp"}));
        assert_eq!(ok.unwrap().argv, ["echo", "hi"]);
        let err = CommandSpec::parse(&json!({"kind": "command"})).unwrap_err();
        assert!(err.contains("argv"), "{err}");
        let err = CommandSpec::parse(&json!({"kind": "command", "argv": []})).unwrap_err();
        assert!(err.contains("argv"), "{err}");
        let err = CommandSpec::parse(&json!({"kind": "command", "argv": [""]})).unwrap_err();
        assert!(err.contains("argv[0]"), "{err}");
        let err = CommandSpec::parse(&json!({"kind": "command", "argv": ["x"], "shell": true})).unwrap_err();
        assert!(err.contains("shell"), "{err}");
        let err = CommandSpec::parse(&json!({"kind": "command", "argv": ["x"], "env": {"A=B": "1"}})).unwrap_err();
        assert!(err.contains("env"), "{err}");
        let err = CommandSpec::parse(&json!({"kind": "command", "argv": ["x"], "env": {"A": 1}})).unwrap_err();
        assert!(err.contains("env"), "{err}");
        let err = CommandSpec::parse(&json!({"kind": "command", "argv": ["x"], "cwd": ""})).unwrap_err();
        assert!(err.contains("cwd"), "{err}");
    }

    /// A pipe at its end before the command exited, beside one with output still in it: the
    /// drain reads the output and returns (it once waited on the closed pipe until its grace
    /// ran out, losing the other's output and holding every command child 2 s).
    #[tokio::test]
    async fn a_drain_reads_what_is_left_without_waiting_on_a_closed_pipe() {
        let (mut writer, reader) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut writer, b"late words")
            .await
            .unwrap();
        drop(writer);
        let (mut closed, mut open): (Option<tokio::io::DuplexStream>, _) = (None, Some(reader));
        let mut output = Tail::default();
        let drained = tokio::time::timeout(Duration::from_secs(30), drain(&mut closed, &mut open, &mut output)).await;
        assert!(drained.is_ok(), "the drain waited on the closed pipe");
        assert_eq!(output.summary(), "late words");
        assert!(open.is_none(), "the pipe at its end is closed");
        let mut output = Tail::default();
        let drained = tokio::time::timeout(Duration::from_secs(30), drain(&mut open, &mut closed, &mut output)).await;
        assert!(drained.is_ok(), "with both pipes closed there is nothing to wait for");
    }

    #[test]
    fn the_tail_starts_on_a_character_boundary_and_fits() {
        // "é" is two bytes: the last 3 bytes of "aéé" cut the first "é" in two.
        assert_eq!(tail("aéé".as_bytes(), 3), "é");
        assert_eq!(tail("aéé".as_bytes(), 4), "éé");
        assert_eq!(tail(b"abc", 10), "abc");
        assert_eq!(tail("€".as_bytes(), 2), "", "a 3-byte character does not fit in 2");
        // Invalid bytes become U+FFFD (3 bytes each) and the text is cut again to fit.
        let t = tail(&[0xFF, 0xFF, b'x'], 3);
        assert!(t.len() <= 3 && t.ends_with('x'), "{t:?}");
    }

    #[test]
    fn the_summary_keeps_the_end_of_long_output_and_marks_the_cut() {
        let mut t = Tail::default();
        t.push(b"hello\n");
        assert_eq!(t.summary(), "hello");
        let mut t = Tail::default();
        for i in 0..2000 {
            t.push(format!("line {i} ü\n").as_bytes());
        }
        let s = t.summary();
        assert!(s.len() <= TAIL_BYTES, "{}", s.len());
        assert!(s.starts_with('…'), "{s:.20}");
        assert!(s.ends_with("line 1999 ü"), "{s}");
        assert!(t.bytes.len() <= 2 * TAIL_BYTES);
    }

    #[test]
    fn how_a_process_ended_is_named() {
        assert_eq!(how_it_ended(ExitStatus::from_raw(3 << 8)), "exited with code 3");
        assert_eq!(
            how_it_ended(ExitStatus::from_raw(9)),
            "was killed by signal 9 (SIGKILL)"
        );
    }
}
