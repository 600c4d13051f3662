//! What pods in their own user namespace (`hostUsers: false`) need beyond the spec: the
//! check that the handler can run them, where the namespace is pinned, and the idmapped
//! rootfs crius mounts for the pause process and each container, so any OCI runtime that
//! knows user namespaces can run them (runc before 1.2 cannot idmap a mount itself).

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use tonic::Status;

use crate::api::v1::{ContainerConfig, PodSandboxConfig};
use crate::cri::CriService;
use crate::store::SandboxMetadata;
use crate::sys::userns::Mappings;

/// A pod's own user namespace, as its sandbox and containers use it.
#[derive(Debug, Clone)]
pub(crate) struct PodUserns {
    /// Where the namespace is pinned.
    pub pin: PathBuf,
    pub mappings: Mappings,
    /// Its rootfs are remapped copies, not idmapped mounts.
    pub copy_rootfs: bool,
    /// The snapshotter of the pod's rootfs.
    pub snapshotter: String,
}

/// Under the state dir: the idmapped rootfs of each sandbox and container of such pods.
const IDMAPPED_ROOTFS_DIR: &str = "rootfs";
/// Under the state dir: idmapped image layers, only while an overlay is being mounted.
const LAYER_STAGING_DIR: &str = "l";
/// In a sandbox's state dir: its pinned user namespace.
const USERNS_PIN: &str = "userns";

impl CriService {
    /// The mappings of a pod that asks for its own user namespace, refused with
    /// INVALID_ARGUMENT when the CRI does not allow them, and with FAILED_PRECONDITION when
    /// the handler (or the host) cannot run such a pod.
    pub(crate) fn pod_user_namespace_request(
        &self,
        config: &PodSandboxConfig,
        handler: &str,
    ) -> Result<Option<Mappings>, Status> {
        let Some(mappings) = crate::sys::userns::pod_mappings(config)
            .map_err(|e| Status::invalid_argument(format!("user namespace: {e}")))?
        else {
            return Ok(None);
        };
        let name = if handler.is_empty() {
            self.config.containerd.default_runtime.as_str()
        } else {
            handler
        };
        let supported = self
            .host
            .handler_features
            .get(name)
            .is_some_and(|f| f.user_namespaces);
        if !supported {
            return Err(Status::failed_precondition(format!(
                "runtime handler {name:?} cannot run pods in their own user namespace on this \
                 host: {}",
                self.host
                    .userns_rootfs
                    .as_ref()
                    .err()
                    .map(String::as_str)
                    .unwrap_or("its runtime type does not take user namespaces")
            )));
        }
        Ok(Some(mappings))
    }

    /// Where a sandbox's user namespace is pinned.
    pub(crate) fn sandbox_userns_pin(&self, sandbox_id: &str) -> PathBuf {
        self.sandbox_state_dir(sandbox_id).join(USERNS_PIN)
    }

    /// Where the idmapped rootfs of the sandbox or container `id` is mounted.
    pub(crate) fn idmapped_rootfs_dir(&self, id: &str) -> PathBuf {
        self.config.state.join(IDMAPPED_ROOTFS_DIR).join(id)
    }

    /// Whether a new pod in its own user namespace gets remapped copies for its rootfs
    /// (else idmapped mounts).
    pub(crate) fn new_pods_copy_rootfs(&self) -> bool {
        self.host.userns_rootfs == Ok(crate::config::UsernsRootfs::Copy)
    }

    /// The user namespace of a sandbox that has its own.
    pub(crate) fn sandbox_user_namespace(&self, metadata: &SandboxMetadata) -> Option<PodUserns> {
        let mappings = crate::sys::userns::pod_mappings(&metadata.config).ok()??;
        Some(PodUserns {
            pin: self.sandbox_userns_pin(&metadata.id),
            mappings,
            copy_rootfs: metadata.userns_rootfs_copy,
            snapshotter: self.snapshotter_of(&metadata.snapshotter).to_string(),
        })
    }

    /// The user namespace of a container's pod, if the pod has its own.
    pub(crate) fn container_user_namespace(
        &self,
        container: &crate::store::Container,
    ) -> Option<PodUserns> {
        let sandbox = self
            .sandboxes
            .get(&container.metadata.sandbox_id)
            .ok()
            .flatten()?;
        self.sandbox_user_namespace(&sandbox.metadata())
    }

