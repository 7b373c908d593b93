//! Series the agent samples itself, for the web UI's plots (no external service): each
//! alloc's CPU and memory on this node, and, while this agent's server answers for the
//! cluster, each job's allocs by status.
//!
//! Each series is a ring of the last [`SAMPLES_KEPT`] samples, one every
//! `[telemetry] collection_interval` (five minutes of them at the default,
//! [`SAMPLE_INTERVAL`]), in memory and lost at a restart (or, for jobs, when
//! the leadership moves). At most [`MAX_SERIES`] allocs and as many jobs are followed: a node
//! of 100,000 allocs pays for 1,024 of them (about 1.5 KiB each), and an alloc past the cap
//! has no plot, which its usage answer says. A series goes with its alloc or job.
//!
//! It reads the client's runners and the server's records; it changes nothing.

use crate::allocrunner::AllocUsage;
use crate::server::{EmbeddedServer, JobAllocCounts};
use crate::util::locks::LockUnpoisoned;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// How often the agent samples.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);
/// Samples kept per series: five minutes.
pub const SAMPLES_KEPT: usize = 60;
/// Most allocs, and most jobs, followed at once.
pub const MAX_SERIES: usize = 1024;

/// One sample of an alloc's usage.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct UsageSample {
    /// When it was taken.
    pub at_unix_ms: u64,
    /// CPU time spent for it since the sample before, as a share of one core's time.
    pub cpu_percent: f64,
    /// The linear memory its instance holds now.
    pub memory_bytes: u64,
}

/// One sample of a job's allocs, as its server holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct JobSample {
    /// When it was taken.
    pub at_unix_ms: u64,
    /// Allocs placed on a node and not yet collected, whatever their status.
    pub placed: u32,
    /// Allocs running.
    pub running: u32,
    /// Allocs failed.
    pub failed: u32,
    /// Allocs that replace one that failed or was lost (rescheduled), not yet collected.
    pub rescheduled: u32,
}

#[derive(Default)]
struct AllocSeries {
    /// The CPU time counted at the last sample, and when: the next sample's rate is from it.
    cpu_before: Option<(Duration, Instant)>,
    samples: VecDeque<UsageSample>,
}

/// Every series this agent keeps. Cheap to share.
#[derive(Default)]
pub struct Series {
    allocs: Mutex<BTreeMap<String, AllocSeries>>,
    jobs: Mutex<BTreeMap<String, VecDeque<JobSample>>>,
}

/// Why an alloc has no series.
pub const NOT_FOLLOWED: &str = "not sampled: this node already follows 1,024 allocs, the most \
     it keeps plots for";

/// The series of `id` in `map`, started while fewer than [`MAX_SERIES`] are followed.
fn followed<T: Default>(map: &mut BTreeMap<String, T>, id: String) -> Option<&mut T> {
    let room = map.len() < MAX_SERIES;
    match map.entry(id) {
        std::collections::btree_map::Entry::Occupied(entry) => Some(entry.into_mut()),
        std::collections::btree_map::Entry::Vacant(entry) if room => {
            Some(entry.insert(T::default()))
        }
        std::collections::btree_map::Entry::Vacant(_) => None,
    }
}

fn keep<T>(ring: &mut VecDeque<T>, sample: T) {
    if ring.len() == SAMPLES_KEPT {
        ring.pop_front();
    }
    ring.push_back(sample);
}

impl Series {
    /// Samples each alloc of `live` (its id and what it used so far), taken at `now`; the
    /// series of allocs no longer there go. An alloc's first sample only starts its count.
    pub fn sample_allocs(&self, live: Vec<(String, AllocUsage)>, now: Instant, at_unix_ms: u64) {
        let mut allocs = self.allocs.lock_unpoisoned();
        let present: BTreeSet<&str> = live.iter().map(|(id, _)| id.as_str()).collect();
        allocs.retain(|id, _| present.contains(id.as_str()));
        for (id, usage) in live {
            let Some(series) = followed(&mut allocs, id) else {
                continue;
            };
            if let Some((cpu_before, at)) = series.cpu_before {
                let wall = now.saturating_duration_since(at).as_secs_f64();
                let spent = usage.cpu_used.saturating_sub(cpu_before).as_secs_f64();
                let cpu_percent = if wall > 0.0 {
                    spent / wall * 100.0
                } else {
                    0.0
                };
                let sample = UsageSample {
                    at_unix_ms,
                    cpu_percent,
                    memory_bytes: usage.memory_bytes,
                };
                keep(&mut series.samples, sample);
            }
            series.cpu_before = Some((usage.cpu_used, now));
        }
    }

