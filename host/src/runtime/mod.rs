//! Everything wasmtime: the engine, compiled components, the linker and the per-alloc store.
//!
//! One [`Runtime`] per process holds one `Engine` (epoch interruption on, the pooling allocator
//! when the address space can be reserved), one `Linker` with every host import, and a cache
//! of compiled components keyed by content hash, each with its `InstancePre` (and, when given
//! a cache dir, their machine code on disk). Each alloc gets its own `Store` (see
//! [`WasmAllocRunner`]).
//!
//! Layout, four rooms by concern (each may use only the rooms listed after it; the module
//! map test checks it, and no two files of the runtime use each other):
//! - `runner/`: [`WasmAllocRunner`], the [`crate::allocrunner::AllocRunner`] on wasm, its run
//!   loop with restarts and upgrades in place (`wasm_runner/`); `lifecycle`, the one value
//!   that says where a runner is in its life; `outcome`, how a run's end becomes the alloc's
//!   final state.
//! - [`component`]: loading runners: the engine's configuration and the epoch ticker
//!   (`engine`), one compile per build however many ask at once (`compile_once`), what a file
//!   must be to be loaded as a runner (`component_checks`), compiled components on disk,
//!   checksummed ([`component::disk_cache`]).
//! - `imports/`: what the host implements for runners, one file per interface with its
//!   state beside it: `bindings` (`bindgen!` output and conversions to
//!   [`crate::model::structs`]); `host_api`, the `caravan:runner/host` import, and
//!   `event_queue`, the events waiting for its `next-event`; `logging`, the `wasi:logging`
//!   import and guest stdout/stderr into tracing, and `last_words`, what a runner last wrote
//!   before it trapped; `wasi_ctx`, what each sandbox's WASI context holds (its directory,
//!   its grants).
//! - `sandbox/`: every limit and meter of one alloc: `store_limits` (memory, instances, the
//!   epoch tick), `cpu_meter` (the CPU budget, the guest's computing and the host's work for
//!   it), `disk_usage` (a directory measured against its quota), `disk_ledger` (each alloc
//!   directory's account), `wasi_quota` (the WASI calls that reserve in it before they
//!   write), `disk_watch` (the thread that looks at every alloc directory about once a
//!   second), `token_bucket` (the rate limits' arithmetic), `alloc_dir` (each alloc's
//!   directory made at start and removed at destroy).
//!
//! This facade keeps the [`Runtime`] (the engine, the linker, the cache of loaded builds)
//! and the per-alloc store's data (`StoreData`), and wires the rooms together.
//!
//! This module may use [`crate::allocrunner`], [`crate::alloc_logs`] (a writer handle per
//! alloc) and the leaves (`structs`, `units`, `locks`); it knows nothing of the client, the
//! server or the state store. On disk it touches only each alloc's directory (through the
//! guest's WASI calls, and read to check its quota), the read-only volumes granted, and its
//! own cache dir; alloc log files belong to [`crate::alloc_logs`].

pub mod component;
pub(crate) mod imports;
pub(crate) mod runner;
pub(crate) mod sandbox;
// The rooms' files by their own names, as this facade used them before they had rooms.
use component::{compile_once, disk_cache};
pub use imports::logging::GUEST_TARGET;
use imports::{host_api, logging};
pub use runner::wasm_runner::{
    MAX_QUEUED_TASK_ACTIONS, RunEnding, WasmAllocRunner, WasmAllocRunnerFactory,
};
pub use sandbox::store_limits::EPOCH_TICK;
use sandbox::{disk_ledger, disk_watch};

use crate::util::locks::LockUnpoisoned;
use component::component_checks::{
    check_component_header, check_runner_export, imports_filesystem,
};
use component::engine::{Instances, engine_config, spawn_epoch_ticker, warn_if_map_count_too_low};
use imports::bindings::{AllocRunnerPre, RUNNER_EXPORT};
use sandbox::cpu_meter::CpuMeter;
use sandbox::descriptors::{DescriptorBudget, HeldDescriptors};
use sandbox::store_limits::MemoryLimiter;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use wasmtime::Engine;
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

