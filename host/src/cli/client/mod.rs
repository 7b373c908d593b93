//! The client commands: `caravan job ...`, `alloc ...`, `node status`, `server members`,
//! `system gc`. Each is
//! one HTTP request (or a few) to the agent at `CARAVAN_ADDR`, printed as a table or, with
//! `--json`, as the API's JSON.
//!
//! One module per command group, each a clap enum of subcommands with one `execute` that
//! takes the [`Remote`] (the agent's API and the output mode): adding a subcommand is one
//! variant and one function. [`api`] is the HTTP client they share and
//! [`table`] the table printing. This module talks to the agent over HTTP only; it never
//! links the server, the client core or the runtime.

pub mod alloc;
pub mod api;
pub mod job;
pub mod node;
pub mod server;
pub mod system;
pub mod table;

use api::Api;
use serde_json::Value;

/// Where the agent is when `CARAVAN_ADDR` is not set.
pub const DEFAULT_ADDR: &str = "http://127.0.0.1:4646";

/// The commands that talk to a running agent.
#[derive(Debug, clap::Subcommand)]
pub enum ClientCommand {
    /// Jobs on the agent at CARAVAN_ADDR.
    Job {
        /// What to do.
        #[command(subcommand)]
        command: job::JobCommand,
        /// Where the agent is.
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Allocations on the agent at CARAVAN_ADDR.
    Alloc {
        /// What to do.
        #[command(subcommand)]
        command: alloc::AllocCommand,
        /// Where the agent is.
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Nodes known to the agent at CARAVAN_ADDR.
    Node {
        /// What to do.
        #[command(subcommand)]
        command: node::NodeCommand,
        /// Where the agent is.
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// The agents of the cluster the agent at CARAVAN_ADDR belongs to, and which leads.
    Server {
        /// What to do.
        #[command(subcommand)]
        command: server::ServerCommand,
        /// Where the agent is.
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Cluster-wide operations on the agent at CARAVAN_ADDR.
    System {
        /// What to do.
        #[command(subcommand)]
        command: system::SystemCommand,
        /// Where the agent is.
        #[command(flatten)]
        remote: RemoteArgs,
    },
}

impl ClientCommand {
    /// Sends the command's requests and prints the answers. An error is one line for the
    /// caller to print: the API's message, or how to reach an agent.
    pub async fn execute(self) -> anyhow::Result<()> {
        match self {
            ClientCommand::Job { command, remote } => command.execute(&remote.connect()?).await,
            ClientCommand::Alloc { command, remote } => command.execute(&remote.connect()?).await,
            ClientCommand::Node { command, remote } => command.execute(&remote.connect()?).await,
            ClientCommand::Server { command, remote } => command.execute(&remote.connect()?).await,
            ClientCommand::System { command, remote } => command.execute(&remote.connect()?).await,
        }
    }
}

/// How client commands reach the agent.
#[derive(Debug, clap::Args)]
pub struct RemoteArgs {
    /// The agent's address.
    #[arg(long, global = true, env = "CARAVAN_ADDR", default_value = DEFAULT_ADDR)]
    address: String,
    /// The agent's ACL token, if it has one.
    #[arg(long, global = true, env = "CARAVAN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print the API's JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
}

impl RemoteArgs {
    /// The client of the agent these flags name. Sends nothing yet; refuses an address
    /// that is not `http://HOST:PORT`.
    fn connect(self) -> anyhow::Result<Remote> {
        Ok(Remote {
            api: Api::new(&self.address, self.token)?,
            json: self.json,
        })
    }
}

/// What every client subcommand works with: the agent's API and how to print its answers.
pub struct Remote {
    /// The agent's HTTP API.
    pub api: Api,
    /// `--json`: print the API's JSON instead of tables.
    pub json: bool,
}

impl Remote {
    /// Prints `value` as JSON with `--json`, else through `human`.
    pub fn print(&self, value: &Value, human: impl FnOnce(&Value)) {
        if self.json {
            println!(
                "{}",
                crate::util::text::escape_json_controls(&value.to_string())
            );
        } else {
            human(value);
        }
    }
}
