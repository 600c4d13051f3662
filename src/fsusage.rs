//! Disk usage of the image filesystem (the snapshotter's directory), measured in the
//! background every stats period so `ImageFsInfo` never walks the tree on the RPC path.

use std::collections::HashSet;
use std::os::fd::OwnedFd;
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

/// How deep the walk goes; what a container nests deeper is not counted.
const MAX_DEPTH: usize = 1024;

/// Walks `root` without following symlinks or crossing into other filesystems, counting each
/// inode once (hard links share one) and its allocated blocks. Directories are opened
/// relative to their parent's handle and never through a symlink: containers change their
/// layers under the walk, and one that swaps a directory for a link to `/` must not send it
/// through the node's files.
pub fn measure(root: &Path) -> std::io::Result<Usage> {
    use nix::fcntl::OFlag;
    // The root is crius's own setting and may be a link (a snapshotter dir moved to another
    // disk); below it, nothing is followed.
    let dir = nix::fcntl::open(
        root,
        OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    let top = nix::sys::stat::fstat(&dir)?;
    let mut walk = Walk {
        dev: top.st_dev,
        seen: HashSet::new(),
        used_bytes: 0,
        inodes_used: 0,
    };
    walk.count(
        top.st_ino,
        top.st_nlink,
        u64::try_from(top.st_blocks).unwrap_or_default(),
    );
    walk.dir(&dir, 0);
    Ok(Usage {
        used_bytes: walk.used_bytes,
        inodes_used: walk.inodes_used,
        timestamp: SystemTime::now(),
    })
}

struct Walk {
    dev: u64,
    seen: HashSet<u64>,
    used_bytes: u64,
    inodes_used: u64,
}

impl Walk {
    fn count(&mut self, ino: u64, nlink: u64, blocks: u64) {
        if nlink > 1 && !self.seen.insert(ino) {
            return;
        }
        self.used_bytes += blocks * 512;
        self.inodes_used += 1;
    }

    /// Counts what is in the directory open at `dir`. Entries vanish while containerd and
    /// the containers work: what disappears (or stops being a directory) is skipped.
    fn dir(&mut self, dir: &OwnedFd, depth: usize) {
        use nix::fcntl::{AtFlags, OFlag};
        use nix::sys::stat::SFlag;
        for name in names(dir) {
            let Ok(stat) =
                nix::sys::stat::fstatat(dir, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            else {
                continue;
            };
            if stat.st_dev != self.dev {
                continue;
            }
            let blocks = u64::try_from(stat.st_blocks).unwrap_or_default();
            self.count(stat.st_ino, stat.st_nlink, blocks);
            let is_dir = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
            if !is_dir || depth >= MAX_DEPTH {
                continue;
            }
            if let Ok(child) = nix::fcntl::openat(
                dir,
                name.as_os_str(),
                OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            ) {
                self.dir(&child, depth + 1);
            }
        }
    }
}

/// The names in the directory open at `dir` (none if it cannot be listed).
fn names(dir: &OwnedFd) -> Vec<std::ffi::OsString> {
    use std::os::unix::ffi::OsStrExt;
    let Ok(copy) = dir.try_clone() else {
        return Vec::new();
    };
    let Ok(mut listing) = nix::dir::Dir::from_fd(copy) else {
        return Vec::new();
    };
    listing
        .iter()
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_bytes().to_vec())
        .filter(|name| name != b"." && name != b"..")
        .map(|name| std::ffi::OsStr::from_bytes(&name).to_os_string())
        .collect()
}

/// The image filesystem and its latest measured usage.
pub struct ImageFs {
    path: PathBuf,
    latest: RwLock<Option<Usage>>,
    /// Held by the caller that measures for the first time: the others wait for its walk.
    first_walk: tokio::sync::Mutex<()>,
}

/// How a walk shares the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Priority {
    /// A caller is waiting for the answer.
    Normal,
    /// Nobody waits: the walk takes only CPU nothing else wants.
    Idle,
}

