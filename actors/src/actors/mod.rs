//! The actor tree (DESIGN.md "Shape"): a root [`supervisor::Supervisor`], one
//! [`owner::SessionOwner`] per live session, one [`unit::Unit`] per completion unit, one
//! [`child::Child`] per task execution, and the [`coalescer::Coalescer`] that group-commits
//! completions. Each module holds one actor: its state, messages and handlers;
//! [`supervise`] holds the restart policy they run under.

pub mod child;
pub mod coalescer;
pub mod holders;
pub mod owner;
pub mod supervise;
pub mod supervisor;
pub mod sweeper;
pub mod unit;

mod builder;
pub use builder::EngineBuilder;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, RwLock};

use actix::{Addr, WeakAddr};
use actix_rt::ArbiterHandle;
use dashmap::DashMap;

use crate::ledger::{Ledger, Tenures};
use crate::runner::RunnerFactory;

/// A session's owner epoch, read-locked by an owner's write for as long as the write lasts.
pub(crate) type Fence = Arc<RwLock<u64>>;

/// The live session owners by session id. A restarted owner replaces its entry, so whoever
/// looks an owner up here (the coalescer, the embedding API) reaches the current one.
pub type Owners = Arc<DashMap<String, Addr<owner::SessionOwner>>>;

pub use crate::runner::Embedder;

/// What every actor of one engine shares.
#[derive(Clone)]
pub struct Engine {
    /// The ledger.
    pub(crate) ledger: Arc<dyn Ledger>,
    /// Runner construction.
    pub(crate) factory: Arc<dyn RunnerFactory>,
    /// Wake targets from stored webhook URLs, if the embedder gave a way to make them.
    pub(crate) wake_factory: Option<Arc<dyn crate::wake::WakeFactory>>,
    /// The live owners.
    pub(crate) owners: Owners,
    /// Children whose actor is alive, by id, with their addresses (a cancel reaches a running
    /// child through here, whichever owner or unit incarnation holds its session now), and
    /// running children whose cancel was decided before they started (one lock orders both
    /// against a unit starting a child).
    live_children: Arc<Mutex<LiveChildren>>,
    /// The arbiter (thread) units, children and runners live on; the supervisor lives on the
    /// system arbiter, so child churn never delays routing.
    pub(crate) children_arbiter: ArbiterHandle,
    /// The coalescer's own thread, when the engine has routing threads: an owner rebuilt on the
    /// supervisor's thread then delays no other session's recording.
    pub(crate) commit_arbiter: Option<ArbiterHandle>,
    /// The routing threads session owners are spread over (by a hash of the session id, so a
    /// rebuilt owner lands where its predecessor was); none: owners run on the system arbiter.
    pub(crate) routing_arbiters: Vec<ArbiterHandle>,
    /// The session of each call an owner holds in memory (a cancel names only its call).
    pub(crate) calls: Arc<DashMap<String, String>>,
    /// The nested sessions (a child's session, by its id), as stored.
    nests: Arc<DashMap<String, crate::model::NestRow>>,
    /// Whether any session is nested: until one is, a child's end looks nothing up.
    any_nest: Arc<std::sync::atomic::AtomicBool>,
    /// The deepest call accepted (a call in a top-level session is depth 1).
    pub(crate) max_depth: u32,
    /// The embedder's handle of the engine, given to runners (nested delegation); weak, so it
    /// never keeps the engine open.
    pub(crate) embedder: Embedder,
    /// How long what is over is kept, and how often retention sweeps.
    pub(crate) retention: crate::retention::Retention,
    /// The server-wide bound on running children, shared round-robin (none: unlimited).
    pub(crate) shares: Option<Arc<crate::routing::Shares>>,
    /// The children queued or running over every session, and the bound a delegate must fit
    /// under (`max_live_children`; none: unbounded).
    pub(crate) live: crate::routing::LiveCount,
    /// The last turn state of each session, so a restarted owner keeps it.
    pub(crate) turns: Arc<DashMap<String, crate::routing::Turn>>,
    /// Where owners tell live observers what they applied.
    pub(crate) events: crate::events::Events,
    /// How long the coalescer gathers completions before it writes a batch (zero: a batch
    /// starts as soon as the previous flush ended).
    pub(crate) commit_window: std::time::Duration,
    /// Whether owners start queued children; cleared while the engine drains.
    admitting: Arc<std::sync::atomic::AtomicBool>,
    /// Each session's owner epoch: an owner writes only while its epoch is current, so the
    /// writes of an owner that died mid-flush never land after its successor read the ledger.
    fences: Arc<DashMap<String, Fence>>,
    coalescer: Arc<RwLock<Option<Addr<coalescer::Coalescer>>>>,
    /// The session tenures, when several processes share the ledger (see [`Tenures`]): a
    /// session is served here only while its tenure is held here.
    pub(crate) tenures: Option<Arc<dyn Tenures>>,
    /// Who serves the sessions another process holds, as this process last found out (see
    /// [`holders`]).
    pub(crate) holders: holders::Holders,
    /// The running totals owners add to as they apply what they decided.
    pub(crate) counters: Arc<crate::totals::Counters>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("ledger", &self.ledger)
            .field("sessions", &self.owners.len())
            .finish()
    }
}

