//! The views of an inspection as text for people. The [`summary`] is a few lines per session
//! (its counts, its calls by state, its oldest unfinished child, its first dead letters and
//! claims), however many calls it has. The [`tree`] is a block per session (its counts on one
//! line, then each shown call's units and children as aligned columns, then how many calls
//! follow and how to see them), then the dead letters of the calls shown and the quarantined
//! rows. Times are UTC, ages coarse (`42s`, `5m`, `3h`, `2d`); a value a source does not know
//! is `-`. Text from users or the ledger (ids, goals, summaries, reasons, consumers, keys) is
//! shown [`printable`]: a goal holding a terminal escape or a carriage return cannot clear the
//! screen or rewrite rows. A goal is cut to [`GOAL_WIDTH`] characters.

use std::fmt::Write as _;

use super::{Inspection, SessionSummary, SessionView, Source, Summary};
use brood::printable;
use brood_server::api::{CallView, Counts};

/// The most characters of a goal shown (the last an ellipsis when it is cut).
pub const GOAL_WIDTH: usize = 40;
/// The most characters of a dead letter's reason a summary shows.
const REASON_WIDTH: usize = 80;

fn source_line(out: &mut String, source: Source) {
    let source = match source {
        Source::Server => "server",
        Source::DataDir => "data dir (turn, wake_capable and counts as a server opening it would start)",
    };
    let _ = writeln!(out, "source: {source}");
}

