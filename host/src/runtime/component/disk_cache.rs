//! Compiled components on disk, so a restart (or a second agent on the same data dir) does
//! not compile a runner again: seconds saved per Python or JavaScript runner.
//!
//! One file per (component, engine) pair, named by the component's SHA-256 and the engine's
//! compatibility hash, so a wasmtime upgrade or a different setting never picks up code
//! compiled for another engine. Each file ends with the SHA-256 of what precedes it; an entry
//! whose digest does not match, or that wasmtime refuses, is recompiled and rewritten, never
//! run. Entries are written to a temporary file and renamed, so a crash leaves either the old
//! entry or the new one.
//!
//! The directory is bounded: every runner build, and every wasmtime build, leaves an entry
//! (a Python runner's is 36 MiB), so after each write the least recently used entries are
//! removed until the rest fit the budget, as wasmtime's own cache does. Loading an entry
//! marks it used (its modification time), so what a node runs stays.
//!
//! What this may not touch: anything outside its directory.

use sha2::{Digest, Sha256};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use wasmtime::Engine;
use wasmtime::component::Component;

const DIGEST_BYTES: usize = 32;

/// How much compiled code a cache directory keeps: 1 GiB, wasmtime's own cache's default,
/// holds some 28 Python runners or hundreds of Rust ones.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

/// What an entry's temporary file is called until it is renamed into place.
const PARTIAL_PREFIX: &str = ".partial-";

/// A temporary file this old belongs to a write that will never finish (its process died):
/// no compile takes an hour.
const ABANDONED_AFTER: Duration = Duration::from_secs(60 * 60);

/// The cache the agent, `caravan run`, `caravan runner check` and `caravan nodesim` share
/// when not given one (`--cache-dir`, `CARAVAN_CACHE_DIR`): `$XDG_CACHE_HOME/caravan/components`,
/// else `$HOME/.cache/caravan/components`, as the XDG base directories say; `None` when
/// neither variable holds an absolute path. A runner compiled once, by any of them, starts
/// from the cache in all the others.
pub fn shared_dir() -> Option<PathBuf> {
    let absolute = |name: &str| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .filter(|path| path.is_absolute())
    };
    let base =
        absolute("XDG_CACHE_HOME").or_else(|| absolute("HOME").map(|home| home.join(".cache")))?;
    Some(base.join("caravan").join("components"))
}

/// The compiled-component cache under one directory.
pub struct DiskCache {
    dir: PathBuf,
    engine_hash: String,
    max_bytes: u64,
}

impl DiskCache {
    /// A cache in `dir` for `engine`'s compiled code, holding at most `max_bytes` of entries
    /// (but always the last one written). The directory is created on first write.
    pub fn new(dir: PathBuf, engine: &Engine, max_bytes: u64) -> Self {
        // Stable for one build of the host, which is all a cache key needs: another build
        // at worst misses and recompiles.
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        DiskCache {
            dir,
            engine_hash: format!("{:016x}", hasher.finish()),
            max_bytes,
        }
    }

    /// Where the entry for the component with hex SHA-256 `component_hash` lives.
    pub fn entry_path(&self, component_hash: &str) -> PathBuf {
        self.dir
            .join(format!("{component_hash}-{}.cwasm", self.engine_hash))
    }

    /// The cached compilation of `component_hash`, if a sound one is on disk. A damaged entry
    /// is reported (WARN) and treated as missing.
    pub fn load(&self, engine: &Engine, component_hash: &str) -> Option<Component> {
        let path = self.entry_path(component_hash);
        let (file, bytes) = match self.read_trusted(&path) {
            Ok(Some(read)) => read,
            Ok(None) => return None,
            Err(Unusable::Damaged(reason)) => {
                warn_damaged(&path, &reason);
                return None;
            }
            Err(Unusable::Untrusted(reason)) => {
                tracing::warn!(path = %path.display(), reason, "ignoring a compiled-component cache entry someone else could have written; compiling again");
                return None;
            }
        };
        let Some(split) = bytes.len().checked_sub(DIGEST_BYTES) else {
            warn_damaged(&path, "too short");
            return None;
        };
        let (code, digest) = bytes.split_at(split);
        if Sha256::digest(code).as_slice() != digest {
            warn_damaged(&path, "its checksum does not match");
            return None;
        }
        // SAFETY: `Component::deserialize` runs the machine code in `code` when the component
        // is instantiated, so the bytes must be what `Component::serialize` wrote for this
        // engine. They are: the file and its directory belong to this process's user and no
        // one else may write them (checked on the open file in `read_trusted`), its name
        // carries this engine's compatibility hash, and its SHA-256 trailer matched above, so
        // a torn or corrupted write is never deserialized. wasmtime also checks its own
        // header and version before loading.
        #[allow(unsafe_code)]
        let loaded = unsafe { Component::deserialize(engine, code) };
        match loaded {
            Ok(component) => {
                // Used now: the last entries the budget removes. Failing to say so only makes
                // it an earlier candidate.
                if let Err(error) = file.set_modified(SystemTime::now()) {
                    tracing::debug!(path = %path.display(), %error, "cannot mark a compiled-component cache entry as used");
                }
                Some(component)
            }
            Err(error) => {
                warn_damaged(&path, &format!("wasmtime refused it: {error:#}"));
                None
            }
        }
    }

