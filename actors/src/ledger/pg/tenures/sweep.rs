//! The sweep's statements: how the sessions are spread over the live processes, and taking free
//! tenures (one asked for, or up to a share), found by index among the free ones.

use super::*;

impl HeldTenures {
    /// SQL: whether the tenure row `l` (its alias) is free to take: given back or run out by its
    /// own expiry (a give-back, a session stored without a tenure, a tenure taken before tenures
    /// lasted as long as their holder's heartbeat), or held by a process instance whose
    /// heartbeat ran out. The dead instances are a few rows of `nodes`, their tenures found by
    /// the index on `instance`, the others' by the index on `expires_at`.
    pub(super) fn free(&self, l: &str) -> String {
        format!(
            "({l}.expires_at < now() OR {l}.instance = ANY(ARRAY(SELECT hb.instance FROM {} hb WHERE hb.expires_at < now())))",
            self.nodes_table
        )
    }

    /// As [`HeldTenures::free`], for a statement that looks for free tenures among all of them
    /// (a sweep): the dead instances given as the parameter `dead` ([`HeldTenures::dead`]), so
    /// the planner knows them and finds their few tenures by the index on `instance` (given by
    /// a subquery it would guess that they hold their share of every row, and scan them all).
    fn free_among(l: &str, dead: &str) -> String {
        format!("({l}.expires_at < now() OR {l}.instance = ANY({dead}::text[]))")
    }

    /// The process instances whose heartbeat ran out (a few rows of `nodes`).
    async fn dead(client: &deadpool_postgres::Object, nodes: &str) -> Result<Vec<String>, LedgerError> {
        let row = client
            .query_one(
                &format!("SELECT coalesce(array_agg(instance), '{{}}') FROM {nodes} WHERE expires_at < now()"),
                &[],
            )
            .await
            .map_err(pg_error("reading which processes' heartbeats ran out"))?;
        Ok(row.get(0))
    }

    /// SQL: writes `$2` as the count of sessions instance `$1` holds (its row of
    /// `held_counts`, which only this process writes, under its `counting` lock: never waited
    /// for), when it changed.
    pub(super) fn held_written(&self) -> String {
        format!(
            "INSERT INTO {c} AS c (instance, held) VALUES ($1, $2)
             ON CONFLICT (instance) DO UPDATE SET held = EXCLUDED.held WHERE c.held <> EXCLUDED.held",
            c = self.counts_table
        )
    }

