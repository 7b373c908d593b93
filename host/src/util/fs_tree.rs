//! Removing directory trees that a guest made: iteratively, with a fixed number of descriptors,
//! whatever their depth and whatever their entries are called.
//!
//! `std::fs::remove_dir_all` recurses: a runner that nests 20,000 directories overflows a
//! 2 MiB thread stack near depth 15,000 (an abort that takes every alloc on the node with it)
//! and runs out of descriptors near 30,000; the full path of such a tree is also longer than
//! `PATH_MAX`, so nothing that works by path can reach its bottom. [`remove_tree`] instead
//! flattens the tree as it goes: each subdirectory it meets is renamed up to the top of the
//! tree (a rename within one directory tree is one metadata update), so every directory it
//! opens is a direct child of the root. It holds at most three descriptors and a list of
//! pending names, never a stack of directories.
//!
//! This module only removes; it never follows a symbolic link (a link is unlinked, its target
//! left alone) and never leaves the tree it was given.

use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{AtFlags, CWD, Dir, FileType, Mode, OFlags, RenameFlags};
use std::ffi::{CStr, CString};
use std::io;
use std::path::Path;

/// How many times a directory is listed again when entries appeared while it was emptied (a
/// guest still writing); after that, the removal fails and is retried later by its caller.
const PASSES_PER_DIRECTORY: usize = 4;

