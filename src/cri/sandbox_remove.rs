//! `RemovePodSandbox`: stop it if needed, then delete its task, containerd container,
//! snapshot, directories and netns, and release its name. An unknown ID is not an error.

use crate::api::v1::{RemovePodSandboxRequest, RemovePodSandboxResponse};
use tonic::Status;

use super::sandbox::internal;
use crate::cri::CriService;
use crate::store::Sandbox;
use std::sync::Arc;

impl CriService {
    pub async fn remove_pod_sandbox(
        &self,
        req: RemovePodSandboxRequest,
    ) -> Result<RemovePodSandboxResponse, Status> {
        let Some(sandbox) = self.find_sandbox(&req.pod_sandbox_id)? else {
            return Ok(RemovePodSandboxResponse {});
        };
        let _lifecycle = sandbox.lifecycle.lock().await;
        let metadata = sandbox.metadata();
        let id = metadata.id.clone();
        self.destroy_sandbox(&sandbox).await?;
        self.sandboxes.remove(&id);
        self.sandbox_names.release(&metadata.name, &id);
        self.emit_container_event(
            &id,
            &id,
            crate::api::v1::ContainerEventType::ContainerDeletedEvent,
        );
        tracing::info!(sandbox = %id, "pod sandbox removed");
        Ok(RemovePodSandboxResponse {})
    }

    /// Stops the sandbox (idempotent: it also finishes a stop that failed half-way), then
    /// deletes its containers, containerd container, snapshot and directories.
    pub(crate) async fn destroy_sandbox(&self, sandbox: &Arc<Sandbox>) -> Result<(), Status> {
        let id = sandbox.id();
        self.stop_sandbox(sandbox).await?;
        for container in self.containers.in_sandbox(&id) {
            let _container_lifecycle = container.lifecycle.lock().await;
            self.destroy_container(&container, super::container::Leftovers::Wait)
                .await?;
        }
        // What RemoveContainer left running: nothing of the pod outlives its removal.
        sandbox.container_cleanups.close();
        sandbox.container_cleanups.wait().await;
        self.containerd
            .delete_container(&id)
            .await
            .map_err(internal)?;
        self.containerd
            .remove_snapshot(self.snapshotter_of(&sandbox.metadata().snapshotter), &id)
            .await
            .map_err(internal)?;
        self.remove_sandbox_dirs(&id)
    }
}
