//! # forgetfs
//!
//! A file system for power-loss tests. It passes every operation through to a backing folder,
//! but keeps what was written in memory until it is made durable the way POSIX says it is:
//!
//! - the bytes and length of a file, until that file is fsynced or fdatasynced;
//! - a new, renamed, linked or unlinked file name, until its directory is fsynced.
//!
//! Reads show everything written (as a page cache would). A **power cut**, [`Mount::cut`],
//! forgets everything not yet durable: afterwards the mount shows only what was synced, files
//! that had no durable name are gone, and every file handle opened before the cut fails with
//! `EIO` (its process did not survive the power loss either). The backing folder holds only the
//! durable state, laid out as the mount shows it, plus a hidden folder (`.forgetfs-homes`) that
//! is removed at unmount.
//!
//! ```no_run
//! # fn main() -> Result<(), forgetfs::Error> {
//! let backing = tempfile::tempdir().expect("backing");
//! let mountpoint = tempfile::tempdir().expect("mountpoint");
//! let mount = forgetfs::Mount::new(backing.path(), mountpoint.path())?;
//! std::fs::write(mount.path().join("a"), b"never fsynced").expect("write");
//! mount.cut()?;
//! assert!(!mount.path().join("a").exists());
//! mount.unmount()?;
//! # Ok(()) }
//! ```
//!
//! What it does not model, on purpose: directories are durable at once (`mkdir`, `rmdir` and a
//! directory's rename first make their parent's pending entries durable, then happen in the
//! backing folder); mode, owner and times go to the backing folder at once; only regular files
//! and directories exist (no symlinks, devices or fifos); there is no torn write (a write is in
//! memory whole or not at all). A file's fsync writes and fsyncs its backing file; a directory's
//! fsync changes the backing folder's entries but does not fsync the backing folder, which plays
//! the disk (only the test's power is cut, never the host's).
//!
//! It needs the FUSE device (`/dev/fuse`) and either root (the mount syscall) or `fusermount3`
//! (Debian's `fuse3`); it links no libfuse. [`Mount::new`] says which is missing.
//!
//! The main types: [`Mount`] (a mounted file system and its power switch), [`Cut`] (what a cut
//! forgot), [`Error`].
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms, unreachable_pub)]
#![deny(unused_must_use)]

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

mod fuse;
mod overlay;
mod volume;

pub use volume::{Cut, HOMES};

/// The FUSE device.
pub const FUSE_DEVICE: &str = "/dev/fuse";

/// What can go wrong mounting, cutting or unmounting.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// There is no FUSE device, so nothing can be mounted.
    #[error(
        "{FUSE_DEVICE} is missing: forgetfs needs the FUSE kernel device (load the `fuse` module; \
         in a container, run it with `--device /dev/fuse --cap-add SYS_ADMIN`)"
    )]
    NoFuseDevice,
    /// The backing folder could not be read or prepared.
    #[error("cannot use {} as the backing folder: {source}", path.display())]
    Backing {
        /// The backing folder.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The kernel or fusermount3 refused the mount.
    #[error(
        "cannot mount forgetfs on {}: {source} (mounting needs root, or fusermount3 from \
         Debian's `fuse3` package, and access to {FUSE_DEVICE})",
        mountpoint.display()
    )]
    Mount {
        /// Where it was to be mounted.
        mountpoint: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The power cut could not update the backing folder.
    #[error("the power cut failed: {0}")]
    Cut(#[source] io::Error),
    /// The file system's state was poisoned by a panic in an earlier request.
    #[error("the file system's state is poisoned by an earlier panic")]
    Poisoned,
    /// Unmounting failed.
    #[error("cannot unmount {}: {source}", mountpoint.display())]
    Unmount {
        /// The mountpoint.
        mountpoint: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// Checks that FUSE can be used here at all (the device exists); [`Mount::new`] checks the rest.
pub fn check_fuse() -> Result<(), Error> {
    if Path::new(FUSE_DEVICE).exists() {
        Ok(())
    } else {
        Err(Error::NoFuseDevice)
    }
}

/// A mounted forgetfs and its power switch. Dropping it unmounts (errors ignored); prefer
/// [`Mount::unmount`], which reports them.
#[derive(Debug)]
pub struct Mount {
    session: Option<fuser::BackgroundSession>,
    volume: Arc<Mutex<volume::Volume>>,
    mountpoint: PathBuf,
}

impl Mount {
    /// Mounts a forgetfs at `mountpoint` over `backing`. Everything already in `backing` counts
    /// as durable.
    pub fn new(backing: &Path, mountpoint: &Path) -> Result<Mount, Error> {
        check_fuse()?;
        let vol = volume::Volume::load(backing).map_err(|source| Error::Backing {
            path: backing.to_path_buf(),
            source,
        })?;
        let volume = Arc::new(Mutex::new(vol));
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName("forgetfs".into()),
            fuser::MountOption::Subtype("forgetfs".into()),
        ];
        let fs = fuse::Fuse {
            volume: Arc::clone(&volume),
        };
        let session = fuser::spawn_mount(fs, mountpoint, &config).map_err(|source| Error::Mount {
            mountpoint: mountpoint.to_path_buf(),
            source,
        })?;
        Ok(Mount {
            session: Some(session),
            volume,
            mountpoint: mountpoint.to_path_buf(),
        })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// The power cut: forgets every byte, length and name that was not made durable, and kills
    /// every open handle. Processes that had files open should be dead by now (a handle that
    /// survives reads and writes `EIO`).
    pub fn cut(&self) -> Result<Cut, Error> {
        let mut vol = self.volume.lock().map_err(|_| Error::Poisoned)?;
        vol.cut()
            .map_err(|errno| Error::Cut(io::Error::from_raw_os_error(i32::from(errno))))
    }

    /// Unmounts and waits for the file system to stop. What was not durable is forgotten, as at
    /// a cut: the backing folder keeps the durable state only.
    pub fn unmount(mut self) -> Result<(), Error> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(), Error> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        session.umount_and_join().map_err(|source| Error::Unmount {
            mountpoint: self.mountpoint.clone(),
            source,
        })
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
