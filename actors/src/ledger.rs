//! The durable ledger: what brood has promised survives a crash.
//!
//! [`Ledger`] is the trait the actors write through; [`SledLedger`] is the embedded default
//! (sled 0.34.7 in a local folder). The trait owns storage and durability only: which rows to
//! write and when is decided by the actors. Writes become durable at [`Ledger::flush`]; nothing
//! may be reported as recorded before the flush that covers it returned (I1).
//!
//! Trees: `sessions`, `calls`, `units`, `children`, `claims`, `dead_letters`, `meta`. Keys are
//! the ids as UTF-8; values are [`crate::codec`] rows.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::codec::{self, CodecError};
use crate::model::{CallRow, ChildRow, ClaimRow, DeadLetterRow, SessionRow, UnitRow};

/// The ledger could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The storage engine failed (I/O, corruption, a lock held by another process).
    #[error("ledger storage failed: {0}")]
    Storage(String),
    /// A stored value could not be encoded or decoded.
    #[error("ledger value in tree `{tree}` at key `{key}`: {source}")]
    Codec {
        /// The tree.
        tree: &'static str,
        /// The key, lossily as text.
        key: String,
        /// What the codec said.
        source: CodecError,
    },
    /// A fault injected on purpose (the `failpoints` feature).
    #[error("injected fault: {0}")]
    Injected(&'static str),
}

impl From<sled::Error> for LedgerError {
    fn from(e: sled::Error) -> Self {
        LedgerError::Storage(e.to_string())
    }
}

/// Everything stored, as read when the ledger opens.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    /// All sessions.
    pub sessions: Vec<SessionRow>,
    /// All calls.
    pub calls: Vec<CallRow>,
    /// All units.
    pub units: Vec<UnitRow>,
    /// All children.
    pub children: Vec<ChildRow>,
    /// Claims that were live (or at least not yet ended) when the last process stopped.
    pub claims: Vec<ClaimRow>,
}

/// Durable storage for brood's rows. Implementations must be safe to share across threads.
pub trait Ledger: Send + Sync + fmt::Debug + 'static {
    /// Creates or replaces a session row.
    fn put_session(&self, row: &SessionRow) -> Result<(), LedgerError>;
    /// Writes everything one accepted call needs: the session (its next set), the call (with
    /// its tasks) and its units. A queued child has no row until it starts: its row is the
    /// call's task, and recovery queues every task without one. Not durable until
    /// [`Ledger::flush`].
    fn put_dispatch(&self, session: &SessionRow, call: &CallRow, units: &[UnitRow]) -> Result<(), LedgerError>;
    /// Forgets a call's rows: a dispatch that was never acknowledged (its flush failed), or
    /// the orphaned rows of one cut short by a crash.
    fn remove_dispatch(&self, call_id: &str, unit_ids: &[String], child_ids: &[String]) -> Result<(), LedgerError>;
    /// Writes child rows (running marks, delivery state) in one batch.
    fn put_children(&self, rows: &[ChildRow]) -> Result<(), LedgerError>;
    /// Records terminal child rows: a row already terminal in the ledger is left as it is (a
    /// retried hand-off), and the ledger's delivery state is kept over the child's copy.
    /// Returns the rows as stored.
    fn record_terminals(&self, rows: &[ChildRow]) -> Result<Vec<ChildRow>, LedgerError>;
    /// Records a claim (cheap: not flushed by the caller).
    fn put_claim(&self, row: &ClaimRow) -> Result<(), LedgerError>;
    /// Forgets claims that ended.
    fn remove_claims(&self, claim_ids: &[String]) -> Result<(), LedgerError>;
    /// Moves items to the dead-letter tree.
    fn put_dead_letters(&self, rows: &[DeadLetterRow]) -> Result<(), LedgerError>;
    /// Takes dead letters back (their items were revived).
    fn remove_dead_letters(&self, dedup_keys: &[String]) -> Result<(), LedgerError>;
    /// Every dead letter.
    fn dead_letters(&self) -> Result<Vec<DeadLetterRow>, LedgerError>;
    /// Makes every write so far durable; returns the bytes flushed.
    fn flush(&self) -> Result<usize, LedgerError>;
    /// Reads everything back (recovery).
    fn load(&self) -> Result<Snapshot, LedgerError>;
}