/// How the runtime allocates instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// Use the pooling allocator when its address space can be reserved, else on-demand.
    Auto,
    /// Always allocate on demand (slower to instantiate, no up-front reservation).
    Off,
}

/// Process-wide runtime settings.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// How many allocs may be live at once; sizes the pooling allocator.
    pub max_live_allocs: u32,
    /// Whether to try the pooling allocator.
    pub pooling: Pooling,
    /// Where compiled components are kept across restarts; `None` keeps them in memory only.
    pub cache_dir: Option<PathBuf>,
    /// How many host descriptors runners may hold together (`None`: no budget); an open past
    /// it fails in the guest, so the agent keeps descriptors of its own whatever runners do.
    pub guest_descriptors: Option<u64>,
}

impl RuntimeConfig {
    /// A node's runtime (the agent's, and each of nodesim's processes'): `max_live_allocs`
    /// sized into the pool, and compiled components kept in `cache_dir`, or by default
    /// under the node's data dir, so that a restart compiles nothing again.
    pub fn for_node(max_live_allocs: u32, cache_dir: Option<&Path>, data_dir: &Path) -> Self {
        RuntimeConfig {
            max_live_allocs,
            cache_dir: Some(cache_dir.map_or_else(|| data_dir.join("cache"), Path::to_path_buf)),
            ..RuntimeConfig::default()
        }
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            max_live_allocs: 1_000,
            pooling: Pooling::Auto,
            cache_dir: None,
            guest_descriptors: None,
        }
    }
}

/// Why a component could not be loaded. Each message names the file and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file does not exist.
    #[error("runner component {path} does not exist")]
    NotFound {
        /// The path given.
        path: PathBuf,
    },
    /// The file could not be read.
    #[error("cannot read runner component {path}: {source}")]
    Read {
        /// The path given.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The bytes are not a WebAssembly component.
    #[error("{path} is not a WebAssembly component: {reason}")]
    NotAComponent {
        /// The path given.
        path: PathBuf,
        /// What was found instead.
        reason: String,
    },
    /// The component failed validation or compilation, or needs more than one instance may
    /// hold (memories, tables, core instances: the sandbox's per-instance limits).
    #[error("{path} cannot be compiled for this host: {reason}")]
    Uncompilable {
        /// The path given.
        path: PathBuf,
        /// wasmtime's account of why.
        reason: String,
    },
    /// The component does not export the runner interface.
    #[error(
        "{path} does not export `{RUNNER_EXPORT}`, so it is not a Caravan runner; it exports: {exports}"
    )]
    MissingExport {
        /// The path given.
        path: PathBuf,
        /// What it exports, comma-separated, or "nothing".
        exports: String,
    },
    /// The component's imports or export types do not match what the host provides.
    #[error("{path} does not fit the `caravan:runner/alloc-runner` world: {reason}")]
    WrongWorld {
        /// The path given.
        path: PathBuf,
        /// wasmtime's account of the mismatch.
        reason: String,
    },
}

/// A compiled component, ready to instantiate.
pub struct LoadedComponent {
    /// Hex SHA-256 of the component's bytes.
    pub hash: String,
    /// Whether it was compiled now or read from the on-disk cache.
    pub origin: Origin,
    /// Whether it imports `wasi:filesystem`: only then is the alloc dir made, and opened
    /// with the granted volumes for its sandbox.
    pub imports_filesystem: bool,
    pre: AllocRunnerPre<StoreData>,
}

/// Where a loaded component's machine code came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Compiled by this process.
    Compiled,
    /// Read from the compiled-component cache on disk.
    DiskCache,
}

/// The process's wasmtime runtime. Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<RuntimeInner>,
}

