//! Rebuilding the in-memory stores from containerd at start-up, and finishing or undoing
//! what a crash left half-made.
//!
//! Each item loads with its own timeout and concurrently with the others, so one broken
//! or hung item cannot block start-up. A sandbox whose RunPodSandbox never finished is
//! completed when its pause task runs and its network is recorded, and undone otherwise; a container whose
//! CreateContainer never persisted its status is undone; crius's leases, directories with
//! no containerd container behind them and the netns they name are removed.

use std::time::Duration;

use futures::StreamExt;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use containerd_client::types::v1::Status as ProcessStatus;

use super::record::{
    KIND_CONTAINER, KIND_LABEL, KIND_SANDBOX, NETNS_NOTE, ROOTFS_VIEW_DIR, UNKNOWN_EXIT_CODE,
    VOLUME_LEASE_PREFIX, container_metadata_from_extensions as container_metadata,
    sandbox_metadata_from_extensions as metadata_from_extensions,
};
use crate::containerd::tasks::TaskState;
use crate::containerd::{Containerd, ContainerdError};
use crate::cri::CriService;
use crate::image::load::load_image;
use crate::io::ContainerIo;
use crate::store::container::read_status;
use crate::store::{Container, ContainerMetadata, ContainerState, ContainerStatus, RecordView};
use crate::store::{ImageStore, Sandbox, SandboxState, SandboxStatus};
use containerd_client::services::v1::Container as ContainerRecord;

/// Bound on loading one item.
pub const ITEM_TIMEOUT: Duration = Duration::from_secs(10);
/// Items loaded at once.
const CONCURRENCY: usize = 8;

/// Loads every image record of the namespace into `store`; returns how many images
/// (distinct IDs) the store holds afterwards.
pub async fn recover_images(
    containerd: &Containerd,
    store: &ImageStore,
) -> Result<usize, ContainerdError> {
    let records = containerd.list_images().await?;
    let total = records.len();
    let mut loads = futures::stream::iter(records)
        .map(|record| async move {
            let loaded = tokio::time::timeout(ITEM_TIMEOUT, load_image(containerd, &record)).await;
            (record.name, loaded)
        })
        .buffer_unordered(CONCURRENCY);
    while let Some((name, loaded)) = loads.next().await {
        match loaded {
            Ok(Ok(image)) => store.add(image),
            Ok(Err(e)) => {
                tracing::warn!(image = %name, error = %e, "skipping image that cannot be loaded")
            }
            Err(_) => {
                tracing::warn!(image = %name, timeout = ?ITEM_TIMEOUT, "skipping image that did not load in time")
            }
        }
    }
    tracing::info!(records = total, images = store.len(), "images recovered");
    Ok(store.len())
}

/// What asking containerd for a task's state gave: its answer, or a timeout.
type TaskLoad = Result<Result<Option<TaskState>, ContainerdError>, tokio::time::error::Elapsed>;

/// crius's containerd records of `kind`, each with its task's state, asked concurrently
/// and each within `ITEM_TIMEOUT`.
async fn records_with_tasks<'a>(
    service: &'a CriService,
    kind: &str,
) -> Result<impl futures::Stream<Item = (ContainerRecord, TaskLoad)> + 'a, ContainerdError> {
    let filter = format!("labels.\"{KIND_LABEL}\"=={kind}");
    let records = service.containerd.list_containers(vec![filter]).await?;
    Ok(futures::stream::iter(records)
        .map(move |record| async move {
            let task =
                tokio::time::timeout(ITEM_TIMEOUT, service.containerd.task_state(&record.id)).await;
            (record, task)
        })
        .buffer_unordered(CONCURRENCY))
}

