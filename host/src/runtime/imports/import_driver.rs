//! The host side of every import a runner calls (`update-state`, `checkpoint`, `next-event`,
//! `wasi:logging`, stdout and stderr), driven straight from bytes: each byte string decodes
//! to a sequence of calls with arbitrary arguments, made on one alloc's real import state,
//! and after every call what the host kept is checked against its bounds. The coverage-
//! guided fuzzers (`fuzz/`) and the seeded fuzz tests feed it.
//!
//! Built only for tests and the `testing` feature. A broken bound is a panic naming it: that
//! is the fuzzer's finding. It may touch nothing but one alloc's import state, built here.

use crate::allocrunner::{CheckpointSaved, Latch, StateUpdater, checkpoint_kept};
use crate::model::structs::{Alloc, AllocState, Limits, Task};
use crate::runtime::imports::bindings::{Event, HostImports, Level, LoggingImports, WitAllocState};
use crate::runtime::imports::event_queue::event_queue;
use crate::runtime::imports::host_api::{
    EndingLatches, HostApi, MAX_EVENT_KIND_BYTES, MAX_EVENTS_PER_TASK, StateCell,
};
use crate::runtime::imports::logging::{GuestLogSink, GuestLogging, GuestOutput, LogLimits};
use crate::util::locks::LockUnpoisoned;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use wasmtime_wasi::cli::StdoutStream;

/// The most a cut text grows by its marker (` [truncated N bytes]`).
const MARKER_BYTES: usize = 40;
/// The alloc's tasks; a report may name them or anything else.
const TASKS: [&str; 2] = ["web", "db"];

/// What one drive did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ImportDrive {
    /// Import calls made.
    pub calls: usize,
    /// Calls the host refused (each with a reason, checked non-empty).
    pub refusals: usize,
    /// Guest lines that reached the agent's log (each checked against the alloc's limits).
    pub lines_logged: u64,
}

