//! One backoff for every retry in the agent: the wait doubles from a first one up to a cap,
//! and each wait gets up to a quarter more at random, so that many clients (or many nodes of
//! a cluster) that failed together do not retry together and stampede what is recovering.
//!
//! What to retry is the caller's decision (an etcd refusal is not retried, a lost answer is:
//! `cluster::store`); this module only says how long to wait. A leaf: it uses nothing of the
//! crate.

use std::time::Duration;

/// How long to wait before each retry of one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    cap: Duration,
}

impl Backoff {
    /// Waits of `first`, then twice that, and so on up to `cap`, each plus up to a quarter.
    pub const fn new(first: Duration, cap: Duration) -> Backoff {
        Backoff { first, cap }
    }

    /// The wait before the retry that follows the `failures`-th failure in a row (the
    /// first failure is 1; 0 is taken as 1).
    pub fn wait(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        let base = self.first.saturating_mul(1 << doublings).min(self.cap);
        base + jitter(base / 4)
    }
}

/// A duration from zero to `most`, drawn afresh each call.
fn jitter(most: Duration) -> Duration {
    let most_nanos = u64::try_from(most.as_nanos()).unwrap_or(u64::MAX);
    if most_nanos == 0 {
        return Duration::ZERO;
    }
    let draw = super::determinism::random_u64();
    Duration::from_nanos(draw % (most_nanos + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BACKOFF: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));

    #[test]
    fn waits_double_from_the_first_up_to_the_cap_with_at_most_a_quarter_more() {
        for _ in 0..100 {
            for (failures, base) in [(0, 200), (1, 200), (2, 400), (3, 800), (5, 3200), (6, 5000)] {
                let wait = BACKOFF.wait(failures);
                let base = Duration::from_millis(base);
                assert!(
                    wait >= base && wait <= base + base / 4,
                    "{failures}: {wait:?}"
                );
            }
            assert!(BACKOFF.wait(u32::MAX) <= Duration::from_millis(6250));
        }
    }

    #[test]
    fn waits_are_spread_not_in_step() {
        let waits: std::collections::BTreeSet<Duration> =
            (0..50).map(|_| BACKOFF.wait(3)).collect();
        assert!(waits.len() > 10, "{waits:?}");
    }
}
