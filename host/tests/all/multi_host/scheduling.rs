//! Scheduling across hosts (issue 41): allocs no host can hold wait and say why, a drained
//! host's guests move with their checkpoints, and a host cut off and back keeps one of each
//! pair by its job's `[job.disconnect]` rule.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_no_host_can_hold_waits_says_why_and_runs_on_a_fourth_host_when_it_joins() {
    // Three hosts with 256 MiB for allocs each, and room for a fourth.
    let layout = Layout {
        spare_hosts: 1,
        client_config: "memory_total = \"256MiB\"\n",
        ..Layout::default()
    };
    let Some(mut cluster) = HostCluster::start_with(layout).await else {
        return;
    };
    let laptop = tempfile::tempdir().unwrap();
    std::fs::copy(SLEEPER, laptop.path().join("web.wasm")).unwrap();
    let job_file = |id: &str, more: &str| {
        let path = laptop.path().join(format!("{id}.toml"));
        let text = format!(
            "[job]\nid = {id:?}\ntype = \"service\"\ncount = 2\nrunner = \"web.wasm\"\n{more}"
        );
        std::fs::write(&path, text).unwrap();
        path
    };
    let big = job_file("big", "[job.limits]\nmemory = \"512MiB\"\n");
    let edge = job_file(
        "edge",
        "[[job.constraint]]\nattribute = \"${node.class}\"\nvalue = \"edge\"\n",
    );
    let run = cluster.agents[0].caravan(&["job", "run", big.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{said}");
    assert!(
        said.contains("2 allocs not placed: no node has 512 MiB free: 3 nodes exhausted memory"),
        "{said}"
    );
    let run = cluster.agents[1].caravan(&["job", "run", "--detach", edge.to_str().unwrap()]);
    assert_succeeded(&run);
    let status = cluster.agents[2].caravan(&["job", "status", "edge"]);
    let shown = String::from_utf8_lossy(&status.stdout);
    assert!(
        shown.contains(
            "Placement: 2 allocs not placed: no node meets the job's constraints: 3 nodes \
             filtered by constraint ${node.class} = edge"
        ),
        "{shown}"
    );

    // An edge machine with room joins: both jobs are placed there, and only there.
    cluster.join(3, "memory_total = \"2GiB\"\nnode_class = \"edge\"\n");
    let cluster = &cluster;
    for job in ["big", "edge"] {
        eventually_async(
            &format!("{job} running on the fourth host"),
            || async move {
                let allocs = cluster.allocs(0, job).await;
                running(&allocs) == 2 && live_by_node(&allocs).keys().eq(["host-4"])
            },
        )
        .await;
        let (_, view) = cluster.get(0, &format!("/v1/job/{job}")).await;
        assert_eq!(view["blocked"], Value::Null, "{view}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_hosts_service_allocs_resume_elsewhere_from_their_checkpoints() {
    let Some(cluster) = HostCluster::start().await else {
        return;
    };
    let laptop = tempfile::tempdir().unwrap();
    std::fs::copy(
        caravan_test_artifacts::STATEFUL,
        laptop.path().join("counter.wasm"),
    )
    .unwrap();
    let job = laptop.path().join("counter.toml");
    std::fs::write(
        &job,
        "[job]\nid = \"counter\"\ntype = \"service\"\ncount = 2\nrunner = \"counter.wasm\"\n\
         [[job.tasks]]\nname = \"counter\"\nconfig = { tick_every = \"100\" }\n",
    )
    .unwrap();
    let agent = |i: usize| &cluster.agents[i];
    assert_succeeded(&agent(0).caravan(&["job", "run", "--detach", job.to_str().unwrap()]));
    let cluster = &cluster;
    eventually_async("two counters running", || async move {
        running(&cluster.allocs(0, "counter").await) == 2
    })
    .await;
    let on_host_1: Vec<String> = cluster
        .allocs(0, "counter")
        .await
        .iter()
        .filter(|a| a["node_id"] == "host-1")
        .filter_map(|a| a["id"].as_str().map(str::to_string))
        .collect();
    assert_eq!(on_host_1.len(), 1, "one counter per host");
    let moved = &on_host_1[0];
    let logs = |id: String| async move {
        let path = format!("/v1/client/allocation/{id}/logs");
        let (_, text) = cluster.get(2, &path).await;
        text.as_str().unwrap_or_default().to_string()
    };
    eventually_async("the counter on host-1 counted to 5", || async move {
        logs(moved.clone()).await.contains("tick 5")
    })
    .await;

    // The operator drains host-1: the command returns once nothing runs there.
    let drained = agent(1).caravan(&["node", "drain", "host-1", "--enable"]);
    assert_succeeded(&drained);
    assert!(
        String::from_utf8_lossy(&drained.stdout).contains("node host-1: drain complete"),
        "{}",
        String::from_utf8_lossy(&drained.stdout)
    );
    // The drain is done once nothing runs on host-1; the last replacement may still be
    // starting elsewhere.
    eventually_async("both counters running, none on host-1", || async move {
        let allocs = cluster.allocs(0, "counter").await;
        running(&allocs) == 2 && !live_by_node(&allocs).contains_key("host-1")
    })
    .await;
    let allocs = cluster.allocs(0, "counter").await;
    // The replacement of the moved counter went on from its count, on another host.
    let resumed = allocs
        .iter()
        .filter(|a| a["client_status"] == "running")
        .filter_map(|a| a["id"].as_str().map(str::to_string));
    let mut counts = Vec::new();
    for id in resumed {
        let text = logs(id).await;
        if let Some(line) = text
            .lines()
            .find(|l| l.contains("resuming from checkpoint at count"))
        {
            counts.push(line.to_string());
        }
    }
    assert_eq!(
        counts.len(),
        1,
        "exactly the moved counter resumed: {counts:?}"
    );
    let count: u64 = counts[0]
        .rsplit(' ')
        .next()
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(
        count >= 5,
        "it resumed from its last count, not 0: {}",
        counts[0]
    );

    // The drained host stays out of placement: a scale-up goes elsewhere.
    let status = agent(2).caravan(&["node", "status"]);
    let table = String::from_utf8_lossy(&status.stdout);
    let host_1 = table
        .lines()
        .find(|l| l.starts_with("host-1"))
        .unwrap_or_default();
    assert!(host_1.contains("ineligible"), "{table}");
    assert_succeeded(&agent(2).caravan(&["job", "scale", "counter", "4"]));
    eventually_async("four counters, none on host-1", || async move {
        let allocs = cluster.allocs(0, "counter").await;
        running(&allocs) == 4 && !live_by_node(&allocs).contains_key("host-1")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_cut_off_and_back_leaves_one_of_each_pair_by_each_jobs_disconnect_rule() {
    let Some(cluster) = HostCluster::start().await else {
        return;
    };
    let laptop = tempfile::tempdir().unwrap();
    std::fs::copy(SLEEPER, laptop.path().join("web.wasm")).unwrap();
    // Four jobs that wait a minute for a host that stops answering, one for each rule of
    // which of a pair to keep when it returns, and one that gives up on it after six
    // seconds; and what each should have left running on the returning host's alloc.
    const JOBS: [(&str, &str, &str); 5] = [
        (
            "orig",
            "lost_after = \"1m\"\nreconcile = \"keep_original\"",
            "running",
        ),
        (
            "repl",
            "lost_after = \"1m\"\nreconcile = \"keep_replacement\"",
            "complete",
        ),
        // The returning host holds none of the job's other allocs, the stand-in's host one
        // more: the original ranks higher.
        (
            "best",
            "lost_after = \"1m\"\nreconcile = \"best_score\"",
            "running",
        ),
        // Neither restarted: the original is the older.
        (
            "longest",
            "lost_after = \"1m\"\nreconcile = \"longest_running\"",
            "running",
        ),
        ("short", "lost_after = \"6s\"", "complete"),
    ];
    for (id, block, _) in JOBS {
        let path = laptop.path().join(format!("{id}.toml"));
        let text = format!(
            "[job]\nid = {id:?}\ntype = \"service\"\ncount = 3\nrunner = \"web.wasm\"\n\
             [job.disconnect]\n{block}\n"
        );
        std::fs::write(&path, text).unwrap();
        assert_succeeded(&cluster.agents[0].caravan(&[
            "job",
            "run",
            "--detach",
            path.to_str().unwrap(),
        ]));
    }
    let cluster = &cluster;
    for (job, _, _) in JOBS {
        eventually_async(
            &format!("{job}: one alloc running on each host"),
            || async move {
                let allocs = cluster.allocs(0, job).await;
                running(&allocs) == 3 && live_by_node(&allocs).len() == 3
            },
        )
        .await;
    }
    let mut originals = Vec::new();
    for (job, _, _) in JOBS {
        let allocs = cluster.allocs(0, job).await;
        let on_host_3 = allocs.iter().find(|a| a["node_id"] == "host-3").unwrap();
        originals.push(on_host_3["id"].as_str().unwrap().to_string());
    }
    let originals = &originals;
    let status = |i: usize| async move {
        let allocs = cluster.allocs(0, JOBS[i].0).await;
        let found = allocs.iter().find(|a| a["id"] == originals[i].as_str());
        found.map(|a| a["client_status"].as_str().unwrap_or("").to_string())
    };

    cluster.hosts.cut(2);
    eventually_async(
        "unknown while away, with stand-ins running",
        || async move {
            let mut settled = true;
            for (i, (job, _, _)) in JOBS.iter().enumerate().take(4) {
                settled &= status(i).await.as_deref() == Some("unknown");
                settled &= running(&cluster.allocs(0, job).await) == 3;
            }
            settled
        },
    )
    .await;
    eventually_async("short gives up on it past its lost_after", || async move {
        status(4).await.as_deref() == Some("lost")
    })
    .await;

    cluster.hosts.mend(2);
    eventually_async(
        "each job settles by its rule, three running each",
        || async move {
            let mut settled = true;
            for (i, (job, _, expected)) in JOBS.iter().enumerate() {
                settled &= status(i).await.as_deref() == Some(*expected);
                settled &= running(&cluster.allocs(0, job).await) == 3;
            }
            settled
        },
    )
    .await;
}
