//! The conformance suite of the [`Ledger`] trait: what every backend must do, whatever it stores
//! its rows in. Each case gets a fresh, empty ledger from the backend's maker and checks one
//! behaviour the actors rely on: rows read back as written, the first terminal row of a child
//! wins, ack rows and dead letters fold into the children's delivery state at a load, pages keep
//! their order and bounds, no read of one session or call reaches into another whose key it
//! shares a prefix with, and quarantine moves a row aside with its raw bytes.
//!
//! It does not test durability (what a crash or a power cut leaves): sled's crash and power-loss
//! tests do, and a backend brings its own.
//!
//! [`run_all`] runs every case in turn. `ledger_conformance_tests!(maker)` makes one `#[test]`
//! per case in the module it is invoked in, so a failure names the behaviour; a backend runs the
//! suite with one line:
//!
//! ```text
//! #[cfg(test)]
//! mod conformance {
//!     crate::ledger::conformance::ledger_conformance_tests!(super::fresh_ledgers());
//! }
//! ```
//!
//! where `fresh_ledgers()` returns an `impl Fn() -> Box<dyn Ledger>` that makes an empty ledger
//! at each call (see `mod sled` at the end of this file).

use std::collections::BTreeMap;

use super::trees::*;
use super::{Ledger, LedgerError, RowKey, Snapshot, Writes};
use crate::codec;
use crate::model::*;

mod loads;
mod lookups;
mod quarantine;
mod rows;

pub(crate) use loads::*;
pub(crate) use lookups::*;
pub(crate) use quarantine::*;
pub(crate) use rows::*;

/// Every case of the suite, handed to the macro `$then` after its own arguments: the one list
/// [`run_all`] and `ledger_conformance_tests!` both take their cases from.
macro_rules! ledger_conformance_cases {
    ($($then:ident)::+ ! { $($args:tt)* }) => {
        $($then)::+ ! { $($args)* ;
            every_kind_of_row_reads_back_after_write_and_flush,
            a_second_put_of_a_key_replaces_its_row,
            every_removal_removes_exactly_the_rows_it_names,
            load_session_reads_only_its_own_sessions_rows,
            load_session_returns_only_the_sessions_own_nest,
            load_sessions_answers_what_load_session_of_each_answers,
            load_sessions_of_more_sessions_than_one_statement_binds_reads_them_all,
            oldest_rows_are_the_first_of_each_sessions_calls_and_acks_pages,
            reads_of_one_session_or_call_do_not_reach_prefix_sharing_keys,
            record_terminals_stores_a_row_the_ledger_did_not_have,
            record_terminals_leaves_a_terminal_row_as_it_is,
            record_terminals_overwrites_a_non_terminal_row_keeping_its_delivery_state,
            record_terminals_returns_the_rows_as_stored_in_input_order,
            record_terminals_keeps_the_first_of_two_rows_of_one_child_in_one_batch,
            a_write_never_moves_an_ended_child_back,
            a_retry_queues_the_next_attempt_over_a_failed_one_and_no_earlier_attempt_replaces_it,
            a_second_write_of_the_same_outcome_changes_nothing,
            an_ack_row_marks_the_items_it_names_delivered,
            a_dead_letter_marks_its_item_dead_with_the_larger_attempt_count,
            an_acked_claim_is_not_returned_as_live,
            load_session_folds_delivery_state_as_load_does,
            call_children_and_call_parts_are_the_stored_rows_without_delivery_folded_in,
            ack_reads_the_ack_row_of_one_claim_of_one_session,
            find_call_finds_a_call_whatever_its_session,
            find_call_finds_no_call_once_it_is_removed,
            has_session_is_true_only_for_a_stored_session,
            call_reads_one_call_of_one_session,
            dead_letters_lists_every_sessions_dead_letters,
            session_ids_page_the_stored_sessions_by_id_and_prefix,
            dead_letter_counts_count_each_sessions_dead_letters_in_the_range,
            call_children_are_that_calls_rows_by_task_index,
            calls_page_pages_one_sessions_calls_in_id_order,
            acks_page_pages_one_sessions_acks_in_claim_id_order,
            call_parts_gathers_the_rows_of_one_call,
            row_counts_count_the_rows_of_every_tree,
            redrive_reads_the_record_of_one_item_of_one_session,
            quarantine_moves_a_row_aside_with_its_bytes_and_reason,
            a_quarantined_child_row_is_named_among_damaged_children,
            quarantine_of_a_session_keyed_row_takes_the_session_id,
            quarantine_of_a_missing_row_changes_nothing,
            quarantine_from_an_unknown_tree_is_refused,
            load_quarantines_rows_that_fail_their_check_and_serves_the_rest,
            a_sessions_settings_read_back_as_written_and_as_changed,
            child_reads_one_child_of_one_session,
            a_calls_traceparent_reads_back_from_every_read_of_the_call,
        }
    };
}

