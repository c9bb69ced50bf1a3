//! Recovery's decisions, tested as plain code.

use super::*;
use crate::ledger::ChildRuns;

fn session() -> SessionRow {
    SessionRow {
        session_id: "s".into(),
        max_concurrent_children: 8,
        max_delivery_attempts: 8,
        next_set: 2,
        created_at_ms: 0,
        addressable: false,
    }
}

fn call(rerun: &[bool], group: Option<&str>) -> CallRow {
    CallRow {
        call_id: "deleg_c".into(),
        session_id: "s".into(),
        set: 4,
        mode: Mode::Sync,
        forced_sync_reason: None,
        independent_completions: false,
        tasks: rerun
            .iter()
            .map(|&r| Task {
                goal: "g".into(),
                runner_json: "{}".into(),
                group: group.map(str::to_string),
                timeout_ms: None,
                stall_ms: DEFAULT_STALL_MS,
                rerun_on_recovery: r,
                input: None,
                retry: None,
            })
            .collect(),
        created_at_ms: 0,
        traceparent: None,
        idempotency: None,
    }
}

fn child(i: u32, status: ChildStatus) -> ChildRow {
    let unit = UnitRow {
        unit_id: "deleg_c-1".into(),
        call_id: "deleg_c".into(),
        group: None,
        tasks: vec![],
    };
    ChildRow {
        status,
        ..queued_child(&call(&[false], None), &unit, i)
    }
}

fn snapshot(call: CallRow, children: Vec<ChildRow>) -> SessionSnapshot {
    SessionSnapshot {
        children: HashMap::from([(call.call_id.clone(), children)]),
        calls: vec![call],
        claims: vec![ClaimRow {
            claim_id: "clm_x".into(),
            session_id: "s".into(),
            consumer: "c".into(),
            lease_expires_at_ms: 0,
            items: 1,
        }],
        damaged: HashSet::new(),
        wake_url: None,
    }
}

#[test]
fn a_running_unit_is_resolved_after_a_process_restart() {
    // Four children of one unit: two recorded, one running re-runnable, one running not.
    let mut done = child(0, ChildStatus::Succeeded);
    done.summary = Some("found it".into());
    let rows = vec![
        done,
        child(1, ChildStatus::Failed),
        child(2, ChildStatus::Running),
        child(3, ChildStatus::Running),
    ];
    let snap = snapshot(call(&[false, false, true, false], None), rows);
    let plan = plan(&session(), snap, Recovery::Process, &HashSet::new(), 99);
    assert_eq!(plan.next_set, 5, "never reuse a stored call's set");
    assert_eq!(plan.lost_claims, vec!["clm_x".to_string()]);
    assert_eq!(plan.calls.len(), 1);
    assert_eq!(
        plan.calls[0].row.mode,
        Mode::Background,
        "a sync caller is gone after a restart"
    );
    let unit = &plan.calls[0].units[0];
    assert_eq!(unit.recorded_before_exit, Some(2));
    assert_eq!(unit.terminal, 3);
    assert!(!unit.complete());
    assert_eq!(plan.queue, vec!["deleg_c.2".to_string()]);
    let by_id: HashMap<&str, &ChildRow> = plan.children().map(|c| (c.child_id.as_str(), c)).collect();
    assert_eq!(by_id["deleg_c.0"].summary.as_deref(), Some("found it"));
    assert!(by_id["deleg_c.0"].recovered);
    assert_eq!(
        (by_id["deleg_c.2"].status, by_id["deleg_c.2"].attempt),
        (ChildStatus::Queued, 2)
    );
    assert_eq!(
        (by_id["deleg_c.3"].status, by_id["deleg_c.3"].finished_at_ms),
        (ChildStatus::Unknown, Some(99))
    );
    // The unit is not complete: only the failed child's early notice is ready.
    assert_eq!(plan.ready, vec![("deleg_c.1:failure_notice".to_string(), 0)]);
    assert_eq!(plan.changed.len(), 4);
}

