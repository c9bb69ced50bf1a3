//! Cases of quarantine: a row moved aside keeps its bytes and reason, a damaged child is named,
//! and a load quarantines what fails its check and serves the rest.

use super::*;

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
    assert_eq!(q.key, crate::ledger::row_key("a", "deleg_c"), "the stored key");
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
    let moved = quarantined_keys(&*ledger);
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
    assert_eq!(q[0].key, crate::ledger::row_key("a", &bad_child.child_id));
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
