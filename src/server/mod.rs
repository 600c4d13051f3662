//! The transport: the CRI's gRPC and ttrpc sockets, the stream server's and metrics'
//! listeners, containerd's sandbox controller socket, and supervision.
//!
//! `CriService::new` (the CRI layer) builds everything; `run` binds the sockets, has the
//! service recover and start its critical tasks (`CriService::start`), and then waits: a stop
//! request (SIGTERM/SIGINT in `main`) shuts down cleanly and returns `Ok`, a critical task
//! that ends shuts down the same way and returns the cause. Shutdown is bounded: in-flight
//! RPCs get [`SHUTDOWN_GRACE`], then everything still running is abandoned and the sockets
//! removed. Nothing below this module imports it.

mod authority;
mod hpack;
pub mod rpc;
pub mod socket;
pub mod ttrpc_glue;

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;

pub use crate::cri::{CriService, ServiceError, ServiceState, TaskEnd};
pub use rpc::CriServer;

/// How long shutdown waits for in-flight RPCs and tasks before abandoning them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);
/// Calls in flight on one CRI connection at most (the HTTP/2 crates set no limit when
/// asked for none): kubelet's pod workers and probes stay well below it, and a client
/// past it waits for a call to end instead of making crius hold more.
pub const MAX_CONCURRENT_STREAMS: u32 = 1024;

/// Raises crius's open-file limit to the hard limit: every container holds FIFOs, every
/// stream a socket, and the default soft limit (1024) is what a flood would exhaust first.
pub fn raise_open_file_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::debug!(from = soft, to = hard, "raised the open-file limit"),
            Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
        },
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot read the open-file limit"),
    }
}

/// Tells the service manager (systemd's `Type=notify`, through `$NOTIFY_SOCKET`) how the
/// service is doing; a no-op when crius was not started by one.
fn notify_service_manager(states: &[sd_notify::NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "cannot notify the service manager");
    }
}

