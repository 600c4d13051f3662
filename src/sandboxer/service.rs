//! The gRPC `containerd.services.sandbox.v1.Controller` containerd dials as a proxy plugin:
//! each verb names its namespace (containerd's `containerd-namespace` header) and pod, and
//! calls the controller. One log line per call.

use std::sync::Arc;
use std::time::Instant;

use tokio::net::UnixListener;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::{SandboxController, SandboxerError};
use crate::protos::containerd::services::sandbox::v1 as api;
use api::controller_server::{Controller, ControllerServer};

/// The gRPC header containerd puts its namespace in.
const NAMESPACE_HEADER: &str = "containerd-namespace";

struct ControllerService(Arc<SandboxController>);

/// Serves the controller on `listener` until `cancel`.
pub async fn serve(
    controller: Arc<SandboxController>,
    listener: UnixListener,
    cancel: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .add_service(ControllerServer::new(ControllerService(controller)))
        .serve_with_incoming_shutdown(
            UnixListenerStream::new(listener)
                .map(|accepted| accepted.and_then(crate::quiet_socket::QuietUnixStream::server)),
            cancel.cancelled_owned(),
        )
        .await
}

fn namespace<T>(request: &Request<T>) -> Result<String, Status> {
    request
        .metadata()
        .get(NAMESPACE_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .ok_or_else(|| Status::failed_precondition("no containerd namespace in the request"))
}

async fn logged<T>(
    method: &str,
    id: &str,
    call: impl std::future::Future<Output = Result<T, SandboxerError>>,
) -> Result<Response<T>, Status> {
    let started = Instant::now();
    let result = call.await;
    log_call(method, id, started, result.as_ref().err());
    result.map(Response::new).map_err(Status::from)
}

/// The log line of one call (shared by every method rather than compiled for each).
#[inline(never)]
fn log_call(method: &str, id: &str, started: Instant, error: Option<&SandboxerError>) {
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    match error {
        None => tracing::info!(method, sandbox = id, ms, "sandbox controller"),
        Some(e) => tracing::warn!(method, sandbox = id, ms, error = %e, "sandbox controller"),
    }
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create(
        &self,
        request: Request<api::ControllerCreateRequest>,
    ) -> Result<Response<api::ControllerCreateResponse>, Status> {
        let ns = namespace(&request)?;
        let req = request.into_inner();
        let id = req.sandbox_id.clone();
        logged("Create", &id, async {
            self.0.create(&ns, req).await?;
            Ok(api::ControllerCreateResponse {
                sandbox_id: id.clone(),
            })
        })
        .await
    }

    async fn start(
        &self,
        request: Request<api::ControllerStartRequest>,
    ) -> Result<Response<api::ControllerStartResponse>, Status> {
        let ns = namespace(&request)?;
        let id = request.into_inner().sandbox_id;
        logged("Start", &id, self.0.start(&ns, &id)).await
    }

    async fn platform(
        &self,
        request: Request<api::ControllerPlatformRequest>,
    ) -> Result<Response<api::ControllerPlatformResponse>, Status> {
        let ns = namespace(&request)?;
        let id = request.into_inner().sandbox_id;
        logged("Platform", &id, self.0.platform(&ns, &id)).await
    }

    async fn stop(
        &self,
        request: Request<api::ControllerStopRequest>,
    ) -> Result<Response<api::ControllerStopResponse>, Status> {
        let ns = namespace(&request)?;
        let req = request.into_inner();
        logged("Stop", &req.sandbox_id, async {
            self.0.stop(&ns, &req.sandbox_id, req.timeout_secs).await?;
            Ok(api::ControllerStopResponse {})
        })
        .await
    }

    async fn wait(
        &self,
        request: Request<api::ControllerWaitRequest>,
    ) -> Result<Response<api::ControllerWaitResponse>, Status> {
        let ns = namespace(&request)?;
        let id = request.into_inner().sandbox_id;
        logged("Wait", &id, self.0.wait(&ns, &id)).await
    }

    async fn status(
        &self,
        request: Request<api::ControllerStatusRequest>,
    ) -> Result<Response<api::ControllerStatusResponse>, Status> {
        let ns = namespace(&request)?;
        let req = request.into_inner();
        // Not logged: containerd asks on every PodSandboxStatus.
        self.0
            .status(&ns, &req.sandbox_id, req.verbose)
            .await
            .map(Response::new)
            .map_err(Status::from)
    }

    async fn shutdown(
        &self,
        request: Request<api::ControllerShutdownRequest>,
    ) -> Result<Response<api::ControllerShutdownResponse>, Status> {
        let ns = namespace(&request)?;
        let id = request.into_inner().sandbox_id;
        logged("Shutdown", &id, async {
            self.0.shutdown(&ns, &id).await?;
            Ok(api::ControllerShutdownResponse {})
        })
        .await
    }

    async fn metrics(
        &self,
        request: Request<api::ControllerMetricsRequest>,
    ) -> Result<Response<api::ControllerMetricsResponse>, Status> {
        let ns = namespace(&request)?;
        let id = request.into_inner().sandbox_id;
        self.0
            .metrics(&ns, &id)
            .await
            .map(Response::new)
            .map_err(Status::from)
    }

    async fn update(
        &self,
        request: Request<api::ControllerUpdateRequest>,
    ) -> Result<Response<api::ControllerUpdateResponse>, Status> {
        let ns = namespace(&request)?;
        let id = request.into_inner().sandbox_id;
        logged("Update", &id, async {
            self.0.update(&ns, &id).await?;
            Ok(api::ControllerUpdateResponse {})
        })
        .await
    }
}
