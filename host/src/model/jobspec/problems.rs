//! A job file's problems all at once, in file order, each with its line and column: unknown
//! keys anywhere (with "did you mean" for a near miss), a value of the wrong type, and every
//! value the checks refuse ([`super::validate`]).
//!
//! The file is read twice: once by the TOML parser that keeps where each key is ([`DeTable`]),
//! whose keys are walked against the job file's schema ([`JOB`]), and once into the job's
//! typed form, without the unknown keys, for the values. A value's problem names its field
//! (`job.tasks[1].name`); the field is looked up in the first reading for its line.

use super::{RawDocument, SpecError, error, toml_error};
use crate::model::limits::LimitOverrides;
use toml::de::{DeTable, DeValue};

/// One problem of a job file, where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Its line, from 1 (0: the file as a whole).
    pub line: usize,
    /// Its column, from 1, in characters.
    pub column: usize,
    /// The field and what is wrong.
    pub error: SpecError,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line > 0 {
            write!(f, "line {}, column {}: ", self.line, self.column)?;
        }
        write!(f, "{}", self.error)
    }
}

/// What a key of the job file holds.
#[derive(Debug, Clone, Copy)]
enum Shape {
    /// A value (a string, a number, a list of values).
    Value,
    /// A table of these keys.
    Table(&'static [(&'static str, Shape)]),
    /// A list of tables of these keys (`[[job.tasks]]`).
    Tables(&'static [(&'static str, Shape)]),
    /// A table whose keys are these names, each a value.
    Named(&'static [&'static str]),
    /// A table of any keys (meta, a task's config, volumes, env).
    Free,
}

use Shape::{Free, Named, Table, Tables, Value};

const TASK: &[(&str, Shape)] = &[("name", Value), ("config", Free)];
const CAPABILITIES: &[(&str, Shape)] = &[("network", Value), ("volumes", Free), ("env", Free)];
const RESCHEDULE: &[(&str, Shape)] = &[
    ("attempts", Value),
    ("interval", Value),
    ("delay", Value),
    ("delay_function", Value),
    ("max_delay", Value),
    ("unlimited", Value),
];
const RESTART: &[(&str, Shape)] = &[
    ("attempts", Value),
    ("interval", Value),
    ("delay", Value),
    ("delay_function", Value),
    ("max_delay", Value),
    ("mode", Value),
];
const CONSTRAINT: &[(&str, Shape)] = &[("attribute", Value), ("operator", Value), ("value", Value)];
const DISCONNECT: &[(&str, Shape)] = &[
    ("lost_after", Value),
    ("replace", Value),
    ("reconcile", Value),
];

/// The job file's keys: what [`super::RawJob`] and the blocks it holds take (a test keeps
/// the two the same).
const JOB: &[(&str, Shape)] = &[
    ("id", Value),
    ("namespace", Value),
    ("type", Value),
    ("count", Value),
    ("runner", Value),
    ("runner_sha256", Value),
    ("limits", Named(LimitOverrides::KEYS)),
    ("tasks", Tables(TASK)),
    ("meta", Free),
    ("capabilities", Table(CAPABILITIES)),
    ("reschedule", Table(RESCHEDULE)),
    ("restart", Table(RESTART)),
    ("update", Table(&[("carry_checkpoint", Value)])),
    ("constraint", Tables(CONSTRAINT)),
    ("placement", Value),
    ("migrate", Table(&[("checkpoint", Value)])),
    ("disconnect", Table(DISCONNECT)),
];

const DOCUMENT: &[(&str, Shape)] = &[("job", Table(JOB))];

