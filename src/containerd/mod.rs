//! A typed handle on containerd's gRPC API.
//!
//! Every client handed out here carries the `containerd-namespace` header of crius's
//! namespace, so callers never forget it. This module owns the connection (with retry at
//! start-up; tonic reconnects by itself afterwards) and small helpers over the raw API; it
//! knows nothing of CRI.

pub mod content;
pub mod lease_pool;
pub mod tasks;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use containerd_client::services::v1::{
    PluginsRequest, containers_client::ContainersClient, content_client::ContentClient,
    diff_client::DiffClient, events_client::EventsClient, images_client::ImagesClient,
    introspection_client::IntrospectionClient, leases_client::LeasesClient,
    snapshots::snapshots_client::SnapshotsClient, tasks_client::TasksClient,
    version_client::VersionClient,
};
use hyper_util::rt::TokioIo;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

/// Whether a failed call's status says the connection under it broke (containerd, or the
/// shim containerd relays to, went away in the middle), not that the call was refused: the
/// same call can succeed once they are back. tonic answers UNAVAILABLE when it cannot
/// connect and "transport error" when a connection breaks; containerd relays a shim's lost
/// connection as "ttrpc: closed".
pub fn connection_lost(status: &tonic::Status) -> bool {
    const BROKEN: [&str; 3] = [
        "transport error",
        "The service is currently unavailable",
        "ttrpc: closed",
    ];
    status.code() == tonic::Code::Unavailable
        || BROKEN.iter().any(|words| status.message().contains(words))
}

