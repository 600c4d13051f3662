//! `RemoveContainer`: force-stop a running container, then delete its task, containerd
//! record, snapshot, FIFOs and dirs, and release its name. An unknown ID is not an error.

use std::time::Duration;

use crate::api::v1::{RemoveContainerRequest, RemoveContainerResponse};
use tonic::Status;

use crate::cri::CriService;

impl CriService {
    pub async fn remove_container(
        &self,
        req: RemoveContainerRequest,
    ) -> Result<RemoveContainerResponse, Status> {
        let Some(container) = self.find_container(&req.container_id)? else {
            return Ok(RemoveContainerResponse {});
        };
        self.stop_container_process(&container, Duration::ZERO)
            .await?;
        let _lifecycle = container.lifecycle.lock().await;
        // Removed while this call waited (RemovePodSandbox): nothing is left to do.
        if !self.is_stored(&container) {
            return Ok(RemoveContainerResponse {});
        }
        self.destroy_container(&container, super::container::Leftovers::InBackground)
            .await?;
        tracing::info!(container = %container.id(), "container removed");
        Ok(RemoveContainerResponse {})
    }
}
