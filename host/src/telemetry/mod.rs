//! The process's one tracing subscriber: every line, host or guest, in the same format.
//! Set up once, by the CLI; library code only emits events, never installs a subscriber.
//! Lines reach stderr through `stderr_writer`, off the thread that logs; the CLI calls
//! [`flush`] before the process exits, and a panic before its message is printed.

mod json_line;
mod stderr_writer;

pub use stderr_writer::flush;
use stderr_writer::{Escaping, StderrWriter};

use std::fmt;
use std::io::IsTerminal;
use tracing::field::{Field, Visit};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::{MakeVisitor, VisitFmt, VisitOutput};
use tracing_subscriber::fmt::format::Writer;

/// Text-log fields with control characters escaped (see [`crate::text::escape_controls`]):
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
/// logs bench).
struct EscapedTextVisitor<'writer> {
    writer: Writer<'writer>,
    /// The fields other than the message, written after it.
    fields: String,
    wrote_message: bool,
    result: fmt::Result,
}

impl EscapedTextVisitor<'_> {
    fn write(&mut self, field: &Field, rendered: &str) {
        let rendered = crate::text::escape_controls(rendered);
        if field.name() == "message" {
            if self.result.is_ok() {
                self.result = self.writer.write_str(&rendered);
            }
            self.wrote_message = true;
        } else {
            if !self.fields.is_empty() {
                self.fields.push(' ');
            }
            self.fields.push_str(field.name());
            self.fields.push('=');
            self.fields.push_str(&rendered);
        }
    }
}

impl Visit for EscapedTextVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        // A guest's line is its record's message as a string: unquoted, as format
        // arguments would be.
        if field.name() == "message" {
            self.write(field, value);
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.write(field, &format!("{value:?}"));
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
    let filter = EnvFilter::try_new(level)
        .map_err(|e| anyhow::anyhow!("invalid --log-level {level:?}: {e}"))?;
    let escaping = if json {
        Escaping::JsonControls
    } else {
        Escaping::None
    };
    let writer = StderrWriter::global(escaping)
        .map_err(|e| anyhow::anyhow!("cannot start the log writer thread: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal());
    let installed = if json {
        builder
            .with_writer(move || writer.clone())
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(json_line::JsonLine)
            .try_init()
    } else {
        builder
            .with_writer(move || writer.clone())
            .fmt_fields(escaped_text_fields())
            .try_init()
    };
    installed.map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))?;
    // A panic's message goes straight to stderr: the lines logged before it go first.
    let print_panic = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        flush();
        print_panic(info);
    }));
    Ok(())
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
                "alloc{alloc_id=\"a-1\" runner=m.wasm runner=\"n.wasm\"}: inside",
            ],
            "{text}"
        );
    }
}
