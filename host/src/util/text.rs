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

/// Whether `text` is a SHA-256 as Caravan names runner builds: 64 lowercase hex digits.
pub fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

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
/// the C1 controls (U+0080 to U+009F; some terminals read U+009B as CSI), and the
/// bidirectional controls, which reorder what follows them on screen (U+202E makes
/// `txt.exe` read as `exe.txt`).
fn is_control(c: char) -> bool {
    (c.is_control() && c != '\t') || is_bidi_control(c)
}

/// Unicode's explicit bidirectional formatting characters (UAX #9).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `json`, a JSON text, with the characters [`escape_controls`] escapes that JSON leaves raw
/// (DEL, the C1 controls, the bidirectional controls) written as `\uXXXX` escapes: any JSON
/// reader gets the same text back, and a terminal shows it inert. JSON escapes the C0
/// controls itself, and these characters can only occur inside its strings.
pub fn escape_json_controls(json: &str) -> Cow<'_, str> {
    // Not the C0 controls: inside strings JSON has escaped them already, and outside them
    // they are the document's own whitespace (the newline ending each log line).
    let left_raw_by_json = |c: char| (c.is_control() && !c.is_ascii_control()) || c == '\u{7f}';
    let needs_escape = |c: char| left_raw_by_json(c) || is_bidi_control(c);
    // Every character to escape is DEL or beyond ASCII: most lines are settled by a byte scan.
    if json.bytes().all(|b| b < 0x7f) || !json.chars().any(needs_escape) {
        return Cow::Borrowed(json);
    }
    let mut escaped = String::with_capacity(json.len() + 12);
    for c in json.chars() {
        if needs_escape(c) {
            let _ = write!(escaped, "\\u{:04x}", u32::from(c));
        } else {
            escaped.push(c);
        }
    }
    Cow::Owned(escaped)
}

/// `text` with every control character but tab, and every bidirectional control, written as
/// an escape: `\n`, `\r`, and `\u{1b}` for the rest. Backslashes are left as they are: a guest that writes a literal
/// `\n` gets the same two characters, which start no line. Plain text comes back borrowed.
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    let plain_ascii = |b: u8| (b' '..0x7f).contains(&b) || b == b'\t';
    if text.bytes().all(plain_ascii) || !text.chars().any(is_control) {
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
        assert_eq!(escape_controls("cod\u{202e}txt.exe"), "cod\\u{202e}txt.exe");
    }

    #[test]
    fn json_keeps_its_text_and_loses_what_a_terminal_would_act_on() {
        let value = serde_json::json!({ "m": "a\u{7f}\u{9b}2J\u{202e}b\n\u{1b}é" });
        let json = value.to_string();
        let escaped = escape_json_controls(&json);
        assert_eq!(escaped, r#"{"m":"a\u007f\u009b2J\u202eb\n\u001bé"}"#);
        let back: serde_json::Value = serde_json::from_str(&escaped).unwrap();
        assert_eq!(back, value, "the same text to a JSON reader");
        let lines = format!("{json}\n{json}\n");
        assert_eq!(escape_json_controls(&lines).matches('\n').count(), 2);
        assert!(matches!(
            escape_json_controls(r#"{"a":1}"#),
            Cow::Borrowed(_)
        ));
    }
}
