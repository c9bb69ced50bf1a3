//! The durable ledger: what brood has promised survives a crash, and with
//! [`Durability::Fsync`] a power cut too.
//!
//! [`Ledger`] is the trait the actors write through; [`SledLedger`] is the embedded default
//! (sled 0.34.7 in a local folder). The trait owns storage and durability only: which rows to
//! write and when is decided by the actors. Writes become durable at [`Ledger::flush`]; nothing
//! may be reported as recorded before the flush that covers it returned (I1).
//!
//! Trees: `sessions`, `calls`, `children`, `starts`, `claims`, `acks`, `wakes`, `nests`, `dead_letters`, `redrives`, `meta`,
//! `quarantine` (with the raw values in `quarantine_raw`). Values are [`crate::codec`] rows.
//! Sessions, wakes and nests are keyed by session id; every other row by [`row_key`] (its session id,
//! a NUL, its own id), so one session's rows are one contiguous range and
//! [`Ledger::load_session`] reads only them: nothing an owner rebuild reads grows with the
//! ledger's other sessions.
//!
//! About one row is written per child: a dispatch writes its call row (the tasks are the
//! children's queued rows), its session row, and one start row for the children it admits at
//! once; a later admission writes one start row per call it admits from; each child's terminal
//! row is group-committed by the coalescer; an ack writes one row for its whole claim and never
//! rewrites the children's rows. A child's durable status is its own row if it has one, else
//! running if a start row names it, else queued. An item's durable delivery state is therefore its child row's flag, *or* an ack row
//! naming it, *or* a dead letter of it, and [`Ledger::load`] folds the three together.
//!
//! A row that cannot be read back (bad version byte, truncated, over the size limit, values
//! brood never writes) is moved with its raw bytes to `quarantine` with the reason, logged and
//! counted; the rest of the ledger opens and is served.
//!
//! The parts: this file (the trait, the rows one decision writes, the errors, the durability
//! levels), `rows` (keys, encoding, what a write changes, what recording terminal rows
//! decides: shared by both backends), `runs` (child rows as a read gives them, a run per
//! call), `sled_ledger` (the sled implementation), `migrate` (an
//! older key layout brought to this one), `fsync` (what `Durability::Fsync` adds to sled's
//! flush), `pg` (the PostgreSQL implementation), `conformance` (what every backend must do,
//! tested on both) and `pg_testkit` (a PostgreSQL server for tests).

#[cfg(test)]
pub(crate) mod conformance;
mod fsync;
mod migrate;
mod pg;
/// A PostgreSQL server for tests (brood's own and an embedder's): not part of the API.
#[doc(hidden)]
pub mod pg_testkit;
mod rows;
mod runs;
mod sled_ledger;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::codec::CodecError;
use crate::model::*;

pub use pg::{PgLedger, TenureConfig, DEFAULT_SCHEMA};
pub use rows::{child_write, kept_terminal_rows, row_key, ChildWrite};
pub use runs::ChildRuns;
pub(crate) use runs::RowSink;
pub use sled_ledger::{FlushObserver, SledLedger, DEFAULT_CACHE_BYTES, LAYOUT, LOCK_WAIT};

/// The ledger could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The storage engine failed (I/O, corruption, a lock held by another process).
    #[error("ledger storage failed: {context}")]
    Storage {
        /// What brood was doing.
        context: String,
        /// What sled or the file system said.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// A stored value could not be encoded or decoded.
    #[error("ledger value in tree `{tree}` at key `{key}`")]
    Codec {
        /// The tree.
        tree: &'static str,
        /// The key, lossily as text.
        key: String,
        /// What the codec said.
        #[source]
        source: CodecError,
    },
    /// A fault injected on purpose (the `failpoints` feature).
    #[error("injected fault: {0}")]
    Injected(&'static str),
    /// The session's tenure was lost to another process sharing the ledger before these rows
    /// were durable: they may not have been written, and this process serves the session no
    /// more.
    #[error("session `{0}` is served by another process now; its rows were refused")]
    Fenced(String),
}

impl LedgerError {
    /// A storage failure with its cause.
    pub fn storage(context: impl Into<String>, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        LedgerError::Storage {
            context: context.into(),
            source: Some(Box::new(source)),
        }
    }

    /// A storage failure brood itself detected.
    pub fn storage_msg(context: impl Into<String>) -> Self {
        LedgerError::Storage {
            context: context.into(),
            source: None,
        }
    }
}

impl From<sled::Error> for LedgerError {
    fn from(e: sled::Error) -> Self {
        LedgerError::storage("sled", e)
    }
}

/// What a flush that brood relies on guarantees (DESIGN.md "Durability").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// sled's flush, then an fsync of every file sled wrote (its log, new blobs, their
    /// folders): what was reported as recorded survives power loss, not only `kill -9`.
    #[default]
    Fsync,
    /// sled's own flush (`sync_file_range`): survives the process dying, but the device cache
    /// and file metadata are not flushed, so a power cut may lose the last moments.
    Flush,
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Durability::Fsync => "fsync",
            Durability::Flush => "flush",
        })
    }
}

