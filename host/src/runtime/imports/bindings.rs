//! Host bindings generated from `wit/`, and conversions between them and [`crate::model::structs`].
//!
//! Kept private to the runtime: the rest of the host speaks [`crate::model::structs`] only.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "alloc-runner",
    imports: {
        // Waiting for the next event suspends the guest's fiber, not a thread.
        "caravan:runner/host.next-event": async,
        // A checkpoint returns once it is saved (a disk commit for the agent's client).
        "caravan:runner/host.checkpoint": async,
        // Everything else answers at once; guest mistakes come back as WIT results, so
        // no import needs to trap.
    },
    exports: {
        // `run` lives as long as the alloc and waits inside `next-event`.
        default: async,
    },
});

use crate::model::structs;
use caravan::runner::types as wit;

pub use caravan::runner::host::{Host as HostImports, add_to_linker as add_host_to_linker};
pub use exports::caravan::runner::runner::RunnerError;
pub use wasi::logging::logging::{
    Host as LoggingImports, Level, add_to_linker as add_logging_to_linker,
};
pub use wit::{AllocState as WitAllocState, Event as WitEvent, Host as TypesHost};

/// The WIT name of the interface every runner must export.
pub const RUNNER_EXPORT: &str = "caravan:runner/runner@0.1.0";

/// The events the host sends a runner, in host terms.
#[derive(Debug, Clone)]
pub enum Event {
    /// A new version of the alloc.
    Update(std::sync::Arc<structs::Alloc>),
    /// The agent is stopping.
    Shutdown,
    /// The alloc is being stopped for good.
    Kill,
    /// Deliver `signal` to `task` (all tasks when `None`).
    Signal {
        /// The task, or all.
        task: Option<String>,
        /// The signal's name.
        signal: String,
    },
    /// Restart one task.
    RestartTask(String),
}

impl Event {
    /// `kill` and `shutdown` end the run; once delivered they are repeated to the guest.
    pub fn is_final(&self) -> bool {
        matches!(self, Event::Kill | Event::Shutdown)
    }
}

pub fn alloc_to_wit(alloc: &structs::Alloc) -> wit::Alloc {
    wit::Alloc {
        id: alloc.id.clone(),
        job_id: alloc.job_id.clone(),
        group: alloc.group.clone(),
        tasks: alloc
            .tasks
            .iter()
            .map(|task| wit::Task {
                name: task.name.clone(),
                config: task.config.clone(),
            })
            .collect(),
        desired_status: match alloc.desired_status {
            structs::DesiredStatus::Run => wit::DesiredStatus::Run,
            structs::DesiredStatus::Stop => wit::DesiredStatus::Stop,
            structs::DesiredStatus::Evict => wit::DesiredStatus::Evict,
        },
        modify_index: alloc.modify_index,
        meta: alloc.meta.clone(),
    }
}

pub fn event_to_wit(event: &Event) -> wit::Event {
    match event {
        Event::Update(alloc) => wit::Event::Update(alloc_to_wit(alloc)),
        Event::Shutdown => wit::Event::Shutdown,
        Event::Kill => wit::Event::Kill,
        Event::Signal { task, signal } => wit::Event::Signal(wit::SignalRequest {
            task: task.clone(),
            signal: signal.clone(),
        }),
        Event::RestartTask(task) => wit::Event::RestartTask(task.clone()),
    }
}

pub fn state_from_wit(state: WitAllocState) -> structs::AllocState {
    structs::AllocState {
        client_status: match state.client_status {
            wit::ClientStatus::Pending => structs::ClientStatus::Pending,
            wit::ClientStatus::Running => structs::ClientStatus::Running,
            wit::ClientStatus::Complete => structs::ClientStatus::Complete,
            wit::ClientStatus::Failed => structs::ClientStatus::Failed,
        },
        description: state.description,
        task_states: state
            .task_states
            .into_iter()
            .map(|task| structs::TaskState {
                name: task.name,
                state: match task.state {
                    wit::TaskLifecycle::Pending => structs::TaskLifecycle::Pending,
                    wit::TaskLifecycle::Running => structs::TaskLifecycle::Running,
                    wit::TaskLifecycle::Dead => structs::TaskLifecycle::Dead,
                },
                failed: task.failed,
                restarts: task.restarts,
                events: task
                    .events
                    .into_iter()
                    .map(|event| structs::TaskEvent {
                        kind: event.kind,
                        message: event.message,
                        time_unix_ms: event.time_unix_ms,
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// The alloc description for a runner's `err`. (bindgen's own `Display` is its `Debug`.)
pub fn describe_runner_error(error: &RunnerError) -> String {
    match error {
        RunnerError::InvalidConfig(message) => format!("invalid config: {message}"),
        RunnerError::Failed(message) => message.clone(),
    }
}
