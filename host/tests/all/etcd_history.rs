//! etcd's history and space in cluster mode, end to end: a real agent on a real etcd member.
//! The leader compacts etcd's history while the cluster goes on placing and watching, and an
//! etcd out of space (its `NOSPACE` alarm) is shown in the agent's health, `server members`
//! and metrics, and cleared by the steps `docs/cluster.md` gives.

use crate::etcd::EtcdCluster;
use crate::support::{AgentProcess, eventually_async, http};
use caravan_test_artifacts::SLEEPER;

/// One agent in cluster mode on `etcd`, compacting every `compact_interval`.
fn agent_on(
    etcd: &EtcdCluster,
    data_dir: &std::path::Path,
    compact_interval: &str,
) -> AgentProcess {
    let endpoints = etcd.endpoints().join(",");
    AgentProcess::start_configured(
        &[
            "--cluster",
            "etcd",
            "--etcd-endpoints",
            &endpoints,
            "--node-name",
            "node-1",
            "--data-dir",
            data_dir.to_str().unwrap(),
        ],
        &format!(
            "max_live_allocs = 64\n[cluster]\nnode_ttl = \"4s\"\ncompact_interval = \"{compact_interval}\"\n"
        ),
    )
}

/// Prints what the agent logged when the test fails.
struct LogsOnFailure<'a>(&'a AgentProcess);

impl Drop for LogsOnFailure<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- the agent logged:");
            for line in self.0.unread_lines() {
                eprintln!("{line}");
            }
        }
    }
}

async fn running(agent: &AgentProcess, job: &str) -> usize {
    let (status, allocs) = http(
        agent.socket_addr(),
        "GET",
        &format!("/v1/job/{job}/allocations"),
        None,
        None,
    )
    .await;
    if status != 200 {
        return 0;
    }
    allocs
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["client_status"] == "running")
        .count()
}

async fn run_job(agent: &AgentProcess, id: &str, count: u32) {
    let body = serde_json::json!({ "job": {
        "id": id, "type": "service", "count": count, "runner": SLEEPER,
    }})
    .to_string();
    // The first job may come while the agent is still taking the leadership.
    eventually_async("the job registered", || async {
        let (status, _) = http(agent.socket_addr(), "POST", "/v1/jobs", Some(&body), None).await;
        status == 200
    })
    .await;
    eventually_async(&format!("{count} allocs of {id} running"), || async {
        running(agent, id).await == count as usize
    })
    .await;
}

/// A metric's value in the agent's Prometheus text (the first line naming it).
async fn metric(agent: &AgentProcess, name: &str) -> Option<f64> {
    let (_, text) = http(agent.socket_addr(), "GET", "/v1/metrics", None, None).await;
    text.as_str()?
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_compacts_etcds_history_and_the_cluster_goes_on() {
    let etcd = EtcdCluster::start_with(1, &[]).await;
    let data = tempfile::tempdir().unwrap();
    let agent = agent_on(&etcd, data.path(), "1s");
    let _logs = LogsOnFailure(&agent);
    run_job(&agent, "before", 3).await;
    let store = etcd.store().await;
    let written = store.revision().await.unwrap();

    // Within two ticks the history up to the job's writes is gone.
    eventually_async("etcd compacted past the job's writes", || async {
        metric(&agent, "caravan_etcd_compacted_revision")
            .await
            .is_some_and(|r| r >= written as f64)
    })
    .await;
    let mut client = etcd_client::Client::connect(etcd.endpoints(), None)
        .await
        .unwrap();
    let old = client
        .get("/", Some(etcd_client::GetOptions::new().with_revision(1)))
        .await;
    let refused = old.expect_err("revision 1 is compacted away").to_string();
    assert!(refused.contains("compacted"), "{refused}");

    // The cluster goes on: placing, watching, reporting.
    run_job(&agent, "after", 3).await;
    let (status, answer) = http(agent.socket_addr(), "GET", "/v1/status/etcd", None, None).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer["compactions"].as_u64().unwrap_or(0) >= 1, "{answer}");
    // A slow call on a loaded machine may fail one; the next tick compacts further.
    let failures = metric(&agent, "caravan_etcd_compaction_failures_total").await;
    let compactions = metric(&agent, "caravan_etcd_compactions_total").await;
    assert!(
        failures.zip(compactions).is_some_and(|(f, c)| f < c),
        "failures {failures:?}, compactions {compactions:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_out_of_space_is_shown_in_health_members_and_metrics_until_cleared() {
    // A small quota, so that a few large values fill it.
    let etcd = EtcdCluster::start_with(1, &["--quota-backend-bytes=16777216"]).await;
    let data = tempfile::tempdir().unwrap();
    let agent = agent_on(&etcd, data.path(), "5m");
    let _logs = LogsOnFailure(&agent);
    run_job(&agent, "web", 2).await;
    let (status, _) = http(agent.socket_addr(), "GET", "/v1/agent/health", None, None).await;
    assert_eq!(status, 200);

    // Another user of the same etcd fills it: etcd raises NOSPACE and refuses every write.
    let mut client = etcd_client::Client::connect(etcd.endpoints(), None)
        .await
        .unwrap();
    let value = vec![b'x'; 1 << 20];
    let mut refused = None;
    for i in 0..64 {
        if let Err(error) = client
            .put(format!("/filler/{i}"), value.clone(), None)
            .await
        {
            refused = Some(error.to_string());
            break;
        }
    }
    let refused = refused.expect("a 16 MiB quota refuses 64 MiB");
    assert!(refused.contains("database space exceeded"), "{refused}");

    eventually_async("the agent unhealthy for etcd's alarm", || async {
        let (status, _) = http(agent.socket_addr(), "GET", "/v1/agent/health", None, None).await;
        status == 503
    })
    .await;
    let health = http(agent.socket_addr(), "GET", "/v1/agent/health", None, None).await;
    let problem = health.1["problems"][0].as_str().unwrap_or("").to_string();
    assert!(problem.contains("NOSPACE on m1"), "{health:?}");
    let members = agent.caravan(&["server", "members"]);
    let table = String::from_utf8_lossy(&members.stdout);
    assert!(members.status.success(), "{members:?}");
    assert!(
        table.contains("ALARM: etcd raised NOSPACE on m1"),
        "{table}"
    );
    assert_eq!(
        metric(&agent, "caravan_etcd_alarms{alarm=\"NOSPACE\"}").await,
        Some(1.0)
    );

    // The operator's way out (docs/cluster.md): delete what filled it, compact, defragment,
    // disarm. The agent is healthy again at its next probe.
    client
        .delete(
            "/filler/",
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    etcd.compact().await;
    client.defragment().await.unwrap();
    let raised = client
        .alarm(
            etcd_client::AlarmAction::Get,
            etcd_client::AlarmType::None,
            None,
        )
        .await
        .unwrap();
    for alarm in raised.alarms() {
        let mut member = etcd_client::AlarmOptions::new();
        member.with_member(alarm.member_id());
        client
            .alarm(
                etcd_client::AlarmAction::Deactivate,
                alarm.alarm(),
                Some(member),
            )
            .await
            .unwrap();
    }
    eventually_async("the agent healthy again", || async {
        http(agent.socket_addr(), "GET", "/v1/agent/health", None, None)
            .await
            .0
            == 200
    })
    .await;
    let members = agent.caravan(&["server", "members"]);
    let table = String::from_utf8_lossy(&members.stdout);
    assert!(table.contains("no alarms"), "{table}");
}
