//! The `external` runner and the work queues outside workers poll (API.md, "External workers").
//!
//! `{"kind": "external", "queue": "default"}` puts its child on a named queue of
//! [`WorkQueues`] and waits. A worker takes it with [`WorkQueues::poll`] and gets a hold (what
//! API.md calls the worker's lease: `lease_ms`) and a token; it renews the hold with [`WorkQueues::heartbeat`] and ends the child with
//! [`WorkQueues::complete`], whose output is what the runner returns.
//!
//! - **Holds.** A worker that stops heartbeating loses the child when its hold runs out: the
//!   child goes back to the front of its queue, a later poll gets it with a new token, and the
//!   old token is stale (every call with it is refused). The runner's own timer takes the hold
//!   back at its expiry, so that happens even when nobody polls; a heartbeat or completion that
//!   arrives after the expiry is refused the same way, whoever looks first.
//! - **Stall clock.** A child waiting for a worker is not stalled: the runner beats the child's
//!   stall clock every second while it is queued. Once a worker has the hold, only that
//!   worker beats it (the poll that hands it out, then each heartbeat), so a worker silent for
//!   longer than the task's `stall_ms` gets the child interrupted even within its hold. The
//!   task's `timeout_ms` bounds the whole wait, queued or held.
//! - **End of the runner.** When the runner is dropped (timeout, stall, cancel, shutdown) or
//!   returns, its child leaves the queues. A cancel takes it out of its queue already when it
//!   is decided, and its worker is answered as below from then on. A worker that still held it
//!   (brood ended it: a cancel, a timeout, a stall) then gets [`WorkError::Ended`] (409): the
//!   queues remember the last `ENDED_KEPT` such children. Any other id gets
//!   [`WorkError::UnknownChild`] (404), and the server looks it up in the ledger.
//! - **A completion holds once it is recorded.** [`WorkQueues::complete`] hands the worker's
//!   output to the runner and answers a [`Completing`]: what became of the child's terminal row
//!   ([`WorkQueues::recorded`], told by the engine through [`RunnerFactory::recorded`]). It is
//!   this completion when the row stored has its status; it is not when brood ended the child
//!   first ([`WorkError::Ended`]), or when the row was refused because the child's session
//!   moved to another process ([`WorkError::Refused`]). The same completion sent again while
//!   its row is on its way waits for the same answer.
//!
//! The queues are shared between the engine's runner thread (runners are `!Send` futures) and
//! the HTTP workers: one `std` mutex over the `Roster` (pure bookkeeping, every decision takes
//! the time as an argument), a `tokio` [`Notify`] that wakes long polls, and a oneshot per child
//! that carries the worker's output to its runner. Nothing is durable here: after a restart,
//! recovery decides what becomes of a child that was queued or held (DESIGN.md I6).

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use brood_actors::ledger::WorkDirectory;
use brood_actors::model::{ChildInfo, ChildStatus};
#[cfg(doc)]
use brood_actors::runner::RunnerFactory;
use brood_actors::runner::{Progress, RecordOutcome, RunContext, RunOutput, Runner};
use futures::future::LocalBoxFuture;
use serde::Deserialize;
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

/// The queue of a spec that names none.
pub const DEFAULT_QUEUE: &str = "default";
/// The longest queue name, in characters.
pub const MAX_QUEUE_CHARS: usize = 128;
/// How often the runner beats the stall clock while its child waits for a worker.
const QUEUED_BEAT: Duration = Duration::from_secs(1);

/// Checks a queue name: non-empty, at most [`MAX_QUEUE_CHARS`], no control characters.
pub fn check_queue(queue: &str) -> Result<(), String> {
    if queue.is_empty() {
        return Err("`queue` must not be empty".into());
    }
    let chars = queue.chars().count();
    if chars > MAX_QUEUE_CHARS {
        return Err(format!(
            "`queue` is {chars} characters long; at most {MAX_QUEUE_CHARS} are allowed"
        ));
    }
    if queue.chars().any(char::is_control) {
        return Err("`queue` must not contain control characters".into());
    }
    Ok(())
}

/// The `external` runner spec: `{"kind": "external", "queue": "default"}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalSpec {
    /// Always `external`.
    pub kind: String,
    /// The queue workers poll for it (default `default`).
    #[serde(default = "default_queue")]
    pub queue: String,
}

fn default_queue() -> String {
    DEFAULT_QUEUE.to_string()
}

impl ExternalSpec {
    /// Checks a spec; the error names the field that is wrong.
    pub fn parse(spec: &serde_json::Value) -> Result<Self, String> {
        let e: ExternalSpec = super::parse_spec("external", spec)?;
        check_queue(&e.queue)?;
        Ok(e)
    }
}

/// What a poll hands a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handout {
    /// The child to run.
    pub child_id: String,
    /// What it is to do.
    pub work: Work,
    /// The token every heartbeat and the completion must carry.
    pub token: String,
    /// The hold, in ms: heartbeat within it (API.md's `lease_ms` of a poll's answer).
    pub hold_ms: u64,
}

/// What a worker is told of the child it runs, besides its id, token and hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Work {
    /// Its goal.
    pub goal: String,
    /// Its task's data.
    pub input: Option<serde_json::Value>,
    /// The session whose call made it.
    pub session_id: String,
    /// The call that made it.
    pub call_id: String,
    /// Its execution attempt (1 for the first run).
    pub attempt: u32,
    /// When it times out (ms since the epoch), when its task has a timeout.
    pub deadline_at_ms: Option<u64>,
}

impl Work {
    /// What `ctx`'s child is to do.
    fn of(ctx: &RunContext) -> Self {
        Work {
            goal: ctx.goal.clone(),
            input: ctx.input.clone(),
            session_id: ctx.parent_session_id.clone(),
            call_id: ctx.call_id.clone(),
            attempt: ctx.attempt,
            deadline_at_ms: ctx.deadline_at_ms,
        }
    }
}

/// Why a worker's heartbeat or completion was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkError {
    /// No queue holds the child: the id is wrong, or its runner ended (completed, timed out,
    /// stalled, cancelled, or the server stopped).
    #[error("no worker queue holds child `{0}`: the id is wrong, or the child ended (completed, timed out, stalled or cancelled)")]
    UnknownChild(String),
    /// Brood ended the child while this worker held it (it was cancelled, or it timed out or
    /// stalled): the worker should stop working on it; what it reports is not taken.
    #[error(
        "child `{0}` has ended and its outcome is recorded (a completion other than this one, a cancel, a timeout or a stall); nothing was changed: stop working on it"
    )]
    Ended(String),
    /// The token is not the child's current hold: it ran out (the child went back to its
    /// queue) or the token is wrong. The worker should stop working on the child.
    #[error("the token is not the current hold of child `{0}`: the hold ran out and the child went back to its queue, or the token is wrong; stop working on it")]
    StaleToken(String),
    /// The completion was not recorded: the child's session moved to another process before
    /// its row was written, and the session's new holder decides what becomes of the child.
    #[error("the result of child `{0}` was not recorded: its session moved to another process first, which runs the child again or records it `unknown`; stop working on it")]
    Refused(String),
    /// The completion was handed to the child but its row is not recorded yet (the ledger is
    /// slow or unavailable): sending the same completion again answers what became of it.
    #[error(
        "the result of child `{0}` is taken but not recorded yet; send the same completion again to learn its outcome"
    )]
    NotRecorded(String),
}

