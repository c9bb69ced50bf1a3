//! Engines sharing one PostgreSQL ledger: a starting process reads what it serves only after it
//! took its tenures, a nested session is served where its parent session is, and a process that
//! takes a nested session up knows it is nested.

mod common;

use std::time::{Duration, Instant};

use brood::{Brood, BroodConfig, BroodError, DelegateRequest};
use brood_actors::ledger::pg_testkit;
use common::*;

fn sharing(dir: &std::path::Path, kit: &Kit, url: &str, schema: &str, node: &str, depth: u32) -> Brood {
    let config = BroodConfig::new(dir)
        .runners(kit.runners())
        .postgres(url)
        .postgres_schema(schema)
        .max_depth(depth)
        .share(node, format!("http://{node}"), Duration::from_secs(60));
    Brood::open(config).expect("open sharing PostgreSQL")
}

/// Opens session `p` on `b` with one long-running child: its call id and the child's id (the
/// id of its nested session).
async fn parent_running(b: &Brood) -> (String, String) {
    parent_running_as(b, task("parent", sim(600_000))).await
}

/// [`parent_running`], the child's task being `parent`.
async fn parent_running_as(b: &Brood, parent: brood::TaskSpec) -> (String, String) {
    open_wake(b, "p").await;
    let call = b
        .delegate("p", DelegateRequest::background(vec![parent]))
        .await
        .expect("delegate")
        .call_id()
        .to_string();
    let child = brood::child_id(&call, 0);
    (call, child)
}

/// Opens session `p` on `b` with one long-running child, and that child's session (one child
/// at a time) with a call of a long child, running, and `second`, queued: the parent's call id,
/// the child's id (the nested session's) and the nested call's id.
async fn nested_queue(b: &Brood, second: serde_json::Value) -> (String, String, String) {
    let (call, child) = parent_running(b).await;
    b.open_session(
        &child,
        brood::SessionSettings::default()
            .wake(|_| {})
            .max_concurrent_children(1),
    )
    .await
    .unwrap();
    let nested = b
        .delegate(
            &child,
            DelegateRequest::background(vec![task("n1", sim(600_000)), task("n2", second)]),
        )
        .await
        .expect("a nested call while the parent child runs")
        .call_id()
        .to_string();
    (call, child, nested)
}

/// Whether a statement is waiting for a lock on `table` (a `DO` block that raises otherwise).
fn waiting_on(url: &str, table: &str) -> bool {
    let sql = format!(
        "DO $$ BEGIN IF (SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
         AND query LIKE '%{table}%' AND pid <> pg_backend_pid()) = 0 THEN RAISE EXCEPTION 'no'; END IF; END $$"
    );
    let url = url.to_string();
    std::panic::catch_unwind(move || pg_testkit::execute(&url, &sql)).is_ok()
}