    /// The rootfs mounts to create the task of sandbox or container `id` with, in a pod
    /// with its own user namespace: none, for the idmapped rootfs crius mounts at
    /// `idmapped_rootfs_dir(id)` (the spec names it); or the snapshot's (a remapped copy),
    /// with its writable layer given to the pod's root.
    pub(crate) async fn userns_rootfs_mounts(
        &self,
        id: &str,
        pod: &PodUserns,
    ) -> Result<Vec<containerd_client::types::Mount>, Status> {
        let mounts = self
            .containerd
            .snapshot_mounts(&pod.snapshotter, id)
            .await
            .map_err(|e| Status::internal(format!("the rootfs mounts of {id}: {e}")))?;
        let host_root = pod.mappings.host_root();
        if pod.copy_rootfs {
            if let Some(upper) = mounts
                .iter()
                .flat_map(|m| m.options.iter())
                .find_map(|o| o.strip_prefix("upperdir="))
            {
                give_to(Path::new(upper), host_root).map_err(Status::internal)?;
            }
            return Ok(mounts);
        }
        let target = self.idmapped_rootfs_dir(id);
        // Short: every layer's path goes into one mount(2) option page.
        let layers = self
            .config
            .state
            .join(LAYER_STAGING_DIR)
            .join(format!("{:08x}", rand::random::<u32>()));
        let userns = pod.pin.clone();
        tokio::task::spawn_blocking(move || {
            mount_idmapped(&mounts, &target, &layers, &userns, host_root)
        })
        .await
        .map_err(|e| Status::internal(format!("mounting the rootfs of {id}: {e}")))?
        .map_err(|e| Status::internal(format!("mounting the idmapped rootfs of {id}: {e}")))?;
        Ok(Vec::new())
    }

    /// The parent snapshot of a new rootfs of `image` (its chain ID) for a pod: the image
    /// itself, or, for a pod with remapped copies, the image's copy for the pod's range,
    /// made once (under `lease`, which the new snapshot then keeps) and shared.
    pub(crate) async fn rootfs_parent(
        &self,
        chain_id: &str,
        pod: Option<&PodUserns>,
        lease: &str,
    ) -> Result<String, Status> {
        match pod {
            Some(pod) if pod.copy_rootfs => self.remapped_snapshot(chain_id, pod, lease).await,
            _ => Ok(chain_id.to_string()),
        }
    }

    /// The committed copy of image `chain_id` whose every owner is shifted into the range:
    /// prepared on the image, chowned through its mount (overlayfs copies each file up),
    /// committed.
    async fn remapped_snapshot(
        &self,
        chain_id: &str,
        pod: &PodUserns,
        lease: &str,
    ) -> Result<String, Status> {
        let snapshotter = pod.snapshotter.as_str();
        let (uids, gids) = (pod.mappings.uids, pod.mappings.gids);
        let name = format!(
            "crius-remap-{}-{}-{}-{}-{chain_id}",
            uids.host_id, uids.size, gids.host_id, gids.size
        );
        let _making = self.remap_lock.lock().await;
        // Under the caller's lease before it is looked for: garbage collection may take a
        // copy no pod holds at any moment (the last pod of the range removed, a failed
        // creation's lease deleted); leased first, a copy that is found stays.
        self.containerd
            .lease_snapshot(lease, snapshotter, &name)
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
        let exists = self
            .containerd
            .snapshot_exists(snapshotter, &name)
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
        if exists {
            return Ok(name);
        }
        tracing::info!(snapshot = %name, "making a copy of an image remapped to a pod's range");
        let key = format!("{name}-prep-{:x}", rand::random::<u64>());
        let made = self.make_remapped(&key, &name, chain_id, pod, lease).await;
        if made.is_err() {
            let _ = self.containerd.remove_snapshot(snapshotter, &key).await;
        }
        made.map(|()| name)
    }

