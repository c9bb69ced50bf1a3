//! The endpoints of outside workers (API.md, "External workers"): poll a queue for a child of an
//! `external` runner, heartbeat to keep its hold on it, complete it with an output. The queues and
//! their hold decisions are [`brood::runners::external`]'s; this module parses the bodies,
//! checks their bounds and shapes the replies.
//!
//! A completion is answered once its child's row is recorded: 200 with the recorded outcome.
//! A token that is not the child's current hold (the hold ran out, the token is wrong, or a
//! restart voided it) answers 409 `stale_token`, as does a completion whose row was refused
//! because the child's session moved to another process first. A child that ended answers what
//! became of it, here or in the ledger: a completion sent again (its answer lost, or after a
//! restart) that is the one recorded answers 200 with the recorded outcome; any other request
//! 409 `child_ended`. An id that names no child answers 404 `unknown_child` (409 `stale_token`
//! when several processes share the ledger: a token no process knows).

use std::time::Duration;

use super::api::{self, ApiError, CompleteBody, Ended, HeartbeatBody, PollBody, TakeBody, UntakeBody};
use super::scope::Access;
use super::state::{body, State};
use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use brood::runners::external::{check_queue, is_recorded_as, DEFAULT_QUEUE};
use brood::runners::{WorkError, WorkQueues};
use brood::{BroodError, RunOutput};
use brood_actors::ledger::Look;

/// The longest a poll may wait for a child, in ms.
pub(super) const MAX_WAIT_MS: u64 = 30_000;
/// The hold of a poll that names none, in ms (its `lease_ms`).
const DEFAULT_WORKER_HOLD_MS: u64 = 30_000;
/// The shortest worker hold, in ms.
pub(super) const MIN_WORKER_HOLD_MS: u64 = 1_000;
/// The longest worker hold, in ms.
pub(super) const MAX_WORKER_HOLD_MS: u64 = 3_600_000;
/// The longest worker name, in characters.
pub(super) const MAX_WORKER_CHARS: usize = 256;
/// How long a completion waits for its child's row to be recorded before it is answered 503
/// `not_recorded` (the same completion sent again answers what became of it).
const RECORD_WAIT: Duration = Duration::from_secs(30);

type Reply = Result<HttpResponse, ApiError>;

/// What a completion says of its child.
/// Its `output` over the server's `max_output_bytes` is refused, naming the bound.
fn output(body: CompleteBody, max_output_bytes: usize) -> Result<RunOutput, ApiError> {
    let data = body.output.filter(|v| !v.is_null());
    if let Some(size) = data
        .as_ref()
        .map(|v| v.to_string().len())
        .filter(|&n| n > max_output_bytes)
    {
        return Err(ApiError::invalid(format!(
            "`output` takes {size} bytes as JSON; this server records at most {max_output_bytes} (its max_output_bytes)"
        )));
    }
    Ok(match body.status {
        Ended::Succeeded => RunOutput::Succeeded {
            summary: body.summary.unwrap_or_default(),
            output: data,
        },
        Ended::Failed => RunOutput::Failed {
            error: body
                .error
                .unwrap_or_else(|| "the worker reported a failure and gave no error".into()),
            summary: body.summary,
            output: data,
        },
    })
}

impl From<WorkError> for ApiError {
    fn from(e: WorkError) -> Self {
        let (status, code) = match &e {
            WorkError::UnknownChild(_) => (StatusCode::NOT_FOUND, "unknown_child"),
            WorkError::StaleToken(_) | WorkError::Refused(_) => (StatusCode::CONFLICT, "stale_token"),
            WorkError::Ended(_) => (StatusCode::CONFLICT, "child_ended"),
            WorkError::NotRecorded(_) => (StatusCode::SERVICE_UNAVAILABLE, "not_recorded"),
        };
        ApiError::new(status, code, e.to_string())
    }
}

fn within(field: &str, value: u64, min: u64, max: u64) -> Result<u64, ApiError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(ApiError::invalid(format!(
            "`{field}` is {value}; it must be from {min} to {max}"
        )))
    }
}