    /// The entry, open, and its bytes; `None` when there is none, or why it may not be
    /// trusted: code to run must come from a file only this user could have written, in a
    /// directory only this user may change (a cache under a shared or foreign home is someone
    /// else's code).
    fn read_trusted(&self, path: &Path) -> Result<Option<(std::fs::File, Vec<u8>)>, Unusable> {
        use std::io::Read;
        use std::os::unix::fs::MetadataExt;
        let mut file = match std::fs::File::open(path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(Unusable::Damaged(format!("cannot read it: {error}"))),
        };
        let user = rustix::process::geteuid().as_raw();
        let only_ours = |what: &str, metadata: std::io::Result<std::fs::Metadata>| {
            let metadata = metadata
                .map_err(|e| Unusable::Damaged(format!("cannot look at its {what}: {e}")))?;
            if metadata.uid() != user || metadata.mode() & 0o022 != 0 {
                return Err(Unusable::Untrusted(format!(
                    "its {what} belongs to another user or others may write it (uid {}, mode {:o})",
                    metadata.uid(),
                    metadata.mode() & 0o7777
                )));
            }
            Ok(())
        };
        only_ours("directory", std::fs::metadata(&self.dir))?;
        only_ours("file", file.metadata())?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(|e| Unusable::Damaged(format!("cannot read it: {e}")))?;
        Ok(Some((file, bytes)))
    }

    /// Saves `component`'s compiled code; failures are logged and otherwise ignored (the
    /// next start compiles again).
    pub fn store(&self, component_hash: &str, component: &Component) {
        if let Err(error) = self.try_store(component_hash, component) {
            tracing::warn!(dir = %self.dir.display(), error = %error, "cannot save the compiled runner component");
        }
    }

    fn try_store(&self, component_hash: &str, component: &Component) -> anyhow::Result<()> {
        let mut bytes = component.serialize().map_err(anyhow::Error::from)?;
        let digest = Sha256::digest(&bytes);
        bytes.extend_from_slice(&digest);
        // Only this user may write where code is loaded from (see `read_trusted`): made so, or
        // made so again when an older Caravan (or a umask of 002) left it open to a group.
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(&self.dir)?;
        close_to_others(&self.dir)?;
        let mut temporary = tempfile::Builder::new()
            .prefix(PARTIAL_PREFIX)
            .tempfile_in(&self.dir)?;
        std::io::Write::write_all(&mut temporary, &bytes)?;
        let entry = self.entry_path(component_hash);
        temporary.persist(&entry)?;
        self.keep_within_budget(&entry)
            .map_err(|error| anyhow::anyhow!("cannot keep the cache within its budget: {error}"))
    }

    /// Removes the least recently used entries until the directory's entries fit
    /// `max_bytes`, never `just_written`, and the temporary files of writes that died.
    /// Entries of other wasmtime builds count like any other, and, no longer used, go first.
    /// Another process sharing the directory may be doing the same: an entry already gone is
    /// not an error, and one it is loading stays readable until it closes it.
    fn keep_within_budget(&self, just_written: &Path) -> std::io::Result<()> {
        let now = SystemTime::now();
        let mut total = 0u64;
        let mut candidates = Vec::new();
        for item in std::fs::read_dir(&self.dir)? {
            let item = item?;
            let Ok(metadata) = item.metadata() else {
                continue; // removed meanwhile
            };
            if !metadata.is_file() {
                continue;
            }
            let path = item.path();
            let used = metadata.modified()?;
            if item
                .file_name()
                .to_string_lossy()
                .starts_with(PARTIAL_PREFIX)
            {
                let age = now.duration_since(used).unwrap_or_default();
                if age > ABANDONED_AFTER {
                    remove_if_present(&path)?;
                }
            } else if path
                .extension()
                .is_some_and(|extension| extension == "cwasm")
            {
                total += metadata.len();
                if path != just_written {
                    candidates.push((used, path, metadata.len()));
                }
            }
        }
        if total <= self.max_bytes {
            return Ok(());
        }
        candidates.sort();
        let (mut removed, mut freed) = (0usize, 0u64);
        for (_, path, bytes) in candidates {
            if total <= self.max_bytes {
                break;
            }
            remove_if_present(&path)?;
            total -= bytes;
            removed += 1;
            freed += bytes;
        }
        tracing::info!(
            dir = %self.dir.display(),
            removed,
            freed_mib = freed / (1 << 20),
            kept_mib = total / (1 << 20),
            budget_mib = self.max_bytes / (1 << 20),
            "removed the least recently used compiled runners from the cache"
        );
        Ok(())
    }
}

fn remove_if_present(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

/// Why an entry is not loaded.
enum Unusable {
    /// It cannot be read, or is not what was written.
    Damaged(String),
    /// Someone other than this user could have written it.
    Untrusted(String),
}

/// Takes write access to `dir` from its group and others, if this user owns it.
fn close_to_others(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let metadata = std::fs::metadata(dir)?;
    if metadata.uid() == rustix::process::geteuid().as_raw() && metadata.mode() & 0o022 != 0 {
        let mode = metadata.mode() & 0o7777 & !0o022;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

fn warn_damaged(path: &Path, reason: &str) {
    tracing::warn!(path = %path.display(), reason, "ignoring damaged compiled-component cache entry; compiling again");
}
