//! The Unit actor: one completion unit, the supervisor of its children.
//!
//! It starts a [`Child`] for each member its owner admits (capacity is the owner's decision),
//! and stops when its owner reports the unit complete, or when it is orphaned (its owner was
//! restarted, retired or moved) and its last child stopped: while it has live children it
//! holds its own address, since they hold only weak ones. It holds no results: those travel
//! child → coalescer → owner.
//!
//! The owner runs each unit under a restart policy: a unit whose handler panicked is replaced,
//! and the children a `StartChildren` held that the unit never started are queued again (the
//! message reports them when it is dropped), so no child is lost or run twice. The children it
//! started live on without it, each registered with the engine as it starts, which is where a
//! cancel reaches them: a unit does not relay cancels (its replacement, or a rebuilt owner's
//! units, would not know a child it did not start).
//!
//! A unit runs in its own span (`unit`, with its call's and its own id) inside its owner's,
//! and starts each child in a span (`child`, with the child's id) inside its own: a child's
//! log lines, its runner's included, carry the session's, call's and child's ids.

use std::sync::Arc;

use actix::prelude::*;
use actix::WeakAddr;

use super::child::{CallIds, Child};
use super::owner::{SessionOwner, StartLost};
use super::{ChildStart, Engine};
use crate::model::{child_id, ChildRow, ShowChildId, Task};

/// Start member children (their rows already marked running). Sent without an answer: the
/// message itself reports to the owner each child it still holds when it is dropped (the unit
/// died before starting it, or was gone when it was sent), and the owner queues those again.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StartChildren {
    /// The ids the children's rows share (every child of one message is of one call).
    ids: Arc<CallIds>,
    /// The unit's ordinal k in its call (`<call>-<k>`).
    unit_k: u32,
    /// The children not started yet, each with its task.
    children: std::vec::IntoIter<(Starting, Task)>,
    /// Told of the children never started.
    owner: WeakAddr<SessionOwner>,
    /// The sending owner's epoch under its session's fence.
    epoch: u64,
}

impl StartChildren {
    /// `children` of the call `ids` names, for its unit `unit_k`, from `owner` (at `epoch`).
    pub fn new(
        ids: Arc<CallIds>,
        unit_k: u32,
        children: Vec<(Starting, Task)>,
        (owner, epoch): (WeakAddr<SessionOwner>, u64),
    ) -> Self {
        StartChildren {
            ids,
            unit_k,
            children: children.into_iter(),
            owner,
            epoch,
        }
    }
}

impl std::fmt::Debug for StartChildren {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StartChildren")
            .field("call_id", &self.ids.call_id)
            .field("unit_k", &self.unit_k)
            .field("children", &self.children.len())
            .finish()
    }
}

impl Drop for StartChildren {
    fn drop(&mut self) {
        if self.children.len() == 0 {
            return;
        }
        let owner = self.owner.upgrade();
        for (start, _) in self.children.by_ref() {
            // Never started: a cancel decided for it has nothing to wait for.
            self.ids
                .engine
                .forget_cancel(&self.ids.call_id, start.task_index, self.epoch);
            // With its owner gone, its successor queues it again: it is not among the live
            // children.
            if let Some(owner) = &owner {
                owner.do_send(StartLost {
                    child_id: child_id(&self.ids.call_id, start.task_index),
                });
            }
        }
    }
}

/// What a child needs of its row to start: the rest is its call's ([`CallIds`]) or made again
/// when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Starting {
    /// Its task's index in the call.
    pub task_index: u32,
    /// Its execution attempt.
    pub attempt: u32,
    /// When its running mark was made.
    pub started_at_ms: Option<u64>,
    /// Whether recovery replayed it.
    pub recovered: bool,
}

impl Starting {
    /// What `row` holds of it.
    pub fn of(row: &ChildRow) -> Self {
        Starting {
            task_index: row.task_index,
            attempt: row.attempt,
            started_at_ms: row.started_at_ms,
            recovered: row.recovered,
        }
    }
}

/// The unit is complete: every member is recorded; the unit actor stops.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct UnitCompleted;

/// A child of this unit stopped (its result was recorded).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct ChildStopped {
    /// The child's task index in its call.
    pub task_index: u32,
}

