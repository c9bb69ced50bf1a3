//! The shared list of children waiting for outside workers: who may list a child, and what a
//! take of it leaves behind when its taker dies or its process lists it anew.

use std::sync::Arc;
use std::time::Duration;

use super::super::super::pg_testkit;
use super::super::*;
use super::tenures::{node, until, TTL};
use crate::ledger::{Listed, TenureHolder, WorkDirectory};

fn list(l: &PgLedger) -> Arc<dyn WorkDirectory> {
    l.work_directory().expect("a shared ledger has a work list")
}

/// Processes `names` on a fresh schema, each holding a session of its own (`own-<name>`), the
/// first also `s1`, whose child `c1` it listed on queue `gpu`.
fn with_c1_listed_by_the_first<const N: usize>(names: [&str; N]) -> [PgLedger; N] {
    let schema = pg_testkit::fresh_schema();
    let nodes = names.map(|name| node(&schema, name, TTL));
    for (l, name) in nodes.iter().zip(names) {
        holds(l, &format!("own-{name}"));
    }
    holds(&nodes[0], "s1");
    list(&nodes[0]).post("s1", "c1", "gpu");
    let at = format!("http://{}", names[0]);
    until("the first listed its child", || is_listed_at(&nodes[0], "c1", &at));
    nodes
}

/// A take from queue `gpu` waiting `answer` for the child's process.
fn take(l: &PgLedger, answer: Duration) -> Option<Listed> {
    list(l).take_elsewhere("gpu", answer).unwrap().taken
}

fn holds(l: &PgLedger, session: &str) {
    assert!(matches!(
        l.tenures().unwrap().acquire(session).unwrap(),
        TenureHolder::Here(_)
    ));
}

/// The address `child` is listed at, and whether a poller may take it now; none when it is not
/// listed.
fn listing(l: &PgLedger, child: &str) -> Option<(String, bool)> {
    let (pool, table, child) = (
        l.inner.pool.clone(),
        format!("\"{}\".work_directory", l.inner.schema),
        child.to_string(),
    );
    l.runtime
        .run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            let row = client
                .query_opt(
                    &format!("SELECT address, posted_at <= now() FROM {table} WHERE child_id = $1"),
                    &[&child],
                )
                .await
                .map_err(pg_error("test query"))?;
            Ok(row.map(|r| (r.get(0), r.get(1))))
        })
        .unwrap()
}

/// Waits until every change `l` made to the list so far has landed: a listing of a marker
/// child of its own session `own`, made after them, is there (the changes of one process land
/// in order).
fn settled(l: &PgLedger, own: &str) {
    let marker = format!("marker-{}", crate::model::random_hex());
    list(l).post(own, &marker, "markers");
    until("the marker was listed", || listing(l, &marker).is_some());
}

fn is_listed_at(l: &PgLedger, child: &str, address: &str) -> bool {
    listing(l, child).is_some_and(|(at, takeable)| at == address && takeable)
}

/// A process lists a child only while it holds the child's session: one that never held it, or
/// lost it to another process (its runners not dropped yet), lists nothing over the holder's
/// listing, and its withdrawal leaves the holder's listing alone.
#[test]
fn only_the_holder_of_a_childs_session_lists_it() {
    let [a, b] = with_c1_listed_by_the_first(["a", "b"]);
    // b does not hold s1: its listing does not land.
    list(&b).post("s1", "c1", "gpu");
    list(&b).post("s1", "c2", "gpu");
    settled(&b, "own-b");
    assert!(is_listed_at(&a, "c1", "http://a"));
    assert_eq!(listing(&a, "c2"), None);
    // s1 moves to b, which lists the child at its own address.
    a.tenures().unwrap().release("s1");
    until("b took s1", || {
        matches!(b.tenures().unwrap().acquire("s1"), Ok(TenureHolder::Here(_)))
    });
    list(&b).post("s1", "c1", "gpu");
    until("b listed the child", || is_listed_at(&b, "c1", "http://b"));
    // a, which lost s1, lists it again and withdraws it (a lapsed hold, then its runner
    // dropped): the listing stays b's.
    list(&a).post("s1", "c1", "gpu");
    list(&a).withdraw("c1");
    list(&a).post("s1", "c1", "gpu");
    settled(&a, "own-a");
    assert!(is_listed_at(&b, "c1", "http://b"));
}