impl std::str::FromStr for Durability {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fsync" => Ok(Durability::Fsync),
            "flush" => Ok(Durability::Flush),
            other => Err(format!("durability `{other}` is not one of: fsync, flush")),
        }
    }
}

/// A row of a session-scoped tree, by its session and its own id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RowKey {
    /// The session it belongs to.
    pub session_id: String,
    /// Its id (call id, claim id, dead letter's dedup key).
    pub id: String,
}

impl RowKey {
    /// The row `id` of `session_id`.
    pub fn new(session_id: impl Into<String>, id: impl Into<String>) -> Self {
        RowKey {
            session_id: session_id.into(),
            id: id.into(),
        }
    }
}

/// Everything stored, as read when the ledger opens, with delivery state folded in.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    /// All sessions.
    pub sessions: Vec<SessionRow>,
    /// All calls.
    pub calls: Vec<CallRow>,
    /// All children; `result`/`notice` say delivered or dead when an ack row or a dead letter
    /// says so. In runs of one call each, as read.
    pub children: ChildRuns,
    /// Claims that were live when the last process stopped (acked ones are not among them).
    pub claims: Vec<ClaimRow>,
    /// Start rows: the running marks of admission batches, for children without a row of
    /// their own (recovery folds them in).
    pub starts: Vec<StartRow>,
    /// Children whose row is in the quarantine tree.
    pub damaged_children: Vec<String>,
    /// Sessions' webhook wake targets.
    pub wakes: Vec<WakeRow>,
    /// Nested sessions: every one for [`Ledger::load`], the session's own (if it is nested) for
    /// [`Ledger::load_session`], those of the sessions named for [`Ledger::load_sessions`].
    pub nests: Vec<NestRow>,
}

impl Snapshot {
    /// Adds the rows of `other` (a load of another session) to these.
    pub fn absorb(&mut self, other: Snapshot) {
        join(&mut self.sessions, other.sessions);
        join(&mut self.calls, other.calls);
        self.children.append(other.children);
        join(&mut self.claims, other.claims);
        join(&mut self.starts, other.starts);
        join(&mut self.damaged_children, other.damaged_children);
        join(&mut self.wakes, other.wakes);
        join(&mut self.nests, other.nests);
    }
}

/// Appends `more` to `rows`; into nothing, `more` is taken as it is (a million rows are not
/// copied into a fresh allocation).
pub(crate) fn join<T>(rows: &mut Vec<T>, mut more: Vec<T>) {
    if rows.is_empty() {
        std::mem::swap(rows, &mut more);
    } else {
        rows.append(&mut more);
    }
}

/// A session's oldest call and oldest ack row ([`Ledger::oldest_rows`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OldestRows {
    /// The session.
    pub session_id: String,
    /// Its first call in id order, if it has one.
    pub call: Option<CallRow>,
    /// Its first ack row in claim id order, if it has one.
    pub ack: Option<AckRow>,
}

/// The rows of one call besides its own (what retention removes with it).
#[derive(Debug, Default, Clone)]
pub struct CallParts {
    /// Its children's rows, by task index.
    pub children: Vec<ChildRow>,
    /// Its items' dead letters.
    pub dead_letters: Vec<DeadLetterRow>,
    /// The dedup keys of its items' redrive records.
    pub redrives: Vec<String>,
    /// The ids of its start rows.
    pub starts: Vec<String>,
}

