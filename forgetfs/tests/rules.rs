//! Each rule of forgetfs, on a real mount in a temporary folder: what a power cut forgets and
//! what it keeps. These tests fail (they do not skip) where FUSE cannot be mounted, with the
//! reason: a missing `/dev/fuse`, or a refused mount.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use forgetfs::Mount;
use tempfile::TempDir;

struct Fixture {
    backing: TempDir,
    _mountpoint: TempDir,
    mount: Mount,
}

fn mount() -> Fixture {
    let backing = tempfile::tempdir().expect("backing temp dir");
    let mountpoint = tempfile::tempdir().expect("mountpoint temp dir");
    let mount = Mount::new(backing.path(), mountpoint.path()).unwrap_or_else(|e| panic!("forgetfs: {e}"));
    Fixture {
        backing,
        _mountpoint: mountpoint,
        mount,
    }
}

impl Fixture {
    fn path(&self, name: &str) -> std::path::PathBuf {
        self.mount.path().join(name)
    }

    /// A file with `bytes` whose bytes and name are both durable.
    fn durable_file(&self, name: &str, bytes: &[u8]) {
        let mut f = File::create(self.path(name)).expect("create");
        f.write_all(bytes).expect("write");
        f.sync_all().expect("fsync");
        fsync_dir(self.mount.path());
    }

    fn cut(&self) {
        self.mount.cut().unwrap_or_else(|e| panic!("cut: {e}"));
    }
}

fn fsync_dir(dir: &Path) {
    File::open(dir).expect("open dir").sync_all().expect("fsync dir");
}