/// Every problem of the TOML job file `text`, in file order, or the job it describes.
pub fn check_toml(text: &str) -> Result<super::JobSpec, Vec<Problem>> {
    let syntax_problem = |syntax: toml::de::Error| {
        let offset = syntax.span().map_or(0, |span| span.start);
        let (line, column) = line_and_column(text, offset);
        vec![Problem {
            line,
            column,
            error: toml_error(text, &syntax),
        }]
    };
    let document = DeTable::parse(text).map_err(syntax_problem)?;
    let mut found = Vec::new();
    let mut unknown = Vec::new();
    walk(document.get_ref(), DOCUMENT, &[], &mut found, &mut unknown);
    // The values, without the unknown keys (each already a problem of its own), read from
    // TOML's own values: a detour through JSON would turn `nan` into "not set".
    let mut value = toml::from_str::<toml::Table>(text)
        .map(toml::Value::Table)
        .map_err(syntax_problem)?;
    for path in &unknown {
        remove(&mut value, path);
    }
    // A typo's unknown key already says what it meant: that key is not said missing too.
    let meant: Vec<String> = found
        .iter()
        .filter_map(|(_, _, meant)| meant.clone())
        .collect();
    let mut problems: Vec<(usize, SpecError)> = found
        .into_iter()
        .map(|(offset, e, _)| (offset, e))
        .collect();
    match serde_path_to_error::deserialize::<_, RawDocument>(value) {
        Err(typed) => {
            let field = match typed.path().to_string() {
                path if path == "." => "job".to_string(),
                path => path,
            };
            let mut message = typed.inner().message().to_string();
            let list = ["job.tasks", "job.constraint"].contains(&field.as_str());
            if list && message.contains("expected a sequence") {
                let name = field.trim_start_matches("job.");
                message.push_str(&format!(
                    "; {name} are a list: write each one under `[[job.{name}]]`, with two brackets"
                ));
            }
            if message.contains("missing field `job`") {
                message.push_str("; a job file starts with a `[job]` table");
            }
            problems.push((offset_of(document.get_ref(), &field), error(field, message)));
        }
        Ok(raw) => match super::validate::validate_all(raw.job) {
            Ok(spec) if problems.is_empty() => return Ok(spec),
            Ok(_) => {}
            Err(refused) => problems.extend(
                refused
                    .into_iter()
                    .filter(|e| !(e.message.starts_with("missing") && meant.contains(&e.field)))
                    .map(|e| (offset_of(document.get_ref(), &e.field), e)),
            ),
        },
    }
    problems.sort_by_key(|(offset, _)| *offset);
    Err(problems
        .into_iter()
        .map(|(offset, error)| {
            let (line, column) = line_and_column(text, offset);
            Problem {
                line,
                column,
                error,
            }
        })
        .collect())
}

/// A problem found by the walk: where, what, and the field a near miss meant.
type Found = (usize, SpecError, Option<String>);

/// Walks `table` (at `path`, as segments) against `schema`: each unknown key is a problem at
/// the key, and its path is kept in `unknown` so that the values can be read without it.
fn walk(
    table: &DeTable<'_>,
    schema: &[(&str, Shape)],
    path: &[String],
    found: &mut Vec<Found>,
    unknown: &mut Vec<Vec<String>>,
) {
    for (key, value) in table {
        let name: &str = key.get_ref();
        let mut segments = path.to_vec();
        segments.push(name.to_string());
        let field = field_of(&segments);
        let Some((_, shape)) = schema.iter().find(|(known, _)| *known == name) else {
            let names: Vec<&str> = schema.iter().map(|(known, _)| *known).collect();
            let (mut problem, meant) = unknown_key(&field, name, &names);
            if path.is_empty() {
                problem.message = format!(
                    "unknown key `{}`; a job file starts with a `[job]` table",
                    crate::util::text::cut(name, 64)
                );
            }
            let meant = meant.map(|meant| field_of(&[path, &[meant.to_string()]].concat()));
            found.push((key.span().start, problem, meant));
            unknown.push(segments);
            continue;
        };
        match (shape, value.get_ref()) {
            (Table(keys), DeValue::Table(inner)) => walk(inner, keys, &segments, found, unknown),
            (Tables(keys), DeValue::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    if let DeValue::Table(inner) = item.get_ref() {
                        let mut at = segments.clone();
                        at.push(i.to_string());
                        walk(inner, keys, &at, found, unknown);
                    }
                }
            }
            (Named(names), DeValue::Table(inner)) => {
                for (key, _) in inner.iter() {
                    let name: &str = key.get_ref();
                    if !names.contains(&name) {
                        let mut at = segments.clone();
                        at.push(name.to_string());
                        let (problem, meant) = unknown_key(&field_of(&at), name, names);
                        let meant = meant.map(|meant| format!("{field}.{meant}"));
                        found.push((key.span().start, problem, meant));
                        unknown.push(at);
                    }
                }
            }
            // A value where a table belongs, or the other way round, is the typed reading's
            // to name.
            _ => {}
        }
    }
}

