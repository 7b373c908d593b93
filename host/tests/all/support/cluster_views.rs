//! What a cluster test reads of the API's JSON views (the nodes ready, a job's allocs: how
//! many run, where, whether any is listed twice) and what it asserts of a CLI command that
//! must succeed. Shared by the loopback cluster tests, the multi-host ones and the runner
//! store's.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// The nodes the cluster places on (`ready`), as the agent at `addr` answers; none while it
/// cannot answer.
pub async fn ready_nodes(addr: std::net::SocketAddr) -> BTreeSet<String> {
    let plain = caravan_host::rpc::transport::AgentPool::new();
    ready_nodes_via(&plain, &format!("http://{addr}")).await
}

/// [`ready_nodes`] of the agent at `base` (`https://...` on a TLS pool) through `pool`.
pub async fn ready_nodes_via(
    pool: &caravan_host::rpc::transport::AgentPool,
    base: &str,
) -> BTreeSet<String> {
    let (status, nodes) = super::http_via(pool, base, "GET", "/v1/nodes", None, None).await;
    if status != 200 {
        return BTreeSet::new();
    }
    nodes
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["status"] == "ready")
        .filter_map(|n| n["id"].as_str().map(str::to_string))
        .collect()
}

/// Fails the test, with what the command wrote to stderr, unless it exited 0.
pub fn assert_succeeded(output: &std::process::Output) {
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Allocs not yet terminal and still wanted, by node.
pub fn live_by_node(allocs: &[Value]) -> BTreeMap<String, usize> {
    let mut by_node = BTreeMap::new();
    for alloc in allocs {
        let terminal =
            ["complete", "failed", "lost"].contains(&alloc["client_status"].as_str().unwrap_or(""));
        if !terminal && alloc["desired_status"] == "run" {
            *by_node
                .entry(alloc["node_id"].as_str().unwrap_or("").to_string())
                .or_default() += 1;
        }
    }
    by_node
}

/// Allocs running and wanted.
pub fn running(allocs: &[Value]) -> usize {
    allocs
        .iter()
        .filter(|a| a["client_status"] == "running" && a["desired_status"] == "run")
        .count()
}

/// Whether no alloc is listed twice.
pub fn unique_ids(allocs: &[Value]) -> bool {
    let ids: BTreeSet<&str> = allocs.iter().filter_map(|a| a["id"].as_str()).collect();
    ids.len() == allocs.len()
}

/// Writes a job file of `count` service allocs of `runner` (as written: a path relative to
/// the file, or a registry reference) into `dir` as `ID.toml`, and returns its path.
pub fn service_job_file(
    dir: &std::path::Path,
    id: &str,
    count: u32,
    runner: &str,
) -> std::path::PathBuf {
    let path = dir.join(format!("{id}.toml"));
    std::fs::write(
        &path,
        format!("[job]\nid = {id:?}\ntype = \"service\"\ncount = {count}\nrunner = {runner:?}\n"),
    )
    .unwrap();
    path
}