/// One `#[test]` per case, each on a fresh ledger from `$make` (an expression of a type that is
/// `Fn() -> Box<dyn Ledger>`, evaluated once per test).
macro_rules! ledger_conformance_tests {
    ($make:expr) => {
        $crate::ledger::conformance::ledger_conformance_cases!(
            crate::ledger::conformance::ledger_conformance_test_fns! { $make }
        );
    };
}

/// The `#[test]` functions `ledger_conformance_tests!` makes, from the list of cases.
macro_rules! ledger_conformance_test_fns {
    ($make:expr ; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let make = $make;
                $crate::ledger::conformance::$case(&make);
            }
        )*
    };
}

pub(crate) use ledger_conformance_cases;
pub(crate) use ledger_conformance_test_fns;
pub(crate) use ledger_conformance_tests;

/// The calls of [`run_all`], from the list of cases.
macro_rules! run_cases {
    ($make:ident ; $($case:ident),* $(,)?) => {
        $( $case($make); )*
    };
}

/// Runs every case, each on a fresh, empty ledger from `make`; panics at the first that fails.
#[allow(dead_code)] // the entry point for a backend that runs the suite as one test
pub(crate) fn run_all(make: &dyn Fn() -> Box<dyn Ledger>) {
    ledger_conformance_cases!(run_cases! { make });
}

// ---------------------------------------------------------------------------------------------
// Rows, built with the model's own ids.

/// A time the rows are stamped with (ms since the epoch).
const T0: u64 = 1_700_000_000_000;

fn task(goal: String) -> Task {
    Task {
        goal,
        runner_json: r#"{"kind":"echo"}"#.into(),
        group: None,
        timeout_ms: None,
        stall_ms: DEFAULT_STALL_MS,
        rerun_on_recovery: false,
        input: None,
        retry: None,
    }
}

fn session_row(session_id: &str) -> SessionRow {
    SessionRow {
        session_id: session_id.into(),
        max_concurrent_children: DEFAULT_MAX_CONCURRENT_CHILDREN,
        max_delivery_attempts: DEFAULT_MAX_DELIVERY_ATTEMPTS,
        next_set: 2,
        created_at_ms: T0,
        addressable: false,
    }
}

