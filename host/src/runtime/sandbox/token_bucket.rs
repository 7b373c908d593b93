//! A token bucket on tokio's clock: what the log rate (lines and bytes) and the checkpoint
//! rate of one alloc are counted with. Plain arithmetic; it touches nothing.

use tokio::time::Instant;

/// Up to `capacity` tokens, refilled at `per_second`, starting full.
pub(in crate::runtime) struct TokenBucket {
    capacity: f64,
    per_second: f64,
    tokens: f64,
    refilled_at: Option<Instant>,
}

impl TokenBucket {
    pub(in crate::runtime) fn new(per_second: f64, capacity: f64) -> Self {
        TokenBucket {
            capacity,
            per_second,
            tokens: capacity,
            refilled_at: None,
        }
    }

    /// Adds what accrued since the last refill, up to the capacity.
    pub(in crate::runtime) fn refill(&mut self, now: Instant) {
        if let Some(refilled_at) = self.refilled_at {
            let elapsed = now.saturating_duration_since(refilled_at).as_secs_f64();
            self.tokens = (self.tokens + elapsed * self.per_second).min(self.capacity);
        }
        self.refilled_at = Some(now);
    }

    /// Whether `tokens` are there to take (after a [`TokenBucket::refill`]).
    pub(in crate::runtime) fn holds(&self, tokens: f64) -> bool {
        self.tokens >= tokens
    }

    /// Takes `tokens`, which [`TokenBucket::holds`] said are there.
    pub(in crate::runtime) fn spend(&mut self, tokens: f64) {
        self.tokens -= tokens;
    }

    /// Refills, then takes `tokens` if they are all there; takes nothing otherwise.
    pub(in crate::runtime) fn take(&mut self, now: Instant, tokens: f64) -> bool {
        self.refill(now);
        let held = self.holds(tokens);
        if held {
            self.spend(tokens);
        }
        held
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_bucket_refills_at_its_rate_up_to_its_capacity() {
        let mut bucket = TokenBucket::new(1000.0, 2000.0);
        let now = Instant::now;
        assert!(bucket.take(now(), 1500.0));
        assert!(!bucket.take(now(), 600.0), "500 left");
        assert!(bucket.take(now(), 500.0));
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(bucket.take(now(), 500.0));
        assert!(!bucket.take(now(), 1.0));
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(bucket.take(now(), 2000.0), "refilled to its capacity");
        assert!(!bucket.take(now(), 1.0), "and no more");
    }
}
