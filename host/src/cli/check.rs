//! `caravan runner ...`: tools for runner authors: `runner check`, its flags and the lines
//! it prints, `runner new`, and `runner push` (to an OCI registry, [`crate::runner_store::oci`]).
//!
//! The checks themselves are [`crate::check`], a library module so tests and other tools can
//! run them without a process, and the scaffolds are [`crate::scaffold`]'s; this module must
//! not add checks or files, only call them and print.

use super::GlobalArgs;
use crate::check::CheckOptions;
use crate::shutdown::Shutdown;
use anyhow::{Context, bail};
use std::path::PathBuf;
use std::process::ExitCode;

/// `caravan runner`'s subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum RunnerCommand {
    /// Drive a runner through the contract and print one line per check. Exits 0 only when
    /// every required check passes.
    Check(CheckCommand),
    /// Make a folder with a working runner, its build script, a job file and a README with
    /// the commands to build, check and run it.
    New(NewCommand),
    /// Publish a runner component to an OCI registry, as the CNCF's Wasm OCI artifact (the
    /// layout `wkg`, Spin and wasmCloud read), for jobs to name as `runner = "oci://..."`.
    Push(PushCommand),
}

impl RunnerCommand {
    /// Runs the subcommand to its exit status.
    pub async fn execute(self, global: &GlobalArgs) -> anyhow::Result<ExitCode> {
        match self {
            RunnerCommand::Check(command) => command.execute(global).await,
            RunnerCommand::New(command) => command.execute(),
            RunnerCommand::Push(command) => command.execute().await,
        }
    }
}

/// `caravan runner new`'s flags.
#[derive(Debug, clap::Args)]
pub struct NewCommand {
    /// The runner's language.
    #[arg(long, value_enum)]
    lang: crate::scaffold::Language,
    /// Its name: the folder, the job and (in Rust) the crate.
    name: String,
    /// Where to make the folder.
    #[arg(long, default_value = ".", value_name = "DIR")]
    dir: PathBuf,
    /// A batch runner that writes `/alloc/out/result.json` and ends, instead of a service
    /// (in JavaScript, built against the `file-runner` world).
    #[arg(long)]
    files: bool,
}