/// How a worker ended its child: what its completion is compared with, in the queues and in
/// the ledger.
fn outcome_of(output: &RunOutput) -> (ChildStatus, Option<&str>, Option<&str>, Option<&serde_json::Value>) {
    let (status, summary, error, output) = match output {
        RunOutput::Succeeded { summary, output } => (ChildStatus::Succeeded, Some(summary.as_str()), None, output),
        RunOutput::Failed { error, summary, output } => {
            (ChildStatus::Failed, summary.as_deref(), Some(error.as_str()), output)
        }
    };
    (status, summary, error, output.as_ref().filter(|v| !v.is_null()))
}

/// Whether what was recorded of an ended child is the end `output` gives it: the same status,
/// summary, error and data (a completion sent again, after its answer was lost or a restart).
pub fn is_recorded_as(row: &ChildInfo, output: &RunOutput) -> bool {
    let (status, summary, error, data) = outcome_of(output);
    let recorded = row.output.as_deref().map(serde_json::from_str::<serde_json::Value>);
    let same_data = match (recorded, data) {
        (None, None) => true,
        (Some(Ok(recorded)), Some(data)) => &recorded == data,
        _ => false,
    };
    row.status.is_terminal()
        && (row.status, row.summary.as_deref(), row.error.as_deref()) == (status, summary, error)
        && same_data
}

/// What a completion handed to its child comes to, once the engine answered its row: `Ok`
/// when the row stored is this completion's (its status); why not otherwise. `None`: the child
/// let go of its runner without this output (brood ended it first).
pub fn completion_outcome(
    child_id: &str,
    output: &RunOutput,
    recorded: Option<RecordOutcome>,
) -> Result<(), WorkError> {
    match recorded {
        Some(RecordOutcome::Stored(status)) if status == outcome_of(output).0 => Ok(()),
        Some(RecordOutcome::Stored(_)) | None => Err(WorkError::Ended(child_id.to_string())),
        Some(RecordOutcome::Refused) => Err(WorkError::Refused(child_id.to_string())),
    }
}

/// A completion on its way to the ledger: [`Completing::outcome`] answers once its row is.
#[derive(Debug)]
pub struct Completing {
    child_id: String,
    output: RunOutput,
    recorded: oneshot::Receiver<RecordOutcome>,
}

impl Completing {
    /// What became of the completion, waiting at most `wait` for its row to be answered
    /// ([`WorkError::NotRecorded`] past it).
    pub async fn outcome(self, wait: Duration) -> Result<RunOutput, WorkError> {
        let recorded = match tokio::time::timeout(wait, self.recorded).await {
            Err(_) => return Err(WorkError::NotRecorded(self.child_id)),
            Ok(answer) => answer.ok(),
        };
        completion_outcome(&self.child_id, &self.output, recorded).map(|()| self.output)
    }
}

/// A completion handed to a child whose row was not answered yet, and who waits for it.
struct Recording {
    token: String,
    output: RunOutput,
    waiters: Vec<oneshot::Sender<RecordOutcome>>,
}

/// A worker's hold on a child.
#[derive(Debug, Clone)]
struct Hold {
    token: String,
    worker: String,
    /// How long it lasts from a hand-out or a heartbeat.
    period: Duration,
    expires_at: Instant,
}

/// One queued or held child; `P` is its stall-clock handle ([`Progress`] outside tests).
struct Entry<P> {
    /// Which run of the child this is (a re-run replaces the entry; only its own ticket may
    /// remove it).
    ticket: u64,
    queue: String,
    work: Work,
    progress: P,
    hold: Option<Hold>,
    done: oneshot::Sender<RunOutput>,
    /// Brood cancelled the child: no worker gets it, and its worker is answered as if it had
    /// ended. The entry stays (with `done`, so its runner does not end on its own) until the
    /// runner is dropped.
    cancelled: bool,
}

impl<P> Entry<P> {
    /// Whether the child waits for a worker: no worker holds it and brood did not cancel it
    /// (what [`Roster`]'s `waiting` holds).
    fn waits(&self) -> bool {
        self.hold.is_none() && !self.cancelled
    }

    /// What listing the child needs: its session and its queue.
    fn listing(&self) -> (String, String) {
        (self.work.session_id.clone(), self.queue.clone())
    }
}

/// Where a child stands, as its runner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    /// Waiting in its queue for a worker.
    Queued,
    /// Held by a worker until then.
    Held {
        /// When the hold runs out.
        expires_at: Instant,
    },
    /// Not in the queues any more.
    Gone,
}

/// The queues' roster: which children wait in which queue, in order, and which worker holds
/// each of the rest. Pure: the caller passes the time and the new tokens, and beats the stall clocks `P`
/// it is handed back.
///
/// Invariant: a child is in `waiting` exactly when it has an entry without a hold that is not
/// cancelled.
struct Roster<P> {
    entries: HashMap<String, Entry<P>>,
    waiting: HashMap<String, VecDeque<String>>,
    next_ticket: u64,
    /// Children brood ended while a worker held them (cancelled, timed out, stalled), newest
    /// last, at most [`ENDED_KEPT`]: their worker's next call is answered 409, not 404.
    ended: VecDeque<String>,
    ended_set: HashSet<String>,
    /// Completions handed to their children whose rows are not answered yet (at most one per
    /// live child).
    recording: HashMap<String, Recording>,
}

/// How many children brood took from their workers are remembered as such.
const ENDED_KEPT: usize = 10_000;

impl<P> Default for Roster<P> {
    fn default() -> Self {
        Roster {
            entries: HashMap::new(),
            waiting: HashMap::new(),
            next_ticket: 0,
            ended: VecDeque::new(),
            ended_set: HashSet::new(),
            recording: HashMap::new(),
        }
    }
}

impl<P> fmt::Debug for Roster<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Roster")
            .field("children", &self.entries.len())
            .field("queues", &self.waiting.len())
            .finish()
    }
}

