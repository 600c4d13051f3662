//! The CRI surface: every RPC of `runtime.v1` and `runtime.v1alpha2`, over gRPC and ttrpc,
//! all funnelled into the same `CriService` handlers.
//!
//! `CriServer` is the instrumented layer: it answers `UNAVAILABLE` until start-up has
//! finished, and logs one line per call with the method, the ids, the latency and the code.
//! `v1alpha2` messages are wire-compatible with `v1`, so the `v1alpha2` services are generated
//! over the `v1` messages (`crate::api::v1alpha2_served`) and served by the `v1`
//! implementation, over gRPC and ttrpc alike. The RPC lists below are the single source for
//! all of them.

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use crate::api::{v1, v1alpha2_served};
use tonic::{Code, Status};

use crate::cri::deadline;
use crate::cri::{ContainerEventStream, CriService};
use crate::metrics::RpcCall;

/// The stream type of the `Stream*` list RPCs.
pub type ListStream<T> = Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send + 'static>>;

/// A call's answer with its type erased, so that what every RPC shares is compiled once.
type AnyAnswer = Result<Box<dyn Any + Send>, Status>;
/// A call's future with its type erased.
type AnyCall = Pin<Box<dyn Future<Output = AnyAnswer> + Send>>;

/// The largest CRI message crius sends or accepts (containerd uses the same bound).
pub const MAX_MESSAGE_SIZE: usize = 16 * 1024 * 1024;

/// The longest error message crius sends. A status travels in HTTP/2 trailers, which
/// clients cap (16 KiB in hyper and grpc-go): a message echoing a huge request field would
/// break the response instead of explaining it.
const MAX_STATUS_MESSAGE: usize = 2048;

/// `status` with its message cut to [`MAX_STATUS_MESSAGE`] bytes.
fn with_bounded_message(status: Status) -> Status {
    let message = status.message();
    if message.len() <= MAX_STATUS_MESSAGE {
        return status;
    }
    let mut cut = MAX_STATUS_MESSAGE;
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    Status::new(
        status.code(),
        format!("{}… ({} more bytes)", &message[..cut], message.len() - cut),
    )
}

/// The instrumented CRI server handed to tonic and ttrpc.
#[derive(Clone)]
pub struct CriServer {
    service: CriService,
}

impl CriServer {
    pub fn new(service: CriService) -> Self {
        Self { service }
    }

    /// Gates, times and logs one call, and bounds it by the client's deadline (`deadline`
    /// from gRPC metadata, else the ttrpc one in scope).
    async fn instrument(
        &self,
        rpc: &'static str,
        ids: String,
        deadline: Option<tokio::time::Instant>,
        call: AnyCall,
    ) -> AnyAnswer {
        let call_metrics = self.begin(rpc, &ids)?;
        let start = Instant::now();
        let deadline = deadline.or_else(deadline::current);
        let bounded = async {
            match crate::failpoint::hit_rpc(rpc).await {
                Ok(()) => call.await,
                Err(e) => Err(Status::internal(e.to_string())),
            }
        };
        let result = match deadline {
            Some(at) => {
                deadline::scope(Some(at), async {
                    tokio::time::timeout_at(at, bounded)
                        .await
                        .unwrap_or_else(|_| Err(deadline_passed(rpc)))
                })
                .await
            }
            None => bounded.await,
        }
        .map_err(|status| self.answered_status(status));
        self.finish(rpc, &ids, start, call_metrics, result.as_ref().err());
        result
    }

    /// Lets a call in once start-up has finished, and counts it as started.
    #[inline(never)]
    fn begin(&self, rpc: &'static str, ids: &str) -> Result<RpcCall, Status> {
        if !self.service.is_initialized() {
            tracing::debug!(rpc, id = %ids, "rejected: server is not initialized yet");
            crate::metrics::metrics()
                .rpc_started(rpc)
                .finish(Code::Unavailable);
            return Err(Status::unavailable("server is not initialized yet"));
        }
        Ok(crate::metrics::metrics().rpc_started(rpc))
    }

    /// The status a failed call answers with.
    #[inline(never)]
    fn answered_status(&self, status: Status) -> Status {
        with_bounded_message(self.unavailable_while_containerd_is_away(status))
    }

