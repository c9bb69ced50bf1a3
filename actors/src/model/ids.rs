//! The id scheme: call, unit and child ids, claim ids, dedup keys, and the random and ordered
//! hex they are made of. Ids of one call share its prefix, so a call's rows sit together in
//! every table, and ids made later sort later.

use std::fmt;

use super::{now_ms, ItemKind};

/// The dedup key of an item: stable for the life of the item.
pub fn dedup_key(child_id: &str, kind: ItemKind) -> String {
    let kind = kind.as_str();
    let mut key = String::with_capacity(child_id.len() + 1 + kind.len());
    key.push_str(child_id);
    key.push(':');
    key.push_str(kind);
    key
}

/// `head`, `sep` and `n` in decimal, in one allocation of the right size: ids are made by the
/// million in recovery, where `format!`'s machinery showed in the profile.
fn numbered(head: &str, sep: char, n: u64) -> String {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    let digits = std::str::from_utf8(&digits[at..]).expect("ASCII digits");
    let mut id = String::with_capacity(head.len() + sep.len_utf8() + digits.len());
    id.push_str(head);
    id.push(sep);
    id.push_str(digits);
    id
}

/// Splits a dedup key back into child id and kind.
pub fn parse_dedup_key(key: &str) -> Option<(&str, ItemKind)> {
    let (child, kind) = key.rsplit_once(':')?;
    let kind = match kind {
        "result" => ItemKind::Result,
        "failure_notice" => ItemKind::FailureNotice,
        _ => return None,
    };
    Some((child, kind))
}

/// A unit id from its call and 1-based ordinal.
pub fn unit_id(call_id: &str, k: usize) -> String {
    numbered(call_id, '-', k as u64)
}

/// Splits an id `<call><sep><n>` into its call and number. The number must be written as
/// [`child_id`] and [`unit_id`] write it (decimal digits, no sign, no leading zero), so one id
/// never names another's place.
fn split_id(id: &str, sep: char) -> Option<(&str, u32)> {
    let (call, n) = id.rsplit_once(sep)?;
    let canonical = !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && (n == "0" || !n.starts_with('0'));
    if !canonical || call.is_empty() {
        return None;
    }
    Some((call, n.parse().ok()?))
}

/// A child id's call and task index, if it is one.
pub fn parse_child_id(id: &str) -> Option<(&str, u32)> {
    split_id(id, '.')
}

/// A unit id's call and ordinal k (from 1), if it is one.
pub fn parse_unit_id(id: &str) -> Option<(&str, u32)> {
    split_id(id, '-').filter(|&(_, k)| k >= 1)
}

/// A child id from its call and 0-based task index.
pub fn child_id(call_id: &str, index: u32) -> String {
    numbered(call_id, '.', u64::from(index))
}

/// A child id as [`child_id`] writes it, shown without being made: a log or span field that
/// costs nothing when nobody records it.
#[derive(Debug, Clone, Copy)]
pub struct ShowChildId<'a>(pub &'a str, pub u32);

impl fmt::Display for ShowChildId<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}

/// `text` as hex, two digits a byte: safe inside an id whatever the text holds.
pub fn text_hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The text [`text_hex`] made `hex` of, if it is one.
pub fn hex_text(hex: &str) -> Option<String> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// A fresh random hex string of 16 digits.
pub fn random_hex() -> String {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u64(now_ms());
    format!("{:016x}", h.finish())
}

/// 16 hex digits that sort in the order they were made: the time in ms (11 digits), then a
/// counter from a random start (5 digits, so a million a millisecond stay distinct). Ids made
/// from them are stored in that order, so new rows are written next to each other at the end
/// of their session's key range, not all over the tree (what sled must touch stays small
/// whatever the ledger's size). Not for secrets: see [`random_hex`].
pub fn ordered_hex() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static START: OnceLock<u64> = OnceLock::new();
    let start = *START.get_or_init(|| u64::from_str_radix(&random_hex()[..5], 16).unwrap_or(0));
    let n = start.wrapping_add(COUNTER.fetch_add(1, Ordering::Relaxed)) & 0xf_ffff;
    format!("{:011x}{n:05x}", now_ms() & 0xfff_ffff_ffff)
}

/// A claim id that names its session: `clm_<session as hex>_<hex>`, in the order claims were
/// made ([`ordered_hex`]: their ack rows are written next to each other).
pub fn new_claim_id(session_id: &str) -> String {
    format!("clm_{}_{}", text_hex(session_id), ordered_hex())
}

/// The session a claim id names, if it is one of ours.
pub fn claim_session(claim_id: &str) -> Option<String> {
    let rest = claim_id.strip_prefix("clm_")?;
    let (hex, _) = rest.rsplit_once('_')?;
    hex_text(hex)
}

/// When a claim id of ours was made (ms since the epoch, as [`ordered_hex`] stamps it).
pub(crate) fn claim_made_ms(claim_id: &str) -> Option<u64> {
    let (_, ordered) = claim_id.strip_prefix("clm_")?.rsplit_once('_')?;
    u64::from_str_radix(ordered.get(..11)?, 16).ok()
}

/// A fresh call id, `deleg_<hex>`, in the order calls were made ([`ordered_hex`]).
pub fn new_call_id() -> String {
    format!("deleg_{}", ordered_hex())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordered_ids_are_distinct_and_sort_in_the_order_they_were_made() {
        let ids: Vec<String> = (0..50_000).map(|_| new_call_id()).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), ids.len(), "an id was made twice");
        // Within one millisecond the counter may wrap once from its random start; across
        // milliseconds the time prefix orders them.
        let out_of_order = ids.windows(2).filter(|w| w[0] > w[1]).count();
        assert!(out_of_order <= 1, "{out_of_order} ids sort before the one made earlier");
        assert!(ids.iter().all(|id| id.len() == "deleg_".len() + 16));
    }

    #[test]
    fn a_shown_child_id_is_the_child_id() {
        for (call, i) in [("deleg_1", 0), ("deleg_ab", 17), ("c", u32::MAX)] {
            assert_eq!(ShowChildId(call, i).to_string(), child_id(call, i));
        }
    }

    #[test]
    fn dedup_keys_round_trip() {
        let key = dedup_key("deleg_ab.3", ItemKind::FailureNotice);
        assert_eq!(parse_dedup_key(&key), Some(("deleg_ab.3", ItemKind::FailureNotice)));
        assert_eq!(parse_dedup_key("nonsense"), None);
    }
}
