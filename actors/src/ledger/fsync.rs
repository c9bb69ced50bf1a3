//! fsync of what sled writes, for [`super::Durability::Fsync`]: sled's own flush leaves the
//! device cache, file sizes, blob files and folders unsynced.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::LedgerError;

/// fsync of what sled writes. sled 0.34.7's flush ends in `sync_file_range` on its log file
/// (`db`): data pages reach the device, but neither its cache nor the file's size do. Values
/// over its blob threshold go to new files in `blobs/`, written without any sync, and its
/// folders are never synced. So after sled's flush, this fsyncs `db`, every blob file not
/// synced yet, and — when a blob appeared — the `blobs` folder (fsync applies to the inode,
/// whichever descriptor calls it).
pub(super) struct FileSync {
    root: PathBuf,
    log: File,
    pub(super) synced_blobs: Mutex<HashSet<std::ffi::OsString>>,
}

impl FileSync {
    pub(super) fn open(root: &Path) -> Result<Self, LedgerError> {
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

    pub(super) fn sync(&self) -> Result<(), LedgerError> {
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
