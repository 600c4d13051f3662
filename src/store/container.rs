//! The container store: every container, by ID (or unique prefix), with its metadata, its
//! status (persisted to a file on every change, so a restart of crius loses nothing), its
//! stdio, and a signal for "it has exited".

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use crate::api::v1::ContainerConfig;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::id_index::{IdIndex, IdLookupError};
use crate::io::ContainerIo;

/// What crius keeps about a container beyond containerd's record; persisted as an
/// extension of the containerd container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerMetadata {
    pub id: String,
    /// `<name>_<pod name>_<pod namespace>_<pod uid>_<attempt>`.
    pub name: String,
    pub sandbox_id: String,
    pub config: ContainerConfig,
    /// The image ID.
    pub image_ref: String,
    /// The image as the client named it.
    pub image_name: String,
    /// Empty when the pod has no log directory or the container no log path.
    pub log_path: String,
    /// The stop signal: the container config's, else the image's (empty: SIGTERM).
    pub stop_signal: String,
    /// The uid, gid and groups its process starts with (`ContainerStatus.user`).
    #[serde(default)]
    pub user: Option<crate::api::v1::LinuxContainerUser>,
    /// Nanoseconds since the epoch.
    pub created_at: i64,
    /// The cgroup path in its runtime spec, where its usage is read.
    #[serde(default)]
    pub cgroups_path: String,
    /// The checkpoint archive it is restored from at start; empty for an ordinary one.
    #[serde(default)]
    pub restore_from: String,
    /// The snapshotter of its rootfs (its pod's); empty in records from before handlers had
    /// snapshotters of their own: `containerd.snapshotter`.
    #[serde(default)]
    pub snapshotter: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    Unknown,
}

/// What containerd does not keep: times, exit code, reason and message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerStatus {
    pub state: ContainerState,
    pub pid: u32,
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    pub reason: String,
    pub message: String,
}

impl ContainerStatus {
    pub fn created(at: i64) -> Self {
        Self {
            state: ContainerState::Created,
            pid: 0,
            created_at: at,
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
        }
    }
}

/// One container.
pub struct Container {
    pub metadata: ContainerMetadata,
    status: Mutex<ContainerStatus>,
    status_path: PathBuf,
    pub io: Arc<ContainerIo>,
    /// The process part of the runtime spec (JSON), the template of exec processes: kept
    /// as text, a fraction of its size as a parsed tree.
    pub process_spec: Box<[u8]>,
    /// True once the container has exited (or never will run).
    exited: watch::Sender<bool>,
    /// Set when containerd reported an OOM kill for the container.
    oom_killed: std::sync::atomic::AtomicBool,
    /// Taken by the first of the paths that learn of the exit (event, re-sync, stop).
    exit_claimed: std::sync::atomic::AtomicBool,
    /// Set once the exited task was deleted: an exited container never has one again.
    task_deleted: std::sync::atomic::AtomicBool,
    /// Serialises create/start/remove transitions.
    pub lifecycle: tokio::sync::Mutex<()>,
    /// Resources set by UpdateContainerResources since creation.
    resources: Mutex<Option<crate::api::v1::LinuxContainerResources>>,
    /// The rootfs mounts its snapshot was prepared with, until StartContainer takes them
    /// (one round trip to containerd less); not kept across a restart of crius.
    rootfs_mounts: Mutex<Option<Vec<containerd_client::types::Mount>>>,
    /// What containerd's record says of it that the verbose status shows, kept so that
    /// the status needs no round trip to containerd; None when the record had no spec.
    record: Mutex<Option<Arc<RecordView>>>,
}

/// The parts of a container's containerd record the verbose status shows.
#[derive(Debug)]
pub struct RecordView {
    pub runtime_type: String,
    /// The OCI runtime spec as the record holds it (JSON text, shown as it is).
    pub spec: Box<serde_json::value::RawValue>,
}

impl RecordView {
    /// None when `spec` is not JSON.
    pub fn new(runtime_type: &str, spec: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(spec).ok()?;
        let spec = serde_json::value::RawValue::from_string(text.to_string()).ok()?;
        Some(Self {
            runtime_type: runtime_type.to_string(),
            spec,
        })
    }
}

