//! How the sessions of a shared ledger are spread over the processes that serve them: plain
//! decisions the supervisor acts on at each sweep (how many free sessions this process may
//! take, how many it hands over, and which). It reads nothing and writes nothing: the counts
//! come from one statement of the ledger ([`Spread`]), the sessions from the supervisor.
//!
//! - **Fair share.** With N live processes and M sessions, a process's share is ⌈M/N⌉, and
//!   its slack a tenth of M/N: a sweep takes free sessions only up to ⌊M/N⌋ while the
//!   processes below it need more than is free, then up to the share, so the sessions of a
//!   process that died are spread over the survivors, and no joiner takes what another needs.
//! - **Giving.** A process holding more than its share plus the slack hands the excess over,
//!   a few at a time ([`give_per_round`]). So does the fullest, when above M/N while another
//!   holds less than M/N less the slack (a joining process pulls from the fullest; one that
//!   took its ⌈M/N⌉ while another still holds more does not hand any on; several tied at the
//!   top each hand over their part of the shortfall, as their sweeps may read the counts at
//!   once: the first of them in instance order one more each while its remainder lasts).
//!   Nothing is given while free sessions wait to be taken: counts are settling.
//! - **Settled** (nobody gives, nothing is free): every process holds within a tenth of M/N
//!   plus one of M/N (the tests hold the decisions to it).

use crate::ledger::Spread;

/// What one sweep of this process does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The most free sessions it may take.
    pub(crate) take: u64,
    /// How many of its sessions it hands over.
    pub(crate) give: u64,
}

/// The fair share of one of `nodes` processes serving `sessions` sessions: ⌈M/N⌉.
pub(crate) fn fair_share(sessions: u64, nodes: u64) -> u64 {
    sessions.div_ceil(nodes.max(1))
}

/// How far above its share a process may hold before it gives sessions back: a tenth of M/N.
pub(crate) fn slack(sessions: u64, nodes: u64) -> u64 {
    sessions / (10 * nodes.max(1))
}

/// The most sessions a process with share `share` hands over in one round (one renewal
/// period): a few, a quarter of its share when that is more, so a large spread settles in a
/// few rounds (a process that joined two holding every session gets its share in eight) and a
/// small one without thrash.
pub(crate) fn give_per_round(share: u64) -> u64 {
    (share / 4).max(4)
}

/// What a process holding `here` sessions does, given what the others hold and what is free.
pub(crate) fn plan(spread: &Spread, here: u64) -> Plan {
    let nodes = spread.others.len() as u64 + 1;
    let sessions = here + spread.others.iter().sum::<u64>() + spread.free;
    let share = fair_share(sessions, nodes);
    let slack = slack(sessions, nodes);
    let floor = sessions / nodes;
    // Up to ⌊M/N⌋ while any process (this one too) is below it by more than the sessions free,
    // then up to ⌈M/N⌉: a joiner never takes what another joiner needs, so none is left to be
    // pulled up by one that took (a session would move twice).
    let short: u64 = spread
        .others
        .iter()
        .chain(std::iter::once(&here))
        .map(|&h| floor.saturating_sub(h))
        .sum();
    let take = if spread.free > short {
        share.saturating_sub(here)
    } else {
        floor.saturating_sub(here)
    };
    let lowest = spread.others.iter().copied().min();
    let excess = if here > share + slack {
        here - share
    } else if here > floor
        && lowest.is_some_and(|l| l < floor.saturating_sub(slack))
        && spread.others.iter().all(|&o| o <= here)
    {
        // Another is below the bound: the fullest pull it up, down to M/N (not one that took
        // its ⌈M/N⌉ while another still holds more: that one gives, and no session moves twice).
        // Several fullest (tied) share the pull-up, as they may read the counts at once: each
        // gives its part, the first ones (in the order every process agrees on) one more each
        // while the shortfall's remainder lasts.
        let before = |i: usize| spread.others_before.get(i).copied().unwrap_or(false);
        let tied = spread.others.iter().enumerate().filter(|&(_, &o)| o == here);
        let (fullest, ahead) = tied.fold((1u64, 0u64), |(n, a), (i, _)| (n + 1, a + u64::from(before(i))));
        let short = floor - lowest.unwrap_or(floor);
        (here - floor).min(short / fullest + u64::from(ahead < short % fullest))
    } else {
        0
    };
    let give = if spread.free > 0 {
        0
    } else {
        excess.min(give_per_round(share))
    };
    Plan { take, give }
}

