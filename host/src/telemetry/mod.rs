//! The process's one tracing subscriber: every line, host or guest, in the same format.
//! Set up once, by the CLI (a bench or an embedder: [`init_with_writer`], with a writer of
//! its own); library code only emits events, never installs a subscriber.
//! Lines reach stderr through `stderr_writer`, off the thread that logs; the CLI calls
//! [`flush`] before the process exits, and a panic before its message is printed.

mod json_line;
pub mod otlp;
mod stderr_writer;

pub use otlp::OtlpSettings;
pub use stderr_writer::flush;
use stderr_writer::{Escaping, StderrWriter};

use std::fmt;
use std::io::IsTerminal;
use tracing::field::{Field, Visit};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::{MakeVisitor, VisitFmt, VisitOutput};
use tracing_subscriber::fmt::format::Writer;

/// Text-log fields with control characters escaped (see [`crate::util::text::escape_controls`]):
/// a guest's newline cannot start a line that looks like the host's, nor its ESC reach the
/// operator's terminal, whichever field (message, context, description) carries it.
fn escaped_text_fields() -> impl for<'writer> tracing_subscriber::fmt::FormatFields<'writer> {
    EscapedTextFields
}

/// Makes an [`EscapedTextVisitor`] for each event and span.
struct EscapedTextFields;

impl<'writer> MakeVisitor<Writer<'writer>> for EscapedTextFields {
    type Visitor = EscapedTextVisitor<'writer>;

    fn make_visitor(&self, writer: Writer<'writer>) -> Self::Visitor {
        EscapedTextVisitor {
            writer,
            fields: String::new(),
            wrote_message: false,
            result: Ok(()),
        }
    }
}

/// Writes the message as it is and then every other field as `name=value`, in `Debug` form
/// (a string quoted), space-separated as tracing's own text formatter does, with control
/// characters escaped. The message comes first whatever the event's field order: a guest's
/// record names its message last, which the JSON line writes faster (measured with the
/// logs bench). Values are rendered straight into the line or the fields, never into a
/// string of their own: every alloc's span and every line pays for this formatting.
struct EscapedTextVisitor<'writer> {
    writer: Writer<'writer>,
    /// The fields other than the message, written after it.
    fields: String,
    wrote_message: bool,
    result: fmt::Result,
}

impl EscapedTextVisitor<'_> {
    /// Writes the message with `render`, or starts the next `name=` in `fields` and
    /// renders the value after it.
    ///
    /// A value whose `Debug` fails fails the line, as in tracing's own formatter (the
    /// subscriber writes a notice in its place); the fields after it are not rendered.
    fn write(&mut self, field: &Field, render: impl FnOnce(&mut dyn fmt::Write) -> fmt::Result) {
        if self.result.is_err() {
            return;
        }
        if field.name() == "message" {
            self.result = render(&mut ControlsEscaped(&mut self.writer));
            self.wrote_message = true;
        } else {
            if self.fields.is_empty() {
                // Room for an alloc span's fields, or a line's few, in one allocation.
                self.fields.reserve(128);
            } else {
                self.fields.push(' ');
            }
            self.fields.push_str(field.name());
            self.fields.push('=');
            self.result = render(&mut ControlsEscaped(&mut self.fields));
        }
    }
}

impl Visit for EscapedTextVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        // A guest's line is its record's message as a string: unquoted, as format
        // arguments would be.
        if field.name() == "message" {
            self.write(field, |out| out.write_str(value));
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.write(field, |out| write!(out, "{value:?}"));
    }
}

/// A writer that passes text on with its control characters escaped, as
/// [`crate::util::text::escape_controls`] escapes them. Escaping goes character by character, so
/// escaping each piece a value is written in is the same as escaping the whole.
struct ControlsEscaped<'a, W: fmt::Write>(&'a mut W);

impl<W: fmt::Write> fmt::Write for ControlsEscaped<'_, W> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        self.0.write_str(&crate::util::text::escape_controls(text))
    }
}

impl VisitOutput<fmt::Result> for EscapedTextVisitor<'_> {
    fn finish(mut self) -> fmt::Result {
        self.result?;
        if self.fields.is_empty() {
            return Ok(());
        }
        if self.wrote_message {
            self.writer.write_str(" ")?;
        }
        self.writer.write_str(&self.fields)
    }
}

impl VisitFmt for EscapedTextVisitor<'_> {
    fn writer(&mut self) -> &mut dyn fmt::Write {
        &mut self.writer
    }
}

/// Installs the global subscriber, writing to stderr through `stderr_writer`'s thread.
///
/// `level` is a level (`info`) or a filter in `RUST_LOG` syntax (`info,caravan::guest=debug`).
/// With `json`, each line is one JSON object whose `span` holds the alloc's fields
/// (`alloc_id`, `job`, `group`, `runner`).
pub fn init(level: &str, json: bool) -> anyhow::Result<()> {
    init_exporting(level, json, None)
}

