//! `caravan node ...`: the nodes the agent's server knows.

use super::Remote;
use super::table::print_table;
use crate::util::units::format_bytes_approx;

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

/// `node status`: every node, its status, class and pool, its allocs (of its slots) and
/// the memory they reserve (of what it has for allocs) and, in cluster mode, its agent's
/// address and last heartbeat (lease renewal).
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
                let slots = match node["alloc_slots"].as_u64() {
                    Some(slots) => format!("{}/{slots}", node["allocs"]),
                    None => node["allocs"].to_string(),
                };
                let memory = match node["memory_bytes"].as_u64() {
                    Some(total) => format!(
                        "{} / {}",
                        format_bytes_approx(node["memory_reserved_bytes"].as_u64().unwrap_or(0)),
                        format_bytes_approx(total)
                    ),
                    None => "-".into(),
                };
                let class = node["class"].as_str().filter(|c| !c.is_empty());
                vec![
                    node["id"].as_str().unwrap_or("").into(),
                    node["status"].as_str().unwrap_or("").into(),
                    class.unwrap_or("-").into(),
                    node["pool"].as_str().unwrap_or("-").into(),
                    slots,
                    memory,
                    node["address"].as_str().unwrap_or("-").into(),
                    heartbeat,
                ]
            })
            .collect();
        print_table(
            &[
                "ID",
                "Status",
                "Class",
                "Pool",
                "Allocs",
                "Memory reserved",
                "Address",
                "Last heartbeat",
            ],
            &rows,
        );
    });
    Ok(())
}
