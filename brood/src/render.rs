//! Rendering: the text a model reads.
//!
//! An envelope's text opens with a header saying these results arrived between turns and
//! asking for one consolidated answer, then holds one block per call (by set), each line tagged
//! `[set N · k/n]`. A failure notice is headed as a failure and says the rest of its unit is
//! still coming. A recovered unit says how many of its children were recorded before the owner
//! exited. The reply to a background call says results arrive only after the parent ends its
//! turn. This module only formats; it decides nothing.

use std::fmt::Write;

use brood_actors::model::{ItemKind, ReadyItem};

/// The header of every envelope.
pub const ENVELOPE_HEADER: &str = "[brood] Results of work you delegated arrived between your turns. \
They are everything that was ready at this boundary. Read all of them, then give ONE consolidated \
answer that accounts for every result below; do not answer them one by one, and do not delegate \
the same work again.";

/// The tag of an item: `[set N · k/n]`.
pub fn tag(item: &ReadyItem) -> String {
    format!("[set {} · {}/{}]", item.set, item.task_index + 1, item.of)
}

/// User-given text on one line: runs of whitespace made one space, and any other control
/// character shown escaped ([`crate::printable`]).
fn one_line(s: &str) -> String {
    let line = s.split_whitespace().collect::<Vec<_>>().join(" ");
    match crate::printable(&line) {
        std::borrow::Cow::Borrowed(_) => line,
        std::borrow::Cow::Owned(shown) => shown,
    }
}

/// How much of a child's data (its JSON text) an envelope's text shows; the item carries all of it.
const DATA_SHOWN_CHARS: usize = 2000;

/// `text` on one line, cut after `max` characters with a note of how much was left out.
fn clipped(text: &str, max: usize) -> String {
    let line = one_line(text);
    match line.char_indices().nth(max) {
        None => line,
        Some((cut, _)) => format!(
            "{}… ({} more bytes in the item's output)",
            &line[..cut],
            line.len() - cut
        ),
    }
}

fn item_line(out: &mut String, item: &ReadyItem) {
    let _ = write!(out, "  {} {} — {}", tag(item), item.status, one_line(&item.goal));
    if let Some(g) = &item.group {
        let _ = write!(out, " (group `{}`)", crate::printable(g));
    }
    if let Some(summary) = &item.summary {
        let _ = write!(out, "\n      result: {}", one_line(summary));
    }
    if let Some(output) = &item.output {
        let _ = write!(out, "\n      data: {}", clipped(output, DATA_SHOWN_CHARS));
    }
    if let Some(error) = &item.error {
        let _ = write!(out, "\n      error: {}", one_line(error));
    }
    if item.delivery_attempt > 1 {
        let _ = write!(
            out,
            "\n      (delivery attempt {}; you may have seen this before: dedup key {})",
            item.delivery_attempt, item.dedup_key
        );
    }
    out.push('\n');
}

/// The text of an envelope holding `items` (ordered by set, unit, task, as the owner returns them).
pub fn envelope_text(items: &[ReadyItem]) -> String {
    let mut out = String::with_capacity(256 + items.len() * 120);
    out.push_str(ENVELOPE_HEADER);
    out.push('\n');
    let mut i = 0;
    while i < items.len() {
        let set = items[i].set;
        let call = &items[i].call_id;
        let end = items[i..]
            .iter()
            .position(|it| it.set != set || &it.call_id != call)
            .map_or(items.len(), |p| i + p);
        let block = &items[i..end];
        let results = block.iter().filter(|it| it.kind == ItemKind::Result).count();
        let _ = writeln!(
            out,
            "\nSet {set} ({call}): {results} of {} results in this envelope",
            block[0].of
        );
        let mut recovered_units: Vec<&str> = Vec::new();
        for item in block {
            if let (Some(k), ItemKind::Result) = (item.recorded_before_exit, item.kind) {
                if !recovered_units.contains(&item.unit_id.as_str()) {
                    recovered_units.push(&item.unit_id);
                    let _ = writeln!(
                        out,
                        "  (unit {}: {k}/{} child results were recorded before the owner exited; the rest were re-run or are unknown)",
                        item.unit_id, item.unit_size
                    );
                }
            }
            match item.kind {
                ItemKind::Result => item_line(&mut out, item),
                ItemKind::FailureNotice => {
                    let _ = writeln!(
                        out,
                        "  FAILURE NOTICE {} {} — {}\n      error: {}\n      The rest of its unit ({}, {} children) is still running; its full result will come in a later envelope.",
                        tag(item),
                        item.status,
                        one_line(&item.goal),
                        item.error.as_deref().map(one_line).unwrap_or_else(|| "no error text".into()),
                        item.unit_id,
                        item.unit_size,
                    );
                }
            }
        }
        i = end;
    }
    out
}

