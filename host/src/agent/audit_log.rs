//! `[audit] path`: the audit trail's own file, one JSON line per operator's write (the
//! records `http`'s audit layer makes), appended by a thread of its own so that no request
//! waits on the disk. The file is created readable by its owner only; it is never rotated or
//! truncated here (an operator's logrotate with `copytruncate` may).

use crate::agent::http::AuditRecord;
use anyhow::Context;
use std::io::Write;
use std::path::Path;

/// The open audit file.
pub struct AuditLog {
    lines: std::sync::Mutex<std::sync::mpsc::Sender<String>>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuditLog")
    }
}

impl AuditLog {
    /// Opens `path` for appending (its directory made if missing), or says why not in one
    /// line naming it.
    pub fn open(path: &Path) -> anyhow::Result<AuditLog> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("audit.path: cannot create {}", dir.display()))?;
        }
        let mut options = std::fs::OpenOptions::new();
        options.create(true).append(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let file = options
            .open(path)
            .with_context(|| format!("audit.path: cannot open {}", path.display()))?;
        let (lines, pending) = std::sync::mpsc::channel::<String>();
        let shown = path.display().to_string();
        std::thread::Builder::new()
            .name("caravan-audit".into())
            .spawn(move || write_lines(file, pending, &shown))
            .context("cannot start the audit log's writer")?;
        Ok(AuditLog {
            lines: std::sync::Mutex::new(lines),
        })
    }

    /// Queues `record` for the file.
    pub fn append(&self, record: &AuditRecord) {
        let Ok(line) = serde_json::to_string(record) else {
            return;
        };
        let lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        let _ = lines.send(line);
    }
}

/// Writes each line as it comes, until the log is dropped; a failed write is logged once.
fn write_lines(mut file: std::fs::File, pending: std::sync::mpsc::Receiver<String>, path: &str) {
    let mut failed = false;
    while let Ok(mut line) = pending.recv() {
        line.push('\n');
        match file.write_all(line.as_bytes()) {
            Ok(()) => failed = false,
            Err(error) if !failed => {
                failed = true;
                tracing::error!(path, error = %error, "cannot write the audit log; retrying with the next record");
            }
            Err(_) => {}
        }
    }
}
