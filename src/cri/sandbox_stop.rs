//! `StopPodSandbox`: stop the pod's task, tear down its network (from the cached CNI result,
//! also when the netns is gone), unmount its /dev/shm and remove its netns. Idempotent, and
//! an unknown ID succeeds.

use crate::api::v1::{StopPodSandboxRequest, StopPodSandboxResponse};
use tonic::Status;

use crate::cri::CriService;

impl CriService {
    pub async fn stop_pod_sandbox(
        &self,
        req: StopPodSandboxRequest,
    ) -> Result<StopPodSandboxResponse, Status> {
        // The CRI makes Stop idempotent: a sandbox that is gone has nothing left to reclaim.
        let Some(sandbox) = self.find_sandbox(&req.pod_sandbox_id)? else {
            return Ok(StopPodSandboxResponse {});
        };
        let _lifecycle = sandbox.lifecycle.lock().await;
        self.stop_sandbox(&sandbox).await?;
        tracing::info!(sandbox = %sandbox.id(), "pod sandbox stopped");
        Ok(StopPodSandboxResponse {})
    }
}
