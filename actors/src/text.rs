//! Text given by users (a child's summary, a goal, a consumer name, a stored key) shown to
//! people: [`printable`] escapes what a terminal would act on instead of show. It owns only
//! that; JSON output needs none of it (serde escapes control characters already).

use std::borrow::Cow;
use std::fmt::Write as _;

/// `text` with every character a terminal would act on escaped, the rest unchanged: `\r`,
/// `\n` and `\t` as those two characters, any other control character (C0, DEL, C1) and the
/// bidirectional overrides and isolates (which reorder what follows them) as `\u{…}`. Plain
/// text comes back borrowed, uncopied.
///
/// ```
/// use brood_actors::text::printable;
///
/// assert_eq!(printable("ok\x1b[2J\rdone"), "ok\\u{1b}[2J\\rdone");
/// assert!(matches!(printable("plain — text"), std::borrow::Cow::Borrowed(_)));
/// ```
pub fn printable(text: &str) -> Cow<'_, str> {
    let Some(first) = text.find(needs_escape) else {
        return Cow::Borrowed(text);
    };
    let mut out = String::with_capacity(text.len() + 8);
    out.push_str(&text[..first]);
    for c in text[first..].chars() {
        match c {
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// A control character, or a bidirectional override or isolate.
fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_shown_escaped_and_plain_text_is_not_copied() {
        assert_eq!(printable("a\x1b[2J\rb"), "a\\u{1b}[2J\\rb");
        assert_eq!(printable("line\nnext\tcol"), "line\\nnext\\tcol");
        assert_eq!(printable("\x07\x08\x7f\u{9b}"), "\\u{7}\\u{8}\\u{7f}\\u{9b}");
        assert_eq!(
            printable("abc\u{202e}cba"),
            "abc\\u{202e}cba",
            "a right-to-left override"
        );
        for plain in ["", "plain text", "ünïcödé — 日本語 ✓", "back\\slash"] {
            assert!(matches!(printable(plain), Cow::Borrowed(p) if p == plain), "{plain}");
        }
    }
}
