//! The durable ledger: what brood has promised survives a crash, and with
//! [`Durability::Fsync`] a power cut too.
//!
//! [`Ledger`] is the trait the actors write through; [`SledLedger`] is the embedded default
//! (sled 0.34.7 in a local folder). The trait owns storage and durability only: which rows to
//! write and when is decided by the actors. Writes become durable at [`Ledger::flush`]; nothing
//! may be reported as recorded before the flush that covers it returned (I1).
//!
//! Trees: `sessions`, `calls`, `units`, `children`, `claims`, `acks`, `dead_letters`, `meta`,
//! `quarantine`. Keys are the ids as UTF-8; values are [`crate::codec`] rows. An item's durable
//! delivery state is its child row's flag, *or* an ack row naming it, *or* a dead letter of it:
//! an ack writes one row for its claim and never rewrites the children's rows (they get an
//! unflushed copy of the flag later), so [`Ledger::load`] folds the three together.
//!
//! A row that cannot be read back (bad version byte, truncated, over the size limit, values
//! brood never writes) is moved with its raw bytes to `quarantine` with the reason, logged and
//! counted; the rest of the ledger opens and is served.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::codec::{self, CodecError};
use crate::model::*;

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

/// Everything stored, as read when the ledger opens, with delivery state folded in.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    /// All sessions.
    pub sessions: Vec<SessionRow>,
    /// All calls.
    pub calls: Vec<CallRow>,
    /// All units.
    pub units: Vec<UnitRow>,
    /// All children; `result`/`notice` say delivered or dead when an ack row or a dead letter
    /// says so.
    pub children: Vec<ChildRow>,
    /// Claims that were live when the last process stopped (acked ones are not among them).
    pub claims: Vec<ClaimRow>,
    /// Children whose row is in the quarantine tree.
    pub damaged_children: Vec<String>,
    /// Sessions' webhook wake targets.
    pub wakes: Vec<WakeRow>,
}

/// The rows one decision writes, in the order sled's log keeps them: sled recovers a prefix of
/// its log, so a crash in the middle leaves the earlier ones. A dispatch lists the session
/// (its next set) before its units and its call: a crash may skip a set number, never reuse one.
#[derive(Debug, Default, Clone)]
pub struct Writes {
    /// Session rows to put.
    pub sessions: Vec<SessionRow>,
    /// Unit rows to put.
    pub units: Vec<UnitRow>,
    /// Call rows to put.
    pub calls: Vec<CallRow>,
    /// Child rows to put.
    pub children: Vec<ChildRow>,
    /// Dead letters to put.
    pub dead_letters: Vec<DeadLetterRow>,
    /// Ack rows to put.
    pub acks: Vec<AckRow>,
    /// Webhook wake targets to put.
    pub wakes: Vec<WakeRow>,
    /// Webhook wake targets to remove, by session id.
    pub remove_wakes: Vec<String>,
    /// Sessions to remove (one whose creation was not made durable).
    pub remove_sessions: Vec<String>,
    /// Calls to remove (a refused dispatch taken back): the call first, then its units.
    pub remove_calls: Vec<(String, Vec<String>)>,
    /// Dead letters to remove, by dedup key.
    pub remove_dead_letters: Vec<String>,
    /// Ack rows to remove, by claim id.
    pub remove_acks: Vec<String>,
    /// Claim rows to remove.
    pub remove_claims: Vec<String>,
}

impl Writes {
    /// Whether nothing is to be written.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
            && self.units.is_empty()
            && self.calls.is_empty()
            && self.children.is_empty()
            && self.dead_letters.is_empty()
            && self.acks.is_empty()
            && self.wakes.is_empty()
            && self.remove_wakes.is_empty()
            && self.remove_sessions.is_empty()
            && self.remove_calls.is_empty()
            && self.remove_dead_letters.is_empty()
            && self.remove_acks.is_empty()
            && self.remove_claims.is_empty()
    }

    /// Appends `other` after these writes.
    pub fn extend(&mut self, other: Writes) {
        self.sessions.extend(other.sessions);
        self.units.extend(other.units);
        self.calls.extend(other.calls);
        self.children.extend(other.children);
        self.dead_letters.extend(other.dead_letters);
        self.acks.extend(other.acks);
        self.wakes.extend(other.wakes);
        self.remove_wakes.extend(other.remove_wakes);
        self.remove_sessions.extend(other.remove_sessions);
        self.remove_calls.extend(other.remove_calls);
        self.remove_dead_letters.extend(other.remove_dead_letters);
        self.remove_acks.extend(other.remove_acks);
        self.remove_claims.extend(other.remove_claims);
    }
}