/// The rows one decision writes, in the order sled's log keeps them: sled recovers a prefix of
/// its log, so a crash in the middle leaves the earlier ones. A dispatch lists the session
/// (its next set) before its call: a crash may skip a set number, never reuse one. Units are
/// not stored: they are planned again from the call row, which is what planned them.
#[derive(Debug, Default, Clone)]
pub struct Writes {
    /// Session rows to put.
    pub sessions: Vec<SessionRow>,
    /// Call rows to put.
    pub calls: Vec<CallRow>,
    /// Child rows to put.
    pub children: Vec<ChildRow>,
    /// Dead letters to put.
    pub dead_letters: Vec<DeadLetterRow>,
    /// Ack rows to put.
    pub acks: Vec<AckRow>,
    /// Start rows to put (the running marks of an admission batch, one row per call).
    pub starts: Vec<StartRow>,
    /// Webhook wake targets to put.
    pub wakes: Vec<WakeRow>,
    /// Webhook wake targets to remove, by session id.
    pub remove_wakes: Vec<String>,
    /// Nested sessions to put (with their session row, when first opened).
    pub nests: Vec<NestRow>,
    /// Sessions to remove (one whose creation was not made durable).
    pub remove_sessions: Vec<String>,
    /// Calls to remove (a refused dispatch taken back).
    pub remove_calls: Vec<RowKey>,
    /// Dead letters to remove, by dedup key.
    pub remove_dead_letters: Vec<RowKey>,
    /// Redrive records to put.
    pub redrives: Vec<RedriveRow>,
    /// Redrive records to remove, by dedup key.
    pub remove_redrives: Vec<RowKey>,
    /// Child rows to remove (retention), by child id.
    pub remove_children: Vec<RowKey>,
    /// Nested sessions' rows to remove, by session id.
    pub remove_nests: Vec<String>,
    /// Ack rows to remove, by claim id.
    pub remove_acks: Vec<RowKey>,
    /// Claim rows to remove.
    pub remove_claims: Vec<RowKey>,
    /// Start rows to remove, by start id.
    pub remove_starts: Vec<RowKey>,
}

impl Writes {
    /// Whether nothing is to be written.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
            && self.calls.is_empty()
            && self.children.is_empty()
            && self.dead_letters.is_empty()
            && self.acks.is_empty()
            && self.starts.is_empty()
            && self.wakes.is_empty()
            && self.remove_wakes.is_empty()
            && self.nests.is_empty()
            && self.redrives.is_empty()
            && self.remove_redrives.is_empty()
            && self.remove_children.is_empty()
            && self.remove_nests.is_empty()
            && self.remove_sessions.is_empty()
            && self.remove_calls.is_empty()
            && self.remove_dead_letters.is_empty()
            && self.remove_acks.is_empty()
            && self.remove_claims.is_empty()
            && self.remove_starts.is_empty()
    }

    /// Appends `other` after these writes.
    pub fn extend(&mut self, other: Writes) {
        self.sessions.extend(other.sessions);
        self.calls.extend(other.calls);
        self.children.extend(other.children);
        self.dead_letters.extend(other.dead_letters);
        self.acks.extend(other.acks);
        self.starts.extend(other.starts);
        self.wakes.extend(other.wakes);
        self.remove_wakes.extend(other.remove_wakes);
        self.nests.extend(other.nests);
        self.redrives.extend(other.redrives);
        self.remove_redrives.extend(other.remove_redrives);
        self.remove_children.extend(other.remove_children);
        self.remove_nests.extend(other.remove_nests);
        self.remove_sessions.extend(other.remove_sessions);
        self.remove_calls.extend(other.remove_calls);
        self.remove_dead_letters.extend(other.remove_dead_letters);
        self.remove_acks.extend(other.remove_acks);
        self.remove_claims.extend(other.remove_claims);
        self.remove_starts.extend(other.remove_starts);
    }
}

