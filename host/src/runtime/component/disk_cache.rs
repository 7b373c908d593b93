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
//! What this may not touch: anything outside its directory.

use sha2::{Digest, Sha256};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use wasmtime::Engine;
use wasmtime::component::Component;

const DIGEST_BYTES: usize = 32;

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
}

impl DiskCache {
    /// A cache in `dir` for `engine`'s compiled code. The directory is created on first write.
    pub fn new(dir: PathBuf, engine: &Engine) -> Self {
        // Stable for one build of the host, which is all a cache key needs: another build
        // at worst misses and recompiles.
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        DiskCache {
            dir,
            engine_hash: format!("{:016x}", hasher.finish()),
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
        let bytes = match self.read_trusted(&path) {
            Ok(Some(bytes)) => bytes,
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
            Ok(component) => Some(component),
            Err(error) => {
                warn_damaged(&path, &format!("wasmtime refused it: {error:#}"));
                None
            }
        }
    }

    /// The entry's bytes, `None` when there is none, or why it may not be trusted: code to
    /// run must come from a file only this user could have written, in a directory only this
    /// user may change (a cache under a shared or foreign home is someone else's code).
    fn read_trusted(&self, path: &Path) -> Result<Option<Vec<u8>>, Unusable> {
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
        Ok(Some(bytes))
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
        let mut temporary = tempfile::NamedTempFile::new_in(&self.dir)?;
        std::io::Write::write_all(&mut temporary, &bytes)?;
        temporary.persist(self.entry_path(component_hash))?;
        Ok(())
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
