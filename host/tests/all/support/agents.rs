//! Agents as tests start them: a real `caravan agent` process, an agent in process, and a
//! client built as the agent builds its own, each with a GC blind to this machine's disk.

use super::{caravan_command, message, runtime, stderr_lines, wait_for_line};
use caravan_host::agent::Agent;
use caravan_host::agent::config::AgentConfig;
use caravan_host::runtime::WasmAllocRunnerFactory;
use serde_json::Value;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

/// GC settings for tests that are not about disk usage: the machine's own disk (a shared CI
/// disk may well be over Nomad's 80%) must not decide what a test sees collected.
pub fn gc_ignoring_this_disk() -> caravan_host::client::gc::GcConfig {
    caravan_host::client::gc::GcConfig {
        disk_usage_threshold: 100.0,
        inode_usage_threshold: 100.0,
        ..Default::default()
    }
}

/// Node `node-1`'s client of `server`, built as the agent builds its own: WebAssembly runners
/// on the shared runtime, state saved to `db`, data under `data_dir`, disk usage read from
/// the data dir's filesystem, and a GC that ignores this machine's disk. Not started.
pub fn wasm_client(
    data_dir: &std::path::Path,
    server: Arc<dyn caravan_host::rpc::ServerApi>,
    db: Arc<dyn caravan_host::state::StateDb>,
) -> caravan_host::client::Client {
    let config = caravan_host::client::ClientConfig {
        gc: gc_ignoring_this_disk(),
        ..caravan_host::client::ClientConfig::new("node-1", data_dir)
    };
    let factory = WasmAllocRunnerFactory::new(runtime()).into_factory();
    caravan_host::client::Client::with_disk_stats(config, server, factory, db)
}

/// The same, as an agent config file's `[client]` block.
const AGENT_CONFIG_IGNORING_THIS_DISK: &str =
    "[client]\ngc_disk_usage_threshold = 100\ngc_inode_usage_threshold = 100\n";

/// A real `caravan agent` on a free port, killed when dropped.
pub struct AgentProcess {
    child: std::process::Child,
    /// `http://127.0.0.1:PORT` (`https://` when the agent serves TLS).
    pub addr: String,
    lines: std::sync::mpsc::Receiver<String>,
    _config: tempfile::NamedTempFile,
    /// Lines logged before "agent started" (a restore logs there), not yet handed out.
    early: std::cell::RefCell<std::collections::VecDeque<String>>,
    /// What [`AgentProcess::caravan`] sets for the CLI to reach this agent over TLS.
    cli_env: Vec<(String, String)>,
}

impl AgentProcess {
    /// `caravan agent --dev`.
    pub fn start() -> Self {
        Self::start_with(&["--dev"])
    }

    /// `caravan agent --data-dir DIR`: state that outlives the process.
    pub fn start_on(data_dir: &std::path::Path) -> Self {
        Self::start_with(&["--data-dir", data_dir.to_str().unwrap()])
    }

    fn start_with(args: &[&str]) -> Self {
        Self::start_configured(args, "")
    }

    /// `caravan agent ARGS` with `config` added to its config file (after a `[client]`
    /// block that makes the GC blind to this disk).
    pub fn start_configured(args: &[&str], config_text: &str) -> Self {
        Self::start_from(caravan_command(), "127.0.0.1:0", args, config_text)
    }

    /// `caravan agent ARGS` as [`AgentProcess::start_configured`] does, on host `host` of a
    /// set of [`crate::support::hosts::Hosts`] (in its network namespace), listening on its
    /// address.
    pub fn start_on_host(
        hosts: &crate::support::hosts::Hosts,
        host: usize,
        args: &[&str],
        config_text: &str,
    ) -> Self {
        let command = hosts.command(host, caravan_command().get_program());
        let bind = format!("{}:4646", hosts.addr(host));
        Self::start_from(command, &bind, args, config_text)
    }