#[test]
fn an_owner_restart_adopts_live_children_and_requeues_the_rest() {
    let rows = vec![
        child(0, ChildStatus::Running),
        child(1, ChildStatus::Running),
        child(2, ChildStatus::Queued),
    ];
    let snap = snapshot(call(&[false, false, false], None), rows);
    // deleg_c.2's row still says queued, but its actor started: adopted, not run twice.
    let live = HashSet::from(["deleg_c.0".to_string(), "deleg_c.2".to_string()]);
    let plan = plan(&session(), snap, Recovery::Owner, &live, 0);
    assert_eq!(plan.running, vec!["deleg_c.0".to_string(), "deleg_c.2".to_string()]);
    assert_eq!(plan.queue, vec!["deleg_c.1".to_string()]);
    assert_eq!(plan.calls[0].units[0].recorded_before_exit, None);
    assert!(plan.children().all(|c| c.status != ChildStatus::Unknown));
}

#[test]
fn delivered_calls_are_left_in_the_ledger_and_children_without_rows_are_queued() {
    let mut a = child(0, ChildStatus::Succeeded);
    a.result.delivered = true;
    let mut b = child(1, ChildStatus::Failed);
    b.result.delivered = true;
    b.notice.delivered = true;
    let settled = plan(
        &session(),
        snapshot(call(&[false, false], None), vec![a.clone(), b]),
        Recovery::Process,
        &HashSet::new(),
        0,
    );
    assert!(settled.calls.is_empty() && settled.ready.is_empty());
    assert_eq!(settled.delivered_done, 3);
    // A child that never started has no row: it is queued (its row needs no write).
    let partial = plan(
        &session(),
        snapshot(call(&[false, false], None), vec![a]),
        Recovery::Process,
        &HashSet::new(),
        0,
    );
    assert_eq!(partial.queue, vec!["deleg_c.1".to_string()]);
    // Only the recorded sibling changed: it is replayed as recovered.
    assert_eq!(partial.changed.len(), 1);
    assert!(partial.changed[0].child_id == "deleg_c.0" && partial.changed[0].recovered);
}

#[test]
fn children_without_their_call_or_beyond_its_tasks_are_rejected() {
    let c = call(&[false], None);
    let no_call = ChildRow {
        call_id: "deleg_gone".into(),
        child_id: "deleg_gone.0".into(),
        ..child(0, ChildStatus::Succeeded)
    };
    let beyond = child(7, ChildStatus::Succeeded);
    let snap = Snapshot {
        sessions: vec![session()],
        calls: vec![c],
        children: vec![child(0, ChildStatus::Queued), no_call, beyond].into(),
        claims: vec![],
        starts: vec![],
        damaged_children: vec![],
        wakes: vec![],
        nests: vec![],
    };
    let split = split_snapshot(snap);
    assert_eq!(split.sessions.len(), 1);
    assert_eq!(split.sessions[0].1.children["deleg_c"].len(), 1);
    let rejected: Vec<(&str, &str)> = split
        .rejects
        .iter()
        .map(|r| (r.key.as_str(), r.reason.as_str()))
        .collect();
    assert_eq!(rejected.len(), 2, "{rejected:?}");
    assert!(rejected
        .iter()
        .any(|(k, r)| *k == "deleg_gone.0" && r.contains("no (readable) row")));
    assert!(rejected
        .iter()
        .any(|(k, r)| *k == "deleg_c.7" && r.contains("beyond its call's 1 tasks")));
}

#[test]
fn a_calls_rows_read_in_several_runs_are_filed_together_without_the_rejected_ones() {
    let c = call(&[false, false, false, false], None);
    let other_unit = ChildRow {
        unit_id: "deleg_c-9".into(),
        ..child(1, ChildStatus::Succeeded)
    };
    // Two reads' shares cut the call's rows in two; a damaged row sits inside the first run.
    let mut first = ChildRuns::from(vec![
        child(0, ChildStatus::Succeeded),
        other_unit,
        child(2, ChildStatus::Queued),
    ]);
    first.append(ChildRuns::from(vec![child(3, ChildStatus::Succeeded)]));
    assert_eq!(first.runs().len(), 2);
    let split = split_snapshot(Snapshot {
        sessions: vec![session()],
        calls: vec![c],
        children: first,
        ..Snapshot::default()
    });
    let filed: Vec<u32> = split.sessions[0].1.children["deleg_c"]
        .iter()
        .map(|r| r.task_index)
        .collect();
    assert_eq!(
        filed,
        vec![0, 2, 3],
        "both runs filed under the call, in order, less the rejected row"
    );
    assert_eq!(split.rejects.len(), 1, "{:?}", split.rejects);
    assert!(split.rejects[0].key == "deleg_c.1" && split.rejects[0].reason.contains("its unit `deleg_c-9`"));
}

