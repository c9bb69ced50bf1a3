//! A recovered nested session's check of its child: whether the child it is named after ended
//! while the session was not served (its owner rebuilt, the session taken over or served
//! nowhere), read from the ledger once the owner is registered.

use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;

use super::{Durable, SessionOwner};
use crate::model::*;

/// Sent to a recovered nested session's owner once it is registered as its session's owner:
/// the owner reads its child's stored row, and ends itself if that child ended. Its child may
/// have ended while no owner could be told (its owner was being rebuilt, the session was being
/// taken over or served nowhere, or the end reached an owner that died before it acted): the end
/// is stored before it is told, and it is told to whichever owner is registered then, so one
/// that registered later reads it.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct CheckParent;

/// How long a failed read of a nested session's child waits to be tried again.
const CHECK_PARENT_RETRY: Duration = Duration::from_secs(1);

impl Handler<CheckParent> for SessionOwner {
    type Result = ();

    fn handle(&mut self, _: CheckParent, ctx: &mut Context<Self>) {
        let session = self.session.session_id.clone();
        let Some((call_id, _)) = nest_parent(&session).filter(|_| self.parent_ended.is_none()) else {
            return self.parent_read(ctx);
        };
        let (call_id, parent) = (
            call_id.to_string(),
            self.engine.nest(&session).map(|n| n.parent_session_id),
        );
        let ledger = self.engine.ledger.clone();
        let child = session.clone();
        let read = crate::ledger::off_thread("reading a nested session's child", move || {
            let call = match parent {
                Some(parent) => ledger.call(&parent, &call_id)?,
                None => ledger.find_call(&call_id)?,
            };
            let row = match &call {
                Some(call) => ledger.child(&call.session_id, &child)?,
                None => None,
            };
            Ok(stored_child_ended(call.as_ref(), row.as_ref()))
        });
        read.into_actor(self)
            .map(move |ended, act, ctx| match ended {
                Ok(true) if act.parent_ended.is_none() => {
                    tracing::info!("a nested session's child ended while it was not served: it is ended now");
                    let reason = parent_ended_reason(&session);
                    // Refuses calls from now on, and admits nothing: its calls are cancelled.
                    act.parent_ended = Some(reason.clone());
                    let (tx, _) = oneshot::channel();
                    act.submit(Durable::EndNested(reason, tx), ctx);
                    act.parent_read(ctx);
                }
                Ok(_) => act.parent_read(ctx),
                Err(e) => {
                    // Not read: its children are not held back for it (the read is tried again).
                    tracing::warn!("reading a nested session's child failed (tried again soon): {e}");
                    act.parent_read(ctx);
                    ctx.notify_later(CheckParent, CHECK_PARENT_RETRY);
                }
            })
            .spawn(ctx);
    }
}

impl SessionOwner {
    /// Its nested session's child was read (or could not be): admission goes on.
    fn parent_read(&mut self, ctx: &mut Context<Self>) {
        if std::mem::take(&mut self.awaiting_parent) {
            self.admit(ctx);
            self.after_change(ctx);
        }
    }
}
