//! What every test here needs: a shared runtime, log capture that prints itself when a test
//! fails, a state recorder to await reports, and a way to start a runner of a guest.

use caravan_host::agent::Agent;
use caravan_host::agent::config::AgentConfig;
use caravan_host::alloc_logs::AllocLogs;
use caravan_host::allocrunner::{
    AllocRunner, AllocRunnerConfig, CheckpointSaved, StateUpdater, alloc_span, checkpoint_kept,
};
use caravan_host::runtime::{Runtime, RuntimeConfig, WasmAllocRunner, WasmAllocRunnerFactory};
use caravan_host::structs::{Alloc, AllocState, ClientStatus, Limits, Task};
use serde_json::Value;
use std::future::Future;
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::watch;

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

/// Records every state and checkpoint a runner reports.
pub struct Recorder {
    /// Bumped on every report, to wake waiters.
    reports: watch::Sender<usize>,
    pub history: Mutex<Vec<AllocState>>,
    pub checkpoints: Mutex<Vec<Vec<u8>>>,
}

impl Recorder {
    pub fn new() -> Arc<Self> {
        Arc::new(Recorder {
            reports: watch::channel(0).0,
            history: Mutex::new(Vec::new()),
            checkpoints: Mutex::new(Vec::new()),
        })
    }

    /// Waits until any state reported so far satisfies `predicate` (a state may already have
    /// been replaced by the time the test looks); fails the test after a minute.
    pub async fn wait_for(
        &self,
        what: &str,
        predicate: impl Fn(&AllocState) -> bool,
    ) -> AllocState {
        let mut reports = self.reports.subscribe();
        within(what, async {
            loop {
                if let Some(found) = self.history.lock().unwrap().iter().find(|s| predicate(s)) {
                    return found.clone();
                }
                reports.changed().await.expect("recorder alive");
            }
        })
        .await
    }

    pub async fn wait_for_status(&self, status: ClientStatus) -> AllocState {
        self.wait_for(&format!("status {status}"), |state| {
            state.client_status == status
        })
        .await
    }

    pub fn last_checkpoint(&self) -> Option<Vec<u8>> {
        self.checkpoints.lock().unwrap().last().cloned()
    }
}

impl StateUpdater for Recorder {
    fn alloc_state_updated(&self, _alloc_id: &str, state: &AllocState) {
        self.history.lock().unwrap().push(state.clone());
        self.reports.send_modify(|count| *count += 1);
    }

    fn checkpoint_saved(&self, _alloc_id: &str, data: &[u8]) -> CheckpointSaved {
        self.checkpoints.lock().unwrap().push(data.to_vec());
        checkpoint_kept()
    }
}

/// Awaits `future`, failing the test with `what` if it takes over a minute (of tokio time).
pub async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(60), future).await {
        Ok(value) => value,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// An alloc of `runner` with the named tasks, each with `config`.
pub fn alloc(runner: &str, tasks: &[&str], config: &[(&str, &str)]) -> Alloc {
    let tasks = tasks
        .iter()
        .map(|name| Task {
            name: name.to_string(),
            config: config
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        })
        .collect();
    Alloc::new(
        format!("{:08x}-test-alloc", rand_u32()),
        "test-job",
        runner,
        tasks,
    )
}

/// An alloc of the `hostile` fixture, one task, making `attack` with `settings`.
pub fn hostile_attack(attack: &str, settings: &[(&str, &str)]) -> Alloc {
    let mut config = vec![("attack", attack)];
    config.extend_from_slice(settings);
    alloc(caravan_test_artifacts::FIXTURE_HOSTILE, &["main"], &config)
}

/// How many of this process's file descriptors are open on `path`.
pub fn descriptors_open_on(path: &std::path::Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("this process's descriptors are listed in /proc/self/fd")
        .filter_map(Result::ok)
        .filter(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == path))
        .count()
}

fn rand_u32() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A runner built through the wasm factory, with its recorder and alloc dir.
pub struct Started {
    pub runner: Arc<WasmAllocRunner>,
    pub recorder: Arc<Recorder>,
    pub alloc: Arc<Alloc>,
    /// Removed without recursion: a hostile runner may leave a tree deeper than any stack.
    pub data_dir: caravan_host::fs_tree::TempTree,
    /// The logs the runner's log writer belongs to.
    pub alloc_logs: AllocLogs,
}

impl Started {
    pub fn alloc_dir(&self) -> std::path::PathBuf {
        self.data_dir.path().join(&self.alloc.id)
    }

    /// Everything in the alloc's log file, as `alloc logs` shows it.
    pub async fn log_file_text(&self) -> String {
        let text = self.alloc_logs.read(&self.alloc.id).await.unwrap();
        String::from_utf8(text).unwrap()
    }

    pub async fn stopped(&self) -> AllocState {
        within("the runner to stop", self.runner.wait().wait()).await;
        self.runner.alloc_state()
    }

    /// Shuts the runner down, as a stopping agent does, and waits until it has.
    pub async fn shut_down(&self) {
        self.runner.shutdown();
        within("shutdown", self.runner.shutdown_done().wait()).await;
    }
}

