//! The record of the process groups of `command` children that are running, kept in the data
//! folder so that the next start can kill what a killed server left behind.
//!
//! A command child's group leader dies with the server (`PR_SET_PDEATHSIG`), but what the
//! leader started in its group does not, and a server killed with SIGKILL drops no runner.
//! [`CommandGroups`] writes each group to `<data_dir>/command-groups` when it starts and takes
//! it out when it ends (the file is replaced whole and fsynced each time), and
//! [`CommandGroups::open`], called at start before anything is re-run, sends SIGKILL to every
//! group the file names that is still the one recorded, then empties the file.
//!
//! A group is named by its id (the leader's pid), the leader's start time (field 22 of
//! `/proc/<pid>/stat`, in clock ticks since boot), the boot id
//! (`/proc/sys/kernel/random/boot_id`) and the pid namespace, so a pid used again by another
//! program is told apart: a group of another boot or namespace is never touched, and a leader
//! still alive must have the recorded start time. A group whose leader is gone lives on only
//! while a member does, and the kernel hands out no pid that is the id of a living group, so
//! such a group is the recorded one unless every member died and the number came round again
//! in between; it is killed when each member started no earlier than the recorded leader.
//!
//! One process keeps a record at a time: `open` takes an exclusive lock (`<record>.lock`) held
//! as long as the record lives, and refuses a record another process holds. Servers sharing a
//! PostgreSQL ledger may share a folder, each with a record of its own
//! ([`CommandGroups::open_named`]). Within the process, writers take turns under a mutex.
//!
//! What this does not cover: a program that leaves its group (`setsid`, a daemon), and the
//! moment between a leader's start and its group being written down (the leader itself dies
//! with the server then, but what it started in that moment does not).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The record's file name in the data folder (its lock's is the same with `.lock`).
pub const FILE: &str = "command-groups";
/// The first line of the record: its format and version.
const HEADER: &str = "brood command-groups 1";

/// A recorded group: its id and its leader's start time, in the boot `boot` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    boot: String,
    pgid: libc::pid_t,
    start: u64,
}

/// Why the record could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum GroupsError {
    /// Another process holds the data folder.
    #[error(
        "the record of command groups {0} is locked by another brood process; one process keeps a record at a time"
    )]
    InUse(PathBuf),
    /// A file of the record could not be read or written.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the file.
        context: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

fn io(context: String) -> impl FnOnce(std::io::Error) -> GroupsError {
    move |source| GroupsError::Io { context, source }
}

/// The record of running command groups of one data folder (see the module docs).
#[derive(Debug)]
pub struct CommandGroups {
    dir: PathBuf,
    /// The record's file name in `dir`.
    name: String,
    boot: String,
    /// The groups running now, as the file lists them.
    running: Mutex<Vec<Entry>>,
    /// Held for the record's life: no other process uses this folder meanwhile.
    _lock: File,
}

/// What [`CommandGroups::open`] found left by an earlier process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Swept {
    /// Groups sent SIGKILL (their ids).
    pub killed: Vec<i32>,
    /// Groups recorded but gone, or whose number now names another process.
    pub gone: usize,
}

impl CommandGroups {
    /// Locks the record of `data_dir` (creating the folder if need be), kills every group an
    /// earlier process left running in it, and empties it. Call it before the engine opens, so
    /// nothing it re-runs starts beside what was left.
    pub fn open(data_dir: &Path) -> Result<(CommandGroups, Swept), GroupsError> {
        CommandGroups::open_named(data_dir, FILE)
    }