/// `text` [`printable`], cut to `max` characters (the last an ellipsis when it is cut); `-`
/// when empty.
fn clip(text: &str, max: usize) -> String {
    if text.is_empty() {
        return "-".into();
    }
    let shown = printable(text);
    if shown.chars().count() <= max {
        return shown.into_owned();
    }
    let mut cut: String = shown.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// Renders the summary: a few lines per session, then the first quarantined rows.
pub fn summary(summary: &Summary) -> String {
    let mut out = String::new();
    source_line(&mut out, summary.source);
    if summary.sessions.is_empty() {
        out.push_str("no sessions\n");
    }
    for session in &summary.sessions {
        out.push('\n');
        summary_session(&mut out, session);
    }
    out.push('\n');
    match &summary.quarantined {
        None => {}
        Some(rows) if rows.total == 0 => out.push_str("quarantined rows: none\n"),
        Some(rows) => {
            let _ = writeln!(out, "quarantined rows: {}", rows.total);
            quarantined_rows(&mut out, &rows.first);
            more(&mut out, "    ", rows.total, rows.first.len(), "--tree lists them all");
        }
    }
    if !summary.sessions.is_empty() {
        out.push_str("(brood inspect --tree shows each session's calls, units and children)\n");
    }
    out
}

/// `… and N more (hint)` when a list shows fewer than it has.
fn more(out: &mut String, indent: &str, total: u64, shown: usize, hint: &str) {
    let left = total.saturating_sub(shown as u64);
    if left > 0 {
        let _ = writeln!(out, "{indent}… and {left} more ({hint})");
    }
}

fn session_header(out: &mut String, id: &str, turn: &str, wake_capable: bool, parent: Option<&str>) {
    let _ = writeln!(
        out,
        "session {}  turn {turn}  wake_capable {wake_capable}",
        printable(id)
    );
    if let Some(parent) = parent {
        let _ = writeln!(out, "  nested: the session of child {}", printable(parent));
    }
}

/// A session's counts on one line, then `more` (what the view adds to them).
fn counts_line(out: &mut String, c: &Counts, more: &str) {
    let _ = writeln!(
        out,
        "  queued {}  running {}  ready {}  backing_off {}  claimed {}  delivered {}{more}",
        c.queued, c.running, c.ready, c.backing_off, c.claimed, c.delivered
    );
}

fn summary_session(out: &mut String, s: &SessionSummary) {
    session_header(
        out,
        &s.session_id,
        s.turn.as_str(),
        s.wake_capable,
        s.parent_child_id.as_deref(),
    );
    counts_line(out, &s.counts, &format!("  dead letters {}", s.dead_letters.total));
    let k = &s.calls;
    let _ = writeln!(
        out,
        "  calls {}: unfinished {}  undelivered {}  dead_lettered {}  delivered {}",
        k.total, k.unfinished, k.undelivered, k.dead_lettered, k.delivered
    );
    match &s.oldest_unfinished {
        None => out.push_str("  oldest unfinished child: none\n"),
        Some(u) => {
            let _ = writeln!(
                out,
                "  oldest unfinished child: {}  {} for {}  goal: {}",
                printable(&u.child_id),
                u.status.as_str(),
                age(u.since),
                clip(&u.goal, GOAL_WIDTH)
            );
        }
    }
    if !s.dead_letters.first.is_empty() {
        out.push_str("  dead letters:\n");
        let rows = s
            .dead_letters
            .first
            .iter()
            .map(|d| {
                vec![
                    d.child_id.clone(),
                    d.kind.as_str().to_string(),
                    d.attempts.to_string(),
                    time(Some(d.dead_at)),
                    clip(&d.reason, REASON_WIDTH),
                ]
            })
            .collect();
        columns(out, "    ", &["CHILD", "KIND", "ATTEMPTS", "DEAD AT", "REASON"], rows);
        more(
            out,
            "    ",
            s.dead_letters.total,
            s.dead_letters.first.len(),
            "--tree lists them with their calls",
        );
    }
    if !s.claims.first.is_empty() {
        out.push_str("  live claims:\n");
        claims(out, &s.claims.first);
        more(
            out,
            "    ",
            s.claims.total,
            s.claims.first.len(),
            "--tree lists them all",
        );
    }
}

fn claims(out: &mut String, claims: &[brood_server::api::ClaimView]) {
    let rows = claims
        .iter()
        .map(|c| {
            vec![
                c.claim_id.clone(),
                c.consumer.clone(),
                c.items.to_string(),
                time(Some(c.lease_expires_at)),
            ]
        })
        .collect();
    columns(out, "    ", &["CLAIM", "CONSUMER", "ITEMS", "LEASE EXPIRES"], rows);
}

fn quarantined_rows(out: &mut String, rows: &[super::QuarantinedView]) {
    let rows = rows
        .iter()
        .map(|q| {
            let at = q
                .quarantined_at
                .map_or("at the next open".to_string(), |t| time(Some(t)));
            vec![q.tree.clone(), q.key.clone(), at, q.reason.clone()]
        })
        .collect();
    columns(out, "  ", &["TREE", "KEY", "QUARANTINED", "REASON"], rows);
}

/// Renders a page of the tree (see [`Inspection::page`]) as aligned tables.
pub fn tree(inspection: &Inspection) -> String {
    let mut out = String::new();
    source_line(&mut out, inspection.source);
    if inspection.sessions.is_empty() {
        out.push_str("no sessions\n");
    }
    for session in &inspection.sessions {
        out.push('\n');
        render_session(&mut out, session);
    }
    out.push('\n');
    if inspection.dead_letters.is_empty() {
        out.push_str("dead letters of the calls shown: none\n");
    } else {
        out.push_str("dead letters of the calls shown:\n");
        let rows = inspection
            .dead_letters
            .iter()
            .map(|d| {
                vec![
                    d.child_id.clone(),
                    d.session_id.clone(),
                    d.kind.as_str().to_string(),
                    d.attempts.to_string(),
                    time(Some(d.dead_at)),
                    d.reason.clone(),
                ]
            })
            .collect();
        columns(
            &mut out,
            "  ",
            &["CHILD", "SESSION", "KIND", "ATTEMPTS", "DEAD AT", "REASON"],
            rows,
        );
    }
    match &inspection.quarantined {
        None => {}
        Some(rows) if rows.is_empty() => out.push_str("quarantined rows: none\n"),
        Some(rows) => {
            out.push_str("quarantined rows:\n");
            quarantined_rows(&mut out, rows);
        }
    }
    out
}

fn render_session(out: &mut String, s: &SessionView) {
    session_header(
        out,
        &s.session_id,
        s.turn.as_str(),
        s.wake_capable,
        s.parent_child_id.as_deref(),
    );
    counts_line(out, &s.counts, "");
    let shown = s.calls.len() as u64;
    let before = s.calls_total.saturating_sub(s.calls_more).saturating_sub(shown);
    if s.calls_total == 0 {
        out.push_str("  no calls\n");
    } else if shown < s.calls_total {
        let _ = writeln!(
            out,
            "  calls {}-{} of {} (by set)",
            before + 1,
            before + shown,
            s.calls_total
        );
    }
    for call in &s.calls {
        render_call(out, call);
    }
    if let Some(next) = &s.calls_next {
        let _ = writeln!(
            out,
            "  … {} more calls: add --after {} to see the next ones (--limit N shows N at a time)",
            s.calls_more,
            printable(next)
        );
    }
    if !s.claims.is_empty() {
        out.push_str("  live claims:\n");
        claims(out, &s.claims);
    }
}

/// How long ago `ms` was, coarsely (`42s`, `5m`, `3h`, `2d`).
fn age(ms: u64) -> String {
    let secs = brood_actors::model::now_ms().saturating_sub(ms) / 1000;
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn render_call(out: &mut String, call: &CallView) {
    let _ = writeln!(
        out,
        "  call {}  set {}  mode {}  age {}",
        printable(&call.call_id),
        call.set,
        call.mode.as_str(),
        age(call.created_at)
    );
    let units = call
        .units
        .iter()
        .map(|u| {
            let tasks: Vec<String> = u.tasks.iter().map(u32::to_string).collect();
            vec![
                u.unit_id.clone(),
                u.group.clone().unwrap_or_else(|| "-".into()),
                tasks.join(","),
            ]
        })
        .collect();
    columns(out, "    ", &["UNIT", "GROUP", "TASKS"], units);
    let children = call
        .children
        .iter()
        .map(|c| {
            vec![
                c.child_id.clone(),
                c.task_index.to_string(),
                clip(&c.goal, GOAL_WIDTH),
                c.status.as_str().to_string(),
                time(c.started_at),
                time(c.finished_at),
                c.delivery.map_or("-", |d| d.as_str()).to_string(),
                c.delivery_attempt.map_or("-".to_string(), |a| a.to_string()),
                c.summary.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    columns(
        out,
        "    ",
        &[
            "CHILD", "TASK", "GOAL", "STATUS", "STARTED", "FINISHED", "DELIVERY", "ATTEMPT", "SUMMARY",
        ],
        children,
    );
}

/// Writes `rows` under `headers`, each column as wide as its widest cell, the last one unpadded;
/// every cell [`printable`].
fn columns(out: &mut String, indent: &str, headers: &[&str], rows: Vec<Vec<String>>) {
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|row| {
            row.into_iter()
                .map(|cell| match printable(&cell) {
                    std::borrow::Cow::Borrowed(_) => cell,
                    std::borrow::Cow::Owned(shown) => shown,
                })
                .collect()
        })
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let header: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::from(indent);
        for (i, (cell, w)) in row.iter().zip(&widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

/// A time in ms since the epoch as `YYYY-MM-DD hh:mm:ss.mmm` UTC; `-` for none.
fn time(ms: Option<u64>) -> String {
    let Some(ms) = ms else {
        return "-".into();
    };
    let (secs, milli) = (ms / 1000, ms % 1000);
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{milli:03}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// The proleptic Gregorian date of a count of days since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for days on or after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_turns_modes_statuses_kinds_and_deliveries_as_the_json_does() {
        use brood_server::api::{ChildStatus, Delivery, ItemKind, Mode, Turn};
        fn json<T: serde::Serialize>(value: T) -> serde_json::Value {
            serde_json::to_value(value).expect("a wire enum serializes")
        }
        for t in [Turn::Idle, Turn::Busy] {
            assert_eq!(json(t), t.as_str());
        }
        for m in [Mode::Background, Mode::Sync] {
            assert_eq!(json(m), m.as_str());
        }
        for s in brood::ChildStatus::ALL.map(ChildStatus::from) {
            assert_eq!(json(s), s.as_str());
        }
        for k in [ItemKind::Result, ItemKind::FailureNotice] {
            assert_eq!(json(k), k.as_str());
        }
        for d in [Delivery::Undelivered, Delivery::Delivered, Delivery::DeadLetter] {
            assert_eq!(json(d), d.as_str());
        }
    }

    #[test]
    fn times_read_as_utc_dates() {
        assert_eq!(time(None), "-");
        assert_eq!(time(Some(0)), "1970-01-01 00:00:00.000");
        // 2000-02-29 is a leap day; 2024-12-31 23:59:59.999 the last moment of a year.
        assert_eq!(time(Some(951_782_400_000)), "2000-02-29 00:00:00.000");
        assert_eq!(time(Some(1_735_689_599_999)), "2024-12-31 23:59:59.999");
    }

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let mut out = String::new();
        columns(
            &mut out,
            "  ",
            &["A", "BB", "C"],
            vec![vec!["long-cell".into(), "x".into(), "last".into()]],
        );
        assert_eq!(out, "  A          BB  C\n  long-cell  x   last\n");
    }

    #[test]
    fn a_long_goal_is_cut_to_its_width_with_an_ellipsis_after_escaping() {
        assert_eq!(clip("", 5), "-");
        assert_eq!(clip("abcde", 5), "abcde");
        assert_eq!(clip("abcdef", 5), "abcd…");
        assert_eq!(clip("\x1b[2J", 40), "\\u{1b}[2J");
        assert_eq!(clip("é\rxyz", 4), "é\\r…");
    }

    #[test]
    fn cells_show_control_characters_escaped() {
        let mut out = String::new();
        columns(&mut out, "", &["A", "B"], vec![vec!["x\ry".into(), "\x1b[2Jz".into()]]);
        assert_eq!(out, "A     B\nx\\ry  \\u{1b}[2Jz\n");
    }
}
