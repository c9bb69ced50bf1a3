//! What a session owner tells others of what it applied: the session's observers (its events)
//! and, when the ready items call for it, the session's wake.

use super::SessionOwner;
use crate::events::Event;
use crate::model::*;
use crate::wake::{WakeEvent, WakeTarget};

impl SessionOwner {
    /// Tells the session's observers what was applied (built only if someone watches).
    pub(super) fn emit(&self, event: impl FnOnce() -> Event) {
        self.engine.events.emit(&self.session.session_id, event);
    }

    /// Tells observers a child's new status (its call is among the owed calls).
    pub(super) fn emit_child(&self, row: &ChildRow) {
        self.emit(|| {
            let call = self.owed.calls.get(&row.call_id);
            child_event(row, row.status, call.and_then(|c| c.row.traceparent.as_deref()))
        });
    }

    /// Tells observers a child of `call` is in `status` (a child its dispatch started at once
    /// was queued first all the same).
    pub(super) fn emit_status(&self, row: &ChildRow, status: ChildStatus, call: &CallRow) {
        self.emit(|| child_event(row, status, call.traceparent.as_deref()));
    }

    /// Tells observers the ready count when it changed since they were last told.
    pub(super) fn emit_ready(&mut self) {
        if !self.engine.events.watched(&self.session.session_id) {
            return;
        }
        let ready = self.router.ready_count(now_ms());
        if ready != self.told_ready {
            self.told_ready = ready;
            self.emit(|| Event::Ready { ready });
        }
    }

    pub(super) fn maybe_wake(&mut self) {
        let ready = self.router.ready_count(now_ms());
        if !self.wake_state.decide(self.wake_capable(), ready) {
            return;
        }
        self.engine.counters.woke();
        self.emit(|| Event::Wake { ready });
        if let Some(WakeTarget(w)) = &self.wake {
            let w = w.clone();
            let event = WakeEvent {
                session_id: self.session.session_id.clone(),
                ready,
            };
            tracing::debug!(ready, "waking session");
            // In the owner's span: the embedder's callback logs with the session's id.
            let wake = async move {
                // The embedder's callback: a panic in it is its own, never the owner's.
                if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.wake(event))) {
                    tracing::error!("the wake callback panicked: {}", crate::model::panic_message(panic));
                }
            };
            actix::spawn(tracing::Instrument::in_current_span(wake));
        }
    }
}

/// What observers are told of a child now in `status`, of a call delegated with
/// `traceparent`.
pub(super) fn child_event(row: &ChildRow, status: ChildStatus, traceparent: Option<&str>) -> Event {
    Event::Child {
        child_id: row.child_id.clone(),
        call_id: row.call_id.clone(),
        task_index: row.task_index,
        status,
        attempts: row.attempt,
        output: if status.is_terminal() { row.output.clone() } else { None },
        traceparent: traceparent.map(str::to_string),
    }
}
