//! `caravan run`'s library half: one alloc of one runner, to completion, on this machine,
//! with no agent.
//!
//! Builds the alloc from the command line's words, runs it through the wasm factory exactly
//! as the client will, sends `kill` when the [`crate::shutdown`] reaches `Stopping` and stops
//! waiting when it reaches `Abandoning`. It may use the runtime and the seam; it keeps no
//! state beyond its data directory. It stays outside `cli/` because it is how an alloc runs
//! without an agent, callable (and tested) without clap, stdout or signals; the command
//! (`cli::run`) only parses flags, installs the signal handlers and prints the outcome.

use crate::allocrunner::{
    AllocRunner, AllocRunnerConfig, CheckpointSaved, StateUpdater, alloc_span, checkpoint_kept,
};
use crate::model::structs::{Alloc, AllocState, ClientStatus, LimitOverrides, Limits, Task};
use crate::runtime::{Runtime, RuntimeConfig, WasmAllocRunner, WasmAllocRunnerFactory};
use crate::shutdown::ShutdownListener;
use crate::util::locks::LockUnpoisoned;
use crate::util::units::format_duration;
use anyhow::{Context, bail};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// What `caravan run` was asked to do.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The runner component.
    pub component: PathBuf,
    /// Task names, in order; `main` when none is given.
    pub tasks: Vec<String>,
    /// `[TASK.]KEY=VALUE` settings, as typed.
    pub config: Vec<String>,
    /// `NAME=VALUE` limits, as typed.
    pub limits: Vec<String>,
    /// `KEY=VALUE` metadata, as typed.
    pub meta: Vec<String>,
    /// The job id the alloc claims.
    pub job_id: String,
    /// Where alloc directories go; a temporary directory, removed at exit, when `None`.
    pub data_dir: Option<PathBuf>,
    /// Keep that temporary directory at exit (`--keep`), and say where it is.
    pub keep: bool,
    /// Where compiled components are kept between runs; nowhere when `None`.
    pub cache_dir: Option<PathBuf>,
    /// Upgrade the runner in place, from its checkpoint, each time the component file
    /// changes (`--watch`).
    pub watch: bool,
}

/// What `--limit` accepts, for its help.
pub const LIMIT_NAMES: &str = "the keys of a job's [job.limits], such as memory=64MiB, cpu=10s, kill-timeout=2s, disk=100MiB, open-files=64";

/// Builds the alloc `caravan run` runs. Errors name the argument at fault.
pub fn build_alloc(options: &RunOptions) -> anyhow::Result<Alloc> {
    let tasks = build_tasks(&options.tasks, &options.config)?;
    let meta = options
        .meta
        .iter()
        .map(|m| split_pair(m, "--meta", "KEY=VALUE").map(|(k, v)| (k.to_string(), v.to_string())))
        .collect::<anyhow::Result<_>>()?;
    Ok(Alloc {
        meta,
        limits: parse_limits(&options.limits)?,
        ..Alloc::new(
            uuid::Uuid::new_v4().to_string(),
            options.job_id.clone(),
            options.component.display().to_string(),
            tasks,
        )
    })
}

/// The tasks of `--task NAME` (default one, `main`) with their `--config [TASK.]KEY=VALUE`:
/// a key prefixed with a task's name is that task's, any other every task's. Errors name the
/// argument at fault.
pub fn build_tasks(task_names: &[String], config: &[String]) -> anyhow::Result<Vec<Task>> {
    let names = if task_names.is_empty() {
        vec!["main".to_string()]
    } else {
        task_names.to_vec()
    };
    let mut tasks: Vec<Task> = Vec::new();
    for name in names {
        if name.is_empty() || tasks.iter().any(|t| t.name == name) {
            bail!("--task {name:?}: task names must be non-empty and unique");
        }
        tasks.push(Task {
            name,
            config: Vec::new(),
        });
    }
    for setting in config {
        let (key, value) = split_pair(setting, "--config", "[TASK.]KEY=VALUE")?;
        let target = key
            .split_once('.')
            .filter(|(task, _)| tasks.iter().any(|t| t.name == *task));
        match target {
            Some((task, key)) => {
                let task = tasks
                    .iter_mut()
                    .find(|t| t.name == task)
                    .expect("task found above");
                task.config.push((key.to_string(), value.to_string()));
            }
            None => {
                for task in &mut tasks {
                    task.config.push((key.to_string(), value.to_string()));
                }
            }
        }
    }
    Ok(tasks)
}

/// Parses `--limit NAME=VALUE` arguments: the keys of `[job.limits]`, `-` or `_` alike.
pub fn parse_limits(limits: &[String]) -> anyhow::Result<LimitOverrides> {
    let mut overrides = LimitOverrides::default();
    for limit in limits {
        let (name, value) = split_pair(limit, "--limit", "NAME=VALUE")?;
        // Flags are spelled with dashes; the job file's keys, with underscores.
        overrides
            .set(&name.replace('-', "_"), value)
            .map_err(|e| anyhow::anyhow!("--limit {limit}: {e}"))?;
    }
    if let Some(conflict) = Limits::default().with_overrides(&overrides).conflict() {
        bail!("--limit: {conflict}");
    }
    Ok(overrides)
}

