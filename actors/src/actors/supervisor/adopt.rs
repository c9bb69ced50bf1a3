//! Sessions taken up from a ledger shared with other processes: on first use, and
//! by a sweep for the sessions of a process that died or handed over (up to this process's
//! fair share, see [`super::balance`]); a nested session where its parent is.

use actix::prelude::*;

use super::recover::{recover_session, recover_sessions};
use super::{balance, store_session, Supervisor};
use crate::actors::owner::SessionOwner;
use crate::actors::{running, Engine};
use crate::error::BroodError;
use std::collections::HashSet;

use crate::ledger::{LedgerError, TenureHolder, Tenures};
use crate::model::{nest_parent, NestRow, SessionRow};
use crate::recovery::Recovery;

impl Supervisor {
    /// Takes a session up from the shared ledger: its tenure taken (or its holder named), then
    /// recovered from its rows as a restart recovers it (I6), or created from `create` when it
    /// has none. One adoption of a session at a time: later askers wait for the first.
    pub(super) fn adopt(
        &mut self,
        id: String,
        create: Option<(SessionRow, Option<NestRow>)>,
        ctx: &mut Context<Self>,
    ) -> impl std::future::Future<Output = Result<Addr<SessionOwner>, BroodError>> + 'static {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let first = !self.adopting.contains_key(&id);
        self.adopting.entry(id.clone()).or_default().push(tx);
        if first {
            self.start_adoption(id, create, ctx);
        }
        async move { rx.await.unwrap_or(Err(BroodError::Stopped)) }
    }

    /// Takes session `id` up, and answers everyone waiting for it in [`Supervisor::adopting`].
    pub(super) fn start_adoption(
        &mut self,
        id: String,
        create: Option<(SessionRow, Option<NestRow>)>,
        ctx: &mut Context<Self>,
    ) {
        let engine = self.engine.clone();
        let session = id.clone();
        let job = crate::ledger::off_thread("taking a session up", move || {
            Ok(adopt_session(&engine, &session, create))
        });
        job.into_actor(self)
            .map(move |adopted, act, ctx| {
                act.adopted(id, adopted.map_err(BroodError::from).and_then(|a| a), ctx);
            })
            .spawn(ctx);
    }

    /// Takes up the sessions a sweep took: the top-level ones all at once (read back in a few
    /// statements per table, whatever their number: [`recover_sessions`]), each nested one on
    /// its own, where its parent is. Requests for them meanwhile wait, as for any adoption.
    fn adopt_swept(&mut self, taken: Vec<String>, ctx: &mut Context<Self>) {
        // Each on its own: a nested session, and one being taken up already or whose owner
        // here has not yet stopped for losing it (replaced by the one taken up, as a single
        // adoption replaces it; left alone, the session would be held here with no owner).
        let (single, batch): (Vec<String>, Vec<String>) = taken.into_iter().partition(|id| {
            nest_parent(id).is_some() || self.adopting.contains_key(id) || self.engine.owner(id).is_some()
        });
        for id in single {
            let adopted = self.adopt(id.clone(), None, ctx);
            actix::spawn(async move {
                if let Err(e) = adopted.await {
                    tracing::warn!(session = %id, "taking a session over failed: {e}");
                }
            });
        }
        if batch.is_empty() {
            return;
        }
        for id in &batch {
            self.adopting.insert(id.clone(), Vec::new());
        }
        let engine = self.engine.clone();
        let ids = batch.clone();
        crate::ledger::off_thread("taking sessions up", move || Ok(adopt_many(&engine, &ids)))
            .into_actor(self)
            .map(move |adopted, act, ctx| match adopted {
                Ok(answers) => {
                    for (id, answer) in answers {
                        if let Err(e) = &answer {
                            tracing::warn!(session = %id, "taking a session over failed: {e}");
                        }
                        act.adopted(id, answer, ctx);
                    }
                }
                Err(e) => {
                    tracing::warn!(sessions = batch.len(), "taking sessions over failed: {e}");
                    let e = BroodError::from(e);
                    for id in batch {
                        act.adopted(id, Err(e.clone()), ctx);
                    }
                }
            })
            .spawn(ctx);
    }

    /// An adoption of `id` ended: its owner spawned (or where it is served, or that it is
    /// unknown, or what failed) answered to everyone waiting for it.
    fn adopted(&mut self, id: String, adopted: Result<Adopted, BroodError>, ctx: &mut Context<Self>) {
        let held_here = self.engine.tenures.as_ref().is_some_and(|t| t.holds(&id));
        if matches!(adopted, Ok(Adopted::Elsewhere(_))) && held_here && running(ctx) {
            // Found served elsewhere, but a sweep of this process took the tenure meanwhile: the
            // session is taken up here after all (its waiters wait on), not left held with no
            // owner while requests are sent to where it was.
            tracing::debug!(session = %id, "a session found served elsewhere was taken here meanwhile; taking it up");
            self.start_adoption(id, None, ctx);
            return;
        }
        match &adopted {
            Ok(Adopted::Elsewhere(address)) => self.engine.holders.found(&id, address, std::time::Instant::now()),
            _ => self.engine.holders.forget(&id),
        }
        let answer = match adopted {
            Ok(Adopted::Owner(owner, nest)) if running(ctx) => {
                if let Some(nest) = nest {
                    self.engine.add_nest(nest);
                }
                let wake = self.wakes.get(&id).cloned();
                let mut owner = *owner;
                if let Some(wake) = wake {
                    owner.bind_wake(wake);
                }
                Ok(self.spawn_owner(owner, ctx))
            }
            Ok(Adopted::Owner(..)) => Err(BroodError::Stopped),
            Ok(Adopted::Elsewhere(address)) => Err(BroodError::Moved {
                session: id.clone(),
                address,
            }),
            Ok(Adopted::Unknown) => Err(BroodError::UnknownSession(id.clone())),
            Err(e) => Err(e),
        };
        for waiter in self.adopting.remove(&id).unwrap_or_default() {
            let _ = waiter.send(answer.clone());
        }
    }

    /// Reads how the sessions are spread (one statement), takes free sessions up to this
    /// process's fair share (those of a process that died, within about a tenure time of its
    /// death, and those handed over, at once), and hands some over when it holds more than its
    /// share (see [`super::balance`]). A sweep under way when another is asked for runs again
    /// once it ends, as does one that took something (the nested sessions of what it took
    /// follow).
    pub(super) fn sweep(&mut self, ctx: &mut Context<Self>) {
        let Some(tenures) = self.engine.tenures.clone() else {
            return;
        };
        if self.sweeping {
            self.sweep_again = true;
            return;
        }
        self.sweeping = true;
        crate::ledger::off_thread("sweeping for free session tenures", move || {
            let spread = tenures.spread()?;
            let here = tenures.held_count() as u64;
            let plan = balance::plan(&spread, here);
            tracing::debug!(here, free = spread.free, others = ?spread.others, take = plan.take, give = plan.give, "sweep planned");
            let taken = if (plan.take > 0 && spread.takeable > 0) || spread.nests > 0 {
                tenures.acquire_free(usize::try_from(plan.take).unwrap_or(usize::MAX))?
            } else {
                Vec::new()
            };
            Ok((taken, plan, spread.others.len() + 1, here))
        })
        .into_actor(self)
        .map(|swept, act, ctx| {
            act.sweeping = false;
            let (taken, plan, nodes, here) = match swept {
                Ok(swept) => swept,
                Err(e) => return tracing::warn!("looking for free session tenures failed (tried again soon): {e}"),
            };
            let again = std::mem::take(&mut act.sweep_again) || !taken.is_empty();
            if !taken.is_empty() {
                tracing::info!(
                    sessions = taken.len(),
                    held = here as usize + taken.len(),
                    processes = nodes,
                    "taking up sessions whose tenure was free"
                );
            }
            act.adopt_swept(taken, ctx);
            if plan.give > 0 {
                act.hand_over_some(plan.give, ctx);
            }
            if again {
                ctx.run_later(std::time::Duration::from_millis(20), |act, ctx| act.sweep(ctx));
            }
        })
        .spawn(ctx);
    }
}

