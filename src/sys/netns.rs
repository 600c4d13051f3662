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

/// Moves the calling thread into the network namespace at `path`: only on a thread of its
/// own, never a runtime worker (the namespace stays with the thread).
pub fn enter_on_this_thread(path: &Path) -> Result<(), NetnsError> {
    let ns = std::fs::File::open(path).map_err(|e| fail(path, "open", e))?;
    nix::sched::setns(&ns, CloneFlags::CLONE_NEWNET).map_err(|e| fail(path, "enter", e))
}

/// A fresh, unique path for a pod's network namespace.
pub fn new_path() -> PathBuf {
    Path::new(NETNS_DIR).join(format!("cni-{:032x}", rand::random::<u128>()))
}

/// Creates a network namespace pinned at `path`.
pub async fn create(path: &Path) -> Result<(), NetnsError> {
    on_a_thread_of_its_own(path, "create", create_on_this_thread).await
}

/// Brings `lo` up in the pinned namespace at `path`: what the loopback CNI plugin does on
/// ADD, without starting a plugin process for every pod (5-17 ms each on the development
/// VM, on the way of RunPodSandbox).
pub async fn loopback_up(path: &Path) -> Result<(), NetnsError> {
    on_a_thread_of_its_own(path, "bring lo up", |path| {
        enter(path)?;
        set_loopback_up().map_err(|e| fail(path, "bring lo up", e))
    })
    .await
}

/// Runs `work` on a thread of its own that ends right after, so no thread that runs
/// anything else ever changes namespace.
async fn on_a_thread_of_its_own(
    path: &Path,
    op: &'static str,
    work: fn(&Path) -> Result<(), NetnsError>,
) -> Result<(), NetnsError> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let target = path.clone();
        std::thread::Builder::new()
            .name("crius-netns".to_string())
            .spawn(move || work(&target))
            .map_err(|e| fail(&path, "spawn thread", e))?
            .join()
            .map_err(|_| fail(&path, op, "namespace thread panicked"))?
    })
    .await
    .map_err(|e| NetnsError {
        path: PathBuf::new(),
        op,
        reason: e.to_string(),
    })?
}

/// Moves this thread into the network namespace pinned at `path`.
fn enter(path: &Path) -> Result<(), NetnsError> {
    let namespace = std::fs::File::open(path).map_err(|e| fail(path, "open", e))?;
    nix::sched::setns(&namespace, CloneFlags::CLONE_NEWNET).map_err(|e| fail(path, "setns", e))
}

/// Sets `IFF_UP` on `lo` of this thread's network namespace.
fn set_loopback_up() -> std::io::Result<()> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the descriptor was just returned and nothing else owns it.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut request = loopback_request();
    // SAFETY: SIOCGIFFLAGS fills the flags of the interface the request names.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut request) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the flags are the member of the union SIOCGIFFLAGS filled.
    unsafe { request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: SIOCSIFFLAGS reads the request, which names lo and carries its flags.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS as _, &request) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// An interface request naming `lo`.
fn loopback_request() -> libc::ifreq {
    // SAFETY: ifreq is plain data, for which all zeroes is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (to, from) in request.ifr_name.iter_mut().zip(b"lo") {
        *to = *from as libc::c_char;
    }
    request
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
/// Whether `path` is one crius makes: `/var/run/netns/cni-<32 hex digits>`. A path read
/// back from disk or from a record is removed only then (removal unmounts and deletes what
/// is there).
pub fn is_pinned_by_crius(path: &Path) -> bool {
    path.parent() == Some(Path::new(NETNS_DIR))
        && path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("cni-"))
            .is_some_and(|hex| {
                hex.len() == 32
                    && hex
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            })
}

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
    match crate::sys::mount::unpin(path) {
        Err(("remove", reason)) if path.exists() => {
            let target = path.to_path_buf();
            std::thread::Builder::new()
                .name("crius-netns".to_string())
                .spawn(move || remove_hidden(&target))
                .map_err(|e| fail(path, "spawn thread", e))?
                .join()
                .map_err(|_| fail(path, "remove", "namespace thread panicked"))?
                .map_err(|e| fail(path, "remove", format!("{reason}; {e}")))
        }
        other => other.map_err(|(op, e)| fail(path, op, e)),
    }
}

/// How many mounts `remove_hidden` peels off the directory at most.
const MAX_COVERS: usize = 8;

