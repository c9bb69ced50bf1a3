//! A session moving to another process sharing the ledger: handed over when this process holds
//! more than its share, or taken over when its tenure was lost. Either way its running
//! children are stopped and the owner stops once no batch of its is in flight.

use actix::prelude::*;

use super::{HandOver, Moved, SessionOwner, HANDOVER_PATIENCE};
use crate::model::*;

impl Handler<Moved> for SessionOwner {
    type Result = ();

    fn handle(&mut self, _: Moved, ctx: &mut Context<Self>) {
        self.moved(ctx);
    }
}

impl Handler<HandOver> for SessionOwner {
    type Result = ResponseFuture<bool>;

    fn handle(&mut self, msg: HandOver, ctx: &mut Context<Self>) -> Self::Result {
        let under_way = self.router.claimed_count() + self.capacity.running() + self.capacity.queued();
        if self.moved || !crate::actors::running(ctx) || (!msg.force && under_way > 0) {
            return Box::pin(async { false });
        }
        // Requests from now on look the session up again, and wait for the handover.
        let me = ctx.address();
        self.engine.owners.remove_if(&self.session.session_id, |_, a| *a == me);
        self.handing_over = true;
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.answer_when_settled(tx, std::time::Instant::now() + HANDOVER_PATIENCE, ctx);
        Box::pin(async move { rx.await.unwrap_or(false) })
    }
}

impl SessionOwner {
    /// Answers a handover once no batch of this owner's is in flight (its writes landed, and
    /// their askers were answered), or at `deadline`.
    fn answer_when_settled(
        &mut self,
        tx: tokio::sync::oneshot::Sender<bool>,
        deadline: std::time::Instant,
        ctx: &mut Context<Self>,
    ) {
        if !self.persist.busy() || std::time::Instant::now() >= deadline {
            let _ = tx.send(!self.moved);
            return;
        }
        ctx.run_later(std::time::Duration::from_millis(5), move |act, ctx| {
            act.answer_when_settled(tx, deadline, ctx)
        });
    }

    /// The session's tenure was lost (or handed over): its children are stopped (what they end
    /// with is not recorded: the ledger refuses it), this owner's writes refused from now on,
    /// and it stops.
    pub(super) fn moved(&mut self, ctx: &mut Context<Self>) {
        if !crate::actors::running(ctx) || self.moved {
            return;
        }
        crate::failpoints::hold("moved_hold");
        let id = self.session.session_id.clone();
        if self.handing_over {
            tracing::info!("the session was handed over to another process; it is no longer served here");
        } else {
            tracing::warn!("the session's tenure was taken over by another process; it is no longer served here");
        }
        self.stop_running_children();
        self.engine.forget_share(&id);
        // Requests from now on look the session up again, and learn where it is served.
        let me = ctx.address();
        self.engine.owners.remove_if(&id, |_, a| *a == me);
        self.moved = true;
        if !self.persist.busy() {
            self.engine.supersede(&id);
            ctx.stop();
        }
        // Else once the batch in flight was answered (refused: its rows were fenced).
    }

    /// Stops the children of this session running in this process, whose session another
    /// process serves now (what they end with is refused anyway), without waiting for them.
    pub(crate) fn stop_running_children(&self) {
        for call in self.owed.calls.values() {
            let running = call.children().filter(|c| c.status == ChildStatus::Running);
            let tasks: Vec<u32> = running.map(|c| c.task_index).collect();
            if !tasks.is_empty() {
                // Not waited for: what they end with is refused anyway.
                drop(self.engine.cancel_running(
                    &call.row.call_id,
                    tasks,
                    "the session moved to another process",
                    self.fence.1,
                ));
            }
        }
    }
}