/// Segments as a field: `job`, `tasks`, `1`, `name` is `job.tasks[1].name`.
fn field_of(segments: &[String]) -> String {
    let mut field = String::new();
    for segment in segments {
        if segment.parse::<usize>().is_ok() {
            field.push_str(&format!("[{segment}]"));
        } else {
            if !field.is_empty() {
                field.push('.');
            }
            field.push_str(&crate::util::text::cut(segment, 64));
        }
    }
    field
}

/// The problem of an unknown key, and the known name it is a near miss of, if any.
fn unknown_key<'k>(field: &str, name: &str, known: &[&'k str]) -> (SpecError, Option<&'k str>) {
    let meant = nearest(name, known);
    let name = crate::util::text::cut(name, 64);
    let message = match meant {
        Some(meant) => format!("unknown key `{name}`; did you mean `{meant}`?"),
        None => format!("unknown key `{name}`; expected one of {}", known.join(", ")),
    };
    (error(field, message), meant)
}

/// `; did you mean `x`?` for the known name nearest to `given`, when it is near enough to be
/// a typo; "" otherwise.
pub(super) fn did_you_mean(given: &str, known: &[&str]) -> String {
    nearest(given, known).map_or_else(String::new, |meant| format!("; did you mean `{meant}`?"))
}

/// The known name nearest to `given`, when it is near enough to be a typo (at most a third
/// of its letters off, and at most 3).
fn nearest<'k>(given: &str, known: &[&'k str]) -> Option<&'k str> {
    let (distance, candidate) = known
        .iter()
        .map(|candidate| (edit_distance(given, candidate), *candidate))
        .min()?;
    (distance > 0 && distance <= 3 && distance * 3 <= candidate.len().max(3)).then_some(candidate)
}

/// Levenshtein distance, in characters, with a swap of two neighbours counting one.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) =
        (a.chars().take(65).collect(), b.chars().take(65).collect());
    if a.len() > 64 || b.len() > 64 {
        return usize::MAX;
    }
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let substitution = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + substitution);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

/// `job.tasks[1].name` as segments: `job`, `tasks`, `1`, `name`.
fn split_path(field: &str) -> Vec<String> {
    field
        .split('.')
        .flat_map(|part| {
            let mut segments = Vec::new();
            let mut rest = part;
            while let Some(open) = rest.find('[') {
                if open > 0 {
                    segments.push(rest[..open].to_string());
                }
                let close = rest[open..].find(']').map_or(rest.len(), |c| open + c);
                segments.push(rest[open + 1..close].to_string());
                rest = rest.get(close + 1..).unwrap_or("");
            }
            if !rest.is_empty() {
                segments.push(rest.to_string());
            }
            segments
        })
        .collect()
}

/// Removes the key at `path` (segments; a number indexes a list) from `value`.
fn remove(value: &mut toml::Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut at = value;
    for segment in parents {
        let next = match at {
            toml::Value::Table(table) => table.get_mut(segment),
            toml::Value::Array(items) => {
                segment.parse::<usize>().ok().and_then(|i| items.get_mut(i))
            }
            _ => None,
        };
        match next {
            Some(next) => at = next,
            None => return,
        }
    }
    if let toml::Value::Table(table) = at {
        table.remove(last);
    }
}

/// Where in the file `field` is: its key, or the nearest of its parents the file has (a
/// missing key is a problem of the table that lacks it); 0 when none is.
fn offset_of(document: &DeTable<'_>, field: &str) -> usize {
    let mut table = document;
    let mut offset = 0;
    let segments = split_path(field);
    let mut segments = segments.iter().peekable();
    while let Some(segment) = segments.next() {
        let Some((key, value)) = table.iter().find(|(key, _)| key.get_ref() == segment) else {
            break;
        };
        offset = key.span().start;
        let mut value = value;
        if let (DeValue::Array(items), Some(index)) = (
            value.get_ref(),
            segments.peek().and_then(|i| i.parse::<usize>().ok()),
        ) {
            segments.next();
            let Some(item) = items.get(index) else {
                break;
            };
            offset = item.span().start;
            value = item;
        }
        match value.get_ref() {
            DeValue::Table(inner) => table = inner,
            _ => break,
        }
    }
    offset
}

