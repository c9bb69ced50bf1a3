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
use crate::parallel::threads_for;

mod slots;
pub use slots::TaskSlots;

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
pub(crate) fn fresh_child(call_id: &str, unit_id: &str, session_id: &str, i: u32) -> ChildRow {
    ChildRow {
        child_id: child_id(call_id, i),
        call_id: call_id.to_string(),
        unit_id: unit_id.to_string(),
        session_id: session_id.to_string(),
        task_index: i,
        status: ChildStatus::Queued,
        summary: None,
        output: None,
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
    /// Children by call id (each call's in no particular order).
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
    let mut calls: HashMap<String, CallInfo> = HashMap::with_capacity(snapshot.calls.len());
    for call in snapshot.calls {
        // The unit each task belongs to, as its call plans it: a child row naming another unit
        // would be claimed but never shown.
        let (unit_of, _) = unit_numbers(&call.tasks, call.independent_completions);
        calls.insert(
            call.call_id.clone(),
            CallInfo {
                session: call.session_id.clone(),
                unit_of,
            },
        );
        out.entry(call.session_id.clone()).or_default().calls.push(call);
    }
    // A read gives each call's rows in runs of their own (a run is of one call and one
    // session): each run is checked and filed whole under its session and call, its rows not
    // moved; a run with a row to reject (damage) is filed without it.
    for mut run in snapshot.children.into_runs() {
        let Some(first) = run.first() else {
            continue;
        };
        let info = calls.get(&first.call_id);
        if run.iter().any(|child| rejected(child, info).is_some()) {
            let mut kept = Vec::with_capacity(run.len());
            for child in run {
                match rejected(&child, info) {
                    Some(reason) => split.rejects.push(Reject {
                        tree: crate::ledger::trees::CHILDREN,
                        session_id: child.session_id,
                        key: child.child_id,
                        reason,
                    }),
                    None => kept.push(child),
                }
            }
            run = kept;
        }
        file_run(run, &mut out);
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
        if let Some(info) = call.and_then(|c| calls.get(c)) {
            out.entry(info.session.clone()).or_default().damaged.insert(id.clone());
        }
    }
    fold_starts(snapshot.starts, &calls, &mut out, &mut split.rejects);
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
            addressable: false,
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
    calls: &HashMap<String, CallInfo>,
    out: &mut HashMap<String, SessionSnapshot>,
    rejects: &mut Vec<Reject>,
) {
    // The latest start of each task, by call: a slot per task of the call (a start row names
    // many of a call's tasks, often all of them).
    let mut started: HashMap<String, Vec<Option<u64>>> = HashMap::new();
    for start in starts {
        let info = calls.get(&start.call_id);
        let reason = match info {
            None => Some(format!("its call `{}` has no (readable) row", start.call_id)),
            Some(info) if info.session != start.session_id => Some(format!(
                "its session `{}` is not its call's session `{}`",
                start.session_id, info.session
            )),
            Some(info) if start.tasks.iter().any(|&i| i as usize >= info.unit_of.len()) => Some(format!(
                "it names a task beyond its call's {} tasks",
                info.unit_of.len()
            )),
            Some(_) => None,
        };
        let (None, Some(info)) = (reason.as_ref(), info) else {
            rejects.push(Reject {
                tree: crate::ledger::trees::STARTS,
                session_id: start.session_id,
                key: start.start_id,
                reason: reason.unwrap_or_default(),
            });
            continue;
        };
        let by_task = started
            .entry(start.call_id)
            .or_insert_with(|| vec![None; info.unit_of.len()]);
        for i in start.tasks {
            let at = &mut by_task[i as usize];
            *at = Some(at.map_or(start.started_at_ms, |a| a.max(start.started_at_ms)));
        }
    }
    for (call_id, by_task) in started {
        let Some(info) = calls.get(&call_id) else {
            continue;
        };
        let session = &info.session;
        let part = out.entry(session.clone()).or_default();
        let rows = part.children.entry(call_id.clone()).or_default();
        let mut has_row = vec![false; by_task.len()];
        for r in rows.iter() {
            if let Some(has) = has_row.get_mut(r.task_index as usize) {
                *has = true;
            }
        }
        // In task order.
        for (i, at) in by_task.into_iter().enumerate() {
            let Some(at) = at.filter(|_| !has_row[i]) else {
                continue;
            };
            let i = i as u32;
            let row = ChildRow {
                status: ChildStatus::Running,
                started_at_ms: Some(at),
                ..fresh_child(
                    &call_id,
                    &unit_id(&call_id, info.unit_of[i as usize] as usize),
                    session,
                    i,
                )
            };
            // Its own row was damaged: its outcome is unknown, whatever started.
            if !part.damaged.contains(&row.child_id) {
                rows.push(row);
            }
        }
    }
}

/// What splitting needs of a call to check its children's rows.
struct CallInfo {
    /// Its session.
    session: String,
    /// The unit of each task (by task index), numbered from 1.
    unit_of: Vec<u32>,
}

/// Why `child`, of the call `info` describes (none: its call has no row), cannot be used, if it
/// cannot.
fn rejected(child: &ChildRow, info: Option<&CallInfo>) -> Option<String> {
    let Some(info) = info else {
        return Some(format!("its call `{}` has no (readable) row", child.call_id));
    };
    let task = child.task_index as usize;
    if task >= info.unit_of.len() {
        return Some(format!(
            "task index {} is beyond its call's {} tasks",
            child.task_index,
            info.unit_of.len()
        ));
    }
    if info.session != child.session_id {
        return Some(format!(
            "its session `{}` is not its call's session `{}`",
            child.session_id, info.session
        ));
    }
    if parse_unit_id(&child.unit_id) != Some((child.call_id.as_str(), info.unit_of[task])) {
        return Some(format!(
            "its unit `{}` is not the one its call plans for task {}",
            child.unit_id, child.task_index
        ));
    }
    None
}

/// Files `run`, rows of one call and session, under their session and call: taken whole when
/// the call has no rows filed yet, else added after them.
fn file_run(mut run: Vec<ChildRow>, out: &mut HashMap<String, SessionSnapshot>) {
    use std::collections::hash_map::Entry;
    let Some(first) = run.first() else {
        return;
    };
    let children = &mut out.entry(first.session_id.clone()).or_default().children;
    match children.entry(first.call_id.clone()) {
        Entry::Vacant(v) => {
            v.insert(run);
        }
        Entry::Occupied(mut o) => o.get_mut().append(&mut run),
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
    /// Its children, as resolved, found by task index (one per task).
    pub children: TaskSlots,
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
        self.calls.iter().flat_map(|c| c.children.iter())
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
    plan_in(session, snapshot, mode, live, now_ms, None)
}

/// [`plan`], on `threads` threads when given (else as many as the rows are worth): every
/// number of threads gives the same plan.
fn plan_in(
    session: &SessionRow,
    snapshot: SessionSnapshot,
    mode: Recovery,
    live: &HashSet<String>,
    now_ms: u64,
    threads: Option<usize>,
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
    // Each call with its stored rows, in set order.
    let work: Vec<(CallRow, Vec<ChildRow>)> = calls
        .into_iter()
        .map(|call| {
            let rows = children.remove(&call.call_id).unwrap_or_default();
            (call, rows)
        })
        .collect();
    let rows: usize = work.iter().map(|(_, r)| r.len()).sum();
    let ctx = CallContext {
        mode,
        live,
        damaged: &damaged,
        now_ms,
    };
    let parts = threads.unwrap_or_else(|| threads_for(rows, work.len()));
    // Calls are planned on their own, so a large session's are planned a share per core and
    // the shares joined in set order: the same plan as one pass makes.
    let shares = crate::parallel::in_shares(
        work,
        parts,
        |(_, rows)| rows.len(),
        |chunk| {
            let mut share = RecoveryPlan::default();
            for (call, rows) in chunk {
                plan_call(&ctx, call, rows, &mut share);
            }
            share
        },
    );
    for share in shares {
        crate::ledger::join(&mut plan.calls, share.calls);
        crate::ledger::join(&mut plan.queue, share.queue);
        crate::ledger::join(&mut plan.running, share.running);
        crate::ledger::join(&mut plan.rowed, share.rowed);
        crate::ledger::join(&mut plan.ready, share.ready);
        crate::ledger::join(&mut plan.changed, share.changed);
        plan.delivered_done += share.delivered_done;
    }
    plan
}

/// What planning one call reads besides the call and its rows.
struct CallContext<'a> {
    mode: Recovery,
    live: &'a HashSet<String>,
    damaged: &'a HashSet<String>,
    now_ms: u64,
}

/// Plans one call (with its stored rows) into `plan`, as [`plan`] describes.
fn plan_call(ctx: &CallContext<'_>, call: CallRow, stored: Vec<ChildRow>, plan: &mut RecoveryPlan) {
    let CallContext {
        mode,
        live,
        damaged,
        now_ms,
    } = *ctx;
    // The stored rows, found by task (not moved).
    let tasks = call.tasks.len() as u32;
    let mut slots = TaskSlots::new(stored, tasks as usize);
    // A call whose every result was delivered (or dead-lettered) is done; an early failure
    // notice left undelivered is moot once the full result was delivered. A task without
    // a row is queued (or damaged): not done.
    let settled = (0..tasks).all(|i| {
        slots
            .get(i)
            .is_some_and(|c| c.status.is_terminal() && (c.result.delivered || c.result.dead))
    });
    if settled {
        plan.delivered_done += slots
            .held()
            .iter()
            .map(|c| c.result.delivered as u64 + c.notice.delivered as u64)
            .sum::<u64>();
        return;
    }
    let units = plan_units(&call.call_id, &call.tasks, call.independent_completions);
    let mut damaged_rows = Vec::new();
    // A child that never started has no row (the call's task is its row): it is queued.
    let mut fresh = vec![false; call.tasks.len()];
    for unit in &units {
        for &i in &unit.tasks {
            if i >= tasks || slots.get(i).is_some() {
                continue;
            }
            let row = if damaged.contains(&child_id(&call.call_id, i)) {
                // Its row was damaged: whatever it did is lost, so it is neither run
                // again blindly nor left queued: its outcome is unknown.
                let row = ChildRow {
                    status: ChildStatus::Unknown,
                    recovered: true,
                    finished_at_ms: Some(now_ms),
                    error: Some("the child's ledger row was damaged and quarantined; its outcome is unknown".into()),
                    ..queued_child(&call, unit, i)
                };
                damaged_rows.push(row.clone());
                row
            } else {
                fresh[i as usize] = true;
                queued_child(&call, unit, i)
            };
            slots.put(row);
        }
    }
    // Every task is in a unit, so every slot is filled now.
    plan.changed.extend(damaged_rows);
    // A child whose attempt ended `failed` or `timed_out` while its task's retry policy runs it
    // again was waiting out its backoff in memory (its retry not yet recorded) when its owner
    // exited: its retry is made now, its next attempt queued (the rest of the wait is not kept).
    // One whose result went out was not run again (a cancel had stopped it).
    for i in 0..tasks {
        let row = slots.get_mut(i).expect("every task is in a unit");
        let policy = call.tasks.get(row.task_index as usize).and_then(|t| t.retry);
        let out = row.result.delivered || row.result.dead;
        if !out && policy.is_some_and(|p| p.delay_after(row.attempt, row.status).is_some()) {
            row.status = ChildStatus::Queued;
            row.attempt = row.attempt.saturating_add(1);
            (row.started_at_ms, row.finished_at_ms) = (None, None);
            (row.summary, row.output) = (None, None);
            plan.changed.push(row.clone());
        }
    }
    let mut recovered_units = Vec::with_capacity(units.len());
    // Children to queue again, in task order across the call's units.
    let mut queue: Vec<(u32, String)> = Vec::new();
    let is_live = |id: &str| !live.is_empty() && live.contains(id);
    for unit in units {
        let rows = || {
            unit.tasks
                .iter()
                .map(|&i| slots.get(i).expect("every task is in a unit"))
        };
        let recorded = rows().filter(|c| c.status.is_terminal()).count();
        // A unit was running if any child of it had started; one none of whose children
        // ever started is simply queued again, with nothing to report.
        let started = rows().any(|c| c.status != ChildStatus::Queued);
        let was_running = started && recorded < unit.tasks.len() && mode == Recovery::Process;
        let mut terminal = 0;
        for &i in &unit.tasks {
            let row = slots.get_mut(i).expect("every task is in a unit");
            if !row.status.is_terminal() && is_live(&row.child_id) {
                // Its actor lives on (whatever its unflushed row says) and will hand its
                // result to this owner: adopt it, never start it a second time.
                row.status = ChildStatus::Running;
            }
            match row.status {
                ChildStatus::Queued => queue.push((row.task_index, row.child_id.clone())),
                ChildStatus::Running if mode == Recovery::Owner => {
                    if is_live(&row.child_id) {
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
        }
        let rows = || {
            unit.tasks
                .iter()
                .map(|&i| slots.get(i).expect("every task is in a unit"))
        };
        plan.rowed.extend(
            rows()
                .filter(|r| !r.status.is_terminal() && !fresh[r.task_index as usize])
                .map(|r| r.child_id.clone()),
        );
        let complete = terminal >= unit.tasks.len();
        for row in rows() {
            if complete {
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
        recovered_units.push(RecoveredUnit {
            row: unit,
            terminal,
            recorded_before_exit: was_running.then_some(recorded as u32),
        });
    }
    queue.sort();
    plan.queue.extend(queue.into_iter().map(|(_, id)| id));
    // Whoever waited for a sync call's inline answer is gone: its results go out at
    // boundaries instead, so nothing recorded is lost.
    let mut row = call;
    row.mode = Mode::Background;
    plan.calls.push(RecoveredCall {
        row,
        units: recovered_units,
        children: slots,
    });
}

#[cfg(test)]
mod tests;