    async fn make_remapped(
        &self,
        key: &str,
        name: &str,
        chain_id: &str,
        pod: &PodUserns,
        lease: &str,
    ) -> Result<(), Status> {
        let snapshotter = pod.snapshotter.as_str();
        let failed =
            |what: &str, e: String| Status::internal(format!("remapping the image: {what}: {e}"));
        let mounts = self
            .containerd
            .prepare_snapshot(snapshotter, key, chain_id, HashMap::new(), Some(lease))
            .await
            .map_err(|e| failed("prepare", e.to_string()))?;
        let staging = self.config.state.join(IDMAPPED_ROOTFS_DIR).join(key);
        let mappings = pod.mappings;
        tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&staging).map_err(|e| e.to_string())?;
            crate::sys::mount::mount_all(&mounts, &staging).map_err(|e| e.to_string())?;
            let shifted =
                crate::sys::tree::shift_owners(&staging, &mappings).map_err(|e| e.to_string());
            let unmounted = crate::sys::mount::unmount_all(&staging).map_err(|e| e.to_string());
            let _ = std::fs::remove_dir(&staging);
            shifted.and(unmounted)
        })
        .await
        .map_err(|e| failed("chown", e.to_string()))?
        .map_err(|e| failed("chown", e))?;
        self.containerd
            .commit_snapshot(snapshotter, name, key, HashMap::new(), Some(lease))
            .await
            .map_err(|e| failed("commit", e.to_string()))
    }

    /// Unmounts and removes the idmapped rootfs and mounts of `id`; none is fine.
    pub(crate) fn unmount_idmapped_rootfs(&self, id: &str) {
        let target = self.idmapped_rootfs_dir(id);
        let staging = target.with_extension("mounts");
        if staging.exists()
            && let Err(e) = remove_staged_mounts(&staging)
        {
            tracing::warn!(id, error = %e, "removing idmapped mounts failed");
        }
        if !target.exists() {
            return;
        }
        if let Err(e) = crate::sys::mount::unmount_all(&target) {
            tracing::warn!(id, error = %e, "unmounting an idmapped rootfs failed");
            return;
        }
        let _ = std::fs::remove_dir(&target);
    }

    /// Start-up: unmounts the idmapped rootfs and mounts of every sandbox or container not
    /// in `known`.
    pub(crate) fn remove_stray_idmapped_rootfs(&self, known: &dyn Fn(&str) -> bool) {
        // Layers staged by a mount that a crash cut short.
        if let Ok(entries) = std::fs::read_dir(self.config.state.join(LAYER_STAGING_DIR)) {
            for entry in entries.flatten() {
                if let Err(e) = remove_staged_mounts(&entry.path()) {
                    tracing::warn!(error = %e, "removing stray idmapped layers failed");
                }
            }
        }
        let Ok(entries) = std::fs::read_dir(self.config.state.join(IDMAPPED_ROOTFS_DIR)) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let id = name.split('.').next().unwrap_or_default();
            if !id.is_empty() && !known(id) {
                tracing::info!(id, "unmounting the idmapped rootfs of a removed container");
                self.unmount_idmapped_rootfs(id);
            }
        }
    }

    /// The container config its spec is built from. CRI mounts that carry ID mappings
    /// (kubelet gives every mount of a pod in its own user namespace the pod's) are left to
    /// a runtime that makes idmapped mounts itself (`runtime_idmaps`: runc 1.2 and later);
    /// for any other they are bound from idmapped mounts crius makes under the state dir.
    /// Mappings other than the pod's, or on a pod without its own user namespace, are
    /// refused. `None`: the config as it is.
    pub(crate) async fn idmap_cri_mounts(
        &self,
        id: &str,
        config: &ContainerConfig,
        pod_userns: Option<&PodUserns>,
        runtime_idmaps: bool,
    ) -> Result<Option<ContainerConfig>, Status> {
        let mapped =
            |m: &crate::api::v1::Mount| !m.uid_mappings.is_empty() || !m.gid_mappings.is_empty();
        if !config.mounts.iter().any(mapped) {
            return Ok(None);
        }
        let Some(PodUserns {
            pin: userns,
            mappings,
            ..
        }) = pod_userns
        else {
            return Err(Status::invalid_argument(
                "a mount carries ID mappings, but the pod has no user namespace of its own",
            ));
        };
        if let Some(mount) = config
            .mounts
            .iter()
            .find(|m| mapped(m) && !mount_mappings_are(m, mappings))
        {
            return Err(Status::invalid_argument(format!(
                "mount {:?}: crius idmaps mounts only with the pod's own mappings",
                mount.container_path
            )));
        }
        if runtime_idmaps && self.host.idmap.is_ok() {
            return Ok(None);
        }
        let mut config = config.clone();
        if self.host.idmap.is_err() {
            // Remapped copies on a host without idmapped mounts: volumes are bound as they
            // are (owned as on the host).
            for mount in config.mounts.iter_mut() {
                mount.uid_mappings.clear();
                mount.gid_mappings.clear();
            }
            return Ok(Some(config));
        }
        let mut to_mount = Vec::new();
        let staging_dir = self.idmapped_rootfs_dir(id).with_extension("mounts");
        for (i, mount) in config
            .mounts
            .iter_mut()
            .enumerate()
            .filter(|(_, m)| mapped(m))
        {
            if !mount_mappings_are(mount, mappings) {
                return Err(Status::invalid_argument(format!(
                    "mount {:?}: crius idmaps mounts only with the pod's own mappings",
                    mount.container_path
                )));
            }
            let staged = staging_dir.join(i.to_string());
            to_mount.push((PathBuf::from(&mount.host_path), staged.clone()));
            mount.host_path = staged.display().to_string();
            mount.uid_mappings.clear();
            mount.gid_mappings.clear();
        }
        let userns = userns.clone();
        tokio::task::spawn_blocking(move || {
            to_mount
                .iter()
                .try_for_each(|(source, staged)| stage_idmapped_bind(source, staged, &userns))
        })
        .await
        .map_err(|e| Status::internal(format!("idmapping the mounts of {id}: {e}")))??;
        Ok(Some(config))
    }

    /// Gives the pod's own files (hostname, hosts, resolv.conf) to its root, so they are
    /// not owned by "nobody" inside the pod.
    pub(crate) fn give_sandbox_files_to_pod_root(
        &self,
        id: &str,
        mappings: &Mappings,
    ) -> Result<(), Status> {
        let (uid, gid) = mappings.host_root();
        let dir = self.sandbox_root_dir(id);
        for name in ["hostname", "hosts", "resolv.conf"] {
            let path = dir.join(name);
            crate::sys::fsutil::chown(&path, uid, gid)
                .map_err(|e| Status::internal(format!("chown {}: {e}", path.display())))?;
        }
        Ok(())
    }
}