/// Outside workers are handed children of every session: a scoped key may not poll or take.
fn every_session(access: &Access) -> Result<(), ApiError> {
    match access.prefix() {
        None => Ok(()),
        Some(p) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "out_of_scope",
            format!("this key reaches only the sessions whose id starts with `{p}`, and a worker's poll hands out children of every session: poll with the server's key"),
        )),
    }
}

#[utoipa::path(
    post, path = "/v1/workers/poll", operation_id = "pollWork",
    request_body(content = api::PollBody, content_type = "application/json"),
    responses((status = 200, description = "A child to work on.", body = api::WorkItem),
        (status = 204, description = "Nothing came within `wait_ms`."))
)]
pub(super) async fn poll(
    state: web::Data<State>,
    access: Access,
    queues: web::Data<WorkQueues>,
    payload: web::Payload,
) -> Reply {
    every_session(&access)?;
    let body: PollBody = api::parse(&body(&state, payload).await?)?;
    if body.worker.is_empty() || body.worker.chars().count() > MAX_WORKER_CHARS {
        return Err(ApiError::invalid(format!(
            "`worker` must name the worker in 1 to {MAX_WORKER_CHARS} characters"
        )));
    }
    let queue = body.queue.unwrap_or_else(|| DEFAULT_QUEUE.to_string());
    check_queue(&queue).map_err(ApiError::invalid)?;
    let wait_ms = within("wait_ms", body.wait_ms, 0, MAX_WAIT_MS)?;
    let lease_ms = within(
        "lease_ms",
        body.lease_ms.unwrap_or(DEFAULT_WORKER_HOLD_MS),
        MIN_WORKER_HOLD_MS,
        MAX_WORKER_HOLD_MS,
    )?;
    let (wait, hold) = (Duration::from_millis(wait_ms), Duration::from_millis(lease_ms));
    let handed = match queues.directory() {
        None => queues.poll(&queue, &body.worker, wait, hold).await,
        Some(_) => poll_shared(&state, &queues, &queue, &body.worker, wait, hold).await,
    };
    Ok(match handed {
        None => HttpResponse::NoContent().finish(),
        Some(h) => HttpResponse::Ok().json(api::WorkItem::from(h)),
    })
}

/// A poll when several processes share the ledger: this process's own queues first, then the
/// children the shared list says wait elsewhere (each asked of its process, which hands it out
/// if it still waits there), until `wait` has passed. Between looks it waits, costing no query,
/// for a child queued here, for the list to say another process listed one, or for a child
/// hidden from it (taken by a poller that may have died, or listed again after a while) to be
/// takeable again: nobody tells of that. A look that found a child being taken by another
/// poller looks again soon (that take may fail), a little later each time in a row.
async fn poll_shared(
    state: &State,
    queues: &WorkQueues,
    queue: &str,
    worker: &str,
    wait: Duration,
    hold: Duration,
) -> Option<brood::runners::external::Handout> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut listed = queues.directory().map(|d| d.listed());
    let mut raced_wait = RACED_FIRST;
    loop {
        // Seen before the look: a child listed after it moves the count, and wakes the wait.
        if let Some(l) = listed.as_mut() {
            l.borrow_and_update();
        }
        if let Some(h) = queues.poll(queue, worker, Duration::ZERO, hold).await {
            return Some(h);
        }
        let look = match take_elsewhere(state, queues, queue, worker, hold, deadline).await {
            Ok(h) => return Some(h),
            Err(look) => look,
        };
        let hidden_for = if look.raced {
            let soon = raced_wait;
            raced_wait = (raced_wait * 2).min(RACED_MOST);
            Some(look.hidden_for.map_or(soon, |d| d.min(soon)))
        } else {
            raced_wait = RACED_FIRST;
            look.hidden_for
        };
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return None;
        }
        let here = queues.poll(queue, worker, deadline - now, hold);
        let elsewhere = async {
            let back = async {
                match hidden_for {
                    Some(d) => tokio::time::sleep(d + jitter(d)).await,
                    None => std::future::pending().await,
                }
            };
            let heard = async {
                let heard = match listed.as_mut() {
                    Some(l) => l.changed().await.is_ok(),
                    None => false,
                };
                if !heard {
                    // No list to hear from (or it is gone): only this process's queues.
                    std::future::pending::<()>().await
                }
            };
            tokio::select! {
                () = back => {}
                () = heard => {}
            }
        };
        tokio::select! {
            handed = here => return handed,
            () = elsewhere => {}
        }
    }
}

