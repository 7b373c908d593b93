//! A fixed-bucket latency histogram, cheap to record from any task, that renders itself in
//! Prometheus' text format; and the name under which `/v1/metrics` shows the runtime's
//! instantiation latency. Plain atomics, a leaf: it knows nothing of wasmtime, the client or
//! the server, which all record into one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the buckets, in seconds: 50 us to 10 s, covering a Rust runner (tens of
/// microseconds) and a Python one (milliseconds).
pub const BUCKETS_SECONDS: [f64; 14] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 10.0,
];

/// Counts of observations per bucket (not cumulative), their sum and their number.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS_SECONDS.len()],
    sum_nanos: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn record(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        if let Some(bucket) = BUCKETS_SECONDS.iter().position(|bound| seconds <= *bound) {
            self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        }
        self.sum_nanos.fetch_add(
            u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Writes the histogram as Prometheus text under `name`.
    pub fn write_prometheus(&self, name: &str, help: &str, out: &mut String) {
        use super::prometheus::{self, Kind};
        prometheus::header(out, name, Kind::Histogram, help);
        let bucket = format!("{name}_bucket");
        let mut cumulative = 0;
        for (bound, count) in BUCKETS_SECONDS.iter().zip(&self.buckets) {
            cumulative += count.load(Ordering::Relaxed);
            prometheus::sample(out, &bucket, &[("le", &bound.to_string())], cumulative);
        }
        let count = self.count.load(Ordering::Relaxed);
        prometheus::sample(out, &bucket, &[("le", "+Inf")], count);
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        prometheus::sample(out, &format!("{name}_sum"), &[], sum);
        prometheus::sample(out, &format!("{name}_count"), &[], count);
    }
}

/// The bucket bound at or under which quantile `q` (0 to 1) of histogram `name` falls, read
/// from Prometheus text as [`Histogram::write_prometheus`] writes it: `Some(None)` when it
/// falls beyond the last bound, `None` when `text` has no observation of `name`.
pub fn quantile_bound(text: &str, name: &str, q: f64) -> Option<Option<Duration>> {
    let prefix = format!("{name}_bucket{{le=\"");
    let buckets: Vec<(&str, u64)> = text
        .lines()
        .filter_map(|line| line.strip_prefix(&prefix))
        .filter_map(|rest| {
            let (bound, count) = rest.split_once("\"} ")?;
            Some((bound, count.trim().parse().ok()?))
        })
        .collect();
    let total = buckets.iter().find(|(bound, _)| *bound == "+Inf")?.1;
    if total == 0 {
        return None;
    }
    let wanted = (q * total as f64).ceil().max(1.0) as u64;
    let (bound, _) = buckets
        .iter()
        .find(|(_, cumulative)| *cumulative >= wanted)?;
    let finite = bound
        .parse::<f64>()
        .ok()
        .filter(|seconds| seconds.is_finite());
    Some(finite.and_then(|seconds| Duration::try_from_secs_f64(seconds).ok()))
}

/// The runtime's instantiation latency (see [`crate::runtime::Runtime::instantiation_latency`])
/// as `/v1/metrics` shows it.
pub fn write_instantiation_latency(histogram: &Histogram, out: &mut String) {
    histogram.write_prometheus(
        "caravan_runner_instantiation_seconds",
        "Time to instantiate a runner component for an alloc.",
        out,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_cumulative_buckets() {
        let histogram = Histogram::default();
        histogram.record(Duration::from_micros(30));
        histogram.record(Duration::from_millis(3));
        histogram.record(Duration::from_secs(60));
        let mut text = String::new();
        histogram.write_prometheus("x", "help", &mut text);
        assert!(text.contains("x_bucket{le=\"0.00005\"} 1\n"), "{text}");
        assert!(text.contains("x_bucket{le=\"0.005\"} 2\n"), "{text}");
        let bound = |q| quantile_bound(&text, "x", q);
        assert_eq!(bound(0.3), Some(Some(Duration::from_micros(50))));
        assert_eq!(bound(0.5), Some(Some(Duration::from_millis(5))));
        assert_eq!(bound(0.99), Some(None), "beyond the last bound");
        assert_eq!(quantile_bound(&text, "y", 0.5), None, "no such histogram");
        assert!(text.contains("x_bucket{le=\"10\"} 2\n"), "{text}");
        assert!(text.contains("x_bucket{le=\"+Inf\"} 3\n"), "{text}");
        assert!(text.contains("x_count 3\n"), "{text}");
    }
}
