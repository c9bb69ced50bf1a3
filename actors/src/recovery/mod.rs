//! Recovery (I6): what an owner rebuilt from the ledger holds, decided as plain code.
//!
//! [`split_snapshot`] sorts a ledger snapshot by session and sets apart the orphaned rows of a
//! dispatch a crash cut short. [`plan`] decides, for one session, every call still owed to its
//! parent: which children are replayed, queued again, adopted as running, re-run or resolved
//! `unknown`, which units are complete, which items are ready again, and which rows changed.
//! The owner applies the plan; nothing here touches an actor or the disk.

use std::collections::{HashMap, HashSet};

use crate::ledger::Snapshot;
use crate::model::*;

/// How a rebuilt owner treats children its ledger shows as running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// The process restarted: nothing is running any more, so each such child is re-run
    /// (when its task allows it) or resolved as `unknown`.
    Process,
    /// Only the owner restarted: its children's actors live on and will hand their results
    /// to the new owner, so they stay running.
    Owner,
}

/// A fresh queued child row for task `i` of `call` in `unit`.
pub fn queued_child(call: &CallRow, unit: &UnitRow, i: u32) -> ChildRow {
    fresh_child(&call.call_id, &unit.unit_id, &call.session_id, i)
}

/// A fresh queued child row for task `i` of call `call_id`, in unit `unit_id` of `session_id`.
fn fresh_child(call_id: &str, unit_id: &str, session_id: &str, i: u32) -> ChildRow {
    ChildRow {
        child_id: child_id(call_id, i),
        call_id: call_id.to_string(),
        unit_id: unit_id.to_string(),
        session_id: session_id.to_string(),
        task_index: i,
        status: ChildStatus::Queued,
        summary: None,
        error: None,
        started_at_ms: None,
        finished_at_ms: None,
        attempt: 1,
        recovered: false,
        result: DeliveryRow::default(),
        notice: DeliveryRow::default(),
    }
}

/// The rows of one session in a ledger snapshot, grouped by call.
#[derive(Debug, Default, Clone)]
pub struct SessionSnapshot {
    /// Its calls.
    pub calls: Vec<CallRow>,
    /// Children by call id.
    pub children: HashMap<String, Vec<ChildRow>>,
    /// Claims that were live.
    pub claims: Vec<ClaimRow>,
    /// Children whose row was damaged and quarantined: their outcome is unknown.
    pub damaged: HashSet<String>,
    /// The session's stored webhook wake target.
    pub wake_url: Option<String>,
}

/// A row recovery cannot use because it contradicts the rows around it: it is quarantined
/// (moved aside with its bytes), never silently dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    /// Its tree.
    pub tree: &'static str,
    /// The session it belongs to.
    pub session_id: String,
    /// Its id.
    pub key: String,
    /// Why.
    pub reason: String,
}

/// A ledger snapshot sorted by session.
#[derive(Debug, Default)]
pub struct Split {
    /// Each session with its rows, by session id.
    pub sessions: Vec<(SessionRow, SessionSnapshot)>,
    /// Rows to quarantine.
    pub rejects: Vec<Reject>,
    /// Sessions whose row was missing, rebuilt from their calls (to be written).
    pub rebuilt_sessions: Vec<SessionRow>,
}