/// A random part of a tenth of `d`, at most a quarter of a second: polls waiting for one hidden
/// child to be takeable again, in this process and the others, do not all look at once.
fn jitter(d: Duration) -> Duration {
    use std::hash::{BuildHasher as _, Hasher as _};
    let most = (d / 10).min(Duration::from_millis(250));
    let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
    most.mul_f64((random % 1_000) as f64 / 1_000.0)
}

/// How long past its `wait_ms` a poll may take, asking another process for a child listed there.
const ASK_MARGIN: Duration = Duration::from_millis(500);

/// The longest a process is asked for a listed child.
const ASK_MOST: Duration = Duration::from_secs(10);

/// How long one try at telling a process that a take was given up waits for its answer (the
/// request is read whenever that process reads it).
const UNTAKE_WAIT: Duration = Duration::from_secs(2);

/// How many times a process is told that a take was given up, until it answers.
const UNTAKE_TRIES: u32 = 5;

/// The pause before the second try at telling a process that a take was given up; doubled for
/// each try after it, up to [`UNTAKE_WAIT`].
const UNTAKE_PAUSE: Duration = Duration::from_millis(250);

/// Takes children the shared list says wait in other processes, asking each process for its
/// own, until one is handed out, the list has none for `queue`, or `deadline` (plus
/// [`ASK_MARGIN`]) passed. A child whose process did not answer in time, or answered with a
/// fault, is listed again after a short while; one it no longer holds, or whose process is gone
/// (its session's next holder lists it anew if it still waits), is taken off the list. A take
/// whose poller dies before any of that hides its child for a while only.
///
/// Each take runs as a task of its own ([`Taking::run`]): a poll dropped meanwhile (its worker
/// hung up) leaves it to finish, and a child handed out for it is given back.
///
/// Handed nothing: when to look again.
async fn take_elsewhere(
    state: &State,
    queues: &WorkQueues,
    queue: &str,
    worker: &str,
    hold: Duration,
    deadline: tokio::time::Instant,
) -> Result<brood::runners::external::Handout, Look> {
    let directory = queues.directory().ok_or_else(Look::default)?.clone();
    loop {
        let within = deadline.saturating_duration_since(tokio::time::Instant::now()) + ASK_MARGIN;
        let taking = Taking {
            directory: directory.clone(),
            queue: queue.to_string(),
            worker: worker.to_string(),
            hold,
            take_id: queues.take_id(),
            ask: Asking {
                key: state.config.peer_credential(),
                me: state.config.advertised(),
                limit: super::forward::answer_limit(state),
            },
            within: within.min(ASK_MOST),
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        // On this worker's event loop, as the poll (the client of the other processes is the
        // thread's own), but not dropped with it.
        actix_web::rt::spawn(taking.run(tx));
        match rx.await {
            Ok((Took::Handed(h), got)) => {
                // Nothing is awaited between this and the answer: the handout is the poll's.
                let _ = got.send(());
                return Ok(h);
            }
            Ok((Took::Nothing, _)) => {}
            Ok((Took::Empty(look), _)) => return Err(look),
            Err(_) => return Err(Look::default()),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Look::default());
        }
    }
}

/// How soon a poll that found a child being taken by another poller looks again at first; each
/// such look in a row doubles it, up to [`RACED_MOST`] (a row locked for long — its process
/// stalled in the middle of a change — is not looked at four times a second).
const RACED_FIRST: Duration = Duration::from_millis(250);

/// The longest wait between looks of a poll that keeps finding a child being taken.
const RACED_MOST: Duration = Duration::from_secs(2);

/// What one take of a child listed elsewhere came to.
enum Took {
    /// The list has no child of the queue waiting elsewhere (or could not be read): the look
    /// that took nothing, which says when to look again.
    Empty(Look),
    /// A child was asked for and not handed out: the next one may be.
    Nothing,
    /// Handed out, to the poll that acknowledges it.
    Handed(brood::runners::external::Handout),
}

/// One take of a child the shared list says waits in another process, for a poll.
struct Taking {
    directory: std::sync::Arc<dyn brood_actors::ledger::WorkDirectory>,
    queue: String,
    worker: String,
    hold: Duration,
    take_id: String,
    ask: Asking,
    /// How long its process is waited for.
    within: Duration,
}