/// A starting process reads the sessions it serves only after it took their tenures: a holder
/// that writes until it gives its tenures back (here: b acks its claims, then stops cleanly, as
/// in a rolling restart) is never read from before those writes, so no acked item is handed
/// out again (I2). The load is held up between the tables it reads by a lock on `wakes` (read
/// after acks, children and claims), standing in for a large ledger's long load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starting_process_must_not_recover_from_a_snapshot_read_before_its_tenures() {
    let (kit, dir) = (Kit::default(), tempfile::tempdir().unwrap());
    let url = pg_testkit::url();
    let schema = pg_testkit::fresh_schema();
    let b = sharing(&dir.path().join("b"), &kit, &url, &schema, "b", 2);
    open_wake(&b, "s").await;
    let tasks = (0..3).map(|i| task(format!("t{i}"), sim(0))).collect();
    b.delegate("s", DelegateRequest::background(tasks).independent())
        .await
        .expect("delegate");
    let mut claims = Vec::new();
    let mut items = 0;
    while items < 3 {
        let env = next_envelope(&b, "s", "c", LONG_LEASE).await;
        items += env.items.len();
        claims.push(env.claim_id);
    }
    // A slow load: a's start reads acks, children and claims, then waits on `wakes`.
    let (lock_url, lock_schema) = (url.clone(), schema.clone());
    let lock = std::thread::spawn(move || {
        pg_testkit::execute(
            &lock_url,
            &format!(
                "BEGIN; LOCK TABLE \"{lock_schema}\".\"wakes\" IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(6); COMMIT;"
            ),
        )
    });
    std::thread::sleep(Duration::from_millis(500));
    let (a_dir, a_url, a_schema, a_kit) = (dir.path().join("a"), url.clone(), schema.clone(), Kit::default());
    let starting = std::thread::spawn(move || sharing(&a_dir, &a_kit, &a_url, &a_schema, "a", 2));
    // a's start either waits on the lock (it reads a session's rows) or, holding no tenure yet,
    // reads nothing at all; both mid-start while b still holds the session.
    let deadline = Instant::now() + Duration::from_secs(2);
    while !waiting_on(&url, "wakes") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    // Meanwhile b (still the holder) acks everything, then stops cleanly: its tenures given back.
    for claim in &claims {
        b.ack(claim).await.expect("b acks while it holds the tenure");
    }
    b.shutdown();
    lock.join().unwrap();
    let a = starting.join().unwrap();
    // a took the session at start: nothing acked may be handed out again.
    let again = a.boundary("s", "c", LONG_LEASE).await.expect("boundary at a");
    assert!(
        again.is_none(),
        "acked items delivered again by the process that took the session over: {:?}",
        again.map(|e| e.items.iter().map(|i| i.dedup_key.clone()).collect::<Vec<_>>())
    );
    a.shutdown();
}

/// A nested session is served where its parent session is: a sweep elsewhere that takes its
/// tenure gives it back, and the parent's holder takes it up again (the end of its child, a
/// cancel of it, reach it there). It is never ended for want of its parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_session_goes_back_to_where_its_parent_is_served() {
    let (kit, dir) = (Kit::default(), tempfile::tempdir().unwrap());
    let url = pg_testkit::url();
    let schema = pg_testkit::fresh_schema();
    let a = sharing(&dir.path().join("a"), &kit, &url, &schema, "a", 2);
    let b = sharing(&dir.path().join("b"), &kit, &url, &schema, "b", 2);
    let (call, child) = parent_running(&a).await;
    open_wake(&a, &child).await;
    let nested = a
        .delegate(
            &child,
            DelegateRequest::background(vec![task("n1", sim(600_000)).rerun_on_recovery(true)]),
        )
        .await
        .expect("a nested call while the parent child runs")
        .call_id()
        .to_string();
    // Only the nested session's tenure runs out (its holder paused past it, say): b's sweep
    // may take it, and gives it back; a takes it up again.
    pg_testkit::execute(
        &url,
        &format!("UPDATE \"{schema}\".session_leases SET expires_at = now() - interval '1 second' WHERE session = '{child}'::bytea"),
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(st) = a.status(&child).await {
            assert!(!b.sessions().contains(&child), "served apart from its parent");
            let status = child_status(&st, &nested, 0);
            assert!(
                !matches!(status, Some(brood::ChildStatus::Cancelled)),
                "the nested session was ended although its parent child still runs: {status:?}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "nobody serves the nested session");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let st = a.status("p").await.expect("parent");
    assert_eq!(child_status(&st, &call, 0), Some(brood::ChildStatus::Running));
    a.shutdown();
    b.shutdown();
}

/// A nested session is opened where its parent session is served: another process names
/// that one (over HTTP the request is forwarded there), and there it takes calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_session_is_opened_where_its_parent_is_served() {
    let (kit, dir) = (Kit::default(), tempfile::tempdir().unwrap());
    let url = pg_testkit::url();
    let schema = pg_testkit::fresh_schema();
    let a = sharing(&dir.path().join("a"), &kit, &url, &schema, "a", 2);
    let b = sharing(&dir.path().join("b"), &kit, &url, &schema, "b", 2);
    let (_, child) = parent_running(&a).await;
    match b.open_session(&child, brood::SessionSettings::default()).await {
        Err(BroodError::Moved { address, .. }) => assert_eq!(address, "http://a"),
        other => panic!("the nested session was not sent to its parent's holder: {other:?}"),
    }
    open_wake(&a, &child).await;
    a.delegate(&child, DelegateRequest::background(vec![task("n1", sim(0))]))
        .await
        .expect("a nested call where the parent is served");
    a.shutdown();
    b.shutdown();
}

/// A process that takes a nested session up later (started before it existed) knows it is
/// nested: max_depth holds there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_depth_holds_in_a_process_that_took_a_nested_session_up() {
    let (kit, dir) = (Kit::default(), tempfile::tempdir().unwrap());
    let url = pg_testkit::url();
    let schema = pg_testkit::fresh_schema();
    // max_depth 1: a nested session takes no call at all.
    let a = sharing(&dir.path().join("a"), &kit, &url, &schema, "a", 1);
    let b = sharing(&dir.path().join("b"), &kit, &url, &schema, "b", 1);
    // The parent's child is run again when b takes its session up (rerun on recovery), so it
    // has not ended there: the nested session's call is refused for its depth alone, not for
    // a child that recovery would otherwise have ended as unknown, whichever b reads first.
    let (_, child) = parent_running_as(&a, task("parent", sim(600_000)).rerun_on_recovery(true)).await;
    open_wake(&a, &child).await;
    let refused = a
        .delegate(&child, DelegateRequest::background(vec![task("deep", sim(0))]))
        .await
        .expect_err("depth 2 > max_depth 1");
    assert!(
        matches!(refused.error, BroodError::MaxDepthExceeded { .. }),
        "{:?}",
        refused.error
    );
    // a stops cleanly; b (started before the nested session existed) takes it up on request.
    a.shutdown();
    let res = b
        .delegate(&child, DelegateRequest::background(vec![task("deep", sim(0))]))
        .await;
    match res {
        Err(e) => assert!(matches!(e.error, BroodError::MaxDepthExceeded { .. }), "{:?}", e.error),
        Ok(r) => panic!(
            "max_depth bypassed in the process that took the nested session up: {}",
            r.call_id()
        ),
    }
    b.shutdown();
}