impl NewCommand {
    /// Writes the folder and prints the three commands; errors (a bad name, a folder that
    /// exists) exit 2 through the caller, having written nothing.
    fn execute(self) -> anyhow::Result<ExitCode> {
        let home = crate::scaffold::default_caravan_home();
        let template = if self.files {
            crate::scaffold::Template::Files
        } else {
            crate::scaffold::Template::Service
        };
        let folder = crate::scaffold::create(&self.dir, &self.name, self.lang, template, &home)?;
        let name = &self.name;
        println!("made {}: from there,", folder.display());
        println!("  ./build                               # out/{name}.wasm");
        println!("  caravan runner check out/{name}.wasm");
        println!("  caravan job run {name}.toml           # with an agent running");
        if self.files {
            println!("  caravan alloc fs ALLOC_ID out/result.json   # the file it wrote");
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// `caravan runner push`'s arguments.
#[derive(Debug, clap::Args)]
pub struct PushCommand {
    /// The runner component (`.wasm`).
    component: PathBuf,
    /// Where to: `oci://HOST[:PORT]/REPOSITORY:TAG`.
    reference: String,
    /// Speak plain HTTP to this registry (a test or a private one on a trusted network);
    /// HTTPS otherwise.
    #[arg(long)]
    insecure: bool,
}

impl PushCommand {
    /// Pushes and prints what was published; a file that is not a component, an unusable
    /// reference or a registry's refusal exits 2 through the caller, in one line.
    async fn execute(self) -> anyhow::Result<ExitCode> {
        use crate::runner_store::oci;
        let parsed = oci::parse(&self.reference)?;
        let bytes = std::fs::read(&self.component)
            .with_context(|| format!("cannot read runner {}", self.component.display()))?;
        let max = crate::runner_store::MAX_BUILD_BYTES;
        if bytes.len() as u64 > max {
            bail!(
                "runner {} is {} bytes, over the limit of {max}",
                self.component.display(),
                bytes.len()
            );
        }
        let insecure = if self.insecure {
            vec![parsed.resolve_registry().to_string()]
        } else {
            Vec::new()
        };
        let pushed = oci::Registries::new(insecure)
            .push(bytes, &self.reference)
            .await?;
        println!(
            "pushed {} to {} (manifest {}, component sha256:{})",
            self.component.display(),
            self.reference,
            pushed.manifest_digest,
            pushed.sha256
        );
        Ok(ExitCode::SUCCESS)
    }
}

/// `caravan runner check`'s flags.
#[derive(Debug, clap::Args)]
pub struct CheckCommand {
    /// The runner component (`.wasm`).
    component: PathBuf,
    /// How long `kill` and `shutdown` may take.
    #[arg(long, default_value = "5s", value_parser = parse_kill_timeout)]
    kill_timeout: std::time::Duration,
    /// Keep compiled components here, so the next check or run does not compile them
    /// again (default: the cache the agent and `caravan run` share,
    /// ~/.cache/caravan/components).
    #[arg(long, env = "CARAVAN_CACHE_DIR", value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// A task of the alloc; repeat for several. Default: one task named `main`.
    #[arg(long = "task", value_name = "NAME")]
    tasks: Vec<String>,
    /// Task config: `KEY=VALUE` for every task, `TASK.KEY=VALUE` for one.
    #[arg(long, value_name = "[TASK.]KEY=VALUE")]
    config: Vec<String>,
    /// Judge it as a batch runner: it must end `complete` or `failed` on its own within
    /// --duration. Without it, a runner that ends `complete` on its own is judged so.
    #[arg(long)]
    batch: bool,
    /// How long a service must stay up (an update, a signal and a task restart are sent at
    /// random times meanwhile), and a batch runner has to end.
    #[arg(long, default_value = "3s", value_parser = parse_check_duration)]
    duration: std::time::Duration,
    /// Chooses when those events are sent; printed, so a failure can be replayed.
    #[arg(long)]
    seed: Option<u64>,
}

impl CheckCommand {
    /// Prints one line per check and a verdict; exits 0 when every required check passed, 1
    /// when one failed. Errors (the checks could not run, Ctrl-C or SIGTERM) exit 2 through
    /// the caller.
    pub async fn execute(self, global: &GlobalArgs) -> anyhow::Result<ExitCode> {
        // Only the checks' own lines: the runner's logs are checked, not shown.
        global.start_logging("off")?;
        let shutdown = Shutdown::new();
        shutdown.on_signals()?;
        let mut stop = shutdown.listener();
        // A task of its own, so that a signal is heard while the checks compile the component
        // (which holds their thread for seconds for Python or JavaScript).
        let seed = self.seed.unwrap_or_else(|| {
            // Different times each run unless asked for a seed: late failures get more
            // chances to show.
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.subsec_nanos() as u64 ^ d.as_secs())
        });
        let options = CheckOptions {
            kill_timeout: self.kill_timeout,
            cache_dir: self
                .cache_dir
                .or_else(crate::runtime::component::disk_cache::shared_dir),
            tasks: crate::run::build_tasks(&self.tasks, &self.config)?,
            batch: self.batch,
            duration: self.duration,
            seed,
        };
        let component = self.component.clone();
        let checks = tokio::spawn(async move { crate::check::check(&component, &options).await });
        let results = tokio::select! {
            results = checks => results.context("the checks stopped unexpectedly")??,
            _ = stop.stopping() => bail!("interrupted: the checks did not finish"),
        };
        for result in &results {
            println!("{}", crate::util::text::escape_controls(&result.line()));
            if !result.log.is_empty() {
                println!("      its last log lines:");
                for line in &result.log {
                    println!("      | {}", crate::util::text::escape_controls(line));
                }
            }
        }
        let failed = results.iter().filter(|r| r.required && !r.passed).count();
        let component = self.component.display();
        if failed == 0 {
            println!("{component}: every required check passed");
            Ok(ExitCode::SUCCESS)
        } else {
            println!(
                "{component}: {failed} required check(s) failed (events sent with --seed {seed})"
            );
            Ok(ExitCode::from(1))
        }
    }
}

/// `--kill-timeout`: at most the agent's cap on a job's kill timeout (30 s).
fn parse_kill_timeout(text: &str) -> Result<std::time::Duration, String> {
    let timeout = crate::util::units::parse_duration(text).map_err(|e| e.to_string())?;
    let cap = crate::model::structs::LimitCaps::default().kill_timeout;
    if timeout > cap {
        return Err(format!(
            "{text} is longer than a job may ask for ({})",
            crate::util::units::format_duration(cap)
        ));
    }
    Ok(timeout)
}

/// `--duration`: from 100ms (time for the events) to 1h.
fn parse_check_duration(text: &str) -> Result<std::time::Duration, String> {
    let duration = crate::util::units::parse_duration(text).map_err(|e| e.to_string())?;
    let (shortest, longest) = (
        std::time::Duration::from_millis(100),
        std::time::Duration::from_secs(3600),
    );
    if !(shortest..=longest).contains(&duration) {
        return Err(format!("{text} is out of range; expected 100ms to 1h"));
    }
    Ok(duration)
}