impl Taking {
    /// Takes a child off the list and asks its process for it; tells `poll` what came of it.
    /// A child handed out that the poll does not acknowledge (it was dropped: its worker hung
    /// up) is given back, as is a take that was not answered in time or answered with a fault
    /// (which is also listed again).
    async fn run(self, poll: Poll) {
        let list = self.directory.clone();
        let (q, within) = (self.queue.clone(), self.within);
        let taken =
            brood_actors::ledger::off_thread("reading the shared work list", move || list.take_elsewhere(&q, within));
        let found = match taken.await {
            Ok(Look { taken: Some(found), .. }) => found,
            Ok(look) => return drop(tell(poll, Took::Empty(look))),
            Err(e) => {
                tracing::warn!("reading the shared work list failed: {e}");
                return drop(tell(poll, Took::Empty(Look::default())));
            }
        };
        let (child_id, address) = (found.child_id.clone(), found.address.clone());
        let body = serde_json::to_vec(&TakeBody {
            child_id: child_id.clone(),
            worker: self.worker.clone(),
            lease_ms: self.hold.as_millis() as u64,
            take_id: Some(self.take_id.clone()),
            // The holder refuses the take past the time this process waits for its answer.
            answer_by_ms: Some(found.taken_at_ms.saturating_add(self.within.as_millis() as u64)),
        })
        .unwrap_or_default();
        let url = format!("{address}/v1/workers/take");
        let given_up = match ask_holder(&url, body, &self.ask, self.within).await {
            Asked::Handed(h) => {
                if let Some(acknowledged) = tell(poll, Took::Handed(h)) {
                    if acknowledged.await.is_ok() {
                        return;
                    }
                }
                tracing::debug!(child = %child_id, %address, "the poll a child was taken for is gone; the take is given up");
                true
            }
            asked => {
                // The poll looks on at once; what follows matters to nobody waiting.
                drop(tell(poll, Took::Nothing));
                match asked {
                    Asked::Gone(e) => {
                        tracing::debug!(child = %child_id, %address, "a listed child's process is gone: {e}");
                        self.directory.unreached(&found);
                        false
                    }
                    Asked::Faulty(e) => {
                        tracing::debug!(child = %child_id, %address, "a listed child's process did not answer in time: {e}");
                        self.directory.relist(&found);
                        true
                    }
                    // Handed out or ended meanwhile: the next one.
                    Asked::NotThere => {
                        self.directory.unlist(&found);
                        false
                    }
                    Asked::Handed(_) => false,
                }
            }
        };
        if given_up {
            // The process may serve the take later, for nobody, or served it for a poll that
            // is gone: it is told the take was given up (and refuses it, or takes the child
            // back), whenever it reads this.
            let body = serde_json::to_vec(&UntakeBody {
                child_id: child_id.clone(),
                take_id: self.take_id.clone(),
            })
            .unwrap_or_default();
            let url = format!("{address}/v1/workers/untake");
            tell_given_up(&url, body, &self.ask).await;
        }
    }
}

/// Tells the process at `url` that a take was given up (`body`), until it answers, refuses it
/// for good (a 4xx answer other than 408 and 429: a key it does not take, a build without the
/// route) or nothing listens there any more, [`UNTAKE_TRIES`] times at most: a give-up it never
/// reads leaves the child, if it serves the take, held by a worker nobody is until the hold runs
/// out. Each try waits [`UNTAKE_WAIT`] for the answer; a process that reads a give-up twice
/// changes nothing the second time.
async fn tell_given_up(url: &str, body: Vec<u8>, ask: &Asking) {
    let mut pause = UNTAKE_PAUSE;
    for tried in 1..=UNTAKE_TRIES {
        let failed = match sent_to_peer(url, body.clone(), ask, UNTAKE_WAIT).await {
            Sent::Answered(answer) if answer.status().is_success() => return,
            Sent::Answered(answer) if refused_for_good(answer.status()) => {
                tracing::warn!(%url, status = %answer.status(), "a process refused to be told that a take was given up");
                return;
            }
            Sent::Answered(answer) => format!("it answered {}", answer.status()),
            Sent::Gone(e) => {
                tracing::debug!(%url, "a take's process is gone; it is not told the take was given up: {e}");
                return;
            }
            Sent::Faulty(e) => e,
        };
        if tried == UNTAKE_TRIES {
            tracing::warn!(%url, "telling a process that a take was given up failed {tried} times (a child it may have handed out for the take stays held until its hold runs out): {failed}");
            return;
        }
        tracing::debug!(%url, "telling a process that a take was given up failed (told again in {pause:?}): {failed}");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(UNTAKE_WAIT);
    }
}