impl Container {
    pub fn new(
        metadata: ContainerMetadata,
        status: ContainerStatus,
        status_path: PathBuf,
        io: Arc<ContainerIo>,
        process_spec: Box<[u8]>,
    ) -> Self {
        let done = status.state == ContainerState::Exited;
        Self {
            metadata,
            status: Mutex::new(status),
            status_path,
            io,
            process_spec,
            exited: watch::channel(done).0,
            oom_killed: std::sync::atomic::AtomicBool::new(false),
            exit_claimed: std::sync::atomic::AtomicBool::new(false),
            task_deleted: std::sync::atomic::AtomicBool::new(false),
            lifecycle: tokio::sync::Mutex::new(()),
            resources: Mutex::new(None),
            rootfs_mounts: Mutex::new(None),
            record: Mutex::new(None),
        }
    }

    /// Keeps what the verbose status shows of the container's record (after it was
    /// written or rewritten).
    pub fn keep_record(&self, view: Option<RecordView>) {
        *self.record.lock().unwrap_or_else(|p| p.into_inner()) = view.map(Arc::new);
    }

    pub fn record(&self) -> Option<Arc<RecordView>> {
        self.record
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Keeps the mounts of the freshly prepared rootfs snapshot for the task's creation.
    pub fn keep_rootfs_mounts(&self, mounts: Vec<containerd_client::types::Mount>) {
        *self.rootfs_mounts.lock().unwrap_or_else(|p| p.into_inner()) = Some(mounts);
    }

    /// The rootfs mounts kept at creation, once.
    pub fn take_rootfs_mounts(&self) -> Option<Vec<containerd_client::types::Mount>> {
        self.rootfs_mounts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// The container's cgroup resources: updated ones, else those it was created with.
    pub fn resources(&self) -> Option<crate::api::v1::LinuxContainerResources> {
        self.resources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .or_else(|| {
                self.metadata
                    .config
                    .linux
                    .as_ref()
                    .and_then(|l| l.resources.clone())
            })
    }

    pub fn set_resources(&self, resources: crate::api::v1::LinuxContainerResources) {
        *self.resources.lock().unwrap_or_else(|p| p.into_inner()) = Some(resources);
    }

    pub fn id(&self) -> &str {
        &self.metadata.id
    }

    pub fn status(&self) -> ContainerStatus {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Changes the status and writes it to the status file (atomically); a write that fails
    /// is logged (the status in memory stands).
    pub fn update_status(&self, update: impl FnOnce(&mut ContainerStatus)) -> ContainerStatus {
        let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
        update(&mut status);
        let snapshot = status.clone();
        if let Err(e) = self.write_status(&snapshot) {
            tracing::error!(container = %self.metadata.id, error = %e, "persisting container status failed");
        }
        if snapshot.state == ContainerState::Exited {
            self.exited.send_replace(true);
        }
        snapshot
    }

    /// Writes the status file as the status stands. CreateContainer's must succeed: start-up
    /// takes a container without one for a creation that never finished, and undoes it.
    pub fn persist_status(&self) -> std::io::Result<()> {
        let status = self.status.lock().unwrap_or_else(|p| p.into_inner());
        self.write_status(&status)
    }

    fn write_status(&self, status: &ContainerStatus) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(status).map_err(std::io::Error::other)?;
        crate::sys::fsutil::write_atomic(&self.status_path, &bytes, 0o600)
    }

    /// Waits until the container has exited.
    pub async fn wait_exited(&self) {
        let mut rx = self.exited.subscribe();
        let _ = rx.wait_for(|done| *done).await;
    }

    pub fn mark_oom_killed(&self) {
        self.oom_killed
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// True for the first caller only: that one records the exit.
    pub fn claim_exit(&self) -> bool {
        !self
            .exit_claimed
            .swap(true, std::sync::atomic::Ordering::AcqRel)
    }

    pub fn mark_task_deleted(&self) {
        self.task_deleted
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether the container's exited task is known to be deleted.
    pub fn task_deleted(&self) -> bool {
        self.task_deleted.load(std::sync::atomic::Ordering::Acquire)
    }

    pub fn oom_killed(&self) -> bool {
        self.oom_killed.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// Reads a persisted status file.
pub fn read_status(path: &std::path::Path) -> std::io::Result<ContainerStatus> {
    // crius wrote it (a few hundred bytes); whatever else is there now is not waited on.
    let bytes = crate::sys::fsutil::read_bounded(path, 1024 * 1024)?;
    serde_json::from_slice(&bytes).map_err(std::io::Error::other)
}

#[derive(Default)]
struct Inner {
    containers: HashMap<String, Arc<Container>>,
    ids: IdIndex,
}

#[derive(Default)]
pub struct ContainerStore {
    inner: RwLock<Inner>,
}

impl ContainerStore {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&self, container: Arc<Container>) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        inner.ids.insert(container.id());
        inner
            .containers
            .insert(container.id().to_string(), container);
    }

    pub fn remove(&self, id: &str) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        inner.ids.remove(id);
        inner.containers.remove(id);
    }

    /// The container whose ID is `id` or starts with it.
    pub fn get(&self, id: &str) -> Result<Option<Arc<Container>>, IdLookupError> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        if let Some(container) = inner.containers.get(id) {
            return Ok(Some(container.clone()));
        }
        Ok(inner
            .ids
            .get(id)?
            .and_then(|full| inner.containers.get(full).cloned()))
    }

    pub fn list(&self) -> Vec<Arc<Container>> {
        self.inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .containers
            .values()
            .cloned()
            .collect()
    }

    /// The containers of one sandbox.
    pub fn in_sandbox(&self, sandbox_id: &str) -> Vec<Arc<Container>> {
        self.list()
            .into_iter()
            .filter(|c| c.metadata.sandbox_id == sandbox_id)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn container_in(dir: &Path) -> Arc<Container> {
        let io = Arc::new(ContainerIo::create(&dir.join("io"), false, false).unwrap());
        Arc::new(Container::new(
            ContainerMetadata {
                id: "c1".into(),
                name: "n".into(),
                sandbox_id: "s".into(),
                config: ContainerConfig::default(),
                image_ref: "sha256:x".into(),
                image_name: "busybox".into(),
                log_path: String::new(),
                stop_signal: String::new(),
                user: None,
                created_at: 1,
                cgroups_path: String::new(),
                restore_from: String::new(),
                snapshotter: String::new(),
            },
            ContainerStatus::created(1),
            dir.join("status"),
            io,
            Box::default(),
        ))
    }

    #[tokio::test]
    async fn status_changes_are_persisted_and_exit_is_signalled() {
        let dir = tempfile::tempdir().unwrap();
        let container = container_in(dir.path());
        let path = dir.path().join("status");
        let waiter = {
            let c = container.clone();
            tokio::spawn(async move { c.wait_exited().await })
        };
        container.update_status(|s| {
            s.state = ContainerState::Exited;
            s.exit_code = 3;
        });
        waiter.await.unwrap();
        let read = read_status(&path).unwrap();
        assert_eq!(read.exit_code, 3);
        assert_eq!(read.state, ContainerState::Exited);
    }

    #[test]
    fn the_prepared_rootfs_mounts_are_taken_once() {
        let dir = tempfile::tempdir().unwrap();
        let container = container_in(dir.path());
        assert!(container.take_rootfs_mounts().is_none());
        let overlay = containerd_client::types::Mount {
            r#type: "overlay".into(),
            source: "overlay".into(),
            options: vec![
                "lowerdir=/l".into(),
                "upperdir=/u".into(),
                "workdir=/w".into(),
            ],
            ..Default::default()
        };
        container.keep_rootfs_mounts(vec![overlay.clone()]);
        assert_eq!(container.take_rootfs_mounts(), Some(vec![overlay]));
        assert!(container.take_rootfs_mounts().is_none());
    }
}
