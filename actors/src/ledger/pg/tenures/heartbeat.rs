//! The process's heartbeat, which every tenure it holds lasts as long as: its renewal, the read
//! back of its tenures after a lapse, the give-backs that failed made again, and the slow
//! upkeep of the tables (sessions without a tenure row, heartbeats long dead).

use super::*;

impl HeldTenures {
    /// Writes this process's row of `nodes` (its heartbeat): at start, before any sweep counts
    /// the processes; then with every renewal.
    pub(in crate::ledger::pg) fn join(self: &Arc<Self>) -> Result<(), LedgerError> {
        let tenures = self.clone();
        self.run(async move {
            tenures.renew().await?;
            tenures.reconcile().await.map(|_| ())
        })
    }

    /// Deletes the heartbeats of process instances dead for [`DEAD_NODES_KEPT_MS`] that no
    /// tenure names any more (a tenure naming an instance without a heartbeat would look held
    /// for ever), each judged by its own row as the delete finds it (a heartbeat renewed
    /// meanwhile, by a process paused that long, is kept), with their counts of sessions held
    /// and any count left without a heartbeat (written by a take or a sweep as its process
    /// left). Returns how many heartbeats it deleted.
    pub(in crate::ledger::pg) async fn forget_dead_nodes(&self) -> Result<u64, LedgerError> {
        let client = self.pool.get().await.map_err(pool_error)?;
        let row = client
            .query_one(
                &format!(
                    "WITH gone AS (
                         DELETE FROM {nodes} n WHERE n.expires_at < now() - $1::int8 * interval '1 millisecond'
                           AND NOT EXISTS (SELECT 1 FROM {t} r WHERE r.instance = n.instance AND r.expires_at >= now())
                         RETURNING n.instance),
                     counted AS (
                         DELETE FROM {counts} c WHERE c.instance IN (SELECT instance FROM gone)
                           OR NOT EXISTS (SELECT 1 FROM {nodes} n WHERE n.instance = c.instance))
                     SELECT count(*) FROM gone",
                    nodes = self.nodes_table,
                    counts = self.counts_table,
                    t = self.table,
                ),
                &[&DEAD_NODES_KEPT_MS],
            )
            .await
            .map_err(pg_error("deleting the heartbeats of processes long dead"))?;
        Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
    }

    /// Gives every stored session without a tenure row one, free: the sweeps find free tenures
    /// by their expiry alone. Returns how many it wrote.
    async fn reconcile(&self) -> Result<u64, LedgerError> {
        let client = self.pool.get().await.map_err(pool_error)?;
        let written = client
            .execute(
                &format!(
                    "INSERT INTO {t} (session, owner, address, epoch, expires_at, instance)
                     SELECT s.key, '', '', 0, '-infinity', '' FROM {sessions} s
                     WHERE NOT EXISTS (SELECT 1 FROM {t} l WHERE l.session = s.key)
                     ON CONFLICT (session) DO NOTHING",
                    t = self.table,
                    sessions = self.sessions_table
                ),
                &[],
            )
            .await
            .map_err(pg_error("giving stored sessions without a tenure row one"))?;
        if written > 0 {
            tracing::info!(
                sessions = written,
                "stored sessions without a tenure row were given one (free)"
            );
        }
        Ok(written)
    }

    /// Renews this process's heartbeat, which every tenure it holds lasts as long as: one row
    /// written, whatever it holds, on the heartbeat's own connection. When the heartbeat had run
    /// out (a pause or an outage longer than a tenure), the others may have taken tenures
    /// meanwhile: the held ones are read back by key, and those taken over are lost.
    pub(super) async fn renew(self: &Arc<Self>) -> Result<(), LedgerError> {
        let _renewing = self.renewing.read().await;
        if self.left.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(());
        }
        let (names, epochs): (Vec<Vec<u8>>, Vec<i64>) = self
            .held()
            .iter()
            .map(|(s, h)| (s.as_bytes().to_vec(), h.epoch))
            .unzip();
        let sent = Instant::now();
        let mut client = self.heartbeat.get().await.map_err(pool_error)?;
        let what = "renewing this process's heartbeat";
        let alive: bool = client
            .query_one(
                &format!(
                    "WITH before AS (SELECT expires_at FROM {nodes} WHERE instance = $3),
                     beat AS (
                         INSERT INTO {nodes} AS n (node, address, instance, expires_at)
                         VALUES ($1, $2, $3, now() + $4::int8 * interval '1 millisecond')
                         ON CONFLICT (instance) DO UPDATE SET node = EXCLUDED.node, address = EXCLUDED.address,
                             expires_at = EXCLUDED.expires_at
                         RETURNING clock_timestamp() AS written)
                     SELECT coalesce((SELECT expires_at FROM before), '-infinity')
                         > (SELECT written FROM beat) + $4::int8 / 5 * interval '1 millisecond'",
                    nodes = self.nodes_table,
                ),
                &[&self.config.node, &self.config.address, &self.instance, &self.ttl_ms()],
            )
            .await
            .map_err(pg_error(what))?
            .get(0);
        // Alive throughout only when the old heartbeat outlived this one's writing by a fifth
        // of a tenure (the commit follows at once): a statement sent in time but held up past
        // the heartbeat's end (a lock, a stalled server) counts as a lapse, as another process
        // may have seen the heartbeat out meanwhile and taken tenures.
        // After a lapse, what is still this process's at the epoch it holds. A takeover begun
        // while the heartbeat was out may not have committed yet: the tenures' advisory locks
        // are taken shared first, as a commit's check takes them, so the read waits for every
        // takeover under way (and one that comes after sees the heartbeat alive again).
        let kept: Option<HashSet<Vec<u8>>> = if alive || names.is_empty() {
            None
        } else {
            let what = "reading the session tenures held through a lapsed heartbeat";
            let tx = client.transaction().await.map_err(pg_error(what))?;
            tx.query(
                "SELECT count(pg_advisory_xact_lock_shared(k)) FROM unnest($1::int8[]) AS k",
                &[&commit_keys(&self.table, &names)],
            )
            .await
            .map_err(pg_error(what))?;
            let rows = tx
                .query(
                    &format!(
                        "SELECT l.session FROM {t} l JOIN unnest($1::bytea[], $2::int8[]) AS f(session, epoch)
                         ON l.session = f.session AND l.epoch = f.epoch AND l.owner = $3 AND l.instance = $4",
                        t = self.table
                    ),
                    &[&names, &epochs, &self.config.node, &self.instance],
                )
                .await
                .map_err(pg_error(what))?;
            tx.commit().await.map_err(pg_error(what))?;
            Some(rows.into_iter().map(|r| r.get(0)).collect())
        };
        drop(client);
        let deadline = self.deadline(sent);
        {
            let mut beat = self.beat.lock().unwrap_or_else(|p| p.into_inner());
            *beat = Some(beat.map_or(deadline, |b| b.max(deadline)));
        }
        let mut lost = Vec::new();
        {
            let mut held = self.held();
            for (name, epoch) in names.iter().zip(&epochs) {
                let shown = String::from_utf8_lossy(name).into_owned();
                // Taken again meanwhile, at a new epoch, or lost already: as it is.
                let Some(h) = held.get_mut(&shown).filter(|h| h.epoch == *epoch) else {
                    continue;
                };
                if kept.as_ref().is_some_and(|k| !k.contains(name)) {
                    lost.push(shown);
                } else {
                    h.deadline = h.deadline.max(deadline);
                }
            }
        }
        self.lose(lost);
        Ok(())
    }

    /// Remembers tenures that may still be this process's in the table although it no longer
    /// holds them (a give-back that failed, a take whose answer was lost): given back at the
    /// next renewal, as a tenure does not run out by itself while its holder is alive.
    /// A nested session's is given back naming its parent session, as its first give-back did.
    pub(super) fn stray(&self, sessions: impl IntoIterator<Item = (String, Option<Vec<u8>>)>) {
        let mut strays = self.strays.lock().unwrap_or_else(|p| p.into_inner());
        for (session, parent) in sessions {
            let kept = strays.entry(session).or_default();
            if parent.is_some() {
                *kept = parent;
            }
        }
    }

    /// Gives back the tenures of [`HeldTenures::stray`] that are still this process's
    /// instance's and are not held again.
    pub(super) async fn give_back_strays(&self) -> Result<(), LedgerError> {
        if self.strays.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
            return Ok(());
        }
        // Not while a take is under way (it may wait for others' commits for up to a tenure):
        // the renewals go on meanwhile, and a later one gives these back.
        let Ok(_turn) = self.taking.try_lock() else {
            return Ok(());
        };
        let (names, parents): (Vec<Vec<u8>>, Vec<Option<Vec<u8>>>) = {
            let held = self.held();
            let mut strays = self.strays.lock().unwrap_or_else(|p| p.into_inner());
            strays.retain(|s, _| !held.contains_key(s));
            strays
                .iter()
                .map(|(s, parent)| (s.as_bytes().to_vec(), parent.clone()))
                .unzip()
        };
        if names.is_empty() {
            return Ok(());
        }
        let given = self.give_back_own(Some((names.clone(), parents)), false).await?;
        let mut strays = self.strays.lock().unwrap_or_else(|p| p.into_inner());
        for name in &names {
            strays.remove(String::from_utf8_lossy(name).as_ref());
        }
        if given > 0 {
            tracing::info!(sessions = given, "session tenures not held any more were given back");
        }
        Ok(())
    }

    /// Starts the renewal task on the ledger's runtime; it ends when the held tenures are dropped,
    /// or once this process left.
    pub(in crate::ledger::pg) fn start_renewing(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let every = self.config.ttl / 3;
        let runtime = self.runtime.clone();
        self.runtime.spawn(async move {
            let mut reconciled = Instant::now();
            let mut upkeep: Option<tokio::task::JoinHandle<()>> = None;
            loop {
                tokio::time::sleep(every).await;
                let Some(tenures) = weak.upgrade() else { return };
                if tenures.left.load(std::sync::atomic::Ordering::SeqCst) {
                    // A clean stop: nothing more to renew or keep up.
                    return;
                }
                if let Err(e) = tenures.renew().await {
                    tracing::warn!("renewing session tenures failed (retried at the next turn): {e}");
                }
                // The upkeep on the pool's connections, beside the renewals (never holding up
                // the next: every connection of the pool may be taken for up to a tenure), one
                // at a time.
                if upkeep.as_ref().is_none_or(|u| u.is_finished()) {
                    let due = reconciled.elapsed() >= RECONCILE_EVERY;
                    if due {
                        reconciled = Instant::now();
                    }
                    upkeep = Some(runtime.spawn(async move { tenures.upkeep(due).await }));
                }
            }
        });
    }

    /// Gives back the tenures left to give back, and with `due` gives stored sessions without a
    /// tenure row one and deletes the heartbeats long dead.
    async fn upkeep(&self, due: bool) {
        if let Err(e) = self.give_back_strays().await {
            tracing::warn!("giving back session tenures not held any more failed (tried again later): {e}");
        }
        if !due {
            return;
        }
        if let Err(e) = self.reconcile().await {
            tracing::warn!("looking for stored sessions without a tenure row failed (tried again later): {e}");
        }
        if let Err(e) = self.forget_dead_nodes().await {
            tracing::warn!("deleting the heartbeats of processes long dead failed (tried again later): {e}");
        }
    }
}
