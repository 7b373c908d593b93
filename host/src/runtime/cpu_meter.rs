//! One alloc's CPU budget: the time its guest computes, and the time the host works on its
//! behalf, both charged against `cpu`.
//!
//! wasmtime's call hook marks every move between wasm and host code, and the meter times the
//! stretches between them. A stretch of wasm is the guest computing: wasm cannot wait, only
//! call the host, so all of it is charged. A stretch of host code is work done for the guest
//! (lifting its arguments, checking its reports, formatting its log lines, the synchronous
//! WASI calls) while the guest's thread runs it, and a wait while the thread is elsewhere:
//! `next-event`, a WASI sleep or poll, the epoch yield, a checkpoint waiting for its commit,
//! and the WASI calls wasmtime-wasi hands to tokio's blocking pool all suspend.
//!
//! Telling a wait from work: the future that drives the guest is wrapped ([`PollCounted`]),
//! and the time inside each of its polls is measured. A host stretch is charged the time of
//! the polls it spans (from its start to the end of the poll it began in, every poll after,
//! and the current poll up to its end), never the time between polls: so a call that lifts a
//! 4 MiB argument and then waits pays for the lifting, and a `next-event` that waits an hour
//! pays for nothing but its own few microseconds. Work done off the guest's thread (the
//! blocking pool's file reads and writes, the state store's commits, the alloc log writer) is
//! not timed here: the disk quota, the checkpoint rate and the log rates bound it. The budget
//! is checked at every move and at every epoch deadline, where a computing guest also yields
//! to tokio.
//!
//! A CPU share under 100% is kept at the epoch deadlines too: the time charged is taken from
//! a credit that refills at the share (a second's worth at most, which is also where it
//! starts), and a guest in debt is paused, not failed, until the credit is back to zero.
//! This module acts on one store only and never reaches past it.

use super::store_limits::UsageGauges;
use crate::units::format_duration;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use wasmtime::UpdateDeadline;

/// Counts the time one alloc spends computing, and the host's work for it, against its budget.
pub struct CpuMeter {
    budget: Duration,
    guest_time: Duration,
    host_work: Duration,
    polls: Arc<PollClock>,
    stretch: Option<Stretch>,
    exhausted: bool,
    /// The share of a core the guest may use, when under a whole one.
    share: Option<ShareCredit>,
    gauges: Option<Arc<UsageGauges>>,
}

/// The longest one pause for a CPU share lasts.
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// What a guest under a CPU share may still compute before it is paused.
struct ShareCredit {
    /// The share, as a fraction of one core (0 to 1).
    fraction: f64,
    /// Seconds of computing the guest may still do; below zero, a debt to wait off.
    credit: f64,
    /// The total charged when the credit was last settled, and when that was, on tokio's
    /// clock: the clock the pause sleeps on, so that a pause repays exactly its debt.
    settled: Duration,
    settled_at: Option<tokio::time::Instant>,
    /// Time the guest spent paused for its share.
    paused: Duration,
}

impl ShareCredit {
    /// Takes what was charged since the last settling from the credit, adds what accrued,
    /// and says how long to pause for any debt.
    fn settle(&mut self, charged: Duration, now: tokio::time::Instant) -> Option<Duration> {
        if let Some(at) = self.settled_at {
            let accrued = now.saturating_duration_since(at).as_secs_f64() * self.fraction;
            self.credit = (self.credit + accrued).min(self.fraction);
        }
        self.credit -= charged.saturating_sub(self.settled).as_secs_f64();
        self.settled = charged;
        self.settled_at = Some(now);
        // A debt under a microsecond is rounding, not computing.
        let pause_micros = (-self.credit / self.fraction * 1e6).round();
        if pause_micros < 1.0 {
            return None;
        }
        // At most a second at a time: a long host call charged at once leaves a debt of many
        // seconds at a small share, and a guest paused that long could not be shut down in
        // time. What is left is paid at the next ticks.
        let pause = Duration::from_micros(pause_micros as u64).min(MAX_PAUSE);
        self.paused += pause;
        Some(pause)
    }
}

/// The code running now, since when, and (for the host) where the polls stood then.
enum Stretch {
    Wasm { since: Instant },
    Host { since: Instant, polls: PollMark },
}

