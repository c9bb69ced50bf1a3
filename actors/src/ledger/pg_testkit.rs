//! A PostgreSQL server for the tests: `BROOD_TEST_PG` when set, else a throwaway cluster this
//! test process starts once (Debian's `postgresql` binaries; `.ci/run` installs them) and that
//! dies with it. Each ledger a test opens gets a schema of its own.
//!
//! `Replicated`: a primary with a synchronous standby, for the tests of a database failover.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::PgLedger;

#[cfg(any(test, feature = "failpoints"))]
pub use super::pg::{commit_lock_key, statements_in};

/// The address of the test server, starting it on first use.
pub fn url() -> String {
    static URL: OnceLock<Result<String, String>> = OnceLock::new();
    URL.get_or_init(|| match std::env::var("BROOD_TEST_PG") {
        Ok(url) => Ok(url),
        // On a thread of its own: a caller may be inside a runtime, where the start's own
        // runtime could not block.
        Err(_) => std::thread::spawn(start)
            .join()
            .unwrap_or_else(|_| Err("starting the test PostgreSQL server panicked".into())),
    })
    .clone()
    .unwrap_or_else(|e| panic!("{e}"))
}

/// A schema (or database) name no other test uses: this process's id, the moment it first
/// asked for one, and a count. The id alone is not enough: the system reuses process ids once
/// they wrap around, and a server kept between runs (`BROOD_TEST_PG`) keeps the schemas of the
/// runs before, whose rows a test would then find in its "fresh" ledger.
pub fn fresh_schema() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    static STARTED: OnceLock<u128> = OnceLock::new();
    let started = STARTED.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    });
    format!(
        "t{}_{}_{}",
        std::process::id(),
        started % 1_000_000_000_000,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs `sql` on the database at `url`, beside whatever brood does there (what a paused
/// process could not stop: its tenure running out, a row changed under it).
pub fn execute(url: &str, sql: &str) {
    let (url, sql) = (url.to_string(), sql.to_string());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(async {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            client.batch_execute(&sql).await
        })
        .map_err(std::io::Error::other)
    })
    .join()
    .expect("running test SQL")
    .unwrap_or_else(|e| panic!("running test SQL: {e}"));
}

/// A transaction holding an advisory lock shared, as a commit in flight holds its sessions'
/// locks, until it is dropped (then it commits, and its connection closes).
#[derive(Debug)]
pub struct SharedLock {
    release: Option<std::sync::mpsc::Sender<()>>,
    done: Option<std::thread::JoinHandle<()>>,
}

/// Takes advisory lock `key` shared on the database at `url`, in a transaction of its own that
/// holds it until the answer is dropped; returns once it is held.
pub fn hold_shared_lock(url: &str, key: i64) -> SharedLock {
    let url = url.to_string();
    let (held_tx, held_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let (release, release_rx) = std::sync::mpsc::channel::<()>();
    let done = std::thread::spawn(move || {
        let run = || -> Result<(), String> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async {
                let (mut client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .map_err(|e| e.to_string())?;
                tokio::spawn(connection);
                let tx = client.transaction().await.map_err(|e| e.to_string())?;
                tx.execute("SELECT pg_advisory_xact_lock_shared($1)", &[&key])
                    .await
                    .map_err(|e| e.to_string())?;
                let _ = held_tx.send(Ok(()));
                let _ = tokio::task::spawn_blocking(move || release_rx.recv()).await;
                tx.commit().await.map_err(|e| e.to_string())
            })
        };
        if let Err(e) = run() {
            let _ = held_tx.send(Err(e));
        }
    });
    match held_rx.recv() {
        Ok(Ok(())) => SharedLock {
            release: Some(release),
            done: Some(done),
        },
        Ok(Err(e)) => panic!("holding advisory lock {key}: {e}"),
        Err(_) => panic!("holding advisory lock {key}: its thread stopped"),
    }
}

impl Drop for SharedLock {
    fn drop(&mut self) {
        drop(self.release.take());
        if let Some(done) = self.done.take() {
            let _ = done.join();
        }
    }
}

/// The address of a new, empty database on the test server (for a `brood serve --ledger`,
/// whose ledger takes the default schema).
pub fn fresh_database() -> String {
    let base = url();
    let name = fresh_schema();
    execute(&base, &format!("CREATE DATABASE {name}"));
    // The address with its database replaced.
    match base.rfind('/') {
        Some(slash) => format!("{}/{name}", &base[..slash]),
        None => panic!("the test server's address {base} names no database"),
    }
}