impl<P: Clone> Roster<P> {
    /// Queues a child at the back of `queue`; answers its ticket.
    fn enqueue(
        &mut self,
        child_id: &str,
        queue: &str,
        work: Work,
        progress: P,
        done: oneshot::Sender<RunOutput>,
    ) -> u64 {
        self.next_ticket += 1;
        let ticket = self.next_ticket;
        if let Some(old) = self.entries.remove(child_id) {
            // An earlier run of the same child that was not removed yet: this run replaces it.
            self.unwait(child_id, &old.queue);
        }
        self.entries.insert(
            child_id.to_string(),
            Entry {
                ticket,
                queue: queue.to_string(),
                work,
                progress,
                hold: None,
                done,
                cancelled: false,
            },
        );
        self.waiting
            .entry(queue.to_string())
            .or_default()
            .push_back(child_id.to_string());
        ticket
    }

    /// The children of session `session_id` in `waiting`.
    fn waiting_of(&self, session_id: &str) -> HashSet<String> {
        self.waiting
            .values()
            .flatten()
            .filter(|c| self.entries.get(*c).is_some_and(|e| e.work.session_id == session_id))
            .cloned()
            .collect()
    }

    fn unwait(&mut self, child_id: &str, queue: &str) {
        if let Some(q) = self.waiting.get_mut(queue) {
            q.retain(|c| c != child_id);
            if q.is_empty() {
                self.waiting.remove(queue);
            }
        }
    }

    /// Marks a child cancelled ([`Entry::cancelled`]) and takes it out of its queue; false when
    /// no queue holds it (or it was marked already).
    fn cancel(&mut self, child_id: &str) -> bool {
        let Some(entry) = self.entries.get_mut(child_id).filter(|e| !e.cancelled) else {
            return false;
        };
        entry.cancelled = true;
        let queue = entry.queue.clone();
        self.unwait(child_id, &queue);
        true
    }

    /// Removes the run `ticket` of a child (its runner ended). One a worker held and did not
    /// complete was ended by brood: it is remembered, so that worker hears 409.
    fn remove(&mut self, child_id: &str, ticket: u64) -> bool {
        let mine = self.entries.get(child_id).is_some_and(|e| e.ticket == ticket);
        if mine {
            if let Some(e) = self.entries.remove(child_id) {
                self.unwait(child_id, &e.queue);
                if e.hold.is_some() && self.ended_set.insert(child_id.to_string()) {
                    self.ended.push_back(child_id.to_string());
                    if self.ended.len() > ENDED_KEPT {
                        if let Some(old) = self.ended.pop_front() {
                            self.ended_set.remove(&old);
                        }
                    }
                }
            }
        }
        mine
    }

    /// Gives `worker` a hold on the child at the front of `queue`; answers it with its stall clock.
    fn hand_out(
        &mut self,
        queue: &str,
        worker: &str,
        hold: Duration,
        token: String,
        now: Instant,
    ) -> Option<(Handout, P)> {
        let q = self.waiting.get_mut(queue)?;
        let child_id = q.pop_front()?;
        if q.is_empty() {
            self.waiting.remove(queue);
        }
        let entry = self.entries.get_mut(&child_id);
        debug_assert!(
            entry.as_ref().is_some_and(|e| e.hold.is_none()),
            "a waiting child has an entry without a hold"
        );
        let entry = entry?;
        entry.hold = Some(Hold {
            token: token.clone(),
            worker: worker.to_string(),
            period: hold,
            expires_at: now + hold,
        });
        let handout = Handout {
            child_id,
            work: entry.work.clone(),
            token,
            hold_ms: hold.as_millis() as u64,
        };
        Some((handout, entry.progress.clone()))
    }

    /// Gives `worker` a hold on the waiting child `child_id` (a worker polling another process was
    /// handed it from the shared list); none when it is not waiting here.
    fn hand_out_child(
        &mut self,
        child_id: &str,
        worker: &str,
        hold: Duration,
        token: String,
        now: Instant,
    ) -> Option<(Handout, P)> {
        let entry = self.entries.get(child_id).filter(|e| e.waits())?;
        let queue = entry.queue.clone();
        let q = self.waiting.get_mut(&queue)?;
        let at = q.iter().position(|c| c == child_id)?;
        q.remove(at);
        q.push_front(child_id.to_string());
        self.hand_out(&queue, worker, hold, token, now)
    }

    /// Takes a lapsed hold back: the child goes to the front of its queue. Answers where the
    /// child stands afterwards, and whether it went back.
    fn expire(&mut self, child_id: &str, now: Instant) -> (Standing, bool) {
        let Some(entry) = self.entries.get_mut(child_id).filter(|e| !e.cancelled) else {
            return (Standing::Gone, false);
        };
        match &entry.hold {
            None => (Standing::Queued, false),
            Some(l) if l.expires_at > now => (
                Standing::Held {
                    expires_at: l.expires_at,
                },
                false,
            ),
            Some(l) => {
                tracing::debug!(child = %child_id, worker = %crate::printable(&l.worker), "worker hold ran out; the child is queued again");
                entry.hold = None;
                self.waiting
                    .entry(entry.queue.clone())
                    .or_default()
                    .push_front(child_id.to_string());
                (Standing::Queued, true)
            }
        }
    }

    /// Ends the hold `token` of `child_id` now (its holder is known to be nobody), so that the
    /// next [`Roster::expire`] takes it back; whether it was that hold.
    fn lapse(&mut self, child_id: &str, token: &str, now: Instant) -> bool {
        match self.entries.get_mut(child_id).and_then(|e| e.hold.as_mut()) {
            Some(l) if l.token == token => {
                l.expires_at = now;
                true
            }
            _ => false,
        }
    }

    /// The entry of a child whose current hold `token` is: one that lapsed is not (it is taken
    /// back by [`WorkQueues::expire`], which lists it again for the other processes too; taken
    /// back here, it would wait in its queue unlisted).
    fn held(&mut self, child_id: &str, token: &str, now: Instant) -> Result<&mut Entry<P>, WorkError> {
        let ended = self.ended_set.contains(child_id) || self.recording.contains_key(child_id);
        let entry = self.entries.get_mut(child_id).ok_or_else(|| match ended {
            true => WorkError::Ended(child_id.to_string()),
            false => WorkError::UnknownChild(child_id.to_string()),
        })?;
        match &entry.hold {
            _ if entry.cancelled => Err(WorkError::Ended(child_id.to_string())),
            Some(l) if l.token == token && l.expires_at > now => Ok(entry),
            _ => Err(WorkError::StaleToken(child_id.to_string())),
        }
    }

    /// Renews a hold for another hold period from `now`; answers that period and the
    /// child's stall clock.
    fn renew(&mut self, child_id: &str, token: &str, now: Instant) -> Result<(Duration, P), WorkError> {
        let entry = self.held(child_id, token, now)?;
        let hold = entry.hold.as_mut().expect("held() answers a held entry");
        hold.expires_at = now + hold.period;
        Ok((hold.period, entry.progress.clone()))
    }

