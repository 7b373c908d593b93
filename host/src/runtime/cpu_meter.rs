//! One alloc's CPU budget: the time its guest computes, and the time the host works on its
//! behalf, both charged against `cpu`.
//!
//! The guest's computing is counted in epoch ticks at every epoch deadline. Host work is
//! timed by wasmtime's call hook, over each stretch of host code between wasm calling it and
//! wasm running again: lifting the guest's arguments, checking and copying its reports,
//! formatting its log lines, encoding its checkpoints, and the synchronous part of WASI
//! calls. Waiting is never charged: time in `next-event`, in a WASI sleep or poll, or queued
//! behind other tasks after a yield belongs to nobody's budget.
//!
//! Telling a wait from work: a stretch that ends within the poll of the future that drives
//! the guest ([`PollCounted`]) it began in never gave the thread back, so its whole time was
//! spent working for the guest; one that spanned polls suspended, and is charged at most one
//! tick, as before (work a WASI call hands to tokio's blocking pool is not charged). This
//! module acts on one store only and never reaches past it.

use super::limits::{EPOCH_TICK, EpochClock};
use crate::units::format_duration;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use wasmtime::UpdateDeadline;

/// Counts the time one alloc spends computing, and the host's work for it, against its budget.
///
/// Called at every epoch deadline while wasm runs, and around every host call. Only ticks
/// since the guest last got the thread are charged: time spent waiting in `next-event` (the
/// host reports it with [`CpuMeter::resumed_since`]) and time spent queued behind other
/// tasks after a yield (the yield itself records when it resumed) belong to nobody's budget.
pub struct CpuMeter {
    clock: EpochClock,
    budget: Duration,
    used_ticks: u64,
    host_work: Duration,
    charged_until: u64,
    resumed_from_yield_at: Arc<AtomicU64>,
    polls: Arc<AtomicU64>,
    in_host: Option<HostStretch>,
    exhausted: bool,
}

/// A stretch of host code run for the guest: when it began, and the poll it began in.
struct HostStretch {
    entered: Instant,
    poll: u64,
}

impl CpuMeter {
    /// A meter with nothing used yet, counting ticks of `clock` against `budget`.
    pub fn new(clock: EpochClock, budget: Duration) -> Self {
        let now = clock.now();
        CpuMeter {
            clock,
            budget,
            used_ticks: 0,
            host_work: Duration::ZERO,
            charged_until: now,
            resumed_from_yield_at: Arc::new(AtomicU64::new(now)),
            polls: Arc::new(AtomicU64::new(0)),
            in_host: None,
            exhausted: false,
        }
    }

    /// What counts the polls of the future that runs the guest, for this meter: wrap that
    /// future with [`PollCounter::count`], so that host calls can tell work from waiting.
    pub fn poll_counter(&self) -> PollCounter {
        PollCounter(self.polls.clone())
    }

    /// The guest came back from a wait at epoch `tick`: ticks before it were not spent
    /// computing.
    pub fn resumed_since(&mut self, tick: u64) {
        self.charged_until = self.charged_until.max(tick);
    }

    /// The thread enters host code: wasm called the host (an import, or a libcall such as
    /// the epoch deadline), or a call the host made into wasm (the guest's allocator, while
    /// the host hands it a result) returned.
    pub fn entering_host(&mut self) {
        self.in_host = Some(HostStretch {
            entered: Instant::now(),
            poll: self.polls.load(Ordering::Relaxed),
        });
    }

    /// The thread leaves host code for wasm: charges the stretch since
    /// [`CpuMeter::entering_host`] when it never suspended, and stops the guest when that
    /// spends the budget. Stretches are charged rather than whole calls because a host call
    /// may run wasm inside it (lowering a string calls the guest's allocator, where an epoch
    /// deadline may yield), and only the host's own stretches are its work.
    pub fn leaving_host(&mut self) -> wasmtime::Result<()> {
        let Some(stretch) = self.in_host.take() else {
            return Ok(());
        };
        if self.polls.load(Ordering::Relaxed) != stretch.poll {
            // It waited; the epoch deadline charges at most one tick for the gap.
            return Ok(());
        }
        self.charge_host_work(stretch.entered.elapsed())
    }

    fn charge_host_work(&mut self, work: Duration) -> wasmtime::Result<()> {
        self.host_work += work;
        // The ticks that passed during the call are this work: not charged again.
        self.charged_until = self.clock.now();
        self.check_budget()
    }

