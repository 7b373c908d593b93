//! Signals and task restarts: what an operator may ask of a running alloc's tasks, and the
//! checks every runner applies before it passes such a request on to its tasks.
//!
//! Pure checks and the error they answer with; delivering is each runner's job. Nothing here
//! holds or touches a runner's state.

use crate::model::structs::{Alloc, ClientStatus};

/// The signal names a request may carry: the POSIX signals Nomad's drivers accept. What a
/// signal means is up to the runner; the host only refuses names that are no signal at all.
pub const SIGNAL_NAMES: &[&str] = &[
    "SIGABRT",
    "SIGALRM",
    "SIGBUS",
    "SIGCHLD",
    "SIGCONT",
    "SIGFPE",
    "SIGHUP",
    "SIGILL",
    "SIGINT",
    "SIGIO",
    "SIGIOT",
    "SIGKILL",
    "SIGPIPE",
    "SIGPROF",
    "SIGQUIT",
    "SIGSEGV",
    "SIGSTOP",
    "SIGSYS",
    "SIGTERM",
    "SIGTRAP",
    "SIGTSTP",
    "SIGTTIN",
    "SIGTTOU",
    "SIGURG",
    "SIGUSR1",
    "SIGUSR2",
    "SIGVTALRM",
    "SIGWINCH",
    "SIGXCPU",
    "SIGXFSZ",
];

/// The signal `nomad alloc signal` sends when none is named, and so does ours.
pub const DEFAULT_SIGNAL: &str = "SIGKILL";

/// Why a signal or a restart was refused. Each message is one line an operator can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskActionError {
    /// No alloc with this id on this client. Answered by the client, never by a runner.
    #[error("alloc {0} is not on this client")]
    UnknownAlloc(String),
    /// The alloc has no task of this name.
    #[error("alloc {alloc_id} has no task named {task:?}; its tasks are: {known}")]
    UnknownTask {
        /// The alloc asked.
        alloc_id: String,
        /// The name asked for.
        task: String,
        /// The alloc's task names, comma-separated, or `none`.
        known: String,
    },
    /// Not one of [`SIGNAL_NAMES`].
    #[error("{0:?} is not a signal name; expected one such as SIGHUP, SIGINT, SIGTERM, SIGUSR1")]
    UnknownSignal(String),
    /// The runner has not yet taken the signals and restarts already queued for it (a guest
    /// busy computing, or a flood of requests): refused so the queue stays bounded.
    #[error(
        "alloc {alloc_id} has {queued} signals or restarts waiting for its runner; try again once it has taken them"
    )]
    Busy {
        /// The alloc asked.
        alloc_id: String,
        /// How many are waiting.
        queued: usize,
    },
    /// The alloc's tasks cannot receive anything now.
    #[error("alloc {alloc_id} is not running: {reason}")]
    NotRunning {
        /// The alloc asked.
        alloc_id: String,
        /// Why, as a phrase: see [`NotRunningReason`].
        reason: NotRunningReason,
    },
}

/// Why an alloc cannot take a signal or a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotRunningReason {
    /// Its runner has not been started.
    NotStarted,
    /// It is being stopped (killed, or the agent is shutting down).
    Stopping,
    /// It has finished, in this status.
    Finished(ClientStatus),
    /// Its runner crashed and waits to be restarted in place (see [`crate::model::restart`]).
    Restarting,
}

impl std::fmt::Display for NotRunningReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotRunningReason::NotStarted => f.write_str("it has not started yet"),
            NotRunningReason::Stopping => f.write_str("it is being stopped"),
            NotRunningReason::Finished(status) => write!(f, "it has finished ({status})"),
            NotRunningReason::Restarting => {
                f.write_str("its runner crashed and waits to be restarted")
            }
        }
    }
}

/// The signal's canonical (upper-case) name when `name` is one of [`SIGNAL_NAMES`], in any case.
pub fn signal_name(name: &str) -> Result<&'static str, TaskActionError> {
    SIGNAL_NAMES
        .iter()
        .find(|known| known.eq_ignore_ascii_case(name))
        .copied()
        .ok_or_else(|| TaskActionError::UnknownSignal(name.to_string()))
}

/// The tasks a request reaches: `task` when the alloc has it (an error naming the alloc's
/// tasks when not), or every task of the alloc, in job order, when `task` is `None`.
pub fn target_tasks(alloc: &Alloc, task: Option<&str>) -> Result<Vec<String>, TaskActionError> {
    let Some(task) = task else {
        return Ok(alloc.tasks.iter().map(|t| t.name.clone()).collect());
    };
    if alloc.tasks.iter().any(|t| t.name == task) {
        return Ok(vec![task.to_string()]);
    }
    let known: Vec<&str> = alloc.tasks.iter().map(|t| t.name.as_str()).collect();
    Err(TaskActionError::UnknownTask {
        alloc_id: alloc.id.clone(),
        task: task.to_string(),
        known: if known.is_empty() {
            "none".to_string()
        } else {
            known.join(", ")
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::structs::Task;

    #[test]
    fn signal_names_are_matched_in_any_case_and_nothing_else_passes() {
        assert_eq!(signal_name("sigusr1"), Ok("SIGUSR1"));
        assert_eq!(signal_name(DEFAULT_SIGNAL), Ok("SIGKILL"));
        assert_eq!(
            signal_name("USR1"),
            Err(TaskActionError::UnknownSignal("USR1".into()))
        );
        assert_eq!(
            signal_name("").unwrap_err().to_string(),
            "\"\" is not a signal name; expected one such as SIGHUP, SIGINT, SIGTERM, SIGUSR1"
        );
    }

    #[test]
    fn a_request_reaches_the_named_task_or_every_task() {
        let alloc = Alloc::new(
            "a1",
            "job",
            "r.wasm",
            vec![Task::named("web"), Task::named("db")],
        );
        assert_eq!(target_tasks(&alloc, None).unwrap(), ["web", "db"]);
        assert_eq!(target_tasks(&alloc, Some("db")).unwrap(), ["db"]);
        assert_eq!(
            target_tasks(&alloc, Some("cache")).unwrap_err().to_string(),
            "alloc a1 has no task named \"cache\"; its tasks are: web, db"
        );
    }
}
