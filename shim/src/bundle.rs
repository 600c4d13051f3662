//! What the shim keeps in and mounts on a container's bundle directory.

use std::path::{Path, PathBuf};

use containerd_shim_protos::api::Mount;

use crate::error::ShimError;
use crate::runc::Runc;

/// The file in the bundle naming the runtime, for the `delete` action.
const RUNTIME_FILE: &str = "crius-shim.json";

pub fn save_runc(bundle: &Path, runc: &Runc) -> Result<(), ShimError> {
    let path = bundle.join(RUNTIME_FILE);
    let text = serde_json::to_vec(runc).map_err(|e| ShimError::Internal(e.to_string()))?;
    std::fs::write(&path, text).map_err(|e| ShimError::io(format!("write {}", path.display()), e))
}

pub fn load_runc(bundle: &Path) -> Option<Runc> {
    let text = std::fs::read(bundle.join(RUNTIME_FILE)).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Mounts the rootfs containerd passed onto `<bundle>/rootfs`; None when it passed none
/// (the spec's root is used as it is).
pub fn mount_rootfs(bundle: &Path, mounts: &[Mount]) -> Result<Option<PathBuf>, ShimError> {
    if mounts.is_empty() {
        return Ok(None);
    }
    let target = bundle.join("rootfs");
    std::fs::create_dir_all(&target)
        .map_err(|e| ShimError::io(format!("create {}", target.display()), e))?;
    for (i, m) in mounts.iter().enumerate() {
        let mounted = containerd_shim::mount::mount_rootfs(
            Some(m.type_.as_str()).filter(|t| !t.is_empty()),
            Some(m.source.as_str()).filter(|s| !s.is_empty()),
            &m.options,
            &target,
        );
        if let Err(e) = mounted {
            if i > 0 {
                unmount_rootfs(&target);
            }
            return Err(ShimError::Internal(format!(
                "mount rootfs {} ({}): {e}",
                m.source, m.type_
            )));
        }
    }
    Ok(Some(target))
}

/// Unmounts everything on the rootfs. A busy mount stays (and is logged) rather than being
/// detached under a process that still uses it, as with containerd's shim.
pub fn unmount_rootfs(target: &Path) {
    let Some(path) = target.to_str() else {
        return;
    };
    if let Err(e) = containerd_shim::mount::umount_recursive(Some(path), 0) {
        log::warn!("unmount {path}: {e}");
    }
}
