//! etcd's history and space: the leader compacts the history, and every agent watches what
//! etcd says of its space.
//!
//! etcd keeps every revision of every key until it is compacted. Caravan rewrites an alloc's
//! keys several times in its life (placed, each client state, stopped, collected), so an
//! uncompacted etcd grows with every alloc ever run (about 3.6 KiB each, measured) until it
//! reaches its quota (2 GiB by default), raises the `NOSPACE` alarm, and refuses every
//! write: the cluster stops. Hence:
//! - **Compaction** ([`Compactor`]): the leader, every `compact_interval`, compacts up to
//!   the revision it saw one interval before, as the Kubernetes API server does. What it
//!   keeps (one interval of history) is what a watch resuming after a short break needs;
//!   a watch that was away longer re-lists its prefix, which `PrefixWatch` already does
//!   after a compaction, so nothing is lost either way. Only the leader compacts, so two
//!   agents never race to it; a new leader starts its own cycle, and a compaction that
//!   finds a later one already made is not an error.
//! - **Space** ([`EtcdSpace`], [`EtcdStore::space`]): the database's size, the part in use
//!   (what compaction frees; the rest waits for a defragmentation, which the operator runs,
//!   as it blocks the member it runs on) and every raised alarm, for `server members`, the
//!   agent's health and its metrics.
//!
//! It knows etcd and nothing of what the keys mean.

use super::backend::CallError;
use super::store::{CALL_TIMEOUT, EtcdStore, StoreError};
use crate::util::prometheus::{Kind, header, sample, single};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// The default time between two compactions: the Kubernetes API server's.
pub const DEFAULT_COMPACT_INTERVAL: Duration = Duration::from_secs(5 * 60);

/// What the leader's compactions have done, for the agent's metrics. Shared between the
/// scheduler (which writes it) and the HTTP API (which reads it).
#[derive(Debug, Default)]
pub struct HistoryStats {
    compactions: AtomicU64,
    failures: AtomicU64,
    compacted_revision: AtomicI64,
}

impl HistoryStats {
    /// Compactions this agent made while it led.
    pub fn compactions(&self) -> u64 {
        self.compactions.load(Ordering::Relaxed)
    }

    /// Compactions this agent tried and etcd refused or did not answer.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// The revision this agent last compacted up to (0: none yet).
    pub fn compacted_revision(&self) -> i64 {
        self.compacted_revision.load(Ordering::Relaxed)
    }

    /// Appends the compaction metric families to a Prometheus text exposition.
    pub fn write_prometheus(&self, out: &mut String) {
        single(
            out,
            "caravan_etcd_compactions_total",
            Kind::Counter,
            "Compactions of etcd's history this agent made while it led.",
            self.compactions(),
        );
        single(
            out,
            "caravan_etcd_compaction_failures_total",
            Kind::Counter,
            "Compactions this agent tried that etcd refused or did not answer.",
            self.failures(),
        );
        single(
            out,
            "caravan_etcd_compacted_revision",
            Kind::Gauge,
            "The revision this agent last compacted etcd's history up to.",
            self.compacted_revision(),
        );
    }
}

/// The leader's compaction schedule: which revision to compact up to at each tick. Pure, so
/// that its rule is tested without etcd.
#[derive(Debug, Default)]
pub struct Compactor {
    /// The revision seen at the last tick: the next tick compacts up to it.
    seen_last_tick: Option<i64>,
    /// The revision last compacted up to.
    compacted: i64,
}

impl Compactor {
    /// At a tick that found etcd at `current`: the revision to compact up to now, if any.
    /// It is the revision of the tick before, so one interval of history is always kept.
    pub fn tick(&mut self, current: i64) -> Option<i64> {
        let target = self.seen_last_tick.replace(current)?;
        (target > self.compacted).then_some(target)
    }

    /// Records that etcd's history is compacted up to `revision` (by this leader, or found
    /// so by it: another compacted further).
    pub fn compacted(&mut self, revision: i64) {
        self.compacted = self.compacted.max(revision);
    }
}

/// The leader's compactions, from its takeover at `revision` on, for as long as it is not
/// dropped (the scheduler runs it as a task of its own and aborts it when it stops leading,
/// so a slow etcd never holds up scheduling).
pub async fn compact_every(
    store: EtcdStore,
    interval: Duration,
    revision: i64,
    stats: std::sync::Arc<HistoryStats>,
) {
    let mut compactor = Compactor::default();
    compactor.tick(revision);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        compact_tick(&store, &mut compactor, &stats).await;
    }
}

/// One compaction: reads the revision, compacts up to the one of the tick before, and
/// records it. Failures are logged and counted, never fatal: the next tick tries again, and
/// a leader must not step down because its housekeeping failed.
async fn compact_tick(store: &EtcdStore, compactor: &mut Compactor, stats: &HistoryStats) {
    let current = match store.revision().await {
        Ok(revision) => revision,
        Err(error) => {
            stats.failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%error, "cannot read etcd's revision to compact its history");
            return;
        }
    };
    let Some(target) = compactor.tick(current) else {
        return;
    };
    match store.compact(target).await {
        Ok(()) => {
            compactor.compacted(target);
            stats.compactions.fetch_add(1, Ordering::Relaxed);
            stats.compacted_revision.store(target, Ordering::Relaxed);
            tracing::debug!(revision = target, "compacted etcd's history");
        }
        Err(error) => {
            stats.failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%error, revision = target, "cannot compact etcd's history");
        }
    }
}

