//! A corrupt ledger never takes the process down (DESIGN.md "Durability": "A row that does not
//! decode is moved with its raw bytes to a quarantine tree, logged and counted; the rest of the
//! ledger opens").
//!
//! Each test writes one kind of damage into a real sled folder — a bad version byte, a
//! truncated value, a length prefix over the size limit, an index out of range, a count at its
//! maximum, a missing session row — reopens it with `Brood::open`, and checks that the damaged
//! row is in quarantine with its reason and its raw bytes, and that the rest is served.

mod common;

use std::path::Path;

use brood::{Brood, BroodConfig, ChildStatus, DelegateReply, DelegateRequest};
use brood_actors::codec;
use brood_actors::ledger::row_key;
use brood_actors::model::ChildRow;
use common::*;
use tempfile::TempDir;

/// A ledger with session `s` holding one background call of two finished children, whose
/// results are ready and not acked. Returns the call id.
async fn ledger_with_a_call(dir: &Path) -> String {
    let b = Brood::open(BroodConfig::new(dir)).unwrap();
    open_wake(&b, "s").await;
    let reply = b
        .delegate(
            "s",
            DelegateRequest::background(vec![task("a", sim(0)), task("b", sim(0))]).independent(),
        )
        .await
        .unwrap();
    let DelegateReply::Background { call_id, .. } = reply else {
        panic!("a wake-capable session runs background calls in the background");
    };
    status_until(&b, "s", "both results ready", |st| st.counts.ready == 2).await;
    b.shutdown();
    call_id
}

/// The stored key of row `id` of session `s` in `tree` (sessions and wakes are keyed by the
/// session id itself).
fn stored_key(tree: &str, id: &str) -> Vec<u8> {
    match tree {
        "sessions" | "wakes" => id.as_bytes().to_vec(),
        _ => row_key("s", id),
    }
}

/// Overwrites one raw value of a tree with `damage(old)`.
fn damage(dir: &Path, tree: &str, key: &str, damage: impl FnOnce(Vec<u8>) -> Vec<u8>) {
    let db = sled::open(dir).unwrap();
    let t = db.open_tree(tree).unwrap();
    let key = stored_key(tree, key);
    let old = t
        .get(&key)
        .unwrap()
        .unwrap_or_else(|| panic!("no `{}` in `{tree}`", String::from_utf8_lossy(&key)))
        .to_vec();
    t.insert(&key, damage(old)).unwrap();
    db.flush().unwrap();
}

fn child_row(dir: &Path, id: &str) -> ChildRow {
    let db = sled::open(dir).unwrap();
    let v = db
        .open_tree("children")
        .unwrap()
        .get(stored_key("children", id))
        .unwrap()
        .unwrap();
    codec::decode(&v).unwrap()
}

/// Reopens the folder and returns the engine and its quarantine.
fn reopen(dir: &Path) -> (Brood, Vec<brood::Quarantined>) {
    let b = Brood::open(BroodConfig::new(dir)).expect("a damaged ledger still opens");
    let q = b.quarantined().unwrap();
    (b, q)
}

