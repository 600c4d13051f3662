//! Disk usage of the image filesystem (the snapshotter's directory), measured in the
//! background every stats period so `ImageFsInfo` never walks the tree on the RPC path.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

/// Bytes and inodes used below a directory, and when that was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub used_bytes: u64,
    pub inodes_used: u64,
    pub timestamp: SystemTime,
}

/// Walks `root` without following symlinks or crossing into other filesystems, counting each
/// inode once (hard links share one) and its allocated blocks.
pub fn measure(root: &Path) -> std::io::Result<Usage> {
    let top = std::fs::symlink_metadata(root)?;
    let dev = top.dev();
    let mut seen = HashSet::new();
    let mut used_bytes = 0u64;
    let mut inodes_used = 0u64;
    let mut stack = vec![root.to_path_buf()];
    let mut count = |meta: &std::fs::Metadata| {
        if meta.nlink() > 1 && !seen.insert(meta.ino()) {
            return;
        }
        used_bytes += meta.blocks() * 512;
        inodes_used += 1;
    };
    count(&top);
    while let Some(dir) = stack.pop() {
        // Entries vanish while containerd works: skip what disappears.
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            if meta.dev() != dev {
                continue;
            }
            count(&meta);
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    Ok(Usage {
        used_bytes,
        inodes_used,
        timestamp: SystemTime::now(),
    })
}

/// The image filesystem and its latest measured usage.
pub struct ImageFs {
    path: PathBuf,
    latest: RwLock<Option<Usage>>,
}

impl ImageFs {
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            latest: RwLock::new(None),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The latest measurement, measuring now if there is none yet.
    pub async fn usage(&self) -> std::io::Result<Usage> {
        if let Some(usage) = *self.latest.read().unwrap_or_else(|p| p.into_inner()) {
            return Ok(usage);
        }
        self.refresh().await
    }

    /// Measures again and keeps the result.
    pub async fn refresh(&self) -> std::io::Result<Usage> {
        let path = self.path.clone();
        let usage = tokio::task::spawn_blocking(move || measure(&path))
            .await
            .map_err(std::io::Error::other)??;
        *self.latest.write().unwrap_or_else(|p| p.into_inner()) = Some(usage);
        Ok(usage)
    }

    /// Re-measures every `period` until cancelled.
    pub async fn run_syncer(&self, period: Duration, cancel: CancellationToken) {
        let mut ticker = tokio::time::interval(period);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = ticker.tick() => {}
            }
            if let Err(e) = self.refresh().await {
                tracing::debug!(path = %self.path.display(), error = %e, "cannot measure image filesystem");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_files_once_per_inode() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/a"), vec![1u8; 64 * 1024]).unwrap();
        std::fs::hard_link(dir.path().join("sub/a"), dir.path().join("b")).unwrap();
        let usage = measure(dir.path()).unwrap();
        // root, sub, and one inode for a/b.
        assert_eq!(usage.inodes_used, 3);
        assert!(usage.used_bytes >= 64 * 1024, "{usage:?}");
        assert!(usage.used_bytes < 2 * 64 * 1024 + 64 * 1024, "{usage:?}");
    }

    #[test]
    fn missing_root_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(measure(&dir.path().join("absent")).is_err());
    }
}
