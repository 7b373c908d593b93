//! One alloc's CPU budget: the time its guest computes, and the time the host works on its
//! behalf, both charged against `cpu`.
//!
//! Everything the guest's thread does for it happens inside a poll of the future that drives
//! the guest: wasm computing, and host code working for it (instantiating it, lowering its
//! arguments, lifting its reports, formatting its log lines, the synchronous WASI calls).
//! A wait happens between polls: `next-event`, a WASI sleep or poll, the epoch yield, a
//! checkpoint waiting for its commit, and the WASI calls wasmtime-wasi hands to tokio's
//! blocking pool all suspend. So that future is wrapped ([`PollCounted`]), the time inside
//! each of its polls is measured, and their sum is what the alloc has used: a call that lifts
//! a 4 MiB argument and then waits pays for the lifting, and a `next-event` that waits an
//! hour pays for nothing but its own few microseconds. Work done off the guest's thread (the
//! blocking pool's file reads and writes, the state store's commits, the alloc log writer) is
//! not timed here: the disk quota, the checkpoint rate and the log rates bound it.
//!
//! Which part was the host's is told apart for the failure message: wasmtime's call hook
//! marks each call from wasm into the host (its imports, and libcalls such as a memory grown
//! or the epoch check) and its return, and the polls' time between the two is host work.
//! The host's calls into wasm (an export, or `cabi_realloc` while a value is lowered into
//! the guest's memory) are not timed: three in four moves of a start are those, and what
//! they take is in the polls already. The budget is checked at every host call and return,
//! and at every epoch deadline, where a computing guest also yields to tokio.
//!
//! A CPU share under 100% is kept at the epoch deadlines too: the time charged is taken from
//! a credit that refills at the share (a second's worth at most, which is also where it
//! starts), and a guest in debt is paused, not failed, until the credit is back to zero.
//! This module acts on one store only and never reaches past it.

use crate::runtime::sandbox::store_limits::UsageGauges;
use crate::util::units::format_duration;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use wasmtime::{CallHook, UpdateDeadline};

/// Counts the time one alloc spends computing, and the host's work for it, against its budget.
///
/// Times are kept in nanoseconds: a call hook runs at every host call, and a `Duration` made
/// from nanoseconds costs a division.
pub struct CpuMeter {
    budget: Duration,
    /// What the alloc's earlier runs used, in nanoseconds.
    earlier: u64,
    /// The host's part of this run, in nanoseconds: the polls' time inside host calls.
    host_work: u64,
    polls: Arc<PollClock>,
    /// The host call running now: when it began (on the poll clock), and where the polls
    /// stood then.
    in_host: Option<(u64, PollMark)>,
    /// How many host calls are running, one inside another: a libcall (a memory grown, say)
    /// made by the guest's `cabi_realloc` while the host lowers a value is part of the call
    /// the host was making.
    host_depth: u32,
    exhausted: bool,
    /// The share of a core the guest may use, when under a whole one.
    share: Option<ShareCredit>,
    gauges: Option<Arc<UsageGauges>>,
}