/// Runs a blocking ledger job where it delays nobody: tokio's blocking pool when the caller runs
/// on a tokio runtime (the actors' threads do), else a thread of its own, so an embedder's
/// executor is not blocked either. `what` names the job in its error.
pub async fn off_thread<T: Send + 'static>(
    what: &'static str,
    job: impl FnOnce() -> Result<T, LedgerError> + Send + 'static,
) -> Result<T, LedgerError> {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => rt
            .spawn_blocking(job)
            .await
            .unwrap_or_else(|e| Err(LedgerError::storage(format!("{what} failed"), e))),
        Err(_) => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            std::thread::Builder::new()
                .name("brood-ledger".into())
                .spawn(move || {
                    let _ = tx.send(job());
                })
                .map_err(|e| LedgerError::storage(format!("starting a thread for {what}"), e))?;
            rx.await
                .unwrap_or_else(|_| Err(LedgerError::storage_msg(format!("{what} ended without an answer"))))
        }
    }
}

/// The children of a call that left memory settled, with the delivery state they had then: its
/// stored rows with its dead letters folded in ([`fold_settled`]).
pub fn settled_children(ledger: &dyn Ledger, session_id: &str, call_id: &str) -> Result<Vec<ChildRow>, LedgerError> {
    let parts = ledger.call_parts(session_id, call_id)?;
    let dead: std::collections::HashSet<String> = parts.dead_letters.into_iter().map(|d| d.dedup_key).collect();
    let mut children = parts.children;
    fold_settled(&mut children, &dead);
    Ok(children)
}

/// Who serves a session, when several processes share one ledger ([`Tenures`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenureHolder {
    /// This process: it holds the session's tenure at this epoch.
    Here(u64),
    /// Another process holds the tenure, and serves requests at `address`.
    Elsewhere {
        /// The holder's node id.
        owner: String,
        /// Where the holder takes requests.
        address: String,
    },
}

/// The children waiting for an outside worker, listed for every process sharing the ledger
/// (the `external` runner's queues live in the memory of the process that serves the child's
/// session): a worker polling any process can be handed any of them. The list is advisory: the
/// holder's own queues decide; an entry whose child was handed out meanwhile, or whose process
/// died, is simply taken off.
///
/// Only a session's holder lists its children: a process that lost the session (its runners
/// not dropped yet) cannot list a child over its new holder's listing, and withdraws only its
/// own listings. A child taken off the list to be asked for is hidden, not removed, until its
/// process answers: a taker that dies before it asks or answers hides it only for a while.
pub trait WorkDirectory: Send + Sync + fmt::Debug {
    /// Lists `child_id` of session `session_id` as waiting on `queue` in this process, if this
    /// process holds the session's tenure when the listing lands (nothing otherwise). Done in
    /// the background, in the order asked, with [`WorkDirectory::withdraw`].
    fn post(&self, session_id: &str, child_id: &str, queue: &str);
    /// Takes `child_id` off the list (handed out here, or its runner ended). In the background.
    fn withdraw(&self, child_id: &str);
    /// Takes the child waiting longest on `queue` in another process, if any (`FOR UPDATE SKIP
    /// LOCKED`: pollers never take the same one): its id, where its process takes requests, and
    /// when it was taken on the list's clock. It is hidden from the other pollers for `answer`
    /// (how long its process is waited for) and a little more, then listed again unless its
    /// process withdrew or listed it anew meanwhile, or the taker ended the take
    /// ([`WorkDirectory::relist`], [`WorkDirectory::unlist`]).
    fn take_elsewhere(&self, queue: &str, answer: Duration) -> Result<Look, LedgerError>;
    /// The list's clock now, in ms since the Unix epoch: the database's, the one clock every
    /// process sharing the list reads alike. A take's deadline is set and checked on it.
    fn clock_ms(&self) -> Result<u64, LedgerError>;
    /// Lists again, after a short while, a child [`WorkDirectory::take_elsewhere`] took whose
    /// process could not be asked for it (it was slow, or answered with a fault), unless its
    /// process withdrew it or listed it anew meanwhile. In the background.
    fn relist(&self, taken: &Listed);
    /// Takes off the list a child [`WorkDirectory::take_elsewhere`] took whose process does not
    /// hold it waiting, unless its process listed it anew meanwhile. In the background.
    fn unlist(&self, taken: &Listed);
    /// Takes off the list a child [`WorkDirectory::take_elsewhere`] took whose process could
    /// not be reached (nothing listens at its address, or the address leads nowhere), unless a
    /// live process has that address — a restart, a brief failure: then it is listed again
    /// after a while — or its process listed it anew meanwhile. In the background.
    fn unreached(&self, taken: &Listed);
    /// A count that moves whenever another process may have listed a child (and when this
    /// process may have missed hearing of one, or itself listed a child of another again soon
    /// after a fault): a poller that found nothing to take waits for it
    /// to move instead of asking again (and, when a child was hidden, for
    /// [`Look::hidden_for`]: a hidden child coming back is not told). Marked seen before the
    /// look, a move after it is never missed.
    fn listed(&self) -> tokio::sync::watch::Receiver<u64>;
}

