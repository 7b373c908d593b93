//! An agent's membership of the cluster: one etcd lease, kept alive, under which the agent
//! says its node is live (`live/<node>`) and campaigns for the leader key.
//!
//! Lifecycle, for the reason given:
//! - The lease is renewed three times per TTL, so one lost renewal does not expire it.
//! - When etcd says the lease expired (the agent was paused or cut off past its TTL), its
//!   keys are gone and another agent may lead and may have replaced this node's allocs: the
//!   agent stops leading at once, grants a new lease and says it is live again under it (the
//!   node's client meanwhile learns from its allocs' keys which of them to stop).
//! - The campaign is a create-if-absent of the leader key under the lease: whoever created
//!   it leads until its lease ends, and its create revision fences its writes. Every agent
//!   tries again whenever the key changes (a watch) and at every renewal, so a dead leader is
//!   replaced about one TTL after its last renewal.
//! - [`Member::leave`] deletes the leader key when this agent holds it: a clean stop hands
//!   leadership over at once rather than after a TTL.
//! - An agent restarted on its data dir revokes the lease its previous run held, once its
//!   node is live under the new one: a leader killed and restarted at once would otherwise
//!   keep the leader key, and the cluster without a scheduler, until the old lease expired.
//! - While it leads, the view says until when its lease is known to hold
//!   ([`MemberView::lease_fresh_until`]): the HTTP API answers from the leader's memory only
//!   until then, and asks etcd who leads afterwards (a leader woken from a pause must not
//!   answer with what it knew before it slept).
//!
//! It knows etcd and its own keys only; what leading means is the caller's.

use super::keys;
use super::lease::{Fence, FencedOp, LeaseState};
use super::store::EtcdStore;
use super::watch::PrefixWatch;
use crate::model::node::NodeInfo;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tokio::sync::watch;

/// Who an agent is, as the leader and live keys say.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    /// Its node's name.
    pub node: String,
    /// Its HTTP API, `http://host:port`.
    pub api: String,
    /// The agent's own id, kept in its data dir: the same agent restarted is the same id,
    /// whatever its address.
    pub agent: String,
    /// What its node says of itself (capacity and attributes), for the scheduler's
    /// placement. A record from before nodes said anything has the defaults.
    #[serde(default)]
    pub info: NodeInfo,
}

impl MemberRecord {
    /// What the node of the live key whose value is `value` says of itself: the defaults
    /// when the value cannot be read or says more than a node may (a WARN names the key).
    pub fn node_info_in(key: &str, value: &[u8]) -> NodeInfo {
        let info = serde_json::from_slice::<MemberRecord>(value)
            .map_err(|e| e.to_string())
            .and_then(|record| record.info.check().map(|()| record.info));
        info.unwrap_or_else(|problem| {
            tracing::warn!(key, %problem, "a live node's record cannot be read; placing on it as a node that says nothing");
            NodeInfo::default()
        })
    }
}

/// What an agent currently is in the cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemberView {
    /// Its lease, once granted.
    pub lease: Option<i64>,
    /// The agent that leads, as last seen.
    pub leader: Option<MemberRecord>,
    /// Set while this agent leads: the fence its writes carry.
    pub leading: Option<Fence>,
    /// When this agent last won the leadership from another, that agent's node: its lease
    /// expired (that is what freed the leader key), so its node is down too.
    pub took_over_from: Option<String>,
    /// Until when this agent's lease certainly holds, on this process's monotonic clock:
    /// three quarters of a TTL after the last renewal etcd accepted was sent (etcd starts
    /// the TTL when it receives the renewal, later; the quarter covers two clocks' drift).
    /// `None` while it has no lease.
    pub lease_fresh_until: Option<tokio::time::Instant>,
}

impl MemberView {
    /// Whether this agent's lease is known to hold now, without asking etcd.
    pub fn lease_is_fresh(&self) -> bool {
        self.lease_fresh_until
            .is_some_and(|until| tokio::time::Instant::now() < until)
    }
}

/// How much of a TTL after a renewal was sent the lease counts as known to hold.
fn fresh_for(ttl: Duration) -> Duration {
    ttl * 3 / 4
}

/// A live agent, as its live key says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveMember {
    /// Who it is.
    pub record: MemberRecord,
    /// How long ago it last renewed its lease (`None`: the lease just expired).
    pub since_heartbeat: Option<Duration>,
}

/// Every live agent's record, and the lease its live key is held under: one read of
/// `live/`. A record that cannot be read is skipped.
pub async fn live_records(
    store: &EtcdStore,
) -> Result<Vec<(MemberRecord, i64)>, super::StoreError> {
    let (entries, _) = store.list(&keys::live_prefix()).await?;
    Ok(entries
        .into_iter()
        .filter_map(|kv| Some((serde_json::from_slice(&kv.value).ok()?, kv.lease)))
        .collect())
}

