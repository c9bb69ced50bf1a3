//! The owner's owed calls: the calls, units and children of one session that still owe their parent
//! something, and the views built from them (a consumer's item, a session's counts and calls).
//!
//! It holds state and answers questions about it; it decides nothing about routing (that is
//! [`crate::routing`]) and writes nothing (that is the owner's persist step).
//!
//! Units and children live inside their call, by position: a unit `<call>-<k>` at k - 1, a
//! child `<call>.<i>` at i. One map, of calls, is keyed by text; finding a child or a unit is
//! that one lookup (in a map as small as the calls in memory) and an index, not a lookup in a
//! map as big as every child of the session, with its id's text hashed and compared.

use foldhash::{HashMap, HashSet};

use actix::Addr;

use super::messages::CallStatus;
use super::sync::SyncWaiter;
use crate::actors::unit::Unit;
use crate::model::*;
use crate::recovery::TaskSlots;

/// A call still owed to its parent.
pub(super) struct CallState {
    pub(super) row: CallRow,
    /// Its units, by ordinal: unit `<call>-<k>` at k - 1.
    pub(super) units: Vec<UnitState>,
    /// Its children's rows, found by task index (none for a child recovery found damaged).
    children: TaskSlots,
    /// The position in `units` of each task's unit, by task index.
    unit_of: Vec<u32>,
    /// Tasks whose cancel is being recorded (or was): nothing starts or requeues them.
    pub(super) cancelling: foldhash::HashSet<u32>,
    pub(super) incomplete_units: usize,
    /// The caller of a sync call, until its results are handed over.
    pub(super) sync_reply: Option<SyncWaiter>,
    /// Sync results were handed over and await the caller's receipt (then they are delivered).
    pub(super) awaiting_receipt: bool,
    /// The receipt is being made durable.
    pub(super) receipt_pending: bool,
}

impl CallState {
    /// The call with its units and children, as a status; `open` says which items are open
    /// in the router (published, not yet delivered or dead).
    pub(super) fn status(&self, open: impl Fn(&str) -> bool) -> CallStatus {
        let mut status = CallStatus::from_rows(&self.row, self.units.iter().map(|u| &u.row), self.children());
        for child in &mut status.children {
            for (kind, d) in [
                (ItemKind::Result, &mut child.result),
                (ItemKind::FailureNotice, &mut child.notice),
            ] {
                d.published = d.published || open(&dedup_key(&child.child_id, kind));
            }
        }
        status
    }

    /// A call, with its units (each with how many of its members are terminal, and for one an
    /// earlier process left running, how many were recorded before it exited) and `children`,
    /// its rows; and the items it counts as delivered: those of the rows it keeps, one per task
    /// (of two rows of one task the later, none past the last task). Made apart from the owed
    /// calls, so a rebuild makes a large session's calls a share per core.
    pub(super) fn new(row: CallRow, mut units: Vec<(UnitRow, usize, Option<u32>)>, children: TaskSlots) -> (Self, u64) {
        let tasks = row.tasks.len();
        // Units are made from their call, numbered from 1 in order: sorting only guards that.
        let ordinal = |u: &UnitRow| parse_unit_id(&u.unit_id).map_or(u32::MAX, |(_, k)| k);
        if !units.is_sorted_by_key(|(u, _, _)| ordinal(u)) {
            units.sort_by_key(|(u, _, _)| ordinal(u));
        }
        let mut unit_of = vec![u32::MAX; tasks];
        let mut incomplete = 0;
        let units: Vec<UnitState> = units
            .into_iter()
            .enumerate()
            .map(|(pos, (unit, terminal, recorded_before_exit))| {
                debug_assert_eq!(unit.unit_id, unit_id(&row.call_id, pos + 1));
                for &i in &unit.tasks {
                    if let Some(slot) = unit_of.get_mut(i as usize) {
                        *slot = pos as u32;
                    }
                }
                let complete = terminal >= unit.tasks.len();
                incomplete += usize::from(!complete);
                UnitState {
                    row: unit,
                    terminal,
                    complete,
                    addr: None,
                    recorded_before_exit,
                }
            })
            .collect();
        let delivered = children.held().iter().map(delivered_items).sum::<u64>();
        let state = CallState {
            row,
            units,
            children,
            unit_of,
            cancelling: Default::default(),
            incomplete_units: incomplete,
            sync_reply: None,
            awaiting_receipt: false,
            receipt_pending: false,
        };
        (state, delivered)
    }

