//! One alloc's CPU budget: the time its guest computes, and the time the host works on its
//! behalf, both charged against `cpu`.
//!
//! wasmtime's call hook marks every move between wasm and host code, and the meter times the
//! stretches between them. A stretch of wasm is the guest computing: wasm cannot wait, only
//! call the host, so all of it is charged. A stretch of host code is work done for the guest
//! (lifting its arguments, checking its reports, formatting its log lines, the synchronous
//! WASI calls) when the thread never left it, and a wait when it did: `next-event`, a WASI
//! sleep or poll, the epoch yield, a checkpoint waiting for its commit, and the WASI calls
//! wasmtime-wasi hands to tokio's blocking pool (file reads and writes) all suspend, and are
//! not charged at all.
//!
//! Telling a wait from work: a host stretch that ends within the poll of the future that
//! drives the guest ([`PollCounted`]) it began in never gave the thread back. The budget is
//! checked at every move and at every epoch deadline, where a computing guest also yields to
//! tokio.
//!
//! A CPU share under 100% is kept at the epoch deadlines too: the time charged is taken from
//! a credit that refills at the share (a second's worth at most, which is also where it
//! starts), and a guest in debt is paused, not failed, until the credit is back to zero.
//! This module acts on one store only and never reaches past it.

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
    polls: Arc<AtomicU64>,
    stretch: Option<Stretch>,
    exhausted: bool,
    /// The share of a core the guest may use, when under a whole one.
    share: Option<ShareCredit>,
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

/// The code running now, since when, and (for the host) in which poll it began.
enum Stretch {
    Wasm { since: Instant },
    Host { since: Instant, poll: u64 },
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
            polls: Arc::new(AtomicU64::new(0)),
            stretch: None,
            exhausted: false,
            share,
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
        let now = Instant::now();
        let poll = self.polls.load(Ordering::Relaxed);
        match self.stretch.replace(Stretch::Host { since: now, poll }) {
            Some(Stretch::Wasm { since }) => self.charge_guest(now - since),
            _ => Ok(()),
        }
    }

    /// The thread leaves host code for wasm. Charges the host stretch that ends here when it
    /// never suspended.
    pub fn leaving_host(&mut self) -> wasmtime::Result<()> {
        let now = Instant::now();
        match self.stretch.replace(Stretch::Wasm { since: now }) {
            Some(Stretch::Host { since, poll }) if self.polls.load(Ordering::Relaxed) == poll => {
                self.charge_host(now - since)
            }
            _ => Ok(()),
        }
    }

    fn charge_guest(&mut self, computed: Duration) -> wasmtime::Result<()> {
        self.guest_time += computed;
        self.check_budget()
    }

    fn charge_host(&mut self, work: Duration) -> wasmtime::Result<()> {
        self.host_work += work;
        self.check_budget()
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

/// Counts the polls of the future that runs one guest (see [`CpuMeter::poll_counter`]).
#[derive(Clone)]
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
    async fn host_code_that_suspends_is_a_wait_and_the_rest_is_charged() {
        let mut meter = CpuMeter::new(Duration::from_secs(60), 100);
        // The counter counts the polls of what it wraps: a yield makes two.
        meter.poll_counter().count(tokio::task::yield_now()).await;
        assert_eq!(meter.polls.load(Ordering::Relaxed), 2);
        // The host calls into wasm (nothing to charge yet), wasm computes, calls the host.
        meter.leaving_host().unwrap();
        std::thread::sleep(Duration::from_millis(1));
        meter.entering_host().unwrap();
        assert!(meter.guest_time >= Duration::from_millis(1));
        // Host code that ends within the poll it began in is work.
        std::thread::sleep(Duration::from_millis(1));
        meter.leaving_host().unwrap();
        let worked = meter.host_work;
        assert!(worked >= Duration::from_millis(1));
        // Host code during which the guest's future was polled again waited.
        meter.entering_host().unwrap();
        meter.polls.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(1));
        meter.leaving_host().unwrap();
        assert_eq!(meter.host_work, worked);
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