/// Durable storage for brood's rows. Implementations must be safe to share across threads.
pub trait Ledger: Send + Sync + fmt::Debug + 'static {
    /// Writes rows (not durable until [`Ledger::flush`]).
    fn write(&self, writes: &Writes) -> Result<(), LedgerError>;
    /// Records terminal child rows: a row already terminal in the ledger is left as it is (a
    /// retried hand-off), and the ledger's delivery state is kept over the child's copy.
    /// Returns the rows as stored.
    fn record_terminals(&self, rows: &[ChildRow]) -> Result<Vec<ChildRow>, LedgerError>;
    /// Records a claim (cheap: not flushed by the caller).
    fn put_claim(&self, row: &ClaimRow) -> Result<(), LedgerError>;
    /// The ack row of a claim, if it was acknowledged durably.
    fn ack(&self, claim_id: &str) -> Result<Option<AckRow>, LedgerError>;
    /// Every dead letter.
    fn dead_letters(&self) -> Result<Vec<DeadLetterRow>, LedgerError>;
    /// Makes every write so far durable, as [`Ledger::durability`] says; returns the bytes
    /// flushed.
    fn flush(&self) -> Result<usize, LedgerError>;
    /// What [`Ledger::flush`] guarantees.
    fn durability(&self) -> Durability;
    /// Reads everything back (recovery), quarantining rows that cannot be read.
    fn load(&self) -> Result<Snapshot, LedgerError>;
    /// Moves one stored row aside, raw bytes kept, with the reason (recovery found it
    /// inconsistent with the rest).
    fn quarantine(&self, tree: &str, key: &str, reason: &str) -> Result<(), LedgerError>;
    /// The rows moved aside so far, with their raw values.
    fn quarantined(&self) -> Result<Vec<Quarantined>, LedgerError>;
}

/// The tree names.
pub mod trees {
    /// Sessions by id.
    pub const SESSIONS: &str = "sessions";
    /// Calls by id.
    pub const CALLS: &str = "calls";
    /// Units by id.
    pub const UNITS: &str = "units";
    /// Children by id.
    pub const CHILDREN: &str = "children";
    /// Claims by id (not flushed; recovery returns them).
    pub const CLAIMS: &str = "claims";
    /// Ack rows by claim id.
    pub const ACKS: &str = "acks";
    /// Webhook wake targets by session id.
    pub const WAKES: &str = "wakes";
    /// Dead letters by dedup key.
    pub const DEAD_LETTERS: &str = "dead_letters";
    /// The format version.
    pub const META: &str = "meta";
    /// What is known of rows that could not be read, by `<tree>/<key>`.
    pub const QUARANTINE: &str = "quarantine";
    /// Their raw values, unencoded, by the same key.
    pub const QUARANTINE_RAW: &str = "quarantine_raw";
}
use trees::*;

/// How long [`SledLedger::open`] waits for a lock left by an earlier open to be released.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The embedded default ledger: sled in a local folder.
pub struct SledLedger {
    path: PathBuf,
    durability: Durability,
    db: sled::Db,
    sessions: sled::Tree,
    calls: sled::Tree,
    units: sled::Tree,
    children: sled::Tree,
    claims: sled::Tree,
    acks: sled::Tree,
    wakes: sled::Tree,
    dead_letters: sled::Tree,
    quarantine: sled::Tree,
    quarantine_raw: sled::Tree,
    files: FileSync,
}

impl fmt::Debug for SledLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SledLedger")
            .field("path", &self.path)
            .field("durability", &self.durability)
            .finish()
    }
}

