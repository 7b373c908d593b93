//! Agents dying, pausing and handing over: a killed node's allocs replaced and stopped on
//! its return, a new leader finishing a deploy, and a paused leader's writes fenced off.

use super::{Cluster, live_by_node, running, unique_ids};
use crate::etcd::EtcdCluster;
use crate::support::http;
use caravan_test_artifacts::SLEEPER;
use std::collections::BTreeSet;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_spreads_over_the_nodes_and_a_killed_node_is_replaced_then_stops_its_old_allocs() {
    let mut cluster = Cluster::start().await;
    let (status, answer) = cluster.run_job(1, "web", 30).await;
    assert_eq!(status, 200, "{answer}");
    cluster
        .until("30 allocs running", |c| async move {
            running(&c.allocs(2, "web").await) == 30
        })
        .await;
    let allocs = cluster.allocs(0, "web").await;
    assert_eq!(allocs.len(), 30, "every alloc placed once");
    assert!(unique_ids(&allocs));
    assert_eq!(
        live_by_node(&allocs).values().copied().collect::<Vec<_>>(),
        [10, 10, 10],
        "spread evenly: {:?}",
        live_by_node(&allocs)
    );

    // An alloc's logs are read through any agent: the request goes to the node running it,
    // found through the leader (asked by a follower, and by the leader itself).
    let leader = cluster.leader_via(0).await.expect("a leader");
    for via in [(leader + 1) % 3, leader] {
        let elsewhere = allocs
            .iter()
            .find(|a| a["node_id"] != cluster.nodes[via].name.as_str())
            .unwrap();
        let path = format!(
            "/v1/client/allocation/{}/logs",
            elsewhere["id"].as_str().unwrap()
        );
        let (status, logs) = cluster.get(via, &path).await;
        assert_eq!(status, 200, "{logs}");
        assert!(
            logs.as_str().is_some_and(|l| l.contains("started")),
            "{logs}"
        );
        // So is what only that node knows of it, which `alloc status` and the UI add.
        let path = format!(
            "/v1/client/allocation/{}",
            elsewhere["id"].as_str().unwrap()
        );
        let (status, local) = cluster.get(via, &path).await;
        assert_eq!(status, 200, "{local}");
        assert!(local["runner_sha256"].is_string(), "{local}");
        // The sleeper reaches no files, so it is given no alloc dir, and none is shown.
        assert!(local["alloc_dir"].is_null(), "{local}");
    }

    // A node that does not lead dies: its allocs are lost and replaced on the other two.
    let victim = (0..3).find(|i| *i != leader).unwrap();
    let survivor = (0..3).find(|i| *i != leader && *i != victim).unwrap();
    let victim_name = cluster.nodes[victim].name.clone();
    let held: BTreeSet<String> = allocs
        .iter()
        .filter(|a| a["node_id"] == victim_name.as_str())
        .map(|a| a["id"].as_str().unwrap().to_string())
        .collect();
    cluster.nodes[victim].kill9();
    let (held_ref, name_ref) = (&held, victim_name.as_str());
    cluster
        .until("the dead node's allocs lost and replaced", |c| async move {
            let allocs = c.allocs(survivor, "web").await;
            let lost = allocs
                .iter()
                .filter(|a| held_ref.contains(a["id"].as_str().unwrap_or("")))
                .all(|a| a["client_status"] == "lost");
            lost && running(&allocs) == 30 && !live_by_node(&allocs).contains_key(name_ref)
        })
        .await;
    let (_, nodes) = cluster.get(survivor, "/v1/nodes").await;
    for node in nodes.as_array().unwrap() {
        if node["id"] == name_ref {
            assert_eq!(node["status"], "down", "{nodes}");
        } else {
            assert_eq!(node["status"], "ready", "{nodes}");
            assert!(
                node["last_heartbeat_secs"].as_u64().is_some_and(|s| s <= 4),
                "{nodes}"
            );
            assert!(
                node["address"]
                    .as_str()
                    .is_some_and(|a| a.starts_with("http://127.0.0.1:")),
                "{nodes}"
            );
        }
    }
    let members = cluster.nodes[survivor]
        .process
        .as_ref()
        .unwrap()
        .caravan(&["server", "members"]);
    let table = String::from_utf8_lossy(&members.stdout);
    let leader_name = cluster.nodes[leader].name.as_str();
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(leader_name) && l.ends_with("true")),
        "{table}"
    );

    // Back on its data dir, it stops what it held: the cluster settles with 30 allocs, each
    // on one node.
    let Cluster { etcd, nodes, .. } = &mut cluster;
    nodes[victim].start(etcd);
    cluster
        .until(
            "the returning node stops its replaced allocs",
            |c| async move {
                let allocs = c.allocs(survivor, "web").await;
                let stopped = allocs
                    .iter()
                    .filter(|a| held_ref.contains(a["id"].as_str().unwrap_or("")))
                    .all(|a| a["client_status"] == "complete");
                stopped && c.ready_nodes_via(survivor).await.contains(name_ref)
            },
        )
        .await;
    let allocs = cluster.allocs(victim, "web").await;
    assert_eq!(live_by_node(&allocs).values().sum::<usize>(), 30);
    assert!(unique_ids(&allocs));
    assert_eq!(running(&allocs), 30);

    // Stopped and collected through any agent's CLI: the leader deletes the allocs' keys
    // and their states from etcd.
    let cli = |args: &[&str]| {
        let out = cluster.nodes[victim]
            .process
            .as_ref()
            .unwrap()
            .caravan(args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    cli(&["job", "stop", "--purge", "web"]);
    cluster
        .until("every alloc stopped", |c| async move {
            let allocs = c.allocs(survivor, "web").await;
            allocs
                .iter()
                .all(|a| ["complete", "lost"].contains(&a["client_status"].as_str().unwrap_or("")))
        })
        .await;
    // A GC collects what is terminal when it runs; a kill still finishing waits for the next.
    let store = cluster.etcd.store().await;
    let store = &store;
    cluster
        .until(
            "system gc leaves nothing of the job in etcd",
            |c| async move {
                // Not `cli`: a GC answered 503 during an election is tried again.
                let agent = c.nodes[victim].process.as_ref().unwrap();
                let _ = agent.caravan(&["system", "gc"]);
                let mut left = Vec::new();
                for prefix in ["allocs/", "status/", "unplaced/", "jobs/"] {
                    let (keys, _) = store.list(&format!("/caravan/v1/{prefix}")).await.unwrap();
                    left.extend(keys.into_iter().map(|kv| kv.key));
                }
                left.is_empty()
            },
        )
        .await;

    // A node that dies holding nothing is still listed, down.
    cluster.nodes[victim].kill9();
    cluster
        .until("the empty dead node listed down", |c| async move {
            let (_, nodes) = c.get(survivor, "/v1/nodes").await;
            nodes.as_array().is_some_and(|nodes| {
                nodes
                    .iter()
                    .any(|n| n["id"] == name_ref && n["status"] == "down" && n["allocs"] == 0)
            })
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_scheduling_agent_dies_mid_deploy_another_takes_over_and_completes_it() {
    let mut cluster = Cluster::start().await;
    let leader = cluster.leader_via(0).await.expect("a leader");
    let follower = (0..3).find(|i| *i != leader).unwrap();
    let other = (0..3).find(|i| *i != leader && *i != follower).unwrap();
    let (status, answer) = cluster.run_job(follower, "web", 30).await;
    assert_eq!(status, 200, "a follower forwards to the leader: {answer}");
    cluster.nodes[leader].kill9();
    let dead = cluster.nodes[leader].name.clone();
    let dead_ref = dead.as_str();
    cluster
        .until("another agent leads", |c| async move {
            c.leader_via(follower).await.is_some_and(|l| l != leader)
        })
        .await;
    cluster
        .until("the deploy completes on the live nodes", |c| async move {
            let allocs = c.allocs(other, "web").await;
            running(&allocs) == 30 && !live_by_node(&allocs).contains_key(dead_ref)
        })
        .await;
    let allocs = cluster.allocs(follower, "web").await;
    assert!(unique_ids(&allocs));
    assert_eq!(
        live_by_node(&allocs).values().sum::<usize>(),
        30,
        "no duplicate placement: {:?}",
        live_by_node(&allocs)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_paused_past_its_ttl_writes_nothing_when_it_wakes() {
    let cluster = Cluster::start().await;
    let leader = cluster.leader_via(0).await.expect("a leader");
    let follower = (0..3).find(|i| *i != leader).unwrap();
    let (status, _) = cluster.run_job(follower, "web", 3).await;
    assert_eq!(status, 200);
    cluster
        .until("3 allocs running", |c| async move {
            running(&c.allocs(follower, "web").await) == 3
        })
        .await;
    let paused = cluster.nodes[leader].process.as_ref().unwrap();
    paused.send_signal("-STOP");
    cluster
        .until("another agent leads", |c| async move {
            c.leader_via(follower).await.is_some_and(|l| l != leader)
        })
        .await;
    // The new leader gives a node that was not live at its takeover one TTL to come back,
    // then calls it down: past that, what the sleeper ran is replaced.
    let paused_name = cluster.nodes[leader].name.clone();
    let paused_ref = paused_name.as_str();
    cluster
        .until(
            "the paused node is down and its allocs replaced",
            |c| async move {
                let allocs = c.allocs(follower, "web").await;
                running(&allocs) == 3 && !live_by_node(&allocs).contains_key(paused_ref)
            },
        )
        .await;
    // A job sent to the paused leader waits in its socket; it wakes with the request in hand
    // and its scheduler as it was.
    let body = serde_json::json!({ "job": {
        "id": "late", "type": "service", "count": 2, "runner": SLEEPER,
    }})
    .to_string();
    let paused_addr = cluster.nodes[leader].addr();
    let late =
        tokio::spawn(async move { http(paused_addr, "POST", "/v1/jobs", Some(&body), None).await });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    paused.send_signal("-CONT");
    let (status, answer) = late.await.unwrap();
    // Either the old leader tried, its fenced write failed and it answered 503, or it had
    // already stepped down and forwarded the job to the new leader.
    assert!(
        status == 503 || status == 200,
        "the woken leader answered {status}: {answer}"
    );
    // Whatever happened, etcd holds exactly what the new leader knows: a write of the old
    // leader that landed would be a job or an alloc the new leader never made.
    let store = cluster.etcd.store().await;
    let new_leader = cluster.leader_via(follower).await.unwrap();
    let (_, jobs) = cluster.get(new_leader, "/v1/jobs").await;
    let (_, allocs) = cluster.get(new_leader, "/v1/allocations").await;
    let known_jobs: BTreeSet<String> = jobs
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap().to_string())
        .collect();
    let known_allocs: BTreeSet<String> = allocs
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap().to_string())
        .collect();
    let (job_keys, _) = store.list("/caravan/v1/jobs/").await.unwrap();
    let stored_jobs: BTreeSet<String> = job_keys
        .iter()
        .map(|kv| kv.key.rsplit('/').next().unwrap().to_string())
        .collect();
    let (alloc_keys, _) = store.list("/caravan/v1/allocs/").await.unwrap();
    let (unplaced, _) = store.list("/caravan/v1/unplaced/").await.unwrap();
    let stored_allocs: BTreeSet<String> = alloc_keys
        .iter()
        .chain(&unplaced)
        .map(|kv| kv.key.rsplit('/').next().unwrap().to_string())
        .collect();
    assert_eq!(stored_jobs, known_jobs);
    assert_eq!(stored_allocs, known_allocs);
    assert_eq!(
        known_jobs.contains("late"),
        status == 200,
        "the late job exists only if the answer said it was registered"
    );
    // Its node was down while it slept: what it ran was replaced, and it stops it.
    cluster
        .until("the woken node stops its replaced allocs", |c| async move {
            let allocs = c.allocs(follower, "web").await;
            running(&allocs) == 3
                && !live_by_node(&allocs).contains_key(paused_ref)
                && allocs
                    .iter()
                    .filter(|a| a["node_id"] == paused_ref)
                    .all(|a| a["client_status"] == "complete")
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_completes_a_deploy_its_predecessor_left_undone() {
    // What a leader that died after writing a job's record, before its allocs, leaves.
    let etcd = EtcdCluster::start().await;
    let body = serde_json::json!({ "job": {
        "id": "web", "type": "service", "count": 3, "runner": SLEEPER,
    }})
    .to_string();
    let spec = caravan_host::model::jobspec::parse_json(&body).unwrap();
    let record = caravan_host::server::JobRecord {
        spec,
        version: 1,
        stopped: false,
        purged: false,
        restarts: 0,
    };
    let store = etcd.store().await;
    store.check_schema().await.unwrap();
    store
        .put(
            "/caravan/v1/jobs/web",
            &serde_json::to_vec(&record).unwrap(),
        )
        .await
        .unwrap();
    let cluster = Cluster::on(etcd).await;
    cluster
        .until("the leader places the job's three allocs", |c| async move {
            running(&c.allocs(0, "web").await) == 3
        })
        .await;
    let allocs = cluster.allocs(1, "web").await;
    assert_eq!(allocs.len(), 3, "no more than the count: {allocs:?}");
}