    /// Ends a held child with `output`: removes it, keeps the completion (and `waiter`)
    /// until its row is answered, and answers where its output goes. The same completion again
    /// while its row is on its way only adds `waiter` (`None` answered); another is refused.
    fn finish(
        &mut self,
        child_id: &str,
        token: &str,
        output: &RunOutput,
        waiter: oneshot::Sender<RecordOutcome>,
        now: Instant,
    ) -> Result<Option<oneshot::Sender<RunOutput>>, WorkError> {
        if let Some(r) = self.recording.get_mut(child_id) {
            if r.token == token && r.output == *output {
                r.waiters.push(waiter);
                return Ok(None);
            }
            return Err(WorkError::Ended(child_id.to_string()));
        }
        self.held(child_id, token, now)?;
        let entry = self
            .entries
            .remove(child_id)
            .ok_or_else(|| WorkError::UnknownChild(child_id.to_string()))?;
        self.recording.insert(
            child_id.to_string(),
            Recording {
                token: token.to_string(),
                output: output.clone(),
                waiters: vec![waiter],
            },
        );
        Ok(Some(entry.done))
    }

    /// The row of `child_id` was answered: whoever waits for its completion, told now.
    fn recorded(&mut self, child_id: &str) -> Vec<oneshot::Sender<RecordOutcome>> {
        self.recording.remove(child_id).map(|r| r.waiters).unwrap_or_default()
    }
}

/// The work queues of `external` children, shared by their runners and the worker endpoints.
#[derive(Debug, Default)]
pub struct WorkQueues {
    roster: Mutex<Roster<Progress>>,
    /// Wakes long polls when a child is queued (or queued again).
    queued: Notify,
    /// When several processes share the ledger: the shared list of waiting children, and where
    /// this process takes requests (named in its tokens).
    shared: std::sync::OnceLock<(Arc<dyn WorkDirectory>, String)>,
    /// How many completions wait for their rows (the roster's `recording`), read without the
    /// lock by [`WorkQueues::recorded`], which every child's end calls.
    awaiting: std::sync::atomic::AtomicUsize,
    /// Takes other processes asked for by id (see [`WorkQueues::take`], [`WorkQueues::untake`]).
    takes: Mutex<Takes>,
}

/// What became of the takes other processes asked for, by their take id, oldest first (at most
/// [`MAX_TAKES`]): the child and token handed out, or given up by the asker before it was.
#[derive(Debug, Default)]
struct Takes {
    by_id: std::collections::HashMap<String, Take>,
    order: std::collections::VecDeque<String>,
}

#[derive(Debug)]
enum Take {
    Handed { child_id: String, token: String },
    GivenUp,
}

/// Takes remembered at most: one that would be forgotten sooner was answered long ago (an
/// asker gives up within seconds).
const MAX_TAKES: usize = 10_000;

impl Takes {
    fn remember(&mut self, id: &str, take: Take) {
        if self.by_id.insert(id.to_string(), take).is_none() {
            self.order.push_back(id.to_string());
        }
        while self.order.len() > MAX_TAKES {
            if let Some(old) = self.order.pop_front() {
                self.by_id.remove(&old);
            }
        }
    }

    /// Whether the take `id`, read now, may hand its child out: not if its asker gave it up
    /// first, nor if it was served already (the same take read again). Either record stays:
    /// for the asker's give-up to find, and to refuse the take read yet again.
    fn may_serve(&self, id: &str) -> bool {
        !self.by_id.contains_key(id)
    }

    fn forget(&mut self, id: &str) -> Option<Take> {
        let take = self.by_id.remove(id)?;
        self.order.retain(|o| o != id);
        Some(take)
    }
}

impl WorkQueues {
    /// Empty queues.
    pub fn new() -> Self {
        Self::default()
    }

    fn roster(&self) -> MutexGuard<'_, Roster<Progress>> {
        // The roster's methods do not panic between changes; a poisoned lock holds a whole roster.
        self.roster.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lists this process's waiting children in `directory` from now on, for workers polling
    /// the other processes sharing the ledger; its tokens name `address`, so a heartbeat or
    /// completion that reaches another process is sent on here.
    ///
    /// The children waiting already (those of the sessions recovered as the engine opened,
    /// queued before the list was there) are listed now.
    pub fn share(&self, directory: Arc<dyn WorkDirectory>, address: String) {
        if self.shared.set((directory, address)).is_err() {
            tracing::warn!("the work queues were shared already");
            return;
        }
        // Under the roster's lock: a handout after this look withdraws after these posts.
        let roster = self.roster();
        for (child_id, entry) in &roster.entries {
            if entry.waits() {
                let (session_id, queue) = entry.listing();
                self.post(&session_id, child_id, &queue);
            }
        }
    }

    /// The shared list, when the queues are shared.
    pub fn directory(&self) -> Option<&Arc<dyn WorkDirectory>> {
        self.shared.get().map(|(d, _)| d)
    }

    /// A fresh hold token: opaque, naming nothing. Where a worker's request for a child goes
    /// is found from the child's session, never from its token.
    fn new_token(&self) -> String {
        format!(
            "wtk_{}{}",
            brood_actors::model::random_hex(),
            brood_actors::model::random_hex()
        )
    }

    /// A fresh id for a take this process asks another process for.
    pub fn take_id(&self) -> String {
        format!("take_{}", brood_actors::model::random_hex())
    }

    /// Whether this process's queues hold the child: waiting, held by a worker, or ended by
    /// its worker with a completion whose row is on its way.
    pub fn holds(&self, child_id: &str) -> bool {
        let roster = self.roster();
        roster.entries.contains_key(child_id) || roster.recording.contains_key(child_id)
    }

    /// Whether this process's queues know the child: waiting, held by a worker, completed
    /// with its row on its way, or taken from its worker by brood lately.
    pub fn knows(&self, child_id: &str) -> bool {
        let roster = self.roster();
        roster.entries.contains_key(child_id)
            || roster.ended_set.contains(child_id)
            || roster.recording.contains_key(child_id)
    }

    /// The children of session `session_id` waiting in a queue here for a worker: not handed
    /// out (or handed back, their hold lapsed), not cancelled.
    pub fn waiting_of(&self, session_id: &str) -> HashSet<String> {
        self.roster().waiting_of(session_id)
    }

    /// Lists `child_id` again in the shared work list if it waits here (not held, not
    /// cancelled): a take of it from another process was refused, after that process had taken
    /// it off the list.
    pub fn list_again(&self, child_id: &str) {
        let listing = {
            let roster = self.roster();
            roster.entries.get(child_id).filter(|e| e.waits()).map(Entry::listing)
        };
        if let Some((session_id, queue)) = listing {
            self.post(&session_id, child_id, &queue);
        }
    }

