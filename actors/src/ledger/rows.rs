//! What both backends do alike with rows: their keys, their encoding, what a [`Writes`]
//! changes, what recording terminal rows decides, and how delivery state is folded at a load.

use std::collections::{HashMap, HashSet};

use super::trees::*;
use super::{LedgerError, RowKey, Writes};
use crate::codec;
use crate::model::*;

/// The stored key of a row of `session_id` in a session-scoped tree (calls, children, claims,
/// acks, dead letters): the session id, a NUL, the row's id. A session id holds no control
/// characters, so the NUL ends it unambiguously and one session's rows are one contiguous
/// range, read by a prefix scan: rebuilding one session reads only its own rows.
pub fn row_key(session_id: &str, id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(session_id.len() + 1 + id.len());
    key.extend_from_slice(session_id.as_bytes());
    key.push(0);
    key.extend_from_slice(id.as_bytes());
    key
}

/// What a write of a child's row does to the row stored for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildWrite {
    /// The proposed row replaces the stored one.
    Replace,
    /// The stored row stays: it is terminal and the proposed one is not (a child's status
    /// moves only forward, queued → running → ended, and ended is final).
    KeepTerminal,
}

/// The one rule every write of a child's row goes through, in the owner's owed calls and at both
/// ledgers, given each row's status and attempt: a row of an earlier attempt never replaces one
/// of a later attempt, and a terminal row is never replaced by a non-terminal one, but for the
/// next attempt of a child that ended `failed` or `timed_out` (its retry). A terminal row
/// replacing a terminal one is left to the caller (recording keeps the first outcome; delivery
/// state rewrites a row with its own outcome).
pub fn child_write(stored: Option<(ChildStatus, u32)>, proposed: (ChildStatus, u32)) -> ChildWrite {
    let Some((status, attempt)) = stored else {
        return ChildWrite::Replace;
    };
    let retry = proposed.1 > attempt && matches!(status, ChildStatus::Failed | ChildStatus::TimedOut);
    if proposed.1 < attempt || (status.is_terminal() && !proposed.0.is_terminal() && !retry) {
        ChildWrite::KeepTerminal
    } else {
        ChildWrite::Replace
    }
}

/// Whether `row` is of a later attempt of the child that ended `failed` or `timed_out` in
/// `stored`: its retry, whose rows replace the attempt's.
fn retries(stored: &ChildRow, row: &ChildRow) -> bool {
    row.attempt > stored.attempt && matches!(stored.status, ChildStatus::Failed | ChildStatus::TimedOut)
}

/// How many writes of a child's row were not applied, at either ledger of this process, for
/// they would have replaced an ended row with an unended one (see [`child_write`]).
static KEPT_TERMINAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The number of child-row writes kept from replacing an ended row, in this process.
pub fn kept_terminal_rows() -> u64 {
    KEPT_TERMINAL.load(std::sync::atomic::Ordering::Relaxed)
}

/// Reports a write of `proposed` that [`child_write`] kept from replacing an ended row.
pub(super) fn report_kept(stored: ChildStatus, proposed: &ChildRow) {
    KEPT_TERMINAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tracing::warn!(
        session = %proposed.session_id,
        child = %proposed.child_id,
        ?stored,
        proposed = ?proposed.status,
        "a write would have moved an ended child back; the ended row is kept"
    );
}

/// A [`row_key`] taken apart: its session id and its row id (none for a key without the NUL
/// a session id never holds, or that is not text).
pub(super) fn split_row_key(key: &[u8]) -> Option<(&str, &str)> {
    let nul = key.iter().position(|b| *b == 0)?;
    let session = std::str::from_utf8(&key[..nul]).ok()?;
    let id = std::str::from_utf8(&key[nul + 1..]).ok()?;
    Some((session, id))
}

/// The prefix every key of `session_id` in a session-scoped tree starts with.
pub(super) fn session_prefix(session_id: &str) -> Vec<u8> {
    row_key(session_id, "")
}

/// Whether a tree's keys are [`row_key`]s (the others are keyed by session id).
pub(super) fn is_scoped(tree: &str) -> bool {
    matches!(
        tree,
        CALLS | CHILDREN | STARTS | CLAIMS | ACKS | DEAD_LETTERS | REDRIVES
    )
}

/// Decodes a stored row; the error names its tree and its key (lossily as text).
pub(super) fn decode_at<T: crate::codec::Stored>(
    tree: &'static str,
    key: &[u8],
    value: &[u8],
) -> Result<T, LedgerError> {
    codec::decode(value).map_err(|source| LedgerError::Codec {
        tree,
        key: String::from_utf8_lossy(key).into_owned(),
        source,
    })
}