    /// Samples each job of `counts`; the series of jobs no longer there go.
    pub fn sample_jobs(&self, counts: BTreeMap<String, JobAllocCounts>, at_unix_ms: u64) {
        let mut jobs = self.jobs.lock_unpoisoned();
        jobs.retain(|id, _| counts.contains_key(id));
        for (id, count) in counts {
            let Some(ring) = followed(&mut jobs, id) else {
                continue;
            };
            let sample = JobSample {
                at_unix_ms,
                placed: count.placed,
                running: count.running,
                failed: count.failed,
                rescheduled: count.rescheduled,
            };
            keep(ring, sample);
        }
    }

    /// The samples of an alloc, oldest first; `None` when it is not followed.
    pub fn alloc(&self, id: &str) -> Option<Vec<UsageSample>> {
        let allocs = self.allocs.lock_unpoisoned();
        allocs
            .get(id)
            .map(|series| series.samples.iter().copied().collect())
    }

    /// Whether as many allocs as it may follow are followed.
    pub fn allocs_full(&self) -> bool {
        self.allocs.lock_unpoisoned().len() >= MAX_SERIES
    }

    /// The samples of a job, oldest first; `None` when it is not followed.
    pub fn job(&self, id: &str) -> Option<Vec<JobSample>> {
        let jobs = self.jobs.lock_unpoisoned();
        jobs.get(id).map(|ring| ring.iter().copied().collect())
    }
}

/// Samples every `interval` until the agent stops: `usages` gives this node's allocs and what
/// each used, `servers` the server answering here (none while another agent leads).
pub async fn sample_every(
    series: Arc<Series>,
    interval: Duration,
    usages: impl Fn() -> Vec<(String, AllocUsage)>,
    servers: watch::Receiver<Option<Arc<EmbeddedServer>>>,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let at_unix_ms = crate::util::timestamp::unix_ms_now();
        series.sample_allocs(usages(), Instant::now(), at_unix_ms);
        let server = servers.borrow().clone();
        let counts = server
            .map(|server| server.alloc_counts())
            .unwrap_or_default();
        series.sample_jobs(counts, at_unix_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(cpu_ms: u64, memory_bytes: u64) -> AllocUsage {
        AllocUsage {
            cpu_used: Duration::from_millis(cpu_ms),
            memory_peak_bytes: memory_bytes,
            memory_bytes,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_allocs_cpu_is_a_rate_between_samples_and_its_series_is_bounded_and_goes_with_it() {
        let series = Series::default();
        let start = Instant::now();
        series.sample_allocs(vec![("a".into(), usage(0, 1 << 20))], start, 0);
        assert_eq!(
            series.alloc("a"),
            Some(vec![]),
            "the first sample only starts the count"
        );
        for n in 1..=100u64 {
            let at = start + SAMPLE_INTERVAL * n as u32;
            // Half a core: 2.5 s of CPU per 5 s.
            series.sample_allocs(vec![("a".into(), usage(2_500 * n, 2 << 20))], at, n);
        }
        let samples = series.alloc("a").unwrap();
        assert_eq!(samples.len(), SAMPLES_KEPT);
        assert_eq!(
            samples.last().unwrap().at_unix_ms,
            100,
            "the newest are kept"
        );
        assert!((samples[0].cpu_percent - 50.0).abs() < 1e-9, "{samples:?}");
        assert_eq!(samples[0].memory_bytes, 2 << 20);
        series.sample_allocs(vec![], start + SAMPLE_INTERVAL * 101, 101);
        assert_eq!(
            series.alloc("a"),
            None,
            "an alloc gone takes its series with it"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn no_more_than_max_series_allocs_are_followed() {
        let series = Series::default();
        let live: Vec<_> = (0..MAX_SERIES + 5)
            .map(|i| (format!("{i:05}"), usage(0, 0)))
            .collect();
        series.sample_allocs(live, Instant::now(), 0);
        assert!(series.alloc("00000").is_some());
        assert_eq!(series.alloc(&format!("{:05}", MAX_SERIES + 4)), None);
    }

    #[test]
    fn a_jobs_counts_are_kept_while_it_exists() {
        let series = Series::default();
        let counts = |running| {
            BTreeMap::from([(
                "web".to_string(),
                JobAllocCounts {
                    placed: 3,
                    running,
                    failed: 1,
                    rescheduled: 1,
                },
            )])
        };
        series.sample_jobs(counts(2), 1);
        series.sample_jobs(counts(3), 2);
        let samples = series.job("web").unwrap();
        assert_eq!(samples.len(), 2);
        assert_eq!((samples[1].running, samples[1].at_unix_ms), (3, 2));
        series.sample_jobs(BTreeMap::new(), 3);
        assert_eq!(series.job("web"), None);
    }
}
