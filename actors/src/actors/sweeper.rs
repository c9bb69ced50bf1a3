//! The retention sweep: reads the ledger a session at a time, in bounded pages, off every
//! actor's thread; what is old enough is decided by the policy's plain code
//! ([`crate::retention`]), and removed by the session's own owner ([`super::owner::Prune`]),
//! which keeps what it still holds in memory: nothing live is ever removed, and routing never
//! waits for a sweep.

use super::owner::{DropIfIdle, OldCall, Prune};
use super::Engine;
use crate::error::BroodError;
use crate::ledger::CallParts;
use crate::model::*;
use crate::retention::{ms, old_ack, old_call, Retention, Swept};

/// Sweeps every session once, under the engine's [`Retention`]: removes what is old enough, a
/// page at a time.
pub async fn sweep(engine: &Engine, now: u64) -> Result<Swept, BroodError> {
    let policy = &engine.retention;
    let mut sessions: Vec<String> = engine.owners.iter().map(|e| e.key().clone()).collect();
    sessions.sort();
    let mut swept = Swept::default();
    for session in sessions {
        let s = sweep_session(engine, policy, &session, now).await?;
        swept.calls += s.calls;
        swept.acks += s.acks;
        swept.sessions += s.sessions;
    }
    Ok(swept)
}

/// A retention read, off every actor's thread.
async fn read<T: Send + 'static>(
    job: impl FnOnce() -> Result<T, crate::ledger::LedgerError> + Send + 'static,
) -> Result<T, BroodError> {
    Ok(crate::ledger::off_thread("a retention read", job).await?)
}

async fn sweep_session(engine: &Engine, policy: &Retention, session: &str, now: u64) -> Result<Swept, BroodError> {
    let mut swept = Swept::default();
    let batch = policy.batch.max(1);
    let cutoff = now.saturating_sub(ms(policy.delivered).min(ms(policy.dead)));
    // Calls, oldest first: none made after the cutoff can be old enough, so the pages stop there.
    let mut after: Option<String> = None;
    loop {
        let (ledger, id, from, p) = (
            engine.ledger.clone(),
            session.to_string(),
            after.clone(),
            policy.clone(),
        );
        let (old, last, more, young) = read(move || {
            let page = ledger.calls_page(&id, from.as_deref(), batch)?;
            let more = page.len() == batch;
            let last = page.last().map(|c| c.call_id.clone());
            let mut old = Vec::new();
            let mut young = false;
            for call in page {
                if call.created_at_ms > cutoff {
                    young = true;
                    break;
                }
                let parts = ledger.call_parts(&id, &call.call_id)?;
                if old_call(&call, &parts, now, &p) {
                    old.push(old_of(&call, parts));
                }
            }
            // A call made under an idempotency key is made again, with the same id, by a
            // delegate under that key once it is removed: the ack rows naming its items go
            // with it, or they would mark the new call's items delivered.
            let keyed: std::collections::HashSet<&str> =
                (old.iter()).filter(|o| o.keyed).map(|o| o.call_id.as_str()).collect();
            let naming = if keyed.is_empty() {
                Vec::new()
            } else {
                acks_naming(&*ledger, &id, &keyed, batch)?
            };
            for o in old.iter_mut().filter(|o| o.keyed) {
                o.acks = (naming.iter())
                    .filter(|a| a.items.iter().any(|k| call_of_item(k) == Some(o.call_id.as_str())))
                    .cloned()
                    .collect();
            }
            Ok((old, last, more, young))
        })
        .await?;
        if !old.is_empty() {
            swept.calls += ask(
                engine,
                session,
                Prune {
                    calls: old,
                    acks: Vec::new(),
                },
            )
            .await?;
        }
        if young || !more {
            break;
        }
        after = last;
    }
    // Ack rows, oldest first, whose items' calls are all gone. Claim ids are made in time
    // order, so the pages stop at the first ack too young to go: the rest is younger still (or
    // goes at a later sweep).
    let mut after: Option<String> = None;
    let mut last_ack: Option<u64> = None;
    let mut stopped_young = false;
    let young_after = now.saturating_sub(ms(policy.delivered));
    loop {
        let (ledger, id, from, p) = (
            engine.ledger.clone(),
            session.to_string(),
            after.clone(),
            policy.clone(),
        );
        let (old, last, more, newest, young) = read(move || {
            let page = ledger.acks_page(&id, from.as_deref(), batch)?;
            let more = page.len() == batch;
            let last = page.last().map(|a| a.claim_id.clone());
            let newest = page.iter().map(|a| a.acked_at_ms).max();
            let mut old = Vec::new();
            let mut young = false;
            for ack in &page {
                if ack.acked_at_ms > young_after {
                    young = true;
                    break;
                }
                let mut stored = |call: &str| ledger.call(&id, call).map(|c| c.is_some()).unwrap_or(true);
                if old_ack(ack, now, &p, &mut stored) {
                    old.push(ack.claim_id.clone());
                }
            }
            Ok((old, last, more, newest, young))
        })
        .await?;
        stopped_young |= young;
        last_ack = last_ack.max(newest);
        if !old.is_empty() {
            let n = old.len();
            ask(
                engine,
                session,
                Prune {
                    calls: Vec::new(),
                    acks: old,
                },
            )
            .await?;
            swept.acks += n;
        }
        if young || !more {
            break;
        }
        after = last;
    }
    // A session with a recent ack was not idle long enough (its newest ack was not read).
    if let Some(idle) = policy.idle_session.filter(|_| !stopped_young) {
        let (ledger, id) = (engine.ledger.clone(), session.to_string());
        let any_call = read(move || Ok(!ledger.calls_page(&id, None, 1)?.is_empty())).await?;
        let msg = DropIfIdle {
            last_activity_ms: last_ack.unwrap_or(0),
            cutoff_ms: now.saturating_sub(ms(idle)),
        };
        if !any_call && ask(engine, session, msg).await? {
            swept.sessions += 1;
        }
    }
    Ok(swept)
}

