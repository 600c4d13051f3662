//! The shim's own exec: for a container runc made, an exec whose spec asks nothing runc
//! alone does runs through the exec helper (`helper.rs`, the shim binary run from a sealed
//! copy in memory) rather than `runc exec`, which starts two Go programs (`runc` and `runc
//! init`) and takes most of an exec probe's time. Anything else goes to runc as before: a
//! terminal, an LSM label, seccomp, a user or time namespace, a personality, Intel RDT,
//! systemd cgroups, a runtime other than runc, a kernel older than 5.8 (no `setns` on a
//! pidfd).

mod cgroups;
mod child;
pub mod helper;
mod lookup;
pub mod spec;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use crate::container::BundleSpec;
use crate::reaper::Reaper;
use crate::runc::{ProcessStdio, Runc, RuncError};

/// crius's mark on a container whose handler sends every exec to runc
/// (`exec_with_runtime`).
pub const EXEC_WITH_RUNTIME: &str = "io.crius.exec-with-runtime";

/// Whether the shim may run this container's execs itself, from its spec and runtime.
pub fn container_allows(spec: &BundleSpec, runc: &Runc) -> bool {
    let marked = spec.annotations.get(EXEC_WITH_RUNTIME).map(String::as_str) == Some("true");
    !marked
        && runc.is_runc()
        && !runc.systemd_cgroup
        && spec.plain_for_exec()
        && kernel_has_pidfd_setns()
}

/// Linux 5.8 joins a process's namespaces through its pidfd.
fn kernel_has_pidfd_setns() -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        nix::sys::utsname::uname()
            .ok()
            .and_then(|u| release_at_least(&u.release().to_string_lossy(), (5, 8)))
            .unwrap_or(false)
    })
}

fn release_at_least(release: &str, wanted: (u32, u32)) -> Option<bool> {
    let mut parts = release.split(['.', '-']);
    let major: u32 = parts.next()?.parse().ok()?;
    let minor: u32 = parts.next()?.parse().ok()?;
    Some((major, minor) >= wanted)
}

/// Runs an exec as `runc exec --detach --pid-file` does, through the helper: the process
/// runs when this returns, its pid in `pid_file`.
pub async fn exec(
    reaper: &Reaper,
    runc: &Runc,
    container_id: &str,
    init_pid: i32,
    process_file: &Path,
    pid_file: &Path,
    stdio: ProcessStdio,
) -> Result<(), RuncError> {
    let failed = |message: String| RuncError::Failed {
        verb: "exec",
        message,
    };
    let init = pidfd_open(init_pid).map_err(|e| {
        failed(format!(
            "exec failed: cannot exec in a stopped container ({container_id}: {e})"
        ))
    })?;
    let binary = tokio::task::spawn_blocking(sealed_copy_of_self)
        .await
        .map_err(|e| failed(format!("copy the shim binary: {e}")))?
        .map_err(|e| failed(format!("copy the shim binary: {e}")))?;
    let args = helper::HelperArgs {
        process: process_file.to_path_buf(),
        pid_file: pid_file.to_path_buf(),
        log: runc.log.clone(),
        keyring: if runc.no_new_keyring {
            String::new()
        } else {
            format!("_ses.{container_id}")
        },
    };
    let mut command = Command::new(format!("/proc/self/fd/{}", binary.as_raw_fd()));
    command
        .arg0("containerd-shim-crius-v2")
        .args(args.to_args());
    let init_fd = init.as_raw_fd();
    // SAFETY: dup2 and fcntl are async-signal-safe; the closure touches nothing else.
    unsafe {
        command.pre_exec(move || {
            if init_fd == helper::INIT_PIDFD {
                // dup2 onto itself keeps close-on-exec: clear it instead.
                if libc::fcntl(init_fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(init_fd, helper::INIT_PIDFD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    let ran = runc.run_with_stdio(reaper, "exec", command, stdio).await;
    drop((init, binary));
    ran
}

fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open returns a new descriptor (close-on-exec) or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just made and owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The running shim binary copied into a sealed memfd (no writes, no resizing), from
/// which the helper runs.
fn sealed_copy_of_self() -> std::io::Result<OwnedFd> {
    let name = c"containerd-shim-crius-v2";
    // SAFETY: memfd_create reads the name and returns a new descriptor or -1.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just made and owned by no one else.
    let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut copy = std::fs::File::from(memfd);
    let mut own = std::fs::File::open("/proc/self/exe")?;
    std::io::copy(&mut own, &mut copy)?;
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: fcntl on a descriptor this function owns.
    if unsafe { libc::fcntl(copy.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(OwnedFd::from(copy))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_of_runc_without_what_only_runc_does_allows_the_shims_exec() {
        let runc = crate::runc::runc_for(&Default::default(), "k8s.io", Path::new("/b"));
        let spec = |json: &str| -> BundleSpec { serde_json::from_str(json).expect("spec") };
        let plain = spec(r#"{"linux":{"namespaces":[{"type":"pid"},{"type":"mount"}]}}"#);
        assert!(container_allows(&plain, &runc));
        let crun = crate::runc::runc_for(
            &crate::runc::RuncOptions {
                binary: "crun".into(),
                ..Default::default()
            },
            "k8s.io",
            Path::new("/b"),
        );
        assert!(!container_allows(&plain, &crun));
        for json in [
            r#"{"annotations":{"io.crius.exec-with-runtime":"true"}}"#,
            r#"{"linux":{"seccomp":{"defaultAction":"SCMP_ACT_ERRNO"}}}"#,
            r#"{"linux":{"namespaces":[{"type":"user"}]}}"#,
            r#"{"linux":{"namespaces":[{"type":"time"}]}}"#,
            r#"{"linux":{"personality":{"domain":"LINUX32"}}}"#,
            r#"{"linux":{"intelRdt":{"closID":"x"}}}"#,
            r#"{"linux":{"mountLabel":"system_u:object_r:container_file_t:s0"}}"#,
            r#"{"linux":{"uidMappings":[{"containerID":0,"hostID":1000,"size":1}]}}"#,
        ] {
            assert!(!container_allows(&spec(json), &runc), "{json}");
        }
    }

    #[test]
    fn kernel_releases_compare_by_major_and_minor() {
        assert_eq!(release_at_least("6.18.0-1-amd64", (5, 8)), Some(true));
        assert_eq!(release_at_least("5.8.0", (5, 8)), Some(true));
        assert_eq!(release_at_least("5.4.0-150-generic", (5, 8)), Some(false));
        assert_eq!(release_at_least("4.19.0", (5, 8)), Some(false));
        assert_eq!(release_at_least("garbage", (5, 8)), None);
    }

    #[test]
    fn the_sealed_copy_is_the_binary_and_refuses_writes() {
        use std::io::Write;
        let copy = sealed_copy_of_self().expect("copy");
        let mut file = std::fs::File::from(copy);
        let own = std::fs::metadata("/proc/self/exe").expect("exe");
        assert_eq!(file.metadata().expect("copy").len(), own.len());
        let err = file.write_all(b"x").expect_err("sealed");
        assert_eq!(err.raw_os_error(), Some(libc::EPERM));
    }
}
