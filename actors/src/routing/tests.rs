//! The router's decisions, tested directly.

use super::*;

#[test]
fn a_bounded_claim_takes_the_oldest_ready_items_that_fit_and_leaves_the_rest_ready_in_order() {
    let mut r: Router<u32> = Router::new(3);
    for i in 0..5 {
        r.publish(i, 0, 0);
    }
    let mut asked = Vec::new();
    let c = r
        .claim_some(0, "c1".into(), 100, |k| {
            asked.push(*k);
            asked.len() <= 2
        })
        .unwrap();
    let keys: Vec<u32> = c.items.iter().map(|(k, _)| *k).collect();
    assert_eq!((keys, c.more), (vec![0, 1], true));
    // Asked of the first (which goes anyway), then until one did not fit.
    assert_eq!(asked, vec![0, 1, 2]);
    let c = r.claim(0, "c2".into(), 100).unwrap();
    let keys: Vec<u32> = c.items.iter().map(|(k, _)| *k).collect();
    assert_eq!((keys, c.more), (vec![2, 3, 4], false));
    assert!(r.claim(0, "c3".into(), 100).is_none());
}

#[test]
fn a_bounded_claim_always_takes_the_first_item_even_over_the_bound() {
    let mut r: Router<u32> = Router::new(3);
    r.publish(7, 0, 0);
    r.publish(8, 0, 0);
    let c = r.claim_some(0, "c1".into(), 100, |_| false).unwrap();
    let keys: Vec<u32> = c.items.iter().map(|(k, _)| *k).collect();
    assert_eq!((keys, c.more), (vec![7], true));
    // What was left is claimable as usual, and released items join it.
    r.apply_ack("c1");
    let c = r.claim_some(0, "c2".into(), 100, |_| false).unwrap();
    assert_eq!((c.items.len(), c.more), (1, false));
}

#[test]
fn ended_claims_are_remembered_up_to_a_bound_then_forgotten_oldest_first() {
    let mut r: Router<u32> = Router::new(3);
    for i in 0..=ENDED_MEMORY as u32 {
        r.publish(i, 0, 0);
        let c = r.claim(0, format!("claim-{i:05}"), 1_000).unwrap();
        r.apply_ack(&c.claim_id);
    }
    assert_eq!(r.ended.len(), ENDED_MEMORY);
    assert_eq!(r.ended_order.len(), ENDED_MEMORY);
    assert!(
        matches!(r.plan_ack("claim-00000"), Err(ClaimError::Unknown(_))),
        "the oldest is forgotten"
    );
    assert!(
        matches!(r.plan_ack("claim-00001"), Ok(AckPlan::Acked(1))),
        "the rest is remembered"
    );
}

#[test]
fn a_boundary_takes_everything_ready_or_nothing() {
    let mut r: Router<u32> = Router::new(8);
    assert!(r.claim(0, "c0".into(), 100).is_none());
    r.publish(1, 0, 0);
    r.publish(2, 0, 0);
    let g = r.claim(0, "c1".into(), 100).unwrap();
    assert_eq!(g.items, vec![(1, 1), (2, 1)]);
    assert!(r.claim(0, "c2".into(), 100).is_none());
}

#[test]
fn lost_claims_are_refused_and_change_nothing() {
    let mut r: Router<u32> = Router::new(8);
    r.publish(1, 0, 0);
    r.claim(0, "c1".into(), 100).unwrap();
    assert_eq!(r.tick(100).len(), 1);
    assert_eq!(r.ack("c1"), Err(ClaimError::Lost("c1".into())));
    assert_eq!(r.ready_count(100), 1);
    let g = r.claim(100, "c2".into(), 100).unwrap();
    assert_eq!(g.items, vec![(1, 2)]);
    assert_eq!(r.ack("c2").unwrap().delivered, 1);
    assert_eq!(r.ack("c2").unwrap().delivered, 1);
    assert_eq!(
        r.release(0, "c2", ReleaseReason::Busy, 0),
        Err(ClaimError::Acked("c2".into()))
    );
    assert_eq!(r.ack("zz"), Err(ClaimError::Unknown("zz".into())));
}

