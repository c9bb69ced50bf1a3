//! The file system's state: which names and bytes are durable, and which are only visible.
//!
//! A [`Volume`] owns the namespace (directories, their visible and their durable entries), the
//! files (each an [`Overlay`] over its durable copy), the open handles and the power cut. It
//! works on inode numbers and names and returns `Errno`s; it does not speak FUSE (that is
//! `fuse.rs`).
//!
//! The backing folder holds only durable state, laid out as the mount shows it, plus one hidden
//! folder, [`HOMES`], that holds every known file under its inode number (a hard link). A file's
//! bytes are always written to its home; a durable name is a hard link to the home, added or
//! removed when its directory is fsynced. So fsync of a file makes its bytes durable under every
//! durable name it has, and fsync of a directory makes its names durable without touching bytes.
//!
//! Directories themselves are simpler than files, and the documentation says so: `mkdir`,
//! `rmdir` and renaming a directory are durable at once (they first make their parent's pending
//! entries durable, as a directory fsync would).

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType};

use crate::overlay::Overlay;

/// The hidden folder in the backing root that holds every known file by inode number.
pub const HOMES: &str = ".forgetfs-homes";

/// An inode number as FUSE sees it.
pub(crate) type Ino = u64;
const ROOT: Ino = 1;

/// What a power cut forgot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cut {
    /// Files whose unsynced bytes or length were dropped.
    pub files_reverted: usize,
    /// Directories whose unsynced entries (creates, renames, unlinks, links) were dropped.
    pub dirs_reverted: usize,
    /// Files that existed only under unsynced names and are gone.
    pub files_gone: usize,
}

#[derive(Debug)]
struct Dir {
    /// Where it is (directories are durable at once, so this is also where it is durably).
    parent: Ino,
    name: OsString,
    visible: BTreeMap<OsString, Ino>,
    durable: BTreeMap<OsString, Ino>,
}

#[derive(Debug)]
struct FileNode {
    /// The home, open for reading and writing.
    home: File,
    overlay: Overlay,
    /// Visible names of it.
    links: u32,
}

#[derive(Debug)]
enum Node {
    Dir(Dir),
    File(FileNode),
}

/// An open file or directory.
#[derive(Debug)]
struct Handle {
    ino: Ino,
    /// The power epoch it was opened in: a cut closes every handle (there was a reboot).
    epoch: u64,
    append: bool,
    /// A directory's entries at `opendir`, for stable `readdir` offsets.
    listing: Vec<(Ino, FileType, OsString)>,
}

/// The whole state of one mount.
#[derive(Debug)]
pub(crate) struct Volume {
    backing: PathBuf,
    homes: PathBuf,
    nodes: HashMap<Ino, Node>,
    next_ino: Ino,
    handles: HashMap<u64, Handle>,
    next_fh: u64,
    epoch: u64,
}

fn io_errno(e: io::Error) -> Errno {
    Errno::from(e)
}

impl Volume {
    /// Loads the backing folder: everything in it is durable. Clears a stale homes folder left by
    /// a file system that was not unmounted.
    pub(crate) fn load(backing: &Path) -> io::Result<Volume> {
        let homes = backing.join(HOMES);
        if homes.exists() {
            fs::remove_dir_all(&homes)?;
        }
        fs::DirBuilder::new().mode(0o700).create(&homes)?;
        let mut vol = Volume {
            backing: backing.to_path_buf(),
            homes,
            nodes: HashMap::new(),
            next_ino: ROOT + 1,
            handles: HashMap::new(),
            next_fh: 1,
            epoch: 0,
        };
        vol.nodes.insert(
            ROOT,
            Node::Dir(Dir {
                parent: ROOT,
                name: OsString::new(),
                visible: BTreeMap::new(),
                durable: BTreeMap::new(),
            }),
        );
        let mut by_backing_ino: HashMap<(u64, u64), Ino> = HashMap::new();
        vol.scan(ROOT, backing.to_path_buf(), &mut by_backing_ino)?;
        Ok(vol)
    }

