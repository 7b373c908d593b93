//! A cluster with TLS everywhere on the API: three agents on a real etcd, each serving HTTPS
//! with its own server certificate from the cluster's CA and requiring one of every caller.
//! An operator's CLI submits a job through an agent that does not lead: the request is
//! forwarded to the leader over mutual TLS, and every node fetches the runner build by hash
//! from another agent over mutual TLS before running its alloc.

use super::{live_by_node, running, secured_agents};
use crate::etcd::EtcdCluster;
use crate::support::pki::Pki;
use crate::support::{eventually_async, http_via};
use caravan_host::cli::tls::Role;
use caravan_test_artifacts::SLEEPER;
use serde_json::Value;

#[tokio::test]
async fn an_operator_runs_a_job_through_any_agent_of_a_cluster_with_mutual_tls() {
    let pki = Pki::new("cluster");
    let etcd = EtcdCluster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let agents = secured_agents(&pki, &etcd, dir.path(), "max_live_allocs = 64\n");
    let cli = pki.issue(Role::Cli, "cli");
    let pool = pki.pool(Some(&cli));
    let get = |i: usize, path: String| {
        let (pool, base) = (pool.clone(), agents[i].addr.clone());
        async move { http_via(&pool, &base, "GET", &path, None, None).await }
    };
    eventually_async("three nodes ready, and a leader", || async {
        let ready = crate::support::ready_nodes_via(&pool, &agents[0].addr)
            .await
            .len();
        let (_, leader) = get(0, "/v1/status/leader".into()).await;
        ready == 3 && leader["leader"]["node"].is_string()
    })
    .await;
    let (_, leader) = get(0, "/v1/status/leader".into()).await;
    let leader = leader["leader"]["node"].as_str().unwrap().to_string();
    let via = (0..3)
        .find(|i| format!("node-{}", i + 1) != leader)
        .unwrap();

    let jobs = tempfile::tempdir().unwrap();
    std::fs::copy(SLEEPER, jobs.path().join("web.wasm")).unwrap();
    let job = crate::support::service_job_file(jobs.path(), "web", 3, "web.wasm");
    let mut args: Vec<String> = ["job", "run", "--detach", job.to_str().unwrap()]
        .map(String::from)
        .to_vec();
    args.extend(pki.cli_flags(Some(&cli)));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    crate::support::assert_succeeded(&agents[via].caravan(&args));

    eventually_async("one alloc running on each node", || async {
        let (_, allocs) = get(via, "/v1/job/web/allocations".into()).await;
        let allocs: Vec<Value> = allocs.as_array().cloned().unwrap_or_default();
        running(&allocs) == 3 && live_by_node(&allocs).len() == 3
    })
    .await;
    drop(etcd);
}
