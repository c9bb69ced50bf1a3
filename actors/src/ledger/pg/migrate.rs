//! The PostgreSQL ledger's schema: created, migrated, and refused when newer than this build.

use super::*;

/// The schema's migrations, in order: (version, name, SQL with `{schema}` for the schema).
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "one table per tree", ""),
    (
        2,
        "session leases",
        "CREATE TABLE \"{schema}\".session_leases (
             session bytea PRIMARY KEY,
             owner text NOT NULL,
             address text NOT NULL,
             epoch bigint NOT NULL,
             expires_at timestamptz NOT NULL) WITH (fillfactor = 70);
         CREATE INDEX ON \"{schema}\".session_leases (owner)",
    ),
    (
        3,
        "shared work list",
        "CREATE TABLE \"{schema}\".work_directory (
             child_id text PRIMARY KEY,
             queue text NOT NULL,
             address text NOT NULL,
             posted_at timestamptz NOT NULL);
         CREATE INDEX ON \"{schema}\".work_directory (queue, posted_at)",
    ),
    (
        4,
        "lease instances",
        "ALTER TABLE \"{schema}\".session_leases ADD COLUMN instance text NOT NULL DEFAULT ''",
    ),
    (
        5,
        "lz4 row values",
        // A call row holds its tasks and an ack row its items (tens of KiB): the server's
        // default compression (pglz) was the largest single cost of a commit's CPU there. On
        // a server built without lz4 the tables keep pglz (the migration is recorded all the
        // same). Values stored before keep their compression; both read alike.
        "DO $$
         DECLARE t record;
         BEGIN
             IF EXISTS (SELECT 1 FROM pg_settings
                        WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
                 FOR t IN SELECT c.relname FROM pg_class c
                          JOIN pg_namespace n ON n.oid = c.relnamespace
                          JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'value'
                          WHERE n.nspname = '{schema}' AND c.relkind = 'r' LOOP
                     EXECUTE format('ALTER TABLE %I.%I ALTER COLUMN value SET COMPRESSION lz4',
                                    '{schema}', t.relname);
                 END LOOP;
             END IF;
         END $$",
    ),
    (
        6,
        "calls by id",
        // A call is looked up by its id alone (`GET /v1/calls/{id}`, a cancel, a worker's
        // request for a child of a call served elsewhere): an index on the id part of its key,
        // built after the migration's transaction, concurrently ([`CALL_INDEX`]).
        "",
    ),
    (
        7,
        "session rows of version 2",
        // Session rows keep `addressable` from now on, in a layout of their own version (the
        // codec reads the old one too): nothing to change here, but a build that does not read
        // the new version refuses the schema rather than quarantine its sessions.
        "",
    ),
    (
        8,
        "call rows of version 2",
        // Call rows keep the caller's `traceparent` from now on, in a layout of their own
        // version (the codec reads the old one too): as migration 7, nothing to change, but a
        // build that does not read the new version refuses the schema rather than quarantine
        // its calls.
        "",
    ),
    (
        9,
        "balanced tenures",
        // The processes sharing the schema (`nodes`: a heartbeat renewed with their tenures,
        // and how many tenures each holds), the free tenures found by their expiry (an index
        // range, not a scan of every session), the parent session of a nested session handed
        // over with it, and a tenure row for every session stored without one (free), so a
        // sweep never needs to look for sessions with no row.
        "CREATE INDEX ON \"{schema}\".session_leases (expires_at);
         ALTER TABLE \"{schema}\".session_leases ADD COLUMN parent bytea;
         CREATE TABLE \"{schema}\".nodes (
             node text PRIMARY KEY,
             address text NOT NULL,
             instance text NOT NULL,
             held bigint NOT NULL DEFAULT 0,
             expires_at timestamptz NOT NULL);
         INSERT INTO \"{schema}\".session_leases (session, owner, address, epoch, expires_at, instance)
             SELECT key, '', '', 0, '-infinity', '' FROM \"{schema}\".sessions
             ON CONFLICT (session) DO NOTHING",
    ),
    (
        10,
        "tenures as long as the heartbeat",
        // A tenure lasts as long as the heartbeat of the process instance that took it (see
        // tenures.rs): one row of `nodes` per instance, and the tenures of an instance found by
        // the index on `instance`. Tenures taken before keep their expiry and run out by it.
        "ALTER TABLE \"{schema}\".nodes DROP CONSTRAINT nodes_pkey;
         ALTER TABLE \"{schema}\".nodes ADD PRIMARY KEY (instance);
         CREATE INDEX ON \"{schema}\".session_leases (instance)",
    ),
    (
        11,
        "counts of sessions held",
        // How many sessions each process instance holds, in a row of its own beside its
        // heartbeat: written in the transaction of each take and give-back (see tenures.rs),
        // which then never holds the heartbeat's row a renewal writes. `nodes.held` is no
        // longer written.
        "CREATE TABLE \"{schema}\".held_counts (
             instance text PRIMARY KEY,
             held bigint NOT NULL)",
    ),
    (
        12,
        "work list instances",
        // The process instance that listed each waiting child: a withdrawal deletes only its
        // own instance's listings, never those of a process started since at the same address.
        // Rows listed before are withdrawn by address until they are listed again.
        "ALTER TABLE \"{schema}\".work_directory ADD COLUMN instance text NOT NULL DEFAULT ''",
    ),
];

