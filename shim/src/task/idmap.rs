//! Idmapped overlay lower layers, for the rootfs of a container in a pod's own user
//! namespace: containerd 2.x passes the overlay mount with `uidmap=`/`gidmap=` options
//! (which the kernel's overlayfs does not take), and the shim mounts each lower layer
//! idmapped by the pod's user namespace first, as containerd's own mount code does. The
//! idmapped clones are detached once overlayfs holds them.
//!
//! The mount API's system calls are in `crius_common::mount_api`, shared with crius.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use crius_common::mount_api;

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

/// Mounts a read-only clone of `source` on `target`, idmapped by `userns`.
fn idmapped_clone(source: &Path, target: &Path, userns: &OwnedFd) -> Result<(), ShimError> {
    let failed =
        |what: &str, path: &Path, e| ShimError::io(format!("{what} {}", path.display()), e);
    let tree = mount_api::clone_tree(source, false).map_err(|e| failed("open_tree", source, e))?;
    mount_api::set_idmap(&tree, userns.as_fd(), false, true)
        .map_err(|e| failed("mount_setattr", source, e))?;
    mount_api::attach(&tree, target).map_err(|e| failed("move_mount", target, e))
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
