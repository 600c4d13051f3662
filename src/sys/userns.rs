//! Pod user namespaces (`hostUsers: false`): the mappings kubelet asks for, checked as the
//! CRI says, and the namespace itself, made by a short-lived child process. A pod's network
//! namespace is made inside it, so the pod owns its network (sysfs mounts and net sysctls
//! work in the pod). Both are pinned by bind mounts, so they outlive every process in them.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::mount::MsFlags;
use nix::sys::wait::waitpid;
use nix::unistd::{ForkResult, Pid};
use serde::{Deserialize, Serialize};

use crate::api::v1::{IdMapping, NamespaceMode, PodSandboxConfig};

/// One contiguous range of IDs: `size` IDs from `container_id` inside are `host_id` on
/// the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdRange {
    pub container_id: u32,
    pub host_id: u32,
    pub size: u32,
}

impl IdRange {
    /// The line `/proc/<pid>/uid_map` takes.
    fn map_line(&self) -> String {
        format!("{} {} {}\n", self.container_id, self.host_id, self.size)
    }

    /// The host ID of the ID `id` inside, if the range maps it.
    pub fn to_host(&self, id: u32) -> Option<u32> {
        let offset = id.checked_sub(self.container_id)?;
        (offset < self.size).then(|| self.host_id + offset)
    }
}

/// A pod's uid and gid mappings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mappings {
    pub uids: IdRange,
    pub gids: IdRange,
}

impl Mappings {
    /// Container IDs 0.. mapped to host IDs `host_id`.., `size` of them, for users and
    /// groups alike.
    #[cfg(test)]
    pub(crate) fn from_zero(host_id: u32, size: u32) -> Self {
        let range = IdRange {
            container_id: 0,
            host_id,
            size,
        };
        Self {
            uids: range,
            gids: range,
        }
    }

