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
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let installed = if json {
        builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init()
    } else {
        builder.fmt_fields(escaped_text_fields()).try_init()
    };
    installed.map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))
}
