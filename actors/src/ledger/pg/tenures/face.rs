//! The [`Tenures`] face of a process's tenures: what the engine asks of them.

use super::*;

/// The trait's face of a process's tenures.
#[derive(Debug, Clone)]
pub(in crate::ledger::pg) struct PgTenures(pub(in crate::ledger::pg) Arc<HeldTenures>);

impl Tenures for PgTenures {
    fn node(&self) -> &str {
        &self.0.config.node
    }

    fn ttl(&self) -> Duration {
        self.0.config.ttl
    }

    fn acquire(&self, session_id: &str) -> Result<TenureHolder, LedgerError> {
        if let Some(h) = self.0.held().get(session_id) {
            return Ok(TenureHolder::Here(h.epoch as u64));
        }
        let tenures = self.0.clone();
        let name = session_id.to_string();
        self.0.run(async move {
            let taken = tenures.clone().take(Some(name.clone()), 1).await?;
            if let Some((_, epoch)) = taken.first() {
                return Ok(TenureHolder::Here(*epoch as u64));
            }
            // A sweep of this process may have taken it just before.
            if let Some(h) = tenures.held().get(&name) {
                return Ok(TenureHolder::Here(h.epoch as u64));
            }
            // A live holder only: a free tenure was not taken because it was given back (or
            // its holder's heartbeat ran out) since, or because this process's own heartbeat
            // is out (it takes nothing then), and is nobody's to send the request to.
            match tenures.holder_row(name.as_bytes().to_vec(), true, true).await? {
                Some(elsewhere) => Ok(elsewhere),
                None => Err(LedgerError::storage_msg(format!(
                    "the tenure of session `{name}` was free but not taken (it changed hands meanwhile, or this process's heartbeat ran out); retry"
                ))),
            }
        })
    }

    fn holder(&self, session_id: &str) -> Result<Option<TenureHolder>, LedgerError> {
        if let Some(h) = self.0.held().get(session_id) {
            return Ok(Some(TenureHolder::Here(h.epoch as u64)));
        }
        let tenures = self.0.clone();
        let name = session_id.as_bytes().to_vec();
        self.0.run(async move { tenures.holder_row(name, true, true).await })
    }

    fn recorded_holder(&self, session_id: &str) -> Result<Option<TenureHolder>, LedgerError> {
        let tenures = self.0.clone();
        let name = session_id.as_bytes().to_vec();
        self.0.run(async move { tenures.holder_row(name, true, false).await })
    }

    fn holders(&self, session_ids: &[String]) -> Result<Vec<(String, TenureHolder)>, LedgerError> {
        let mut out = Vec::new();
        let mut ask: Vec<Vec<u8>> = Vec::new();
        {
            let held = self.0.held();
            for id in session_ids {
                match held.get(id) {
                    Some(h) => out.push((id.clone(), TenureHolder::Here(h.epoch as u64))),
                    None => ask.push(id.as_bytes().to_vec()),
                }
            }
        }
        if ask.is_empty() {
            return Ok(out);
        }
        let (pool, table, live, me) = (
            self.0.pool.clone(),
            self.0.table.clone(),
            self.0.free("l"),
            self.0.instance.clone(),
        );
        let rows: Vec<(Vec<u8>, String, String)> = self.0.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            let rows = client
                .query(
                    // Rows of this process's own that it does not hold (a take under way, a
                    // give-back) name nobody else: left out.
                    &format!(
                        "SELECT session, owner, address FROM {table} l
                         WHERE session = ANY($1) AND NOT {live} AND instance <> $2"
                    ),
                    &[&ask, &me],
                )
                .await
                .map_err(pg_error("reading session tenures"))?;
            Ok(rows.into_iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect())
        })?;
        for (name, owner, address) in rows {
            if let Ok(id) = String::from_utf8(name) {
                out.push((id, TenureHolder::Elsewhere { owner, address }));
            }
        }
        Ok(out)
    }

    fn acquire_free(&self, limit: usize) -> Result<Vec<String>, LedgerError> {
        let tenures = self.0.clone();
        let taken = self.0.run(async move { tenures.take(None, limit).await })?;
        Ok(taken.into_iter().map(|(s, _)| s).collect())
    }

    fn spread(&self) -> Result<Spread, LedgerError> {
        let tenures = self.0.clone();
        self.0.run(async move { tenures.spread().await })
    }

    fn held_count(&self) -> usize {
        usize::try_from(self.0.top_level_held()).unwrap_or(0)
    }

    fn hand_over(&self, sessions: &[(String, Option<String>)]) -> Result<(), LedgerError> {
        let back = self.0.unhold(sessions);
        {
            let now = Instant::now();
            let ttl = self.0.config.ttl;
            let mut given = self.0.given();
            given.retain(|_, at| now.duration_since(*at) < ttl);
            for (s, _) in sessions {
                given.insert(s.clone(), now);
            }
        }
        let tenures = self.0.clone();
        let given = self.0.run(async move { tenures.give_back(back, true).await })?;
        tracing::info!(sessions = given, "session tenures handed over to the other processes");
        Ok(())
    }

    fn handed_over(&self, session_id: &str) -> bool {
        self.0
            .given()
            .get(session_id)
            .is_some_and(|at| at.elapsed() < self.0.config.ttl)
    }

    fn leave_to_parent(&self, session_id: &str, parent: &str) {
        let back = self.0.unhold(&[(session_id.to_string(), Some(parent.to_string()))]);
        if back.names.is_empty() {
            return;
        }
        let tenures = self.0.clone();
        let shown = session_id.to_string();
        // Not waited for: a tenure not given back runs out by itself (and is then anyone's).
        self.0.runtime.spawn(async move {
            if let Err(e) = tenures.give_back(back, true).await {
                tracing::warn!(session = %shown, "giving a nested session's tenure back failed (it runs out by itself): {e}");
            }
        });
    }

    fn freed(&self) -> Option<watch::Receiver<u64>> {
        Some(self.0.freed.clone())
    }

    fn holds(&self, session_id: &str) -> bool {
        self.0.held().contains_key(session_id)
    }

    fn serving(&self, session_id: &str) -> bool {
        self.0
            .held()
            .get(session_id)
            .is_some_and(|h| Instant::now() < h.deadline)
    }

    fn release(&self, session_id: &str) {
        let Some(held) = self.0.held().remove(session_id) else {
            return;
        };
        tracing::debug!(session = %session_id, epoch = held.epoch, "session tenure given back");
        // Not waited for: a tenure not given back runs out by itself.
        let tenures = self.0.clone();
        let shown = session_id.to_string();
        let back = GiveBack {
            names: vec![session_id.as_bytes().to_vec()],
            epochs: vec![held.epoch],
            parents: vec![None],
            counted: 0,
        };
        self.0.runtime.spawn(async move {
            if let Err(e) = tenures.give_back(back, false).await {
                tracing::warn!(session = %shown, "giving a session tenure back failed (it runs out by itself): {e}");
            }
        });
    }

    fn release_all(&self) {
        let tenures = self.0.clone();
        match self.0.run(async move { tenures.leave().await }) {
            Ok(n) => tracing::info!(tenures = n, "session tenures given back"),
            Err(e) => tracing::warn!("giving session tenures back failed (they run out by themselves): {e}"),
        }
    }

    fn on_lost(&self, lost: crate::ledger::LostTenures) {
        if self.0.on_lost.set(lost).is_err() {
            tracing::warn!("a second lost-tenure hook was not set");
        }
    }
}
