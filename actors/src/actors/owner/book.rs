//! The owner's book: the calls, units and children of one session that still owe their parent
//! something, and the views built from them (a consumer's item, a session's counts and calls).
//!
//! It holds state and answers questions about it; it decides nothing about routing (that is
//! [`crate::routing`]) and writes nothing (that is the owner's persist step).

use foldhash::{HashMap, HashSet};

use actix::Addr;

use super::messages::CallStatus;
use super::sync::SyncWaiter;
use crate::actors::unit::Unit;
use crate::model::*;

/// A call still owed to its parent.
pub(super) struct CallState {
    pub(super) row: CallRow,
    pub(super) units: Vec<String>,
    pub(super) incomplete_units: usize,
    /// The caller of a sync call, until its results are handed over.
    pub(super) sync_reply: Option<SyncWaiter>,
    /// Sync results were handed over and await the caller's receipt (then they are delivered).
    pub(super) awaiting_receipt: bool,
    /// The receipt is being made durable.
    pub(super) receipt_pending: bool,
}

/// A completion unit of a call in the book.
pub(super) struct UnitState {
    pub(super) row: UnitRow,
    pub(super) terminal: usize,
    pub(super) complete: bool,
    pub(super) addr: Option<Addr<Unit>>,
    pub(super) recorded_before_exit: Option<u32>,
}

/// The calls, units and children in memory.
#[derive(Default)]
pub(super) struct Book {
    pub(super) calls: HashMap<String, CallState>,
    pub(super) units: HashMap<String, UnitState>,
    pub(super) children: HashMap<String, ChildRow>,
    /// Unfinished children with a child row of their own in the ledger (requeued, recovered):
    /// their starts are marked in that row, never in a start row (their row would hide it).
    /// Everything else unfinished has no row yet. A child leaves it when its end is recorded.
    /// Usually empty.
    pub(super) rowed: HashSet<String>,
    /// Items delivered of calls already dropped from memory.
    pub(super) delivered_done: u64,
    /// Items delivered of the children in memory (kept by [`Book::put_child`], [`Book::mark`]
    /// and [`Book::drop_call`], so counts are O(1)).
    delivered_live: u64,
}

/// The k of a unit id `<call>-<k>` (0 when it has none).
fn unit_ordinal(unit_id: &str) -> u64 {
    unit_id.rsplit_once('-').and_then(|(_, k)| k.parse().ok()).unwrap_or(0)
}

impl Book {
    /// Adds an accepted (or recovered) call with its units; `children` are its rows.
    pub(super) fn insert_call(
        &mut self,
        row: CallRow,
        units: Vec<(UnitRow, usize, Option<u32>)>,
        children: Vec<ChildRow>,
    ) {
        let unit_ids: Vec<String> = units.iter().map(|(u, _, _)| u.unit_id.clone()).collect();
        self.units.reserve(units.len());
        let mut incomplete = 0;
        for (unit, terminal, recorded_before_exit) in units {
            let complete = terminal >= unit.tasks.len();
            incomplete += usize::from(!complete);
            self.units.insert(
                unit.unit_id.clone(),
                UnitState {
                    row: unit,
                    terminal,
                    complete,
                    addr: None,
                    recorded_before_exit,
                },
            );
        }
        self.children.reserve(children.len());
        for child in children {
            self.put_child(child);
        }
        self.calls.insert(
            row.call_id.clone(),
            CallState {
                row,
                units: unit_ids,
                incomplete_units: incomplete,
                sync_reply: None,
                awaiting_receipt: false,
                receipt_pending: false,
            },
        );
    }

