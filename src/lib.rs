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
//! use brood::{Brood, BroodConfig, DelegateRequest, DelegateRequestExt, SessionOptions, TaskSpec};
//! use serde_json::json;
//!
//! # async fn demo() -> Result<(), brood::BroodError> {
//! let brood = Brood::open(BroodConfig::new("./brood-data"))?;
//! // Binding a wake target makes the session wake-capable, so background calls stay background.
//! brood.open_session("chat-1", SessionOptions::default().wake(|ev| println!("wake {ev:?}"))).await?;
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

pub mod chaos;
pub mod render;
pub mod runners;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix::{Addr, Handler, Message};
use brood_actors::actors::owner::{self, claim_session, Delegated, OwnerError, SessionOwner};
use brood_actors::actors::supervisor::{DeadLetters, FindOwner, OpenSession, Supervisor};
use brood_actors::actors::Owners;
use brood_actors::ledger::{Ledger, SledLedger};
use brood_actors::routing::ClaimError;

pub use brood_actors::actors::owner::{CallStatus, SessionInfo, SessionStatus, TaskSpec};
pub use brood_actors::ledger::LedgerError;
pub use brood_actors::model::{ChildStatus, DeadLetterRow, ItemKind, Mode, ReadyItem, UnitRow};
pub use brood_actors::routing::{ReleaseReason, Turn};
pub use brood_actors::runner::{Progress, RunContext, RunOutput, Runner, RunnerFactory};
pub use brood_actors::wake::{Wake, WakeEvent};
pub use brood_actors::{actors, failpoints, ledger, model, routing};
pub use runners::Runners;

/// Shortest lease accepted, in ms (API.md).
pub const MIN_LEASE_MS: u64 = 100;
/// Longest lease accepted, in ms (API.md).
pub const MAX_LEASE_MS: u64 = 3_600_000;

/// What went wrong. A refused request changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum BroodError {
    /// The request is malformed: `field` names what, `message` says how to fix it.
    #[error("invalid `{field}`: {message}")]
    Invalid {
        /// The offending field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// No session with that id was opened.
    #[error("unknown session `{0}`; open it first")]
    UnknownSession(String),
    /// No such claim was made.
    #[error("unknown claim `{0}`")]
    UnknownClaim(String),
    /// The claim ended (lease expiry or release) before this ack or release; its items were
    /// returned to the ready set and may be claimed by someone else.
    #[error("claim `{0}` was lost: its lease expired or it was released, and its items went back to the ready set")]
    ClaimLost(String),
    /// The claim was acknowledged already and cannot be released.
    #[error("claim `{0}` was already acknowledged")]
    ClaimAcked(String),
    /// The ledger failed; nothing was reported as done.
    #[error("ledger: {0}")]
    Ledger(String),
    /// The session's owner failed while handling the request and is being restarted from
    /// the ledger; the request may or may not have taken effect. Retry it.
    #[error("the owner of session `{0}` failed while handling the request and was restarted from the ledger; retry")]
    Interrupted(String),
    /// The session's owner kept failing and its supervisor gave it up.
    #[error("session `{session}` failed and is no longer served: {reason}")]
    SessionFailed {
        /// The session.
        session: String,
        /// The last failure.
        reason: String,
    },
    /// The engine is not running (shut down, or it failed to start).
    #[error("the brood engine is not running")]
    Stopped,
}

impl BroodError {
    /// The snake_case code API.md uses for this error.
    pub fn code(&self) -> &'static str {
        match self {
            BroodError::Invalid { .. } => "invalid_request",
            BroodError::UnknownSession(_) => "unknown_session",
            BroodError::UnknownClaim(_) => "unknown_claim",
            BroodError::ClaimLost(_) => "claim_lost",
            BroodError::ClaimAcked(_) => "claim_acked",
            BroodError::Ledger(_) => "ledger_error",
            BroodError::Interrupted(_) => "interrupted",
            BroodError::SessionFailed { .. } => "session_failed",
            BroodError::Stopped => "stopped",
        }
    }
}

