//! Helpers the benches share: allocs of one runner, their configs, and measurements.
// Each bench uses a different subset.
#![allow(dead_code)]

/// The `caravan` binary's allocator (host/src/main.rs), so a bench in process measures
/// what the agent runs.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use caravan_host::allocrunner::{AllocRunnerConfig, StateUpdater, alloc_span};
use caravan_host::model::structs::{Alloc, AllocState, ClientStatus, Limits, Task};
use std::io::{BufRead, Read, Write as _};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CARAVAN: &str = env!("CARGO_BIN_EXE_caravan");
use tokio::sync::Notify;

/// Installs the agent's own subscriber at INFO (its text lines), so spans and fields are
/// really built and formatted as an agent's are; the lines themselves go nowhere.
pub fn log_as_the_agent() {
    caravan_host::telemetry::init_with_writer("info", std::io::sink).unwrap();
}

/// Notifies once the guest reports a status (`running` for a start), and keeps when the
/// host's state updater first saw it.
pub struct StatusSignal {
    status: ClientStatus,
    pub reached: Notify,
    seen_at: std::sync::OnceLock<Instant>,
}

impl StatusSignal {
    pub fn new(status: ClientStatus) -> Arc<Self> {
        Arc::new(StatusSignal {
            status,
            reached: Notify::new(),
            seen_at: std::sync::OnceLock::new(),
        })
    }

    /// When the state updater first saw the status: the end of a start as the host sees
    /// it, as the raw baseline's import sees it, before any task is woken.
    pub fn seen_at(&self) -> Option<Instant> {
        self.seen_at.get().copied()
    }

    pub fn running() -> Arc<Self> {
        StatusSignal::new(ClientStatus::Running)
    }
}

impl StateUpdater for StatusSignal {
    fn alloc_state_updated(&self, _alloc_id: &str, state: &AllocState) {
        if state.client_status == self.status {
            self.seen_at.get_or_init(Instant::now);
            self.reached.notify_one();
        }
    }
}

pub fn alloc(runner: &str, n: usize) -> Alloc {
    Alloc::new(
        format!("bench-{n}"),
        "bench",
        runner,
        vec![Task::named("main")],
    )
}

/// The SHA-256 of the runner at `path`: what an alloc names as its build (`runner_sha256`)
/// when the server places it, as the agent's server does with the build its job was
/// submitted with.
pub fn build_of(path: &str) -> String {
    caravan_host::runtime::component_sha256(&std::fs::read(path).unwrap())
}

pub fn config(
    alloc: Alloc,
    data_dir: &std::path::Path,
    updater: Arc<dyn StateUpdater>,
) -> AllocRunnerConfig {
    let alloc = Arc::new(alloc);
    AllocRunnerConfig {
        span: alloc_span(&alloc),
        alloc_dir: data_dir.join(&alloc.id),
        alloc,
        state_updater: updater,
        limits: Limits::default(),
        restored: None,
        restoring: false,
        last_state: None,
        log_writer: None,
    }
}

/// The value after `name` on the bench's command line (`-- --rounds 5`).
pub fn arg_value(name: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != name).nth(1)
}

/// A count given as `name N`, at least 1; `default` when absent or not a number.
pub fn count_arg(name: &str, default: usize) -> usize {
    arg_value(name)
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
        .max(1)
}

