//! The plain data the host passes around: allocs and their state (per-alloc limits live in
//! [`crate::model::limits`] and are re-exported here).
//!
//! These types know nothing of wasmtime, the client or storage, so every layer can use them.
//! An [`Alloc`] is immutable once built and shared as `Arc<Alloc>`: an update replaces it whole.

use crate::model::capabilities::Capabilities;
use serde::{Deserialize, Serialize};
use std::fmt;

pub use crate::model::limits::{LimitCaps, LimitOverrides, Limits, OverCap};

/// What the scheduler wants for an alloc.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DesiredStatus {
    /// Keep it running.
    Run,
    /// Stop it (job stopped or scaled down).
    Stop,
    /// Move it elsewhere (its node is drained): its client shuts the runner down, so that
    /// it saves a checkpoint, rather than killing it, and reports it complete; the alloc
    /// that replaces it on another node starts from that checkpoint (see
    /// [`Alloc::previous_alloc`]).
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
    /// The SHA-256 (hex) of the build of `runner` its job was registered with; `None` when
    /// unknown (an alloc of `caravan run`, or made before builds were recorded). A change of
    /// it in an update is an upgrade in place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_sha256: Option<String>,
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
    /// Set on an alloc made to replace a failed one: when it may start, and its place in
    /// the chain of replacements (see [`crate::model::reschedule`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reschedule: Option<Reschedule>,
    /// How its runner is restarted in place after a crash; `None`: it is not (see
    /// [`crate::model::restart`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<crate::model::restart::RestartPolicy>,
    /// Set on an alloc made to take over from one moved off a drained node: its client
    /// fetches that alloc's last checkpoint from its node and starts the runner from it
    /// (unless its job said not to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_alloc: Option<PreviousAlloc>,
}

/// The alloc a migrated alloc takes over from, and where it ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviousAlloc {
    /// Its id.
    pub alloc_id: String,
    /// The node it ran on, which keeps its checkpoint.
    pub node_id: String,
    /// Whether to start from its checkpoint (its job's `[job.migrate] checkpoint`).
    #[serde(default = "starts_from_checkpoint")]
    pub checkpoint: bool,
}

fn starts_from_checkpoint() -> bool {
    true
}

/// What an alloc made to replace a failed one carries (Nomad's reschedule tracker).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reschedule {
    /// The failed alloc it replaces.
    pub previous_alloc_id: String,
    /// Which replacement of its chain this is, within the policy's interval (from 1).
    pub attempt: u32,
    /// Not started before this time (Unix ms): the failure plus the policy's delay.
    pub start_after_unix_ms: u64,
    /// When each replacement of its chain within the interval was made (Unix ms), this one
    /// included, oldest first.
    pub history_unix_ms: Vec<u64>,
}

impl Alloc {
    /// A new alloc of `job_id` running `runner` with `tasks`, with the defaults a fresh
    /// placement has: a group named after the job, desired to run, modify index 1, no
    /// metadata, no limit overrides, no capabilities, no restarts. Set other fields with struct update
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
            runner_sha256: None,
            tasks,
            desired_status: DesiredStatus::Run,
            modify_index: 1,
            meta: Vec::new(),
            limits: LimitOverrides::default(),
            capabilities: Capabilities::default(),
            reschedule: None,
            restart: None,
            previous_alloc: None,
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
    /// Terminal: its node stopped answering (cluster mode), so the scheduler gave up on it.
    /// Set by the scheduler, never by a client.
    Lost,
    /// Its node stopped answering, and its job's `[job.disconnect] lost_after` has not run
    /// out: it may still run there, and is kept (or not) when the node returns, by the
    /// job's `reconcile` rule. Set by the scheduler, never by a client; not terminal.
    Unknown,
}

impl ClientStatus {
    /// `complete`, `failed` and `lost` are final.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            ClientStatus::Complete | ClientStatus::Failed | ClientStatus::Lost
        )
    }

    /// The lowercase name operators see.
    pub fn as_str(self) -> &'static str {
        match self {
            ClientStatus::Pending => "pending",
            ClientStatus::Running => "running",
            ClientStatus::Complete => "complete",
            ClientStatus::Failed => "failed",
            ClientStatus::Lost => "lost",
            ClientStatus::Unknown => "unknown",
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
