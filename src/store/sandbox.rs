//! The sandbox store: every pod sandbox, by ID (or unique ID prefix).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use crate::api::v1::PodSandboxConfig;
use serde::{Deserialize, Serialize};

use super::id_index::{IdIndex, IdLookupError};
use crate::cni::network::NetworkAttachment;

/// What crius keeps about a sandbox beyond containerd's own record. Persisted as an
/// extension on the containerd container, so recovery needs nothing else.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxMetadata {
    pub id: String,
    /// `<name>_<namespace>_<uid>_<attempt>`.
    pub name: String,
    pub config: PodSandboxConfig,
    pub runtime_handler: String,
    pub runtime_type: String,
    /// The pinned netns; empty for host-network pods.
    pub netns_path: String,
    /// The pod's IPs, primary first.
    pub ips: Vec<String>,
    /// The CNI result of each network the pod was added to.
    pub networks: Vec<NetworkAttachment>,
    /// Nanoseconds since the epoch.
    pub created_at: i64,
    /// The image ID of the pause image.
    pub image: String,
    /// The pause container's cgroup path in its runtime spec.
    #[serde(default)]
    pub cgroups_path: String,
    /// In its own user namespace, the pod's rootfs are remapped copies (`userns.rootfs`
    /// "copy"), not idmapped mounts.
    #[serde(default)]
    pub userns_rootfs_copy: bool,
    /// crius's shim holds the pod itself: no pause container, no rootfs snapshot.
    #[serde(default)]
    pub held: bool,
    /// The snapshotter of its runtime handler, for its pause container's rootfs and its
    /// containers'; empty in records from before handlers had snapshotters of their own:
    /// `containerd.snapshotter`.
    #[serde(default)]
    pub snapshotter: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SandboxState {
    /// Being created: not listed yet, but Stop and Remove can undo it.
    Creating,
    Ready,
    NotReady,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxStatus {
    pub state: SandboxState,
    pub pid: u32,
    /// Whether the netns has been removed (Stop).
    pub netns_closed: bool,
    /// Whether this process ran CNI DEL for the pod (a Remove after a Stop skips it).
    pub network_released: bool,
}

/// One sandbox: metadata, status, and a lock that serialises Stop and Remove on it.
pub struct Sandbox {
    metadata: RwLock<SandboxMetadata>,
    status: Mutex<SandboxStatus>,
    /// Held across the steps of Run (after the record exists), Stop and Remove.
    pub lifecycle: tokio::sync::Mutex<()>,
    /// The removal of removed containers' writable layers and files, which RemoveContainer
    /// leaves running; RemovePodSandbox waits for them.
    pub container_cleanups: tokio_util::task::TaskTracker,
}

impl Sandbox {
    pub fn new(metadata: SandboxMetadata, status: SandboxStatus) -> Self {
        Self {
            metadata: RwLock::new(metadata),
            status: Mutex::new(status),
            lifecycle: tokio::sync::Mutex::new(()),
            container_cleanups: tokio_util::task::TaskTracker::new(),
        }
    }

    pub fn id(&self) -> String {
        self.metadata().id
    }

    pub fn metadata(&self) -> SandboxMetadata {
        self.metadata
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn update_metadata(&self, update: impl FnOnce(&mut SandboxMetadata)) -> SandboxMetadata {
        let mut metadata = self.metadata.write().unwrap_or_else(|p| p.into_inner());
        update(&mut metadata);
        metadata.clone()
    }

    pub fn status(&self) -> SandboxStatus {
        *self.status.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn update_status(&self, update: impl FnOnce(&mut SandboxStatus)) -> SandboxStatus {
        let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
        update(&mut status);
        *status
    }
}

#[derive(Default)]
struct Inner {
    sandboxes: HashMap<String, Arc<Sandbox>>,
    ids: IdIndex,
}

#[derive(Default)]
pub struct SandboxStore {
    inner: RwLock<Inner>,
}

impl SandboxStore {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&self, sandbox: Arc<Sandbox>) {
        let id = sandbox.id();
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        inner.ids.insert(&id);
        inner.sandboxes.insert(id, sandbox);
    }

    pub fn remove(&self, id: &str) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        inner.ids.remove(id);
        inner.sandboxes.remove(id);
    }

    /// The sandbox whose ID is `id` or starts with it.
    pub fn get(&self, id: &str) -> Result<Option<Arc<Sandbox>>, IdLookupError> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        if let Some(sandbox) = inner.sandboxes.get(id) {
            return Ok(Some(sandbox.clone()));
        }
        Ok(inner
            .ids
            .get(id)?
            .and_then(|full| inner.sandboxes.get(full).cloned()))
    }

    pub fn list(&self) -> Vec<Arc<Sandbox>> {
        self.inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .sandboxes
            .values()
            .cloned()
            .collect()
    }
}
