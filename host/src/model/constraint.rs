//! Job constraints (`[[job.constraint]]`): which nodes a job's allocs may be placed on, in
//! Nomad's terms. A constraint names a node's attribute (`${node.class}`, `${meta.rack}`,
//! ...: see [`Target`]), an operator and a value:
//!
//! ```toml
//! [[job.constraint]]
//! attribute = "${node.class}"
//! value = "edge"                    # operator "=" by default
//!
//! [[job.constraint]]
//! attribute = "${attr.caravan.version}"
//! operator = "version"
//! value = ">= 0.1, < 2"
//!
//! [[job.constraint]]
//! operator = "distinct_hosts"       # at most one of the job's allocs per node
//! ```
//!
//! Operators: `=` (also `==`, `is`), `!=` (also `not`), `regexp`, `set_contains` (the
//! node's value, a comma-separated list, holds every item of the constraint's), `version`
//! (a semver requirement the node's value, read as a version, meets), `distinct_hosts`.
//! As in Nomad, a node without the attribute meets `!=` and fails every other operator.
//!
//! A job keeps its constraints as written ([`Constraint`]); [`Compiled`] is the form
//! placement checks nodes with. Everything that can be wrong with a constraint is found by
//! [`Constraint::compile`] at submit, so placement never meets a bad one.

use crate::model::node::{NodeInfo, Target};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The most constraints a job may have.
pub const MAX_CONSTRAINTS: usize = 32;
/// The longest value a constraint may have, in bytes (a regexp or a version requirement).
pub const MAX_CONSTRAINT_VALUE_BYTES: usize = 1024;
/// The most memory a constraint's compiled regexp may take: a regexp is the submitter's
/// program, compiled by the scheduler at each placement of its job and run against every
/// node, under the server's lock.
const MAX_REGEX_BYTES: usize = 64 << 10;

/// One constraint, as written and stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Constraint {
    /// The node attribute, `${...}`; empty for `distinct_hosts`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub attribute: String,
    /// The operator, as written (its canonical name after parsing).
    pub operator: String,
    /// What the attribute is compared with.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
}

impl fmt::Display for Constraint {
    /// Nomad's way of naming a constraint in a placement failure: `${node.class} = edge`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.operator == "distinct_hosts" {
            return f.write_str("distinct_hosts");
        }
        write!(f, "{} {} {}", self.attribute, self.operator, self.value)
    }
}

/// The raw `[[job.constraint]]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConstraint {
    attribute: Option<String>,
    operator: Option<String>,
    value: Option<String>,
}

impl RawConstraint {
    /// Validates the table into a [`Constraint`]; the error is `(key, problem)`.
    pub(crate) fn parse(self) -> Result<Constraint, (&'static str, String)> {
        let operator = match self.operator.as_deref().unwrap_or("=") {
            "=" | "==" | "is" => "=",
            "!=" | "not" => "!=",
            "regexp" => "regexp",
            "set_contains" => "set_contains",
            "version" => "version",
            "distinct_hosts" => "distinct_hosts",
            other => {
                return Err((
                    "operator",
                    format!(
                        "unknown operator {:?}; expected =, !=, regexp, set_contains, version \
                         or distinct_hosts",
                        crate::util::text::cut(other, 64)
                    ),
                ));
            }
        };
        let constraint = Constraint {
            attribute: self.attribute.unwrap_or_default(),
            operator: operator.into(),
            value: self.value.unwrap_or_default(),
        };
        constraint.compile()?;
        Ok(constraint)
    }
}

impl Constraint {
    /// The form placement checks nodes with; the error is `(key, problem)`, for a
    /// constraint that was never valid (see the module docs).
    pub fn compile(&self) -> Result<Compiled, (&'static str, String)> {
        if self.value.len() > MAX_CONSTRAINT_VALUE_BYTES {
            return Err((
                "value",
                format!(
                    "{} bytes; at most {MAX_CONSTRAINT_VALUE_BYTES}",
                    self.value.len()
                ),
            ));
        }
        if self.operator == "distinct_hosts" {
            return match self.value.as_str() {
                "" | "true" => Ok(Compiled::DistinctHosts),
                "false" => Ok(Compiled::Always),
                other => Err((
                    "value",
                    format!("{other:?}: distinct_hosts takes \"true\" or \"false\""),
                )),
            };
        }
        let target = Target::parse(&self.attribute).map_err(|e| ("attribute", e))?;
        let test = match self.operator.as_str() {
            "=" => Test::Equal(self.value.clone()),
            "!=" => Test::NotEqual(self.value.clone()),
            "regexp" => Test::Regexp(
                regex::RegexBuilder::new(&self.value)
                    .size_limit(MAX_REGEX_BYTES)
                    .build()
                    .map_err(|e| ("value", format!("not a regexp: {}", one_line(&e))))?,
            ),
            "set_contains" => {
                let items = split_set(&self.value);
                if items.is_empty() {
                    return Err(("value", "set_contains needs one item or more".into()));
                }
                Test::SetContains(items)
            }
            "version" => Test::Version(
                semver::VersionReq::parse(&self.value)
                    .map_err(|e| ("value", format!("not a version requirement: {e}")))?,
            ),
            other => {
                return Err(("operator", format!("unknown operator {other:?}")));
            }
        };
        Ok(Compiled::Check { target, test })
    }
}

fn one_line(error: &regex::Error) -> String {
    let text = error.to_string();
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    crate::util::text::cut(&text, 200).into_owned()
}

fn split_set(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(str::to_string)
        .collect()
}

