//! Idmapped overlay lower layers, for the rootfs of a container in a pod's own user
//! namespace: containerd 2.x passes the overlay mount with `uidmap=`/`gidmap=` options
//! (which the kernel's overlayfs does not take), and the shim mounts each lower layer
//! idmapped by the pod's user namespace first, as containerd's own mount code does. The
//! idmapped clones are detached once overlayfs holds them.
//!
//! The three mount API system calls have no wrapper in nix; they are called through
//! `libc::syscall` here and nowhere else in the shim.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::error::ShimError;

/// Whether an overlay's options ask for idmapped layers.
pub fn wants_idmap(options: &[String]) -> bool {
    options
        .iter()
        .any(|o| o.starts_with("uidmap=") || o.starts_with("gidmap="))
}

/// The overlay options with the lower layers replaced by idmapped clones made under
/// `scratch` (one directory per layer) and without `uidmap=`/`gidmap=`; returns them and
/// the clones to detach after the overlay is mounted.
pub fn idmapped_overlay_options(
    options: &[String],
    userns: &Path,
    scratch: &Path,
) -> Result<(Vec<String>, Vec<PathBuf>), ShimError> {
    let userns_fd = std::fs::File::open(userns)
        .map(OwnedFd::from)
        .map_err(|e| ShimError::io(format!("open {}", userns.display()), e))?;
    let mut kept = Vec::new();
    let mut clones = Vec::new();
    for option in options {
        if option.starts_with("uidmap=") || option.starts_with("gidmap=") {
            continue;
        }
        let Some(lowers) = option.strip_prefix("lowerdir=") else {
            kept.push(option.clone());
            continue;
        };
        let mut mapped = Vec::new();
        for (i, lower) in lowers.split(':').enumerate() {
            let target = scratch.join(i.to_string());
            std::fs::create_dir_all(&target)
                .map_err(|e| ShimError::io(format!("create {}", target.display()), e))?;
            if let Err(e) = idmapped_clone(Path::new(lower), &target, &userns_fd) {
                detach_all(&clones);
                return Err(e);
            }
            mapped.push(target.display().to_string());
            clones.push(target);
        }
        kept.push(format!("lowerdir={}", mapped.join(":")));
    }
    Ok((kept, clones))
}

/// Detaches the idmapped clones (overlayfs keeps its own references to its layers).
pub fn detach_all(clones: &[PathBuf]) {
    for clone in clones {
        if let Err(e) = nix::mount::umount2(clone, nix::mount::MntFlags::MNT_DETACH) {
            log::warn!("detach {}: {e}", clone.display());
        }
    }
}

fn c_path(path: &Path) -> Result<CString, ShimError> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| ShimError::InvalidArgument(format!("path {}", path.display())))
}

fn syscall_error(what: &str, path: &Path) -> ShimError {
    ShimError::io(
        format!("{what} {}", path.display()),
        std::io::Error::last_os_error(),
    )
}

/// Mounts a read-only clone of `source` on `target`, idmapped by `userns`.
fn idmapped_clone(source: &Path, target: &Path, userns: &OwnedFd) -> Result<(), ShimError> {
    let source_c = c_path(source)?;
    let flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC;
    // SAFETY: a NUL-terminated path that outlives the call; the result is a new fd.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            source_c.as_ptr(),
            flags,
        )
    };
    if fd < 0 {
        return Err(syscall_error("open_tree", source));
    }
    // SAFETY: the kernel just returned this fd, and nothing else owns it.
    let tree = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let attr = libc::mount_attr {
        attr_set: libc::MOUNT_ATTR_IDMAP | libc::MOUNT_ATTR_RDONLY,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: open fds, and an attr struct that lives across the call, its size with it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &raw const attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if rc < 0 {
        return Err(syscall_error("mount_setattr", source));
    }
    let target_c = c_path(target)?;
    // SAFETY: an open fd, an empty C string and a NUL-terminated path that outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target_c.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if rc < 0 {
        return Err(syscall_error("move_mount", target));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_id_mapping_options_ask_for_idmap() {
        let plain = ["lowerdir=/a:/b".to_string(), "upperdir=/u".to_string()];
        assert!(!wants_idmap(&plain));
        let mapped = [
            "lowerdir=/a".to_string(),
            "uidmap=0:200000:65536".to_string(),
        ];
        assert!(wants_idmap(&mapped));
    }

    #[test]
    fn a_missing_user_namespace_is_an_error_before_any_mount() {
        let scratch = tempfile::tempdir().expect("tempdir");
        let options = ["lowerdir=/a".to_string(), "uidmap=0:1:1".to_string()];
        let err = idmapped_overlay_options(&options, Path::new("/nonexistent/ns"), scratch.path())
            .expect_err("no userns");
        assert!(err.to_string().contains("/nonexistent/ns"), "{err}");
    }
}
