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
//! - [`component`]: loading runners (`load`: a file read, hashed, checked and compiled
//!   once, or read from the cache, and what a failure says); the engine's configuration and
//!   the epoch ticker
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
//!   it), `descriptors` (the host descriptors all runners hold, against one budget),
//!   `disk_usage` (a directory measured against its quota), `disk_ledger` (each alloc
//!   directory's account), `wasi_quota` (the WASI calls that reserve in it before they
//!   write), `disk_watch` (the thread that looks at every alloc directory about once a
//!   second), `token_bucket` (the rate limits' arithmetic), `alloc_dir` (each alloc's
//!   directory made at start and removed at destroy).
//!
//! This facade keeps the [`Runtime`] (the engine, the linker, the loaded builds), its
//! configuration and the per-alloc store's data (`StoreData`), and wires the rooms together
//! (`imports::add_to_linker`, `sandbox::add_to_linker`, `sandbox::install`).
//!
//! This module may use [`crate::allocrunner`], [`crate::alloc_logs`] (a writer handle per
//! alloc), [`crate::runner_store`] (builds by hash, see `component::load`), [`crate::model`]
//! and [`crate::util`]; it knows nothing of the client, the server or the state store. On disk it touches only each alloc's directory (through the
//! guest's WASI calls, and read to check its quota), the read-only volumes granted, and its
//! own cache dir; alloc log files belong to [`crate::alloc_logs`].

pub mod component;
pub(crate) mod imports;
pub(crate) mod runner;
pub(crate) mod sandbox;
// The rooms' files by their own names, as this facade used them before they had rooms.
use component::load::PathEntry;
pub use component::load::{
    LoadError, LoadedComponent, MAX_COMPONENT_BYTES, Origin, StoredRunners, component_sha256,
};
use component::{compile_once, disk_cache};
pub use imports::logging::GUEST_TARGET;
use imports::{host_api, logging};
pub use runner::wasm_runner::{
    MAX_QUEUED_TASK_ACTIONS, RunEnding, WasmAllocRunner, WasmAllocRunnerFactory,
};
pub use sandbox::store_limits::EPOCH_TICK;
use sandbox::{disk_ledger, disk_watch};

use component::engine::{Instances, engine_config, spawn_epoch_ticker, warn_if_map_count_too_low};
use sandbox::cpu_meter::CpuMeter;
use sandbox::descriptors::{DescriptorBudget, HeldDescriptors};
use sandbox::store_limits::MemoryLimiter;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use wasmtime::Engine;
use wasmtime::component::{Linker, ResourceTable};
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
    /// How many bytes of compiled code `cache_dir` may hold before the least recently used
    /// entries are removed ([`disk_cache::DEFAULT_MAX_BYTES`] unless a test wants less).
    pub cache_max_bytes: u64,
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
            cache_max_bytes: disk_cache::DEFAULT_MAX_BYTES,
            guest_descriptors: None,
        }
    }
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
            .map(|dir| disk_cache::DiskCache::new(dir, &engine, config.cache_max_bytes));
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