#[test]
fn calls_whose_session_row_is_missing_keep_their_session_and_sets() {
    let snap = Snapshot {
        sessions: vec![],
        calls: vec![call(&[false], None)],
        ..Snapshot::default()
    };
    let split = split_snapshot(snap);
    assert_eq!(split.rebuilt_sessions.len(), 1);
    let (row, part) = &split.sessions[0];
    assert_eq!(row.session_id, "s");
    assert_eq!(row.next_set, 5, "past the stored call's set 4");
    assert_eq!(part.calls.len(), 1);
}

#[test]
fn children_that_never_started_are_queued_again_in_task_order_across_units() {
    // Tasks 0, 2 in group a, 1, 3 in group b: nothing started.
    let mut c = call(&[false, false, false, false], None);
    for (i, t) in c.tasks.iter_mut().enumerate() {
        t.group = Some(if i % 2 == 0 { "a" } else { "b" }.into());
    }
    let snap = SessionSnapshot {
        calls: vec![c],
        ..SessionSnapshot::default()
    };
    let plan = plan(&session(), snap, Recovery::Process, &HashSet::new(), 0);
    assert_eq!(plan.queue, vec!["deleg_c.0", "deleg_c.1", "deleg_c.2", "deleg_c.3"]);
}

#[test]
fn a_unit_none_of_whose_children_started_is_queued_not_reported_as_recovered() {
    let snap = SessionSnapshot {
        calls: vec![call(&[false, false], None)],
        ..SessionSnapshot::default()
    };
    let queued = plan(&session(), snap, Recovery::Process, &HashSet::new(), 0);
    assert_eq!(queued.calls[0].units[0].recorded_before_exit, None);
    assert!(queued.changed.is_empty());
    // One started child makes the unit one that was running: 0/2 were recorded.
    let snap = snapshot(call(&[true, false], None), vec![child(0, ChildStatus::Running)]);
    let started = plan(&session(), snap, Recovery::Process, &HashSet::new(), 0);
    assert_eq!(started.calls[0].units[0].recorded_before_exit, Some(0));
}

fn start(tasks: &[u32], at: u64) -> StartRow {
    StartRow::new("s", "deleg_c", tasks.to_vec(), at)
}

#[test]
fn a_start_row_marks_running_the_children_without_a_row_of_their_own() {
    // Four tasks: 0 finished (its own row), 1 requeued after a lost start (its own row
    // says queued), 2 and 3 only named by start rows; task 3 started twice.
    let snap = Snapshot {
        sessions: vec![session()],
        calls: vec![call(&[false, false, false, true], None)],
        children: vec![child(0, ChildStatus::Succeeded), child(1, ChildStatus::Queued)].into(),
        starts: vec![start(&[0, 1, 2, 3], 10), start(&[3], 20)],
        ..Snapshot::default()
    };
    let split = split_snapshot(snap);
    assert!(split.rejects.is_empty(), "{:?}", split.rejects);
    let part = &split.sessions[0].1;
    // A call's rows come in no particular order.
    let mut rows: Vec<(u32, ChildStatus, Option<u64>)> = part.children["deleg_c"]
        .iter()
        .map(|c| (c.task_index, c.status, c.started_at_ms))
        .collect();
    rows.sort_by_key(|r| r.0);
    assert_eq!(
        rows,
        vec![
            (0, ChildStatus::Succeeded, None),
            (1, ChildStatus::Queued, None),
            (2, ChildStatus::Running, Some(10)),
            (3, ChildStatus::Running, Some(20)),
        ],
        "a child's own row wins over a start row; the latest start counts"
    );
    // After a process restart: 2 (not safe to re-run) is unknown, 3 is re-run; 1 and 3
    // now have rows of their own, so their next starts go into those rows.
    let (row, part) = split.sessions.into_iter().next().unwrap();
    let plan = plan(&row, part, Recovery::Process, &HashSet::new(), 99);
    let by_id: HashMap<&str, &ChildRow> = plan.children().map(|c| (c.child_id.as_str(), c)).collect();
    assert_eq!(by_id["deleg_c.2"].status, ChildStatus::Unknown);
    assert_eq!(
        (by_id["deleg_c.3"].status, by_id["deleg_c.3"].attempt),
        (ChildStatus::Queued, 2)
    );
    assert_eq!(plan.queue, vec!["deleg_c.1", "deleg_c.3"]);
    let mut rowed = plan.rowed.clone();
    rowed.sort();
    assert_eq!(rowed, vec!["deleg_c.1", "deleg_c.3"]);
}