    /// The host uid and gid of root inside.
    pub fn host_root(&self) -> (u32, u32) {
        (self.uids.host_id, self.gids.host_id)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MappingError {
    #[error("user namespace mode {0} is not supported: only POD and NODE are")]
    UnsupportedMode(String),
    #[error("a pod in the host's user namespace (NODE) takes no {0} mappings")]
    MappingsWithNode(&'static str),
    #[error("a pod's user namespace needs exactly one {what} mapping, got {count}")]
    RangeCount { what: &'static str, count: usize },
    #[error("the {0} mapping must map container ID 0")]
    RootNotMapped(&'static str),
    #[error("the {0} mapping is empty")]
    Empty(&'static str),
    #[error("the {0} mapping runs past the largest ID (2^32 - 1)")]
    Overflow(&'static str),
}

/// The mappings of a pod that asks for its own user namespace; `None` for the host's.
pub fn pod_mappings(config: &PodSandboxConfig) -> Result<Option<Mappings>, MappingError> {
    let Some(options) = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref())
        .and_then(|n| n.userns_options.as_ref())
    else {
        return Ok(None);
    };
    match NamespaceMode::try_from(options.mode) {
        Ok(NamespaceMode::Node) => {
            if !options.uids.is_empty() {
                return Err(MappingError::MappingsWithNode("uid"));
            }
            if !options.gids.is_empty() {
                return Err(MappingError::MappingsWithNode("gid"));
            }
            Ok(None)
        }
        Ok(NamespaceMode::Pod) => Ok(Some(Mappings {
            uids: one_range("uid", &options.uids)?,
            gids: one_range("gid", &options.gids)?,
        })),
        Ok(other) => Err(MappingError::UnsupportedMode(
            other.as_str_name().to_string(),
        )),
        Err(_) => Err(MappingError::UnsupportedMode(options.mode.to_string())),
    }
}

/// The one range a pod's mapping must be, mapping container ID 0.
fn one_range(what: &'static str, ranges: &[IdMapping]) -> Result<IdRange, MappingError> {
    let [range] = ranges else {
        return Err(MappingError::RangeCount {
            what,
            count: ranges.len(),
        });
    };
    if range.container_id != 0 {
        return Err(MappingError::RootNotMapped(what));
    }
    if range.length == 0 {
        return Err(MappingError::Empty(what));
    }
    if u64::from(range.host_id) + u64::from(range.length) > u64::from(u32::MAX) + 1 {
        return Err(MappingError::Overflow(what));
    }
    Ok(IdRange {
        container_id: range.container_id,
        host_id: range.host_id,
        size: range.length,
    })
}

#[derive(Debug, thiserror::Error)]
#[error("user namespace: {op}: {reason}")]
pub struct UsernsError {
    pub op: String,
    pub reason: String,
}

fn fail(op: impl Into<String>, reason: impl ToString) -> UsernsError {
    UsernsError {
        op: op.into(),
        reason: reason.to_string(),
    }
}

/// A child process that sits in a new user namespace with the given mappings (and, when
/// asked, a new network namespace owned by it) until dropped: while it lives, its
/// namespaces can be pinned or used for idmapped mounts.
pub struct Holder {
    pid: Pid,
    /// The child exits when this closes.
    release: Option<OwnedFd>,
}

impl Holder {
    /// Forks the child, waits until it has unshared, and writes its mappings. Blocking:
    /// call it off the async threads.
    pub fn spawn(mappings: &Mappings, with_netns: bool) -> Result<Holder, UsernsError> {
        // One at a time: a child forked (without exec) by a concurrent spawn would hold a
        // copy of this spawn's pipe ends, and neither would ever see its EOF.
        static SPAWNING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = SPAWNING.lock().unwrap_or_else(|p| p.into_inner());
        let (ready_read, ready_write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| fail("pipe", e))?;
        let (release_read, release_write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| fail("pipe", e))?;
        let mut flags = libc::CLONE_NEWUSER;
        if with_netns {
            flags |= libc::CLONE_NEWNET;
        }
        // SAFETY: the child only makes raw system calls (close, unshare, write, read,
        // _exit): nothing that allocates or takes a lock another thread may hold.
        match unsafe { nix::unistd::fork() }.map_err(|e| fail("fork", e))? {
            ForkResult::Child => {
                let code = child_main(
                    flags,
                    ready_write.as_raw_fd(),
                    release_read.as_raw_fd(),
                    [ready_read.as_raw_fd(), release_write.as_raw_fd()],
                );
                // SAFETY: ends the child without running the parent's exit handlers.
                unsafe { libc::_exit(code) }
            }
            ForkResult::Parent { child } => {
                drop(ready_write);
                drop(release_read);
                let holder = Holder {
                    pid: child,
                    release: Some(release_write),
                };
                wait_until_unshared(ready_read)?;
                holder.write_mappings(mappings)?;
                Ok(holder)
            }
        }
    }

    /// A user namespace with some mappings, for checks that need one (blocking).
    pub fn throwaway() -> Result<Holder, UsernsError> {
        let range = IdRange {
            container_id: 0,
            host_id: 65536,
            size: 65536,
        };
        Holder::spawn(
            &Mappings {
                uids: range,
                gids: range,
            },
            false,
        )
    }

    /// `/proc/<child>/ns/<kind>`.
    pub fn ns_path(&self, kind: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/{kind}", self.pid))
    }

    /// Pins the child's namespace of `kind` by a bind mount on `target` (a file it
    /// creates).
    pub fn pin(&self, kind: &str, target: &Path) -> Result<(), UsernsError> {
        if let Some(dir) = target.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| fail(format!("create {}", dir.display()), e))?;
        }
        File::create(target).map_err(|e| fail(format!("create {}", target.display()), e))?;
        nix::mount::mount(
            Some(&self.ns_path(kind)),
            target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| {
            let _ = std::fs::remove_file(target);
            fail(
                format!("pin the {kind} namespace at {}", target.display()),
                e,
            )
        })
    }

    fn write_mappings(&self, mappings: &Mappings) -> Result<(), UsernsError> {
        for (file, range) in [("uid_map", mappings.uids), ("gid_map", mappings.gids)] {
            let path = format!("/proc/{}/{file}", self.pid);
            // The kernel takes the whole map in one write.
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .and_then(|mut f| f.write_all(range.map_line().as_bytes()))
                .map_err(|e| fail(format!("write {path}"), e))?;
        }
        Ok(())
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.release.take();
        let _ = waitpid(self.pid, None);
    }
}

/// Reads the child's report: `K`, or `E` and the errno of its unshare (exactly those
/// bytes: no wait for an EOF another process could hold off).
fn wait_until_unshared(ready: OwnedFd) -> Result<(), UsernsError> {
    let mut ready = File::from(ready);
    let mut kind = [0u8; 1];
    if ready.read_exact(&mut kind).is_err() {
        return Err(fail("unshare", "the child exited without a report"));
    }
    match kind[0] {
        b'K' => Ok(()),
        b'E' => {
            let mut errno = [0u8; 4];
            ready
                .read_exact(&mut errno)
                .map_err(|e| fail("read the child's report", e))?;
            let errno = i32::from_ne_bytes(errno);
            Err(fail("unshare", nix::errno::Errno::from_raw(errno)))
        }
        other => Err(fail("unshare", format!("unexpected report {other:#x}"))),
    }
}

/// The child: unshare, report, then wait for the parent to close the release pipe. Only
/// raw system calls: it runs right after a fork of a multi-threaded process.
fn child_main(flags: libc::c_int, ready: i32, release: i32, parent_ends: [i32; 2]) -> i32 {
    // SAFETY: plain system calls on fds this process owns and stack buffers.
    unsafe {
        for fd in parent_ends {
            libc::close(fd);
        }
        // Gone with the thread that forked it, whatever happens to the pipes.
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::unshare(flags) != 0 {
            let errno = *libc::__errno_location();
            let mut report = [b'E', 0, 0, 0, 0];
            report[1..].copy_from_slice(&errno.to_ne_bytes());
            libc::write(ready, report.as_ptr().cast(), report.len());
            return 1;
        }
        libc::write(ready, b"K".as_ptr().cast(), 1);
        libc::close(ready);
        let mut byte = 0u8;
        // Returns at EOF: the parent closed its end, or died.
        while libc::read(release, (&raw mut byte).cast(), 1) > 0 {}
        0
    }
}

/// Whether this process can make a user namespace with mappings (blocking).
pub fn probe() -> Result<(), String> {
    Holder::throwaway().map(drop).map_err(|e| e.to_string())
}

/// Makes a pod's user namespace with `mappings`, pinned at `userns_pin`, and, for a pod
/// with its own network, its network namespace inside it, pinned at `netns_pin`.
pub async fn create_pod_namespaces(
    mappings: Mappings,
    userns_pin: PathBuf,
    netns_pin: Option<PathBuf>,
) -> Result<(), UsernsError> {
    tokio::task::spawn_blocking(move || {
        let holder = Holder::spawn(&mappings, netns_pin.is_some())?;
        holder.pin("user", &userns_pin)?;
        if let Some(netns) = &netns_pin
            && let Err(e) = holder.pin("net", netns)
        {
            let _ = unpin(&userns_pin);
            return Err(e);
        }
        Ok(())
    })
    .await
    .map_err(|e| fail("create", e))?
}

/// Unmounts and removes a pinned namespace; a missing one is fine.
pub fn unpin(path: &Path) -> Result<(), UsernsError> {
    crate::sys::mount::unpin(path).map_err(|(op, e)| fail(format!("{op} {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1::{LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceOption};

    fn config(mode: NamespaceMode, uids: Vec<IdMapping>, gids: Vec<IdMapping>) -> PodSandboxConfig {
        PodSandboxConfig {
            linux: Some(LinuxPodSandboxConfig {
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        userns_options: Some(crate::api::v1::UserNamespace {
                            mode: mode as i32,
                            uids,
                            gids,
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn range(container_id: u32, host_id: u32, length: u32) -> IdMapping {
        IdMapping {
            container_id,
            host_id,
            length,
        }
    }

    #[test]
    fn pod_mode_takes_one_range_from_zero() {
        let one = vec![range(0, 1000, 100000)];
        let mappings = pod_mappings(&config(NamespaceMode::Pod, one.clone(), one))
            .unwrap()
            .unwrap();
        assert_eq!(mappings.host_root(), (1000, 1000));
        assert_eq!(mappings.uids.to_host(99999), Some(100999));
        assert_eq!(mappings.uids.to_host(100000), None);
        assert_eq!(mappings.uids.map_line(), "0 1000 100000\n");
    }

    #[test]
    fn bad_mappings_are_refused() {
        let one = vec![range(0, 1000, 100000)];
        let two = vec![range(0, 1000, 100000), range(0, 2000, 100000)];
        let cases = [
            (
                config(NamespaceMode::Pod, two.clone(), two),
                MappingError::RangeCount {
                    what: "uid",
                    count: 2,
                },
            ),
            (
                config(NamespaceMode::Pod, one.clone(), vec![]),
                MappingError::RangeCount {
                    what: "gid",
                    count: 0,
                },
            ),
            (
                config(NamespaceMode::Pod, vec![range(1, 1000, 10)], one.clone()),
                MappingError::RootNotMapped("uid"),
            ),
            (
                config(NamespaceMode::Pod, one.clone(), vec![range(0, 1000, 0)]),
                MappingError::Empty("gid"),
            ),
            (
                config(NamespaceMode::Pod, vec![range(0, u32::MAX, 2)], one.clone()),
                MappingError::Overflow("uid"),
            ),
            (
                config(NamespaceMode::Node, one.clone(), vec![]),
                MappingError::MappingsWithNode("uid"),
            ),
            (
                config(NamespaceMode::Container, vec![], vec![]),
                MappingError::UnsupportedMode("CONTAINER".to_string()),
            ),
            (
                config(NamespaceMode::Target, vec![], vec![]),
                MappingError::UnsupportedMode("TARGET".to_string()),
            ),
        ];
        for (config, expected) in cases {
            assert_eq!(pod_mappings(&config), Err(expected));
        }
    }

    #[test]
    fn node_mode_and_no_options_use_the_hosts() {
        assert_eq!(
            pod_mappings(&config(NamespaceMode::Node, vec![], vec![])),
            Ok(None)
        );
        assert_eq!(pod_mappings(&PodSandboxConfig::default()), Ok(None));
    }

    #[test]
    fn the_last_id_fits() {
        let top = vec![range(0, u32::MAX - 9, 10)];
        assert!(
            pod_mappings(&config(NamespaceMode::Pod, top.clone(), top))
                .unwrap()
                .is_some()
        );
    }

    /// Needs root (as the whole test suite does).
    #[tokio::test]
    async fn pinned_namespaces_carry_the_mappings() {
        let dir = tempfile::tempdir().unwrap();
        let (user, net) = (dir.path().join("user"), dir.path().join("net"));
        let mappings = Mappings {
            uids: IdRange {
                container_id: 0,
                host_id: 200000,
                size: 65536,
            },
            gids: IdRange {
                container_id: 0,
                host_id: 300000,
                size: 65536,
            },
        };
        create_pod_namespaces(mappings, user.clone(), Some(net.clone()))
            .await
            .unwrap();
        assert!(crate::sys::netns::is_pinned(&user));
        assert!(crate::sys::netns::is_pinned(&net));
        // The netns is owned by the pinned userns (NS_GET_USERNS), which has the mappings:
        // checked through a process that joins both.
        let out = std::process::Command::new("nsenter")
            .arg(format!("--user={}", user.display()))
            .arg(format!("--net={}", net.display()))
            .args(["cat", "/proc/self/uid_map", "/proc/self/gid_map"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines,
            vec![vec!["0", "200000", "65536"], vec!["0", "300000", "65536"]],
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        unpin(&net).unwrap();
        unpin(&user).unwrap();
        unpin(&user).unwrap();
        assert!(!user.exists() && !net.exists());
    }
}