/// Splits a ledger snapshot by session. Units are not stored: they are planned again from the
/// call row, which is what planned them. A child row exists only once its call's dispatch was flushed, so
/// a child without its call, or with a task index its call does not have, means damage: it is
/// rejected (quarantined). A call whose session row is missing keeps its session, rebuilt
/// with default settings and a next set past every stored one, so no set number is reused.
pub fn split_snapshot(snapshot: Snapshot) -> Split {
    let mut out: HashMap<String, SessionSnapshot> = HashMap::new();
    let mut split = Split::default();
    let mut call_tasks: HashMap<String, (String, usize)> = HashMap::with_capacity(snapshot.calls.len());
    // The unit each task belongs to, as its call plans it (by task index): a child row naming
    // another unit would be claimed but never shown.
    let mut unit_of: HashMap<String, Vec<String>> = HashMap::with_capacity(snapshot.calls.len());
    for call in snapshot.calls {
        call_tasks.insert(call.call_id.clone(), (call.session_id.clone(), call.tasks.len()));
        let mut by_task = vec![String::new(); call.tasks.len()];
        for unit in plan_units(&call.call_id, &call.tasks, call.independent_completions) {
            for i in unit.tasks {
                if let Some(slot) = by_task.get_mut(i as usize) {
                    slot.clone_from(&unit.unit_id);
                }
            }
        }
        unit_of.insert(call.call_id.clone(), by_task);
        out.entry(call.session_id.clone()).or_default().calls.push(call);
    }
    for child in snapshot.children {
        let reason = match call_tasks.get(&child.call_id) {
            None => Some(format!("its call `{}` has no (readable) row", child.call_id)),
            Some((_, n)) if child.task_index as usize >= *n => Some(format!(
                "task index {} is beyond its call's {n} tasks",
                child.task_index
            )),
            Some((session, _)) if *session != child.session_id => Some(format!(
                "its session `{}` is not its call's session `{session}`",
                child.session_id
            )),
            Some(_)
                if unit_of
                    .get(&child.call_id)
                    .and_then(|units| units.get(child.task_index as usize))
                    != Some(&child.unit_id) =>
            {
                Some(format!(
                    "its unit `{}` is not the one its call plans for task {}",
                    child.unit_id, child.task_index
                ))
            }
            Some(_) => None,
        };
        match reason {
            Some(reason) => split.rejects.push(Reject {
                tree: crate::ledger::trees::CHILDREN,
                session_id: child.session_id,
                key: child.child_id,
                reason,
            }),
            None => out
                .entry(child.session_id.clone())
                .or_default()
                .children
                .entry(child.call_id.clone())
                .or_default()
                .push(child),
        }
    }
    for claim in snapshot.claims {
        out.entry(claim.session_id.clone()).or_default().claims.push(claim);
    }
    for wake in snapshot.wakes {
        out.entry(wake.session_id.clone()).or_default().wake_url = Some(wake.url);
    }
    let damaged = snapshot
        .damaged_children
        .iter()
        .chain(split.rejects.iter().map(|r| &r.key));
    for id in damaged {
        let call = id.rsplit_once('.').map(|(c, _)| c);
        if let Some((session, _)) = call.and_then(|c| call_tasks.get(c)) {
            out.entry(session.clone()).or_default().damaged.insert(id.clone());
        }
    }
    fold_starts(snapshot.starts, &call_tasks, &unit_of, &mut out, &mut split.rejects);
    for s in out.values_mut() {
        for children in s.children.values_mut() {
            children.sort_by_key(|c| c.task_index);
        }
    }
    for session in snapshot.sessions {
        let part = out.remove(&session.session_id).unwrap_or_default();
        split.sessions.push((session, part));
    }
    let mut missing: Vec<(String, SessionSnapshot)> = out.into_iter().filter(|(_, p)| !p.calls.is_empty()).collect();
    missing.sort_by(|a, b| a.0.cmp(&b.0));
    for (id, part) in missing {
        let last = part.calls.iter().map(|c| c.set).max().unwrap_or(0);
        let row = SessionRow {
            session_id: id,
            max_concurrent_children: DEFAULT_MAX_CONCURRENT_CHILDREN,
            max_delivery_attempts: DEFAULT_MAX_DELIVERY_ATTEMPTS,
            next_set: last.saturating_add(1),
            created_at_ms: part.calls.iter().map(|c| c.created_at_ms).min().unwrap_or(0),
        };
        split.rebuilt_sessions.push(row.clone());
        split.sessions.push((row, part));
    }
    split.sessions.sort_by(|a, b| a.0.session_id.cmp(&b.0.session_id));
    split
}

/// Folds start rows into the children they name: a child without a row of its own (and not
/// damaged) that a start row names was running when that row was written, so it gets a running
/// row, started at the latest such start. A start row whose call is missing, of another session,
/// or naming a task the call does not have is rejected (quarantined).
fn fold_starts(
    starts: Vec<StartRow>,
    call_tasks: &HashMap<String, (String, usize)>,
    unit_of: &HashMap<String, Vec<String>>,
    out: &mut HashMap<String, SessionSnapshot>,
    rejects: &mut Vec<Reject>,
) {
    // The latest start of each task, by call.
    let mut started: HashMap<String, HashMap<u32, u64>> = HashMap::new();
    for start in starts {
        let reason = match call_tasks.get(&start.call_id) {
            None => Some(format!("its call `{}` has no (readable) row", start.call_id)),
            Some((session, _)) if *session != start.session_id => Some(format!(
                "its session `{}` is not its call's session `{session}`",
                start.session_id
            )),
            Some((_, n)) if start.tasks.iter().any(|&i| i as usize >= *n) => {
                Some(format!("it names a task beyond its call's {n} tasks"))
            }
            Some(_) => None,
        };
        if let Some(reason) = reason {
            rejects.push(Reject {
                tree: crate::ledger::trees::STARTS,
                session_id: start.session_id,
                key: start.start_id,
                reason,
            });
            continue;
        }
        let by_task = started.entry(start.call_id).or_default();
        for i in start.tasks {
            let at = by_task.entry(i).or_insert(start.started_at_ms);
            *at = (*at).max(start.started_at_ms);
        }
    }
    for (call_id, by_task) in started {
        let (Some((session, _)), Some(units)) = (call_tasks.get(&call_id), unit_of.get(&call_id)) else {
            continue;
        };
        let part = out.entry(session.clone()).or_default();
        let rows = part.children.entry(call_id.clone()).or_default();
        let has_row: HashSet<u32> = rows.iter().map(|r| r.task_index).collect();
        // In no order: the caller sorts each call's rows by task.
        for (i, at) in by_task.into_iter().filter(|(i, _)| !has_row.contains(i)) {
            let row = ChildRow {
                status: ChildStatus::Running,
                started_at_ms: Some(at),
                ..fresh_child(&call_id, &units[i as usize], session, i)
            };
            // Its own row was damaged: its outcome is unknown, whatever started.
            if !part.damaged.contains(&row.child_id) {
                rows.push(row);
            }
        }
    }
}