/// An alarm an etcd member raised: while one is raised, etcd refuses writes (`NOSPACE`) or
/// is not to be trusted (`CORRUPT`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EtcdAlarm {
    /// The member that raised it: its name, or its id in hex when it has none.
    pub member: String,
    /// `NOSPACE` or `CORRUPT`.
    pub alarm: String,
}

/// What etcd says of its space, as one member answered.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EtcdSpace {
    /// The member that answered (members hold the same keys, so their sizes are alike).
    pub member: String,
    /// Its etcd version.
    pub version: String,
    /// The database file's size, in bytes: what counts against the quota.
    pub db_size: u64,
    /// The part of it in use; the rest is free pages that only a defragmentation returns.
    pub db_size_in_use: u64,
    /// The cluster's revision.
    pub revision: i64,
    /// Every alarm raised in the cluster.
    pub alarms: Vec<EtcdAlarm>,
}

impl EtcdSpace {
    /// The alarms as one line for an operator, with what to do about each.
    pub fn alarm_line(&self) -> Option<String> {
        if self.alarms.is_empty() {
            return None;
        }
        let raised: Vec<String> = self
            .alarms
            .iter()
            .map(|a| format!("{} on {}", a.alarm, a.member))
            .collect();
        Some(format!(
            "etcd raised {}: while NOSPACE is raised every write fails; free space \
             (etcdctl defrag on each member), then etcdctl alarm disarm (docs/cluster.md)",
            raised.join(", ")
        ))
    }
}

/// The last answer to the space probe every agent makes (see [`watch_space`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpaceProbe {
    /// No probe has ended yet.
    NotYet,
    /// The last probe's answer.
    Answered(EtcdSpace),
    /// The last probe failed: etcd did not answer it.
    Failed(String),
}

/// How often every agent asks etcd for its space and alarms.
pub const SPACE_PROBE_INTERVAL: Duration = Duration::from_secs(10);

/// What the agent's HTTP API shows of etcd: the last probe of its space, and this agent's
/// compactions.
#[derive(Debug, Clone)]
pub struct EtcdHealth {
    /// The last probe, kept up to date by [`watch_space`].
    pub space: tokio::sync::watch::Receiver<SpaceProbe>,
    /// What this agent's compactions did while it led.
    pub history: std::sync::Arc<HistoryStats>,
}

impl EtcdHealth {
    /// Appends etcd's metric families: this agent's compactions and the last probe.
    pub fn write_prometheus(&self, out: &mut String) {
        self.history.write_prometheus(out);
        let probe = self.space.borrow().clone();
        single(
            out,
            "caravan_etcd_up",
            Kind::Gauge,
            "Whether etcd answered this agent's last probe of its space.",
            u8::from(matches!(probe, SpaceProbe::Answered(_))),
        );
        let SpaceProbe::Answered(space) = probe else {
            return;
        };
        single(
            out,
            "caravan_etcd_db_size_bytes",
            Kind::Gauge,
            "etcd's database size, what counts against its quota.",
            space.db_size,
        );
        single(
            out,
            "caravan_etcd_db_size_in_use_bytes",
            Kind::Gauge,
            "The part of etcd's database in use; compaction frees the rest for reuse, defragmentation returns it.",
            space.db_size_in_use,
        );
        let name = "caravan_etcd_alarms";
        header(
            out,
            name,
            Kind::Gauge,
            "Alarms etcd's members raised, by kind (NOSPACE: every write fails).",
        );
        for kind in ["NOSPACE", "CORRUPT"] {
            let raised = space.alarms.iter().filter(|a| a.alarm == kind).count();
            sample(out, name, &[("alarm", kind)], raised);
        }
    }
}

/// Probes in a row that must fail before etcd counts as not answering: an election, or one
/// slow member, fails a probe or two, and every agent's health turning 503 at once for that
/// would have supervisors restart a cluster that is fine.
const FAILED_PROBES_BEFORE_DOWN: u32 = 3;