struct RuntimeInner {
    engine: Engine,
    linker: Linker<StoreData>,
    pooling: bool,
    components: Mutex<HashMap<String, Arc<LoadedComponent>>>,
    disk_cache: Option<disk_cache::DiskCache>,
    instantiations: crate::util::histogram::Histogram,
    /// Which component a file held when last read, so starting the ten-thousandth alloc of a
    /// runner costs at most a `stat` (once per [`PATH_RECHECK`]), not a read and a hash.
    by_path: Mutex<HashMap<PathBuf, PathEntry>>,
    /// One gate per path being read and per component being compiled: the thousands of
    /// allocs of a new runner that start at once wait for the first to compile it (a CPU-
    /// second or more, and tens of MiB, each) instead of all compiling it side by side.
    /// An entry is as small and as many as `by_path`'s.
    reading: compile_once::Gates<PathBuf>,
    compiling: compile_once::Gates<String>,
    /// Components that failed to load, by hash, so that the other allocs of a bad runner
    /// fail at once rather than each compiling it again under the gate.
    failed: compile_once::FailedLoads,
    ticker_stop: Arc<AtomicBool>,
    disk_watcher: disk_watch::DiskWatcher,
    /// The host descriptors every runner together may hold.
    descriptors: Arc<DescriptorBudget>,
}

/// The SHA-256 (hex) of a component's bytes: the [`LoadedComponent::hash`] it loads as.
pub fn component_sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// The largest component file the runtime reads (Python and JavaScript runners are 12-20 MB).
pub const MAX_COMPONENT_BYTES: u64 = 256 * 1024 * 1024;

/// How long a path's stamp is trusted before the file is looked at again. A replaced runner
/// file is picked up by allocs started after this.
const PATH_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

struct PathEntry {
    stamp: FileStamp,
    checked_at: std::time::Instant,
    loaded: Arc<LoadedComponent>,
}

/// What identifies one version of a file without reading it.
#[derive(Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl Drop for RuntimeInner {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
    }
}

impl Runtime {
    /// Builds the engine, starts the epoch ticker and fills the linker.
    pub fn new(config: &RuntimeConfig) -> anyhow::Result<Runtime> {
        let pooled = match config.pooling {
            Pooling::Auto => {
                match Engine::new(&engine_config(config.max_live_allocs, Instances::Pooled)) {
                    Ok(engine) => Some(engine),
                    Err(error) => {
                        tracing::warn!(
                            error = %format!("{error:#}"),
                            "cannot reserve the pooling allocator's address space; allocating instances on demand"
                        );
                        None
                    }
                }
            }
            Pooling::Off => None,
        };
        let pooling = pooled.is_some();
        let engine = match pooled {
            Some(engine) => engine,
            None => Engine::new(&engine_config(config.max_live_allocs, Instances::OnDemand))
                .map_err(anyhow::Error::from)?,
        };

        let mut linker = Linker::<StoreData>::new(&engine);
        imports::add_to_linker(&mut linker)?;
        sandbox::add_to_linker(&mut linker)?;

        warn_if_map_count_too_low(config.max_live_allocs);
        let ticker_stop = Arc::new(AtomicBool::new(false));
        spawn_epoch_ticker(engine.clone(), ticker_stop.clone())?;
        let disk_watcher = disk_watch::DiskWatcher::start(ticker_stop.clone())?;

        let disk_cache = config
            .cache_dir
            .clone()
            .map(|dir| disk_cache::DiskCache::new(dir, &engine));
        Ok(Runtime {
            inner: Arc::new(RuntimeInner {
                disk_cache,
                engine,
                linker,
                pooling,
                components: Mutex::new(HashMap::new()),
                by_path: Mutex::new(HashMap::new()),
                reading: Default::default(),
                compiling: Default::default(),
                failed: Default::default(),
                instantiations: crate::util::histogram::Histogram::default(),
                ticker_stop,
                disk_watcher,
                descriptors: DescriptorBudget::new(config.guest_descriptors),
            }),
        })
    }

