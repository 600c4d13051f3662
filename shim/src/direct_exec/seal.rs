//! The binary the exec helper runs from, sealed so that a container process reaching it
//! through `/proc/<pid>/exe` while the helper runs in its namespaces can never write the
//! shim's binary on the host (CVE-2019-5736).
//!
//! The shim's own file seen through a private read-only overlayfs mount (attached
//! nowhere, the way runc 1.2 seals itself) costs nothing per exec: it is made once per shim
//! and every exec runs a duplicate of its descriptor. Where the kernel cannot make one
//! (no `fsopen`, no overlayfs), each exec gets a sealed memfd copy of the binary instead.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::OnceLock;

/// The lowest descriptor the binary may have: below it sits the helper's pidfd.
const LOWEST_BINARY_FD: libc::c_int = 10;

/// `MFD_EXEC` (Linux 6.3): an executable memfd where `vm.memfd_noexec` would refuse one.
const MFD_EXEC: libc::c_uint = 0x10;

/// The overlay handle, made at the first exec; `None` when the kernel could not make it.
static OVERLAY: OnceLock<Option<OwnedFd>> = OnceLock::new();

/// A sealed binary of the running shim for one exec (blocking: it may copy the binary).
pub fn sealed_binary() -> std::io::Result<OwnedFd> {
    let overlay = OVERLAY.get_or_init(|| match overlay_of_self() {
        Ok(fd) => Some(fd),
        Err(e) => {
            log::debug!("no overlayfs seal of the shim binary ({e}): execs copy it");
            None
        }
    });
    match overlay {
        Some(fd) => duplicate_high(fd),
        None => memfd_copy_of_self(),
    }
}