fn read(path: &Path) -> Vec<u8> {
    fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

#[test]
fn a_write_without_fsync_is_gone_after_a_cut() {
    let fx = mount();
    fx.durable_file("f", b"synced");
    let f = OpenOptions::new().write(true).open(fx.path("f")).expect("open");
    f.write_all_at(b"-and more, never synced", 6).expect("write");
    drop(f);
    fx.cut();
    assert_eq!(read(&fx.path("f")), b"synced");
}

#[test]
fn a_write_is_visible_before_the_cut() {
    let fx = mount();
    fx.durable_file("f", b"synced");
    fs::write(fx.path("f"), b"rewritten").expect("write");
    assert_eq!(read(&fx.path("f")), b"rewritten");
    assert_eq!(fs::metadata(fx.path("f")).expect("stat").len(), 9);
}

#[test]
fn a_write_with_fsync_survives_a_cut() {
    let fx = mount();
    fx.durable_file("f", b"synced");
    let f = OpenOptions::new().write(true).open(fx.path("f")).expect("open");
    f.write_all_at(b"+fsynced", 6).expect("write");
    f.sync_all().expect("fsync");
    drop(f);
    fx.cut();
    assert_eq!(read(&fx.path("f")), b"synced+fsynced");
}

#[test]
fn a_write_with_fdatasync_survives_a_cut() {
    let fx = mount();
    fx.durable_file("f", b"synced");
    let f = OpenOptions::new().write(true).open(fx.path("f")).expect("open");
    f.write_all_at(b"+fdatasynced", 6).expect("write");
    f.sync_data().expect("fdatasync");
    drop(f);
    fx.cut();
    assert_eq!(read(&fx.path("f")), b"synced+fdatasynced");
}

#[test]
fn only_the_synced_part_of_a_file_survives() {
    let fx = mount();
    fx.durable_file("f", b"");
    let mut f = OpenOptions::new().write(true).open(fx.path("f")).expect("open");
    f.write_all(b"first;").expect("write");
    f.sync_data().expect("fdatasync");
    f.write_all(b"second;").expect("write");
    drop(f);
    fx.cut();
    assert_eq!(read(&fx.path("f")), b"first;");
}

#[test]
fn a_truncation_without_fsync_is_undone_by_a_cut() {
    let fx = mount();
    fx.durable_file("f", b"0123456789");
    OpenOptions::new()
        .write(true)
        .open(fx.path("f"))
        .expect("open")
        .set_len(3)
        .expect("truncate");
    assert_eq!(read(&fx.path("f")), b"012");
    fx.cut();
    assert_eq!(read(&fx.path("f")), b"0123456789");
}

#[test]
fn a_file_created_without_a_directory_fsync_is_gone_after_a_cut() {
    let fx = mount();
    let mut f = File::create(fx.path("new")).expect("create");
    f.write_all(b"bytes fsynced, name not").expect("write");
    f.sync_all().expect("fsync the file, not its directory");
    drop(f);
    fx.cut();
    assert_eq!(
        fs::metadata(fx.path("new")).map_err(|e| e.kind()).err(),
        Some(ErrorKind::NotFound),
        "a name that was never made durable survived the cut"
    );
}

#[test]
fn a_file_created_with_a_directory_fsync_survives_a_cut() {
    let fx = mount();
    let mut f = File::create(fx.path("new")).expect("create");
    f.write_all(b"both durable").expect("write");
    f.sync_all().expect("fsync");
    drop(f);
    fsync_dir(fx.mount.path());
    fx.cut();
    assert_eq!(read(&fx.path("new")), b"both durable");
}

#[test]
fn a_directory_fsync_alone_keeps_the_name_but_not_the_bytes() {
    let fx = mount();
    fs::write(fx.path("new"), b"never fsynced").expect("write");
    fsync_dir(fx.mount.path());
    fx.cut();
    assert_eq!(read(&fx.path("new")), b"");
}

#[test]
fn a_rename_without_a_directory_fsync_is_undone_by_a_cut() {
    let fx = mount();
    fx.durable_file("old", b"x");
    fs::rename(fx.path("old"), fx.path("renamed")).expect("rename");
    fx.cut();
    assert_eq!(read(&fx.path("old")), b"x");
    assert!(!fx.path("renamed").exists(), "an unsynced rename survived the cut");
}

#[test]
fn a_rename_with_a_directory_fsync_survives_a_cut() {
    let fx = mount();
    fx.durable_file("old", b"x");
    fs::rename(fx.path("old"), fx.path("renamed")).expect("rename");
    fsync_dir(fx.mount.path());
    fx.cut();
    assert!(!fx.path("old").exists());
    assert_eq!(read(&fx.path("renamed")), b"x");
}

#[test]
fn an_unlink_without_a_directory_fsync_is_undone_by_a_cut() {
    let fx = mount();
    fx.durable_file("f", b"still here");
    fs::remove_file(fx.path("f")).expect("unlink");
    assert!(!fx.path("f").exists());
    fx.cut();
    assert_eq!(read(&fx.path("f")), b"still here");
}

#[test]
fn a_file_in_a_new_directory_follows_the_same_rules() {
    let fx = mount();
    fs::create_dir(fx.path("d")).expect("mkdir");
    fs::write(fx.path("d/kept"), b"k").expect("write");
    File::open(fx.path("d/kept")).expect("open").sync_all().expect("fsync");
    fsync_dir(&fx.path("d"));
    fs::write(fx.path("d/lost"), b"l").expect("write");
    fx.cut();
    assert_eq!(read(&fx.path("d/kept")), b"k");
    assert!(!fx.path("d/lost").exists());
}

#[test]
fn a_handle_opened_before_a_cut_is_dead_after_it() {
    let fx = mount();
    fx.durable_file("f", b"abc");
    let mut f = File::open(fx.path("f")).expect("open");
    fx.cut();
    let mut buf = Vec::new();
    let err = f.read_to_end(&mut buf).expect_err("a pre-cut handle still read");
    assert_eq!(err.raw_os_error(), Some(5), "expected EIO, got {err}");
}

#[test]
fn the_backing_folder_holds_only_durable_state_after_unmount() {
    let fx = mount();
    fx.durable_file("durable", b"d");
    fs::write(fx.path("volatile"), b"v").expect("write");
    fs::write(fx.path("durable"), b"changed").expect("write");
    let Fixture {
        backing,
        _mountpoint,
        mount,
    } = fx;
    mount.cut().unwrap_or_else(|e| panic!("cut: {e}"));
    mount.unmount().unwrap_or_else(|e| panic!("unmount: {e}"));
    let mut names: Vec<_> = fs::read_dir(backing.path())
        .expect("list backing")
        .map(|e| e.expect("entry").file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["durable"]);
    assert_eq!(read(&backing.path().join("durable")), b"d");
}

#[test]
fn what_the_backing_folder_holds_is_durable_at_mount() {
    let backing = tempfile::tempdir().expect("backing");
    fs::create_dir(backing.path().join("sub")).expect("mkdir");
    fs::write(backing.path().join("sub/f"), b"was there").expect("seed");
    let mountpoint = tempfile::tempdir().expect("mountpoint");
    let mount = Mount::new(backing.path(), mountpoint.path()).unwrap_or_else(|e| panic!("forgetfs: {e}"));
    fs::write(mount.path().join("sub/f"), b"overwritten").expect("write");
    mount.cut().unwrap_or_else(|e| panic!("cut: {e}"));
    assert_eq!(read(&mount.path().join("sub/f")), b"was there");
    mount.unmount().unwrap_or_else(|e| panic!("unmount: {e}"));
}
