//! An alloc's directory, read for its operator (`caravan alloc fs`, `/v1/client/fs/...`), as
//! Nomad's `alloc fs` reads one: list a directory, print a file.
//!
//! Everything in an alloc dir was made by its guest, so every path is confined to the dir
//! by the kernel: each lookup is one `openat2` beneath the dir (`RESOLVE_BENEATH`), which
//! refuses absolute symbolic links and links that lead out, while links that stay inside are
//! followed; a `..` in the path itself is refused before any lookup. A path is the alloc dir's own (`out/result.json`) or the
//! runner's view of it (`/alloc/out/result.json`); any other absolute path is refused. Only
//! regular files and directories are read; listings and files are bounded.
//!
//! A leaf: it reads files and knows nothing of allocs, HTTP or the client.

use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use std::io::Read;
use std::path::Path;

/// The largest file [`read`] returns.
pub const READ_MAX_BYTES: u64 = 16 << 20;
/// The most entries [`stat`] lists of one directory: the first the directory gives, in its
/// own order (then sorted); the rest are counted, not listed.
pub const LIST_MAX_ENTRIES: usize = 10_000;
/// Where a runner sees its alloc dir.
pub const GUEST_MOUNT: &str = "/alloc";

/// Why a path cannot be read. Each `path` is the path as it was asked.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs)] // Each variant's message says what it is.
pub enum FsError {
    #[error(
        "{path:?} is outside the alloc dir: paths are relative to it, or start with {GUEST_MOUNT}/ as its runner sees it, and links are not followed out of it"
    )]
    Outside { path: String },
    #[error("{path:?} does not exist in the alloc dir")]
    NotFound { path: String },
    #[error(
        "the alloc has no directory now (not started here, collected, or its runner reaches no files: it imports no wasi:filesystem)"
    )]
    NoAllocDir,
    #[error("{path:?} is a directory: list it instead")]
    IsADirectory { path: String },
    #[error("{path:?} is neither a file nor a directory")]
    NotAFile { path: String },
    #[error("{path:?} goes through too many symbolic links (a loop?)")]
    LinkLoop { path: String },
    #[error("{path:?} is not a path (it holds a NUL byte)")]
    NotAPath { path: String },
    #[error("{path:?} is {size} bytes; alloc fs prints files of at most {READ_MAX_BYTES} bytes")]
    TooLarge { path: String, size: u64 },
    #[error("cannot read {path:?}: {error}")]
    Io { path: String, error: std::io::Error },
}

/// One directory entry, as listed: its name (control characters left for the printer to
/// escape), kind, size and modification time. Links are shown, not followed.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Entry {
    /// The name, as the guest made it.
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: &'static str,
    /// Bytes (a link's: its target's length).
    pub size: u64,
    /// Last modified, in milliseconds since the Unix epoch.
    pub modified_unix_ms: i64,
}

/// What a path is: a file with its size, or a directory with its entries.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Stat {
    /// The path as asked.
    pub path: String,
    /// `file` or `dir`.
    pub kind: &'static str,
    /// Bytes.
    pub size: u64,
    /// A directory's entries, sorted by name: the first [`LIST_MAX_ENTRIES`] the directory
    /// gives.
    pub entries: Vec<Entry>,
    /// Entries beyond [`LIST_MAX_ENTRIES`], not listed.
    pub entries_not_listed: usize,
}

/// `path` relative to the alloc dir (`.` for the dir itself), or why it cannot be.
fn relative(path: &str) -> Result<&str, FsError> {
    let outside = || FsError::Outside {
        path: path.to_string(),
    };
    let inside = match path.strip_prefix(GUEST_MOUNT) {
        Some("") => "",
        Some(rest) => rest.strip_prefix('/').ok_or_else(outside)?,
        None if path.starts_with('/') => return Err(outside()),
        None => path,
    };
    // Said here in words; the kernel would refuse it too, as a link leading out.
    if inside.split('/').any(|part| part == "..") {
        return Err(outside());
    }
    let inside = inside.trim_end_matches('/');
    Ok(if inside.is_empty() { "." } else { inside })
}