/// The shim's binary as a file of a read-only overlayfs whose top layer is the binary's
/// directory: the file can be run and read, and every open for writing fails (EROFS).
fn overlay_of_self() -> std::io::Result<OwnedFd> {
    let exe = std::fs::read_link("/proc/self/exe")?;
    let (Some(dir), Some(name)) = (exe.parent(), exe.file_name()) else {
        return Err(std::io::Error::other(format!(
            "{} has no directory",
            exe.display()
        )));
    };
    // overlayfs without an upper layer needs two lower ones; the second, the working
    // directory (the bundle), lies below the binary's and can hide nothing of it.
    let below = std::env::current_dir()?;
    let context = fsopen_overlay()?;
    let lower = format!("{}:{}", escape_lower_dir(dir), escape_lower_dir(&below));
    fsconfig_string(&context, "lowerdir", &lower)?;
    // xino only adds kernel log lines when the layers are on different filesystems.
    let _ = fsconfig_string(&context, "xino", "off");
    fsconfig_create(&context)?;
    let mount = fsmount_read_only(&context)?;
    let name = CString::new(name.as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: openat reads the name and returns a new descriptor or -1.
    let fd = unsafe {
        libc::openat(
            mount.as_raw_fd(),
            name.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    let file = owned(fd)?;
    ensure_same_file(&file, &exe)?;
    duplicate_high(&file)
}

/// The binary the overlay shows must be the one running (not one installed over it since):
/// an exec helper of another build could read its arguments differently. overlayfs gives
/// its files its own device and inode numbers, so size and times stand for identity.
fn ensure_same_file(file: &OwnedFd, exe: &Path) -> std::io::Result<()> {
    let seen = std::fs::metadata(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
    let running = std::fs::metadata("/proc/self/exe")?;
    let same = seen.len() == running.len()
        && (seen.mtime(), seen.mtime_nsec()) == (running.mtime(), running.mtime_nsec())
        && (seen.ctime(), seen.ctime_nsec()) == (running.ctime(), running.ctime_nsec());
    if same {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "{} is no longer the running binary",
            exe.display()
        )))
    }
}

/// A path as one overlayfs `lowerdir` entry: `:` separates layers, `\` escapes.
fn escape_lower_dir(path: &Path) -> String {
    path.to_string_lossy()
        .replace('\\', "\\\\")
        .replace(':', "\\:")
}

fn fsopen_overlay() -> std::io::Result<OwnedFd> {
    // SAFETY: fsopen reads the name and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_fsopen, c"overlay".as_ptr(), libc::FSOPEN_CLOEXEC) };
    owned(fd as libc::c_int)
}

fn fsconfig_string(context: &OwnedFd, key: &str, value: &str) -> std::io::Result<()> {
    let key = CString::new(key).map_err(std::io::Error::other)?;
    let value = CString::new(value).map_err(std::io::Error::other)?;
    // SAFETY: fsconfig reads both strings; it changes nothing of this process's memory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            context.as_raw_fd(),
            libc::FSCONFIG_SET_STRING,
            key.as_ptr(),
            value.as_ptr(),
            0,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::other(format!(
            "fsconfig {}={}: {}",
            key.to_string_lossy(),
            value.to_string_lossy(),
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

fn fsconfig_create(context: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: FSCONFIG_CMD_CREATE takes no pointers.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            context.as_raw_fd(),
            libc::FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn fsmount_read_only(context: &OwnedFd) -> std::io::Result<OwnedFd> {
    let attributes = libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
    // SAFETY: fsmount takes no pointers and returns a new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_fsmount,
            context.as_raw_fd(),
            libc::FSMOUNT_CLOEXEC,
            attributes,
        )
    };
    owned(fd as libc::c_int)
}

/// The running shim binary copied into a sealed memfd (no writes, no resizing).
fn memfd_copy_of_self() -> std::io::Result<OwnedFd> {
    let name = c"containerd-shim-crius-v2";
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: memfd_create reads the name and returns a new descriptor or -1.
    let mut fd = unsafe { libc::memfd_create(name.as_ptr(), flags | MFD_EXEC) };
    if fd < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        // SAFETY: as above, on a kernel that knows no MFD_EXEC.
        fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    }
    let mut copy = std::fs::File::from(owned(fd)?);
    let mut own = std::fs::File::open("/proc/self/exe")?;
    std::io::copy(&mut own, &mut copy)?;
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: fcntl on a descriptor this function owns.
    if unsafe { libc::fcntl(copy.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    duplicate_high(&OwnedFd::from(copy))
}

/// A close-on-exec duplicate out of the way of the pidfd the helper gets as descriptor 3.
fn duplicate_high(fd: &OwnedFd) -> std::io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor or -1.
    owned(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, LOWEST_BINARY_FD) })
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

    fn assert_is_the_binary_and_refuses_writes(fd: &OwnedFd) {
        assert!(fd.as_raw_fd() >= LOWEST_BINARY_FD);
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let sealed = std::fs::read(&path).expect("read the sealed binary");
        let own = std::fs::read("/proc/self/exe").expect("read the binary");
        assert!(
            sealed == own,
            "the sealed binary differs from the running one"
        );
        let opened = std::fs::OpenOptions::new().write(true).open(&path);
        let err = match opened {
            Ok(mut file) => {
                use std::io::Write;
                file.write_all(b"x")
                    .expect_err("a write to the sealed binary")
            }
            Err(e) => e,
        };
        assert!(
            matches!(
                err.raw_os_error(),
                Some(libc::EROFS | libc::EPERM | libc::ETXTBSY)
            ),
            "{err}"
        );
    }

    #[test]
    fn the_memfd_copy_is_the_binary_and_refuses_writes() {
        use std::io::Write;
        let copy = memfd_copy_of_self().expect("copy");
        assert_is_the_binary_and_refuses_writes(&copy);
        let mut file = std::fs::File::from(copy);
        let err = file.write_all(b"x").expect_err("sealed");
        assert_eq!(err.raw_os_error(), Some(libc::EPERM));
    }

    #[test]
    fn the_overlay_shows_the_binary_read_only() {
        // Making a mount needs CAP_SYS_ADMIN: root in CI, as the shim runs.
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let fd = overlay_of_self().expect("overlayfs seal");
        assert_is_the_binary_and_refuses_writes(&fd);
        let again = sealed_binary().expect("sealed binary");
        assert_is_the_binary_and_refuses_writes(&again);
    }

    #[test]
    fn lower_dirs_escape_colons_and_backslashes() {
        assert_eq!(escape_lower_dir(Path::new("/a:b\\c")), "/a\\:b\\\\c");
        assert_eq!(escape_lower_dir(Path::new("/usr/bin")), "/usr/bin");
    }
}
