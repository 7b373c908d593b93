//! The process's one tracing subscriber: every line, host or guest, in the same format.
//! Set up once, by the CLI; library code only emits events, never installs a subscriber.
//! Lines reach stderr through `stderr_writer`, off the thread that logs; the CLI calls
//! [`flush`] before the process exits, and a panic before its message is printed.

mod json_line;
mod stderr_writer;

pub use stderr_writer::flush;
use stderr_writer::{Escaping, StderrWriter};

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