    fn start_from(mut command: Command, bind: &str, args: &[&str], config_text: &str) -> Self {
        let config = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            config.path(),
            format!("{AGENT_CONFIG_IGNORING_THIS_DISK}{config_text}"),
        )
        .unwrap();
        let mut child = crate::etcd::dies_with_its_parent(&mut command)
            .arg("agent")
            .args(args)
            .arg("--config")
            .arg(config.path())
            .args(["--bind", bind, "--log-json"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("caravan agent starts");
        let lines = stderr_lines(&mut child);
        let (line, early) = wait_for_line(&lines, "agent started", |line| {
            serde_json::from_str::<Value>(line).is_ok_and(|l| message(&l) == "agent started")
        });
        let parsed: Value = serde_json::from_str(&line).unwrap();
        let scheme = if parsed["fields"]["tls"] == true {
            "https"
        } else {
            "http"
        };
        let addr = format!("{scheme}://{}", parsed["fields"]["addr"].as_str().unwrap());
        AgentProcess {
            child,
            addr,
            lines,
            _config: config,
            early: std::cell::RefCell::new(early.into()),
            cli_env: Vec::new(),
        }
    }

    /// The agent's process id, for reading its `/proc` entries.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The address as a socket address, for [`http`].
    pub fn socket_addr(&self) -> std::net::SocketAddr {
        let host_port = self
            .addr
            .split_once("://")
            .map_or(&*self.addr, |(_, rest)| rest);
        host_port.parse().unwrap()
    }

    /// Runs a client command against this agent (over TLS with what
    /// [`AgentProcess::with_cli_env`] gave).
    pub fn caravan(&self, args: &[&str]) -> std::process::Output {
        super::run_caravan_with(args, Some(&self.addr), &self.cli_env)
    }

    /// This agent, with `env` (the CLI's CA and certificate variables) set for every command
    /// [`AgentProcess::caravan`] runs.
    pub fn with_cli_env(mut self, env: Vec<(String, String)>) -> Self {
        self.cli_env = env;
        self
    }

    /// Reads the agent's log until a line satisfies `found`; returns it and the lines before.
    pub fn wait_for(&self, what: &str, found: impl Fn(&Value) -> bool) -> (Value, Vec<Value>) {
        let parse = |l: &String| serde_json::from_str(l).unwrap_or(Value::String(l.clone()));
        let mut before = Vec::new();
        while let Some(line) = self.early.borrow_mut().pop_front() {
            let parsed = parse(&line);
            if found(&parsed) {
                return (parsed, before);
            }
            before.push(parsed);
        }
        let (line, rest) = wait_for_line(&self.lines, what, |line| {
            serde_json::from_str::<Value>(line).is_ok_and(|l| found(&l))
        });
        before.extend(rest.iter().map(parse));
        (parse(&line), before)
    }

    /// Stops the agent with Ctrl-C and returns its exit code and every log line not yet read.
    pub fn stop(self) -> (Option<i32>, Vec<String>) {
        self.signal("-INT");
        self.finish()
    }

    /// Sends `signal` (`-STOP`, `-CONT`) and leaves the agent running.
    pub fn send_signal(&self, signal: &str) {
        self.signal(signal);
    }

    /// Every line the agent logged and nobody read yet, without waiting.
    pub fn unread_lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self.early.borrow_mut().drain(..).collect();
        lines.extend(self.lines.try_iter());
        lines
    }

    /// Kills the agent with SIGKILL, as a crash or an OOM kill would, and returns every log
    /// line not yet read.
    pub fn kill9(self) -> Vec<String> {
        self.signal("-KILL");
        self.finish().1
    }

    fn signal(&self, signal: &str) {
        std::process::Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
    }

    fn finish(mut self) -> (Option<i32>, Vec<String>) {
        let mut status = None;
        for _ in 0..600 {
            // Polling a child's exit: std has no wait with a timeout.
            if let Some(exited) = self.child.try_wait().unwrap() {
                status = Some(exited);
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let status = status.expect("the agent exits within a minute");
        // The reader thread ends at EOF; everything the agent wrote is in the channel.
        let mut lines: Vec<String> = self.early.borrow_mut().drain(..).collect();
        lines.extend(std::iter::from_fn(|| {
            self.lines.recv_timeout(Duration::from_secs(10)).ok()
        }));
        (status.code(), lines)
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

/// A real agent in process on 127.0.0.1:0 with its own data dir, the GC blind to this disk,
/// and whatever `configure` changes.
pub async fn agent(configure: impl FnOnce(&mut AgentConfig)) -> (Agent, tempfile::TempDir) {
    let data_dir = tempfile::tempdir().unwrap();
    let mut config = AgentConfig {
        data_dir: data_dir.path().to_path_buf(),
        ..AgentConfig::default()
    };
    config.bind = "127.0.0.1:0".parse().unwrap();
    config.gc = gc_ignoring_this_disk();
    configure(&mut config);
    (
        Agent::start(config).await.expect("the agent starts"),
        data_dir,
    )
}

/// `caravan agent ARGS --bind 127.0.0.1:0 --config FILE` with `config_text` in FILE, for an
/// agent that must refuse to start: its exit code and what it wrote to stderr.
pub fn agent_refusing_to_start(args: &[&str], config_text: &str) -> (Option<i32>, String) {
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), config_text).unwrap();
    let output = caravan_command()
        .arg("agent")
        .args(args)
        .args(["--bind", "127.0.0.1:0", "--config"])
        .arg(config.path())
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
