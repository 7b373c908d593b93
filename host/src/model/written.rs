//! How a job wrote its values (its limits, its policies' durations), kept beside them so
//! that what the agent says back (a cap refused, an alloc's limits, a restart limit reached)
//! reads as the author wrote it: `60s`, not `1m`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Each key a job set in one block, and its value as written (trimmed, each run of
/// whitespace one space). Never part of what the block says: two blocks that differ only in
/// how they were written are equal, so that writing `60s` where `1m` was is no change to the
/// job.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AsWritten(BTreeMap<String, String>);

impl AsWritten {
    /// What a block wrote for each of `keys` that it set.
    pub(crate) fn of(keys: &[(&str, &Option<String>)]) -> Self {
        let mut written = AsWritten::default();
        for (key, text) in keys {
            if let Some(text) = text {
                written.record(key, text);
            }
        }
        written
    }

    /// Records that `key` was written as `text`.
    pub(crate) fn record(&mut self, key: &str, text: &str) {
        // Runs of whitespace (a line break a parser let through included) said back as one
        // space: what is said back goes into one-line descriptions and log fields.
        let said = text.split_whitespace().collect::<Vec<_>>().join(" ");
        self.0.insert(key.to_string(), said);
    }

    /// How `key` was written, if it was.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// `key` as written, or `value` in the agent's form when it was not written.
    pub fn duration(&self, key: &str, value: std::time::Duration) -> String {
        self.get(key).map_or_else(
            || crate::util::units::format_duration(value),
            str::to_string,
        )
    }

    /// Whether nothing was recorded (the overrides came from elsewhere than a document).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Always equal: see [`AsWritten`].
impl PartialEq for AsWritten {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for AsWritten {}
