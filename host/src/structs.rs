//! The plain data the host passes around: allocs, their state, and per-alloc limits.
//!
//! These types know nothing of wasmtime, the client or storage, so every layer can use them.
//! An [`Alloc`] is immutable once built and shared as `Arc<Alloc>`: an update replaces it whole.

use crate::capabilities::Capabilities;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// What the scheduler wants for an alloc.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DesiredStatus {
    /// Keep it running.
    Run,
    /// Stop it (job stopped or scaled down).
    Stop,
    /// Move it elsewhere.
    Evict,
}

impl DesiredStatus {
    /// True when the runner should be killed.
    pub fn is_stop(self) -> bool {
        matches!(self, DesiredStatus::Stop | DesiredStatus::Evict)
    }
}

/// One task of an alloc: a name and free-form config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// Unique within the alloc.
    pub name: String,
    /// Key/value settings in the order written.
    #[serde(default)]
    pub config: Vec<(String, String)>,
}

/// One placed instance of a job's group. Immutable; share it as `Arc<Alloc>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alloc {
    /// Unique id (a UUID).
    pub id: String,
    /// The job it belongs to.
    pub job_id: String,
    /// The task group inside the job.
    pub group: String,
    /// Path of the runner component that runs it.
    pub runner: String,
    /// The tasks, in job order.
    pub tasks: Vec<Task>,
    /// What the scheduler wants.
    pub desired_status: DesiredStatus,
    /// Grows with every server-side change.
    pub modify_index: u64,
    /// Free-form metadata from the job.
    #[serde(default)]
    pub meta: Vec<(String, String)>,
    /// Limits for this alloc; unset fields take the agent's defaults.
    #[serde(default)]
    pub limits: LimitOverrides,
    /// What the alloc may reach beyond its own directory; nothing by default.
    #[serde(default, skip_serializing_if = "Capabilities::is_empty")]
    pub capabilities: Capabilities,
}

impl Alloc {
    /// A new alloc of `job_id` running `runner` with `tasks`, with the defaults a fresh
    /// placement has: a group named after the job, desired to run, modify index 1, no
    /// metadata, no limit overrides, no capabilities. Set other fields with struct update
    /// syntax.
    pub fn new(
        id: impl Into<String>,
        job_id: impl Into<String>,
        runner: impl Into<String>,
        tasks: Vec<Task>,
    ) -> Alloc {
        let job_id = job_id.into();
        Alloc {
            id: id.into(),
            group: job_id.clone(),
            job_id,
            runner: runner.into(),
            tasks,
            desired_status: DesiredStatus::Run,
            modify_index: 1,
            meta: Vec::new(),
            limits: LimitOverrides::default(),
            capabilities: Capabilities::default(),
        }
    }
}

impl Task {
    /// A task named `name` with no config.
    pub fn named(name: impl Into<String>) -> Task {
        Task {
            name: name.into(),
            config: Vec::new(),
        }
    }
}

/// The alloc's status as its client sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientStatus {
    /// Not running yet.
    Pending,
    /// Running.
    Running,
    /// Terminal: finished successfully or stopped on purpose.
    Complete,
    /// Terminal: something went wrong.
    Failed,
}

impl ClientStatus {
    /// `complete` and `failed` are final.
    pub fn is_terminal(self) -> bool {
        matches!(self, ClientStatus::Complete | ClientStatus::Failed)
    }

    /// The lowercase name operators see.
    pub fn as_str(self) -> &'static str {
        match self {
            ClientStatus::Pending => "pending",
            ClientStatus::Running => "running",
            ClientStatus::Complete => "complete",
            ClientStatus::Failed => "failed",
        }
    }
}

impl fmt::Display for ClientStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Lifecycle of one task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskLifecycle {
    /// Not started.
    Pending,
    /// Started and not finished.
    Running,
    /// Finished.
    Dead,
}

/// Something that happened to a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskEvent {
    /// Short stable kind (`Started`, `Killed`, ...).
    pub kind: String,
    /// One human-readable line.
    pub message: String,
    /// Milliseconds since the Unix epoch.
    pub time_unix_ms: u64,
}

/// The state of one task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskState {
    /// The task's name.
    pub name: String,
    /// Where it is in its lifecycle.
    pub state: TaskLifecycle,
    /// True when it finished unsuccessfully.
    pub failed: bool,
    /// How many times it was restarted.
    pub restarts: u32,
    /// Its last events, oldest first.
    pub events: Vec<TaskEvent>,
}

/// Everything known about an alloc's progress on the client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocState {
    /// The alloc's status.
    pub client_status: ClientStatus,
    /// Why it is in that status.
    pub description: String,
    /// One entry per task the runner reported.
    pub task_states: Vec<TaskState>,
}

impl AllocState {
    /// The state of an alloc whose runner has not reported yet.
    pub fn pending() -> Self {
        AllocState {
            client_status: ClientStatus::Pending,
            description: String::new(),
            task_states: Vec::new(),
        }
    }

    /// A `failed` state with `description`, keeping no task states.
    pub fn failed(description: impl Into<String>) -> Self {
        AllocState {
            client_status: ClientStatus::Failed,
            description: description.into(),
            task_states: Vec::new(),
        }
    }
}

/// Per-alloc limits as a job states them: unset fields take the agent's [`Limits`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitOverrides {
    /// Bytes of linear memory, all memories together.
    pub memory_bytes: Option<u64>,
    /// Time spent computing (not waiting) over the alloc's run.
    pub cpu: Option<Duration>,
    /// Time from start after which the host stops the guest and fails the alloc.
    pub wall_time: Option<Duration>,
    /// How long the host waits for `run` to return after `kill`.
    pub kill_timeout: Option<Duration>,
    /// Guest log lines per second before the excess is dropped.
    pub log_lines_per_second: Option<u32>,
    /// Bytes the alloc directory may hold.
    pub disk_bytes: Option<u64>,
}