impl Engine {
    /// An engine on `ledger`, its runners made by `factory`, its units and children on
    /// `children_arbiter`: set the rest on the builder, then [`EngineBuilder::build`]. It has no
    /// coalescer until the supervisor starts one.
    pub fn builder(
        ledger: Arc<dyn Ledger>,
        factory: Arc<dyn RunnerFactory>,
        children_arbiter: ArbiterHandle,
    ) -> EngineBuilder {
        EngineBuilder::new(ledger, factory, children_arbiter)
    }

    /// The ledger.
    pub fn ledger(&self) -> &Arc<dyn Ledger> {
        &self.ledger
    }

    /// What builds its runners.
    pub fn factory(&self) -> &Arc<dyn RunnerFactory> {
        &self.factory
    }

    /// The session tenures, when several processes share the ledger: a session is served here
    /// only while its tenure is held here.
    pub fn tenures(&self) -> Option<&Arc<dyn Tenures>> {
        self.tenures.as_ref()
    }

    /// The running totals since the engine started (see [`crate::totals`]).
    pub fn totals(&self) -> crate::totals::Totals {
        self.counters.totals()
    }

    /// The live session owners.
    pub fn owners(&self) -> &Owners {
        &self.owners
    }

    /// Where owners tell live observers what they applied.
    pub fn events(&self) -> &crate::events::Events {
        &self.events
    }

    /// The embedder's handle of the engine, given to runners (set once it is made).
    pub fn embedder(&self) -> &Embedder {
        &self.embedder
    }

    /// The session of a call an owner holds in memory, if one does.
    pub fn session_of_call(&self, call_id: &str) -> Option<String> {
        self.calls.get(call_id).map(|s| s.value().clone())
    }

