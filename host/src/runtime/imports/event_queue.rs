//! The queue of [`Event`]s the host sends one alloc's runner (updates, signals, task
//! restarts, `kill`, `shutdown`): one sender, the runner's, and one receiver, handed from
//! each run's store to the next.
//!
//! A live alloc holds its queue for its whole life and it is nearly always empty, so the
//! queue allocates no buffer until an event is sent (only its shared part, about 100 bytes):
//! tokio's unbounded channel allocated a block of 32 slots (about 2 KiB) up front, the largest single cost of an idle alloc's
//! host memory after wasmtime's own. What bounds it is the sender's business (the runner
//! counts queued signals and restarts against `MAX_QUEUED_TASK_ACTIONS`). Knows nothing but
//! the event type.

use crate::runtime::imports::bindings::Event;
use crate::util::locks::LockUnpoisoned;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

#[derive(Default)]
struct Queue {
    events: VecDeque<Event>,
    sender_gone: bool,
    receiver_gone: bool,
}

#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    /// Holds one wake-up for the receiver, given by every send and by the sender's drop.
    ready: Notify,
}

/// The sending side; dropping it ends the receiver's `recv` with `None` once the queue is
/// empty.
pub(crate) struct EventSender(Arc<Shared>);

/// The receiving side.
pub(crate) struct EventReceiver(Arc<Shared>);

/// A new, empty queue.
pub(crate) fn event_queue() -> (EventSender, EventReceiver) {
    let shared = Arc::new(Shared::default());
    (EventSender(shared.clone()), EventReceiver(shared))
}

impl EventSender {
    /// Queues `event` behind those queued before it; dropped if the receiver is gone.
    pub(crate) fn send(&self, event: Event) {
        {
            let mut queue = self.0.queue.lock_unpoisoned();
            if queue.receiver_gone {
                return;
            }
            queue.events.push_back(event);
        }
        self.0.ready.notify_one();
    }
}

impl Drop for EventSender {
    fn drop(&mut self) {
        self.0.queue.lock_unpoisoned().sender_gone = true;
        self.0.ready.notify_one();
    }
}

/// Why [`EventReceiver::try_recv`] has no event to give.
#[derive(Debug, PartialEq, Eq)]
enum TryRecvError {
    /// Nothing is queued now.
    Empty,
    /// Nothing is queued and the sender is gone: nothing will be.
    Disconnected,
}