/// A child taken off the list by a poller that then dies (before it asks the child's process,
/// or before it lists the child again) is hidden from the other pollers only for the time the
/// poller would have waited, and a little more: then it is takeable again.
#[test]
fn a_child_taken_by_a_poller_that_died_comes_back_to_the_list() {
    let [_a, b, c] = with_c1_listed_by_the_first(["a", "b", "c"]);
    let taken = take(&b, Duration::ZERO).unwrap();
    assert_eq!((taken.child_id.as_str(), taken.address.as_str()), ("c1", "http://a"));
    // Hidden meanwhile, from b and from everyone else.
    assert_eq!(take(&c, Duration::ZERO), None);
    assert_eq!(take(&b, Duration::ZERO), None);
    // b says nothing more (it died): the child comes back by itself.
    drop(b);
    until("the child came back", || is_listed_at(&c, "c1", "http://a"));
    let again = take(&c, Duration::ZERO).unwrap();
    assert_eq!(again.child_id, "c1");
    assert_ne!(again.hidden_until, taken.hidden_until);
}

/// What a taker does with its take (lists it again soon, or takes it off the list) changes the
/// row as it took it only: a child its process listed anew meanwhile stays listed as it is.
#[test]
fn a_takers_later_word_changes_nothing_once_the_holder_listed_the_child_anew() {
    let [a, b] = with_c1_listed_by_the_first(["a", "b"]);
    let first: Listed = take(&b, Duration::from_secs(60)).unwrap();
    // a lists it anew (the take was refused as late, or its hold lapsed).
    list(&a).post("s1", "c1", "gpu");
    until("a listed its child anew", || is_listed_at(&a, "c1", "http://a"));
    list(&b).unlist(&first);
    list(&b).relist(&first);
    settled(&b, "own-b");
    assert!(is_listed_at(&a, "c1", "http://a"), "{:?}", listing(&a, "c1"));
    // On the row as it was taken, each does what it says.
    let second = take(&b, Duration::from_secs(60)).unwrap();
    assert_eq!(second.child_id, "c1");
    list(&b).relist(&second);
    // Takeable again within a few seconds, not the minute its taker would have waited.
    until("the child was listed again", || is_listed_at(&a, "c1", "http://a"));
    let third = take(&b, Duration::from_secs(60)).unwrap();
    list(&b).unlist(&third);
    settled(&b, "own-b");
    assert_eq!(listing(&a, "c1"), None);
}

/// A process started at the address of one that lost its session (a restart, the same name on
/// another host) lists the session's children there: a withdrawal by the old instance, whose
/// runners are dropped late, leaves that listing alone.
#[test]
fn a_withdrawal_by_an_instance_that_lost_the_session_leaves_the_listing_at_its_address() {
    let schema = pg_testkit::fresh_schema();
    let (old, new) = (node(&schema, "a", TTL), node(&schema, "a", TTL));
    holds(&old, "s1");
    holds(&old, "own-old");
    holds(&new, "own-new");
    list(&old).post("s1", "c1", "gpu");
    until("the old instance listed the child", || {
        is_listed_at(&old, "c1", "http://a")
    });
    old.tenures().unwrap().release("s1");
    until("the new instance took s1", || {
        matches!(new.tenures().unwrap().acquire("s1"), Ok(TenureHolder::Here(_)))
    });
    list(&new).post("s1", "c1", "gpu");
    settled(&new, "own-new");
    list(&old).withdraw("c1");
    settled(&old, "own-old");
    assert!(
        is_listed_at(&new, "c1", "http://a"),
        "withdrawn by the old instance: {:?}",
        listing(&new, "c1")
    );
    // The holder's own withdrawal still takes it off.
    list(&new).withdraw("c1");
    settled(&new, "own-new");
    assert_eq!(listing(&new, "c1"), None);
}

