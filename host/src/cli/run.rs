//! `caravan run`: its flags, the signal handling, and the one summary line it prints.
//!
//! The alloc itself is run by [`crate::run`], which this module only feeds and reads; it
//! must not grow alloc logic of its own.

use super::GlobalArgs;
use crate::model::structs::ClientStatus;
use crate::run::{LIMIT_NAMES, RunOptions};
use crate::shutdown::Shutdown;
use std::path::PathBuf;
use std::process::ExitCode;

/// `caravan run`'s flags.
#[derive(Debug, clap::Args)]
pub struct RunCommand {
    /// The runner component (`.wasm`).
    component: PathBuf,
    /// A task of the alloc; repeat for several. Default: one task named `main`.
    #[arg(long = "task", value_name = "NAME")]
    tasks: Vec<String>,
    /// Task config: `KEY=VALUE` for every task, `TASK.KEY=VALUE` for one.
    #[arg(long, value_name = "[TASK.]KEY=VALUE")]
    config: Vec<String>,
    /// A limit for this alloc.
    #[arg(long = "limit", value_name = "NAME=VALUE", help = format!("A limit for this alloc: {LIMIT_NAMES}"))]
    limits: Vec<String>,
    /// Alloc metadata.
    #[arg(long, value_name = "KEY=VALUE")]
    meta: Vec<String>,
    /// The job id the alloc belongs to.
    #[arg(long, default_value = "run")]
    job: String,
    /// Keep alloc directories here instead of in a temporary directory.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Keep the temporary directory (and the alloc's `/alloc` in it) at exit, and say where.
    #[arg(long, conflicts_with = "data_dir")]
    keep: bool,
    /// Keep compiled components here, so the next run does not compile them again (default:
    /// the cache the agent and `runner check` share, ~/.cache/caravan/components).
    #[arg(long, env = "CARAVAN_CACHE_DIR", value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Each time the component file changes, upgrade the running alloc to it in place: the
    /// old build checkpoints on `shutdown` and the new one starts from it (rolled back if it
    /// fails before reporting `running`). Nothing is rebuilt: run your build in another
    /// terminal.
    #[arg(long)]
    watch: bool,
}

impl RunCommand {
    /// Runs the alloc, prints `alloc ID STATUS: DESCRIPTION` (or its JSON form with
    /// `--log-json`), and exits 0 when the alloc ends `complete`, 1 otherwise. Errors (bad
    /// arguments, an unusable component, a second Ctrl-C) exit 2 through the caller.
    pub async fn execute(self, global: &GlobalArgs) -> anyhow::Result<ExitCode> {
        global.start_logging("info")?;
        let options = RunOptions {
            component: self.component,
            tasks: self.tasks,
            config: self.config,
            limits: self.limits,
            meta: self.meta,
            job_id: self.job,
            data_dir: self.data_dir,
            keep: self.keep,
            cache_dir: self
                .cache_dir
                .or_else(crate::runtime::component::disk_cache::shared_dir),
            watch: self.watch,
        };
        let shutdown = Shutdown::new();
        shutdown.on_signals()?;
        let (alloc, state) = crate::run::run(options, shutdown.listener()).await?;
        let summary = if global.log_json {
            serde_json::json!({
                "alloc_id": alloc.id,
                "client_status": state.client_status,
                "description": state.description,
                "task_states": state.task_states,
            })
            .to_string()
        } else {
            format!(
                "alloc {} {}: {}",
                alloc.id,
                state.client_status,
                crate::util::text::escape_controls(&state.description)
            )
        };
        // The alloc has ended and been cleaned up; a reader that has gone away (`| head`)
        // changes nothing of that, and the exit status still says how it ended.
        use std::io::Write;
        let _ = writeln!(std::io::stdout(), "{summary}");
        Ok(if state.client_status == ClientStatus::Complete {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        })
    }
}