/// Encodes a row; its key (an id, or a stored key's bytes) is turned into text only for the
/// error, as this runs for every row written.
pub(super) fn encode<T: crate::codec::Stored>(
    tree: &'static str,
    key: impl AsRef<[u8]>,
    row: &T,
) -> Result<Vec<u8>, LedgerError> {
    codec::encode(row).map_err(|source| LedgerError::Codec {
        tree,
        key: String::from_utf8_lossy(key.as_ref()).into_owned(),
        source,
    })
}

/// One change a [`Writes`] makes: its tree, its key, and the value to put (`None`: remove).
pub(super) type Change = (&'static str, Vec<u8>, Option<Vec<u8>>);

/// What `w` changes, encoded, in the order a ledger applies it (the same key changed twice
/// ends as the later change says). A nest comes before its session: a crash between them (in
/// a ledger without transactions) leaves a nest row that the next open writes again, never a
/// nested session that looks top-level.
pub(super) fn write_changes(w: &Writes) -> Result<Vec<Change>, LedgerError> {
    fn puts<'a, T: crate::codec::Stored + 'a>(
        out: &mut Vec<Change>,
        tree: &'static str,
        rows: impl IntoIterator<Item = (Vec<u8>, &'a T)>,
    ) -> Result<(), LedgerError> {
        for (key, row) in rows {
            let value = encode(tree, &key, row)?;
            out.push((tree, key, Some(value)));
        }
        Ok(())
    }
    fn removes(out: &mut Vec<Change>, tree: &'static str, keys: impl IntoIterator<Item = Vec<u8>>) {
        out.extend(keys.into_iter().map(|key| (tree, key, None)));
    }
    let by_id = |id: &String| id.as_bytes().to_vec();
    let scoped = |k: &RowKey| row_key(&k.session_id, &k.id);
    let mut out = Vec::new();
    puts(&mut out, NESTS, w.nests.iter().map(|r| (by_id(&r.session_id), r)))?;
    puts(&mut out, SESSIONS, w.sessions.iter().map(|r| (by_id(&r.session_id), r)))?;
    puts(
        &mut out,
        CALLS,
        w.calls.iter().map(|r| (row_key(&r.session_id, &r.call_id), r)),
    )?;
    puts(
        &mut out,
        CHILDREN,
        w.children.iter().map(|r| (row_key(&r.session_id, &r.child_id), r)),
    )?;
    puts(
        &mut out,
        STARTS,
        w.starts.iter().map(|r| (row_key(&r.session_id, &r.start_id), r)),
    )?;
    let dead = w.dead_letters.iter().map(|r| (row_key(&r.session_id, &r.dedup_key), r));
    puts(&mut out, DEAD_LETTERS, dead)?;
    puts(&mut out, WAKES, w.wakes.iter().map(|r| (by_id(&r.session_id), r)))?;
    removes(&mut out, WAKES, w.remove_wakes.iter().map(by_id));
    removes(&mut out, CALLS, w.remove_calls.iter().map(scoped));
    // After a removed call: an ack row retention takes a removed call's items out of is never
    // written while that call is still stored (its items would read undelivered).
    puts(
        &mut out,
        ACKS,
        w.acks.iter().map(|r| (row_key(&r.session_id, &r.claim_id), r)),
    )?;
    removes(&mut out, DEAD_LETTERS, w.remove_dead_letters.iter().map(scoped));
    puts(
        &mut out,
        REDRIVES,
        w.redrives.iter().map(|r| (row_key(&r.session_id, &r.dedup_key), r)),
    )?;
    removes(&mut out, REDRIVES, w.remove_redrives.iter().map(scoped));
    removes(&mut out, CHILDREN, w.remove_children.iter().map(scoped));
    removes(&mut out, SESSIONS, w.remove_sessions.iter().map(by_id));
    removes(&mut out, NESTS, w.remove_nests.iter().map(by_id));
    removes(&mut out, ACKS, w.remove_acks.iter().map(scoped));
    removes(&mut out, CLAIMS, w.remove_claims.iter().map(scoped));
    removes(&mut out, STARTS, w.remove_starts.iter().map(scoped));
    Ok(out)
}

/// The call `call_id` among `calls` (every stored call, key and value), whatever its session:
/// every call's key ends with a NUL and its id.
pub(super) fn find_call_in(
    calls: impl IntoIterator<Item = Result<(impl AsRef<[u8]>, impl AsRef<[u8]>), LedgerError>>,
    call_id: &str,
) -> Result<Option<CallRow>, LedgerError> {
    let mut suffix = Vec::with_capacity(call_id.len() + 1);
    suffix.push(0);
    suffix.extend_from_slice(call_id.as_bytes());
    for kv in calls {
        let (k, v) = kv?;
        if k.as_ref().ends_with(&suffix) {
            let row: CallRow = decode_at(CALLS, call_id.as_bytes(), v.as_ref())?;
            if row.call_id == call_id {
                return Ok(Some(row));
            }
        }
    }
    Ok(None)
}

/// The claims no ack row names: live when the last process stopped.
pub(super) fn live_claims(mut claims: Vec<ClaimRow>, acks: &[AckRow]) -> Vec<ClaimRow> {
    let acked: HashSet<&str> = acks.iter().map(|a| a.claim_id.as_str()).collect();
    claims.retain(|c| !acked.contains(c.claim_id.as_str()));
    claims
}

/// Folds the durable delivery state of ack rows and dead letters into the children's rows.
pub(super) fn fold_delivery<'a>(
    children: impl IntoIterator<Item = &'a mut ChildRow>,
    acks: &[AckRow],
    dead: &[DeadLetterRow],
) {
    /// What the ack rows and dead letters say of one item.
    #[derive(Default, Clone, Copy)]
    struct Said {
        delivered: bool,
        dead: Option<u32>,
    }
    // Keyed by the ids the acks and dead letters name (borrowed): usually far fewer than the
    // children, and none at all in a ledger nothing was delivered from.
    let mut said: HashMap<&str, [Said; 2]> = HashMap::new();
    let slot = |kind: ItemKind| match kind {
        ItemKind::Result => 0,
        ItemKind::FailureNotice => 1,
    };
    for key in acks.iter().flat_map(|a| &a.items) {
        if let Some((child, kind)) = parse_dedup_key(key) {
            said.entry(child).or_default()[slot(kind)].delivered = true;
        }
    }
    for d in dead {
        if let Some((child, kind)) = parse_dedup_key(&d.dedup_key) {
            let s = &mut said.entry(child).or_default()[slot(kind)];
            s.dead = Some(s.dead.map_or(d.attempts, |a| a.max(d.attempts)));
        }
    }
    if said.is_empty() {
        return;
    }
    for child in children {
        let Some(&items) = said.get(child.child_id.as_str()) else {
            continue;
        };
        for kind in [ItemKind::Result, ItemKind::FailureNotice] {
            let s = items[slot(kind)];
            let row = child.delivery_mut(kind);
            row.delivered |= s.delivered;
            if let Some(attempts) = s.dead {
                row.dead = true;
                row.failed_attempts = row.failed_attempts.max(attempts);
            }
        }
    }
}

/// A quarantined row's key in the quarantine trees (`<tree>/<key>`) and what is recorded of it.
pub(super) fn quarantine_entry(tree: &str, key: &[u8], value: &[u8], reason: &str) -> (Vec<u8>, QuarantineRow) {
    let row = QuarantineRow {
        tree: tree.to_string(),
        key: key.to_vec(),
        value_len: value.len() as u64,
        reason: reason.to_string(),
        quarantined_at_ms: now_ms(),
    };
    ([tree.as_bytes(), b"/", key].concat(), row)
}

/// The rows as stored, and which of them to write: each with its key and its place among the
/// stored rows.
pub(super) type Merged = (Vec<ChildRow>, Vec<(Vec<u8>, usize)>);

/// What recording terminal rows decides, whatever stores them ([`Ledger::record_terminals`]):
/// each row as it is to be stored (in the order given), and which of them to write. `current`
/// reads a child's stored row by key (`None` when it has none, or none that decodes). A stored
/// terminal row is left as it is; a stored non-terminal one is replaced, its delivery state
/// kept; a second row of the same child in one batch (its cancel and its own end, handed over
/// at once) is one the first already made terminal, so it is left as the first stored it.
/// The rows are moved, not copied: a batch of completions is the hot path.
pub(super) fn merge_terminals(
    rows: Vec<ChildRow>,
    mut current: impl FnMut(&[u8]) -> Result<Option<ChildRow>, LedgerError>,
) -> Result<Merged, LedgerError> {
    let mut keys: Vec<Vec<u8>> = rows.iter().map(|r| row_key(&r.session_id, &r.child_id)).collect();
    // The place of the first row of the same child, for each row that repeats one.
    let firsts: Vec<Option<usize>> = {
        let mut seen: foldhash::HashMap<&[u8], usize> =
            foldhash::HashMap::with_capacity_and_hasher(keys.len(), Default::default());
        keys.iter()
            .enumerate()
            .map(|(i, k)| match seen.entry(k.as_slice()) {
                std::collections::hash_map::Entry::Occupied(e) => Some(*e.get()),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(i);
                    None
                }
            })
            .collect()
    };
    let mut stored: Vec<ChildRow> = Vec::with_capacity(rows.len());
    let mut writes = Vec::with_capacity(rows.len());
    for ((mut row, first), key) in rows.into_iter().zip(firsts).zip(keys.iter_mut()) {
        if let Some(first) = first {
            stored.push(stored[first].clone());
            continue;
        }
        match current(key)? {
            // Recording keeps the first outcome of an attempt, and never an unended row over an
            // ended one.
            Some(current)
                if (current.status.is_terminal() && !retries(&current, &row))
                    || child_write(Some((current.status, current.attempt)), (row.status, row.attempt))
                        == ChildWrite::KeepTerminal =>
            {
                stored.push(current)
            }
            current => {
                if let Some(current) = current {
                    row.result = current.result;
                    row.notice = current.notice;
                }
                writes.push((std::mem::take(key), stored.len()));
                stored.push(row);
            }
        }
    }
    Ok((stored, writes))
}