/// The ids of a call's rows, for its owner to remove.
fn old_of(call: &CallRow, parts: CallParts) -> OldCall {
    OldCall {
        call_id: call.call_id.clone(),
        children: parts.children.into_iter().map(|c| c.child_id).collect(),
        dead_letters: parts.dead_letters.into_iter().map(|d| d.dedup_key).collect(),
        redrives: parts.redrives,
        starts: parts.starts,
        keyed: call.idempotency.is_some(),
        acks: Vec::new(),
    }
}

/// The call of an item's dedup key.
fn call_of_item(key: &str) -> Option<&str> {
    parse_dedup_key(key)
        .and_then(|(child, _)| parse_child_id(child))
        .map(|(call, _)| call)
}

/// The ack rows of `session` naming an item of one of `calls`, read a page at a time.
fn acks_naming(
    ledger: &dyn crate::ledger::Ledger,
    session: &str,
    calls: &std::collections::HashSet<&str>,
    batch: usize,
) -> Result<Vec<AckRow>, crate::ledger::LedgerError> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = ledger.acks_page(session, after.as_deref(), batch)?;
        let more = page.len() == batch;
        after = page.last().map(|a| a.claim_id.clone());
        out.extend(page.into_iter().filter(|a| {
            a.items
                .iter()
                .any(|k| call_of_item(k).is_some_and(|c| calls.contains(c)))
        }));
        if !more {
            return Ok(out);
        }
    }
}

/// Asks a session's owner; a session that is gone meanwhile has nothing to remove.
async fn ask<M, T>(engine: &Engine, session: &str, msg: M) -> Result<T, BroodError>
where
    M: actix::Message<Result = Result<T, BroodError>> + Send + 'static,
    T: Default + Send + 'static,
    crate::actors::owner::SessionOwner: actix::Handler<M>,
{
    match engine.owner(session) {
        Some(owner) => owner.send(msg).await.map_err(|_| BroodError::Stopped)?,
        None => Ok(T::default()),
    }
}

/// Sweeps every [`Retention::interval`] until the engine stops.
pub async fn run(engine: Engine) {
    let Some(every) = engine.retention.interval else { return };
    loop {
        tokio::time::sleep(every).await;
        match sweep(&engine, now_ms()).await {
            Ok(s) if s != Swept::default() => tracing::info!(
                calls = s.calls,
                acks = s.acks,
                sessions = s.sessions,
                "retention removed what was old"
            ),
            Ok(_) => {}
            Err(BroodError::Stopped) => return,
            Err(e) => tracing::warn!("a retention sweep failed (it runs again later): {e}"),
        }
    }
}
