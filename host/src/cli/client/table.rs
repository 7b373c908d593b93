//! How the client commands print the API's answers for people: padded tables, Nomad's
//! columns for jobs and allocs.
//!
//! Printing only: it never sends a request.

use serde_json::Value;

/// Prints rows as a table with a header, columns padded to fit.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            row.iter()
                .map(|cell| crate::util::text::escape_controls(cell).into_owned())
                .collect()
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in &rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// A JSON value as a table cell: strings bare (control characters escaped: a cell is one
/// line of inert text whatever a runner reported), `null` as `-`.
pub fn text(value: &Value) -> String {
    match value {
        Value::String(s) => crate::util::text::escape_controls(s).into_owned(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// An id cut to its first 8 characters, as tables show ids.
pub fn short(id: &Value) -> String {
    text(id).chars().take(8).collect()
}

/// Prints allocs as Nomad's `job status` does.
pub fn print_allocs(allocs: &Value) {
    let rows: Vec<Vec<String>> = allocs
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            vec![
                short(&a["id"]),
                text(&a["job_id"]),
                text(&a["node_id"]),
                text(&a["desired_status"]),
                text(&a["client_status"]),
                text(&a["description"]),
            ]
        })
        .collect();
    print_table(
        &["ID", "Job", "Node", "Desired", "Status", "Description"],
        &rows,
    );
}

/// Prints jobs as a table.
pub fn print_jobs(jobs: &Value) {
    let rows: Vec<Vec<String>> = jobs
        .as_array()
        .into_iter()
        .flatten()
        .map(|j| {
            let allocs = j["allocs"].as_object().map(|m| {
                m.iter()
                    .map(|(status, n)| format!("{status}={n}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            });
            vec![
                text(&j["id"]),
                text(&j["type"]),
                text(&j["count"]),
                text(&j["status"]),
                allocs.unwrap_or_default(),
                text(&j["namespace"]),
            ]
        })
        .collect();
    print_table(
        &["ID", "Type", "Count", "Status", "Allocs", "Namespace"],
        &rows,
    );
}