/// A unit as recovery leaves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredUnit {
    /// The unit.
    pub row: UnitRow,
    /// Members that are terminal now.
    pub terminal: usize,
    /// For a unit an earlier process left running: how many of its children were recorded
    /// before the owner exited.
    pub recorded_before_exit: Option<u32>,
}

impl RecoveredUnit {
    /// Whether every member is terminal.
    pub fn complete(&self) -> bool {
        self.terminal >= self.row.tasks.len()
    }
}

/// A call still owed to its parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredCall {
    /// The call (a sync call's waiter is gone, so it is delivered in the background now).
    pub row: CallRow,
    /// Its units, in order.
    pub units: Vec<RecoveredUnit>,
    /// Its children, as resolved (unit by unit).
    pub children: Vec<ChildRow>,
}

/// What an owner rebuilt from the ledger holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryPlan {
    /// Calls with something still to run or deliver, by set, each with its children.
    pub calls: Vec<RecoveredCall>,
    /// Children to queue, in order.
    pub queue: Vec<String>,
    /// Children whose actor lives on (owner restart only), counted as running.
    pub running: Vec<String>,
    /// Unfinished children that have (or, once `changed` is written, will have) a child row of
    /// their own: a later start of one is marked in its row, not in a start row, which the
    /// row would hide at the next load.
    pub rowed: Vec<String>,
    /// Items ready again, with their failed delivery attempts.
    pub ready: Vec<(String, u32)>,
    /// Claims that were live: lost now, so a late ack of one is refused as lost.
    pub lost_claims: Vec<String>,
    /// Rows recovery changed, to be written.
    pub changed: Vec<ChildRow>,
    /// Items of settled calls that were delivered (for the session's counts).
    pub delivered_done: u64,
    /// The set the session's next call gets (never one a stored call has).
    pub next_set: u64,
}

impl RecoveryPlan {
    /// Every resolved child, call by call.
    pub fn children(&self) -> impl Iterator<Item = &ChildRow> {
        self.calls.iter().flat_map(|c| &c.children)
    }
}

