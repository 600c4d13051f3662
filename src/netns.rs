//! Network namespaces for pods: created on a dedicated thread (never a tokio worker, whose
//! namespace must not change), pinned by a bind mount under `/var/run/netns/cni-<id>` so
//! they outlive every process in them, and removed idempotently.

use std::path::{Path, PathBuf};

use nix::mount::MsFlags;
use nix::sched::CloneFlags;

/// Where pinned network namespaces live (iproute2's directory).
pub const NETNS_DIR: &str = "/var/run/netns";

#[derive(Debug, thiserror::Error)]
#[error("network namespace {path}: {op}: {reason}")]
pub struct NetnsError {
    pub path: PathBuf,
    pub op: &'static str,
    pub reason: String,
}

fn fail(path: &Path, op: &'static str, reason: impl ToString) -> NetnsError {
    NetnsError {
        path: path.to_path_buf(),
        op,
        reason: reason.to_string(),
    }
}

/// A fresh, unique path for a pod's network namespace.
pub fn new_path() -> PathBuf {
    Path::new(NETNS_DIR).join(format!("cni-{:032x}", rand::random::<u128>()))
}

/// Creates a network namespace pinned at `path`.
pub async fn create(path: &Path) -> Result<(), NetnsError> {
    let path = path.to_path_buf();
    let target = path.clone();
    tokio::task::spawn_blocking(move || {
        // The unshare happens on a thread of its own that ends right after, so no thread
        // that runs anything else ever changes namespace.
        std::thread::Builder::new()
            .name("crius-netns".to_string())
            .spawn(move || create_on_this_thread(&target))
            .map_err(|e| fail(&path, "spawn thread", e))?
            .join()
            .map_err(|_| fail(&path, "create", "namespace thread panicked"))?
    })
    .await
    .map_err(|e| NetnsError {
        path: PathBuf::new(),
        op: "create",
        reason: e.to_string(),
    })?
}

fn create_on_this_thread(path: &Path) -> Result<(), NetnsError> {
    let dir = path.parent().unwrap_or(Path::new(NETNS_DIR));
    std::fs::create_dir_all(dir).map_err(|e| fail(path, "create directory", e))?;
    std::fs::File::create(path).map_err(|e| fail(path, "create mount point", e))?;
    let pinned = (|| {
        nix::sched::unshare(CloneFlags::CLONE_NEWNET).map_err(|e| fail(path, "unshare", e))?;
        let tid = nix::unistd::gettid();
        let source = format!("/proc/self/task/{tid}/ns/net");
        nix::mount::mount(
            Some(source.as_str()),
            path,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| fail(path, "bind mount", e))
    })();
    if pinned.is_err() {
        let _ = std::fs::remove_file(path);
    }
    pinned
}

/// Unmounts and removes a pinned namespace; a missing one is fine.
pub async fn remove(path: &Path) -> Result<(), NetnsError> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || remove_blocking(&path))
        .await
        .map_err(|e| NetnsError {
            path: PathBuf::new(),
            op: "remove",
            reason: e.to_string(),
        })?
}

fn remove_blocking(path: &Path) -> Result<(), NetnsError> {
    crate::mount::unpin(path).map_err(|(op, e)| fail(path, op, e))
}

/// Whether `path` is a pinned namespace (a mounted nsfs file).
pub fn is_pinned(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .map(|fs| fs.filesystem_type() == nix::sys::statfs::NSFS_MAGIC)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn create_pin_and_remove_twice() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cni-test");
        create(&path).await.unwrap();
        assert!(is_pinned(&path));
        // The process's own namespace did not change.
        let own = std::fs::read_link("/proc/self/ns/net").unwrap();
        let pinned = std::fs::metadata(&path).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_ne!(
            own.to_string_lossy(),
            format!("net:[{}]", pinned.ino()),
            "the pinned namespace is a new one"
        );
        remove(&path).await.unwrap();
        assert!(!path.exists());
        remove(&path).await.unwrap();
    }
}