    /// How many host descriptors runners hold now, all together.
    pub fn descriptors_held(&self) -> u64 {
        self.inner.descriptors.held()
    }

    /// How long instantiating a runner took, per alloc.
    pub fn instantiation_latency(&self) -> &crate::util::histogram::Histogram {
        &self.inner.instantiations
    }

    /// True when instances come from the pooling allocator.
    pub fn uses_pooling(&self) -> bool {
        self.inner.pooling
    }

    /// The engine, for benchmarks that measure raw wasmtime next to Caravan.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// Loads the component at `path`, compiling it only the first time these bytes are seen.
    /// A file whose size and modification time are unchanged is not read again, and is
    /// looked at no more than once a second.
    pub fn load_file(&self, path: &Path) -> Result<Arc<LoadedComponent>, LoadError> {
        {
            let by_path = self.inner.by_path.lock_unpoisoned();
            if let Some(entry) = by_path.get(path)
                && entry.checked_at.elapsed() < PATH_RECHECK
            {
                return Ok(entry.loaded.clone());
            }
        }
        self.load_file_now(path)
    }

    /// As [`Runtime::load_file`], looking at the file now however recently it was looked at:
    /// for a job's registration and an upgrade, which ask for the build there is now.
    pub fn load_file_now(&self, path: &Path) -> Result<Arc<LoadedComponent>, LoadError> {
        let gate = self.inner.reading.gate(path);
        let _turn = gate.lock_unpoisoned();
        let io_error = |source: std::io::Error| match source.kind() {
            std::io::ErrorKind::NotFound => LoadError::NotFound {
                path: path.to_path_buf(),
            },
            _ => LoadError::Read {
                path: path.to_path_buf(),
                source,
            },
        };
        let metadata = std::fs::metadata(path).map_err(io_error)?;
        let stamp = FileStamp {
            len: metadata.len(),
            modified: metadata.modified().ok(),
        };
        let checked_at = std::time::Instant::now();
        {
            let mut by_path = self.inner.by_path.lock_unpoisoned();
            if let Some(entry) = by_path.get_mut(path)
                && entry.stamp == stamp
                && stamp.modified.is_some()
            {
                entry.checked_at = checked_at;
                return Ok(entry.loaded.clone());
            }
        }
        if !metadata.is_file() {
            return Err(LoadError::NotAComponent {
                path: path.to_path_buf(),
                reason: "it is not a regular file".into(),
            });
        }
        if metadata.len() > MAX_COMPONENT_BYTES {
            return Err(LoadError::NotAComponent {
                path: path.to_path_buf(),
                reason: format!(
                    "it is {} bytes, over the limit of {MAX_COMPONENT_BYTES}",
                    metadata.len()
                ),
            });
        }
        let bytes = std::fs::read(path).map_err(io_error)?;
        let loaded = self.load_bytes(path, &bytes)?;
        let mut by_path = self.inner.by_path.lock_unpoisoned();
        let entry = PathEntry {
            stamp,
            checked_at,
            loaded: loaded.clone(),
        };
        by_path.insert(path.to_path_buf(), entry);
        Ok(loaded)
    }

    /// Loads a component from bytes; `path` only names it in errors.
    pub fn load_bytes(&self, path: &Path, bytes: &[u8]) -> Result<Arc<LoadedComponent>, LoadError> {
        let hash = component_sha256(bytes);
        if let Some(loaded) = self.cached(&hash) {
            return Ok(loaded);
        }
        let gate = self.inner.compiling.gate(&hash);
        let _turn = gate.lock_unpoisoned();
        // Whoever held the gate before may have compiled it, or failed to.
        if let Some(loaded) = self.cached(&hash) {
            return Ok(loaded);
        }
        if let Some(error) = self.inner.failed.get(&hash, path) {
            return Err(error);
        }
        let loaded = self.compile(path, bytes, &hash);
        if let Err(error) = &loaded {
            self.inner.failed.insert(&hash, error);
        }
        loaded
    }