/// The polls of the future that runs one guest: how many have begun, when the one running
/// now began, and how long all the finished ones took (times in nanoseconds from `origin`).
/// Written by [`PollCounted`] and read by the meter, both on the guest's own thread.
struct PollClock {
    origin: Instant,
    begun: AtomicU64,
    current_start: AtomicU64,
    finished: AtomicU64,
}

/// Where a [`PollClock`] stood at one moment.
#[derive(Clone, Copy)]
struct PollMark {
    begun: u64,
    current_start: u64,
    finished: u64,
}

impl PollClock {
    fn new() -> Self {
        PollClock {
            origin: Instant::now(),
            begun: AtomicU64::new(0),
            current_start: AtomicU64::new(0),
            finished: AtomicU64::new(0),
        }
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    fn poll_begins(&self, now: Instant) {
        self.begun.fetch_add(1, Ordering::Relaxed);
        self.current_start.store(self.nanos(now), Ordering::Relaxed);
    }

    fn poll_ends(&self, now: Instant) {
        let took = self
            .nanos(now)
            .saturating_sub(self.current_start.load(Ordering::Relaxed));
        self.finished.fetch_add(took, Ordering::Relaxed);
    }

    fn mark(&self) -> PollMark {
        PollMark {
            begun: self.begun.load(Ordering::Relaxed),
            current_start: self.current_start.load(Ordering::Relaxed),
            finished: self.finished.load(Ordering::Relaxed),
        }
    }

    /// The time the guest's thread spent in polls between `since` (inside the poll `entry`
    /// was taken in) and `now` (inside the poll running now).
    fn busy_between(&self, since: Instant, entry: PollMark, now: Instant) -> Duration {
        let current = self.mark();
        if current.begun == entry.begun {
            return now.saturating_duration_since(since);
        }
        // Every poll that finished since, the one `since` fell in whole...
        let finished = current.finished.saturating_sub(entry.finished);
        // ...less its part before `since`, plus the current poll so far.
        let before_since = self.nanos(since).saturating_sub(entry.current_start);
        let current_so_far = self.nanos(now).saturating_sub(current.current_start);
        Duration::from_nanos(
            finished
                .saturating_sub(before_since)
                .saturating_add(current_so_far),
        )
    }
}

impl CpuMeter {
    /// A meter with nothing used yet, counting against `budget`, and keeping the guest to
    /// `share_percent` of one core.
    pub fn new(budget: Duration, share_percent: u32) -> Self {
        let share = (share_percent < 100).then(|| {
            let fraction = f64::from(share_percent.max(1)) / 100.0;
            ShareCredit {
                fraction,
                credit: fraction,
                settled: Duration::ZERO,
                settled_at: None,
                paused: Duration::ZERO,
            }
        });
        CpuMeter {
            budget,
            guest_time: Duration::ZERO,
            host_work: Duration::ZERO,
            polls: Arc::new(PollClock::new()),
            stretch: None,
            exhausted: false,
            share,
            gauges: None,
        }
    }

    /// The same meter, counting `earlier` as charged already: what the alloc's earlier runs
    /// used, since a runner restarted in place keeps the one budget its alloc has. Counted as
    /// the guest's: a failure then names only this run's host work as the host's share,
    /// never more than it was.
    pub fn charged_already(mut self, earlier: Duration) -> Self {
        self.guest_time = earlier;
        if let Some(share) = &mut self.share {
            share.settled = earlier;
        }
        self
    }

    /// The same meter, publishing what it charges in `gauges`.
    pub fn reporting_to(self, gauges: Arc<UsageGauges>) -> Self {
        CpuMeter {
            gauges: Some(gauges),
            ..self
        }
    }

    /// What counts the polls of the future that runs the guest, for this meter: wrap that
    /// future with [`PollCounter::count`], so that host stretches can tell work from waiting.
    pub fn poll_counter(&self) -> PollCounter {
        PollCounter(self.polls.clone())
    }

    /// The thread enters host code: wasm called the host (an import, or a libcall such as
    /// the epoch deadline), or a call the host made into wasm returned. Charges the wasm
    /// stretch that ends here.
    pub fn entering_host(&mut self) -> wasmtime::Result<()> {
        self.entering_host_at(Instant::now())
    }

