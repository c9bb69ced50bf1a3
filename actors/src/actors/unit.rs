//! The Unit actor: one completion unit, the supervisor of its children.
//!
//! It starts a [`Child`] for each member its owner admits (capacity is the owner's decision),
//! forwards cancellation to the children still running, and stops when its owner reports the
//! unit complete. It holds no results: those travel child → coalescer → owner.

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;

use super::child::{Cancel, Child};
use super::coalescer::Coalescer;
use super::owner::SessionOwner;
use crate::model::{ChildRow, Task, UnitRow};
use crate::runner::RunnerFactory;

/// Start one member child (its row already marked running).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct StartChild {
    /// The child's row.
    pub row: ChildRow,
    /// Its task.
    pub task: Task,
}

/// Cancel every child of the unit that is still running.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct CancelUnit;

/// The unit is complete: every member is recorded; the unit actor stops.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct UnitComplete;

/// One completion unit.
pub struct Unit {
    row: UnitRow,
    factory: Arc<dyn RunnerFactory>,
    coalescer: Addr<Coalescer>,
    owner: Addr<SessionOwner>,
    children: HashMap<String, Addr<Child>>,
}

impl std::fmt::Debug for Unit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unit")
            .field("unit_id", &self.row.unit_id)
            .field("children", &self.children.len())
            .finish()
    }
}

impl Unit {
    /// A unit actor for `row`.
    pub fn new(
        row: UnitRow,
        factory: Arc<dyn RunnerFactory>,
        coalescer: Addr<Coalescer>,
        owner: Addr<SessionOwner>,
    ) -> Self {
        Unit {
            row,
            factory,
            coalescer,
            owner,
            children: HashMap::new(),
        }
    }
}

impl Actor for Unit {
    type Context = Context<Self>;
}

impl Handler<StartChild> for Unit {
    type Result = ();

    fn handle(&mut self, msg: StartChild, _: &mut Context<Self>) {
        let id = msg.row.child_id.clone();
        let child = Child::new(
            msg.row,
            msg.task,
            self.factory.clone(),
            self.coalescer.clone(),
            self.owner.clone(),
        );
        self.children.insert(id, child.start());
    }
}

impl Handler<CancelUnit> for Unit {
    type Result = ();

    fn handle(&mut self, _: CancelUnit, _: &mut Context<Self>) {
        self.children.retain(|_, child| child.connected());
        for child in self.children.values() {
            child.do_send(Cancel);
        }
    }
}

impl Handler<UnitComplete> for Unit {
    type Result = ();

    fn handle(&mut self, _: UnitComplete, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
