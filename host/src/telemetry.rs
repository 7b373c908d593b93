//! The process's one tracing subscriber: every line, host or guest, in the same format.
//! Set up once, by the CLI; library code only emits events, never installs a subscriber.

use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::MakeExt;
use tracing_subscriber::fmt::format::debug_fn;

/// Text-log fields with control characters escaped (see [`crate::text::escape_controls`]):
/// a guest's newline cannot start a line that looks like the host's, nor its ESC reach the
/// operator's terminal, whichever field (message, context, description) carries it.
fn escaped_text_fields() -> impl for<'writer> tracing_subscriber::fmt::FormatFields<'writer> {
    debug_fn(|writer, field, value| {
        let rendered = format!("{value:?}");
        let rendered = crate::text::escape_controls(&rendered);
        if field.name() == "message" {
            write!(writer, "{rendered}")
        } else {
            write!(writer, "{field}={rendered}")
        }
    })
    .delimited(" ")
}

/// Stderr for JSON log lines, with DEL, C1 and bidirectional controls escaped as JSON
/// `\uXXXX` (see [`crate::text::escape_json_controls`]). The formatter hands it whole
/// lines, so no character is split between two calls; bytes that are not UTF-8 pass as they
/// are.
struct JsonStderr;

impl std::io::Write for JsonStderr {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        // ASCII below DEL is valid UTF-8 with nothing to escape: most lines, checked at once.
        if line.iter().all(|&b| b < 0x7f) {
            std::io::stderr().write_all(line)?;
            return Ok(line.len());
        }
        match std::str::from_utf8(line) {
            Ok(text) => {
                let escaped = crate::text::escape_json_controls(text);
                std::io::stderr().write_all(escaped.as_bytes())?;
                Ok(line.len())
            }
            Err(_) => std::io::stderr().write(line),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Installs the global subscriber, writing to stderr.
///
/// `level` is a level (`info`) or a filter in `RUST_LOG` syntax (`info,caravan::guest=debug`).
/// With `json`, each line is one JSON object whose `span` holds the alloc's fields
/// (`alloc_id`, `job`, `group`, `runner`).
pub fn init(level: &str, json: bool) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(level)
        .map_err(|e| anyhow::anyhow!("invalid --log-level {level:?}: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal());
    let installed = if json {
        builder
            .with_writer(|| JsonStderr)
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init()
    } else {
        builder
            .with_writer(std::io::stderr)
            .fmt_fields(escaped_text_fields())
            .try_init()
    };
    installed.map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))
}