fn split_pair<'a>(text: &'a str, flag: &str, form: &str) -> anyhow::Result<(&'a str, &'a str)> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key, value)),
        _ => bail!("{flag} {text:?}: expected {form}"),
    }
}

/// Runs `options` to completion and returns the alloc's final state. When `shutdown` reaches
/// `Stopping` the alloc is killed (or, if that happened before it started, not started at
/// all); when it reaches `Abandoning` this returns an error without waiting for the runner.
pub async fn run(
    options: RunOptions,
    mut shutdown: ShutdownListener,
) -> anyhow::Result<(Alloc, AllocState)> {
    let alloc = Arc::new(build_alloc(&options)?);
    let runtime = Runtime::new(&RuntimeConfig {
        max_live_allocs: 1,
        cache_dir: options.cache_dir.clone(),
        ..RuntimeConfig::default()
    })?;
    let temporary = match &options.data_dir {
        Some(_) => None,
        None => Some(
            crate::util::fs_tree::TempTree::new("caravan-run-")
                .context("cannot create a temporary data dir")?,
        ),
    };
    let data_dir = options.data_dir.clone().unwrap_or_else(|| {
        temporary
            .as_ref()
            .expect("created above")
            .path()
            .to_path_buf()
    });
    let limits = Limits::default();
    let span = alloc_span(&alloc);
    let config = AllocRunnerConfig {
        alloc: alloc.clone(),
        span: span.clone(),
        state_updater: Arc::new(StatusLogger::new(span.clone())),
        limits,
        alloc_dir: data_dir.join("allocs").join(&alloc.id),
        restored: None,
        restoring: false,
        last_state: None,
        log_writer: None,
    };
    // Building may compile the component (seconds for Python or JavaScript): on the blocking
    // pool, so a Ctrl-C meanwhile is heard at once instead of after the compile.
    let factory = WasmAllocRunnerFactory::new(runtime);
    let build = tokio::task::spawn_blocking(move || factory.build(config));
    let runner = tokio::select! {
        built = build => built.context("building the runner stopped unexpectedly")??,
        _ = shutdown.stopping() => bail!("interrupted before the alloc started"),
    };
    runner.run();
    // Dropped on every way out of here, which stops the watching.
    let mut watching = tokio::task::JoinSet::new();
    if options.watch {
        watching.spawn(watch_component(
            runner.clone(),
            options.component.clone(),
            span.clone(),
        ));
    }

    let stopped = runner.wait();
    let kill_timeout = limits.with_overrides(&alloc.limits).kill_timeout;
    tokio::select! {
        _ = stopped.wait() => {}
        _ = shutdown.stopping() => {
            tracing::info!(
                parent: &span,
                kill_timeout = %format_duration(kill_timeout),
                "interrupted: killing the alloc (press Ctrl-C again to stop waiting)"
            );
            runner.kill();
            tokio::select! {
                _ = stopped.wait() => {}
                _ = shutdown.abandoning() => {
                    bail!("interrupted again: stopped without waiting for the runner");
                }
            }
        }
    }
    let state = runner.alloc_state();
    say_where_the_alloc_dir_is(
        &data_dir.join("allocs").join(&alloc.id),
        temporary,
        options.keep,
        &span,
    );
    Ok((Alloc::clone(&alloc), state))
}

/// Says where the alloc's directory (what a batch runner left in `/alloc`) is once the run
/// ended, if the runner had one: kept (a `--data-dir`, or `--keep`), or removed now.
fn say_where_the_alloc_dir_is(
    alloc_dir: &std::path::Path,
    temporary: Option<crate::util::fs_tree::TempTree>,
    keep: bool,
    span: &tracing::Span,
) {
    if !alloc_dir.exists() {
        return;
    }
    let path = alloc_dir.display();
    match temporary {
        None => tracing::info!(parent: span, "the alloc dir is {path}"),
        Some(temporary) if keep => {
            let kept = temporary.keep();
            tracing::info!(parent: span, "the alloc dir is kept at {path} (remove {} when done)", kept.display());
        }
        Some(_) => tracing::info!(
            parent: span,
            "the alloc dir {path} is removed at exit (--keep keeps it, --data-dir puts it elsewhere)"
        ),
    }
}

/// How often `--watch` looks at the component file.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(300);