/// Errors that stop crius from serving, or make it stop.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Service(#[from] ServiceError),
    #[error(transparent)]
    Socket(#[from] socket::SocketError),
    #[error("failed to start the ttrpc server: {0}")]
    Ttrpc(String),
    #[error("critical task {task} failed: {reason}")]
    CriticalTask { task: &'static str, reason: String },
    #[error(transparent)]
    StreamServer(#[from] crate::streaming::StreamServerError),
    #[error(transparent)]
    Metrics(#[from] crate::metrics::ServeError),
}

/// What `run` binds before anything serves.
struct Bound {
    grpc: tokio::net::UnixListener,
    ttrpc: tokio::net::UnixListener,
    stream_server: crate::streaming::StreamServer,
    metrics: Option<crate::metrics::MetricsServer>,
}

/// Stops the ttrpc server and waits for the tasks, each for at most [`SHUTDOWN_GRACE`];
/// tasks still running then are abandoned.
async fn stop_within_grace(ttrpc: &mut ttrpc::r#async::Server, tasks: &mut JoinSet<TaskEnd>) {
    let ttrpc_stop = async {
        if tokio::time::timeout(SHUTDOWN_GRACE, ttrpc.shutdown())
            .await
            .is_err()
        {
            tracing::warn!("ttrpc server did not stop in time");
        }
    };
    let tasks_stop = async {
        let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
            while let Some(ended) = tasks.join_next().await {
                if let Ok((task, Err(e))) = ended {
                    tracing::warn!(task, error = %e, "task failed while stopping");
                }
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!("tasks still running after the shutdown grace; abandoning them");
            tasks.abort_all();
        }
    };
    tokio::join!(ttrpc_stop, tasks_stop);
}

impl CriService {
    /// Serves the CRI until `stop` resolves (`Ok`) or a critical task ends (`Err` with the
    /// cause). The sockets are removed before this returns.
    pub async fn run(&self, stop: impl Future<Output = ()>) -> Result<(), ServeError> {
        let bound = self.bind_all().await?;
        let server = CriServer::new(self.clone());
        let mut tasks: JoinSet<TaskEnd> = JoinSet::new();
        self.spawn_grpc_server(&mut tasks, bound.grpc, server.clone());
        let sandboxer_path = self.config.sandbox_controller.address.clone();
        if !sandboxer_path.as_os_str().is_empty()
            && let Err(e) = self
                .spawn_sandbox_controller(&mut tasks, &sandboxer_path)
                .await
        {
            self.close();
            self.remove_cri_sockets();
            return Err(e);
        }
        let mut ttrpc = ttrpc::r#async::Server::new()
            .add_listener(ttrpc::r#async::transport::Listener::from(bound.ttrpc))
            .register_service(rpc::ttrpc_services(server));
        // Scrapes are answered during recovery too (its duration is one of the metrics).
        if let Some(metrics_server) = bound.metrics {
            let cancel = self.shutdown.clone();
            tasks.spawn(async move {
                metrics_server.serve(cancel).await;
                ("metrics listener", Ok(()))
            });
        }

        let outcome = match ttrpc.start().await {
            Err(e) => Err(ServeError::Ttrpc(e.to_string())),
            Ok(()) => {
                self.start_and_serve(&mut tasks, bound.stream_server, stop)
                    .await
            }
        };
        notify_service_manager(&[sd_notify::NotifyState::Stopping]);
        self.close();
        stop_within_grace(&mut ttrpc, &mut tasks).await;
        self.remove_cri_sockets();
        if !sandboxer_path.as_os_str().is_empty() {
            socket::remove(&sandboxer_path);
        }
        tracing::info!("crius stopped");
        outcome
    }

    /// Binds the CRI sockets, the stream server and the metrics listener; a failure removes
    /// the sockets bound before it.
    async fn bind_all(&self) -> Result<Bound, ServeError> {
        let grpc = socket::bind(&self.config.grpc.address).await?;
        let ttrpc = match socket::bind(&self.config.grpc.ttrpc_address).await {
            Ok(listener) => listener,
            Err(e) => {
                socket::remove(&self.config.grpc.address);
                return Err(e.into());
            }
        };
        let others = async {
            let stream_server = crate::streaming::StreamServer::bind(
                &self.config.stream,
                self.stream_requests.clone(),
                std::sync::Arc::new(self.clone()),
            )
            .await?;
            let _ = self.stream_endpoint.set(stream_server.endpoint());
            let metrics = self.bind_metrics().await?;
            Ok::<_, ServeError>((stream_server, metrics))
        };
        match others.await {
            Ok((stream_server, metrics)) => Ok(Bound {
                grpc,
                ttrpc,
                stream_server,
                metrics,
            }),
            Err(e) => {
                self.remove_cri_sockets();
                Err(e)
            }
        }
    }

    fn remove_cri_sockets(&self) {
        socket::remove(&self.config.grpc.address);
        socket::remove(&self.config.grpc.ttrpc_address);
    }

    /// Serves gRPC on `listener` (repairing old clients' `:authority`) as a critical task.
    fn spawn_grpc_server(
        &self,
        tasks: &mut JoinSet<TaskEnd>,
        listener: tokio::net::UnixListener,
        server: CriServer,
    ) {
        let routes = rpc::grpc_routes(server);
        let cancel = self.shutdown.clone();
        tasks.spawn(async move {
            let served = tonic::transport::Server::builder()
                .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
                .add_routes(routes)
                .serve_with_incoming_shutdown(
                    UnixListenerStream::new(listener).map(|accepted| {
                        accepted
                            .and_then(crate::quiet_socket::QuietUnixStream::server)
                            .map(authority::AuthorityRepair::new)
                    }),
                    cancel.cancelled_owned(),
                )
                .await;
            ("grpc server", served.map_err(|e| e.to_string()))
        });
    }

    /// Recovers and starts the critical tasks, tells the service manager crius is ready,
    /// then supervises until `stop` or a critical task's end. A stop during start-up ends
    /// it there.
    async fn start_and_serve(
        &self,
        tasks: &mut JoinSet<TaskEnd>,
        stream_server: crate::streaming::StreamServer,
        stop: impl Future<Output = ()>,
    ) -> Result<(), ServeError> {
        let mut stop = std::pin::pin!(stop);
        tokio::select! {
            _ = &mut stop => {
                tracing::info!("stop requested during start-up");
                Ok(())
            }
            started = async {
                notify_service_manager(&[sd_notify::NotifyState::Status("recovering state")]);
                self.start(tasks, stream_server).await
            } => {
                started?;
                tracing::info!(
                    grpc = %self.config.grpc.address.display(),
                    ttrpc = %self.config.grpc.ttrpc_address.display(),
                    "crius is serving the CRI"
                );
                // Ready only now: recovery is done and the critical tasks run.
                notify_service_manager(&[
                    sd_notify::NotifyState::Ready,
                    sd_notify::NotifyState::Status("serving the CRI"),
                ]);
                self.supervise(tasks, stop).await
            }
        }
    }

    /// Binds containerd's sandbox controller socket and serves it as a critical task.
    async fn spawn_sandbox_controller(
        &self,
        tasks: &mut JoinSet<TaskEnd>,
        path: &std::path::Path,
    ) -> Result<(), ServeError> {
        let listener = socket::bind(path).await?;
        let controller = std::sync::Arc::new(crate::sandboxer::SandboxController::new(
            &self.config.state,
            &self.config.sandbox_controller.shim,
            &self.config.containerd.address,
        ));
        let cancel = self.shutdown.clone();
        tasks.spawn(async move {
            let served = crate::sandboxer::serve(controller, listener, cancel).await;
            ("sandbox controller", served.map_err(|e| e.to_string()))
        });
        tracing::info!(address = %path.display(), "serving containerd's sandbox controller");
        Ok(())
    }

    /// The metrics listener, when `[metrics] address` names one.
    async fn bind_metrics(&self) -> Result<Option<crate::metrics::MetricsServer>, ServeError> {
        let address = &self.config.metrics.address;
        if address.is_empty() {
            return Ok(None);
        }
        Ok(Some(crate::metrics::MetricsServer::bind(address).await?))
    }

    /// Waits for a stop request or for a critical task to end.
    async fn supervise(
        &self,
        tasks: &mut JoinSet<TaskEnd>,
        stop: impl Future<Output = ()>,
    ) -> Result<(), ServeError> {
        tokio::select! {
            _ = stop => {
                tracing::info!("stop requested; shutting down");
                Ok(())
            }
            ended = tasks.join_next() => {
                let (task, reason) = match ended {
                    Some(Ok((task, Err(reason)))) => (task, reason),
                    Some(Ok((task, Ok(())))) => (task, "exited unexpectedly".to_string()),
                    Some(Err(join)) => ("unknown task", join.to_string()),
                    None => ("all tasks", "no task is running".to_string()),
                };
                tracing::error!(task, %reason, "critical task failed; shutting down");
                Err(ServeError::CriticalTask { task, reason })
            }
        }
    }
}