#[test]
fn children_that_never_started_have_no_row_and_are_not_counted_as_rowed() {
    let snap = SessionSnapshot {
        calls: vec![call(&[false, false], None)],
        ..SessionSnapshot::default()
    };
    let plan = plan(&session(), snap, Recovery::Process, &HashSet::new(), 0);
    assert_eq!(plan.queue.len(), 2);
    assert!(plan.rowed.is_empty());
}

#[test]
fn a_start_row_of_a_damaged_child_leaves_its_outcome_unknown() {
    let snap = Snapshot {
        sessions: vec![session()],
        calls: vec![call(&[true], None)],
        starts: vec![start(&[0], 10)],
        damaged_children: vec!["deleg_c.0".into()],
        ..Snapshot::default()
    };
    let (row, part) = split_snapshot(snap).sessions.into_iter().next().unwrap();
    assert!(part.children.get("deleg_c").is_none_or(|rows| rows.is_empty()));
    let plan = plan(&row, part, Recovery::Process, &HashSet::new(), 5);
    assert_eq!(
        plan.children().next().unwrap().status,
        ChildStatus::Unknown,
        "never re-run blindly"
    );
}

#[test]
fn start_rows_without_their_call_or_beyond_its_tasks_or_of_another_session_are_rejected() {
    let gone = StartRow::new("s", "deleg_gone", vec![0], 1);
    let other = StartRow::new("t", "deleg_c", vec![0], 1);
    let snap = Snapshot {
        sessions: vec![session()],
        calls: vec![call(&[false], None)],
        starts: vec![gone.clone(), start(&[0, 5], 1), other.clone()],
        ..Snapshot::default()
    };
    let split = split_snapshot(snap);
    let reasons: Vec<(&str, &str)> = split.rejects.iter().map(|r| (r.tree, r.reason.as_str())).collect();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert!(reasons.iter().all(|(t, _)| *t == crate::ledger::trees::STARTS));
    assert!(reasons[0].1.contains("no (readable) row"));
    assert!(reasons[1].1.contains("beyond its call's 1 tasks"));
    assert!(reasons[2].1.contains("not its call's session"));
    assert!(split.sessions[0].1.children.values().flatten().next().is_none());
}

/// A session of three calls of many tasks, in every state a child can be left in.
fn large_session() -> SessionSnapshot {
    let statuses = [
        ChildStatus::Succeeded,
        ChildStatus::Failed,
        ChildStatus::Running,
        ChildStatus::Queued,
    ];
    let mut calls = Vec::new();
    let mut children = HashMap::new();
    for (k, tasks) in [(1u64, 900u32), (2, 50), (3, 1200)] {
        let mut c = call(&vec![false; tasks as usize], None);
        c.call_id = format!("deleg_{k}");
        c.set = 10 - k;
        c.independent_completions = k != 2;
        let units = plan_units(&c.call_id, &c.tasks, c.independent_completions);
        let mut rows = Vec::new();
        for unit in &units {
            for &i in &unit.tasks {
                // Every seventh task has no row (never started); the rest vary.
                if i % 7 != 3 {
                    let mut row = ChildRow {
                        status: statuses[(i as usize) % statuses.len()],
                        ..queued_child(&c, unit, i)
                    };
                    row.result.delivered = i % 5 == 0;
                    rows.push(row);
                }
            }
        }
        // In no particular order, as a split leaves them.
        rows.reverse();
        children.insert(c.call_id.clone(), rows);
        calls.push(c);
    }
    SessionSnapshot {
        calls,
        children,
        damaged: HashSet::from(["deleg_3.10".to_string()]),
        ..SessionSnapshot::default()
    }
}

