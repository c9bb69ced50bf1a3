//! Child rows as a read gives them: in runs of one call each.
//!
//! A read files each child row in its call's run as it decodes it, so recovery hands every
//! call its rows as one vector, taken whole: no row of a million is moved again between the
//! decode and the owner that keeps it (each move copies the row and, into fresh memory, makes
//! the system clear every page it lands on first).

use crate::model::ChildRow;

/// Child rows in the order read, in runs of consecutive rows of one call (and one session).
/// One call's rows may be split over several runs (a read in shares cuts between two), and a
/// run may hold several rows of one task (damage, which recovery sorts out).
#[derive(Debug, Clone, Default)]
pub struct ChildRuns {
    runs: Vec<Vec<ChildRow>>,
    len: usize,
}

impl ChildRuns {
    /// No rows.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `row` after the others: to the last run when it is of the same call and session,
    /// else as the first of a new run, with room for as many rows as the last run holds (a
    /// read's calls are usually alike). A run left with room for more than twice its rows is
    /// trimmed as the next starts, and the last one as the runs are joined or taken, so a small
    /// call after a large one holds no more than it needs.
    pub fn push(&mut self, row: ChildRow) {
        self.len += 1;
        match self.runs.last_mut() {
            Some(run) if run.last().is_some_and(|last| same_run(last, &row)) => run.push(row),
            _ => {
                self.trim_last();
                let room = self.runs.last().map_or(1, Vec::len);
                let mut run = Vec::with_capacity(room);
                run.push(row);
                self.runs.push(run);
            }
        }
    }

    /// Gives back the room of the last run beyond its rows, when it has more than twice as much.
    fn trim_last(&mut self) {
        if let Some(run) = self.runs.last_mut() {
            if run.capacity() > 2 * run.len() {
                run.shrink_to_fit();
            }
        }
    }

    /// Adds the runs of `later` after these, as they are (no row is moved).
    pub fn append(&mut self, mut later: ChildRuns) {
        self.trim_last();
        later.trim_last();
        self.len += later.len;
        if self.runs.is_empty() {
            self.runs = later.runs;
        } else {
            self.runs.extend(later.runs);
        }
    }

    /// How many rows.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keeps only the rows `keep` says yes to, in order (a run left empty is dropped).
    pub fn retain(&mut self, mut keep: impl FnMut(&ChildRow) -> bool) {
        for run in &mut self.runs {
            run.retain(&mut keep);
        }
        self.runs.retain(|run| !run.is_empty());
        self.len = self.runs.iter().map(Vec::len).sum();
    }

    /// The rows, in order.
    pub fn iter(&self) -> impl Iterator<Item = &ChildRow> {
        self.runs.iter().flatten()
    }

    /// The runs, in order.
    pub fn runs(&self) -> &[Vec<ChildRow>] {
        &self.runs
    }

    /// The runs, in order, to change their rows in place.
    pub fn runs_mut(&mut self) -> impl Iterator<Item = &mut [ChildRow]> {
        self.runs.iter_mut().map(Vec::as_mut_slice)
    }

    /// The rows, in order, to change in place.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut ChildRow> {
        self.runs.iter_mut().flatten()
    }

    /// The runs, taken.
    pub fn into_runs(mut self) -> Vec<Vec<ChildRow>> {
        self.trim_last();
        self.runs
    }

    /// The rows, in order, in one vector.
    pub fn into_vec(self) -> Vec<ChildRow> {
        let mut runs = self.runs.into_iter();
        let Some(mut all) = runs.next() else {
            return Vec::new();
        };
        all.reserve(self.len - all.len());
        for mut run in runs {
            all.append(&mut run);
        }
        all
    }
}

/// Whether `row` follows `last` in its run.
fn same_run(last: &ChildRow, row: &ChildRow) -> bool {
    last.call_id == row.call_id && last.session_id == row.session_id
}

impl PartialEq for ChildRuns {
    /// The same rows in the same order, however they are cut into runs.
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl Eq for ChildRuns {}

impl PartialEq<Vec<ChildRow>> for ChildRuns {
    fn eq(&self, other: &Vec<ChildRow>) -> bool {
        self.len == other.len() && self.iter().eq(other.iter())
    }
}

impl Extend<ChildRow> for ChildRuns {
    fn extend<I: IntoIterator<Item = ChildRow>>(&mut self, rows: I) {
        for row in rows {
            self.push(row);
        }
    }
}

impl FromIterator<ChildRow> for ChildRuns {
    fn from_iter<I: IntoIterator<Item = ChildRow>>(rows: I) -> Self {
        let mut runs = ChildRuns::new();
        runs.extend(rows);
        runs
    }
}

impl From<Vec<ChildRow>> for ChildRuns {
    fn from(rows: Vec<ChildRow>) -> Self {
        rows.into_iter().collect()
    }
}

impl IntoIterator for ChildRuns {
    type Item = ChildRow;
    type IntoIter = std::iter::Flatten<std::vec::IntoIter<Vec<ChildRow>>>;

