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
//! tokio. This module acts on one store only and never reaches past it.

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
}

/// The code running now, since when, and (for the host) in which poll it began.
enum Stretch {
    Wasm { since: Instant },
    Host { since: Instant, poll: u64 },
}

impl CpuMeter {
    /// A meter with nothing used yet, counting against `budget`.
    pub fn new(budget: Duration) -> Self {
        CpuMeter {
            budget,
            guest_time: Duration::ZERO,
            host_work: Duration::ZERO,
            polls: Arc::new(AtomicU64::new(0)),
            stretch: None,
            exhausted: false,
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
    /// the guest when the budget is spent, or yield to tokio so other allocs run.
    pub fn on_epoch_deadline(&mut self) -> wasmtime::Result<UpdateDeadline> {
        self.check_budget()?;
        Ok(UpdateDeadline::YieldCustom(
            1,
            Box::pin(tokio::task::yield_now()),
        ))
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
        let mut meter = CpuMeter::new(Duration::from_millis(30));
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
        let mut computing = CpuMeter::new(Duration::from_millis(30));
        assert!(computing.charge_guest(Duration::from_millis(31)).is_err());
        assert_eq!(
            computing.failure().unwrap(),
            "CPU budget exhausted: used 30ms of computing time"
        );
    }

    #[tokio::test]
    async fn host_code_that_suspends_is_a_wait_and_the_rest_is_charged() {
        let mut meter = CpuMeter::new(Duration::from_secs(60));
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
}