/// Decides what the owner of `session` holds after a restart. `live` names the children whose
/// actor is alive (empty after a process restart); `now_ms` stamps children resolved `unknown`.
pub fn plan(
    session: &SessionRow,
    snapshot: SessionSnapshot,
    mode: Recovery,
    live: &HashSet<String>,
    now_ms: u64,
) -> RecoveryPlan {
    let SessionSnapshot {
        mut calls,
        mut children,
        claims,
        damaged,
        wake_url: _,
    } = snapshot;
    let mut plan = RecoveryPlan {
        lost_claims: claims.into_iter().map(|c| c.claim_id).collect(),
        next_set: session.next_set,
        ..RecoveryPlan::default()
    };
    calls.sort_by_key(|c| c.set);
    if let Some(last) = calls.last() {
        plan.next_set = plan.next_set.max(last.set.saturating_add(1));
    }
    for call in &calls {
        let units = plan_units(&call.call_id, &call.tasks, call.independent_completions);
        // The stored rows are moved into the plan, not copied.
        let mut stored: HashMap<u32, ChildRow> = children
            .remove(&call.call_id)
            .map(|rows| rows.into_iter().map(|r| (r.task_index, r)).collect())
            .unwrap_or_default();
        // A child that never started has no row (the call's task is its row): it is queued.
        let mut damaged_rows = Vec::new();
        let mut fresh = vec![false; call.tasks.len()];
        let mut rows_of = |unit: &UnitRow| -> Vec<ChildRow> {
            unit.tasks
                .iter()
                .map(|&i| match stored.remove(&i) {
                    Some(row) => row,
                    None if damaged.contains(&child_id(&call.call_id, i)) => {
                        // Its row was damaged: whatever it did is lost, so it is neither run
                        // again blindly nor left queued: its outcome is unknown.
                        let row = ChildRow {
                            status: ChildStatus::Unknown,
                            recovered: true,
                            finished_at_ms: Some(now_ms),
                            error: Some(
                                "the child's ledger row was damaged and quarantined; its outcome is unknown".into(),
                            ),
                            ..queued_child(call, unit, i)
                        };
                        damaged_rows.push(row.clone());
                        row
                    }
                    None => {
                        if let Some(f) = fresh.get_mut(i as usize) {
                            *f = true;
                        }
                        queued_child(call, unit, i)
                    }
                })
                .collect()
        };
        let members: Vec<Vec<ChildRow>> = units.iter().map(&mut rows_of).collect();
        plan.changed.extend(damaged_rows);
        // A call whose every result was delivered (or dead-lettered) is done; an early failure
        // notice left undelivered is moot once the full result was delivered.
        let settled = members
            .iter()
            .flatten()
            .all(|c| c.status.is_terminal() && (c.result.delivered || c.result.dead));
        if settled {
            plan.delivered_done += members
                .iter()
                .flatten()
                .map(|c| c.result.delivered as u64 + c.notice.delivered as u64)
                .sum::<u64>();
            continue;
        }
        let mut recovered_units = Vec::with_capacity(units.len());
        let mut call_children = Vec::with_capacity(call.tasks.len());
        // Children to queue again, in task order across the call's units.
        let mut queue: Vec<(u32, String)> = Vec::new();
        for (unit, rows) in units.into_iter().zip(members) {
            let recorded = rows.iter().filter(|c| c.status.is_terminal()).count();
            // A unit was running if any child of it had started; one none of whose children
            // ever started is simply queued again, with nothing to report.
            let started = rows.iter().any(|c| c.status != ChildStatus::Queued);
            let was_running = started && recorded < unit.tasks.len() && mode == Recovery::Process;
            let mut terminal = 0;
            let mut resolved = Vec::with_capacity(rows.len());
            for mut row in rows {
                if !row.status.is_terminal() && live.contains(&row.child_id) {
                    // Its actor lives on (whatever its unflushed row says) and will hand its
                    // result to this owner: adopt it, never start it a second time.
                    row.status = ChildStatus::Running;
                }
                match row.status {
                    ChildStatus::Queued => queue.push((row.task_index, row.child_id.clone())),
                    ChildStatus::Running if mode == Recovery::Owner => {
                        if live.contains(&row.child_id) {
                            plan.running.push(row.child_id.clone());
                        } else {
                            // Admitted by the old owner but never started: queue it again.
                            row.status = ChildStatus::Queued;
                            row.started_at_ms = None;
                            queue.push((row.task_index, row.child_id.clone()));
                            plan.changed.push(row.clone());
                        }
                    }
                    ChildStatus::Running => {
                        row.recovered = true;
                        if call.tasks[row.task_index as usize].rerun_on_recovery {
                            row.status = ChildStatus::Queued;
                            row.attempt = row.attempt.saturating_add(1);
                            row.started_at_ms = None;
                            queue.push((row.task_index, row.child_id.clone()));
                        } else {
                            row.status = ChildStatus::Unknown;
                            row.finished_at_ms = Some(now_ms);
                            row.error = Some(
                                "the child was running when its owner exited and its task is not safe to re-run; its outcome is unknown"
                                    .into(),
                            );
                            terminal += 1;
                        }
                        plan.changed.push(row.clone());
                    }
                    _ => {
                        if was_running && !row.recovered {
                            row.recovered = true;
                            plan.changed.push(row.clone());
                        }
                        terminal += 1;
                    }
                }
                resolved.push(row);
            }
            plan.rowed.extend(
                resolved
                    .iter()
                    .filter(|r| !r.status.is_terminal() && !fresh.get(r.task_index as usize).copied().unwrap_or(false))
                    .map(|r| r.child_id.clone()),
            );
            let recovered = RecoveredUnit {
                row: unit,
                terminal,
                recorded_before_exit: was_running.then_some(recorded as u32),
            };
            for row in &resolved {
                if recovered.complete() {
                    if !row.result.delivered && !row.result.dead {
                        plan.ready
                            .push((dedup_key(&row.child_id, ItemKind::Result), row.result.failed_attempts));
                    }
                } else if row.status.is_failure() && !row.notice.delivered && !row.notice.dead {
                    plan.ready.push((
                        dedup_key(&row.child_id, ItemKind::FailureNotice),
                        row.notice.failed_attempts,
                    ));
                }
            }
            call_children.extend(resolved);
            recovered_units.push(recovered);
        }
        queue.sort();
        plan.queue.extend(queue.into_iter().map(|(_, id)| id));
        // Whoever waited for a sync call's inline answer is gone: its results go out at
        // boundaries instead, so nothing recorded is lost.
        let mut row = call.clone();
        row.mode = Mode::Background;
        plan.calls.push(RecoveredCall {
            row,
            units: recovered_units,
            children: call_children,
        });
    }
    plan
}

#[cfg(test)]
mod tests;
