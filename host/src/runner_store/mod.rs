//! Runners by content: every agent keeps the runner components it was given or fetched in a
//! content-addressed store under its data dir (`runners/sha256/<hex>`), so that a job names
//! its build by SHA-256 and every node runs exactly those bytes, whatever happens to the file
//! it was submitted from.
//!
//! Invariants, each for the reason given:
//! - A build is in the store only under the SHA-256 of its bytes: bytes are written to a
//!   temporary file while they are hashed, and renamed into place only when the hash is the
//!   one asked for (and the file synced). A crash leaves a temporary file, removed at the next
//!   open, never a build under a wrong name; no alloc starts from bytes whose hash was not
//!   checked.
//! - Putting a build the store has is a no-op: uploads and fetches are idempotent.
//! - At most [`MAX_BUILD_BYTES`] per build, counted as bytes arrive: an upload over the cap is
//!   refused without being read to its end.
//! - A node that lacks a build fetches it from the cluster's other agents ([`fetch`]), one at
//!   a time in the order the agent's peer list gives (the leader first), and keeps it. One
//!   fetch per build at a time, however many allocs of it start together.
//! - A build's file's modification time is when it was last used (stored, loaded for an alloc,
//!   served to a peer): what [`gc`] reads to remove builds no job has used for a grace period.
//!
//! It knows files, SHA-256 and, for fetching, the agents' HTTP API through
//! [`crate::rpc::transport`]; it knows nothing of wasmtime, jobs or allocs (what references a
//! build is the caller's to say, see [`gc`]).

pub mod fetch;
pub mod gc;
pub mod oci;

use crate::util::locks::LockUnpoisoned;
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;
use tokio::io::AsyncWriteExt;

pub use fetch::{FetchError, PeerList, fixed_peers};

/// The largest runner component a store takes (Python and JavaScript runners are 12-20 MB):
/// the runtime's own cap on a component file.
pub const MAX_BUILD_BYTES: u64 = 256 * 1024 * 1024;

/// How a build is named in a job, an alloc and a URL: `sha256:` and 64 lowercase hex digits
/// in text, the digits alone in paths.
pub const SHA256_PREFIX: &str = "sha256:";

pub use crate::util::text::is_sha256_hex;

/// The SHA-256 (hex) of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// One build the store holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBuild {
    /// Its SHA-256, hex.
    pub sha256: String,
    /// Its size in bytes.
    pub size: u64,
    /// When it was last stored or used.
    pub last_used: SystemTime,
}

/// What putting a build did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    /// The bytes were checked and stored.
    Stored,
    /// The store had the build already; nothing was written.
    AlreadyHad,
}

/// Why a build was not stored. Each message says what was wrong with the bytes given.
#[derive(Debug, thiserror::Error)]
pub enum PutError {
    /// The name asked for is not a SHA-256.
    #[error("{0:?} is not a SHA-256: expected 64 lowercase hex digits")]
    BadName(String),
    /// More bytes than the store's cap ([`MAX_BUILD_BYTES`] unless a test lowered it).
    #[error("the runner is over the limit of {0} bytes")]
    TooLarge(u64),
    /// The bytes hash to another SHA-256 than the one asked for.
    #[error("the bytes received have SHA-256 {actual}, not the {expected} they were sent as")]
    Mismatch {
        /// The SHA-256 asked for.
        expected: String,
        /// The SHA-256 of the bytes received.
        actual: String,
    },
    /// The bytes do not start as a WebAssembly component does.
    #[error("the bytes are not a WebAssembly component (no component header)")]
    NotAComponent,
    /// The bytes stopped coming before their end.
    #[error("the upload broke off: {0}")]
    Interrupted(String),
    /// The store could not write.
    #[error("the runner store could not write: {0}")]
    Io(#[from] io::Error),
}

/// The content-addressed store of one agent. Cheap to clone.
#[derive(Clone)]
pub struct RunnerStore {
    inner: Arc<Inner>,
}

struct Inner {
    builds: PathBuf,
    max_build_bytes: u64,
    tmp: PathBuf,
    /// One fetch or put per build at a time: the second waits and then finds it stored.
    turns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Where a missing build is fetched from; none in the single-node mode.
    peers: Mutex<Option<fetch::Peers>>,
    /// How registries are reached, for builds whose alloc names a registry reference.
    registries: oci::Registries,
}

/// The first bytes of every WebAssembly component: the magic, and the component layer's
/// version (0x0d) and layer (1). A core module's layer is 0.
const COMPONENT_HEADER: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];

