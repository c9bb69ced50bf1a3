//! An inspection of a data folder that no process holds, which leaves the folder as it was.
//!
//! Opening a sled ledger is not a read. sled 0.34.7 writes at open: on a folder a stopped
//! server left, its log file `db` grows to a whole segment (512 KiB) and changes, and a new
//! snapshot file `snap.<lsn>` appears (a missing `conf` or tree would be written too); brood's
//! [`SledLedger::open_with`] adds the format row to a ledger without one and fsyncs the folder
//! and its parent; [`load`](brood_actors::ledger::Ledger::load) moves unreadable rows to the
//! quarantine tree and flushes.
//! So the folder itself is never opened by sled: its `db` file is locked the way sled locks it
//! (an exclusive `flock`, which fails while a server holds the folder), every file is copied
//! to a temporary folder under that lock, the lock is let go, and the copy is opened, loaded
//! and removed. The folder is only read; nothing in it is created or changed.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, TryLockError};
use std::path::Path;

use brood_actors::ledger::{Durability, Ledger, SledLedger};
use brood_actors::model::{child_id, now_ms, plan_units, ChildRow, DeadLetterRow, Quarantined, SessionRow};
use brood_actors::recovery::{self, Recovery, RecoveryPlan, SessionSnapshot};

use super::{InspectError, Inspection, QuarantinedView, SessionView, Source};
use brood::{CallStatus, DeadLetterInfo};
use brood_server::api::{CallView, Counts, DeadLetter, Turn};

fn io(context: String) -> impl FnOnce(std::io::Error) -> InspectError {
    move |source| InspectError::Io { context, source }
}

/// Reads the ledger in `dir` (every session, or only `session`) without changing it. Fails
/// with [`InspectError::InUse`] while a process holds the folder, [`InspectError::NoDataDir`]
/// when it does not exist.
pub fn from_data_dir(dir: &Path, session: Option<&str>) -> Result<Inspection, InspectError> {
    if !dir.is_dir() {
        return Err(InspectError::NoDataDir(dir.to_path_buf()));
    }
    let db = dir.join("db");
    if !db.is_file() {
        return Err(InspectError::NotALedger(dir.to_path_buf()));
    }
    let copy = tempfile::Builder::new()
        .prefix("brood-inspect-")
        .tempdir()
        .map_err(io("making a temporary folder for a copy of the ledger".into()))?;
    let ledger_copy = copy.path().join("ledger");
    {
        // Held while the files are copied, so no server opens the folder half-way through.
        let lock = File::open(&db).map_err(io(format!("opening {} to lock it", db.display())))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(InspectError::InUse(dir.to_path_buf())),
            Err(TryLockError::Error(e)) => return Err(io(format!("locking {}", db.display()))(e)),
        }
        copy_tree(dir, &ledger_copy)?;
    }
    let ledger = SledLedger::open_with(&ledger_copy, Durability::Flush)?;
    let snapshot = ledger.load()?;
    let dead = ledger.dead_letters()?;
    let quarantined = ledger.quarantined()?;
    drop(ledger);
    let nests: HashSet<String> = snapshot.nests.iter().map(|n| n.session_id.clone()).collect();
    inspection(recovery::split_snapshot(snapshot), &nests, dead, &quarantined, session)
}

/// Copies every file and folder under `from` to `to` (created): a ledger folder no process
/// holds, to read it (or open it) without changing the original.
pub fn copy_tree(from: &Path, to: &Path) -> Result<(), InspectError> {
    fs::create_dir_all(to).map_err(io(format!("creating {}", to.display())))?;
    let entries = fs::read_dir(from).map_err(io(format!("listing {}", from.display())))?;
    for entry in entries {
        let entry = entry.map_err(io(format!("listing {}", from.display())))?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type().map_err(io(format!("reading {}", src.display())))?;
        if kind.is_dir() {
            copy_tree(&src, &dst)?;
        } else if kind.is_file() {
            fs::copy(&src, &dst).map_err(io(format!("copying {}", src.display())))?;
        }
    }
    Ok(())
}

