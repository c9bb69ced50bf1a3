//! Cases of single reads and pages: one call, child, claim's ack or redrive record; the
//! stored sessions, calls, acks and dead letters paged in order; counts of rows.

use super::*;

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
