//! # brood
//!
//! Durable, turn-boundary routing of delegated child work. A parent (an LLM agent's
//! conversation, a build controller, any long-running orchestrator) delegates a call of tasks
//! and keeps working; every child's result is written durably the moment it finishes and is
//! handed back at the parent's next turn boundary, in one envelope with everything else that is
//! ready right then. Nothing waits behind a slow sibling outside its unit, nothing is lost when
//! the process dies, nothing acknowledged is delivered twice.
//!
//! [`Brood`] is the embedding API: it runs the actor engine (`brood-actors`) on its own thread
//! over a sled ledger in a local folder, and every method is an `async fn` usable from any
//! executor.
//!
//! ```no_run
//! use std::time::Duration;
//! use brood::{Brood, BroodConfig, DelegateRequest, SessionSettings, TaskSpec};
//! use serde_json::json;
//!
//! # async fn demo() -> Result<(), brood::BroodError> {
//! let brood = Brood::open(BroodConfig::new("./brood-data"))?;
//! // Binding a wake target makes the session wake-capable, so background calls stay background.
//! brood.open_session("chat-1", SessionSettings::default().wake(|ev| println!("wake {ev:?}"))).await?;
//! let reply = brood
//!     .delegate("chat-1", DelegateRequest::background(vec![
//!         TaskSpec::new("summarise PR 12", json!({"kind": "sim", "ms": 50})),
//!         TaskSpec::new("review PR 13", json!({"kind": "sim", "ms": 80})),
//!     ]))
//!     .await?;
//! println!("{}", reply.note());
//! // … the parent finishes its turn; at the boundary:
//! if let Some(envelope) = brood.boundary("chat-1", "cli", Duration::from_secs(30)).await? {
//!     println!("{}", envelope.text);
//!     brood.ack(&envelope.claim_id).await?;
//! }
//! brood.shutdown();
//! # Ok(()) }
//! ```
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms, unreachable_pub)]
#![deny(unused_must_use)]

mod cluster;
mod config;
mod lifecycle;
pub mod render;
pub mod runners;
pub mod whole;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::{Addr, Handler, Message};
use brood_actors::actors::owner::{self, claim_session, SessionOwner};
pub use brood_actors::actors::supervisor::Health;
use brood_actors::actors::supervisor::{GetDeadLetters, GetHealth, GetOwner, OpenSession, RestartOwner, Supervisor};
use brood_actors::actors::{Engine, Owners};
use brood_actors::events::Events;
use brood_actors::ledger::Ledger;

pub use brood_actors::actors::owner::{CallStatus, LiveClaim, SessionCounts, SessionInfo, SessionStatus};
pub use brood_actors::error::{BroodError, DelegateError};
pub use brood_actors::events::{ClaimChange, Event, SessionEvent};
pub use brood_actors::failpoints;
pub use brood_actors::ledger::{Durability, LedgerError};
pub use brood_actors::model::{
    child_id, dedup_key, parse_dedup_key, unit_id, validate_traceparent, AckInfo, CallInfo, CancelTarget, Cancelled,
    ChildInfo, ChildStatus, DeadLetterInfo, DelegateReply, DelegateRequest, DeliveryInfo, Envelope, EnvelopeLimits,
    ItemKind, ItemRef, Mode, NestInfo, Quarantined, ReadyItem, RedriveEntry, RedriveInfo, RedriveSelect, RequestError,
    RetryPolicy, SessionSettings, TaskInfo, TaskSpec, UnitInfo,
};
pub use brood_actors::retention::{Retention, Swept};
pub use brood_actors::routing::{ReleaseReason, Turn};
pub use brood_actors::runner::{Progress, RecordOutcome, RunContext, RunOutput, Runner, RunnerFactory};
pub use brood_actors::text::printable;
pub use brood_actors::totals::{DeliveryStage, Totals};
pub use brood_actors::wake::{Wake, WakeEvent, WakeFactory};
pub use cluster::RedriveSplit;
pub use config::BroodConfig;
pub use runners::Runners;