impl RunnerStore {
    /// Opens (or makes) the store under `data_dir` (`runners/`), removing what a put cut short
    /// by a crash left.
    pub fn open(data_dir: &Path) -> io::Result<RunnerStore> {
        let root = data_dir.join("runners");
        let builds = root.join("sha256");
        let tmp = root.join("tmp");
        std::fs::create_dir_all(&builds)?;
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        std::fs::create_dir_all(&tmp)?;
        Ok(RunnerStore {
            inner: Arc::new(Inner {
                builds,
                max_build_bytes: MAX_BUILD_BYTES,
                tmp,
                turns: Mutex::new(HashMap::new()),
                peers: Mutex::new(None),
                registries: oci::Registries::default(),
            }),
        })
    }

    /// The same store with a lower cap on a build's size than [`MAX_BUILD_BYTES`] (tests of
    /// the cap, which need not send 256 MiB). Call it before cloning the store.
    pub fn with_max_build_bytes(mut self, max: u64) -> RunnerStore {
        let inner = Arc::get_mut(&mut self.inner).expect("configured before it is cloned");
        inner.max_build_bytes = max.min(MAX_BUILD_BYTES);
        self
    }

    /// The same store reaching registries as `registries` says (which speak plain HTTP).
    /// Call it before cloning the store.
    pub fn with_registries(mut self, registries: oci::Registries) -> RunnerStore {
        let inner = Arc::get_mut(&mut self.inner).expect("configured before it is cloned");
        inner.registries = registries;
        self
    }

    /// How this store reaches registries.
    pub fn registries(&self) -> &oci::Registries {
        &self.inner.registries
    }

    /// The most bytes a build may have here.
    pub fn max_build_bytes(&self) -> u64 {
        self.inner.max_build_bytes
    }

    /// Where missing builds are fetched from from now on (cluster mode): `peers` lists the
    /// other agents' APIs, the leader first, dialled on `pool` (TLS in a TLS cluster), and
    /// `token` is sent to them.
    pub fn fetch_from(
        &self,
        peers: PeerList,
        token: Option<String>,
        pool: crate::rpc::transport::AgentPool,
    ) {
        *self.inner.peers.lock_unpoisoned() = Some(fetch::Peers::new(peers, token, pool));
    }

    /// The file of build `sha256`, if the store has it.
    pub fn path(&self, sha256: &str) -> Option<PathBuf> {
        if !is_sha256_hex(sha256) {
            return None;
        }
        let path = self.inner.builds.join(sha256);
        path.is_file().then_some(path)
    }

    /// Whether the store has build `sha256`.
    pub fn has(&self, sha256: &str) -> bool {
        self.path(sha256).is_some()
    }

