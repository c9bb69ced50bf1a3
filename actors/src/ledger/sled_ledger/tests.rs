//! Tests of the sled ledger: its lock, its keys, and reading rows back.

use super::*;
use std::time::Duration;

#[test]
fn a_lock_released_moments_later_is_waited_out() {
    let dir = tempfile::TempDir::new().unwrap();
    let first = SledLedger::open(dir.path()).unwrap();
    let holder = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        drop(first);
    });
    let second = SledLedger::open(dir.path());
    holder.join().unwrap();
    assert!(second.is_ok(), "{:?}", second.err());
}

#[test]
fn a_flush_observer_is_told_of_every_successful_flush() {
    let dir = tempfile::TempDir::new().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let ledger = SledLedger::open(dir.path())
        .unwrap()
        .on_flush(std::sync::Arc::new(move |d| record.lock().unwrap().push(d)));
    ledger.flush().unwrap();
    ledger.flush().unwrap();
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[test]
fn a_lock_held_for_good_is_reported() {
    let dir = tempfile::TempDir::new().unwrap();
    let _first = SledLedger::open(dir.path()).unwrap();
    let err = SledLedger::open(dir.path()).unwrap_err().to_string();
    assert!(err.contains("another brood process"), "{err}");
}

#[test]
fn a_value_over_the_blob_threshold_is_fsynced_and_reads_back() {
    let dir = tempfile::TempDir::new().unwrap();
    let goal = "x".repeat(300 * 1024); // over sled's blob threshold (segment size / 4)
    let call = CallRow {
        call_id: "deleg_big".into(),
        session_id: "s".into(),
        set: 1,
        mode: Mode::Background,
        forced_sync_reason: None,
        independent_completions: false,
        tasks: vec![Task {
            goal: goal.clone(),
            runner_json: "{}".into(),
            group: None,
            timeout_ms: None,
            stall_ms: 1,
            rerun_on_recovery: false,
            input: None,
            retry: None,
        }],
        created_at_ms: 0,
        traceparent: None,
        idempotency: None,
    };
    {
        let ledger = SledLedger::open_with(dir.path(), Durability::Fsync).unwrap();
        ledger
            .write(&Writes {
                calls: vec![call.clone()],
                ..Writes::default()
            })
            .unwrap();
        ledger.flush().unwrap();
        let synced = ledger.files.synced_blobs.lock().unwrap().len();
        assert!(synced >= 1, "the blob file sled wrote was fsynced");
    }
    let ledger = SledLedger::open(dir.path()).unwrap();
    let snapshot = ledger.load().unwrap();
    assert_eq!(snapshot.calls, vec![call]);
}

#[test]
fn durability_names_parse_and_unknown_ones_are_refused() {
    assert_eq!("fsync".parse::<Durability>(), Ok(Durability::Fsync));
    assert_eq!("flush".parse::<Durability>(), Ok(Durability::Flush));
    assert!("sometimes".parse::<Durability>().unwrap_err().contains("fsync, flush"));
}

#[test]
fn acks_and_dead_letters_fold_into_the_children_they_name() {
    let mut children = vec![ChildRow {
        child_id: "deleg_a.0".into(),
        call_id: "deleg_a".into(),
        unit_id: "deleg_a-1".into(),
        session_id: "s".into(),
        task_index: 0,
        status: ChildStatus::Failed,
        summary: None,
        error: None,
        started_at_ms: None,
        finished_at_ms: None,
        attempt: 1,
        recovered: false,
        result: DeliveryRow::default(),
        notice: DeliveryRow::default(),
        output: None,
    }];
    let acks = vec![AckRow {
        claim_id: "c".into(),
        session_id: "s".into(),
        items: vec!["deleg_a.0:result".into(), "deleg_gone.0:result".into()],
        acked_at_ms: 0,
    }];
    let dead = vec![DeadLetterRow {
        dedup_key: "deleg_a.0:failure_notice".into(),
        child_id: "deleg_a.0".into(),
        session_id: "s".into(),
        call_id: "deleg_a".into(),
        kind: ItemKind::FailureNotice,
        reason: "r".into(),
        attempts: 8,
        dead_at_ms: 0,
    }];
    fold_delivery(&mut children, &acks, &dead);
    assert!(children[0].result.delivered && !children[0].result.dead);
    assert!(children[0].notice.dead && children[0].notice.failed_attempts == 8);
}

/// A call of `tasks` independent tasks in `session`.
fn call_of(session: &str, call_id: &str, tasks: usize) -> CallRow {
    CallRow {
        call_id: call_id.into(),
        session_id: session.into(),
        set: 1,
        mode: Mode::Background,
        forced_sync_reason: None,
        independent_completions: true,
        tasks: (0..tasks)
            .map(|_| Task {
                goal: "g".into(),
                runner_json: "{}".into(),
                group: None,
                timeout_ms: None,
                stall_ms: 1,
                rerun_on_recovery: false,
                input: None,
                retry: None,
            })
            .collect(),
        created_at_ms: 0,
        traceparent: None,
        idempotency: None,
    }
}

/// Sessions whose ids share prefixes, each with calls whose children mostly have rows.
fn many_children(ledger: &SledLedger) {
    let mut writes = Writes::default();
    for (session, calls) in [("a", 3), ("ab", 2), ("b", 4)] {
        for k in 0..calls {
            let call = call_of(session, &format!("deleg_{session}{k}"), 40 + 7 * k);
            for unit in plan_units(&call.call_id, &call.tasks, true) {
                for &i in &unit.tasks {
                    if i % 9 != 4 {
                        writes.children.push(crate::recovery::queued_child(&call, &unit, i));
                    }
                }
            }
            writes.calls.push(call);
        }
    }
    ledger.write(&writes).unwrap();
    ledger.flush().unwrap();
}

#[test]
fn children_read_in_several_ranges_are_the_rows_read_in_one() {
    let dir = tempfile::TempDir::new().unwrap();
    let ledger = SledLedger::open(dir.path()).unwrap();
    many_children(&ledger);
    let calls: Vec<CallRow> = ledger.scan(&ledger.calls, CALLS, None).unwrap();
    let all: Vec<ChildRow> = ledger.scan(&ledger.children, CHILDREN, None).unwrap();
    assert!(all.len() > 300);
    for parts in [1, 2, 3, 5, 9, 40] {
        assert_eq!(
            ledger.scan_children_in(None, &calls, parts).unwrap(),
            all,
            "{parts} ranges"
        );
    }
    // One session's rows only, whichever other session's id it prefixes.
    let a_calls: Vec<CallRow> = ledger.scan(&ledger.calls, CALLS, Some("a")).unwrap();
    let a: Vec<ChildRow> = ledger.scan(&ledger.children, CHILDREN, Some("a")).unwrap();
    assert!(!a.is_empty() && a.iter().all(|c| c.session_id == "a"));
    for parts in [1, 2, 3] {
        assert_eq!(
            ledger.scan_children_in(Some("a"), &a_calls, parts).unwrap(),
            a,
            "{parts} ranges"
        );
    }
}

#[test]
fn a_damaged_child_row_read_on_another_thread_is_quarantined() {
    let dir = tempfile::TempDir::new().unwrap();
    let ledger = SledLedger::open(dir.path()).unwrap();
    many_children(&ledger);
    let calls: Vec<CallRow> = ledger.scan(&ledger.calls, CALLS, None).unwrap();
    let before: Vec<ChildRow> = ledger.scan(&ledger.children, CHILDREN, None).unwrap();
    // In the last session's last call (a task without a row of its own): in the last of three
    // ranges, read on a spawned thread.
    let key = row_key("b", "deleg_b3.4");
    ledger.children.insert(key.clone(), &b"not a row"[..]).unwrap();
    let read = ledger.scan_children_in(None, &calls, 3).unwrap();
    assert!(read == before, "the damaged row is not read back, the others are");
    assert!(
        ledger.children.get(&key).unwrap().is_none(),
        "moved out of the children"
    );
    let quarantined = ledger.quarantined().unwrap();
    assert_eq!(quarantined.len(), 1);
    assert_eq!(quarantined[0].tree, CHILDREN);
    assert_eq!(quarantined[0].value, b"not a row".to_vec());
}

#[test]
fn calls_stored_before_the_index_was_kept_are_indexed_when_the_ledger_opens() {
    let dir = tempfile::TempDir::new().unwrap();
    let (a, b) = (call_of("s1", "deleg_a", 1), call_of("s2", "deleg_b", 2));
    {
        let ledger = SledLedger::open(dir.path()).unwrap();
        ledger
            .write(&Writes {
                calls: vec![a.clone(), b.clone()],
                ..Writes::default()
            })
            .unwrap();
        // As a ledger of a build without the index: no index entries, no marker.
        ledger.call_sessions.clear().unwrap();
        ledger.db.open_tree(META).unwrap().remove(CALL_INDEX_KEY).unwrap();
        ledger.flush().unwrap();
        assert_eq!(
            ledger.find_call("deleg_a").unwrap(),
            None,
            "the index is what finds a call"
        );
    }
    let ledger = SledLedger::open(dir.path()).unwrap();
    assert_eq!(ledger.find_call("deleg_a").unwrap(), Some(a));
    assert_eq!(ledger.find_call("deleg_b").unwrap(), Some(b));
    assert!(ledger
        .db
        .open_tree(META)
        .unwrap()
        .get(CALL_INDEX_KEY)
        .unwrap()
        .is_some());
}

#[test]
fn a_load_of_sessions_holds_no_room_for_rows_it_did_not_read() {
    use crate::ledger::conformance::{call_row, child_row};
    let dir = tempfile::TempDir::new().unwrap();
    let ledger = SledLedger::open(dir.path()).unwrap();
    let ids: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
    let mut writes = Writes::default();
    // Each session: a large call, then a call of one child, read last.
    for s in &ids {
        writes.calls.push(call_row(s, "deleg_a", 1000));
        writes.calls.push(call_row(s, "deleg_b", 1));
        writes
            .children
            .extend((0..1000).map(|i| child_row(s, "deleg_a", i, ChildStatus::Succeeded)));
        writes.children.push(child_row(s, "deleg_b", 0, ChildStatus::Succeeded));
    }
    ledger.write(&writes).unwrap();
    ledger.flush().unwrap();
    let read = ledger.load_sessions(&ids).unwrap();
    let runs: Vec<(usize, usize)> = read.children.runs().iter().map(|r| (r.len(), r.capacity())).collect();
    let (rows, room) = runs.iter().fold((0, 0), |(n, c), r| (n + r.0, c + r.1));
    assert!(room <= rows + rows / 2, "{rows} rows held in room for {room}: {runs:?}");
}