    fn into_iter(self) -> Self::IntoIter {
        self.runs.into_iter().flatten()
    }
}

impl<'a> IntoIterator for &'a ChildRuns {
    type Item = &'a ChildRow;
    type IntoIter = std::iter::Flatten<std::slice::Iter<'a, Vec<ChildRow>>>;

    fn into_iter(self) -> Self::IntoIter {
        self.runs.iter().flatten()
    }
}

/// Where a read puts the rows it decodes, in the order read: a vector, or for child rows
/// [`ChildRuns`]. A read in shares fills one per share and joins them in order.
pub(crate) trait RowSink: Default {
    /// The rows it holds.
    type Row;
    /// An empty one with room for `n` rows.
    fn with_room(n: usize) -> Self;
    /// Adds a row after the others.
    fn put(&mut self, row: Self::Row);
    /// Adds the rows of `later` after these.
    fn put_all(&mut self, later: Self);
}

impl<T> RowSink for Vec<T> {
    type Row = T;

    fn with_room(n: usize) -> Self {
        Vec::with_capacity(n)
    }

    fn put(&mut self, row: T) {
        self.push(row);
    }

    fn put_all(&mut self, later: Self) {
        super::join(self, later);
    }
}

impl RowSink for ChildRuns {
    type Row = ChildRow;

    fn with_room(_: usize) -> Self {
        ChildRuns::new()
    }

    fn put(&mut self, row: ChildRow) {
        self.push(row);
    }

    fn put_all(&mut self, later: Self) {
        self.append(later);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::unit_id;

    fn row(session: &str, call: &str, i: u32) -> ChildRow {
        crate::recovery::fresh_child(call, &unit_id(call, 1), session, i)
    }

    #[test]
    fn rows_are_cut_into_runs_where_their_call_or_session_changes() {
        let rows = vec![
            row("a", "c1", 0),
            row("a", "c1", 1),
            row("a", "c2", 0),
            row("b", "c2", 0),
            row("b", "c2", 1),
            row("b", "c3", 0),
        ];
        let runs = ChildRuns::from(rows.clone());
        let lens: Vec<usize> = runs.runs().iter().map(Vec::len).collect();
        assert_eq!(lens, vec![2, 1, 2, 1]);
        assert_eq!(runs.len(), 6);
        assert_eq!(runs, rows);
        assert_eq!(runs.clone().into_vec(), rows);
        assert_eq!(runs.into_iter().collect::<Vec<_>>(), rows);
    }

    #[test]
    fn joined_runs_keep_their_order_and_compare_as_their_rows() {
        let mut first = ChildRuns::from(vec![row("a", "c1", 0)]);
        let second = ChildRuns::from(vec![row("a", "c1", 1), row("a", "c2", 0)]);
        first.append(second);
        assert_eq!(first.runs().len(), 3, "runs are joined as they are, one call in two");
        assert_eq!(
            first,
            ChildRuns::from(vec![row("a", "c1", 0), row("a", "c1", 1), row("a", "c2", 0)])
        );
        assert_eq!(first.len(), 3);
        let mut kept = first.clone();
        kept.retain(|r| r.call_id == "c2");
        assert_eq!((kept.len(), kept.runs().len()), (1, 1), "emptied runs are dropped");
        let mut none = ChildRuns::new();
        none.append(first.clone());
        assert_eq!(none, first);
    }

    #[test]
    fn runs_joined_or_taken_hold_no_more_room_than_their_rows_need() {
        let piece = || {
            let mut runs = ChildRuns::new();
            runs.extend((0..1000).map(|i| row("a", "big", i)));
            runs.push(row("a", "small", 0));
            runs
        };
        let mut joined = piece();
        joined.append(piece());
        joined.append(piece());
        let check = |runs: &[Vec<ChildRow>]| {
            assert!(
                runs.iter().all(|r| r.capacity() <= 2 * r.len().max(1)),
                "{:?}",
                runs.iter().map(|r| (r.len(), r.capacity())).collect::<Vec<_>>()
            )
        };
        check(&joined.runs()[..joined.runs().len() - 1]);
        check(&joined.into_runs());
    }

    #[test]
    fn a_small_call_after_a_large_one_holds_no_more_room_than_it_needs() {
        let mut runs = ChildRuns::new();
        runs.extend((0..1000).map(|i| row("a", "big", i)));
        runs.push(row("a", "small", 0));
        runs.push(row("a", "next", 0));
        let small = &runs.runs()[1];
        assert_eq!(small.len(), 1);
        assert!(small.capacity() <= 2, "room for {} rows kept", small.capacity());
    }
}
