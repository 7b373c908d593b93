//! etcd failing under the cluster: its leader dying mid-deploy, and a node's watch outliving
//! the history it needed (a compaction and every member's restart).

use super::{Cluster, live_by_node, running, unique_ids};
use crate::support::http;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etcd_leader_dying_mid_deploy_loses_no_write_and_no_event_and_a_compaction_is_survived()
{
    let mut cluster = Cluster::start().await;
    let (status, answer) = cluster.run_job(0, "web", 30).await;
    assert_eq!(status, 200, "{answer}");
    let member = cluster.etcd.leader().await;
    cluster.etcd.kill(member);
    cluster.etcd.restart(member);
    cluster.etcd.wait_for_member(member).await;
    cluster
        .until("30 allocs running", |c| async move {
            running(&c.allocs(0, "web").await) == 30
        })
        .await;
    // Every node saw every alloc placed on it: each reported it running itself.
    let allocs = cluster.allocs(1, "web").await;
    assert!(unique_ids(&allocs));
    assert_eq!(live_by_node(&allocs).values().sum::<usize>(), 30);
    // A node whose watch broke while the history it needed was compacted re-lists its
    // allocs and carries on: node X sleeps through a scale-up that places an alloc on it, a
    // compaction, and every etcd member's restart (so its watch's member is gone).
    let leader = cluster.leader_via(0).await.expect("a leader");
    let x = (0..3).find(|i| *i != leader).unwrap();
    let via = (0..3).find(|i| *i != x).unwrap();
    let sleeper = cluster.nodes[x].process.as_ref().unwrap();
    sleeper.send_signal("-STOP");
    let scale = serde_json::json!({ "count": 33 }).to_string();
    let (status, answer) = http(
        cluster.nodes[via].addr(),
        "POST",
        "/v1/job/web/scale",
        Some(&scale),
        None,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let x_name = cluster.nodes[x].name.clone();
    let x_ref = x_name.as_str();
    cluster
        .until("the other nodes run their new allocs", |c| async move {
            let allocs = c.allocs(via, "web").await;
            let elsewhere: Vec<Value> = allocs
                .into_iter()
                .filter(|a| a["node_id"] != x_ref)
                .collect();
            running(&elsewhere) >= 22
        })
        .await;
    cluster.etcd.compact().await;
    for member in 0..3 {
        cluster.etcd.restart(member);
        cluster.etcd.wait_for_member(member).await;
    }
    sleeper.send_signal("-CONT");
    let prefix = format!("/caravan/v1/allocs/{}/", cluster.nodes[x].name);
    sleeper.wait_for("the sleeping node's re-list", |line| {
        line["fields"]["message"] == "etcd history compacted; re-listed the prefix"
            && line["fields"]["prefix"] == prefix.as_str()
    });
    cluster
        .until("33 allocs running", |c| async move {
            running(&c.allocs(via, "web").await) == 33
        })
        .await;
}
