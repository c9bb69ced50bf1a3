//! A call's child rows, found by task index.

use crate::model::ChildRow;

/// A call's child rows, at most one per task, found by task index. The rows stay in the order
/// they came in (a read gives a call's rows in key order: `.0, .1, .10, .100, …`) with each
/// task's place among them kept beside them: putting the rows themselves in task order moved
/// most of a large call's rows, each move a copy of the whole row.
#[derive(Debug, Clone, Default)]
pub struct TaskSlots {
    rows: Vec<ChildRow>,
    /// The place in `rows` of each task's row, by task index ([`NO_ROW`]: none).
    at: Vec<u32>,
}

impl PartialEq for TaskSlots {
    /// The same rows for the same tasks, however they are held.
    fn eq(&self, other: &Self) -> bool {
        self.tasks() == other.tasks() && (0..self.tasks() as u32).all(|i| self.get(i) == other.get(i))
    }
}

impl Eq for TaskSlots {}

/// A task without a row.
const NO_ROW: u32 = u32::MAX;

impl TaskSlots {
    /// The slots of a call of `tasks` tasks, holding `rows`: each the row of its task index; of
    /// two rows of one task the later, a row past the last task dropped. The rows keep their
    /// buffer, with room for exactly a row per task (a read files a call's rows in room sized
    /// for the call before it, and tasks without a row get one later, as recovery queues them:
    /// the slots live as long as the call does).
    pub fn new(mut rows: Vec<ChildRow>, tasks: usize) -> Self {
        let mut at = vec![NO_ROW; tasks];
        let mut dropped = false;
        for (pos, row) in rows.iter().enumerate() {
            match at.get_mut(row.task_index as usize) {
                Some(place) => {
                    dropped |= *place != NO_ROW;
                    *place = pos as u32;
                }
                None => dropped = true,
            }
        }
        if dropped {
            // Damage: the rows no task keeps are let go.
            let mut kept = vec![false; rows.len()];
            for &pos in at.iter().filter(|&&p| p != NO_ROW) {
                kept[pos as usize] = true;
            }
            let mut kept = kept.into_iter();
            rows.retain(|_| kept.next().unwrap_or(false));
            at.fill(NO_ROW);
            for (pos, row) in rows.iter().enumerate() {
                at[row.task_index as usize] = pos as u32;
            }
        }
        if rows.capacity() > tasks {
            rows.shrink_to(tasks);
        } else {
            rows.reserve_exact(tasks - rows.len());
        }
        TaskSlots { rows, at }
    }

    /// How many tasks (slots) the call has.
    pub fn tasks(&self) -> usize {
        self.at.len()
    }

    /// How many rows it holds.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether it holds no row.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Room for rows it holds (its buffer's).
    pub fn capacity(&self) -> usize {
        self.rows.capacity()
    }

    /// The row of task `i`.
    pub fn get(&self, i: u32) -> Option<&ChildRow> {
        let pos = *self.at.get(i as usize)?;
        self.rows.get(pos as usize)
    }

    /// The row of task `i`, to change in place (its task index is not to be changed).
    pub fn get_mut(&mut self, i: u32) -> Option<&mut ChildRow> {
        let pos = *self.at.get(i as usize)?;
        self.rows.get_mut(pos as usize)
    }

    /// Puts `row` in the slot of its task, in place of the row there (returned). A row past the
    /// last task has no slot and is not put: callers put rows of the call's tasks only.
    pub fn put(&mut self, row: ChildRow) -> Option<ChildRow> {
        let Some(place) = self.at.get_mut(row.task_index as usize) else {
            debug_assert!(false, "child `{}` is past its call's last task", row.child_id);
            return None;
        };
        if *place == NO_ROW {
            *place = self.rows.len() as u32;
            self.rows.push(row);
            return None;
        }
        Some(std::mem::replace(&mut self.rows[*place as usize], row))
    }

    /// The rows, in task order.
    pub fn iter(&self) -> impl Iterator<Item = &ChildRow> {
        self.at.iter().filter_map(|&pos| self.rows.get(pos as usize))
    }

    /// The rows in the order they are held (not task order): what needs every row, in any order.
    pub fn held(&self) -> &[ChildRow] {
        &self.rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{unit_id, ChildStatus};

    fn row(i: u32) -> ChildRow {
        crate::recovery::fresh_child("deleg_c", &unit_id("deleg_c", 1), "s", i)
    }

    /// What a slot-by-slot pass files: each row in its task's slot, the later of two.
    fn by_slot(rows: &[ChildRow], tasks: usize) -> Vec<Option<ChildRow>> {
        let mut slots = vec![None; tasks];
        for r in rows {
            if let Some(slot) = slots.get_mut(r.task_index as usize) {
                *slot = Some(r.clone());
            }
        }
        slots
    }

    fn slots_of(s: &TaskSlots) -> Vec<Option<ChildRow>> {
        (0..s.tasks() as u32).map(|i| s.get(i).cloned()).collect()
    }

    #[test]
    fn rows_in_key_order_are_found_by_task_and_keep_their_buffer() {
        let twelve: Vec<ChildRow> = (0..12).map(row).collect();
        let mut keyed = twelve.clone();
        keyed.sort_by(|a, b| a.child_id.cmp(&b.child_id));
        assert_ne!(keyed, twelve, "key order is not task order past ten tasks");
        let buffer = keyed.as_ptr() as usize;
        let slots = TaskSlots::new(keyed, 12);
        assert_eq!(slots.held().as_ptr() as usize, buffer, "no row moved");
        assert_eq!(slots.iter().cloned().collect::<Vec<_>>(), twelve, "in task order");
        assert_eq!((slots.len(), slots.tasks()), (12, 12));
        let mut sorted = TaskSlots::new(slots.iter().cloned().collect(), 12);
        assert_eq!(sorted, slots, "the same rows for the same tasks, held in another order");
        sorted.get_mut(3).unwrap().attempt = 2;
        assert_ne!(sorted, slots);
    }

    #[test]
    fn every_list_of_rows_is_filed_as_a_slot_by_slot_pass_files_it() {
        // Lists of rows of tasks 0..=3 (one past the last for three tasks, rows of a task
        // twice, tasks without a row), each row told apart by its attempt.
        for tasks in 0..=3usize {
            for len in 0..=4u32 {
                for code in 0..4u32.pow(len) {
                    let rows: Vec<ChildRow> = (0..len)
                        .map(|at| ChildRow {
                            attempt: at + 1,
                            ..row(code / 4u32.pow(at) % 4)
                        })
                        .collect();
                    let slots = TaskSlots::new(rows.clone(), tasks);
                    let expected = by_slot(&rows, tasks);
                    assert_eq!(slots_of(&slots), expected, "{tasks} tasks: {rows:?}");
                    assert_eq!(
                        slots.len(),
                        expected.iter().flatten().count(),
                        "only kept rows are held"
                    );
                }
            }
        }
    }

    #[test]
    fn a_row_put_fills_or_replaces_its_tasks_slot() {
        let mut slots = TaskSlots::new(vec![row(2)], 3);
        assert_eq!(slots.put(row(0)), None);
        let later = ChildRow {
            status: ChildStatus::Succeeded,
            ..row(2)
        };
        assert_eq!(slots.put(later.clone()), Some(row(2)));
        assert_eq!(slots_of(&slots), vec![Some(row(0)), None, Some(later)]);
        slots.get_mut(0).unwrap().attempt = 2;
        assert_eq!(slots.get(0).unwrap().attempt, 2);
        assert!(slots.get(1).is_none() && slots.get(9).is_none());
    }
}
