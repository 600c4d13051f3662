//! `StopContainer`: the image's stop signal, up to the timeout, then SIGKILL. A container
//! that is not running, or not there, is stopped already.

use std::time::Duration;

use crate::api::v1::{StopContainerRequest, StopContainerResponse};
use tonic::Status;

use crate::cri::CriService;

impl CriService {
    pub async fn stop_container(
        &self,
        req: StopContainerRequest,
    ) -> Result<StopContainerResponse, Status> {
        // Stopping what is not there succeeds: kubelet retries and races with removal.
        let Some(container) = self.find_container(&req.container_id)? else {
            return Ok(StopContainerResponse {});
        };
        let timeout = Duration::from_secs(u64::try_from(req.timeout).unwrap_or(0));
        self.stop_container_process(&container, timeout).await?;
        tracing::info!(container = %container.id(), "container stopped");
        Ok(StopContainerResponse {})
    }
}