    fn post(&self, session_id: &str, child_id: &str, queue: &str) {
        if let Some(d) = self.directory() {
            d.post(session_id, child_id, queue);
        }
    }

    fn withdraw(&self, child_id: &str) {
        if let Some(d) = self.directory() {
            d.withdraw(child_id);
        }
    }

    /// Hands the waiting child `child_id` to `worker` (who polled another process, which took
    /// it from the shared list); none when it is not waiting here any more.
    ///
    /// `take_id` names the take: one its asker gave up on first ([`WorkQueues::untake`]) is
    /// refused, and one it gives up on later is taken back. The takes stay locked from the look
    /// at what the asker said to the record of the handout: a give-up read beside it (the asker's
    /// two requests reach this process together when it was slow) waits for the record, and is
    /// never overwritten by it.
    pub fn take(&self, child_id: &str, worker: &str, hold: Duration, take_id: Option<&str>) -> Option<Handout> {
        if brood_actors::failpoints::fires("take_stall") {
            // A holder slow to serve a take (its asker gives up meanwhile).
            std::thread::sleep(Duration::from_millis(1500));
        }
        let Some(id) = take_id else {
            return self.hand_out_taken(child_id, worker, hold);
        };
        let mut takes = self.takes();
        if !takes.may_serve(id) {
            return None;
        }
        let handed = self.hand_out_taken(child_id, worker, hold)?;
        brood_actors::failpoints::hold("take_recording_hold");
        takes.remember(
            id,
            Take::Handed {
                child_id: handed.child_id.clone(),
                token: handed.token.clone(),
            },
        );
        Some(handed)
    }

    /// Takes back the child `child_id` handed out with `token` (nobody holds it: the take it was
    /// handed out for was given up, or came too late), and queues it (and lists it) again.
    pub fn take_back(&self, child_id: &str, token: &str) {
        if self.roster().lapse(child_id, token, Instant::now()) {
            tracing::debug!(child = %child_id, "a take nobody waits for is taken back; the child is queued again");
            self.expire(child_id);
        }
    }

    /// The asker of the take `take_id` of `child_id` gave up waiting for its answer: a child
    /// handed out by it goes back to its queue (no worker holds its token), and a take not
    /// served yet will be refused. One step under the takes' lock, as a take is.
    pub fn untake(&self, child_id: &str, take_id: &str) {
        let mut takes = self.takes();
        match takes.forget(take_id) {
            Some(Take::Handed { child_id: c, token }) if c == child_id => {
                self.take_back(child_id, &token);
                // The take read again later is refused.
                takes.remember(take_id, Take::GivenUp);
            }
            Some(other) => takes.remember(take_id, other),
            None => takes.remember(take_id, Take::GivenUp),
        }
    }

    fn takes(&self) -> MutexGuard<'_, Takes> {
        self.takes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn hand_out_taken(&self, child_id: &str, worker: &str, hold: Duration) -> Option<Handout> {
        let token = self.new_token();
        let (h, progress) = self
            .roster()
            .hand_out_child(child_id, worker, hold, token, Instant::now())?;
        // Hidden from the other pollers by its taker until now: off the list for good.
        self.withdraw(&h.child_id);
        progress.beat();
        tracing::debug!(child = %h.child_id, worker = %crate::printable(worker), "child handed to a worker polling another process");
        Some(h)
    }

    /// Queues a child; the ticket removes it when dropped, the receiver gets its output.
    fn enqueue(self: &Arc<Self>, ctx: &RunContext, queue: &str) -> (Ticket, oneshot::Receiver<RunOutput>) {
        let (tx, rx) = oneshot::channel();
        let ticket = self
            .roster()
            .enqueue(&ctx.child_id, queue, Work::of(ctx), ctx.progress.clone(), tx);
        self.post(&ctx.parent_session_id, &ctx.child_id, queue);
        self.queued.notify_waiters();
        let ticket = Ticket {
            queues: self.clone(),
            child_id: ctx.child_id.clone(),
            ticket,
        };
        (ticket, rx)
    }

    /// Takes back the child's hold if it ran out; answers where the child stands.
    fn expire(&self, child_id: &str) -> Standing {
        // The queue it went back to is read under the same lock: a cancel in between would
        // otherwise have it listed again for the other processes.
        let (standing, requeued_to) = {
            let mut roster = self.roster();
            let (standing, requeued) = roster.expire(child_id, Instant::now());
            let listing = requeued
                .then(|| roster.entries.get(child_id).map(Entry::listing))
                .flatten();
            (standing, listing)
        };
        if let Some((session_id, queue)) = requeued_to {
            self.post(&session_id, child_id, &queue);
            self.queued.notify_waiters();
        }
        standing
    }