/// What a look at the shared work list ([`WorkDirectory::take_elsewhere`]) came to (the
/// default: nothing taken, nothing hidden, no race).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Look {
    /// The child taken, if one was takeable.
    pub taken: Option<Listed>,
    /// When none was: how soon a child of the queue hidden now (taken by another poller, or
    /// listed again after a while) is takeable again, if any is hidden. Nobody is told when
    /// that happens: a poller waiting for the list to move looks again then.
    pub hidden_for: Option<Duration>,
    /// When none was: a child was takeable but being taken by another poller (whose take may
    /// fail, and the child come back untold): worth a look again soon.
    pub raced: bool,
}

/// A child [`WorkDirectory::take_elsewhere`] took from the shared work list, hidden from the other pollers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The child.
    pub child_id: String,
    /// Where the process whose queue holds it takes requests.
    pub address: String,
    /// When it was taken off the list, on the list's clock ([`WorkDirectory::clock_ms`]).
    pub taken_at_ms: u64,
    /// Until when it is hidden from the other pollers: names this take of it, so that what the
    /// taker does with it later changes nothing if its process listed it anew meanwhile.
    pub hidden_until: std::time::SystemTime,
}

/// What the processes sharing a ledger hold, as one statement read it (see [`Tenures::spread`]):
/// the counts a sweep balances by.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spread {
    /// How many top-level sessions each other live process holds (as it last wrote it).
    pub others: Vec<u64>,
    /// For each of `others`, whether it comes before this process in an order every process
    /// agrees on (by instance): who of several holding alike gives first.
    pub others_before: Vec<bool>,
    /// Top-level sessions whose tenure is free (ran out, given back, or never taken).
    pub free: u64,
    /// Of those, the ones this process may take (not handed over by it lately).
    pub takeable: u64,
    /// Nested sessions whose tenure is free and whose parent session this process holds, or
    /// which name no parent (left by a process that died): its to take, whatever its share.
    pub nests: u64,
}

/// What is told of the sessions whose tenure a process lost.
pub type LostTenures = Box<dyn Fn(&[String]) + Send + Sync>;