/// A process that starts while a nested session's tenure is free (its holder paused past it,
/// say) leaves that session to the process that serves its parent, where the end of its child
/// and a cancel of its parent's call reach it: cancelling the parent's call ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starting_process_leaves_a_nested_session_to_the_holder_of_its_parent() {
    let (kit, dir) = (Kit::default(), tempfile::tempdir().unwrap());
    let url = pg_testkit::url();
    let schema = pg_testkit::fresh_schema();
    let a = sharing(&dir.path().join("a"), &kit, &url, &schema, "a", 2);
    let (call, child, nested) = nested_queue(&a, sim(600_000)).await;
    pg_testkit::execute(
        &url,
        &format!("UPDATE \"{schema}\".session_leases SET expires_at = now() - interval '1 second' WHERE session = '{child}'::bytea"),
    );
    // c starts while the nested session's tenure is free.
    let c = sharing(&dir.path().join("c"), &kit, &url, &schema, "c", 2);
    let cancelled = a
        .cancel(brood::CancelTarget::Call(call.clone()), "the test", None)
        .await
        .expect("cancel the parent's call");
    assert_eq!(cancelled.cancelled, vec![child.clone()]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(!c.sessions().contains(&child), "served apart from its parent");
        if let Ok(st) = a.status(&child).await {
            let ended = (0..2).all(|i| child_status(&st, &nested, i).is_some_and(brood::ChildStatus::is_terminal));
            if ended {
                assert_eq!(child_status(&st, &nested, 1), Some(brood::ChildStatus::Cancelled));
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the nested session's children were not ended with its parent's call"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    a.shutdown();
    c.shutdown();
}

/// A cancel decided by a process whose session another process took over (it has not noticed
/// yet) is answered: its rows are refused, and it says the session is not served here (a
/// retry reaches the new holder), instead of trying to record them for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_in_a_process_that_lost_its_session_is_answered() {
    let (kit, dir) = (Kit::default(), tempfile::tempdir().unwrap());
    let url = pg_testkit::url();
    let schema = pg_testkit::fresh_schema();
    let a = sharing(&dir.path().join("a"), &kit, &url, &schema, "a", 2);
    let (_, child) = parent_running(&a).await;
    wait_for!(
        "the child runs",
        a.status("p")
            .await
            .ok()
            .and_then(|st| child_status(&st, child.rsplit_once('.').unwrap().0, 0))
            .filter(|s| *s == brood::ChildStatus::Running)
    );
    pg_testkit::execute(
        &url,
        &format!("UPDATE \"{schema}\".session_leases SET expires_at = now() - interval '1 second' WHERE session = 'p'::bytea"),
    );
    // b starts while p's tenure is free, and takes it over.
    let b = sharing(&dir.path().join("b"), &kit, &url, &schema, "b", 2);
    assert!(b.sessions().contains(&"p".to_string()), "b took p over");
    let cancel = a.cancel(brood::CancelTarget::Child(child.clone()), "the test", None);
    match tokio::time::timeout(DEADLINE, cancel).await {
        Ok(Err(BroodError::TenureLapsed { .. } | BroodError::Moved { .. })) => {}
        Ok(other) => panic!("the cancel in the process that lost the session answered {other:?}"),
        Err(_) => panic!("the cancel in the process that lost the session was never answered"),
    }
    a.shutdown();
    b.shutdown();
}

/// A process that takes over a session whose running child ends by the takeover (its run is
/// resolved, not re-run) and that child's nested session ends the nested session, whichever of
/// the two it takes up first: its queued children are cancelled and never run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_that_ends_a_running_child_ends_its_nested_session() {
    let (kit, dir) = (Kit::default(), tempfile::tempdir().unwrap());
    let url = pg_testkit::url();
    let schema = pg_testkit::fresh_schema();
    let a = sharing(&dir.path().join("a"), &kit, &url, &schema, "a", 2);
    let (call, child, nested) = nested_queue(&a, hold()).await;
    // Both tenures run out at once (a paused, say), and b takes both sessions over.
    pg_testkit::execute(
        &url,
        &format!("UPDATE \"{schema}\".session_leases SET expires_at = now() - interval '1 second'"),
    );
    let b = sharing(&dir.path().join("b"), &kit, &url, &schema, "b", 2);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let parent = b.status("p").await.ok().and_then(|st| child_status(&st, &call, 0));
        let queued = b.status(&child).await.ok().and_then(|st| child_status(&st, &nested, 1));
        if parent.is_some_and(brood::ChildStatus::is_terminal) && queued == Some(brood::ChildStatus::Cancelled) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the nested session of a child the takeover ended was not ended: parent child {parent:?}, queued nested child {queued:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !kit.holds.started().contains(&brood::child_id(&nested, 1)),
        "the queued nested child never ran"
    );
    a.shutdown();
    b.shutdown();
}

