//! The agent's JSON log line, written straight into the line's buffer: one object per event
//! with `timestamp` (RFC 3339, microseconds, UTC), `level`, `fields`, `target` and `span`
//! (the current span's fields and its `name`), the shape tracing's own JSON formatter gives.
//!
//! Why not that formatter: every guest record passes here, on the guest's thread, and that
//! one re-parses the span's fields from JSON for each event, goes through serde for each
//! string and formats the clock from scratch; this writes the span's stored JSON as it is,
//! escapes in place and formats the date once a second ([`crate::util::timestamp`]). It only formats: escaping of what
//! JSON leaves raw (DEL, C1, bidirectional controls) is the writer's, and filtering is the
//! subscriber's.

use crate::util::timestamp::Fraction;
use std::cell::RefCell;
use std::fmt::{self, Write};
use std::time::SystemTime;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_log::NormalizeEvent;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// Formats events as JSON lines; used with [`JsonFields`], which stores each span's fields
/// as a JSON object.
pub struct JsonLine;

/// A thread's line buffer grows to its longest line; past this it is let go after the line.
const LINE_CAPACITY_KEPT: usize = 64 * 1024;

thread_local! {
    /// The line being formatted on this thread. It is written with plain `String` pushes and
    /// handed to the subscriber's writer in one call: each write to that writer is a dynamic
    /// call, and a line is some twenty writes.
    static LINE: RefCell<String> = const { RefCell::new(String::new()) };
}

impl<S> FormatEvent<S, JsonFields> for JsonLine
where
    S: Subscriber + for<'lookup> LookupSpan<'lookup>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        LINE.with(|line| match line.try_borrow_mut() {
            Ok(mut line) => {
                line.clear();
                let written =
                    write_line(&mut line, ctx, event).and_then(|()| writer.write_str(&line));
                if line.capacity() > LINE_CAPACITY_KEPT {
                    *line = String::new();
                }
                written
            }
            // An event logged while this thread formats another (by a field's `Debug`).
            Err(_) => {
                let mut line = String::new();
                write_line(&mut line, ctx, event)?;
                writer.write_str(&line)
            }
        })
    }
}

/// Writes `event` as one JSON line. Fails only when one of its fields' `Debug` or `Display`
/// does.
fn write_line<S>(
    line: &mut String,
    ctx: &FmtContext<'_, S, JsonFields>,
    event: &Event<'_>,
) -> fmt::Result
where
    S: Subscriber + for<'lookup> LookupSpan<'lookup>,
{
    // A `log` crate record (wasmtime's, say) arrives as an event of target `log`; its own
    // target and level are in its fields, as tracing's formatter shows them.
    let normalized = event.normalized_metadata();
    let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
    line.push_str("{\"timestamp\":\"");
    crate::util::timestamp::write_utc(line, SystemTime::now(), Fraction::Micros)?;
    line.push_str("\",\"level\":\"");
    line.push_str(meta.level().as_str());
    line.push_str("\",\"fields\":{");
    let mut fields = FieldsVisitor {
        line,
        first: true,
        result: Ok(()),
    };
    event.record(&mut fields);
    fields.result?;
    line.push_str("},\"target\":");
    write_json_str(line, meta.target())?;
    if let Some(span) = ctx.parent_span() {
        let extensions = span.extensions();
        let stored = extensions
            .get::<FormattedFields<JsonFields>>()
            .map(|fields| fields.fields.as_str())
            .unwrap_or("{}");
        // `{"a":1,"b":2}` as `"a":1,"b":2`: the span's fields are already a JSON object.
        let inner = stored
            .strip_prefix('{')
            .and_then(|rest| rest.strip_suffix('}'))
            .unwrap_or("")
            .trim();
        line.push_str(",\"span\":{");
        if !inner.is_empty() {
            line.push_str(inner);
            line.push(',');
        }
        line.push_str("\"name\":");
        write_json_str(line, span.name())?;
        line.push('}');
    }
    line.push_str("}\n");
    Ok(())
}

/// Writes an event's fields as `"name":value` pairs.
struct FieldsVisitor<'a> {
    line: &'a mut String,
    first: bool,
    result: fmt::Result,
}

impl FieldsVisitor<'_> {
    fn entry(&mut self, field: &Field, value: impl FnOnce(&mut String) -> fmt::Result) {
        if self.result.is_err() {
            return;
        }
        let separator = if std::mem::take(&mut self.first) {
            ""
        } else {
            ","
        };
        self.line.push_str(separator);
        self.result = write_json_str(self.line, field.name()).and_then(|()| {
            self.line.push(':');
            value(self.line)
        });
    }
}

impl Visit for FieldsVisitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.entry(field, |w| {
            w.write_char('"')?;
            write!(JsonEscaped(w), "{value:?}")?;
            w.write_char('"')
        });
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.entry(field, |w| write_json_str(w, value));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.entry(field, |w| {
            w.write_char('"')?;
            write!(JsonEscaped(w), "{value}")?;
            w.write_char('"')
        });
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.entry(field, |w| write!(w, "{value}"));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.entry(field, |w| write!(w, "{value}"));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.entry(field, |w| write!(w, "{value}"));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // As serde_json writes it (`1.0`, not `1`); JSON has no NaN or infinity: `null`.
        self.entry(field, |w| match serde_json::Number::from_f64(value) {
            Some(number) => write!(w, "{number}"),
            None => w.write_str("null"),
        });
    }
}

