//! Rebuilding a session's owner from the ledger when its task ended: a panic within the
//! restart budget, or a restart asked for. The rebuild runs on a thread of its own, and an
//! outage of the ledger is waited out rather than giving the session up.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use super::recover::recover_session;
use super::Supervisor;
use crate::actors::owner::SessionOwner;
use crate::actors::supervise::{Decision, Exit};
use crate::actors::Engine;
use crate::ledger::LedgerError;
use crate::recovery::Recovery;
use crate::wake::Wake;

/// How long a session owner whose rebuild failed waits before the next attempt.
const REBUILD_RETRY: Duration = Duration::from_millis(50);

/// The longest wait between rebuilds of an owner that fail because the ledger does not answer.
const REBUILD_RETRY_MOST: Duration = Duration::from_secs(2);

impl Supervisor {
    pub(super) fn owner_exited(&mut self, id: String, exit: Exit, ctx: &mut Context<Self>) {
        let asked = self.restarting.remove(&id);
        let msg = match exit {
            Exit::Panicked(msg) => {
                tracing::error!(session = %id, "session owner panicked: {msg}");
                if !crate::actors::running(ctx) {
                    return; // the engine is stopping: nothing to restart
                }
                let decision = self.budgets.on_failure(&id, Instant::now());
                if decision == Decision::Escalate {
                    tracing::error!(session = %id, "session owner keeps failing; the session is given up");
                    self.engine.owners.remove(&id);
                    self.engine.forget_share(&id);
                    self.failed.insert(id, msg);
                    return;
                }
                msg
            }
            Exit::Stopped if asked && crate::actors::running(ctx) => "a restart was asked for".to_string(),
            Exit::Stopped => {
                self.engine.owners.remove(&id);
                return;
            }
        };
        self.rebuild(id, msg, ctx);
    }

    /// Rebuilds session `id`'s owner from the ledger (its old one ended as `msg` says). A
    /// rebuild that fails on an error of the ledger's storage (its database out of reach, as
    /// during a failover; a disk's I/O error) is tried again, `wait` later, then twice as long each time up
    /// to [`REBUILD_RETRY_MOST`], for as long as it takes: an outage of the database gives no
    /// session up. Any other failure is a failure of the owner like a panic: tried again within
    /// the restart budget, the session given up past it.
    fn rebuild(&mut self, id: String, msg: String, ctx: &mut Context<Self>) {
        self.rebuild_after(id, msg, REBUILD_RETRY, ctx);
    }

    fn rebuild_after(&mut self, id: String, msg: String, wait: Duration, ctx: &mut Context<Self>) {
        // Rebuilt on a thread of its own at a lower priority: its reads, flushes and planning
        // block neither this actor's thread nor, on a machine with few cores, the threads that
        // route the other sessions. Requests to the session meanwhile are answered as
        // interrupted (its old owner is gone), as they are while any owner restarts.
        let (engine, wake, session) = (self.engine.clone(), self.wakes.get(&id).cloned(), id.clone());
        let (tx, rx) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new().name("brood-rebuild".into()).spawn(move || {
            crate::parallel::lower_this_threads_priority();
            let _ = tx.send(rebuild_owner(&engine, &session, wake));
        });
        if let Err(e) = spawned {
            tracing::error!(session = %id, "no thread to rebuild the session owner on: {e}");
            self.engine.owners.remove(&id);
            self.failed
                .insert(id, format!("{msg}; no thread to rebuild its owner on: {e}"));
            return;
        }
        rx.into_actor(self)
            .map(move |rebuilt, act, ctx| {
                let rebuilt = rebuilt.unwrap_or_else(|_| Err(LedgerError::storage_msg("the rebuild panicked")));
                match rebuilt {
                    Ok(_) if !crate::actors::running(ctx) => {} // the engine is stopping
                    // Its tenure went to another process while it was rebuilt (the outage it
                    // waited out outlasted the tenure): not served here. The next request looks
                    // the session up again and learns where it is served.
                    Ok((owner, _)) if act.engine.tenures.as_ref().is_some_and(|t| !t.holds(&id)) => {
                        owner.stop_running_children();
                        act.engine.owners.remove(&id);
                        act.engine.forget_share(&id);
                        act.engine.supersede(&id);
                        tracing::warn!(session = %id, "session owner rebuilt after its tenure went to another process; not served here");
                    }
                    // Its tenure went to another process and came back while it was rebuilt (the
                    // other may have written meanwhile): what it read is not served; read again.
                    Ok((_, epoch)) if held_epoch(&act.engine, &id) != epoch => {
                        tracing::info!(session = %id, "the session's tenure changed hands while its owner was rebuilt; rebuilding it again");
                        act.rebuild_after(id, msg, REBUILD_RETRY, ctx);
                    }
                    Ok((owner, _)) => {
                        act.spawn_owner(owner, ctx);
                        tracing::info!(session = %id, "session owner restarted from the ledger");
                    }
                    Err(e @ LedgerError::Storage { source: Some(_), .. }) if crate::actors::running(ctx) => {
                        tracing::warn!(session = %id, retry_in = ?wait, "session owner could not be rebuilt: the ledger did not answer; trying again: {e}");
                        let next = (wait * 2).min(REBUILD_RETRY_MOST);
                        ctx.run_later(wait, move |act, ctx| act.rebuild_after(id, msg, next, ctx));
                    }
                    Err(e)
                        if crate::actors::running(ctx) && act.budgets.on_failure(&id, Instant::now()) == Decision::Restart =>
                    {
                        tracing::warn!(session = %id, "session owner could not be rebuilt; trying again: {e}");
                        ctx.run_later(REBUILD_RETRY, move |act, ctx| act.rebuild(id, msg, ctx));
                    }
                    Err(e) => {
                        tracing::error!(session = %id, "session owner could not be rebuilt: {e}");
                        act.engine.owners.remove(&id);
                        act.failed
                            .insert(id, format!("{msg}; rebuilding from the ledger failed: {e}"));
                    }
                }
            })
            .spawn(ctx);
    }
}

/// Reads one session back from the ledger for an in-process owner restart: its own rows
/// only (they are one key range), so the rebuild costs what the session holds, whatever
/// the rest of the ledger holds. The ledger is flushed first, so the rebuilt owner
/// publishes nothing that is not durable (I1).
fn rebuild_owner(
    engine: &Engine,
    id: &str,
    wake: Option<Arc<dyn Wake>>,
) -> Result<(SessionOwner, Option<u64>), LedgerError> {
    crate::failpoints::hold("rebuild_hold");
    // The epoch of the tenure the rows are read under: should it change before the rebuilt
    // owner is served, another process may have written to the session since the read.
    let epoch = held_epoch(engine, id);
    // The dead owner's write in flight lands before the read below, or never.
    engine.supersede(id);
    engine.ledger.flush()?;
    let (mut owner, _) = recover_session(engine, id, Recovery::Owner)?
        .ok_or_else(|| LedgerError::storage_msg(format!("session `{id}` has no row")))?;
    if let Some(wake) = wake {
        owner.bind_wake(wake);
    }
    crate::failpoints::hold("rebuild_read_hold");
    Ok((owner, epoch))
}

/// The epoch at which this process holds session `id`'s tenure, when it shares the ledger and
/// holds it (known here: no read).
fn held_epoch(engine: &Engine, id: &str) -> Option<u64> {
    match engine.tenures.as_ref()?.holder(id) {
        Ok(Some(crate::ledger::TenureHolder::Here(epoch))) => Some(epoch),
        _ => None,
    }
}
