//! [`State`]: the alloc state a runner reports, kept up to date by small calls.

use crate::{Alloc, AllocState, ClientStatus, TaskEvent, TaskLifecycle, TaskState, host};

/// How many events the host keeps per task; we keep the same so reports stay small.
const MAX_EVENTS_PER_TASK: usize = 10;

/// The state of one alloc as the runner reports it: client status, description, and one
/// [`TaskState`] per task of the alloc.
///
/// Change it with the `task_*` methods (they add the usual events and derive the client
/// status), then call [`State::report`], which sends it only when it changed.
///
/// Client status is derived from the tasks: `running` once any task runs, `complete` when
/// every task is dead and none failed, `failed` when every task is dead and one failed. A
/// status set with [`State::set_status`] holds until the next task change; a terminal one is
/// final.
///
/// ```
/// use caravan_guest::{ClientStatus, State, TaskLifecycle};
/// # let alloc = caravan_guest::Alloc {
/// #     id: "a1".into(), job_id: "web".into(), group: "web".into(),
/// #     tasks: vec![caravan_guest::Task { name: "main".into(), config: vec![] }],
/// #     desired_status: caravan_guest::DesiredStatus::Run, modify_index: 1, meta: vec![],
/// # };
/// let mut state = State::new(&alloc);
/// assert_eq!(state.client_status(), ClientStatus::Pending);
/// state.task_started("main");
/// assert_eq!(state.client_status(), ClientStatus::Running);
/// state.task_finished("main", false, "computed the answer");
/// assert_eq!(state.client_status(), ClientStatus::Complete);
/// assert!(state.is_terminal());
/// let main = state.task("main").unwrap();
/// assert_eq!(main.state, TaskLifecycle::Dead);
/// let kinds: Vec<&str> = main.events.iter().map(|e| e.kind.as_str()).collect();
/// assert_eq!(kinds, ["Received", "Started", "Terminated"]);
/// ```
#[derive(Debug, Clone)]
pub struct State {
    current: AllocState,
    last_reported: Option<AllocState>,
}

impl State {
    /// A `pending` state with every task of `alloc` pending.
    pub fn new(alloc: &Alloc) -> Self {
        let task_states = alloc
            .tasks
            .iter()
            .map(|task| TaskState {
                name: task.name.clone(),
                state: TaskLifecycle::Pending,
                failed: false,
                restarts: 0,
                events: vec![event("Received", "Task received by client")],
            })
            .collect();
        State {
            current: AllocState {
                client_status: ClientStatus::Pending,
                description: String::new(),
                task_states,
            },
            last_reported: None,
        }
    }

    /// The state as it would be reported now.
    pub fn snapshot(&self) -> &AllocState {
        &self.current
    }

    /// The current client status.
    pub fn client_status(&self) -> ClientStatus {
        self.current.client_status
    }

