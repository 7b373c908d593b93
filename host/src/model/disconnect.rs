//! What a job's allocs become when their node stops answering (`[job.disconnect]`, Nomad's
//! block):
//!
//! ```toml
//! [job.disconnect]
//! lost_after = "5m"            # unknown this long before lost; default 0: lost at once
//! replace = true               # place a stand-in meanwhile (default true)
//! reconcile = "best_score"     # or keep_original, keep_replacement, longest_running
//! ```
//!
//! Without the block, or with `lost_after = "0s"`, an alloc whose node misses its TTL is
//! lost and replaced at once (at-least-once: if the node was only cut off, both ran for a
//! while). With it, the alloc is `unknown` for `lost_after`; if its node returns in time,
//! one of the pair (the original and its stand-in) is kept by `reconcile` and the other
//! stopped, so nothing runs twice for longer than the partition; past it, it is lost.

use crate::util::units::parse_duration;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The longest `lost_after`: an unknown alloc holds its place (and its stand-in's) that long.
pub const MAX_LOST_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);

/// A job's `[job.disconnect]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisconnectPolicy {
    /// How long an alloc of a node that stopped answering is `unknown` before it is lost.
    pub lost_after: Duration,
    /// Whether a stand-in is placed while it is unknown.
    pub replace: bool,
    /// Which of the pair is kept when the node returns in time.
    pub reconcile: Reconcile,
}

/// Which of an unknown alloc and its stand-in is kept when the node returns (Nomad's names).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reconcile {
    /// The one on the node placement ranks higher now (the original on a tie).
    #[default]
    BestScore,
    /// The original.
    KeepOriginal,
    /// The stand-in.
    KeepReplacement,
    /// The one running without a restart for longer (the original unless it restarted
    /// while its node was away).
    LongestRunning,
}

/// The raw `[job.disconnect]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDisconnect {
    lost_after: Option<String>,
    replace: Option<bool>,
    reconcile: Option<String>,
}

impl RawDisconnect {
    /// Validates the table; `None` when it leaves allocs lost at once (`lost_after` 0). The
    /// error is every problem, each `(key, problem)`.
    pub(crate) fn parse(self) -> Result<Option<DisconnectPolicy>, Vec<(&'static str, String)>> {
        let mut found = crate::model::reschedule::BlockProblems(Vec::new());
        let lost_after = found.keep(match &self.lost_after {
            None => Ok(Duration::ZERO),
            Some(text) => match parse_duration(text) {
                Ok(lost_after) if lost_after > MAX_LOST_AFTER => Err((
                    "lost_after",
                    format!(
                        "{} is over the most, 168h",
                        crate::util::text::cut(text, 64)
                    ),
                )),
                Ok(lost_after) => Ok(lost_after),
                Err(e) => Err(("lost_after", e.to_string())),
            },
        });
        let reconcile = found.keep(match self.reconcile.as_deref() {
            None | Some("best_score") => Ok(Reconcile::BestScore),
            Some("keep_original") => Ok(Reconcile::KeepOriginal),
            Some("keep_replacement") => Ok(Reconcile::KeepReplacement),
            Some("longest_running") => Ok(Reconcile::LongestRunning),
            Some(other) => Err((
                "reconcile",
                format!(
                    "unknown rule {:?}; expected best_score, keep_original, \
                     keep_replacement or longest_running",
                    crate::util::text::cut(other, 64)
                ),
            )),
        });
        let (Some(lost_after), Some(reconcile)) = (lost_after, reconcile) else {
            return Err(found.0);
        };
        Ok((!lost_after.is_zero()).then_some(DisconnectPolicy {
            lost_after,
            replace: self.replace.unwrap_or(true),
            reconcile,
        }))
    }
}
