//! `caravan server ...`: the agents of the cluster and which of them leads (schedules).

use super::Remote;
use super::table::print_table;

/// `caravan server`'s subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ServerCommand {
    /// List the cluster's agents (one per node) and which one leads.
    Members,
}

impl ServerCommand {
    /// Runs the subcommand against the agent.
    pub async fn execute(self, remote: &Remote) -> anyhow::Result<()> {
        match self {
            ServerCommand::Members => members(remote).await,
        }
    }
}

/// `server members`: every node's agent, whether it is alive, and the leader; in cluster
/// mode, then, etcd's space and alarms.
async fn members(remote: &Remote) -> anyhow::Result<()> {
    let leader = remote.api.call("GET", "/v1/status/leader", None).await?;
    let nodes = remote.api.call("GET", "/v1/nodes", None).await?;
    // An agent older than this command has no such route: its members are shown without it.
    let etcd = remote
        .api
        .call("GET", "/v1/status/etcd", None)
        .await
        .unwrap_or(serde_json::Value::Null);
    let leading = leader["leader"]["node"].as_str().unwrap_or("").to_string();
    let answer = serde_json::json!({ "leader": leader, "nodes": nodes, "etcd": etcd });
    remote.print(&answer, |_| {
        let rows: Vec<Vec<String>> = nodes
            .as_array()
            .into_iter()
            .flatten()
            .map(|node| {
                let id = node["id"].as_str().unwrap_or("");
                let is_leader = !leading.is_empty() && id == leading;
                vec![
                    id.into(),
                    node["status"].as_str().unwrap_or("").into(),
                    node["address"].as_str().unwrap_or("-").into(),
                    is_leader.to_string(),
                ]
            })
            .collect();
        print_table(&["Name", "Status", "Address", "Leader"], &rows);
        if let Some(line) = etcd_line(&etcd) {
            println!("\n{line}");
        }
    });
    Ok(())
}

/// etcd's space and alarms in one line, as the agent last probed them (`None` in the
/// embedded mode).
fn etcd_line(etcd: &serde_json::Value) -> Option<String> {
    if etcd["mode"] != "etcd" {
        return None;
    }
    let space = &etcd["space"];
    Some(match etcd["probe"].as_str() {
        Some("answered") => {
            let size = |field: &str| {
                crate::util::units::format_bytes_approx(space[field].as_u64().unwrap_or(0))
            };
            let health = match etcd["problem"].as_str() {
                Some(problem) => format!("ALARM: {problem}"),
                None => "no alarms".to_string(),
            };
            format!(
                "etcd: database {} ({} in use) as member {} (etcd {}) reports, revision {}; {health}",
                size("db_size"),
                size("db_size_in_use"),
                space["member"].as_str().unwrap_or("?"),
                space["version"].as_str().unwrap_or("?"),
                space["revision"],
            )
        }
        Some("failed") => format!(
            "etcd: did not answer the agent's last probe: {}",
            etcd["error"].as_str().unwrap_or("")
        ),
        _ => "etcd: not probed yet; ask again in a few seconds".to_string(),
    })
}