/// A look that takes nothing says how soon a child hidden now is takeable again: nobody tells
/// the waiting pollers when a hidden child comes back by itself.
#[test]
fn a_look_that_takes_nothing_says_when_a_hidden_child_is_back() {
    let schema = pg_testkit::fresh_schema();
    let (a, b, c) = (
        node(&schema, "a", TTL),
        node(&schema, "b", TTL),
        node(&schema, "c", TTL),
    );
    holds(&a, "s1");
    let empty = list(&c).take_elsewhere("gpu", Duration::ZERO).unwrap();
    assert_eq!(
        (empty.taken, empty.hidden_for),
        (None, None),
        "nothing listed, nothing hidden"
    );
    list(&a).post("s1", "c1", "gpu");
    until("a listed its child", || is_listed_at(&a, "c1", "http://a"));
    let taken = list(&b).take_elsewhere("gpu", Duration::from_secs(3)).unwrap();
    assert!(taken.taken.is_some() && taken.hidden_for.is_none(), "{taken:?}");
    let look = list(&c).take_elsewhere("gpu", Duration::ZERO).unwrap();
    assert_eq!(look.taken, None);
    let back = look.hidden_for.expect("a child is hidden");
    // Hidden for the taker's 3 s and 2 s more, less the time since.
    assert!(
        back > Duration::from_secs(3) && back <= Duration::from_secs(5),
        "{back:?}"
    );
}

/// A child whose process could not be reached is taken off the list when no live process has
/// its address (the process is gone; its session's next holder lists it anew), and listed again
/// a little later when one has (a restart, a brief failure).
#[test]
fn a_child_whose_process_was_not_reached_leaves_the_list_only_if_no_live_process_has_its_address() {
    let [a, b] = with_c1_listed_by_the_first(["a", "b"]);
    // a is alive: listed again, takeable within a few seconds (not the minute of the take).
    let first = take(&b, Duration::from_secs(60)).unwrap();
    list(&b).unreached(&first);
    until("the child was listed again", || is_listed_at(&a, "c1", "http://a"));
    // a died, and its heartbeat is gone: taken off.
    drop(a);
    super::sql(&b, "DELETE FROM \"{schema}\".nodes WHERE node = 'a'");
    let second = take(&b, Duration::from_secs(60)).unwrap();
    list(&b).unreached(&second);
    settled(&b, "own-b");
    assert_eq!(listing(&b, "c1"), None);
}

/// A look that finds a child being taken by another poller (its row locked) and so takes
/// nothing says so: that take may fail and the child come back untold.
#[test]
fn a_look_that_loses_the_race_for_a_child_still_says_when_to_look_again() {
    let [a, _b, c] = with_c1_listed_by_the_first(["a", "b", "c"]);
    let (go, held) = super::held_open(
        &a,
        &pg_testkit::url(),
        "UPDATE \"{schema}\".work_directory SET posted_at = clock_timestamp() + interval '3 seconds' WHERE child_id = 'c1'",
    );
    let look = list(&c).take_elsewhere("gpu", Duration::ZERO).unwrap();
    let _ = go.send(());
    a.runtime
        .run(async move { held.await.map_err(|e| LedgerError::storage_msg(e.to_string())) })
        .unwrap();
    assert_eq!(look.taken, None);
    assert!(look.raced, "{look:?}");
}

/// A child listed again soon after its process answered a take with a fault is told of to the
/// taker's own polls (those that looked while it was taken would wait for the end of the take's
/// wait); the other processes' polls are not woken for it.
#[test]
fn a_child_listed_again_early_is_told_of_to_the_takers_own_polls() {
    let [_a, b, c] = with_c1_listed_by_the_first(["a", "b", "c"]);
    let first = take(&b, Duration::from_secs(10)).unwrap();
    let (mut here, mut there) = (list(&b).listed(), list(&c).listed());
    until("c listens", || *there.borrow() >= 1);
    here.borrow_and_update();
    there.borrow_and_update();
    list(&b).relist(&first);
    until("the relisting was told here", || here.has_changed().unwrap());
    std::thread::sleep(Duration::from_millis(300));
    assert!(!there.has_changed().unwrap(), "the other processes were woken");
}
