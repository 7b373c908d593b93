//! The garbage collector's config (Nomad's knobs) and where it learns the disk's usage.

use std::path::PathBuf;
use std::time::Duration;

/// The garbage collector's knobs, with Nomad's names and defaults.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GcConfig {
    /// Time between passes (`gc_interval`, default 1m).
    pub interval: Duration,
    /// Disk usage percent of the data dir's filesystem above which allocs are collected
    /// (`gc_disk_usage_threshold`, default 80).
    pub disk_usage_threshold: f64,
    /// Inode usage percent above which allocs are collected (`gc_inode_usage_threshold`,
    /// default 70).
    pub inode_usage_threshold: f64,
    /// Live allocs above which terminal ones are collected (`gc_max_allocs`, default 50).
    pub max_allocs: usize,
    /// Destroys allowed at once (`gc_parallel_destroys`, default 2; <= 0 becomes 1).
    pub parallel_destroys: i64,
}

impl Default for GcConfig {
    fn default() -> Self {
        GcConfig {
            interval: Duration::from_secs(60),
            disk_usage_threshold: 80.0,
            inode_usage_threshold: 70.0,
            max_allocs: 50,
            parallel_destroys: 2,
        }
    }
}

impl GcConfig {
    /// `parallel_destroys` as a usable count: a value <= 0 becomes 1, with a warning.
    pub fn sanitized_parallel_destroys(&self) -> usize {
        if self.parallel_destroys <= 0 {
            tracing::warn!(
                gc_parallel_destroys = self.parallel_destroys,
                "gc_parallel_destroys must be greater than 0; using 1"
            );
            1
        } else {
            self.parallel_destroys as usize
        }
    }
}

/// Usage of the filesystem that holds the data dir, in percent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiskStats {
    /// Used space.
    pub used_percent: f64,
    /// Used inodes.
    pub inodes_used_percent: f64,
}

/// Where the GC learns disk usage; injected so tests can drive the thresholds.
pub trait StatsSource: Send + Sync {
    /// Current usage. Called once per check of a pass; may block briefly (a `statvfs`).
    fn stats(&self) -> std::io::Result<DiskStats>;
}

/// The real [`StatsSource`]: `statvfs` of a path.
pub struct StatvfsStats {
    path: PathBuf,
}

impl StatvfsStats {
    /// Stats of the filesystem holding `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        StatvfsStats { path: path.into() }
    }
}

impl StatsSource for StatvfsStats {
    fn stats(&self) -> std::io::Result<DiskStats> {
        let vfs = rustix::fs::statvfs(&self.path)?;
        let percent = |used: u64, total: u64| {
            if total == 0 {
                0.0
            } else {
                used as f64 * 100.0 / total as f64
            }
        };
        // As `df` does: used over used plus what an unprivileged user may still take.
        let used = vfs.f_blocks.saturating_sub(vfs.f_bfree);
        Ok(DiskStats {
            used_percent: percent(used, used + vfs.f_bavail),
            inodes_used_percent: percent(vfs.f_files.saturating_sub(vfs.f_ffree), vfs.f_files),
        })
    }
}
