//! Cases of loads: what a load of the ledger, of one session or of several answers, how
//! delivery state (ack rows, dead letters) folds into it, and that no read reaches into a
//! session whose key shares a prefix.

use super::*;

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
    let expected: Vec<crate::ledger::OldestRows> = asked
        .iter()
        .map(|id| crate::ledger::OldestRows {
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
