//! Batch: each task computes the sum of the squares of 1..`numbers`, `chunk` numbers at a time
//! (so `kill` and `shutdown` are answered between chunks), logs it and ends with it in the
//! task's `Terminated` event; the alloc completes when every task has. Its Python, JavaScript
//! and C twins (`guests/*/batch`) behave the same, byte for byte: the conformance suite runs
//! all four.
//!
//! Task config (all optional): `numbers` (default 1000, at most 1000000), `chunk` (default
//! 100), `result_file` (a file under `/alloc/`, at most 128 bytes, its parts neither empty nor
//! `.` or `..`: the task writes `{"numbers":N,"sum":S}` and a newline there when it is done,
//! making its directories, and reads it back; a write that fails fails the task with the
//! reason as a WASI error code, `Cannot write PATH: is-directory`). On `shutdown` it
//! checkpoints each task's progress (version 1: a line `name<TAB>next<TAB>sum` per task) and
//! resumes from it, whichever language wrote it.
//!
//! Writing files makes this runner import `wasi:filesystem` (through `std::fs`), so each of
//! its allocs is given an alloc dir, `result_file` or not.

use caravan_guest::{
    Alloc, ClientStatus, Runner, RunnerError, State, TaskConfig, decode_checkpoint,
    encode_checkpoint, info,
};
use std::time::Duration;

const CHECKPOINT_VERSION: u32 = 1;
const MAX_NUMBERS: i64 = 1_000_000;

struct Batch {
    tasks: Vec<Summing>,
}

struct Summing {
    name: String,
    numbers: i64,
    chunk: i64,
    next: i64,
    sum: u64,
    done: bool,
    result_file: Option<String>,
}

/// The longest `result_file`, in bytes.
const MAX_RESULT_FILE: usize = 128;

/// `result_file`, when set: a file under `/alloc/`, the only directory a runner sees, named
/// plainly (no empty, `.` or `..` part), so that every language resolves it alike.
fn result_file(config: &TaskConfig) -> Result<Option<String>, RunnerError> {
    let Some(path) = config.get("result_file") else {
        return Ok(None);
    };
    if path.len() > MAX_RESULT_FILE {
        let why = format!("is longer than {MAX_RESULT_FILE} bytes");
        return Err(config.invalid("result_file", why));
    }
    let plain = path.strip_prefix("/alloc/").is_some_and(|rest| {
        rest.split('/')
            .all(|part| !matches!(part, "" | "." | "..") && !part.contains('\0'))
    });
    if !plain {
        let why = format!("{path:?} is not a file under /alloc/");
        return Err(config.invalid("result_file", why));
    }
    Ok(Some(path.to_string()))
}

/// Why a write failed, as the WASI error code every language's batch names it by.
fn reason(error: &std::io::Error) -> &'static str {
    use std::io::ErrorKind;
    match error.kind() {
        ErrorKind::IsADirectory => "is-directory",
        ErrorKind::NotADirectory => "not-directory",
        ErrorKind::NotFound => "no-entry",
        ErrorKind::StorageFull | ErrorKind::QuotaExceeded => "insufficient-space",
        ErrorKind::PermissionDenied => "access",
        ErrorKind::AlreadyExists => "exist",
        _ => "io",
    }
}

/// Writes `text` to `path` (its directories made first) and reads it back.
fn write_and_read_back(path: &str, text: &str) -> std::io::Result<String> {
    if let Some(dir) = std::path::Path::new(path).parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, text)?;
    std::fs::read_to_string(path)
}

fn setting(
    config: &TaskConfig,
    key: &str,
    default: i64,
    range: (i64, i64),
) -> Result<i64, RunnerError> {
    let value = config.whole_number(key)?.unwrap_or(default);
    match range {
        (low, high) if (low..=high).contains(&value) => Ok(value),
        (low, i64::MAX) => Err(config.invalid(key, format!("{value} is not at least {low}"))),
        (low, high) => Err(config.invalid(key, format!("{value} is not between {low} and {high}"))),
    }
}