/// fsync of what sled writes. sled 0.34.7's flush ends in `sync_file_range` on its log file
/// (`db`): data pages reach the device, but neither its cache nor the file's size do. Values
/// over its blob threshold go to new files in `blobs/`, written without any sync, and its
/// folders are never synced. So after sled's flush, this fsyncs `db`, every blob file not
/// synced yet, and — when a blob appeared — the `blobs` folder (fsync applies to the inode,
/// whichever descriptor calls it).
struct FileSync {
    root: PathBuf,
    log: File,
    synced_blobs: Mutex<HashSet<std::ffi::OsString>>,
}

impl FileSync {
    fn open(root: &Path) -> Result<Self, LedgerError> {
        let log = File::open(root.join("db"))
            .map_err(|e| LedgerError::storage(format!("opening {} to fsync it", root.join("db").display()), e))?;
        let sync = FileSync {
            root: root.to_path_buf(),
            log,
            synced_blobs: Mutex::new(HashSet::new()),
        };
        // What sled created at open (its config, its log, the folders) becomes durable once.
        for file in ["conf", "db"] {
            sync_path(&root.join(file))?;
        }
        sync.sync_blobs()?;
        sync_path(&root.join("blobs"))?;
        sync_path(root)?;
        if let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_path(parent)?;
        }
        Ok(sync)
    }

    fn sync(&self) -> Result<(), LedgerError> {
        self.log
            .sync_data()
            .map_err(|e| LedgerError::storage("fsync of the ledger's log file", e))?;
        self.sync_blobs()
    }

    /// fsyncs blob files not synced before and, when there were any, their folder — all under
    /// one lock, so a flush that finds nothing new cannot return before another flush's folder
    /// fsync of a blob it depends on.
    fn sync_blobs(&self) -> Result<(), LedgerError> {
        let dir = self.root.join("blobs");
        let mut synced = self
            .synced_blobs
            .lock()
            .map_err(|_| LedgerError::storage_msg("the blob sync list was poisoned by a panic"))?;
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(LedgerError::storage(format!("listing {}", dir.display()), e)),
        };
        let mut present = HashSet::new();
        let mut new = false;
        for entry in entries {
            let entry = entry.map_err(|e| LedgerError::storage(format!("listing {}", dir.display()), e))?;
            let name = entry.file_name();
            if !synced.contains(&name) {
                match File::open(entry.path()) {
                    Ok(f) => f
                        .sync_all()
                        .map_err(|e| LedgerError::storage(format!("fsync of {}", entry.path().display()), e))?,
                    // Collected by sled between the listing and the open: nothing to keep.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(LedgerError::storage(format!("opening {}", entry.path().display()), e)),
                }
                new = true;
            }
            present.insert(name);
        }
        *synced = present;
        if new {
            sync_path(&dir)?;
        }
        Ok(())
    }
}