/// Rebuilds the sandbox store and the sandbox names from containerd: each sandbox container's
/// metadata extension and its task's state.
pub async fn recover_sandboxes(service: &CriService) -> Result<usize, ContainerdError> {
    let mut loads = records_with_tasks(service, KIND_SANDBOX).await?;
    let mut recovered = 0;
    while let Some((record, task)) = loads.next().await {
        let metadata = match metadata_from_extensions(&record.extensions) {
            Some(Ok(metadata)) => metadata,
            Some(Err(e)) => {
                tracing::warn!(sandbox = %record.id, error = %e, "skipping sandbox with unreadable metadata");
                continue;
            }
            None => {
                // Not crius's (containerd's own CRI labels its records the same way):
                // never touched.
                tracing::debug!(sandbox = %record.id, "skipping a sandbox container crius did not make");
                continue;
            }
        };
        if metadata.id != record.id {
            tracing::warn!(sandbox = %record.id, metadata_id = %metadata.id, "skipping a sandbox whose metadata names another id");
            continue;
        }
        if !service.sandbox_was_started(&metadata.id) {
            let running = matches!(&task, Ok(Ok(Some(t))) if t.status == ProcessStatus::Running);
            // The network is recorded once CNI ADD and the pause task both succeeded.
            let networked = metadata.netns_path.is_empty() || !metadata.networks.is_empty();
            if !running || !networked {
                discard_sandbox(service, metadata).await;
                continue;
            }
            tracing::info!(sandbox = %metadata.id, "finishing a sandbox whose creation was interrupted");
            if let Err(e) = service.mark_sandbox_started(&metadata.id) {
                tracing::warn!(sandbox = %metadata.id, error = %e.message(), "cannot record the sandbox as made");
            }
        }
        let (state, pid) = match task {
            Ok(Ok(Some(t))) if t.status == ProcessStatus::Running => (SandboxState::Ready, t.pid),
            Ok(Ok(_)) => (SandboxState::NotReady, 0),
            Ok(Err(e)) => {
                tracing::warn!(sandbox = %record.id, error = %e, "sandbox task state unknown; NOTREADY");
                (SandboxState::NotReady, 0)
            }
            Err(_) => {
                tracing::warn!(sandbox = %record.id, timeout = ?ITEM_TIMEOUT, "sandbox task did not answer; NOTREADY");
                (SandboxState::NotReady, 0)
            }
        };
        let netns_closed = metadata.netns_path.is_empty()
            || !crate::sys::netns::is_pinned(Path::new(&metadata.netns_path));
        if let Err(e) = service.sandbox_names.reserve(&metadata.name, &metadata.id) {
            tracing::warn!(sandbox = %metadata.id, error = %e, "sandbox name already taken");
        }
        // A kubelet retry of the RunPodSandbox that made it still finds it.
        service.sandbox_names.set_fingerprint(
            &metadata.name,
            &metadata.id,
            crate::cri::sandbox_fingerprint(&metadata.config, &metadata.runtime_handler),
        );
        service.sandboxes.add(Arc::new(Sandbox::new(
            metadata,
            SandboxStatus {
                state,
                pid,
                netns_closed,
                network_released: false,
            },
        )));
        recovered += 1;
    }
    tracing::info!(sandboxes = recovered, "sandboxes recovered");
    Ok(recovered)
}

/// Rebuilds the container store from containerd and the status files: each container's
/// metadata extension, its persisted status, and its task's state. Running containers get
/// their output re-attached to their logs; those that exited while crius was down get
/// their real exit code and time.
pub async fn recover_containers(service: &CriService) -> Result<usize, ContainerdError> {
    let mut loads = records_with_tasks(service, KIND_CONTAINER).await?;
    let mut recovered = 0;
    while let Some((record, task)) = loads.next().await {
        let Some(metadata) = recorded_container_metadata(&record) else {
            continue;
        };
        let Some(status) = recovered_container_status(service, &metadata).await else {
            continue;
        };
        let Some(container) = rebuilt_container(service, &record, metadata, status) else {
            continue;
        };
        resume_container(service, &container, task).await;
        let metadata = &container.metadata;
        if let Err(e) = service
            .container_names
            .reserve(&metadata.name, &metadata.id)
        {
            tracing::warn!(container = %metadata.id, error = %e, "container name already taken");
        }
        service.container_names.set_fingerprint(
            &metadata.name,
            &metadata.id,
            crate::cri::container_fingerprint(&metadata.sandbox_id, &metadata.config),
        );
        service.containers.add(container);
        recovered += 1;
    }
    tracing::info!(containers = recovered, "containers recovered");
    Ok(recovered)
}

/// crius's metadata of a container record; None (logged) when the record is not crius's
/// or its metadata is unreadable or names another container.
fn recorded_container_metadata(record: &ContainerRecord) -> Option<ContainerMetadata> {
    let metadata = match container_metadata(&record.extensions) {
        Some(Ok(metadata)) => metadata,
        Some(Err(e)) => {
            tracing::warn!(container = %record.id, error = %e, "skipping container with unreadable metadata");
            return None;
        }
        None => {
            tracing::debug!(container = %record.id, "skipping a container crius did not make");
            return None;
        }
    };
    if metadata.id != record.id {
        tracing::warn!(container = %record.id, metadata_id = %metadata.id, "skipping a container whose metadata names another id");
        return None;
    }
    Some(metadata)
}