/// Builds a runner for `alloc` through the wasm factory and starts it.
pub fn start(alloc: Alloc, restored: Option<Vec<u8>>) -> Started {
    start_on(runtime(), alloc, restored)
}

/// As [`start`], on a runtime of the test's own.
pub fn start_on(runtime: Runtime, alloc: Alloc, restored: Option<Vec<u8>>) -> Started {
    start_with(WasmAllocRunnerFactory::new(runtime), alloc, restored)
}

/// As [`start`], through `factory`.
pub fn start_with(
    factory: WasmAllocRunnerFactory,
    alloc: Alloc,
    restored: Option<Vec<u8>>,
) -> Started {
    let recorder = Recorder::new();
    let data_dir = caravan_host::fs_tree::TempTree::new("caravan-test-").unwrap();
    let alloc = Arc::new(alloc);
    let alloc_logs = AllocLogs::under_data_dir(data_dir.path());
    let config = AllocRunnerConfig {
        alloc: alloc.clone(),
        span: alloc_span(&alloc),
        state_updater: recorder.clone(),
        limits: Limits::default(),
        alloc_dir: data_dir.path().join(&alloc.id),
        restoring: restored.is_some(),
        restored,
        last_state: None,
        log_writer: Some(alloc_logs.writer(&alloc.id)),
    };
    let runner = factory
        .build(config)
        .expect("the factory builds the runner");
    runner.run();
    Started {
        runner,
        recorder,
        alloc,
        data_dir,
        alloc_logs,
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

/// One HTTP/1.1 request over a fresh connection; returns the status and the body (parsed as
/// JSON when it is JSON, else as a JSON string). Fails the test after a minute.
pub async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    token: Option<&str>,
) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = body.unwrap_or("");
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let response = within(&format!("{method} {path}"), async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .expect("the agent accepts connections");
        stream.write_all(request.as_bytes()).await.unwrap();
        // To the end of the body: the connection's end, or Content-Length bytes after the
        // head (chromedriver keeps the connection open a while after it answered).
        let mut response = Vec::new();
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            let read = stream.read(&mut buffer).await.unwrap();
            if read == 0 {
                break;
            }
            response.extend_from_slice(&buffer[..read]);
            if response_complete(&response) {
                break;
            }
        }
        response
    })
    .await;
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a header end");
    let head = String::from_utf8_lossy(&response[..split]).to_string();
    let raw_body = &response[split + 4..];
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let body_bytes = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(raw_body)
    } else {
        raw_body.to_vec()
    };
    let body = String::from_utf8_lossy(&body_bytes).to_string();
    let value = serde_json::from_str(&body).unwrap_or(Value::String(body));
    (status, value)
}

/// Whether `response` holds a head with a Content-Length and that many body bytes.
fn response_complete(response: &[u8]) -> bool {
    let Some(split) = response.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&response[..split]).to_ascii_lowercase();
    let length = head.lines().find_map(|line| {
        let value = line.strip_prefix("content-length:")?;
        value.trim().parse::<usize>().ok()
    });
    length.is_some_and(|length| response.len() - (split + 4) >= length)
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

/// The body of a `Transfer-Encoding: chunked` response, without its framing.
fn dechunk(mut framed: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    while let Some(line_end) = framed.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&framed[..line_end]).trim(), 16)
            .expect("a chunk size");
        if size == 0 {
            break;
        }
        let data = &framed[line_end + 2..];
        body.extend_from_slice(&data[..size]);
        framed = &data[size + 2..];
    }
    body
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
            .recv_timeout(Duration::from_secs(60))
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
    let mut command = caravan_command();
    command.args(args);
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
    /// `http://127.0.0.1:PORT`.
    pub addr: String,
    lines: std::sync::mpsc::Receiver<String>,
    _config: tempfile::NamedTempFile,
    /// Lines logged before "agent started" (a restore logs there), not yet handed out.
    early: std::cell::RefCell<std::collections::VecDeque<String>>,
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
        let config = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            config.path(),
            format!("{AGENT_CONFIG_IGNORING_THIS_DISK}{config_text}"),
        )
        .unwrap();
        let mut child = crate::etcd::dies_with_its_parent(&mut caravan_command())
            .arg("agent")
            .args(args)
            .arg("--config")
            .arg(config.path())
            .args(["--bind", "127.0.0.1:0", "--log-json"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("caravan agent starts");
        let lines = stderr_lines(&mut child);
        let (line, early) = wait_for_line(&lines, "agent started", |line| {
            serde_json::from_str::<Value>(line).is_ok_and(|l| message(&l) == "agent started")
        });
        let parsed: Value = serde_json::from_str(&line).unwrap();
        let addr = format!("http://{}", parsed["fields"]["addr"].as_str().unwrap());
        AgentProcess {
            child,
            addr,
            lines,
            _config: config,
            early: std::cell::RefCell::new(early.into()),
        }
    }

    /// The agent's process id, for reading its `/proc` entries.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The address as a socket address, for [`http`].
    pub fn socket_addr(&self) -> std::net::SocketAddr {
        self.addr.trim_start_matches("http://").parse().unwrap()
    }

    /// Runs a client command against this agent.
    pub fn caravan(&self, args: &[&str]) -> std::process::Output {
        run_caravan(args, Some(&self.addr))
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
