//! Bringing a ledger of an older key layout to this build's ([`super::LAYOUT`]).
//!
//! Layout 1 keyed every row by its bare id and stored unit rows. Layout 2 keys the rows of the
//! session-scoped trees by [`super::row_key`] and stores no units (they are planned again from
//! their call). The migration is idempotent, so a crash in the middle of it only means it runs
//! again at the next open: a key with a NUL in it is already migrated (no id of layout 1 holds
//! a control character), one without is moved, in batches each applied atomically (the new key
//! and the removal of the old one together). The caller records the new layout, durably, only
//! once every tree is done.
//!
//! Layout 3 adds start rows (a tree of their own, empty in an older ledger), so layout 2 is
//! brought to it by its number alone. Layout 4 writes session rows of version 2 (the codec
//! reads version 1 too), so layout 3 is brought to it by its number alone as well; layout 5
//! writes call rows of version 2 (with a trace context; version 1 is read too), and layout 4
//! is brought to it the same way.

use super::trees::*;
use super::{row_key, LedgerError};
use crate::codec;
use crate::model::*;

/// Rows moved per atomic batch.
const BATCH: usize = 10_000;

/// Re-keys the session-scoped trees of a layout-1 ledger and drops its unit rows.
pub(super) fn session_keys(db: &sled::Db) -> Result<(), LedgerError> {
    let mut moved = 0usize;
    for name in [CALLS, CHILDREN, CLAIMS, ACKS, DEAD_LETTERS] {
        let tree = db.open_tree(name)?;
        let mut batch = sled::Batch::default();
        let mut n = 0;
        // One pass: sled's iterators tolerate writes behind them, and a key this pass wrote
        // (it holds a NUL) is skipped if the pass meets it.
        for kv in tree.iter() {
            let (k, v) = kv?;
            if k.contains(&0) {
                continue;
            }
            // A row that does not decode stays where it is: the next load quarantines it with
            // its raw bytes, under whatever key it has.
            let Some(session) = session_of(name, &v) else {
                continue;
            };
            let id = String::from_utf8_lossy(&k).into_owned();
            batch.insert(row_key(&session, &id), v);
            batch.remove(k);
            n += 1;
            if n == BATCH {
                tree.apply_batch(std::mem::take(&mut batch))?;
                moved += n;
                n = 0;
            }
        }
        tree.apply_batch(batch)?;
        moved += n;
    }
    db.drop_tree(UNITS)?;
    tracing::info!(rows = moved, "ledger migrated to session-scoped keys (layout 2)");
    Ok(())
}