/// Whether an answer refuses a request however often it is sent: a 4xx but 408 (timed out) and
/// 429 (too many requests).
fn refused_for_good(status: StatusCode) -> bool {
    status.is_client_error() && status != StatusCode::REQUEST_TIMEOUT && status != StatusCode::TOO_MANY_REQUESTS
}

/// Where a take tells the poll it runs for what came of it; the poll acknowledges a handout
/// on the sender that comes with it.
type Poll = tokio::sync::oneshot::Sender<(Took, tokio::sync::oneshot::Sender<()>)>;

/// Tells `poll` what a take came to: where it acknowledges that, if it was still there.
fn tell(poll: Poll, took: Took) -> Option<tokio::sync::oneshot::Receiver<()>> {
    let (got, acknowledged) = tokio::sync::oneshot::channel();
    poll.send((took, got)).ok().map(|()| acknowledged)
}

/// What a process asked for a listed child answered.
enum Asked {
    /// It handed the child out.
    Handed(brood::runners::external::Handout),
    /// It does not hold the child waiting (handed out, ended, or not its own).
    NotThere,
    /// It could not be reached: nothing listens there.
    Gone(String),
    /// It did not answer in time, or answered with a fault.
    Faulty(String),
}

/// Who asks another process for a child, and how much of its answer is read.
struct Asking {
    /// The credential processes sharing the ledger show each other, if they have one.
    key: Option<String>,
    /// This process's advertised address.
    me: String,
    limit: usize,
}

/// What a request to another process sharing the ledger came to.
enum Sent {
    /// It answered (the body not read yet).
    Answered(awc::ClientResponse),
    /// It could not be reached: nothing listens there, or the name leads nowhere.
    Gone(String),
    /// It did not answer in time, or the exchange failed.
    Faulty(String),
}

/// Sends `body` to the process at `url`, waiting at most `timeout` for its answer: from this
/// worker's event loop, over its connections to the other processes
/// ([`super::forward::peers`]).
async fn sent_to_peer(url: &str, body: Vec<u8>, ask: &Asking, timeout: Duration) -> Sent {
    use awc::error::{ConnectError, SendRequestError};
    let mut request = super::forward::peers()
        .post(url)
        .timeout(timeout)
        .insert_header((actix_web::http::header::CONTENT_TYPE, "application/json"))
        .insert_header((super::forward::FORWARDED, ask.me.as_str()));
    if let Some(k) = &ask.key {
        request = request.insert_header((super::forward::PEER, k.as_str()));
    }
    match request.send_body(body).await {
        Ok(answer) => Sent::Answered(answer),
        Err(SendRequestError::Connect(
            e @ (ConnectError::Resolver(_) | ConnectError::NoRecords | ConnectError::Unresolved),
        )) => Sent::Gone(e.to_string()),
        Err(SendRequestError::Connect(ConnectError::Io(e))) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            Sent::Gone(e.to_string())
        }
        Err(e) => Sent::Faulty(e.to_string()),
    }
}

/// Asks the process at `url` to hand out the child of `body`, waiting at most `timeout`.
async fn ask_holder(url: &str, body: Vec<u8>, ask: &Asking, timeout: Duration) -> Asked {
    let mut answer = match sent_to_peer(url, body, ask, timeout).await {
        Sent::Answered(answer) => answer,
        Sent::Gone(e) => return Asked::Gone(e),
        Sent::Faulty(e) => return Asked::Faulty(e),
    };
    match answer.status().as_u16() {
        200 => {}
        404 => return Asked::NotThere,
        // Refused as late (`take_expired`): the child still waits there, off the list.
        409 => return Asked::Faulty("it refused the take as late".into()),
        other => return Asked::Faulty(format!("it answered {other}")),
    }
    let text = match answer.body().limit(ask.limit).await {
        Ok(text) => text,
        Err(e) => return Asked::Faulty(e.to_string()),
    };
    match serde_json::from_slice::<api::WorkItem>(&text) {
        Ok(h) => Asked::Handed(h.into()),
        Err(e) => Asked::Faulty(format!("its answer does not parse: {e}")),
    }
}