/// The inspection of a split snapshot: each session as recovery would rebuild it.
fn inspection(
    split: recovery::Split,
    nests: &HashSet<String>,
    dead: Vec<DeadLetterRow>,
    quarantined: &[Quarantined],
    only: Option<&str>,
) -> Result<Inspection, InspectError> {
    let sessions = split
        .sessions
        .iter()
        .map(|(row, part)| {
            let mut view = session(row, part);
            view.parent_child_id = nests.contains(&row.session_id).then(|| row.session_id.clone());
            view
        })
        .collect();
    let dead_letters = dead
        .iter()
        .map(|d| DeadLetter::from(&DeadLetterInfo::from(d)))
        .collect();
    let mut rows: Vec<QuarantinedView> = quarantined
        .iter()
        .map(|q| QuarantinedView {
            tree: q.tree.clone(),
            // A session-scoped key is `session NUL id`: shown as `session/id`.
            key: String::from_utf8_lossy(&q.key).replace('\0', "/"),
            reason: q.reason.clone(),
            quarantined_at: Some(q.quarantined_at_ms),
        })
        .collect();
    // Rows that read back but contradict their call: the next open moves them aside.
    rows.extend(split.rejects.into_iter().map(|r| QuarantinedView {
        tree: r.tree.to_string(),
        key: r.key,
        reason: r.reason,
        quarantined_at: None,
    }));
    Inspection::assemble(Source::DataDir, sessions, dead_letters, Some(rows), only)
}

/// One session: the header as a server opening the folder would answer it, every stored call
/// with its children as recorded.
fn session(row: &SessionRow, part: &SessionSnapshot) -> SessionView {
    let plan = recovery::plan(row, part.clone(), Recovery::Process, &HashSet::new(), now_ms());
    // The rows as recorded first; recovery's for children without a readable row of their own.
    let rows: HashMap<&str, &ChildRow> = plan
        .children()
        .chain(part.children.values().flatten())
        .map(|c| (c.child_id.as_str(), c))
        .collect();
    let mut calls: Vec<CallView> = part
        .calls
        .iter()
        .map(|call| {
            let units = plan_units(&call.call_id, &call.tasks, call.independent_completions);
            let mut children: Vec<ChildRow> = units
                .iter()
                .flat_map(|unit| unit.tasks.iter().map(move |&i| (unit, i)))
                .map(|(unit, i)| {
                    match rows.get(child_id(&call.call_id, i).as_str()) {
                        Some(&row) => row.clone(),
                        // A child that never started has no row of its own: it is queued.
                        None => recovery::queued_child(call, unit, i),
                    }
                })
                .collect();
            children.sort_by_key(|c| c.task_index);
            // Shown as the server shows a call it holds.
            CallView::from(&CallStatus::from_rows(call, &units, &children))
        })
        .collect();
    calls.sort_by_key(|c| c.set);
    SessionView {
        session_id: row.session_id.clone(),
        turn: Turn::Idle,
        wake_capable: part.wake_url.is_some() || row.addressable,
        counts: counts(&plan),
        parent_child_id: None,
        calls_total: calls.len() as u64,
        calls_more: 0,
        calls_next: None,
        calls,
        claims: Vec::new(),
    }
}

/// The counts a rebuilt owner starts with (see `SessionOwner::recover`).
fn counts(plan: &RecoveryPlan) -> Counts {
    let live: u64 = plan
        .children()
        .map(|c| u64::from(c.result.delivered) + u64::from(c.notice.delivered))
        .sum();
    Counts {
        queued: plan.queue.len() as u64,
        running: plan.running.len() as u64,
        ready: plan.ready.len() as u64,
        backing_off: 0,
        claimed: 0,
        delivered: plan.delivered_done.saturating_add(live),
    }
}