fn sync_path(path: &Path) -> Result<(), LedgerError> {
    match File::open(path) {
        Ok(f) => f
            .sync_all()
            .map_err(|e| LedgerError::storage(format!("fsync of {}", path.display()), e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(LedgerError::storage(
            format!("opening {} to fsync it", path.display()),
            e,
        )),
    }
}

impl SledLedger {
    /// Opens (or creates) the ledger in `path` with [`Durability::Fsync`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, LedgerError> {
        Self::open_with(path, Durability::default())
    }

    /// Opens (or creates) the ledger in `path`.
    ///
    /// sled releases its file lock from a background thread some moments after the last handle
    /// of an earlier open is dropped, so a lock held by this process's own past is waited out
    /// (up to [`LOCK_WAIT`]); a lock held elsewhere is reported once that time is up.
    pub fn open_with(path: impl AsRef<Path>, durability: Durability) -> Result<Self, LedgerError> {
        let path = path.as_ref().to_path_buf();
        let started = std::time::Instant::now();
        let mut pause = std::time::Duration::from_millis(5);
        let db = loop {
            match sled::Config::new().path(&path).open() {
                Ok(db) => break db,
                // sled reports the lock as an I/O error whose kind it does not keep.
                Err(e) if e.to_string().contains("could not acquire lock") && started.elapsed() < LOCK_WAIT => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_millis(100));
                }
                Err(e) if e.to_string().contains("could not acquire lock") => {
                    return Err(LedgerError::storage(
                        format!(
                            "opening {} (is another brood process using this folder?)",
                            path.display()
                        ),
                        e,
                    ))
                }
                Err(e) => return Err(LedgerError::storage(format!("opening {}", path.display()), e)),
            }
        };
        let meta = db.open_tree(META)?;
        match meta.get("format")? {
            Some(v) => {
                let version: u8 = codec::decode(&v).map_err(|source| LedgerError::Codec {
                    tree: META,
                    key: "format".into(),
                    source,
                })?;
                if version != codec::FORMAT_VERSION {
                    return Err(LedgerError::storage_msg(format!(
                        "{} holds ledger format {version}; this build reads {}",
                        path.display(),
                        codec::FORMAT_VERSION
                    )));
                }
            }
            None => {
                meta.insert("format", encode(META, "format", &codec::FORMAT_VERSION)?)?;
                db.flush()?;
            }
        }
        let files = FileSync::open(&path)?;
        Ok(SledLedger {
            sessions: db.open_tree(SESSIONS)?,
            calls: db.open_tree(CALLS)?,
            units: db.open_tree(UNITS)?,
            children: db.open_tree(CHILDREN)?,
            claims: db.open_tree(CLAIMS)?,
            acks: db.open_tree(ACKS)?,
            wakes: db.open_tree(WAKES)?,
            dead_letters: db.open_tree(DEAD_LETTERS)?,
            quarantine: db.open_tree(QUARANTINE)?,
            quarantine_raw: db.open_tree(QUARANTINE_RAW)?,
            files,
            durability,
            path,
            db,
        })
    }

    /// The folder the ledger lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn tree(&self, name: &str) -> Option<&sled::Tree> {
        Some(match name {
            SESSIONS => &self.sessions,
            CALLS => &self.calls,
            UNITS => &self.units,
            CHILDREN => &self.children,
            CLAIMS => &self.claims,
            ACKS => &self.acks,
            WAKES => &self.wakes,
            DEAD_LETTERS => &self.dead_letters,
            _ => return None,
        })
    }

    /// Moves a raw row aside: the quarantine copy first, so a crash between the steps leaves
    /// the row in both places (quarantined again at the next open), never in neither. The raw
    /// value is kept unencoded, so no size limit can refuse to keep it.
    fn move_aside(
        &self,
        tree: &sled::Tree,
        name: &str,
        key: &[u8],
        value: &[u8],
        reason: &str,
    ) -> Result<(), LedgerError> {
        let row = QuarantineRow {
            tree: name.to_string(),
            key: key.to_vec(),
            value_len: value.len() as u64,
            reason: reason.to_string(),
            quarantined_at_ms: now_ms(),
        };
        let qkey = [name.as_bytes(), b"/", key].concat();
        self.quarantine_raw.insert(&qkey, value)?;
        self.quarantine
            .insert(&qkey, encode(QUARANTINE, &String::from_utf8_lossy(key), &row)?)?;
        tree.remove(key)?;
        tracing::error!(
            tree = name,
            key = %String::from_utf8_lossy(key),
            "a stored row could not be used and was moved to the quarantine tree: {reason}"
        );
        Ok(())
    }

    /// Reads a tree back; rows that do not decode or fail their check are quarantined.
    fn scan<T: serde::de::DeserializeOwned + CheckRow>(
        &self,
        tree: &sled::Tree,
        name: &'static str,
    ) -> Result<Vec<T>, LedgerError> {
        // Not `tree.len()`: in sled 0.34 that is a scan of its own.
        let mut out = Vec::new();
        let mut bad = Vec::new();
        for kv in tree.iter() {
            let (k, v) = kv?;
            match codec::decode::<T>(&v)
                .map_err(|e| e.to_string())
                .and_then(|row| row.check().map(|_| row))
            {
                Ok(row) => out.push(row),
                Err(reason) => bad.push((k, v, reason)),
            }
        }
        for (k, v, reason) in bad {
            self.move_aside(tree, name, &k, &v, &reason)?;
        }
        Ok(out)
    }
}

fn encode<T: serde::Serialize>(tree: &'static str, key: &str, row: &T) -> Result<Vec<u8>, LedgerError> {
    codec::encode(row).map_err(|source| LedgerError::Codec {
        tree,
        key: key.to_string(),
        source,
    })
}

