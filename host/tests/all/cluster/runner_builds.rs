//! Runners travel by hash: a runner submitted through any agent runs on every node after its
//! file is gone, and a node that cannot get a build fails that alloc naming the build and
//! the agents it asked, and the alloc is placed where the build is.

use super::{Cluster, live_by_node, running};
use crate::support::http;
use caravan_host::runner_store::sha256_hex;
use caravan_test_artifacts::SLEEPER;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The builds node `i`'s store holds.
async fn builds_on(cluster: &Cluster, i: usize) -> Vec<String> {
    let (_, builds) = cluster.get(i, "/v1/runners").await;
    builds
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["sha256"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn a_runner_submitted_through_one_agent_runs_on_every_node_after_its_file_is_gone() {
    let cluster = Cluster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let runner = dir.path().join("web.wasm");
    std::fs::copy(SLEEPER, &runner).unwrap();
    let job = crate::support::service_job_file(dir.path(), "web", 3, "web.wasm");
    // Through an agent that does not lead, when there is one: the upload lands there, the
    // leader fetches it to check the job, and the other nodes fetch it to run their allocs.
    let leader = cluster.leader_via(0).await;
    let via = (0..3).find(|i| Some(*i) != leader).unwrap();
    let process = cluster.nodes[via].process.as_ref().unwrap();
    let run = process.caravan(&["job", "run", "--detach", job.to_str().unwrap()]);
    crate::support::assert_succeeded(&run);
    std::fs::remove_file(&runner).unwrap();

    cluster
        .until("one alloc running on each node", |c| async move {
            let allocs = c.allocs(0, "web").await;
            running(&allocs) == 3 && live_by_node(&allocs).len() == 3
        })
        .await;
    let sha256 = sha256_hex(&std::fs::read(SLEEPER).unwrap());
    for i in 0..3 {
        assert_eq!(
            builds_on(&cluster, i).await,
            std::slice::from_ref(&sha256),
            "node {i} keeps the build it runs"
        );
    }
}

#[tokio::test]
async fn a_node_that_cannot_get_the_build_fails_the_alloc_naming_it_and_the_alloc_moves() {
    let cluster = Cluster::start().await;
    let leader = cluster.leader_via(0).await.expect("a leader");
    let leader_addr = cluster.nodes[leader].addr();
    let leader_name = cluster.nodes[leader].name.clone();
    let sha256 = sha256_hex(&std::fs::read(SLEEPER).unwrap());

    // The build is uploaded to the leader, and a job of it registers with no alloc: the
    // leader loads it. Then the leader's copy goes (a disk lost, say): it can run the build
    // from memory, and no agent can give it to another node (nor is it at the path the job
    // names, on any machine). The job is scaled up.
    let pool = caravan_host::rpc::transport::AgentPool::new();
    let leader_api = pool.agent(&format!("http://{leader_addr}"), None).unwrap();
    let (status, _) = leader_api
        .exchange(
            hyper::Method::PUT,
            &format!("/v1/runner/{sha256}"),
            axum::body::Body::from(std::fs::read(SLEEPER).unwrap()),
            crate::support::DEADLINE,
            1 << 20,
        )
        .await
        .unwrap();
    assert_eq!(status.as_u16(), 201);
    let job = json!({ "job": {
        "id": "web", "type": "service", "count": 0, "runner": "/gone/web.wasm",
        "runner_sha256": sha256,
        "reschedule": { "attempts": 6, "interval": "1h", "delay": "1s",
                        "delay_function": "constant" },
    }});
    let (status, answer) = http(
        leader_addr,
        "POST",
        "/v1/jobs",
        Some(&job.to_string()),
        None,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let kept = cluster.nodes[leader]
        .data_dir
        .join("runners/sha256")
        .join(&sha256);
    std::fs::remove_file(&kept).unwrap();
    let (status, answer) = http(
        leader_addr,
        "POST",
        "/v1/job/web/scale",
        Some(r#"{"count": 3}"#),
        None,
    )
    .await;
    assert_eq!(status, 200, "{answer}");

    cluster
        .until("every alloc running on the leader's node", |c| {
            let leader_name = leader_name.clone();
            async move {
                let allocs = c.allocs(0, "web").await;
                running(&allocs) == 3 && live_by_node(&allocs) == BTreeMap::from([(leader_name, 3)])
            }
        })
        .await;
    let allocs = cluster.allocs(0, "web").await;
    let failed: Vec<&Value> = allocs
        .iter()
        .filter(|a| a["client_status"] == "failed")
        .collect();
    assert!(!failed.is_empty(), "{allocs:#?}");
    for alloc in failed {
        let description = alloc["description"].as_str().unwrap_or_default();
        assert!(
            description.contains(&format!(
                "runner build sha256:{sha256} is not on this agent, and no agent gave it \
                 (tried {}: does not have it",
                format_args!("http://{leader_addr}")
            )),
            "names the build and the agents asked, the leader first: {description}"
        );
        assert_ne!(alloc["node_id"], leader_name.as_str());
    }
}

#[tokio::test]
async fn a_job_naming_a_build_no_agent_has_is_refused_and_nothing_registers() {
    let cluster = Cluster::start().await;
    let missing = "ab".repeat(32);
    let job = json!({ "job": {
        "id": "web", "type": "service", "count": 1, "runner": "web.wasm",
        "runner_sha256": missing,
    }});
    let (status, answer) = http(
        cluster.nodes[0].addr(),
        "POST",
        "/v1/jobs",
        Some(&job.to_string()),
        None,
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["field"], "job.runner");
    let error = answer["error"].as_str().unwrap();
    assert!(
        error.starts_with(&format!(
            "job.runner: runner build sha256:{missing} is not on this agent, and no agent \
             gave it (tried http://127.0.0.1:"
        )) && error.matches("does not have it").count() == 2,
        "{error}"
    );
    let (status, _) = cluster.get(0, "/v1/job/web").await;
    assert_eq!(status, 404, "nothing registered");
}
