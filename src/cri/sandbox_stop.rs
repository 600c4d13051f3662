//! `StopPodSandbox`: stop the pod's task, tear down its network (from the cached CNI result,
//! also when the netns is gone), unmount its /dev/shm and remove its netns. Idempotent.

use k8s_cri::v1::{StopPodSandboxRequest, StopPodSandboxResponse};
use tonic::Status;

use crate::server::CriService;

impl CriService {
    pub async fn stop_pod_sandbox(
        &self,
        req: StopPodSandboxRequest,
    ) -> Result<StopPodSandboxResponse, Status> {
        let sandbox = self.find_sandbox(&req.pod_sandbox_id)?.ok_or_else(|| {
            Status::not_found(format!("pod sandbox {:?} not found", req.pod_sandbox_id))
        })?;
        let _lifecycle = sandbox.lifecycle.lock().await;
        self.stop_sandbox(&sandbox).await?;
        tracing::info!(sandbox = %sandbox.id(), "pod sandbox stopped");
        Ok(StopPodSandboxResponse {})
    }
}