    fn entering_host_at(&mut self, now: Instant) -> wasmtime::Result<()> {
        let polls = self.polls.mark();
        match self.stretch.replace(Stretch::Host { since: now, polls }) {
            Some(Stretch::Wasm { since }) => {
                self.charge_guest(now.saturating_duration_since(since))
            }
            _ => Ok(()),
        }
    }

    /// The thread leaves host code for wasm. Charges the host stretch that ends here: the
    /// time of the polls it spans, not the waits between them.
    pub fn leaving_host(&mut self) -> wasmtime::Result<()> {
        self.leaving_host_at(Instant::now())
    }

    fn leaving_host_at(&mut self, now: Instant) -> wasmtime::Result<()> {
        match self.stretch.replace(Stretch::Wasm { since: now }) {
            Some(Stretch::Host { since, polls }) => {
                let work = self.polls.busy_between(since, polls, now);
                self.charge_host(work)
            }
            _ => Ok(()),
        }
    }

    fn charge_guest(&mut self, computed: Duration) -> wasmtime::Result<()> {
        self.guest_time += computed;
        self.publish();
        self.check_budget()
    }

    fn charge_host(&mut self, work: Duration) -> wasmtime::Result<()> {
        self.host_work += work;
        self.publish();
        self.check_budget()
    }

    fn publish(&self) {
        if let Some(gauges) = &self.gauges {
            gauges.set_cpu_used(self.guest_time + self.host_work);
        }
    }

    /// The epoch deadline passed (the stretch of wasm before it is already charged): stop
    /// the guest when the budget is spent, pause it when it is over its CPU share, or else
    /// yield to tokio so other allocs run.
    pub fn on_epoch_deadline(&mut self) -> wasmtime::Result<UpdateDeadline> {
        self.check_budget()?;
        let charged = self.guest_time + self.host_work;
        let pause = self
            .share
            .as_mut()
            .and_then(|share| share.settle(charged, tokio::time::Instant::now()));
        Ok(match pause {
            Some(pause) => UpdateDeadline::YieldCustom(1, Box::pin(tokio::time::sleep(pause))),
            None => UpdateDeadline::YieldCustom(1, Box::pin(tokio::task::yield_now())),
        })
    }

    fn check_budget(&mut self) -> wasmtime::Result<()> {
        if self.guest_time + self.host_work > self.budget {
            self.exhausted = true;
            return Err(wasmtime::Error::msg("CPU budget exhausted"));
        }
        Ok(())
    }

    /// The alloc's description when the guest ran out of budget, if it did, naming the host's
    /// share when it was a tenth or more.
    pub fn failure(&self) -> Option<String> {
        self.exhausted.then(|| {
            let mut description = format!(
                "CPU budget exhausted: used {} of computing time",
                format_duration(self.budget)
            );
            // Named when it is a real part of the budget: a runner spending its budget by
            // making the host work should be told so.
            if self.host_work >= self.budget / 10 {
                description.push_str(&format!(
                    " ({} of it host work on the runner's behalf)",
                    format_duration(self.host_work.min(self.budget))
                ));
            }
            if let Some(share) = self.share.as_ref().filter(|s| !s.paused.is_zero()) {
                description.push_str(&format!(
                    "; paused {} to keep it to its CPU share of {:.0}%",
                    format_duration(share.paused),
                    share.fraction * 100.0
                ));
            }
            description
        })
    }
}

/// Times the polls of the future that runs one guest (see [`CpuMeter::poll_counter`]).
#[derive(Clone)]
pub struct PollCounter(Arc<PollClock>);

impl PollCounter {
    /// `future`, its polls counted and timed.
    pub fn count<F: Future>(self, future: F) -> PollCounted<F> {
        PollCounted {
            inner: Box::pin(future),
            polls: self.0,
        }
    }
}

/// A future whose polls are counted and timed (see [`PollCounter::count`]).
pub struct PollCounted<F> {
    inner: Pin<Box<F>>,
    polls: Arc<PollClock>,
}

impl<F: Future> Future for PollCounted<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<F::Output> {
        self.polls.poll_begins(Instant::now());
        let polled = self.inner.as_mut().poll(context);
        self.polls.poll_ends(Instant::now());
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn computing_and_host_work_share_the_budget_and_waiting_is_free() {
        let mut meter = CpuMeter::new(Duration::from_millis(30), 100);
        meter.charge_guest(Duration::from_millis(10)).unwrap();
        meter.charge_host(Duration::from_millis(15)).unwrap();
        assert!(matches!(
            meter.on_epoch_deadline(),
            Ok(UpdateDeadline::YieldCustom(1, _))
        ));
        assert!(meter.charge_guest(Duration::from_millis(6)).is_err());
        assert!(meter.on_epoch_deadline().is_err());
        assert_eq!(
            meter.failure().unwrap(),
            "CPU budget exhausted: used 30ms of computing time \
             (15ms of it host work on the runner's behalf)"
        );
        let mut computing = CpuMeter::new(Duration::from_millis(30), 100);
        assert!(computing.charge_guest(Duration::from_millis(31)).is_err());
        assert_eq!(
            computing.failure().unwrap(),
            "CPU budget exhausted: used 30ms of computing time"
        );
    }