fn put_all<'a, T: serde::Serialize + 'a>(
    tree: &sled::Tree,
    name: &'static str,
    rows: impl IntoIterator<Item = (&'a str, &'a T)>,
) -> Result<(), LedgerError> {
    let mut batch = sled::Batch::default();
    let mut any = false;
    for (key, row) in rows {
        batch.insert(key.as_bytes(), encode(name, key, row)?);
        any = true;
    }
    if any {
        tree.apply_batch(batch)?;
    }
    Ok(())
}

fn remove_all<'a>(tree: &sled::Tree, keys: impl IntoIterator<Item = &'a String>) -> Result<(), LedgerError> {
    let mut batch = sled::Batch::default();
    let mut any = false;
    for key in keys {
        batch.remove(key.as_bytes());
        any = true;
    }
    if any {
        tree.apply_batch(batch)?;
    }
    Ok(())
}

/// Folds the durable delivery state of ack rows and dead letters into the children's rows.
fn fold_delivery(children: &mut [ChildRow], acks: &[AckRow], dead: &[DeadLetterRow]) {
    let mut by_id: HashMap<String, usize> = HashMap::with_capacity(children.len());
    for (i, c) in children.iter().enumerate() {
        by_id.insert(c.child_id.clone(), i);
    }
    let mut mark = |key: &str, f: &dyn Fn(&mut DeliveryRow)| {
        if let Some((child, kind)) = parse_dedup_key(key) {
            if let Some(&i) = by_id.get(child) {
                f(children[i].delivery_mut(kind));
            }
        }
    };
    for ack in acks {
        for key in &ack.items {
            mark(key, &|d| d.delivered = true);
        }
    }
    for d in dead {
        let attempts = d.attempts;
        mark(&d.dedup_key, &|row| {
            row.dead = true;
            row.failed_attempts = row.failed_attempts.max(attempts);
        });
    }
}

impl Ledger for SledLedger {
    fn write(&self, w: &Writes) -> Result<(), LedgerError> {
        crate::failpoint!("ledger_write");
        if crate::failpoints::fires("ledger_write_stall") {
            // A slow disk: the write goes through, late.
            std::thread::sleep(std::time::Duration::from_millis(400));
        }
        put_all(
            &self.sessions,
            SESSIONS,
            w.sessions.iter().map(|r| (r.session_id.as_str(), r)),
        )?;
        put_all(&self.units, UNITS, w.units.iter().map(|r| (r.unit_id.as_str(), r)))?;
        put_all(&self.calls, CALLS, w.calls.iter().map(|r| (r.call_id.as_str(), r)))?;
        put_all(
            &self.children,
            CHILDREN,
            w.children.iter().map(|r| (r.child_id.as_str(), r)),
        )?;
        put_all(
            &self.dead_letters,
            DEAD_LETTERS,
            w.dead_letters.iter().map(|r| (r.dedup_key.as_str(), r)),
        )?;
        put_all(&self.acks, ACKS, w.acks.iter().map(|r| (r.claim_id.as_str(), r)))?;
        put_all(&self.wakes, WAKES, w.wakes.iter().map(|r| (r.session_id.as_str(), r)))?;
        remove_all(&self.wakes, &w.remove_wakes)?;
        // The call first: without it the rest is ignored by recovery anyway.
        remove_all(&self.calls, w.remove_calls.iter().map(|(c, _)| c))?;
        remove_all(&self.units, w.remove_calls.iter().flat_map(|(_, u)| u))?;
        remove_all(&self.dead_letters, &w.remove_dead_letters)?;
        remove_all(&self.sessions, &w.remove_sessions)?;
        remove_all(&self.acks, &w.remove_acks)?;
        remove_all(&self.claims, &w.remove_claims)?;
        Ok(())
    }