/// A drain during a database outage longer than the tenure waits for the children still
/// running here: the views of the session are refused meanwhile (another process may take it
/// over), but its children run on in this process until they end or the drain gives up, and
/// the drain says how many it left running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_during_a_database_outage_waits_for_the_children_running_here() {
    let (kit, dir) = (Kit::default(), tempfile::tempdir().unwrap());
    let mut cluster = pg_testkit::Cluster::private();
    let config = BroodConfig::new(dir.path())
        .runners(kit.runners())
        .postgres(cluster.url())
        .postgres_schema(pg_testkit::fresh_schema())
        .share("a", "http://a", Duration::from_secs(1));
    let a = Brood::open(config).expect("open sharing PostgreSQL");
    open_wake(&a, "p").await;
    let call = a
        .delegate("p", DelegateRequest::background(vec![task("long", hold())]))
        .await
        .expect("delegate")
        .call_id()
        .to_string();
    wait_for!(
        "the child runs",
        kit.holds.started().contains(&brood::child_id(&call, 0)).then_some(())
    );
    cluster.stop();
    wait_for!(
        "the tenure lapses while the database is away",
        matches!(a.counts("p").await, Err(BroodError::TenureLapsed { .. })).then_some(())
    );
    let left = a.drain(Duration::from_millis(500)).await;
    assert_eq!(left, 1, "the drain did not count the child still running here");
    assert_eq!(kit.holds.stopped(), 0, "the child runs on through the outage");
    cluster.start();
    a.shutdown();
}