    /// As [`CommandGroups::open`], with the record in file `name` of `data_dir` (and its lock
    /// in `<name>.lock`): processes that share a folder but not a ledger in it (several servers
    /// on one PostgreSQL database, started in one folder) each keep a record of their own.
    pub fn open_named(data_dir: &Path, name: &str) -> Result<(CommandGroups, Swept), GroupsError> {
        std::fs::create_dir_all(data_dir).map_err(io(format!("creating the data folder {}", data_dir.display())))?;
        let lock_path = data_dir.join(format!("{name}.lock"));
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io(format!("opening {}", lock_path.display())))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(GroupsError::InUse(lock_path)),
            Err(TryLockError::Error(e)) => return Err(io(format!("locking {}", lock_path.display()))(e)),
        }
        let boot = boot_id().map_err(io(
            "reading the boot id (/proc/sys/kernel/random/boot_id) and pid namespace (/proc/self/ns/pid)".into(),
        ))?;
        let path = data_dir.join(name);
        let left = match std::fs::read_to_string(&path) {
            Ok(text) => parse(&text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io(format!("reading {}", path.display()))(e)),
        };
        let mut swept = Swept::default();
        for entry in &left {
            if still_running(entry, &boot) {
                // SAFETY: killpg only sends a signal, to a group this data folder's server
                // started and that is still the one recorded.
                unsafe {
                    libc::killpg(entry.pgid, libc::SIGKILL);
                }
                swept.killed.push(entry.pgid);
            } else {
                swept.gone += 1;
            }
        }
        let groups = CommandGroups {
            dir: data_dir.to_path_buf(),
            name: name.to_string(),
            boot,
            running: Mutex::new(Vec::new()),
            _lock: lock,
        };
        if !left.is_empty() || path.exists() {
            groups.write(&[])?;
        }
        Ok((groups, swept))
    }

    /// Records the group whose leader is `pgid`, just started; `None` when its start time
    /// cannot be read (the leader is then not recorded) or the record cannot be written.
    pub(crate) fn started(&self, pgid: libc::pid_t) -> Option<Entry> {
        let Some(stat) = Stat::of(pgid) else {
            tracing::warn!(
                pgid,
                "the start time of a command's group leader cannot be read; its group is not recorded"
            );
            return None;
        };
        let entry = Entry {
            boot: self.boot.clone(),
            pgid,
            start: stat.start,
        };
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running.push(entry.clone());
        if let Err(e) = self.write(&running) {
            tracing::warn!(
                pgid,
                "a command's group could not be recorded ({e}); a kill -9 of the server would leave it to run"
            );
        }
        Some(entry)
    }

    /// Takes a group that ended (was killed) out of the record.
    pub(crate) fn ended(&self, entry: &Entry) {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let Some(at) = running.iter().position(|e| e == entry) else {
            return;
        };
        running.swap_remove(at);
        if let Err(e) = self.write(&running) {
            tracing::warn!(
                pgid = entry.pgid,
                "a command's group that ended could not be taken out of the record: {e}"
            );
        }
    }

    /// Replaces the file with `entries`: a new file written and fsynced, renamed over the old,
    /// and the folder fsynced, so a crash leaves either list whole.
    fn write(&self, entries: &[Entry]) -> Result<(), GroupsError> {
        let path = self.dir.join(&self.name);
        let temp = self.dir.join(format!("{}.new", self.name));
        let mut text = format!("{HEADER}\n");
        for e in entries {
            text.push_str(&format!("{} {} {}\n", e.boot, e.pgid, e.start));
        }
        let mut file = File::create(&temp).map_err(io(format!("creating {}", temp.display())))?;
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(io(format!("writing {}", temp.display())))?;
        std::fs::rename(&temp, &path).map_err(io(format!("replacing {}", path.display())))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io(format!("syncing the folder {}", self.dir.display())))
    }
}

/// The entries of a record; a line that cannot be read is skipped, with a warning.
fn parse(text: &str) -> Vec<Entry> {
    let mut lines = text.lines();
    if lines.next() != Some(HEADER) {
        if !text.is_empty() {
            tracing::warn!("the command-groups record has no `{HEADER}` header; its lines are not read");
        }
        return Vec::new();
    }
    let mut out = Vec::new();
    for line in lines {
        let mut fields = line.split(' ');
        let entry = match (fields.next(), fields.next(), fields.next(), fields.next()) {
            (Some(boot), Some(pgid), Some(start), None) => match (pgid.parse(), start.parse()) {
                (Ok(pgid), Ok(start)) if pgid > 1 && !boot.is_empty() => Some(Entry {
                    boot: boot.to_string(),
                    pgid,
                    start,
                }),
                _ => None,
            },
            _ => None,
        };
        match entry {
            Some(e) => out.push(e),
            None => tracing::warn!(line, "a line of the command-groups record cannot be read; skipped"),
        }
    }
    out
}

/// Whether the group `entry` names is still the one recorded (see the module docs).
fn still_running(entry: &Entry, boot: &str) -> bool {
    if entry.boot != boot {
        return false;
    }
    match Stat::of(entry.pgid) {
        Some(leader) => leader.start == entry.start && leader.pgrp == entry.pgid,
        None => {
            let members = members(entry.pgid);
            !members.is_empty() && members.iter().all(|m| m.start >= entry.start)
        }
    }
}

/// The processes whose group is `pgid`.
fn members(pgid: libc::pid_t) -> Vec<Stat> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter_map(Stat::of)
        .filter(|s| s.pgrp == pgid)
        .collect()
}

