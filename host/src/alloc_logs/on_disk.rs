//! Which allocs may have log files on disk, so that removing the log of one that has none
//! makes no system call. Most allocs of a churn of short ones are collected before their
//! lines were due (see the write-behind in the module above) and never made a file; their
//! removals tried an unlink per possible file, about 3% of the churn's CPU.
//!
//! An alloc may have files if the directory held some of its files when the owner was made
//! (an earlier run of the agent left them), or if a batch of its lines has been written
//! since. It is forgotten once its files are all deleted. When the directory cannot be
//! listed, every alloc may have files: every removal tries, as before.

use super::file::alloc_of;
use crate::util::locks::LockUnpoisoned;
use std::collections::HashSet;
use std::path::Path;
use std::sync::Mutex;

pub(super) struct FilesOnDisk {
    /// `None` when the directory could not be listed.
    allocs: Mutex<Option<HashSet<String>>>,
}

impl FilesOnDisk {
    /// Lists `dir` (one read of the directory; a missing one has no files).
    pub(super) fn list(dir: &Path) -> Self {
        let listed = match std::fs::read_dir(dir) {
            Ok(entries) => entries
                .map(|entry| entry.map(|entry| alloc_of(&entry.file_name().to_string_lossy())))
                .filter_map(Result::transpose)
                .collect::<std::io::Result<HashSet<String>>>(),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(HashSet::new()),
            Err(error) => Err(error),
        };
        let allocs = listed
            .inspect_err(|error| {
                tracing::warn!(dir = %dir.display(), error = %error, "cannot list the alloc log files; every removal will try to delete them")
            })
            .ok();
        FilesOnDisk {
            allocs: Mutex::new(allocs),
        }
    }

    /// `alloc_id`'s lines are about to be written: it may have files from now on.
    pub(super) fn writing(&self, alloc_id: &str) {
        if let Some(allocs) = &mut *self.allocs.lock_unpoisoned()
            && !allocs.contains(alloc_id)
        {
            allocs.insert(alloc_id.to_string());
        }
    }

    /// Whether `alloc_id` may have files to delete.
    pub(super) fn may_have_files(&self, alloc_id: &str) -> bool {
        self.allocs
            .lock_unpoisoned()
            .as_ref()
            .is_none_or(|allocs| allocs.contains(alloc_id))
    }

    /// Every file of `alloc_id` is deleted.
    pub(super) fn deleted(&self, alloc_id: &str) {
        if let Some(allocs) = &mut *self.allocs.lock_unpoisoned() {
            allocs.remove(alloc_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_that_cannot_be_listed_leaves_every_alloc_to_try() {
        let dir = tempfile::tempdir().unwrap();
        let not_a_dir = dir.path().join("file");
        std::fs::write(&not_a_dir, "").unwrap();
        let on_disk = FilesOnDisk::list(&not_a_dir);
        assert!(on_disk.may_have_files("anything"));
        on_disk.deleted("anything");
        assert!(on_disk.may_have_files("anything"));
    }
}