impl From<OwnerError> for BroodError {
    fn from(e: OwnerError) -> Self {
        match e {
            OwnerError::Invalid { field, message } => BroodError::Invalid { field, message },
            OwnerError::Claim(ClaimError::Lost(c)) => BroodError::ClaimLost(c),
            OwnerError::Claim(ClaimError::AlreadyAcked(c)) => BroodError::ClaimAcked(c),
            OwnerError::Claim(ClaimError::Unknown(c)) => BroodError::UnknownClaim(c),
            OwnerError::Ledger(m) => BroodError::Ledger(m),
            OwnerError::Stopped => BroodError::Stopped,
            OwnerError::SessionFailed { session, reason } => BroodError::SessionFailed { session, reason },
            OwnerError::UnknownSession(s) => BroodError::UnknownSession(s),
        }
    }
}

impl From<actix::MailboxError> for BroodError {
    fn from(_: actix::MailboxError) -> Self {
        BroodError::Stopped
    }
}

/// How to open the engine.
#[derive(Clone)]
pub struct BroodConfig {
    /// The sled folder.
    pub data_dir: PathBuf,
    /// The runner registry (default: the built-in `sim`).
    pub runners: Arc<dyn RunnerFactory>,
}

impl std::fmt::Debug for BroodConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BroodConfig").field("data_dir", &self.data_dir).finish()
    }
}

impl BroodConfig {
    /// The embedded default: sled in `data_dir`, built-in runners.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        BroodConfig {
            data_dir: data_dir.into(),
            runners: Arc::new(Runners::builtin()),
        }
    }

    /// Uses another runner registry.
    pub fn runners(mut self, runners: impl RunnerFactory) -> Self {
        self.runners = Arc::new(runners);
        self
    }
}

/// Settings of a session; unset fields keep their current (or default) value.
pub use brood_actors::actors::owner::SessionSettings as SessionOptions;

pub use brood_actors::actors::owner::DelegateRequest;

/// Builders for [`DelegateRequest`].
pub trait DelegateRequestExt {
    /// A background call of `tasks` (one unit for all ungrouped tasks).
    fn background(tasks: Vec<TaskSpec>) -> Self;
    /// A sync call of `tasks`.
    fn sync(tasks: Vec<TaskSpec>) -> Self;
    /// Makes each ungrouped task its own unit.
    fn independent(self) -> Self;
}

impl DelegateRequestExt for DelegateRequest {
    fn background(tasks: Vec<TaskSpec>) -> Self {
        DelegateRequest {
            tasks,
            mode: Mode::Background,
            independent_completions: false,
        }
    }
    fn sync(tasks: Vec<TaskSpec>) -> Self {
        DelegateRequest {
            tasks,
            mode: Mode::Sync,
            independent_completions: false,
        }
    }
    fn independent(mut self) -> Self {
        self.independent_completions = true;
        self
    }
}

/// What a delegate call answers.
#[derive(Debug, Clone)]
pub enum DelegateReply {
    /// Accepted in the background: results come at turn boundaries.
    Background {
        /// `deleg_<hex>`.
        call_id: String,
        /// The call's set ordinal in its session.
        set: u64,
        /// Its completion units.
        units: Vec<UnitRow>,
        /// What the model should do now (finish independent work, end the turn).
        note: String,
    },
    /// Ran synchronously: the results are here and count as delivered.
    Sync {
        /// `deleg_<hex>`.
        call_id: String,
        /// The call's set ordinal in its session.
        set: u64,
        /// Its completion units.
        units: Vec<UnitRow>,
        /// Why a background call was forced to sync, if it was.
        forced_sync_reason: Option<String>,
        /// Every child's result.
        results: Vec<ReadyItem>,
        /// The note, then the rendered results.
        note: String,
        /// The results rendered as an envelope's text.
        text: String,
    },
}

impl DelegateReply {
    /// The call id.
    pub fn call_id(&self) -> &str {
        match self {
            DelegateReply::Background { call_id, .. } | DelegateReply::Sync { call_id, .. } => call_id,
        }
    }

    /// The set ordinal.
    pub fn set(&self) -> u64 {
        match self {
            DelegateReply::Background { set, .. } | DelegateReply::Sync { set, .. } => *set,
        }
    }

    /// The note for the model.
    pub fn note(&self) -> &str {
        match self {
            DelegateReply::Background { note, .. } | DelegateReply::Sync { note, .. } => note,
        }
    }
}

/// Everything ready at one boundary, owned by one claim.
#[derive(Debug, Clone)]
pub struct Envelope {
    /// The claim that owns the items; ack or release it.
    pub claim_id: String,
    /// Who holds the claim.
    pub consumer: String,
    /// When the lease runs out (ms since the epoch).
    pub lease_expires_at_ms: u64,
    /// The items, by set, unit and task.
    pub items: Vec<ReadyItem>,
    /// What a model reads.
    pub text: String,
}