    /// The rows of its children among the owed calls, by task index.
    pub(super) fn children(&self) -> impl Iterator<Item = &ChildRow> {
        self.children.iter()
    }

    /// The row of its task `i`'s child.
    pub(super) fn child(&self, i: u32) -> Option<&ChildRow> {
        self.children.get(i)
    }

    /// The position in `units` of its task `i`'s unit.
    pub(super) fn unit_pos(&self, i: u32) -> Option<usize> {
        self.unit_of.get(i as usize).map(|&u| u as usize)
    }

    /// The unit of its task `i`.
    pub(super) fn unit_of(&self, i: u32) -> Option<&UnitState> {
        self.units.get(self.unit_pos(i)?)
    }

    /// The unit of its task `i`, to change.
    pub(super) fn unit_of_mut(&mut self, i: u32) -> Option<&mut UnitState> {
        let pos = self.unit_pos(i)?;
        self.units.get_mut(pos)
    }
}

/// A completion unit of a call among the owed calls.
pub(super) struct UnitState {
    pub(super) row: UnitRow,
    pub(super) terminal: usize,
    pub(super) complete: bool,
    pub(super) addr: Option<Addr<Unit>>,
    pub(super) recorded_before_exit: Option<u32>,
}

/// The calls, with their units and children, in memory.
#[derive(Default)]
pub(super) struct OwedCalls {
    pub(super) calls: HashMap<String, CallState>,
    /// Unfinished children with a child row of their own in the ledger (requeued, recovered):
    /// their starts are marked in that row, never in a start row (their row would hide it).
    /// Everything else unfinished has no row yet. A child leaves it when its end is recorded.
    /// Usually empty.
    pub(super) rowed: HashSet<String>,
    /// Children waiting out a retry's backoff, with the row of the attempt that ended (what
    /// the ledger holds of them until the retry is recorded). Queued here, not in capacity.
    pub(super) retrying: HashMap<String, ChildRow>,
    /// Items delivered of calls already dropped from memory.
    pub(super) delivered_done: u64,
    /// Items delivered of the children in memory (kept by [`OwedCalls::put_child`], [`OwedCalls::mark`]
    /// and [`OwedCalls::drop_call`], so counts are O(1)).
    delivered_live: u64,
}

impl OwedCalls {
    /// Adds an accepted (or recovered) call with its units; `children` are its rows.
    /// Returns the items it counted as delivered: those of the rows it kept, one per task (of
    /// two rows of one task the later, none past the last task).
    pub(super) fn insert_call(
        &mut self,
        row: CallRow,
        units: Vec<(UnitRow, usize, Option<u32>)>,
        children: Vec<ChildRow>,
    ) -> u64 {
        let tasks = row.tasks.len();
        let (state, delivered) = CallState::new(row, units, TaskSlots::new(children, tasks));
        self.insert_state(state, delivered);
        delivered
    }

    /// Adds a call made by [`CallState::new`], which counted `delivered` items delivered.
    pub(super) fn insert_state(&mut self, state: CallState, delivered: u64) {
        self.delivered_live += delivered;
        self.calls.insert(state.row.call_id.clone(), state);
    }

    /// Brings back a call that left memory settled (its delivered items were counted as
    /// delivered of dropped calls: they move back among the live ones). What moves is what the
    /// call's rows in memory count, as its drop counted them: a second row of one task read
    /// back, or a row past its last task, is not kept, so it is not counted either.
    pub(super) fn bring_back(
        &mut self,
        row: CallRow,
        units: Vec<(UnitRow, usize, Option<u32>)>,
        children: Vec<ChildRow>,
    ) {
        let delivered = self.insert_call(row, units, children);
        self.delivered_done = self.delivered_done.saturating_sub(delivered);
    }

