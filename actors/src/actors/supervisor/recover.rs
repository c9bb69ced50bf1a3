//! Reading sessions back from the ledger: every session at start, the sessions this process
//! takes up from a shared ledger, and one session for its owner's rebuild. Each owner is
//! recovered as a restart of the process recovers it (I6): its live claims returned, what
//! recovery resolved written and flushed before the owner serves anything.

use std::collections::HashMap;

use crate::actors::owner::SessionOwner;
use crate::actors::Engine;
use crate::ledger::{Ledger, LedgerError, RowKey, Writes};
use crate::model::{nest_parent, ChildRow, ChildStatus, ClaimRow, NestRow};
use crate::recovery::{split_snapshot, Recovery, Reject};

/// Leaves in `snapshot` only the rows of `sessions` (the damaged children of their calls).
pub(super) fn keep_sessions(snapshot: &mut crate::ledger::Snapshot, sessions: &std::collections::HashSet<String>) {
    let ours = |s: &String| sessions.contains(s);
    snapshot.sessions.retain(|r| ours(&r.session_id));
    snapshot.calls.retain(|r| ours(&r.session_id));
    snapshot.children.retain(|r| ours(&r.session_id));
    snapshot.claims.retain(|r| ours(&r.session_id));
    snapshot.starts.retain(|r| ours(&r.session_id));
    snapshot.wakes.retain(|r| ours(&r.session_id));
    snapshot.nests.retain(|r| ours(&r.session_id));
    let calls: std::collections::HashSet<&str> = snapshot.calls.iter().map(|c| c.call_id.as_str()).collect();
    snapshot
        .damaged_children
        .retain(|id| id.rsplit_once('.').is_some_and(|(call, _)| calls.contains(call)));
}

/// Moves aside the rows recovery found inconsistent with the rest.
pub(super) fn quarantine_rejects(ledger: &dyn Ledger, rejects: &[Reject]) -> Result<(), LedgerError> {
    for r in rejects {
        ledger.quarantine(r.tree, &r.session_id, &r.key, &r.reason)?;
    }
    Ok(())
}

/// The keys of claim rows, to remove them.
pub(super) fn claim_keys(claims: &[ClaimRow]) -> Vec<RowKey> {
    claims
        .iter()
        .map(|c| RowKey::new(c.session_id.clone(), c.claim_id.clone()))
        .collect()
}

/// Marks the recovered owners of nested sessions whose child has ended (while no process ran,
/// or before its end reached them: a crash in between): each cancels its unfinished calls as it
/// starts, before it admits anything, and takes no more.
pub(super) fn end_orphaned_nests(engine: &Engine, owners: &mut [SessionOwner]) {
    let index: HashMap<String, usize> = owners
        .iter()
        .enumerate()
        .map(|(i, o)| (o.session_id().to_string(), i))
        .collect();
    let mut ended = Vec::new();
    for nest in engine.nests() {
        let Some(&me) = index.get(&nest.session_id) else {
            continue;
        };
        let Some((call_id, task)) = nest_parent(&nest.session_id) else {
            continue;
        };
        let Some(&parent) = index.get(&nest.parent_session_id) else {
            // Shared: the parent is served by another process, whose child may still run.
            if engine.tenures.is_none() {
                ended.push(me);
            }
            continue;
        };
        let state = owners[parent].child_status(call_id, task);
        if state.is_none_or(|s| s.is_terminal()) {
            ended.push(me);
        }
    }
    for i in ended {
        let reason = crate::model::parent_ended_reason(owners[i].session_id());
        owners[i].end_nested_when_started(reason);
    }
}

/// Reads one session's own rows back and recovers its owner from them as `mode` says (its live
/// claims returned; what recovery resolved written and flushed), with its own nest row if it is
/// nested; none when the session has no row.
pub(super) fn recover_session(
    engine: &Engine,
    id: &str,
    mode: Recovery,
) -> Result<Option<(SessionOwner, Option<NestRow>)>, LedgerError> {
    let mut snapshot = engine.ledger.load_session(id)?;
    let nest = snapshot.nests.pop();
    let split = split_snapshot(snapshot);
    quarantine_rejects(&*engine.ledger, &split.rejects)?;
    let Some((session, part)) = split.sessions.into_iter().find(|(s, _)| s.session_id == id) else {
        return Ok(None);
    };
    let claim_ids = claim_keys(&part.claims);
    let (owner, changed) = SessionOwner::recover(engine.clone(), session, part, mode);
    let writes = Writes {
        children: changed,
        remove_claims: claim_ids,
        ..Writes::default()
    };
    engine.ledger.write(&writes)?;
    // A child queued again must not read `running` after a crash (it would be `unknown`).
    engine.ledger.flush()?;
    count_unknown(engine, &writes.children);
    Ok(Some((owner, nest)))
}

/// Reads the top-level sessions `ids` (whose tenures this process just took) back all at once
/// — on PostgreSQL a few statements per table, whatever their number — and recovers each owner
/// as [`recover_session`] recovers one (as a restart of the process would: I6), with one write
/// and one flush for them all. The sessions stored are answered; an id missing from the answer
/// has no row any more.
pub(super) fn recover_sessions(engine: &Engine, ids: &[String]) -> Result<Vec<SessionOwner>, LedgerError> {
    let mut snapshot = engine.ledger.load_sessions(ids)?;
    keep_sessions(&mut snapshot, &ids.iter().cloned().collect());
    for nest in std::mem::take(&mut snapshot.nests) {
        engine.add_nest(nest);
    }
    let claim_ids = claim_keys(&snapshot.claims);
    let split = split_snapshot(snapshot);
    quarantine_rejects(&*engine.ledger, &split.rejects)?;
    let mut writes = Writes {
        sessions: split.rebuilt_sessions,
        remove_claims: claim_ids,
        ..Writes::default()
    };
    let mut owners = Vec::with_capacity(split.sessions.len());
    for (session, part) in split.sessions {
        let (owner, rows) = SessionOwner::recover(engine.clone(), session, part, Recovery::Process);
        writes.children.extend(rows);
        owners.push(owner);
    }
    engine.ledger.write(&writes)?;
    // A child queued again must not read `running` after a crash (it would be `unknown`).
    engine.ledger.flush()?;
    count_unknown(engine, &writes.children);
    Ok(owners)
}

/// Counts the children recovery resolved `unknown` (their rows durable now) as ended: the
/// only way a child ends so. Rows it read as ended already, and marked recovered, are not
/// counted: their end was counted where it happened, or before this process started.
pub(super) fn count_unknown(engine: &Engine, changed: &[ChildRow]) {
    let unknown = changed.iter().filter(|r| r.status == ChildStatus::Unknown).count();
    engine.counters.ended(ChildStatus::Unknown, unknown as u64);
}