    /// What the live processes hold and what is free; writes this process's held count first
    /// when it changed, and deletes a few expired rows of sessions no longer stored.
    pub(super) async fn spread(&self) -> Result<Spread, LedgerError> {
        let client = self.pool.get().await.map_err(pool_error)?;
        {
            // Written by a statement of its own, the lock let go before the read: the read's
            // delete may wait for a take of this process's, which waits for the lock.
            let _counting = self.counting.lock().await;
            client
                .execute(&self.held_written(), &[&self.instance, &self.counted()])
                .await
                .map_err(pg_error("writing how many sessions this process holds"))?;
        }
        let given = self.recently_given();
        let stored = format!(
            "EXISTS (SELECT 1 FROM {} s WHERE s.key = l.session)",
            self.sessions_table
        );
        let dead = Self::dead(&client, &self.nodes_table).await?;
        // The rows to delete are found with the dead instances named (by index), and each is
        // judged again as the delete finds it with the heartbeats as they are then: a tenure
        // taken meanwhile by an instance revived since is kept.
        let (free, free_d) = (Self::free_among("l", "$5"), self.free("d"));
        let row = client
            .query_one(
                &format!(
                    "WITH gone AS (
                         DELETE FROM {t} d WHERE d.session IN (
                             SELECT l.session FROM {t} l WHERE {free} AND NOT {stored} LIMIT $3
                             FOR UPDATE SKIP LOCKED)
                           AND {free_d})
                     SELECT
                         (SELECT count(*) FROM {t} l WHERE {free} AND l.parent IS NULL AND NOT {NESTED}
                              AND {stored}),
                         (SELECT count(*) FROM {t} l WHERE {free} AND l.parent IS NULL AND NOT {NESTED}
                              AND NOT (l.session = ANY($4)) AND {stored}),
                         (SELECT count(*) FROM {t} l JOIN {t} p ON p.session = l.parent
                              WHERE {free} AND p.owner = $1 AND p.instance = $2
                                AND p.expires_at >= now() AND {stored})
                         + (SELECT count(*) FROM {t} l WHERE {free} AND l.parent IS NULL AND {NESTED}
                              AND NOT (l.session = ANY($4)) AND {stored}),
                         coalesce((SELECT array_agg(coalesce(c.held, 0) ORDER BY n.instance) FROM {nodes} n
                                       LEFT JOIN {counts} c ON c.instance = n.instance
                                   WHERE n.expires_at >= now() AND n.node <> $1),
                                  '{{}}'::bigint[]),
                         coalesce((SELECT array_agg(n.instance < $2 ORDER BY n.instance) FROM {nodes} n
                                   WHERE n.expires_at >= now() AND n.node <> $1),
                                  '{{}}'::boolean[])",
                    nodes = self.nodes_table,
                    counts = self.counts_table,
                    t = self.table,
                ),
                &[&self.config.node, &self.instance, &GONE_PER_SWEEP, &given, &dead],
            )
            .await
            .map_err(pg_error("reading how the sessions are spread"))?;
        let count = |i: usize| u64::try_from(row.get::<_, i64>(i)).unwrap_or(0);
        Ok(Spread {
            free: count(0),
            takeable: count(1),
            nests: count(2),
            others: row
                .get::<_, Vec<i64>>(3)
                .into_iter()
                .map(|h| u64::try_from(h).unwrap_or(0))
                .collect(),
            others_before: row.get(4),
        })
    }

    /// Takes tenures by one upsert: for `session` alone, or (none) for up to `limit` stored
    /// top-level sessions whose tenure is free and which this process did not give back, and
    /// every free nested session whose parent session this process holds. Free tenures are
    /// found by their expiry (an index range), not by a scan of the sessions.
    pub(super) async fn take(
        self: Arc<Self>,
        session: Option<String>,
        limit: usize,
    ) -> Result<Vec<(String, i64)>, LedgerError> {
        let _turn = self.taking.lock().await;
        let sent = Instant::now();
        let mut client = self.pool.get().await.map_err(pool_error)?;
        let what = "taking session tenures";
        let held: Vec<Vec<u8>> = self.held().keys().map(|s| s.as_bytes().to_vec()).collect();
        let one = session.map(String::into_bytes);
        let candidates: Vec<Vec<u8>> = match &one {
            Some(name) => vec![name.clone()],
            None => {
                let stored = format!(
                    "EXISTS (SELECT 1 FROM {} s WHERE s.key = l.session)",
                    self.sessions_table
                );
                // Top-level sessions up to the limit; nested ones given back to the holder of
                // their parent (this process); nested ones whose parent is not named (taken by
                // any process, which leaves each to the holder of its parent: see adopt.rs).
                let dead = Self::dead(&client, &self.nodes_table).await?;
                let free = Self::free_among("l", "$6");
                let sql = format!(
                    "(SELECT l.session FROM {t} l
                      WHERE {free} AND l.parent IS NULL AND NOT {NESTED}
                        AND NOT (l.session = ANY($2)) AND NOT (l.session = ANY($5)) AND {stored}
                      ORDER BY l.expires_at, l.session LIMIT $4)
                     UNION
                     (SELECT l.session FROM {t} l JOIN {t} p ON p.session = l.parent
                      WHERE {free} AND NOT (l.session = ANY($2)) AND p.owner = $1 AND p.instance = $3
                        AND p.expires_at >= now() AND {stored})
                     UNION
                     (SELECT l.session FROM {t} l
                      WHERE {free} AND l.parent IS NULL AND {NESTED}
                        AND NOT (l.session = ANY($2)) AND NOT (l.session = ANY($5)) AND {stored})
                     ORDER BY 1",
                    t = self.table
                );
                let limit = i64::try_from(limit).unwrap_or(i64::MAX);
                let given = self.recently_given();
                client
                    .query(&sql, &[&self.config.node, &held, &self.instance, &limit, &given, &dead])
                    .await
                    .map_err(pg_error(what))?
                    .into_iter()
                    .map(|r| r.get(0))
                    .collect()
            }
        };
        // In batches, each a transaction of its own: a batch taken stays taken (and held) when a
        // later one fails, and is answered, so the caller serves it; the next sweep takes the rest.
        let mut taken: Vec<(String, i64)> = Vec::new();
        for batch in candidates.chunks(TAKE_BATCH) {
            let answer = self.take_batch(&mut client, batch, &held, sent).await;
            if answer.is_err() {
                // Its commit may have gone through unanswered: what it took is given back.
                self.stray(batch.iter().map(|n| (String::from_utf8_lossy(n).into_owned(), None)));
            }
            match answer {
                Ok(more) => taken.extend(more),
                Err(e) if taken.is_empty() => return Err(e),
                Err(e) => {
                    tracing::warn!(
                        taken = taken.len(),
                        "taking session tenures stopped part way (the rest is taken at a later sweep): {e}"
                    );
                    break;
                }
            }
        }
        tracing::debug!(asked = ?one.as_ref().map(|n| String::from_utf8_lossy(n).into_owned()), ?taken, "session tenures taken");
        if taken.len() >= VACUUM_AFTER {
            // Their rows changed from free to held at once. Cleaned now, not at the next
            // automatic vacuum: until then the index on expiry still holds their free versions
            // (every sweep would read them all to find none free), and the planner's statistics
            // still count them free.
            if let Err(e) = client.batch_execute(&format!("VACUUM (ANALYZE) {}", self.table)).await {
                tracing::warn!("cleaning the tenure table after a large take failed: {e}");
            }
        }
        Ok(taken)
    }

    /// Takes the tenures of `batch` that are free (see [`HeldTenures::take`]) in one
    /// transaction, and holds them from now on.
    async fn take_batch(
        &self,
        client: &mut deadpool_postgres::Object,
        batch: &[Vec<u8>],
        held: &[Vec<u8>],
        sent: Instant,
    ) -> Result<Vec<(String, i64)>, LedgerError> {
        let what = "taking session tenures";
        // Their advisory locks first, exclusively and in key order: this waits for every commit
        // of the tenures' holders that is under way, and holds off those that come after until
        // this one committed (see the module's "Fencing").
        let keys = take_keys(&self.table, batch);
        let tx = client.transaction().await.map_err(pg_error(what))?;
        tx.query(
            "SELECT count(pg_advisory_xact_lock(k)) FROM unnest($1::int8[]) AS k",
            &[&keys],
        )
        .await
        .map_err(pg_error(what))?;
        // Held as long as this process's heartbeat is: taken only while it is alive, its row
        // of `nodes` locked against a delete until this commits (so no tenure ever names an
        // instance without one: [`HeldTenures::leave`] deletes it first), and never running out
        // by itself ('infinity') until given back.
        let sql = format!(
            "INSERT INTO {t} AS l (session, owner, address, epoch, expires_at, instance)
             SELECT src.key, $1, $2, 1, 'infinity', $4 FROM unnest($5::bytea[]) AS src(key)
             WHERE EXISTS (SELECT 1 FROM {nodes} me WHERE me.instance = $4 AND me.expires_at >= now()
                           FOR KEY SHARE)
             ON CONFLICT (session) DO UPDATE SET owner = EXCLUDED.owner, address = EXCLUDED.address,
                 epoch = l.epoch + 1, expires_at = EXCLUDED.expires_at, instance = EXCLUDED.instance
               WHERE ({free} OR l.instance = $4) AND NOT (l.session = ANY($3))
             RETURNING l.session, l.epoch",
            t = self.table,
            nodes = self.nodes_table,
            free = self.free("l"),
        );
        let rows = tx
            .query(
                &sql,
                &[&self.config.node, &self.config.address, &held, &self.instance, &batch],
            )
            .await
            .map_err(pg_error(what))?;
        let taken: Vec<(String, i64)> = rows
            .into_iter()
            .map(|r| (String::from_utf8_lossy(r.get::<_, &[u8]>(0)).into_owned(), r.get(1)))
            .collect();
        // This process's count with the sessions taken, written in the same transaction (so the
        // others never see them neither free nor counted), and the sessions held here before
        // another count is worked out.
        let top_level = top_level_in(taken.iter().map(|(s, _)| s));
        let _counting = self.counting.lock().await;
        if top_level > 0 {
            let held = self.counted() + top_level;
            tx.execute(&self.held_written(), &[&self.instance, &held])
                .await
                .map_err(pg_error(what))?;
        }
        tx.commit().await.map_err(pg_error(what))?;
        // Served no longer than the heartbeat it lasts as long as (its take found it alive).
        let beat = *self.beat.lock().unwrap_or_else(|p| p.into_inner());
        let deadline = beat.map_or(sent, |b| b.min(self.deadline(sent)));
        let mut mine = self.held();
        let mut given = self.given();
        for (s, epoch) in &taken {
            given.remove(s);
            mine.insert(
                s.clone(),
                Held {
                    epoch: *epoch,
                    deadline,
                },
            );
        }
        Ok(taken)
    }
}
