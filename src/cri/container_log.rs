//! `ReopenContainerLog`: kubelet rotated the log file away; write to a new one.

use crate::api::v1::{ReopenContainerLogRequest, ReopenContainerLogResponse};
use tonic::Status;

use crate::cri::CriService;
use crate::store::ContainerState;

impl CriService {
    pub async fn reopen_container_log(
        &self,
        req: ReopenContainerLogRequest,
    ) -> Result<ReopenContainerLogResponse, Status> {
        let container = self.require_container(&req.container_id)?;
        if container.status().state != ContainerState::Running {
            return Err(Status::failed_precondition(format!(
                "container {} is not running",
                container.id()
            )));
        }
        container
            .io
            .reopen_log()
            .map_err(|e| Status::internal(format!("reopening the container log: {e}")))?;
        Ok(ReopenContainerLogResponse {})
    }
}