/// The note of a background call's reply.
pub fn background_note(set: u64, tasks: usize, units: usize) -> String {
    format!(
        "Delegated {tasks} task{} as set {set} ({units} completion unit{}). Their results arrive only \
after you end your turn: brood hands them to you at your next turn boundary, never in the middle \
of a turn, so do not wait or poll for them. Finish any work that does not depend on them, then end \
your turn.",
        if tasks == 1 { "" } else { "s" },
        if units == 1 { "" } else { "s" },
    )
}

/// The note of a sync call's reply.
pub fn sync_note(set: u64, forced_sync_reason: Option<&str>) -> String {
    match forced_sync_reason {
        Some(why) => format!("Ran synchronously as set {set} instead of in the background: {why}. All results are below and count as delivered."),
        None => format!("Ran synchronously as set {set}. All results are below and count as delivered."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brood_actors::model::ChildStatus;

    fn item(kind: ItemKind, set: u64, idx: u32, status: ChildStatus) -> ReadyItem {
        ReadyItem {
            kind,
            dedup_key: format!("deleg_a.{idx}:{}", kind.as_str()),
            delivery_attempt: 1,
            call_id: "deleg_a".into(),
            set,
            unit_id: "deleg_a-1".into(),
            group: Some("triage".into()),
            child_id: format!("deleg_a.{idx}"),
            task_index: idx,
            of: 3,
            unit_size: 3,
            status,
            goal: "look\nat it".into(),
            summary: Some("fine".into()),
            output: None,
            attempts: 1,
            error: status.is_failure().then(|| "boom".into()),
            recovered: false,
            finished_at_ms: Some(1),
            recorded_before_exit: None,
        }
    }

    #[test]
    fn envelope_text_tags_every_item_and_heads_failure_notices() {
        let items = vec![
            item(ItemKind::FailureNotice, 2, 0, ChildStatus::Failed),
            item(ItemKind::Result, 2, 1, ChildStatus::Succeeded),
        ];
        let text = envelope_text(&items);
        assert!(text.starts_with(ENVELOPE_HEADER));
        assert!(text.contains("between your turns"));
        assert!(text.contains("ONE consolidated"));
        assert!(text.contains("Set 2 (deleg_a)"));
        assert!(text.contains("FAILURE NOTICE [set 2 · 1/3] failed — look at it"));
        assert!(text.contains("still running"));
        assert!(text.contains("[set 2 · 2/3] succeeded"));
    }

    #[test]
    fn user_text_is_shown_on_one_line_without_control_characters() {
        let mut it = item(ItemKind::Result, 1, 0, ChildStatus::Succeeded);
        it.summary = Some("done\x1b[2J\r\nrewritten".into());
        it.group = Some("g\x1b[1A".into());
        let text = envelope_text(&[it]);
        assert!(!text.contains('\x1b') && !text.contains('\r'), "{text:?}");
        assert!(text.contains("result: done\\u{1b}[2J rewritten"), "{text}");
        assert!(text.contains("(group `g\\u{1b}[1A`)"), "{text}");
    }

    #[test]
    fn recovered_units_say_how_much_was_recorded() {
        let mut it = item(ItemKind::Result, 1, 0, ChildStatus::Succeeded);
        it.recorded_before_exit = Some(2);
        assert!(envelope_text(&[it]).contains("2/3 child results were recorded before the owner exited"));
    }

    #[test]
    fn background_note_says_results_come_after_the_turn() {
        let note = background_note(4, 12, 10);
        assert!(note.contains("only after you end your turn"));
        assert!(note.contains("set 4"));
    }

    #[test]
    fn an_items_data_is_shown_on_one_line_and_clipped() {
        let mut it = item(ItemKind::Result, 1, 0, ChildStatus::Succeeded);
        it.output = Some("{\"files\":\n[\"a.rs\"]}".into());
        let text = envelope_text(&[it.clone()]);
        assert!(text.contains("      data: {\"files\": [\"a.rs\"]}\n"), "{text}");
        it.output = Some(format!("\"{}\"", "é".repeat(DATA_SHOWN_CHARS)));
        let text = envelope_text(&[it]);
        let line = text.lines().find(|l| l.trim_start().starts_with("data:")).unwrap();
        assert!(line.ends_with("more bytes in the item's output)"), "{line}");
        assert!(line.chars().count() < DATA_SHOWN_CHARS + 80, "{}", line.chars().count());
    }
}
