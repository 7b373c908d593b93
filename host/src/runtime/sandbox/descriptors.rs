//! The host descriptors runners hold, against one budget for the whole agent.
//!
//! Every file or directory a guest opens through WASI (`open-at`) is a descriptor of the
//! agent's process. Each alloc is held to its own handle limit (`open_files`), but a thousand
//! allocs at their limits would hold far more descriptors than the process may open, and
//! then the agent could no longer accept a connection, write a log file or save its state.
//! So the agent gives runners one budget, the descriptor limit less a reserve of its own
//! ([`DescriptorBudget`]), and each store counts what it took from it ([`HeldDescriptors`]):
//! an open past the budget fails in the guest (`quota`), its neighbours' files stay open,
//! and the agent keeps its reserve whatever runners do.
//!
//! A descriptor is given back when the guest drops it, and everything a store still holds
//! when the store is dropped (a trap, a kill), since its table closes them then. Only
//! descriptors opened through `open-at` are counted: a preopen handle is not a new
//! descriptor, and dropping one gives nothing back.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// How many descriptors runners may hold together.
#[derive(Debug)]
pub struct DescriptorBudget {
    /// `None`: no budget (a command that runs one alloc).
    most: Option<u64>,
    held: AtomicU64,
}

impl DescriptorBudget {
    /// A budget of `most` descriptors for every runner together (`None`: unbounded).
    pub fn new(most: Option<u64>) -> Arc<DescriptorBudget> {
        Arc::new(DescriptorBudget {
            most,
            held: AtomicU64::new(0),
        })
    }

    /// How many runners hold now, all stores together.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    fn take(&self) -> bool {
        let Some(most) = self.most else {
            self.held.fetch_add(1, Ordering::Relaxed);
            return true;
        };
        self.held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                (held < most).then_some(held + 1)
            })
            .is_ok()
    }

    fn give_back(&self, count: u64) {
        self.held.fetch_sub(count, Ordering::Relaxed);
    }
}

/// What one store holds of the budget: the descriptors its guest opened and has not
/// dropped, by resource handle. Everything left is given back when it is dropped.
#[derive(Debug)]
pub struct HeldDescriptors {
    budget: Arc<DescriptorBudget>,
    held: HashSet<u32>,
    /// Taken for opens under way: a run stopped in the middle of one (a kill, a timeout)
    /// never says how it ended, and the store's end gives these back too.
    pending: u64,
}

impl HeldDescriptors {
    /// Nothing held yet, of `budget`.
    pub fn of(budget: Arc<DescriptorBudget>) -> HeldDescriptors {
        HeldDescriptors {
            budget,
            held: HashSet::new(),
            pending: 0,
        }
    }

    /// Takes one from the budget for an open about to be made; false when none is left.
    /// Follow it with [`HeldDescriptors::opened`] or [`HeldDescriptors::not_opened`].
    pub fn reserve(&mut self) -> bool {
        let taken = self.budget.take();
        self.pending += u64::from(taken);
        taken
    }

    /// The reserved open made descriptor `handle` (its resource handle).
    pub fn opened(&mut self, handle: u32) {
        self.pending = self.pending.saturating_sub(1);
        if !self.held.insert(handle) {
            // A handle reused while still held cannot happen; if it did, keep the count true.
            self.budget.give_back(1);
        }
    }

    /// The reserved open failed.
    pub fn not_opened(&mut self) {
        self.pending = self.pending.saturating_sub(1);
        self.budget.give_back(1);
    }

    /// The guest dropped descriptor `handle`: given back if it was counted.
    pub fn dropped(&mut self, handle: u32) {
        if self.held.remove(&handle) {
            self.budget.give_back(1);
        }
    }
}

impl Drop for HeldDescriptors {
    fn drop(&mut self) {
        self.budget.give_back(self.held.len() as u64 + self.pending);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runners_together_hold_no_more_than_the_budget_and_a_store_gives_back_what_it_held() {
        let budget = DescriptorBudget::new(Some(3));
        let mut first = HeldDescriptors::of(budget.clone());
        let mut second = HeldDescriptors::of(budget.clone());
        for handle in 0..2 {
            assert!(first.reserve());
            first.opened(handle);
        }
        assert!(second.reserve());
        second.opened(7);
        assert!(!second.reserve(), "the budget is spent");
        assert_eq!(budget.held(), 3);
        first.dropped(0);
        first.dropped(99); // never counted: a preopen's handle
        assert_eq!(budget.held(), 2);
        assert!(second.reserve());
        second.not_opened();
        drop(first);
        assert_eq!(budget.held(), 1, "a dropped store gives back what it held");
        drop(second);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn an_open_never_finished_is_given_back_with_its_store() {
        let budget = DescriptorBudget::new(Some(3));
        let mut held = HeldDescriptors::of(budget.clone());
        assert!(held.reserve());
        // The run is stopped here, mid-open: neither `opened` nor `not_opened` comes.
        drop(held);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn without_a_budget_every_open_is_counted_and_allowed() {
        let budget = DescriptorBudget::new(None);
        let mut held = HeldDescriptors::of(budget.clone());
        for handle in 0..10_000 {
            assert!(held.reserve());
            held.opened(handle);
        }
        assert_eq!(budget.held(), 10_000);
    }
}