/// The longest cancel reason kept, in characters.
pub const MAX_CANCEL_REASON: usize = 1000;

/// Routing threads an engine gets unless told otherwise: one per core.
pub fn default_routing_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Unread events a subscriber may hold before it lags (see [`BroodHandle::subscribe`]).
pub const EVENTS_CAPACITY: usize = Events::CAPACITY;

/// Shortest lease accepted, in ms (API.md).
pub const MIN_LEASE_MS: u64 = 100;
/// Longest lease accepted, in ms (API.md).
pub const MAX_LEASE_MS: u64 = 3_600_000;

/// A duration in whole milliseconds, refused (naming `field`) when it does not fit in a u64:
/// never truncated, never wrapped.
fn millis(field: &str, d: Duration) -> Result<u64, BroodError> {
    u64::try_from(d.as_millis())
        .map_err(|_| BroodError::invalid(field, format!("{d:?} is too long to count in milliseconds")))
}

/// The embedded engine. Cheap to share behind an `Arc`; shut it down with [`Brood::shutdown`]
/// (dropping it does the same). Shutting down joins the engine's threads, so never drop the
/// last handle from inside a wake callback or a runner. Every request method is
/// [`BroodHandle`]'s, which a `Brood` dereferences to.
pub struct Brood {
    handle: Arc<BroodHandle>,
    system: actix::System,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Brood {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Brood")
            .field("data_dir", &self.handle.data_dir)
            .finish()
    }
}

impl std::ops::Deref for Brood {
    type Target = BroodHandle;

    fn deref(&self) -> &BroodHandle {
        &self.handle
    }
}

/// The requests of an open engine: what a [`Brood`] answers, and what a runner reaches through
/// [`BroodHandle::of`] to delegate in its own right (nested delegation). It does not keep the
/// engine open: once its `Brood` shut down, every request answers [`BroodError::Stopped`].
pub struct BroodHandle {
    root: Addr<Supervisor>,
    owners: Owners,
    events: Events,
    ledger: Arc<dyn Ledger>,
    engine: Engine,
    data_dir: PathBuf,
}

impl std::fmt::Debug for BroodHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BroodHandle").field("data_dir", &self.data_dir).finish()
    }
}

type Started = (Addr<Supervisor>, Engine, actix::System);