/// The line and column (from 1; the column in characters) of byte `offset` of `text`.
fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |at| at + 1);
    (line, before[line_start..].chars().count() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The field each problem names (`line L, column C: FIELD: message`).
    fn fields_of(problems: &[String]) -> Vec<&str> {
        problems
            .iter()
            .map(|p| p.split(": ").nth(1).unwrap_or(""))
            .collect()
    }

    fn problems(text: &str) -> Vec<String> {
        check_toml(text)
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn every_problem_is_found_in_file_order_with_its_line() {
        let text = "[job]\nid = \"web\"\ntype = \"servce\"\ncount = 1\nrunner = \"r.wasm\"\n\
                    placement = \"sprad\"\n[job.limits]\nmemroy = \"64MiB\"\n\
                    [[job.task]]\nname = \"a\"\n";
        assert_eq!(
            problems(text),
            [
                "line 3, column 1: job.type: unknown job type \"servce\"; did you mean `service`?; expected \"service\" or \"batch\"",
                "line 6, column 1: job.placement: unknown placement \"sprad\"; did you mean `spread`?; expected \"binpack\" or \"spread\"",
                "line 8, column 1: job.limits.memroy: unknown key `memroy`; did you mean `memory`?",
                "line 9, column 7: job.task: unknown key `task`; did you mean `tasks`?",
            ]
        );
    }

    #[test]
    fn a_missing_key_is_the_tables_and_a_wrong_type_is_its_keys() {
        let text = "[job]\nid = \"web\"\ntype = \"batch\"\nrunner = \"r.wasm\"\n\
                    [[job.tasks]]\nname = \"a\"\n[[job.tasks]]\nname = 7\n";
        let found = problems(text);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("line 8, column 1: job.tasks[1].name: invalid type"),
            "{found:?}"
        );
        let missing = problems("[job]\nid = \"web\"\ntype = \"batch\"\nrunner = \"r.wasm\"\n");
        assert_eq!(
            missing,
            ["line 1, column 2: job.count: missing; how many allocs to run, such as `count = 3`"]
        );
    }

    #[test]
    fn a_typo_is_one_problem_and_nan_is_no_value() {
        let text = "[job]\nid = \"web\"\ntype = \"batch\"\ncout = 3\nrunner = \"r.wasm\"\n";
        assert_eq!(
            problems(text),
            ["line 4, column 1: job.cout: unknown key `cout`; did you mean `count`?"]
        );
        let text = "[job]\nid = \"web\"\ntype = \"batch\"\ncount = nan\nrunner = \"r.wasm\"\n";
        let found = problems(text);
        assert!(
            found[0].starts_with("line 4, column 1: job.count: invalid type: floating point"),
            "{found:?}"
        );
        let empty = problems("");
        assert_eq!(empty.len(), 1, "{empty:?}");
        assert!(empty[0].contains(" job: missing field `job`"), "{empty:?}");
        let syntax = check_toml("[job]\nid = \"web\"\ncount = three\n").unwrap_err();
        assert_eq!((syntax[0].line, syntax[0].column), (3, 9), "{syntax:?}");
    }

    #[test]
    fn every_bad_limit_is_named() {
        let text = "[job]\nid = \"web\"\ntype = \"batch\"\ncount = 1\nrunner = \"r.wasm\"\n\
                    [job.limits]\nmemory = \"lots\"\ncpu = \"0s\"\n";
        let found = problems(text);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].starts_with("line 7, column 1: job.limits.memory: "),
            "{found:?}"
        );
        assert!(
            found[1].starts_with("line 8, column 1: job.limits.cpu: "),
            "{found:?}"
        );
    }

    #[test]
    fn every_bad_capability_is_named() {
        let text = "[job]\nid = \"web\"\ntype = \"batch\"\ncount = 1\nrunner = \"r.wasm\"\n\
                    [job.capabilities]\nnetwork = [\"db:5432\", \"10.0.0.5:5432\", \"10.0.0.6\"]\n\
                    volumes = { \"relative/path\" = \"shared\" }\n\
                    env = { \"1BAD\" = \"x\", GOOD = \"y\" }\n";
        let found = problems(text);
        assert_eq!(
            fields_of(&found),
            [
                "job.capabilities.network[0]",
                "job.capabilities.network[2]",
                "job.capabilities.volumes.\"relative/path\"",
                "job.capabilities.env.\"1BAD\"",
            ],
            "{found:#?}"
        );
        assert!(found[0].starts_with("line 7, "), "{found:?}");
    }

    #[test]
    fn every_bad_policy_key_is_named() {
        let text = "[job]\nid = \"web\"\ntype = \"service\"\ncount = 1\nrunner = \"r.wasm\"\n\
                    [job.restart]\nattempts = -1\nmode = \"sometimes\"\n\
                    [job.reschedule]\ndelay_function = \"fibonacci\"\ninterval = \"soon\"\n\
                    [job.disconnect]\nlost_after = \"forever\"\nreconcile = \"coin\"\n";
        let found = problems(text);
        assert_eq!(
            fields_of(&found),
            [
                "job.restart.attempts",
                "job.restart.mode",
                "job.reschedule.delay_function",
                "job.reschedule.interval",
                "job.disconnect.lost_after",
                "job.disconnect.reconcile",
            ],
            "{found:#?}"
        );
        assert!(found[0].starts_with("line 7, "), "{found:?}");
    }

    #[test]
    fn a_far_miss_lists_what_is_known() {
        let text = "[job]\nid = \"web\"\ntype = \"batch\"\ncount = 1\nrunner = \"r.wasm\"\n\
                    [job.update]\nwhatever = true\n";
        assert_eq!(
            problems(text),
            [
                "line 7, column 1: job.update.whatever: unknown key `whatever`; expected one of carry_checkpoint"
            ]
        );
    }

    #[test]
    fn the_schema_is_the_typed_forms() {
        // Every key the schema knows is one the typed reading takes, and one it does not
        // know is refused there too.
        fn keys(schema: &[(&'static str, Shape)], path: &str, out: &mut Vec<(String, Shape)>) {
            for (name, shape) in schema {
                let field = format!("{path}.{name}");
                out.push((field.clone(), *shape));
                match shape {
                    Table(inner) => keys(inner, &field, out),
                    Tables(inner) => keys(inner, &field, out),
                    _ => {}
                }
            }
        }
        let mut all = Vec::new();
        keys(JOB, "job", &mut all);
        for (field, _) in &all {
            // `job.a.b` as {"job": {"a": {"b": null}}}, a list of tables holding one table.
            let segments: Vec<&str> = field.split('.').collect();
            let mut value = serde_json::Value::Null;
            for i in (1..segments.len()).rev() {
                let is_list = all
                    .iter()
                    .any(|(f, s)| *f == segments[..=i].join(".") && matches!(s, Tables(_)));
                let inner = if is_list && !value.is_null() {
                    serde_json::json!([value])
                } else {
                    value
                };
                value = serde_json::json!({ segments[i]: inner });
            }
            let value = serde_json::json!({ "job": value });
            let typed = serde_json::from_value::<RawDocument>(value.clone());
            if let Err(error) = typed {
                assert!(
                    !error.to_string().contains("unknown field"),
                    "{field}: {error}"
                );
            }
        }
        let unknown = serde_json::json!({"job": {"bogus": 1}});
        assert!(serde_json::from_value::<RawDocument>(unknown).is_err());
    }

    #[test]
    fn near_misses_only() {
        assert_eq!(
            did_you_mean("memroy", &["memory", "cpu"]),
            "; did you mean `memory`?"
        );
        assert_eq!(did_you_mean("xyz", &["memory", "cpu"]), "");
        assert_eq!(did_you_mean("cpu", &["memory", "cpu"]), "");
    }
}