/// `POST /v1/workers/take` (between processes sharing a ledger, not for workers): hands out the
/// child a poll of another process took from the shared list, if it still waits here; 404 if not.
#[utoipa::path(
    post, path = "/v1/workers/take", operation_id = "takeWork",
    request_body(content = api::TakeBody, content_type = "application/json"),
    responses((status = 200, description = "The child, handed out (between processes sharing a ledger).", body = api::WorkItem),
        (status = 404, description = "The child does not wait here (`unknown_child`).", body = api::ErrorReply),
        (status = 409, description = "Read after its asker's `answer_by_ms` (`take_expired`): nothing was handed out.", body = api::ErrorReply))
)]
pub(super) async fn take(
    state: web::Data<State>,
    access: Access,
    queues: web::Data<WorkQueues>,
    payload: web::Payload,
) -> Reply {
    every_session(&access)?;
    let body: TakeBody = api::parse(&body(&state, payload).await?)?;
    if body.child_id.is_empty() || body.take_id.as_deref() == Some("") {
        return Err(ApiError::invalid("`child_id` and `take_id` must not be empty"));
    }
    let lease_ms = within("lease_ms", body.lease_ms, MIN_WORKER_HOLD_MS, MAX_WORKER_HOLD_MS)?;
    let take_id = body.take_id.as_deref();
    // A take with a deadline: its asker took the child off the shared list, so it is listed
    // again unless the take is served, whether it is refused or dropped unanswered (the asker
    // hung up while the clock was read).
    let mut unlisted = ListAgain {
        queues: queues.clone(),
        child_id: body.child_id.clone(),
        armed: body.answer_by_ms.is_some(),
    };
    let answer_by = match body.answer_by_ms {
        Some(by) => Some(answered_in_time(&queues, by).await?),
        None => None,
    };
    unlisted.armed = false;
    match queues.take(&body.child_id, &body.worker, Duration::from_millis(lease_ms), take_id) {
        Some(h) if answer_by.is_some_and(|at| std::time::Instant::now() > at) => {
            // Handed out past the asker's time (this process stalled between reading the clock
            // and the handout): taken back, queued (and listed) again.
            queues.take_back(&h.child_id, &h.token);
            Err(expired(
                "was handed out after its asker stopped waiting for the answer; it was taken back",
            ))
        }
        Some(h) => Ok(HttpResponse::Ok().json(api::WorkItem::from(h))),
        None => Err(WorkError::UnknownChild(body.child_id).into()),
    }
}

/// A take's refusal as late (409 `take_expired`): the take `what`.
fn expired(what: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "take_expired",
        format!("the take {what}; nothing is held for it"),
    )
}

/// Lists a child taken off the shared work list again when dropped armed: the take that took it
/// off was not served.
struct ListAgain {
    queues: web::Data<WorkQueues>,
    child_id: String,
    armed: bool,
}

impl Drop for ListAgain {
    fn drop(&mut self) {
        if self.armed {
            self.queues.list_again(&self.child_id);
        }
    }
}

/// Whether a take whose asker waits for its answer until `by` (ms on the shared list's clock) is
/// read in time: a take read later is refused (409 `take_expired`), as is one whose time cannot
/// be told (503: the database's clock could not be read). A process that shares no list reads
/// its own clock. Read in time: the moment on this process's clock at which the asker stops
/// waiting.
async fn answered_in_time(queues: &WorkQueues, by: u64) -> Result<std::time::Instant, ApiError> {
    let unknown = |why: String| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ledger_unavailable",
            format!("a take with a deadline is served only once the shared work list's clock is read: {why}"),
        )
    };
    let asked = std::time::Instant::now();
    let now = match queues.directory().cloned() {
        Some(list) => brood_actors::ledger::off_thread("reading the shared work list's clock", move || list.clock_ms())
            .await
            .map_err(|e| unknown(e.to_string()))?,
        // A process that shares no work list is asked for takes by nobody but a hand-made
        // request: its own clock is the one there is.
        None => brood_actors::model::now_ms(),
    };
    if now > by {
        return Err(expired(&format!(
            "was read {} ms after its asker stopped waiting for the answer",
            now - by
        )));
    }
    Ok(asked + Duration::from_millis(by - now))
}

