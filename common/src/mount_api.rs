//! The new mount API (Linux 5.12+ for idmapped mounts): a detached clone of a mount, its
//! attributes set (idmapped by a user namespace, read-only), attached elsewhere. The three
//! system calls have no wrapper in libc's function set; they are called through
//! `libc::syscall` here and nowhere else.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// A detached clone of the mount at `source` (with its submounts when `recursive`).
pub fn clone_tree(source: &Path, recursive: bool) -> io::Result<OwnedFd> {
    let path = c_path(source)?;
    let mut flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: a NUL-terminated path that outlives the call; the result is a new fd.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, path.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel just returned this fd, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Idmaps a detached tree with the user namespace open at `userns` (and makes it read-only
/// when `read_only`).
pub fn set_idmap(
    tree: &OwnedFd,
    userns: BorrowedFd<'_>,
    recursive: bool,
    read_only: bool,
) -> io::Result<()> {
    let mut attr_set = libc::MOUNT_ATTR_IDMAP;
    if read_only {
        attr_set |= libc::MOUNT_ATTR_RDONLY;
    }
    let attr = libc::mount_attr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    let flags = libc::AT_EMPTY_PATH | if recursive { libc::AT_RECURSIVE } else { 0 };
    // SAFETY: the fds are open, the attr struct lives across the call and its size is
    // passed with it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            flags,
            &raw const attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Attaches a detached tree at `target` (an existing directory, or a file for a file).
pub fn attach(tree: &OwnedFd, target: &Path) -> io::Result<()> {
    let target = c_path(target)?;
    // SAFETY: an open fd, an empty C string and a NUL-terminated path that outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
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
    fn a_path_with_a_nul_is_refused_before_any_call() {
        let err = clone_tree(Path::new("a\0b"), false).expect_err("refused");
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn a_missing_source_is_an_os_error() {
        let err = clone_tree(Path::new("/nonexistent/crius-common-test"), false)
            .expect_err("no such path");
        // ENOENT, or EPERM/ENOSYS where the sandbox forbids open_tree.
        assert!(err.raw_os_error().is_some(), "{err}");
    }
}
