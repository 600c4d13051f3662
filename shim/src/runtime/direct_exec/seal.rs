//! The binary the exec helper runs from: for each exec, a sealed memfd copy (no writes, no
//! resizing) of `crius-exec-helper` installed beside the shim, or of the shim itself.
//!
//! Why a fresh copy and not the file on disk (not even read-only through a private
//! overlayfs mount, as runc 1.2 seals itself): the helper's child is inside the container
//! before its `execve`, and a program there whose interpreter is `/proc/self/exe` runs the
//! helper's binary again, where the container's processes can open it through
//! `/proc/<pid>/exe`. Sealed, the copy cannot be written; its own, it shares no page with a
//! host binary, so not even a kernel bug that writes through a file open for reading (Dirty
//! Pipe) reaches one. The helper alone is a fraction of the shim's size, so the copy costs
//! little.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// The exec helper's file name, beside the shim's binary.
pub const HELPER_NAME: &str = "crius-exec-helper";

/// The lowest descriptor the binary may have: below it sits the helper's pidfd.
const LOWEST_BINARY_FD: libc::c_int = 10;

/// The largest binary copied (the helper is 0.5 MB, the shim 2.5 MB; a debug build of the
/// shim tens of MB): a file beside the shim that is not a binary of ours is not copied.
const MAX_BINARY: u64 = 256 << 20;

/// `MFD_EXEC` (Linux 6.3): an executable memfd where `vm.memfd_noexec` would refuse one.
const MFD_EXEC: libc::c_uint = 0x10;

/// Set once the helper beside the shim turned out to be of another build (crius was
/// upgraded on disk under a running shim): from then on this shim copies itself.
static HELPER_OF_ANOTHER_BUILD: AtomicBool = AtomicBool::new(false);

/// Set once the host refused to run a sealed binary (a policy against executable memfds):
/// from then on this shim's execs go straight to runc, without a copy made for nothing.
static EXECS_FROM_MEMORY_REFUSED: AtomicBool = AtomicBool::new(false);

/// A sealed binary of the exec helper for one exec (blocking: it copies the binary).
pub fn sealed_binary() -> std::io::Result<OwnedFd> {
    if EXECS_FROM_MEMORY_REFUSED.load(Ordering::Relaxed) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "this host refused to run the exec helper from memory before",
        ));
    }
    let helper = if !takes_helper_beside() {
        None
    } else {
        std::fs::read_link("/proc/self/exe")
            .ok()
            .and_then(|exe| helper_beside(&exe))
    };
    match helper {
        Some(helper) => memfd_copy(helper),
        None => memfd_copy(File::open("/proc/self/exe")?),
    }
}

/// Whether execs copy the helper beside the shim (else the shim's own binary).
fn takes_helper_beside() -> bool {
    !HELPER_OF_ANOTHER_BUILD.load(Ordering::Relaxed)
}

/// Notes that the helper beside the shim declined for being of another build.
pub fn helper_is_of_another_build() {
    HELPER_OF_ANOTHER_BUILD.store(true, Ordering::Relaxed);
}

/// Notes that the host refused to run a sealed binary.
pub fn execs_from_memory_refused() {
    EXECS_FROM_MEMORY_REFUSED.store(true, Ordering::Relaxed);
}

/// `crius-exec-helper` in the directory of the binary `exe`, when it is installed there
/// (opened without blocking: a FIFO there would hold the open for ever).
fn helper_beside(exe: &Path) -> Option<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(exe.parent()?.join(HELPER_NAME))
        .ok()
}

/// `source` copied into a sealed memfd: a regular file of at most [`MAX_BINARY`] bytes,
/// copied whole.
fn memfd_copy(source: File) -> std::io::Result<OwnedFd> {
    let meta = source.metadata()?;
    if !meta.is_file() || meta.len() > MAX_BINARY {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("the exec helper's binary is not a regular file of at most {MAX_BINARY} bytes"),
        ));
    }
    let name = c"crius-exec-helper";
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: memfd_create reads the name and returns a new descriptor or -1.
    let mut fd = unsafe { libc::memfd_create(name.as_ptr(), flags | MFD_EXEC) };
    if fd < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        // SAFETY: as above, on a kernel that knows no MFD_EXEC.
        fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    }
    let mut copy = File::from(owned(fd)?);
    let copied = std::io::copy(&mut source.take(meta.len()), &mut copy)?;
    if copied != meta.len() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the exec helper's binary changed while it was copied",
        ));
    }
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: fcntl on a descriptor this function owns.
    if unsafe { libc::fcntl(copy.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // Out of the way of the pidfd the helper gets as descriptor 3.
    // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor or -1.
    owned(unsafe { libc::fcntl(copy.as_raw_fd(), libc::F_DUPFD_CLOEXEC, LOWEST_BINARY_FD) })
}

fn owned(fd: libc::c_int) -> std::io::Result<OwnedFd> {
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just made and owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn the_copy_is_the_binary_and_refuses_writes() {
        let copy = memfd_copy(File::open("/proc/self/exe").expect("exe")).expect("copy");
        assert!(copy.as_raw_fd() >= LOWEST_BINARY_FD);
        let path = format!("/proc/self/fd/{}", copy.as_raw_fd());
        let sealed = std::fs::read(&path).expect("read the copy");
        let own = std::fs::read("/proc/self/exe").expect("read the binary");
        assert!(sealed == own, "the copy differs from the binary");
        let mut file = File::from(copy);
        let err = file.write_all(b"x").expect_err("sealed");
        assert_eq!(err.raw_os_error(), Some(libc::EPERM));
        let err = file.set_len(1).expect_err("sealed");
        assert_eq!(err.raw_os_error(), Some(libc::EPERM));
        // SAFETY: fcntl queries on a descriptor this test owns.
        let (seals, fd_flags) = unsafe {
            (
                libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS),
                libc::fcntl(file.as_raw_fd(), libc::F_GETFD),
            )
        };
        let all = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
        assert_eq!(seals, all, "every seal, the seals themselves included");
        assert_ne!(fd_flags & libc::FD_CLOEXEC, 0, "not passed on to what runs");
    }

    #[test]
    fn only_a_regular_file_is_copied() {
        let err = memfd_copy(File::open("/dev/zero").expect("/dev/zero")).expect_err("endless");
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join(HELPER_NAME);
        let path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: mkfifo reads a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
        // Opened without waiting for a writer, and then refused.
        let opened = helper_beside(&dir.path().join("containerd-shim-crius-v2")).expect("open");
        assert!(memfd_copy(opened).is_err());
    }

    #[test]
    fn a_helper_of_another_build_is_not_copied_again() {
        let declined = crate::runtime::runc::RuncError::Failed {
            verb: "exec",
            message: format!(
                "{}{}",
                super::super::helper::DECLINED,
                super::super::helper::OTHER_BUILD
            ),
        };
        assert!(super::super::declined(&declined));
        assert!(!takes_helper_beside());
    }

    #[test]
    fn the_helper_beside_the_shim_is_taken_when_installed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let shim = dir.path().join("containerd-shim-crius-v2");
        assert!(helper_beside(&shim).is_none());
        std::fs::write(dir.path().join(HELPER_NAME), b"helper").expect("install");
        let mut found = helper_beside(&shim).expect("the helper beside the shim");
        let mut text = String::new();
        std::io::Read::read_to_string(&mut found, &mut text).expect("read");
        assert_eq!(text, "helper");
    }
}