#[test]
fn failed_releases_back_off_and_dead_letter_past_the_limit() {
    let mut r: Router<u32> = Router::new(3);
    r.publish(7, 0, 0);
    let mut now = 0;
    for attempt in 1..=3u32 {
        let g = r.claim(now, format!("c{attempt}"), 1000).unwrap();
        assert_eq!(g.items, vec![(7, attempt)]);
        let back = r
            .release(now, &format!("c{attempt}"), ReleaseReason::Failed, 0)
            .unwrap();
        if attempt < 3 {
            assert_eq!(back.requeued, vec![(7, attempt)]);
            assert!(
                r.claim(now, "early".into(), 1000).is_none(),
                "backoff must hold the item"
            );
            now += failure_backoff_ms(attempt);
            assert_eq!(r.next_deadline(), Some(now));
        } else {
            assert_eq!(back.dead, vec![(7, 3)]);
        }
    }
    assert!(r.claim(now + 1_000_000, "last".into(), 1000).is_none());
}

#[test]
fn a_revived_dead_item_is_ready_with_its_attempts_afresh_and_nothing_else_revives() {
    let mut r: Router<u32> = Router::new(1);
    r.publish(7, 0, 0);
    r.claim(0, "c1".into(), 1000).unwrap();
    let back = r.release(0, "c1", ReleaseReason::Failed, 0).unwrap();
    assert_eq!(back.dead, vec![(7, 1)]);
    assert!(r.revive(7, 0));
    assert!(!r.revive(7, 0), "ready already");
    let g = r.claim(0, "c2".into(), 1000).unwrap();
    assert_eq!(g.items, vec![(7, 1)], "the first attempt again");
    r.apply_ack("c2");
    assert!(!r.revive(7, 0), "a delivered item is not revived");
    assert!(r.revive(9, 0), "an item the router does not hold is published");
    assert_eq!(r.ready_count(0), 1);
}

#[test]
fn an_item_is_ready_since_it_was_published_or_revived_whatever_releases_came_between() {
    let mut r: Router<u32> = Router::new(2);
    assert_eq!(r.ready_since(&7), None);
    r.publish(7, 0, 10);
    r.claim(20, "c1".into(), 1000).unwrap();
    r.release(30, "c1", ReleaseReason::Failed, 0).unwrap();
    assert_eq!(r.ready_since(&7), Some(10), "a failed delivery attempt keeps it");
    assert!(!r.publish(7, 0, 40));
    assert_eq!(r.ready_since(&7), Some(10), "publishing it again changes nothing");
    r.claim(1000, "c2".into(), 1000).unwrap();
    r.release(1010, "c2", ReleaseReason::Failed, 0).unwrap();
    assert!(r.revive(7, 2000));
    assert_eq!(r.ready_since(&7), Some(2000), "a redrive makes it ready anew");
}

#[test]
fn backoff_doubles_and_caps() {
    assert_eq!(failure_backoff_ms(1), 100);
    assert_eq!(failure_backoff_ms(2), 200);
    assert_eq!(failure_backoff_ms(30), 60_000);
}

#[test]
fn wakes_once_per_idle_period() {
    let mut w = WakeState::default();
    assert!(!w.decide(false, 3));
    assert!(w.decide(true, 1));
    assert!(!w.decide(true, 5));
    w.set_turn(Turn::Busy);
    assert!(!w.decide(true, 5));
    w.set_turn(Turn::Idle);
    assert!(w.decide(true, 5));
    w.boundary();
    assert!(!w.decide(true, 0));
    assert!(w.decide(true, 1));
}

#[test]
fn capacity_admits_in_order_up_to_the_limit() {
    let mut c = Capacity::new(2);
    for k in 0..5 {
        c.enqueue(k);
    }
    assert_eq!(c.admit(), vec![0, 1]);
    assert!(c.admit().is_empty());
    c.finish(&1);
    assert_eq!(c.admit(), vec![2]);
    assert_eq!((c.running(), c.queued()), (2, 2));
}

#[test]
fn units_publish_whole_with_early_failure_notices() {
    assert_eq!(on_child_end(1, 3, true), Publish::FailureNotice);
    assert_eq!(on_child_end(2, 3, false), Publish::Nothing);
    assert_eq!(on_child_end(3, 3, true), Publish::UnitComplete);
}