/// Reads arbitrary values off the input; past its end every value is zero.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let (first, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        first
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    fn u64(&mut self) -> u64 {
        (0..8).fold(0u64, |n, _| n << 8 | u64::from(self.byte()))
    }

    /// A string of up to `max` bytes of the input (lossily UTF-8), sometimes stretched to
    /// many times its bytes so that limits are reached without inputs that large.
    fn text(&mut self, max: usize) -> String {
        let len = usize::from(self.byte()).min(max).min(self.0.len());
        let (taken, rest) = self.0.split_at(len);
        self.0 = rest;
        let text = String::from_utf8_lossy(taken).into_owned();
        match self.byte() % 8 {
            0 => text.repeat(1 + usize::from(self.u16()) % 4096),
            _ => text,
        }
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Keeps what the host hands on: every state report and checkpoint.
#[derive(Default)]
struct Kept {
    states: Mutex<Vec<AllocState>>,
    checkpoints: Mutex<Vec<usize>>,
}

impl StateUpdater for Kept {
    fn alloc_state_updated(&self, _alloc_id: &str, state: &AllocState) {
        self.states.lock_unpoisoned().push(state.clone());
    }

    fn checkpoint_saved(&self, _alloc_id: &str, data: &[u8]) -> CheckpointSaved {
        self.checkpoints.lock_unpoisoned().push(data.len());
        checkpoint_kept()
    }
}

/// Drives one alloc's imports with the calls `bytes` decodes to, on the current tokio
/// runtime (start it paused: `next-event` waits out its timeouts). Panics when the host
/// keeps or hands on anything past its bounds.
pub async fn drive_host_imports(bytes: &[u8]) -> ImportDrive {
    let mut input = Input(bytes);
    // Small limits, so that short inputs reach them.
    let limits = Limits {
        description_bytes: 64 + u64::from(input.byte()),
        checkpoint_bytes: 1024 + u64::from(input.u16()),
        log_line_bytes: 64 + u64::from(input.byte()),
        log_field_bytes: 16 + u64::from(input.byte()),
        ..Limits::default()
    };
    let alloc = Arc::new(Alloc::new(
        "fuzzed",
        "fuzz",
        "fuzz.wasm",
        TASKS.iter().map(|name| Task::named(*name)).collect(),
    ));
    let kept = Arc::new(Kept::default());
    let description_bytes = limits.description_bytes as usize;
    let cell = Arc::new(StateCell::new(
        alloc.id.clone(),
        description_bytes,
        kept.clone(),
        AllocState::pending(),
    ));
    let (events, receiver) = event_queue();
    let (_upgrade, upgrade_asked) = Latch::new();
    let (_kill, kill_sent) = Latch::new();
    let mut host = HostApi::new(
        alloc.clone(),
        receiver,
        Arc::new(AtomicUsize::new(usize::MAX / 2)),
        cell.clone(),
        tracing::Span::none(),
        &limits,
        EndingLatches {
            upgrade_asked,
            kill_sent,
        },
    );
    let sink = GuestLogSink::new(tracing::Span::none(), LogLimits::of(&limits), None);
    let mut logging = GuestLogging::new(sink.clone());
    let mut stdout = GuestOutput::stdout(sink.clone()).p2_stream();
    let logged = Arc::new(Mutex::new(GuestLines::default()));
    let _capture =
        tracing::subscriber::set_default(tracing_subscriber::layer::SubscriberExt::with(
            tracing_subscriber::registry(),
            LineCapture(logged.clone()),
        ));
    let started = tokio::time::Instant::now();
    let mut drive = ImportDrive::default();
    while !input.is_empty() && drive.calls < 256 {
        drive.calls += 1;
        let refused = match input.byte() % 6 {
            0 => host.update_state(report(&mut input)).err(),
            1 => {
                let len = usize::from(input.u16()) * 4;
                let fill = input.byte();
                host.checkpoint(vec![fill; len]).await.err()
            }
            2 => {
                let level = level(input.byte());
                let context = input.text(64);
                let message = input.text(255);
                logging.log(level, context, message);
                None
            }
            3 => {
                let text = input.text(255);
                let _ = stdout.write(bytes::Bytes::from(text.into_bytes()));
                None
            }
            4 => {
                events.send(event(&mut input, &alloc));
                None
            }
            _ => {
                let timeout_ms = u64::from(input.u16());
                let _ = host.next_event(timeout_ms).await;
                None
            }
        };
        if let Some(reason) = refused {
            assert!(!reason.trim().is_empty(), "a refusal without a reason");
            drive.refusals += 1;
        }
        check_kept(&cell.get(), &alloc, description_bytes);
        for state in kept.states.lock_unpoisoned().iter() {
            check_kept(state, &alloc, description_bytes);
        }
        let largest = kept.checkpoints.lock_unpoisoned().iter().copied().max();
        assert!(
            largest.unwrap_or(0) as u64 <= limits.checkpoint_bytes,
            "a checkpoint of {largest:?} bytes was kept, over checkpoint_size {}",
            limits.checkpoint_bytes
        );
    }
    logging.flush();
    let logged = logged.lock_unpoisoned();
    let (line_bytes, context_bytes) = (limits.log_line_bytes, limits.log_field_bytes);
    assert!(
        logged.longest_message as u64 <= line_bytes + MARKER_BYTES as u64,
        "a guest line of {} bytes was logged (log_line_size {line_bytes})",
        logged.longest_message
    );
    assert!(
        logged.longest_context as u64 <= context_bytes + MARKER_BYTES as u64,
        "a context of {} bytes was logged (log_field_size {context_bytes})",
        logged.longest_context
    );
    // A second's burst, then the rate; each report of dropped lines is a line of its own.
    let seconds = started.elapsed().as_secs() + 2;
    let allowed = u64::from(limits.log_lines_per_second) * seconds * 2;
    assert!(
        logged.lines <= allowed,
        "{} guest lines logged in {seconds}s, past log_lines_per_second {}",
        logged.lines,
        limits.log_lines_per_second
    );
    drive.lines_logged = logged.lines;
    if let Some(words) = logging.last_words() {
        assert!(
            words.len() <= 64 << 10,
            "last words of {} bytes",
            words.len()
        );
    }
    drive
}

/// What reached the agent's log from the guest.
#[derive(Default)]
struct GuestLines {
    lines: u64,
    longest_message: usize,
    longest_context: usize,
}

/// Measures every guest line the agent's logger receives.
struct LineCapture(Arc<Mutex<GuestLines>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for LineCapture {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() != crate::runtime::GUEST_TARGET {
            return;
        }
        let mut lines = self.0.lock_unpoisoned();
        lines.lines += 1;
        event.record(&mut *lines);
    }
}

impl tracing::field::Visit for GuestLines {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        match field.name() {
            "message" => self.longest_message = self.longest_message.max(value.len()),
            "context" => self.longest_context = self.longest_context.max(value.len()),
            _ => {}
        }
    }

    fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
}