/// Opens `path` beneath `alloc_dir`, following only links that stay beneath it.
fn open_beneath(alloc_dir: &Path, path: &str) -> Result<OwnedFd, FsError> {
    let relative = relative(path)?;
    let flags = OFlags::RDONLY | OFlags::CLOEXEC;
    let root = match rustix::fs::open(alloc_dir, flags | OFlags::DIRECTORY, Mode::empty()) {
        Ok(root) => root,
        Err(Errno::NOENT) => return Err(FsError::NoAllocDir),
        Err(error) => return Err(io_error(path, error)),
    };
    // NONBLOCK: opening a FIFO a guest could not make, but another process could, must not
    // hang the agent.
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
    let path = path.to_string();
    let mut attempts = 0;
    loop {
        let opened = rustix::fs::openat2(
            &root,
            relative,
            flags | OFlags::NONBLOCK,
            Mode::empty(),
            resolve,
        );
        return match opened {
            Ok(fd) => Ok(fd),
            // A link leading out, or an absolute one.
            Err(Errno::XDEV) => Err(FsError::Outside { path }),
            Err(Errno::LOOP) => Err(FsError::LinkLoop { path }),
            Err(Errno::NOENT | Errno::NOTDIR) => Err(FsError::NotFound { path }),
            Err(Errno::INVAL) if relative.contains('\0') => Err(FsError::NotAPath { path }),
            // The kernel saw a rename while resolving and asks for another try.
            Err(Errno::AGAIN) if attempts < 3 => {
                attempts += 1;
                continue;
            }
            Err(error) => Err(io_error(&path, error)),
        };
    }
}

fn io_error(path: &str, error: Errno) -> FsError {
    FsError::Io {
        path: path.to_string(),
        error: error.into(),
    }
}

fn kind_name(file_type: FileType) -> &'static str {
    match file_type {
        FileType::RegularFile => "file",
        FileType::Directory => "dir",
        FileType::Symlink => "symlink",
        _ => "other",
    }
}

// The stat fields' integer types differ from one target to another.
#[allow(clippy::unnecessary_cast)]
fn unix_ms(stat: &rustix::fs::Stat) -> i64 {
    (stat.st_mtime as i64).saturating_mul(1000) + stat.st_mtime_nsec as i64 / 1_000_000
}

/// What `path` is in `alloc_dir`: a file's size, or a directory's entries.
pub fn stat(alloc_dir: &Path, path: &str) -> Result<Stat, FsError> {
    let fd = open_beneath(alloc_dir, path)?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| io_error(path, e))?;
    let kind = kind_name(FileType::from_raw_mode(stat.st_mode));
    let mut answer = Stat {
        path: path.to_string(),
        kind,
        size: stat.st_size as u64,
        entries: Vec::new(),
        entries_not_listed: 0,
    };
    match kind {
        "file" => {}
        "dir" => {
            let (entries, not_listed) = list(&fd).map_err(|e| io_error(path, e))?;
            answer.entries = entries;
            answer.entries_not_listed = not_listed;
        }
        _ => {
            return Err(FsError::NotAFile {
                path: path.to_string(),
            });
        }
    }
    Ok(answer)
}