/// Errors talking to containerd.
#[derive(Debug, thiserror::Error)]
pub enum ContainerdError {
    #[error("failed to connect to containerd at {address} within {timeout:?}: {reason}")]
    Connect {
        address: PathBuf,
        timeout: Duration,
        reason: String,
    },
    #[error("invalid containerd namespace {0:?}")]
    Namespace(String),
    #[error("failed to find snapshotter {0:?}")]
    SnapshotterNotFound(String),
    #[error("snapshotter {name:?} failed to initialize in containerd: {message}")]
    SnapshotterFailed { name: String, message: String },
    #[error("containerd {op}: {status}")]
    Rpc {
        op: &'static str,
        status: tonic::Status,
    },
    #[error("write {} in containerd's content store: {source}", path.display())]
    Ingest {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl ContainerdError {
    /// Wraps a failed containerd call with the name of the operation.
    pub fn rpc(op: &'static str) -> impl FnOnce(tonic::Status) -> Self {
        move |status| Self::Rpc { op, status }
    }
}

/// Adds the containerd namespace header to every request.
#[derive(Clone)]
pub struct NamespaceHeader(AsciiMetadataValue);

impl tonic::service::Interceptor for NamespaceHeader {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut()
            .insert("containerd-namespace", self.0.clone());
        Ok(req)
    }
}

/// The channel type of every namespaced client.
pub type Namespaced = InterceptedService<Channel, NamespaceHeader>;

/// A connection to containerd, scoped to one namespace. Cheap to clone.
#[derive(Clone)]
pub struct Containerd {
    channel: Channel,
    namespace: String,
    header: NamespaceHeader,
    address: PathBuf,
    /// The local content store's directory, once asked (shared by clones).
    content_root: Arc<tokio::sync::OnceCell<Option<PathBuf>>>,
}

impl Containerd {
    /// Connects to the containerd socket at `address`, retrying with backoff for up to
    /// `timeout` (containerd may still be starting).
    pub async fn connect(
        address: &Path,
        namespace: &str,
        timeout: Duration,
    ) -> Result<Self, ContainerdError> {
        let header = MetadataValue::try_from(namespace)
            .map_err(|_| ContainerdError::Namespace(namespace.to_string()))?;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut backoff = Duration::from_millis(100);
        loop {
            match dial(address).await {
                Ok(channel) => {
                    return Ok(Self {
                        channel,
                        namespace: namespace.to_string(),
                        header: NamespaceHeader(header),
                        address: address.to_path_buf(),
                        content_root: Arc::default(),
                    });
                }
                Err(reason) if tokio::time::Instant::now() + backoff >= deadline => {
                    return Err(ContainerdError::Connect {
                        address: address.to_path_buf(),
                        timeout,
                        reason,
                    });
                }
                Err(reason) => {
                    tracing::info!(address = %address.display(), %reason, retry_in = ?backoff, "containerd not reachable yet");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn address(&self) -> &Path {
        &self.address
    }

    fn namespaced(&self) -> Namespaced {
        InterceptedService::new(self.channel.clone(), self.header.clone())
    }

    pub fn containers(&self) -> ContainersClient<Namespaced> {
        ContainersClient::new(self.namespaced())
    }

    pub fn tasks(&self) -> TasksClient<Namespaced> {
        TasksClient::new(self.namespaced())
    }

    pub fn content(&self) -> ContentClient<Namespaced> {
        ContentClient::new(self.namespaced())
    }

    pub fn images(&self) -> ImagesClient<Namespaced> {
        ImagesClient::new(self.namespaced())
    }

    pub fn snapshots(&self) -> SnapshotsClient<Namespaced> {
        SnapshotsClient::new(self.namespaced())
    }

    pub fn diff(&self) -> DiffClient<Namespaced> {
        DiffClient::new(self.namespaced())
    }

    pub fn leases(&self) -> LeasesClient<Namespaced> {
        LeasesClient::new(self.namespaced())
    }

    pub fn events(&self) -> EventsClient<Namespaced> {
        EventsClient::new(self.namespaced())
    }

    pub fn introspection(&self) -> IntrospectionClient<Namespaced> {
        IntrospectionClient::new(self.namespaced())
    }

    /// containerd's version string; also the cheapest "is containerd there" probe.
    pub async fn version(&self) -> Result<String, ContainerdError> {
        let resp = VersionClient::new(self.channel.clone())
            .version(())
            .await
            .map_err(ContainerdError::rpc("version"))?;
        Ok(resp.into_inner().version)
    }

    /// The directory of containerd's local content store as containerd reports it; `None`
    /// when its content plugin exports no root (another store) or cannot be asked. Asked
    /// once per connection.
    pub async fn content_root(&self) -> Option<&Path> {
        self.content_root
            .get_or_init(|| async {
                let plugins = self
                    .introspection()
                    .plugins(PluginsRequest {
                        filters: vec!["type==io.containerd.content.v1,id==content".to_string()],
                    })
                    .await
                    .ok()?
                    .into_inner()
                    .plugins;
                let root = plugins.first()?.exports.get("root")?;
                Some(PathBuf::from(root))
            })
            .await
            .as_deref()
    }

    /// Whether the snapshotter `name` takes a parent at the commit of a snapshot prepared
    /// without one (containerd 2.2+'s "rebase" capability, which its parallel unpack
    /// uses). Asked each time: containerd may have been replaced since.
    pub async fn snapshotter_can_rebase(&self, name: &str) -> bool {
        let resp = match self
            .introspection()
            .plugins(PluginsRequest {
                filters: vec!["type==io.containerd.snapshotter.v1".to_string()],
            })
            .await
        {
            Ok(resp) => resp,
            Err(status) => {
                tracing::debug!(error = %status, "cannot list containerd's snapshotters; not rebasing");
                return false;
            }
        };
        (resp.into_inner().plugins.iter())
            .find(|p| p.id == name)
            .is_some_and(|p| p.capabilities.iter().any(|c| c == "rebase"))
    }

    /// Fails unless containerd serves the snapshotter `name` and it initialised.
    pub async fn check_snapshotter(&self, name: &str) -> Result<(), ContainerdError> {
        let plugins = self
            .introspection()
            .plugins(PluginsRequest {
                filters: vec!["type==io.containerd.snapshotter.v1".to_string()],
            })
            .await
            .map_err(ContainerdError::rpc("list plugins"))?
            .into_inner()
            .plugins;
        let plugin = plugins
            .iter()
            .find(|p| p.id == name)
            .ok_or_else(|| ContainerdError::SnapshotterNotFound(name.to_string()))?;
        match &plugin.init_err {
            Some(err) if err.code != 0 => Err(ContainerdError::SnapshotterFailed {
                name: name.to_string(),
                message: err.message.clone(),
            }),
            _ => Ok(()),
        }
    }
}

/// Opens a gRPC channel over the unix socket at `path`.
async fn dial(path: &Path) -> Result<Channel, String> {
    let path = path.to_path_buf();
    let endpoint = Endpoint::try_from("http://[::]").map_err(|e| e.to_string())?;
    endpoint
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(&path).await?;
                let stream = crate::quiet_socket::QuietUnixStream::new(stream)?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
        .map_err(|e| {
            // tonic's transport error hides the io error in its source chain.
            let mut text = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                text = format!("{text}: {s}");
                source = s.source();
            }
            text
        })
}

#[cfg(test)]
mod tests {
    use super::connection_lost;
    use tonic::Status;

    #[test]
    fn a_broken_connection_is_told_from_a_refusal() {
        for broken in [
            Status::unavailable("No such file or directory (os error 2)"),
            Status::internal(
                "containerd kill task: code: 'Unknown error', message: \"transport error\"",
            ),
            Status::internal("containerd get task: code: 'The service is currently unavailable'"),
            Status::internal("containerd kill task: message: \"ttrpc: closed: unknown\""),
        ] {
            assert!(connection_lost(&broken), "{broken:?}");
        }
        for refused in [
            Status::internal("containerd create task: OCI runtime create failed"),
            Status::not_found("task abc not found"),
            Status::deadline_exceeded("task abc did not exit within 10s of SIGKILL"),
        ] {
            assert!(!connection_lost(&refused), "{refused:?}");
        }
    }
}