/// A constraint ready to check nodes with.
#[derive(Debug, Clone)]
pub enum Compiled {
    /// The node's attribute passes the test.
    Check {
        /// The attribute.
        target: Target,
        /// The test.
        test: Test,
    },
    /// At most one of the job's allocs per node: placement counts them, nodes cannot say.
    DistinctHosts,
    /// Always met (`distinct_hosts = false`).
    Always,
}

/// What a node's attribute is tested against.
#[derive(Debug, Clone)]
pub enum Test {
    /// `=`.
    Equal(String),
    /// `!=`.
    NotEqual(String),
    /// `regexp`.
    Regexp(regex::Regex),
    /// `set_contains`.
    SetContains(Vec<String>),
    /// `version`.
    Version(semver::VersionReq),
}

impl Compiled {
    /// Whether node `node_id`, described by `node`, meets it. `DistinctHosts` is always met
    /// here: it depends on the job's allocs, which placement counts.
    pub fn admits(&self, node_id: &str, node: &NodeInfo) -> bool {
        let Compiled::Check { target, test } = self else {
            return true;
        };
        let value = node.value_of(node_id, target);
        match (test, value) {
            (Test::NotEqual(wanted), value) => value != Some(wanted.as_str()),
            (_, None) => false,
            (Test::Equal(wanted), Some(value)) => value == wanted,
            (Test::Regexp(regex), Some(value)) => regex.is_match(value),
            (Test::SetContains(items), Some(value)) => {
                let have = split_set(value);
                items.iter().all(|item| have.contains(item))
            }
            (Test::Version(requirement), Some(value)) => {
                parse_version(value).is_some_and(|v| requirement.matches(&v))
            }
        }
    }
}

/// A node's version, leniently: `1.2` is `1.2.0`, a leading `v` is dropped.
fn parse_version(text: &str) -> Option<semver::Version> {
    let text = text.trim().trim_start_matches('v');
    semver::Version::parse(text).ok().or_else(|| {
        let parts = text.split('.').count();
        let padded = match parts {
            1 => format!("{text}.0.0"),
            2 => format!("{text}.0"),
            _ => return None,
        };
        semver::Version::parse(&padded).ok()
    })
}

/// How a job's allocs are ranked over the nodes that can hold them (`[job] placement`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// Fill the fullest node that fits first, keeping whole nodes free (Nomad's default).
    #[default]
    Binpack,
    /// The emptiest node first, spreading load.
    Spread,
}

impl Algorithm {
    /// Whether it is the default, for leaving it out of a stored job.
    pub fn is_default(&self) -> bool {
        *self == Algorithm::Binpack
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn raw(attribute: &str, operator: &str, value: &str) -> RawConstraint {
        RawConstraint {
            attribute: Some(attribute.into()),
            operator: Some(operator.into()),
            value: Some(value.into()),
        }
    }

    fn admits(attribute: &str, operator: &str, value: &str, node: &NodeInfo) -> bool {
        let constraint = raw(attribute, operator, value).parse().unwrap();
        constraint.compile().unwrap().admits("n1", node)
    }

    #[test]
    fn each_operator_checks_the_nodes_attribute_as_nomad_does() {
        let node = NodeInfo {
            class: "edge".into(),
            meta: BTreeMap::from([
                ("zones".into(), "a, b,c".into()),
                ("version".into(), "1.4".into()),
            ]),
            ..NodeInfo::default()
        };
        let cases = [
            ("${node.class}", "=", "edge", true),
            ("${node.class}", "==", "core", false),
            ("${node.class}", "!=", "core", true),
            ("${meta.missing}", "!=", "x", true),
            ("${meta.missing}", "=", "x", false),
            ("${node.name}", "regexp", "^n[0-9]$", true),
            ("${node.pool}", "regexp", "^edge", false),
            ("${meta.zones}", "set_contains", "c,a", true),
            ("${meta.zones}", "set_contains", "a,d", false),
            ("${meta.version}", "version", ">= 1.2, < 2", true),
            ("${meta.version}", "version", ">= 1.5", false),
            ("${meta.zones}", "version", ">= 1", false),
        ];
        for (attribute, operator, value, expected) in cases {
            assert_eq!(
                admits(attribute, operator, value, &node),
                expected,
                "{attribute} {operator} {value}"
            );
        }
    }

    #[test]
    fn a_bad_constraint_is_refused_naming_its_key() {
        let refused = |r: RawConstraint| r.parse().unwrap_err();
        assert_eq!(refused(raw("${node.class}", "~", "x")).0, "operator");
        assert_eq!(refused(raw("node.class", "=", "x")).0, "attribute");
        assert_eq!(refused(raw("${nod.class}", "=", "x")).0, "attribute");
        let (key, problem) = refused(raw("${node.class}", "regexp", "(unclosed"));
        assert_eq!(key, "value");
        assert!(problem.starts_with("not a regexp"), "{problem}");
        assert!(!problem.contains('\n'));
        assert_eq!(refused(raw("${meta.v}", "version", "about two")).0, "value");
        assert_eq!(refused(raw("${meta.v}", "set_contains", " , ")).0, "value");
        let huge = raw("${node.class}", "regexp", "a{1000}{1000}{1000}");
        assert_eq!(refused(huge).0, "value", "a regexp past its size limit");
        let distinct = RawConstraint {
            operator: Some("distinct_hosts".into()),
            ..RawConstraint::default()
        };
        let parsed = distinct.parse().unwrap();
        assert!(matches!(parsed.compile(), Ok(Compiled::DistinctHosts)));
        assert_eq!(parsed.to_string(), "distinct_hosts");
        assert_eq!(
            raw("${node.class}", "is", "edge")
                .parse()
                .unwrap()
                .to_string(),
            "${node.class} = edge"
        );
    }
}
