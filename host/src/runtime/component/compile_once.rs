//! Loading a component once however many allocs of it start together: a gate (a mutex) per
//! path being read and per component being compiled, and the errors of components that
//! failed, kept by hash. Without them, 10,000 allocs of a new runner arriving at once each
//! compiled it side by side on every blocking thread (a CPU-second and tens of MiB each);
//! with the gates but no kept errors, a bad runner was compiled 10,000 times in a row.
//! Plain maps and mutexes: it knows nothing of wasmtime.

use crate::runtime::LoadError;
use crate::util::locks::LockUnpoisoned;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The most failed components remembered; past it the memory starts over (a bad runner is
/// then compiled once more).
const MAX_FAILED: usize = 1024;

/// A mutex per key, made on first use: work on one key is done by one thread at a time. An
/// entry is as small, and as many, as the runtime's per-path cache entries.
pub(in crate::runtime) struct Gates<K> {
    gates: Mutex<HashMap<K, Arc<Mutex<()>>>>,
}

impl<K> Default for Gates<K> {
    fn default() -> Self {
        Gates {
            gates: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: std::hash::Hash + Eq + Clone> Gates<K> {
    /// The gate of `key`; lock it for a turn.
    pub(in crate::runtime) fn gate<Q>(&self, key: &Q) -> Arc<Mutex<()>>
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut gates = self.gates.lock_unpoisoned();
        if let Some(gate) = gates.get(key) {
            return gate.clone();
        }
        let gate = Arc::new(Mutex::new(()));
        gates.insert(key.to_owned(), gate.clone());
        gate
    }
}

/// Why each component hash failed to load, kept whole but for the path, which is the asking
/// alloc's own.
#[derive(Default)]
pub(in crate::runtime) struct FailedLoads {
    failed: Mutex<HashMap<String, LoadError>>,
}

impl FailedLoads {
    /// The error `hash` failed with, worded for `path`.
    pub(in crate::runtime) fn get(&self, hash: &str, path: &Path) -> Option<LoadError> {
        let failed = self.failed.lock_unpoisoned();
        failed.get(hash).map(|error| error.for_path(path))
    }

    /// Remembers that `hash` failed with `error`.
    pub(in crate::runtime) fn insert(&self, hash: &str, error: &LoadError) {
        let mut failed = self.failed.lock_unpoisoned();
        if failed.len() >= MAX_FAILED {
            failed.clear();
        }
        failed.insert(hash.to_string(), error.for_path(Path::new("")));
    }
}

impl LoadError {
    /// The same error, naming `path`.
    fn for_path(&self, path: &Path) -> LoadError {
        let path = path.to_path_buf();
        match self {
            LoadError::NotFound { .. } => LoadError::NotFound { path },
            LoadError::Read { source, .. } => LoadError::Read {
                path,
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            LoadError::NotAComponent { reason, .. } => LoadError::NotAComponent {
                path,
                reason: reason.clone(),
            },
            LoadError::Uncompilable { reason, .. } => LoadError::Uncompilable {
                path,
                reason: reason.clone(),
            },
            LoadError::MissingExport { exports, .. } => LoadError::MissingExport {
                path,
                exports: exports.clone(),
            },
            LoadError::WrongWorld { reason, .. } => LoadError::WrongWorld {
                path,
                reason: reason.clone(),
            },
            LoadError::Unavailable { reason, .. } => LoadError::Unavailable {
                path,
                reason: reason.clone(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn a_kept_failure_names_the_path_of_whoever_asks() {
        let failures = FailedLoads::default();
        let error = LoadError::WrongWorld {
            path: PathBuf::from("/first/r.wasm"),
            reason: "no host".into(),
        };
        failures.insert("abc", &error);
        let again = failures.get("abc", Path::new("/second/r.wasm")).unwrap();
        assert_eq!(
            again.to_string(),
            "/second/r.wasm does not fit the `caravan:runner/alloc-runner` world: no host"
        );
        assert!(failures.get("other", Path::new("x")).is_none());
    }
}