/// Another process gave tenures back: sweep now.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(super) struct SweepNow;

impl Handler<SweepNow> for Supervisor {
    type Result = ();

    fn handle(&mut self, _: SweepNow, ctx: &mut Context<Self>) {
        self.sweep(ctx);
    }
}

/// What taking a session up from a shared ledger came to.
enum Adopted {
    /// Its tenure is held here now, and this is its owner (with its nest row, when new).
    Owner(Box<SessionOwner>, Option<NestRow>),
    /// Another process holds its tenure and takes requests at this address.
    Elsewhere(String),
    /// No such session is stored (and none was to be created).
    Unknown,
}

/// Takes a session's tenure and recovers it from its own rows as a restart of the process
/// would (I6: its live claims returned, what was running re-run or resolved), or creates it
/// from `create`. Runs off every actor's thread.
fn adopt_session(
    engine: &Engine,
    id: &str,
    create: Option<(SessionRow, Option<NestRow>)>,
) -> Result<Adopted, BroodError> {
    let Some(tenures) = engine.tenures.as_ref() else {
        return Ok(Adopted::Unknown);
    };
    // A top-level session another process serves (or is creating: its tenure taken, its row
    // not yet committed) is named by its live tenure, read as it is, first: a lookup costs one
    // read. Taking the tenure would wait for that holder's commits in flight, and hold up its
    // next ones, only to find it held. (Where a nested session is served is its parent's
    // business, below; one this process handed over is answered once its taker took it; a
    // session being created is looked for first, as it is most often new.)
    let first = match create.is_none() && nest_parent(id).is_none() && !tenures.handed_over(id) {
        true => Some(tenures.holder(id)?),
        false => None,
    };
    if let Some(Some(TenureHolder::Elsewhere { address, owner })) = first {
        return Ok(elsewhere(id, address, &owner));
    }
    let holder = |first: Option<Option<TenureHolder>>| match first {
        Some(read) => Ok(read),
        None => tenures.holder(id),
    };
    let stored = engine.ledger.has_session(id)?;
    if !stored {
        if create.is_none() {
            // An id that names no stored session takes no tenure and leaves nothing behind (no
            // tenure row, no fence): a lookup of junk ids costs two reads each, and nothing
            // later. One being created by another process is served there.
            return Ok(match holder(first)? {
                Some(TenureHolder::Elsewhere { address, .. }) => Adopted::Elsewhere(address),
                _ => Adopted::Unknown,
            });
        }
        crate::model::validate_new_session_id(id)?;
    }
    if tenures.handed_over(id) {
        return served_by_taker(&**tenures, id);
    }
    // A nested session is served where its parent session is: the end of its child, and a
    // cancel of it, reach it there.
    if let Some(parent) = parent_session(engine, id, create.as_ref().and_then(|c| c.1.as_ref()))? {
        let here = engine.owner(&parent).is_some();
        let holder = if here { None } else { tenures.holder(&parent)? };
        if let Some(address) = nest_served_at(here, holder) {
            tracing::debug!(session = %id, %parent, %address, "a nested session is served where its parent is");
            // Taken by a sweep here: given back, for the parent's holder to take up.
            if tenures.holds(id) {
                tenures.leave_to_parent(id, &parent);
            }
            return Ok(Adopted::Elsewhere(address));
        }
    }
    // A stored session's live tenure, read above or now (nested, or put again), names another
    // holder without taking it. (A session being created has no tenure to read yet.)
    let read = if stored { holder(first)? } else { None };
    let found = match read {
        Some(elsewhere @ TenureHolder::Elsewhere { .. }) => elsewhere,
        _ => tenures.acquire(id)?,
    };
    if let TenureHolder::Elsewhere { address, owner } = found {
        return Ok(elsewhere(id, address, &owner));
    }
    // An owner of an earlier epoch in this process (its tenure lost, then taken back) writes
    // nothing more: its writes in flight land before the read below, or never.
    engine.supersede(id);
    let refusals = engine.ledger.refusals(id);
    let adopted = take_up(engine, id, create);
    settled(engine, &**tenures, id, refusals, adopted)
}