/// An owner rebuilt from rows read before its session's tenure went to another process and came
/// back (a pause outlasting the heartbeat; the other process wrote a call meanwhile, then gave
/// the session back) is not served from that read: it is read again, and the call is there.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_rebuilt_from_rows_read_before_its_tenure_changed_hands_is_read_again() {
    use brood_actors::failpoints;
    let (kit, dir) = (Kit::default(), tempfile::tempdir().unwrap());
    let url = pg_testkit::url();
    let schema = pg_testkit::fresh_schema();
    let config = BroodConfig::new(dir.path().join("a"))
        .runners(kit.runners())
        .postgres(&url)
        .postgres_schema(&schema)
        .share("a", "http://a", Duration::from_secs(3));
    let a = Brood::open(config).expect("open sharing PostgreSQL");
    let b = sharing(&dir.path().join("b"), &kit, &url, &schema, "b", 2);
    open_wake(&a, "s").await;
    failpoints::arm("rebuild_read_hold", 1);
    let (restarted, call) = tokio::join!(a.restart_owner("s"), async {
        wait_for!(
            "the rebuild to have read its rows",
            (!failpoints::armed("rebuild_read_hold")).then_some(())
        );
        // a's heartbeat lapses (a pause) and b takes the session over, writes a call to it,
        // and stops, giving it back; a's sweep takes it back once its heartbeat is renewed.
        let lapse = format!("UPDATE \"{schema}\".nodes SET expires_at = now() - interval '1 second' WHERE node = 'a'");
        wait_for!("b to take the session over", {
            pg_testkit::execute(&url, &lapse);
            b.open_session("s", brood::SessionSettings::default()).await.ok()
        });
        let call = delegated(&b, "s", DelegateRequest::background(vec![task("from-b", sim(0))])).await;
        b.shutdown();
        let held_by_a =
            format!("SELECT owner FROM \"{schema}\".session_leases WHERE session = 's'::bytea AND expires_at > now()");
        wait_for!(
            "a to take the session back",
            (pg_testkit::query_value(&url, &held_by_a).ok().flatten().as_deref() == Some("a")).then_some(())
        );
        failpoints::release("rebuild_read_hold");
        call
    });
    restarted.expect("the owner restarted");
    // The call's one child, ended, its result ready or delivered: known to the rebuilt owner
    // only from a read made after b wrote the call.
    let counts = a.status("s").await.expect("status").counts;
    assert_eq!(
        counts.queued + counts.running + counts.ready + counts.claimed + counts.delivered as usize,
        1,
        "the call {call} b wrote while it held the session is not served by a's rebuilt owner: {counts:?}"
    );
    a.shutdown();
}

