//! `caravan node ...`: the nodes the agent's server knows.

use super::Remote;
use super::table::print_table;

/// `caravan node`'s subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum NodeCommand {
    /// List nodes.
    Status,
}

impl NodeCommand {
    /// Runs the subcommand against the agent.
    pub async fn execute(self, remote: &Remote) -> anyhow::Result<()> {
        match self {
            NodeCommand::Status => status(remote).await,
        }
    }
}

/// `node status`: every node, its status, how many allocs it holds and, in cluster mode,
/// its agent's address and last heartbeat (lease renewal).
async fn status(remote: &Remote) -> anyhow::Result<()> {
    let nodes = remote.api.call("GET", "/v1/nodes", None).await?;
    remote.print(&nodes, |n| {
        let rows: Vec<Vec<String>> = n
            .as_array()
            .into_iter()
            .flatten()
            .map(|node| {
                let heartbeat = match node["last_heartbeat_secs"].as_u64() {
                    Some(secs) => format!("{secs}s ago"),
                    None => "-".into(),
                };
                vec![
                    node["id"].as_str().unwrap_or("").into(),
                    node["status"].as_str().unwrap_or("").into(),
                    node["allocs"].to_string(),
                    node["address"].as_str().unwrap_or("-").into(),
                    heartbeat,
                ]
            })
            .collect();
        print_table(
            &["ID", "Status", "Allocs", "Address", "Last heartbeat"],
            &rows,
        );
    });
    Ok(())
}