/// Mounts a snapshot for a pod in its own user namespace on `target`. An overlay gets its
/// lower layers idmapped (overlayfs cannot be idmapped itself, but takes idmapped layers),
/// and its upper dir given to the pod's root, as containerd's remapping snapshots do: what
/// the container writes is owned by its host IDs. The idmapped layers are mounted on
/// staging dirs only until the overlay holds them.
fn mount_idmapped(
    mounts: &[containerd_client::types::Mount],
    target: &Path,
    layers: &Path,
    userns: &Path,
    host_root: (u32, u32),
) -> Result<(), String> {
    let [mount] = mounts else {
        return Err(format!(
            "a rootfs of {} mounts cannot be idmapped",
            mounts.len()
        ));
    };
    let parent = target.parent().unwrap_or(target);
    std::fs::create_dir_all(target).map_err(|e| format!("create {}: {e}", target.display()))?;
    // The runtime resolves the rootfs inside the user namespace: it must be able to pass.
    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o711))
        .map_err(|e| format!("chmod {}: {e}", parent.display()))?;
    let mounted = match mount.r#type.as_str() {
        "overlay" => mount_overlay_with_idmapped_layers(mount, target, layers, userns, host_root),
        // An image without layers: its one directory, given to the pod's root.
        "bind" => give_to(Path::new(&mount.source), host_root)
            .and_then(|()| crate::sys::mount::mount_all(mounts, target).map_err(|e| e.to_string())),
        other => Err(format!("a {other:?} rootfs cannot be idmapped")),
    };
    if layers.exists()
        && let Err(e) = remove_staged_mounts(layers)
    {
        tracing::warn!(error = %e, "removing the staged idmapped layers failed");
    }
    mounted
}

