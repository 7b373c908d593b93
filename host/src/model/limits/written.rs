//! How a job wrote its limits, kept beside their values so that what the agent says back
//! (a cap refused, an alloc's limits) reads as the author wrote it: `60s`, not `1m`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Each limit key a job set, and its value as written (trimmed). Never part of what the
/// limits are: two overrides that differ only in how they were written are equal, so that
/// writing `60s` where `1m` was is no change to the job.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WrittenLimits(BTreeMap<String, String>);

impl WrittenLimits {
    /// Records that `key` was written as `text`.
    pub(super) fn record(&mut self, key: &str, text: &str) {
        self.0.insert(key.to_string(), text.trim().to_string());
    }

    /// How `key` was written, if it was.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// Whether nothing was recorded (the overrides came from elsewhere than a document).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Always equal: see [`WrittenLimits`].
impl PartialEq for WrittenLimits {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for WrittenLimits {}