/// An owner rebuilt from the ledger (a restart asked for, or one waiting out a database outage)
/// after its session's tenure went to another process meanwhile is not served here: requests
/// for the session are answered as moved to its holder, not by an owner without its tenure
/// (whose boundaries would answer `lease_lapsed` for as long as the process runs).
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_rebuilt_after_its_session_was_taken_over_is_not_served_here() {
    use brood_actors::failpoints;
    let (kit, dir) = (Kit::default(), tempfile::tempdir().unwrap());
    let url = pg_testkit::url();
    let schema = pg_testkit::fresh_schema();
    // A short tenure: renewed every second, so a's renewal soon finds the tenure gone.
    let config = BroodConfig::new(dir.path())
        .runners(kit.runners())
        .postgres(&url)
        .postgres_schema(&schema)
        .share("a", "http://a", Duration::from_secs(3));
    let a = Brood::open(config).expect("open sharing PostgreSQL");
    open_wake(&a, "s").await;
    failpoints::arm("rebuild_hold", 1);
    let (restarted, ()) = tokio::join!(a.restart_owner("s"), async {
        wait_for!(
            "the rebuild to be held",
            (!failpoints::armed("rebuild_hold")).then_some(())
        );
        // Meanwhile a's heartbeat lapses (a pause) and another process takes the session over.
        pg_testkit::execute(
            &url,
            &format!(
                "UPDATE \"{schema}\".nodes SET expires_at = now() - interval '1 second' WHERE node = 'a'; \
                 UPDATE \"{schema}\".session_leases SET owner = 'c', address = 'http://c', epoch = epoch + 1, \
                 instance = 'c', expires_at = now() + interval '10 minutes' WHERE session = 's'::bytea"
            ),
        );
        wait_for!(
            "a to find its tenure gone",
            a.served_elsewhere(&["s".to_string()])
                .await
                .ok()
                .filter(|away| away.contains_key("s"))
        );
        failpoints::release("rebuild_hold");
    });
    match restarted {
        Ok(()) | Err(BroodError::Moved { .. }) => {}
        Err(e) => panic!("the restart answered {e:?}"),
    }
    let answer = a.boundary("s", "c1", LONG_LEASE).await;
    match answer {
        Err(BroodError::Moved { address, .. }) => assert_eq!(address, "http://c"),
        other => panic!("a boundary of a session served elsewhere answered {other:?}"),
    }
    assert!(!a.sessions().contains(&"s".to_string()), "s is still served here");
    a.shutdown();
}

/// A sweep that takes a session whose owner here has not yet stopped for losing it (told, not
/// there yet) takes it up all the same: the session is served here again, by a new owner, not
/// left held by this process with no owner (nobody else could take it).
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_swept_back_while_its_old_owner_still_stops_is_taken_up() {
    use brood_actors::failpoints;
    let (kit, dir) = (Kit::default(), tempfile::tempdir().unwrap());
    let url = pg_testkit::url();
    let schema = pg_testkit::fresh_schema();
    // One routing thread: every owner on it, so a round trip through one owner comes after
    // whatever another one was doing there.
    let config = BroodConfig::new(dir.path())
        .runners(kit.runners())
        .postgres(&url)
        .postgres_schema(&schema)
        .routing_threads(1)
        .share("a", "http://a", Duration::from_secs(3));
    let a = Brood::open(config).expect("open sharing PostgreSQL");
    open_wake(&a, "s").await;
    open_wake(&a, "t").await;
    failpoints::arm("moved_hold", 1);
    // a's heartbeat lapses (a pause) and another process, c, takes s over: a's renewal finds
    // it lost, and its owner is told (held there, not stopped yet). c holds one session besides,
    // so a's share, once s is free again, is two.
    pg_testkit::execute(
        &url,
        &format!(
            "INSERT INTO \"{schema}\".nodes (instance, node, address, expires_at)
                 VALUES ('c1', 'c', 'http://c', now() + interval '1 hour');
             INSERT INTO \"{schema}\".held_counts (instance, held) VALUES ('c1', 1);
             UPDATE \"{schema}\".nodes SET expires_at = now() - interval '1 second' WHERE node = 'a';
             UPDATE \"{schema}\".session_leases SET owner = 'c', address = 'http://c', epoch = epoch + 1,
                 instance = 'c1', expires_at = 'infinity' WHERE session = 's'::bytea"
        ),
    );
    wait_for!(
        "s's owner to be told it lost s",
        (!failpoints::armed("moved_hold")).then_some(())
    );
    // c gives s back, and a's sweep takes it.
    pg_testkit::execute(
        &url,
        &format!(
            "UPDATE \"{schema}\".session_leases SET expires_at = now() - interval '1 second' WHERE session = 's'::bytea"
        ),
    );
    wait_for!("a to take s back", held_by_a(&url, &schema).then_some(()));
    failpoints::release("moved_hold");
    // Through t's owner, on the same thread: s's old owner is done with being told by then.
    a.boundary("t", "c", LONG_LEASE).await.expect("t answers");
    wait_for!(
        "s to be served here again",
        a.sessions().contains(&"s".to_string()).then_some(())
    );
    a.shutdown();
}