impl ImageFs {
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            latest: RwLock::new(None),
            first_walk: tokio::sync::Mutex::new(()),
        }
    }

    fn cached(&self) -> Option<Usage> {
        *self.latest.read().unwrap_or_else(|p| p.into_inner())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The latest measurement, measuring now if there is none yet (one walk, at normal
    /// priority, for all the callers that come before it ends).
    pub async fn usage(&self) -> std::io::Result<Usage> {
        if let Some(usage) = self.cached() {
            return Ok(usage);
        }
        let _first = self.first_walk.lock().await;
        if let Some(usage) = self.cached() {
            return Ok(usage);
        }
        self.refresh(Priority::Normal).await
    }

    /// Measures again and keeps the result. The walk runs on a thread of its own; in the
    /// background, in the idle scheduling class, so that on a busy node it waits and
    /// pulls and RPCs do not.
    async fn refresh(&self, priority: Priority) -> std::io::Result<Usage> {
        let path = self.path.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("crius-fsusage".to_string())
            .spawn(move || {
                if priority == Priority::Idle
                    && let Err(e) = crate::sys::host::make_this_thread_idle()
                {
                    tracing::debug!(error = %e, "disk-usage walk keeps its priority");
                }
                let _ = tx.send(measure(&path));
            })?;
        let usage = rx
            .await
            .map_err(|_| std::io::Error::other("disk-usage walk ended without a result"))??;
        *self.latest.write().unwrap_or_else(|p| p.into_inner()) = Some(usage);
        Ok(usage)
    }

    /// Re-measures every `period` until cancelled, the first time one period after the
    /// start (a daemon that has just started has pulls to serve first; the first
    /// ImageFsInfo before then measures at once).
    pub async fn run_syncer(&self, period: Duration, cancel: CancellationToken) {
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = ticker.tick() => {}
            }
            if let Err(e) = self.refresh(Priority::Idle).await {
                tracing::debug!(path = %self.path.display(), error = %e, "cannot measure image filesystem");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(fs: &ImageFs) -> Option<Usage> {
        *fs.latest.read().unwrap()
    }

    #[tokio::test]
    async fn the_syncer_waits_a_period_and_a_caller_measures_at_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), vec![1u8; 8192]).unwrap();
        let fs = std::sync::Arc::new(ImageFs::new(dir.path().to_path_buf()));
        let cancel = CancellationToken::new();
        let syncer = tokio::spawn({
            let (fs, cancel) = (fs.clone(), cancel.clone());
            async move { fs.run_syncer(Duration::from_secs(3600), cancel).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(measured(&fs), None, "walked at the start");
        let usage = fs.usage().await.unwrap();
        assert_eq!(usage.inodes_used, 2, "{usage:?}");
        assert_eq!(measured(&fs), Some(usage));
        cancel.cancel();
        syncer.await.unwrap();
    }

    #[tokio::test]
    async fn callers_before_the_first_measurement_share_one_walk() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..200 {
            std::fs::write(dir.path().join(format!("f{i}")), b"x").unwrap();
        }
        let fs = std::sync::Arc::new(ImageFs::new(dir.path().to_path_buf()));
        let callers: Vec<_> = (0..8)
            .map(|_| {
                let fs = fs.clone();
                tokio::spawn(async move { fs.usage().await.unwrap() })
            })
            .collect();
        let mut usages = Vec::new();
        for caller in callers {
            usages.push(caller.await.unwrap());
        }
        // Each walk stamps its own end time: one timestamp, one walk.
        assert!(usages.iter().all(|u| *u == usages[0]), "{usages:?}");
        assert_eq!(usages[0].inodes_used, 201);
    }

    #[test]
    fn the_walking_thread_runs_in_the_idle_class() {
        let class = std::thread::spawn(|| {
            crate::sys::host::make_this_thread_idle().unwrap();
            // SAFETY: no arguments but the calling thread's id.
            unsafe { libc::sched_getscheduler(0) }
        })
        .join()
        .unwrap();
        assert_eq!(class, libc::SCHED_IDLE);
    }

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
    fn a_link_to_a_directory_is_counted_not_walked() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(root.join("layer")).unwrap();
        std::fs::create_dir(&outside).unwrap();
        for i in 0..10 {
            std::fs::write(outside.join(format!("f{i}")), b"x").unwrap();
        }
        std::os::unix::fs::symlink(&outside, root.join("layer/escape")).unwrap();
        let usage = measure(&root).unwrap();
        // root, layer, and the link itself.
        assert_eq!(usage.inodes_used, 3, "{usage:?}");
    }

    #[test]
    fn a_root_given_as_a_link_is_measured() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::fs::write(real.join("f"), vec![1u8; 8192]).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let usage = measure(&link).unwrap();
        assert_eq!(usage.inodes_used, 2, "{usage:?}");
        assert!(usage.used_bytes >= 8192, "{usage:?}");
    }

    #[test]
    fn missing_root_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(measure(&dir.path().join("absent")).is_err());
    }
}
