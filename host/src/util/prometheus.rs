//! The one writer of Prometheus' text exposition format (0.0.4) that `/v1/metrics` is made
//! of: a family's `HELP` and `TYPE` lines, then its samples, label values escaped as the
//! format asks (`\`, `"` and line breaks), so a value that came from a guest or a config
//! (a reason, a status) can never break a line or forge another sample. Each room renders
//! its own families with it, next to its counters.

use std::fmt::{Display, Write};

/// A family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Cumulative buckets, a sum and a count.
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Writes a family's `HELP` and `TYPE` lines.
pub fn header(out: &mut String, name: &str, kind: Kind, help: &str) {
    let help = help.replace('\\', "\\\\").replace('\n', "\\n");
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {}", kind.as_str());
}

/// Writes one sample, `name{label="value",...} value`.
pub fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: impl Display) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (label, value)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(label);
            out.push_str("=\"");
            escape_label_value(out, value);
            out.push('"');
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

/// A family of one unlabelled sample.
pub fn single(out: &mut String, name: &str, kind: Kind, help: &str, value: impl Display) {
    header(out, name, kind, help);
    sample(out, name, &[], value);
}

fn escape_label_value(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_family_has_its_help_type_and_samples() {
        let mut out = String::new();
        header(&mut out, "caravan_x_total", Kind::Counter, "Things.\nMore.");
        sample(&mut out, "caravan_x_total", &[("reason", "a")], 3);
        sample(&mut out, "caravan_x_total", &[], 4);
        assert_eq!(
            out,
            "# HELP caravan_x_total Things.\\nMore.\n# TYPE caravan_x_total counter\n\
             caravan_x_total{reason=\"a\"} 3\ncaravan_x_total 4\n"
        );
    }

    #[test]
    fn a_label_value_cannot_break_its_line_or_forge_a_sample() {
        let mut out = String::new();
        let hostile = "x\"} 1\ncaravan_forged 9\\";
        sample(&mut out, "caravan_y", &[("status", hostile), ("b", "c")], 1);
        assert_eq!(out.lines().count(), 1, "{out}");
        assert_eq!(
            out,
            "caravan_y{status=\"x\\\"} 1\\ncaravan_forged 9\\\\\",b=\"c\"} 1\n"
        );
    }
}