/// The embedded engine. Cheap to share behind an `Arc`; shut it down with [`Brood::shutdown`]
/// (dropping it does the same). Shutting down joins the engine's threads, so never drop the
/// last handle from inside a wake callback or a runner.
pub struct Brood {
    root: Addr<Supervisor>,
    owners: Owners,
    system: actix::System,
    thread: Option<std::thread::JoinHandle<()>>,
    data_dir: PathBuf,
}

impl std::fmt::Debug for Brood {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Brood").field("data_dir", &self.data_dir).finish()
    }
}

impl Brood {
    /// Opens the ledger in `config.data_dir`, recovers what an earlier process left (I6) and
    /// starts the actors on a thread of their own.
    pub fn open(config: BroodConfig) -> Result<Brood, BroodError> {
        let (tx, rx) = std::sync::mpsc::channel();
        let dir = config.data_dir.clone();
        let runners = config.runners.clone();
        let thread = std::thread::Builder::new()
            .name("brood-actors".into())
            .spawn(move || {
                let sys = actix::System::new();
                // Units, children and runners get a thread of their own; routing keeps this one.
                let children = sys.block_on(async { actix::Arbiter::new() });
                let handle = children.handle();
                let started = sys.block_on(async move {
                    let ledger: Arc<dyn Ledger> = Arc::new(SledLedger::open(&dir)?);
                    Supervisor::start(ledger, runners, handle)
                });
                match started {
                    Ok(root) => {
                        let _ = tx.send(Ok((root, actix::System::current())));
                        if let Err(e) = sys.run() {
                            tracing::error!("brood actor system ended with an error: {e}");
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                }
                // Everything that holds the ledger is gone once both threads are: only then
                // may the folder be opened again.
                children.stop();
                let _ = children.join();
            })
            .map_err(|e| BroodError::Ledger(format!("starting the actor thread: {e}")))?;
        match rx.recv() {
            Ok(Ok(((root, owners), system))) => Ok(Brood {
                root,
                owners,
                system,
                thread: Some(thread),
                data_dir: config.data_dir,
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(BroodError::Ledger(e.to_string()))
            }
            Err(_) => {
                let _ = thread.join();
                Err(BroodError::Stopped)
            }
        }
    }

    /// The ledger folder.
    pub fn data_dir(&self) -> &std::path::Path {
        &self.data_dir
    }

    async fn owner(&self, session_id: &str) -> Result<Addr<SessionOwner>, BroodError> {
        if let Some(addr) = self.owners.get(session_id) {
            return Ok(addr.clone());
        }
        Ok(self.root.send(FindOwner(session_id.to_string())).await??)
    }

    /// Sends `msg` to the session's owner; a lost answer means the owner died mid-request.
    async fn ask<M>(&self, session_id: &str, msg: M) -> Result<M::Result, BroodError>
    where
        M: Message + Send + 'static,
        M::Result: Send,
        SessionOwner: Handler<M>,
    {
        let owner = self.owner(session_id).await?;
        owner.send(msg).await.map_err(|_| {
            if self.root.connected() {
                BroodError::Interrupted(session_id.to_string())
            } else {
                BroodError::Stopped
            }
        })
    }

    /// Creates a session, or updates one (a session from an earlier process keeps its calls
    /// and set ordinals; bind its wake target again after a restart).
    pub async fn open_session(&self, session_id: &str, options: SessionOptions) -> Result<SessionInfo, BroodError> {
        let (_, info) = self
            .root
            .send(OpenSession {
                session_id: session_id.to_string(),
                settings: options,
            })
            .await??;
        Ok(info)
    }

    /// Delegates a call. A background call on a session that is not wake-capable runs
    /// synchronously and says why.
    pub async fn delegate(&self, session_id: &str, request: DelegateRequest) -> Result<DelegateReply, BroodError> {
        let tasks = request.tasks.len();
        Ok(match self.ask(session_id, owner::Delegate(request)).await?? {
            Delegated::Background { call_id, set, units } => {
                let note = render::background_note(set, tasks, units.len());
                DelegateReply::Background {
                    call_id,
                    set,
                    units,
                    note,
                }
            }
            Delegated::Sync {
                call_id,
                set,
                units,
                forced_sync_reason,
                results,
            } => {
                // The results are in hand: only now do they count as delivered.
                if let Ok(owner) = self.owner(session_id).await {
                    owner.do_send(owner::SyncReceived {
                        call_id: call_id.clone(),
                    });
                }
                let note = render::sync_note(set, forced_sync_reason.as_deref());
                let text = render::envelope_text(&results);
                DelegateReply::Sync {
                    call_id,
                    set,
                    units,
                    forced_sync_reason,
                    results,
                    note,
                    text,
                }
            }
        })
    }

    /// A turn boundary: claims every item of the session ready right now, in one envelope, or
    /// returns `None` when nothing is ready. The lease must be 100 ms to 1 hour.
    pub async fn boundary(
        &self,
        session_id: &str,
        consumer: &str,
        lease: Duration,
    ) -> Result<Option<Envelope>, BroodError> {
        let lease_ms = lease.as_millis() as u64;
        if !(MIN_LEASE_MS..=MAX_LEASE_MS).contains(&lease_ms) {
            return Err(BroodError::Invalid {
                field: "lease_ms".into(),
                message: format!("is {lease_ms}; must be from {MIN_LEASE_MS} to {MAX_LEASE_MS}"),
            });
        }
        if consumer.trim().is_empty() {
            return Err(BroodError::Invalid {
                field: "consumer".into(),
                message: "must not be empty".into(),
            });
        }
        let claimed = self
            .ask(
                session_id,
                owner::Boundary {
                    consumer: consumer.to_string(),
                    lease_ms,
                },
            )
            .await??;
        Ok(claimed.map(|c| Envelope {
            text: render::envelope_text(&c.items),
            claim_id: c.claim_id,
            consumer: c.consumer,
            lease_expires_at_ms: c.lease_expires_at_ms,
            items: c.items,
        }))
    }

    /// The session a claim id names, refusing ids that are not claims.
    fn claim_session(claim_id: &str) -> Result<String, BroodError> {
        claim_session(claim_id).ok_or_else(|| BroodError::UnknownClaim(claim_id.to_string()))
    }

    async fn ask_claim<M>(&self, claim_id: &str, msg: M) -> Result<M::Result, BroodError>
    where
        M: Message + Send + 'static,
        M::Result: Send,
        SessionOwner: Handler<M>,
    {
        let session = Self::claim_session(claim_id)?;
        self.ask(&session, msg).await.map_err(|e| match e {
            BroodError::UnknownSession(_) => BroodError::UnknownClaim(claim_id.to_string()),
            e => e,
        })
    }

    /// Acknowledges a claim: its items are delivered, durably, and never delivered again.
    /// Returns how many items the claim delivered (the same again for a repeated ack).
    pub async fn ack(&self, claim_id: &str) -> Result<usize, BroodError> {
        Ok(self
            .ask_claim(
                claim_id,
                owner::Ack {
                    claim_id: claim_id.to_string(),
                },
            )
            .await??)
    }

    /// Hands a claim back: its items are ready again after `retry_after` (and, for
    /// [`ReleaseReason::Failed`], after a backoff too).
    pub async fn release(
        &self,
        claim_id: &str,
        reason: ReleaseReason,
        retry_after: Duration,
    ) -> Result<(), BroodError> {
        let retry_after_ms = retry_after.as_millis() as u64;
        Ok(self
            .ask_claim(
                claim_id,
                owner::Release {
                    claim_id: claim_id.to_string(),
                    reason,
                    retry_after_ms,
                },
            )
            .await??)
    }

    /// Sets a session's turn state (a session is woken only while idle).
    pub async fn set_turn(&self, session_id: &str, turn: Turn) -> Result<(), BroodError> {
        self.ask(session_id, owner::SetTurn(turn)).await
    }

    /// A session's counts and live calls.
    pub async fn status(&self, session_id: &str) -> Result<SessionStatus, BroodError> {
        self.ask(session_id, owner::Status { calls: true }).await
    }

    /// A session's counts only (`calls` left empty): cheap enough to poll.
    pub async fn counts(&self, session_id: &str) -> Result<SessionStatus, BroodError> {
        self.ask(session_id, owner::Status { calls: false }).await
    }

    /// Items that ran out of delivery attempts.
    pub async fn dead_letters(&self) -> Result<Vec<DeadLetterRow>, BroodError> {
        Ok(self.root.send(DeadLetters).await??)
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

impl Drop for Brood {
    fn drop(&mut self) {
        self.stop();
    }
}