    /// Stops (or resumes) starting queued children in every session: a drain lets the running
    /// ones end without new ones taking their slots. Queued children stay queued, durably.
    pub fn set_admitting(&self, on: bool) {
        self.admitting.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether owners start queued children.
    pub fn admitting(&self) -> bool {
        self.admitting.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The current coalescer (a restarted one replaces the old).
    pub fn coalescer(&self) -> Option<Addr<coalescer::Coalescer>> {
        self.coalescer.read().ok().and_then(|c| c.clone())
    }

    /// Hands a terminal row to the current coalescer (without a copy of its address: copying
    /// an actix address allocates twice), and returns where its answer comes. With no
    /// coalescer, or one that stops before answering, the answer is dropped unsent.
    pub(crate) fn hand_off(
        &self,
        terminal: coalescer::Terminal,
    ) -> tokio::sync::oneshot::Receiver<Result<crate::model::ChildStatus, coalescer::HandOffError>> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        if let Ok(current) = self.coalescer.read() {
            if let Some(c) = current.as_ref() {
                c.do_send(coalescer::ChildEnded { terminal, reply });
            }
        }
        answer
    }

    pub(crate) fn set_coalescer(&self, addr: Option<Addr<coalescer::Coalescer>>) {
        if let Ok(mut c) = self.coalescer.write() {
            *c = addr;
        }
    }

    /// Registers a child as alive (`child` is its actor's address, made before it runs) and
    /// lets it start, unless `owner_alive` says the owner that sent its start (at `epoch`)
    /// died (then its successor queues the child again, and it must not start). One lock orders this against
    /// [`Engine::live_children`], so a child is either adopted or re-queued, and against
    /// [`Engine::cancel_running`], so a cancel either finds the child here or is taken by it.
    ///
    /// A child whose cancel was decided before this (it was marked running, and its unit had
    /// not started it yet) is registered all the same, and starts only to end `cancelled` with
    /// the reason returned: its runner is never built (so whoever waits for it to stop is
    /// told at once).
    pub(crate) fn child_starting(
        &self,
        call_id: &str,
        task: u32,
        child: WeakAddr<child::Child>,
        (owner_alive, epoch): (impl FnOnce() -> bool, u64),
    ) -> ChildStart {
        let Ok(mut live) = self.live_children.lock() else {
            return ChildStart::Refused;
        };
        if !owner_alive() {
            // Never started here: a cancel the dead owner decided for it has nothing to wait
            // for (one its successor decided waits for the start the successor sent).
            live.take_cancel(call_id, task, Some(epoch));
            return ChildStart::Refused;
        }
        match live.running.get_mut(call_id) {
            Some(tasks) => {
                tasks.insert(task, child);
            }
            None => {
                live.running
                    .insert(call_id.to_string(), std::iter::once((task, child)).collect());
            }
        }
        match live.take_cancel(call_id, task, None) {
            Some(cancel) => ChildStart::Cancelled(cancel.reason),
            None => ChildStart::Go,
        }
    }

    /// Stops the running children `tasks` of the call `call_id`, whose cancel is decided
    /// (`reason` is its error text), whichever unit started them and whichever owner admitted
    /// them: a child alive here is told to end `cancelled` (its runner dropped, a command's
    /// process group killed); one not started yet ends `cancelled` as it starts, its runner
    /// never built, whatever order its unit reads its start and the cancel in. What is
    /// returned resolves once each of them is stopped or known gone (never started, or its
    /// start lost). `epoch` is the deciding owner's.
    pub(crate) fn cancel_running(
        &self,
        call_id: &str,
        tasks: impl IntoIterator<Item = u32>,
        reason: &str,
        epoch: u64,
    ) -> RunnersStopped {
        let mut waits = Vec::new();
        let Ok(mut live) = self.live_children.lock() else {
            return RunnersStopped(waits);
        };
        let LiveChildren { running, cancelled } = &mut *live;
        let alive = running.get(call_id);
        for task in tasks {
            let (gone, stopped) = tokio::sync::oneshot::channel();
            waits.push(stopped);
            match alive.and_then(|tasks| tasks.get(&task)) {
                Some(child) => {
                    // A child whose actor stopped meanwhile drops the message, and with it
                    // `gone`: it is gone.
                    if let Some(child) = child.upgrade() {
                        child.do_send(child::Cancel {
                            reason: reason.to_string(),
                            gone: Gone { _tell: gone },
                        });
                    }
                }
                None => {
                    let pending = cancelled
                        .entry(call_id.to_string())
                        .or_default()
                        .entry(task)
                        .or_insert_with(|| PendingCancel {
                            reason: reason.to_string(),
                            waiting: Vec::new(),
                            epoch,
                        });
                    // Decided again by a newer owner: that owner's start takes it.
                    pending.epoch = pending.epoch.max(epoch);
                    pending.waiting.push(Gone { _tell: gone });
                }
            }
        }
        RunnersStopped(waits)
    }

    /// Forgets the decided cancel of a child no unit will start (its start, sent by the owner
    /// at `epoch`, was lost), telling whoever waits for it to stop that it is gone: a child
    /// that starts or stops takes its own, and one a newer owner decided is left for the start
    /// that owner sent.
    pub(crate) fn forget_cancel(&self, call_id: &str, task: u32, epoch: u64) {
        if let Ok(mut live) = self.live_children.lock() {
            live.take_cancel(call_id, task, Some(epoch));
        }
    }

    /// Lets go of the waiting cancels an owner older than `epoch` decided for children that
    /// ended (a rebuilt owner found them ended, or was told so before it started them): the
    /// start that owner sent was lost with it, no other will come, and whoever waits for those
    /// children to stop is told they are gone. `ended` says of a child of the rebuilt owner's
    /// session whether it ended, and is none for a child of another session (epochs are each
    /// session's own). Returns whether such cancels of the session are still waiting.
    pub(crate) fn forget_stale_cancels(&self, epoch: u64, ended: impl Fn(&str, u32) -> Option<bool>) -> bool {
        let Ok(mut live) = self.live_children.lock() else {
            return false;
        };
        let mut left = false;
        live.cancelled.retain(|call_id, tasks| {
            tasks.retain(|&task, pending| match ended(call_id, task) {
                Some(_) if pending.epoch >= epoch => true,
                Some(true) => false,
                Some(false) => {
                    left = true;
                    true
                }
                None => true,
            });
            !tasks.is_empty()
        });
        left
    }

    /// A child's actor stopped.
    pub(crate) fn child_stopped(&self, call_id: &str, task: u32) {
        if let Ok(mut live) = self.live_children.lock() {
            if let Some(tasks) = live.running.get_mut(call_id) {
                tasks.remove(&task);
                if tasks.is_empty() {
                    live.running.remove(call_id);
                }
            }
            live.take_cancel(call_id, task, None);
        }
    }

    /// The ids of the children whose actor is alive right now.
    pub(crate) fn live_children(&self) -> HashSet<String> {
        let Ok(live) = self.live_children.lock() else {
            return HashSet::new();
        };
        live.running
            .iter()
            .flat_map(|(call, tasks)| tasks.keys().map(|&i| crate::model::child_id(call, i)))
            .collect()
    }

    /// The fence of a session and its current epoch (a new owner writes under it).
    pub(crate) fn fence(&self, session_id: &str) -> (Fence, u64) {
        let fence = self.fences.entry(session_id.to_string()).or_default().clone();
        let epoch = fence.read().map(|e| *e).unwrap_or(u64::MAX);
        (fence, epoch)
    }

    /// Whether `epoch` is still the session's current one: a start an owner sent is read only
    /// while that owner's epoch lasts. An owner superseded but not stopped yet (taken over with
    /// a batch in flight) still answers, and its start must not run a child its successor
    /// queues or starts again. Never waits: while a successor is being made, it is not.
    pub(crate) fn epoch_current(&self, session_id: &str, epoch: u64) -> bool {
        self.fences
            .get(session_id)
            .is_none_or(|f| f.try_read().is_ok_and(|current| *current == epoch))
    }

    /// Ends the current owner's epoch of a session: waits for a write of it in flight, and
    /// refuses every later one. Called before the session is read back for a new owner.
    pub(crate) fn supersede(&self, session_id: &str) {
        let fence = self.fences.entry(session_id.to_string()).or_default().clone();
        let mut guard = fence.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        *guard = guard.saturating_add(1);
    }

    /// Whether this process holds the session's tenure (always, when it shares the ledger with
    /// nobody): an owner whose session was taken over publishes, acks and answers nothing more.
    pub(crate) fn holds(&self, session_id: &str) -> bool {
        self.tenures.as_ref().is_none_or(|l| l.holds(session_id))
    }

    /// Refuses to hand anything of the session out when its tenure could not be renewed in time.
    pub(crate) fn check_serving(&self, session_id: &str) -> Result<(), crate::error::BroodError> {
        match &self.tenures {
            Some(l) if !l.serving(session_id) => Err(crate::error::BroodError::TenureLapsed {
                session: session_id.to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// The routing thread of a session, if the engine has routing threads.
    pub(crate) fn routing_arbiter(&self, session_id: &str) -> Option<&ArbiterHandle> {
        use std::hash::{Hash as _, Hasher as _};
        if self.routing_arbiters.is_empty() {
            return None;
        }
        let mut h = std::hash::DefaultHasher::new();
        session_id.hash(&mut h);
        let i = (h.finish() % self.routing_arbiters.len() as u64) as usize;
        self.routing_arbiters.get(i)
    }

    /// A nested session's row; none for a top-level session.
    pub fn nest(&self, session_id: &str) -> Option<crate::model::NestRow> {
        if !self.any_nest.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        self.nests.get(session_id).map(|n| n.clone())
    }

    /// Whether `session_id` is a nested session.
    pub(crate) fn is_nested(&self, session_id: &str) -> bool {
        self.any_nest.load(std::sync::atomic::Ordering::Acquire) && self.nests.contains_key(session_id)
    }

    /// How deep a session is: 0 for a top-level one.
    pub fn depth(&self, session_id: &str) -> u32 {
        self.nest(session_id).map_or(0, |n| n.depth)
    }

    /// Every nested session.
    pub fn nests(&self) -> Vec<crate::model::NestRow> {
        self.nests.iter().map(|n| n.value().clone()).collect()
    }

    /// Knows `row` from now on (stored, or read back).
    pub(crate) fn add_nest(&self, row: crate::model::NestRow) {
        self.nests.insert(row.session_id.clone(), row);
        self.any_nest.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Forgets a session retention removed: its owner, its nest, its turn, its share.
    pub(crate) fn forget_session(&self, session_id: &str) {
        self.owners.remove(session_id);
        self.nests.remove(session_id);
        self.turns.remove(session_id);
        self.forget_share(session_id);
        if let Some(tenures) = &self.tenures {
            tenures.release(session_id);
        }
    }

    /// A session no longer served gives its server-wide slots to the sessions waiting for one.
    pub(crate) fn forget_share(&self, session_id: &str) {
        if let Some(shares) = &self.shares {
            self.poke(shares.forget(session_id));
        }
    }

    /// Tells the owners of `sessions` to admit (a server-wide slot was reserved for them).
    pub(crate) fn poke(&self, sessions: Vec<String>) {
        for s in sessions {
            if let Some(owner) = self.owner(&s) {
                owner.do_send(owner::Admit);
            }
        }
    }

    /// The address of the process that serves `session_id`, when another process does as this
    /// one last found out: none when it is served here (or being taken up here), or nobody
    /// known serves it.
    pub fn holder_elsewhere(&self, session_id: &str) -> Option<String> {
        self.tenures.as_ref()?;
        if self.owners.contains_key(session_id) {
            return None;
        }
        self.holders.get(session_id, std::time::Instant::now())
    }

    /// Forgets which process serves `session_id`: a request sent there went unanswered or was
    /// refused as moved, and the next asks the ledger who serves it now.
    pub fn forget_holder(&self, session_id: &str) {
        self.holders.forget(session_id);
    }

    /// The current owner of a session.
    pub fn owner(&self, session_id: &str) -> Option<Addr<owner::SessionOwner>> {
        self.owners.get(session_id).map(|a| a.clone())
    }
}

/// Whether an actor may still start timers and tasks. When an arbiter shuts down, actix polls
/// each live actor one last time outside any runtime (to run its stop hooks); a timer or task
/// started then panics, so callbacks that may run at that moment check this first.
pub(crate) fn running<A: actix::Actor<Context = actix::Context<A>>>(ctx: &actix::Context<A>) -> bool {
    use actix::ActorContext as _;
    ctx.state() == actix::ActorState::Running
}

/// Children whose actor is alive, and cancels decided for running children not started yet.
#[derive(Debug, Default)]
struct LiveChildren {
    /// By call, the task indexes of the children whose actor is alive, with a weak address of
    /// each (one id's text per call, not per child; weak, so a child's life is its own).
    running: foldhash::HashMap<String, foldhash::HashMap<u32, WeakAddr<child::Child>>>,
    /// By call, running children whose cancel was decided before their unit started them,
    /// until they start or stop (or their start was lost).
    cancelled: foldhash::HashMap<String, foldhash::HashMap<u32, PendingCancel>>,
}

/// A cancel decided for a child its unit has not started yet.
#[derive(Debug)]
struct PendingCancel {
    /// Its error text (of the first cancel decided).
    reason: String,
    /// Told, by being dropped, once the child will never run its runner.
    waiting: Vec<Gone>,
    /// The epoch of the newest owner that decided it: only a start that owner sent takes it
    /// when it is refused or lost (a stale start of an owner that died before must not, or the
    /// start that owner's successor sent would run the child uncancelled).
    epoch: u64,
}

impl LiveChildren {
    /// Takes the decided cancel of a child, if there is one and `epoch` is none or the epoch
    /// of the owner that decided it last (whoever waits for it to stop is told, once the caller
    /// lets it go).
    fn take_cancel(&mut self, call_id: &str, task: u32, epoch: Option<u64>) -> Option<PendingCancel> {
        if self.cancelled.is_empty() {
            return None; // the usual case: no key to hash
        }
        let cancels = self.cancelled.get_mut(call_id)?;
        if epoch.is_some_and(|e| cancels.get(&task).is_some_and(|c| c.epoch != e)) {
            return None;
        }
        let cancel = cancels.remove(&task);
        if cancels.is_empty() {
            self.cancelled.remove(call_id);
        }
        cancel
    }
}

/// Dropped once the child it was made for is stopped or known gone: its runner dropped, or
/// never to be built.
#[derive(Debug)]
pub(crate) struct Gone {
    /// Never sent on: its drop is the message.
    _tell: tokio::sync::oneshot::Sender<std::convert::Infallible>,
}

/// Resolves once every child a cancel stops ([`Engine::cancel_running`]) is stopped or known
/// gone.
#[derive(Debug)]
#[must_use = "it tells when the children are stopped; drop it to not wait"]
pub(crate) struct RunnersStopped(Vec<tokio::sync::oneshot::Receiver<std::convert::Infallible>>);

impl RunnersStopped {
    /// Waits until each child is stopped or known gone.
    pub(crate) async fn wait(self) {
        for stopped in self.0 {
            // Only ever answered by its sender being dropped.
            let _ = stopped.await;
        }
    }
}

/// Whether a unit may start a child ([`Engine::child_starting`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ChildStart {
    /// Its owner died: its successor queues it again, so it must not start here.
    Refused,
    /// It starts.
    Go,
    /// Its cancel was decided: it starts only to end `cancelled` (the reason), its runner
    /// never built.
    Cancelled(String),
}