    /// Counts a call as finished and logs its line.
    #[inline(never)]
    fn finish(
        &self,
        rpc: &'static str,
        ids: &str,
        start: Instant,
        call_metrics: RpcCall,
        error: Option<&Status>,
    ) {
        let latency_us = start.elapsed().as_micros() as u64;
        call_metrics.finish(error.map_or(Code::Ok, Status::code));
        let read_only = is_read_only(rpc);
        if !read_only {
            // Lifecycle calls allocate and free per-pod state: its pages go back once the
            // burst is over.
            crate::heap::release_soon();
        }
        match error {
            None if read_only => tracing::debug!(rpc, id = %ids, latency_us, code = "OK"),
            None => tracing::info!(rpc, id = %ids, latency_us, code = "OK"),
            Some(status) if is_server_fault(status.code()) => tracing::error!(
                rpc, id = %ids, latency_us, code = ?status.code(), error = status.message()
            ),
            Some(status) => tracing::warn!(
                rpc, id = %ids, latency_us, code = ?status.code(), error = status.message()
            ),
        }
    }

    /// A call that broke while containerd is unreachable failed for that reason: say so with
    /// `UNAVAILABLE`, which clients retry, rather than `INTERNAL`.
    /// So does one whose connection to containerd (or containerd's to a shim) broke under
    /// it, before crius noticed containerd was gone.
    fn unavailable_while_containerd_is_away(&self, status: Status) -> Status {
        if !matches!(status.code(), Code::Internal | Code::Unknown) {
            status
        } else if !self.service.containerd_reachable() {
            Status::unavailable(format!("containerd is not reachable: {}", status.message()))
        } else if crate::containerd::connection_lost(&status) {
            Status::unavailable(format!(
                "containerd or a shim was unreachable for a moment: {}",
                status.message()
            ))
        } else {
            status
        }
    }

    /// One unary `v1` call: unwrap, instrument, run the handler, wrap. Only the unwrapping
    /// and wrapping are compiled for each RPC: the handler's future and its answer go
    /// through [`Self::run`] type-erased.
    async fn unary<Req, Resp, Fut>(
        &self,
        rpc: &'static str,
        request: tonic::Request<Req>,
        handler: impl FnOnce(CriService, Req) -> Fut + Send + 'static,
    ) -> Result<tonic::Response<Resp>, Status>
    where
        Req: LogIds + Send + 'static,
        Resp: Send + 'static,
        Fut: Future<Output = Result<Resp, Status>> + Send + 'static,
    {
        let deadline = grpc_deadline(request.metadata());
        let req = request.into_inner();
        let ids = req.log_ids();
        // The handler's future (up to 30 KiB) is made inside the boxed one, on the heap:
        // each move of it by value (into the deadline scope, the task, the instrumentation)
        // put another copy in the worker's stack frame, whose pages then stay resident.
        let service = self.service.clone();
        let call: AnyCall = Box::pin(async move {
            handler(service, req)
                .await
                .map(|answer| Box::new(answer) as Box<dyn Any + Send>)
        });
        let answer = self.run(rpc, ids, deadline, call).await?;
        answer
            .downcast::<Resp>()
            .map(|answer| tonic::Response::new(*answer))
            .map_err(|_| Status::internal(format!("{rpc}: its handler answered another type")))
    }

    /// Runs a call: a read in place, a change in a task of its own.
    async fn run(
        &self,
        rpc: &'static str,
        ids: String,
        deadline: Option<tokio::time::Instant>,
        call: AnyCall,
    ) -> AnyAnswer {
        if is_read_only(rpc) {
            return self.instrument(rpc, ids, deadline, call).await;
        }
        // A change runs in a task of its own: a client that gives up (its deadline, a
        // disconnect) ends the wait, never the operation half-way through.
        // Spawned on first poll: after the initialized gate and the failpoints. The task
        // keeps the deadline (task-locals do not cross a spawn), so PullImage still sees it.
        let task_deadline = deadline.or_else(deadline::current);
        let joined: AnyCall = Box::pin(async move {
            tokio::spawn(deadline::scope(task_deadline, call))
                .await
                .unwrap_or_else(|e| Err(Status::internal(format!("{rpc} failed: {e}"))))
        });
        self.instrument(rpc, ids, deadline, joined).await
    }
}

/// The answer of a call still running when its client's deadline passed.
#[inline(never)]
fn deadline_passed(rpc: &str) -> Status {
    Status::deadline_exceeded(format!("{rpc}: the client's deadline passed"))
}

