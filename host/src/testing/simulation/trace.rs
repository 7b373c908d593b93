//! What a simulation saw, in order: each line stamped with the simulated time, hashed as it
//! is written (two runs of one seed must hash alike), the last lines kept to show with a
//! violation, every line when asked for. And the seeded draws every choice comes from.

use crate::util::determinism::simulated::splitmix64;
use crate::util::locks::LockUnpoisoned;
use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How many lines a trace keeps when it does not keep them all.
const TAIL_LINES: usize = 40;

/// The trace of one simulation. Cheap to clone; every clone writes to the same one.
#[derive(Clone)]
pub(super) struct Trace(Arc<Mutex<TraceState>>);

struct TraceState {
    started: tokio::time::Instant,
    hasher: Sha256,
    lines: VecDeque<String>,
    keep_all: bool,
    written: u64,
}

impl Trace {
    /// A trace whose clock starts now; `keep_all`: every line, else the last few.
    pub(super) fn new(keep_all: bool) -> Trace {
        Trace(Arc::new(Mutex::new(TraceState {
            started: tokio::time::Instant::now(),
            hasher: Sha256::new(),
            lines: VecDeque::new(),
            keep_all,
            written: 0,
        })))
    }

    pub(super) fn record(&self, event: String) {
        let mut state = self.0.lock_unpoisoned();
        let at = state.started.elapsed().as_millis();
        let line = format!("{at:>9}ms {event}");
        state.hasher.update(line.as_bytes());
        state.hasher.update(b"\n");
        state.written += 1;
        state.lines.push_back(line);
        if !state.keep_all && state.lines.len() > TAIL_LINES {
            state.lines.pop_front();
        }
    }

    /// How long the simulation has run, in simulated time.
    pub(super) fn elapsed(&self) -> Duration {
        self.0.lock_unpoisoned().started.elapsed()
    }

    /// The hash of every line so far, in hex (16 digits), the number of lines, and the
    /// lines kept.
    pub(super) fn finish(&self) -> (String, u64, Vec<String>) {
        let state = self.0.lock_unpoisoned();
        let digest = state.hasher.clone().finalize();
        let hex = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        (hex, state.written, state.lines.iter().cloned().collect())
    }
}

/// FNV-1a: a stable hash of bytes, to mix an alloc's id into the seed.
pub(super) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The simulation's own draws (what to do next, which faults), apart from the host's.
pub(super) struct Draws(u64);

impl Draws {
    pub(super) fn new(seed: u64) -> Draws {
        Draws(seed ^ 0x5eed_5eed_5eed_5eed)
    }

    /// A number in `0..n` (`n` > 0).
    pub(super) fn below(&mut self, n: u64) -> u64 {
        splitmix64(&mut self.0) % n.max(1)
    }

    /// True `percent` times in a hundred.
    pub(super) fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// A duration in `from..to` milliseconds.
    pub(super) fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to.saturating_sub(from)))
    }
}
