//! The client commands: `caravan job ...`, `alloc ...`, `node status`, `server members`,
//! `system gc`, `acl ...`. Each is
//! one HTTP request (or a few) to the agent at `CARAVAN_ADDR`, printed as a table or, with
//! `--json`, as the API's JSON.
//!
//! One module per command group, each a clap enum of subcommands with one `execute` that
//! takes the [`Remote`] (the agent's API and the output mode): adding a subcommand is one
//! variant and one function. [`api`] is the HTTP client they share and
//! [`table`] the table printing. This module talks to the agent over HTTP only; it never
//! links the server, the client core or the runtime.

pub mod acl;
pub mod alloc;
pub mod api;
pub mod job;
pub mod node;
pub mod server;
pub mod system;
pub mod table;

use crate::rpc::transport::AgentPool;
use crate::tls::{Expect, PemFile, TlsFiles, dial_config};
use api::Api;
use serde_json::Value;
use std::path::PathBuf;

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
    /// ACL tokens on the agent at CARAVAN_ADDR ([acl] enabled = true).
    Acl {
        /// What to do.
        #[command(subcommand)]
        command: acl::AclCommand,
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
            ClientCommand::Acl { command, remote } => command.execute(&remote.connect()?).await,
        }
    }
}

/// How client commands reach the agent.
#[derive(Debug, clap::Args)]
pub struct RemoteArgs {
    /// The agent's address.
    #[arg(long, global = true, env = "CARAVAN_ADDR", default_value = DEFAULT_ADDR)]
    address: String,
    /// The ACL token's secret to send (as Authorization: Bearer).
    #[arg(long, global = true, env = "CARAVAN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print the API's JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// Also say the HTTP status a refusal came with.
    #[arg(long, global = true)]
    verbose: bool,
    /// How to reach an agent that serves HTTPS.
    #[command(flatten)]
    tls: DialTlsArgs,
}

impl RemoteArgs {
    /// The client of the agent these flags name. Sends nothing yet; refuses an address
    /// that is not `http://HOST:PORT` (`https://` with a CA certificate).
    fn connect(self) -> anyhow::Result<Remote> {
        Ok(Remote {
            api: Api::new(&self.tls.pool()?, &self.address, self.token)?.verbose(self.verbose),
            json: self.json,
        })
    }
}

/// The certificates an operator's command reaches a TLS agent with (Nomad's flags and
/// variables): the agent's certificate is checked against the CA and the address's host.
#[derive(Debug, Clone, clap::Args)]
pub struct DialTlsArgs {
    /// The CA certificate the agent's certificate must chain to (for an https:// address).
    #[arg(long, global = true, env = "CARAVAN_CACERT", value_name = "FILE")]
    ca_cert: Option<PathBuf>,
    /// The certificate to present, for an agent that requires one (verify_https_client).
    #[arg(long, global = true, env = "CARAVAN_CLIENT_CERT", value_name = "FILE")]
    client_cert: Option<PathBuf>,
    /// The key of --client-cert.
    #[arg(long, global = true, env = "CARAVAN_CLIENT_KEY", value_name = "FILE")]
    client_key: Option<PathBuf>,
}

impl DialTlsArgs {
    /// The pool these flags dial with: plain HTTP without --ca-cert, else TLS only.
    pub fn pool(&self) -> anyhow::Result<AgentPool> {
        let identity = match (&self.client_cert, &self.client_key) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((
                PemFile::new("--client-cert", cert),
                PemFile::new("--client-key", key),
            )),
            (Some(_), None) => {
                anyhow::bail!("--client-cert needs --client-key (CARAVAN_CLIENT_KEY)")
            }
            (None, Some(_)) => {
                anyhow::bail!("--client-key needs --client-cert (CARAVAN_CLIENT_CERT)")
            }
        };
        let Some(ca) = &self.ca_cert else {
            if identity.is_some() {
                anyhow::bail!(
                    "--client-cert needs --ca-cert (CARAVAN_CACERT) to check the agent with"
                );
            }
            return Ok(AgentPool::new());
        };
        let files = TlsFiles {
            ca: PemFile::new("--ca-cert", ca),
            identity,
        };
        Ok(AgentPool::with_tls(dial_config(
            &files,
            &Expect::AddressHost,
        )?))
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
