//! A watch of one key prefix that survives what happens to etcd watches: a stream broken by
//! a member's death is re-opened (the client's balancer picks among the members) from the
//! revision after the last change it delivered, so no change is missed or delivered twice; a
//! watch whose history was compacted away re-lists the prefix and carries on from there; a
//! member that lost its leader fails the watch (it is opened with `require_leader`), and one
//! that froze fails its connection's keep-alive, rather than leaving the watch silent.
//! Progress notifications move the resume point along while the prefix is quiet, so a watch
//! re-opened after a compaction re-lists only when it really missed history.

use super::backend::{WatchAnswer, WatchEvent, WatchStream};
use super::store::{CALL_TIMEOUT, EtcdStore, KeyValue, StoreError};
use std::time::Duration;

/// One change under a watched prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A key was written.
    Put(KeyValue),
    /// A key was deleted, at `mod_revision`.
    Delete {
        /// The key.
        key: String,
        /// The revision of the delete.
        mod_revision: i64,
    },
    /// The history the watch needed was compacted away: this is the whole prefix as of
    /// `revision`, to be taken as the truth (a key missing from it was deleted); the changes
    /// after it follow.
    Relisted {
        /// Every key under the prefix.
        entries: Vec<KeyValue>,
        /// The revision the list was read at.
        revision: i64,
    },
}

/// The longest pause between two attempts to re-open a broken watch.
const MAX_REOPEN_PAUSE: Duration = Duration::from_secs(1);

/// How many cancels in a row, for a reason other than compaction, make the watch give up:
/// such a cancel (a permission, a bad range) would only come back.
const MAX_CANCELS: u32 = 3;

/// A watch of every key under one prefix; see the module docs.
pub struct PrefixWatch {
    store: EtcdStore,
    prefix: String,
    /// The revision of the first change not yet delivered.
    next_revision: i64,
    stream: Option<Box<dyn WatchStream>>,
    pause: Duration,
    cancels: u32,
}

impl PrefixWatch {
    /// Lists `prefix` and watches it from just after the list: every key now, then every
    /// change.
    pub async fn start(
        store: &EtcdStore,
        prefix: &str,
    ) -> Result<(Vec<KeyValue>, PrefixWatch), StoreError> {
        let (entries, revision) = store.list(prefix).await?;
        Ok((
            entries,
            PrefixWatch::from_revision(store, prefix, revision + 1),
        ))
    }

    /// Watches `prefix` from `revision` on (the changes at `revision` included): for a caller
    /// resuming from a revision it saved.
    pub fn from_revision(store: &EtcdStore, prefix: &str, revision: i64) -> PrefixWatch {
        PrefixWatch {
            store: store.clone(),
            prefix: prefix.to_string(),
            next_revision: revision.max(1),
            stream: None,
            pause: Duration::from_millis(50),
            cancels: 0,
        }
    }

    /// The revision of the first change not yet delivered.
    pub fn next_revision(&self) -> i64 {
        self.next_revision
    }

    /// The next changes, in revision order; waits until there is at least one. A broken
    /// watch is re-opened for as long as it takes, so this fails only when a re-list after a
    /// compaction cannot read etcd, or when etcd cancels the watch three times in
    /// a row for another reason. Cancel-safe: dropping the future loses no change.
    pub async fn next(&mut self) -> Result<Vec<Change>, StoreError> {
        loop {
            let Some(stream) = self.stream.as_mut() else {
                self.open().await;
                continue;
            };
            let answer = match stream.next().await {
                Ok(Some(answer)) => answer,
                Ok(None) => {
                    self.broken("the watch stream ended").await;
                    continue;
                }
                Err(error) => {
                    self.broken(&error.to_string()).await;
                    continue;
                }
            };
            let events = match answer {
                WatchAnswer::Created => continue,
                WatchAnswer::Progress { revision } => {
                    self.next_revision = self.next_revision.max(revision + 1);
                    continue;
                }
                WatchAnswer::Canceled {
                    compact_revision, ..
                } if compact_revision > 0 => return self.relist().await,
                WatchAnswer::Canceled { reason, .. } => {
                    self.cancels += 1;
                    if self.cancels >= MAX_CANCELS {
                        self.stream = None;
                        return Err(StoreError::WatchCanceled {
                            endpoints: self.store.endpoints(),
                            prefix: self.prefix.clone(),
                            reason,
                        });
                    }
                    self.broken(&format!("watch canceled: {reason}")).await;
                    continue;
                }
                WatchAnswer::Events(events) => events,
            };
            self.pause = Duration::from_millis(50);
            self.cancels = 0;
            // A re-opened watch starts at the revision after the last delivered one; anything
            // older is a repeat.
            let changes: Vec<Change> = events
                .into_iter()
                .map(|event| match event {
                    WatchEvent::Put(kv) => Change::Put(kv),
                    WatchEvent::Delete { key, mod_revision } => {
                        Change::Delete { key, mod_revision }
                    }
                })
                .filter(|change| revision_of(change) >= self.next_revision)
                .collect();
            if let Some(last) = changes.iter().map(revision_of).max() {
                self.next_revision = last + 1;
                return Ok(changes);
            }
        }
    }

    async fn open(&mut self) {
        let opening = self.store.backend().watch(&self.prefix, self.next_revision);
        match tokio::time::timeout(CALL_TIMEOUT, opening).await {
            Ok(Ok(stream)) => self.stream = Some(stream),
            Ok(Err(error)) => self.broken(&error.to_string()).await,
            Err(_) => self.broken("opening the watch timed out").await,
        }
    }

    /// Drops the stream and waits before the next attempt, a little longer each time (the
    /// pause is reset only once changes arrive, so a member that accepts a watch and drops it
    /// at once is not asked again every 50 ms).
    async fn broken(&mut self, reason: &str) {
        let level_warn = self.pause >= MAX_REOPEN_PAUSE;
        if level_warn {
            tracing::warn!(prefix = %self.prefix, reason, "etcd watch still broken; re-opening");
        } else {
            tracing::debug!(prefix = %self.prefix, reason, "etcd watch broken; re-opening");
        }
        self.stream = None;
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(MAX_REOPEN_PAUSE);
    }

    async fn relist(&mut self) -> Result<Vec<Change>, StoreError> {
        self.stream = None;
        let (entries, revision) = self.store.list(&self.prefix).await?;
        tracing::info!(prefix = %self.prefix, revision, "etcd history compacted; re-listed the prefix");
        self.next_revision = revision + 1;
        Ok(vec![Change::Relisted { entries, revision }])
    }
}

fn revision_of(change: &Change) -> i64 {
    match change {
        Change::Put(kv) => kv.mod_revision,
        Change::Delete { mod_revision, .. } => *mod_revision,
        Change::Relisted { revision, .. } => *revision,
    }
}
