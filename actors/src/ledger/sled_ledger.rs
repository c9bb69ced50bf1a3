//! [`SledLedger`]: the embedded default ledger, sled 0.34.7 in a local folder. It reads every
//! tree back with quarantine of what cannot be read, folds ack rows and dead letters into the
//! children's delivery state, and ends each flush with an fsync when asked to.

use std::fmt;
use std::path::{Path, PathBuf};

use super::fsync::FileSync;
use super::rows::*;
use super::trees::*;
use super::{CallParts, ChildRuns, Durability, Ledger, LedgerError, Snapshot, Writes};
use crate::codec;
use crate::model::*;

/// The default bound of sled's page cache: 64 MiB. sled's own default, 1 GiB, let a process
/// grow with its ledger's size (measured: 0.23 GB of RSS at 10k delivered rows, 0.69 GB at 1M,
/// even at a 256 MiB bound, as sled's count of a cached page is below its real size).
pub const DEFAULT_CACHE_BYTES: u64 = 64 << 20;

/// How long [`SledLedger::open`] waits for a lock left by an earlier open to be released.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Told how long each successful [`Ledger::flush`] took (its fsync included): a hook for an
/// embedder's metrics, called on the flushing thread, so it should be quick.
pub type FlushObserver = std::sync::Arc<dyn Fn(std::time::Duration) + Send + Sync>;

/// The embedded default ledger: sled in a local folder.
pub struct SledLedger {
    path: PathBuf,
    durability: Durability,
    db: sled::Db,
    sessions: sled::Tree,
    calls: sled::Tree,
    children: sled::Tree,
    claims: sled::Tree,
    acks: sled::Tree,
    starts: sled::Tree,
    wakes: sled::Tree,
    nests: sled::Tree,
    redrives: sled::Tree,
    dead_letters: sled::Tree,
    /// The session of every stored call, by call id: a call is found by its id alone without
    /// a scan ([`Ledger::find_call`]). An entry may outlive its call (a crash between their
    /// writes), never the other way round.
    call_sessions: sled::Tree,
    quarantine: sled::Tree,
    quarantine_raw: sled::Tree,
    files: FileSync,
    on_flush: Option<FlushObserver>,
    /// Whether a row was moved aside since the last load ended.
    moved_aside: std::sync::atomic::AtomicBool,
    /// Held while terminal rows are read and written: two batches at once (a coalescer's job
    /// still running after it was restarted) would each decide on the same stored row.
    terminals: std::sync::Mutex<()>,
}