/// The answer for session `id`, whose tenure `owner` holds: served at `address`.
fn elsewhere(id: &str, address: String, owner: &str) -> Adopted {
    tracing::debug!(session = %id, %owner, %address, "the session's tenure is held by another process");
    crate::failpoints::hold("adopt_elsewhere_hold");
    Adopted::Elsewhere(address)
}

/// What taking session `id` up came to, its rows read and what recovery resolved written:
/// given back when it failed, or when its rows were refused at the commit (its tenure lost
/// meanwhile since `refusals` were counted: `Fenced`), so another process or a later sweep may
/// take it.
fn settled(
    engine: &Engine,
    tenures: &dyn Tenures,
    id: &str,
    refusals: u64,
    adopted: Result<Adopted, BroodError>,
) -> Result<Adopted, BroodError> {
    let refused = engine.ledger.refusals(id) != refusals;
    if adopted.is_err() || refused {
        tenures.release(id);
    }
    if refused {
        return Err(LedgerError::Fenced(id.to_string()).into());
    }
    adopted
}

/// Takes up top-level sessions whose tenures a sweep of this process took, as
/// [`adopt_session`] takes up one (recovered from their rows as a restart would: I6), read back
/// and recovered together. A session whose rows were refused at the commit (its tenure lost
/// meanwhile), or that is no longer stored, is given back.
fn adopt_many(engine: &Engine, ids: &[String]) -> Vec<(String, Result<Adopted, BroodError>)> {
    let Some(tenures) = engine.tenures.as_ref() else {
        return ids.iter().map(|id| (id.clone(), Ok(Adopted::Unknown))).collect();
    };
    let ledger = &engine.ledger;
    // Owners of an earlier epoch in this process write nothing more (see `adopt_session`).
    for id in ids {
        engine.supersede(id);
    }
    let refusals: Vec<u64> = ids.iter().map(|id| ledger.refusals(id)).collect();
    let mut owners: std::collections::HashMap<String, SessionOwner> = match recover_sessions(engine, ids) {
        Ok(owners) => owners.into_iter().map(|o| (o.session_id().to_string(), o)).collect(),
        Err(e) => {
            for id in ids {
                tenures.release(id);
            }
            let e = BroodError::from(e);
            return ids.iter().map(|id| (id.clone(), Err(e.clone()))).collect();
        }
    };
    ids.iter()
        .zip(refusals)
        .map(|(id, before)| {
            let adopted = match owners.remove(id) {
                Some(owner) => Ok(Adopted::Owner(Box::new(owner), None)),
                // No longer stored: given back.
                None => {
                    tenures.release(id);
                    Ok(Adopted::Unknown)
                }
            };
            (id.clone(), settled(engine, &**tenures, id, before, adopted))
        })
        .collect()
}