    /// The children ids of a call, by task index.
    pub(super) fn child_ids(call: &CallRow) -> impl Iterator<Item = String> + '_ {
        (0..call.tasks.len() as u32).map(move |i| child_id(&call.call_id, i))
    }

    /// The row of the child `child_id`.
    pub(super) fn child(&self, child_id: &str) -> Option<&ChildRow> {
        let (call, i) = parse_child_id(child_id)?;
        self.calls.get(call)?.child(i)
    }

    /// The row of the child `child_id`, to change anything but its delivery state (that goes
    /// through [`OwedCalls::mark`] or [`OwedCalls::put_child`], which keep the delivered count).
    pub(super) fn child_mut(&mut self, child_id: &str) -> Option<&mut ChildRow> {
        let (call, i) = parse_child_id(child_id)?;
        self.calls.get_mut(call)?.children.get_mut(i)
    }

    /// The unit `unit_id`.
    pub(super) fn unit_mut(&mut self, unit_id: &str) -> Option<&mut UnitState> {
        let (call, k) = parse_unit_id(unit_id)?;
        self.calls.get_mut(call)?.units.get_mut(k.checked_sub(1)? as usize)
    }

    /// Marks the child `child_id` running from `now`, unless it ended (a row is never moved
    /// back from its end: one recorded while its start was being written, by a cancel an
    /// earlier owner decided, stays as it is) or a cancel of it is being recorded (or was: it
    /// stays as its cancel left it); whether it was marked.
    pub(super) fn mark_running(&mut self, child_id: &str, now: u64) -> bool {
        let Some((call, i)) = parse_child_id(child_id) else {
            return false;
        };
        let Some(state) = self.calls.get_mut(call) else {
            return false;
        };
        if state.cancelling.contains(&i) {
            return false;
        }
        match state.children.get_mut(i) {
            Some(row) if !row.status.is_terminal() => {
                row.status = ChildStatus::Running;
                row.started_at_ms = Some(now);
                true
            }
            _ => false,
        }
    }

    /// Whether a cancel of the child `row` is being recorded (or was).
    pub(super) fn cancelling(&self, row: &ChildRow) -> bool {
        self.calls
            .get(&row.call_id)
            .is_some_and(|c| c.cancelling.contains(&row.task_index))
    }

    /// The task of a child.
    pub(super) fn task_of(&self, row: &ChildRow) -> Option<&Task> {
        self.calls.get(&row.call_id)?.row.tasks.get(row.task_index as usize)
    }

    /// What the item `key` names is counted as against an envelope's `max_bytes`: its goal,
    /// summary, error and output, and [`ITEM_OVERHEAD_BYTES`].
    pub(super) fn item_bytes(&self, key: &str) -> usize {
        let row = parse_dedup_key(key).and_then(|(child, _)| Some((child, parse_child_id(child)?)));
        let Some((_, (call_id, task))) = row else {
            return ITEM_OVERHEAD_BYTES;
        };
        let Some(call) = self.calls.get(call_id) else {
            return ITEM_OVERHEAD_BYTES;
        };
        let text = |s: &Option<String>| s.as_ref().map_or(0, String::len);
        let goal = call.row.tasks.get(task as usize).map_or(0, |t| t.goal.len());
        let row = call.child(task);
        ITEM_OVERHEAD_BYTES + goal + row.map_or(0, |r| text(&r.summary) + text(&r.error) + text(&r.output))
    }

    /// The items of `keys` in envelope order: by set, unit, task, kind. The order is decided
    /// on small keys first (each item's rows looked up once), and the items are then built in
    /// place into a vector of their final size, never moved by a sort or a regrowth; each key
    /// moves into its item.
    pub(super) fn items(&self, mut keys: Vec<(String, u32)>) -> Vec<ReadyItem> {
        type Found<'a> = (
            (u64, u32, u32, ItemKind),
            usize,
            &'a ChildRow,
            &'a CallState,
            &'a UnitState,
        );
        let mut order: Vec<Found<'_>> = Vec::with_capacity(keys.len());
        // Keys of one call come in runs: its state is looked up once per run.
        let mut last: Option<(&str, &CallState)> = None;
        for (i, (key, _)) in keys.iter().enumerate() {
            let Some((child, kind)) = parse_dedup_key(key) else {
                continue;
            };
            let Some((call_id, task)) = parse_child_id(child) else {
                continue;
            };
            let call = match last {
                Some((id, call)) if id == call_id => call,
                _ => {
                    let Some(call) = self.calls.get(call_id) else {
                        continue;
                    };
                    last = Some((call_id, call));
                    call
                }
            };
            let (Some(row), Some(unit)) = (call.child(task), call.unit_of(task)) else {
                continue;
            };
            let sort = (call.row.set, call.unit_of[task as usize], task, kind);
            order.push((sort, i, row, call, unit));
        }
        order.sort_unstable_by_key(|f| f.0);
        let mut items = Vec::with_capacity(order.len());
        for ((.., kind), i, row, call, unit) in order {
            let (key, attempt) = std::mem::take(&mut keys[i]);
            items.extend(item_of(key, kind, attempt, row, call, unit));
        }
        items
    }

    /// Sets the delivery state of the items `keys` names, returning the child rows changed.
    pub(super) fn mark<'a>(
        &mut self,
        keys: impl IntoIterator<Item = &'a String>,
        f: impl Fn(&mut DeliveryRow),
    ) -> Vec<ChildRow> {
        let mut touched: Vec<String> = Vec::new();
        self.mark_each(keys, f, |row| touched.push(row.child_id.clone()));
        touched.sort();
        touched.dedup();
        touched.iter().filter_map(|id| self.child(id).cloned()).collect()
    }

    /// As [`OwedCalls::mark`], returning only the calls touched, each once (an ack rewrites no row,
    /// so it needs no copies of them).
    pub(super) fn mark_calls<'a>(
        &mut self,
        keys: impl IntoIterator<Item = &'a String>,
        f: impl Fn(&mut DeliveryRow),
    ) -> Vec<String> {
        let mut calls: Vec<String> = Vec::new();
        self.mark_each(keys, f, |row| {
            if calls.last() != Some(&row.call_id) {
                calls.push(row.call_id.clone());
            }
        });
        calls.sort();
        calls.dedup();
        calls
    }

    fn mark_each<'a>(
        &mut self,
        keys: impl IntoIterator<Item = &'a String>,
        f: impl Fn(&mut DeliveryRow),
        mut touched: impl FnMut(&ChildRow),
    ) {
        for key in keys {
            let Some((child, kind)) = parse_dedup_key(key) else {
                continue;
            };
            let Some(row) = self.child_mut(child) else {
                continue;
            };
            let before = delivered_items(row);
            f(row.delivery_mut(kind));
            let after = delivered_items(row);
            touched(row);
            self.delivered_live = self.delivered_live.saturating_sub(before) + after;
        }
    }

    /// Whether every item of a complete call is delivered or dead, so it can leave memory.
    pub(super) fn settled(&self, call_id: &str, open: impl Fn(&str) -> bool) -> bool {
        let Some(call) = self.calls.get(call_id) else {
            return false;
        };
        if call.incomplete_units != 0 || call.awaiting_receipt || call.receipt_pending {
            return false;
        }
        // One buffer for every key: this runs for each call an ack touched.
        let mut key = KeyBuf::new(call_id);
        (0..call.row.tasks.len() as u32).all(|i| {
            call.child(i).is_none_or(|r| r.result.delivered || r.result.dead) && {
                key.child(i);
                !open(key.item(ItemKind::Result)) && !open(key.item(ItemKind::FailureNotice))
            }
        })
    }

    /// Drops a settled call from memory, telling `forget` each of its item keys (for the
    /// router to forget).
    pub(super) fn drop_call(&mut self, call_id: &str, mut forget: impl FnMut(&str)) {
        let Some(call) = self.calls.remove(call_id) else {
            return;
        };
        let mut key = KeyBuf::new(call_id);
        for row in call.children.held() {
            self.delivered_live = self.delivered_live.saturating_sub(delivered_items(row));
            self.delivered_done = self.delivered_done.saturating_add(delivered_items(row));
        }
        for i in 0..call.children.tasks() as u32 {
            key.child(i);
            forget(key.item(ItemKind::Result));
            forget(key.item(ItemKind::FailureNotice));
        }
    }

    /// Items delivered, of calls in memory and dropped.
    pub(super) fn delivered(&self) -> u64 {
        self.delivered_done.saturating_add(self.delivered_live)
    }

    /// Puts a child's row among the owed calls, in place of its earlier one: every change of a row's
    /// delivery state goes through here or [`OwedCalls::mark`], so the delivered count stays exact
    /// in O(1). A row of a call not among the owed calls is not kept.
    pub(super) fn put_child(&mut self, row: ChildRow) {
        let Some(slots) = self
            .calls
            .get_mut(&row.call_id)
            .map(|c| &mut c.children)
            .filter(|s| (row.task_index as usize) < s.tasks())
        else {
            return;
        };
        if let Some(old) = slots.get(row.task_index) {
            if crate::ledger::child_write(Some((old.status, old.attempt)), (row.status, row.attempt))
                == crate::ledger::ChildWrite::KeepTerminal
            {
                debug_assert!(false, "the owed calls would move ended child `{}` back", row.child_id);
                tracing::error!(child = %row.child_id, stored = ?old.status, proposed = ?row.status,
                    "fault: the owed calls would move an ended child back; its ended row is kept");
                return;
            }
        }
        self.delivered_live += delivered_items(&row);
        if let Some(old) = slots.put(row) {
            self.delivered_live = self.delivered_live.saturating_sub(delivered_items(&old));
        }
    }

    /// The calls in memory with their units and children, by set.
    pub(super) fn call_statuses(&self, open: impl Fn(&str) -> bool) -> Vec<CallStatus> {
        let mut calls: Vec<CallStatus> = self.calls.values().map(|c| c.status(&open)).collect();
        calls.sort_by_key(|c| c.call.set);
        calls
    }
}

