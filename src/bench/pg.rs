//! `brood bench --ledger postgres://…`: where the engines measured keep their ledgers on
//! PostgreSQL (a schema of their own each, or a database of their own for a `brood serve`),
//! and the baselines measured on the same database: a plain `FOR UPDATE SKIP LOCKED` queue
//! doing the durable workload's job, and a full read of a ledger's tables.
//!
//! Everything a run creates on the database (its schemas, its databases) is dropped at its end
//! ([`Cleanup`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio_postgres::{Client, NoTls};

use super::CALL;

/// `--ledger`, set once at the start of a run.
pub(super) static LEDGER: OnceLock<Option<String>> = OnceLock::new();

/// The PostgreSQL database of this run's engines, if they run on one.
pub(super) fn url() -> Option<&'static str> {
    LEDGER.get().and_then(|u| u.as_deref())
}

/// How long an engine's session tenures last (as `brood serve`'s default).
pub(super) const TENURE: Duration = Duration::from_secs(10);

/// The node id of this process's engines (one at a time: a reopened ledger is taken back at
/// once, as a restarted node takes its sessions back).
pub(super) fn node() -> String {
    format!("bench-{}", std::process::id())
}

/// Where the other processes would reach this one's engines: nobody does (nothing else
/// shares their schemas), so an address that answers nothing.
pub(super) const ADDRESS: &str = "http://127.0.0.1:1";

/// What this run made on the database.
#[derive(Default)]
struct Made {
    /// A schema per ledger folder (so a folder opened again is the same ledger).
    schemas: HashMap<PathBuf, String>,
    databases: Vec<String>,
    next: usize,
}

static MADE: LazyLock<Mutex<Made>> = LazyLock::new(Default::default);

impl Made {
    fn name(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}_{}_{}", std::process::id(), self.next)
    }
}

/// The schema of the ledger "in" `dir`: the same one each time `dir` is named.
pub(super) fn schema_for(dir: &Path) -> String {
    let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = made.schemas.get(dir) {
        return s.clone();
    }
    let s = made.name("bench");
    made.schemas.insert(dir.to_path_buf(), s.clone());
    s
}

/// The address of a new, empty database on the server (for a `brood serve --ledger`, whose
/// ledger takes the default schema of its database).
pub(super) fn fresh_database(url: &str) -> anyhow::Result<String> {
    let name = MADE.lock().unwrap_or_else(|e| e.into_inner()).name("benchdb");
    execute(url, &format!("CREATE DATABASE {name}"))?;
    MADE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .databases
        .push(name.clone());
    with_database(url, &name)
}

/// `url` with its database replaced by `db`.
fn with_database(url: &str, db: &str) -> anyhow::Result<String> {
    let (head, query) = match url.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (url, None),
    };
    let host = head.find("://").context("--ledger: not a postgres://… address")? + 3;
    let base = match head[host..].find('/') {
        Some(slash) => &head[..host + slash],
        None => head,
    };
    Ok(format!(
        "{base}/{db}{}",
        query.map(|q| format!("?{q}")).unwrap_or_default()
    ))
}

/// Drops what the run made on the database when dropped.
pub(super) struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        let Some(url) = url() else { return };
        let made = std::mem::take(&mut *MADE.lock().unwrap_or_else(|e| e.into_inner()));
        let mut sql: Vec<String> = made
            .schemas
            .values()
            .map(|s| format!("DROP SCHEMA IF EXISTS \"{s}\" CASCADE"))
            .collect();
        sql.extend(
            made.databases
                .iter()
                .map(|d| format!("DROP DATABASE IF EXISTS {d} WITH (FORCE)")),
        );
        // One statement at a time: DROP DATABASE may not run inside a transaction block.
        for s in sql {
            if let Err(e) = execute(url, &s) {
                eprintln!("brood bench: note: `{s}` failed: {e:#}");
            }
        }
    }
}

/// Connects, with the connection driven by the current runtime.
pub(super) async fn connect(url: &str) -> anyhow::Result<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .context("connecting to the --ledger database")?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    // As brood's ledger commits.
    client.batch_execute("SET synchronous_commit = on").await?;
    Ok(client)
}

/// Runs `sql` on `url`, from a thread and a runtime of its own (callers may be inside one).
pub(super) fn execute(url: &str, sql: &str) -> anyhow::Result<()> {
    off_runtime(
        url,
        sql,
        |client, sql| async move { Ok(client.batch_execute(&sql).await?) },
    )
}