/// Removes a pin that a later mount of its directory hides. `ip netns add` bind-mounts
/// /var/run/netns onto itself (with what is mounted under it) when it is not a mount point:
/// the unmount then reaches only the copy, the original stays where no path leads, and the
/// file cannot be removed while it is mounted. On this thread (which ends right after),
/// with a private copy of the mount table, the directory's covering mounts are peeled
/// until the file can be removed; removing it detaches the original in the node's mount
/// namespace too (the kernel lazily unmounts what is mounted on an unlinked file
/// elsewhere). Nothing undone here reaches the node: the copy is private.
fn remove_hidden(path: &Path) -> Result<(), String> {
    let dir = path.parent().ok_or("the pin has no directory")?;
    nix::sched::unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_FS)
        .map_err(|e| format!("unshare the mount namespace: {e}"))?;
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("make the mount table private: {e}"))?;
    for peeled in 0..MAX_COVERS {
        for _ in 0..MAX_COVERS {
            if nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH).is_err() {
                break;
            }
        }
        match std::fs::remove_file(path) {
            Ok(()) => return Ok(()),
            // Gone before anything was peeled: removed meanwhile. Gone under a peeled
            // cover of another file system: the pin is not down this way.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && peeled == 0 => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(format!("not found under the mounts of {}", dir.display()));
            }
            Err(_) => {}
        }
        nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH)
            .map_err(|e| format!("still mounted under {}: {e}", dir.display()))?;
    }
    Err(format!(
        "still mounted under {} after {MAX_COVERS} covering mounts",
        dir.display()
    ))
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

    #[test]
    fn only_crius_netns_paths_are_taken_for_removal() {
        let ours = format!("{NETNS_DIR}/cni-{:032x}", 0xabcdu128);
        assert!(is_pinned_by_crius(Path::new(&ours)));
        for other in [
            "/etc/shadow",
            "/var/run/netns/cni-../../etc",
            "/var/run/netns/cni-ABCDEF0123456789abcdef0123456789",
            "/var/run/netns/other",
            "/var/run/netns/sub/cni-0000000000000000000000000000abcd",
        ] {
            assert!(!is_pinned_by_crius(Path::new(other)), "{other}");
        }
    }

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

    /// Whether `lo` is up in the namespace pinned at `path`, asked from a thread of its own.
    fn loopback_is_up(path: &Path) -> bool {
        let path = path.to_path_buf();
        std::thread::spawn(move || {
            use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
            enter(&path).unwrap();
            let fd =
                unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
            assert!(fd >= 0);
            let socket = unsafe { OwnedFd::from_raw_fd(fd) };
            let mut request = loopback_request();
            let read =
                unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut request) };
            assert!(read >= 0, "{}", std::io::Error::last_os_error());
            let flags = unsafe { request.ifr_ifru.ifru_flags };
            flags & libc::IFF_UP as libc::c_short != 0
        })
        .join()
        .unwrap()
    }

    /// `ip netns add` on the node bind-mounts the netns directory onto itself with what is
    /// under it: a namespace pinned before is still removed, and its original mount goes.
    #[tokio::test]
    async fn a_pin_hidden_by_a_later_mount_of_its_directory_is_still_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cni-hidden");
        create(&path).await.unwrap();
        nix::mount::mount(
            Some(dir.path()),
            dir.path(),
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .unwrap();
        let mounts_at = |p: &Path| {
            std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .lines()
                .filter(|l| l.split(' ').nth(4) == Some(&*p.to_string_lossy()))
                .count()
        };
        assert_eq!(mounts_at(&path), 2, "the pin and its copy");
        let removed = remove(&path).await;
        // The node's cover stays: the removal peeled it only in a private copy.
        let covered = mounts_at(dir.path());
        let _ = nix::mount::umount2(dir.path(), nix::mount::MntFlags::MNT_DETACH);
        removed.unwrap();
        assert_eq!(covered, 1, "the directory's cover is left alone");
        assert!(!path.exists());
        assert_eq!(mounts_at(&path), 0, "the hidden original is detached too");
    }

    #[tokio::test]
    async fn loopback_comes_up_in_the_pinned_namespace_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cni-lo");
        create(&path).await.unwrap();
        assert!(!loopback_is_up(&path), "a new namespace's lo is down");
        loopback_up(&path).await.unwrap();
        assert!(loopback_is_up(&path));
        // Twice is fine (a retried sandbox).
        loopback_up(&path).await.unwrap();
        remove(&path).await.unwrap();
        let gone = loopback_up(&path).await.unwrap_err();
        assert_eq!(gone.op, "open", "{gone}");
    }
}