#[test]
fn a_plan_made_on_several_threads_is_the_plan_made_on_one() {
    let one = plan_in(
        &session(),
        large_session(),
        Recovery::Process,
        &HashSet::new(),
        7,
        Some(1),
    );
    assert_eq!(one.calls.len(), 3, "every call has something left to do");
    assert!(!one.queue.is_empty() && !one.ready.is_empty() && !one.changed.is_empty());
    for threads in [2, 3, 8] {
        let many = plan_in(
            &session(),
            large_session(),
            Recovery::Process,
            &HashSet::new(),
            7,
            Some(threads),
        );
        assert_eq!(many, one, "{threads} threads");
    }
    // The plan is in set order whatever the threads: deleg_3 (set 7) first.
    let order: Vec<&str> = one.calls.iter().map(|c| c.row.call_id.as_str()).collect();
    assert_eq!(order, ["deleg_3", "deleg_2", "deleg_1"]);
    // Each call's children come back by task index, one per task.
    for c in &one.calls {
        assert!(c.children.iter().enumerate().all(|(i, r)| r.task_index as usize == i));
        assert_eq!(c.children.len(), c.row.tasks.len());
    }
}

/// A recovered call holds room for its own children only: a split files a call's rows in a
/// buffer sized for the call before it (a large one), and a call whose rows come one per task
/// in order keeps that buffer, so it is trimmed to the call's own tasks.
#[test]
fn a_recovered_call_holds_room_for_its_own_children_only() {
    let mut large = call(&vec![false; 1000], None);
    large.call_id = "deleg_a".into();
    large.independent_completions = true;
    let mut small = call(&[false], None);
    small.call_id = "deleg_b".into();
    small.set = 5;
    let rows = |c: &CallRow, status| {
        plan_units(&c.call_id, &c.tasks, c.independent_completions)
            .iter()
            .flat_map(|u| {
                u.tasks.iter().map(move |&i| ChildRow {
                    status,
                    ..queued_child(c, u, i)
                })
            })
            .collect::<Vec<_>>()
    };
    let mut children = rows(&large, ChildStatus::Succeeded);
    children.extend(rows(&small, ChildStatus::Running));
    let split = split_snapshot(Snapshot {
        sessions: vec![session()],
        calls: vec![large, small],
        children: children.into(),
        ..Snapshot::default()
    });
    assert!(split.rejects.is_empty(), "{:?}", split.rejects);
    let (row, part) = split.sessions.into_iter().next().expect("the session");
    let plan = plan(&row, part, Recovery::Process, &HashSet::new(), 7);
    let small = plan
        .calls
        .iter()
        .find(|c| c.row.call_id == "deleg_b")
        .expect("the small call is owed");
    assert_eq!(small.children.len(), 1);
    assert_eq!(
        small.children.capacity(),
        1,
        "room for its one child, not the call before it's"
    );
}

/// A recovered call whose children mostly never started (no rows: they are filled in as
/// queued) holds room for its own tasks only.
#[test]
fn a_recovered_call_filled_with_queued_children_holds_room_for_its_tasks_only() {
    for (tasks, stored) in [(5usize, 0u32), (5, 1), (513, 0)] {
        let mut c = call(&vec![false; tasks], None);
        c.independent_completions = true;
        let rows = (0..stored).map(|i| child(i, ChildStatus::Succeeded)).collect();
        let plan = plan(&session(), snapshot(c, rows), Recovery::Process, &HashSet::new(), 7);
        let kept = &plan.calls[0].children;
        assert_eq!(kept.len(), tasks);
        assert_eq!(
            kept.capacity(),
            tasks,
            "{tasks} tasks, {stored} stored: room for its tasks, not a regrown buffer's"
        );
    }
}