    /// Compiles `bytes` (or reads them from the disk cache) and checks they fit the world.
    fn compile(
        &self,
        path: &Path,
        bytes: &[u8],
        hash: &str,
    ) -> Result<Arc<LoadedComponent>, LoadError> {
        let hash = hash.to_string();
        check_component_header(path, bytes)?;
        let started = std::time::Instant::now();
        let disk_cache = self.inner.disk_cache.as_ref();
        let (component, origin) = match disk_cache.and_then(|c| c.load(&self.inner.engine, &hash)) {
            Some(component) => {
                // Said once per component and process: why a runner started without compiling.
                tracing::info!(
                    runner = %path.file_name().unwrap_or(path.as_os_str()).to_string_lossy(),
                    runner_sha256 = %crate::allocrunner::short_hash(&hash),
                    "loaded compiled runner from the cache"
                );
                (component, Origin::DiskCache)
            }
            None => {
                // A large runner (a Python one is tens of MB) takes seconds to compile: say so
                // before, and how long it took after, so a pending alloc is not a mystery.
                let name = path
                    .file_name()
                    .unwrap_or(path.as_os_str())
                    .to_string_lossy();
                tracing::info!(
                    runner = %name,
                    runner_sha256 = %crate::allocrunner::short_hash(&hash),
                    "compiling runner {name} ({})",
                    crate::util::units::format_bytes_approx(bytes.len() as u64)
                );
                let component = Component::new(&self.inner.engine, bytes).map_err(|error| {
                    LoadError::Uncompilable {
                        path: path.to_path_buf(),
                        reason: format!("{error:#}"),
                    }
                })?;
                tracing::info!(
                    runner = %name,
                    "compiled runner {name} in {:.1?}",
                    started.elapsed()
                );
                (component, Origin::Compiled)
            }
        };
        check_runner_export(path, &self.inner.engine, &component)?;
        let wrong_world = |error: wasmtime::Error| LoadError::WrongWorld {
            path: path.to_path_buf(),
            reason: format!("{error:#}"),
        };
        let instance_pre = self
            .inner
            .linker
            .instantiate_pre(&component)
            .map_err(wrong_world)?;
        let pre = AllocRunnerPre::new(instance_pre).map_err(wrong_world)?;
        // Only a component that fits the world is worth keeping.
        if let (Some(cache), Origin::Compiled) = (disk_cache, origin) {
            cache.store(&hash, &component);
        }
        tracing::debug!(
            path = %path.display(),
            hash = %hash,
            origin = ?origin,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "loaded runner component"
        );
        let loaded = Arc::new(LoadedComponent {
            hash: hash.clone(),
            origin,
            imports_filesystem: imports_filesystem(&self.inner.engine, &component),
            pre,
        });
        let mut components = self.inner.components.lock_unpoisoned();
        Ok(components.entry(hash).or_insert(loaded).clone())
    }

    fn cached(&self, hash: &str) -> Option<Arc<LoadedComponent>> {
        self.inner.components.lock_unpoisoned().get(hash).cloned()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Everything one alloc's store holds. Each host interface gets its own field and its own
/// `add_to_linker` projection, so no import sees another's state.
pub(crate) struct StoreData {
    wasi: WasiCtx,
    table: ResourceTable,
    host_api: host_api::HostApi,
    logging: logging::GuestLogging,
    memory: MemoryLimiter,
    cpu: CpuMeter,
    /// The limits the alloc runs under, for naming the one it hit (shared with its runner).
    limits: Arc<crate::model::structs::Limits>,
    /// The alloc directory's account, which the WASI layer reserves writes in.
    disk: Arc<disk_ledger::DiskLedger>,
    /// The host descriptors this store's guest holds, of the runtime's budget.
    descriptors: HeldDescriptors,
}

impl WasiView for StoreData {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}
