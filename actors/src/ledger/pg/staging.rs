//! What the PostgreSQL ledger has staged and what its commits in flight hold: plain
//! bookkeeping, so that several commits can be in flight at once (PostgreSQL's own group commit
//! then shares their fsyncs) without two of them ever writing the same row.
//!
//! - A write stages a value (or a removal) per key, numbered in the order writes were made; the
//!   last write of a key wins. A staged write that replaces one not yet committed (staged, or
//!   taken by a commit that failed) keeps the older write's number: it carries that write now,
//!   so a flush that waits for the older write waits until the newer one is committed.
//! - A flush's commit takes every staged key that no commit in flight holds, and holds them
//!   until it ends. A commit of statements (terminal rows, a quarantine) takes only the staged
//!   writes of the keys its statements write, and holds those keys: it never makes a flush wait
//!   for it with rows it did not need. So two commits never write one key at once, and a later
//!   write of a key commits after an earlier one: it stays staged until the commit holding the
//!   key ended.
//! - A flush returns once every write numbered before it was committed (by any commit).
//! - A commit that failed stages what it took again, under anything staged since (which then
//!   carries what it hid, as above).

use std::collections::{BTreeMap, BTreeSet, HashSet};

/// A stored key: its table (tree) and its bytes.
pub(super) type Slot = (&'static str, Vec<u8>);

/// One staged write: its number and its value (`None`: a removal).
type Entry = (u64, Option<Vec<u8>>);

/// What a commit took: its rows, with their numbers, and the keys it holds.
#[derive(Debug)]
pub(super) struct Taken {
    id: u64,
    pub(super) rows: Vec<(Slot, u64, Option<Vec<u8>>)>,
    held: Vec<Slot>,
}

/// Staged writes and commits in flight.
#[derive(Debug, Default)]
pub(super) struct Staging {
    staged: BTreeMap<Slot, Entry>,
    /// The numbers of the staged writes.
    numbers: BTreeSet<u64>,
    next: u64,
    /// Keys a commit in flight holds.
    held: HashSet<Slot>,
    /// Each commit in flight's oldest write (u64::MAX: it took none).
    oldest: BTreeMap<u64, u64>,
    next_commit: u64,
}

impl Staging {
    /// Stages a write of `slot` (`None`: its removal).
    pub(super) fn stage(&mut self, slot: Slot, value: Option<Vec<u8>>) {
        use std::collections::btree_map::Entry;
        match self.staged.entry(slot) {
            // The write it replaces is not committed: this one carries it, under its number.
            Entry::Occupied(mut e) => e.get_mut().1 = value,
            Entry::Vacant(e) => {
                let n = self.next;
                self.next += 1;
                e.insert((n, value));
                self.numbers.insert(n);
            }
        }
    }

    /// The mark a flush waits for: every write made so far is numbered below it.
    pub(super) fn mark(&self) -> u64 {
        self.next
    }

    /// Whether every write numbered below `mark` is committed.
    pub(super) fn settled(&self, mark: u64) -> bool {
        let staged = self.numbers.first().copied().unwrap_or(u64::MAX);
        let in_flight = self.oldest.values().min().copied().unwrap_or(u64::MAX);
        staged.min(in_flight) >= mark
    }

    /// Whether a staged write numbered below `mark` could be taken by a commit now.
    pub(super) fn takeable_below(&self, mark: u64) -> bool {
        self.staged
            .iter()
            .any(|(slot, (n, _))| *n < mark && !self.held.contains(slot))
    }

    /// Whether nothing is staged.
    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.staged.is_empty()
    }

    /// Whether a commit whose statements write `extra` may start: fewer than `max` in flight,
    /// and none of them holds those keys.
    pub(super) fn can_start(&self, extra: &[Slot], max: usize) -> bool {
        self.oldest.len() < max && extra.iter().all(|s| !self.held.contains(s))
    }

    /// Takes the staged writes of `extra` (the keys a commit's statements write), or, when it
    /// has none, every staged write no commit in flight holds; holds their keys and `extra`.
    pub(super) fn take(&mut self, extra: &[Slot]) -> Taken {
        let free: Vec<Slot> = match extra.is_empty() {
            true => self
                .staged
                .keys()
                .filter(|s| !self.held.contains(*s))
                .cloned()
                .collect(),
            false => extra
                .iter()
                .filter(|s| self.staged.contains_key(*s) && !self.held.contains(*s))
                .cloned()
                .collect(),
        };
        let mut rows = Vec::with_capacity(free.len());
        for slot in free {
            if let Some((n, value)) = self.staged.remove(&slot) {
                self.numbers.remove(&n);
                rows.push((slot, n, value));
            }
        }
        let mut held: Vec<Slot> = rows.iter().map(|(s, _, _)| s.clone()).collect();
        held.extend(extra.iter().cloned());
        for s in &held {
            self.held.insert(s.clone());
        }
        let id = self.next_commit;
        self.next_commit += 1;
        let oldest = rows.iter().map(|(_, n, _)| *n).min().unwrap_or(u64::MAX);
        self.oldest.insert(id, oldest);
        Taken { id, rows, held }
    }

    /// A commit ended. When it failed, what it took is staged again (under anything staged
    /// since, which is newer), with `written` (what its own statements wrote) over it.
    pub(super) fn finish(&mut self, taken: Taken, failed: Option<Vec<(Slot, Option<Vec<u8>>)>>) {
        for s in &taken.held {
            self.held.remove(s);
        }
        self.oldest.remove(&taken.id);
        let Some(written) = failed else { return };
        let mut back: BTreeMap<Slot, Entry> = taken.rows.into_iter().map(|(s, n, v)| (s, (n, v))).collect();
        for (slot, value) in written {
            // Written after everything the commit took, in the same transaction.
            let n = self.next;
            self.next += 1;
            back.insert(slot, (n, value));
        }
        for (slot, (n, value)) in back {
            match self.staged.entry(slot) {
                std::collections::btree_map::Entry::Vacant(e) => {
                    e.insert((n, value));
                    self.numbers.insert(n);
                }
                // A newer write of the key hides this one: it carries it, under the older
                // number, so a flush waiting for this write waits for that one's commit.
                std::collections::btree_map::Entry::Occupied(mut e) => {
                    let newer = &mut e.get_mut().0;
                    if n < *newer {
                        self.numbers.remove(newer);
                        self.numbers.insert(n);
                        *newer = n;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(k: &str) -> Slot {
        ("t", k.as_bytes().to_vec())
    }

    fn v(s: &str) -> Option<Vec<u8>> {
        Some(s.as_bytes().to_vec())
    }

    #[test]
    fn a_commit_takes_what_no_other_holds_and_a_later_write_of_a_held_key_waits() {
        let mut st = Staging::default();
        st.stage(slot("a"), v("1"));
        st.stage(slot("b"), v("1"));
        let first = st.take(&[]);
        assert_eq!(first.rows.len(), 2);
        st.stage(slot("a"), v("2"));
        st.stage(slot("c"), v("1"));
        let mark = st.mark();
        let second = st.take(&[]);
        let keys: Vec<&Slot> = second.rows.iter().map(|(s, _, _)| s).collect();
        assert_eq!(keys, vec![&slot("c")], "a is held by the first commit");
        assert!(!st.settled(mark));
        assert!(!st.takeable_below(mark), "a waits for the first commit");
        st.finish(second, None);
        assert!(!st.settled(mark));
        st.finish(first, None);
        assert!(st.takeable_below(mark));
        let third = st.take(&[]);
        assert_eq!(third.rows, vec![(slot("a"), 2, v("2"))]);
        st.finish(third, None);
        assert!(st.settled(mark) && st.is_empty());
    }

    #[test]
    fn a_commit_of_statements_takes_only_the_staged_writes_of_its_own_keys() {
        let mut st = Staging::default();
        st.stage(slot("child"), v("running"));
        st.stage(slot("call"), v("1"));
        let mark = st.mark();
        let terminals = st.take(&[slot("child"), slot("other child")]);
        assert_eq!(terminals.rows, vec![(slot("child"), 0, v("running"))]);
        assert!(st.takeable_below(mark), "the call row is left for a flush");
        let flush = st.take(&[]);
        assert_eq!(flush.rows, vec![(slot("call"), 1, v("1"))]);
        st.finish(flush, None);
        assert!(
            !st.settled(mark),
            "the running mark is committed with the terminal rows"
        );
        st.finish(terminals, None);
        assert!(st.settled(mark) && st.is_empty());
    }

    #[test]
    fn a_commit_holds_the_keys_its_statements_write() {
        let mut st = Staging::default();
        let terminals = st.take(&[slot("child")]);
        assert!(!st.can_start(&[slot("child")], 4), "a second writer of the key waits");
        assert!(st.can_start(&[slot("other")], 4));
        st.stage(slot("child"), v("running"));
        let other = st.take(&[]);
        assert!(other.rows.is_empty(), "a staged write of a held key stays staged");
        assert!(!st.can_start(&[], 2), "two in flight");
        st.finish(other, None);
        st.finish(terminals, None);
        assert!(st.can_start(&[slot("child")], 4));
    }

    #[test]
    fn a_flush_waits_for_a_write_whose_failed_commit_a_newer_write_of_its_key_hid() {
        let mut st = Staging::default();
        st.stage(slot("a"), v("1"));
        let failing = st.take(&[]);
        let mark = st.mark();
        st.stage(slot("a"), v("2"));
        st.finish(failing, Some(Vec::new()));
        assert!(
            !st.settled(mark),
            "the first write is not committed: only the newer one, staged, can carry it"
        );
        let again = st.take(&[]);
        assert_eq!(again.rows.len(), 1);
        assert_eq!(again.rows[0].2, v("2"), "the newer value is the one committed");
        st.finish(again, None);
        assert!(st.settled(mark) && st.is_empty());
    }

    #[test]
    fn a_flush_waits_for_a_staged_write_a_newer_write_of_its_key_replaced() {
        let mut st = Staging::default();
        st.stage(slot("a"), v("1"));
        let in_flight = st.take(&[]);
        st.stage(slot("a"), v("2"));
        let mark = st.mark();
        st.stage(slot("a"), v("3"));
        st.finish(in_flight, None);
        assert!(
            !st.settled(mark),
            "the second write is staged (as the third), not committed"
        );
        assert!(st.takeable_below(mark));
        let third = st.take(&[]);
        assert_eq!(third.rows[0].2, v("3"));
        st.finish(third, None);
        assert!(st.settled(mark) && st.is_empty());
    }

    #[test]
    fn a_failed_commit_stages_its_rows_again_under_newer_writes() {
        let mut st = Staging::default();
        st.stage(slot("a"), v("old"));
        st.stage(slot("b"), v("old"));
        let mark = st.mark();
        let failed = st.take(&[slot("a"), slot("b"), slot("t")]);
        assert_eq!(failed.rows.len(), 2, "a and b taken");
        st.stage(slot("b"), v("new"));
        st.finish(failed, Some(vec![(slot("t"), v("terminal"))]));
        assert!(!st.settled(mark), "a's write is staged again, not committed");
        let again = st.take(&[]);
        let mut rows: Vec<(Slot, Option<Vec<u8>>)> =
            again.rows.iter().map(|(s, _, v)| (s.clone(), v.clone())).collect();
        rows.sort();
        assert_eq!(
            rows,
            vec![(slot("a"), v("old")), (slot("b"), v("new")), (slot("t"), v("terminal"))]
        );
        st.finish(again, None);
        assert!(st.settled(mark));
    }
}