/// `POST /v1/workers/untake` (between processes sharing a ledger, not for workers): the process
/// that asked for the take `take_id` gave up waiting for its answer; a child it handed out goes
/// back to its queue (nobody holds its token), and a take not served yet is refused. 204.
#[utoipa::path(
    post, path = "/v1/workers/untake", operation_id = "untakeWork",
    request_body(content = api::UntakeBody, content_type = "application/json"),
    responses((status = 204, description = "The take was given up."))
)]
pub(super) async fn untake(
    state: web::Data<State>,
    access: Access,
    queues: web::Data<WorkQueues>,
    payload: web::Payload,
) -> Reply {
    every_session(&access)?;
    let body: UntakeBody = api::parse(&body(&state, payload).await?)?;
    if body.child_id.is_empty() || body.take_id.is_empty() {
        return Err(ApiError::invalid("`child_id` and `take_id` must not be empty"));
    }
    queues.untake(&body.child_id, &body.take_id);
    Ok(HttpResponse::NoContent().finish())
}

/// A heartbeat or completion of a child this process's queues do not hold, answered from what
/// the ledger recorded of it: a child that ended answers what became of it (`completed`: the
/// completion that is the recorded one answers 200 with it); one still live whose session
/// another process serves is sent on there (503 `session_moved`, with where, which the
/// forwarding layer follows: only ever to a registered session holder, whatever the token says);
/// any other token is stale. A child brood took from a worker here is `child_ended`.
async fn not_held(
    state: &State,
    queues: &WorkQueues,
    child_id: &str,
    completed: Option<&RunOutput>,
) -> Result<HttpResponse, ApiError> {
    let shared = queues.directory().is_some();
    let stored = match state.brood.stored_child(child_id).await {
        Ok(stored) => stored,
        Err(BroodError::UnknownTarget { .. }) if shared => {
            // A token no process knows (a forged one, or one of a process that stopped).
            return Err(WorkError::StaleToken(child_id.to_string()).into());
        }
        Err(BroodError::UnknownTarget { .. }) => return Err(WorkError::UnknownChild(child_id.to_string()).into()),
        Err(e) => return Err(e.into()),
    };
    if let Some(row) = stored.filter(|r| r.status.is_terminal()) {
        return match completed {
            Some(output) if is_recorded_as(&row, output) => Ok(HttpResponse::Ok().json(api::CompleteReply {
                child_id: child_id.to_string(),
                status: row.status.into(),
                summary: row.summary,
                output: api::data(row.output.as_deref()),
                error: row.error,
            })),
            _ => Err(WorkError::Ended(child_id.to_string()).into()),
        };
    }
    if shared {
        if let Some(moved) = served_elsewhere(state, child_id).await? {
            return Err(moved);
        }
    }
    if queues.knows(child_id) {
        return Err(WorkError::Ended(child_id.to_string()).into());
    }
    Err(WorkError::StaleToken(child_id.to_string()).into())
}

/// 503 `session_moved`, with where, when the tenure row of the child's session names a process
/// at another address (one naming this address, this process or its previous life restarted
/// at the same address, is here); None otherwise, and always when the ledger is not shared.
async fn served_elsewhere(state: &State, child_id: &str) -> Result<Option<ApiError>, ApiError> {
    Ok(match state.brood.child_holder(child_id).await? {
        Some(address) if address != state.config.advertised() => {
            let mut e = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "session_moved",
                format!("the child's session is served by the process at {address}; send the request there"),
            );
            e.moved_to = Some(super::api::MovedTo { session: None, address });
            Some(e)
        }
        _ => None,
    })
}