/// Every live agent, with how long ago each renewed its lease: [`live_records`], then one
/// lease query per agent, at most 32 at a time.
pub async fn live_members(store: &EtcdStore) -> Result<Vec<LiveMember>, super::StoreError> {
    let records = live_records(store).await?;
    let mut members = Vec::with_capacity(records.len());
    for chunk in records.chunks(32) {
        let ages = chunk.iter().map(|(_, lease)| store.lease_age(*lease));
        let ages = futures_util::future::join_all(ages).await;
        for ((record, _), age) in chunk.iter().zip(ages) {
            members.push(LiveMember {
                record: record.clone(),
                since_heartbeat: age?,
            });
        }
    }
    Ok(members)
}

/// A running membership. Dropping it stops the renewals (the lease then expires).
pub struct Member {
    view: watch::Receiver<MemberView>,
    store: EtcdStore,
    task: tokio::task::JoinHandle<()>,
}

impl Member {
    /// Joins the cluster as `record`, with leases of `ttl`, and campaigns to lead it.
    /// `previous_lease`: the lease this same agent's previous run held (its live key's), which
    /// is revoked once the node is live under the new one.
    pub fn join(
        store: EtcdStore,
        record: MemberRecord,
        ttl: Duration,
        previous_lease: Option<i64>,
    ) -> Member {
        Member::start(store, record, ttl, Campaign::ToLead, previous_lease)
    }

    /// Joins as a node that never leads: its live key under its lease, and no campaign (the
    /// simulated nodes of `caravan nodesim`, which have no scheduler to lead with).
    pub fn join_as_node_only(store: EtcdStore, record: MemberRecord, ttl: Duration) -> Member {
        Member::start(store, record, ttl, Campaign::Never, None)
    }

    fn start(
        store: EtcdStore,
        record: MemberRecord,
        ttl: Duration,
        campaign: Campaign,
        previous_lease: Option<i64>,
    ) -> Member {
        let (sender, view) = watch::channel(MemberView::default());
        let task = tokio::spawn(keep_membership(
            store.clone(),
            Joining {
                record,
                ttl,
                campaign,
                previous_lease,
            },
            sender,
        ));
        Member { view, store, task }
    }

    /// What this agent is now, and its changes.
    pub fn view(&self) -> watch::Receiver<MemberView> {
        self.view.clone()
    }

