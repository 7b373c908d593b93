//! `caravan acl ...`: ACL tokens on an agent with `[acl] enabled = true` (Nomad's commands):
//! bootstrap once for the first management token, then make, list, revoke tokens, and ask
//! what the token in use is. A secret is printed once, when its token is made.

use super::Remote;
use super::table::print_table;
use serde_json::{Value, json};

/// `caravan acl`'s subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum AclCommand {
    /// Make the first management token (once in the cluster's life) and print its secret.
    Bootstrap,
    /// ACL tokens.
    Token {
        /// What to do.
        #[command(subcommand)]
        command: TokenCommand,
    },
}

/// `caravan acl token`'s subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum TokenCommand {
    /// Make a token and print its secret (shown this once).
    Create {
        /// What to call it (shown in lists and the audit trail).
        #[arg(long)]
        name: String,
        /// read, submit, operator, management, or node.
        #[arg(long)]
        role: String,
        /// Confine a submit token to this namespace's jobs.
        #[arg(long)]
        namespace: Option<String>,
        /// How long it works (`720h`); default: until revoked.
        #[arg(long)]
        ttl: Option<String>,
    },
    /// List every token (never their secrets).
    List,
    /// Revoke a token by its accessor id: it stops working at once, on every agent.
    Revoke {
        /// The token's accessor id (from `acl token list`).
        accessor_id: String,
    },
    /// Show the token in use (CARAVAN_TOKEN or --token).
    #[command(name = "self")]
    Own,
}

impl AclCommand {
    /// Runs the subcommand against the agent.
    pub async fn execute(self, remote: &Remote) -> anyhow::Result<()> {
        match self {
            AclCommand::Bootstrap => {
                let token = remote.api.call("POST", "/v1/acl/bootstrap", None).await?;
                print_token(remote, &token);
            }
            AclCommand::Token { command } => match command {
                TokenCommand::Create {
                    name,
                    role,
                    namespace,
                    ttl,
                } => {
                    let body =
                        json!({ "name": name, "role": role, "namespace": namespace, "ttl": ttl });
                    let token = remote.api.call("POST", "/v1/acl/token", Some(body)).await?;
                    print_token(remote, &token);
                }
                TokenCommand::List => {
                    let tokens = remote.api.call("GET", "/v1/acl/tokens", None).await?;
                    remote.print(&tokens, |tokens| {
                        let rows: Vec<Vec<String>> = tokens
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|t| {
                                vec![
                                    text(t, "accessor_id"),
                                    text(t, "name"),
                                    text(t, "role"),
                                    text(t, "namespace"),
                                    text(t, "expire"),
                                ]
                            })
                            .collect();
                        print_table(
                            &["Accessor ID", "Name", "Role", "Namespace", "Expires"],
                            &rows,
                        );
                    });
                }
                TokenCommand::Revoke { accessor_id } => {
                    let path = format!("/v1/acl/token/{}", encode_segment(&accessor_id));
                    let answer = remote.api.call("DELETE", &path, None).await?;
                    remote.print(&answer, |_| println!("revoked token {accessor_id}"));
                }
                TokenCommand::Own => {
                    let token = remote.api.call("GET", "/v1/acl/token/self", None).await?;
                    print_token(remote, &token);
                }
            },
        }
        Ok(())
    }
}

/// A field as a table cell: `-` when absent.
fn text(value: &Value, key: &str) -> String {
    value[key].as_str().unwrap_or("-").to_string()
}

/// A token, one field a line, its secret among them when the answer has it.
fn print_token(remote: &Remote, token: &Value) {
    remote.print(token, |t| {
        for (label, key) in [
            ("Accessor ID", "accessor_id"),
            ("Secret ID", "secret_id"),
            ("Name", "name"),
            ("Role", "role"),
            ("Namespace", "namespace"),
            ("Created", "create"),
            ("Expires", "expire"),
        ] {
            if t.get(key).is_some() {
                println!("{label:<12} = {}", text(t, key));
            }
        }
    });
}

/// `segment` safe to put in a path: anything but letters, digits and `-` is percent-encoded.
fn encode_segment(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
