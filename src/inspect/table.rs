//! An [`Inspection`] as text for people: a block per session (its counts on one line, then each
//! call's units and children as aligned columns), then the dead letters and the quarantined
//! rows. Times are UTC; a value a source does not know is `-`. Text from users or the ledger
//! (ids, summaries, reasons, keys) is shown [`printable`]: a summary holding a terminal escape
//! or a carriage return cannot clear the screen or rewrite rows.

use std::fmt::Write as _;

use super::{Inspection, SessionView, Source};
use brood::printable;
use brood_server::api::CallView;

/// Renders an inspection as aligned tables.
pub fn render(inspection: &Inspection) -> String {
    let mut out = String::new();
    let source = match inspection.source {
        Source::Server => "server",
        Source::DataDir => "data dir (turn, wake_capable and counts as a server opening it would start)",
    };
    let _ = writeln!(out, "source: {source}");
    if inspection.sessions.is_empty() {
        out.push_str("no sessions\n");
    }
    for session in &inspection.sessions {
        out.push('\n');
        render_session(&mut out, session);
    }
    out.push('\n');
    if inspection.dead_letters.is_empty() {
        out.push_str("dead letters: none\n");
    } else {
        out.push_str("dead letters:\n");
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
            let rows = rows
                .iter()
                .map(|q| {
                    let at = q
                        .quarantined_at
                        .map_or("at the next open".to_string(), |t| time(Some(t)));
                    vec![q.tree.clone(), q.key.clone(), at, q.reason.clone()]
                })
                .collect();
            columns(&mut out, "  ", &["TREE", "KEY", "QUARANTINED", "REASON"], rows);
        }
    }
    out
}

fn render_session(out: &mut String, s: &SessionView) {
    let c = &s.counts;
    let _ = writeln!(
        out,
        "session {}  turn {}  wake_capable {}",
        printable(&s.session_id),
        s.turn.as_str(),
        s.wake_capable
    );
    let _ = writeln!(
        out,
        "  queued {}  running {}  ready {}  backing_off {}  claimed {}  delivered {}",
        c.queued, c.running, c.ready, c.backing_off, c.claimed, c.delivered
    );
    if let Some(parent) = &s.parent_child_id {
        let _ = writeln!(out, "  nested: the session of child {}", printable(parent));
    }
    if s.calls.is_empty() {
        out.push_str("  no calls\n");
    }
    for call in &s.calls {
        render_call(out, call);
    }
    if !s.claims.is_empty() {
        out.push_str("  live claims:\n");
        let rows = s
            .claims
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
            "CHILD", "TASK", "STATUS", "STARTED", "FINISHED", "DELIVERY", "ATTEMPT", "SUMMARY",
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
    fn cells_show_control_characters_escaped() {
        let mut out = String::new();
        columns(&mut out, "", &["A", "B"], vec![vec!["x\ry".into(), "\x1b[2Jz".into()]]);
        assert_eq!(out, "A     B\nx\\ry  \\u{1b}[2Jz\n");
    }
}