impl EventReceiver {
    /// The oldest queued event, without waiting.
    fn try_recv(&mut self) -> Result<Event, TryRecvError> {
        let mut queue = self.0.queue.lock_unpoisoned();
        match queue.events.pop_front() {
            Some(event) => Ok(event),
            None if queue.sender_gone => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }

    /// The oldest queued event, waiting for one if there is none; `None` once the queue is
    /// empty and its sender gone. Cancel-safe: an event is taken only when it is returned.
    pub(crate) async fn recv(&mut self) -> Option<Event> {
        loop {
            match self.try_recv() {
                Ok(event) => return Some(event),
                Err(TryRecvError::Disconnected) => return None,
                // A send between the look and this wait left its wake-up stored.
                Err(TryRecvError::Empty) => self.0.ready.notified().await,
            }
        }
    }

    /// As [`recv`](Self::recv), waiting at most `within` (`None`: as long as it takes);
    /// [`TimedOut`] when it passed first. A zero wait only looks at the queue: a tokio
    /// timer of zero would wait for the timer wheel's next millisecond tick and a worker to
    /// process it, holding the waiting alloc's instance all the while.
    pub(crate) async fn recv_within(
        &mut self,
        within: Option<Duration>,
    ) -> Result<Option<Event>, TimedOut> {
        match within {
            None => Ok(self.recv().await),
            Some(within) if within.is_zero() => match self.try_recv() {
                Ok(event) => Ok(Some(event)),
                Err(TryRecvError::Disconnected) => Ok(None),
                Err(TryRecvError::Empty) => Err(TimedOut),
            },
            Some(within) => tokio::time::timeout(within, self.recv())
                .await
                .map_err(|_| TimedOut),
        }
    }
}

/// What [`EventReceiver::recv_within`] gives when its time passed before an event came.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TimedOut;

impl Drop for EventReceiver {
    fn drop(&mut self) {
        let mut queue = self.0.queue.lock_unpoisoned();
        queue.receiver_gone = true;
        queue.events.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn events_arrive_in_the_order_sent_then_none_once_the_sender_is_gone() {
        let (sender, mut receiver) = event_queue();
        sender.send(Event::Shutdown);
        sender.send(Event::Kill);
        drop(sender);
        assert!(matches!(receiver.recv().await, Some(Event::Shutdown)));
        assert!(matches!(receiver.recv().await, Some(Event::Kill)));
        assert!(receiver.recv().await.is_none());
    }

    /// `receiver` waiting in `recv` on a task of its own; what it got, once woken.
    async fn waiting(mut receiver: EventReceiver) -> tokio::task::JoinHandle<Option<Event>> {
        let waiter = tokio::spawn(async move { receiver.recv().await });
        // On this one-thread runtime, yielding lets the waiter run until it waits.
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        waiter
    }

    /// What `waiter` got; a lost wake-up fails here rather than hanging the test run.
    async fn woken(waiter: tokio::task::JoinHandle<Option<Event>>) -> Option<Event> {
        let received = tokio::time::timeout(Duration::from_secs(10), waiter).await;
        received.expect("the waiter is woken").unwrap()
    }

    #[tokio::test]
    async fn a_receiver_already_waiting_is_woken_by_a_send() {
        let (sender, receiver) = event_queue();
        let waiter = waiting(receiver).await;
        sender.send(Event::Kill);
        assert!(matches!(woken(waiter).await, Some(Event::Kill)));
    }

    #[tokio::test]
    async fn a_receiver_already_waiting_gets_none_when_the_sender_goes() {
        let (sender, receiver) = event_queue();
        let waiter = waiting(receiver).await;
        drop(sender);
        assert!(woken(waiter).await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_given_up_loses_no_event() {
        let (sender, mut receiver) = event_queue();
        let timed_out = tokio::time::timeout(Duration::from_secs(1), receiver.recv()).await;
        assert!(timed_out.is_err());
        sender.send(Event::Kill);
        // The wake-up the abandoned wait left does not stand in for the event either.
        assert!(matches!(receiver.recv().await, Some(Event::Kill)));
        let empty = tokio::time::timeout(Duration::from_secs(1), receiver.recv()).await;
        assert!(empty.is_err(), "one event is received once");
    }

    #[test]
    fn try_recv_takes_what_is_queued_and_tells_empty_from_gone() {
        let (sender, mut receiver) = event_queue();
        assert_eq!(receiver.try_recv().err(), Some(TryRecvError::Empty));
        sender.send(Event::Kill);
        drop(sender);
        assert!(matches!(receiver.try_recv(), Ok(Event::Kill)));
        assert_eq!(receiver.try_recv().err(), Some(TryRecvError::Disconnected));
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_wait_answers_from_the_queue_without_the_clock_moving() {
        let (sender, mut receiver) = event_queue();
        // Between two ticks of the timer wheel, where a zero timer would wait for the next.
        tokio::time::advance(Duration::from_micros(500)).await;
        let begun = tokio::time::Instant::now();
        assert_eq!(
            receiver.recv_within(Some(Duration::ZERO)).await.err(),
            Some(TimedOut)
        );
        sender.send(Event::Kill);
        let queued = receiver.recv_within(Some(Duration::ZERO)).await;
        assert!(matches!(queued, Ok(Some(Event::Kill))));
        drop(sender);
        assert!(matches!(
            receiver.recv_within(Some(Duration::ZERO)).await,
            Ok(None)
        ));
        assert_eq!(begun.elapsed(), Duration::ZERO);
    }

    #[tokio::test]
    async fn what_is_sent_after_the_receiver_is_gone_is_dropped() {
        let (sender, receiver) = event_queue();
        drop(receiver);
        sender.send(Event::Kill);
        assert!(sender.0.queue.lock_unpoisoned().events.is_empty());
    }
}