    /// Every build the store holds, in no particular order. An entry that is not a build's
    /// (a stray file) is skipped.
    pub fn list(&self) -> io::Result<Vec<StoredBuild>> {
        let mut builds = Vec::new();
        for entry in std::fs::read_dir(&self.inner.builds)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !is_sha256_hex(&name) {
                continue;
            }
            let Ok(metadata) = entry.metadata() else {
                continue;
            };
            builds.push(StoredBuild {
                sha256: name,
                size: metadata.len(),
                last_used: metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            });
        }
        Ok(builds)
    }

    /// Marks build `sha256` used now, so the collector keeps it another grace period.
    pub fn touch(&self, sha256: &str) {
        if let Some(path) = self.path(sha256)
            && let Ok(file) = std::fs::File::options().append(true).open(&path)
        {
            let _ = file.set_modified(SystemTime::now());
        }
    }

    /// Removes build `sha256` if nothing has used it since `unused_since` and no put or fetch
    /// of it is under way (its turn is free); returns whether it was removed. What the
    /// collector calls: a build used (uploaded again, served, named by a job) between the
    /// collector's listing and now stays.
    pub fn remove_unused(&self, sha256: &str, unused_since: SystemTime) -> io::Result<bool> {
        let turn = self.turn(sha256);
        let Ok(_turn) = turn.try_lock() else {
            return Ok(false);
        };
        let Some(path) = self.path(sha256) else {
            return Ok(false);
        };
        let last_used = std::fs::metadata(&path)?.modified()?;
        if last_used > unused_since {
            return Ok(false);
        }
        std::fs::remove_file(path)?;
        Ok(true)
    }

    /// Removes build `sha256` (nothing when it is not there).
    pub fn remove(&self, sha256: &str) -> io::Result<()> {
        match self.path(sha256) {
            Some(path) => std::fs::remove_file(path),
            None => Ok(()),
        }
    }

    /// Reads build `sha256` whole, or `None` when the store lacks it. The bytes are not hashed
    /// again here: whoever compiles them hashes them (see [`crate::runtime`]'s loads by hash).
    pub fn read(&self, sha256: &str) -> io::Result<Option<Vec<u8>>> {
        match self.path(sha256) {
            None => Ok(None),
            Some(path) => match std::fs::read(path) {
                Ok(bytes) => Ok(Some(bytes)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e),
            },
        }
    }

    /// Stores the file at `path` (a runner on this agent's disk, named in a job), returning
    /// its SHA-256. Blocking: call it where blocking is allowed.
    pub fn put_file(&self, path: &Path) -> Result<String, PutError> {
        // Only a regular file, and not one over the cap: opening a FIFO (or a device a job
        // names) would block or read forever.
        let metadata = std::fs::metadata(path)?;
        if !metadata.is_file() {
            return Err(PutError::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            )));
        }
        if metadata.len() > self.inner.max_build_bytes {
            return Err(PutError::TooLarge(self.inner.max_build_bytes));
        }
        let mut file = std::fs::File::open(path)?;
        let (tmp, tmp_path) = self.temporary_file()?;
        let mut tmp = io::BufWriter::new(tmp);
        let mut hasher = Sha256::new();
        let mut buffer = vec![0u8; 64 * 1024];
        let mut total = 0u64;
        let mut head = Vec::with_capacity(COMPONENT_HEADER.len());
        let result = (|| {
            loop {
                let n = io::Read::read(&mut file, &mut buffer)?;
                if n == 0 {
                    break;
                }
                total += n as u64;
                if total > self.inner.max_build_bytes {
                    return Err(PutError::TooLarge(self.inner.max_build_bytes));
                }
                check_header(&mut head, &buffer[..n])?;
                hasher.update(&buffer[..n]);
                io::Write::write_all(&mut tmp, &buffer[..n])?;
            }
            if head.len() < COMPONENT_HEADER.len() {
                return Err(PutError::NotAComponent);
            }
            let tmp = tmp.into_inner().map_err(|e| e.into_error())?;
            tmp.sync_all()?;
            Ok(hex(&hasher.finalize()))
        })();
        let sha256 = match result {
            Ok(sha256) => sha256,
            Err(error) => {
                let _ = std::fs::remove_file(&tmp_path);
                return Err(error);
            }
        };
        self.settle(&tmp_path, &sha256)?;
        Ok(sha256)
    }

    /// Stores the bytes `body` yields as build `expected`: hashed as they arrive, refused past
    /// [`MAX_BUILD_BYTES`] without reading on, and kept only when their SHA-256 is `expected`.
    /// A build the store has is not read at all.
    pub async fn put_stream<S, E>(&self, expected: &str, body: S) -> Result<Put, PutError>
    where
        S: Stream<Item = Result<Bytes, E>>,
        E: std::fmt::Display,
    {
        if !is_sha256_hex(expected) {
            return Err(PutError::BadName(
                crate::util::text::cut(expected, 80).into_owned(),
            ));
        }
        let turn = self.turn(expected);
        let _turn = turn.lock().await;
        if self.has(expected) {
            self.touch(expected);
            return Ok(Put::AlreadyHad);
        }
        self.write_build(expected, body).await?;
        Ok(Put::Stored)
    }

    /// Writes the bytes `body` yields as build `expected` once they are checked; the caller
    /// holds the build's turn.
    async fn write_build<S, E>(&self, expected: &str, body: S) -> Result<(), PutError>
    where
        S: Stream<Item = Result<Bytes, E>>,
        E: std::fmt::Display,
    {
        let (file, tmp_path) = self.temporary_file()?;
        let file = tokio::fs::File::from_std(file);
        let result = write_checked(file, body, expected, self.inner.max_build_bytes).await;
        if let Err(error) = result {
            let _ = tokio::fs::remove_file(&tmp_path).await;
            return Err(error);
        }
        self.settle(&tmp_path, expected)?;
        Ok(())
    }

    /// Build `sha256`'s file: the store's, or when it lacks it, pulled from the registry
    /// `origin` names (when it is an `oci://` reference), else fetched from a peer (see
    /// [`fetch`]). The error names every source tried.
    pub async fn get_or_fetch(
        &self,
        sha256: &str,
        origin: Option<&str>,
    ) -> Result<PathBuf, FetchError> {
        if let Some(path) = self.path(sha256) {
            return Ok(path);
        }
        let turn = self.turn(sha256);
        let _turn = turn.lock().await;
        // Whoever held the turn before may have fetched it.
        if let Some(path) = self.path(sha256) {
            return Ok(path);
        }
        let mut tried = Vec::new();
        if let Some(reference) = origin.filter(|r| oci::is_oci(r)) {
            let pull = self.inner.registries.pull_into(self, reference, sha256);
            let pulled = tokio::time::timeout(fetch::TRANSFER_TIMEOUT, pull)
                .await
                .unwrap_or_else(|_| {
                    Err(oci::RegistryError {
                        reference: reference.to_string(),
                        why: format!(
                            "the registry did not send it within {}s",
                            fetch::TRANSFER_TIMEOUT.as_secs()
                        ),
                    })
                });
            match pulled {
                Ok(()) => {
                    tracing::info!(
                        runner_sha256 = %&sha256[..12],
                        from = %reference,
                        "pulled runner build from its registry"
                    );
                    if let Some(path) = self.path(sha256) {
                        return Ok(path);
                    }
                }
                Err(error) => tried.push(("its registry".to_string(), error.to_string())),
            }
        }
        let peers = self.inner.peers.lock_unpoisoned().clone();
        match peers {
            Some(peers) => peers.fetch(self, sha256, tried).await,
            None => Err(FetchError {
                sha256: sha256.to_string(),
                tried,
            }),
        }
    }

    fn turn(&self, sha256: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut turns = self.inner.turns.lock_unpoisoned();
        // Turns of builds nobody waits for are dropped as new ones are made: the map stays
        // as small as the builds being stored at once.
        turns.retain(|_, turn| Arc::strong_count(turn) > 1);
        turns.entry(sha256.to_string()).or_default().clone()
    }

    fn temporary_file(&self) -> io::Result<(std::fs::File, PathBuf)> {
        let path = self
            .inner
            .tmp
            .join(format!("put-{}", uuid::Uuid::new_v4().simple()));
        let file = std::fs::File::create_new(&path)?;
        Ok((file, path))
    }

    /// Moves a checked temporary file into place as build `sha256`.
    fn settle(&self, tmp_path: &Path, sha256: &str) -> io::Result<()> {
        let result = std::fs::rename(tmp_path, self.inner.builds.join(sha256));
        if result.is_err() {
            let _ = std::fs::remove_file(tmp_path);
        }
        result?;
        // The rename is durable once the directory is.
        if let Ok(dir) = std::fs::File::open(&self.inner.builds) {
            let _ = dir.sync_all();
        }
        Ok(())
    }
}

