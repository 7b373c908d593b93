//! What an alloc directory holds, and what it may: its [`DiskQuota`], a [`DiskUse`] of bytes
//! and entries, and [`check`], the bounded walk that measures a directory against its quota.
//! The ledger (`disk_ledger`) keeps each alloc's account with it, and the watcher thread
//! (`disk_watch`) looks with it; it only reads.
//!
//! Each look is bounded: it stops as soon as a limit is passed, so a guest's million files
//! cost it one failed check, not a million `stat`s. It holds one descriptor per level it is
//! in, and never goes deeper than the depth limit.

use crate::util::units::format_bytes;
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags};
use std::ffi::CString;
use std::path::Path;
use std::rc::Rc;

/// How deep directories may nest under the alloc directory.
pub const MAX_DIR_DEPTH: usize = 64;

/// The quota of one alloc directory.
#[derive(Debug, Clone, Copy)]
pub struct DiskQuota {
    /// Bytes in use (as `du` counts them: whole blocks).
    pub bytes: u64,
    /// Entries of any kind.
    pub entries: u64,
    /// Nesting of directories.
    pub depth: usize,
}

impl DiskQuota {
    /// The quota `limits` give an alloc directory (its depth limit is fixed).
    pub fn of(limits: &crate::model::structs::Limits) -> Self {
        DiskQuota {
            bytes: limits.disk_bytes,
            entries: u64::from(limits.disk_entries),
            depth: MAX_DIR_DEPTH,
        }
    }

    /// The default quota but for `bytes`.
    #[cfg(test)]
    pub fn of_bytes(bytes: u64) -> Self {
        DiskQuota {
            bytes,
            ..DiskQuota::of(&crate::model::structs::Limits::default())
        }
    }

    /// The alloc's description when it holds more bytes than allowed.
    pub fn bytes_exceeded(&self) -> String {
        format!("disk quota of {} exceeded", format_bytes(self.bytes))
    }

    /// The alloc's description when it holds more entries than allowed.
    pub fn entries_exceeded(&self) -> String {
        format!(
            "disk quota exceeded: the alloc directory holds more than {} entries",
            self.entries
        )
    }

    pub(in crate::runtime) fn exceeded_by(&self, usage: DiskUse) -> Option<String> {
        if usage.bytes > self.bytes {
            Some(self.bytes_exceeded())
        } else if usage.entries > self.entries {
            Some(self.entries_exceeded())
        } else {
            None
        }
    }
}

/// Bytes and entries: what a look found, or what an operation reserves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskUse {
    /// Bytes, in whole blocks.
    pub bytes: u64,
    /// Entries of any kind.
    pub entries: u64,
}

impl DiskUse {
    pub(in crate::runtime) fn plus(self, other: DiskUse) -> DiskUse {
        DiskUse {
            bytes: self.bytes.saturating_add(other.bytes),
            entries: self.entries.saturating_add(other.entries),
        }
    }

    pub(in crate::runtime) fn minus(self, other: DiskUse) -> DiskUse {
        DiskUse {
            bytes: self.bytes.saturating_sub(other.bytes),
            entries: self.entries.saturating_sub(other.entries),
        }
    }
}

/// What `dir` holds, or the first limit it passes, described for the alloc; `None` when it
/// cannot be opened. Unreadable entries are skipped: the check only ever fails an alloc for
/// what it saw.
pub fn check(dir: &Path, quota: DiskQuota) -> Result<Option<DiskUse>, String> {
    let Ok(root) = rustix::fs::openat(
        CWD,
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return Ok(None);
    };
    let (mut bytes, mut entries) = (0u64, 0u64);
    // Directories still to read: their parent (kept open while any child waits), name, depth.
    let mut pending: Vec<(Rc<OwnedFd>, CString, usize)> = Vec::new();
    let mut reading = Some((Rc::new(root), 0usize));
    while let Some((directory, depth)) = reading.take() {
        // Counted while read, so a directory of a million entries costs one limit's worth.
        let Ok(mut reader) = rustix::fs::Dir::read_from(&*directory) else {
            reading = next_directory(&mut pending);
            continue;
        };
        while let Some(Ok(entry)) = reader.read() {
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            let (name, file_type) = (name.to_owned(), entry.file_type());
            entries += 1;
            if entries > quota.entries {
                return Err(quota.entries_exceeded());
            }
            let Ok(stat) = rustix::fs::statat(
                directory.as_fd(),
                name.as_c_str(),
                AtFlags::SYMLINK_NOFOLLOW,
            ) else {
                continue;
            };
            bytes = bytes.saturating_add(u64::try_from(stat.st_blocks).unwrap_or(0) * 512);
            if bytes > quota.bytes {
                return Err(quota.bytes_exceeded());
            }
            let is_directory = match file_type {
                FileType::Directory => true,
                FileType::Unknown => FileType::from_raw_mode(stat.st_mode) == FileType::Directory,
                _ => false,
            };
            if is_directory {
                if depth + 1 > quota.depth {
                    return Err(format!(
                        "disk quota exceeded: directories nest deeper than {} levels",
                        quota.depth
                    ));
                }
                pending.push((directory.clone(), name, depth + 1));
            }
        }
        drop(directory);
        reading = next_directory(&mut pending);
    }
    Ok(Some(DiskUse { bytes, entries }))
}

/// Opens the next pending directory that can still be opened.
fn next_directory(
    pending: &mut Vec<(Rc<OwnedFd>, CString, usize)>,
) -> Option<(Rc<OwnedFd>, usize)> {
    while let Some((parent, name, depth)) = pending.pop() {
        let opened = rustix::fs::openat(
            parent.as_fd(),
            name.as_c_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        );
        if let Ok(directory) = opened {
            return Some((Rc::new(directory), depth));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(bytes: u64, entries: u64, depth: usize) -> DiskQuota {
        DiskQuota {
            bytes,
            entries,
            depth,
        }
    }

    #[test]
    fn a_directory_within_its_quota_passes_with_what_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/file"), vec![1u8; 10_000]).unwrap();
        let found = check(dir.path(), DiskQuota::of_bytes(1 << 30))
            .unwrap()
            .unwrap();
        assert_eq!(found.entries, 3);
        assert!(found.bytes >= 10_000, "{found:?}");
        assert_eq!(check(&dir.path().join("missing"), quota(1, 1, 1)), Ok(None));
    }

    #[test]
    fn bytes_entries_and_depth_are_each_named_when_passed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("big"), vec![1u8; 1 << 20]).unwrap();
        assert_eq!(
            check(dir.path(), quota(512 * 1024, 100, 10)),
            Err("disk quota of 512 KiB exceeded".to_string())
        );

        let dir = tempfile::tempdir().unwrap();
        for i in 0..20 {
            std::fs::write(dir.path().join(format!("f{i}")), "").unwrap();
        }
        assert_eq!(
            check(dir.path(), quota(1 << 30, 10, 10)),
            Err("disk quota exceeded: the alloc directory holds more than 10 entries".to_string())
        );

        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("1/2/3/4/5")).unwrap();
        assert_eq!(
            check(dir.path(), quota(1 << 30, 100, 4)),
            Err("disk quota exceeded: directories nest deeper than 4 levels".to_string())
        );
        assert!(check(dir.path(), quota(1 << 30, 100, 5)).is_ok());
    }
}
