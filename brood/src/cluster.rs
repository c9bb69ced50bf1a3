//! The reads and requests of [`BroodHandle`] that see every session stored in the ledger, not
//! only those this process serves: a page of stored session ids, their dead letters counted,
//! who serves which, a redrive split between this process and the holders of the other
//! sessions, and a bounded round trip to the ledger (readiness). What crosses to another
//! process is the server's to send; this file says what goes where.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use brood_actors::actors::owner;
use brood_actors::ledger::TenureHolder;
use brood_actors::model::DeadLetterRow;

use crate::{BroodError, BroodHandle, DeadLetterInfo, RedriveSelect};

/// A redrive done where it could be: the items put back in sessions this process serves, and
/// the dead letters of sessions served by other processes, for their holders to redrive.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RedriveSplit {
    /// The items put back here.
    pub redriven: usize,
    /// By the address of the process serving them: the sessions served there, each with the
    /// ids of the children whose dead letters were selected (sorted, each once).
    pub elsewhere: BTreeMap<String, Vec<(String, Vec<String>)>>,
}

impl BroodHandle {
    /// Up to `limit` ids of the sessions stored in the ledger, in ascending order: after `after`
    /// (exclusive) when given, starting with `prefix` when given. Every stored session, whichever
    /// process serves it (one read of a key range).
    pub async fn stored_session_ids(
        &self,
        after: Option<&str>,
        prefix: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, BroodError> {
        let (ledger, after, prefix) = (
            self.ledger.clone(),
            after.map(str::to_string),
            prefix.map(str::to_string),
        );
        crate::lifecycle::blocking(move || ledger.session_ids(after.as_deref(), prefix.as_deref(), limit)).await
    }

    /// How many dead letters each session from `first` to `last` (by id, both included) holds,
    /// counted in one grouped read; a session without any is absent.
    pub async fn dead_letter_counts(&self, first: &str, last: &str) -> Result<HashMap<String, u64>, BroodError> {
        let (ledger, first, last) = (self.ledger.clone(), first.to_string(), last.to_string());
        let counts = crate::lifecycle::blocking(move || ledger.dead_letter_counts(&first, &last)).await?;
        Ok(counts.into_iter().collect())
    }

    /// How many dead letters the ledger holds (every session's, whichever process serves it),
    /// counted without reading them.
    pub async fn dead_letter_total(&self) -> Result<u64, BroodError> {
        let ledger = self.ledger.clone();
        crate::lifecycle::blocking(move || ledger.dead_letter_total()).await
    }

    /// Of `session_ids`, those another process serves now (its tenure is live and not this
    /// process's), with the address it takes requests at: one read of the tenures. Sessions
    /// served here, free ones and unknown ones are absent; so is everything when no other
    /// process shares the ledger.
    pub async fn served_elsewhere(&self, session_ids: &[String]) -> Result<HashMap<String, String>, BroodError> {
        let Some(tenures) = self.engine.tenures().cloned() else {
            return Ok(HashMap::new());
        };
        let ids = session_ids.to_vec();
        let holders = crate::lifecycle::blocking(move || tenures.holders(&ids)).await?;
        Ok(holders
            .into_iter()
            .filter_map(|(id, h)| match h {
                TenureHolder::Elsewhere { address, .. } => Some((id, address)),
                TenureHolder::Here(_) => None,
            })
            .collect())
    }

    /// Whether the ledger answers a round trip within `timeout` (PostgreSQL: `SELECT 1`; sled,
    /// in this process's own folder: always). Not cached: a probe caches it.
    pub async fn ledger_answers(&self, timeout: Duration) -> Result<(), BroodError> {
        let ledger = self.ledger.clone();
        crate::lifecycle::blocking(move || ledger.ping(timeout)).await
    }

    /// As [`BroodHandle::redrive`], each session's part done by the process that serves it:
    /// the parts of the sessions served here are done, and those of sessions served elsewhere
    /// come back for their holders ([`RedriveSplit::elsewhere`]), chosen together (`limit`
    /// counts them all, the oldest dead first). The holders are found in one read of the
    /// tenures; a session free now is taken up here, as any request would.
    pub async fn redrive_split(&self, select: RedriveSelect, limit: Option<usize>) -> Result<RedriveSplit, BroodError> {
        let by_session = self.redrive_selection(&select, limit).await?;
        let ids: Vec<String> = by_session.keys().cloned().collect();
        let away = self.served_elsewhere(&ids).await?;
        let mut split = RedriveSplit::default();
        for (session, selected) in by_session {
            let address = match away.get(&session) {
                Some(address) => address.clone(),
                None => match self
                    .ask(
                        &session,
                        owner::Redrive {
                            selected: selected.clone(),
                        },
                    )
                    .await
                {
                    Ok(done) => {
                        split.redriven += done?;
                        continue;
                    }
                    Err(BroodError::Moved { address, .. }) => address,
                    Err(e) => return Err(e),
                },
            };
            let mut children: Vec<String> = selected.into_iter().map(|d| d.child_id).collect();
            children.sort();
            children.dedup();
            split.elsewhere.entry(address).or_default().push((session, children));
        }
        Ok(split)
    }

    /// The dead letters `select` chooses, at most `limit` (the oldest dead first), by session.
    pub(crate) async fn redrive_selection(
        &self,
        select: &RedriveSelect,
        limit: Option<usize>,
    ) -> Result<BTreeMap<String, Vec<DeadLetterRow>>, BroodError> {
        match select {
            RedriveSelect::Children(ids) if ids.is_empty() => {
                return Err(BroodError::invalid("child_ids", "must name at least one child"))
            }
            RedriveSelect::Session(s) if s.is_empty() => {
                return Err(BroodError::invalid("session_id", "must not be empty"))
            }
            _ => {}
        }
        if limit == Some(0) {
            return Err(BroodError::invalid("limit", "must be at least 1 when given"));
        }
        let mut all = self.dead_letter_rows().await?;
        all.sort_by(|a, b| (a.dead_at_ms, &a.dedup_key).cmp(&(b.dead_at_ms, &b.dedup_key)));
        let mut by_session: BTreeMap<String, Vec<DeadLetterRow>> = BTreeMap::new();
        let chosen = all.into_iter().filter(|d| select.selects(&DeadLetterInfo::from(d)));
        for d in chosen.take(limit.unwrap_or(usize::MAX)) {
            by_session.entry(d.session_id.clone()).or_default().push(d);
        }
        Ok(by_session)
    }
}