/// One completion unit.
pub struct Unit {
    unit_id: String,
    /// Task indexes of its members, ascending.
    tasks: Box<[u32]>,
    engine: Arc<Engine>,
    /// Its owner's address, one shared by every unit an admission started (copying an actix
    /// address allocates twice).
    owner: Arc<Addr<SessionOwner>>,
    /// Whether each member was started here and has not stopped yet, by its place in
    /// `tasks`: one slot per member, allocated once.
    children: Vec<bool>,
    /// How many of `children` are set.
    live: usize,
    /// Its own address while it has live children: a unit whose owner is gone (restarted,
    /// retired, moved) lives on until its last child stopped, and what its owner sent it last
    /// is still read. One sender per unit; its children hold only weak addresses.
    keep: Option<Addr<Unit>>,
}

impl std::fmt::Debug for Unit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unit")
            .field("unit_id", &self.unit_id)
            .field("children", &self.live)
            .finish()
    }
}

impl Unit {
    /// A unit actor for the unit `unit_id` of the members `tasks` (task indexes, ascending),
    /// owned by `owner`.
    pub fn new(unit_id: String, tasks: Box<[u32]>, engine: Arc<Engine>, owner: Arc<Addr<SessionOwner>>) -> Self {
        Unit {
            children: Vec::new(),
            live: 0,
            keep: None,
            unit_id,
            tasks,
            engine,
            owner,
        }
    }

    /// The slot of the member with task index `task` (members are ascending).
    fn slot(&mut self, task: u32) -> Option<&mut bool> {
        let at = self.tasks.binary_search(&task).ok()?;
        if self.children.is_empty() {
            self.children.resize(self.tasks.len(), false);
        }
        self.children.get_mut(at)
    }
}

impl Actor for Unit {
    type Context = Context<Self>;
}

impl Handler<StartChildren> for Unit {
    type Result = ();

    fn handle(&mut self, mut msg: StartChildren, ctx: &mut Context<Self>) {
        if crate::failpoints::fires("unit_handler") {
            panic!("injected fault: unit_handler (unit {})", self.unit_id);
        }
        crate::failpoints::hold("unit_start_hold");
        // One weak address for every child: it tells this unit when it stops, and holds no
        // sender (nor its allocation) of its own.
        let me = ctx.address().downgrade();
        for (start, task) in msg.children.by_ref() {
            let index = start.task_index;
            // Its address exists before it runs: registered with it, a cancel decided from
            // now on reaches it whoever decides it.
            let context = Context::<Child>::new();
            let addr = context.address();
            let cancelled = match self.engine.child_starting(
                &msg.ids.call_id,
                index,
                addr.downgrade(),
                (
                    || self.owner.connected() && self.engine.epoch_current(&msg.ids.session_id, msg.epoch),
                    msg.epoch,
                ),
            ) {
                // The owner that admitted this child died or was superseded; its successor
                // queues the child again (it is not among the live children), so starting it
                // here would run it twice.
                ChildStart::Refused => continue,
                ChildStart::Go => None,
                // Its cancel was decided before this start was read.
                ChildStart::Cancelled(reason) => Some(reason),
            };
            // Its span, inside this unit's (the session's and the call's ids): its handlers,
            // clocks and runner run in it. Nothing is formatted unless a subscriber records it.
            let span = tracing::info_span!("child", child_id = %ShowChildId(&msg.ids.call_id, index));
            let child = Child::new(msg.ids.clone(), msg.unit_k, start, (task, span), me.clone()).cancelled(cancelled);
            // Run without another address (each costs two allocations). Kept weak, by the
            // engine: a child lives while its runner, clocks or hand-off do, and stops itself;
            // a strong address per child would cost a sender of its own.
            actix_rt::spawn(context.into_future(child));
            drop(addr);
            match self.slot(index) {
                Some(slot) => {
                    self.live += usize::from(!std::mem::replace(slot, true));
                }
                // Not a member (an owner never sends one): it runs, unsupervised by this unit.
                None => {
                    tracing::warn!(task = index, "a child not of this unit was started here")
                }
            }
        }
        if self.live > 0 && self.keep.is_none() {
            self.keep = Some(ctx.address());
        }
    }
}

impl Handler<ChildStopped> for Unit {
    type Result = ();

    fn handle(&mut self, msg: ChildStopped, ctx: &mut Context<Self>) {
        if let Some(slot) = self.slot(msg.task_index) {
            self.live -= usize::from(std::mem::take(slot));
        }
        if self.live == 0 {
            self.keep = None;
        }
        if self.live == 0 && !self.owner.connected() {
            ctx.stop(); // orphaned: the restarted owner runs this unit through a new actor
        }
    }
}

impl Handler<UnitCompleted> for Unit {
    type Result = ();

    fn handle(&mut self, _: UnitCompleted, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
