//! Leadership under pauses and restarts: the three defects a chaos run of the real cluster
//! found, each reproduced with real agents on a real etcd. A paused leader woken up answered
//! from what it knew before it slept; a request sent on to a paused leader waited for it to
//! wake rather than go to the next one; a leader killed and restarted at once kept the
//! cluster leaderless until its previous lease expired.

use super::{Cluster, NODE_TTL, live_by_node, running};
use crate::etcd::EtcdCluster;
use crate::support::WrittenRequest;
use crate::support::http;
use caravan_test_artifacts::SLEEPER;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_woken_from_a_pause_does_not_answer_from_what_it_knew_before() {
    let cluster = Cluster::start().await;
    let leader = cluster.leader_via(0).await.expect("a leader");
    let follower = (0..3).find(|i| *i != leader).unwrap();
    let leader_name = cluster.nodes[leader].name.clone();
    let leader_ref = leader_name.as_str();
    assert_eq!(cluster.run_job(follower, "web", 6).await.0, 200);
    cluster
        .until(
            "6 allocs running, some on the leader's node",
            |c| async move {
                let allocs = c.allocs(follower, "web").await;
                running(&allocs) == 6 && live_by_node(&allocs).contains_key(leader_ref)
            },
        )
        .await;
    let paused = cluster.nodes[leader].process.as_ref().unwrap();
    paused.send_signal("-STOP");
    cluster
        .until(
            "the paused node's allocs replaced by a new leader",
            |c| async move {
                let allocs = c.allocs(follower, "web").await;
                running(&allocs) == 6 && !live_by_node(&allocs).contains_key(leader_ref)
            },
        )
        .await;
    // Asked while asleep, it answers as soon as it wakes, before its membership has heard
    // from etcd that its lease is gone.
    let asked = WrittenRequest::get(cluster.nodes[leader].addr(), "/v1/job/web/allocations").await;
    paused.send_signal("-CONT");
    // Whichever it hears of first, its stale lease or the request, it asks etcd who leads
    // and sends the request there.
    let (status, allocs) = asked.answer().await;
    assert_eq!(status, 200, "the woken leader answered {status}: {allocs}");
    let allocs = allocs.as_array().expect("a list of allocs");
    assert!(
        !live_by_node(allocs).contains_key(leader_ref),
        "the woken leader showed its node's allocs still live, which the new leader had \
         replaced: {allocs:#?}"
    );
    assert_eq!(running(allocs), 6, "{allocs:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_sent_on_to_a_paused_leader_goes_to_the_next_leader_once_one_is_elected() {
    let cluster = Cluster::start().await;
    let leader = cluster.leader_via(0).await.expect("a leader");
    let follower = (0..3).find(|i| *i != leader).unwrap();
    let paused = cluster.nodes[leader].process.as_ref().unwrap();
    paused.send_signal("-STOP");
    // The follower still sees the paused agent lead, for a TTL: it sends the job there.
    let (status, answer) = cluster.run_job(follower, "late", 2).await;
    assert_eq!(
        status, 200,
        "the job waited for the paused leader rather than go to the next one: {answer}"
    );
    let forwarder = cluster.nodes[follower].process.as_ref().unwrap();
    forwarder.wait_for("the request sent again to the new leader", |line| {
        line["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("sending it to the new leader"))
    });
    cluster
        .until("the late job's 2 allocs running", |c| async move {
            running(&c.allocs(follower, "late").await) == 2
        })
        .await;
    // The old leader wakes with the forwarded request in its socket: it must not register
    // the job a second time.
    paused.send_signal("-CONT");
    cluster
        .until("the woken agent is a node again", |c| async move {
            c.ready_nodes_via(follower).await.len() == 3
        })
        .await;
    let allocs = cluster.allocs(follower, "late").await;
    assert_eq!(allocs.len(), 2, "{allocs:#?}");
    // Registered once, by the new leader: the woken one refused what it found in its socket
    // (a second registration of the same job would change nothing, so only the agents' own
    // lines can tell).
    let registered = cluster
        .nodes
        .iter()
        .flat_map(|node| node.process.as_ref().unwrap().unread_lines())
        .filter(|line| line.contains("\"job registered\"") && line.contains("\"job_id\":\"late\""))
        .count();
    assert_eq!(registered, 1, "the job was registered {registered} times");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_and_restarted_at_once_revokes_its_previous_lease() {
    // Leases that would outlast the wait below many times over: only a revocation frees
    // the leader key in time.
    const LONG_TTL: &str = "300s";
    assert_ne!(LONG_TTL, NODE_TTL);
    let mut cluster = Cluster::with_ttl(EtcdCluster::start().await, LONG_TTL).await;
    let leader = cluster.leader_via(0).await.expect("a leader");
    let follower = (0..3).find(|i| *i != leader).unwrap();
    let store = cluster.etcd.store().await;
    let leader_key = caravan_host::cluster::keys::leader_key();
    let held = store
        .get_many(std::slice::from_ref(&leader_key))
        .await
        .unwrap();
    let previous_lease = held.first().expect("the leader key").lease;
    cluster.nodes[leader].kill9();
    let Cluster { etcd, nodes, .. } = &mut cluster;
    nodes[leader].start(etcd);
    cluster
        .until("the previous run's lease revoked", |_| {
            let store = store.clone();
            async move { store.lease_age(previous_lease).await.unwrap().is_none() }
        })
        .await;
    cluster
        .until("the cluster answers a write again", |c| async move {
            let body = serde_json::json!({ "job": {
                "id": "after", "type": "service", "count": 1, "runner": SLEEPER,
            }})
            .to_string();
            let addr = c.nodes[follower].addr();
            http(addr, "POST", "/v1/jobs", Some(&body), None).await.0 == 200
        })
        .await;
}