/// Removes `path` and everything under it. A missing `path` is not an error; a file or a
/// symbolic link at `path` is unlinked. Blocking: call it from a blocking thread.
///
/// Keeps going past entries it cannot remove and returns the first error at the end, so a
/// failed removal leaves as little behind as it can and can simply be called again.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    // The common case, a directory its alloc left empty, is one `rmdir` and no listing. It
    // fails without touching anything for a non-empty directory, a file and a link alike
    // (`rmdir` never follows one), which the walk below then handles.
    match rustix::fs::unlinkat(CWD, path, AtFlags::REMOVEDIR) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(_) => {}
    }
    let root = match rustix::fs::openat(
        CWD,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(root) => root,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        // Not a directory (or a link to one): one unlink removes it.
        Err(rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => {
            return match std::fs::remove_file(path) {
                Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
                other => other,
            };
        }
        Err(error) => return Err(error.into()),
    };
    let mut remover = Remover {
        root,
        next_name: 0,
        first_error: None,
    };
    remover.empty_root();
    drop(remover.root);
    if let Err(error) = std::fs::remove_dir(path)
        && error.kind() != io::ErrorKind::NotFound
    {
        remover.first_error.get_or_insert(error);
    }
    match remover.first_error {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// A temporary directory (a dev agent's data dir, `caravan run`'s) that guests may fill, removed
/// with [`remove_tree`] when dropped: `tempfile`'s own removal recurses.
pub struct TempTree(Option<tempfile::TempDir>);

impl TempTree {
    /// A new directory under the system's temporary directory, its name starting with `prefix`.
    pub fn new(prefix: &str) -> io::Result<TempTree> {
        tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .map(|dir| TempTree(Some(dir)))
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        self.0.as_ref().map_or(Path::new(""), |dir| dir.path())
    }

    /// Keeps the directory (it is not removed) and returns where it is.
    pub fn keep(mut self) -> std::path::PathBuf {
        self.0.take().map(|dir| dir.keep()).unwrap_or_default()
    }
}

impl Drop for TempTree {
    fn drop(&mut self) {
        let Some(dir) = &self.0 else { return };
        if let Err(error) = remove_tree(dir.path()) {
            tracing::warn!(
                path = %dir.path().display(),
                error = %error,
                "cannot remove a temporary directory; remove it by hand"
            );
        }
    }
}

struct Remover {
    root: OwnedFd,
    /// Suffix of the next name a subdirectory is moved up to.
    next_name: u64,
    first_error: Option<io::Error>,
}

impl Remover {
    /// Empties the root: its own entries first, then each directory found (every one of them a
    /// child of the root by then), removing each once it is empty.
    fn empty_root(&mut self) {
        let mut pending: Vec<CString> = Vec::new();
        let root = self.root.try_clone();
        match root {
            Ok(root) => self.empty_directory(&root, true, &mut pending),
            Err(error) => self.note(error),
        }
        while let Some(name) = pending.pop() {
            let opened = rustix::fs::openat(
                self.root.as_fd(),
                name.as_c_str(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            );
            match opened {
                Ok(directory) => {
                    self.empty_directory(&directory, false, &mut pending);
                    drop(directory);
                    if let Err(error) =
                        rustix::fs::unlinkat(self.root.as_fd(), name.as_c_str(), AtFlags::REMOVEDIR)
                    {
                        self.note(error.into());
                    }
                }
                Err(rustix::io::Errno::NOENT) => {}
                // Replaced by something else since it was listed: unlink whatever it is now.
                Err(rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => {
                    if let Err(error) = unlink(self.root.as_fd(), &name) {
                        self.note(error);
                    }
                }
                Err(error) => self.note(error.into()),
            }
        }
    }

    /// Unlinks every non-directory in `directory`; its subdirectories are added to `pending`,
    /// moved up to the root first unless `directory` is the root itself. The root is listed
    /// once (its subdirectories stay where they are); any other directory is listed until it
    /// is empty, up to [`PASSES_PER_DIRECTORY`] times.
    fn empty_directory(&mut self, directory: &OwnedFd, is_root: bool, pending: &mut Vec<CString>) {
        let passes = if is_root { 1 } else { PASSES_PER_DIRECTORY };
        for _ in 0..passes {
            let entries = match list(directory) {
                Ok(entries) => entries,
                Err(error) => return self.note(error),
            };
            if entries.is_empty() {
                return;
            }
            for (name, file_type) in entries {
                let is_directory = match file_type {
                    FileType::Directory => true,
                    FileType::Unknown => rustix::fs::statat(
                        directory.as_fd(),
                        name.as_c_str(),
                        AtFlags::SYMLINK_NOFOLLOW,
                    )
                    .map(|stat| FileType::from_raw_mode(stat.st_mode) == FileType::Directory)
                    .unwrap_or(false),
                    _ => false,
                };
                if !is_directory {
                    if let Err(error) = unlink(directory.as_fd(), &name) {
                        self.note(error);
                    }
                } else if is_root {
                    pending.push(name);
                } else if let Some(moved) = self.move_to_root(directory, &name) {
                    pending.push(moved);
                }
            }
        }
    }

    /// Renames `directory/name` to a fresh name in the root and returns that name.
    fn move_to_root(&mut self, directory: &OwnedFd, name: &CStr) -> Option<CString> {
        loop {
            let fresh = CString::new(format!(".caravan-removing-{}", self.next_name))
                .expect("no NUL in a formatted number");
            self.next_name += 1;
            let renamed = rustix::fs::renameat_with(
                directory.as_fd(),
                name,
                self.root.as_fd(),
                fresh.as_c_str(),
                RenameFlags::NOREPLACE,
            );
            // Filesystems without `RENAME_NOREPLACE` (NFS, many FUSE ones) say EINVAL: make
            // sure the fresh name is free, then rename plainly (only this process names these).
            let renamed = match renamed {
                Err(rustix::io::Errno::INVAL) => match rustix::fs::statat(
                    self.root.as_fd(),
                    fresh.as_c_str(),
                    AtFlags::SYMLINK_NOFOLLOW,
                ) {
                    Ok(_) => Err(rustix::io::Errno::EXIST),
                    Err(_) => rustix::fs::renameat(
                        directory.as_fd(),
                        name,
                        self.root.as_fd(),
                        fresh.as_c_str(),
                    ),
                },
                other => other,
            };
            match renamed {
                Ok(()) => return Some(fresh),
                // A guest's entry already has that name: try the next one.
                Err(rustix::io::Errno::EXIST) => continue,
                Err(rustix::io::Errno::NOENT) => return None,
                Err(error) => {
                    self.note(error.into());
                    return None;
                }
            }
        }
    }

    fn note(&mut self, error: io::Error) {
        self.first_error.get_or_insert(error);
    }
}

/// Unlinks a non-directory; one already gone is fine.
fn unlink(directory: rustix::fd::BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    match rustix::fs::unlinkat(directory, name, AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// The entries of `directory` but `.` and `..`, read in one pass with a descriptor of their own.
fn list(directory: &OwnedFd) -> io::Result<Vec<(CString, FileType)>> {
    let mut reader = Dir::read_from(directory)?;
    let mut entries = Vec::new();
    while let Some(entry) = reader.read() {
        let entry = entry?;
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        entries.push((name.to_owned(), entry.file_type()));
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    fn name_of(bytes: &[u8]) -> &OsStr {
        OsStr::from_bytes(bytes)
    }

    /// Nests `depth` directories under `root` by descriptor (their full path is far longer
    /// than `PATH_MAX`), with a file at the bottom.
    fn nest(root: &Path, depth: usize) {
        let mut parent = rustix::fs::openat(CWD, root, OFlags::DIRECTORY, Mode::empty()).unwrap();
        for _ in 0..depth {
            rustix::fs::mkdirat(&parent, "d", Mode::RWXU).unwrap();
            parent = rustix::fs::openat(&parent, "d", OFlags::DIRECTORY, Mode::empty()).unwrap();
        }
        let file = rustix::fs::openat(
            &parent,
            "bottom",
            OFlags::CREATE | OFlags::WRONLY,
            Mode::RUSR | Mode::WUSR,
        )
        .unwrap();
        drop(file);
    }

    #[test]
    fn a_tree_deeper_than_any_stack_or_path_is_removed_on_a_small_stack() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("alloc");
        std::fs::create_dir(&tree).unwrap();
        nest(&tree, 20_000);
        // 64 KiB of stack: recursion of any depth worth the name would overflow it.
        let removing = tree.clone();
        std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || remove_tree(&removing))
            .unwrap()
            .join()
            .expect("remove_tree must not overflow its stack")
            .unwrap();
        assert!(!tree.exists());
    }

    #[test]
    fn odd_names_are_removed_and_links_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "precious").unwrap();
        let tree = dir.path().join("alloc");
        std::fs::create_dir(&tree).unwrap();
        for name in [
            name_of(b"line\nbreak"),
            name_of(b"\xff\xfe not utf-8"),
            name_of(b"..."),
            name_of(b".caravan-removing-0"),
            name_of(b"\x1b[2J"),
        ] {
            std::fs::create_dir(tree.join(name)).unwrap();
            std::fs::write(tree.join(name).join(name), "x").unwrap();
            std::fs::create_dir(tree.join(name).join("sub")).unwrap();
        }
        std::os::unix::fs::symlink(&outside, tree.join("link-to-outside")).unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("...").join("sub").join("link")).unwrap();
        std::fs::hard_link(outside.join("keep"), tree.join("hard-link")).unwrap();

        remove_tree(&tree).unwrap();
        assert!(!tree.exists());
        assert_eq!(
            std::fs::read_to_string(outside.join("keep")).unwrap(),
            "precious"
        );
    }

    #[test]
    fn a_temporary_tree_goes_with_its_owner_however_deep() {
        let temporary = TempTree::new("caravan-test-").unwrap();
        let path = temporary.path().to_path_buf();
        nest(&path, 2_000);
        drop(temporary);
        assert!(!path.exists());
    }

    #[test]
    fn a_missing_path_an_empty_directory_a_plain_file_or_a_link_is_fine() {
        let dir = tempfile::tempdir().unwrap();
        remove_tree(&dir.path().join("never-made")).unwrap();
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        remove_tree(&empty).unwrap();
        assert!(!empty.exists());
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        remove_tree(&file).unwrap();
        assert!(!file.exists());
        // A link to an empty directory: the link goes, the directory stays.
        let target = dir.path().join("target");
        std::fs::create_dir(&target).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        remove_tree(&link).unwrap();
        assert!(!link.exists() && target.is_dir());
    }
}
