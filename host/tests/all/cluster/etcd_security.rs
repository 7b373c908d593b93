//! Cluster mode on an etcd that lets no one in without credentials: three real members
//! serving `https://` only, requiring a client certificate from the cluster's CA
//! (`--client-cert-auth`), with authentication on and a `caravan` user whose role may read
//! and write `/caravan/` only (the role docs/cluster.md tells operators to make). Agents with
//! the CA, their certificate and the user's password form a cluster and run a job; an agent
//! with a wrong password, or without a certificate, stops at start with one line naming why.

use super::running;
use crate::etcd::EtcdCluster;
use crate::support::pki::{Identity, Pki};
use crate::support::{AgentProcess, agent_refusing_to_start, eventually_async, http};
use caravan_host::cli::tls::Role;
use caravan_test_artifacts::SLEEPER;

/// The `[cluster]` block of an agent named `node` reaching the secured etcd.
fn cluster_block(
    etcd: &EtcdCluster,
    node: &str,
    ca: &std::path::Path,
    identity: Option<&Identity>,
    password_file: &std::path::Path,
) -> String {
    let mut block = format!(
        "[cluster]\nmode = \"etcd\"\nnode_name = {node:?}\nnode_ttl = \"4s\"\ncompact_interval = \"1s\"\n\
         etcd_endpoints = {:?}\n\
         etcd_ca_file = {ca:?}\netcd_username = \"caravan\"\netcd_password_file = {password_file:?}\n",
        etcd.endpoints()
    );
    if let Some(identity) = identity {
        block.push_str(&format!(
            "etcd_cert_file = {:?}\netcd_key_file = {:?}\n",
            identity.cert, identity.key
        ));
    }
    block
}

#[tokio::test]
async fn agents_need_etcds_ca_their_certificate_and_the_users_password_to_join() {
    let pki = Pki::new("cluster");
    let member = pki.issue(Role::Server, "etcd-member");
    let agent = pki.issue(Role::Server, "agent");
    let mut etcd = EtcdCluster::start_secured(
        &pki.ca,
        (&member.cert, &member.key),
        (&agent.cert, &agent.key),
    )
    .await;
    etcd.enable_auth("caravan", "s3cret").await;
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("etcd-password");
    std::fs::write(&password, "s3cret\n").unwrap();
    let wrong_password = dir.path().join("wrong-password");
    std::fs::write(&wrong_password, "guess\n").unwrap();

    let agents: Vec<AgentProcess> = ["node-1", "node-2"]
        .iter()
        .map(|node| {
            let data_dir = dir.path().join(node);
            AgentProcess::start_configured(
                &["--data-dir", data_dir.to_str().unwrap()],
                &format!(
                    "max_live_allocs = 64\n{}",
                    cluster_block(&etcd, node, &pki.ca, Some(&agent), &password)
                ),
            )
        })
        .collect();
    let first = agents[0].socket_addr();
    eventually_async("two nodes ready, and a leader", || async {
        let (_, leader) = http(first, "GET", "/v1/status/leader", None, None).await;
        crate::support::ready_nodes(first).await.len() == 2 && leader["leader"]["node"].is_string()
    })
    .await;
    let job = serde_json::json!({ "job": {
        "id": "web", "type": "service", "count": 2, "runner": SLEEPER,
    }})
    .to_string();
    let (status, answer) = http(first, "POST", "/v1/jobs", Some(&job), None).await;
    assert_eq!(status, 200, "{answer}");
    eventually_async("both allocs running", || async {
        let (_, allocs) = http(first, "GET", "/v1/job/web/allocations", None, None).await;
        running(allocs.as_array().map_or(&[][..], Vec::as_slice)) == 2
    })
    .await;

    // The leader compacts etcd's history, and every agent reads etcd's space and alarms, as
    // the `caravan` user: the role the docs give is enough for all of it.
    let addrs: Vec<_> = agents.iter().map(AgentProcess::socket_addr).collect();
    eventually_async(
        "a compaction, and etcd's space read by every agent",
        || async {
            let mut compactions = 0;
            for addr in &addrs {
                let (_, etcd) = http(*addr, "GET", "/v1/status/etcd", None, None).await;
                if etcd["probe"] != "answered" {
                    println!("{addr}: {etcd}");
                    return false;
                }
                compactions += etcd["compactions"].as_u64().unwrap_or(0);
            }
            compactions > 0
        },
    )
    .await;

    for (what, identity, password_file, expected) in [
        (
            "a wrong password",
            Some(&agent),
            &wrong_password,
            "authentication failed",
        ),
        (
            "no certificate",
            None,
            &password,
            "presented no certificate",
        ),
    ] {
        let data_dir = dir.path().join("node-3");
        let (code, stderr) = agent_refusing_to_start(
            &["--data-dir", data_dir.to_str().unwrap()],
            &cluster_block(&etcd, "node-3", &pki.ca, identity, password_file),
        );
        assert_ne!(code, Some(0), "{what}: {stderr}");
        let last = stderr.lines().last().unwrap_or_default();
        assert!(
            last.to_lowercase().contains(expected),
            "{what}: the last line names the cause: {stderr}"
        );
        assert!(
            !stderr.contains("s3cret"),
            "{what}: the password is never shown: {stderr}"
        );
    }
    drop(agents);
}