/// A gRPC request's deadline, a little before the client's: tonic's own timer for the same
/// header answers CANCELLED, so crius answers DEADLINE_EXCEEDED first.
fn grpc_deadline(metadata: &tonic::metadata::MetadataMap) -> Option<tokio::time::Instant> {
    let at = deadline::from_grpc_metadata(metadata)?;
    let left = at.saturating_duration_since(tokio::time::Instant::now());
    Some(at - (left / 10).min(std::time::Duration::from_millis(20)))
}

/// Reads that kubelet polls constantly are logged at debug level, changes at info.
fn is_read_only(rpc: &str) -> bool {
    rpc.starts_with("List")
        || rpc.ends_with("Status")
        || rpc.ends_with("Stats")
        || matches!(rpc, "Version" | "ImageFsInfo" | "RuntimeConfig")
}

fn is_server_fault(code: Code) -> bool {
    matches!(
        code,
        Code::Internal | Code::Unknown | Code::DataLoss | Code::Unavailable
    )
}

/// `Version` on a `v1alpha2` endpoint reports that API version.
fn mark_alpha(resp: &mut dyn Any) {
    if let Some(v) = resp.downcast_mut::<v1::VersionResponse>() {
        v.runtime_api_version = "v1alpha2".to_string();
    }
}

/// The ids a request is about, for the log line.
pub trait LogIds {
    fn log_ids(&self) -> String;
}

macro_rules! log_ids {
    ($($req:ident($r:ident) => $ids:expr;)*) => {
        $(impl LogIds for v1::$req {
            fn log_ids(&self) -> String {
                let $r = self;
                $ids
            }
        })*
    };
}

macro_rules! no_log_ids {
    ($($req:ident),* $(,)?) => {
        $(impl LogIds for v1::$req {
            fn log_ids(&self) -> String {
                String::new()
            }
        })*
    };
}

log_ids! {
    RunPodSandboxRequest(r) => r
        .config
        .as_ref()
        .and_then(|c| c.metadata.as_ref())
        .map(|m| format!("{}/{}", m.namespace, m.name))
        .unwrap_or_default();
    StopPodSandboxRequest(r) => r.pod_sandbox_id.clone();
    RemovePodSandboxRequest(r) => r.pod_sandbox_id.clone();
    UpdatePodSandboxResourcesRequest(r) => r.pod_sandbox_id.clone();
    PodSandboxStatusRequest(r) => r.pod_sandbox_id.clone();
    PodSandboxStatsRequest(r) => r.pod_sandbox_id.clone();
    PortForwardRequest(r) => r.pod_sandbox_id.clone();
    CreateContainerRequest(r) => format!(
        "{}/{}",
        r.pod_sandbox_id,
        r.config
            .as_ref()
            .and_then(|c| c.metadata.as_ref())
            .map(|m| m.name.as_str())
            .unwrap_or_default()
    );
    StartContainerRequest(r) => r.container_id.clone();
    StopContainerRequest(r) => r.container_id.clone();
    RemoveContainerRequest(r) => r.container_id.clone();
    ContainerStatusRequest(r) => r.container_id.clone();
    UpdateContainerResourcesRequest(r) => r.container_id.clone();
    ReopenContainerLogRequest(r) => r.container_id.clone();
    ExecSyncRequest(r) => r.container_id.clone();
    ExecRequest(r) => r.container_id.clone();
    AttachRequest(r) => r.container_id.clone();
    ContainerStatsRequest(r) => r.container_id.clone();
    CheckpointContainerRequest(r) => r.container_id.clone();
    PullImageRequest(r) => r.image.as_ref().map(|i| i.image.clone()).unwrap_or_default();
    ImageStatusRequest(r) => r.image.as_ref().map(|i| i.image.clone()).unwrap_or_default();
    RemoveImageRequest(r) => r.image.as_ref().map(|i| i.image.clone()).unwrap_or_default();
}

no_log_ids!(
    VersionRequest,
    StatusRequest,
    ListPodSandboxRequest,
    ListContainersRequest,
    ListContainerStatsRequest,
    ListPodSandboxStatsRequest,
    UpdateRuntimeConfigRequest,
    ListMetricDescriptorsRequest,
    ListPodSandboxMetricsRequest,
    RuntimeConfigRequest,
    ListImagesRequest,
    ImageFsInfoRequest,
    GetEventsRequest,
    StreamPodSandboxesRequest,
    StreamContainersRequest,
    StreamContainerStatsRequest,
    StreamPodSandboxStatsRequest,
    StreamPodSandboxMetricsRequest,
    StreamImagesRequest,
);