/// Session tenures: when several processes share one ledger, each session is served by one of
/// them at a time, the holder of its tenure (owner, address, epoch, expiry), renewed in the
/// background. Every write of a session's rows is checked against the holder's epoch in the
/// transaction that writes it (fencing): once another process took the tenure over, nothing of
/// the old holder's lands. Expiry is judged by the database's clock; the holder also stops
/// serving a session once its local deadline (a monotonic clock, which runs through a pause)
/// passed without a renewal. (The public contract calls a tenure a session lease: the table
/// `session_leases`, the configuration key `session_lease_ms`, the error code `lease_lapsed`.)
pub trait Tenures: Send + Sync + fmt::Debug {
    /// This process's node id.
    fn node(&self) -> &str;
    /// How long a tenure lasts without a renewal.
    fn ttl(&self) -> std::time::Duration;
    /// Takes the tenure of `session_id` when it is free (none, or expired), or answers who holds
    /// it.
    fn acquire(&self, session_id: &str) -> Result<TenureHolder, LedgerError>;
    /// Who holds the tenure of `session_id` right now, without taking it: none when it is free.
    fn holder(&self, session_id: &str) -> Result<Option<TenureHolder>, LedgerError>;
    /// Whom the live tenure row of `session_id` names, read from the ledger even while this
    /// process believes it holds the tenure (one that lost it without noticing yet learns who
    /// took it): `Elsewhere` with the row's owner and address whichever process it names, this
    /// one included; none when the tenure is free.
    fn recorded_holder(&self, session_id: &str) -> Result<Option<TenureHolder>, LedgerError>;
    /// Who holds the tenures of `session_ids` right now, in one read (as [`Tenures::holder`]
    /// answers for one): the sessions whose tenure is free are left out.
    fn holders(&self, session_ids: &[String]) -> Result<Vec<(String, TenureHolder)>, LedgerError> {
        let mut out = Vec::new();
        for id in session_ids {
            if let Some(h) = self.holder(id)? {
                out.push((id.clone(), h));
            }
        }
        Ok(out)
    }
    /// Takes the tenures of up to `limit` stored top-level sessions whose tenure is free (at
    /// start, and as a sweep: the sessions of a process that died, or handed over), and of
    /// every free nested session whose parent session this process holds or which names none;
    /// returns those taken. Sessions this process handed over lately are left to the others.
    fn acquire_free(&self, limit: usize) -> Result<Vec<String>, LedgerError>;
    /// What the live processes hold and what is free, read in one statement (which also
    /// writes how many this one holds, when that changed).
    fn spread(&self) -> Result<Spread, LedgerError>;
    /// How many tenures of top-level sessions this process holds (what the spread counts: a
    /// nested session moves with its parent).
    fn held_count(&self) -> usize;
    /// Hands sessions over to the other processes: gives their tenures back at the epochs held
    /// here (each nested one with its parent session, whose holder takes it), and tells the
    /// others at once. The caller made sure nothing of them is in flight.
    fn hand_over(&self, sessions: &[(String, Option<String>)]) -> Result<(), LedgerError>;
    /// Whether this process handed `session_id` over lately (within a tenure time): it is not
    /// taken back here meanwhile, a request for it waits for its taker.
    fn handed_over(&self, session_id: &str) -> bool;
    /// Gives back the tenure of a nested session whose parent session another process serves,
    /// naming the parent: that process takes it.
    fn leave_to_parent(&self, session_id: &str, parent: &str);
    /// Moves when another process gave sessions back (a sweep looks at once).
    fn freed(&self) -> Option<tokio::sync::watch::Receiver<u64>>;
    /// Whether this process holds the tenure of `session_id` (it has not been taken over).
    fn holds(&self, session_id: &str) -> bool;
    /// Whether this process may serve `session_id` now: it holds the tenure and its local
    /// deadline has not passed.
    fn serving(&self, session_id: &str) -> bool;
    /// Gives the tenure of a session this process no longer serves back (retention removed it).
    fn release(&self, session_id: &str);
    /// Gives every tenure back (a clean stop): other processes may take the sessions at once.
    fn release_all(&self);
    /// Calls `lost` with the sessions whose tenure this process lost (taken over, or refused at
    /// a write), as soon as it knows.
    fn on_lost(&self, lost: LostTenures);
}

