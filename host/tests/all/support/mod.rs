//! What every test here needs: a shared runtime, log capture that prints itself when a test
//! fails, waiting with a deadline, and the real `caravan` binary with the lines its
//! processes write; runners, HTTP and agents are in the submodules, re-exported here.

mod acl_tokens;
mod agents;
mod cluster_views;
pub mod hosts;
mod http_request;
pub mod pki;
mod runner;

pub use acl_tokens::{acl_bootstrap, acl_token};
pub use agents::{
    AgentProcess, agent, agent_refusing_to_start, gc_ignoring_this_disk, wasm_client,
};
pub use cluster_views::{
    assert_succeeded, live_by_node, ready_nodes, ready_nodes_via, running, service_job_file,
    unique_ids,
};
pub use http_request::{WrittenRequest, http, http_via};
pub use runner::{
    Recorder, Started, alloc, descriptors_open_on, hostile_attack, start, start_on, start_with,
};

use caravan_host::runtime::{Runtime, RuntimeConfig};
use serde_json::Value;
use std::future::Future;
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// One runtime for the whole test binary, so each guest is compiled once.
pub fn runtime() -> Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME
        .get_or_init(|| Runtime::new(&RuntimeConfig::default()).expect("runtime"))
        .clone()
}

/// Captures every log line of this test (host and guest) as JSON. Dropped during a panic,
/// it prints them, so a failing test shows what its guests said.
pub struct LogCapture {
    buffer: Arc<Mutex<Vec<u8>>>,
    _guard: tracing::subscriber::DefaultGuard,
}

#[derive(Clone)]
struct SharedBuffer(Arc<Mutex<Vec<u8>>>);

impl Write for SharedBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogCapture {
    /// Starts capturing on this thread. Tests run on a current-thread runtime, so the
    /// runners' tasks log here too.
    pub fn start() -> Self {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let writer = SharedBuffer(buffer.clone());
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_env_filter("debug")
            .with_writer(move || writer.clone())
            .finish();
        LogCapture {
            buffer,
            _guard: tracing::subscriber::set_default(subscriber),
        }
    }

    /// Every captured line, parsed.
    pub fn lines(&self) -> Vec<Value> {
        let text = String::from_utf8_lossy(&self.buffer.lock().unwrap()).to_string();
        text.lines()
            .map(|line| serde_json::from_str(line).expect("a JSON log line"))
            .collect()
    }

    /// Lines whose message contains `text`.
    pub fn with_message(&self, text: &str) -> Vec<Value> {
        self.lines()
            .into_iter()
            .filter(|line| message(line).contains(text))
            .collect()
    }
}

impl Drop for LogCapture {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let text = String::from_utf8_lossy(&self.buffer.lock().unwrap()).to_string();
            eprintln!("---- captured log lines ----\n{text}---- end of captured log lines ----");
        }
    }
}

/// The message of a JSON log line.
pub fn message(line: &Value) -> &str {
    line["fields"]["message"].as_str().unwrap_or_default()
}

/// How long any test waits for anything before it fails, saying what it waited for: one
/// policy for every wait (`within`, `eventually`, a log line, a command's output), long
/// enough for a loaded two-core machine, short enough that a hang is reported, not timed out
/// by CI.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Awaits `future`, failing the test with `what` if it takes over [`DEADLINE`] (of tokio
/// time).
pub async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(DEADLINE, future).await {
        Ok(value) => value,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// Polls `condition` (advancing paused time 10 ms a round) until it holds; fails after a
/// minute of tokio time.
pub async fn eventually(what: &str, condition: impl Fn() -> bool) {
    within(what, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

/// [`eventually`] for a condition that needs to await (an HTTP call, say).
pub async fn eventually_async<F: Future<Output = bool>>(what: &str, condition: impl Fn() -> F) {
    within(what, async {
        while !condition().await {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

/// Every line the child writes to stderr, read on a thread of its own.
pub fn stderr_lines(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    lines_of(child.stderr.take().expect("stderr piped"))
}

/// Every line `output` (a child's piped stdout or stderr) gives, read on a thread of its own.
pub fn lines_of(output: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let output = std::io::BufReader::new(output);
    let (lines_tx, lines_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in output.lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    lines_rx
}

/// Reads `lines` until one satisfies `found`; fails the test, showing every line, after a
/// minute without it. Returns that line and the ones before it.
pub fn wait_for_line(
    lines: &std::sync::mpsc::Receiver<String>,
    what: &str,
    found: impl Fn(&str) -> bool,
) -> (String, Vec<String>) {
    let mut seen = Vec::new();
    loop {
        let line = lines
            .recv_timeout(DEADLINE)
            .unwrap_or_else(|_| panic!("no {what} line in {seen:#?}"));
        if found(&line) {
            return (line, seen);
        }
        seen.push(line);
    }
}

/// The real `caravan` binary as a test runs it: its compile cache is the test run's own,
/// under target/ (never a developer's, and nothing is written outside target/; shared by
/// every test, so a Python runner compiles once), and its time zone is pinned, since the CLI
/// shows local times.
pub fn caravan_command() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_caravan"));
    command
        .env("CARAVAN_CACHE_DIR", test_cache_dir())
        .env("TZ", "UTC0");
    command
}

/// The compile cache of the `caravan` processes tests start.
pub fn test_cache_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("caravan-cache")
}

/// Runs the real `caravan` binary with `args` (and `CARAVAN_ADDR` when given), printing what
/// it wrote, which the test harness shows only when the test fails.
pub fn run_caravan(args: &[&str], agent_addr: Option<&str>) -> std::process::Output {
    run_caravan_with(args, agent_addr, &[])
}

/// [`run_caravan`] with `env` set too (a TLS agent's CA and the CLI's certificate).
pub fn run_caravan_with(
    args: &[&str],
    agent_addr: Option<&str>,
    env: &[(String, String)],
) -> std::process::Output {
    let mut command = caravan_command();
    command.args(args);
    command.envs(env.iter().map(|(k, v)| (k, v)));
    if let Some(addr) = agent_addr {
        command.env("CARAVAN_ADDR", addr);
    }
    let output = command.output().expect("caravan runs");
    println!(
        "$ caravan {}\n--- stdout\n{}--- stderr\n{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Appends `value` as an unsigned LEB128 number, as wasm binaries write counts and sizes.
pub fn leb128(out: &mut Vec<u8>, mut value: u32) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}
