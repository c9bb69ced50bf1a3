//! The PostgreSQL ledger's schema: created, migrated, and refused when newer than this build.

use super::*;

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