    /// True once the status is `complete` or `failed`.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self.current.client_status,
            ClientStatus::Complete | ClientStatus::Failed
        )
    }

    /// Sets the client status and description yourself. A terminal status is final: later
    /// calls change nothing.
    ///
    /// ```
    /// use caravan_guest::{ClientStatus, State};
    /// # let alloc = caravan_guest::Alloc {
    /// #     id: "a1".into(), job_id: "web".into(), group: "web".into(),
    /// #     tasks: vec![caravan_guest::Task { name: "main".into(), config: vec![] }],
    /// #     desired_status: caravan_guest::DesiredStatus::Run, modify_index: 1, meta: vec![],
    /// # };
    /// let mut state = State::new(&alloc);
    /// state.set_status(ClientStatus::Failed, "the input file is missing");
    /// state.set_status(ClientStatus::Running, "too late");
    /// assert_eq!(state.snapshot().description, "the input file is missing");
    /// ```
    pub fn set_status(&mut self, status: ClientStatus, description: impl Into<String>) {
        if !self.is_terminal() {
            self.current.client_status = status;
            self.current.description = description.into();
        }
    }

    /// The state of task `name`, if the alloc has such a task.
    pub fn task(&self, name: &str) -> Option<&TaskState> {
        self.current.task_states.iter().find(|t| t.name == name)
    }

    /// Marks task `name` running, with a `Started` event.
    pub fn task_started(&mut self, name: &str) {
        self.update_task(name, |task| {
            task.state = TaskLifecycle::Running;
            task.failed = false;
            push_event(task, event("Started", "Task started by client"));
        });
    }

    /// Marks task `name` dead, with a `Terminated` event carrying `message`.
    pub fn task_finished(&mut self, name: &str, failed: bool, message: &str) {
        self.update_task(name, |task| {
            task.state = TaskLifecycle::Dead;
            task.failed = failed;
            push_event(task, event("Terminated", message));
        });
    }

    /// Counts a restart of task `name`, with a `Restarting` event, and marks it running.
    ///
    /// ```
    /// use caravan_guest::State;
    /// # let alloc = caravan_guest::Alloc {
    /// #     id: "a1".into(), job_id: "web".into(), group: "web".into(),
    /// #     tasks: vec![caravan_guest::Task { name: "main".into(), config: vec![] }],
    /// #     desired_status: caravan_guest::DesiredStatus::Run, modify_index: 1, meta: vec![],
    /// # };
    /// let mut state = State::new(&alloc);
    /// state.task_started("main");
    /// state.task_restarted("main", "User requested task to restart");
    /// assert_eq!(state.task("main").unwrap().restarts, 1);
    /// ```
    pub fn task_restarted(&mut self, name: &str, reason: &str) {
        self.update_task(name, |task| {
            task.restarts += 1;
            push_event(task, event("Restarting", reason));
            task.state = TaskLifecycle::Running;
            task.failed = false;
        });
    }

    /// Records that task `name` was sent `signal`, with Nomad's `Signaling` event.
    pub fn task_signaled(&mut self, name: &str, signal: &str) {
        let message = format!("Task being sent signal {signal}");
        self.update_task(name, |task| push_event(task, event("Signaling", &message)));
    }

    /// Adds an event of your own kind to task `name`.
    pub fn task_event(&mut self, name: &str, kind: &str, message: &str) {
        self.update_task(name, |task| push_event(task, event(kind, message)));
    }

    /// Kills every task that is not dead yet (`Killing` then `Killed` events) and makes the
    /// alloc `complete` with `description`, as a stop asked for by the operator should be.
    ///
    /// ```
    /// use caravan_guest::{ClientStatus, State};
    /// # let alloc = caravan_guest::Alloc {
    /// #     id: "a1".into(), job_id: "web".into(), group: "web".into(),
    /// #     tasks: vec![caravan_guest::Task { name: "main".into(), config: vec![] }],
    /// #     desired_status: caravan_guest::DesiredStatus::Run, modify_index: 1, meta: vec![],
    /// # };
    /// let mut state = State::new(&alloc);
    /// state.task_started("main");
    /// state.kill_all("alloc was stopped");
    /// assert_eq!(state.client_status(), ClientStatus::Complete);
    /// assert!(!state.task("main").unwrap().failed);
    /// ```
    pub fn kill_all(&mut self, description: &str) {
        for task in &mut self.current.task_states {
            if task.state != TaskLifecycle::Dead {
                push_event(task, event("Killing", "Sent interrupt"));
                push_event(task, event("Killed", "Task successfully killed"));
                task.state = TaskLifecycle::Dead;
            }
        }
        self.set_status(ClientStatus::Complete, description);
    }

    /// Sends the state to the host if it changed since the last successful report.
    ///
    /// Returns the host's refusal (see `update-state` in `wit/runner.wit`), if any. The
    /// default loop ([`crate::run`]) calls it after each event; call it yourself only from a
    /// loop of your own. (It calls the host, so this example only compiles here.)
    ///
    /// ```no_run
    /// use caravan_guest::State;
    /// # let alloc = caravan_guest::Alloc {
    /// #     id: "a1".into(), job_id: "web".into(), group: "web".into(),
    /// #     tasks: vec![caravan_guest::Task { name: "main".into(), config: vec![] }],
    /// #     desired_status: caravan_guest::DesiredStatus::Run, modify_index: 1, meta: vec![],
    /// # };
    /// let mut state = State::new(&alloc);
    /// state.task_started("main");
    /// if let Err(refusal) = state.report() {
    ///     caravan_guest::error!("the host refused our state: {refusal}");
    /// }
    /// ```
    pub fn report(&mut self) -> Result<(), String> {
        if self.last_reported.as_ref() == Some(&self.current) {
            return Ok(());
        }
        host::update_state(&self.current)?;
        self.last_reported = Some(self.current.clone());
        Ok(())
    }

    fn update_task(&mut self, name: &str, change: impl FnOnce(&mut TaskState)) {
        let Some(task) = self.current.task_states.iter_mut().find(|t| t.name == name) else {
            crate::warn!(context: "caravan-guest", "no task named {name:?} in this alloc");
            return;
        };
        change(task);
        self.derive_client_status();
    }

    fn derive_client_status(&mut self) {
        if self.is_terminal() {
            return;
        }
        let tasks = &self.current.task_states;
        if !tasks.is_empty() && tasks.iter().all(|t| t.state == TaskLifecycle::Dead) {
            let failed: Vec<&str> = tasks
                .iter()
                .filter(|t| t.failed)
                .map(|t| t.name.as_str())
                .collect();
            if failed.is_empty() {
                self.set_status(ClientStatus::Complete, "All tasks have completed");
            } else {
                self.set_status(
                    ClientStatus::Failed,
                    format!("Failed tasks: {}", failed.join(", ")),
                );
            }
        } else if tasks.iter().any(|t| t.state == TaskLifecycle::Running) {
            self.current.client_status = ClientStatus::Running;
            self.current.description = "Tasks are running".to_string();
        }
    }
}

fn event(kind: &str, message: &str) -> TaskEvent {
    TaskEvent {
        kind: kind.to_string(),
        message: message.to_string(),
        time_unix_ms: host::now_unix_ms(),
    }
}

fn push_event(task: &mut TaskState, event: TaskEvent) {
    task.events.push(event);
    if task.events.len() > MAX_EVENTS_PER_TASK {
        let excess = task.events.len() - MAX_EVENTS_PER_TASK;
        task.events.drain(..excess);
    }
}