/// The container's status as its file last had it. CreateContainer persists the status
/// last: without the file the creation never finished, so it is undone here (None).
async fn recovered_container_status(
    service: &CriService,
    metadata: &ContainerMetadata,
) -> Option<ContainerStatus> {
    let id = &metadata.id;
    let reading = service.container_root_dir(id).join("status");
    let read = tokio::task::spawn_blocking(move || read_status(&reading))
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    match read {
        Ok(status) => Some(status),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::info!(container = %id, "undoing a container whose creation was interrupted");
            delete_record(service, id).await;
            remove_dirs(&[
                service.container_root_dir(id),
                service.container_state_dir(id),
            ]);
            None
        }
        Err(e) => {
            tracing::warn!(container = %id, error = %e, "container status file unreadable");
            let mut status = ContainerStatus::created(metadata.created_at);
            status.state = ContainerState::Unknown;
            Some(status)
        }
    }
}

/// The container as the store holds it, its FIFOs made again; None (logged) when they
/// cannot be.
fn rebuilt_container(
    service: &CriService,
    record: &ContainerRecord,
    metadata: ContainerMetadata,
    status: ContainerStatus,
) -> Option<Arc<Container>> {
    let id = metadata.id.clone();
    let process_spec = (record.spec.as_ref())
        .and_then(|any| serde_json::from_slice::<serde_json::Value>(&any.value).ok())
        .and_then(|spec| serde_json::to_vec(&spec["process"]).ok())
        .unwrap_or_default()
        .into_boxed_slice();
    let io = match ContainerIo::create(
        &service.container_state_dir(&id).join("io"),
        metadata.config.stdin,
        metadata.config.tty,
    ) {
        Ok(io) => Arc::new(io),
        Err(e) => {
            tracing::warn!(container = %id, error = %e, "cannot recreate container FIFOs; skipping");
            return None;
        }
    };
    let container = Arc::new(Container::new(
        metadata,
        status,
        service.container_root_dir(&id).join("status"),
        io,
        process_spec,
    ));
    let runtime_type = record.runtime.as_ref().map_or("", |r| r.name.as_str());
    container.keep_record(
        (record.spec.as_ref()).and_then(|any| RecordView::new(runtime_type, &any.value)),
    );
    Some(container)
}

/// Brings the container's status in line with its task: a running task gets its output
/// copied again, an exit missed while crius was away is handled now, a task containerd
/// cannot tell about makes the container EXITED with an unknown code.
async fn resume_container(service: &CriService, container: &Arc<Container>, task: TaskLoad) {
    let (metadata, status) = (&container.metadata, container.status());
    let id = &metadata.id;
    match task {
        Ok(Ok(Some(t))) if t.status == ProcessStatus::Running => {
            let log = (!metadata.log_path.is_empty()).then(|| Path::new(&metadata.log_path));
            if let Err(e) = container.io.start(log, service.config.log_line_limit()) {
                tracing::warn!(container = %id, error = %e, "cannot re-attach container output");
            }
            container.io.task_created();
            if status.state != ContainerState::Running {
                container.update_status(|s| {
                    s.state = ContainerState::Running;
                    s.pid = t.pid;
                });
            }
        }
        Ok(Ok(Some(t))) => {
            let (code, at) = t
                .exit
                .map(|e| (e.code, e.at))
                .unwrap_or((UNKNOWN_EXIT_CODE, std::time::SystemTime::now()));
            if status.state == ContainerState::Running {
                service.handle_container_exit(container, code, at).await;
            } else if let Err(e) = service.containerd.delete_task(id).await {
                tracing::warn!(container = %id, error = %e, "deleting a stale task failed");
            }
        }
        Ok(Ok(None)) if status.state == ContainerState::Running => {
            service
                .handle_container_exit(container, UNKNOWN_EXIT_CODE, std::time::SystemTime::now())
                .await;
        }
        Ok(Ok(None)) => {}
        Ok(Err(e)) => {
            tracing::warn!(container = %id, error = %e, "container task state unknown; EXITED with an unknown code");
            mark_lost(container);
        }
        Err(_) => {
            tracing::warn!(container = %id, timeout = ?ITEM_TIMEOUT, "container task did not answer; EXITED with an unknown code");
            mark_lost(container);
        }
    }
}

