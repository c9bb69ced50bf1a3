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
struct Fixture {
    session: SessionRow,
    call: CallRow,
    children: Vec<ChildRow>,
    claim: ClaimRow,
    ack: AckRow,
    start: StartRow,
    wake: WakeRow,
    nest: NestRow,
    dead: DeadLetterRow,
    redrive: RedriveRow,
}

impl Fixture {
    fn new(session_id: &str, call_id: &str) -> Self {
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
    fn writes(&self) -> Writes {
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
fn sorted<T: Clone, K: Ord>(rows: &[T], key: impl Fn(&T) -> K) -> Vec<T> {
    let mut rows = rows.to_vec();
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

pub(crate) fn every_kind_of_row_reads_back_after_write_and_flush(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let f = Fixture::new("a", "deleg_c");
    f.store(&*ledger);

    assert_snapshot(&load(&*ledger), &snapshot_of(&[&f], true), "load");
    assert_eq!(
        ledger.ack("a", &f.ack.claim_id).expect("ack"),
        Some(f.ack.clone()),
        "ack row"
    );
    assert_eq!(ledger.dead_letters().expect("dead_letters"), vec![f.dead.clone()]);
    assert_eq!(
        ledger.redrive("a", &f.redrive.dedup_key).expect("redrive"),
        Some(f.redrive.clone()),
        "redrive record"
    );
}

pub(crate) fn a_second_put_of_a_key_replaces_its_row(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let f = Fixture::new("a", "deleg_c");
    f.store(&*ledger);

    let mut session = f.session.clone();
    session.next_set = 7;
    let mut child = f.children[0].clone();
    child.summary = Some("rewritten".into());
    let mut claim = f.claim.clone();
    claim.lease_expires_at_ms += 60_000;
    let mut wake = f.wake.clone();
    wake.url = "http://127.0.0.1:9/elsewhere".into();
    let mut ack = f.ack.clone();
    ack.items.push(dedup_key(&child_id("deleg_c", 3), ItemKind::Result));
    let again = dead_letter("a", "deleg_c", 2, ItemKind::Result, 8);
    let redrive = RedriveRow::after(Some(f.redrive.clone()), &again, T0 + 9);
    write(
        &*ledger,
        Writes {
            sessions: vec![session.clone()],
            children: vec![child.clone()],
            wakes: vec![wake.clone()],
            acks: vec![ack.clone()],
            redrives: vec![redrive.clone()],
            ..Writes::default()
        },
    );
    ledger.put_claim(&claim).expect("put_claim");

    let mut expected = snapshot_of(&[&f], true);
    expected.sessions = vec![session];
    expected.children[0] = child;
    expected.claims = vec![claim];
    expected.wakes = vec![wake];
    assert_snapshot(&load(&*ledger), &expected, "load after the second puts");
    assert_eq!(ledger.ack("a", &ack.claim_id).expect("ack"), Some(ack));
    assert_eq!(ledger.redrive("a", &redrive.dedup_key).expect("redrive"), Some(redrive));
}

pub(crate) fn every_removal_removes_exactly_the_rows_it_names(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    // "a" is a prefix of "ab" and "deleg_c" of "deleg_c1": a removal by prefix would take both.
    let a = Fixture::new("a", "deleg_c");
    let ab = Fixture::new("ab", "deleg_c1");
    a.store(&*ledger);
    ab.store(&*ledger);

    let w = Writes::default;
    let steps: Vec<(&str, usize, Writes)> = vec![
        (
            SESSIONS,
            1,
            Writes {
                remove_sessions: vec!["a".into()],
                ..w()
            },
        ),
        (
            CALLS,
            1,
            Writes {
                remove_calls: vec![key("a", &a.call.call_id)],
                ..w()
            },
        ),
        (
            CHILDREN,
            2,
            Writes {
                remove_children: a.children.iter().map(|c| key("a", &c.child_id)).collect(),
                ..w()
            },
        ),
        (
            CLAIMS,
            1,
            Writes {
                remove_claims: vec![key("a", &a.claim.claim_id)],
                ..w()
            },
        ),
        (
            ACKS,
            1,
            Writes {
                remove_acks: vec![key("a", &a.ack.claim_id)],
                ..w()
            },
        ),
        (
            STARTS,
            1,
            Writes {
                remove_starts: vec![key("a", &a.start.start_id)],
                ..w()
            },
        ),
        (
            WAKES,
            1,
            Writes {
                remove_wakes: vec!["a".into()],
                ..w()
            },
        ),
        (
            NESTS,
            1,
            Writes {
                remove_nests: vec![a.nest.session_id.clone()],
                ..w()
            },
        ),
        (
            DEAD_LETTERS,
            1,
            Writes {
                remove_dead_letters: vec![key("a", &a.dead.dedup_key)],
                ..w()
            },
        ),
        (
            REDRIVES,
            1,
            Writes {
                remove_redrives: vec![key("a", &a.redrive.dedup_key)],
                ..w()
            },
        ),
    ];
    let mut all = Writes::default();
    for (tree, removed, writes) in steps {
        let mut expected = counts(&*ledger);
        *expected.get_mut(tree).unwrap_or_else(|| panic!("no count of `{tree}`")) -= removed;
        all.extend(writes.clone());
        write(&*ledger, writes);
        assert_eq!(counts(&*ledger), expected, "after removing from `{tree}`");
    }

    assert_snapshot(&load(&*ledger), &snapshot_of(&[&ab], true), "load");
    assert_snapshot(&load_session(&*ledger, "a"), &Snapshot::default(), "load_session(a)");
    assert_eq!(ledger.ack("a", &a.ack.claim_id).expect("ack"), None, "a's ack row");
    assert_eq!(ledger.redrive("a", &a.redrive.dedup_key).expect("redrive"), None);
    assert_eq!(ledger.dead_letters().expect("dead_letters"), vec![ab.dead.clone()]);
    assert_eq!(ledger.ack("ab", &ab.ack.claim_id).expect("ack"), Some(ab.ack.clone()));
    assert_eq!(
        ledger.redrive("ab", &ab.redrive.dedup_key).expect("redrive"),
        Some(ab.redrive.clone())
    );

    // Removing rows that are gone is not an error and changes nothing.
    let before = counts(&*ledger);
    write(&*ledger, all);
    assert_eq!(counts(&*ledger), before, "after removing the same rows again");
}

pub(crate) fn load_session_reads_only_its_own_sessions_rows(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let a = Fixture::new("a", "deleg_c");
    let ab = Fixture::new("ab", "deleg_c1");
    let b = Fixture::new("b", "deleg_d");
    a.store(&*ledger);
    ab.store(&*ledger);
    b.store(&*ledger);

    assert_snapshot(
        &load_session(&*ledger, "a"),
        &snapshot_of(&[&a], false),
        "load_session(a)",
    );
    assert_snapshot(
        &load_session(&*ledger, "ab"),
        &snapshot_of(&[&ab], false),
        "load_session(ab)",
    );
    assert_snapshot(
        &load_session(&*ledger, "b"),
        &snapshot_of(&[&b], false),
        "load_session(b)",
    );
    assert_snapshot(
        &load_session(&*ledger, "nobody"),
        &Snapshot::default(),
        "load_session(nobody)",
    );
    assert_snapshot(&load(&*ledger), &snapshot_of(&[&a, &ab, &b], true), "load");
}

pub(crate) fn load_sessions_answers_what_load_session_of_each_answers(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    // "a" and "ab" share a call id: an ack row or a dead letter of one folds into the other's
    // children in neither a load of each nor a load of both.
    let a = Fixture::new("a", "deleg_c");
    let ab = Fixture::new("ab", "deleg_c");
    let b = Fixture::new("b", "deleg_d");
    for f in [&a, &ab, &b] {
        f.store(&*ledger);
    }
    // Rows of their own for the children the ack row and the dead letter name (2 and 3), in
    // "a" and "ab" both; "a"'s child 1 moved to quarantine; a nested session of "a".
    let mut more = Vec::new();
    for s in ["a", "ab"] {
        more.push(child_row(s, "deleg_c", 2, ChildStatus::Succeeded));
        more.push(child_row(s, "deleg_c", 3, ChildStatus::Failed));
    }
    let nested = session_row(&a.nest.session_id);
    write(
        &*ledger,
        Writes {
            children: more,
            sessions: vec![nested],
            ..Writes::default()
        },
    );
    ledger
        .quarantine(CHILDREN, "a", &a.children[1].child_id, "inconsistent")
        .expect("quarantine");
    ledger.flush().expect("flush");

    let asked: Vec<String> = ["b", "deleg_c.0", "a", "nobody", "a"].map(String::from).to_vec();
    let mut expected = Snapshot::default();
    for id in ["a", "b", "deleg_c.0", "nobody"] {
        expected.absorb(load_session(&*ledger, id));
    }
    let both = ledger.load_sessions(&asked).expect("load_sessions");
    assert_snapshot(&both, &expected, "load_sessions against load_session of each");
    // What the per-session loads say, checked here too, so neither can drift with the other.
    let delivered = |snapshot: &Snapshot, session: &str, child: &str| {
        snapshot
            .children
            .iter()
            .find(|c| c.session_id == session && c.child_id == child)
            .map(|c| (c.result.delivered, c.notice.dead))
    };
    assert_eq!(
        delivered(&both, "a", "deleg_c.2"),
        Some((true, false)),
        "a's ack row folded in"
    );
    assert_eq!(
        delivered(&both, "a", "deleg_c.3"),
        Some((false, true)),
        "a's dead letter folded in"
    );
    assert!(
        !both.sessions.iter().any(|r| r.session_id == "ab"),
        "ab was not asked for"
    );
    assert_eq!(both.damaged_children, vec![a.children[1].child_id.clone()]);
    assert_eq!(
        both.nests.iter().map(|n| n.session_id.as_str()).collect::<Vec<_>>(),
        ["deleg_c.0"],
        "the nest row of the one nested session asked for"
    );
    assert_snapshot(
        &ledger.load_sessions(&[]).expect("load_sessions of none"),
        &Snapshot::default(),
        "load_sessions of none",
    );
}

pub(crate) fn load_sessions_of_more_sessions_than_one_statement_binds_reads_them_all(
    make: &dyn Fn() -> Box<dyn Ledger>,
) {
    let ledger = make();
    // More than a PostgreSQL read binds at once (1,000), each session with a call and a child.
    let ids: Vec<String> = (0..2_100).map(|i| format!("s{i:05}")).collect();
    let mut writes = Writes::default();
    for (i, id) in ids.iter().enumerate() {
        writes.sessions.push(session_row(id));
        let call = format!("deleg_{i:05}");
        writes.calls.push(call_row(id, &call, 1));
        writes.children.push(child_row(id, &call, 0, ChildStatus::Succeeded));
    }
    write(&*ledger, writes);
    let all = ledger.load_sessions(&ids).expect("load_sessions");
    assert_eq!(all.sessions.len(), ids.len(), "every session");
    assert_snapshot(&all, &load(&*ledger), "load_sessions of every session against load");
}

pub(crate) fn oldest_rows_are_the_first_of_each_sessions_calls_and_acks_pages(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let a = Fixture::new("a", "deleg_c");
    let ab = Fixture::new("ab", "deleg_c1");
    a.store(&*ledger);
    ab.store(&*ledger);
    // A later call and ack row of "a" (larger ids), and "b" with a session row only.
    write(
        &*ledger,
        Writes {
            calls: vec![call_row("a", "deleg_d", 1)],
            acks: vec![ack_row("a", "clm_deleg_d", Vec::new())],
            sessions: vec![session_row("b")],
            ..Writes::default()
        },
    );
    let asked: Vec<String> = ["b", "ab", "nobody", "a"].map(String::from).to_vec();
    let oldest = ledger.oldest_rows(&asked).expect("oldest_rows");
    let expected: Vec<super::OldestRows> = asked
        .iter()
        .map(|id| super::OldestRows {
            session_id: id.clone(),
            call: ledger.calls_page(id, None, 1).expect("calls_page").pop(),
            ack: ledger.acks_page(id, None, 1).expect("acks_page").pop(),
        })
        .collect();
    assert_eq!(
        oldest, expected,
        "the first of each session's pages, in the order asked"
    );
    assert_eq!(oldest[3].call.as_ref().map(|c| c.call_id.as_str()), Some("deleg_c"));
    assert_eq!(oldest[3].ack.as_ref().map(|c| c.claim_id.as_str()), Some("clm_deleg_c"));
    assert_eq!(
        (oldest[0].call.is_none(), oldest[0].ack.is_none()),
        (true, true),
        "b has none"
    );
    assert_eq!(ledger.oldest_rows(&[]).expect("oldest_rows of none"), Vec::new());
}

pub(crate) fn load_session_returns_only_the_sessions_own_nest(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let nest = nest_row("a", "deleg_c", 0);
    let nested = session_row(&nest.session_id);
    write(
        &*ledger,
        Writes {
            sessions: vec![nested.clone()],
            nests: vec![nest.clone()],
            ..Writes::default()
        },
    );

    let one = load_session(&*ledger, &nest.session_id);
    assert_eq!(one.sessions, vec![nested], "the nested session's own row");
    assert_eq!(
        one.nests,
        vec![nest.clone()],
        "and its own nest row (whoever takes it up knows its parent)"
    );
    assert!(
        load_session(&*ledger, "a").nests.is_empty(),
        "not the nests of other sessions"
    );
    assert_eq!(load(&*ledger).nests, vec![nest], "a full load reads them all");
}

pub(crate) fn reads_of_one_session_or_call_do_not_reach_prefix_sharing_keys(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let a = Fixture::new("a", "deleg_c");
    let ab = Fixture::new("ab", "deleg_c1");
    a.store(&*ledger);
    ab.store(&*ledger);
    // A call of "a" whose id starts with the other's, with rows of every per-call kind.
    let c10 = "deleg_c10";
    let c10_dead = dead_letter("a", c10, 0, ItemKind::Result, 8);
    write(
        &*ledger,
        Writes {
            calls: vec![call_row("a", c10, 1)],
            children: vec![child_row("a", c10, 0, ChildStatus::Succeeded)],
            dead_letters: vec![c10_dead.clone()],
            redrives: vec![redrive_row(&c10_dead)],
            starts: vec![StartRow::new("a", c10, vec![0], T0)],
            ..Writes::default()
        },
    );

    assert_eq!(ledger.call("a", "deleg_c1").expect("call"), None, "ab's call from a");
    assert_eq!(ledger.call("ab", "deleg_c").expect("call"), None, "a's call from ab");
    assert_eq!(ledger.call("a", "deleg_c").expect("call"), Some(a.call.clone()));
    assert_eq!(
        ledger.call_children("a", "deleg_c").expect("call_children"),
        a.children,
        "a call's children, not those of deleg_c1 or deleg_c10"
    );
    assert_eq!(
        ledger.call_children("a", "deleg_c1").expect("call_children"),
        vec![],
        "ab's children from a"
    );
    let parts = ledger.call_parts("a", "deleg_c").expect("call_parts");
    assert_eq!(parts.children, a.children, "call_parts: children");
    assert_eq!(parts.dead_letters, vec![a.dead.clone()], "call_parts: dead letters");
    assert_eq!(
        parts.redrives,
        vec![a.redrive.dedup_key.clone()],
        "call_parts: redrives"
    );
    assert_eq!(parts.starts, vec![a.start.start_id.clone()], "call_parts: starts");
    let none = ledger.call_parts("ab", "deleg_c").expect("call_parts");
    assert!(
        none.children.is_empty() && none.dead_letters.is_empty() && none.redrives.is_empty() && none.starts.is_empty(),
        "a's call's parts from ab: {none:?}"
    );
    let calls: Vec<String> = ledger
        .calls_page("a", None, 10)
        .expect("calls_page")
        .into_iter()
        .map(|c| c.call_id)
        .collect();
    assert_eq!(calls, vec!["deleg_c".to_string(), c10.to_string()], "a's calls");
    assert_eq!(
        ledger.calls_page("ab", None, 10).expect("calls_page"),
        vec![ab.call.clone()]
    );
    assert_eq!(ledger.acks_page("a", None, 10).expect("acks_page"), vec![a.ack.clone()]);
    assert_eq!(
        ledger.acks_page("ab", None, 10).expect("acks_page"),
        vec![ab.ack.clone()]
    );
    assert_eq!(
        ledger.ack("ab", &a.ack.claim_id).expect("ack"),
        None,
        "a's ack row from ab"
    );
    assert_eq!(ledger.redrive("ab", &a.redrive.dedup_key).expect("redrive"), None);
}

// ---------------------------------------------------------------------------------------------
// record_terminals.

pub(crate) fn record_terminals_stores_a_row_the_ledger_did_not_have(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    write(
        &*ledger,
        Writes {
            calls: vec![call_row("a", "deleg_c", 1)],
            ..Writes::default()
        },
    );
    let row = child_row("a", "deleg_c", 0, ChildStatus::Succeeded);

    assert_eq!(
        record(&*ledger, std::slice::from_ref(&row)),
        vec![row.clone()],
        "returned"
    );
    assert_eq!(load(&*ledger).children, vec![row], "loaded");
}

pub(crate) fn record_terminals_leaves_a_terminal_row_as_it_is(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    write(
        &*ledger,
        Writes {
            calls: vec![call_row("a", "deleg_c", 1)],
            ..Writes::default()
        },
    );
    let first = child_row("a", "deleg_c", 0, ChildStatus::Succeeded);
    let mut second = child_row("a", "deleg_c", 0, ChildStatus::Failed);
    second.attempt = 2;
    second.result.delivered = true;
    record(&*ledger, std::slice::from_ref(&first));

    assert_eq!(
        record(&*ledger, std::slice::from_ref(&second)),
        vec![first.clone()],
        "the stored row is returned"
    );
    assert_eq!(load(&*ledger).children, vec![first], "the first terminal row stays");
}

pub(crate) fn record_terminals_overwrites_a_non_terminal_row_keeping_its_delivery_state(
    make: &dyn Fn() -> Box<dyn Ledger>,
) {
    let ledger = make();
    let mut running = child_row("a", "deleg_c", 0, ChildStatus::Running);
    running.result = DeliveryRow {
        delivered: false,
        dead: true,
        failed_attempts: 3,
    };
    running.notice = DeliveryRow {
        delivered: true,
        dead: false,
        failed_attempts: 1,
    };
    write(
        &*ledger,
        Writes {
            calls: vec![call_row("a", "deleg_c", 1)],
            children: vec![running.clone()],
            ..Writes::default()
        },
    );
    let mut done = child_row("a", "deleg_c", 0, ChildStatus::Failed);
    done.attempt = 2;
    done.recovered = true;
    done.result.delivered = true;

    let mut expected = done.clone();
    expected.result = running.result;
    expected.notice = running.notice;
    assert_eq!(record(&*ledger, &[done]), vec![expected.clone()], "returned");
    assert_eq!(
        ledger.call_children("a", "deleg_c").expect("call_children"),
        vec![expected],
        "stored"
    );
}

pub(crate) fn record_terminals_returns_the_rows_as_stored_in_input_order(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let c = "deleg_c";
    let terminal = child_row("a", c, 0, ChildStatus::Succeeded);
    let mut queued = child_row("a", c, 1, ChildStatus::Queued);
    queued.notice.failed_attempts = 2;
    write(
        &*ledger,
        Writes {
            calls: vec![call_row("a", c, 3)],
            children: vec![terminal.clone(), queued.clone()],
            ..Writes::default()
        },
    );
    let new = child_row("a", c, 2, ChildStatus::TimedOut);
    let retried = child_row("a", c, 0, ChildStatus::Cancelled);
    let over_queued = child_row("a", c, 1, ChildStatus::Interrupted);

    let stored = record(&*ledger, &[new.clone(), retried, over_queued.clone()]);
    let mut kept = over_queued;
    kept.notice = queued.notice;
    assert_eq!(stored, vec![new.clone(), terminal.clone(), kept.clone()]);
    assert_eq!(
        ledger.call_children("a", c).expect("call_children"),
        vec![terminal, kept, new],
        "what the ledger holds"
    );
}

pub(crate) fn record_terminals_keeps_the_first_of_two_rows_of_one_child_in_one_batch(
    make: &dyn Fn() -> Box<dyn Ledger>,
) {
    // A child's own end and a cancel of it handed to the coalescer together land in one batch:
    // the first is recorded, the second is a hand-off of a row already terminal.
    let ledger = make();
    write(
        &*ledger,
        Writes {
            calls: vec![call_row("a", "deleg_c", 1)],
            ..Writes::default()
        },
    );
    let ended = child_row("a", "deleg_c", 0, ChildStatus::Succeeded);
    let cancelled = child_row("a", "deleg_c", 0, ChildStatus::Cancelled);

    let stored = record(&*ledger, &[ended.clone(), cancelled]);
    assert_eq!(
        ledger.call_children("a", "deleg_c").expect("call_children"),
        vec![ended.clone()],
        "the first row is stored"
    );
    assert_eq!(stored, vec![ended.clone(), ended], "each row is returned as stored");
}

// ---------------------------------------------------------------------------------------------
// Delivery state folded in at a load.

/// A call of two failed children (each with a result and a failure notice) in `session_id`.
pub(crate) fn a_write_never_moves_an_ended_child_back(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    write(
        &*ledger,
        Writes {
            calls: vec![call_row("a", "deleg_c", 2)],
            ..Writes::default()
        },
    );
    let cancelled = child_row("a", "deleg_c", 0, ChildStatus::Cancelled);
    let ended = child_row("a", "deleg_c", 1, ChildStatus::Succeeded);
    record(&*ledger, &[cancelled.clone(), ended.clone()]);
    let before = crate::ledger::kept_terminal_rows();
    for status in [ChildStatus::Queued, ChildStatus::Running] {
        let mut back = cancelled.clone();
        back.status = status;
        back.finished_at_ms = None;
        let mut other = ended.clone();
        other.status = status;
        write(
            &*ledger,
            Writes {
                children: vec![back, other],
                ..Writes::default()
            },
        );
    }
    let mut children = load(&*ledger).children;
    children.sort_by(|a, b| a.child_id.cmp(&b.child_id));
    assert_eq!(children, vec![cancelled, ended], "the ended rows stay as they were");
    assert!(
        crate::ledger::kept_terminal_rows() >= before + 4,
        "each write kept from an ended row is counted"
    );
}

/// A retry writes the next attempt, queued, over a `failed` or `timed_out` row (not over any other
/// ended row, nor as the same attempt); once it is there, no row of an earlier attempt — a late
/// end, a stale requeue — replaces it, and the next attempt's end is recorded.
pub(crate) fn a_retry_queues_the_next_attempt_over_a_failed_one_and_no_earlier_attempt_replaces_it(
    make: &dyn Fn() -> Box<dyn Ledger>,
) {
    let ledger = make();
    write(
        &*ledger,
        Writes {
            calls: vec![call_row("a", "deleg_r", 3)],
            ..Writes::default()
        },
    );
    let failed = child_row("a", "deleg_r", 0, ChildStatus::Failed);
    let timed_out = child_row("a", "deleg_r", 1, ChildStatus::TimedOut);
    let cancelled = child_row("a", "deleg_r", 2, ChildStatus::Cancelled);
    record(&*ledger, &[failed.clone(), timed_out.clone(), cancelled.clone()]);
    let next = |row: &ChildRow, attempt: u32| ChildRow {
        status: ChildStatus::Queued,
        started_at_ms: None,
        finished_at_ms: None,
        attempt,
        ..row.clone()
    };
    let (same_attempt, retried, retried_too, not_retryable) = (
        next(&failed, 1),
        next(&failed, 2),
        next(&timed_out, 2),
        next(&cancelled, 2),
    );
    for rows in [
        vec![same_attempt],
        vec![retried.clone(), retried_too.clone(), not_retryable],
    ] {
        write(
            &*ledger,
            Writes {
                children: rows,
                ..Writes::default()
            },
        );
    }
    let by_id = |ledger: &dyn Ledger| -> BTreeMap<String, ChildRow> {
        load(ledger)
            .children
            .into_iter()
            .map(|c| (c.child_id.clone(), c))
            .collect()
    };
    let children = by_id(&*ledger);
    assert_eq!(children[&failed.child_id], retried, "a failed attempt is retried");
    assert_eq!(
        children[&timed_out.child_id], retried_too,
        "a timed-out attempt is retried"
    );
    assert_eq!(
        children[&cancelled.child_id], cancelled,
        "a cancelled child stays cancelled"
    );
    // A late row of the first attempt changes nothing, whether written or recorded.
    write(
        &*ledger,
        Writes {
            children: vec![next(&failed, 1)],
            ..Writes::default()
        },
    );
    let stored = record(&*ledger, std::slice::from_ref(&failed));
    assert_eq!(
        stored,
        vec![retried.clone()],
        "an earlier attempt's end is not recorded over the retry"
    );
    // The retry's own end is.
    let second = ChildRow {
        attempt: 2,
        status: ChildStatus::Succeeded,
        ..failed.clone()
    };
    assert_eq!(record(&*ledger, std::slice::from_ref(&second)), vec![second.clone()]);
    assert_eq!(by_id(&*ledger)[&failed.child_id], second);
}

pub(crate) fn a_second_write_of_the_same_outcome_changes_nothing(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    write(
        &*ledger,
        Writes {
            calls: vec![call_row("a", "deleg_c", 1)],
            ..Writes::default()
        },
    );
    let ended = child_row("a", "deleg_c", 0, ChildStatus::Cancelled);
    record(&*ledger, std::slice::from_ref(&ended));
    write(
        &*ledger,
        Writes {
            children: vec![ended.clone()],
            ..Writes::default()
        },
    );
    assert_eq!(record(&*ledger, std::slice::from_ref(&ended)), vec![ended.clone()]);
    assert_eq!(load(&*ledger).children, vec![ended], "one row, as first recorded");
}

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

pub(crate) fn an_ack_row_marks_the_items_it_names_delivered(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let (first, second) = two_failed_children(&*ledger, "a", "deleg_c");
    let items = vec![
        dedup_key(&first.child_id, ItemKind::Result),
        dedup_key(&second.child_id, ItemKind::FailureNotice),
    ];
    write(
        &*ledger,
        Writes {
            acks: vec![ack_row("a", "clm_1", items)],
            ..Writes::default()
        },
    );

    let mut expected = vec![first, second];
    expected[0].result.delivered = true;
    expected[1].notice.delivered = true;
    assert_eq!(sorted(&load(&*ledger).children, |c| c.child_id.clone()), expected);
}

pub(crate) fn a_dead_letter_marks_its_item_dead_with_the_larger_attempt_count(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let mut first = child_row("a", "deleg_c", 0, ChildStatus::Failed);
    first.notice.failed_attempts = 2;
    let mut second = child_row("a", "deleg_c", 1, ChildStatus::Failed);
    second.result.failed_attempts = 9;
    write(
        &*ledger,
        Writes {
            calls: vec![call_row("a", "deleg_c", 2)],
            children: vec![first.clone(), second.clone()],
            dead_letters: vec![
                dead_letter("a", "deleg_c", 0, ItemKind::FailureNotice, 5),
                dead_letter("a", "deleg_c", 1, ItemKind::Result, 4),
            ],
            ..Writes::default()
        },
    );

    let mut expected = vec![first, second];
    expected[0].notice = DeliveryRow {
        delivered: false,
        dead: true,
        failed_attempts: 5,
    };
    expected[1].result = DeliveryRow {
        delivered: false,
        dead: true,
        failed_attempts: 9,
    };
    assert_eq!(sorted(&load(&*ledger).children, |c| c.child_id.clone()), expected);
}

pub(crate) fn an_acked_claim_is_not_returned_as_live(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let (first, _) = two_failed_children(&*ledger, "a", "deleg_c");
    let acked = claim_row("a", "clm_1");
    let live = claim_row("a", "clm_2");
    ledger.put_claim(&acked).expect("put_claim");
    ledger.put_claim(&live).expect("put_claim");
    write(
        &*ledger,
        Writes {
            acks: vec![ack_row(
                "a",
                "clm_1",
                vec![dedup_key(&first.child_id, ItemKind::Result)],
            )],
            ..Writes::default()
        },
    );

    assert_eq!(load(&*ledger).claims, vec![live.clone()], "load");
    assert_eq!(load_session(&*ledger, "a").claims, vec![live], "load_session");
}

pub(crate) fn load_session_folds_delivery_state_as_load_does(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let (a0, a1) = two_failed_children(&*ledger, "a", "deleg_c");
    let (b0, b1) = two_failed_children(&*ledger, "ab", "deleg_c1");
    write(
        &*ledger,
        Writes {
            acks: vec![
                ack_row("a", "clm_1", vec![dedup_key(&a0.child_id, ItemKind::Result)]),
                ack_row("ab", "clm_2", vec![dedup_key(&b1.child_id, ItemKind::Result)]),
            ],
            dead_letters: vec![
                dead_letter("a", "deleg_c", 1, ItemKind::FailureNotice, 6),
                dead_letter("ab", "deleg_c1", 0, ItemKind::FailureNotice, 7),
            ],
            ..Writes::default()
        },
    );

    let mut a = vec![a0, a1];
    a[0].result.delivered = true;
    a[1].notice = DeliveryRow {
        delivered: false,
        dead: true,
        failed_attempts: 6,
    };
    let mut ab = vec![b0, b1];
    ab[1].result.delivered = true;
    ab[0].notice = DeliveryRow {
        delivered: false,
        dead: true,
        failed_attempts: 7,
    };
    let child = |c: &ChildRow| c.child_id.clone();
    assert_eq!(
        sorted(&load_session(&*ledger, "a").children, child),
        a,
        "load_session(a)"
    );
    assert_eq!(
        sorted(&load_session(&*ledger, "ab").children, child),
        ab,
        "load_session(ab)"
    );
    let all = load(&*ledger).children;
    let in_session = |s: &str| {
        sorted(&all, child)
            .into_iter()
            .filter(|c| c.session_id == s)
            .collect::<Vec<_>>()
    };
    assert_eq!(in_session("a"), a, "load: a");
    assert_eq!(in_session("ab"), ab, "load: ab");
}

pub(crate) fn call_children_and_call_parts_are_the_stored_rows_without_delivery_folded_in(
    make: &dyn Fn() -> Box<dyn Ledger>,
) {
    let ledger = make();
    let (first, second) = two_failed_children(&*ledger, "a", "deleg_c");
    write(
        &*ledger,
        Writes {
            acks: vec![ack_row(
                "a",
                "clm_1",
                vec![dedup_key(&first.child_id, ItemKind::Result)],
            )],
            dead_letters: vec![dead_letter("a", "deleg_c", 1, ItemKind::FailureNotice, 8)],
            ..Writes::default()
        },
    );
    let stored = vec![first, second];

    assert_eq!(ledger.call_children("a", "deleg_c").expect("call_children"), stored);
    assert_eq!(ledger.call_parts("a", "deleg_c").expect("call_parts").children, stored);
    // ... while a load does fold them in.
    assert!(load(&*ledger)
        .children
        .iter()
        .any(|c| c.result.delivered || c.notice.dead));
}

// ---------------------------------------------------------------------------------------------
// Point reads, lists and pages.

pub(crate) fn ack_reads_the_ack_row_of_one_claim_of_one_session(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let row = ack_row("a", "clm_1", vec![dedup_key(&child_id("deleg_c", 0), ItemKind::Result)]);
    let other = ack_row(
        "a",
        "clm_10",
        vec![dedup_key(&child_id("deleg_c", 1), ItemKind::Result)],
    );
    write(
        &*ledger,
        Writes {
            acks: vec![row.clone(), other.clone()],
            ..Writes::default()
        },
    );

    assert_eq!(ledger.ack("a", "clm_1").expect("ack"), Some(row));
    assert_eq!(ledger.ack("a", "clm_10").expect("ack"), Some(other));
    assert_eq!(ledger.ack("a", "clm_").expect("ack"), None, "a prefix of a claim id");
    assert_eq!(ledger.ack("ab", "clm_1").expect("ack"), None, "another session");
    assert_eq!(ledger.ack("", "clm_1").expect("ack"), None, "no session");
}

pub(crate) fn find_call_finds_a_call_whatever_its_session(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let c1 = call_row("a", "deleg_c1", 1);
    let c = call_row("ab", "deleg_c", 2);
    write(
        &*ledger,
        Writes {
            calls: vec![c1.clone(), c.clone()],
            ..Writes::default()
        },
    );

    assert_eq!(ledger.find_call("deleg_c").expect("find_call"), Some(c));
    assert_eq!(ledger.find_call("deleg_c1").expect("find_call"), Some(c1));
    assert_eq!(ledger.find_call("deleg_").expect("find_call"), None, "a prefix");
    assert_eq!(ledger.find_call("c").expect("find_call"), None, "a suffix");
    assert_eq!(ledger.find_call("deleg_c10").expect("find_call"), None, "a longer id");
}

pub(crate) fn find_call_finds_no_call_once_it_is_removed(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let c = call_row("a", "deleg_c", 1);
    write(
        &*ledger,
        Writes {
            calls: vec![c.clone()],
            ..Writes::default()
        },
    );
    assert_eq!(ledger.find_call("deleg_c").expect("find_call"), Some(c));
    write(
        &*ledger,
        Writes {
            remove_calls: vec![key("a", "deleg_c")],
            ..Writes::default()
        },
    );
    assert_eq!(ledger.find_call("deleg_c").expect("find_call"), None);
}

pub(crate) fn has_session_is_true_only_for_a_stored_session(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    write(
        &*ledger,
        Writes {
            sessions: vec![session_row("ab")],
            ..Writes::default()
        },
    );
    assert!(ledger.has_session("ab").expect("has_session"));
    for other in ["a", "abc", "b", ""] {
        assert!(!ledger.has_session(other).expect("has_session"), "{other:?}");
    }
    write(
        &*ledger,
        Writes {
            remove_sessions: vec!["ab".to_string()],
            ..Writes::default()
        },
    );
    assert!(!ledger.has_session("ab").expect("has_session"));
}

pub(crate) fn call_reads_one_call_of_one_session(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let c = call_row("a", "deleg_c", 1);
    let c1 = call_row("a", "deleg_c1", 2);
    write(
        &*ledger,
        Writes {
            calls: vec![c.clone(), c1.clone()],
            ..Writes::default()
        },
    );

    assert_eq!(ledger.call("a", "deleg_c").expect("call"), Some(c));
    assert_eq!(ledger.call("a", "deleg_c1").expect("call"), Some(c1));
    assert_eq!(ledger.call("a", "deleg_c10").expect("call"), None, "a longer id");
    assert_eq!(ledger.call("ab", "deleg_c").expect("call"), None, "another session");
}

pub(crate) fn dead_letters_lists_every_sessions_dead_letters(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let rows = vec![
        dead_letter("a", "deleg_c", 0, ItemKind::Result, 8),
        dead_letter("a", "deleg_c", 0, ItemKind::FailureNotice, 3),
        dead_letter("ab", "deleg_c1", 4, ItemKind::Result, 8),
        dead_letter("b", "deleg_d", 1, ItemKind::FailureNotice, 8),
    ];
    write(
        &*ledger,
        Writes {
            dead_letters: rows.clone(),
            ..Writes::default()
        },
    );

    let key = |d: &DeadLetterRow| (d.session_id.clone(), d.dedup_key.clone());
    assert_eq!(
        sorted(&ledger.dead_letters().expect("dead_letters"), key),
        sorted(&rows, key)
    );
}

pub(crate) fn session_ids_page_the_stored_sessions_by_id_and_prefix(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let ids = ["a", "a-1", "a-2", "ab", "b", "b-1", "c~"];
    write(
        &*ledger,
        Writes {
            sessions: ids.iter().map(|s| session_row(s)).collect(),
            // Rows of other trees are no sessions.
            calls: vec![call_row("a", "deleg_c", 1)],
            ..Writes::default()
        },
    );
    let page = |after: Option<&str>, prefix: Option<&str>, limit| {
        ledger.session_ids(after, prefix, limit).expect("session_ids")
    };
    assert_eq!(page(None, None, 100), ids.to_vec());
    assert_eq!(page(None, None, 3), ["a", "a-1", "a-2"]);
    assert_eq!(page(Some("a-2"), None, 2), ["ab", "b"]);
    // `after` need not be a stored id.
    assert_eq!(page(Some("a-15"), None, 2), ["a-2", "ab"]);
    assert_eq!(page(None, Some("a"), 100), ["a", "a-1", "a-2", "ab"]);
    assert_eq!(page(None, Some("a-"), 100), ["a-1", "a-2"]);
    assert_eq!(page(Some("a-1"), Some("a-"), 100), ["a-2"]);
    // An `after` before the prefix starts at the prefix; one past it finds nothing.
    assert_eq!(page(Some("0"), Some("b"), 100), ["b", "b-1"]);
    assert!(page(Some("b-1"), Some("b"), 100).is_empty());
    assert!(page(Some("zz"), None, 100).is_empty());
    assert!(page(None, Some("d"), 100).is_empty());
    // Pages of one row each walk every id once.
    let (mut walked, mut after) = (Vec::new(), None::<String>);
    loop {
        let got = page(after.as_deref(), None, 1);
        let Some(last) = got.last().cloned() else { break };
        walked.extend(got);
        after = Some(last);
    }
    assert_eq!(walked, ids.to_vec());
    write(
        &*ledger,
        Writes {
            remove_sessions: vec!["a-1".to_string()],
            ..Writes::default()
        },
    );
    assert_eq!(page(None, Some("a-"), 100), ["a-2"]);
}

pub(crate) fn dead_letter_counts_count_each_sessions_dead_letters_in_the_range(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    write(
        &*ledger,
        Writes {
            dead_letters: vec![
                dead_letter("a", "deleg_c", 0, ItemKind::Result, 8),
                dead_letter("a", "deleg_c", 0, ItemKind::FailureNotice, 3),
                dead_letter("a", "deleg_c", 1, ItemKind::Result, 8),
                dead_letter("ab", "deleg_c1", 4, ItemKind::Result, 8),
                dead_letter("b", "deleg_d", 1, ItemKind::FailureNotice, 8),
                dead_letter("c", "deleg_e", 0, ItemKind::Result, 8),
            ],
            ..Writes::default()
        },
    );
    let counts = |first: &str, last: &str| ledger.dead_letter_counts(first, last).expect("dead_letter_counts");
    let owned = |v: &[(&str, u64)]| v.iter().map(|(s, n)| (s.to_string(), *n)).collect::<Vec<_>>();
    assert_eq!(counts("a", "c"), owned(&[("a", 3), ("ab", 1), ("b", 1), ("c", 1)]));
    assert_eq!(
        counts("a", "a"),
        owned(&[("a", 3)]),
        "a prefix-sharing session is not counted"
    );
    assert_eq!(counts("aa", "b"), owned(&[("ab", 1), ("b", 1)]));
    assert_eq!(counts("b", "bz"), owned(&[("b", 1)]));
    assert!(counts("d", "z").is_empty());
    assert_eq!(ledger.dead_letter_total().expect("dead_letter_total"), 6);
}

pub(crate) fn call_children_are_that_calls_rows_by_task_index(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    // Indices whose ids sort otherwise as text: deleg_c.1 < deleg_c.10 < deleg_c.2.
    let rows: Vec<ChildRow> = [10, 2, 1, 0]
        .into_iter()
        .map(|i| child_row("a", "deleg_c", i, ChildStatus::Succeeded))
        .collect();
    let mut writes = Writes {
        calls: vec![call_row("a", "deleg_c", 12), call_row("a", "deleg_c1", 1)],
        children: rows.clone(),
        ..Writes::default()
    };
    writes
        .children
        .push(child_row("a", "deleg_c1", 0, ChildStatus::Succeeded));
    write(&*ledger, writes);

    let indices: Vec<u32> = ledger
        .call_children("a", "deleg_c")
        .expect("call_children")
        .into_iter()
        .map(|c| {
            assert_eq!(c.call_id, "deleg_c", "a child of another call: {c:?}");
            c.task_index
        })
        .collect();
    assert_eq!(indices, vec![0, 1, 2, 10]);
    assert_eq!(
        ledger.call_children("a", "deleg_none").expect("call_children"),
        vec![],
        "a call without rows"
    );
}

/// `n` distinct ids made by `new_id`, in id order (the callers write them in the reverse order,
/// so a page in write order fails).
fn ordered_ids(n: usize, new_id: impl Fn() -> String) -> Vec<String> {
    let mut ids: Vec<String> = (0..n).map(|_| new_id()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), n, "ids made twice: {ids:?}");
    ids
}

/// Just past `id` and before any id made after it (ordered ids are hex digits, `x` is above).
fn between(id: &str) -> String {
    format!("{id}x")
}

pub(crate) fn calls_page_pages_one_sessions_calls_in_id_order(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let ids = ordered_ids(5, new_call_id);
    let other = ordered_ids(2, new_call_id);
    let mut calls: Vec<CallRow> = ids.iter().rev().map(|id| call_row("a", id, 1)).collect();
    calls.extend(other.iter().map(|id| call_row("ab", id, 1)));
    write(
        &*ledger,
        Writes {
            calls,
            ..Writes::default()
        },
    );
    let page = |after: Option<&str>, limit| -> Vec<String> {
        let rows = ledger.calls_page("a", after, limit).expect("calls_page");
        rows.into_iter().map(|c| c.call_id).collect()
    };

    assert_eq!(page(None, 10), ids, "every call of the session, in id order");
    assert_eq!(page(None, 2), ids[..2], "the first two");
    assert_eq!(page(Some(&ids[1]), 2), ids[2..4], "two after the second, exclusive");
    assert_eq!(
        page(Some(&between(&ids[1])), 10),
        ids[2..],
        "after an id that is not stored"
    );
    assert_eq!(
        page(Some(&ids[4]), 10),
        Vec::<String>::new(),
        "after the last: none of ab's"
    );
    assert_eq!(page(None, 0), Vec::<String>::new(), "limit 0");
}

pub(crate) fn acks_page_pages_one_sessions_acks_in_claim_id_order(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let ids = ordered_ids(5, || crate::model::new_claim_id("a"));
    let item = |i: u32| vec![dedup_key(&child_id("deleg_c", i), ItemKind::Result)];
    let mut acks: Vec<AckRow> = ids
        .iter()
        .enumerate()
        .rev()
        .map(|(i, id)| ack_row("a", id, item(i as u32)))
        .collect();
    acks.push(ack_row("ab", &crate::model::new_claim_id("ab"), item(9)));
    write(
        &*ledger,
        Writes {
            acks,
            ..Writes::default()
        },
    );
    let page = |after: Option<&str>, limit| -> Vec<String> {
        let rows = ledger.acks_page("a", after, limit).expect("acks_page");
        rows.into_iter().map(|a| a.claim_id).collect()
    };

    assert_eq!(page(None, 10), ids, "every ack row of the session, in claim id order");
    assert_eq!(page(None, 3), ids[..3], "the first three");
    assert_eq!(page(Some(&ids[2]), 1), ids[3..4], "one after the third, exclusive");
    assert_eq!(
        page(Some(&between(&ids[0])), 10),
        ids[1..],
        "after an id that is not stored"
    );
    assert_eq!(
        page(Some(&ids[4]), 10),
        Vec::<String>::new(),
        "after the last: none of ab's"
    );
    assert_eq!(page(None, 0), Vec::<String>::new(), "limit 0");
    let first = ledger.acks_page("a", None, 1).expect("acks_page");
    assert_eq!(first, vec![ack_row("a", &ids[0], item(0))], "the rows themselves");
}

pub(crate) fn call_parts_gathers_the_rows_of_one_call(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let (c, c1) = ("deleg_c", "deleg_c1");
    let dead = dead_letter("a", c, 0, ItemKind::FailureNotice, 8);
    let redriven = dead_letter("a", c, 2, ItemKind::Result, 8);
    let other_dead = dead_letter("a", c1, 0, ItemKind::Result, 8);
    let start = StartRow::new("a", c, vec![1], T0);
    let children = vec![
        child_row("a", c, 2, ChildStatus::Succeeded),
        child_row("a", c, 0, ChildStatus::Failed),
    ];
    let mut writes = Writes {
        calls: vec![call_row("a", c, 3), call_row("a", c1, 1)],
        children: children.clone(),
        dead_letters: vec![dead.clone(), other_dead.clone()],
        redrives: vec![redrive_row(&redriven), redrive_row(&other_dead)],
        starts: vec![start.clone(), StartRow::new("a", c1, vec![0], T0)],
        ..Writes::default()
    };
    writes.children.push(child_row("a", c1, 0, ChildStatus::Succeeded));
    write(&*ledger, writes);

    let parts = ledger.call_parts("a", c).expect("call_parts");
    assert_eq!(
        parts.children,
        vec![children[1].clone(), children[0].clone()],
        "children, by task index"
    );
    assert_eq!(parts.dead_letters, vec![dead], "dead letters");
    assert_eq!(parts.redrives, vec![redriven.dedup_key], "redrive records");
    assert_eq!(parts.starts, vec![start.start_id], "start rows");
}

pub(crate) fn row_counts_count_the_rows_of_every_tree(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let names = [
        SESSIONS,
        CALLS,
        CHILDREN,
        STARTS,
        CLAIMS,
        ACKS,
        WAKES,
        NESTS,
        DEAD_LETTERS,
        REDRIVES,
    ];
    let empty: BTreeMap<&str, usize> = names.iter().map(|&n| (n, 0)).collect();
    assert_eq!(counts(&*ledger), empty, "a fresh ledger");

    // A different count in every tree, so two trees' counts swapped fail.
    let c = "deleg_c";
    for i in 0..5 {
        ledger
            .put_claim(&claim_row("a", &format!("clm_{i}")))
            .expect("put_claim");
    }
    write(
        &*ledger,
        Writes {
            sessions: vec![session_row("a")],
            calls: vec![call_row("a", c, 10), call_row("a", "deleg_d", 1)],
            children: (0..3).map(|i| child_row("a", c, i, ChildStatus::Succeeded)).collect(),
            starts: (0..4).map(|i| StartRow::new("a", c, vec![i], T0)).collect(),
            acks: (0..6)
                .map(|i| {
                    ack_row(
                        "a",
                        &format!("clm_{i}"),
                        vec![dedup_key(&child_id(c, i), ItemKind::Result)],
                    )
                })
                .collect(),
            wakes: (0..7).map(|i| wake_row(&format!("w{i}"))).collect(),
            nests: (0..8).map(|i| nest_row("a", c, i)).collect(),
            dead_letters: (0..9).map(|i| dead_letter("a", c, i, ItemKind::Result, 8)).collect(),
            redrives: (0..10)
                .map(|i| redrive_row(&dead_letter("a", c, i, ItemKind::FailureNotice, 8)))
                .collect(),
            ..Writes::default()
        },
    );
    let expected: BTreeMap<&str, usize> = names.iter().zip(1..).map(|(&n, k)| (n, k)).collect();
    assert_eq!(counts(&*ledger), expected);
}

pub(crate) fn redrive_reads_the_record_of_one_item_of_one_session(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let dead = dead_letter("a", "deleg_c", 1, ItemKind::Result, 8);
    let twice = RedriveRow::after(Some(redrive_row(&dead)), &dead, T0 + 10);
    write(
        &*ledger,
        Writes {
            redrives: vec![twice.clone()],
            ..Writes::default()
        },
    );

    assert_eq!(ledger.redrive("a", &dead.dedup_key).expect("redrive"), Some(twice));
    let notice = dedup_key(&dead.child_id, ItemKind::FailureNotice);
    assert_eq!(
        ledger.redrive("a", &notice).expect("redrive"),
        None,
        "the child's other item"
    );
    assert_eq!(
        ledger.redrive("ab", &dead.dedup_key).expect("redrive"),
        None,
        "another session"
    );
}

// ---------------------------------------------------------------------------------------------
// Quarantine.

pub(crate) fn quarantine_moves_a_row_aside_with_its_bytes_and_reason(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let victim = call_row("a", "deleg_c", 2);
    let kept = call_row("ab", "deleg_c1", 1);
    write(
        &*ledger,
        Writes {
            calls: vec![victim.clone(), kept.clone()],
            ..Writes::default()
        },
    );

    let before = now_ms();
    ledger
        .quarantine(CALLS, "a", "deleg_c", "its children disagree with it")
        .expect("quarantine");
    let after = now_ms();
    ledger.flush().expect("flush");

    assert_eq!(
        load(&*ledger).calls,
        vec![kept],
        "load serves the rest, not the row moved aside"
    );
    assert_eq!(ledger.call("a", "deleg_c").expect("call"), None);
    let q = ledger.quarantined().expect("quarantined");
    assert_eq!(q.len(), 1, "{q:?}");
    let q = &q[0];
    assert_eq!(q.tree, CALLS);
    assert_eq!(q.key, super::row_key("a", "deleg_c"), "the stored key");
    assert_eq!(q.reason, "its children disagree with it");
    assert!((before..=after).contains(&q.quarantined_at_ms), "{q:?}");
    assert_eq!(q.value_len, q.value.len() as u64);
    let raw: CallRow = codec::decode(&q.value).expect("the raw bytes are the stored value");
    assert_eq!(raw, victim);
}

pub(crate) fn a_quarantined_child_row_is_named_among_damaged_children(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let (first, second) = two_failed_children(&*ledger, "a", "deleg_c");
    ledger
        .quarantine(CHILDREN, "a", &first.child_id, "inconsistent")
        .expect("quarantine");
    ledger.flush().expect("flush");

    let all = load(&*ledger);
    assert_eq!(all.children, vec![second.clone()], "load: children");
    assert_eq!(all.damaged_children, vec![first.child_id.clone()], "load: damaged");
    let one = load_session(&*ledger, "a");
    assert_eq!(one.children, vec![second], "load_session: children");
    assert_eq!(one.damaged_children, vec![first.child_id], "load_session: damaged");
    assert_eq!(
        load_session(&*ledger, "ab").damaged_children,
        Vec::<String>::new(),
        "another session"
    );
}

pub(crate) fn quarantine_of_a_session_keyed_row_takes_the_session_id(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let nest = nest_row("a", "deleg_c", 0);
    write(
        &*ledger,
        Writes {
            sessions: vec![session_row("a"), session_row("ab")],
            wakes: vec![wake_row("a"), wake_row("ab")],
            nests: vec![nest.clone()],
            ..Writes::default()
        },
    );
    for (tree, id) in [(SESSIONS, "a"), (WAKES, "ab"), (NESTS, nest.session_id.as_str())] {
        ledger.quarantine(tree, id, id, "moved aside").expect("quarantine");
    }
    ledger.flush().expect("flush");

    let snapshot = load(&*ledger);
    assert_eq!(snapshot.sessions, vec![session_row("ab")], "sessions");
    assert_eq!(snapshot.wakes, vec![wake_row("a")], "wakes");
    assert_eq!(snapshot.nests, vec![], "nests");
    let mut moved: Vec<(String, Vec<u8>)> = ledger
        .quarantined()
        .expect("quarantined")
        .into_iter()
        .map(|q| (q.tree, q.key))
        .collect();
    moved.sort();
    let mut expected = vec![
        (SESSIONS.to_string(), b"a".to_vec()),
        (WAKES.to_string(), b"ab".to_vec()),
        (NESTS.to_string(), nest.session_id.into_bytes()),
    ];
    expected.sort();
    assert_eq!(moved, expected, "each by its session id");
}

pub(crate) fn quarantine_of_a_missing_row_changes_nothing(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let f = Fixture::new("ab", "deleg_c");
    f.store(&*ledger);

    ledger.quarantine(CALLS, "a", "deleg_c", "gone").expect("quarantine");
    ledger.quarantine(SESSIONS, "a", "a", "gone").expect("quarantine");
    ledger.flush().expect("flush");

    assert_eq!(ledger.quarantined().expect("quarantined"), vec![]);
    assert_snapshot(&load(&*ledger), &snapshot_of(&[&f], true), "load");
}

pub(crate) fn quarantine_from_an_unknown_tree_is_refused(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    write(
        &*ledger,
        Writes {
            sessions: vec![session_row("a")],
            ..Writes::default()
        },
    );

    let refused = ledger.quarantine("units_of_old", "a", "a", "why").map_err(err_text);
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(ledger.quarantined().expect("quarantined"), vec![]);
    assert_eq!(load(&*ledger).sessions, vec![session_row("a")]);
}

pub(crate) fn load_quarantines_rows_that_fail_their_check_and_serves_the_rest(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let good = child_row("a", "deleg_c", 0, ChildStatus::Succeeded);
    // An id that does not match its call and task index, and a session whose next set is 0:
    // values brood never writes.
    let mut bad_child = child_row("a", "deleg_c", 1, ChildStatus::Succeeded);
    bad_child.child_id = child_id("deleg_c", 7);
    let mut bad_session = session_row("ab");
    bad_session.next_set = 0;
    write(
        &*ledger,
        Writes {
            sessions: vec![session_row("a"), bad_session.clone()],
            calls: vec![call_row("a", "deleg_c", 2)],
            children: vec![good.clone(), bad_child.clone()],
            ..Writes::default()
        },
    );

    let first = load(&*ledger);
    assert_eq!(first.sessions, vec![session_row("a")], "sessions");
    assert_eq!(first.calls, vec![call_row("a", "deleg_c", 2)], "calls");
    assert_eq!(first.children, vec![good], "children");
    assert_eq!(
        first.damaged_children,
        vec![bad_child.child_id.clone()],
        "damaged children"
    );
    let q = sorted(&ledger.quarantined().expect("quarantined"), |q| q.tree.clone());
    let trees: Vec<&str> = q.iter().map(|q| q.tree.as_str()).collect();
    assert_eq!(trees, vec![CHILDREN, SESSIONS], "{q:?}");
    assert_eq!(q[0].key, super::row_key("a", &bad_child.child_id));
    assert_eq!(codec::decode::<ChildRow>(&q[0].value).expect("raw child"), bad_child);
    assert_eq!(q[1].key, b"ab".to_vec());
    assert_eq!(
        codec::decode::<SessionRow>(&q[1].value).expect("raw session"),
        bad_session
    );
    assert!(q.iter().all(|q| !q.reason.is_empty()), "each says why: {q:?}");

    // Moved, not copied: a second load finds nothing more to move.
    let second = load(&*ledger);
    assert_eq!(second.damaged_children, first.damaged_children);
    assert_eq!(ledger.quarantined().expect("quarantined").len(), 2);
}

/// Every setting a session row holds (`addressable` too) reads back as written, from a full
/// load and from the session's own, and a later write of the row replaces them.
pub(crate) fn a_sessions_settings_read_back_as_written_and_as_changed(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let mut polled = session_row("polled");
    polled.addressable = true;
    polled.max_concurrent_children = 2;
    polled.max_delivery_attempts = 3;
    let plain = session_row("plain");
    write(
        &*ledger,
        Writes {
            sessions: vec![polled.clone(), plain.clone()],
            ..Writes::default()
        },
    );
    assert_eq!(load(&*ledger).sessions, vec![plain.clone(), polled.clone()]);
    assert_eq!(load_session(&*ledger, "polled").sessions, vec![polled.clone()]);

    polled.addressable = false;
    polled.max_concurrent_children = 5;
    write(
        &*ledger,
        Writes {
            sessions: vec![polled.clone()],
            ..Writes::default()
        },
    );
    assert_eq!(load(&*ledger).sessions, vec![plain, polled.clone()]);
    assert_eq!(load_session(&*ledger, "polled").sessions, vec![polled]);
}

/// One child's row is read by its session and id: none for another session's child, for a
/// child id that only shares a prefix, or for a child without a row; a terminal row recorded
/// over a running one reads back terminal.
pub(crate) fn child_reads_one_child_of_one_session(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let running = child_row("a", "deleg_c", 1, ChildStatus::Running);
    let other = child_row("ab", "deleg_c", 1, ChildStatus::Succeeded);
    write(
        &*ledger,
        Writes {
            sessions: vec![session_row("a"), session_row("ab")],
            calls: vec![call_row("a", "deleg_c", 12), call_row("ab", "deleg_c", 12)],
            children: vec![running.clone(), other.clone()],
            ..Writes::default()
        },
    );
    let id = child_id("deleg_c", 1);
    assert_eq!(ledger.child("a", &id).expect("child"), Some(running.clone()));
    assert_eq!(ledger.child("ab", &id).expect("child"), Some(other));
    for (session, child) in [
        ("b", id.clone()),
        ("a", child_id("deleg_c", 0)),
        ("a", child_id("deleg_c", 10)),
    ] {
        assert_eq!(ledger.child(session, &child).expect("child"), None, "{session} {child}");
    }
    let mut ended = running;
    ended.status = ChildStatus::Succeeded;
    ended.summary = Some("done".into());
    record(&*ledger, std::slice::from_ref(&ended));
    assert_eq!(ledger.child("a", &id).expect("child"), Some(ended));
}

// ---------------------------------------------------------------------------------------------

/// A call's trace context (`traceparent`) reads back as written from every read of the call —
/// a full load, its session's load, the call by its session, by its id alone, and a page of
/// its session's calls — and a call without one reads back without one.
pub(crate) fn a_calls_traceparent_reads_back_from_every_read_of_the_call(make: &dyn Fn() -> Box<dyn Ledger>) {
    let ledger = make();
    let mut traced = call_row("a", "deleg_t", 2);
    traced.traceparent = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
    let plain = call_row("a", "deleg_u", 1);
    write(
        &*ledger,
        Writes {
            sessions: vec![session_row("a")],
            calls: vec![traced.clone(), plain.clone()],
            ..Writes::default()
        },
    );
    let both = vec![traced.clone(), plain.clone()];
    assert_eq!(load(&*ledger).calls, both, "load");
    assert_eq!(load_session(&*ledger, "a").calls, both, "load_session");
    assert_eq!(ledger.call("a", "deleg_t").expect("call"), Some(traced.clone()));
    assert_eq!(ledger.find_call("deleg_t").expect("find_call"), Some(traced.clone()));
    assert_eq!(ledger.calls_page("a", None, 10).expect("calls_page"), both);
    assert_eq!(ledger.find_call("deleg_u").expect("find_call"), Some(plain));
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