/// The first two columns of the rows `sql` answers on `url`, as text and a number (as
/// [`execute`] runs it).
pub(super) fn text_and_number(url: &str, sql: &str) -> anyhow::Result<Vec<(String, i64)>> {
    off_runtime(url, sql, |client, sql| async move {
        let rows = client.query(&sql, &[]).await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    })
}

/// Runs `job` with a connection to `url` and `sql`, from a thread and a runtime of its own.
fn off_runtime<T, F>(url: &str, sql: &str, job: impl FnOnce(Client, String) -> F + Send + 'static) -> anyhow::Result<T>
where
    T: Send + 'static,
    F: std::future::Future<Output = anyhow::Result<T>>,
{
    let (url, sql) = (url.to_string(), sql.to_string());
    std::thread::spawn(move || -> anyhow::Result<T> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(async {
            let client = connect(&url).await?;
            job(client, sql).await
        })
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the SQL thread panicked"))?
}

/// The mean length of the values of a ledger's table.
pub(super) async fn mean_row_len(url: &str, schema: &str, table: &str) -> anyhow::Result<usize> {
    let client = connect(url).await?;
    let row = client
        .query_one(
            &format!("SELECT coalesce(avg(length(value)), 0)::float8 FROM \"{schema}\".\"{table}\""),
            &[],
        )
        .await?;
    let mean: f64 = row.get(0);
    anyhow::ensure!(
        mean > 0.0,
        "the ledger in schema {schema} holds no rows in `{table}` to size"
    );
    Ok(mean.round() as usize)
}

/// The raw baseline of recovery: connect and read every row of every table of `schema`; the
/// rows read and the seconds it took.
pub(super) async fn scan(url: &str, schema: &str) -> anyhow::Result<(usize, f64)> {
    let start = Instant::now();
    let client = connect(url).await?;
    let tables = client
        .query(
            "SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1",
            &[&schema],
        )
        .await?;
    let mut rows = 0;
    for t in tables {
        let name: String = t.get(0);
        rows += client
            .query(&format!("SELECT * FROM \"{schema}\".\"{name}\""), &[])
            .await?
            .len();
    }
    Ok((rows, start.elapsed().as_secs_f64()))
}

/// How long an idle worker or consumer of the queue waits before it looks again.
const POLL: Duration = Duration::from_millis(1);

/// The durable workload's baseline on PostgreSQL: a plain `FOR UPDATE SKIP LOCKED` queue in a
/// schema of its own. `n` jobs of `row` bytes are inserted in calls of [`CALL`] (one statement,
/// one transaction each); `workers` workers each claim up to [`CALL`] waiting jobs
/// (`FOR UPDATE SKIP LOCKED`), do them (zero-time) and mark them done with their result, one
/// transaction a batch; a consumer claims up to [`CALL`] done results (`SKIP LOCKED`) and
/// deletes them (its ack), one transaction a batch. Every commit is `synchronous_commit = on`.
/// Jobs per second from the first insert to the last ack.
pub(super) async fn queue(url: &str, schema: &str, n: usize, row: usize, workers: usize) -> anyhow::Result<f64> {
    let setup = connect(url).await?;
    setup
        .batch_execute(&format!(
            "CREATE SCHEMA \"{schema}\";
             CREATE TABLE \"{schema}\".jobs (
                 id bigint PRIMARY KEY,
                 payload bytea NOT NULL,
                 state smallint NOT NULL DEFAULT 0,
                 result bytea);
             CREATE INDEX ON \"{schema}\".jobs (id) WHERE state = 0;
             CREATE INDEX ON \"{schema}\".jobs (id) WHERE state = 1;"
        ))
        .await?;
    let jobs = format!("\"{schema}\".jobs");
    let producer = connect(url).await?;
    let consumer = connect(url).await?;
    let mut pool = Vec::new();
    for _ in 0..workers.max(1) {
        pool.push(connect(url).await?);
    }
    let insert = producer
        .prepare(&format!(
            "INSERT INTO {jobs} (id, payload) SELECT * FROM unnest($1::bigint[], $2::bytea[])"
        ))
        .await?;
    let batch = CALL as i64;
    let claim_sql =
        format!("SELECT id, payload FROM {jobs} WHERE state = 0 ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED");
    let done_sql = format!(
        "UPDATE {jobs} SET state = 1, result = r.result
         FROM unnest($1::bigint[], $2::bytea[]) AS r(id, result) WHERE {jobs}.id = r.id"
    );
    let take_sql = format!("SELECT id, result FROM {jobs} WHERE state = 1 ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED");
    let ack_sql = format!("DELETE FROM {jobs} WHERE id = ANY($1)");
    // Set when the consumer has everything, or anything failed (so nothing waits for ever).
    let finished = std::cell::Cell::new(false);
    let stopping = |r: anyhow::Result<()>| {
        if r.is_err() {
            finished.set(true);
        }
        r
    };
    let start = Instant::now();
    let produce = async {
        for call in 0..n.div_ceil(CALL) {
            let ids: Vec<i64> = (call * CALL..((call + 1) * CALL).min(n)).map(|i| i as i64).collect();
            let payloads: Vec<Vec<u8>> = ids
                .iter()
                .map(|i| {
                    let mut p = vec![7u8; row];
                    p[..8.min(row)].copy_from_slice(&i.to_le_bytes()[..8.min(row)]);
                    p
                })
                .collect();
            producer.execute(&insert, &[&ids, &payloads]).await?;
        }
        Ok::<_, anyhow::Error>(())
    };
    let produce = async { stopping(produce.await) };
    let consume = async {
        let take = consumer.prepare(&take_sql).await?;
        let ack = consumer.prepare(&ack_sql).await?;
        let mut delivered = 0;
        while delivered < n {
            anyhow::ensure!(!finished.get(), "the queue's producer or a worker failed");
            consumer.batch_execute("BEGIN").await?;
            let taken = consumer.query(&take, &[&batch]).await?;
            if taken.is_empty() {
                consumer.batch_execute("COMMIT").await?;
                tokio::time::sleep(POLL).await;
                continue;
            }
            let ids: Vec<i64> = taken.iter().map(|r| r.get(0)).collect();
            consumer.execute(&ack, &[&ids]).await?;
            consumer.batch_execute("COMMIT").await?;
            delivered += ids.len();
        }
        Ok::<_, anyhow::Error>(())
    };
    let consume = async {
        let r = consume.await;
        finished.set(true);
        r
    };
    let (claim_sql, done_sql, flag, stop) = (&claim_sql, &done_sql, &finished, &stopping);
    let workers = futures::future::join_all(
        pool.iter()
            .map(|client| async move { stop(work(client, claim_sql, done_sql, row, flag).await) }),
    );
    let (p, c, w) = tokio::join!(produce, consume, workers);
    let took = start.elapsed().as_secs_f64();
    // The first failure, rather than the consumer's report of it.
    p?;
    for r in w {
        r?;
    }
    c?;
    setup
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await?;
    Ok(n as f64 / took)
}

/// A worker of [`queue`]: until `finished`, claims up to [`CALL`] waiting jobs, does them
/// (zero-time: the result is the start of the payload) and marks them done, one transaction a
/// batch.
async fn work(
    client: &Client,
    claim_sql: &str,
    done_sql: &str,
    row: usize,
    finished: &std::cell::Cell<bool>,
) -> anyhow::Result<()> {
    let claim = client.prepare(claim_sql).await?;
    let done = client.prepare(done_sql).await?;
    let batch = CALL as i64;
    while !finished.get() {
        // `Client::transaction` needs `&mut`: its statements, sent as they are.
        client.batch_execute("BEGIN").await?;
        let claimed = client.query(&claim, &[&batch]).await?;
        if claimed.is_empty() {
            client.batch_execute("COMMIT").await?;
            tokio::time::sleep(POLL).await;
            continue;
        }
        let ids: Vec<i64> = claimed.iter().map(|r| r.get(0)).collect();
        let results: Vec<Vec<u8>> = claimed
            .iter()
            .map(|r| r.get::<_, &[u8]>(1)[..64.min(row)].to_vec())
            .collect();
        client.execute(&done, &[&ids, &results]).await?;
        client.batch_execute("COMMIT").await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn a_database_is_swapped_in_the_address() {
        assert_eq!(
            with_database("postgres://u@h:5/postgres", "x").unwrap(),
            "postgres://u@h:5/x"
        );
        assert_eq!(with_database("postgres://u@h:5", "x").unwrap(), "postgres://u@h:5/x");
        assert_eq!(
            with_database("postgresql://u:p@h/db?sslmode=disable", "x").unwrap(),
            "postgresql://u:p@h/x?sslmode=disable"
        );
    }
}