/// `--watch`: each time the component file changes, and then stays the same for one look
/// (a build may write it in pieces), hands the runner a version of its alloc naming the new
/// build, which it upgrades to in place exactly as an agent's runner does for a job whose
/// runner was rebuilt. A file that cannot be read or loaded is reported by that path, and
/// the running build carries on.
async fn watch_component(runner: Arc<WasmAllocRunner>, path: PathBuf, span: tracing::Span) {
    let stamp = |path: &PathBuf| {
        std::fs::metadata(path)
            .ok()
            .map(|m| (m.len(), m.modified().ok()))
    };
    let mut seen = stamp(&path);
    let mut asked: Option<String> = None;
    let mut ticker = tokio::time::interval(WATCH_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let now = stamp(&path);
        if now == seen {
            continue;
        }
        ticker.tick().await;
        if stamp(&path) != now {
            continue; // still being written: looked at again next time
        }
        seen = now;
        let reading = path.clone();
        let hashed = tokio::task::spawn_blocking(move || {
            std::fs::read(&reading).map(|bytes| crate::runtime::component_sha256(&bytes))
        })
        .await;
        let sha256 = match hashed {
            Ok(Ok(sha256)) => sha256,
            Ok(Err(error)) => {
                tracing::warn!(parent: &span, %error, path = %path.display(), "the runner file changed but cannot be read");
                continue;
            }
            Err(_) => return,
        };
        if runner.runner_sha256().as_ref() == Some(&sha256) || asked.as_ref() == Some(&sha256) {
            continue;
        }
        tracing::info!(parent: &span, runner_sha256 = %crate::allocrunner::short_hash(&sha256), "the runner file changed: upgrading in place");
        asked = Some(sha256.clone());
        let current = runner.alloc();
        runner.update(Arc::new(Alloc {
            runner_sha256: Some(sha256),
            modify_index: current.modify_index + 1,
            ..Alloc::clone(&current)
        }));
    }
}

/// Logs each change of client status, the way the agent's log shows an alloc's progress.
struct StatusLogger {
    span: tracing::Span,
    last: Mutex<Option<ClientStatus>>,
}

impl StatusLogger {
    fn new(span: tracing::Span) -> Self {
        StatusLogger {
            span,
            last: Mutex::new(None),
        }
    }
}

impl StateUpdater for StatusLogger {
    fn alloc_state_updated(&self, _alloc_id: &str, state: &AllocState) {
        let mut last = self.last.lock_unpoisoned();
        if *last != Some(state.client_status) {
            *last = Some(state.client_status);
            tracing::info!(
                parent: &self.span,
                client_status = %state.client_status,
                description = %state.description,
                "alloc status changed"
            );
        }
    }

    fn checkpoint_saved(&self, _alloc_id: &str, data: &[u8]) -> CheckpointSaved {
        tracing::debug!(parent: &self.span, bytes = data.len(), "runner saved a checkpoint");
        checkpoint_kept()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(tasks: &[&str], config: &[&str], limits: &[&str]) -> RunOptions {
        RunOptions {
            component: "runner.wasm".into(),
            tasks: tasks.iter().map(|s| s.to_string()).collect(),
            config: config.iter().map(|s| s.to_string()).collect(),
            limits: limits.iter().map(|s| s.to_string()).collect(),
            meta: vec![],
            job_id: "example".into(),
            data_dir: None,
            keep: false,
            cache_dir: None,
            watch: false,
        }
    }

    #[test]
    fn config_goes_to_every_task_unless_prefixed_with_a_task_name() {
        let alloc = build_alloc(&options(
            &["web", "db"],
            &["run_for=5s", "db.exit_code=1", "x.y=z"],
            &[],
        ))
        .unwrap();
        let web = &alloc.tasks[0].config;
        let db = &alloc.tasks[1].config;
        assert_eq!(
            web,
            &vec![("run_for".into(), "5s".into()), ("x.y".into(), "z".into())]
        );
        assert!(db.contains(&("exit_code".into(), "1".into())));
        assert_eq!(
            build_alloc(&options(&[], &[], &[])).unwrap().tasks[0].name,
            "main"
        );
    }

    #[test]
    fn bad_arguments_name_the_flag_and_the_expected_form() {
        let error = build_alloc(&options(&[], &["novalue"], &[]))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("--config") && error.contains("KEY=VALUE"),
            "{error}"
        );
        let error = build_alloc(&options(&[], &[], &["memory=lots"]))
            .unwrap_err()
            .to_string();
        assert!(error.contains("--limit memory=lots"), "{error}");
        let error = build_alloc(&options(&[], &[], &["inodes=1000"]))
            .unwrap_err()
            .to_string();
        assert!(error.contains("unknown limit \"inodes\""), "{error}");
        let error = build_alloc(&options(&["a", "a"], &[], &[]))
            .unwrap_err()
            .to_string();
        assert!(error.contains("unique"), "{error}");
    }

    #[test]
    fn limits_parse_into_overrides() {
        let limits = parse_limits(&["memory=32MiB".into(), "kill-timeout=1s".into()]).unwrap();
        assert_eq!(limits.memory_bytes, Some(32 << 20));
        assert_eq!(limits.kill_timeout, Some(std::time::Duration::from_secs(1)));
        assert!(parse_limits(&["log-rate=0".into()]).is_err());
    }
}
