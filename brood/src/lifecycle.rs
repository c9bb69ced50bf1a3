//! The lifecycle requests of [`BroodHandle`]: one call's view, a session's stored calls and
//! acks, retention's sweep, dead letters and their redrive, cancel (with the descendants it
//! reaches).

use brood_actors::actors::owner;
use brood_actors::ledger::Ledger;

use brood_actors::model::CallRow;

use crate::{
    AckInfo, BroodError, BroodHandle, CallStatus, CancelTarget, Cancelled, ChildInfo, DeadLetterInfo, LedgerError,
    RedriveInfo, RedriveSelect, Swept, MAX_CANCEL_REASON,
};

impl BroodHandle {
    /// One call, with its units and children: from its owner while any of it is out, else from
    /// the ledger (once everything in it was delivered, until retention removes it).
    pub async fn call(&self, call_id: &str) -> Result<CallStatus, BroodError> {
        let unknown = || BroodError::UnknownTarget {
            kind: "call",
            id: call_id.to_string(),
        };
        let live = self.engine.session_of_call(call_id);
        if let Some(session) = live {
            if let Some(status) = self.ask(&session, owner::GetCall(call_id.to_string())).await? {
                return Ok(status);
            }
        }
        let ledger = self.ledger.clone();
        let id = call_id.to_string();
        // One read of the index of calls.
        let found = blocking(move || ledger.find_call(&id)).await?.ok_or_else(unknown)?;
        if self.engine.tenures().is_some() {
            // Shared: its session may be served here once taken up, or elsewhere (then the
            // request goes there: its holder has the call in memory).
            let view = owner::GetCall(call_id.to_string());
            if let Some(status) = self.ask(&found.session_id, view).await? {
                return Ok(status);
            }
        }
        let ledger = self.ledger.clone();
        blocking(move || stored_call(&*ledger, found)).await
    }

    /// The session call `call_id` was made in: from memory while the call is out, else from the
    /// ledger's index of calls (one read). None when no stored call has the id.
    pub async fn call_session(&self, call_id: &str) -> Result<Option<String>, BroodError> {
        if let Some(session) = self.engine.session_of_call(call_id) {
            return Ok(Some(session));
        }
        let (ledger, id) = (self.ledger.clone(), call_id.to_string());
        Ok(blocking(move || ledger.find_call(&id)).await?.map(|c| c.session_id))
    }

    /// What the ledger recorded of child `child_id` (a terminal child's is final), or `None`
    /// while it has no row of its own (it never started); [`BroodError::UnknownTarget`] when no
    /// stored call has the child. Read from the ledger, whichever process serves its session:
    /// what is there was recorded.
    pub async fn stored_child(&self, child_id: &str) -> Result<Option<ChildInfo>, BroodError> {
        let unknown = || BroodError::UnknownTarget {
            kind: "child",
            id: child_id.to_string(),
        };
        let (call_id, task) = brood_actors::model::parse_child_id(child_id).ok_or_else(unknown)?;
        let session = self.call_session(call_id).await?.ok_or_else(unknown)?;
        let (ledger, call, child) = (self.ledger.clone(), call_id.to_string(), child_id.to_string());
        let (row, tasks) = blocking(move || {
            let row = ledger.child(&session, &child)?;
            let tasks = match row {
                Some(_) => None,
                None => Some(ledger.call(&session, &call)?.map_or(0, |c| c.tasks.len())),
            };
            Ok::<_, LedgerError>((row, tasks))
        })
        .await?;
        match (row, tasks) {
            (Some(row), _) => Ok(Some(ChildInfo::from(&row))),
            (None, Some(n)) if (task as usize) < n => Ok(None),
            (None, _) => Err(unknown()),
        }
    }

    /// The address of the process the tenure row of child `child_id`'s session names, when
    /// several processes share the ledger: read from the ledger, so a process that lost the
    /// session without noticing yet sees who took it; this process's own address when the row
    /// names it (the caller compares). None when the tenure is free, when the id names no
    /// stored call, or when the ledger is not shared. Found from what the processes wrote (the
    /// call's row and the session's tenure, written by a peer that registered itself by taking
    /// it), never from anything a client sent but the child id.
    pub async fn child_holder(&self, child_id: &str) -> Result<Option<String>, BroodError> {
        let Some(tenures) = self.engine.tenures().cloned() else {
            return Ok(None);
        };
        let Some((call_id, _)) = brood_actors::model::parse_child_id(child_id) else {
            return Ok(None);
        };
        let Some(session) = self.call_session(call_id).await? else {
            return Ok(None);
        };
        let holder = blocking(move || tenures.recorded_holder(&session)).await?;
        Ok(match holder {
            Some(brood_actors::ledger::TenureHolder::Elsewhere { address, .. }) => Some(address),
            _ => None,
        })
    }

