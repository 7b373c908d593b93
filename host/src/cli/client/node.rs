//! `caravan node ...`: the nodes the agent's server knows.

use super::Remote;
use super::table::{print_table, text};
use crate::util::units::format_bytes_approx;
use serde_json::{Value, json};

/// `caravan node`'s subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum NodeCommand {
    /// List nodes.
    Status,
    /// Move every alloc off a node (`--enable`), or stop doing so (`--disable`). A drained
    /// node gets no new allocs; its service allocs move one per job at a time, each
    /// replacement starting from the moved alloc's checkpoint; batch allocs may finish
    /// until the deadline, when whatever is left moves. Waits until the drain is done
    /// unless `--detach`.
    Drain {
        /// The node.
        node: String,
        /// Start draining it.
        #[arg(long, conflicts_with = "disable", required_unless_present = "disable")]
        enable: bool,
        /// Stop draining it (it becomes eligible again, unless `--keep-ineligible`).
        #[arg(long)]
        disable: bool,
        /// How long allocs may stay before every one left is moved (`5m`, `1h`); default:
        /// no deadline.
        #[arg(long, value_name = "DURATION", requires = "enable")]
        deadline: Option<String>,
        /// Nomad's flag; Caravan has no system jobs, so it changes nothing.
        #[arg(long, requires = "enable")]
        ignore_system: bool,
        /// With `--disable`: leave the node ineligible for new allocs.
        #[arg(long, requires = "disable")]
        keep_ineligible: bool,
        /// Return once the drain is set, without waiting for it to finish.
        #[arg(long)]
        detach: bool,
    },
    /// Mark a node eligible for new allocs (`--enable`) or not (`--disable`); what runs on
    /// it runs on.
    Eligibility {
        /// The node.
        node: String,
        /// New allocs may go to it.
        #[arg(long, conflicts_with = "disable", required_unless_present = "disable")]
        enable: bool,
        /// No new alloc goes to it.
        #[arg(long)]
        disable: bool,
    },
}

impl NodeCommand {
    /// Runs the subcommand against the agent.
    pub async fn execute(self, remote: &Remote) -> anyhow::Result<()> {
        match self {
            NodeCommand::Status => status(remote).await,
            NodeCommand::Drain {
                node,
                enable,
                deadline,
                ignore_system,
                keep_ineligible,
                detach,
                ..
            } => {
                let body = match enable {
                    true => json!({
                        "enable": true,
                        "deadline": deadline,
                        "ignore_system": ignore_system,
                    }),
                    false => json!({ "enable": false, "keep_ineligible": keep_ineligible }),
                };
                drain(remote, &node, body, enable && !detach).await
            }
            NodeCommand::Eligibility { node, enable, .. } => {
                let path = format!("/v1/node/{node}/eligibility");
                let answer = remote
                    .api
                    .call("POST", &path, Some(json!({ "eligible": enable })))
                    .await?;
                remote.print(&answer, |a| {
                    println!("node {}: {}", text(&a["node"]), text(&a["eligibility"]));
                });
                Ok(())
            }
        }
    }
}

/// `node drain`: sets the drain, then, when `wait`, reports progress until nothing is left
/// on the node.
async fn drain(remote: &Remote, node: &str, body: Value, wait: bool) -> anyhow::Result<()> {
    let answer = remote
        .api
        .call("POST", &format!("/v1/node/{node}/drain"), Some(body))
        .await?;
    let draining = !answer["drain"].is_null();
    if !remote.json {
        match draining {
            true => println!("node {node}: draining; no new allocs go to it"),
            false => println!(
                "node {node}: not draining; {}",
                text(&answer["eligibility"])
            ),
        }
    }
    if !wait || !draining {
        if remote.json {
            println!("{answer}");
        }
        return Ok(());
    }
    let mut last_line = String::new();
    loop {
        let nodes = remote.api.call("GET", "/v1/nodes", None).await?;
        let Some(view) = nodes
            .as_array()
            .and_then(|nodes| nodes.iter().find(|n| n["id"] == node))
        else {
            anyhow::bail!("node {node} is no longer registered");
        };
        if view["drain"].is_null() {
            if remote.json {
                println!("{view}");
            } else {
                println!("node {node}: drain complete; it stays ineligible for new allocs");
            }
            return Ok(());
        }
        let line = format!("node {node}: {} allocs left", view["allocs"]);
        if !remote.json && line != last_line {
            println!("{line}");
            last_line = line;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
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
                let eligibility = match (node["eligibility"].as_str(), node["drain"].is_null()) {
                    (_, false) => "draining",
                    (Some(eligibility), true) => eligibility,
                    (None, true) => "-",
                };
                vec![
                    node["id"].as_str().unwrap_or("").into(),
                    node["status"].as_str().unwrap_or("").into(),
                    eligibility.into(),
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
                "Eligibility",
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