const SESSIONS: &str = "sessions";
const CALLS: &str = "calls";
const UNITS: &str = "units";
const CHILDREN: &str = "children";
const CLAIMS: &str = "claims";
const DEAD_LETTERS: &str = "dead_letters";
const META: &str = "meta";

/// How long [`SledLedger::open`] waits for a lock left by an earlier open to be released.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The embedded default ledger: sled in a local folder.
pub struct SledLedger {
    path: PathBuf,
    db: sled::Db,
    sessions: sled::Tree,
    calls: sled::Tree,
    units: sled::Tree,
    children: sled::Tree,
    claims: sled::Tree,
    dead_letters: sled::Tree,
}

impl fmt::Debug for SledLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SledLedger").field("path", &self.path).finish()
    }
}

impl SledLedger {
    /// Opens (or creates) the ledger in `path`.
    ///
    /// sled releases its file lock from a background thread some moments after the last handle
    /// of an earlier open is dropped, so a lock held by this process's own past is waited out
    /// (up to [`LOCK_WAIT`]); a lock held elsewhere is reported once that time is up.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, LedgerError> {
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
                    return Err(LedgerError::Storage(format!(
                        "opening {}: {e} (is another brood process using this folder?)",
                        path.display()
                    )))
                }
                Err(e) => return Err(LedgerError::Storage(format!("opening {}: {e}", path.display()))),
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
                    return Err(LedgerError::Storage(format!(
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
        Ok(SledLedger {
            sessions: db.open_tree(SESSIONS)?,
            calls: db.open_tree(CALLS)?,
            units: db.open_tree(UNITS)?,
            children: db.open_tree(CHILDREN)?,
            claims: db.open_tree(CLAIMS)?,
            dead_letters: db.open_tree(DEAD_LETTERS)?,
            path,
            db,
        })
    }

    /// The folder the ledger lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn encode<T: serde::Serialize>(tree: &'static str, key: &str, row: &T) -> Result<Vec<u8>, LedgerError> {
    codec::encode(row).map_err(|source| LedgerError::Codec {
        tree,
        key: key.to_string(),
        source,
    })
}

fn scan<T: serde::de::DeserializeOwned>(tree: &sled::Tree, name: &'static str) -> Result<Vec<T>, LedgerError> {
    let mut out = Vec::with_capacity(tree.len());
    for kv in tree.iter() {
        let (k, v) = kv?;
        out.push(codec::decode(&v).map_err(|source| LedgerError::Codec {
            tree: name,
            key: String::from_utf8_lossy(&k).into_owned(),
            source,
        })?);
    }
    Ok(out)
}

fn put_all<'a, T: serde::Serialize + 'a>(
    tree: &sled::Tree,
    name: &'static str,
    rows: impl IntoIterator<Item = (&'a str, &'a T)>,
) -> Result<(), LedgerError> {
    let mut batch = sled::Batch::default();
    for (key, row) in rows {
        batch.insert(key.as_bytes(), encode(name, key, row)?);
    }
    tree.apply_batch(batch)?;
    Ok(())
}

impl Ledger for SledLedger {
    fn put_session(&self, row: &SessionRow) -> Result<(), LedgerError> {
        crate::failpoint!("ledger_write");
        self.sessions
            .insert(row.session_id.as_bytes(), encode(SESSIONS, &row.session_id, row)?)?;
        Ok(())
    }

    fn put_dispatch(&self, session: &SessionRow, call: &CallRow, units: &[UnitRow]) -> Result<(), LedgerError> {
        crate::failpoint!("ledger_write");
        // sled recovers a prefix of its log, so order is what makes a dispatch safe: the
        // session's next set first (a crash may skip a set number, never reuse one), then the
        // units, the call last. Recovery drops rows of a call it never saw.
        self.sessions.insert(
            session.session_id.as_bytes(),
            encode(SESSIONS, &session.session_id, session)?,
        )?;
        put_all(&self.units, UNITS, units.iter().map(|u| (u.unit_id.as_str(), u)))?;
        self.calls
            .insert(call.call_id.as_bytes(), encode(CALLS, &call.call_id, call)?)?;
        Ok(())
    }

    fn remove_dispatch(&self, call_id: &str, unit_ids: &[String], child_ids: &[String]) -> Result<(), LedgerError> {
        // The call first: without it the rest is ignored by recovery anyway.
        self.calls.remove(call_id.as_bytes())?;
        let mut units = sled::Batch::default();
        for id in unit_ids {
            units.remove(id.as_bytes());
        }
        self.units.apply_batch(units)?;
        let mut children = sled::Batch::default();
        for id in child_ids {
            children.remove(id.as_bytes());
        }
        self.children.apply_batch(children)?;
        Ok(())
    }

    fn record_terminals(&self, rows: &[ChildRow]) -> Result<Vec<ChildRow>, LedgerError> {
        crate::failpoint!("ledger_write");
        let mut stored = Vec::with_capacity(rows.len());
        let mut batch = sled::Batch::default();
        for row in rows {
            let current: Option<ChildRow> = match self.children.get(row.child_id.as_bytes())? {
                Some(v) => Some(codec::decode(&v).map_err(|source| LedgerError::Codec {
                    tree: CHILDREN,
                    key: row.child_id.clone(),
                    source,
                })?),
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

    fn put_children(&self, rows: &[ChildRow]) -> Result<(), LedgerError> {
        crate::failpoint!("ledger_write");
        put_all(&self.children, CHILDREN, rows.iter().map(|c| (c.child_id.as_str(), c)))
    }

    fn put_claim(&self, row: &ClaimRow) -> Result<(), LedgerError> {
        self.claims
            .insert(row.claim_id.as_bytes(), encode(CLAIMS, &row.claim_id, row)?)?;
        Ok(())
    }

    fn remove_claims(&self, claim_ids: &[String]) -> Result<(), LedgerError> {
        let mut batch = sled::Batch::default();
        for id in claim_ids {
            batch.remove(id.as_bytes());
        }
        self.claims.apply_batch(batch)?;
        Ok(())
    }

    fn put_dead_letters(&self, rows: &[DeadLetterRow]) -> Result<(), LedgerError> {
        crate::failpoint!("ledger_write");
        put_all(
            &self.dead_letters,
            DEAD_LETTERS,
            rows.iter().map(|d| (d.dedup_key.as_str(), d)),
        )
    }

    fn remove_dead_letters(&self, dedup_keys: &[String]) -> Result<(), LedgerError> {
        let mut batch = sled::Batch::default();
        for key in dedup_keys {
            batch.remove(key.as_bytes());
        }
        self.dead_letters.apply_batch(batch)?;
        Ok(())
    }

    fn dead_letters(&self) -> Result<Vec<DeadLetterRow>, LedgerError> {
        scan(&self.dead_letters, DEAD_LETTERS)
    }

    fn flush(&self) -> Result<usize, LedgerError> {
        crate::failpoint!("ledger_flush");
        Ok(self.db.flush()?)
    }

    fn load(&self) -> Result<Snapshot, LedgerError> {
        Ok(Snapshot {
            sessions: scan(&self.sessions, SESSIONS)?,
            calls: scan(&self.calls, CALLS)?,
            units: scan(&self.units, UNITS)?,
            children: scan(&self.children, CHILDREN)?,
            claims: scan(&self.claims, CLAIMS)?,
        })
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
}
