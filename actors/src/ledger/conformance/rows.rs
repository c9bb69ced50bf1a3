//! Cases of writes: every kind of row reads back, a put replaces, a removal removes what it
//! names, and the rules of children's rows (an ended child never moves back, a retry's attempt
//! replaces only an earlier one, `record_terminals` keeps what it must).

use super::*;

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
    expected.children = std::iter::once(child)
        .chain(expected.children.into_iter().skip(1))
        .collect();
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
    let mut children = load(&*ledger).children.into_vec();
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