    /// Up to `limit` calls of a session in the order they were made (after the call id `after`,
    /// when given), delivered ones included (from the ledger, until retention removes them);
    /// and the last call id of the page when more follow.
    pub async fn session_calls(
        &self,
        session_id: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<CallStatus>, Option<String>), BroodError> {
        self.owner(session_id).await?;
        let (ledger, id, from) = (self.ledger.clone(), session_id.to_string(), after.map(str::to_string));
        let limit = limit.max(1);
        let mut page = blocking(move || ledger.calls_page(&id, from.as_deref(), limit + 1)).await?;
        let more = page.len() > limit;
        page.truncate(limit);
        let next = more.then(|| page.last().map(|c| c.call_id.clone())).flatten();
        let mut out = Vec::with_capacity(page.len());
        for call in page {
            let live = match self.engine.session_of_call(&call.call_id).is_some() {
                true => self.ask(session_id, owner::GetCall(call.call_id.clone())).await?,
                false => None,
            };
            let status = match live {
                Some(status) => status,
                None => {
                    let ledger = self.ledger.clone();
                    blocking(move || stored_call(&*ledger, call)).await?
                }
            };
            out.push(status);
        }
        Ok((out, next))
    }

    /// Up to `limit` acks of a session in claim id order (the order its claims were made, then
    /// sync calls' receipts, whose claim ids `sync_<call_id>` sort after every claim's), after the claim id `after` when given, from the ledger
    /// (until retention removes them); and the last claim id of the page when more follow. With
    /// `call_id`, only the acks that delivered items of that call, each with only those: the
    /// session's retained acks are read a thousand at a time until the page is full. Served
    /// by the session's holder, as [`BroodHandle::status`] is.
    pub async fn deliveries(
        &self,
        session_id: &str,
        call_id: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<AckInfo>, Option<String>), BroodError> {
        self.view(session_id, owner::GetCounts).await?;
        let (ledger, id) = (self.ledger.clone(), session_id.to_string());
        let (call, from) = (call_id.map(str::to_string), after.map(str::to_string));
        let limit = limit.max(1);
        blocking(move || acks_of(&*ledger, &id, call.as_deref(), from, limit)).await
    }

    /// Sweeps now what retention would remove (as the background sweep does every
    /// [`Retention::interval`](crate::Retention::interval)): calls delivered or dead long enough ago, ack rows of calls that
    /// are gone, idle sessions. Nothing live is removed.
    pub async fn sweep(&self) -> Result<Swept, BroodError> {
        brood_actors::actors::sweeper::sweep(&self.engine, brood_actors::model::now_ms()).await
    }

    /// How many rows the ledger holds, by tree (a scan: for inspection).
    pub fn stored_rows(&self) -> Result<Vec<(&'static str, usize)>, BroodError> {
        Ok(self.ledger.row_counts()?)
    }

    /// The dead letters of one session.
    pub async fn dead_letters_of(&self, session_id: &str) -> Result<Vec<DeadLetterInfo>, BroodError> {
        let mut dead = self.dead_letters().await?;
        dead.retain(|d| d.session_id == session_id);
        Ok(dead)
    }

    /// Puts dead-lettered items back in their sessions' ready sets, with their delivery
    /// attempts counted afresh: those of the children named, of one session, or all; at most
    /// `limit` of them (the oldest dead first). Each redrive is recorded with its item
    /// ([`BroodHandle::redrive_record`]). Items that are not dead letters are skipped, not
    /// counted. Returns how many were put back.
    pub async fn redrive(&self, select: RedriveSelect, limit: Option<usize>) -> Result<usize, BroodError> {
        let mut redriven = 0;
        for (session, selected) in self.redrive_selection(&select, limit).await? {
            redriven += self.ask(&session, owner::Redrive { selected }).await??;
        }
        Ok(redriven)
    }

    /// The redrive record of an item (by its dedup key), if it was ever redriven.
    pub fn redrive_record(&self, session_id: &str, dedup_key: &str) -> Result<Option<RedriveInfo>, BroodError> {
        Ok(self
            .ledger
            .redrive(session_id, dedup_key)?
            .as_ref()
            .map(RedriveInfo::from))
    }