fn mount_overlay_with_idmapped_layers(
    mount: &containerd_client::types::Mount,
    target: &Path,
    layers: &Path,
    userns: &Path,
    host_root: (u32, u32),
) -> Result<(), String> {
    let mut options = Vec::with_capacity(mount.options.len());
    for option in &mount.options {
        if let Some(lowers) = option.strip_prefix("lowerdir=") {
            let mut idmapped = Vec::new();
            for (i, lower) in lowers.split(':').enumerate() {
                let staged = layers.join(i.to_string());
                std::fs::create_dir_all(&staged)
                    .map_err(|e| format!("create {}: {e}", staged.display()))?;
                crate::sys::idmap::bind(Path::new(lower), &staged, userns, false)
                    .map_err(|e| e.to_string())?;
                idmapped.push(staged.display().to_string());
            }
            options.push(format!("lowerdir={}", idmapped.join(":")));
        } else {
            if let Some(upper) = option.strip_prefix("upperdir=") {
                give_to(Path::new(upper), host_root)?;
            }
            options.push(option.clone());
        }
    }
    let remapped = containerd_client::types::Mount {
        options,
        ..mount.clone()
    };
    crate::sys::mount::mount_all(std::slice::from_ref(&remapped), target).map_err(|e| e.to_string())
}

/// Unmounts every mount staged in `dir` and removes it. (An overlay holds its own
/// references to its layers: their staging mounts can go as soon as it is mounted.)
fn remove_staged_mounts(dir: &Path) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("read {}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        crate::sys::mount::unmount_all(&path).map_err(|e| e.to_string())?;
        // Never a recursive removal: what is still mounted there may be a host volume.
        if crate::sys::mount::is_mount_point(&path).unwrap_or(true) {
            return Err(format!("{} is still mounted", path.display()));
        }
        std::fs::remove_dir(&path)
            .or_else(|_| std::fs::remove_file(&path))
            .map_err(|e| format!("remove {}: {e}", path.display()))?;
    }
    std::fs::remove_dir(dir).map_err(|e| format!("remove {}: {e}", dir.display()))
}

/// Whether a mount's mappings are exactly the pod's.
fn mount_mappings_are(mount: &crate::api::v1::Mount, mappings: &Mappings) -> bool {
    let is = |given: &[crate::api::v1::IdMapping], range: crate::sys::userns::IdRange| {
        matches!(given, [m] if m.container_id == range.container_id
            && m.host_id == range.host_id
            && m.length == range.size)
    };
    is(&mount.uid_mappings, mappings.uids) && is(&mount.gid_mappings, mappings.gids)
}

/// An idmapped bind of `source` (a directory with what is mounted below it, or a file) on
/// `staged`, which is made to match.
fn stage_idmapped_bind(source: &Path, staged: &Path, userns: &Path) -> Result<(), Status> {
    let source = std::fs::canonicalize(source).map_err(|e| {
        Status::invalid_argument(format!("mount host path {}: {e}", source.display()))
    })?;
    let internal = |what: String| Status::internal(what);
    let parent = staged.parent().unwrap_or(staged);
    std::fs::create_dir_all(parent)
        .map_err(|e| internal(format!("create {}: {e}", parent.display())))?;
    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o711))
        .map_err(|e| internal(format!("chmod {}: {e}", parent.display())))?;
    if source.is_dir() {
        std::fs::create_dir_all(staged)
    } else {
        std::fs::File::create(staged).map(drop)
    }
    .map_err(|e| internal(format!("create {}: {e}", staged.display())))?;
    // Submounts that cannot be idmapped fail the recursive form: then the mount alone.
    crate::sys::idmap::bind(&source, staged, userns, true)
        .or_else(|e| {
            tracing::warn!(error = %e, "idmapping a volume without what is mounted below it");
            crate::sys::idmap::bind(&source, staged, userns, false)
        })
        .map_err(|e| Status::failed_precondition(format!("the host cannot idmap this volume: {e}")))
}

/// Gives a directory (itself, not what is in it) to the pod's root.
fn give_to(dir: &Path, (uid, gid): (u32, u32)) -> Result<(), String> {
    crate::sys::fsutil::chown(dir, uid, gid).map_err(|e| format!("chown {}: {e}", dir.display()))
}
