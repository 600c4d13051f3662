//! Idmapped mounts (Linux 5.12+): a clone of a mount whose file owners appear shifted by a
//! user namespace's mappings. crius makes them itself for pods in their own user namespace,
//! so the OCI runtime only bind-mounts ready paths (runc before 1.2 cannot idmap).
//!
//! The system calls themselves are in `crius_common::mount_api`, shared with the shim.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use crius_common::mount_api;

use nix::errno::Errno;

#[derive(Debug, thiserror::Error)]
#[error("idmapped mount of {source_path} on {target}: {op}: {errno}")]
pub struct IdmapError {
    pub source_path: String,
    pub target: String,
    pub op: &'static str,
    pub errno: Errno,
}

/// The errno of a failed system call (EIO when it carries none).
fn errno_of(e: std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

fn clone_tree(source: &Path, recursive: bool) -> Result<OwnedFd, Errno> {
    mount_api::clone_tree(source, recursive).map_err(errno_of)
}

fn set_idmap(tree: &OwnedFd, userns: &OwnedFd, recursive: bool) -> Result<(), Errno> {
    mount_api::set_idmap(tree, userns.as_fd(), recursive, false).map_err(errno_of)
}

fn attach(tree: &OwnedFd, target: &Path) -> Result<(), Errno> {
    mount_api::attach(tree, target).map_err(errno_of)
}

fn open_userns(userns: &Path) -> Result<OwnedFd, Errno> {
    std::fs::File::open(userns)
        .map(OwnedFd::from)
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
}

/// Mounts `source` on `target` (an existing directory, or file for a file) idmapped by the
/// user namespace pinned or open at `userns`: files owned by N on disk appear owned by
/// the namespace's host ID for N.
pub fn bind(
    source: &Path,
    target: &Path,
    userns: &Path,
    recursive: bool,
) -> Result<(), IdmapError> {
    let failed = |op, errno| IdmapError {
        source_path: source.display().to_string(),
        target: target.display().to_string(),
        op,
        errno,
    };
    let userns = open_userns(userns).map_err(|e| failed("open the user namespace", e))?;
    let tree = clone_tree(source, recursive).map_err(|e| failed("open_tree", e))?;
    set_idmap(&tree, &userns, recursive).map_err(|e| failed("mount_setattr", e))?;
    attach(&tree, target).map_err(|e| failed("move_mount", e))
}

/// Whether the filesystem at `dir` takes idmapped mounts: an idmapped clone of it is made
/// with a throwaway user namespace and dropped, never attached. Blocking.
pub fn probe(dir: &Path) -> Result<(), IdmapError> {
    let failed = |op, errno| IdmapError {
        source_path: dir.display().to_string(),
        target: String::new(),
        op,
        errno,
    };
    let holder = crate::sys::userns::Holder::throwaway().map_err(|e| {
        tracing::debug!(error = %e, "no throwaway user namespace");
        failed("make a user namespace", Errno::EPERM)
    })?;
    let userns = open_userns(&holder.ns_path("user")).map_err(|e| failed("open", e))?;
    let tree = clone_tree(dir, false).map_err(|e| failed("open_tree", e))?;
    set_idmap(&tree, &userns, false).map_err(|e| failed("mount_setattr", e))
}

/// Whether this host can run pods in their own user namespace the way crius does: a user
/// namespace can be made, idmapped mounts work on each of `dirs`, and overlayfs takes an
/// idmapped lower layer (made for the check in `scratch`, then removed). Blocking.
pub fn probe_host(dirs: &[&Path], scratch: &Path) -> Result<(), String> {
    for dir in dirs {
        probe(dir).map_err(|e| e.to_string())?;
    }
    let base = scratch.join(format!(".idmap-probe-{:x}", rand::random::<u64>()));
    let result = probe_overlay(&base);
    for dir in ["merged", "idmapped"] {
        let _ = nix::mount::umount2(&base.join(dir), nix::mount::MntFlags::MNT_DETACH);
    }
    let _ = std::fs::remove_dir_all(&base);
    result
}

fn probe_overlay(base: &Path) -> Result<(), String> {
    let dirs = ["lower", "idmapped", "upper", "work", "merged"].map(|d| base.join(d));
    for dir in &dirs {
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    }
    let holder = crate::sys::userns::Holder::throwaway().map_err(|e| e.to_string())?;
    bind(&dirs[0], &dirs[1], &holder.ns_path("user"), false).map_err(|e| e.to_string())?;
    let data = format!(
        "lowerdir={},upperdir={},workdir={}",
        dirs[1].display(),
        dirs[2].display(),
        dirs[3].display()
    );
    nix::mount::mount(
        Some("overlay"),
        &dirs[4],
        Some("overlay"),
        nix::mount::MsFlags::empty(),
        Some(data.as_str()),
    )
    .map_err(|e| format!("overlayfs does not take an idmapped lower layer: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// Needs root and a kernel with idmapped mounts (as the test bed has).
    #[tokio::test]
    async fn an_idmapped_bind_shifts_owners() {
        let dir = tempfile::tempdir().unwrap();
        let (source, target) = (dir.path().join("source"), dir.path().join("target"));
        std::fs::create_dir_all(&source).unwrap();
        std::fs::create_dir_all(&target).unwrap();
        std::fs::write(source.join("file"), b"x").unwrap();
        std::os::unix::fs::chown(source.join("file"), Some(7), Some(8)).unwrap();
        probe(dir.path()).unwrap();

        let range = crate::sys::userns::IdRange {
            container_id: 0,
            host_id: 100000,
            size: 65536,
        };
        let userns = dir.path().join("userns");
        crate::sys::userns::create_pod_namespaces(
            crate::sys::userns::Mappings {
                uids: range,
                gids: range,
            },
            userns.clone(),
            None,
        )
        .await
        .unwrap();
        bind(&source, &target, &userns, false).unwrap();
        let seen = std::fs::metadata(target.join("file")).unwrap();
        assert_eq!((seen.uid(), seen.gid()), (100007, 100008));
        // The source is untouched.
        let original = std::fs::metadata(source.join("file")).unwrap();
        assert_eq!((original.uid(), original.gid()), (7, 8));

        nix::mount::umount2(&target, nix::mount::MntFlags::MNT_DETACH).unwrap();
        crate::sys::userns::unpin(&userns).unwrap();
        let missing = bind(
            &dir.path().join("nope"),
            &target,
            &dir.path().join("nope2"),
            false,
        );
        assert!(missing.is_err());
    }
}