/// The session a stored row of `tree` belongs to, if it decodes.
fn session_of(tree: &str, value: &[u8]) -> Option<String> {
    match tree {
        CALLS => codec::decode::<CallRow>(value).ok().map(|r| r.session_id),
        CHILDREN => codec::decode::<ChildRow>(value).ok().map(|r| r.session_id),
        CLAIMS => codec::decode::<ClaimRow>(value).ok().map(|r| r.session_id),
        ACKS => codec::decode::<AckRow>(value).ok().map(|r| r.session_id),
        DEAD_LETTERS => codec::decode::<DeadLetterRow>(value).ok().map(|r| r.session_id),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Ledger, SledLedger};
    use super::*;

    /// Opens the folder with raw sled, waiting out the lock an earlier handle's background
    /// thread releases moments after it was dropped.
    fn raw(dir: &std::path::Path) -> sled::Db {
        let start = std::time::Instant::now();
        loop {
            match sled::open(dir) {
                Ok(db) => return db,
                Err(e) if start.elapsed() < super::super::LOCK_WAIT => {
                    let _ = e;
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) => panic!("opening {}: {e}", dir.display()),
            }
        }
    }

    fn child(session: &str, call: &str, i: u32) -> ChildRow {
        ChildRow {
            child_id: child_id(call, i),
            call_id: call.into(),
            unit_id: format!("{call}-{}", i + 1),
            session_id: session.into(),
            task_index: i,
            status: ChildStatus::Succeeded,
            summary: Some("done".into()),
            error: None,
            started_at_ms: Some(1),
            finished_at_ms: Some(2),
            attempt: 1,
            recovered: false,
            result: DeliveryRow::default(),
            notice: DeliveryRow::default(),
            output: None,
        }
    }

    /// A ledger as layout 1 wrote it: bare-id keys, unit rows, no layout in `meta`.
    fn layout_1(dir: &std::path::Path, children: usize) {
        let db = raw(dir);
        db.open_tree(META)
            .unwrap()
            .insert("format", codec::encode(&codec::FORMAT_VERSION).unwrap())
            .unwrap();
        let kids = db.open_tree(CHILDREN).unwrap();
        for i in 0..children {
            let (session, call) = if i % 2 == 0 { ("a", "deleg_a") } else { ("b", "deleg_b") };
            let row = child(session, call, i as u32);
            kids.insert(row.child_id.as_bytes(), codec::encode(&row).unwrap())
                .unwrap();
        }
        let acks = db.open_tree(ACKS).unwrap();
        let ack = AckRow {
            claim_id: "claim_a1".into(),
            session_id: "a".into(),
            items: vec![dedup_key(&child_id("deleg_a", 0), ItemKind::Result)],
            acked_at_ms: 3,
        };
        acks.insert("claim_a1", codec::encode(&ack).unwrap()).unwrap();
        kids.insert("garbage", vec![codec::FORMAT_VERSION, 250, 1]).unwrap();
        db.open_tree(UNITS).unwrap().insert("deleg_a-1", vec![1u8, 2]).unwrap();
        db.flush().unwrap();
    }

    #[test]
    fn a_layout_1_ledger_is_rekeyed_by_session_and_reads_back_whole() {
        let dir = tempfile::TempDir::new().unwrap();
        // More rows than one batch, so the migration loops.
        layout_1(dir.path(), BATCH + 17);
        let ledger = SledLedger::open(dir.path()).unwrap();
        let a = ledger.load_session("a").unwrap();
        let b = ledger.load_session("b").unwrap();
        assert_eq!(a.children.len() + b.children.len(), BATCH + 17);
        assert!(a.children.iter().all(|c| c.session_id == "a"));
        assert!(b.children.iter().all(|c| c.session_id == "b"));
        let first = a.children.iter().find(|c| c.task_index == 0).unwrap();
        assert!(first.result.delivered, "the ack row still folds into its child");
        assert_eq!(ledger.ack("a", "claim_a1").unwrap().map(|r| r.items.len()), Some(1));
        drop(ledger);
        let db = raw(dir.path());
        assert!(
            !db.tree_names().iter().any(|n| &n[..] == UNITS.as_bytes()),
            "unit rows dropped"
        );
        let kids = db.open_tree(CHILDREN).unwrap();
        let bare: Vec<_> = kids
            .iter()
            .keys()
            .map(|k| k.unwrap())
            .filter(|k| !k.contains(&0))
            .collect();
        assert_eq!(
            bare,
            vec![sled::IVec::from("garbage")],
            "only the row that does not decode keeps its key"
        );
    }

    #[test]
    fn a_migration_cut_short_runs_again_at_the_next_open() {
        let dir = tempfile::TempDir::new().unwrap();
        layout_1(dir.path(), 40);
        {
            // Half of it done, then "a crash": no layout recorded.
            let db = raw(dir.path());
            let kids = db.open_tree(CHILDREN).unwrap();
            for k in kids.iter().keys().take(20) {
                let k = k.unwrap();
                if let Some(s) = session_of(CHILDREN, &kids.get(&k).unwrap().unwrap()) {
                    let v = kids.remove(&k).unwrap().unwrap();
                    kids.insert(row_key(&s, &String::from_utf8_lossy(&k)), v).unwrap();
                }
            }
            db.flush().unwrap();
        }
        let ledger = SledLedger::open(dir.path()).unwrap();
        let all = ledger.load().unwrap();
        assert_eq!(all.children.len(), 40, "every child once, none lost or doubled");
        assert_eq!(ledger.load_session("a").unwrap().children.len(), 20);
    }

    #[test]
    fn a_layout_2_ledger_opens_as_this_layout_with_its_rows_untouched() {
        let dir = tempfile::TempDir::new().unwrap();
        {
            let ledger = SledLedger::open(dir.path()).unwrap();
            ledger
                .write(&crate::ledger::Writes {
                    children: vec![child("a", "deleg_a", 0)],
                    ..Default::default()
                })
                .unwrap();
            ledger.flush().unwrap();
        }
        {
            let db = raw(dir.path());
            db.open_tree(META)
                .unwrap()
                .insert("layout", codec::encode(&2u8).unwrap())
                .unwrap();
            db.drop_tree(STARTS).unwrap();
            db.flush().unwrap();
        }
        let ledger = SledLedger::open(dir.path()).unwrap();
        let all = ledger.load().unwrap();
        assert_eq!(all.children, vec![child("a", "deleg_a", 0)]);
        assert!(all.starts.is_empty());
        drop(ledger);
        let layout: u8 =
            codec::decode(&raw(dir.path()).open_tree(META).unwrap().get("layout").unwrap().unwrap()).unwrap();
        assert_eq!(layout, super::super::LAYOUT);
    }

    /// A layout-3 ledger holds session rows of version 1 (before `addressable`): it opens as
    /// this layout, and its sessions load as they were, not addressable.
    #[test]
    fn a_layout_3_ledgers_sessions_load_as_they_were() {
        let dir = tempfile::TempDir::new().unwrap();
        drop(SledLedger::open(dir.path()).unwrap());
        {
            let db = raw(dir.path());
            db.open_tree(META)
                .unwrap()
                .insert("layout", codec::encode(&3u8).unwrap())
                .unwrap();
            // Session `old`: capacity 8, 3 delivery attempts, next set 2, created at 9, as
            // version 1 wrote it.
            db.open_tree(SESSIONS)
                .unwrap()
                .insert("old", vec![1, 3, b'o', b'l', b'd', 8, 3, 2, 9])
                .unwrap();
            db.flush().unwrap();
        }
        let ledger = SledLedger::open(dir.path()).unwrap();
        assert_eq!(
            ledger.load().unwrap().sessions,
            vec![SessionRow {
                session_id: "old".into(),
                max_concurrent_children: 8,
                max_delivery_attempts: 3,
                next_set: 2,
                created_at_ms: 9,
                addressable: false,
            }]
        );
        assert!(ledger.quarantined().unwrap().is_empty());
        drop(ledger);
        let layout: u8 =
            codec::decode(&raw(dir.path()).open_tree(META).unwrap().get("layout").unwrap().unwrap()).unwrap();
        assert_eq!(layout, super::super::LAYOUT);
    }

    #[test]
    fn a_newer_layout_is_refused_with_a_clear_error() {
        let dir = tempfile::TempDir::new().unwrap();
        drop(SledLedger::open(dir.path()).unwrap());
        {
            let db = raw(dir.path());
            db.open_tree(META)
                .unwrap()
                .insert("layout", codec::encode(&(super::super::LAYOUT + 1)).unwrap())
                .unwrap();
            db.flush().unwrap();
        }
        let err = SledLedger::open(dir.path()).unwrap_err().to_string();
        let (newer, this) = (super::super::LAYOUT + 1, super::super::LAYOUT);
        assert!(
            err.contains(&format!("layout {newer}")) && err.contains(&format!("up to {this}")),
            "{err}"
        );
    }
}