    fn scan(&mut self, dir: Ino, path: PathBuf, seen: &mut HashMap<(u64, u64), Ino>) -> io::Result<()> {
        for entry in fs::read_dir(&path)? {
            let entry = entry?;
            let name = entry.file_name();
            if dir == ROOT && name == HOMES {
                continue;
            }
            let meta = fs::symlink_metadata(entry.path())?;
            let ino = if meta.is_dir() {
                let ino = self.alloc();
                self.nodes.insert(
                    ino,
                    Node::Dir(Dir {
                        parent: dir,
                        name: name.clone(),
                        visible: BTreeMap::new(),
                        durable: BTreeMap::new(),
                    }),
                );
                self.scan(ino, entry.path(), seen)?;
                ino
            } else if meta.is_file() {
                match seen.get(&(meta.dev(), meta.ino())) {
                    Some(&ino) => {
                        if let Some(Node::File(f)) = self.nodes.get_mut(&ino) {
                            f.links += 1;
                        }
                        ino
                    }
                    None => {
                        let ino = self.alloc();
                        let home = self.homes.join(ino.to_string());
                        fs::hard_link(entry.path(), &home)?;
                        let file = OpenOptions::new().read(true).write(true).open(&home)?;
                        self.nodes.insert(
                            ino,
                            Node::File(FileNode {
                                home: file,
                                overlay: Overlay::new(meta.len()),
                                links: 1,
                            }),
                        );
                        seen.insert((meta.dev(), meta.ino()), ino);
                        ino
                    }
                }
            } else {
                // Only regular files and directories are modelled; the rest is not shown.
                continue;
            };
            let d = self
                .dir_mut(dir)
                .map_err(|_| io::Error::other("scanned parent vanished"))?;
            d.visible.insert(name.clone(), ino);
            d.durable.insert(name, ino);
        }
        Ok(())
    }

    fn alloc(&mut self) -> Ino {
        let ino = self.next_ino;
        self.next_ino += 1;
        ino
    }