/// A container whose task could not be asked about: it is reported exited, code unknown.
fn mark_lost(container: &Container) {
    if matches!(
        container.status().state,
        ContainerState::Running | ContainerState::Unknown
    ) {
        container.update_status(|s| {
            s.state = ContainerState::Exited;
            s.exit_code = UNKNOWN_EXIT_CODE as i32;
            s.reason = "Unknown".to_string();
            s.finished_at = crate::cri::unix_nanos(std::time::SystemTime::now()).max(s.started_at);
            s.pid = 0;
        });
    }
}

/// Undoes a sandbox whose creation never finished: network, netns, task, containerd
/// container, snapshot and dirs. Kept (NOTREADY) when that fails, for Remove to retry.
async fn discard_sandbox(service: &CriService, metadata: crate::store::SandboxMetadata) {
    let id = metadata.id.clone();
    tracing::info!(sandbox = %id, "undoing a sandbox whose creation was interrupted");
    let sandbox = Arc::new(Sandbox::new(
        metadata.clone(),
        SandboxStatus {
            state: SandboxState::NotReady,
            pid: 0,
            netns_closed: false,
            network_released: false,
        },
    ));
    match tokio::time::timeout(ITEM_TIMEOUT, service.destroy_sandbox(&sandbox)).await {
        Ok(Ok(())) => {}
        failed => {
            let reason = match failed {
                Ok(Err(e)) => e.message().to_string(),
                _ => format!("timed out after {ITEM_TIMEOUT:?}"),
            };
            tracing::warn!(sandbox = %id, error = %reason, "cannot undo the half-made sandbox; keeping it NOTREADY");
            if let Err(e) = service.sandbox_names.reserve(&metadata.name, &id) {
                tracing::warn!(sandbox = %id, error = %e, "sandbox name already taken");
            }
            service.sandboxes.add(sandbox);
        }
    }
}

/// Deletes a containerd container crius made, with its task and snapshot.
async fn delete_record(service: &CriService, id: &str) {
    if let Err(e) = service.destroy_task(id).await {
        tracing::warn!(id, error = %e.message(), "deleting a leftover task failed");
    }
    if let Err(e) = service.containerd.delete_container(id).await {
        tracing::warn!(id, error = %e, "deleting a leftover containerd container failed");
    }
    remove_snapshot(service, id).await;
}

/// Removes the snapshot crius prepared under `id`, if it is still there, in whichever
/// configured snapshotter it is: what recorded its snapshotter may be gone.
async fn remove_snapshot(service: &CriService, id: &str) {
    for snapshotter in service.config.snapshotters() {
        if let Err(e) = service.containerd.remove_snapshot(snapshotter, id).await {
            tracing::warn!(id, snapshotter, error = %e, "removing a leftover snapshot failed");
        }
    }
}

fn remove_dirs(dirs: &[std::path::PathBuf]) {
    for dir in dirs {
        if let Err(e) = std::fs::remove_dir_all(dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %dir.display(), error = %e, "removing a leftover directory failed");
        }
    }
}

/// Whether `lease` holds the image volumes of a pod crius still has (they outlive restarts).
fn holds_live_image_volumes(service: &CriService, lease: &str) -> bool {
    lease.strip_prefix(VOLUME_LEASE_PREFIX).is_some_and(|id| {
        service
            .sandboxes
            .get(id)
            .ok()
            .flatten()
            .is_some_and(|s| s.id() == id)
    })
}

/// IDs of the entries of `dir` (none when it does not exist).
fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// After recovery: removes crius's leases (no pull or creation is in flight at start-up,
/// so what they hold is garbage), and the directories, shm mounts and netns of sandboxes
/// and containers containerd has no record of.
pub async fn clean_up_leftovers(service: &CriService) {
    delete_stale_leases(service).await;
    // What containerd still has a record of is no leftover, even when crius could not take
    // it back (its metadata unreadable, its FIFOs not made): removing its netns, snapshot or
    // files would tear down a pod that still runs.
    let recorded: HashSet<String> = match service.containerd.list_containers(Vec::new()).await {
        Ok(records) => records.into_iter().map(|r| r.id).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list containerd's records: leftovers stay until the next start");
            return;
        }
    };
    // First, so no snapshot below is removed under its idmapped mount.
    service.remove_stray_idmapped_rootfs(&|id| {
        let known_sandbox = service.sandboxes.get(id).ok().flatten().is_some();
        known_sandbox
            || service.containers.get(id).ok().flatten().is_some()
            || recorded.contains(id)
    });
    remove_sandbox_leftovers(service, &recorded).await;
    remove_container_leftovers(service, &recorded).await;
}