/// Where a session this process handed over lately is served: by its taker, once it took it
/// (waited for a moment: takers are told at once); until then a request is answered as lapsed,
/// to be retried, and the session is not taken back here.
fn served_by_taker(tenures: &dyn Tenures, id: &str) -> Result<Adopted, BroodError> {
    let deadline = std::time::Instant::now() + TAKER_PATIENCE;
    loop {
        if let Some(TenureHolder::Elsewhere { address, .. }) = tenures.holder(id)? {
            return Ok(Adopted::Elsewhere(address));
        }
        if std::time::Instant::now() >= deadline {
            return Err(BroodError::TenureLapsed {
                session: id.to_string(),
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
}

/// How long a request for a session handed over waits for its taker to take it.
const TAKER_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

/// Where a nested session is to be served, given whether its parent session is served here and
/// who holds the parent's tenure: at the address of the process that serves its parent, when
/// that is another one; else here (its parent is served here, or by nobody now).
fn nest_served_at(parent_here: bool, parent_holder: Option<TenureHolder>) -> Option<String> {
    match parent_holder {
        Some(TenureHolder::Elsewhere { address, .. }) if !parent_here => Some(address),
        _ => None,
    }
}

/// Gives back the tenures a starting process took (`taken`) of the nested sessions whose parent
/// session another process serves, or is itself given back here (a nested session of a nested
/// session follows its parent): each is served where its parent is, whose holder takes it up at
/// its next sweep, and not here, where the end of its child would never reach it.
pub(super) fn give_back_nests_apart(
    engine: &Engine,
    tenures: &dyn Tenures,
    taken: &mut HashSet<String>,
) -> Result<(), LedgerError> {
    // Each nested session's parent, and whether another process serves that parent (read once).
    let mut nested: Vec<(String, String, bool)> = Vec::new();
    let mut parents: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    for id in taken.iter().filter(|id| nest_parent(id).is_some()) {
        let Some(parent) = parent_session(engine, id, None)? else {
            continue;
        };
        let here = taken.contains(&parent);
        let holder = if here { None } else { tenures.holder(&parent)? };
        parents.insert(id.clone(), parent.clone());
        nested.push((id.clone(), parent, nest_served_at(here, holder).is_some()));
    }
    let given_back = nests_to_give_back(&nested);
    for id in &given_back {
        tracing::info!(session = %id, "a nested session is left to the process that serves its parent");
        match parents.get(id) {
            Some(parent) => tenures.leave_to_parent(id, parent),
            None => tenures.release(id),
        }
        taken.remove(id);
    }
    Ok(())
}

/// Of nested sessions (each with its parent session, and whether another process serves that
/// parent), those to give back: the ones whose parent is served elsewhere, and, again and
/// again, those whose parent is given back.
fn nests_to_give_back(nested: &[(String, String, bool)]) -> HashSet<String> {
    let mut given_back: HashSet<String> = HashSet::new();
    loop {
        let before = given_back.len();
        for (id, parent, elsewhere) in nested {
            if *elsewhere || given_back.contains(parent) {
                given_back.insert(id.clone());
            }
        }
        if given_back.len() == before {
            return given_back;
        }
    }
}

/// The parent session of `id`, when it is a nested session: from its nest row (`nest`, when it
/// is being created; else as known here, or as stored).
fn parent_session(engine: &Engine, id: &str, nest: Option<&NestRow>) -> Result<Option<String>, LedgerError> {
    if let Some(n) = nest.cloned().or_else(|| engine.nest(id)) {
        return Ok(Some(n.parent_session_id));
    }
    let Some((call_id, _)) = nest_parent(id) else {
        return Ok(None);
    };
    if let Some(session) = engine.calls.get(call_id) {
        return Ok(Some(session.value().clone()));
    }
    Ok(engine.ledger.find_call(call_id)?.map(|c| c.session_id))
}

/// Reads a session whose tenure this process just took, and recovers it (or creates it).
fn take_up(engine: &Engine, id: &str, create: Option<(SessionRow, Option<NestRow>)>) -> Result<Adopted, BroodError> {
    // Its own nest row, if it is nested, comes with it: known here from now on (its depth,
    // its parent).
    if let Some((owner, nest)) = recover_session(engine, id, Recovery::Process)? {
        tracing::info!(session = %id, "session taken up from the shared ledger");
        return Ok(Adopted::Owner(Box::new(owner), nest));
    }
    let Some((row, nest)) = create else {
        if let Some(tenures) = &engine.tenures {
            tenures.release(id);
        }
        return Ok(Adopted::Unknown);
    };
    store_session(&*engine.ledger, &row, &nest)?;
    Ok(Adopted::Owner(Box::new(SessionOwner::new(engine.clone(), row)), nest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nested_session_is_served_where_its_parent_is() {
        let elsewhere = || {
            Some(TenureHolder::Elsewhere {
                owner: "b".into(),
                address: "http://b".into(),
            })
        };
        assert_eq!(nest_served_at(false, elsewhere()).as_deref(), Some("http://b"));
        assert_eq!(nest_served_at(true, elsewhere()), None, "served here already");
        assert_eq!(nest_served_at(false, None), None, "its parent is served by nobody now");
        assert_eq!(nest_served_at(false, Some(TenureHolder::Here(3))), None);
    }

    #[test]
    fn a_nest_of_a_nest_follows_its_parent_whatever_the_order() {
        let chain = |order: &[usize]| {
            let all = [
                ("n2".to_string(), "n1".to_string(), false),
                ("n1".to_string(), "p".to_string(), true),
                ("m".to_string(), "q".to_string(), false),
            ];
            let nested: Vec<_> = order.iter().map(|&i| all[i].clone()).collect();
            let mut back: Vec<String> = nests_to_give_back(&nested).into_iter().collect();
            back.sort();
            back
        };
        for order in [[0, 1, 2], [1, 0, 2], [2, 1, 0], [2, 0, 1]] {
            assert_eq!(chain(&order), ["n1", "n2"], "visited in the order {order:?}");
        }
    }
}