/// Durable storage for brood's rows. Implementations must be safe to share across threads.
pub trait Ledger: Send + Sync + fmt::Debug + 'static {
    /// Writes rows (not durable until [`Ledger::flush`]).
    fn write(&self, writes: &Writes) -> Result<(), LedgerError>;
    /// Records terminal child rows: a row already terminal in the ledger is left as it is (a
    /// retried hand-off), and the ledger's delivery state is kept over the child's copy.
    /// Returns the rows as stored, in the order given.
    fn record_terminals(&self, rows: Vec<ChildRow>) -> Result<Vec<ChildRow>, LedgerError>;
    /// Records a claim (cheap: not flushed by the caller).
    fn put_claim(&self, row: &ClaimRow) -> Result<(), LedgerError>;
    /// The ack row of a claim of `session_id`, if it was acknowledged durably.
    fn ack(&self, session_id: &str, claim_id: &str) -> Result<Option<AckRow>, LedgerError>;
    /// The stored row of the call `call_id`, whatever its session: one indexed read, not a
    /// scan, so an unknown id costs no more than a known one.
    fn find_call(&self, call_id: &str) -> Result<Option<CallRow>, LedgerError>;
    /// Whether a session row of `session_id` is stored (one key's read): a lookup of an id
    /// that names no session creates nothing.
    fn has_session(&self, session_id: &str) -> Result<bool, LedgerError>;
    /// The stored row of the call `call_id` of `session_id` (one key's read).
    fn call(&self, session_id: &str, call_id: &str) -> Result<Option<CallRow>, LedgerError>;
    /// Every dead letter.
    fn dead_letters(&self) -> Result<Vec<DeadLetterRow>, LedgerError>;
    /// How many dead letters are stored, counted without reading them (a gauge read at every
    /// scrape of the metrics).
    fn dead_letter_total(&self) -> Result<u64, LedgerError>;
    /// Up to `limit` ids of stored sessions in ascending (bytewise) order: those after `after`
    /// (exclusive) when given, and of those only the ids that start with `prefix` when given.
    /// Reads the keys of one range of the sessions' tree, no value: a page of a listing costs
    /// what the page holds, whatever the ledger holds besides.
    fn session_ids(&self, after: Option<&str>, prefix: Option<&str>, limit: usize) -> Result<Vec<String>, LedgerError>;
    /// How many dead letters each session whose id is from `first` to `last` (both included)
    /// holds, in ascending session id order, read as one key range and counted by session (one
    /// grouped statement on PostgreSQL); sessions without any are left out.
    fn dead_letter_counts(&self, first: &str, last: &str) -> Result<Vec<(String, u64)>, LedgerError>;
    /// Whether the storage answers now, within `timeout`: a cheap round trip (PostgreSQL: `SELECT
    /// 1` on a connection of the pool). sled lives in this process's own folder: always yes.
    fn ping(&self, timeout: std::time::Duration) -> Result<(), LedgerError> {
        let _ = timeout;
        Ok(())
    }
    /// The stored row of the child `child_id` of `session_id` (one key's read), without the
    /// delivery state its ack rows and dead letters fold in at a load.
    fn child(&self, session_id: &str, child_id: &str) -> Result<Option<ChildRow>, LedgerError>;
    /// The stored rows of a call's children (those that have one), by task index.
    fn call_children(&self, session_id: &str, call_id: &str) -> Result<Vec<ChildRow>, LedgerError>;
    /// Up to `limit` calls of a session in id order (the order they were made), after the
    /// call id `after` (exclusive) when given.
    fn calls_page(&self, session_id: &str, after: Option<&str>, limit: usize) -> Result<Vec<CallRow>, LedgerError>;
    /// Every stored row of one call but the call's own: its children's rows, its items' dead
    /// letters and redrive records, its start rows.
    fn call_parts(&self, session_id: &str, call_id: &str) -> Result<CallParts, LedgerError>;
    /// Up to `limit` ack rows of a session in claim id order (the order claims were made), after
    /// `after` (exclusive) when given.
    fn acks_page(&self, session_id: &str, after: Option<&str>, limit: usize) -> Result<Vec<AckRow>, LedgerError>;
    /// The oldest call and the oldest ack row of each of `session_ids` (the first of
    /// [`Ledger::calls_page`] and of [`Ledger::acks_page`]), in the order asked: what the
    /// retention sweep looks at first, for many sessions at once. A backend on a server reads
    /// them in two statements for many sessions; this default reads each session's pages.
    fn oldest_rows(&self, session_ids: &[String]) -> Result<Vec<OldestRows>, LedgerError> {
        session_ids
            .iter()
            .map(|id| {
                Ok(OldestRows {
                    session_id: id.clone(),
                    call: self.calls_page(id, None, 1)?.pop(),
                    ack: self.acks_page(id, None, 1)?.pop(),
                })
            })
            .collect()
    }
    /// How many rows each tree holds (a scan: for inspection and tests, not hot paths).
    fn row_counts(&self) -> Result<Vec<(&'static str, usize)>, LedgerError>;
    /// The redrive record of an item, if it was ever redriven.
    fn redrive(&self, session_id: &str, dedup_key: &str) -> Result<Option<RedriveRow>, LedgerError>;
    /// Makes every write so far durable, as [`Ledger::durability`] says; returns the bytes
    /// flushed.
    fn flush(&self) -> Result<usize, LedgerError>;
    /// What [`Ledger::flush`] guarantees.
    fn durability(&self) -> Durability;
    /// Reads everything back (recovery), quarantining rows that cannot be read.
    fn load(&self) -> Result<Snapshot, LedgerError>;
    /// Reads one session's rows back (an owner rebuilt in-process), as [`Ledger::load`] does;
    /// it reads nothing of the other sessions.
    fn load_session(&self, session_id: &str) -> Result<Snapshot, LedgerError>;
    /// Reads the rows of many sessions back at once (a start recovering the sessions it took),
    /// answering exactly what [`Ledger::load_session`] of each one answers, added up (an id
    /// named twice is read once; one with no rows adds nothing). A backend on a server reads
    /// them in a few statements per table, whatever their number; this default reads one
    /// session at a time.
    fn load_sessions(&self, session_ids: &[String]) -> Result<Snapshot, LedgerError> {
        let ids: std::collections::BTreeSet<&String> = session_ids.iter().collect();
        let mut snapshot = Snapshot::default();
        for id in ids {
            snapshot.absorb(self.load_session(id)?);
        }
        Ok(snapshot)
    }
    /// Moves one stored row of `session_id` aside, raw bytes kept, with the reason (recovery
    /// found it inconsistent with the rest). For the trees keyed by session id, `id` is the
    /// session id.
    fn quarantine(&self, tree: &str, session_id: &str, id: &str, reason: &str) -> Result<(), LedgerError>;
    /// The rows moved aside so far, with their raw values.
    fn quarantined(&self) -> Result<Vec<Quarantined>, LedgerError>;
    /// The session tenures, when several processes may share this ledger; none when this
    /// process serves every session in it (sled: its folder is locked to one process).
    fn tenures(&self) -> Option<Arc<dyn Tenures>> {
        None
    }
    /// How many times rows of `session_id` were refused (or its tenure lost) so far: a write
    /// made when this was `n`, whose flush returned when it was more, may not have landed.
    /// Always 0 when nobody shares the ledger.
    fn refusals(&self, session_id: &str) -> u64 {
        let _ = session_id;
        0
    }
    /// The shared list of children waiting for outside workers, when several processes share
    /// this ledger.
    fn work_directory(&self) -> Option<Arc<dyn WorkDirectory>> {
        None
    }
}