    /// A child of `queue`, held by `worker` for `hold`, waiting up to `wait` for one to be
    /// queued; `None` when none came. Waiting holds no thread.
    pub async fn poll(&self, queue: &str, worker: &str, wait: Duration, hold: Duration) -> Option<Handout> {
        let deadline = Instant::now() + wait;
        loop {
            // Registered before the roster is read, so a child queued after the read wakes it.
            let queued = self.queued.notified();
            tokio::pin!(queued);
            queued.as_mut().enable();
            let token = self.new_token();
            let handed = self.roster().hand_out(queue, worker, hold, token, Instant::now());
            if let Some((h, progress)) = handed {
                self.withdraw(&h.child_id);
                // Taken by a worker: from now on its heartbeats beat the stall clock.
                progress.beat();
                tracing::debug!(child = %h.child_id, worker = %crate::printable(worker), queue = %crate::printable(queue), "child handed to a worker");
                return Some(h);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::select! {
                _ = &mut queued => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// Brood cancelled the child: it leaves its queue now, before its runner is dropped (on the
    /// children's thread, maybe later), so that from the cancel's answer on its worker hears
    /// [`WorkError::Ended`]. Nothing when no queue holds it.
    pub fn cancelled(&self, child_id: &str) {
        let marked = self.roster().cancel(child_id);
        if marked {
            self.withdraw(child_id);
        }
    }

    /// Renews the hold of the worker holding `token`, and beats the child's stall clock (with
    /// `progress` as its partial result, if given); answers the hold period.
    pub fn heartbeat(&self, child_id: &str, token: &str, progress: Option<String>) -> Result<Duration, WorkError> {
        let (hold, beat) = self.roster().renew(child_id, token, Instant::now())?;
        match progress {
            Some(p) => beat.partial(p),
            None => beat.beat(),
        }
        Ok(hold)
    }

    /// Ends the child held with `token` with the worker's output; the answer says what
    /// became of it once its row is recorded (or refused). The same completion sent again
    /// while its row is on its way waits for the same answer.
    pub fn complete(&self, child_id: &str, token: &str, output: RunOutput) -> Result<Completing, WorkError> {
        let (tx, rx) = oneshot::channel();
        let done = {
            let mut roster = self.roster();
            let done = roster.finish(child_id, token, &output, tx, Instant::now())?;
            self.awaiting
                .store(roster.recording.len(), std::sync::atomic::Ordering::Release);
            done
        };
        if let Some(done) = done {
            // The runner removes its entry before its receiver goes, so it is still listening;
            // if it went in between, brood ended the child first: whoever waits hears so.
            if done.send(output.clone()).is_err() {
                self.recorded_as(child_id, None);
            }
        }
        Ok(Completing {
            child_id: child_id.to_string(),
            output,
            recorded: rx,
        })
    }

    /// A child's row was answered ([`RunnerFactory::recorded`]): the completion waiting for
    /// it, if any, learns what became of it. Costs one atomic read for any other child.
    pub fn recorded(&self, child_id: &str, outcome: RecordOutcome) {
        if self.awaiting.load(std::sync::atomic::Ordering::Acquire) == 0 {
            return;
        }
        self.recorded_as(child_id, Some(outcome));
    }

    /// Tells those waiting for `child_id`'s row `outcome` (`None`: nothing was recorded of
    /// their completion).
    fn recorded_as(&self, child_id: &str, outcome: Option<RecordOutcome>) {
        let waiters = {
            let mut roster = self.roster();
            let waiters = roster.recorded(child_id);
            self.awaiting
                .store(roster.recording.len(), std::sync::atomic::Ordering::Release);
            waiters
        };
        if let Some(outcome) = outcome {
            for w in waiters {
                let _ = w.send(outcome);
            }
        }
    }
}

/// A queued child's place: dropping it takes the child out of the queues.
#[derive(Debug)]
struct Ticket {
    queues: Arc<WorkQueues>,
    child_id: String,
    ticket: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // Only this run's entry: a re-run of the child replaced it (and its listing) already.
        if self.queues.roster().remove(&self.child_id, self.ticket) {
            self.queues.withdraw(&self.child_id);
        }
    }
}

/// A child run by an outside worker.
#[derive(Debug, Clone)]
pub struct ExternalRunner {
    spec: ExternalSpec,
    queues: Arc<WorkQueues>,
}

impl ExternalRunner {
    /// An external runner for a checked spec, on `queues`.
    pub fn new(spec: ExternalSpec, queues: Arc<WorkQueues>) -> Self {
        ExternalRunner { spec, queues }
    }
}

impl Runner for ExternalRunner {
    fn run(self: Box<Self>, ctx: RunContext) -> LocalBoxFuture<'static, RunOutput> {
        Box::pin(async move {
            let (ticket, mut done) = self.queues.enqueue(&ctx, &self.spec.queue);
            loop {
                let wake = match self.queues.expire(&ticket.child_id) {
                    Standing::Queued => {
                        ctx.progress.beat();
                        Instant::now() + QUEUED_BEAT
                    }
                    Standing::Held { expires_at } => expires_at,
                    Standing::Gone => Instant::now() + QUEUED_BEAT,
                };
                tokio::select! {
                    output = &mut done => {
                        drop(ticket);
                        return output.unwrap_or_else(|_| {
                            RunOutput::failed("the work queue let go of the child without an output")
                        });
                    }
                    _ = tokio::time::sleep_until(wake) => {}
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A roster whose stall clocks are nothing (the queues beat them, not the roster).
    fn book_with(children: &[(&str, &str)]) -> (Roster<()>, Vec<oneshot::Receiver<RunOutput>>) {
        let mut roster = Roster::default();
        let mut rxs = Vec::new();
        for (child, queue) in children {
            let (tx, rx) = oneshot::channel();
            roster.enqueue(child, queue, work(format!("goal of {child}")), (), tx);
            rxs.push(rx);
        }
        (roster, rxs)
    }

    const HOLD: Duration = Duration::from_millis(1000);

    fn done(summary: &str) -> RunOutput {
        RunOutput::succeeded(summary)
    }

    /// The work of a child that has only a goal.
    fn work(goal: String) -> Work {
        Work {
            goal,
            input: None,
            session_id: "s".into(),
            call_id: "deleg_1".into(),
            attempt: 1,
            deadline_at_ms: None,
        }
    }

    /// Ends a child with `done("ok")`, its waiter dropped.
    fn finish(
        roster: &mut Roster<()>,
        child: &str,
        token: &str,
        now: Instant,
    ) -> Result<Option<oneshot::Sender<RunOutput>>, WorkError> {
        let (tx, _rx) = oneshot::channel();
        roster.finish(child, token, &done("ok"), tx, now)
    }

    #[test]
    fn a_cancelled_child_is_handed_to_nobody_and_its_worker_hears_it_ended_while_its_runner_waits() {
        let (mut roster, mut rx) = book_with(&[("held", "q"), ("waiting", "q")]);
        let now = Instant::now();
        let (h, ()) = roster.hand_out("q", "w", HOLD, "t1".into(), now).unwrap();
        assert_eq!(h.child_id, "held");
        assert!(roster.cancel("held") && roster.cancel("waiting"));
        assert!(!roster.cancel("held"), "once");
        assert!(!roster.cancel("nobody"));
        assert_eq!(roster.renew("held", "t1", now), Err(WorkError::Ended("held".into())));
        assert_eq!(
            finish(&mut roster, "held", "t1", now).err(),
            Some(WorkError::Ended("held".into()))
        );
        assert!(
            roster.hand_out("q", "w", HOLD, "t2".into(), now).is_none(),
            "not handed out"
        );
        assert!(roster.hand_out_child("waiting", "w", HOLD, "t3".into(), now).is_none());
        // A lapsed hold does not queue it again.
        assert_eq!(roster.expire("held", now + 2 * HOLD), (Standing::Gone, false));
        assert!(roster.hand_out("q", "w", HOLD, "t4".into(), now).is_none());
        // Its runner is not woken: it ends when brood drops it.
        assert!(matches!(rx[0].try_recv(), Err(oneshot::error::TryRecvError::Empty)));
        assert!(roster.remove("held", 1), "the runner's own ticket removes it");
        assert_eq!(roster.renew("held", "t1", now), Err(WorkError::Ended("held".into())));
    }

    #[test]
    fn a_hold_its_taker_gave_up_on_lapses_at_once_and_only_with_its_token() {
        let (mut roster, _rx) = book_with(&[("c", "q")]);
        let now = Instant::now();
        let (h, ()) = roster.hand_out_child("c", "w", HOLD, "t1".into(), now).unwrap();
        assert_eq!(h.child_id, "c");
        assert!(!roster.lapse("c", "other", now), "another token is not that hold");
        assert!(!roster.expire("c", now).1, "still held");
        assert!(roster.lapse("c", "t1", now));
        assert_eq!(roster.expire("c", now), (Standing::Queued, true), "queued again");
        assert!(roster.hand_out("q", "w2", HOLD, "t2".into(), now).is_some());
    }

    #[test]
    fn takes_are_remembered_up_to_their_bound_oldest_forgotten_first() {
        let mut takes = Takes::default();
        for i in 0..MAX_TAKES + 2 {
            takes.remember(&format!("take{i}"), Take::GivenUp);
        }
        assert_eq!(takes.by_id.len(), MAX_TAKES);
        assert!(takes.forget("take0").is_none() && takes.forget("take1").is_none());
        assert!(matches!(takes.forget("take2"), Some(Take::GivenUp)));
        assert!(takes.forget("take2").is_none(), "once");
    }

    #[test]
    fn a_take_read_again_is_refused_and_its_record_kept() {
        let mut takes = Takes::default();
        assert!(takes.may_serve("t1"));
        takes.remember(
            "t1",
            Take::Handed {
                child_id: "c".into(),
                token: "k".into(),
            },
        );
        assert!(!takes.may_serve("t1"), "the same take read again");
        assert!(
            matches!(takes.forget("t1"), Some(Take::Handed { child_id, token }) if child_id == "c" && token == "k"),
            "the give-up still finds what was handed out"
        );
        takes.remember("t2", Take::GivenUp);
        assert!(!takes.may_serve("t2"));
        assert!(!takes.may_serve("t2"), "refused however often it is read");
        assert!(takes.may_serve("t3"), "a take never heard of");
    }

    #[test]
    fn children_are_handed_out_in_order_per_queue() {
        let (mut roster, _rx) = book_with(&[("a", "q"), ("b", "other"), ("c", "q")]);
        let now = Instant::now();
        let (h, ()) = roster.hand_out("q", "w", HOLD, "t1".into(), now).unwrap();
        assert_eq!(
            (h.child_id.as_str(), h.work.goal.as_str(), h.hold_ms),
            ("a", "goal of a", 1000)
        );
        assert_eq!(
            roster.hand_out("q", "w", HOLD, "t2".into(), now).unwrap().0.child_id,
            "c"
        );
        assert_eq!(roster.hand_out("q", "w", HOLD, "t3".into(), now), None);
        assert_eq!(
            roster
                .hand_out("other", "w", HOLD, "t4".into(), now)
                .unwrap()
                .0
                .child_id,
            "b"
        );
        assert_eq!(roster.hand_out("nowhere", "w", HOLD, "t5".into(), now), None);
    }

    #[test]
    fn only_children_in_a_queue_wait_for_a_worker_each_listed_under_its_own_session() {
        let (mut roster, _rx) = book_with(&[("a", "q"), ("b", "q"), ("c", "other")]);
        let (tx, _rx_d) = oneshot::channel();
        let mut elsewhere = work("goal of d".into());
        elsewhere.session_id = "t".into();
        roster.enqueue("d", "q", elsewhere, (), tx);
        let set = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<HashSet<String>>();
        assert_eq!(roster.waiting_of("s"), set(&["a", "b", "c"]));
        assert_eq!(roster.waiting_of("t"), set(&["d"]));
        assert_eq!(roster.waiting_of("nobody"), set(&[]));
        // Handed out, or cancelled: no longer waiting.
        let now = Instant::now();
        roster.hand_out("q", "w", HOLD, "t1".into(), now).unwrap();
        assert!(roster.cancel("c"));
        assert_eq!(roster.waiting_of("s"), set(&["b"]));
        // A lapsed hold puts it back in line: waiting again.
        roster.expire("a", now + HOLD + HOLD);
        assert_eq!(roster.waiting_of("s"), set(&["a", "b"]));
    }

    #[test]
    fn a_lapsed_hold_puts_the_child_first_in_line_and_stales_its_token() {
        let (mut roster, _rx) = book_with(&[("a", "q"), ("b", "q")]);
        let t0 = Instant::now();
        roster.hand_out("q", "w1", HOLD, "old".into(), t0).unwrap();
        assert_eq!(
            roster.expire("a", t0 + HOLD / 2),
            (Standing::Held { expires_at: t0 + HOLD }, false)
        );
        assert_eq!(
            roster.expire("a", t0 + HOLD),
            (Standing::Queued, true),
            "expired at its deadline"
        );
        assert_eq!(
            roster.renew("a", "old", t0 + HOLD).unwrap_err(),
            WorkError::StaleToken("a".into())
        );
        let (h, ()) = roster.hand_out("q", "w2", HOLD, "new".into(), t0 + HOLD).unwrap();
        assert_eq!(h.child_id, "a", "before b, which waited less");
        assert!(finish(&mut roster, "a", "old", t0 + HOLD).is_err());
        assert!(finish(&mut roster, "a", "new", t0 + HOLD).is_ok());
        assert_eq!(
            roster.renew("a", "new", t0 + HOLD).unwrap_err(),
            WorkError::Ended("a".into()),
            "completed, its row on its way"
        );
        roster.recorded("a");
        assert_eq!(
            roster.renew("a", "new", t0 + HOLD).unwrap_err(),
            WorkError::UnknownChild("a".into()),
            "recorded: the queues let go of it"
        );
    }

    #[test]
    fn a_heartbeat_after_the_deadline_is_stale_even_if_nobody_looked() {
        let (mut roster, _rx) = book_with(&[("a", "q")]);
        let t0 = Instant::now();
        roster.hand_out("q", "w", HOLD, "tok".into(), t0).unwrap();
        let (hold, _) = roster.renew("a", "tok", t0 + HOLD / 2).unwrap();
        assert_eq!(hold, HOLD);
        // Renewed at 0.5 s: good until 1.5 s.
        assert!(roster.renew("a", "tok", t0 + HOLD * 14 / 10).is_ok());
        assert_eq!(
            roster.renew("a", "tok", t0 + HOLD * 3).unwrap_err(),
            WorkError::StaleToken("a".into())
        );
        assert_eq!(
            roster.expire("a", t0 + HOLD * 3),
            (Standing::Queued, true),
            "and the child is queued again by the look that lists it again, not by the heartbeat"
        );
    }

    #[test]
    fn wrong_tokens_and_unknown_children_are_refused() {
        let (mut roster, _rx) = book_with(&[("a", "q")]);
        let now = Instant::now();
        assert_eq!(
            roster.renew("a", "any", now).unwrap_err(),
            WorkError::StaleToken("a".into()),
            "not held yet"
        );
        roster.hand_out("q", "w", HOLD, "tok".into(), now).unwrap();
        assert_eq!(
            finish(&mut roster, "a", "tak", now).unwrap_err(),
            WorkError::StaleToken("a".into())
        );
        assert_eq!(
            finish(&mut roster, "zz", "tok", now).unwrap_err(),
            WorkError::UnknownChild("zz".into())
        );
    }

    #[test]
    fn the_same_completion_again_waits_for_the_same_row_and_another_is_refused() {
        let (mut roster, _rx) = book_with(&[("a", "q")]);
        let now = Instant::now();
        roster.hand_out("q", "w", HOLD, "tok".into(), now).unwrap();
        let (first, mut first_rx) = oneshot::channel();
        assert!(roster.finish("a", "tok", &done("ok"), first, now).unwrap().is_some());
        let (again, mut again_rx) = oneshot::channel();
        assert!(
            roster.finish("a", "tok", &done("ok"), again, now).unwrap().is_none(),
            "joined: the runner has its output already"
        );
        for (token, output) in [("tok", done("other")), ("wrong", done("ok"))] {
            let (tx, _rx) = oneshot::channel();
            assert_eq!(
                roster.finish("a", token, &output, tx, now).unwrap_err(),
                WorkError::Ended("a".into()),
                "{token} {output:?}"
            );
        }
        let waiters = roster.recorded("a");
        assert_eq!(waiters.len(), 2);
        for w in waiters {
            w.send(RecordOutcome::Stored(ChildStatus::Succeeded)).unwrap();
        }
        assert_eq!(first_rx.try_recv(), Ok(RecordOutcome::Stored(ChildStatus::Succeeded)));
        assert_eq!(again_rx.try_recv(), Ok(RecordOutcome::Stored(ChildStatus::Succeeded)));
        assert!(roster.recorded("a").is_empty(), "told once");
    }

    #[test]
    fn a_completion_holds_only_when_its_own_row_was_recorded() {
        let ok = done("frame 7");
        assert_eq!(
            completion_outcome("a", &ok, Some(RecordOutcome::Stored(ChildStatus::Succeeded))),
            Ok(())
        );
        let failed = RunOutput::failed("on fire");
        assert_eq!(
            completion_outcome("a", &failed, Some(RecordOutcome::Stored(ChildStatus::Failed))),
            Ok(())
        );
        for first in [ChildStatus::Cancelled, ChildStatus::TimedOut, ChildStatus::Failed] {
            assert_eq!(
                completion_outcome("a", &ok, Some(RecordOutcome::Stored(first))),
                Err(WorkError::Ended("a".into())),
                "{first}"
            );
        }
        assert_eq!(completion_outcome("a", &ok, None), Err(WorkError::Ended("a".into())));
        assert_eq!(
            completion_outcome("a", &ok, Some(RecordOutcome::Refused)),
            Err(WorkError::Refused("a".into()))
        );
    }

    #[test]
    fn a_recorded_row_is_a_completion_only_with_its_status_summary_and_error() {
        let row = |status: ChildStatus, summary: Option<&str>, error: Option<&str>| ChildInfo {
            child_id: "d.0".into(),
            call_id: "d".into(),
            unit_id: "d-1".into(),
            session_id: "s".into(),
            task_index: 0,
            status,
            summary: summary.map(str::to_string),
            output: None,
            error: error.map(str::to_string),
            started_at_ms: Some(1),
            finished_at_ms: Some(2),
            attempt: 1,
            recovered: false,
            result: Default::default(),
            notice: Default::default(),
        };
        let ok = done("frame 7");
        assert!(is_recorded_as(&row(ChildStatus::Succeeded, Some("frame 7"), None), &ok));
        assert!(!is_recorded_as(
            &row(ChildStatus::Succeeded, Some("frame 8"), None),
            &ok
        ));
        assert!(!is_recorded_as(&row(ChildStatus::Unknown, Some("frame 7"), None), &ok));
        assert!(!is_recorded_as(&row(ChildStatus::Running, Some("frame 7"), None), &ok));
        let failed = RunOutput::Failed {
            error: "on fire".into(),
            summary: Some("40%".into()),
            output: None,
        };
        assert!(is_recorded_as(
            &row(ChildStatus::Failed, Some("40%"), Some("on fire")),
            &failed
        ));
        assert!(!is_recorded_as(
            &row(ChildStatus::Failed, None, Some("on fire")),
            &failed
        ));
        assert!(!is_recorded_as(
            &row(ChildStatus::Failed, Some("40%"), Some("smoke")),
            &failed
        ));
        // The data too: recorded as text, compared as the JSON value it is.
        let with_data = done("frame 7").with_output(serde_json::json!({"n": 1, "tags": ["a"]}));
        let recorded = |text: Option<&str>| ChildInfo {
            output: text.map(str::to_string),
            ..row(ChildStatus::Succeeded, Some("frame 7"), None)
        };
        assert!(is_recorded_as(&recorded(Some(r#"{"tags":["a"],"n":1}"#)), &with_data));
        assert!(!is_recorded_as(&recorded(Some(r#"{"n":2,"tags":["a"]}"#)), &with_data));
        assert!(!is_recorded_as(&recorded(None), &with_data));
        assert!(!is_recorded_as(&recorded(Some("[]")), &ok));
    }

    #[test]
    fn only_its_own_run_removes_a_child() {
        let (mut roster, _rx) = book_with(&[("a", "q")]);
        let (tx, _rx2) = oneshot::channel();
        let second = roster.enqueue("a", "q", work("again".into()), (), tx);
        roster.remove("a", second - 1);
        assert_eq!(
            roster.expire("a", Instant::now()).0,
            Standing::Queued,
            "the first run's ticket is spent"
        );
        assert_eq!(roster.waiting["q"].len(), 1, "queued once, not twice");
        roster.remove("a", second);
        assert_eq!(roster.expire("a", Instant::now()).0, Standing::Gone);
        assert!(roster.waiting.is_empty());
    }

    #[test]
    fn specs_and_queue_names_are_checked() {
        assert_eq!(
            ExternalSpec::parse(&json!({"kind": "external"})).unwrap().queue,
            "default"
        );
        assert_eq!(
            ExternalSpec::parse(&json!({"kind": "external", "queue": "gpu"}))
                .unwrap()
                .queue,
            "gpu"
        );
        let err = ExternalSpec::parse(&json!({"kind": "external", "queue": ""})).unwrap_err();
        assert!(err.contains("queue"), "{err}");
        let err = ExternalSpec::parse(&json!({"kind": "external", "queue": "x".repeat(129)})).unwrap_err();
        assert!(err.contains("128"), "{err}");
        let err = ExternalSpec::parse(&json!({"kind": "external", "queue": 3})).unwrap_err();
        assert!(err.contains("queue") || err.contains("string"), "{err}");
        let err = ExternalSpec::parse(&json!({"kind": "external", "worker": "w"})).unwrap_err();
        assert!(err.contains("worker"), "{err}");
    }
}
