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

/// `server members`: every node's agent, whether it is alive, and the leader.
async fn members(remote: &Remote) -> anyhow::Result<()> {
    let leader = remote.api.call("GET", "/v1/status/leader", None).await?;
    let nodes = remote.api.call("GET", "/v1/nodes", None).await?;
    let leading = leader["leader"]["node"].as_str().unwrap_or("").to_string();
    let answer = serde_json::json!({ "leader": leader, "nodes": nodes });
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
    });
    Ok(())
}