/// The boot and the pid namespace this process runs in (`<boot id>/pid:[<inode>]`): a pid
/// means the same process only within both, so a folder reused by a container started anew (the
/// host's boot, another namespace) is never taken to name groups of its own.
fn boot_id() -> std::io::Result<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
    let namespace = std::fs::read_link("/proc/self/ns/pid")?;
    Ok(format!("{}/{}", id.trim(), namespace.display()))
}

/// What brood reads of `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy)]
struct Stat {
    /// Field 5: the process group.
    pgrp: libc::pid_t,
    /// Field 22: the start time, in clock ticks since boot.
    start: u64,
}

impl Stat {
    fn of(pid: libc::pid_t) -> Option<Stat> {
        Self::parse(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
    }

    /// Fields after the command name (which is in parentheses and may hold anything) count
    /// from 3, the state.
    fn parse(stat: &str) -> Option<Stat> {
        let rest = &stat[stat.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        Some(Stat {
            pgrp: fields.get(5 - 3)?.parse().ok()?,
            start: fields.get(22 - 3)?.parse().ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_is_read_past_a_command_name_holding_parentheses() {
        let line =
            "4242 (a) b) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 18446744073709551615";
        let s = Stat::parse(line).unwrap();
        assert_eq!((s.pgrp, s.start), (4242, 987654));
        assert!(Stat::parse("1 (x) S 0").is_none());
    }

    #[test]
    fn the_record_reads_back_what_is_written_and_skips_bad_lines() {
        let text = format!("{HEADER}\nb1 100 5\nnonsense\nb1 1 5\nb2 200 7\n");
        let got = parse(&text);
        let want = [("b1", 100, 5), ("b2", 200, 7)]
            .map(|(b, p, s)| Entry {
                boot: b.into(),
                pgid: p,
                start: s,
            })
            .to_vec();
        assert_eq!(got, want, "pgid 1 and a line that is not three fields are skipped");
        assert!(parse("b1 100 5\n").is_empty(), "no header, nothing read");
    }

    #[test]
    fn a_group_of_another_boot_or_another_start_is_not_ours() {
        let me = std::process::id() as libc::pid_t;
        let boot = boot_id().unwrap();
        let start = Stat::of(me).unwrap().start;
        let mine = |boot: &str, start| Entry {
            boot: boot.into(),
            pgid: me,
            start,
        };
        // The test process leads no group of its own unless it happens to; compare with its
        // own group's answer rather than assume.
        let leads = Stat::of(me).unwrap().pgrp == me;
        assert_eq!(still_running(&mine(&boot, start), &boot), leads);
        assert!(!still_running(&mine("another-boot", start), &boot));
        assert!(!still_running(&mine(&boot, start + 1), &boot));
    }

    #[test]
    fn a_second_process_cannot_hold_the_same_data_folder() {
        let dir = tempfile::tempdir().unwrap();
        let (first, swept) = CommandGroups::open(dir.path()).unwrap();
        assert_eq!(swept, Swept::default());
        // File locks are per open file description: a second open is refused as another
        // process would be.
        let e = CommandGroups::open(dir.path()).unwrap_err();
        assert!(matches!(e, GroupsError::InUse(_)), "{e}");
        drop(first);
        assert!(CommandGroups::open(dir.path()).is_ok(), "free again once dropped");
    }

    #[test]
    fn records_of_other_names_share_a_folder() {
        let dir = tempfile::tempdir().unwrap();
        let (a, _) = CommandGroups::open_named(dir.path(), "command-groups-127.0.0.1-7070").unwrap();
        let (b, _) = CommandGroups::open_named(dir.path(), "command-groups-127.0.0.1-7071").unwrap();
        assert!(CommandGroups::open_named(dir.path(), "command-groups-127.0.0.1-7070").is_err());
        let me = std::process::id() as libc::pid_t;
        assert!(a.started(me).is_some());
        let text = std::fs::read_to_string(dir.path().join("command-groups-127.0.0.1-7070")).unwrap();
        assert_eq!(parse(&text).len(), 1, "{text}");
        assert!(
            !dir.path().join("command-groups-127.0.0.1-7071").exists(),
            "b wrote nothing"
        );
        drop(b);
    }

    #[test]
    fn a_record_of_another_pid_namespace_names_no_group_here() {
        let boot = boot_id().unwrap();
        let (id, namespace) = boot.split_once('/').unwrap();
        assert!(namespace.starts_with("pid:["), "{boot}");
        let me = std::process::id() as libc::pid_t;
        let stat = Stat::of(me).unwrap();
        let there = Entry {
            boot: format!("{id}/pid:[1]"),
            pgid: stat.pgrp,
            start: 0,
        };
        assert!(!still_running(&there, &boot), "the same boot, another namespace");
    }
}