/// Polls `condition` (a spawned agent's answer, say) until it holds; gives up after five
/// minutes, naming `what`.
pub fn wait_for(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while !condition() {
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Prints the bench's line for BENCHMARKS.md's scoreboard (`scripts/bench --summary` reads
/// it): today's figure, the baseline of the same run and their ratio, by the row's name.
pub fn scoreboard(name: &str, today: &str, baseline: &str, ratio: &str) {
    println!("scoreboard: {name} | {today} | {baseline} | {ratio}");
}

pub fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// The CPU time (user and system) the processes `pids` have spent so far.
pub fn cpu_of(pids: &[u32]) -> Duration {
    // /proc counts in USER_HZ, which Linux fixes at 100 whatever the kernel's own tick.
    let ticks = 100.0;
    let spent: u64 = pids
        .iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|stat| {
            // The fields after the command's closing parenthesis; utime and stime are
            // the 12th and 13th of them.
            let rest = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
        })
        .sum();
    Duration::from_secs_f64(spent as f64 / ticks)
}

/// The value of `key` in a `/proc` file of `Key:  N kB` lines (`status`, `meminfo`,
/// `smaps_rollup`), in KiB; 0 where it is not there.
pub fn kib_field(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .unwrap_or(0)
}

/// `field` of process `pid`'s `/proc/PID/status` (`VmRSS`, or `VmHWM`: the most RSS so
/// far), in bytes; 0 for a process that is gone.
pub fn status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    kib_field(&status, field) * 1024
}

pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// This process's memory by kind of page, in bytes, from `/proc/self/status` and
/// `/proc/self/smaps_rollup`. RSS counts a page once per mapping of it, so the copy-on-write
/// memory image that every instance of a component maps is counted once per instance though
/// it is in RAM once; `pss` counts it once, and `private` is what no other mapping shares.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryKinds {
    pub rss: u64,
    /// Anonymous pages: heap, stacks, and every page an instance wrote.
    pub anon: u64,
    /// Pages of files, the compiled code among them.
    pub file: u64,
    /// Shared memory: the memfd copy-on-write images of linear memories, as mapped.
    pub shmem: u64,
    /// The proportional set size: each page divided among its mappings.
    pub pss: u64,
    /// Pages mapped once (clean or dirty).
    pub private: u64,
    /// The whole machine's memory not available to a new program (`MemTotal -
    /// MemAvailable`): what every process and the page cache hold, so it moves with
    /// everything else on the machine, but it counts a shared page once whoever maps it.
    pub machine_used: u64,
}

impl MemoryKinds {
    pub fn now() -> MemoryKinds {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap();
        let kib = |text: &str, key: &str| kib_field(text, key) * 1024;
        MemoryKinds {
            rss: kib(&status, "VmRSS"),
            anon: kib(&status, "RssAnon"),
            file: kib(&status, "RssFile"),
            shmem: kib(&status, "RssShmem"),
            pss: kib(&rollup, "Pss"),
            private: kib(&rollup, "Private_Clean") + kib(&rollup, "Private_Dirty"),
            machine_used: kib(&meminfo, "MemTotal").saturating_sub(kib(&meminfo, "MemAvailable")),
        }
    }

    /// The change from `earlier` to `self` divided by `count` (negative where it shrank).
    pub fn per_item_since(&self, earlier: &MemoryKinds, count: usize) -> MemoryPerItem {
        let each = |now: u64, then: u64| (now as f64 - then as f64) / count as f64;
        MemoryPerItem {
            rss: each(self.rss, earlier.rss),
            anon: each(self.anon, earlier.anon),
            file: each(self.file, earlier.file),
            shmem: each(self.shmem, earlier.shmem),
            pss: each(self.pss, earlier.pss),
            private: each(self.private, earlier.private),
            machine_used: each(self.machine_used, earlier.machine_used),
        }
    }
}

/// [`MemoryKinds`]' growth per item, in bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryPerItem {
    pub rss: f64,
    pub anon: f64,
    pub file: f64,
    pub shmem: f64,
    pub pss: f64,
    pub private: f64,
    pub machine_used: f64,
}

impl MemoryPerItem {
    pub fn describe_kib(&self) -> String {
        format!(
            "pss {:.0}, rss {:.0} (anon {:.0}, file {:.0}, shmem {:.0}), private {:.0} KiB; \
             the machine's used memory {:.0} KiB",
            self.pss / 1024.0,
            self.rss / 1024.0,
            self.anon / 1024.0,
            self.file / 1024.0,
            self.shmem / 1024.0,
            self.private / 1024.0,
            self.machine_used / 1024.0,
        )
    }
}

/// A spawned `caravan agent` and its address. Dropping it kills the agent, so a bench that
/// panics leaves no agent running behind it.
pub struct Agent {
    pub child: Child,
    pub addr: String,
    /// The agent's last log lines (JSON), at most [`KEPT_LINES`].
    lines: Arc<std::sync::Mutex<std::collections::VecDeque<String>>>,
    /// How many lines the agent logged with each message, over its whole run.
    messages: Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>>,
}

/// How many of an agent's last log lines a bench keeps.
const KEPT_LINES: usize = 2_000;