/// Decodes and checks rows (key, stored value) into `out`, in their order; returns those that
/// failed, each with why, for the caller to quarantine.
pub(super) fn decode_rows<C, K, V, E>(
    rows: impl Iterator<Item = Result<(K, V), E>>,
    out: &mut C,
) -> Result<Vec<(K, V, String)>, LedgerError>
where
    C: super::RowSink,
    C::Row: crate::codec::Stored + CheckRow,
    V: AsRef<[u8]>,
    LedgerError: From<E>,
{
    let mut bad = Vec::new();
    for kv in rows {
        let (k, v) = kv?;
        match decode_checked::<C::Row>(v.as_ref()) {
            Ok(row) => out.put(row),
            Err(reason) => bad.push((k, v, reason)),
        }
    }
    Ok(bad)
}

/// A stored row decoded and checked; why not, when it does not decode or fails its check.
pub(super) fn decode_checked<T: crate::codec::Stored + CheckRow>(value: &[u8]) -> Result<T, String> {
    codec::decode::<T>(value)
        .map_err(|e| e.to_string())
        .and_then(|row| row.check().map(|_| row))
}

/// A quarantine entry as read back: its stored record (`encoded`, under `key`) and the raw
/// value it kept. A quarantine record is brood's own; one that does not decode is reported as
/// such.
pub(super) fn read_quarantined(key: &[u8], encoded: &[u8], value: Vec<u8>) -> Quarantined {
    let row = codec::decode(encoded).unwrap_or_else(|e| QuarantineRow {
        tree: QUARANTINE.into(),
        key: key.to_vec(),
        value_len: value.len() as u64,
        reason: format!("the quarantine row itself does not decode: {e}"),
        quarantined_at_ms: 0,
    });
    Quarantined::new(row, value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_row_moves_forward_and_only_a_retry_reopens_an_ended_attempt() {
        use ChildStatus::*;
        use ChildWrite::*;
        assert_eq!(child_write(None, (Queued, 1)), Replace);
        assert_eq!(child_write(Some((Queued, 1)), (Running, 1)), Replace);
        assert_eq!(child_write(Some((Running, 1)), (Failed, 1)), Replace);
        for ended in [Succeeded, Failed, TimedOut, Cancelled, Interrupted, Unknown] {
            assert_eq!(child_write(Some((ended, 1)), (Queued, 1)), KeepTerminal, "{ended}");
        }
        assert_eq!(child_write(Some((Failed, 1)), (Queued, 2)), Replace);
        assert_eq!(child_write(Some((TimedOut, 2)), (Queued, 3)), Replace);
        for ended in [Succeeded, Cancelled, Interrupted, Unknown] {
            assert_eq!(child_write(Some((ended, 1)), (Queued, 2)), KeepTerminal, "{ended}");
        }
        // An earlier attempt never replaces a later one's row, ended or not.
        assert_eq!(child_write(Some((Queued, 2)), (Failed, 1)), KeepTerminal);
        assert_eq!(child_write(Some((Running, 2)), (Running, 1)), KeepTerminal);
    }
}
