//! Process file descriptors (Linux 5.3+; signals through one since 5.1): a handle on one
//! process that a pid reused after it ends never reaches.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A pidfd for the process `pid` (readable once it exits, close-on-exec).
pub fn open(pid: i32) -> io::Result<OwnedFd> {
    if pid <= 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the descriptor was just returned to this process and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sends `signal` to the process behind `pidfd` (ESRCH once it has ended).
pub fn send_signal(pidfd: &OwnedFd, signal: i32) -> io::Result<()> {
    // SAFETY: an open pidfd, a signal number, no siginfo and no flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_reaches_the_process_and_an_ended_one_is_esrch() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("spawn sleep");
        let pid = i32::try_from(child.id()).expect("pid");
        let fd = open(pid).expect("pidfd");
        send_signal(&fd, libc::SIGTERM).expect("signal");
        let status = child.wait().expect("wait");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGTERM));
        // Reaped: the pidfd names no process any more, whoever takes its pid.
        let err = send_signal(&fd, libc::SIGTERM).expect_err("ended");
        assert_eq!(err.raw_os_error(), Some(libc::ESRCH));
    }

    #[test]
    fn no_pidfd_for_a_pid_that_is_not_one() {
        assert_eq!(open(0).expect_err("0").raw_os_error(), Some(libc::EINVAL));
        assert_eq!(open(-1).expect_err("-1").raw_os_error(), Some(libc::EINVAL));
    }
}