    fn record_terminals(&self, rows: &[ChildRow]) -> Result<Vec<ChildRow>, LedgerError> {
        crate::failpoint!("ledger_write");
        let mut stored = Vec::with_capacity(rows.len());
        let mut batch = sled::Batch::default();
        for row in rows {
            // A stored row that does not decode is overwritten by the child's own, which is
            // complete; the damaged one was quarantined when the ledger opened.
            let current: Option<ChildRow> = match self.children.get(row.child_id.as_bytes())? {
                Some(v) => codec::decode(&v).ok(),
                None => None,
            };
            match current {
                Some(current) if current.status.is_terminal() => stored.push(current),
                current => {
                    let mut row = row.clone();
                    if let Some(current) = current {
                        row.result = current.result;
                        row.notice = current.notice;
                    }
                    batch.insert(row.child_id.as_bytes(), encode(CHILDREN, &row.child_id, &row)?);
                    stored.push(row);
                }
            }
        }
        self.children.apply_batch(batch)?;
        Ok(stored)
    }

    fn put_claim(&self, row: &ClaimRow) -> Result<(), LedgerError> {
        self.claims
            .insert(row.claim_id.as_bytes(), encode(CLAIMS, &row.claim_id, row)?)?;
        Ok(())
    }

    fn ack(&self, claim_id: &str) -> Result<Option<AckRow>, LedgerError> {
        match self.acks.get(claim_id.as_bytes())? {
            None => Ok(None),
            Some(v) => codec::decode(&v).map(Some).map_err(|source| LedgerError::Codec {
                tree: ACKS,
                key: claim_id.to_string(),
                source,
            }),
        }
    }

    fn dead_letters(&self) -> Result<Vec<DeadLetterRow>, LedgerError> {
        self.scan(&self.dead_letters, DEAD_LETTERS)
    }

    fn flush(&self) -> Result<usize, LedgerError> {
        crate::failpoint!("ledger_flush");
        if crate::failpoints::fires("ledger_flush_stall") {
            // A slow disk: the flush succeeds, late.
            std::thread::sleep(std::time::Duration::from_millis(400));
        }
        let bytes = self.db.flush()?;
        if self.durability == Durability::Fsync {
            self.files.sync()?;
        }
        Ok(bytes)
    }

    fn durability(&self) -> Durability {
        self.durability
    }

    fn load(&self) -> Result<Snapshot, LedgerError> {
        let acks: Vec<AckRow> = self.scan(&self.acks, ACKS)?;
        let dead: Vec<DeadLetterRow> = self.scan(&self.dead_letters, DEAD_LETTERS)?;
        let mut children: Vec<ChildRow> = self.scan(&self.children, CHILDREN)?;
        fold_delivery(&mut children, &acks, &dead);
        let acked: HashSet<&str> = acks.iter().map(|a| a.claim_id.as_str()).collect();
        let mut claims: Vec<ClaimRow> = self.scan(&self.claims, CLAIMS)?;
        claims.retain(|c| !acked.contains(c.claim_id.as_str()));
        let sessions = self.scan(&self.sessions, SESSIONS)?;
        let calls = self.scan(&self.calls, CALLS)?;
        let units = self.scan(&self.units, UNITS)?;
        let prefix = format!("{CHILDREN}/");
        let mut damaged_children = Vec::new();
        for kv in self.quarantine.scan_prefix(prefix.as_bytes()) {
            let (k, _) = kv?;
            damaged_children.push(String::from_utf8_lossy(&k[prefix.len()..]).into_owned());
        }
        let snapshot = Snapshot {
            sessions,
            calls,
            units,
            children,
            claims,
            damaged_children,
            wakes: self.scan(&self.wakes, WAKES)?,
        };
        if !self.quarantine.is_empty() {
            // What was moved aside must not come back on its own: make the move durable.
            self.flush()?;
        }
        Ok(snapshot)
    }

    fn quarantine(&self, tree: &str, key: &str, reason: &str) -> Result<(), LedgerError> {
        let Some(t) = self.tree(tree) else {
            return Err(LedgerError::storage_msg(format!("no tree `{tree}` to quarantine from")));
        };
        match t.get(key.as_bytes())? {
            Some(v) => self.move_aside(t, tree, key.as_bytes(), &v, reason),
            None => Ok(()),
        }
    }