    /// The children ids of a call, by task index.
    pub(super) fn child_ids(call: &CallRow) -> impl Iterator<Item = String> + '_ {
        (0..call.tasks.len() as u32).map(move |i| child_id(&call.call_id, i))
    }

    /// The task of a child.
    pub(super) fn task_of(&self, row: &ChildRow) -> Option<&Task> {
        self.calls.get(&row.call_id)?.row.tasks.get(row.task_index as usize)
    }

    /// The items of `keys` in envelope order: by set, unit, task, kind. The order is decided
    /// on small keys first (each item's rows looked up once), and the items are then built in
    /// place into a vector of their final size, never moved by a sort or a regrowth; each key
    /// moves into its item.
    pub(super) fn items(&self, mut keys: Vec<(String, u32)>) -> Vec<ReadyItem> {
        type Found<'a> = (
            (u64, u64, u32, ItemKind),
            usize,
            &'a ChildRow,
            &'a CallState,
            &'a UnitState,
        );
        let mut order: Vec<Found<'_>> = Vec::with_capacity(keys.len());
        for (i, (key, _)) in keys.iter().enumerate() {
            let Some((child, kind)) = parse_dedup_key(key) else {
                continue;
            };
            let Some(row) = self.children.get(child) else { continue };
            let Some(call) = self.calls.get(&row.call_id) else {
                continue;
            };
            let Some(unit) = self.units.get(&row.unit_id) else {
                continue;
            };
            let sort = (call.row.set, unit_ordinal(&row.unit_id), row.task_index, kind);
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
        touched.iter().filter_map(|id| self.children.get(id).cloned()).collect()
    }

    /// As [`Book::mark`], returning only the calls touched, each once (an ack rewrites no row,
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
            if let Some((child, kind)) = parse_dedup_key(key) {
                if let Some(row) = self.children.get_mut(child) {
                    let before = delivered_items(row);
                    f(row.delivery_mut(kind));
                    self.delivered_live = self.delivered_live.saturating_sub(before) + delivered_items(row);
                    touched(row);
                }
            }
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
        // One buffer for every id and key: this runs for each call an ack touched.
        let mut key = KeyBuf::new(call_id);
        (0..call.row.tasks.len() as u32).all(|i| {
            self.children
                .get(key.child(i))
                .is_none_or(|r| r.result.delivered || r.result.dead)
                && !open(key.item(ItemKind::Result))
                && !open(key.item(ItemKind::FailureNotice))
        })
    }

    /// Drops a settled call from memory, telling `forget` each of its item keys (for the
    /// router to forget).
    pub(super) fn drop_call(&mut self, call_id: &str, mut forget: impl FnMut(&str)) {
        let Some(call) = self.calls.remove(call_id) else {
            return;
        };
        let mut key = KeyBuf::new(call_id);
        for i in 0..call.row.tasks.len() as u32 {
            if let Some(row) = self.children.remove(key.child(i)) {
                self.delivered_live = self.delivered_live.saturating_sub(delivered_items(&row));
                self.delivered_done = self.delivered_done.saturating_add(delivered_items(&row));
            }
            forget(key.item(ItemKind::Result));
            forget(key.item(ItemKind::FailureNotice));
        }
        for u in call.units {
            self.units.remove(&u);
        }
    }

    /// Items delivered, of calls in memory and dropped.
    pub(super) fn delivered(&self) -> u64 {
        self.delivered_done.saturating_add(self.delivered_live)
    }

    /// Puts a child's row in the book, in place of its earlier one: every change of a row
    /// goes through here or [`Book::mark`], so the delivered count stays exact in O(1).
    pub(super) fn put_child(&mut self, row: ChildRow) {
        self.delivered_live += delivered_items(&row);
        if let Some(old) = self.children.insert(row.child_id.clone(), row) {
            self.delivered_live = self.delivered_live.saturating_sub(delivered_items(&old));
        }
    }

    /// The calls in memory with their units and children, by set.
    pub(super) fn call_statuses(&self) -> Vec<CallStatus> {
        let mut calls: Vec<CallStatus> = self
            .calls
            .values()
            .map(|c| CallStatus {
                call: c.row.clone(),
                units: c
                    .units
                    .iter()
                    .filter_map(|u| self.units.get(u).map(|s| s.row.clone()))
                    .collect(),
                children: Self::child_ids(&c.row)
                    .filter_map(|id| self.children.get(&id).cloned())
                    .collect(),
            })
            .collect();
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