/// Spawns `caravan agent` on `data_dir` with `config` and `extra` flags, and waits until it
/// logs "agent started".
pub fn spawn_agent(data_dir: &std::path::Path, config: &std::path::Path, extra: &[&str]) -> Agent {
    let mut child = Command::new(CARAVAN)
        .args(["agent", "--bind", "127.0.0.1:0", "--log-json", "--data-dir"])
        .arg(data_dir)
        // Each run compiles afresh, as before the agent shared the user's cache.
        .arg("--cache-dir")
        .arg(data_dir.join("cache"))
        .arg("--config")
        .arg(config)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("caravan agent starts");
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let lines = Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
    let messages = Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
    let (kept, counted) = (lines.clone(), messages.clone());
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if let Ok(value) = serde_json::from_str::<serde_json::Value>(&line) {
                if value["fields"]["message"] == "agent started" {
                    let _ = addr_tx.send(value["fields"]["addr"].as_str().unwrap().to_string());
                }
                if let Some(message) = value["fields"]["message"].as_str() {
                    *counted
                        .lock()
                        .unwrap()
                        .entry(message.to_string())
                        .or_insert(0) += 1;
                }
            }
            let mut kept = kept.lock().unwrap();
            if kept.len() == KEPT_LINES {
                kept.pop_front();
            }
            kept.push_back(line);
        }
    });
    let addr = addr_rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the agent starts");
    Agent {
        child,
        addr,
        lines,
        messages,
    }
}

impl Agent {
    /// The node of the agent that leads the cluster, as this agent sees it; none while there
    /// is none (or this agent does not answer).
    pub fn leader_node(&self) -> Option<String> {
        let answer = self.request("GET", "/v1/status/leader", "");
        let body = answer.split("\r\n\r\n").nth(1)?;
        let status: serde_json::Value = serde_json::from_str(body).ok()?;
        status["leader"]["node"].as_str().map(str::to_string)
    }

    pub fn request(&self, method: &str, path: &str, body: &str) -> String {
        let mut stream = std::net::TcpStream::connect(&self.addr).unwrap();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    }

    /// The value of the unlabelled sample `name` on the agent's `/v1/metrics`, 0 if absent.
    pub fn metric(&self, name: &str) -> u64 {
        let metrics = self.request("GET", "/v1/metrics", "");
        let prefix = format!("{name} ");
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The numeric field `field` of the last line the agent logged with `message`, waiting
    /// up to ten seconds for it; 0 if it never came.
    pub fn last_logged(&self, message: &str, field: &str) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let found = self.lines.lock().unwrap().iter().rev().find_map(|line| {
                let value: serde_json::Value = serde_json::from_str(line).ok()?;
                (value["fields"]["message"] == message)
                    .then(|| value["fields"][field].as_u64())
                    .flatten()
            });
            if let Some(found) = found {
                return found;
            }
            if Instant::now() > deadline {
                return 0;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The kept log lines (see [`KEPT_LINES`]) with `message`, as JSON.
    pub fn kept_lines_with(&self, message: &str) -> Vec<serde_json::Value> {
        let lines = self.lines.lock().unwrap();
        lines
            .iter()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|value| value["fields"]["message"] == message)
            .collect()
    }

    /// The last `count` kept lines logged at WARN or ERROR, one per line, and the `count`
    /// messages logged most: what a bench that failed prints, so that it says why.
    pub fn last_warnings(&self, count: usize) -> String {
        let lines = self.lines.lock().unwrap();
        let warnings: Vec<&String> = lines
            .iter()
            .filter(|line| {
                line.contains(r#""level":"WARN""#) || line.contains(r#""level":"ERROR""#)
            })
            .collect();
        let skip = warnings.len().saturating_sub(count);
        let mut said: String = warnings[skip..]
            .iter()
            .map(|line| format!("{line}\n"))
            .collect();
        let messages = self.messages.lock().unwrap();
        let mut counted: Vec<(&String, &u64)> = messages.iter().collect();
        counted.sort_by(|a, b| b.1.cmp(a.1));
        said.push_str("its messages, most logged first:\n");
        for (message, times) in counted.into_iter().take(count) {
            said.push_str(&format!("{times:>8} {message}\n"));
        }
        said
    }

    /// How many lines the agent logged with `message` so far.
    pub fn count_logged(&self, message: &str) -> u64 {
        let messages = self.messages.lock().unwrap();
        messages.get(message).copied().unwrap_or(0)
    }

    pub fn instantiations(&self) -> u64 {
        self.metric("caravan_runner_instantiation_seconds_count")
    }

    pub fn wait_instantiations(&self, wanted: u64) {
        while self.instantiations() < wanted {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the agent as an operator's Ctrl-C would, and waits for it to exit.
    pub fn stop(mut self) {
        Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // After `stop` the child is reaped and this does nothing.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
