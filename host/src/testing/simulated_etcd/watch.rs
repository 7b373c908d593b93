//! The simulated etcd's watches: every change under a prefix from a revision, in order, or
//! a cancel when the history they need was compacted away.

use super::state::lost;
use super::{CallFate, CallKind, Connection};
use crate::cluster::backend::{CallError, WatchAnswer, WatchEvent, WatchStream};
use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

pub(super) struct SimulatedWatch {
    pub(super) connection: Connection,
    pub(super) prefix: String,
    pub(super) next_revision: i64,
    pub(super) created: bool,
    /// Notified at each new revision (a permit is kept when it is not waiting).
    pub(super) changed: Arc<Notify>,
}

#[async_trait]
impl WatchStream for SimulatedWatch {
    async fn next(&mut self) -> Result<Option<WatchAnswer>, CallError> {
        if !self.created {
            self.created = true;
            return Ok(Some(WatchAnswer::Created));
        }
        loop {
            if let Some(answer) = self.pending()? {
                return Ok(Some(answer));
            }
            // The next lease expiry is a change too: wake for it.
            let expiry = self
                .connection
                .etcd
                .with_state(|state| state.leases.values().map(|lease| lease.expires).min());
            let far = Instant::now() + Duration::from_secs(3600);
            tokio::select! {
                biased;
                () = self.changed.notified() => {}
                () = tokio::time::sleep_until(expiry.unwrap_or(far)) => {}
            }
        }
    }
}

impl SimulatedWatch {
    /// What the watch has to say now, if anything: changes after its revision, or a cancel
    /// when they were compacted away.
    fn pending(&mut self) -> Result<Option<WatchAnswer>, CallError> {
        let etcd = &self.connection.etcd;
        let fate = etcd.fate(&self.connection.name, CallKind::Watch);
        if matches!(fate, CallFate::LostBefore | CallFate::LostAfter) {
            return Err(lost("a watch"));
        }
        let (prefix, from) = (self.prefix.as_str(), self.next_revision);
        let seen = etcd.with_state(|state| {
            if from <= state.compacted {
                return Err(WatchAnswer::Canceled {
                    compact_revision: state.compacted,
                    reason: "etcdserver: mvcc: required revision has been compacted".into(),
                });
            }
            let first = state.log.partition_point(|(revision, _)| *revision < from);
            let events: Vec<WatchEvent> = state
                .log
                .range(first..)
                .filter(|(_, event)| event_key(event).starts_with(prefix))
                .map(|(_, event)| event.clone())
                .collect();
            Ok((events, state.revision))
        });
        match seen {
            Err(canceled) => Ok(Some(canceled)),
            // A watch that has seen every change is caught up to the store's revision, as
            // etcd's synced watchers are: a compaction after it does not cancel it.
            Ok((events, revision)) if events.is_empty() => {
                self.next_revision = self.next_revision.max(revision + 1);
                Ok(None)
            }
            Ok((events, _)) => {
                let last = events.iter().map(event_revision).max().unwrap_or(from);
                self.next_revision = last + 1;
                Ok(Some(WatchAnswer::Events(events)))
            }
        }
    }
}

fn event_key(event: &WatchEvent) -> &str {
    match event {
        WatchEvent::Put(kv) => &kv.key,
        WatchEvent::Delete { key, .. } => key,
    }
}

fn event_revision(event: &WatchEvent) -> i64 {
    match event {
        WatchEvent::Put(kv) => kv.mod_revision,
        WatchEvent::Delete { mod_revision, .. } => *mod_revision,
    }
}