impl fmt::Debug for SledLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SledLedger")
            .field("path", &self.path)
            .field("durability", &self.durability)
            .finish()
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
        Self::open_with_cache(path, durability, DEFAULT_CACHE_BYTES)
    }

    /// As [`SledLedger::open_with`], with sled's page cache bounded at `cache_bytes`.
    pub fn open_with_cache(
        path: impl AsRef<Path>,
        durability: Durability,
        cache_bytes: u64,
    ) -> Result<Self, LedgerError> {
        let path = path.as_ref().to_path_buf();
        let started = std::time::Instant::now();
        let mut pause = std::time::Duration::from_millis(5);
        let db = loop {
            match sled::Config::new().path(&path).cache_capacity(cache_bytes).open() {
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
                meta.insert(LAYOUT_KEY, encode(META, LAYOUT_KEY, &LAYOUT)?)?;
                db.flush()?;
            }
        }
        let layout: u8 = match meta.get(LAYOUT_KEY)? {
            // Written before layouts were numbered: keys were the bare ids.
            None => 1,
            Some(v) => codec::decode(&v).map_err(|source| LedgerError::Codec {
                tree: META,
                key: LAYOUT_KEY.into(),
                source,
            })?,
        };
        match layout {
            LAYOUT => {}
            1..=4 => {
                if layout == 1 {
                    super::migrate::session_keys(&db)?;
                }
                // Layout 2 is layout 3 without start rows: only the number changes, so that a
                // build that does not fold start rows refuses this ledger rather than take
                // its started children for queued ones and run them a second time. Layout 3
                // is layout 4 without session rows of version 2: a build that does not read
                // them refuses the ledger rather than quarantine its sessions. Layout 4 is
                // layout 5 without call rows of version 2 (with a trace context), likewise.
                meta.insert(LAYOUT_KEY, encode(META, LAYOUT_KEY, &LAYOUT)?)?;
                db.flush()?;
                FileSync::open(&path)?.sync()?;
            }
            newer => {
                return Err(LedgerError::storage_msg(format!(
                    "{} holds ledger layout {newer}; this build reads layouts up to {LAYOUT}",
                    path.display()
                )))
            }
        }
        let calls = db.open_tree(CALLS)?;
        let call_sessions = db.open_tree(CALL_SESSIONS)?;
        if meta.get(CALL_INDEX_KEY)?.is_none() {
            // Calls stored before the index was kept: indexed once, in one pass.
            let mut batch = sled::Batch::default();
            for kv in calls.iter() {
                let (key, _) = kv?;
                if let Some((session, call)) = split_row_key(&key) {
                    batch.insert(call, encode(CALL_SESSIONS, call, &session.to_string())?);
                }
            }
            call_sessions.apply_batch(batch)?;
            meta.insert(CALL_INDEX_KEY, encode(META, CALL_INDEX_KEY, &1u8)?)?;
            db.flush()?;
            FileSync::open(&path)?.sync()?;
        }
        let files = FileSync::open(&path)?;
        Ok(SledLedger {
            sessions: db.open_tree(SESSIONS)?,
            calls,
            call_sessions,
            children: db.open_tree(CHILDREN)?,
            claims: db.open_tree(CLAIMS)?,
            acks: db.open_tree(ACKS)?,
            starts: db.open_tree(STARTS)?,
            wakes: db.open_tree(WAKES)?,
            nests: db.open_tree(NESTS)?,
            redrives: db.open_tree(REDRIVES)?,
            dead_letters: db.open_tree(DEAD_LETTERS)?,
            quarantine: db.open_tree(QUARANTINE)?,
            quarantine_raw: db.open_tree(QUARANTINE_RAW)?,
            files,
            on_flush: None,
            moved_aside: Default::default(),
            terminals: Default::default(),
            durability,
            path,
            db,
        })
    }

    /// Tells `observer` the duration of every successful flush from now on.
    pub fn on_flush(mut self, observer: FlushObserver) -> Self {
        self.on_flush = Some(observer);
        self
    }

    /// The folder the ledger lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn tree(&self, name: &str) -> Option<&sled::Tree> {
        Some(match name {
            SESSIONS => &self.sessions,
            CALLS => &self.calls,
            CALL_SESSIONS => &self.call_sessions,
            CHILDREN => &self.children,
            CLAIMS => &self.claims,
            ACKS => &self.acks,
            STARTS => &self.starts,
            WAKES => &self.wakes,
            NESTS => &self.nests,
            REDRIVES => &self.redrives,
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
        let (qkey, row) = quarantine_entry(name, key, value, reason);
        self.quarantine_raw.insert(&qkey, value)?;
        self.quarantine.insert(&qkey, encode(QUARANTINE, key, &row)?)?;
        tree.remove(key)?;
        self.moved_aside.store(true, std::sync::atomic::Ordering::Relaxed);
        tracing::error!(
            tree = name,
            key = %crate::text::printable(&String::from_utf8_lossy(key)),
            "a stored row could not be used and was moved to the quarantine tree: {reason}"
        );
        Ok(())
    }

    /// Reads a tree back, all of it or one session's rows (a key range of a session-scoped
    /// tree, the one row of a tree keyed by session id); rows that do not decode or fail their
    /// check are quarantined.
    fn scan<T: crate::codec::Stored + CheckRow>(
        &self,
        tree: &sled::Tree,
        name: &'static str,
        session: Option<&str>,
    ) -> Result<Vec<T>, LedgerError> {
        let rows = match session {
            None => tree.iter(),
            Some(s) if is_scoped(name) => tree.scan_prefix(session_prefix(s)),
            Some(s) => tree.range(s.as_bytes()..=s.as_bytes()),
        };
        // Not `tree.len()`: in sled 0.34 that is a scan of its own.
        let mut out = Vec::new();
        let bad = decode_rows(rows, &mut out)?;
        self.move_all_aside(tree, name, bad)?;
        Ok(out)
    }

    fn move_all_aside(&self, tree: &sled::Tree, name: &str, bad: Vec<BadRow>) -> Result<(), LedgerError> {
        for (k, v, reason) in bad {
            self.move_aside(tree, name, &k, &v, &reason)?;
        }
        Ok(())
    }

    /// Reads the children's rows back, all or one session's, as [`SledLedger::scan`] does,
    /// into a vector sized once from the calls' tasks. A large read is split into key ranges
    /// at call boundaries, one per core, decoded on threads of their own (sled's reads are
    /// safe to run at once); the rows come back in key order all the same.
    fn scan_children(&self, session: Option<&str>, calls: &[CallRow]) -> Result<ChildRuns, LedgerError> {
        let expected: usize = calls.iter().map(|c| c.tasks.len()).sum();
        self.scan_children_in(session, calls, crate::parallel::threads_for(expected, calls.len()))
    }

    /// [`SledLedger::scan_children`] in `parts` ranges (at most one per call).
    fn scan_children_in(
        &self,
        session: Option<&str>,
        calls: &[CallRow],
        parts: usize,
    ) -> Result<ChildRuns, LedgerError> {
        use std::ops::Bound;
        // A call's children are at most its tasks (a damaged extra row is quarantined).
        let expected: usize = calls.iter().map(|c| c.tasks.len()).sum();
        let parts = parts.clamp(1, calls.len().max(1));
        let (from, to) = match session {
            None => (Bound::Unbounded, Bound::Unbounded),
            Some(s) => {
                let prefix = session_prefix(s);
                // Every key of the session starts `<session>\0`, so is below `<session>\1`.
                let mut end = prefix.clone();
                *end.last_mut().expect("a prefix ends with its separator") = 1;
                (Bound::Included(prefix), Bound::Excluded(end))
            }
        };
        // The split keys: the first key of the call at which each part's share of the tasks
        // is reached (calls come in key order, as their children do).
        let mut cuts = Vec::with_capacity(parts - 1);
        let mut seen = 0;
        for call in calls {
            if cuts.len() + 1 < parts && seen >= expected * (cuts.len() + 1) / parts {
                cuts.push(row_key(&call.session_id, &call.call_id));
            }
            seen += call.tasks.len();
        }
        let mut bounds = Vec::with_capacity(cuts.len() + 1);
        let mut lower = from;
        for cut in cuts {
            bounds.push((lower, Bound::Excluded(cut.clone())));
            lower = Bound::Included(cut);
        }
        bounds.push((lower, to));
        let mut out = ChildRuns::new();
        let (first, rest) = bounds.split_first().expect("one range at least");
        let (bad, more) = std::thread::scope(|scope| {
            let others: Vec<_> = rest
                .iter()
                .map(|range| {
                    let tree = &self.children;
                    scope.spawn(move || {
                        let mut rows = ChildRuns::new();
                        decode_rows(tree.range::<Vec<u8>, _>(range.clone()), &mut rows).map(|bad| (rows, bad))
                    })
                })
                .collect();
            let mut bad = decode_rows(self.children.range::<Vec<u8>, _>(first.clone()), &mut out)?;
            let mut more = Vec::with_capacity(others.len());
            for other in others {
                let (rows, b) = other.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
                more.push(rows);
                bad.extend(b);
            }
            Ok::<_, LedgerError>((bad, more))
        })?;
        for rows in more {
            out.append(rows);
        }
        self.move_all_aside(&self.children, CHILDREN, bad)?;
        Ok(out)
    }

    /// The children (of one session, or all) whose rows are in quarantine.
    fn damaged_children(&self, session: Option<&str>) -> Result<Vec<String>, LedgerError> {
        let mut prefix = format!("{CHILDREN}/").into_bytes();
        if let Some(s) = session {
            prefix.extend_from_slice(&session_prefix(s));
        }
        let mut out = Vec::new();
        for kv in self.quarantine.scan_prefix(prefix) {
            let (k, _) = kv?;
            let key = &k[CHILDREN.len() + 1..];
            // A key of the session-keyed layout names its session first.
            let id = key.iter().position(|&b| b == 0).map_or(key, |nul| &key[nul + 1..]);
            out.push(String::from_utf8_lossy(id).into_owned());
        }
        Ok(out)
    }

    /// Reads everything back, or one session's rows, with delivery state folded in.
    fn read(&self, session: Option<&str>) -> Result<Snapshot, LedgerError> {
        let acks: Vec<AckRow> = self.scan(&self.acks, ACKS, session)?;
        let dead: Vec<DeadLetterRow> = self.scan(&self.dead_letters, DEAD_LETTERS, session)?;
        // The calls first: their tasks say how many child rows to expect and where to split
        // the children's keys between threads.
        let calls: Vec<CallRow> = self.scan(&self.calls, CALLS, session)?;
        let mut children = self.scan_children(session, &calls)?;
        fold_delivery(children.iter_mut(), &acks, &dead);
        let claims = live_claims(self.scan(&self.claims, CLAIMS, session)?, &acks);
        let snapshot = Snapshot {
            sessions: self.scan(&self.sessions, SESSIONS, session)?,
            calls,
            children,
            claims,
            starts: self.scan(&self.starts, STARTS, session)?,
            damaged_children: self.damaged_children(session)?,
            wakes: self.scan(&self.wakes, WAKES, session)?,
            nests: self.scan(&self.nests, NESTS, session)?,
        };
        self.settle_quarantine()?;
        Ok(snapshot)
    }

    /// Makes what a load moved aside durable: it must not come back on its own.
    fn settle_quarantine(&self) -> Result<(), LedgerError> {
        if self.moved_aside.swap(false, std::sync::atomic::Ordering::Relaxed) {
            self.flush()?;
        }
        Ok(())
    }

    /// Up to `limit` rows of `session_id` in a session-scoped tree, in key order, after `after`.
    fn page<T: crate::codec::Stored>(
        &self,
        tree: &sled::Tree,
        name: &'static str,
        session_id: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<T>, LedgerError> {
        let prefix = session_prefix(session_id);
        let start = match after {
            // The next key after `after`: the smallest key greater than it.
            Some(a) => {
                let mut k = row_key(session_id, a);
                k.push(0);
                k
            }
            None => prefix.clone(),
        };
        let mut out = Vec::new();
        for kv in tree.range(start..) {
            let (k, v) = kv?;
            if !k.starts_with(&prefix) || out.len() >= limit {
                break;
            }
            out.push(decode_at(name, &k, &v)?);
        }
        Ok(out)
    }

    /// The row `id` of `session_id` in a session-scoped tree, if there is one.
    fn get_row<T: crate::codec::Stored>(
        &self,
        tree: &sled::Tree,
        name: &'static str,
        session_id: &str,
        id: &str,
    ) -> Result<Option<T>, LedgerError> {
        match tree.get(row_key(session_id, id))? {
            None => Ok(None),
            Some(v) => decode_at(name, id.as_bytes(), &v).map(Some),
        }
    }

    /// The stored key of `id` in `tree`: session-scoped, or the session id itself.
    fn key_of(name: &str, session_id: &str, id: &str) -> Vec<u8> {
        if is_scoped(name) {
            row_key(session_id, id)
        } else {
            id.as_bytes().to_vec()
        }
    }
}

/// The ledger's layout this build writes: 5, every session-scoped row keyed by [`row_key`],
/// children's running marks in start rows, session rows of version 2 (with `addressable`) and
/// call rows of version 2 (with `traceparent`). Layout 1 (bare ids, and unit rows) is migrated
/// when opened; layouts 2 (no start rows), 3 (session rows of version 1 only) and 4 (call rows
/// of version 1 only; this build reads both) need nothing but their number changed.
pub const LAYOUT: u8 = 5;
const LAYOUT_KEY: &str = "layout";

/// A row that could not be used: its key, its value and why.
type BadRow = (sled::IVec, sled::IVec, String);

impl Ledger for SledLedger {
    fn write(&self, w: &Writes) -> Result<(), LedgerError> {
        crate::failpoint!("ledger_write");
        if crate::failpoints::fires("ledger_write_stall") {
            // A slow disk: the write goes through, late.
            std::thread::sleep(std::time::Duration::from_millis(400));
        }
        // One batch per run of one tree's changes, in their order; a call's index entry is
        // written before the call and removed after it.
        // A child's row that would move an ended child back is not written (its ended row is
        // kept, and reported): one read per unended row, which only start marks and requeues
        // write through here.
        let mut kept: Vec<Vec<u8>> = Vec::new();
        for row in w.children.iter().filter(|r| !r.status.is_terminal()) {
            let key = row_key(&row.session_id, &row.child_id);
            let stored = self
                .children
                .get(&key)?
                .and_then(|v| codec::decode::<ChildRow>(&v).ok());
            if let Some(stored) = stored {
                if child_write(Some((stored.status, stored.attempt)), (row.status, row.attempt))
                    == ChildWrite::KeepTerminal
                {
                    report_kept(stored.status, row);
                    kept.push(key);
                }
            }
        }
        let mut changes = with_call_index(write_changes(w)?)?
            .into_iter()
            .filter(|c| kept.is_empty() || c.0 != CHILDREN || !kept.contains(&c.1))
            .peekable();
        while let Some((name, key, value)) = changes.next() {
            let tree = self
                .tree(name)
                .ok_or_else(|| LedgerError::storage_msg(format!("no tree `{name}` to write to")))?;
            let mut batch = sled::Batch::default();
            let mut put = |key, value: Option<Vec<u8>>| match value {
                Some(v) => batch.insert(key, v),
                None => batch.remove(key),
            };
            put(key, value);
            while let Some((key, value)) = changes.next_if(|c| c.0 == name).map(|c| (c.1, c.2)) {
                put(key, value);
            }
            tree.apply_batch(batch)?;
        }
        Ok(())
    }

    fn record_terminals(&self, rows: Vec<ChildRow>) -> Result<Vec<ChildRow>, LedgerError> {
        crate::failpoint!("ledger_write");
        let _one_batch_at_a_time = self.terminals.lock().unwrap_or_else(|p| p.into_inner());
        let (stored, writes) = merge_terminals(rows, |key| {
            // A stored row that does not decode is overwritten by the child's own, which is
            // complete; the damaged one was quarantined when the ledger opened.
            Ok(self.children.get(key)?.and_then(|v| codec::decode(&v).ok()))
        })?;
        // One insert per row rather than one sled batch: each row stands alone (a crash may
        // keep some of an unflushed batch, whose children were not answered yet, and recovery
        // publishes what it finds), and sled's batch costs a sixth more CPU than its inserts.
        for (key, at) in writes {
            let row = &stored[at];
            self.children.insert(key, encode(CHILDREN, &row.child_id, row)?)?;
        }
        Ok(stored)
    }

    fn put_claim(&self, row: &ClaimRow) -> Result<(), LedgerError> {
        self.claims.insert(
            row_key(&row.session_id, &row.claim_id),
            encode(CLAIMS, &row.claim_id, row)?,
        )?;
        Ok(())
    }

    fn ack(&self, session_id: &str, claim_id: &str) -> Result<Option<AckRow>, LedgerError> {
        self.get_row(&self.acks, ACKS, session_id, claim_id)
    }

    fn find_call(&self, call_id: &str) -> Result<Option<CallRow>, LedgerError> {
        let Some(v) = self.call_sessions.get(call_id)? else {
            return Ok(None);
        };
        let session: String = decode_at(CALL_SESSIONS, call_id.as_bytes(), &v)?;
        self.call(&session, call_id)
    }

    fn has_session(&self, session_id: &str) -> Result<bool, LedgerError> {
        Ok(self.sessions.contains_key(session_id)?)
    }

    fn call(&self, session_id: &str, call_id: &str) -> Result<Option<CallRow>, LedgerError> {
        self.get_row(&self.calls, CALLS, session_id, call_id)
    }

    fn dead_letters(&self) -> Result<Vec<DeadLetterRow>, LedgerError> {
        self.scan(&self.dead_letters, DEAD_LETTERS, None)
    }

    fn dead_letter_total(&self) -> Result<u64, LedgerError> {
        Ok(self.dead_letters.len() as u64)
    }

    fn session_ids(&self, after: Option<&str>, prefix: Option<&str>, limit: usize) -> Result<Vec<String>, LedgerError> {
        let prefix = prefix.unwrap_or("").as_bytes();
        let start = match after {
            Some(a) => {
                let mut k = a.as_bytes().to_vec();
                k.push(0);
                k.max(prefix.to_vec())
            }
            None => prefix.to_vec(),
        };
        let mut out = Vec::new();
        for k in self.sessions.range(start..).keys() {
            let k = k?;
            if !k.starts_with(prefix) || out.len() >= limit {
                break;
            }
            if let Ok(id) = std::str::from_utf8(&k) {
                out.push(id.to_string());
            }
        }
        Ok(out)
    }

    fn dead_letter_counts(&self, first: &str, last: &str) -> Result<Vec<(String, u64)>, LedgerError> {
        let mut end = session_prefix(last);
        // Past every key of `last`: its ids follow a NUL, and nothing sorts between.
        if let Some(nul) = end.last_mut() {
            *nul = 1;
        }
        let mut out: Vec<(String, u64)> = Vec::new();
        for k in self.dead_letters.range(session_prefix(first)..end).keys() {
            let k = k?;
            let session = k.split(|b| *b == 0).next().unwrap_or(&[]);
            match out.last_mut() {
                Some((s, n)) if s.as_bytes() == session => *n += 1,
                _ => {
                    if let Ok(s) = std::str::from_utf8(session) {
                        out.push((s.to_string(), 1));
                    }
                }
            }
        }
        Ok(out)
    }

    fn child(&self, session_id: &str, child_id: &str) -> Result<Option<ChildRow>, LedgerError> {
        self.get_row(&self.children, CHILDREN, session_id, child_id)
    }

    fn call_children(&self, session_id: &str, call_id: &str) -> Result<Vec<ChildRow>, LedgerError> {
        let prefix = row_key(session_id, &format!("{call_id}."));
        let mut out = Vec::new();
        for kv in self.children.scan_prefix(prefix) {
            let (k, v) = kv?;
            let row: ChildRow = decode_at(CHILDREN, &k, &v)?;
            if row.call_id == call_id {
                out.push(row);
            }
        }
        out.sort_by_key(|r| r.task_index);
        Ok(out)
    }

    fn row_counts(&self) -> Result<Vec<(&'static str, usize)>, LedgerError> {
        let trees = super::ROW_TREES;
        let mut out = Vec::with_capacity(trees.len());
        for name in trees {
            if let Some(tree) = self.tree(name) {
                out.push((name, tree.len()));
            }
        }
        Ok(out)
    }

    fn calls_page(&self, session_id: &str, after: Option<&str>, limit: usize) -> Result<Vec<CallRow>, LedgerError> {
        self.page(&self.calls, CALLS, session_id, after, limit)
    }

    fn acks_page(&self, session_id: &str, after: Option<&str>, limit: usize) -> Result<Vec<AckRow>, LedgerError> {
        self.page(&self.acks, ACKS, session_id, after, limit)
    }

    fn call_parts(&self, session_id: &str, call_id: &str) -> Result<CallParts, LedgerError> {
        let mut parts = CallParts {
            children: self.call_children(session_id, call_id)?,
            ..CallParts::default()
        };
        let items = row_key(session_id, &format!("{call_id}."));
        for kv in self.dead_letters.scan_prefix(&items) {
            let (k, v) = kv?;
            let row: DeadLetterRow = decode_at(DEAD_LETTERS, &k, &v)?;
            if row.call_id == call_id {
                parts.dead_letters.push(row);
            }
        }
        let id_of = |k: &[u8], prefix_len: usize| String::from_utf8_lossy(&k[prefix_len..]).into_owned();
        let scope = session_prefix(session_id).len();
        for kv in self.redrives.scan_prefix(&items) {
            parts.redrives.push(id_of(&kv?.0, scope));
        }
        for kv in self.starts.scan_prefix(row_key(session_id, &format!("{call_id}/"))) {
            parts.starts.push(id_of(&kv?.0, scope));
        }
        Ok(parts)
    }

    fn redrive(&self, session_id: &str, dedup_key: &str) -> Result<Option<RedriveRow>, LedgerError> {
        self.get_row(&self.redrives, REDRIVES, session_id, dedup_key)
    }

    fn flush(&self) -> Result<usize, LedgerError> {
        crate::failpoint!("ledger_flush");
        if crate::failpoints::fires("ledger_flush_slow_fail") {
            // A slow disk that gives up.
            std::thread::sleep(std::time::Duration::from_millis(400));
            return Err(LedgerError::Injected("ledger_flush_slow_fail"));
        }
        let started = std::time::Instant::now();
        if crate::failpoints::fires("ledger_flush_stall") {
            // A slow disk: the flush succeeds, late.
            std::thread::sleep(std::time::Duration::from_millis(400));
        }
        let bytes = self.db.flush()?;
        if self.durability == Durability::Fsync {
            self.files.sync()?;
        }
        if let Some(observe) = &self.on_flush {
            observe(started.elapsed());
        }
        Ok(bytes)
    }

    fn durability(&self) -> Durability {
        self.durability
    }

    fn load(&self) -> Result<Snapshot, LedgerError> {
        self.read(None)
    }

    fn load_session(&self, session_id: &str) -> Result<Snapshot, LedgerError> {
        self.read(Some(session_id))
    }

    fn quarantine(&self, tree: &str, session_id: &str, id: &str, reason: &str) -> Result<(), LedgerError> {
        let Some(t) = self.tree(tree) else {
            return Err(LedgerError::storage_msg(format!("no tree `{tree}` to quarantine from")));
        };
        let key = Self::key_of(tree, session_id, id);
        match t.get(&key)? {
            Some(v) => self.move_aside(t, tree, &key, &v, reason),
            None => Ok(()),
        }
    }

    fn quarantined(&self) -> Result<Vec<Quarantined>, LedgerError> {
        let mut out = Vec::new();
        for kv in self.quarantine.iter() {
            let (k, v) = kv?;
            let value = self.quarantine_raw.get(&k)?.map(|v| v.to_vec()).unwrap_or_default();
            out.push(read_quarantined(&k, &v, value));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;

/// The meta key that says every stored call is in the call index.
const CALL_INDEX_KEY: &str = "call_index";

/// `changes` with the call index kept beside the calls: an entry put before the first change
/// and removed after the last, so that a crash between the trees' batches leaves at most an
/// entry whose call is gone (found as no call), never a call that cannot be found.
fn with_call_index(changes: Vec<Change>) -> Result<Vec<Change>, LedgerError> {
    let mut puts = Vec::new();
    let mut removes = Vec::new();
    for (tree, key, value) in &changes {
        if *tree != CALLS {
            continue;
        }
        let Some((session, call)) = split_row_key(key) else {
            continue;
        };
        match value {
            Some(_) => puts.push((
                CALL_SESSIONS,
                call.as_bytes().to_vec(),
                Some(encode(CALL_SESSIONS, call, &session.to_string())?),
            )),
            None => removes.push((CALL_SESSIONS, call.as_bytes().to_vec(), None)),
        }
    }
    if puts.is_empty() && removes.is_empty() {
        return Ok(changes);
    }
    puts.extend(changes);
    puts.extend(removes);
    Ok(puts)
}