/// Calls `$m! { $($pre)* <list> }` with the unary RuntimeService RPCs: all of `v1`
/// (`all`), or those `v1alpha2` has too (`v1alpha2`).
macro_rules! runtime_rpcs {
    ($m:ident { $($pre:tt)* }, all) => {
        runtime_rpcs!(@emit $m { $($pre)* } [
            checkpoint_container "CheckpointContainer" CheckpointContainerRequest CheckpointContainerResponse;
            list_metric_descriptors "ListMetricDescriptors" ListMetricDescriptorsRequest ListMetricDescriptorsResponse;
            list_pod_sandbox_metrics "ListPodSandboxMetrics" ListPodSandboxMetricsRequest ListPodSandboxMetricsResponse;
            runtime_config "RuntimeConfig" RuntimeConfigRequest RuntimeConfigResponse;
            update_pod_sandbox_resources "UpdatePodSandboxResources" UpdatePodSandboxResourcesRequest UpdatePodSandboxResourcesResponse;
        ]);
    };
    ($m:ident { $($pre:tt)* }, v1alpha2) => {
        runtime_rpcs!(@emit $m { $($pre)* } []);
    };
    (@emit $m:ident { $($pre:tt)* } [$($extra:tt)*]) => {
        $m! { $($pre)*
            version "Version" VersionRequest VersionResponse;
            run_pod_sandbox "RunPodSandbox" RunPodSandboxRequest RunPodSandboxResponse;
            stop_pod_sandbox "StopPodSandbox" StopPodSandboxRequest StopPodSandboxResponse;
            remove_pod_sandbox "RemovePodSandbox" RemovePodSandboxRequest RemovePodSandboxResponse;
            pod_sandbox_status "PodSandboxStatus" PodSandboxStatusRequest PodSandboxStatusResponse;
            list_pod_sandbox "ListPodSandbox" ListPodSandboxRequest ListPodSandboxResponse;
            create_container "CreateContainer" CreateContainerRequest CreateContainerResponse;
            start_container "StartContainer" StartContainerRequest StartContainerResponse;
            stop_container "StopContainer" StopContainerRequest StopContainerResponse;
            remove_container "RemoveContainer" RemoveContainerRequest RemoveContainerResponse;
            list_containers "ListContainers" ListContainersRequest ListContainersResponse;
            container_status "ContainerStatus" ContainerStatusRequest ContainerStatusResponse;
            update_container_resources "UpdateContainerResources" UpdateContainerResourcesRequest UpdateContainerResourcesResponse;
            reopen_container_log "ReopenContainerLog" ReopenContainerLogRequest ReopenContainerLogResponse;
            exec_sync "ExecSync" ExecSyncRequest ExecSyncResponse;
            exec "Exec" ExecRequest ExecResponse;
            attach "Attach" AttachRequest AttachResponse;
            port_forward "PortForward" PortForwardRequest PortForwardResponse;
            container_stats "ContainerStats" ContainerStatsRequest ContainerStatsResponse;
            list_container_stats "ListContainerStats" ListContainerStatsRequest ListContainerStatsResponse;
            pod_sandbox_stats "PodSandboxStats" PodSandboxStatsRequest PodSandboxStatsResponse;
            list_pod_sandbox_stats "ListPodSandboxStats" ListPodSandboxStatsRequest ListPodSandboxStatsResponse;
            update_runtime_config "UpdateRuntimeConfig" UpdateRuntimeConfigRequest UpdateRuntimeConfigResponse;
            status "Status" StatusRequest StatusResponse;
            $($extra)*
        }
    };
}

/// Calls `$m! { $($pre)* <list> }` with the ImageService RPCs (the same in both versions).
macro_rules! image_rpcs {
    ($m:ident { $($pre:tt)* }) => {
        $m! { $($pre)*
            list_images "ListImages" ListImagesRequest ListImagesResponse;
            image_status "ImageStatus" ImageStatusRequest ImageStatusResponse;
            pull_image "PullImage" PullImageRequest PullImageResponse;
            remove_image "RemoveImage" RemoveImageRequest RemoveImageResponse;
            image_fs_info "ImageFsInfo" ImageFsInfoRequest ImageFsInfoResponse;
        }
    };
}