/// A state report with arbitrary status, texts, tasks (the alloc's, or not, or twice) and
/// events, as a guest hands it over.
fn report(input: &mut Input<'_>) -> WitAllocState {
    use crate::runtime::imports::bindings::caravan::runner::types::{
        ClientStatus, TaskEvent, TaskLifecycle, TaskState,
    };
    let client_status = match input.byte() % 4 {
        0 => ClientStatus::Pending,
        1 => ClientStatus::Running,
        2 => ClientStatus::Complete,
        _ => ClientStatus::Failed,
    };
    let description = input.text(255);
    let task_states = (0..input.byte() % 4)
        .map(|_| {
            let name = match input.byte() % 4 {
                0 => input.text(80),
                pick => TASKS[usize::from(pick) % TASKS.len()].to_string(),
            };
            let state = match input.byte() % 3 {
                0 => TaskLifecycle::Pending,
                1 => TaskLifecycle::Running,
                _ => TaskLifecycle::Dead,
            };
            let failed = input.byte() % 2 == 1;
            let restarts = u32::from(input.u16());
            let events = (0..input.byte() % 24)
                .map(|_| TaskEvent {
                    kind: input.text(100),
                    message: input.text(255),
                    time_unix_ms: input.u64(),
                })
                .collect();
            TaskState {
                name,
                state,
                failed,
                restarts,
                events,
            }
        })
        .collect();
    WitAllocState {
        client_status,
        description,
        task_states,
    }
}

fn level(byte: u8) -> Level {
    match byte % 6 {
        0 => Level::Trace,
        1 => Level::Debug,
        2 => Level::Info,
        3 => Level::Warn,
        4 => Level::Error,
        _ => Level::Critical,
    }
}

/// An event the host might queue for the runner.
fn event(input: &mut Input<'_>, alloc: &Arc<Alloc>) -> Event {
    match input.byte() % 5 {
        0 => Event::Update(alloc.clone()),
        1 => Event::Signal {
            task: input.byte().is_multiple_of(2).then(|| TASKS[0].to_string()),
            signal: input.text(32),
        },
        2 => Event::RestartTask(TASKS[1].to_string()),
        3 => Event::Shutdown,
        _ => Event::Kill,
    }
}

/// What the host keeps of an alloc's state stays within its bounds: its tasks exactly the
/// alloc's, each once; texts cut; the newest events only; times a calendar can show.
fn check_kept(state: &AllocState, alloc: &Alloc, text_bytes: usize) {
    assert!(
        state.description.len() <= text_bytes + MARKER_BYTES,
        "a description of {} bytes was kept (description_size {text_bytes})",
        state.description.len()
    );
    let mut names: Vec<&str> = state.task_states.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    let mut expected: Vec<&str> = alloc.tasks.iter().map(|t| t.name.as_str()).collect();
    expected.sort_unstable();
    if state.client_status != crate::model::structs::ClientStatus::Pending || !names.is_empty() {
        assert_eq!(names, expected, "the kept tasks are not the alloc's");
    }
    for task in &state.task_states {
        assert!(
            task.events.len() <= MAX_EVENTS_PER_TASK,
            "{} events kept for one task",
            task.events.len()
        );
        for event in &task.events {
            assert!(event.kind.len() <= MAX_EVENT_KIND_BYTES + MARKER_BYTES);
            assert!(event.message.len() <= text_bytes + MARKER_BYTES);
            assert!(
                event.time_unix_ms <= 253_402_300_799_999,
                "a time past year 9999"
            );
        }
    }
}