/// A session this process serves, as a candidate to hand over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// The session.
    pub(crate) session: String,
    /// How much is under way in it here: calls not settled, live claims. 0 is idle.
    pub(crate) busy: usize,
    /// A nested session: it moves with its parent, never on its own.
    pub(crate) nested: bool,
}

/// Which `count` sessions to hand over: top-level ones, the idlest first (their handover
/// returns no claim and interrupts no child), then by id.
pub(crate) fn pick(candidates: &[Candidate], count: u64) -> Vec<String> {
    let mut top: Vec<&Candidate> = candidates.iter().filter(|c| !c.nested).collect();
    top.sort_by(|a, b| a.busy.cmp(&b.busy).then_with(|| a.session.cmp(&b.session)));
    top.into_iter()
        .take(usize::try_from(count).unwrap_or(usize::MAX))
        .map(|c| c.session.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `held` is within a tenth plus one of M/N (M `sessions`, N `nodes`): what a
    /// settled spread keeps every process to.
    fn within_bound(held: u64, sessions: u64, nodes: u64) -> bool {
        let mean = sessions as f64 / nodes.max(1) as f64;
        (held as f64 - mean).abs() <= mean / 10.0 + 1.0
    }

    fn spread(others: &[u64], free: u64) -> Spread {
        Spread {
            others: others.to_vec(),
            free,
            ..Spread::default()
        }
    }

    /// What process `i` of those holding `held` reads, with `free` free: the others in order,
    /// those of a lower index first in the order every process agrees on.
    fn seen_by(held: &[u64], i: usize, free: u64) -> Spread {
        let others = (0..held.len()).filter(|&j| j != i);
        Spread {
            others: others.clone().map(|j| held[j]).collect(),
            others_before: others.map(|j| j < i).collect(),
            free,
            ..Spread::default()
        }
    }

    #[test]
    fn the_share_is_the_ceiling_of_sessions_over_processes() {
        assert_eq!(fair_share(60, 3), 20);
        assert_eq!(fair_share(61, 3), 21);
        assert_eq!(fair_share(0, 3), 0);
        assert_eq!(fair_share(5, 0), 5, "no live process counted: this one");
    }

    #[test]
    fn a_sweep_takes_free_sessions_only_up_to_the_share() {
        // A dead process's 30 sessions, two survivors holding 15 each: each takes up to 30.
        assert_eq!(plan(&spread(&[15], 30), 15).take, 15);
        // A lone process takes everything.
        assert_eq!(plan(&spread(&[], 60), 0).take, 60);
        // At or over its share: nothing.
        assert_eq!(plan(&spread(&[10], 0), 30).take, 0);
    }

    #[test]
    fn a_process_over_its_share_and_slack_gives_a_few_per_round() {
        // 60 sessions held by one, two joined: share 20, give at most 5 a round.
        let p = plan(&spread(&[0, 0], 0), 60);
        assert_eq!(p, Plan { take: 0, give: 5 });
        // A small share still gives a few.
        assert_eq!(plan(&spread(&[0, 0], 0), 24).give, 4);
        // Within the slack: nothing given.
        assert_eq!(plan(&spread(&[19, 19], 0), 22).give, 0);
        // A large spread gives a quarter of the share a round.
        assert_eq!(plan(&spread(&[0], 0), 800).give, 100);
    }

    #[test]
    fn nothing_is_given_while_sessions_wait_to_be_taken() {
        assert_eq!(plan(&spread(&[0, 0], 4), 56).give, 0);
    }

    #[test]
    fn a_process_below_the_bound_pulls_from_one_above_the_mean() {
        // 101 sessions over 11: ten hold 10, the new one 1; those above M/N (9) give.
        let p = plan(&spread(&[10, 10, 10, 10, 10, 10, 10, 10, 10, 1], 0), 10);
        assert_eq!(p.give, 1);
        // Nobody below the bound: nothing.
        assert_eq!(plan(&spread(&[10, 10, 9], 0), 10).give, 0);
        // 1,000 over three: one joining took its ⌈M/N⌉ (334) while the first still holds more
        // than its share; the first pulls the other up, the one that took does not.
        assert_eq!(plan(&spread(&[600, 66], 0), 334).give, 0);
        assert_eq!(plan(&spread(&[334, 66], 0), 600).give, 83);
    }

    #[test]
    fn the_fullest_processes_tied_share_the_pull_up() {
        // 43 over four: three hold 12 (within the slack of their share), one 7, short of
        // ⌊M/N⌋ by 3: each of the three gives one, not two (six given for three needed, and
        // three sessions moved again).
        assert_eq!(plan(&seen_by(&[12, 12, 12, 7], 0, 0), 12).give, 1);
        assert_eq!(plan(&seen_by(&[12, 12, 12, 7], 2, 0), 12).give, 1);
        // 18 over four, short by one: only the first of the three tied gives it.
        let gives: Vec<u64> = (0..3).map(|i| plan(&seen_by(&[5, 5, 5, 3], i, 0), 5).give).collect();
        assert_eq!(gives, [1, 0, 0]);
        // Alone at the top, the fullest pulls the whole shortfall.
        assert_eq!(plan(&seen_by(&[11, 11, 12, 7], 2, 0), 12).give, 2);
    }

    #[test]
    fn the_idlest_top_level_sessions_are_picked() {
        let c = |s: &str, busy, nested| Candidate {
            session: s.into(),
            busy,
            nested,
        };
        let candidates = [
            c("b", 2, false),
            c("a", 0, false),
            c("n", 0, true),
            c("c", 0, false),
            c("d", 1, false),
        ];
        assert_eq!(pick(&candidates, 3), ["a", "c", "d"]);
        assert_eq!(
            pick(&candidates, 9),
            ["a", "c", "d", "b"],
            "a nested session is never picked alone"
        );
    }

    /// A stream of pseudo-random numbers from `seed` (not 0): the models' orders of play.
    fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        }
    }

    /// Runs rounds of the decisions over processes holding `held` until nobody gives and
    /// nothing is free (takers in a shifting order, reading the counts as they are); returns
    /// the settled holdings.
    fn settle(mut held: Vec<u64>, mut free: u64, seed: u64) -> Vec<u64> {
        let mut next = xorshift(seed);
        let n = held.len();
        // Whether each process took sessions: when none were free to begin with (processes
        // joining), one that did never hands any on (each session moves once, from a process
        // over its share to one under it).
        let once = free == 0;
        let mut took = vec![false; n];
        for _ in 0..10_000 {
            let settled = (0..n).all(|i| plan(&seen_by(&held, i, free), held[i]).give == 0);
            if settled && free == 0 {
                return held;
            }
            // Each process in turn, from a random start.
            let start = (next() % n as u64) as usize;
            for k in 0..n {
                let i = (start + k) % n;
                let p = plan(&seen_by(&held, i, free), held[i]);
                let taken = p.take.min(free);
                held[i] += taken;
                free -= taken;
                assert!(
                    !once || p.give == 0 || !took[i],
                    "process {i} took sessions and hands {} on: {held:?} free {free}",
                    p.give
                );
                took[i] |= taken > 0;
                held[i] -= p.give;
                free += p.give;
            }
        }
        panic!("never settled: {held:?} free {free}");
    }

    /// As [`settle`], but every process of a round plans from the counts as they were when the
    /// round began (their sweeps read them at once), gives, and then takes in a shifting order;
    /// returns the settled holdings and how many sessions were given in all.
    fn settle_at_once(mut held: Vec<u64>, mut free: u64, seed: u64) -> (Vec<u64>, u64) {
        let mut next = xorshift(seed);
        let n = held.len();
        let mut given = 0;
        for _ in 0..10_000 {
            let plans: Vec<Plan> = (0..n).map(|i| plan(&seen_by(&held, i, free), held[i])).collect();
            if free == 0 && plans.iter().all(|p| p.give == 0) {
                return (held, given);
            }
            let start = (next() % n as u64) as usize;
            for k in 0..n {
                let i = (start + k) % n;
                held[i] -= plans[i].give;
                free += plans[i].give;
                given += plans[i].give;
            }
            for k in 0..n {
                let i = (start + k) % n;
                let taken = plans[i].take.min(free);
                held[i] += taken;
                free -= taken;
            }
        }
        panic!("never settled: {held:?} free {free}");
    }

    #[test]
    fn sweeps_reading_the_counts_at_once_move_each_session_once() {
        // Joiners only (nothing free at first): what must move, and what did.
        let cases: Vec<Vec<u64>> = vec![
            vec![10, 10, 0],
            vec![12, 12, 12, 0],
            vec![500, 500, 0, 0],
            vec![334, 333, 333, 0],
            vec![100, 100, 100, 100, 0],
            vec![12, 12, 12, 7],
            vec![5, 5, 5, 3],
            vec![4, 4, 4, 4, 4, 2],
        ];
        for held in cases {
            let sessions: u64 = held.iter().sum();
            let nodes = held.len() as u64;
            let needed: u64 = held.iter().map(|&h| (sessions / nodes).saturating_sub(h)).sum();
            for seed in 1..20u64 {
                let (settled, given) = settle_at_once(held.clone(), 0, seed * 7919);
                assert_eq!(settled.iter().sum::<u64>(), sessions, "none lost");
                for h in &settled {
                    assert!(within_bound(*h, sessions, nodes), "{held:?} settled to {settled:?}");
                }
                assert!(
                    given <= needed,
                    "{held:?}: {given} sessions moved for {needed} needed (settled to {settled:?})"
                );
            }
        }
    }

    #[test]
    fn sweeps_reading_the_counts_at_once_pull_up_with_no_more_moves_than_needed() {
        // Random spreads where only pull-ups move sessions (nobody above its share and slack).
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        let mut tried = 0;
        while tried < 2_000 {
            let n = 2 + (next() % 7) as usize;
            let held: Vec<u64> = (0..n).map(|_| next() % 40).collect();
            let sessions: u64 = held.iter().sum();
            let nodes = n as u64;
            let (share, slack) = (fair_share(sessions, nodes), slack(sessions, nodes));
            if held.iter().any(|&h| h > share + slack) {
                continue;
            }
            tried += 1;
            let needed: u64 = held.iter().map(|&h| (sessions / nodes).saturating_sub(h)).sum();
            let (settled, given) = settle_at_once(held.clone(), 0, next() | 1);
            assert_eq!(settled.iter().sum::<u64>(), sessions, "none lost");
            assert!(
                given <= needed,
                "{held:?}: {given} sessions moved for {needed} needed (settled to {settled:?})"
            );
        }
    }

    #[test]
    fn a_settled_spread_keeps_every_process_within_a_tenth_and_one_of_the_mean() {
        let cases: Vec<(Vec<u64>, u64)> = vec![
            (vec![60, 0, 0], 0),
            (vec![60, 0], 0),
            (vec![20, 20, 0], 20),
            (vec![0, 0, 0], 61),
            (vec![1000, 0, 0, 0, 0, 0, 0], 0),
            (vec![10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 0], 1),
            (vec![3, 0, 0, 0, 0], 0),
            (vec![0, 0], 1),
            (vec![500, 20, 7], 333),
            (vec![1000, 0, 0], 0),
            (vec![500, 500, 0, 0], 0),
            (vec![334, 333, 333, 0], 0),
            (vec![7, 0, 0], 0),
            (vec![10, 0, 0, 0], 0),
            (vec![2005, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 0),
        ];
        for (held, free) in cases {
            let sessions: u64 = held.iter().sum::<u64>() + free;
            let nodes = held.len() as u64;
            for seed in 1..20u64 {
                let settled = settle(held.clone(), free, seed * 7919);
                assert_eq!(settled.iter().sum::<u64>(), sessions, "none lost");
                for h in &settled {
                    assert!(
                        within_bound(*h, sessions, nodes),
                        "{held:?} + {free} free settled to {settled:?}: {h} is out of bound"
                    );
                }
            }
        }
    }
}
