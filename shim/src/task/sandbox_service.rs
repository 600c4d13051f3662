//! The ttrpc sandbox service (`containerd.runtime.sandbox.v1.Sandbox`): containerd 2.x's
//! CRI drives a pod through it when the runtime handler's sandboxer is the shim (or crius's
//! sandbox controller forwards to it). The shim holds the pod itself, no pause container;
//! the pod's containers then come through the task service on the same socket.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use containerd_shim_protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim_protos::ttrpc;
use containerd_shim_protos::ttrpc::r#async::TtrpcContext;

use crate::error::ShimError;
use crate::pod::{self, Pod};
use crate::protos::metrics::Metric;
use crate::protos::platform::Platform;
use crate::protos::sandbox::*;
use crate::protos::sandbox_ttrpc::Sandbox;
use crate::task::shim::{Shim, timestamp};

/// How long StopSandbox waits for the holder when containerd names no timeout.
const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct SandboxService(pub Arc<Shim>);

type Answer<T> = ttrpc::Result<T>;

/// Logs one line per call at info level: a pod's calls are few and each one matters.
async fn logged<T>(
    method: &str,
    id: &str,
    call: impl std::future::Future<Output = Result<T, ShimError>>,
) -> Answer<T> {
    crate::task::service::logged_at(log::Level::Info, method, id, call).await
}

fn optional_timestamp(at: Option<std::time::SystemTime>) -> Option<Timestamp> {
    at.map(timestamp)
}

/// `amd64`, `arm64`, ...: the architecture as OCI platforms name it.
pub fn oci_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

impl SandboxService {
    /// The pod the shim holds, if it is `id`.
    fn pod(&self, id: &str) -> Result<Arc<Pod>, ShimError> {
        self.0
            .pod()
            .filter(|p| p.id == id)
            .ok_or_else(|| ShimError::NotFound(format!("sandbox {id}")))
    }

    async fn create(&self, req: CreateSandboxRequest) -> Result<(), ShimError> {
        if req.sandbox_id.is_empty() || req.bundle_path.is_empty() {
            return Err(ShimError::InvalidArgument(
                "a sandbox needs an id and a bundle".into(),
            ));
        }
        if self.0.pod().is_some() {
            return Err(ShimError::AlreadyExists(format!(
                "this shim holds a pod already; sandbox {}",
                req.sandbox_id
            )));
        }
        let config = pod::decode_config(req.options.as_ref())?;
        let namespaces = pod::namespaces(&config, &req.netns_path)?;
        let id = req.sandbox_id.clone();
        let bundle = std::path::PathBuf::from(&req.bundle_path);
        let made =
            tokio::task::spawn_blocking(move || Pod::create(&id, &bundle, &config, namespaces))
                .await
                .map_err(|e| ShimError::Internal(format!("create pod: {e}")))??;
        let made = Arc::new(made);
        if !self.0.set_pod(made.clone()) {
            made.release_shm();
            return Err(ShimError::AlreadyExists(format!(
                "sandbox {}",
                req.sandbox_id
            )));
        }
        Ok(())
    }

    async fn start(&self, id: &str) -> Result<StartSandboxResponse, ShimError> {
        let pod = self.pod(id)?;
        if pod.pid() == 0 {
            let starting = self.0.begin_starting();
            let namespaces = pod.namespaces().clone();
            let pid = tokio::task::spawn_blocking(move || {
                crate::pod::holder::spawn(&namespaces, Vec::new())
            })
            .await
            .map_err(|e| ShimError::Internal(format!("start pod: {e}")))??;
            pod.started(pid);
            pod.join_cgroup(pid);
            if let Some(exit) = self.0.take_early_exit(&starting, pid) {
                pod.exited(exit);
            }
            drop(starting);
            log::info!("pod {id} held by pid {pid}");
        }
        let status = pod.status();
        Ok(StartSandboxResponse {
            pid: status.pid as u32,
            created_at: optional_timestamp(status.created_at).into(),
            ..Default::default()
        })
    }

    /// Ends the pod and the shim. A shim whose CreateSandbox failed holds no pod and ends
    /// all the same: containerd (or crius) shuts it down to clean up.
    async fn shutdown(&self, id: &str) -> Result<(), ShimError> {
        match self.0.pod() {
            Some(pod) if pod.id == id => {
                if let Err(e) = pod.stop(DEFAULT_STOP_TIMEOUT).await {
                    log::warn!("shutting down pod {id}: {e}");
                }
                // Even with a holder that would not die: containerd removes the bundle next.
                pod.release_shm();
            }
            Some(_) => return Err(ShimError::NotFound(format!("sandbox {id}"))),
            None => log::info!("no pod {id} was made: the shim ends"),
        }
        if !self.0.is_empty() {
            log::warn!("pod {id} shut down with containers left in the shim");
        }
        self.0.shutdown.notify_one();
        Ok(())
    }