/// Two processes sharing a fresh schema, "a" and "b", and session "s" opened on b.
#[cfg(feature = "failpoints")]
struct Two {
    a: Brood,
    b: Brood,
    url: String,
    schema: String,
    _kit: Kit,
    _dir: tempfile::TempDir,
}

#[cfg(feature = "failpoints")]
async fn s_served_by_b() -> Two {
    let (kit, dir) = (Kit::default(), tempfile::tempdir().unwrap());
    let url = pg_testkit::url();
    let schema = pg_testkit::fresh_schema();
    let a = sharing(&dir.path().join("a"), &kit, &url, &schema, "a", 2);
    let b = sharing(&dir.path().join("b"), &kit, &url, &schema, "b", 2);
    open_wake(&b, "s").await;
    Two {
        a,
        b,
        url,
        schema,
        _kit: kit,
        _dir: dir,
    }
}

/// Whether a holds s's tenure by the table.
#[cfg(feature = "failpoints")]
fn held_by_a(url: &str, schema: &str) -> bool {
    let sql = format!(
        "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM \"{schema}\".session_leases WHERE session = 's'::bytea \
         AND owner = 'a' AND expires_at = 'infinity') THEN RAISE EXCEPTION 'no'; END IF; END $$"
    );
    let url = url.to_string();
    std::panic::catch_unwind(move || pg_testkit::execute(&url, &sql)).is_ok()
}

/// A request's adoption that found its session served by another process, answered just after
/// a sweep of this process took the session (the other gave it back meanwhile), takes it up
/// here: it is not left held here with no owner while requests are sent to where it was.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adoption_that_found_the_session_elsewhere_as_a_sweep_took_it_takes_it_up() {
    use brood_actors::failpoints;
    let Two {
        a,
        b,
        url,
        schema,
        _kit,
        _dir,
    } = s_served_by_b().await;
    failpoints::arm("adopt_elsewhere_hold", 1);
    let (asked, ()) = tokio::join!(a.status("s"), async {
        wait_for!(
            "a's adoption to find s served by b",
            (!failpoints::armed("adopt_elsewhere_hold")).then_some(())
        );
        // b stops, giving s back; a's sweep takes it while the adoption is held.
        b.shutdown();
        wait_for!("a to hold s", held_by_a(&url, &schema).then_some(()));
        failpoints::release("adopt_elsewhere_hold");
    });
    let st = asked.expect("s is served by a, which holds it");
    assert_eq!(st.counts.info.session_id, "s");
    assert!(a.sessions().contains(&"s".to_string()), "s has no owner in a");
    a.shutdown();
}

/// A request for a session another process serves, made of a process that has not served it,
/// is answered with the holder at once: it is not held up behind the holder's commit in flight
/// (which holds the session's advisory lock shared until it commits), as taking the tenure to
/// find it held would be, and it holds up none of the holder's next commits.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_served_elsewhere_is_named_without_waiting_for_its_holders_commits() {
    let Two {
        a,
        b,
        url,
        schema,
        _kit,
        _dir,
    } = s_served_by_b().await;
    // A commit of b writing s, in flight.
    let in_flight = pg_testkit::hold_shared_lock(&url, pg_testkit::commit_lock_key(&schema, "s"));
    let asked = tokio::time::timeout(Duration::from_secs(60), a.status("s")).await;
    drop(in_flight);
    match asked {
        Ok(Err(BroodError::Moved { address, .. })) => assert_eq!(address, "http://b"),
        Ok(other) => panic!("s was not named as served by b: {other:?}"),
        Err(_) => panic!("a's answer waited for b's commit in flight"),
    }
    assert!(b.sessions().contains(&"s".to_string()), "b no longer serves s");
    a.shutdown();
    b.shutdown();
}