/// A fresh, empty ledger in a schema no other test uses.
pub fn fresh() -> PgLedger {
    PgLedger::open_in(&url(), &fresh_schema()).unwrap_or_else(|e| panic!("opening a PostgreSQL ledger: {e:?}"))
}

/// The newest installed server's binaries.
fn binaries() -> Result<PathBuf, String> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).ok_or_else(|| {
        "PostgreSQL is needed for these tests: install Debian's `postgresql` (.ci/run does) or set BROOD_TEST_PG=postgres://…"
            .to_string()
    })
}

/// The uid and gid of the `postgres` user, to run the server as (it refuses root).
fn postgres_user() -> Result<(u32, u32), String> {
    let passwd = std::fs::read_to_string("/etc/passwd").map_err(|e| format!("reading /etc/passwd: {e}"))?;
    passwd
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.first() == Some(&"postgres")).then(|| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))?
        })
        .ok_or_else(|| "running the tests as root needs the `postgres` user (Debian's postgresql makes it)".into())
}

/// A command run as `user` when given (from root), killed when the thread that started it
/// ends when `tied`.
fn command(program: &Path, user: Option<(u32, u32)>, tied: bool) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(program);
    unsafe {
        cmd.pre_exec(move || {
            if let Some((uid, gid)) = user {
                if libc::setgid(gid) != 0 || libc::setuid(uid) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            // After the user change, which clears it.
            if tied && libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

/// A PostgreSQL cluster in a temporary folder, on a free loopback port.
#[derive(Debug)]
pub struct Cluster {
    bin: PathBuf,
    user: Option<(u32, u32)>,
    dir: PathBuf,
    port: u16,
    server: Option<std::process::Child>,
    /// Settings of its own (`name=value`), given to the server at each start.
    settings: Vec<String>,
}

impl Cluster {
    /// A new cluster in `name` (a folder under the temporary directory), not started.
    fn create(name: &str) -> Result<Cluster, String> {
        let c = Cluster::folder(name)?;
        let out = command(&c.bin.join("initdb"), c.user, false)
            .current_dir(&c.dir)
            .args(["-U", "brood", "--auth=trust", "-E", "UTF8", "--no-locale", "-D"])
            .arg(c.dir.join("data"))
            .output()
            .map_err(|e| format!("running initdb: {e}"))?;
        if !out.status.success() {
            return Err(format!("initdb failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(c)
    }

    /// The folder of a cluster in `name` (a folder under the temporary directory), owned by
    /// the server's user, and a free port: no data folder yet.
    fn folder(name: &str) -> Result<Cluster, String> {
        let bin = binaries()?;
        let user = (unsafe { libc::geteuid() } == 0).then(postgres_user).transpose()?;
        let dir = std::env::temp_dir().join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .map_err(|e| format!("chown {}: {e}", dir.display()))?;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("finding a free port: {e}"))?
            .port();
        Ok(Cluster {
            bin,
            user,
            dir,
            port,
            server: None,
            settings: Vec::new(),
        })
    }

    /// A cluster of a test's own, started: it dies when the thread that calls this ends (or
    /// the cluster is dropped), and [`Cluster::stop`] and [`Cluster::start`] restart it.
    pub fn private() -> Cluster {
        let mut c = Cluster::create(&format!("brood-pg-{}-{}", std::process::id(), fresh_schema()))
            .unwrap_or_else(|e| panic!("{e}"));
        c.start();
        c
    }

    /// Its address (the `postgres` database).
    pub fn url(&self) -> String {
        format!("postgres://brood@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts the server and waits until it answers.
    pub fn start(&mut self) {
        self.spawn().unwrap_or_else(|e| panic!("{e}"));
        self.wait_ready().unwrap_or_else(|e| panic!("{e}"));
    }

    /// Stops the server at once (`SIGQUIT`: no shutdown checkpoint, as a crash), and waits.
    pub fn stop(&mut self) {
        if let Some(mut server) = self.server.take() {
            unsafe { libc::kill(server.id() as i32, libc::SIGQUIT) };
            let _ = server.wait();
        }
    }

    fn spawn(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("server.log"))
            .map_err(|e| format!("opening the server log: {e}"))?;
        let server = command(&self.bin.join("postgres"), self.user, true)
            .current_dir(&self.dir)
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-c", "listen_addresses=127.0.0.1", "-c", &format!("port={}", self.port)])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", self.dir.display()))
            .args([
                "-c",
                "fsync=on",
                "-c",
                "synchronous_commit=on",
                "-c",
                "max_connections=200",
            ])
            .args(self.settings.iter().flat_map(|s| ["-c", s.as_str()]))
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting postgres: {e}"))?;
        self.server = Some(server);
        Ok(())
    }

    /// Ready once it answers a query (it accepts connections while still starting up).
    fn wait_ready(&self) -> Result<(), String> {
        let url = self.url();
        let log = self.dir.join("server.log");
        // On a thread of its own: the caller may be inside a runtime.
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            loop {
                let ready = rt.block_on(async {
                    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
                    tokio::spawn(connection);
                    client.simple_query("SELECT 1").await.map(|_| ())
                });
                match ready {
                    Ok(()) => return Ok(()),
                    Err(e) if Instant::now() > deadline => {
                        return Err(format!(
                            "the test PostgreSQL server did not answer within 60 s ({e}); see {}",
                            log.display()
                        ))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        })
        .join()
        .unwrap_or_else(|_| Err("waiting for the test server panicked".into()))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The shared server: started from a thread that lives as long as the process, so the server
/// (tied to it) dies with the process and not with a test's thread.
fn start() -> Result<String, String> {
    // Earlier test processes' clusters, whose servers died with them.
    for entry in std::fs::read_dir(std::env::temp_dir()).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix("brood-pg-"))
            .map(|rest| rest.split('-').next().unwrap_or(rest).to_string());
        if pid.is_some_and(|pid| !Path::new("/proc").join(pid).exists()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    let mut cluster = Cluster::create(&format!("brood-pg-{}", std::process::id()))?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("brood-test-pg".into())
        .spawn(move || {
            let started = cluster
                .spawn()
                .and_then(|_| cluster.wait_ready())
                .map(|_| cluster.url());
            let _ = tx.send(started);
            // Kept (not dropped) for as long as the process lives.
            loop {
                std::thread::park();
            }
        })
        .map_err(|e| format!("starting the server's thread: {e}"))?;
    rx.recv().map_err(|_| "the server's thread ended".to_string())?
}

/// The first column of the first row `sql` answers on the database at `url` (as text), or why
/// it could not be had (the server is down, or refuses).
pub fn query_value(url: &str, sql: &str) -> Result<Option<String>, String> {
    let (url, sql) = (url.to_string(), sql.to_string());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            let messages = client.simple_query(&sql).await?;
            Ok::<_, tokio_postgres::Error>(messages.into_iter().find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(row) => Some(row.get(0).map(str::to_string)),
                _ => None,
            }))
        })
        .map(Option::flatten)
        .map_err(|e| e.to_string())
    })
    .join()
    .unwrap_or_else(|_| Err("querying the test server panicked".into()))
}

/// The `application_name` the standby of a [`Replicated`] pair connects to its primary with, and
/// the primary's `synchronous_standby_names`.
const STANDBY_NAME: &str = "brood_standby";

/// The role the standby replicates as.
const REPLICATION_USER: &str = "replicator";

/// A primary and a **synchronous** standby, each a [`Cluster`] of its own on a port of its
/// own: the primary with `wal_level=replica`, a replication role and its `pg_hba.conf` entry,
/// `synchronous_standby_names` naming the standby and `synchronous_commit=on`, so that a commit
/// is acknowledged only once the standby has it on disk; the standby made by `pg_basebackup -R`
/// and streaming from it. Both die with the thread that started them (or when this is dropped),
/// their folders removed.
///
/// A failover: [`Replicated::kill_primary`] (as `pg_ctl stop -m immediate`), then
/// [`Replicated::promote_standby`]; a client given [`Replicated::url`] (both hosts,
/// `target_session_attrs=read-write`) reaches whichever of the two takes writes.
#[derive(Debug)]
pub struct Replicated {
    primary: Cluster,
    standby: Cluster,
}

impl Replicated {
    /// Starts the primary, copies it into the standby, starts that, and returns once the primary
    /// reports the standby `sync` in `pg_stat_replication`.
    pub fn start() -> Replicated {
        Replicated::try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_start() -> Result<Replicated, String> {
        let name = format!("brood-pg-{}-{}", std::process::id(), fresh_schema());
        let mut primary = Cluster::create(&format!("{name}-primary"))?;
        primary.settings = vec![
            "wal_level=replica".into(),
            "max_wal_senders=4".into(),
            "hot_standby=on".into(),
            format!("synchronous_standby_names={STANDBY_NAME}"),
        ];
        let hba = primary.dir.join("data").join("pg_hba.conf");
        let mut rules = std::fs::read_to_string(&hba).map_err(|e| format!("reading {}: {e}", hba.display()))?;
        rules.push_str(&format!("host replication {REPLICATION_USER} 127.0.0.1/32 trust\n"));
        std::fs::write(&hba, rules).map_err(|e| format!("writing {}: {e}", hba.display()))?;
        primary.spawn()?;
        primary.wait_ready()?;
        // Committed locally: no standby is there yet to wait for.
        execute(
            &primary.url(),
            &format!("SET synchronous_commit = local; CREATE ROLE {REPLICATION_USER} WITH REPLICATION LOGIN"),
        );
        let mut standby = Cluster::folder(&format!("{name}-standby"))?;
        let out = command(&standby.bin.join("pg_basebackup"), standby.user, false)
            .current_dir(&standby.dir)
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &primary.port.to_string(),
                "-U",
                REPLICATION_USER,
            ])
            .args(["-X", "stream", "--checkpoint=fast", "-R", "-D"])
            .arg(standby.dir.join("data"))
            .output()
            .map_err(|e| format!("running pg_basebackup: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "pg_basebackup failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        // `-R` wrote `standby.signal` and a `primary_conninfo`; this one names the standby as the
        // primary's `synchronous_standby_names` does. A promoted standby has no standby of its
        // own to wait for: it has no `synchronous_standby_names` (the primary's is given on its
        // command line, not in the configuration files the copy took).
        standby.settings = vec![
            "hot_standby=on".into(),
            format!(
                "primary_conninfo=host=127.0.0.1 port={} user={REPLICATION_USER} application_name={STANDBY_NAME}",
                primary.port
            ),
        ];
        standby.spawn()?;
        standby.wait_ready()?;
        let pair = Replicated { primary, standby };
        let deadline = Instant::now() + Duration::from_secs(60);
        let sql = format!("SELECT sync_state FROM pg_stat_replication WHERE application_name = '{STANDBY_NAME}'");
        loop {
            match query_value(&pair.primary.url(), &sql) {
                Ok(Some(state)) if state == "sync" => return Ok(pair),
                seen if Instant::now() > deadline => {
                    return Err(format!(
                        "the standby was not reported `sync` within 60 s ({seen:?}); see {}",
                        pair.standby.dir.join("server.log").display()
                    ))
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// The address of both servers' `postgres` database, the primary first, taking a
    /// connection only where writes are allowed (`target_session_attrs=read-write`).
    pub fn url(&self) -> String {
        self.url_of("postgres")
    }

    fn url_of(&self, database: &str) -> String {
        format!(
            "postgres://brood@127.0.0.1:{},127.0.0.1:{}/{database}?target_session_attrs=read-write",
            self.primary.port, self.standby.port
        )
    }

    /// The primary's own address (the `postgres` database).
    pub fn primary_url(&self) -> String {
        self.primary.url()
    }

    /// The standby's own address (the `postgres` database).
    pub fn standby_url(&self) -> String {
        self.standby.url()
    }

    /// A new, empty database (made on the primary, so on the standby too): its address on both
    /// hosts, as [`Replicated::url`].
    pub fn fresh_database(&self) -> String {
        let name = fresh_schema();
        execute(&self.primary.url(), &format!("CREATE DATABASE {name}"));
        self.url_of(&name)
    }

    /// Kills the primary as `pg_ctl stop -m immediate` does (`SIGQUIT` to the postmaster: every
    /// server process quits at once, no shutdown checkpoint, as a crash), and waits for it. Its
    /// clients' connections break.
    pub fn kill_primary(&mut self) {
        self.primary.stop();
    }

    /// Promotes the standby (`pg_promote()`) and returns once it takes writes.
    pub fn promote_standby(&self) {
        let url = self.standby.url();
        execute(&url, "SELECT pg_promote(true, 60)");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match query_value(&url, "SHOW transaction_read_only") {
                Ok(Some(ro)) if ro == "off" => return,
                seen => assert!(
                    Instant::now() < deadline,
                    "the promoted standby did not take writes within 60 s ({seen:?})"
                ),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