/// Calls `$m! { $($pre)* <list> }` with the `Stream*` list RPCs of a `v1` service (`runtime`
/// or `image`): method, name, request, response and the tonic stream type's name.
macro_rules! stream_rpcs {
    ($m:ident { $($pre:tt)* }, runtime) => {
        $m! { $($pre)*
            stream_pod_sandboxes "StreamPodSandboxes" StreamPodSandboxesRequest StreamPodSandboxesResponse StreamPodSandboxesStream;
            stream_containers "StreamContainers" StreamContainersRequest StreamContainersResponse StreamContainersStream;
            stream_container_stats "StreamContainerStats" StreamContainerStatsRequest StreamContainerStatsResponse StreamContainerStatsStream;
            stream_pod_sandbox_stats "StreamPodSandboxStats" StreamPodSandboxStatsRequest StreamPodSandboxStatsResponse StreamPodSandboxStatsStream;
            stream_pod_sandbox_metrics "StreamPodSandboxMetrics" StreamPodSandboxMetricsRequest StreamPodSandboxMetricsResponse StreamPodSandboxMetricsStream;
        }
    };
    ($m:ident { $($pre:tt)* }, image) => {
        $m! { $($pre)*
            stream_images "StreamImages" StreamImagesRequest StreamImagesResponse StreamImagesStream;
        }
    };
}

/// The `v1` RuntimeService: every unary RPC plus the `GetContainerEvents` stream.
macro_rules! impl_v1_runtime {
    ($($name:ident $rpc:literal $req:ident $resp:ident;)*) => {
        #[tonic::async_trait]
        impl v1::runtime_service_server::RuntimeService for CriServer {
            type GetContainerEventsStream = ContainerEventStream;

            async fn get_container_events(
                &self,
                request: tonic::Request<v1::GetEventsRequest>,
            ) -> Result<tonic::Response<ContainerEventStream>, Status> {
                self.unary("GetContainerEvents", request, |s, r| async move {
                    s.get_container_events(r).await
                })
                .await
            }

            stream_rpcs!(impl_list_streams {}, runtime);

            $(
                async fn $name(
                    &self,
                    request: tonic::Request<v1::$req>,
                ) -> Result<tonic::Response<v1::$resp>, Status> {
                    self.unary($rpc, request, |s, r| async move { s.$name(r).await }).await
                }
            )*
        }
    };
}

/// The `Stream*` methods inside a tonic service impl: the handler's messages, sent in order.
/// Written in the shape `async_trait` gives its methods, because a macro inside the impl is
/// expanded after `async_trait` has run.
macro_rules! impl_list_streams {
    ($($name:ident $rpc:literal $req:ident $resp:ident $stream:ident;)*) => {
        $(
            type $stream = ListStream<v1::$resp>;

            fn $name<'life0, 'async_trait>(
                &'life0 self,
                request: tonic::Request<v1::$req>,
            ) -> Pin<Box<
                dyn Future<Output = Result<tonic::Response<ListStream<v1::$resp>>, Status>>
                    + Send
                    + 'async_trait,
            >>
            where
                'life0: 'async_trait,
                Self: 'async_trait,
            {
                Box::pin(async move {
                    self.unary($rpc, request, |s, r| async move {
                        let messages = s.$name(r).await?;
                        let stream: ListStream<v1::$resp> =
                            Box::pin(futures::stream::iter(messages.into_iter().map(Ok)));
                        Ok(stream)
                    })
                    .await
                })
            }
        )*
    };
}

macro_rules! impl_v1_image {
    ($($name:ident $rpc:literal $req:ident $resp:ident;)*) => {
        #[tonic::async_trait]
        impl v1::image_service_server::ImageService for CriServer {
            stream_rpcs!(impl_list_streams {}, image);

            $(
                async fn $name(
                    &self,
                    request: tonic::Request<v1::$req>,
                ) -> Result<tonic::Response<v1::$resp>, Status> {
                    self.unary($rpc, request, |s, r| async move { s.$name(r).await }).await
                }
            )*
        }
    };
}

/// A `v1alpha2` service whose every RPC is served by the matching `v1` one, with the same
/// messages (see [`crate::api::v1alpha2_served`]).
macro_rules! impl_v1alpha2 {
    ($alpha:path, $v1:path; $($name:ident $rpc:literal $req:ident $resp:ident;)*) => {
        #[tonic::async_trait]
        impl $alpha for CriServer {
            $(
                async fn $name(
                    &self,
                    request: tonic::Request<v1::$req>,
                ) -> Result<tonic::Response<v1::$resp>, Status> {
                    let mut answer = <CriServer as $v1>::$name(self, request).await?;
                    mark_alpha(answer.get_mut());
                    Ok(answer)
                }
            )*
        }
    };
}