pub(crate) fn call_row(session_id: &str, call_id: &str, tasks: u32) -> CallRow {
    CallRow {
        call_id: call_id.into(),
        session_id: session_id.into(),
        set: 1,
        mode: Mode::Background,
        forced_sync_reason: None,
        independent_completions: false,
        // Every other task carries data (JSON text kept as given: key order, spacing, escapes).
        tasks: (0..tasks)
            .map(|i| Task {
                input: (i % 2 == 1).then(|| format!(r#"{{"z":{i},"a":[1.50,null,"é\n\"q\""]}}"#)),
                ..task(format!("task {i} of {call_id}"))
            })
            .collect(),
        created_at_ms: T0,
        traceparent: None,
        idempotency: None,
    }
}

pub(crate) fn child_row(session_id: &str, call_id: &str, index: u32, status: ChildStatus) -> ChildRow {
    let id = child_id(call_id, index);
    let terminal = status.is_terminal();
    ChildRow {
        summary: terminal.then(|| format!("{status} summary of {id}")),
        output: terminal.then(|| format!(r#"{{"child":"{id}","n":[1,2.5e3,{{}}]}}"#)),
        error: status.is_failure().then(|| format!("what went wrong in {id}")),
        child_id: id,
        call_id: call_id.into(),
        unit_id: unit_id(call_id, 1),
        session_id: session_id.into(),
        task_index: index,
        status,
        started_at_ms: (status != ChildStatus::Queued).then_some(T0 + 1),
        finished_at_ms: terminal.then_some(T0 + 2),
        attempt: 1,
        recovered: false,
        result: DeliveryRow::default(),
        notice: DeliveryRow::default(),
    }
}

fn claim_row(session_id: &str, claim_id: &str) -> ClaimRow {
    ClaimRow {
        claim_id: claim_id.into(),
        session_id: session_id.into(),
        consumer: "consumer-1".into(),
        lease_expires_at_ms: T0 + 30_000,
        items: 2,
    }
}

fn ack_row(session_id: &str, claim_id: &str, items: Vec<String>) -> AckRow {
    AckRow {
        claim_id: claim_id.into(),
        session_id: session_id.into(),
        items,
        acked_at_ms: T0 + 3,
    }
}

fn wake_row(session_id: &str) -> WakeRow {
    WakeRow {
        session_id: session_id.into(),
        url: format!("http://127.0.0.1:9/wake/{session_id}"),
        bound_at_ms: T0,
    }
}

/// The nested session of child `index` of `call_id`, a call of `parent_session_id`.
fn nest_row(parent_session_id: &str, call_id: &str, index: u32) -> NestRow {
    NestRow {
        session_id: child_id(call_id, index),
        parent_session_id: parent_session_id.into(),
        depth: 1,
        created_at_ms: T0,
    }
}

fn dead_letter(session_id: &str, call_id: &str, index: u32, kind: ItemKind, attempts: u32) -> DeadLetterRow {
    let child = child_id(call_id, index);
    DeadLetterRow {
        dedup_key: dedup_key(&child, kind),
        child_id: child,
        session_id: session_id.into(),
        call_id: call_id.into(),
        kind,
        reason: "lease expired".into(),
        attempts,
        dead_at_ms: T0 + 4,
    }
}

/// The redrive record of an item redriven once from `dead`.
fn redrive_row(dead: &DeadLetterRow) -> RedriveRow {
    RedriveRow::after(None, dead, T0 + 5)
}

fn key(session_id: &str, id: &str) -> RowKey {
    RowKey::new(session_id, id)
}

/// Every kind of row one session can have, around one call of four tasks: children 0 and 1
/// have rows of their own, 2 and 3 are named by a start row. The ack row and the dead letter
/// name items of children 2 and 3, which have no row, so a load folds nothing into the stored
/// rows and reads them back as written.
pub(crate) struct Fixture {
    session: SessionRow,
    call: CallRow,
    children: Vec<ChildRow>,
    pub(crate) claim: ClaimRow,
    ack: AckRow,
    start: StartRow,
    wake: WakeRow,
    nest: NestRow,
    dead: DeadLetterRow,
    redrive: RedriveRow,
}

impl Fixture {
    pub(crate) fn new(session_id: &str, call_id: &str) -> Self {
        let s = session_id;
        let mut failed = child_row(s, call_id, 1, ChildStatus::Failed);
        failed.notice.failed_attempts = 1;
        Fixture {
            session: session_row(s),
            call: call_row(s, call_id, 4),
            children: vec![child_row(s, call_id, 0, ChildStatus::Succeeded), failed],
            claim: claim_row(s, &format!("clm_{call_id}_live")),
            ack: ack_row(
                s,
                &format!("clm_{call_id}"),
                vec![dedup_key(&child_id(call_id, 2), ItemKind::Result)],
            ),
            start: StartRow::new(s, call_id, vec![3, 2], T0 + 1),
            wake: wake_row(s),
            nest: nest_row(s, call_id, 0),
            dead: dead_letter(s, call_id, 3, ItemKind::FailureNotice, 8),
            redrive: redrive_row(&dead_letter(s, call_id, 2, ItemKind::Result, 8)),
        }
    }

    /// Everything but the claim (which goes through [`Ledger::put_claim`]).
    pub(crate) fn writes(&self) -> Writes {
        Writes {
            sessions: vec![self.session.clone()],
            calls: vec![self.call.clone()],
            children: self.children.clone(),
            dead_letters: vec![self.dead.clone()],
            acks: vec![self.ack.clone()],
            starts: vec![self.start.clone()],
            wakes: vec![self.wake.clone()],
            nests: vec![self.nest.clone()],
            redrives: vec![self.redrive.clone()],
            ..Writes::default()
        }
    }

    /// Writes every row, puts the claim, flushes.
    fn store(&self, ledger: &dyn Ledger) {
        ledger.write(&self.writes()).expect("write");
        ledger.put_claim(&self.claim).expect("put_claim");
        ledger.flush().expect("flush");
    }
}

/// What a load of these fixtures' sessions returns; nests only when `nests` (a load of one
/// session has none).
fn snapshot_of(fixtures: &[&Fixture], nests: bool) -> Snapshot {
    let mut s = Snapshot::default();
    for f in fixtures {
        s.sessions.push(f.session.clone());
        s.calls.push(f.call.clone());
        s.children.extend(f.children.iter().cloned());
        s.claims.push(f.claim.clone());
        s.starts.push(f.start.clone());
        s.wakes.push(f.wake.clone());
        if nests {
            s.nests.push(f.nest.clone());
        }
    }
    s
}

/// `rows` ordered by `key`: the trait does not say in which order a load returns its rows.
fn sorted<'a, T: Clone + 'a, K: Ord>(rows: impl IntoIterator<Item = &'a T>, key: impl Fn(&T) -> K) -> Vec<T> {
    let mut rows: Vec<T> = rows.into_iter().cloned().collect();
    rows.sort_by_key(|r| key(r));
    rows
}

/// Asserts that `actual` holds exactly the rows of `expected`, in any order.
fn assert_snapshot(actual: &Snapshot, expected: &Snapshot, what: &str) {
    let session = |r: &SessionRow| r.session_id.clone();
    assert_eq!(
        sorted(&actual.sessions, session),
        sorted(&expected.sessions, session),
        "{what}: sessions"
    );
    let call = |r: &CallRow| (r.session_id.clone(), r.call_id.clone());
    assert_eq!(
        sorted(&actual.calls, call),
        sorted(&expected.calls, call),
        "{what}: calls"
    );
    let child = |r: &ChildRow| (r.session_id.clone(), r.child_id.clone());
    assert_eq!(
        sorted(&actual.children, child),
        sorted(&expected.children, child),
        "{what}: children"
    );
    let claim = |r: &ClaimRow| (r.session_id.clone(), r.claim_id.clone());
    assert_eq!(
        sorted(&actual.claims, claim),
        sorted(&expected.claims, claim),
        "{what}: claims"
    );
    let start = |r: &StartRow| (r.session_id.clone(), r.start_id.clone());
    assert_eq!(
        sorted(&actual.starts, start),
        sorted(&expected.starts, start),
        "{what}: starts"
    );
    let wake = |r: &WakeRow| r.session_id.clone();
    assert_eq!(
        sorted(&actual.wakes, wake),
        sorted(&expected.wakes, wake),
        "{what}: wakes"
    );
    let nest = |r: &NestRow| r.session_id.clone();
    assert_eq!(
        sorted(&actual.nests, nest),
        sorted(&expected.nests, nest),
        "{what}: nests"
    );
    assert_eq!(
        sorted(&actual.damaged_children, String::clone),
        sorted(&expected.damaged_children, String::clone),
        "{what}: damaged children"
    );
}

/// The ledger's row counts by tree name.
fn counts(ledger: &dyn Ledger) -> BTreeMap<&'static str, usize> {
    let counts = ledger.row_counts().expect("row_counts");
    let by_tree: BTreeMap<_, _> = counts.iter().copied().collect();
    assert_eq!(by_tree.len(), counts.len(), "a tree is counted twice: {counts:?}");
    by_tree
}

fn write(ledger: &dyn Ledger, writes: Writes) {
    ledger.write(&writes).expect("write");
    ledger.flush().expect("flush");
}

fn load(ledger: &dyn Ledger) -> Snapshot {
    ledger.load().expect("load")
}

/// The tree and key of every row in the ledger's quarantine, sorted.
fn quarantined_keys(ledger: &dyn Ledger) -> Vec<(String, Vec<u8>)> {
    let mut keys: Vec<(String, Vec<u8>)> = ledger
        .quarantined()
        .expect("quarantined")
        .into_iter()
        .map(|q| (q.tree, q.key))
        .collect();
    keys.sort();
    keys
}

fn load_session(ledger: &dyn Ledger, session_id: &str) -> Snapshot {
    ledger.load_session(session_id).expect("load_session")
}

fn record(ledger: &dyn Ledger, rows: &[ChildRow]) -> Vec<ChildRow> {
    let stored = ledger.record_terminals(rows.to_vec()).expect("record_terminals");
    ledger.flush().expect("flush");
    stored
}

fn err_text(e: LedgerError) -> String {
    e.to_string()
}

// ---------------------------------------------------------------------------------------------
// Writes, loads and removals.

fn two_failed_children(ledger: &dyn Ledger, session_id: &str, call_id: &str) -> (ChildRow, ChildRow) {
    let first = child_row(session_id, call_id, 0, ChildStatus::Failed);
    let second = child_row(session_id, call_id, 1, ChildStatus::Failed);
    write(
        ledger,
        Writes {
            sessions: vec![session_row(session_id)],
            calls: vec![call_row(session_id, call_id, 2)],
            children: vec![first.clone(), second.clone()],
            ..Writes::default()
        },
    );
    (first, second)
}

#[cfg(test)]
mod sled {
    use std::cell::RefCell;

    use super::super::{Ledger, SledLedger};

    /// Fresh sled ledgers, each in a temporary folder of its own; the folders are removed when
    /// the maker is dropped, after the case and its ledger are done.
    fn fresh_ledgers() -> impl Fn() -> Box<dyn Ledger> {
        let dirs = RefCell::new(Vec::new());
        move || {
            let dir = tempfile::TempDir::new().expect("a temporary folder");
            let ledger = SledLedger::open(dir.path()).expect("a fresh sled ledger");
            dirs.borrow_mut().push(dir);
            Box::new(ledger)
        }
    }

    super::ledger_conformance_tests!(fresh_ledgers());
}

/// A load of the whole ledger answers the same on sled and on PostgreSQL, whatever is stored:
/// sessions whose ids start with bytes past ASCII, rows of a session with no session row,
/// claims acked and not, dead letters, starts, wakes, nests, and rows that fail their check
/// in several sessions (one of them damaged before), each moved aside and named damaged once.
#[cfg(test)]
mod sled_and_postgres {
    use super::*;
    use crate::ledger::SledLedger;

    fn stored(ledger: &dyn Ledger) {
        let mut writes = Writes::default();
        for (s, call) in [
            ("a", "deleg_a"),
            ("ab", "deleg_ab"),
            ("é", "deleg_e"),
            ("\u{10FFFF}z", "deleg_m"),
        ] {
            writes.sessions.push(session_row(s));
            writes.calls.push(call_row(s, call, 12));
            for i in 0..12 {
                let status = [ChildStatus::Succeeded, ChildStatus::Failed, ChildStatus::Queued][i as usize % 3];
                writes.children.push(child_row(s, call, i, status));
            }
            writes
                .dead_letters
                .push(dead_letter(s, call, 1, ItemKind::FailureNotice, 3));
            writes.acks.push(ack_row(
                s,
                &format!("clm_{call}_1"),
                vec![dedup_key(&child_id(call, 0), ItemKind::Result)],
            ));
            writes.starts.push(StartRow {
                start_id: format!("{call}/01"),
                session_id: s.into(),
                call_id: call.into(),
                tasks: vec![0, 1, 2],
                started_at_ms: T0,
            });
            writes.wakes.push(wake_row(s));
            writes.nests.push(nest_row(s, call, 3));
        }
        // A session with no session row: its call and children are kept.
        writes.calls.push(call_row("orphan", "deleg_o", 2));
        writes
            .children
            .push(child_row("orphan", "deleg_o", 0, ChildStatus::Running));
        // Rows that fail their check.
        let mut bad_session = session_row("zz");
        bad_session.next_set = 0;
        writes.sessions.push(bad_session);
        for (s, call) in [("a", "deleg_a"), ("\u{10FFFF}z", "deleg_m")] {
            let mut bad = child_row(s, call, 11, ChildStatus::Succeeded);
            bad.child_id = child_id(call, 7);
            writes.children.push(bad);
        }
        write(ledger, writes);
        for (s, call) in [
            ("a", "deleg_a"),
            ("ab", "deleg_ab"),
            ("é", "deleg_e"),
            ("\u{10FFFF}z", "deleg_m"),
        ] {
            ledger
                .put_claim(&claim_row(s, &format!("clm_{call}_1")))
                .expect("put_claim");
            ledger
                .put_claim(&claim_row(s, &format!("clm_{call}_2")))
                .expect("put_claim");
        }
        // A child damaged earlier, in quarantine already, and one damaged again.
        ledger
            .quarantine(CHILDREN, "ab", &child_id("deleg_ab", 5), "damaged earlier")
            .expect("quarantine");
        ledger
            .quarantine(CHILDREN, "é", &child_id("deleg_e", 2), "damaged earlier")
            .expect("quarantine");
        let mut again = child_row("é", "deleg_e", 9, ChildStatus::Succeeded);
        again.child_id = child_id("deleg_e", 2);
        write(
            ledger,
            Writes {
                children: vec![again],
                ..Writes::default()
            },
        );
    }

    /// The load's answer (its damaged children sorted: their order is not relied on) and the
    /// quarantine's keys, as text.
    fn answer(ledger: &dyn Ledger) -> String {
        let mut snapshot = load(ledger);
        snapshot.damaged_children.sort();
        format!("{snapshot:#?}\n{:?}", quarantined_keys(ledger))
    }

    #[test]
    fn a_load_of_the_whole_ledger_answers_the_same_on_both() {
        let dir = tempfile::TempDir::new().expect("a temporary folder");
        let sled = SledLedger::open(dir.path()).expect("a sled ledger");
        let pg = crate::ledger::pg_testkit::fresh();
        assert_eq!(answer(&pg), answer(&sled), "empty");
        assert!(load(&pg).sessions.is_empty());
        stored(&sled);
        stored(&pg);
        let loaded = load(&sled);
        assert_eq!(loaded.damaged_children.len(), 4, "{:?}", loaded.damaged_children);
        assert!(loaded.calls.iter().any(|c| c.session_id == "orphan"));
        assert_eq!(answer(&pg), answer(&sled), "first load");
        assert_eq!(answer(&pg), answer(&sled), "second load");
    }
}