/// Writes what `body` yields to `file`, hashing and counting it, and checks it is build
/// `expected`.
async fn write_checked<S, E>(
    mut file: tokio::fs::File,
    body: S,
    expected: &str,
    max_bytes: u64,
) -> Result<(), PutError>
where
    S: Stream<Item = Result<Bytes, E>>,
    E: std::fmt::Display,
{
    let mut body = std::pin::pin!(body);
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    let mut head = Vec::with_capacity(COMPONENT_HEADER.len());
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| PutError::Interrupted(e.to_string()))?;
        total += chunk.len() as u64;
        if total > max_bytes {
            return Err(PutError::TooLarge(max_bytes));
        }
        check_header(&mut head, &chunk)?;
        hasher.update(&chunk);
        file.write_all(&chunk).await?;
    }
    if head.len() < COMPONENT_HEADER.len() {
        return Err(PutError::NotAComponent);
    }
    let actual = hex(&hasher.finalize());
    if actual != expected {
        return Err(PutError::Mismatch {
            expected: expected.to_string(),
            actual,
        });
    }
    file.flush().await?;
    file.sync_all().await?;
    Ok(())
}

/// Adds the start of `chunk` to `head` until it holds the header's length, and refuses bytes
/// that do not start as a component.
fn check_header(head: &mut Vec<u8>, chunk: &[u8]) -> Result<(), PutError> {
    if head.len() < COMPONENT_HEADER.len() {
        let wanted = COMPONENT_HEADER.len() - head.len();
        head.extend_from_slice(&chunk[..wanted.min(chunk.len())]);
        if !COMPONENT_HEADER.starts_with(head) {
            return Err(PutError::NotAComponent);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
