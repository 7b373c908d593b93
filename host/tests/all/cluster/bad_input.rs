//! What the cluster refuses, with one line: an unreachable etcd, an address others cannot
//! reach, an invalid job sent to a follower, a live node's name, and a newer schema.

use super::Cluster;
use crate::support::{http, run_caravan};

/// Starts `caravan agent --cluster etcd --dev` with these endpoints, node name and bind,
/// expects it to refuse to start (exit 2), and returns the one line it ended with; the
/// whole of stderr for failure messages.
fn refused_agent(endpoints: &str, node: &str, bind: &str) -> (String, String) {
    let out = run_caravan(
        &[
            "agent",
            "--cluster",
            "etcd",
            "--etcd-endpoints",
            endpoints,
            "--node-name",
            node,
            "--dev",
            "--bind",
            bind,
        ],
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let last = stderr.lines().last().unwrap_or("").to_string();
    (last, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_one_line_by_any_agent() {
    // Nothing listens on port 1: the agent names the endpoint and exits.
    let (last, stderr) = refused_agent("http://127.0.0.1:1", "n1", "127.0.0.1:0");
    assert!(
        last.contains("etcd is unreachable at http://127.0.0.1:1"),
        "{stderr}"
    );

    // An API on 0.0.0.0 is not an address other agents can forward to.
    let (last, stderr) = refused_agent("http://127.0.0.1:1", "n1", "0.0.0.0:0");
    assert!(last.contains("--advertise"), "{stderr}");

    let cluster = Cluster::start().await;
    // A job is validated wherever it is sent: a follower relays the leader's 400.
    let leader = cluster.leader_via(0).await.unwrap();
    let follower = (0..3).find(|i| *i != leader).unwrap();
    let body = r#"{"job": {"id": "a", "type": "service", "count": 1}}"#;
    let (status, error) = http(
        cluster.nodes[follower].addr(),
        "POST",
        "/v1/jobs",
        Some(body),
        None,
    )
    .await;
    assert_eq!(status, 400, "{error}");
    assert_eq!(error["field"], "job.runner", "{error}");

    // A second agent under a live node's name would run that node's allocs twice: refused.
    let endpoints = cluster.etcd.endpoints().join(",");
    let (last, stderr) = refused_agent(&endpoints, &cluster.nodes[0].name, "127.0.0.1:0");
    assert!(
        last.contains("node name node-1 is live in the cluster already"),
        "{stderr}"
    );

    // A newer schema is refused with one line naming it.
    let mut client = etcd_client::Client::connect(cluster.etcd.endpoints(), None)
        .await
        .unwrap();
    until_answered!(
        "writing schema 99",
        client.put(caravan_host::cluster::SCHEMA_KEY, "99", None)
    );
    let (last, stderr) = refused_agent(&endpoints, "n4", "127.0.0.1:0");
    assert!(
        last.contains("holds Caravan's cluster schema 99"),
        "{stderr}"
    );
}