    fn metrics(&self, id: &str) -> Result<Metric, ShimError> {
        let pod = self.pod(id)?;
        let pid = pod.pid();
        if pid <= 0 || pod.has_exited() {
            return Err(ShimError::FailedPrecondition(format!(
                "sandbox {id} is not running"
            )));
        }
        let group = containerd_shim::cgroup::get_cgroup(pid as u32)
            .map_err(|e| ShimError::Internal(format!("cgroup of pod {id}: {e}")))?;
        Ok(Metric {
            timestamp: Some(timestamp(std::time::SystemTime::now())).into(),
            id: id.to_string(),
            data: Some(crate::task::stats::collect(&group)?).into(),
            ..Default::default()
        })
    }
}

#[async_trait]
impl Sandbox for SandboxService {
    async fn create_sandbox(
        &self,
        _: &TtrpcContext,
        req: CreateSandboxRequest,
    ) -> Answer<CreateSandboxResponse> {
        let id = req.sandbox_id.clone();
        logged("CreateSandbox", &id, async {
            self.create(req).await?;
            Ok(CreateSandboxResponse::new())
        })
        .await
    }

    async fn start_sandbox(
        &self,
        _: &TtrpcContext,
        req: StartSandboxRequest,
    ) -> Answer<StartSandboxResponse> {
        logged("StartSandbox", &req.sandbox_id, self.start(&req.sandbox_id)).await
    }

    async fn platform(&self, _: &TtrpcContext, req: PlatformRequest) -> Answer<PlatformResponse> {
        logged("Platform", &req.sandbox_id, async {
            self.pod(&req.sandbox_id)?;
            let platform = Platform {
                os: std::env::consts::OS.to_string(),
                architecture: oci_architecture().to_string(),
                ..Default::default()
            };
            Ok(PlatformResponse {
                platform: Some(platform).into(),
                ..Default::default()
            })
        })
        .await
    }

    async fn stop_sandbox(
        &self,
        _: &TtrpcContext,
        req: StopSandboxRequest,
    ) -> Answer<StopSandboxResponse> {
        logged("StopSandbox", &req.sandbox_id, async {
            let timeout = match req.timeout_secs {
                0 => DEFAULT_STOP_TIMEOUT,
                secs => Duration::from_secs(secs.into()),
            };
            self.pod(&req.sandbox_id)?.stop(timeout).await?;
            Ok(StopSandboxResponse::new())
        })
        .await
    }

    async fn wait_sandbox(
        &self,
        _: &TtrpcContext,
        req: WaitSandboxRequest,
    ) -> Answer<WaitSandboxResponse> {
        // Not logged per call: containerd keeps one open for the pod's whole life.
        let pod = self.pod(&req.sandbox_id)?;
        let exit = pod.wait().await;
        Ok(WaitSandboxResponse {
            exit_status: exit.status,
            exited_at: Some(timestamp(exit.at)).into(),
            ..Default::default()
        })
    }

    async fn sandbox_status(
        &self,
        _: &TtrpcContext,
        req: SandboxStatusRequest,
    ) -> Answer<SandboxStatusResponse> {
        let pod = self.pod(&req.sandbox_id)?;
        let status = pod.status();
        Ok(SandboxStatusResponse {
            sandbox_id: req.sandbox_id,
            pid: status.pid.max(0) as u32,
            state: status.state.to_string(),
            created_at: optional_timestamp(status.created_at).into(),
            exited_at: optional_timestamp(status.exit.map(|e| e.at)).into(),
            ..Default::default()
        })
    }

    async fn ping_sandbox(&self, _: &TtrpcContext, req: PingRequest) -> Answer<PingResponse> {
        self.pod(&req.sandbox_id)?;
        Ok(PingResponse::new())
    }

    async fn shutdown_sandbox(
        &self,
        _: &TtrpcContext,
        req: ShutdownSandboxRequest,
    ) -> Answer<ShutdownSandboxResponse> {
        logged("ShutdownSandbox", &req.sandbox_id, async {
            self.shutdown(&req.sandbox_id).await?;
            Ok(ShutdownSandboxResponse::new())
        })
        .await
    }

    async fn sandbox_metrics(
        &self,
        _: &TtrpcContext,
        req: SandboxMetricsRequest,
    ) -> Answer<SandboxMetricsResponse> {
        let metric = self.metrics(&req.sandbox_id)?;
        Ok(SandboxMetricsResponse {
            metrics: Some(metric).into(),
            ..Default::default()
        })
    }
}
