//! `StartContainer`: open the log and start copying the FIFOs, create and start the task.
//! A failure leaves the container EXITED with reason `StartError`, exit code 128 and the
//! runtime's message, as containerd's CRI reports it.

use std::path::Path;
use std::time::SystemTime;

use crate::api::v1::{StartContainerRequest, StartContainerResponse};
use tonic::Status;

use super::container::{START_ERROR_EXIT_CODE, START_ERROR_REASON};
use super::unix_nanos;
use crate::cri::CriService;
use crate::store::{ContainerState, SandboxState};

impl CriService {
    pub async fn start_container(
        &self,
        req: StartContainerRequest,
    ) -> Result<StartContainerResponse, Status> {
        let container = self.require_container(&req.container_id)?;
        let sandbox = self
            .sandboxes
            .get(&container.metadata.sandbox_id)
            .ok()
            .flatten();
        // The pod's lock before the container's, in the order Stop/RemovePodSandbox take
        // them: a pod being stopped or removed does not get a container started under it.
        let _pod_lifecycle = match &sandbox {
            Some(sandbox) => Some(sandbox.lifecycle.lock().await),
            None => None,
        };
        let _lifecycle = container.lifecycle.lock().await;
        let id = container.id().to_string();
        if !self.is_stored(&container) {
            return Err(Status::not_found(format!("container {id} was removed")));
        }
        let state = container.status().state;
        if state != ContainerState::Created {
            return Err(Status::failed_precondition(format!(
                "container {id} is {state:?}, not created"
            )));
        }
        let sandbox_ready = sandbox
            .as_ref()
            .is_some_and(|s| s.status().state == SandboxState::Ready);
        if !sandbox_ready {
            return Err(Status::failed_precondition(format!(
                "the pod sandbox {} of container {id} is not ready",
                container.metadata.sandbox_id
            )));
        }

        match self.start_task_of(&container).await {
            Ok(pid) => {
                container.update_status(|s| {
                    s.state = ContainerState::Running;
                    s.pid = pid;
                    s.started_at = unix_nanos(SystemTime::now());
                });
                tracing::info!(container = %id, pid, "container started");
                self.emit_container_event(
                    &id,
                    &container.metadata.sandbox_id,
                    crate::api::v1::ContainerEventType::ContainerStartedEvent,
                );
                Ok(StartContainerResponse {})
            }
            Err(message) => {
                container.io.task_created();
                if let Err(e) = self.destroy_task(&id).await {
                    tracing::warn!(container = %id, error = %e, "cleaning up the failed task failed");
                }
                container
                    .io
                    .drain(std::time::Duration::from_millis(100))
                    .await;
                container.update_status(|s| {
                    s.state = ContainerState::Exited;
                    s.exit_code = START_ERROR_EXIT_CODE;
                    s.reason = START_ERROR_REASON.to_string();
                    s.message = message.clone();
                    s.finished_at = unix_nanos(SystemTime::now());
                });
                Err(Status::new(
                    super::runtime_errors::container_start_code(&message),
                    format!("failed to start container {id}: {message}"),
                ))
            }
        }
    }

    /// Creates and starts the task with the container's FIFOs; the error text on failure.
    async fn start_task_of(&self, container: &crate::store::Container) -> Result<u32, String> {
        let id = container.id();
        let log_path = (!container.metadata.log_path.is_empty())
            .then(|| Path::new(&container.metadata.log_path));
        container
            .io
            .start(log_path, self.config.log_line_limit())
            .map_err(|e| format!("opening the container's output: {e}"))?;
        // A restore replays the checkpoint's layer changes before the rootfs is mounted.
        let restore = match container.metadata.restore_from.as_str() {
            "" => None,
            archive => Some(self.prepare_restore(container, Path::new(archive)).await?),
        };
        let started = self.create_and_start_task(container, restore).await;
        if !container.metadata.restore_from.is_empty() {
            self.finish_restore(id);
        }
        started
    }

    /// Creates the task (restoring it with the given task options) and starts it.
    async fn create_and_start_task(
        &self,
        container: &crate::store::Container,
        options: Option<prost_types::Any>,
    ) -> Result<u32, String> {
        let id = container.id();
        let prepared = container.take_rootfs_mounts();
        let mounts = match self.container_user_namespace(container) {
            // In the pod's own user namespace: its idmapped rootfs or remapped copy.
            Some(pod) => self
                .userns_rootfs_mounts(id, &pod)
                .await
                .map_err(|e| e.message().to_string())?,
            None => match prepared {
                Some(mounts) => mounts,
                None => self
                    .containerd
                    .snapshot_mounts(self.snapshotter_of(&container.metadata.snapshotter), id)
                    .await
                    .map_err(|e| e.to_string())?,
            },
        };
        let stdio = container.io.fifos().paths();
        let tty = container.metadata.config.tty;
        self.containerd
            .create_task_from(id, mounts, [&stdio[0], &stdio[1], &stdio[2]], tty, options)
            .await
            .map_err(|e| e.to_string())?;
        container.io.task_created();
        self.containerd
            .start_task(id, "")
            .await
            .map_err(|e| e.to_string())
    }
}