    /// Cancels a call, one of its units, or one child: every unfinished child under it ends
    /// `cancelled` (a running one's runner is dropped, so a command's process group is killed
    /// and an external worker's next heartbeat or completion is refused; a queued one never
    /// starts), recorded durably before this answers, and its slot goes to the next queued
    /// child. Children that had ended are left as they are and still delivered. A cancelled
    /// child is an ordinary result of its unit, which goes out whole; its error says who
    /// cancelled it (`by`), what, and why. Cancelling again, or something finished, changes
    /// nothing and says so.
    pub async fn cancel(&self, target: CancelTarget, by: &str, reason: Option<&str>) -> Result<Cancelled, BroodError> {
        let unknown = || BroodError::UnknownTarget {
            kind: target.kind(),
            id: target.id().to_string(),
        };
        if let Some(r) = reason {
            if r.chars().count() > MAX_CANCEL_REASON {
                return Err(BroodError::invalid(
                    "reason",
                    format!(
                        "is {} characters long; at most {MAX_CANCEL_REASON} are kept",
                        r.chars().count()
                    ),
                ));
            }
        }
        let call_id = target.call_id().ok_or_else(unknown)?.to_string();
        let mut text = format!("cancelled by {by} ({} {})", target.kind(), target.id());
        if let Some(r) = reason.map(str::trim).filter(|r| !r.is_empty()) {
            text = format!("{text}: {r}");
        }
        let live = self.engine.session_of_call(&call_id);
        if let Some(session) = live {
            let msg = owner::Cancel {
                target: target.clone(),
                reason: text.clone(),
                stored: None,
            };
            match self.ask(&session, msg).await? {
                // Its call left memory meanwhile: it is over, and the ledger says how.
                Err(BroodError::UnknownTarget { .. }) => {}
                done => return done,
            }
        }
        let ledger = self.ledger.clone();
        let id = call_id.clone();
        // One read of the index of calls.
        let stored = blocking(move || ledger.find_call(&id)).await?.ok_or_else(unknown)?;
        let session = stored.session_id.clone();
        self.ask(
            &session,
            owner::Cancel {
                target,
                reason: text,
                stored: Some(stored),
            },
        )
        .await?
    }
}

/// A blocking ledger read, off the caller's executor and every actor's thread.
pub(crate) async fn blocking<T: Send + 'static>(
    job: impl FnOnce() -> Result<T, LedgerError> + Send + 'static,
) -> Result<T, BroodError> {
    Ok(brood_actors::ledger::off_thread("reading the ledger", job).await?)
}

/// How many ack rows a page of one call's deliveries reads at a time.
const ACK_BATCH: usize = 1000;

/// A page of [`BroodHandle::deliveries`]: the acks of session `id` after `from`, of the call
/// `call` when given, at most `limit`, and the last claim id when more follow.
fn acks_of(
    ledger: &dyn Ledger,
    id: &str,
    call: Option<&str>,
    mut from: Option<String>,
    limit: usize,
) -> Result<(Vec<AckInfo>, Option<String>), LedgerError> {
    // One more than the page, to know whether more follow.
    let mut out: Vec<AckInfo> = Vec::with_capacity(limit.min(ACK_BATCH) + 1);
    loop {
        let batch = match call {
            None => limit + 1 - out.len(),
            Some(_) => ACK_BATCH,
        };
        let rows = ledger.acks_page(id, from.as_deref(), batch)?;
        let exhausted = rows.len() < batch;
        from = rows.last().map(|r| r.claim_id.clone());
        for row in &rows {
            let mut ack = AckInfo::from(row);
            if let Some(c) = call {
                ack.items.retain(|i| i.call_id == c);
                if ack.items.is_empty() {
                    continue;
                }
            }
            out.push(ack);
            if out.len() > limit {
                break;
            }
        }
        if exhausted || out.len() > limit {
            break;
        }
    }
    let more = out.len() > limit;
    out.truncate(limit);
    let next = more.then(|| out.last().map(|a| a.claim_id.clone())).flatten();
    Ok((out, next))
}

/// A call no owner holds any more, from the ledger: everything in it was delivered or dead.
fn stored_call(ledger: &dyn Ledger, call: CallRow) -> Result<CallStatus, LedgerError> {
    let children = brood_actors::ledger::settled_children(ledger, &call.session_id, &call.call_id)?;
    let units = brood_actors::model::plan_units(&call.call_id, &call.tasks, call.independent_completions);
    Ok(CallStatus::from_rows(&call, &units, &children))
}
