//! The wire between a node's client and the server, with the seed's faults on it: a request
//! lost before the server sees it, an answer lost after the server acted, a delay, a report
//! delivered twice; a partition that holds every call until it heals; and a server restart,
//! which fails the calls in flight as a closed connection would.

use super::trace::{Draws, Trace};
use crate::model::node::NodeInfo;
use crate::model::structs::Alloc;
use crate::rpc::{AllocUpdate, NodeAllocs, ServerApi, ServerError};
use crate::server::EmbeddedServer;
use crate::util::locks::LockUnpoisoned;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// The server the links deliver to, replaced when it restarts.
///
/// Waits here use `Notify`, never `watch`: a `watch` wakes its receivers in an order drawn
/// from tokio's own random, which would make a seed's trace differ from run to run.
pub(super) struct ServerSlot {
    current: Mutex<Arc<EmbeddedServer>>,
    restarted: Notify,
}

impl super::ledger::CurrentServer for ServerSlot {
    fn current(&self) -> Option<Arc<EmbeddedServer>> {
        Some(self.server())
    }
}

impl ServerSlot {
    pub(super) fn new(server: Arc<EmbeddedServer>) -> Arc<ServerSlot> {
        Arc::new(ServerSlot {
            current: Mutex::new(server),
            restarted: Notify::new(),
        })
    }

    pub(super) fn server(&self) -> Arc<EmbeddedServer> {
        self.current.lock_unpoisoned().clone()
    }

    /// Puts `server` in place of the one that died; calls in flight to the old one fail.
    pub(super) fn replace(&self, server: Arc<EmbeddedServer>) {
        *self.current.lock_unpoisoned() = server;
        self.restarted.notify_waiters();
    }
}

/// What goes wrong on one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    RequestLost,
    AnswerLost,
    Delayed(Duration),
    Duplicated,
}

/// What the server has heard of a node, as the wire saw it reach the server: the server
/// counts a node live while a watch of it is open, and for a TTL after its last watch,
/// registration or saved report.
struct Contact {
    open_watches: usize,
    last: tokio::time::Instant,
}

/// One node's wire to the server.
pub(super) struct Link {
    pub(super) node: String,
    contact: Mutex<Contact>,
    slot: Arc<ServerSlot>,
    faults_on: Arc<AtomicBool>,
    draws: Mutex<Draws>,
    partitioned: AtomicBool,
    healed: Notify,
    trace: Trace,
}

impl Link {
    pub(super) fn new(
        node: &str,
        seed: u64,
        slot: Arc<ServerSlot>,
        faults_on: Arc<AtomicBool>,
        trace: Trace,
    ) -> Arc<Link> {
        Arc::new(Link {
            node: node.to_string(),
            contact: Mutex::new(Contact {
                open_watches: 0,
                last: tokio::time::Instant::now(),
            }),
            slot,
            faults_on,
            draws: Mutex::new(Draws::new(seed ^ super::trace::fnv1a(node.as_bytes()))),
            partitioned: AtomicBool::new(false),
            healed: Notify::new(),
            trace,
        })
    }

    /// Cuts the node off (`true`) or heals the cut.
    pub(super) fn partition(&self, cut: bool) {
        self.partitioned.store(cut, Ordering::SeqCst);
        if !cut {
            self.healed.notify_waiters();
        }
    }

    /// How long the server has heard nothing of this node; `None` while a watch is open.
    pub(super) fn silent_for(&self) -> Option<Duration> {
        let contact = self.contact.lock_unpoisoned();
        (contact.open_watches == 0).then(|| contact.last.elapsed())
    }

    fn heard(&self) {
        self.contact.lock_unpoisoned().last = tokio::time::Instant::now();
    }

