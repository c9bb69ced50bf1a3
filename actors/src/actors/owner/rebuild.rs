//! An owner built from the ledger: after a process restart, or when its supervisor restarts a
//! panicked owner in-process. [`crate::recovery::plan`] decides (I6); this applies the plan to a
//! fresh owner's owed calls, capacity and router.

use super::owed::CallState;
use super::SessionOwner;
use crate::actors::Engine;
use crate::model::*;
use crate::recovery::{self, Recovery, SessionSnapshot};

impl SessionOwner {
    /// Rebuilds an owner from what an earlier process (or an earlier owner) left in the
    /// ledger, following [`recovery::plan`] (I6). Returns the rows recovery changed, for the
    /// caller to write.
    pub fn recover(
        engine: Engine,
        session: SessionRow,
        snapshot: SessionSnapshot,
        mode: Recovery,
    ) -> (Self, Vec<ChildRow>) {
        let live = if mode == Recovery::Owner {
            engine.live_children()
        } else {
            Default::default()
        };
        let wake_url = snapshot.wake_url.clone();
        let plan = recovery::plan(&session, snapshot, mode, &live, now_ms());
        let mut owner = SessionOwner::new(engine, session);
        // A nested session's child may have ended while it was not served: nothing of it
        // starts until its child's row was read (CheckParent).
        owner.awaiting_parent = nest_parent(&owner.session.session_id).is_some();
        // The nested sessions of ended children are ended as the owner starts: of those
        // recovery ended, and of those it reads ended, whose end may have been stored while no
        // owner could be told (this one being rebuilt): told again later, it finds the child
        // recorded already. Ending a nested session a second time changes nothing.
        let resolved = plan.changed.iter().filter(|r| r.status.is_terminal());
        let read = (plan.calls.iter().flat_map(|c| c.children.iter()))
            .filter(|r| r.status.is_terminal() && owner.engine.is_nested(&r.child_id));
        owner.resolved_ended = resolved.chain(read).map(|r| r.child_id.clone()).collect();
        owner.resolved_ended.sort_unstable();
        owner.resolved_ended.dedup();
        if let Some(url) = &wake_url {
            owner.bind_wake_url(url);
        }
        owner.session.next_set = plan.next_set;
        owner.owed.delivered_done = plan.delivered_done;
        for claim in plan.lost_claims {
            owner.router.remember_lost(claim);
        }
        // Maps sized once for what they will hold: growing them call by call rehashed (and
        // moved) them again and again.
        owner.owed.calls.reserve(plan.calls.len());
        owner.router.reserve(plan.ready.len());
        // A large session's calls are made a share per core, then filed here.
        let rows: usize = plan.calls.iter().map(|c| c.children.len()).sum();
        let parts = crate::parallel::threads_for(rows, plan.calls.len());
        let made = crate::parallel::in_shares(
            plan.calls,
            parts,
            |c| c.children.len(),
            |calls| {
                calls
                    .into_iter()
                    .map(|call| {
                        let units = call
                            .units
                            .into_iter()
                            .map(|u| (u.row, u.terminal, u.recorded_before_exit))
                            .collect();
                        CallState::new(call.row, units, call.children)
                    })
                    .collect::<Vec<_>>()
            },
        );
        for (state, delivered) in made.into_iter().flatten() {
            owner
                .engine
                .calls
                .insert(state.row.call_id.clone(), owner.session.session_id.clone());
            owner.owed.insert_state(state, delivered);
        }
        for id in plan.queue {
            owner.capacity.enqueue(id);
        }
        owner.owed.rowed.extend(plan.rowed);
        for id in plan.running {
            owner.capacity.mark_running(id);
        }
        // Claimable again from now on (their end was timed, if at all, when it happened).
        let now = now_ms();
        for (key, attempts) in plan.ready {
            owner.router.publish(key, attempts, now);
        }
        // A cancel the owner before this one decided for a child whose start it had sent waits
        // for that start, which died with it: a child found ended never starts again. (Only
        // this session's calls: epochs are the session's own.)
        // Those of children still to start are taken by their starts; the owner looks again as
        // it records children that end first.
        owner.inherited_cancels = owner.engine.forget_stale_cancels(owner.fence.1, |call, task| {
            let call = owner.owed.calls.get(call)?;
            Some(call.child(task).is_none_or(|r| r.status.is_terminal()))
        });
        (owner, plan.changed)
    }
}
