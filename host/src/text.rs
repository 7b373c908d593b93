//! Text that came from a guest, made safe to keep and to show.
//!
//! Two steps, applied at two moments:
//! - [`cut`], before a guest's string is stored or logged: at most a limit of bytes, on a
//!   character boundary, with a marker saying how much was cut, so a runner can neither grow
//!   the state DB nor the log without bound.
//! - [`escape_controls`], where text becomes a line for people: the agent's text log, alloc
//!   log files, and every CLI table or status. A newline inside a guest's string would start
//!   a line indistinguishable from the host's own, and ESC, OSC, BEL or CR would drive the
//!   operator's terminal; escaped, one guest string is one line of inert text. Stored values
//!   and the JSON log keep the text as it was (JSON escapes C0 controls itself; DEL and C1
//!   pass through it raw).
//!
//! A leaf: it knows nothing of allocs or guests.

use std::borrow::Cow;
use std::fmt::Write as _;

/// `text` cut to at most `max_bytes` bytes (on a character boundary), followed by
/// ` [truncated N bytes]` when anything was cut. The marker is not counted in `max_bytes`.
pub fn cut(text: &str, max_bytes: usize) -> Cow<'_, str> {
    if text.len() <= max_bytes {
        return Cow::Borrowed(text);
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!(
        "{} [truncated {} bytes]",
        &text[..end],
        text.len() - end
    ))
}

/// [`cut`], in place.
pub fn cut_in_place(text: &mut String, max_bytes: usize) {
    if let Cow::Owned(shorter) = cut(text, max_bytes) {
        *text = shorter;
    }
}

/// True for characters that must not reach a terminal as they are: C0 controls but tab, DEL,
/// and the C1 controls (U+0080 to U+009F; some terminals read U+009B as CSI).
fn is_control(c: char) -> bool {
    (c.is_control() && c != '\t') || c == '\u{7f}'
}

/// `text` with every control character but tab written as an escape: `\n`, `\r`, and
/// `\u{1b}` for the rest. Backslashes are left as they are: a guest that writes a literal
/// `\n` gets the same two characters, which start no line. Plain text comes back borrowed.
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_control) {
        return Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => escaped.push_str("\\n"),
            '\r' => escaped.push_str("\\r"),
            c if is_control(c) => {
                let _ = write!(escaped, "\\u{{{:x}}}", u32::from(c));
            }
            c => escaped.push(c),
        }
    }
    Cow::Owned(escaped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cutting_keeps_whole_characters_and_says_how_much_went() {
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("abcdef", 4), "abcd [truncated 2 bytes]");
        // "é" is two bytes: a cut inside it moves back to its start.
        assert_eq!(cut("aé", 2), "a [truncated 2 bytes]");
        let mut text = "x".repeat(5000);
        cut_in_place(&mut text, 1024);
        assert!(text.starts_with(&"x".repeat(1024)));
        assert!(text.ends_with(" [truncated 3976 bytes]"));
    }

    #[test]
    fn controls_are_escaped_so_one_string_is_one_inert_line() {
        assert_eq!(escape_controls("plain\ttext é"), "plain\ttext é");
        assert!(matches!(escape_controls("plain"), Cow::Borrowed(_)));
        assert_eq!(
            escape_controls("msg\n2026-01-01T00:00:00Z  INFO forged"),
            "msg\\n2026-01-01T00:00:00Z  INFO forged"
        );
        assert_eq!(
            escape_controls("\u{1b}[2J\u{1b}]0;title\u{7}\rover\u{9b}"),
            "\\u{1b}[2J\\u{1b}]0;title\\u{7}\\rover\\u{9b}"
        );
        assert_eq!(escape_controls("\u{7f}"), "\\u{7f}");
    }
}