/// The child id of the path and the parsed body of a heartbeat or completion; a child of a
/// session out of reach of the key is answered as one nobody knows.
async fn child_request<T: serde::de::DeserializeOwned>(
    state: &State,
    access: &Access,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<(String, T), ApiError> {
    let child_id = path.into_inner();
    if let Some((call_id, _)) = brood_actors::model::parse_child_id(&child_id) {
        super::routes::reach_call(state, access, "child", &child_id, call_id).await?;
    }
    let body = api::parse(&body(state, payload).await?)?;
    Ok((child_id, body))
}

#[utoipa::path(
    post, path = "/v1/children/{child_id}/heartbeat", operation_id = "heartbeat",
    params(("child_id" = String, Path, description = "The child: `<call_id>.<index>`.")), request_body(content = api::HeartbeatBody, content_type = "application/json"),
    responses((status = 200, description = "The lease was renewed.", body = api::HeartbeatReply),
        (status = 404, description = "No such child (`unknown_child`).", body = api::ErrorReply),
        (status = 409, description = "The token is stale, or the child ended (`stale_token`, `child_ended`).", body = api::ErrorReply))
)]
pub(super) async fn heartbeat(
    state: web::Data<State>,
    access: Access,
    queues: web::Data<WorkQueues>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    let (child_id, body): (String, HeartbeatBody) = child_request(&state, &access, path, payload).await?;
    if queues.holds(&child_id) {
        // A process that lost the child's session without noticing yet still holds the child,
        // but renewing it would keep a worker on a child whose end it can no longer record: the
        // tenure row says where the session is served (one indexed read, and only with a shared
        // ledger).
        if queues.directory().is_some() {
            match served_elsewhere(&state, &child_id).await {
                Ok(Some(moved)) => return Err(moved),
                Ok(None) => {}
                // The ledger cannot say now (an outage shorter than the session's tenure must
                // not cost a worker its child): renewed as this process's own held tenures have it.
                Err(e) => {
                    tracing::debug!(child = %child_id, "the child's tenure row could not be read ({}); renewed here", e.message)
                }
            }
        }
        match queues.heartbeat(&child_id, &body.token, body.progress) {
            Ok(hold) => {
                return Ok(HttpResponse::Ok().json(api::HeartbeatReply {
                    child_id,
                    lease_ms: hold.as_millis() as u64,
                }))
            }
            // Gone in between: answered as a child not held here.
            Err(WorkError::UnknownChild(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    not_held(&state, &queues, &child_id, None).await
}

#[utoipa::path(
    post, path = "/v1/children/{child_id}/complete", operation_id = "complete",
    params(("child_id" = String, Path, description = "The child: `<call_id>.<index>`.")), request_body(content = api::CompleteBody, content_type = "application/json"),
    responses((status = 200, description = "The outcome recorded (the same completion sent again answers the same).", body = api::CompleteReply),
        (status = 404, description = "No such child (`unknown_child`).", body = api::ErrorReply),
        (status = 409, description = "The token is stale, or the child ended otherwise (`stale_token`, `child_ended`).", body = api::ErrorReply))
)]
pub(super) async fn complete(
    state: web::Data<State>,
    access: Access,
    queues: web::Data<WorkQueues>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    let (child_id, body): (String, CompleteBody) = child_request(&state, &access, path, payload).await?;
    let token = body.token.clone();
    let output = output(body, state.config.max_output_bytes)?;
    if queues.holds(&child_id) {
        match queues.complete(&child_id, &token, output.clone()) {
            Ok(completing) => {
                let output = completing.outcome(RECORD_WAIT).await?;
                return Ok(HttpResponse::Ok().json(completed(&child_id, &output)));
            }
            Err(WorkError::UnknownChild(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    not_held(&state, &queues, &child_id, Some(&output)).await
}

/// The reply to a completion recorded as `output` says.
fn completed(child_id: &str, output: &RunOutput) -> api::CompleteReply {
    let (status, summary, data, error) = match output {
        RunOutput::Succeeded { summary, output } => (api::ChildStatus::Succeeded, Some(summary.clone()), output, None),
        RunOutput::Failed { error, summary, output } => {
            (api::ChildStatus::Failed, summary.clone(), output, Some(error.clone()))
        }
    };
    api::CompleteReply {
        child_id: child_id.to_string(),
        status,
        summary,
        output: data.clone(),
        error,
    }
}
