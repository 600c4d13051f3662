//! The pod's holder: the one process that keeps a pod's namespaces when containerd drives
//! the pod through the sandbox API (there is no pause container). The shim clones it
//! straight into the pod's new PID, IPC and UTS namespaces and its network namespace, so it
//! is PID 1 of the pod; it sets the pod's sysctls in them, then execs the shim binary again
//! as `pause`, which reaps what is reparented to it and ends on SIGTERM or SIGINT.

use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use nix::sched::CloneFlags;
use nix::sys::signal::{SigSet, Signal};

use crate::error::ShimError;

/// The argument that runs the shim binary as a pod's holder.
pub const PAUSE_ACTION: &str = "pause";
const STACK_SIZE: usize = 256 * 1024;

/// The namespaces a pod's holder gets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Namespaces {
    /// The network namespace to join (containerd's CRI made it and ran CNI in it); None:
    /// the host's.
    pub netns: Option<PathBuf>,
    /// A PID namespace of the pod's own, the holder its PID 1 (false: the host's).
    pub pid: bool,
    pub ipc: bool,
    /// A UTS namespace with the pod's hostname (false with the host's network).
    pub uts: bool,
    pub hostname: String,
    /// The pod's sysctls, set in its namespaces: (path below /proc/sys, value).
    pub sysctls: Vec<(String, String)>,
}

impl Namespaces {
    fn clone_flags(&self) -> CloneFlags {
        let mut flags = CloneFlags::empty();
        if self.pid {
            flags |= CloneFlags::CLONE_NEWPID;
        }
        if self.ipc {
            flags |= CloneFlags::CLONE_NEWIPC;
        }
        if self.uts {
            flags |= CloneFlags::CLONE_NEWUTS;
        }
        flags
    }
}

/// What the child reports through the pipe when it fails before exec: the step and errno.
fn failure(step: u8) -> [u8; 5] {
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    let e = errno.to_le_bytes();
    [step, e[0], e[1], e[2], e[3]]
}

/// Starts the holder and returns its pid once it has exec'd. The caller must hold a
/// [`crate::shim::Starting`] so an early exit is kept for it.
pub fn spawn(namespaces: &Namespaces) -> Result<i32, ShimError> {
    let exe = std::env::current_exe().map_err(|e| ShimError::io("shim binary".into(), e))?;
    let exe = CString::new(exe.as_os_str().as_bytes())
        .map_err(|e| ShimError::Internal(format!("shim binary path: {e}")))?;
    let action = CString::new(PAUSE_ACTION).map_err(|e| ShimError::Internal(e.to_string()))?;
    let hostname = if namespaces.uts && !namespaces.hostname.is_empty() {
        Some(namespaces.hostname.clone().into_bytes())
    } else {
        None
    };
    let netns: Option<OwnedFd> = match &namespaces.netns {
        Some(path) => Some(
            std::fs::File::open(path)
                .map_err(|e| {
                    ShimError::io(format!("open network namespace {}", path.display()), e)
                })?
                .into(),
        ),
        None => None,
    };
    let sysctls = namespaces
        .sysctls
        .iter()
        .map(|(path, value)| {
            CString::new(format!("/proc/sys/{path}"))
                .map(|path| (path, value.clone().into_bytes()))
                .map_err(|e| ShimError::InvalidArgument(format!("sysctl {path}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (reader, writer) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| ShimError::io("pipe".into(), e.into()))?;
    let argv = [exe.as_ptr(), action.as_ptr(), std::ptr::null()];
    let root = c"/";
    let mut stack = vec![0u8; STACK_SIZE];
    let writer_fd = writer.as_raw_fd();
    // Only raw system calls between clone and exec: the child is a copy of a threaded process.
    let child = Box::new(|| -> isize {
        let fail = |step: u8| -> isize {
            let report = failure(step);
            // SAFETY: writes a stack buffer to the pipe's write end.
            unsafe { libc::write(writer_fd, report.as_ptr().cast(), report.len()) };
            1
        };
        // SAFETY: raw system calls on fds and buffers that outlive the child's use of them.
        unsafe {
            if let Some(fd) = &netns
                && libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) != 0
            {
                return fail(1);
            }
            if let Some(name) = &hostname
                && libc::sethostname(name.as_ptr().cast(), name.len()) != 0
            {
                return fail(2);
            }
            for (path, value) in &sysctls {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return fail(5);
                }
                let written = libc::write(fd, value.as_ptr().cast(), value.len());
                libc::close(fd);
                if written < 0 {
                    return fail(5);
                }
            }
            if libc::chdir(root.as_ptr()) != 0 {
                return fail(3);
            }
            libc::execv(exe.as_ptr(), argv.as_ptr());
        }
        fail(4)
    });
    // SAFETY: the child runs only the system calls above, then execs or exits.
    let pid = unsafe {
        nix::sched::clone(
            child,
            &mut stack,
            namespaces.clone_flags(),
            Some(libc::SIGCHLD),
        )
    }
    .map_err(|e| ShimError::io("clone the pod's holder".into(), e.into()))?;
    drop(writer);
    let mut report = Vec::new();
    std::fs::File::from(reader)
        .read_to_end(&mut report)
        .map_err(|e| ShimError::io("read the pod holder's start".into(), e))?;
    if report.len() >= 5 {
        let errno = i32::from_le_bytes([report[1], report[2], report[3], report[4]]);
        let step = match report[0] {
            1 => "join the network namespace",
            2 => "set the hostname",
            3 => "change to /",
            5 => "set the pod's sysctls",
            _ => "exec the shim as the holder",
        };
        return Err(ShimError::io(
            format!("pod holder: {step}"),
            std::io::Error::from_raw_os_error(errno),
        ));
    }
    Ok(pid.as_raw())
}

/// The holder's life: reap what ends in the pod, end on SIGTERM or SIGINT.
pub fn pause() -> ! {
    let mut signals = SigSet::empty();
    for signal in [Signal::SIGCHLD, Signal::SIGTERM, Signal::SIGINT] {
        signals.add(signal);
    }
    if signals.thread_block().is_err() {
        std::process::exit(1);
    }
    loop {
        match signals.wait() {
            Ok(Signal::SIGCHLD) => reap_all(),
            Ok(_) => std::process::exit(0),
            Err(_) => {}
        }
    }
}

fn reap_all() {
    loop {
        // SAFETY: waitpid on any child, without keeping its status.
        let pid = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_follow_the_namespaces_asked_for() {
        let host = Namespaces::default();
        assert!(host.clone_flags().is_empty());
        let pod = Namespaces {
            pid: true,
            ipc: true,
            uts: true,
            ..Default::default()
        };
        assert_eq!(
            pod.clone_flags(),
            CloneFlags::CLONE_NEWPID | CloneFlags::CLONE_NEWIPC | CloneFlags::CLONE_NEWUTS
        );
    }

    #[test]
    fn a_failure_report_carries_step_and_errno() {
        // SAFETY: sets errno for the test.
        unsafe { *libc::__errno_location() = libc::ENOENT };
        let report = failure(2);
        assert_eq!(report[0], 2);
        assert_eq!(
            i32::from_le_bytes([report[1], report[2], report[3], report[4]]),
            libc::ENOENT
        );
    }
}
