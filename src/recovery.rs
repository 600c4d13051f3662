//! Rebuilding the in-memory stores from containerd at start-up.
//!
//! Each item loads with its own timeout and concurrently with the others, so one broken
//! or hung item cannot block start-up; what cannot be loaded is logged and skipped.

use std::time::Duration;

use futures::StreamExt;

use std::path::Path;
use std::sync::Arc;

use containerd_client::types::v1::Status as ProcessStatus;

use crate::containerd::{Containerd, ContainerdError};
use crate::cri::container::metadata_from_extensions as container_metadata;
use crate::cri::exits::UNKNOWN_EXIT_CODE;
use crate::cri::sandbox::{KIND_CONTAINER, KIND_LABEL, KIND_SANDBOX, metadata_from_extensions};
use crate::image::load::load_image;
use crate::io::ContainerIo;
use crate::server::CriService;
use crate::store::container::read_status;
use crate::store::{Container, ContainerState, ContainerStatus};
use crate::store::{ImageStore, Sandbox, SandboxState, SandboxStatus};

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

/// Rebuilds the sandbox store and the sandbox names from containerd: each sandbox container's
/// metadata extension and its task's state.
pub async fn recover_sandboxes(service: &CriService) -> Result<usize, ContainerdError> {
    let filter = format!("labels.\"{KIND_LABEL}\"=={KIND_SANDBOX}");
    let records = service.containerd.list_containers(vec![filter]).await?;
    let mut loads = futures::stream::iter(records)
        .map(|record| async move {
            let task =
                tokio::time::timeout(ITEM_TIMEOUT, service.containerd.task_state(&record.id)).await;
            (record, task)
        })
        .buffer_unordered(CONCURRENCY);
    let mut recovered = 0;
    while let Some((record, task)) = loads.next().await {
        let metadata = match metadata_from_extensions(&record.extensions) {
            Some(Ok(metadata)) => metadata,
            Some(Err(e)) => {
                tracing::warn!(sandbox = %record.id, error = %e, "skipping sandbox with unreadable metadata");
                continue;
            }
            None => {
                tracing::warn!(sandbox = %record.id, "skipping sandbox container without crius metadata");
                continue;
            }
        };
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
            || !crate::netns::is_pinned(Path::new(&metadata.netns_path));
        if let Err(e) = service.sandbox_names.reserve(&metadata.name, &metadata.id) {
            tracing::warn!(sandbox = %metadata.id, error = %e, "sandbox name already taken");
        }
        service.sandboxes.add(Arc::new(Sandbox::new(
            metadata,
            SandboxStatus {
                state,
                pid,
                netns_closed,
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
    let filter = format!("labels.\"{KIND_LABEL}\"=={KIND_CONTAINER}");
    let records = service.containerd.list_containers(vec![filter]).await?;
    let mut loads = futures::stream::iter(records)
        .map(|record| async move {
            let task =
                tokio::time::timeout(ITEM_TIMEOUT, service.containerd.task_state(&record.id)).await;
            (record, task)
        })
        .buffer_unordered(CONCURRENCY);
    let mut recovered = 0;
    while let Some((record, task)) = loads.next().await {
        let metadata = match container_metadata(&record.extensions) {
            Some(Ok(metadata)) => metadata,
            Some(Err(e)) => {
                tracing::warn!(container = %record.id, error = %e, "skipping container with unreadable metadata");
                continue;
            }
            None => {
                tracing::warn!(container = %record.id, "skipping container without crius metadata");
                continue;
            }
        };
        let id = metadata.id.clone();
        let status_path = service.container_root_dir(&id).join("status");
        let status = read_status(&status_path).unwrap_or_else(|e| {
            tracing::warn!(container = %id, error = %e, "container status file unreadable");
            let mut status = ContainerStatus::created(metadata.created_at);
            status.state = ContainerState::Unknown;
            status
        });
        let process_spec = record
            .spec
            .as_ref()
            .and_then(|any| serde_json::from_slice::<serde_json::Value>(&any.value).ok())
            .map(|spec| spec["process"].clone())
            .unwrap_or_default();
        let io = match ContainerIo::create(
            &service.container_state_dir(&id).join("io"),
            metadata.config.stdin,
            metadata.config.tty,
        ) {
            Ok(io) => Arc::new(io),
            Err(e) => {
                tracing::warn!(container = %id, error = %e, "cannot recreate container FIFOs; skipping");
                continue;
            }
        };
        let container = Arc::new(Container::new(
            metadata.clone(),
            status.clone(),
            status_path,
            io,
            process_spec,
        ));
        match task {
            Ok(Ok(Some(t))) if t.status == ProcessStatus::Running => {
                let log = (!metadata.log_path.is_empty()).then(|| Path::new(&metadata.log_path));
                if let Err(e) = container.io.start(log) {
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
                    service.handle_container_exit(&container, code, at).await;
                } else if let Err(e) = service.containerd.delete_task(&id).await {
                    tracing::warn!(container = %id, error = %e, "deleting a stale task failed");
                }
            }
            Ok(Ok(None)) if status.state == ContainerState::Running => {
                service
                    .handle_container_exit(
                        &container,
                        UNKNOWN_EXIT_CODE,
                        std::time::SystemTime::now(),
                    )
                    .await;
            }
            Ok(Ok(None)) => {}
            Ok(Err(e)) => {
                tracing::warn!(container = %id, error = %e, "container task state unknown");
            }
            Err(_) => {
                tracing::warn!(container = %id, timeout = ?ITEM_TIMEOUT, "container task did not answer");
            }
        }
        if let Err(e) = service.container_names.reserve(&metadata.name, &id) {
            tracing::warn!(container = %id, error = %e, "container name already taken");
        }
        service.containers.add(container);
        recovered += 1;
    }
    tracing::info!(containers = recovered, "containers recovered");
    Ok(recovered)
}