runtime_rpcs!(impl_v1_runtime {}, all);
image_rpcs!(impl_v1_image {});
runtime_rpcs!(impl_v1alpha2 {
    v1alpha2_served::runtime_service_server::RuntimeService,
    v1::runtime_service_server::RuntimeService;
}, v1alpha2);
image_rpcs!(impl_v1alpha2 {
    v1alpha2_served::image_service_server::ImageService,
    v1::image_service_server::ImageService;
});
/// The gRPC services to put on a tonic server: both API versions of both services.
pub fn grpc_routes(server: CriServer) -> tonic::service::Routes {
    use v1::image_service_server::ImageServiceServer as V1Image;
    use v1::runtime_service_server::RuntimeServiceServer as V1Runtime;
    use v1alpha2_served::image_service_server::ImageServiceServer as AlphaImage;
    use v1alpha2_served::runtime_service_server::RuntimeServiceServer as AlphaRuntime;

    macro_rules! sized {
        ($svc:expr) => {
            $svc.max_decoding_message_size(MAX_MESSAGE_SIZE)
                .max_encoding_message_size(MAX_MESSAGE_SIZE)
        };
    }
    tonic::service::Routes::new(sized!(V1Runtime::new(server.clone())))
        .add_service(sized!(V1Image::new(server.clone())))
        .add_service(sized!(AlphaRuntime::new(server.clone())))
        .add_service(sized!(AlphaImage::new(server)))
}

/// The ttrpc services: both API versions of both services, generated by `build.rs` from
/// the same protos and served by the same trait implementations as gRPC.
pub fn ttrpc_services(server: CriServer) -> HashMap<String, ttrpc::r#async::Service> {
    HashMap::from([
        (
            v1::runtime_service_ttrpc::NAME.to_string(),
            v1::runtime_service_ttrpc::service(server.clone()),
        ),
        (
            v1::image_service_ttrpc::NAME.to_string(),
            v1::image_service_ttrpc::service(server.clone()),
        ),
        (
            v1alpha2_served::runtime_service_ttrpc::NAME.to_string(),
            v1alpha2_served::runtime_service_ttrpc::service(server.clone()),
        ),
        (
            v1alpha2_served::image_service_ttrpc::NAME.to_string(),
            v1alpha2_served::image_service_ttrpc::service(server),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1alpha2;
    use prost::Message;

    #[test]
    fn error_messages_are_cut_to_fit_in_trailers() {
        let huge = Status::not_found(format!("container {:?} not found", "é".repeat(1 << 20)));
        let cut = with_bounded_message(huge);
        assert_eq!(cut.code(), Code::NotFound);
        assert!(cut.message().len() < MAX_STATUS_MESSAGE + 64);
        assert!(cut.message().ends_with("more bytes)"), "{}", cut.message());
        let short = with_bounded_message(Status::internal("short"));
        assert_eq!(short.message(), "short");
    }

    #[test]
    fn alpha_messages_decode_as_v1_ones_and_back() {
        let alpha = v1alpha2::RemoveContainerRequest {
            container_id: "abc".into(),
        };
        let v1_req = v1::RemoveContainerRequest::decode(alpha.encode_to_vec().as_slice())
            .expect("an alpha request decodes as v1");
        assert_eq!(v1_req.container_id, "abc");
        let status = v1::ContainerStatusResponse {
            status: Some(v1::ContainerStatus {
                id: "abc".into(),
                state: v1::ContainerState::ContainerRunning as i32,
                ..Default::default()
            }),
            ..Default::default()
        };
        let back = v1alpha2::ContainerStatusResponse::decode(status.encode_to_vec().as_slice())
            .expect("a v1 answer decodes in an alpha client");
        let back = back.status.expect("status");
        assert_eq!(back.id, "abc");
        assert_eq!(
            back.state,
            v1alpha2::ContainerState::ContainerRunning as i32
        );
    }

    #[test]
    fn version_on_alpha_reports_alpha() {
        let mut resp = v1::VersionResponse {
            runtime_api_version: "v1".into(),
            ..Default::default()
        };
        mark_alpha(&mut resp);
        assert_eq!(resp.runtime_api_version, "v1alpha2");
        let mut other = v1::StatusResponse::default();
        mark_alpha(&mut other);
        assert_eq!(other, v1::StatusResponse::default());
    }
}
