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

/// Sessions whose oldest rows are read at once.
const OLDEST_BATCH: usize = 1_000;

/// Sweeps every session once, under the engine's [`Retention`]: removes what is old enough, a
/// page at a time. The oldest call and ack row of many sessions are read at once first
/// ([`crate::ledger::Ledger::oldest_rows`]): a session whose oldest rows are too young to go (most
/// of them, most of the time) is read no further, so an idle engine's sweep costs a few
/// statements per thousand sessions.
pub async fn sweep(engine: &Engine, now: u64) -> Result<Swept, BroodError> {
    let policy = &engine.retention;
    let mut sessions: Vec<String> = engine.owners.iter().map(|e| e.key().clone()).collect();
    sessions.sort();
    let mut swept = Swept::default();
    for batch in sessions.chunks(OLDEST_BATCH) {
        let (ledger, ids) = (engine.ledger.clone(), batch.to_vec());
        let oldest = read(move || ledger.oldest_rows(&ids)).await?;
        for o in oldest {
            let s = match first_look(policy, &o, now) {
                FirstLook::Sweep => sweep_session(engine, policy, &o.session_id, now).await?,
                FirstLook::DropIfIdle(msg) => Swept {
                    sessions: usize::from(ask(engine, &o.session_id, msg).await?),
                    ..Swept::default()
                },
                FirstLook::Nothing => Swept::default(),
            };
            swept.calls += s.calls;
            swept.acks += s.acks;
            swept.sessions += s.sessions;
        }
    }
    Ok(swept)
}

/// What a sweep does with a session, given its oldest call and ack row.
#[derive(Debug)]
enum FirstLook {
    /// Something may be old enough: its pages are read.
    Sweep,
    /// No call and no ack row: its owner drops it if it has been idle long enough.
    DropIfIdle(DropIfIdle),
    /// Nothing is old enough.
    Nothing,
}

/// Decides, from a session's oldest call and ack row, what [`sweep_session`] would come to
/// without reading its pages when nothing in them is old enough: its oldest call was made after
/// the cutoff (so is every later one), and its oldest ack is too young to go (so is every later
/// one, and the session is not idle). A session with neither drops if idle, with no activity
/// known, as [`sweep_session`] asks.
fn first_look(policy: &Retention, oldest: &crate::ledger::OldestRows, now: u64) -> FirstLook {
    let cutoff = now.saturating_sub(ms(policy.delivered).min(ms(policy.dead)));
    let young_after = now.saturating_sub(ms(policy.delivered));
    let old_call = oldest.call.as_ref().is_some_and(|c| c.created_at_ms <= cutoff);
    let old_ack = oldest.ack.as_ref().is_some_and(|a| a.acked_at_ms <= young_after);
    if old_call || old_ack {
        return FirstLook::Sweep;
    }
    match policy.idle_session {
        Some(idle) if oldest.call.is_none() && oldest.ack.is_none() => FirstLook::DropIfIdle(DropIfIdle {
            last_activity_ms: 0,
            cutoff_ms: now.saturating_sub(ms(idle)),
        }),
        _ => FirstLook::Nothing,
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::OldestRows;
    use std::time::Duration;

    const DAY: u64 = 24 * 60 * 60 * 1000;
    const NOW: u64 = 100 * DAY;

    fn oldest(call_at: Option<u64>, ack_at: Option<u64>) -> OldestRows {
        OldestRows {
            session_id: "s".into(),
            call: call_at.map(|at| CallRow {
                created_at_ms: at,
                ..crate::ledger::conformance::call_row("s", "deleg_c", 1)
            }),
            ack: ack_at.map(|at| AckRow {
                claim_id: "clm_1".into(),
                session_id: "s".into(),
                items: Vec::new(),
                acked_at_ms: at,
            }),
        }
    }

    fn look(policy: &Retention, call_at: Option<u64>, ack_at: Option<u64>) -> &'static str {
        match first_look(policy, &oldest(call_at, ack_at), NOW) {
            FirstLook::Sweep => "sweep",
            FirstLook::DropIfIdle(_) => "drop if idle",
            FirstLook::Nothing => "nothing",
        }
    }

    #[test]
    fn a_session_whose_oldest_rows_are_young_is_read_no_further() {
        let policy = Retention::default(); // delivered after 7 days, dead after 30
        let young = Some(NOW - DAY);
        assert_eq!(look(&policy, young, young), "nothing");
        assert_eq!(look(&policy, None, None), "nothing", "no idle policy: kept");
        // A call older than the smaller of the two ages may go: its pages are read.
        assert_eq!(look(&policy, Some(NOW - 8 * DAY), young), "sweep");
        assert_eq!(look(&policy, young, Some(NOW - 8 * DAY)), "sweep");
        assert_eq!(look(&policy, Some(NOW - 7 * DAY), None), "sweep", "at the cutoff");
    }

    #[test]
    fn a_session_with_no_call_and_no_ack_is_offered_to_drop_if_idle() {
        let policy = Retention {
            idle_session: Some(Duration::from_secs(60)),
            ..Retention::default()
        };
        assert_eq!(look(&policy, None, None), "drop if idle");
        let FirstLook::DropIfIdle(msg) = first_look(&policy, &oldest(None, None), NOW) else {
            panic!("not offered");
        };
        assert_eq!((msg.last_activity_ms, msg.cutoff_ms), (0, NOW - 60_000));
        // A young ack row is activity; a young call is not idle.
        assert_eq!(look(&policy, None, Some(NOW - DAY)), "nothing");
        assert_eq!(look(&policy, Some(NOW - DAY), None), "nothing");
    }
}
