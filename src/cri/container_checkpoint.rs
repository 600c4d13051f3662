//! `CheckpointContainer` (kubelet's forensic checkpoint): the running container is paused,
//! dumped by CRIU through containerd's task checkpoint (it keeps running), its writable
//! layer's changes are taken, and it is resumed; the archive (see `crate::checkpoint`) is
//! then written at the requested location. Refused with FAILED_PRECONDITION where CRIU
//! cannot work (checked at start-up) or the container does not run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::api::v1::{
    CheckpointContainerRequest, CheckpointContainerResponse, ContainerStatusRequest,
};
use tonic::Status;

use super::sandbox::internal;
use crate::checkpoint::{ArchiveParts, ContainerConfigDump, StagedLayer, go_time};
use crate::cri::CriService;
use crate::store::{Container, ContainerState};

/// How long a checkpoint may take when the request sets no timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

impl CriService {
    pub async fn checkpoint_container(
        &self,
        req: CheckpointContainerRequest,
    ) -> Result<CheckpointContainerResponse, Status> {
        if req.location.is_empty() {
            return Err(Status::invalid_argument(
                "a checkpoint location is required",
            ));
        }
        let location = PathBuf::from(&req.location);
        if !location.is_absolute() {
            return Err(Status::invalid_argument(format!(
                "the checkpoint location {:?} is not an absolute path",
                req.location
            )));
        }
        let container = self.require_container(&req.container_id)?;
        if let Err(reason) = &self.host.criu {
            return Err(Status::failed_precondition(format!(
                "containers cannot be checkpointed on this host: {reason}"
            )));
        }
        let timeout = u64::try_from(req.timeout)
            .ok()
            .filter(|t| *t > 0)
            .map_or(DEFAULT_TIMEOUT, Duration::from_secs);
        // In a task of its own: a client that gives up must not leave the container paused.
        let service = self.clone();
        tokio::spawn(async move {
            let _lifecycle = container.lifecycle.lock().await;
            service
                .checkpoint_locked(&container, &location, timeout)
                .await
        })
        .await
        .map_err(|e| Status::internal(format!("checkpoint task failed: {e}")))??;
        Ok(CheckpointContainerResponse {})
    }

    async fn checkpoint_locked(
        &self,
        container: &Arc<Container>,
        location: &Path,
        timeout: Duration,
    ) -> Result<(), Status> {
        let id = container.id().to_string();
        if !self.is_stored(container) {
            return Err(Status::not_found(format!("container {id} was removed")));
        }
        let state = container.status().state;
        if state != ContainerState::Running {
            return Err(Status::failed_precondition(format!(
                "container {id} is {state:?}: only running containers can be checkpointed"
            )));
        }
        let record = self
            .containerd
            .get_container(&id)
            .await
            .map_err(internal)?
            .ok_or_else(|| Status::not_found(format!("container {id} has no containerd record")))?;
        let runtime = record
            .runtime
            .as_ref()
            .map(|r| r.name.clone())
            .unwrap_or_default();
        if !crate::config::RUNC_RUNTIME_TYPES.contains(&runtime.as_str()) {
            return Err(Status::failed_precondition(format!(
                "container {id} runs on {runtime:?}, which cannot checkpoint (only runc's shims)"
            )));
        }
        let staging = self
            .container_root_dir(&id)
            .join(format!("checkpoint-{:x}", rand::random::<u64>()));
        let result = async {
            let images = make_private_dir(&staging.join("images"))?;
            let scratch = make_private_dir(&staging.join("scratch"))?;
            let upper = self.writable_layer(container).await;
            let layer = self
                .dump_paused(&id, &images, &staging, timeout, upper, scratch)
                .await?;
            let parts = CheckpointFiles {
                config: self.config_dump(container, &runtime),
                spec: record.spec.map(|s| s.value).unwrap_or_default(),
                status: self.status_dump(&id).await?,
            };
            let (location, log) = (location.to_path_buf(), container.metadata.log_path.clone());
            tokio::task::spawn_blocking(move || {
                crate::checkpoint::write_archive(
                    &location,
                    &ArchiveParts {
                        images: &images,
                        work: &staging_of(&images),
                        config_dump: &parts.config,
                        spec_dump: &parts.spec,
                        status_dump: &parts.status,
                        log: (!log.is_empty()).then_some(Path::new(&log)),
                        layer: layer.as_ref(),
                    },
                )
            })
            .await
            .map_err(internal)?
            .map_err(|e| Status::internal(format!("writing the checkpoint archive: {e}")))
        }
        .await;
        if let Err(e) = std::fs::remove_dir_all(&staging) {
            tracing::warn!(container = %id, error = %e, "removing the checkpoint's staging dir failed");
        }
        if result.is_ok() {
            tracing::info!(container = %id, location = %location.display(), "container checkpointed");
        }
        result
    }