/// [`init`], and with `otlp` the agent's spans and metrics exported to a collector as well
/// ([`otlp`]); [`finish`] then sends what is left as the process ends.
pub fn init_exporting(level: &str, json: bool, otlp: Option<&OtlpSettings>) -> anyhow::Result<()> {
    let filter = level_filter(level)?;
    let escaping = if json {
        Escaping::JsonControls
    } else {
        Escaping::None
    };
    let writer = StderrWriter::global(escaping)
        .map_err(|e| anyhow::anyhow!("cannot start the log writer thread: {e}"))?;
    install(
        filter,
        json,
        std::io::stderr().is_terminal(),
        otlp,
        move || writer.clone(),
    )?;
    // A panic's message goes straight to stderr: the lines logged before it go first.
    let print_panic = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        flush();
        print_panic(info);
    }));
    Ok(())
}

/// Installs the global subscriber [`init`] installs for text lines (the same filter, fields
/// and line format, no colours), writing each line to `writer` as it is made: for an
/// embedder that keeps the lines itself, and for the benches, which must pay for the
/// agent's own formatting (`std::io::sink` as the writer) and nothing else. Text only: a
/// JSON line has some of its controls escaped by the stderr writer, which this bypasses.
pub fn init_with_writer<W>(level: &str, writer: W) -> anyhow::Result<()>
where
    W: for<'writer> tracing_subscriber::fmt::MakeWriter<'writer> + Send + Sync + 'static,
{
    install(level_filter(level)?, false, false, None, writer)
}

/// What the process does last: sends the spans and metrics not yet exported (when it
/// exports), then writes the lines not yet written.
pub fn finish() {
    otlp::shutdown();
    flush();
}

fn level_filter(level: &str) -> anyhow::Result<EnvFilter> {
    EnvFilter::try_new(level).map_err(|e| anyhow::anyhow!("invalid --log-level {level:?}: {e}"))
}

fn install<W>(
    filter: EnvFilter,
    json: bool,
    ansi: bool,
    otlp: Option<&OtlpSettings>,
    writer: W,
) -> anyhow::Result<()>
where
    W: for<'writer> tracing_subscriber::fmt::MakeWriter<'writer> + Send + Sync + 'static,
{
    use tracing_subscriber::layer::SubscriberExt;
    // A registry with layers rather than `fmt()`'s subscriber: the OTLP layer has a filter
    // of its own, which only a registry carries.
    let lines = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(writer);
    let filtered = tracing_subscriber::registry().with(filter);
    if json {
        let lines = lines
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(json_line::JsonLine);
        install_exporting(filtered.with(lines), otlp)
    } else {
        install_exporting(filtered.with(lines.fmt_fields(escaped_text_fields())), otlp)
    }
}

/// Installs `subscriber` as the process's, with the OTLP layer over it when exporting.
fn install_exporting<S>(subscriber: S, otlp: Option<&OtlpSettings>) -> anyhow::Result<()>
where
    S: tracing::Subscriber
        + for<'span> tracing_subscriber::registry::LookupSpan<'span>
        + Send
        + Sync
        + 'static,
{
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let exporting = otlp.map(otlp::start::<S>).transpose()?;
    subscriber
        .with(exporting)
        .try_init()
        .map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// What a test's subscriber wrote.
    #[derive(Clone, Default)]
    pub(in crate::telemetry) struct Captured(pub(in crate::telemetry) Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
        type Writer = Captured;

        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    #[test]
    fn text_lines_show_a_string_message_as_format_arguments_would_and_escape_controls() {
        let captured = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(captured.clone())
            .fmt_fields(escaped_text_fields())
            .without_time()
            .with_level(false)
            .with_target(false)
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            // A guest's record, as `runtime::logging` emits it: its message named last.
            let message = "task web \"started\"\nINFO forged";
            tracing::info!(stream = "stdout", message);
            tracing::info!(context = "ctx", count = 3, "from {}", "arguments");
            // Controls reach a line through `Display` and format arguments too.
            tracing::info!(reason = %"a\nb", "from {}", "\u{1b}[31m");
            let span = tracing::info_span!("alloc", alloc_id = "a-1", runner = %"m.wasm");
            span.record("runner", "n.wasm");
            let _in = span.enter();
            tracing::info!("inside");
        });
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "task web \"started\"\\nINFO forged stream=\"stdout\"",
                "from arguments context=\"ctx\" count=3",
                "from \\u{1b}[31m reason=a\\nb",
                "alloc{alloc_id=\"a-1\" runner=m.wasm runner=\"n.wasm\"}: inside",
            ],
            "{text}"
        );
    }
}