    fn watch_opened(&self) -> OpenWatch<'_> {
        let mut contact = self.contact.lock_unpoisoned();
        contact.open_watches += 1;
        contact.last = tokio::time::Instant::now();
        OpenWatch(self)
    }

    fn draw_fault(&self, duplicable: bool) -> Option<Fault> {
        if !self.faults_on.load(Ordering::SeqCst) {
            return None;
        }
        let mut draws = self.draws.lock_unpoisoned();
        match draws.below(100) {
            0..=3 => Some(Fault::RequestLost),
            4..=7 => Some(Fault::AnswerLost),
            8..=17 => Some(Fault::Delayed(draws.millis(1, 3_000))),
            18..=20 if duplicable => Some(Fault::Duplicated),
            _ => None,
        }
    }

    pub(super) fn is_cut(&self) -> bool {
        self.partitioned.load(Ordering::SeqCst)
    }

    async fn healed(&self) {
        loop {
            // Made before the look, so that a heal in between is not missed.
            let healed = self.healed.notified();
            if !self.is_cut() {
                return;
            }
            healed.await;
        }
    }

    /// Delivers `call` to the current server through the faults drawn for it.
    async fn call<T, F>(
        &self,
        what: &str,
        duplicable: bool,
        call: impl Fn(Arc<EmbeddedServer>) -> F,
    ) -> Result<T, ServerError>
    where
        F: Future<Output = Result<T, ServerError>>,
    {
        let lost = |how: &str| {
            self.trace
                .record(format!("wire {}: {what} {how}", self.node));
            Err(ServerError::Unavailable(format!("simulated: {what} {how}")))
        };
        self.healed().await;
        let fault = self.draw_fault(duplicable);
        match fault {
            Some(Fault::RequestLost) => return lost("lost on the way"),
            Some(Fault::Delayed(delay)) => tokio::time::sleep(delay).await,
            _ => {}
        }
        let restarted = self.slot.restarted.notified();
        let server = self.slot.server();
        let answer = tokio::select! {
            biased;
            () = restarted => return lost("cut by a server restart"),
            answer = call(server.clone()) => answer,
        };
        if fault == Some(Fault::Duplicated) && answer.is_ok() {
            self.trace
                .record(format!("wire {}: {what} delivered twice", self.node));
            let _ = call(server).await;
        }
        if self.is_cut() {
            self.healed().await;
            return lost("answer lost in a partition");
        }
        if fault == Some(Fault::AnswerLost) {
            return lost("answer lost");
        }
        answer
    }
}

#[async_trait::async_trait]
impl ServerApi for Link {
    async fn register_node(&self, node_id: &str, info: &NodeInfo) -> Result<(), ServerError> {
        self.call("registration", false, |server| async move {
            self.heard();
            server.register_node(node_id, info).await
        })
        .await
    }

    async fn watch_allocs(
        &self,
        node_id: &str,
        min_index: u64,
        wait: Duration,
    ) -> Result<NodeAllocs, ServerError> {
        self.call("watch", false, |server| async move {
            let _open = self.watch_opened();
            server.watch_allocs(node_id, min_index, wait).await
        })
        .await
    }

    async fn get_allocs(&self, ids: &[String]) -> Result<Vec<Arc<Alloc>>, ServerError> {
        self.call("fetch", false, |server| async move {
            server.get_allocs(ids).await
        })
        .await
    }

    async fn update_allocs(&self, updates: &[AllocUpdate]) -> Result<Vec<String>, ServerError> {
        self.call("report", true, |server| async move {
            let taken = server.update_allocs(updates).await;
            // The server counts a report as word from its node only when it took some of it.
            if taken.as_ref().is_ok_and(|ids| !ids.is_empty()) {
                self.heard();
            }
            taken
        })
        .await
    }
}

/// A watch at the server: it ends (answered, or cut) when dropped.
struct OpenWatch<'a>(&'a Link);

impl Drop for OpenWatch<'_> {
    fn drop(&mut self) {
        let mut contact = self.0.contact.lock_unpoisoned();
        contact.open_watches = contact.open_watches.saturating_sub(1);
        contact.last = tokio::time::Instant::now();
    }
}