/// `text` as a JSON string, quotes included.
fn write_json_str(w: &mut impl Write, text: &str) -> fmt::Result {
    w.write_char('"')?;
    JsonEscaped(w).write_str(text)?;
    w.write_char('"')
}

/// Writes what it is given as the inside of a JSON string: quote, backslash and the C0
/// controls escaped, everything else as it is.
struct JsonEscaped<'a, W: Write>(&'a mut W);

impl<W: Write> Write for JsonEscaped<'_, W> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        if !needs_escape(text) {
            return self.0.write_str(text);
        }
        let mut plain_from = 0;
        for (at, byte) in text.bytes().enumerate() {
            let escape = match byte {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0..0x20 => "",
                _ => continue,
            };
            // Every byte escaped here is ASCII, so `at` is on a character boundary.
            self.0.write_str(&text[plain_from..at])?;
            if escape.is_empty() {
                write!(self.0, "\\u{byte:04x}")?;
            } else {
                self.0.write_str(escape)?;
            }
            plain_from = at + 1;
        }
        self.0.write_str(&text[plain_from..])
    }
}

/// Whether any byte of `text` is one JSON needs escaped. Most lines have none, and this
/// looks at sixteen bytes at a time without a branch among them, which compiles to vector
/// compares.
fn needs_escape(text: &str) -> bool {
    let escaped = |byte: u8| byte < 0x20 || byte == b'"' || byte == b'\\';
    let mut chunks = text.as_bytes().chunks_exact(16);
    chunks.any(|chunk| chunk.iter().fold(false, |any, &byte| any | escaped(byte)))
        || chunks.remainder().iter().any(|&byte| escaped(byte))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::tests::Captured;

    #[test]
    fn strings_escape_what_json_requires() {
        let mut text = String::new();
        write_json_str(&mut text, "a\"b\\c\nd\re\tf\u{1}g\u{1b}[2Jé\u{202e}").unwrap();
        assert_eq!(
            text,
            "\"a\\\"b\\\\c\\nd\\re\\tf\\u0001g\\u001b[2Jé\u{202e}\""
        );
        let back: String = serde_json::from_str(&text).unwrap();
        assert_eq!(back, "a\"b\\c\nd\re\tf\u{1}g\u{1b}[2Jé\u{202e}");
        // Past the first sixteen bytes, and in the last ones.
        for at in [0, 15, 16, 31, 32, 39] {
            let mut plain = "x".repeat(40);
            plain.replace_range(at..=at, "\"");
            text.clear();
            write_json_str(&mut text, &plain).unwrap();
            assert_eq!(text.matches("\\\"").count(), 1, "{at}: {text}");
            assert_eq!(serde_json::from_str::<String>(&text).unwrap(), plain);
        }
        text.clear();
        write_json_str(&mut text, &"y".repeat(40)).unwrap();
        assert_eq!(text, format!("\"{}\"", "y".repeat(40)));
    }

    /// The lines a subscriber wrote, through `install`'s formatter, for the same events.
    fn lines_from(
        install: impl FnOnce(
            tracing_subscriber::fmt::SubscriberBuilder<
                JsonFields,
                tracing_subscriber::fmt::format::Format<tracing_subscriber::fmt::format::Json>,
                tracing_subscriber::filter::LevelFilter,
                Captured,
            >,
        ) -> Box<dyn Subscriber + Send + Sync>,
    ) -> Vec<serde_json::Value> {
        let captured = Captured::default();
        let builder = tracing_subscriber::fmt()
            .json()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(captured.clone());
        tracing::subscriber::with_default(install(builder), || {
            tracing::warn!(count = 3_u64, ratio = 0.5, ok = true, "outside any span");
            let span = tracing::info_span!("alloc", alloc_id = "a-1", job = "web \"x\"");
            let _in = span.enter();
            tracing::info!(target: "caravan::guest", context = "ctx", "line\twith \"quotes\"");
            // A guest's record: its message is a string field, not format arguments.
            let message = "guest\nline";
            tracing::info!(target: "caravan::guest", stream = "stdout", message);
            let error = std::io::Error::other("disk full");
            tracing::error!(
                error = &error as &dyn std::error::Error,
                delta = -2_i64,
                whole = 1.0,
                "failed"
            );
            // A `log` crate record, as wasmtime's arrive.
            tracing_log::format_trace(
                &tracing_log::log::Record::builder()
                    .args(format_args!("from the log crate"))
                    .level(tracing_log::log::Level::Warn)
                    .target("cranelift_codegen::timing")
                    .module_path_static(Some("cranelift_codegen::timing"))
                    .file_static(Some("timing.rs"))
                    .line(Some(7))
                    .build(),
            )
            .unwrap();
        });
        let bytes = captured.0.lock().unwrap().clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(|line| {
                let mut value: serde_json::Value = serde_json::from_str(line).unwrap();
                value.as_object_mut().unwrap().remove("timestamp");
                value
            })
            .collect()
    }

    #[test]
    fn lines_say_what_tracings_own_json_formatter_says() {
        let ours = lines_from(|builder| Box::new(builder.event_format(JsonLine).finish()));
        let theirs = lines_from(|builder| {
            Box::new(
                builder
                    .with_current_span(true)
                    .with_span_list(false)
                    .finish(),
            )
        });
        assert_eq!(ours.len(), 5);
        assert_eq!(ours[2]["fields"]["message"], "guest\nline", "{:?}", ours[2]);
        assert_eq!(
            ours[4]["target"], "cranelift_codegen::timing",
            "{:?}",
            ours[4]
        );
        assert_eq!(ours, theirs);
    }
}