    /// Leaves: stops renewing, and hands leadership over at once when this agent leads.
    /// The node's live key stays until its lease expires, as after a crash: an agent that
    /// restarts within the TTL (an upgrade) keeps its allocs.
    pub async fn leave(self) {
        self.task.abort();
        let leading = self.view.borrow().leading.clone();
        if let Some(fence) = leading {
            let resign = [FencedOp::Delete {
                key: fence.key.clone(),
            }];
            if let Err(error) = self.store.write_fenced(&fence, &resign).await {
                tracing::warn!(%error, "cannot hand the leadership over; it passes when this agent's lease expires");
            }
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Whether a member campaigns for the leader key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Campaign {
    ToLead,
    Never,
}

/// Who joins, and how.
struct Joining {
    record: MemberRecord,
    ttl: Duration,
    campaign: Campaign,
    previous_lease: Option<i64>,
}

async fn keep_membership(store: EtcdStore, joining: Joining, view: watch::Sender<MemberView>) {
    let Joining {
        record,
        ttl,
        campaign: campaign_for,
        mut previous_lease,
    } = joining;
    let value = serde_json::to_vec(&record).unwrap_or_default();
    let renew_every = ttl / 3;
    // A member that never leads follows nobody's campaign: its counter never moves (its
    // sender is kept, so waiting on it waits for ever rather than failing at once).
    let (_never_moves, quiet) = watch::channel(0u64);
    let leader_changed = match campaign_for {
        Campaign::ToLead => watch_leader_key(store.clone()),
        Campaign::Never => quiet,
    };
    loop {
        let granting = tokio::time::Instant::now();
        let lease = match store.grant_lease(ttl).await {
            Ok(lease) => lease,
            Err(error) => {
                tracing::warn!(%error, "cannot join the cluster yet; retrying");
                tokio::time::sleep(renew_every).await;
                continue;
            }
        };
        if let Err(error) = store
            .put_leased(&keys::live_key(&record.node), &value, lease)
            .await
        {
            // Paced: a refusal now comes back at once (it is not retried in the store), and
            // each turn grants a lease that lingers until its TTL.
            tracing::warn!(%error, "cannot say this node is live; retrying");
            tokio::time::sleep(renew_every).await;
            continue;
        }
        view.send_modify(|v| {
            v.lease = Some(lease);
            v.lease_fresh_until = Some(granting + fresh_for(ttl));
        });
        tracing::info!(node = %record.node, lease, "node is live in the cluster");
        if let Some(previous) = previous_lease.take().filter(|previous| *previous != lease) {
            revoke_previous_run(&store, previous).await;
        }
        let mut leader_changed = leader_changed.clone();
        let renewer = store.lease_renewer(lease);
        let mut renew = tokio::time::interval(renew_every);
        renew.tick().await;
        loop {
            // Bounded: a campaign must never hold up the next renewal (an agent woken past
            // its TTL learns that its lease expired from the renewal).
            if campaign_for == Campaign::ToLead {
                let campaigning = campaign(&store, &record, &value, lease, &view);
                let _ = tokio::time::timeout(renew_every, campaigning).await;
            }
            // Biased, renewal first: a renewal due is never put off by a change of the
            // leader key, and a simulation replays (an unbiased select draws from tokio's own
            // random).
            tokio::select! {
                biased;
                _ = renew.tick() => {
                    let renewing = tokio::time::Instant::now();
                    let renewed = tokio::time::timeout(renew_every, renewer.renew());
                    let renewed = match renewed.await {
                        Ok(answer) => answer.map_err(|error| error.to_string()),
                        Err(_) => Err(format!("no answer within {renew_every:?}")),
                    };
                    match renewed {
                        Ok(LeaseState::Alive) => view.send_modify(|v| {
                            v.lease_fresh_until = Some(renewing + fresh_for(ttl));
                        }),
                        Ok(LeaseState::Expired) => {
                            tracing::warn!(node = %record.node, "this agent's lease expired (paused or cut off too long); joining again");
                            view.send_modify(|v| {
                                v.lease = None;
                                v.leading = None;
                                v.lease_fresh_until = None;
                            });
                            break;
                        }
                        Err(error) => tracing::warn!(%error, "cannot renew this agent's lease; trying again"),
                    }
                }
                _ = leader_changed.changed() => {}
            }
        }
    }
}

/// Revokes the lease of this agent's previous run: its keys go at once (its node's live key
/// was written again under the new lease just before, so only what the old run held alone
/// goes: the leader key, when it led). A failure only costs time: the old lease then expires
/// after its TTL, as it always did.
async fn revoke_previous_run(store: &EtcdStore, previous: i64) {
    match store.revoke_lease(previous).await {
        Ok(true) => tracing::info!(
            lease = previous,
            "revoked the lease of this agent's previous run (and the leadership it held)"
        ),
        Ok(false) => {}
        Err(error) => {
            tracing::warn!(%error, lease = previous, "cannot revoke the lease of this agent's previous run; it expires after its TTL")
        }
    }
}

/// Creates the leader key under `lease` if nobody holds it, and records who does.
async fn campaign(
    store: &EtcdStore,
    record: &MemberRecord,
    value: &[u8],
    lease: i64,
    view: &watch::Sender<MemberView>,
) {
    let held = match store.create_leased(&keys::leader_key(), value, lease).await {
        Ok(held) => held,
        Err(error) => {
            tracing::warn!(%error, "cannot read the cluster's leader");
            return;
        }
    };
    let leader = serde_json::from_slice::<MemberRecord>(&held.value).ok();
    let leading = (held.lease == lease && held.create_revision > 0).then(|| Fence {
        key: keys::leader_key(),
        create_revision: held.create_revision,
    });
    view.send_if_modified(|v| {
        let changed = v.leader != leader || v.leading != leading;
        if leading.is_some() && v.leading.is_none() {
            v.took_over_from = v
                .leader
                .as_ref()
                .filter(|old| old.node != record.node)
                .map(|old| old.node.clone());
        }
        v.leader = leader;
        v.leading = leading;
        changed
    });
}

/// A counter bumped at every change of the leader key, by a task that ends with the
/// receiver.
fn watch_leader_key(store: EtcdStore) -> watch::Receiver<u64> {
    let (sender, receiver) = watch::channel(0u64);
    tokio::spawn(async move {
        let follow = async {
            loop {
                let mut watch = match PrefixWatch::start(&store, &keys::leader_key()).await {
                    Ok((_, watch)) => watch,
                    Err(_) => {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                };
                while watch.next().await.is_ok() {
                    sender.send_modify(|n| *n += 1);
                }
            }
        };
        tokio::select! {
            biased;
            () = sender.closed() => {}
            () = follow => {}
        }
    });
    receiver
}