    #[tokio::test]
    async fn the_counter_times_the_polls_of_what_it_wraps() {
        let meter = CpuMeter::new(Duration::from_secs(60), 100);
        // A yield is polled twice.
        meter.poll_counter().count(tokio::task::yield_now()).await;
        assert_eq!(meter.polls.mark().begun, 2);
    }

    #[test]
    fn host_code_is_charged_for_the_polls_it_spans_and_not_the_waits_between() {
        let mut meter = CpuMeter::new(Duration::from_secs(60), 100);
        let clock = meter.polls.clone();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Poll 1: the host calls into wasm, which computes 1 ms and calls the host.
        clock.poll_begins(at(0));
        meter.leaving_host_at(at(0)).unwrap();
        meter.entering_host_at(at(1)).unwrap();
        assert_eq!(meter.guest_time, Duration::from_millis(1));
        // Host code that returns within its poll: 2 ms of work.
        meter.leaving_host_at(at(3)).unwrap();
        assert_eq!(meter.host_work, Duration::from_millis(2));
        // A call that works 4 ms (lifting its argument), then waits 1,000 ms, then works 1 ms
        // in a later poll before returning to wasm: 5 ms of work, the wait free.
        meter.entering_host_at(at(3)).unwrap();
        clock.poll_ends(at(7));
        clock.poll_begins(at(1_007));
        meter.leaving_host_at(at(1_008)).unwrap();
        assert_eq!(meter.host_work, Duration::from_millis(7));
        // The same, across a poll that only checked and went back to waiting (0.5 ms).
        meter.entering_host_at(at(1_010)).unwrap();
        clock.poll_ends(at(1_011));
        clock.poll_begins(at(2_000));
        clock.poll_ends(at(2_000) + Duration::from_micros(500));
        clock.poll_begins(at(3_000));
        meter.leaving_host_at(at(3_002)).unwrap();
        assert_eq!(
            meter.host_work,
            Duration::from_millis(7 + 1 + 2) + Duration::from_micros(500)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_guest_over_its_share_pauses_until_the_share_has_paid_for_it() {
        // A quarter of a core: a credit of 250 ms to start with, refilling 250 ms a second.
        let mut meter = CpuMeter::new(Duration::from_secs(60), 25);
        let share = meter.share.as_mut().unwrap();
        let start = tokio::time::Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(share.settle(ms(200), start), None, "within the credit");
        // 100 ms more leaves a debt of 50 ms: 200 ms of waiting at a quarter of a core.
        assert_eq!(share.settle(ms(300), start), Some(ms(200)));
        // After that pause, the debt is paid; computing 25 ms in the next 100 ms is allowed.
        assert_eq!(share.settle(ms(300), start + ms(200)), None);
        assert_eq!(share.settle(ms(325), start + ms(300)), None);
        assert_eq!(share.paused, ms(200));
        // A debt of 10 s at a quarter of a core is paid a second at a time.
        assert_eq!(share.settle(ms(2_825), start + ms(300)), Some(ms(1_000)));
        assert_eq!(share.settle(ms(2_825), start + ms(1_300)), Some(ms(1_000)));
        // A full core never pauses.
        assert!(CpuMeter::new(Duration::from_secs(60), 100).share.is_none());
    }
}