fn list(directory: &OwnedFd) -> Result<(Vec<Entry>, usize), Errno> {
    let mut reader = Dir::read_from(directory)?;
    let (mut entries, mut not_listed) = (Vec::new(), 0);
    while let Some(entry) = reader.read() {
        let entry = entry?;
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        if entries.len() == LIST_MAX_ENTRIES {
            not_listed += 1;
            continue;
        }
        // Gone since it was listed: leave it out.
        let Ok(stat) = rustix::fs::statat(directory.as_fd(), name, AtFlags::SYMLINK_NOFOLLOW)
        else {
            continue;
        };
        entries.push(Entry {
            name: name.to_string_lossy().into_owned(),
            kind: kind_name(FileType::from_raw_mode(stat.st_mode)),
            size: stat.st_size as u64,
            modified_unix_ms: unix_ms(&stat),
        });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((entries, not_listed))
}

/// The bytes of the file `path` in `alloc_dir`, if it is at most [`READ_MAX_BYTES`].
pub fn read(alloc_dir: &Path, path: &str) -> Result<Vec<u8>, FsError> {
    let fd = open_beneath(alloc_dir, path)?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| io_error(path, e))?;
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => {}
        FileType::Directory => {
            return Err(FsError::IsADirectory {
                path: path.to_string(),
            });
        }
        _ => {
            return Err(FsError::NotAFile {
                path: path.to_string(),
            });
        }
    }
    let too_large = |size| FsError::TooLarge {
        path: path.to_string(),
        size,
    };
    let size = stat.st_size as u64;
    if size > READ_MAX_BYTES {
        return Err(too_large(size));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    // The file may grow while it is read: never past the limit.
    std::fs::File::from(fd)
        .take(READ_MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| FsError::Io {
            path: path.to_string(),
            error,
        })?;
    if bytes.len() as u64 > READ_MAX_BYTES {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// An alloc dir with a file, a subdirectory, and links in and out; beside it, a secret.
    fn alloc_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret.txt");
        std::fs::write(&secret, "not yours").unwrap();
        let alloc = dir.path().join("alloc");
        std::fs::create_dir_all(alloc.join("out")).unwrap();
        std::fs::write(alloc.join("out/result.json"), "{\"ok\":true}").unwrap();
        symlink("out/result.json", alloc.join("link-in")).unwrap();
        symlink(&secret, alloc.join("link-out-absolute")).unwrap();
        symlink("../secret.txt", alloc.join("link-out-relative")).unwrap();
        dir
    }

    #[test]
    fn files_and_directories_inside_are_read_by_either_path() {
        let dir = alloc_dir();
        let alloc = dir.path().join("alloc");
        for path in ["out/result.json", "/alloc/out/result.json", "link-in"] {
            assert_eq!(read(&alloc, path).unwrap(), b"{\"ok\":true}", "{path}");
        }
        let root = stat(&alloc, "/alloc").unwrap();
        assert_eq!(root.kind, "dir");
        let names: Vec<(&str, &str)> = root
            .entries
            .iter()
            .map(|e| (e.name.as_str(), e.kind))
            .collect();
        assert_eq!(
            names,
            [
                ("link-in", "symlink"),
                ("link-out-absolute", "symlink"),
                ("link-out-relative", "symlink"),
                ("out", "dir")
            ]
        );
        for path in ["", ".", "/alloc/", "out/.."] {
            let outcome = stat(&alloc, path);
            if path == "out/.." {
                assert!(matches!(outcome, Err(FsError::Outside { .. })), "{path}");
            } else {
                assert_eq!(outcome.unwrap().entries.len(), 4, "{path}");
            }
        }
        let file = stat(&alloc, "out/result.json").unwrap();
        assert_eq!((file.kind, file.size), ("file", 11));
        assert!(matches!(
            read(&alloc, "out"),
            Err(FsError::IsADirectory { .. })
        ));
        assert!(matches!(
            read(&alloc, "nope"),
            Err(FsError::NotFound { .. })
        ));
    }

    #[test]
    fn nothing_outside_is_reached() {
        let dir = alloc_dir();
        let alloc = dir.path().join("alloc");
        for path in [
            "../secret.txt",
            "out/../../secret.txt",
            "/etc/passwd",
            "/allocx/secret.txt",
            "link-out-absolute",
            "link-out-relative",
        ] {
            let outcome = read(&alloc, path);
            assert!(
                matches!(outcome, Err(FsError::Outside { .. })),
                "{path}: {outcome:?}"
            );
        }
        symlink("loop-b", alloc.join("loop-a")).unwrap();
        symlink("loop-a", alloc.join("loop-b")).unwrap();
        // Refused, however the kernel names it (here: the walk left the tree).
        let looped = read(&alloc, "loop-a");
        assert!(
            matches!(
                looped,
                Err(FsError::Outside { .. } | FsError::LinkLoop { .. })
            ),
            "{looped:?}"
        );
        let nul = read(&alloc, "a\0b");
        assert!(matches!(nul, Err(FsError::NotAPath { .. })), "{nul:?}");
        let gone = dir.path().join("collected");
        assert!(matches!(read(&gone, "x"), Err(FsError::NoAllocDir)));
    }
}