    /// Pauses the task, has CRIU dump it into `images` (its log in `work`), stages the
    /// writable layer's changes while it is still paused (so they agree with its memory and
    /// the container cannot change them under the walk), and resumes it whatever happened.
    /// Past `timeout` the dump is left to finish in the background, and the task is resumed
    /// once it has (CRIU puts back the frozen state it found).
    async fn dump_paused(
        &self,
        id: &str,
        images: &Path,
        work: &Path,
        timeout: Duration,
        upper: Option<PathBuf>,
        scratch: PathBuf,
    ) -> Result<Option<StagedLayer>, Status> {
        let options = crate::protos::runc::CheckpointOptions {
            exit: false,
            image_path: images.display().to_string(),
            work_path: work.display().to_string(),
            ..Default::default()
        };
        let options = prost_types::Any {
            type_url: "containerd.runc.v1.CheckpointOptions".to_string(),
            value: prost::Message::encode_to_vec(&options),
        };
        self.containerd
            .pause_task(id)
            .await
            .map_err(|e| Status::internal(format!("pausing container {id}: {e}")))?;
        let containerd = self.containerd.clone();
        let task_id = id.to_string();
        let mut dump =
            tokio::spawn(async move { containerd.checkpoint_task(&task_id, options).await });
        let dumped = match tokio::time::timeout(timeout, &mut dump).await {
            Ok(joined) => joined.map_err(|e| Status::internal(format!("checkpoint task: {e}")))?,
            Err(_) => {
                let (containerd, paused) = (self.containerd.clone(), id.to_string());
                tokio::spawn(async move {
                    let _ = dump.await;
                    if let Err(e) = containerd.resume_task(&paused).await {
                        tracing::warn!(container = %paused, error = %e, "resuming a container after a timed-out checkpoint failed");
                    }
                });
                return Err(Status::deadline_exceeded(format!(
                    "checkpointing container {id} took over {timeout:?}; it is resumed when CRIU is done"
                )));
            }
        };
        let staged = match (&dumped, upper) {
            (Ok(()), Some(upper)) => tokio::task::spawn_blocking(move || {
                crate::checkpoint::stage_layer(&upper, &scratch)
            })
            .await
            .map_err(internal)
            .and_then(|r| {
                r.map(Some).map_err(|e| {
                    Status::internal(format!("taking the writable layer's changes: {e}"))
                })
            }),
            _ => Ok(None),
        };
        // A container left frozen fails every probe: its checkpoint is no success.
        let resumed = match self.containerd.resume_task(id).await {
            Ok(()) => Ok(()),
            Err(first) => {
                tracing::warn!(container = id, error = %first, "resuming a checkpointed container failed; trying again");
                self.containerd.resume_task(id).await
            }
        };
        // A task that is gone (the container exited) is not left paused.
        if let Err(e) = resumed.or_else(|e| if e.is_not_found() { Ok(()) } else { Err(e) }) {
            return Err(Status::internal(format!(
                "container {id} is left paused after its checkpoint: resuming it failed: {e}"
            )));
        }
        match dumped {
            Ok(()) => staged,
            // The staging dir goes away: CRIU's own reason is kept in the message.
            Err(e) => Err(Status::internal(format!(
                "CRIU could not checkpoint container {id}: {e}{}",
                criu_error(&work.join("dump.log"))
                    .map(|line| format!("; CRIU's first error: {line}"))
                    .unwrap_or_default()
            ))),
        }
    }

    /// The container's writable layer (its overlay upper dir), if the snapshotter has one.
    pub(crate) async fn writable_layer(&self, container: &Container) -> Option<PathBuf> {
        let mounts = self
            .containerd
            .snapshot_mounts(
                self.snapshotter_of(&container.metadata.snapshotter),
                container.id(),
            )
            .await
            .ok()?;
        mounts
            .iter()
            .flat_map(|m| m.options.iter())
            .find_map(|o| o.strip_prefix("upperdir="))
            .map(PathBuf::from)
    }

    fn config_dump(&self, container: &Container, runtime: &str) -> ContainerConfigDump {
        let metadata = &container.metadata;
        let created = u64::try_from(metadata.created_at)
            .ok()
            .map(|n| SystemTime::UNIX_EPOCH + Duration::from_nanos(n));
        ContainerConfigDump {
            id: metadata.id.clone(),
            name: metadata
                .config
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default(),
            rootfs_image: metadata.image_name.clone(),
            rootfs_image_ref: metadata.image_ref.clone(),
            rootfs_image_name: metadata.image_name.clone(),
            runtime: runtime.to_string(),
            created_time: go_time(created),
            checkpointed_time: go_time(Some(SystemTime::now())),
            restored_time: go_time(None),
            restored: false,
        }
    }

    /// The CRI status of the container, as JSON.
    async fn status_dump(&self, id: &str) -> Result<Vec<u8>, Status> {
        let status = self
            .container_status(ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: false,
            })
            .await?
            .status;
        serde_json::to_vec(&status).map_err(internal)
    }
}

/// What the archive holds besides files on disk.
struct CheckpointFiles {
    config: ContainerConfigDump,
    spec: Vec<u8>,
    status: Vec<u8>,
}

/// The first error line of a CRIU log (read up to 1 MiB).
fn criu_error(log: &Path) -> Option<String> {
    use std::io::Read;
    let mut text = Vec::new();
    std::fs::File::open(log)
        .ok()?
        .take(1024 * 1024)
        .read_to_end(&mut text)
        .ok()?;
    crate::checkpoint::first_criu_error(&String::from_utf8_lossy(&text))
}

/// CRIU's work dir is the staging dir, the parent of its images.
fn staging_of(images: &Path) -> PathBuf {
    images.parent().unwrap_or(images).to_path_buf()
}

fn make_private_dir(path: &Path) -> Result<PathBuf, Status> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|e| Status::internal(format!("creating {}: {e}", path.display())))?;
    Ok(path.to_path_buf())
}