/// The items of a child that are delivered (its result, its failure notice).
fn delivered_items(row: &ChildRow) -> u64 {
    u64::from(row.result.delivered) + u64::from(row.notice.delivered)
}

/// The consumer's view of the item `key` (of `kind`) of the child `row` in `call` and `unit`.
fn item_of(
    key: String,
    kind: ItemKind,
    delivery_attempt: u32,
    row: &ChildRow,
    call: &CallState,
    unit: &UnitState,
) -> Option<ReadyItem> {
    let task = call.row.tasks.get(row.task_index as usize)?;
    Some(ReadyItem {
        kind,
        dedup_key: key,
        delivery_attempt,
        call_id: row.call_id.clone(),
        set: call.row.set,
        unit_id: row.unit_id.clone(),
        group: unit.row.group.clone(),
        child_id: row.child_id.clone(),
        task_index: row.task_index,
        of: u32::try_from(call.row.tasks.len()).unwrap_or(u32::MAX),
        unit_size: u32::try_from(unit.row.tasks.len()).unwrap_or(u32::MAX),
        status: row.status,
        goal: task.goal.clone(),
        summary: row.summary.clone(),
        output: row.output.clone(),
        attempts: row.attempt,
        error: row.error.clone(),
        recovered: row.recovered,
        finished_at_ms: row.finished_at_ms,
        recorded_before_exit: unit.recorded_before_exit,
    })
}

