//! Handing sessions over to the other processes sharing the ledger, when this one holds more
//! than its share (what and how many: [`super::balance`]).
//!
//! A handover loses nothing and delivers nothing twice:
//! 1. requests for the session that reach the supervisor from now on wait (in
//!    [`Supervisor::adopting`](super::Supervisor)), and its owner is asked to hand over
//!    ([`HandOver`]): it leaves the registry and answers once no batch of its is in flight (its
//!    writes landed, their askers answered);
//! 2. its tenure is given back at its epoch, with a `NOTIFY`: the others' sweeps take it at once;
//!    from here on no write of this process for it lands (its commits are fenced);
//! 3. its owner is told [`Moved`]: its running children are stopped, what they end with is
//!    refused, and it stops;
//! 4. the waiting requests are answered with the taker's address (forwarded there), or, when
//!    nobody took it within a moment, as lapsed (503, retried).
//!
//! The taker recovers the session as a takeover does (I6): live claims returned (an ack of one
//! made here is refused; its items come again, with the same dedup keys), children that were
//! running re-run if their task allows it. Idle sessions are handed over first, and a busy one
//! (a live claim, a child running or queued) only after [`FORCE_AFTER`] rounds found none idle.
//! A nested session moves with its parent: given back with it, naming it, for the parent's
//! taker to take.

use actix::prelude::*;

use super::balance::{self, Candidate};
use super::Supervisor;
use crate::actors::owner::{HandOver, Moved, SessionOwner};

/// Rounds in a row whose every pick was busy, after which busy sessions are handed over too.
pub(super) const FORCE_AFTER: u32 = 3;

impl Supervisor {
    /// Hands `count` sessions over (at most one round per renewal period, and none while a
    /// round is under way).
    pub(super) fn hand_over_some(&mut self, count: u64, ctx: &mut Context<Self>) {
        let Some(tenures) = self.engine.tenures.clone() else {
            return;
        };
        let now = std::time::Instant::now();
        if self.handing > 0
            || self
                .last_give
                .is_some_and(|at| now.duration_since(at) < tenures.ttl() / 3)
        {
            return;
        }
        self.last_give = Some(now);
        let mut calls: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
        for entry in self.engine.calls.iter() {
            *calls.entry(entry.value().clone()).or_default() += 1;
        }
        let candidates: Vec<Candidate> = self
            .engine
            .owners
            .iter()
            .map(|e| e.key().clone())
            .filter(|id| !self.adopting.contains_key(id) && tenures.holds(id))
            .map(|id| Candidate {
                busy: calls.get(&id).copied().unwrap_or(0),
                nested: self.engine.is_nested(&id),
                session: id,
            })
            .collect();
        let chosen = balance::pick(&candidates, count);
        if chosen.is_empty() {
            return;
        }
        let force = self.declined_rounds >= FORCE_AFTER;
        tracing::info!(
            sessions = chosen.len(),
            held = tenures.held_count(),
            force,
            "handing sessions over to balance the processes"
        );
        self.round_declined = 0;
        self.round_size = chosen.len();
        for parent in chosen {
            self.hand_over(parent, force, ctx);
        }
    }

    /// Hands `parent` over, with its nested sessions served here.
    fn hand_over(&mut self, parent: String, force: bool, ctx: &mut Context<Self>) {
        let Some(tenures) = self.engine.tenures.clone() else {
            return;
        };
        let group = nested_group(&self.engine, &parent);
        let owners: Vec<(String, Addr<SessionOwner>)> = group
            .iter()
            .filter_map(|(id, _)| self.engine.owner(id).map(|a| (id.clone(), a)))
            .collect();
        let ids: Vec<String> = group.iter().map(|(id, _)| id.clone()).collect();
        for id in &ids {
            // Requests reaching the supervisor wait for the handover to end.
            self.adopting.entry(id.clone()).or_default();
        }
        self.handing += 1;
        let asked = owners.clone();
        let first = owners.first().map(|(id, _)| id.clone());
        let accepted = async move {
            for (i, (_, owner)) in asked.iter().enumerate() {
                // The parent may decline (busy); its nested sessions go with it whatever.
                let yes = owner.send(HandOver { force: force || i > 0 }).await.unwrap_or(false);
                if i == 0 && !yes {
                    return false;
                }
            }
            !asked.is_empty()
        };
        accepted
            .into_actor(self)
            .then(move |accepted, act, _| {
                let given: Option<Vec<(String, Option<String>)>> =
                    (accepted && first.as_deref() == Some(parent.as_str())).then_some(group);
                if given.is_none() {
                    act.round_declined += 1;
                }
                let job = crate::ledger::off_thread("handing sessions over", move || match given {
                    Some(group) => tenures.hand_over(&group).map(|()| true),
                    None => Ok(false),
                });
                job.into_actor(act)
            })
            .map(move |handed, act, ctx| {
                match handed {
                    Ok(true) => {
                        // Given back: what its children end with from now on is refused.
                        for (_, owner) in &owners {
                            owner.do_send(Moved);
                        }
                    }
                    Ok(false) => {}
                    Err(e) => {
                        // Not held here any more all the same: it runs out, and is taken then.
                        tracing::warn!("handing sessions over failed (their tenures run out by themselves): {e}");
                        for (_, owner) in &owners {
                            owner.do_send(Moved);
                        }
                    }
                }
                act.end_handover(ids, ctx);
            })
            .spawn(ctx);
    }

    /// A handover ended: the requests that waited for it are answered by the owner still here
    /// (it declined), or sent where the session went.
    fn end_handover(&mut self, ids: Vec<String>, ctx: &mut Context<Self>) {
        self.handing = self.handing.saturating_sub(1);
        if self.handing == 0 {
            // A round whose every pick was busy counts towards handing busy ones over.
            if self.round_size > 0 && self.round_declined >= self.round_size {
                self.declined_rounds += 1;
            } else {
                self.declined_rounds = 0;
            }
        }
        for id in ids {
            let waiting = self.adopting.get(&id).is_some_and(|w| !w.is_empty());
            if !waiting {
                self.adopting.remove(&id);
                continue;
            }
            match self.engine.owner(&id) {
                Some(owner) => {
                    for waiter in self.adopting.remove(&id).unwrap_or_default() {
                        let _ = waiter.send(Ok(owner.clone()));
                    }
                }
                None => self.start_adoption(id, None, ctx),
            }
        }
    }
}

/// `parent` and the nested sessions served here below it (each with its parent session).
fn nested_group(engine: &crate::actors::Engine, parent: &str) -> Vec<(String, Option<String>)> {
    let nests = engine.nests();
    let mut group: Vec<(String, Option<String>)> = vec![(parent.to_string(), None)];
    let mut i = 0;
    while i < group.len() {
        let above = group[i].0.clone();
        for n in &nests {
            if n.parent_session_id == above && engine.owner(&n.session_id).is_some() {
                group.push((n.session_id.clone(), Some(above.clone())));
            }
        }
        i += 1;
    }
    group
}