fn assert_quarantined(q: &[brood::Quarantined], tree: &str, key: &str, reason: &str) {
    let found = q
        .iter()
        .find(|r| r.tree == tree && r.key == stored_key(tree, key))
        .unwrap_or_else(|| panic!("`{tree}/{key}` is not quarantined: {q:?}"));
    assert!(
        found.reason.contains(reason),
        "reason `{}` does not say `{reason}`",
        found.reason
    );
    assert!(!found.value.is_empty(), "the raw bytes are kept");
    assert_eq!(found.value.len() as u64, found.value_len);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_version_byte_is_quarantined_and_the_sibling_still_delivered() {
    let dir = TempDir::new().unwrap();
    let call = ledger_with_a_call(dir.path()).await;
    let victim = format!("{call}.0");
    damage(dir.path(), "children", &victim, |mut v| {
        v[0] = 77;
        v
    });
    let (b, q) = reopen(dir.path());
    assert_quarantined(&q, "children", &victim, "format version 77");
    let env = next_envelope(&b, "s", "c", LONG_LEASE).await;
    let by_child: Vec<(String, ChildStatus)> = env.items.iter().map(|i| (i.child_id.clone(), i.status)).collect();
    assert!(
        by_child.contains(&(format!("{call}.1"), ChildStatus::Succeeded)),
        "{by_child:?}"
    );
    // The damaged child is not run again blindly: its outcome is unknown, and said so.
    let damaged = env
        .items
        .iter()
        .find(|i| i.child_id == victim)
        .expect("the damaged child is reported");
    assert_eq!(damaged.status, ChildStatus::Unknown);
    assert!(damaged.error.as_deref().unwrap_or("").contains("damaged"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_length_prefix_past_the_limit_is_refused_not_allocated() {
    let dir = TempDir::new().unwrap();
    let call = ledger_with_a_call(dir.path()).await;
    let victim = format!("{call}.1");
    // child_id's length prefix follows the version byte: make it u64::MAX.
    damage(dir.path(), "children", &victim, |v| {
        let mut out = vec![v[0], 253];
        out.extend_from_slice(&u64::MAX.to_le_bytes());
        out.extend_from_slice(&v[2..]);
        out
    });
    let (_b, q) = reopen(dir.path());
    assert_quarantined(&q, "children", &victim, "malformed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_call_row_quarantines_the_call_and_its_children() {
    let dir = TempDir::new().unwrap();
    let call = ledger_with_a_call(dir.path()).await;
    damage(dir.path(), "calls", &call, |v| v[..v.len() / 2].to_vec());
    let (b, q) = reopen(dir.path());
    assert_quarantined(&q, "calls", &call, "malformed");
    assert_quarantined(&q, "children", &format!("{call}.0"), "has no (readable) row");
    assert_quarantined(&q, "children", &format!("{call}.1"), "has no (readable) row");
    // The session is still served: a new call gets the next set, not set 1 again.
    let reply = b
        .delegate("s", DelegateRequest::sync(vec![task("after", sim(0))]))
        .await
        .unwrap();
    assert_eq!(reply.set(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_index_beyond_its_calls_tasks_is_quarantined() {
    let dir = TempDir::new().unwrap();
    let call = ledger_with_a_call(dir.path()).await;
    let mut row = child_row(dir.path(), &format!("{call}.0"));
    row.task_index = 99;
    row.child_id = format!("{call}.99");
    {
        let db = sled::open(dir.path()).unwrap();
        db.open_tree("children")
            .unwrap()
            .insert(row_key(&row.session_id, &row.child_id), codec::encode(&row).unwrap())
            .unwrap();
        db.flush().unwrap();
    }
    let (b, q) = reopen(dir.path());
    assert_quarantined(&q, "children", &row.child_id, "beyond its call's 2 tasks");
    let env = next_envelope(&b, "s", "c", LONG_LEASE).await;
    assert_eq!(env.items.len(), 2, "the call's own children are served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_at_its_maximum_is_quarantined_not_incremented() {
    let dir = TempDir::new().unwrap();
    let call = ledger_with_a_call(dir.path()).await;
    let victim = format!("{call}.0");
    let mut row = child_row(dir.path(), &victim);
    row.result.failed_attempts = u32::MAX;
    damage(dir.path(), "children", &victim, |_| codec::encode(&row).unwrap());
    let (_b, q) = reopen(dir.path());
    assert_quarantined(&q, "children", &victim, "result.failed_attempts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_session_row_is_rebuilt_from_its_calls_without_reusing_a_set() {
    let dir = TempDir::new().unwrap();
    ledger_with_a_call(dir.path()).await;
    damage(dir.path(), "sessions", "s", |_| vec![1, 0xff]);
    let (b, q) = reopen(dir.path());
    assert_quarantined(&q, "sessions", "s", "malformed");
    // Its call is still owed to it, and the next call takes set 2.
    let env = next_envelope(&b, "s", "c", LONG_LEASE).await;
    assert_eq!(env.items.len(), 2);
    let reply = b
        .delegate("s", DelegateRequest::sync(vec![task("after", sim(0))]))
        .await
        .unwrap();
    assert_eq!(reply.set(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quarantine_survives_a_second_reopen_and_is_not_repeated() {
    let dir = TempDir::new().unwrap();
    let call = ledger_with_a_call(dir.path()).await;
    let victim = format!("{call}.0");
    damage(dir.path(), "children", &victim, |mut v| {
        v.truncate(3);
        v
    });
    let (b, q) = reopen(dir.path());
    assert_eq!(q.len(), 1);
    b.shutdown();
    let (_b, q) = reopen(dir.path());
    assert_eq!(q.len(), 1, "the row was moved once, durably: {q:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_value_over_the_size_limit_is_quarantined_whole() {
    let dir = TempDir::new().unwrap();
    let call = ledger_with_a_call(dir.path()).await;
    let victim = format!("{call}.0");
    let huge = brood_actors::codec::MAX_VALUE_BYTES + 16;
    damage(dir.path(), "children", &victim, |v| {
        let mut out = v;
        out.resize(huge, 0);
        out
    });
    let (_b, q) = reopen(dir.path());
    assert_quarantined(&q, "children", &victim, "over the limit");
    assert_eq!(q[0].value.len(), huge, "kept whole");
}