    fn quarantined(&self) -> Result<Vec<Quarantined>, LedgerError> {
        let mut out = Vec::new();
        for kv in self.quarantine.iter() {
            let (k, v) = kv?;
            let value = self.quarantine_raw.get(&k)?.map(|v| v.to_vec()).unwrap_or_default();
            // A quarantine row is brood's own; one that does not decode is reported as such.
            let row = codec::decode(&v).unwrap_or_else(|e| QuarantineRow {
                tree: QUARANTINE.into(),
                key: k.to_vec(),
                value_len: value.len() as u64,
                reason: format!("the quarantine row itself does not decode: {e}"),
                quarantined_at_ms: 0,
            });
            out.push(Quarantined { row, value });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_lock_released_moments_later_is_waited_out() {
        let dir = tempfile::TempDir::new().unwrap();
        let first = SledLedger::open(dir.path()).unwrap();
        let holder = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(first);
        });
        let second = SledLedger::open(dir.path());
        holder.join().unwrap();
        assert!(second.is_ok(), "{:?}", second.err());
    }

    #[test]
    fn a_lock_held_for_good_is_reported() {
        let dir = tempfile::TempDir::new().unwrap();
        let _first = SledLedger::open(dir.path()).unwrap();
        let err = SledLedger::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("another brood process"), "{err}");
    }

    #[test]
    fn a_value_over_the_blob_threshold_is_fsynced_and_reads_back() {
        let dir = tempfile::TempDir::new().unwrap();
        let goal = "x".repeat(300 * 1024); // over sled's blob threshold (segment size / 4)
        let call = CallRow {
            call_id: "deleg_big".into(),
            session_id: "s".into(),
            set: 1,
            mode: Mode::Background,
            forced_sync_reason: None,
            independent_completions: false,
            tasks: vec![Task {
                goal: goal.clone(),
                runner_json: "{}".into(),
                group: None,
                timeout_ms: None,
                stall_ms: 1,
                rerun_on_recovery: false,
            }],
            created_at_ms: 0,
        };
        {
            let ledger = SledLedger::open_with(dir.path(), Durability::Fsync).unwrap();
            ledger
                .write(&Writes {
                    calls: vec![call.clone()],
                    ..Writes::default()
                })
                .unwrap();
            ledger.flush().unwrap();
            let synced = ledger.files.synced_blobs.lock().unwrap().len();
            assert!(synced >= 1, "the blob file sled wrote was fsynced");
        }
        let ledger = SledLedger::open(dir.path()).unwrap();
        let snapshot = ledger.load().unwrap();
        assert_eq!(snapshot.calls, vec![call]);
    }

    #[test]
    fn durability_names_parse_and_unknown_ones_are_refused() {
        assert_eq!("fsync".parse::<Durability>(), Ok(Durability::Fsync));
        assert_eq!("flush".parse::<Durability>(), Ok(Durability::Flush));
        assert!("sometimes".parse::<Durability>().unwrap_err().contains("fsync, flush"));
    }

    #[test]
    fn acks_and_dead_letters_fold_into_the_children_they_name() {
        let mut children = vec![ChildRow {
            child_id: "deleg_a.0".into(),
            call_id: "deleg_a".into(),
            unit_id: "deleg_a-1".into(),
            session_id: "s".into(),
            task_index: 0,
            status: ChildStatus::Failed,
            summary: None,
            error: None,
            started_at_ms: None,
            finished_at_ms: None,
            attempt: 1,
            recovered: false,
            result: DeliveryRow::default(),
            notice: DeliveryRow::default(),
        }];
        let acks = vec![AckRow {
            claim_id: "c".into(),
            session_id: "s".into(),
            items: vec!["deleg_a.0:result".into(), "deleg_gone.0:result".into()],
            acked_at_ms: 0,
        }];
        let dead = vec![DeadLetterRow {
            dedup_key: "deleg_a.0:failure_notice".into(),
            child_id: "deleg_a.0".into(),
            session_id: "s".into(),
            call_id: "deleg_a".into(),
            kind: ItemKind::FailureNotice,
            reason: "r".into(),
            attempts: 8,
            dead_at_ms: 0,
        }];
        fold_delivery(&mut children, &acks, &dead);
        assert!(children[0].result.delivered && !children[0].result.dead);
        assert!(children[0].notice.dead && children[0].notice.failed_attempts == 8);
    }
}