impl Batch {
    /// Each line `name<TAB>next<TAB>sum` of a version 1 checkpoint sets that task's progress;
    /// anything else in it is refused, in the same words by every language's batch runner.
    fn restore(&mut self, restored: &[u8]) -> Result<(), RunnerError> {
        let (version, data) = decode_checkpoint(restored)?;
        if version != CHECKPOINT_VERSION {
            return Err(RunnerError::Failed(format!(
                "checkpoint version {version} is not one this runner reads"
            )));
        }
        let unreadable =
            || RunnerError::Failed("the restored checkpoint's progress cannot be read".into());
        let text = std::str::from_utf8(data).map_err(|_| unreadable())?;
        for line in text.split('\n').filter(|line| !line.is_empty()) {
            let fields: Vec<&str> = line.split('\t').collect();
            let [name, next, sum] = fields[..] else {
                return Err(unreadable());
            };
            let next = digits(next)
                .filter(|n| (1..=MAX_NUMBERS as u64 + 1).contains(n))
                .ok_or_else(unreadable)?;
            let sum = digits(sum).ok_or_else(unreadable)?;
            if let Some(task) = self.tasks.iter_mut().find(|t| t.name == name) {
                task.next = next as i64;
                task.sum = sum;
                info!("task {name} resumed at {next}");
            }
        }
        Ok(())
    }
}

/// Decimal digits only (no sign), fitting a u64.
fn digits(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

impl Runner for Batch {
    fn start(
        alloc: &Alloc,
        restored: Option<Vec<u8>>,
        state: &mut State,
    ) -> Result<Self, RunnerError> {
        let mut tasks = Vec::new();
        for task in &alloc.tasks {
            let config = TaskConfig::of(task);
            tasks.push(Summing {
                name: task.name.clone(),
                numbers: setting(&config, "numbers", 1000, (0, MAX_NUMBERS))?,
                chunk: setting(&config, "chunk", 100, (1, i64::MAX))?,
                next: 1,
                sum: 0,
                done: false,
                result_file: result_file(&config)?,
            });
        }
        let mut batch = Batch { tasks };
        if let Some(restored) = restored {
            batch.restore(&restored)?;
        }
        for task in &batch.tasks {
            state.task_started(&task.name);
        }
        if batch.tasks.is_empty() {
            state.set_status(ClientStatus::Complete, "All tasks have completed");
        }
        Ok(batch)
    }

    fn next_wakeup(&self) -> Option<Duration> {
        self.tasks.iter().any(|t| !t.done).then_some(Duration::ZERO)
    }

    fn on_wakeup(&mut self, state: &mut State) -> Result<(), RunnerError> {
        for task in self.tasks.iter_mut().filter(|t| !t.done) {
            let last = task.numbers.min(task.next.saturating_add(task.chunk - 1));
            for n in task.next..=last {
                task.sum = task.sum.wrapping_add((n as u64) * (n as u64));
            }
            task.next = last + 1;
            if task.next > task.numbers {
                task.done = true;
                info!(
                    "task {} computed the sum of squares of 1..{}: {}",
                    task.name, task.numbers, task.sum
                );
                let mut message = format!(
                    "Computed the sum of squares of 1..{}: {}",
                    task.numbers, task.sum
                );
                let mut failed = false;
                if let Some(path) = &task.result_file {
                    let result = format!("{{\"numbers\":{},\"sum\":{}}}\n", task.numbers, task.sum);
                    match write_and_read_back(path, &result) {
                        Ok(read) if read == result => {
                            info!("task {} wrote {} bytes to {path}", task.name, read.len())
                        }
                        Ok(_) => (failed, message) = (true, format!("{path} reads back otherwise")),
                        Err(error) => {
                            let why = reason(&error);
                            (failed, message) = (true, format!("Cannot write {path}: {why}"))
                        }
                    }
                }
                state.task_finished(&task.name, failed, &message);
            }
        }
        Ok(())
    }

    fn checkpoint(&self) -> Option<Vec<u8>> {
        let lines: String = self
            .tasks
            .iter()
            .map(|t| format!("{}\t{}\t{}\n", t.name, t.next, t.sum))
            .collect();
        Some(encode_checkpoint(CHECKPOINT_VERSION, lines.as_bytes()))
    }
}

caravan_guest::export_runner!(Batch);