impl Brood {
    /// Opens the ledger in the config's data folder, recovers what an earlier process left
    /// (I6) and starts the actors on a thread of their own. Rows that cannot be read are
    /// quarantined ([`BroodHandle::quarantined`]); the rest opens and is served.
    pub fn open(config: BroodConfig) -> Result<Brood, BroodError> {
        config.check()?;
        let (tx, rx) = std::sync::mpsc::channel::<Result<Started, LedgerError>>();
        let data_dir = config.data_dir.clone();
        let thread = std::thread::Builder::new()
            .name("brood-actors".into())
            .spawn(move || run_engine(config, tx))
            .map_err(|e| LedgerError::storage("starting the actor thread", e))?;
        match rx.recv() {
            Ok(Ok((root, engine, system))) => {
                let handle = Arc::new(BroodHandle {
                    root,
                    owners: engine.owners().clone(),
                    events: engine.events().clone(),
                    ledger: engine.ledger().clone(),
                    engine,
                    data_dir,
                });
                let weak: std::sync::Weak<dyn std::any::Any + Send + Sync> = Arc::downgrade(&handle) as _;
                let _ = handle.engine.embedder().set(weak);
                Ok(Brood {
                    handle,
                    system,
                    thread: Some(thread),
                })
            }
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e.into())
            }
            Err(_) => {
                let _ = thread.join();
                Err(BroodError::Stopped)
            }
        }
    }

    /// Stops the actors and closes the ledger (everything recorded stays recorded).
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.system.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl BroodHandle {
    /// The engine a runner runs under, to delegate in its own right: a child's calls go to its
    /// own nested session, whose id is its child id ([`RunContext::session_id`]); open it with
    /// [`BroodHandle::open_session`] first, like any session. Refused with
    /// [`BroodError::Stopped`] when the engine is shut down.
    pub fn of(ctx: &RunContext) -> Result<Arc<BroodHandle>, BroodError> {
        ctx.embedder()
            .and_then(|any| any.downcast::<BroodHandle>().ok())
            .ok_or(BroodError::Stopped)
    }

    /// The ledger folder.
    pub fn data_dir(&self) -> &std::path::Path {
        &self.data_dir
    }

    /// The rows that could not be read back and were moved to the quarantine tree, with why.
    pub fn quarantined(&self) -> Result<Vec<Quarantined>, BroodError> {
        Ok(self.ledger.quarantined()?)
    }

    /// The shared list of children waiting for outside workers, when this engine shares its
    /// PostgreSQL ledger with other processes ([`BroodConfig::share`]).
    pub fn work_directory(&self) -> Option<Arc<dyn brood_actors::ledger::WorkDirectory>> {
        self.ledger.work_directory()
    }

    async fn owner(&self, session_id: &str) -> Result<Addr<SessionOwner>, BroodError> {
        if let Some(addr) = self.owners.get(session_id) {
            return Ok(addr.clone());
        }
        self.root.send(GetOwner(session_id.to_string())).await?
    }

    /// A lost answer means the owner died mid-request (or the engine stopped).
    fn lost(&self, session_id: &str, call_id: Option<String>) -> BroodError {
        if self.engine.tenures().is_some_and(|l| !l.holds(session_id)) {
            // Its owner stopped because another process took the session over.
            return BroodError::TenureLapsed {
                session: session_id.to_string(),
            };
        }
        if self.root.connected() {
            BroodError::Interrupted {
                session: session_id.to_string(),
                call_id,
            }
        } else {
            BroodError::Stopped
        }
    }

    /// Sends `msg` to the session's owner.
    pub(crate) async fn ask<M>(&self, session_id: &str, msg: M) -> Result<M::Result, BroodError>
    where
        M: Message + Send + 'static,
        M::Result: Send,
        SessionOwner: Handler<M>,
    {
        let owner = self.owner(session_id).await?;
        owner.send(msg).await.map_err(|_| self.lost(session_id, None))
    }

    /// Creates a session, or updates one (a session from an earlier process keeps its calls
    /// and set ordinals; bind its wake target again after a restart).
    pub async fn open_session(&self, session_id: &str, settings: SessionSettings) -> Result<SessionInfo, BroodError> {
        self.open_session_with_defaults(
            session_id,
            settings,
            brood_actors::model::DEFAULT_MAX_CONCURRENT_CHILDREN,
            brood_actors::model::DEFAULT_MAX_DELIVERY_ATTEMPTS,
        )
        .await
    }

    /// As [`BroodHandle::open_session`], with the limits a session gets when it is new and `settings`
    /// leave them unset (a server's configured defaults).
    pub async fn open_session_with_defaults(
        &self,
        session_id: &str,
        settings: SessionSettings,
        max_concurrent_children: u32,
        max_delivery_attempts: u32,
    ) -> Result<SessionInfo, BroodError> {
        let (_, info) = self
            .root
            .send(OpenSession {
                session_id: session_id.to_string(),
                settings,
                defaults: (max_concurrent_children, max_delivery_attempts),
            })
            .await??;
        Ok(info)
    }

    /// Delegates a call. A background call on a session that is not wake-capable runs
    /// synchronously and says why. A call that did not go through hands its request back.
    pub async fn delegate(&self, session_id: &str, request: DelegateRequest) -> Result<DelegateReply, DelegateError> {
        if let Err(error) = self.parent_running(session_id).await {
            return Err(DelegateError { request, error });
        }
        let request = Arc::new(request);
        let accepted = Arc::new(Mutex::new(None));
        let msg = owner::Delegate {
            request: request.clone(),
            accepted: accepted.clone(),
        };
        let answered = match self.owner(session_id).await {
            Ok(owner) => match owner.send(msg).await {
                Ok(answer) => answer,
                Err(_) => Err(self.lost(session_id, accepted.lock().ok().and_then(|a| a.clone()))),
            },
            Err(e) => Err(e),
        };
        let tasks = request.tasks.len();
        match answered {
            Ok(reply) => Ok(self.reply(session_id, reply, tasks).await),
            Err(error) => {
                let error = match error {
                    BroodError::Interrupted { .. } if !self.root.connected() => BroodError::Stopped,
                    e => e,
                };
                // The owner has let go of its share by now (it answered, or it is gone).
                let request = Arc::try_unwrap(request).unwrap_or_else(|shared| (*shared).clone());
                Err(DelegateError { request, error })
            }
        }
    }

    /// A nested session takes calls only while its child has not ended. (Its owner refuses them
    /// too once told of the end; this covers an owner rebuilt since.)
    async fn parent_running(&self, session_id: &str) -> Result<(), BroodError> {
        let Some(nest) = self.engine.nest(session_id) else {
            return Ok(());
        };
        let Some((call_id, task)) = brood_actors::model::nest_parent(session_id) else {
            return Ok(());
        };
        let ended = || BroodError::ParentEnded {
            session: session_id.to_string(),
        };
        let msg = owner::GetChildStatus {
            call_id: call_id.to_string(),
            task,
        };
        match self.ask(&nest.parent_session_id, msg).await {
            Ok(Some(status)) if !status.is_terminal() => Ok(()),
            Ok(_) | Err(BroodError::UnknownSession(_) | BroodError::SessionFailed { .. }) => Err(ended()),
            Err(e) => Err(e),
        }
    }

    /// The owner's reply with its note (and a sync call's text) rendered; a sync call's results
    /// are received first.
    async fn reply(&self, session_id: &str, mut reply: DelegateReply, tasks: usize) -> DelegateReply {
        match &mut reply {
            DelegateReply::Background { set, units, note, .. } => {
                *note = render::background_note(*set, tasks, units.len());
            }
            DelegateReply::Sync {
                call_id,
                set,
                forced_sync_reason,
                results,
                note,
                text,
                ..
            } => {
                // The results are in hand: only now do they count as delivered. Waiting for that
                // to be durable means a caller that goes on is not handed them again.
                if let Ok(owner) = self.owner(session_id).await {
                    let _ = owner
                        .send(owner::SyncReceived {
                            call_id: call_id.clone(),
                        })
                        .await;
                }
                *note = render::sync_note(*set, forced_sync_reason.as_deref());
                *text = render::envelope_text(results);
            }
        }
        reply
    }

    /// A turn boundary: claims every item of the session ready right now, in one envelope, or
    /// returns `None` when nothing is ready. The lease must be 100 ms to 1 hour.
    pub async fn boundary(
        &self,
        session_id: &str,
        consumer: &str,
        lease: Duration,
    ) -> Result<Option<Envelope>, BroodError> {
        self.boundary_within(session_id, consumer, lease, EnvelopeLimits::NONE)
            .await
    }

    /// A turn boundary whose envelope holds at most what `limits` allow: the oldest ready items
    /// that fit (the first always goes, however large); the rest stay ready for the next
    /// boundary, and [`Envelope::more`] says there are some. A bound of 0 is refused.
    pub async fn boundary_within(
        &self,
        session_id: &str,
        consumer: &str,
        lease: Duration,
        limits: EnvelopeLimits,
    ) -> Result<Option<Envelope>, BroodError> {
        if limits.max_items == Some(0) {
            return Err(BroodError::invalid("max_items", "must be at least 1"));
        }
        if limits.max_bytes == Some(0) {
            return Err(BroodError::invalid("max_bytes", "must be at least 1"));
        }
        let lease_ms = millis("lease_ms", lease)?;
        if !(MIN_LEASE_MS..=MAX_LEASE_MS).contains(&lease_ms) {
            return Err(BroodError::invalid(
                "lease_ms",
                format!("is {lease_ms}; must be from {MIN_LEASE_MS} to {MAX_LEASE_MS}"),
            ));
        }
        if consumer.trim().is_empty() {
            return Err(BroodError::invalid("consumer", "must not be empty"));
        }
        let claimed = self
            .ask(
                session_id,
                owner::ClaimReady {
                    consumer: consumer.to_string(),
                    lease_ms,
                    limits,
                },
            )
            .await??;
        Ok(claimed.map(|mut envelope| {
            envelope.text = render::envelope_text(&envelope.items);
            envelope
        }))
    }

    async fn ask_claim<M>(&self, claim_id: &str, msg: M) -> Result<M::Result, BroodError>
    where
        M: Message + Send + 'static,
        M::Result: Send,
        SessionOwner: Handler<M>,
    {
        let session = claim_session(claim_id).ok_or_else(|| BroodError::UnknownClaim(claim_id.to_string()))?;
        self.ask(&session, msg).await.map_err(|e| match e {
            BroodError::UnknownSession(_) => BroodError::UnknownClaim(claim_id.to_string()),
            e => e,
        })
    }

    /// Acknowledges a claim: its items are delivered, durably, and never delivered again.
    /// Returns how many items the claim delivered (the same again for a repeated ack, also
    /// after a restart).
    pub async fn ack(&self, claim_id: &str) -> Result<usize, BroodError> {
        self.ask_claim(
            claim_id,
            owner::Ack {
                claim_id: claim_id.to_string(),
            },
        )
        .await?
    }

    /// Hands a claim back: its items are ready again after `retry_after` (and, for
    /// [`ReleaseReason::Failed`], after a backoff too). A busy release is no delivery attempt.
    pub async fn release(
        &self,
        claim_id: &str,
        reason: ReleaseReason,
        retry_after: Duration,
    ) -> Result<(), BroodError> {
        let retry_after_ms = millis("retry_after_ms", retry_after)?;
        self.ask_claim(
            claim_id,
            owner::Release {
                claim_id: claim_id.to_string(),
                reason,
                retry_after_ms,
            },
        )
        .await?
    }

    /// Sets a session's turn state (a session is woken only while idle).
    pub async fn set_turn(&self, session_id: &str, turn: Turn) -> Result<(), BroodError> {
        self.ask(session_id, owner::SetTurn(turn)).await
    }

    /// A session's counts, its calls in memory (with their units and children) and its live
    /// claims.
    pub async fn status(&self, session_id: &str) -> Result<SessionStatus, BroodError> {
        self.view(session_id, owner::GetStatus).await
    }

    /// A session's settings, turn and counts only: cheap enough to poll.
    pub async fn counts(&self, session_id: &str) -> Result<SessionCounts, BroodError> {
        self.view(session_id, owner::GetCounts).await
    }

    /// A session's state as its owner here has it, refused ([`BroodError::TenureLapsed`]) as a
    /// boundary is when this process may no longer serve the session: once its tenure could
    /// have run out (a pause, a database outage), another process may have taken the session
    /// over and changed it, and this owner's state would be an older view than the holder's.
    async fn view<M>(&self, session_id: &str, query: M) -> Result<M::Result, BroodError>
    where
        M: Message + Send + 'static,
        M::Result: Send,
        SessionOwner: Handler<M>,
    {
        let st = self.ask(session_id, query).await?;
        if self.engine.tenures().is_some_and(|l| !l.serving(session_id)) {
            return Err(BroodError::TenureLapsed {
                session: session_id.to_string(),
            });
        }
        Ok(st)
    }

    /// A nested session (its child, its parent session, its depth); none for a top-level
    /// session.
    pub fn nest(&self, session_id: &str) -> Option<NestInfo> {
        self.engine.nest(session_id).as_ref().map(NestInfo::from)
    }

    /// The children of a session whose runners wait for an outside worker to take their work
    /// up (an `external` child in its queue, not handed out yet): asked of the runners, cheap
    /// enough for each view of the session.
    pub fn waiting_for_workers(&self, session_id: &str) -> std::collections::HashSet<String> {
        self.engine.factory().waiting_for_workers(session_id)
    }

    /// The ids of the sessions this engine routes, in ascending order (a session given up after
    /// its owner kept failing is not among them).
    pub fn sessions(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.owners.iter().map(|e| e.key().clone()).collect();
        ids.sort();
        ids
    }

    /// Subscribes to what happens in a session from now on: children's status changes, the
    /// ready count, wakes, failure notices and claims, each told once it is applied (durable
    /// where it must be). The receiver holds at most [`brood_actors::events::Events::CAPACITY`]
    /// unread events; a reader that falls further behind gets `Lagged` and has missed the
    /// oldest. Nothing is replayed: what was before is in [`BroodHandle::status`].
    pub async fn subscribe(
        &self,
        session_id: &str,
    ) -> Result<tokio::sync::broadcast::Receiver<Arc<SessionEvent>>, BroodError> {
        self.owner(session_id).await?;
        Ok(self.events.subscribe(session_id))
    }

    /// The engine's running totals (children ended by status, items delivered by kind, wakes,
    /// redriven items, retries): counts that only grow, kept since this engine opened. They
    /// live in memory: a restart starts them from 0, and a delivered call leaving memory takes
    /// nothing from them (unlike [`BroodHandle::status`]'s counts). Each is counted once its
    /// decision is durable; a request that failed counts nothing.
    pub fn totals(&self) -> Totals {
        self.engine.totals()
    }

    /// Forgets which process serves `session`, as this one had found out: a request for it sent
    /// there went unanswered or was refused as moved, and the next asks the ledger who serves
    /// it now. Only of use with a ledger shared by several processes.
    pub fn forget_holder(&self, session_id: &str) {
        self.engine.forget_holder(session_id);
    }

    /// The address of the process serving `session_id`, when another process does as this one
    /// last found out (a request for it is sent on there); none when it is served here, or no
    /// other process is known to serve it. Only of use with a ledger shared by several processes.
    pub fn holder_elsewhere(&self, session_id: &str) -> Option<String> {
        self.engine.holder_elsewhere(session_id)
    }

    /// Whether this process serves `session_id` now (its owner is live here).
    pub fn serves(&self, session_id: &str) -> bool {
        self.owners.contains_key(session_id)
    }

    /// Whether the engine can take work (its actors answer and it can record results), without
    /// reading the ledger: cheap enough for a health probe.
    pub async fn health(&self) -> Result<Health, BroodError> {
        self.root.send(GetHealth).await?
    }

    /// Items that ran out of delivery attempts.
    pub async fn dead_letters(&self) -> Result<Vec<DeadLetterInfo>, BroodError> {
        Ok(self
            .dead_letter_rows()
            .await?
            .iter()
            .map(DeadLetterInfo::from)
            .collect())
    }

    /// The dead-letter rows, as the ledger has them (what a redrive hands the owners).
    pub(crate) async fn dead_letter_rows(&self) -> Result<Vec<brood_actors::model::DeadLetterRow>, BroodError> {
        self.root.send(GetDeadLetters).await?
    }

    /// Drains the engine before a stop: no queued child starts any more (they stay queued,
    /// durably, and start after the next open), and this waits until no child runs or
    /// `timeout` has passed. Calls are still accepted (queued) and results still recorded,
    /// claimed and acked meanwhile. Returns how many children were still running at the end
    /// (0: all ended and their results are recorded).
    pub async fn drain(&self, timeout: Duration) -> usize {
        self.engine.set_admitting(false);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let mut running = 0;
            for id in self.sessions() {
                // Asked of the owner itself: a session whose tenure may have lapsed (a database
                // outage) still has its children running here, and they are waited for.
                running += self.ask(&id, owner::GetCounts).await.map_or(0, |st| st.running);
            }
            if running == 0 || tokio::time::Instant::now() >= deadline {
                return running;
            }
            tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + Duration::from_millis(25))).await;
        }
    }

    /// Restarts a session's owner as its supervisor restarts one that panicked, without the
    /// panic and outside the restart budget: the owner stops and is rebuilt from the session's
    /// own rows in the ledger (its live claims returned, its running children adopted, nothing
    /// recorded lost); requests it had not answered get [`BroodError::Interrupted`]. For
    /// supervision-tree fault testing. Returns once the rebuilt owner answers.
    pub async fn restart_owner(&self, session_id: &str) -> Result<(), BroodError> {
        let old = self.owner(session_id).await?;
        self.root.send(RestartOwner(session_id.to_string())).await??;
        loop {
            if let Some(addr) = self.owners.get(session_id).map(|a| a.clone()) {
                if addr != old && addr.send(owner::GetCounts).await.is_ok() {
                    return Ok(());
                }
            } else {
                // Given up (past its restart budget), or the engine stopped.
                self.root.send(GetOwner(session_id.to_string())).await??;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// The engine's own thread: its actix system and arbiters, the ledger, the engine and its
/// supervisor; tells `started` once every recovered session's owner is registered (or why it
/// could not start), runs until the engine stops, then gives the session tenures back and stops
/// the arbiters (only then may the data folder be opened again).
fn run_engine(config: BroodConfig, started: std::sync::mpsc::Sender<Result<Started, LedgerError>>) {
    let sys = actix::System::new();
    // Units, children and runners get a thread of their own, session owners the routing
    // threads and (with them) the coalescer one more; the supervisor keeps this one.
    let threads = sys.block_on(async { Threads::start(config.routing_threads) });
    let opened = sys.block_on(async {
        let ledger = config.open_ledger()?;
        let engine = config.engine(ledger, threads.children.handle(), threads.routing_handles());
        let root = Supervisor::start_engine(engine.clone(), Default::default())?;
        // Answered once the supervisor started: every recovered session's owner is
        // registered by then, so what `open` returns knows them all.
        let _ = root.send(GetHealth).await;
        Ok::<_, LedgerError>((root, engine))
    });
    match opened {
        Ok((root, engine)) => {
            let (ledger, tenures) = (engine.ledger().clone(), engine.tenures().cloned());
            let _ = started.send(Ok((root, engine, actix::System::current())));
            if let Err(e) = sys.run() {
                tracing::error!("brood actor system ended with an error: {e}");
            }
            if let Some(tenures) = tenures {
                // What was decided is committed first; then the other processes may take the
                // sessions up at once.
                if let Err(e) = ledger.flush() {
                    tracing::warn!("the last flush before giving the session tenures back failed: {e}");
                }
                tenures.release_all();
            }
        }
        Err(e) => {
            let _ = started.send(Err(e));
        }
    }
    threads.stop();
}

/// The arbiters (threads) of an engine besides its system's own: one for units, children and
/// runners; `routing` for session owners; and, with routing threads, one for the coalescer.
struct Threads {
    children: actix::Arbiter,
    routing: Vec<actix::Arbiter>,
    commit: Option<actix::Arbiter>,
}

impl Threads {
    /// Starts them (inside the engine's actix system).
    fn start(routing: usize) -> Threads {
        Threads {
            children: actix::Arbiter::new(),
            routing: (0..routing).map(|_| actix::Arbiter::new()).collect(),
            commit: (routing > 0).then(actix::Arbiter::new),
        }
    }

    /// The routing threads' handles, and the coalescer's.
    fn routing_handles(&self) -> (Vec<actix::ArbiterHandle>, Option<actix::ArbiterHandle>) {
        (
            self.routing.iter().map(|a| a.handle()).collect(),
            self.commit.as_ref().map(|a| a.handle()),
        )
    }

    /// Stops every one and waits for it: everything that holds the ledger is gone after.
    fn stop(self) {
        for a in self.routing.into_iter().chain(self.commit) {
            a.stop();
            let _ = a.join();
        }
        self.children.stop();
        let _ = self.children.join();
    }
}

impl Drop for Brood {
    fn drop(&mut self) {
        self.stop();
    }
}
