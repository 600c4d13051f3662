//! What the benchmarks that time a pod's start share: a one-container pod brought up with
//! its two latencies, and torn down.

use std::time::{Duration, Instant};

use crate::common::pod::image;
use crius::api::v1::{
    ContainerConfig, ContainerMetadata, CreateContainerRequest, ImageSpec, PodSandboxConfig,
    RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest, StopPodSandboxRequest,
};
use crius_testkit::CriClient;

/// A busybox container that sleeps.
pub fn workload() -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: "app".to_string(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: image("busybox:latest"),
            ..Default::default()
        }),
        command: ["sleep", "3600"].map(String::from).to_vec(),
        log_path: "app.log".to_string(),
        ..Default::default()
    }
}

/// Runs a pod from `config` with one container on `handler`; returns the pod id and the
/// latency of RunPodSandbox and StartContainer.
pub async fn bring_up(
    client: &mut CriClient,
    config: PodSandboxConfig,
    handler: &str,
) -> (String, [Duration; 2]) {
    std::fs::create_dir_all(&config.log_directory).expect("create the pod log directory");
    let t = Instant::now();
    let pod_id = client
        .runtime
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: handler.to_string(),
        })
        .await
        .expect("RunPodSandbox")
        .into_inner()
        .pod_sandbox_id;
    let run = t.elapsed();
    let container_id = client
        .runtime
        .create_container(CreateContainerRequest {
            pod_sandbox_id: pod_id.clone(),
            config: Some(workload()),
            sandbox_config: Some(config),
        })
        .await
        .expect("CreateContainer")
        .into_inner()
        .container_id;
    let t = Instant::now();
    client
        .runtime
        .start_container(StartContainerRequest { container_id })
        .await
        .expect("StartContainer");
    (pod_id, [run, t.elapsed()])
}

pub async fn tear_down(client: &mut CriClient, pod_id: &str) {
    client
        .runtime
        .stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: pod_id.to_string(),
        })
        .await
        .expect("StopPodSandbox");
    client
        .runtime
        .remove_pod_sandbox(RemovePodSandboxRequest {
            pod_sandbox_id: pod_id.to_string(),
        })
        .await
        .expect("RemovePodSandbox");
}