/// crius's leases but those of image volumes still mounted.
async fn delete_stale_leases(service: &CriService) {
    let leases = match service.containerd.list_leases().await {
        Ok(leases) => leases,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list leases to clean up");
            return;
        }
    };
    for lease in leases
        .iter()
        .filter(|l| l.starts_with("crius-") && !holds_live_image_volumes(service, l))
    {
        tracing::info!(%lease, "deleting a lease left by an interrupted operation");
        if let Err(e) = service.containerd.delete_lease(lease, false).await {
            tracing::warn!(%lease, error = %e, "deleting a stale lease failed");
        }
    }
}

/// IDs with entries under any of `dirs`, each once.
fn entries_of(dirs: &[PathBuf]) -> Vec<String> {
    let mut ids: Vec<String> = dirs.iter().flat_map(|dir| entries(dir)).collect();
    ids.sort();
    ids.dedup();
    ids
}

/// The netns, snapshot, image volumes and dirs of sandboxes neither crius nor containerd
/// knows.
async fn remove_sandbox_leftovers(service: &CriService, recorded: &HashSet<String>) {
    let config = &service.config;
    let sandbox_ids = entries_of(&[
        config.root.join("sandboxes"),
        config.state.join("sandboxes"),
        config.state.join("image-volumes"),
    ]);
    for id in sandbox_ids {
        let known = (service.sandboxes.get(&id).ok().flatten()).is_some_and(|s| s.id() == id);
        if known || recorded.contains(&id) {
            continue;
        }
        tracing::info!(sandbox = %id, "removing the leftovers of a sandbox containerd does not know");
        remove_leftover_netns(service, &id).await;
        remove_snapshot(service, &id).await;
        if let Err(e) = service.unmount_image_volumes(&id).await {
            tracing::warn!(sandbox = %id, error = %e.message(), "removing leftover image volumes failed");
        }
        if let Err(e) = service.remove_sandbox_dirs(&id) {
            tracing::warn!(sandbox = %id, error = %e.message(), "removing leftover sandbox dirs failed");
        }
    }
}

/// The netns a leftover sandbox's note names, if it is one of crius's.
async fn remove_leftover_netns(service: &CriService, id: &str) {
    let note = service.sandbox_root_dir(id).join(NETNS_NOTE);
    let note =
        tokio::task::spawn_blocking(move || crate::sys::fsutil::read_bounded_string(&note, 4096))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    let Ok(netns) = note else {
        return;
    };
    let netns = Path::new(netns.trim());
    if netns.as_os_str().is_empty() {
        return;
    }
    if !crate::sys::netns::is_pinned_by_crius(netns) {
        tracing::warn!(sandbox = %id, netns = %netns.display(), "a leftover's netns note names no netns of crius's: left alone");
    } else if let Err(e) = crate::sys::netns::remove(netns).await {
        tracing::warn!(sandbox = %id, error = %e, "removing a leftover netns failed");
    }
}

/// The snapshot and dirs of containers neither crius nor containerd knows, and any
/// container's rootfs view a crash left mounted.
async fn remove_container_leftovers(service: &CriService, recorded: &HashSet<String>) {
    let config = &service.config;
    let container_ids = entries_of(&[
        config.root.join("containers"),
        config.state.join("containers"),
    ]);
    for id in container_ids {
        // A crash in the middle of CreateContainer can leave the image's read-only rootfs
        // view mounted; it is never in use after start-up.
        let view = service.container_root_dir(&id).join(ROOTFS_VIEW_DIR);
        if view.exists() {
            if let Err(e) = crate::sys::mount::unmount_all(&view) {
                tracing::warn!(container = %id, error = %e, "unmounting a leftover rootfs view failed");
            }
            let _ = std::fs::remove_dir(&view);
        }
        let known = (service.containers.get(&id).ok().flatten()).is_some_and(|c| c.id() == id);
        if known || recorded.contains(&id) {
            continue;
        }
        tracing::info!(container = %id, "removing the leftovers of a container containerd does not know");
        remove_snapshot(service, &id).await;
        remove_dirs(&[
            service.container_root_dir(&id),
            service.container_state_dir(&id),
        ]);
    }
}