/// The most a job may ask of an agent, per limit (`[client.limit_caps]` in the agent's config).
/// A job asking for more is refused when it is submitted, naming the key; without caps a job
/// could ask one node for any memory, CPU budget or kill timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitCaps {
    /// Default 1 GiB.
    pub memory_bytes: u64,
    /// Default 1 hour of computing.
    pub cpu: Duration,
    /// Default 30 s, Nomad's `max_kill_timeout`.
    pub kill_timeout: Duration,
    /// Default 10,000 lines per second.
    pub log_lines_per_second: u32,
    /// Default 10 GiB.
    pub disk_bytes: u64,
}

impl Default for LimitCaps {
    fn default() -> Self {
        LimitCaps {
            memory_bytes: 1024 * 1024 * 1024,
            cpu: Duration::from_secs(3600),
            kill_timeout: Duration::from_secs(30),
            log_lines_per_second: 10_000,
            disk_bytes: 10 * 1024 * 1024 * 1024,
        }
    }
}

/// A limit asked above its cap: which, and by how much.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {asked} is over this agent's cap of {cap} (client.limit_caps.{name})")]
pub struct OverCap {
    /// The job file's key, such as `job.limits.memory`.
    pub key: &'static str,
    /// The key's name in `[client.limit_caps]`.
    pub name: &'static str,
    /// What was asked, for people.
    pub asked: String,
    /// The cap, for people.
    pub cap: String,
}

impl LimitCaps {
    /// The first limit of `limits` over its cap, in the order of [`LimitCaps`]' fields.
    pub fn check(&self, limits: &LimitOverrides) -> Result<(), OverCap> {
        use crate::units::{format_bytes, format_duration};
        let over = |name: &'static str, asked: String, cap: String| OverCap {
            key: match name {
                "memory" => "job.limits.memory",
                "cpu" => "job.limits.cpu",
                "kill_timeout" => "job.limits.kill_timeout",
                "disk" => "job.limits.disk",
                _ => "job.limits.log_rate",
            },
            name,
            asked,
            cap,
        };
        if let Some(asked) = limits.memory_bytes.filter(|&m| m > self.memory_bytes) {
            return Err(over(
                "memory",
                format_bytes(asked),
                format_bytes(self.memory_bytes),
            ));
        }
        if let Some(asked) = limits.cpu.filter(|&c| c > self.cpu) {
            return Err(over(
                "cpu",
                format_duration(asked),
                format_duration(self.cpu),
            ));
        }
        if let Some(asked) = limits.kill_timeout.filter(|&k| k > self.kill_timeout) {
            return Err(over(
                "kill_timeout",
                format_duration(asked),
                format_duration(self.kill_timeout),
            ));
        }
        if let Some(asked) = limits
            .log_lines_per_second
            .filter(|&r| r > self.log_lines_per_second)
        {
            return Err(over(
                "log_rate",
                asked.to_string(),
                self.log_lines_per_second.to_string(),
            ));
        }
        if let Some(asked) = limits.disk_bytes.filter(|&d| d > self.disk_bytes) {
            return Err(over(
                "disk",
                format_bytes(asked),
                format_bytes(self.disk_bytes),
            ));
        }
        Ok(())
    }
}

/// The limits one alloc runs under, all set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Bytes all linear memories of the instance may hold together. Default 64 MiB: plenty
    /// for a runner that supervises tasks rather than doing their work.
    pub memory_bytes: u64,
    /// Time spent computing, counted in epoch ticks. Default 60 s: runners mostly wait, and
    /// waiting is free, so only a runner that computes without end runs out.
    pub cpu: Duration,
    /// Time from start after which the host stops the guest at once and fails the alloc;
    /// `None` means no limit (the default: services run until stopped).
    pub wall_time: Option<Duration>,
    /// How long `kill` may take. Default 5 s, Nomad's default kill timeout.
    pub kill_timeout: Duration,
    /// Guest log lines per second, with a burst of the same size. Default 1,000.
    pub log_lines_per_second: u32,
    /// Bytes the alloc directory may hold (as `du` counts them). Default 1 GiB: a write past
    /// it fails in the guest with "no space", and the alloc fails naming the quota.
    #[serde(default = "default_disk_bytes")]
    pub disk_bytes: u64,
}

fn default_disk_bytes() -> u64 {
    Limits::default().disk_bytes
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 64 * 1024 * 1024,
            cpu: Duration::from_secs(60),
            wall_time: None,
            kill_timeout: Duration::from_secs(5),
            log_lines_per_second: 1_000,
            disk_bytes: 1024 * 1024 * 1024,
        }
    }
}

impl Limits {
    /// These limits with the alloc's overrides applied.
    pub fn with_overrides(self, overrides: &LimitOverrides) -> Limits {
        Limits {
            memory_bytes: overrides.memory_bytes.unwrap_or(self.memory_bytes),
            cpu: overrides.cpu.unwrap_or(self.cpu),
            wall_time: overrides.wall_time.or(self.wall_time),
            kill_timeout: overrides.kill_timeout.unwrap_or(self.kill_timeout),
            log_lines_per_second: overrides
                .log_lines_per_second
                .unwrap_or(self.log_lines_per_second),
            disk_bytes: overrides.disk_bytes.unwrap_or(self.disk_bytes),
        }
    }
}
