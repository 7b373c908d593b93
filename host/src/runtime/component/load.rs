//! Loading a runner: a file read (or not, when its stamp is unchanged), hashed, checked and
//! compiled once per build however many allocs ask at once, or its machine code read from
//! the disk cache; what a load failure says. The [`Runtime`] keeps what was loaded.

use crate::runner_store::RunnerStore;
use crate::runtime::component::component_checks::{
    check_component_header, check_runner_export, imports_filesystem,
};
use crate::runtime::imports::bindings::{AllocRunnerPre, RUNNER_EXPORT};
use crate::runtime::{Runtime, StoreData};
use crate::util::locks::LockUnpoisoned;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use wasmtime::component::Component;

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
    /// The build an alloc names is not loaded, not in this agent's runner store, and could
    /// not be fetched from another agent (the message names the build and who was asked).
    #[error("{reason}")]
    Unavailable {
        /// The runner as its job names it.
        path: PathBuf,
        /// Why, naming the build.
        reason: String,
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
    pub(in crate::runtime) pre: AllocRunnerPre<StoreData>,
}

/// Where a loaded component's machine code came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Compiled by this process.
    Compiled,
    /// Read from the compiled-component cache on disk.
    DiskCache,
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

pub(in crate::runtime) struct PathEntry {
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

impl Runtime {
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

    /// Loads the runner `alloc` names: with a runner store, the build the alloc names by
    /// hash ([`Runtime::load_build`]); without one (`caravan run`, `runner check`), or for an
    /// alloc saved before builds were named, the file at its path (looked at now when `fresh`:
    /// an upgrade asks for the build there is now). An alloc saved before this agent kept a
    /// store finds its build at its path once, and keeps it in the store from then on.
    pub fn load_for_alloc(
        &self,
        alloc: &crate::model::structs::Alloc,
        store: Option<&RunnerStore>,
        fresh: bool,
    ) -> Result<Arc<LoadedComponent>, LoadError> {
        let path = Path::new(&alloc.runner);
        let (Some(store), Some(sha256)) = (store, alloc.runner_sha256.as_deref()) else {
            return match fresh {
                true => self.load_file_now(path),
                false => self.load_file(path),
            };
        };
        match self.load_build(sha256, path, store) {
            Err(LoadError::Unavailable { .. })
                if path.is_absolute()
                    && store.put_file(path).is_ok_and(|found| found == sha256) =>
            {
                self.load_build(sha256, path, store)
            }
            loaded => loaded,
        }
    }

    /// Loads build `sha256` (hex): the one loaded already, or the runner store's copy, or
    /// one fetched from another agent into the store (see [`RunnerStore::get_or_fetch`]).
    /// `path` only names it in errors. Blocking: it may read, fetch and compile; a fetch needs
    /// a tokio runtime to be current (the blocking pool's threads have one).
    pub fn load_build(
        &self,
        sha256: &str,
        path: &Path,
        store: &RunnerStore,
    ) -> Result<Arc<LoadedComponent>, LoadError> {
        if let Some(loaded) = self.cached(sha256) {
            return Ok(loaded);
        }
        let unavailable = |reason: String| LoadError::Unavailable {
            path: path.to_path_buf(),
            reason,
        };
        let read = |store: &RunnerStore| {
            store.read(sha256).map_err(|error| {
                unavailable(format!("cannot read runner build sha256:{sha256}: {error}"))
            })
        };
        let bytes = match read(store)? {
            Some(bytes) => bytes,
            None => {
                let handle = tokio::runtime::Handle::try_current().map_err(|_| {
                    unavailable(format!(
                        "runner build sha256:{sha256} is not on this agent (and cannot be \
                         fetched outside the agent's runtime)"
                    ))
                })?;
                handle
                    .block_on(store.get_or_fetch(sha256, path.to_str()))
                    .map_err(|error| unavailable(error.to_string()))?;
                read(store)?.ok_or_else(|| {
                    unavailable(format!(
                        "runner build sha256:{sha256} was fetched, then gone"
                    ))
                })?
            }
        };
        let loaded = self.load_bytes(path, &bytes)?;
        if loaded.hash != sha256 {
            // The store names files by their hash when it writes them: this one changed on
            // disk since. It goes, so that the next start fetches a good copy.
            let _ = store.remove(sha256);
            return Err(unavailable(format!(
                "the runner store's copy of build sha256:{sha256} has changed on disk (its \
                 bytes are now sha256:{}); removed, to be fetched again",
                loaded.hash
            )));
        }
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

/// The runtime alone identifies a job's runner by its file (`caravan run`, `runner check`,
/// and a runtime given no store): it loads the file as it is now, compiling a build not seen
/// before. A build named by hash must have been loaded already.
impl crate::model::admission::RunnerIdentity for Runtime {
    fn identify(&self, path: &Path, sha256: Option<&str>) -> Result<String, String> {
        if let Some(sha256) = sha256 {
            return self.cached(sha256).map(|loaded| loaded.hash.clone()).ok_or_else(|| {
                format!("runner build sha256:{sha256} is not known here (this agent keeps no runner store)")
            });
        }
        self.load_file_now(path)
            .map(|loaded| loaded.hash.clone())
            .map_err(|error| error.to_string())
    }
}

/// An agent identifies a job's runner through its runtime and its runner store: a build named
/// by hash is loaded from the store (fetched from another agent when the store lacks it), and
/// a file is loaded as it is now and kept in the store, so that the job's allocs run these
/// bytes whatever becomes of the file.
pub struct StoredRunners {
    /// Loads and compiles.
    pub runtime: Runtime,
    /// Keeps the bytes.
    pub store: RunnerStore,
}

impl crate::model::admission::RunnerIdentity for StoredRunners {
    fn identify(&self, path: &Path, sha256: Option<&str>) -> Result<String, String> {
        let sha256 = match sha256 {
            // The agent that takes a job keeps its build, loaded or not: the cluster's other
            // agents fetch it from here.
            Some(sha256) if !self.store.has(sha256) => {
                let handle = tokio::runtime::Handle::try_current()
                    .map_err(|_| format!("runner build sha256:{sha256} is not on this agent"))?;
                handle
                    .block_on(self.store.get_or_fetch(sha256, path.to_str()))
                    .map_err(|error| error.to_string())?;
                sha256.to_string()
            }
            Some(sha256) => sha256.to_string(),
            None => {
                let loaded = self
                    .runtime
                    .load_file_now(path)
                    .map_err(|e| e.to_string())?;
                let kept = self.store.put_file(path).map_err(|error| {
                    format!(
                        "cannot keep runner {} in the runner store: {error}",
                        path.display()
                    )
                })?;
                if kept != loaded.hash {
                    return Err(format!(
                        "runner component {} changed while it was read; submit it again",
                        path.display()
                    ));
                }
                kept
            }
        };
        let loaded = self
            .runtime
            .load_build(&sha256, path, &self.store)
            .map_err(|error| error.to_string())?;
        self.store.touch(&sha256);
        Ok(loaded.hash.clone())
    }
}
