//! A pod and its containers, driven through crius's client: the helpers the container
//! and isolation tests share.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crius::api::v1::{
    ContainerConfig, ContainerMetadata, ContainerState, ContainerStatusRequest,
    CreateContainerRequest, ExecSyncRequest, ImageSpec, LinuxPodSandboxConfig,
    LinuxSandboxSecurityContext, NamespaceMode, NamespaceOption, PodSandboxConfig,
    PullImageRequest, RemoveContainerRequest, RemovePodSandboxRequest, RunPodSandboxRequest,
    StartContainerRequest, StopContainerRequest,
};
use crius_testkit::CriClient;

use super::{Crius, Testbed, eventually, pod_config};

/// Whether the file at `path` comes to contain `needle` within five seconds.
pub async fn log_contains(path: &Path, needle: &str) -> bool {
    let path = path.to_path_buf();
    let needle = needle.to_string();
    eventually(Duration::from_secs(5), || {
        let (path, needle) = (path.clone(), needle.clone());
        async move {
            std::fs::read_to_string(&path)
                .map(|l| l.contains(&needle))
                .unwrap_or(false)
        }
    })
    .await
}

pub fn image(name: &str) -> String {
    format!("{}/{name}", Testbed::from_env().registry)
}

/// A running host-network pod whose logs go under the test's directory.
pub struct Pod {
    pub client: CriClient,
    pub id: String,
    pub config: PodSandboxConfig,
}

/// A running host-network pod.
pub async fn pod(crius: &Crius, name: &str) -> Pod {
    pod_with(crius, host_network_pod_config(name)).await
}

/// The config of a host-network pod named `name`.
pub fn host_network_pod_config(name: &str) -> PodSandboxConfig {
    let mut config = pod_config(name);
    // It shares the host's UTS namespace: no hostname of its own.
    config.hostname = String::new();
    config.linux = Some(LinuxPodSandboxConfig {
        security_context: Some(LinuxSandboxSecurityContext {
            namespace_options: Some(NamespaceOption {
                network: NamespaceMode::Node as i32,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    config
}

/// A running pod made from `config` (its log directory goes under the test's directory).
pub async fn pod_with(crius: &Crius, config: PodSandboxConfig) -> Pod {
    pod_on(crius, config, "").await
}

/// Pulls a test image (`busybox:latest`, ...) from the test bed's registry; returns its
/// image ref.
pub async fn pull(client: &mut CriClient, name: &str) -> String {
    client
        .image
        .pull_image(PullImageRequest {
            image: Some(ImageSpec {
                image: image(name),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("pull {name}: {e}"))
        .into_inner()
        .image_ref
}

/// A running pod made from `config` on runtime handler `handler`.
pub async fn pod_on(crius: &Crius, mut config: PodSandboxConfig, handler: &str) -> Pod {
    let name = config
        .metadata
        .as_ref()
        .map(|m| m.name.clone())
        .unwrap_or_default();
    let mut client = crius.client().await;
    for img in [
        "busybox:latest",
        "busybox-entry:latest",
        "busybox-user:nobody",
    ] {
        pull(&mut client, img).await;
    }
    config.log_directory = crius
        .dir
        .path()
        .join("logs")
        .join(&name)
        .display()
        .to_string();
    let mut request = tonic::Request::new(RunPodSandboxRequest {
        config: Some(config.clone()),
        runtime_handler: handler.to_string(),
    });
    request.set_timeout(Duration::from_secs(240));
    let id = client
        .runtime
        .run_pod_sandbox(request)
        .await
        .expect("run pod")
        .into_inner()
        .pod_sandbox_id;
    Pod { client, id, config }
}

pub fn container(name: &str, img: &str, command: &[&str]) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.to_string(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: image(img),
            ..Default::default()
        }),
        command: command.iter().map(|s| s.to_string()).collect(),
        log_path: format!("{name}.log"),
        labels: HashMap::from([("name".to_string(), name.to_string())]),
        ..Default::default()
    }
}

impl Pod {
    /// Pulls a test bed image by its short name (`busybox:latest`); returns its image ref.
    pub async fn pull(&mut self, name: &str) -> String {
        pull(&mut self.client, name).await
    }

    pub async fn create(&mut self, config: ContainerConfig) -> Result<String, tonic::Status> {
        // With a deadline, as kubelet sends every call.
        let mut request = tonic::Request::new(CreateContainerRequest {
            pod_sandbox_id: self.id.clone(),
            config: Some(config),
            sandbox_config: Some(self.config.clone()),
        });
        request.set_timeout(Duration::from_secs(120));
        self.client
            .runtime
            .create_container(request)
            .await
            .map(|r| r.into_inner().container_id)
    }

    pub async fn start(&mut self, id: &str) -> Result<(), tonic::Status> {
        self.client
            .runtime
            .start_container(StartContainerRequest {
                container_id: id.to_string(),
            })
            .await
            .map(|_| ())
    }

    pub async fn run(&mut self, config: ContainerConfig) -> String {
        let id = self.create(config).await.expect("create container");
        self.start(&id).await.expect("start container");
        id
    }

    pub async fn status(
        &mut self,
        id: &str,
    ) -> (crius::api::v1::ContainerStatus, serde_json::Value) {
        let resp = self
            .client
            .runtime
            .container_status(ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: true,
            })
            .await
            .expect("container status")
            .into_inner();
        (
            resp.status.expect("status"),
            serde_json::from_str(&resp.info["info"]).expect("info"),
        )
    }

    pub async fn wait_exited(&mut self, id: &str) -> crius::api::v1::ContainerStatus {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let (status, _) = self.status(id).await;
            if status.state == ContainerState::ContainerExited as i32 {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "container {id} did not exit: {status:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn exec(
        &mut self,
        id: &str,
        cmd: &[&str],
        timeout: i64,
    ) -> Result<(String, String, i32), tonic::Status> {
        self.client
            .runtime
            .exec_sync(ExecSyncRequest {
                container_id: id.to_string(),
                cmd: cmd.iter().map(|s| s.to_string()).collect(),
                timeout,
            })
            .await
            .map(|r| {
                let r = r.into_inner();
                (
                    String::from_utf8_lossy(&r.stdout).into_owned(),
                    String::from_utf8_lossy(&r.stderr).into_owned(),
                    r.exit_code,
                )
            })
    }

    pub async fn stop(&mut self, id: &str, timeout: i64) {
        self.client
            .runtime
            .stop_container(StopContainerRequest {
                container_id: id.to_string(),
                timeout,
            })
            .await
            .expect("stop container");
    }

    pub async fn remove(&mut self, id: &str) {
        self.client
            .runtime
            .remove_container(RemoveContainerRequest {
                container_id: id.to_string(),
            })
            .await
            .expect("remove container");
    }

    pub fn log_path(&self, name: &str) -> std::path::PathBuf {
        Path::new(&self.config.log_directory).join(format!("{name}.log"))
    }

    pub async fn remove_pod(mut self) {
        self.client
            .runtime
            .remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: self.id.clone(),
            })
            .await
            .expect("remove pod");
    }
}
