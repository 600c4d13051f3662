//! What the shim keeps in and mounts on a container's bundle directory.

use std::path::{Path, PathBuf};

use containerd_shim_protos::api::Mount;

use crate::error::ShimError;
use crate::pod::{Pod, SHM};
use crate::runtime::bundle_spec::SANDBOX_ID;
use crate::runtime::runc::Runc;

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
/// (the spec's root is used as it is). An overlay whose layers are to be idmapped (a pod in
/// its own user namespace) gets them idmapped by `userns`.
pub fn mount_rootfs(
    bundle: &Path,
    mounts: &[Mount],
    userns: Option<&Path>,
) -> Result<Option<PathBuf>, ShimError> {
    if mounts.is_empty() {
        return Ok(None);
    }
    let target = bundle.join("rootfs");
    std::fs::create_dir_all(&target)
        .map_err(|e| ShimError::io(format!("create {}", target.display()), e))?;
    for (i, m) in mounts.iter().enumerate() {
        let mounted = mount_one(bundle, m, &target, userns);
        if let Err(e) = mounted {
            if i > 0 {
                unmount_rootfs(&target);
            }
            return Err(e);
        }
    }
    Ok(Some(target))
}

fn mount_one(
    bundle: &Path,
    m: &Mount,
    target: &Path,
    userns: Option<&Path>,
) -> Result<(), ShimError> {
    let (options, clones) = if crate::task::idmap::wants_idmap(&m.options) {
        let userns = userns.ok_or_else(|| {
            ShimError::InvalidArgument(format!(
                "rootfs {} asks for idmapped layers, but the container's pod has no user namespace",
                m.source
            ))
        })?;
        crate::task::idmap::idmapped_overlay_options(&m.options, userns, &bundle.join("idmap"))?
    } else {
        (m.options.clone(), Vec::new())
    };
    let mounted = containerd_shim::mount::mount_rootfs(
        Some(m.type_.as_str()).filter(|t| !t.is_empty()),
        Some(m.source.as_str()).filter(|s| !s.is_empty()),
        &options,
        target,
    );
    crate::task::idmap::detach_all(&clones);
    mounted
        .map_err(|e| ShimError::Internal(format!("mount rootfs {} ({}): {e}", m.source, m.type_)))
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

/// Gives a container of a pod the shim holds the pod's shared files: containerd's CRI
/// found no pause sandbox's files to bind, so the spec binds each one it does not mount
/// itself, and the pod's /dev/shm replaces the private tmpfs of the default spec. The etc
/// files are read-only with a read-only rootfs, as containerd's CRI binds them.
pub fn add_pod_files(bundle: &Path, pod: &Pod) -> Result<(), ShimError> {
    let path = bundle.join("config.json");
    let text =
        std::fs::read(&path).map_err(|e| ShimError::io(format!("read {}", path.display()), e))?;
    let mut spec: serde_json::Value = serde_json::from_slice(&text)
        .map_err(|e| ShimError::InvalidArgument(format!("{}: {e}", path.display())))?;
    if spec["annotations"][SANDBOX_ID].as_str() != Some(pod.id.as_str()) {
        return Ok(());
    }
    let readonly = spec["root"]["readonly"].as_bool().unwrap_or(false);
    let mounts = match spec.get_mut("mounts").and_then(|m| m.as_array_mut()) {
        Some(mounts) => mounts,
        None => {
            spec["mounts"] = serde_json::json!([]);
            spec["mounts"]
                .as_array_mut()
                .ok_or_else(|| ShimError::Internal("spec mounts".into()))?
        }
    };
    for (destination, source) in pod.shared_files() {
        if let Some(i) = mounts.iter().position(|m| m["destination"] == destination) {
            let private_shm = destination == SHM && mounts[i]["type"] == "tmpfs";
            if !private_shm {
                continue;
            }
            mounts.remove(i);
        }
        let access = if readonly && destination != SHM {
            "ro"
        } else {
            "rw"
        };
        mounts.push(serde_json::json!({
            "destination": destination,
            "type": "bind",
            "source": source,
            "options": ["rbind", "rprivate", access],
        }));
    }
    let text = serde_json::to_vec(&spec).map_err(|e| ShimError::Internal(e.to_string()))?;
    let temp = bundle.join(".config.json.tmp");
    std::fs::write(&temp, text)
        .map_err(|e| ShimError::io(format!("write {}", temp.display()), e))?;
    std::fs::rename(&temp, &path)
        .map_err(|e| ShimError::io(format!("replace {}", path.display()), e))
}