impl PgLedger {
    /// Creates the schema and applies the migrations it lacks; refuses a schema newer than
    /// this build, or one whose applied migrations are not this build's.
    pub(super) fn migrate(&self) -> Result<(), LedgerError> {
        let pool = self.inner.pool.clone();
        let schema = self.inner.schema.clone();
        let tables: Vec<String> = tables().map(|t| self.table(t)).collect();
        let meta = self.table(META);
        self.runtime.run(async move {
            let mut client = pool.get().await.map_err(pool_error)?;
            let tx = client.transaction().await.map_err(pg_error("starting the migration"))?;
            // One process at a time, whichever schema: the lock is the transaction's.
            tx.execute("SELECT pg_advisory_xact_lock(7420113)", &[])
                .await
                .map_err(pg_error("waiting for the migration lock"))?;
            tx.batch_execute(&format!(
                "CREATE SCHEMA IF NOT EXISTS \"{schema}\";
                 CREATE TABLE IF NOT EXISTS \"{schema}\".migrations (
                     version integer PRIMARY KEY,
                     name text NOT NULL,
                     applied_at timestamptz NOT NULL DEFAULT now())"
            ))
            .await
            .map_err(pg_error("creating the schema"))?;
            let applied = tx
                .query(&format!("SELECT version, name FROM \"{schema}\".migrations ORDER BY version"), &[])
                .await
                .map_err(pg_error("reading the applied migrations"))?;
            let latest = MIGRATIONS.last().map_or(0, |m| m.0);
            for row in &applied {
                let (version, name): (i32, String) = (row.get(0), row.get(1));
                match MIGRATIONS.iter().find(|m| m.0 == version) {
                    None if version > latest => {
                        return Err(LedgerError::storage_msg(format!(
                            "the database's brood schema `{schema}` is at version {version}; this build knows versions up to {latest}: upgrade brood (nothing was changed)"
                        )))
                    }
                    Some(m) if m.1 == name => {}
                    _ => {
                        return Err(LedgerError::storage_msg(format!(
                            "the database's brood schema `{schema}` has a migration {version} `{name}` this build does not have (nothing was changed)"
                        )))
                    }
                }
            }
            for &(version, name, sql) in MIGRATIONS {
                if applied.iter().any(|r| r.get::<_, i32>(0) == version) {
                    continue;
                }
                if version == 1 {
                    for table in &tables {
                        tx.batch_execute(&format!(
                            "CREATE TABLE {table} (key bytea PRIMARY KEY, value bytea NOT NULL)"
                        ))
                        .await
                        .map_err(pg_error(format!("creating {table}")))?;
                    }
                }
                if !sql.is_empty() {
                    tx.batch_execute(&sql.replace("{schema}", &schema))
                        .await
                        .map_err(pg_error(format!("applying migration {version}")))?;
                }
                tx.execute(
                    &format!("INSERT INTO \"{schema}\".migrations (version, name) VALUES ($1, $2)"),
                    &[&version, &name],
                )
                .await
                .map_err(pg_error("recording a migration"))?;
            }
            // The rows' format, as sled's meta tree keeps it.
            let format = tx
                .query_opt(&format!("SELECT value FROM {meta} WHERE key = $1"), &[&b"format".as_slice()])
                .await
                .map_err(pg_error("reading the ledger's format"))?;
            match format {
                Some(row) => {
                    let version: u8 = decode_at(META, b"format", row.get::<_, &[u8]>(0))?;
                    if version != codec::FORMAT_VERSION {
                        return Err(LedgerError::storage_msg(format!(
                            "the database's brood schema `{schema}` holds ledger format {version}; this build reads {}",
                            codec::FORMAT_VERSION
                        )));
                    }
                }
                None => {
                    let value = encode(META, "format", &codec::FORMAT_VERSION)?;
                    tx.execute(
                        &format!("INSERT INTO {meta} (key, value) VALUES ($1, $2)"),
                        &[&b"format".as_slice(), &value],
                    )
                    .await
                    .map_err(pg_error("writing the ledger's format"))?;
                }
            }
            tx.commit().await.map_err(pg_error("committing the migration"))
        })?;
        // The index only speeds lookups by call id up: a build that failed (a lock or statement
        // timeout, a cancel) leaves them reading the table, and the next open builds it.
        if let Err(e) = self.build_call_index() {
            tracing::warn!(schema = %self.inner.schema, "building the index of calls by id failed (lookups by call id read the table until a later open builds it): {e}");
        }
        Ok(())
    }

    /// Builds the index of calls by id ([`CALL_INDEX`]) when it is missing or invalid, without
    /// blocking writes (`CONCURRENTLY`, which runs outside any transaction). One process builds
    /// a schema's index at a time: one that finds another building it goes on without waiting
    /// (lookups read the table until the index is valid).
    fn build_call_index(&self) -> Result<(), LedgerError> {
        let pool = self.inner.pool.clone();
        let schema = self.inner.schema.clone();
        self.runtime.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            if call_index_valid(&client, &schema).await? == Some(true) {
                return Ok(());
            }
            let locked: bool = client
                .query_one("SELECT pg_try_advisory_lock(7420114, hashtext($1))", &[&schema])
                .await
                .map_err(pg_error("taking the index build's lock"))?
                .get(0);
            if !locked {
                tracing::info!(%schema, "another process builds the index of calls by id");
                return Ok(());
            }
            let built = async {
                match call_index_valid(&client, &schema).await? {
                    Some(true) => return Ok(()),
                    Some(false) => {
                        tracing::warn!(%schema, "the index of calls by id was left invalid by an interrupted build: built again");
                        client
                            .batch_execute(&format!("DROP INDEX CONCURRENTLY IF EXISTS \"{schema}\".{CALL_INDEX}"))
                            .await
                            .map_err(pg_error("dropping the invalid index of calls by id"))?;
                    }
                    None => tracing::info!(%schema, "building the index of calls by id"),
                }
                client
                    .batch_execute(&format!(
                        "CREATE INDEX CONCURRENTLY IF NOT EXISTS {CALL_INDEX} ON \"{schema}\".calls (({CALL_ID_OF_KEY}))"
                    ))
                    .await
                    .map_err(pg_error("building the index of calls by id"))
            }
            .await;
            let unlocked = client
                .execute("SELECT pg_advisory_unlock(7420114, hashtext($1))", &[&schema])
                .await
                .map_err(pg_error("giving the index build's lock back"));
            built.and(unlocked.map(|_| ()))
        })
    }
}

/// Whether `schema`'s index of calls by id ([`CALL_INDEX`]) is valid; None: it is not there.
pub(super) async fn call_index_valid(
    client: &deadpool_postgres::Object,
    schema: &str,
) -> Result<Option<bool>, LedgerError> {
    client
        .query_opt(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2",
            &[&schema, &CALL_INDEX],
        )
        .await
        .map(|row| row.map(|r| r.get::<_, bool>(0)))
        .map_err(pg_error("reading the index of calls by id"))
}
