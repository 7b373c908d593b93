//! `caravan system ...`: cluster-wide operations on the agent's server.

use super::Remote;

/// `caravan system`'s subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum SystemCommand {
    /// Run the server's garbage collection now.
    Gc,
}

impl SystemCommand {
    /// Runs the subcommand against the agent.
    pub async fn execute(self, remote: &Remote) -> anyhow::Result<()> {
        match self {
            SystemCommand::Gc => gc(remote).await,
        }
    }
}

/// `system gc`: collect now, and say how many allocs went.
async fn gc(remote: &Remote) -> anyhow::Result<()> {
    let answer = remote.api.call("PUT", "/v1/system/gc", None).await?;
    remote.print(&answer, |a| {
        println!(
            "removed {} allocs",
            a["removed"].as_array().map_or(0, Vec::len)
        )
    });
    Ok(())
}