    fn dir(&self, ino: Ino) -> Result<&Dir, Errno> {
        match self.nodes.get(&ino) {
            Some(Node::Dir(d)) => Ok(d),
            Some(Node::File(_)) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn dir_mut(&mut self, ino: Ino) -> Result<&mut Dir, Errno> {
        match self.nodes.get_mut(&ino) {
            Some(Node::Dir(d)) => Ok(d),
            Some(Node::File(_)) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn file_mut(&mut self, ino: Ino) -> Result<&mut FileNode, Errno> {
        match self.nodes.get_mut(&ino) {
            Some(Node::File(f)) => Ok(f),
            Some(Node::Dir(_)) => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        }
    }

    /// The backing path of a directory.
    fn dir_path(&self, ino: Ino) -> Result<PathBuf, Errno> {
        let mut names = Vec::new();
        let mut at = ino;
        while at != ROOT {
            let d = self.dir(at)?;
            names.push(d.name.clone());
            at = d.parent;
        }
        let mut path = self.backing.clone();
        for name in names.iter().rev() {
            path.push(name);
        }
        Ok(path)
    }

    fn home_path(&self, ino: Ino) -> PathBuf {
        self.homes.join(ino.to_string())
    }

    fn kind(&self, ino: Ino) -> Result<FileType, Errno> {
        match self.nodes.get(&ino) {
            Some(Node::Dir(_)) => Ok(FileType::Directory),
            Some(Node::File(_)) => Ok(FileType::RegularFile),
            None => Err(Errno::ENOENT),
        }
    }

    /// The attributes the mount shows for `ino`.
    pub(crate) fn attr(&self, ino: Ino) -> Result<FileAttr, Errno> {
        let (meta, kind, size, nlink) = match self.nodes.get(&ino) {
            Some(Node::Dir(_)) => {
                let meta = fs::metadata(self.dir_path(ino)?).map_err(io_errno)?;
                (meta, FileType::Directory, 4096, 2)
            }
            Some(Node::File(f)) => {
                let meta = f.home.metadata().map_err(io_errno)?;
                (meta, FileType::RegularFile, f.overlay.size(), f.links)
            }
            None => return Err(Errno::ENOENT),
        };
        let time = |secs: i64, nsecs: i64| {
            let secs = u64::try_from(secs).unwrap_or(0);
            let nsecs = u32::try_from(nsecs).unwrap_or(0);
            UNIX_EPOCH + Duration::new(secs, nsecs)
        };
        Ok(FileAttr {
            ino: fuser::INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: time(meta.atime(), meta.atime_nsec()),
            mtime: time(meta.mtime(), meta.mtime_nsec()),
            ctime: time(meta.ctime(), meta.ctime_nsec()),
            crtime: time(meta.ctime(), meta.ctime_nsec()),
            kind,
            perm: (meta.mode() & 0o7777) as u16,
            nlink,
            uid: meta.uid(),
            gid: meta.gid(),
            rdev: 0,
            flags: 0,
            blksize: 4096,
        })
    }

    /// Looks `name` up in the visible entries of `parent`.
    pub(crate) fn lookup(&self, parent: Ino, name: &OsStr) -> Result<FileAttr, Errno> {
        let ino = *self.dir(parent)?.visible.get(name).ok_or(Errno::ENOENT)?;
        self.attr(ino)
    }

    /// Changes attributes: mode, owner and times go to the backing at once, the length to the
    /// overlay.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn setattr(
        &mut self,
        ino: Ino,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<SystemTime>,
        mtime: Option<SystemTime>,
    ) -> Result<FileAttr, Errno> {
        let path = match self.nodes.get(&ino) {
            Some(Node::Dir(_)) => self.dir_path(ino)?,
            Some(Node::File(_)) => self.home_path(ino),
            None => return Err(Errno::ENOENT),
        };
        if let Some(mode) = mode {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&path, fs::Permissions::from_mode(mode & 0o7777)).map_err(io_errno)?;
        }
        if uid.is_some() || gid.is_some() {
            std::os::unix::fs::chown(&path, uid, gid).map_err(io_errno)?;
        }
        if atime.is_some() || mtime.is_some() {
            let mut times = fs::FileTimes::new();
            if let Some(t) = atime {
                times = times.set_accessed(t);
            }
            if let Some(t) = mtime {
                times = times.set_modified(t);
            }
            File::options()
                .write(matches!(self.nodes.get(&ino), Some(Node::File(_))))
                .read(true)
                .open(&path)
                .and_then(|f| f.set_times(times))
                .map_err(io_errno)?;
        }
        if let Some(size) = size {
            self.file_mut(ino)?.overlay.set_len(size);
        }
        self.attr(ino)
    }

    fn check_new_name(&self, parent: Ino, name: &OsStr) -> Result<(), Errno> {
        if parent == ROOT && name == HOMES {
            return Err(Errno::EACCES);
        }
        if self.dir(parent)?.visible.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        Ok(())
    }

    /// Creates a regular file under a name that is durable only after its directory's fsync.
    pub(crate) fn create_file(&mut self, parent: Ino, name: &OsStr, mode: u32) -> Result<FileAttr, Errno> {
        self.check_new_name(parent, name)?;
        let ino = self.alloc();
        let home = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(mode & 0o7777)
            .open(self.home_path(ino))
            .map_err(io_errno)?;
        self.nodes.insert(
            ino,
            Node::File(FileNode {
                home,
                overlay: Overlay::new(0),
                links: 1,
            }),
        );
        self.dir_mut(parent)?.visible.insert(name.to_os_string(), ino);
        self.attr(ino)
    }

    /// Creates a directory, durably at once.
    pub(crate) fn mkdir(&mut self, parent: Ino, name: &OsStr, mode: u32) -> Result<FileAttr, Errno> {
        self.check_new_name(parent, name)?;
        self.sync_dir(parent)?;
        let path = self.dir_path(parent)?.join(name);
        fs::DirBuilder::new()
            .mode(mode & 0o7777)
            .create(&path)
            .map_err(io_errno)?;
        let ino = self.alloc();
        self.nodes.insert(
            ino,
            Node::Dir(Dir {
                parent,
                name: name.to_os_string(),
                visible: BTreeMap::new(),
                durable: BTreeMap::new(),
            }),
        );
        let d = self.dir_mut(parent)?;
        d.visible.insert(name.to_os_string(), ino);
        d.durable.insert(name.to_os_string(), ino);
        self.attr(ino)
    }

    /// Removes a file's name (durable after its directory's fsync).
    pub(crate) fn unlink(&mut self, parent: Ino, name: &OsStr) -> Result<(), Errno> {
        let ino = *self.dir(parent)?.visible.get(name).ok_or(Errno::ENOENT)?;
        self.file_mut(ino)?.links -= 1;
        self.dir_mut(parent)?.visible.remove(name);
        Ok(())
    }

    /// Removes an empty directory, durably at once.
    pub(crate) fn rmdir(&mut self, parent: Ino, name: &OsStr) -> Result<(), Errno> {
        let ino = *self.dir(parent)?.visible.get(name).ok_or(Errno::ENOENT)?;
        if !self.dir(ino)?.visible.is_empty() {
            return Err(Errno::ENOTEMPTY);
        }
        self.sync_dir(ino)?;
        fs::remove_dir(self.dir_path(ino)?).map_err(io_errno)?;
        let d = self.dir_mut(parent)?;
        d.visible.remove(name);
        d.durable.remove(name);
        self.nodes.remove(&ino);
        Ok(())
    }

    /// Adds a name for a file (durable after its directory's fsync).
    pub(crate) fn link(&mut self, ino: Ino, parent: Ino, name: &OsStr) -> Result<FileAttr, Errno> {
        self.check_new_name(parent, name)?;
        self.file_mut(ino)?.links += 1;
        self.dir_mut(parent)?.visible.insert(name.to_os_string(), ino);
        self.attr(ino)
    }

    /// Renames an entry. A file's rename changes the visible entries of both directories and is
    /// durable in each after its fsync; a directory's rename is durable at once.
    pub(crate) fn rename(
        &mut self,
        parent: Ino,
        name: &OsStr,
        new_parent: Ino,
        new_name: &OsStr,
        no_replace: bool,
    ) -> Result<(), Errno> {
        let ino = *self.dir(parent)?.visible.get(name).ok_or(Errno::ENOENT)?;
        if new_parent == ROOT && new_name == HOMES {
            return Err(Errno::EACCES);
        }
        let target = self.dir(new_parent)?.visible.get(new_name).copied();
        if target == Some(ino) {
            return Ok(());
        }
        if target.is_some() && no_replace {
            return Err(Errno::EEXIST);
        }
        match self.kind(ino)? {
            FileType::Directory => self.rename_dir(ino, parent, name, new_parent, new_name, target),
            _ => {
                if let Some(old) = target {
                    match self.nodes.get_mut(&old) {
                        Some(Node::File(f)) => f.links -= 1,
                        Some(Node::Dir(_)) => return Err(Errno::EISDIR),
                        None => return Err(Errno::ENOENT),
                    }
                }
                self.dir_mut(parent)?.visible.remove(name);
                self.dir_mut(new_parent)?.visible.insert(new_name.to_os_string(), ino);
                Ok(())
            }
        }
    }

    fn rename_dir(
        &mut self,
        ino: Ino,
        parent: Ino,
        name: &OsStr,
        new_parent: Ino,
        new_name: &OsStr,
        target: Option<Ino>,
    ) -> Result<(), Errno> {
        // A directory may not move into itself.
        let mut at = new_parent;
        while at != ROOT {
            if at == ino {
                return Err(Errno::EINVAL);
            }
            at = self.dir(at)?.parent;
        }
        if let Some(old) = target {
            if !self.dir(old)?.visible.is_empty() {
                return Err(Errno::ENOTEMPTY);
            }
            self.sync_dir(old)?;
        }
        self.sync_dir(parent)?;
        self.sync_dir(new_parent)?;
        let from = self.dir_path(ino)?;
        let to = self.dir_path(new_parent)?.join(new_name);
        fs::rename(&from, &to).map_err(io_errno)?;
        if let Some(old) = target {
            self.nodes.remove(&old);
        }
        let p = self.dir_mut(parent)?;
        p.visible.remove(name);
        p.durable.remove(name);
        let np = self.dir_mut(new_parent)?;
        np.visible.insert(new_name.to_os_string(), ino);
        np.durable.insert(new_name.to_os_string(), ino);
        let d = self.dir_mut(ino)?;
        d.parent = new_parent;
        d.name = new_name.to_os_string();
        Ok(())
    }

    /// Opens a file or directory; the handle dies at the next cut.
    pub(crate) fn open(&mut self, ino: Ino, append: bool) -> Result<u64, Errno> {
        let listing = match self.nodes.get(&ino) {
            Some(Node::Dir(d)) => {
                let mut listing = vec![
                    (ino, FileType::Directory, OsString::from(".")),
                    (d.parent, FileType::Directory, OsString::from("..")),
                ];
                for (name, &child) in &d.visible {
                    listing.push((child, self.kind(child)?, name.clone()));
                }
                listing
            }
            Some(Node::File(_)) => Vec::new(),
            None => return Err(Errno::ENOENT),
        };
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(
            fh,
            Handle {
                ino,
                epoch: self.epoch,
                append,
                listing,
            },
        );
        Ok(fh)
    }

    /// Closes a handle.
    pub(crate) fn release(&mut self, fh: u64) {
        self.handles.remove(&fh);
    }

    /// The handle `fh` of `ino`, if it was opened since the last cut.
    fn handle(&self, ino: Ino, fh: u64) -> Result<&Handle, Errno> {
        match self.handles.get(&fh) {
            Some(h) if h.ino == ino && h.epoch == self.epoch => Ok(h),
            // A handle from before a cut: its process was there when the power went.
            _ => Err(Errno::EIO),
        }
    }

    /// A directory's listing from `offset` on.
    pub(crate) fn listing(&self, ino: Ino, fh: u64) -> Result<&[(Ino, FileType, OsString)], Errno> {
        Ok(&self.handle(ino, fh)?.listing)
    }

    /// Reads what the mount shows (dirty bytes included, as a page cache would).
    pub(crate) fn read(&mut self, ino: Ino, fh: u64, offset: u64, len: u32) -> Result<Vec<u8>, Errno> {
        self.handle(ino, fh)?;
        let f = self.file_mut(ino)?;
        f.overlay.read(&f.home, offset, u64::from(len)).map_err(io_errno)
    }

    /// Writes into memory; nothing reaches the backing file before an fsync.
    pub(crate) fn write(&mut self, ino: Ino, fh: u64, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let append = self.handle(ino, fh)?.append;
        let f = self.file_mut(ino)?;
        let offset = if append { f.overlay.size() } else { offset };
        f.overlay.write(&f.home, offset, data).map_err(io_errno)?;
        u32::try_from(data.len()).map_err(|_| Errno::EINVAL)
    }

    /// fsync / fdatasync of a file: its bytes and length become durable (not its names).
    pub(crate) fn fsync(&mut self, ino: Ino, fh: u64, data_only: bool) -> Result<(), Errno> {
        self.handle(ino, fh)?;
        let f = self.file_mut(ino)?;
        f.overlay.sync(&f.home, data_only).map_err(io_errno)
    }

    /// fsync of a directory: its entries become durable (not the bytes of its files).
    pub(crate) fn fsyncdir(&mut self, ino: Ino, fh: u64) -> Result<(), Errno> {
        self.handle(ino, fh)?;
        self.sync_dir(ino)
    }

    /// Makes the visible entries of `ino` its durable ones in the backing folder.
    fn sync_dir(&mut self, ino: Ino) -> Result<(), Errno> {
        let path = self.dir_path(ino)?;
        let d = self.dir(ino)?;
        if d.visible == d.durable {
            return Ok(());
        }
        let gone: Vec<OsString> = d
            .durable
            .iter()
            .filter(|(name, child)| d.visible.get(*name) != Some(*child))
            .map(|(name, _)| name.clone())
            .collect();
        let added: Vec<(OsString, Ino)> = d
            .visible
            .iter()
            .filter(|(name, child)| d.durable.get(*name) != Some(*child))
            .map(|(name, &child)| (name.clone(), child))
            .collect();
        // Directories are durable at once, so only files differ here.
        for name in &gone {
            fs::remove_file(path.join(name)).map_err(io_errno)?;
        }
        for (name, child) in &added {
            fs::hard_link(self.home_path(*child), path.join(name)).map_err(io_errno)?;
        }
        let d = self.dir_mut(ino)?;
        d.durable = d.visible.clone();
        Ok(())
    }

    /// The power cut: every file is its durable copy again, every directory shows its durable
    /// entries, files that had no durable name are gone, and every open handle is dead.
    pub(crate) fn cut(&mut self) -> Result<Cut, Errno> {
        let mut cut = Cut::default();
        self.epoch += 1;
        self.handles.clear();
        let mut links: HashMap<Ino, u32> = HashMap::new();
        for node in self.nodes.values_mut() {
            if let Node::Dir(d) = node {
                if d.visible != d.durable {
                    d.visible = d.durable.clone();
                    cut.dirs_reverted += 1;
                }
                for &child in d.durable.values() {
                    *links.entry(child).or_default() += 1;
                }
            }
        }
        let mut gone = Vec::new();
        for (&ino, node) in self.nodes.iter_mut() {
            if let Node::File(f) = node {
                match links.get(&ino) {
                    Some(&n) => {
                        if f.overlay.is_dirty() {
                            f.overlay.forget();
                            cut.files_reverted += 1;
                        }
                        f.links = n;
                    }
                    None => gone.push(ino),
                }
            }
        }
        for ino in gone {
            self.nodes.remove(&ino);
            fs::remove_file(self.home_path(ino)).map_err(io_errno)?;
            cut.files_gone += 1;
        }
        Ok(cut)
    }

    /// Removes the homes folder: the backing folder is left with its durable tree only.
    pub(crate) fn close(&mut self) -> io::Result<()> {
        self.nodes.clear();
        self.handles.clear();
        fs::remove_dir_all(&self.homes)
    }

    /// The backing folder.
    pub(crate) fn backing(&self) -> &Path {
        &self.backing
    }
}