/// `duration` in nanoseconds, as far as a `u64` goes (584 years).
fn nanos_of(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
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

/// The polls of the future that runs one guest: when the one running now began, and how long
/// all the finished ones took (times in nanoseconds from `origin`).
/// Written by [`PollCounted`] and read by the meter, both on the guest's own thread.
struct PollClock {
    origin: Instant,
    current_start: AtomicU64,
    finished: AtomicU64,
}

/// `current_start` between polls: a time so late that no poll is counted as running.
const NOT_POLLING: u64 = u64::MAX;

/// Where a [`PollClock`] stood at one moment.
#[derive(Clone, Copy)]
struct PollMark {
    current_start: u64,
    finished: u64,
}

impl PollClock {
    fn new() -> Self {
        PollClock {
            origin: Instant::now(),
            current_start: AtomicU64::new(NOT_POLLING),
            finished: AtomicU64::new(0),
        }
    }

    /// `at` on this clock: nanoseconds from `origin`. Taken once per call hook, and used for
    /// everything that hook works out.
    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    fn poll_begins(&self, now: Instant) {
        self.current_start.store(self.nanos(now), Ordering::Relaxed);
    }

    fn poll_ends(&self, now: Instant) {
        let took = self
            .nanos(now)
            .saturating_sub(self.current_start.swap(NOT_POLLING, Ordering::Relaxed));
        self.finished.fetch_add(took, Ordering::Relaxed);
    }

    fn mark(&self) -> PollMark {
        PollMark {
            current_start: self.current_start.load(Ordering::Relaxed),
            finished: self.finished.load(Ordering::Relaxed),
        }
    }

    /// The time of every poll so far, the one running now (at `now`), if one is, included.
    fn busy_until(&self, now: u64) -> u64 {
        let current_so_far = now.saturating_sub(self.current_start.load(Ordering::Relaxed));
        self.finished
            .load(Ordering::Relaxed)
            .saturating_add(current_so_far)
    }

    /// The time of the polls that have finished.
    fn busy_finished(&self) -> u64 {
        self.finished.load(Ordering::Relaxed)
    }

    /// The time the guest's thread spent in polls between `since` (inside the poll `entry`
    /// was taken in) and `now` (inside the poll running now).
    /// When no poll runs at `now` (a run dropped midway), the polls up to the last one.
    fn busy_between(&self, since: u64, entry: PollMark, now: u64) -> u64 {
        let current = self.mark();
        // Every poll that finished since, the one `since` fell in whole, and the one running
        // now so far (one and the same when `since` fell in it)...
        let finished = current.finished.saturating_sub(entry.finished);
        let current_so_far = now.saturating_sub(current.current_start);
        // ...less the part of the first before `since`.
        let before_since = since.saturating_sub(entry.current_start);
        finished
            .saturating_add(current_so_far)
            .saturating_sub(before_since)
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
            earlier: 0,
            host_work: 0,
            polls: Arc::new(PollClock::new()),
            in_host: None,
            host_depth: 0,
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
        self.earlier = nanos_of(earlier);
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
    /// future with [`PollCounter::count`], so that the meter sees the time it works.
    pub fn poll_counter(&self) -> PollCounter {
        PollCounter(self.polls.clone())
    }

    /// wasmtime's call hook, for every move between wasm and the host, on the guest's thread:
    /// inside a poll of its future, but for the unwinding of a run dropped midway, which
    /// adds nothing. Times the calls into the host and checks the budget at each.
    pub fn on_call_hook(&mut self, hook: CallHook) -> wasmtime::Result<()> {
        match hook {
            CallHook::CallingHost => self.host_called_at(Instant::now()),
            CallHook::ReturningFromHost => self.host_returned_at(Instant::now()),
            // The host calling an export or `cabi_realloc`: inside the polls, so charged.
            CallHook::CallingWasm | CallHook::ReturningFromWasm => Ok(()),
        }
    }

    fn host_called_at(&mut self, now: Instant) -> wasmtime::Result<()> {
        let now = self.polls.nanos(now);
        // Refused first: wasmtime makes no call, and so no return, when this fails.
        self.charge(self.used_at(now))?;
        self.host_depth += 1;
        if self.host_depth == 1 {
            self.in_host = Some((now, self.polls.mark()));
        }
        Ok(())
    }

    fn host_returned_at(&mut self, now: Instant) -> wasmtime::Result<()> {
        let now = self.polls.nanos(now);
        self.host_depth = self.host_depth.saturating_sub(1);
        if self.host_depth == 0
            && let Some((since, entry)) = self.in_host.take()
        {
            self.host_work = self
                .host_work
                .saturating_add(self.polls.busy_between(since, entry, now));
        }
        self.charge(self.used_at(now))
    }

    /// All the alloc has used by `now` (on the poll clock), inside a poll of the guest's
    /// future, in nanoseconds.
    fn used_at(&self, now: u64) -> u64 {
        self.earlier.saturating_add(self.polls.busy_until(now))
    }

    /// The guest's run has ended (its future is no longer polled): publishes all it used,
    /// which the alloc's next run starts from.
    pub fn run_ended(&mut self) {
        self.publish(self.earlier.saturating_add(self.polls.busy_finished()));
    }

    fn charge(&mut self, used: u64) -> wasmtime::Result<()> {
        self.publish(used);
        if used > nanos_of(self.budget) {
            self.exhausted = true;
            return Err(wasmtime::Error::msg("CPU budget exhausted"));
        }
        Ok(())
    }

    fn publish(&self, used: u64) {
        if let Some(gauges) = &self.gauges {
            gauges.set_cpu_used_nanos(used);
        }
    }

    /// The host's part of this run.
    fn host_work(&self) -> Duration {
        Duration::from_nanos(self.host_work)
    }

    /// The epoch deadline passed: stop the guest when the budget is spent, pause it when it
    /// is over its CPU share, or else yield to tokio so other allocs run.
    pub fn on_epoch_deadline(&mut self) -> wasmtime::Result<UpdateDeadline> {
        self.on_epoch_deadline_at(Instant::now())
    }

    fn on_epoch_deadline_at(&mut self, now: Instant) -> wasmtime::Result<UpdateDeadline> {
        let used = self.used_at(self.polls.nanos(now));
        self.charge(used)?;
        let pause = self.share.as_mut().and_then(|share| {
            share.settle(Duration::from_nanos(used), tokio::time::Instant::now())
        });
        Ok(match pause {
            Some(pause) => UpdateDeadline::YieldCustom(1, Box::pin(tokio::time::sleep(pause))),
            None => UpdateDeadline::YieldCustom(1, Box::pin(tokio::task::yield_now())),
        })
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
            let host_work = self.host_work();
            if host_work >= self.budget / 10 {
                description.push_str(&format!(
                    " ({} of it host work on the runner's behalf)",
                    format_duration(host_work.min(self.budget))
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
            inner: future,
            polls: self.0,
        }
    }
}

pin_project_lite::pin_project! {
    /// A future whose polls are counted and timed (see [`PollCounter::count`]). It holds the
    /// future it counts in place: boxing it would cost every alloc's start an allocation
    /// and a copy of the future, twice.
    pub struct PollCounted<F> {
        #[pin]
        inner: F,
        polls: Arc<PollClock>,
    }
}

impl<F: Future> Future for PollCounted<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        this.polls.poll_begins(Instant::now());
        let polled = this.inner.poll(context);
        this.polls.poll_ends(Instant::now());
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A meter on `budget`, its poll clock, and a time line in milliseconds from a moment of
    /// its own, at which the guest's first poll began.
    fn meter_in_first_poll(
        budget: Duration,
    ) -> (CpuMeter, Arc<PollClock>, impl Fn(u64) -> Instant) {
        let meter = CpuMeter::new(budget, 100);
        let clock = meter.polls.clone();
        let t0 = Instant::now();
        let at = move |ms| t0 + Duration::from_millis(ms);
        clock.poll_begins(at(0));
        (meter, clock, at)
    }

    #[test]
    fn computing_and_host_work_share_the_budget_and_waiting_is_free() {
        let ms = Duration::from_millis;
        let (mut meter, clock, at) = meter_in_first_poll(ms(30));
        // 10 ms of computing, then an import that works 15 ms.
        meter.host_called_at(at(10)).unwrap();
        meter.host_returned_at(at(25)).unwrap();
        assert_eq!(
            Duration::from_nanos(meter.used_at(clock.nanos(at(25)))),
            ms(25)
        );
        // Waiting between polls is free; 5 ms more in the next poll, 3 of them the host's,
        // is over the budget.
        clock.poll_ends(at(26));
        clock.poll_begins(at(1_000));
        meter.host_called_at(at(1_002)).unwrap();
        assert!(meter.host_returned_at(at(1_005)).is_err());
        assert_eq!(
            meter.failure().unwrap(),
            "CPU budget exhausted: used 30ms of computing time \
             (18ms of it host work on the runner's behalf)"
        );

        let (mut computing, _, at) = meter_in_first_poll(ms(30));
        assert!(computing.host_called_at(at(31)).is_err());
        assert_eq!(
            computing.failure().unwrap(),
            "CPU budget exhausted: used 30ms of computing time"
        );
    }

    #[test]
    fn an_epoch_deadline_counts_the_poll_running_now() {
        let (mut meter, _, at) = meter_in_first_poll(Duration::from_millis(10));
        assert!(matches!(
            meter.on_epoch_deadline_at(at(5)),
            Ok(UpdateDeadline::YieldCustom(1, _))
        ));
        // Computing for 20 ms in one poll, never calling the host, is stopped at the next.
        assert!(meter.on_epoch_deadline_at(at(20)).is_err());
        assert_eq!(
            meter.failure().unwrap(),
            "CPU budget exhausted: used 10ms of computing time"
        );
    }

    #[test]
    fn a_host_call_refused_for_the_budget_leaves_no_call_open() {
        let ms = Duration::from_millis;
        let (mut meter, _, at) = meter_in_first_poll(ms(10));
        meter.host_called_at(at(1)).unwrap();
        // Lowering its result, `cabi_realloc` grows memory: that libcall is refused, and
        // wasmtime makes no call and so no return for it. The import's return still counts.
        assert!(meter.host_called_at(at(11)).is_err());
        assert!(meter.host_returned_at(at(12)).is_err());
        assert_eq!(meter.host_work(), ms(11));
        assert_eq!(meter.host_depth, 0);
    }

    #[test]
    fn host_work_stops_at_the_last_poll_when_none_runs() {
        let (mut meter, clock, at) = meter_in_first_poll(Duration::from_secs(60));
        meter.host_called_at(at(1)).unwrap();
        clock.poll_ends(at(4));
        // A run dropped while its import waited unwinds outside any poll, much later.
        meter.host_returned_at(at(5_000)).unwrap();
        assert_eq!(meter.host_work(), Duration::from_millis(3));
    }

    #[test]
    fn what_a_run_used_is_published_when_it_ends_and_counted_by_the_next() {
        let ms = Duration::from_millis;
        let gauges = Arc::new(UsageGauges::default());
        let mut first = CpuMeter::new(ms(100), 100).reporting_to(gauges.clone());
        let clock = first.polls.clone();
        let t0 = Instant::now();
        // Computing between the last import call and the end of the run counts too.
        clock.poll_begins(t0);
        first.host_called_at(t0 + ms(1)).unwrap();
        first.host_returned_at(t0 + ms(2)).unwrap();
        clock.poll_ends(t0 + ms(40));
        first.run_ended();
        assert_eq!(gauges.snapshot().cpu_used, ms(40));

        let mut second = CpuMeter::new(ms(100), 100)
            .charged_already(gauges.snapshot().cpu_used)
            .reporting_to(gauges.clone());
        second.polls.poll_begins(t0 + ms(50));
        assert!(second.host_called_at(t0 + ms(111)).is_err(), "40 + 61 ms");
        assert_eq!(gauges.snapshot().cpu_used, ms(101));
    }

    #[tokio::test]
    async fn the_counter_times_the_polls_of_what_it_wraps() {
        let meter = CpuMeter::new(Duration::from_secs(60), 100);
        // Two polls that each work a millisecond.
        let mut polls = 0;
        let working = std::future::poll_fn(|context| {
            let begun = Instant::now();
            while begun.elapsed() < Duration::from_millis(1) {
                std::hint::spin_loop();
            }
            polls += 1;
            if polls == 2 {
                return Poll::Ready(());
            }
            context.waker().wake_by_ref();
            Poll::Pending
        });
        meter.poll_counter().count(working).await;
        assert!(Duration::from_nanos(meter.polls.busy_finished()) >= Duration::from_millis(2));
        assert_eq!(meter.polls.mark().current_start, NOT_POLLING);
    }

    #[test]
    fn host_code_is_charged_for_the_polls_it_spans_and_not_the_waits_between() {
        let ms = Duration::from_millis;
        let (mut meter, clock, at) = meter_in_first_poll(Duration::from_secs(60));
        // Poll 1: the guest computes 1 ms and calls an import, which returns within its
        // poll: 2 ms of work.
        meter.host_called_at(at(1)).unwrap();
        meter.host_returned_at(at(3)).unwrap();
        assert_eq!(meter.host_work(), ms(2));
        // A call that works 4 ms (lifting its argument), then waits 1,000 ms, then works 1 ms
        // in a later poll before returning to wasm: 5 ms of work, the wait free.
        meter.host_called_at(at(3)).unwrap();
        clock.poll_ends(at(7));
        clock.poll_begins(at(1_007));
        meter.host_returned_at(at(1_008)).unwrap();
        assert_eq!(meter.host_work(), ms(7));
        // The same, across a poll that only checked and went back to waiting (0.5 ms).
        meter.host_called_at(at(1_010)).unwrap();
        clock.poll_ends(at(1_011));
        clock.poll_begins(at(2_000));
        clock.poll_ends(at(2_000) + Duration::from_micros(500));
        clock.poll_begins(at(3_000));
        meter.host_returned_at(at(3_002)).unwrap();
        assert_eq!(
            meter.host_work(),
            ms(7 + 1 + 2) + Duration::from_micros(500)
        );
        // All it used is the polls' time, the computing between the calls included.
        assert_eq!(
            Duration::from_nanos(meter.used_at(clock.nanos(at(3_002)))),
            ms(7 + 4 + 2) + Duration::from_micros(500)
        );
    }

    #[test]
    fn the_hosts_calls_into_wasm_are_not_timed_apart() {
        let (mut meter, _, at) = meter_in_first_poll(Duration::from_secs(60));
        meter.host_called_at(at(1)).unwrap();
        // The host lowering a result calls the guest's `cabi_realloc`, which grows its memory
        // (a libcall, a host call of its own): all of it is the import's.
        meter.on_call_hook(CallHook::CallingWasm).unwrap();
        meter.host_called_at(at(2)).unwrap();
        meter.host_returned_at(at(3)).unwrap();
        meter.on_call_hook(CallHook::ReturningFromWasm).unwrap();
        meter.host_returned_at(at(4)).unwrap();
        assert_eq!(meter.host_work(), Duration::from_millis(3));
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