/// The trees of rows, in the order [`Ledger::row_counts`] reports them.
pub const ROW_TREES: [&str; 10] = [
    trees::SESSIONS,
    trees::CALLS,
    trees::CHILDREN,
    trees::STARTS,
    trees::CLAIMS,
    trees::ACKS,
    trees::WAKES,
    trees::NESTS,
    trees::DEAD_LETTERS,
    trees::REDRIVES,
];

/// The tree names.
pub mod trees {
    /// Sessions by id.
    pub const SESSIONS: &str = "sessions";
    /// Calls by id.
    pub const CALLS: &str = "calls";
    /// Units by id: layout 1 only (units are planned again from their call).
    pub const UNITS: &str = "units";
    /// Children by id.
    pub const CHILDREN: &str = "children";
    /// Claims by id (not flushed; recovery returns them).
    pub const CLAIMS: &str = "claims";
    /// Ack rows by claim id.
    pub const ACKS: &str = "acks";
    /// Start rows (an admission batch's running marks) by start id.
    pub const STARTS: &str = "starts";
    /// Webhook wake targets by session id.
    pub const WAKES: &str = "wakes";
    /// Nested sessions by session id.
    pub const NESTS: &str = "nests";
    /// Redrive records by dedup key.
    pub const REDRIVES: &str = "redrives";
    /// Dead letters by dedup key.
    pub const DEAD_LETTERS: &str = "dead_letters";
    /// The session of each call, by call id (sled; PostgreSQL indexes the calls' keys).
    pub const CALL_SESSIONS: &str = "call_sessions";
    /// The format version.
    pub const META: &str = "meta";
    /// What is known of rows that could not be read, by `<tree>/<key>`.
    pub const QUARANTINE: &str = "quarantine";
    /// Their raw values, unencoded, by the same key.
    pub const QUARANTINE_RAW: &str = "quarantine_raw";
}
