//! The FUSE side: each kernel request becomes one call on the [`Volume`], under its lock.
//!
//! This module owns the translation (inode numbers, flags, replies, time-to-live) and the
//! choices that keep the kernel from hiding anything: every file is opened `direct_io` (no page
//! cache, so every read and write reaches the volume), the kernel's write-back cache is not
//! asked for, and entries and attributes are given a zero time-to-live, so what a cut forgot is
//! gone from the next lookup on.

use std::ffi::OsStr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};

use crate::volume::Volume;

const TTL: Duration = Duration::ZERO;

/// The mounted file system; it shares its volume with the [`crate::Mount`] handle.
#[derive(Debug)]
pub(crate) struct Fuse {
    pub(crate) volume: Arc<Mutex<Volume>>,
}

impl Fuse {
    fn vol(&self) -> Result<MutexGuard<'_, Volume>, Errno> {
        self.volume.lock().map_err(|_| Errno::EIO)
    }
}

fn time(t: Option<TimeOrNow>) -> Option<SystemTime> {
    t.map(|t| match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    })
}

fn entry(reply: ReplyEntry, r: Result<fuser::FileAttr, Errno>) {
    match r {
        Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
        Err(e) => reply.error(e),
    }
}

fn empty(reply: ReplyEmpty, r: Result<(), Errno>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

impl Filesystem for Fuse {
    fn destroy(&mut self) {
        if let Ok(mut vol) = self.volume.lock() {
            // Nothing to report to: the kernel has already let go of the mount.
            let _ = vol.close();
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        entry(reply, self.vol().and_then(|v| v.lookup(parent.0, name)));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.vol().and_then(|v| v.attr(ino.0)) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let r = self
            .vol()
            .and_then(|mut v| v.setattr(ino.0, mode, uid, gid, size, time(atime), time(mtime)));
        match r {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc_s_ifmt() != libc_s_ifreg() {
            // Only regular files are modelled.
            reply.error(Errno::EPERM);
            return;
        }
        entry(
            reply,
            self.vol()
                .and_then(|mut v| v.create_file(parent.0, name, mode & !umask)),
        );
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        entry(
            reply,
            self.vol().and_then(|mut v| v.mkdir(parent.0, name, mode & !umask)),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.vol().and_then(|mut v| v.unlink(parent.0, name)));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.vol().and_then(|mut v| v.rmdir(parent.0, name)));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.intersects(RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_WHITEOUT) {
            reply.error(Errno::EINVAL);
            return;
        }
        let no_replace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        empty(
            reply,
            self.vol()
                .and_then(|mut v| v.rename(parent.0, name, newparent.0, newname, no_replace)),
        );
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        entry(reply, self.vol().and_then(|mut v| v.link(ino.0, newparent.0, newname)));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let append = flags.0 & append_flag() != 0;
        match self.vol().and_then(|mut v| v.open(ino.0, append)) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.vol().and_then(|mut v| v.read(ino.0, fh.0, offset, size)) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.vol().and_then(|mut v| v.write(ino.0, fh.0, offset, data)) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // close() makes nothing durable.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if let Ok(mut v) = self.vol() {
            v.release(fh.0);
        }
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        empty(reply, self.vol().and_then(|mut v| v.fsync(ino.0, fh.0, datasync)));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.vol().and_then(|mut v| v.open(ino.0, false)) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let vol = match self.vol() {
            Ok(v) => v,
            Err(e) => return reply.error(e),
        };
        match vol.listing(ino.0, fh.0) {
            Ok(listing) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX);
                for (i, (child, kind, name)) in listing.iter().enumerate().skip(start) {
                    if reply.add(INodeNo(*child), i as u64 + 1, *kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        if let Ok(mut v) = self.vol() {
            v.release(fh.0);
        }
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        empty(reply, self.vol().and_then(|mut v| v.fsyncdir(ino.0, fh.0)));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let backing = match self.vol() {
            Ok(v) => v.backing().to_path_buf(),
            Err(e) => return reply.error(e),
        };
        match nix::sys::statvfs::statvfs(&backing) {
            Ok(s) => {
                let small = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
                reply.statfs(
                    s.blocks(),
                    s.blocks_free(),
                    s.blocks_available(),
                    s.files(),
                    s.files_free(),
                    small(s.block_size()),
                    small(s.name_max()),
                    small(s.fragment_size()),
                )
            }
            Err(e) => reply.error(Errno::from_i32(e as i32)),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        empty(reply, self.vol().and_then(|v| v.attr(ino.0).map(|_| ())));
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let append = flags & append_flag() != 0;
        let r = self.vol().and_then(|mut v| {
            let attr = v.create_file(parent.0, name, mode & !umask)?;
            let fh = v.open(attr.ino.0, append)?;
            Ok((attr, fh))
        });
        match r {
            Ok((attr, fh)) => reply.created(&TTL, &attr, Generation(0), FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }
}

// The few open(2) and stat(2) constants needed, from nix's libc.
fn append_flag() -> i32 {
    nix::libc::O_APPEND
}

fn libc_s_ifmt() -> u32 {
    nix::libc::S_IFMT
}

fn libc_s_ifreg() -> u32 {
    nix::libc::S_IFREG
}