/// Probes etcd's space and alarms every `every`, from now on, publishing each answer (a
/// failure only after three in a row, `FAILED_PROBES_BEFORE_DOWN`; till then the last answer
/// stands); logs an alarm when it is first seen and when it is cleared. Ends when nobody
/// reads the answers any more.
pub fn watch_space(store: EtcdStore, every: Duration) -> tokio::sync::watch::Receiver<SpaceProbe> {
    let (publish, answers) = tokio::sync::watch::channel(SpaceProbe::NotYet);
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut alarmed = false;
        let mut failed_in_a_row = 0;
        loop {
            ticks.tick().await;
            let probe = match store.space().await {
                Ok(space) => {
                    failed_in_a_row = 0;
                    match (space.alarm_line(), alarmed) {
                        (Some(line), false) => {
                            tracing::error!(alarms = %line, "etcd raised an alarm")
                        }
                        (None, true) => tracing::info!("etcd's alarms are cleared"),
                        _ => {}
                    }
                    alarmed = !space.alarms.is_empty();
                    SpaceProbe::Answered(space)
                }
                Err(error) => {
                    failed_in_a_row += 1;
                    let answered = matches!(*publish.borrow(), SpaceProbe::Answered(_));
                    if answered && failed_in_a_row < FAILED_PROBES_BEFORE_DOWN {
                        tracing::debug!(%error, "etcd did not answer a probe of its space");
                        continue;
                    }
                    SpaceProbe::Failed(error.to_string())
                }
            };
            if publish.send(probe).is_err() {
                return;
            }
        }
    });
    answers
}

impl EtcdStore {
    /// Compacts etcd's history up to `revision`. A revision already compacted (by an
    /// earlier attempt whose answer was lost, or by another compactor) is success: the
    /// history is as short as asked.
    pub async fn compact(&self, revision: i64) -> Result<(), StoreError> {
        let outcome = tokio::time::timeout(CALL_TIMEOUT, self.backend().compact(revision)).await;
        let reason = match outcome {
            Ok(Ok(())) | Ok(Err(CallError::Compacted(_))) => return Ok(()),
            Ok(Err(CallError::Lost(reason))) => reason,
            Ok(Err(refusal)) => {
                return Err(StoreError::Refused {
                    endpoints: self.endpoints(),
                    what: format!("compacting to revision {revision}"),
                    reason: refusal.to_string(),
                });
            }
            Err(_) => format!("compacting took longer than {CALL_TIMEOUT:?}"),
        };
        Err(self.unreachable(reason))
    }

    /// What etcd says of its space now: one member's status, the raised alarms, and the
    /// members' names. Tried once, within the store's call timeout: this is a probe, and
    /// the next one is soon.
    pub async fn space(&self) -> Result<EtcdSpace, StoreError> {
        let status = match tokio::time::timeout(CALL_TIMEOUT, self.backend().status()).await {
            Ok(Ok(status)) => status,
            Ok(Err(error)) => return Err(self.unreachable(error.to_string())),
            Err(_) => {
                return Err(self.unreachable(format!(
                    "asking for etcd's status took longer than {CALL_TIMEOUT:?}"
                )));
            }
        };
        // What etcd says of itself is shown and logged: bounded, as any text from outside.
        let name = |name: &str| crate::util::text::cut(name, 64).into_owned();
        Ok(EtcdSpace {
            member: name(&status.member),
            version: crate::util::text::cut(&status.version, 32).into_owned(),
            db_size: status.db_size,
            db_size_in_use: status.db_size_in_use,
            revision: status.revision,
            alarms: status
                .alarms
                .iter()
                .map(|(member, alarm)| EtcdAlarm {
                    member: name(member),
                    alarm: alarm.clone(),
                })
                .collect(),
        })
    }

    fn unreachable(&self, reason: String) -> StoreError {
        StoreError::Unreachable {
            endpoints: self.endpoints(),
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_tick_only_remembers_where_etcd_was() {
        let mut compactor = Compactor::default();
        assert_eq!(compactor.tick(100), None);
    }

    #[test]
    fn each_tick_compacts_up_to_the_revision_of_the_tick_before() {
        let mut compactor = Compactor::default();
        compactor.tick(100);
        assert_eq!(compactor.tick(250), Some(100));
        compactor.compacted(100);
        assert_eq!(compactor.tick(400), Some(250));
    }

    #[test]
    fn a_quiet_cluster_is_not_compacted_again() {
        let mut compactor = Compactor::default();
        compactor.tick(100);
        assert_eq!(compactor.tick(100), Some(100));
        compactor.compacted(100);
        assert_eq!(compactor.tick(100), None, "nothing new to compact");
    }

    #[test]
    fn a_failed_compaction_is_tried_again_further_on() {
        let mut compactor = Compactor::default();
        compactor.tick(100);
        assert_eq!(compactor.tick(200), Some(100));
        // Not recorded as compacted: the next tick asks for the newer revision.
        assert_eq!(compactor.tick(300), Some(200));
    }

    #[test]
    fn alarms_name_their_member_and_what_to_do() {
        let space = EtcdSpace {
            member: "m1".into(),
            version: "3.4.23".into(),
            db_size: 1,
            db_size_in_use: 1,
            revision: 1,
            alarms: vec![EtcdAlarm {
                member: "m2".into(),
                alarm: "NOSPACE".into(),
            }],
        };
        let line = space.alarm_line().unwrap();
        assert!(line.contains("NOSPACE on m2"), "{line}");
        assert!(line.contains("alarm disarm"), "{line}");
        let quiet = EtcdSpace {
            alarms: Vec::new(),
            ..space
        };
        assert_eq!(quiet.alarm_line(), None);
    }
}