/// Child ids and item keys of one call, written into one reused buffer (the same text as
/// [`child_id`] and [`dedup_key`], without an allocation for each).
struct KeyBuf {
    buf: String,
    call: usize,
    child: usize,
}

impl KeyBuf {
    fn new(call_id: &str) -> Self {
        let mut buf = String::with_capacity(call_id.len() + 32);
        buf.push_str(call_id);
        buf.push('.');
        KeyBuf {
            call: buf.len(),
            child: buf.len(),
            buf,
        }
    }

    /// The id of task `i`'s child.
    fn child(&mut self, i: u32) -> &str {
        use std::fmt::Write;
        self.buf.truncate(self.call);
        let _ = write!(self.buf, "{i}");
        self.child = self.buf.len();
        &self.buf
    }

    /// The key of the last child's item of `kind`.
    fn item(&mut self, kind: ItemKind) -> &str {
        self.buf.truncate(self.child);
        self.buf.push(':');
        self.buf.push_str(kind.as_str());
        &self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_names_its_place_only_as_the_model_writes_it() {
        assert_eq!(
            parse_child_id(&child_id("deleg_0a.b-c", 12)),
            Some(("deleg_0a.b-c", 12))
        );
        assert_eq!(parse_unit_id(&unit_id("deleg_0a.b-c", 3)), Some(("deleg_0a.b-c", 3)));
        assert_eq!(parse_child_id("c.0"), Some(("c", 0)));
        assert_eq!(parse_unit_id("c-0"), None, "units count from 1");
        for bad in ["c.", "c.01", "c.+1", "c.-1", "c.1a", "c. 1", "c1", "c.99999999999"] {
            assert_eq!(parse_child_id(bad), None, "{bad}");
        }
    }

    /// A call brought back (by a redrive) moves the items of it counted as delivered of dropped
    /// calls back among the live ones: the session's delivered count stays what it was, even
    /// when the rows read back hold a second row of one task or a row past the last task (the
    /// rows kept in the call's slots are what its drop counted, and what comes back).
    #[test]
    fn a_call_brought_back_keeps_the_delivered_count_whatever_rows_come_with_it() {
        use crate::ledger::conformance::{call_row, child_row};
        let units = |call: &CallRow| -> Vec<(UnitRow, usize, Option<u32>)> {
            plan_units(&call.call_id, &call.tasks, call.independent_completions)
                .into_iter()
                .map(|u| {
                    let n = u.tasks.len();
                    (u, n, None)
                })
                .collect()
        };
        let delivered = |call: &str, i| {
            let mut row = child_row("s", call, i, ChildStatus::Failed);
            row.result.delivered = true;
            row.notice.delivered = true;
            row
        };
        let mut owed = OwedCalls::default();
        for id in ["deleg_a", "deleg_b"] {
            let call = call_row("s", id, 2);
            owed.insert_call(call.clone(), units(&call), vec![delivered(id, 0), delivered(id, 1)]);
            owed.drop_call(id, |_| {});
        }
        assert_eq!(owed.delivered(), 8, "counted as delivered of dropped calls");
        // Read back with task 1 twice, and a row past the last task.
        let call = call_row("s", "deleg_a", 2);
        let mut past = delivered("deleg_a", 1);
        past.task_index = 2;
        past.child_id = child_id("deleg_a", 2);
        let rows = vec![
            delivered("deleg_a", 0),
            delivered("deleg_a", 1),
            delivered("deleg_a", 1),
            past,
        ];
        owed.bring_back(call, units(&call_row("s", "deleg_a", 2)), rows);
        assert_eq!(owed.delivered(), 8, "brought back");
        owed.drop_call("deleg_a", |_| {});
        assert_eq!(owed.delivered(), 8, "dropped again");
    }

    #[test]
    fn a_key_buffer_writes_the_same_ids_and_keys_as_the_model() {
        let mut key = KeyBuf::new("deleg_00ab");
        for i in [0u32, 7, 10, 12345, u32::MAX] {
            assert_eq!(key.child(i), child_id("deleg_00ab", i));
            for kind in [ItemKind::Result, ItemKind::FailureNotice, ItemKind::Result] {
                assert_eq!(key.item(kind), dedup_key(&child_id("deleg_00ab", i), kind));
            }
        }
    }
}