    /// The epoch deadline passed while the guest computed: charge it, then yield to tokio or
    /// stop the guest when the budget is spent.
    pub fn on_epoch_deadline(&mut self) -> wasmtime::Result<UpdateDeadline> {
        let now = self.clock.now();
        let since = self
            .charged_until
            .max(self.resumed_from_yield_at.load(Ordering::Relaxed));
        // At most one tick per deadline: a guest that computes meets a deadline every tick, so
        // a longer gap was spent suspended in some other host call (a WASI sleep, file I/O).
        self.used_ticks += now.saturating_sub(since).min(1);
        self.charged_until = now;
        self.check_budget()?;
        let clock = self.clock.clone();
        let resumed_at = self.resumed_from_yield_at.clone();
        Ok(UpdateDeadline::YieldCustom(
            1,
            Box::pin(async move {
                tokio::task::yield_now().await;
                resumed_at.store(clock.now(), Ordering::Relaxed);
            }),
        ))
    }

    fn used(&self) -> Duration {
        EPOCH_TICK.saturating_mul(u32::try_from(self.used_ticks).unwrap_or(u32::MAX))
            + self.host_work
    }

    fn check_budget(&mut self) -> wasmtime::Result<()> {
        if self.used() > self.budget {
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
            description
        })
    }
}

/// Counts the polls of the future that runs one guest (see [`CpuMeter::poll_counter`]).
pub struct PollCounter(Arc<AtomicU64>);

impl PollCounter {
    /// `future`, its polls counted.
    pub fn count<F: Future>(self, future: F) -> PollCounted<F> {
        PollCounted {
            inner: Box::pin(future),
            polls: self.0,
        }
    }
}

/// A future whose polls are counted (see [`PollCounter::count`]).
pub struct PollCounted<F> {
    inner: Pin<Box<F>>,
    polls: Arc<AtomicU64>,
}

impl<F: Future> Future for PollCounted<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<F::Output> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        self.inner.as_mut().poll(context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_is_not_charged_and_computing_is() {
        let clock = EpochClock::default();
        let mut meter = CpuMeter::new(clock.clone(), Duration::from_millis(30));
        // A long wait, then one deadline right after resuming: nothing charged.
        for _ in 0..1000 {
            clock.advance();
        }
        meter.resumed_since(clock.now());
        assert!(matches!(
            meter.on_epoch_deadline(),
            Ok(UpdateDeadline::YieldCustom(1, _))
        ));
        // Three ticks of computing stay within 30 ms; the fourth exhausts it.
        for _ in 0..3 {
            clock.advance();
            assert!(meter.on_epoch_deadline().is_ok());
        }
        clock.advance();
        assert!(meter.on_epoch_deadline().is_err());
        assert_eq!(
            meter.failure().unwrap(),
            "CPU budget exhausted: used 30ms of computing time"
        );
    }

    #[test]
    fn host_work_counts_against_the_budget_alongside_computing() {
        let clock = EpochClock::default();
        let mut meter = CpuMeter::new(clock.clone(), Duration::from_millis(30));
        clock.advance();
        assert!(meter.on_epoch_deadline().is_ok());
        // 15 ms of host work during which two ticks pass: those ticks are the work, not
        // charged again at the next deadline.
        assert!(meter.charge_host_work(Duration::from_millis(15)).is_ok());
        clock.advance();
        clock.advance();
        meter.resumed_since(clock.now() - 2);
        // 10 ms computed + 15 ms of host work: within 30 ms. The next tick passes it.
        clock.advance();
        assert!(meter.on_epoch_deadline().is_err());
        assert_eq!(
            meter.failure().unwrap(),
            "CPU budget exhausted: used 30ms of computing time \
             (15ms of it host work on the runner's behalf)"
        );
    }

    #[tokio::test]
    async fn host_code_that_suspends_is_a_wait_and_host_code_that_does_not_is_work() {
        let mut meter = CpuMeter::new(EpochClock::default(), Duration::from_secs(60));
        // The counter counts the polls of what it wraps: a yield makes two.
        meter.poll_counter().count(tokio::task::yield_now()).await;
        assert_eq!(meter.polls.load(Ordering::Relaxed), 2);
        // A stretch of host code that ends within the poll it began in is work.
        meter.entering_host();
        std::thread::sleep(Duration::from_millis(1));
        meter.leaving_host().unwrap();
        let worked = meter.host_work;
        assert!(worked >= Duration::from_millis(1));
        // One during which the guest's future was polled again waited: nothing charged.
        meter.entering_host();
        meter.polls.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(1));
        meter.leaving_host().unwrap();
        assert_eq!(meter.host_work, worked);
        // Leaving without having entered (the host's first call into the guest) is nothing.
        meter.leaving_host().unwrap();
        assert_eq!(meter.host_work, worked);
    }
}
