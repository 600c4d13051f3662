//! RPCs whose capability is not built yet. Each answers `UNIMPLEMENTED` with its name, so a
//! client sees exactly what is missing instead of a fake success. Entries leave this file as
//! their capability lands in its own module.

use k8s_cri::v1::*;
use tonic::Status;

use crate::server::CriService;

macro_rules! not_built {
    ($($name:ident, $rpc:literal, $req:ident, $resp:ident;)*) => {
        impl CriService {
            $(
                pub async fn $name(&self, _req: $req) -> Result<$resp, Status> {
                    Err(Status::unimplemented(concat!($rpc, " is not implemented in crius yet")))
                }
            )*
        }
    };
}

not_built! {
    container_stats, "ContainerStats", ContainerStatsRequest, ContainerStatsResponse;
    list_container_stats, "ListContainerStats", ListContainerStatsRequest, ListContainerStatsResponse;
    pod_sandbox_stats, "PodSandboxStats", PodSandboxStatsRequest, PodSandboxStatsResponse;
    list_pod_sandbox_stats, "ListPodSandboxStats", ListPodSandboxStatsRequest, ListPodSandboxStatsResponse;
    checkpoint_container, "CheckpointContainer", CheckpointContainerRequest, CheckpointContainerResponse;
    list_metric_descriptors, "ListMetricDescriptors", ListMetricDescriptorsRequest, ListMetricDescriptorsResponse;
    list_pod_sandbox_metrics, "ListPodSandboxMetrics", ListPodSandboxMetricsRequest, ListPodSandboxMetricsResponse;
}
