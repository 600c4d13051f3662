//! Content store, leases, images, snapshots and diff: the calls an image pull and the image
//! store make, with the containerd conventions (lease header, GC labels) in one place.

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use containerd_client::services::v1::snapshots::{
    CommitSnapshotRequest, PrepareSnapshotRequest, RemoveSnapshotRequest, StatSnapshotRequest,
    UsageRequest, ViewSnapshotRequest,
};
use containerd_client::services::v1::{
    AbortRequest, ApplyRequest, CreateImageRequest, DeleteContentRequest, DeleteImageRequest,
    DeleteRequest, GetImageRequest, Image, InfoRequest, ListImagesRequest, ReadContentRequest,
    UpdateImageRequest, UpdateRequest, WriteAction, WriteContentRequest,
};
use containerd_client::types::{Descriptor, Mount};
use futures::{Stream, StreamExt};
use sha2::{Digest as _, Sha256};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use super::{Containerd, ContainerdError};

/// The gRPC header that puts what a call creates under a lease.
const LEASE_HEADER: &str = "containerd-lease";
/// Size of each chunk sent to the content store.
const WRITE_CHUNK: usize = 1024 * 1024;

/// Wraps `msg` in a request that carries `lease` (when given).
pub fn leased<T>(msg: T, lease: Option<&str>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    if let Some(lease) = lease
        && let Ok(value) = lease.parse()
    {
        req.metadata_mut().insert(LEASE_HEADER, value);
    }
    req
}

impl ContainerdError {
    pub fn code(&self) -> Option<Code> {
        match self {
            Self::Rpc { status, .. } => Some(status.code()),
            _ => None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.code() == Some(Code::NotFound)
    }

    pub fn is_already_exists(&self) -> bool {
        self.code() == Some(Code::AlreadyExists)
    }

    /// Whether another writer holds the ingest (containerd answers UNAVAILABLE "locked").
    pub fn is_locked(&self) -> bool {
        matches!(self, Self::Rpc { status, .. }
            if status.code() == Code::Unavailable && status.message().contains("locked"))
    }
}

/// Why writing a blob into the content store failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError<E: std::error::Error + 'static> {
    #[error(transparent)]
    Source(E),
    #[error(transparent)]
    Containerd(#[from] ContainerdError),
    #[error(
        "blob {expected}: content has digest {actual} and {size} bytes (expected {expected_size})"
    )]
    Mismatch {
        expected: String,
        actual: String,
        size: i64,
        expected_size: i64,
    },
}

impl<E: std::error::Error + 'static> WriteError<E> {
    /// The same error, with a source's error turned by `f`.
    fn map_source<F: std::error::Error + 'static>(
        self,
        f: impl FnOnce(E) -> WriteError<F>,
    ) -> WriteError<F> {
        match self {
            Self::Source(e) => f(e),
            Self::Containerd(e) => WriteError::Containerd(e),
            Self::Mismatch {
                expected,
                actual,
                size,
                expected_size,
            } => WriteError::Mismatch {
                expected,
                actual,
                size,
                expected_size,
            },
        }
    }
}

impl Containerd {
    /// Creates a lease that expires by itself after `expire` (so a crash cannot pin content
    /// forever).
    pub async fn create_lease(&self, id: &str, expire: Duration) -> Result<(), ContainerdError> {
        let expiry = humantime::format_rfc3339_seconds(SystemTime::now() + expire).to_string();
        self.leases()
            .create(containerd_client::services::v1::CreateRequest {
                id: id.to_string(),
                labels: HashMap::from([("containerd.io/gc.expire".to_string(), expiry)]),
            })
            .await
            .map_err(ContainerdError::rpc("create lease"))?;
        Ok(())
    }

    /// Creates a lease that lasts until it is deleted; an existing one is kept.
    pub async fn ensure_lasting_lease(&self, id: &str) -> Result<(), ContainerdError> {
        match self
            .leases()
            .create(containerd_client::services::v1::CreateRequest {
                id: id.to_string(),
                labels: HashMap::new(),
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(status) if status.code() == Code::AlreadyExists => Ok(()),
            Err(status) => Err(ContainerdError::Rpc {
                op: "create lease",
                status,
            }),
        }
    }

    /// The IDs of every lease in the namespace.
    pub async fn list_leases(&self) -> Result<Vec<String>, ContainerdError> {
        let response = self
            .leases()
            .list(containerd_client::services::v1::ListRequest {
                filters: Vec::new(),
            })
            .await
            .map_err(ContainerdError::rpc("list leases"))?;
        Ok(response
            .into_inner()
            .leases
            .into_iter()
            .map(|lease| lease.id)
            .collect())
    }

    /// Puts an existing snapshot under a lease, so garbage collection keeps it while the
    /// lease lives.
    pub async fn lease_snapshot(
        &self,
        lease: &str,
        snapshotter: &str,
        key: &str,
    ) -> Result<(), ContainerdError> {
        self.leases()
            .add_resource(containerd_client::services::v1::AddResourceRequest {
                id: lease.to_string(),
                resource: Some(containerd_client::services::v1::Resource {
                    id: key.to_string(),
                    r#type: format!("snapshots/{snapshotter}"),
                }),
            })
            .await
            .map(|_| ())
            .map_err(ContainerdError::rpc("add a snapshot to a lease"))
    }

    /// Deletes a lease; `sync` runs garbage collection before answering.
    pub async fn delete_lease(&self, id: &str, sync: bool) -> Result<(), ContainerdError> {
        match self
            .leases()
            .delete(DeleteRequest {
                id: id.to_string(),
                sync,
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(status) if status.code() == Code::NotFound => Ok(()),
            Err(status) => Err(ContainerdError::Rpc {
                op: "delete lease",
                status,
            }),
        }
    }

    /// The content store's record of `digest`, if it has the blob.
    pub async fn content_info(
        &self,
        digest: &str,
    ) -> Result<Option<containerd_client::services::v1::Info>, ContainerdError> {
        match self
            .content()
            .info(InfoRequest {
                digest: digest.to_string(),
            })
            .await
        {
            Ok(resp) => Ok(resp.into_inner().info),
            Err(status) if status.code() == Code::NotFound => Ok(None),
            Err(status) => Err(ContainerdError::Rpc {
                op: "content info",
                status,
            }),
        }
    }

    /// Reads a whole (small) blob: manifests and configs.
    pub async fn read_content(&self, digest: &str) -> Result<Vec<u8>, ContainerdError> {
        let mut stream = self
            .content()
            .read(ReadContentRequest {
                digest: digest.to_string(),
                offset: 0,
                size: 0,
            })
            .await
            .map_err(ContainerdError::rpc("read content"))?
            .into_inner();
        let mut data = Vec::new();
        while let Some(chunk) = stream.next().await {
            data.extend(chunk.map_err(ContainerdError::rpc("read content"))?.data);
        }
        Ok(data)
    }

    /// Sets `labels` on a blob, keeping its other labels.
    pub async fn set_content_labels(
        &self,
        digest: &str,
        labels: HashMap<String, String>,
    ) -> Result<(), ContainerdError> {
        if labels.is_empty() {
            return Ok(());
        }
        let paths = labels.keys().map(|k| format!("labels.{k}")).collect();
        self.content()
            .update(UpdateRequest {
                info: Some(containerd_client::services::v1::Info {
                    digest: digest.to_string(),
                    labels,
                    ..Default::default()
                }),
                update_mask: Some(prost_types::FieldMask { paths }),
            })
            .await
            .map_err(ContainerdError::rpc("update content labels"))?;
        Ok(())
    }

    pub async fn delete_content(&self, digest: &str) -> Result<(), ContainerdError> {
        match self
            .content()
            .delete(DeleteContentRequest {
                digest: digest.to_string(),
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(status) if status.code() == Code::NotFound => Ok(()),
            Err(status) => Err(ContainerdError::Rpc {
                op: "delete content",
                status,
            }),
        }
    }

    /// Drops a half-written ingest.
    pub async fn abort_ingest(&self, reference: &str) {
        let _ = self
            .content()
            .abort(AbortRequest {
                r#ref: reference.to_string(),
            })
            .await;
    }

    /// Opens an ingest for the blob `digest` of `size` bytes under `lease`. `None` when the
    /// namespace already has the blob. A writer that is already complete (containerd shares
    /// the blob from another namespace) only needs [`ContentWriter::commit`].
    pub async fn open_writer(
        &self,
        lease: &str,
        ingest_ref: &str,
        digest: &str,
        size: i64,
    ) -> Result<Option<ContentWriter>, ContainerdError> {
        let (tx, rx) = mpsc::channel::<WriteContentRequest>(4);
        let stat = WriteContentRequest {
            action: WriteAction::Stat as i32,
            r#ref: ingest_ref.to_string(),
            total: size,
            expected: digest.to_string(),
            ..Default::default()
        };
        // The channel is empty and has room: this cannot fail.
        let _ = tx.try_send(stat);
        let mut responses = match self
            .content()
            .write(leased(ReceiverStream::new(rx), Some(lease)))
            .await
        {
            Ok(resp) => resp.into_inner(),
            Err(status) if status.code() == Code::AlreadyExists => return Ok(None),
            Err(status) => return Err(rpc_write(status)),
        };
        let offset = match responses.next().await {
            Some(Ok(resp)) => resp.offset,
            Some(Err(status)) if status.code() == Code::AlreadyExists => return Ok(None),
            Some(Err(status)) => return Err(rpc_write(status)),
            None => {
                return Err(rpc_write(tonic::Status::aborted(
                    "write stream closed at once",
                )));
            }
        };
        Ok(Some(ContentWriter {
            containerd: self.clone(),
            tx,
            responses,
            ingest_ref: ingest_ref.to_string(),
            digest: digest.to_string(),
            size,
            offset,
        }))
    }

    /// Writes a small blob held in memory (manifests, configs) with `labels`; a blob the
    /// namespace already has only gets the labels.
    pub async fn put_blob(
        &self,
        lease: &str,
        digest: &str,
        data: Bytes,
        labels: HashMap<String, String>,
    ) -> Result<(), WriteError<std::convert::Infallible>> {
        const LOCKED_WAIT: Duration = Duration::from_millis(20);
        const LOCKED_TRIES: u32 = 500;
        let ingest = format!("crius-{digest}");
        let size = data.len() as i64;
        let mut tries = 0;
        // Another pull of the same image may be writing the same document: once it is
        // done, this one finds the blob there and only sets the labels.
        let opened = loop {
            match self.open_writer(lease, &ingest, digest, size).await {
                Err(e) if e.is_locked() && tries < LOCKED_TRIES => {
                    tries += 1;
                    tokio::time::sleep(LOCKED_WAIT).await;
                }
                opened => break opened?,
            }
        };
        match opened {
            None => Ok(self.set_content_labels(digest, labels).await?),
            Some(writer) if writer.is_complete() => Ok(writer.commit(labels).await?),
            Some(writer) => {
                let chunks = futures::stream::iter([Ok(data)]);
                writer.write_all(chunks, labels, |_| {}).await
            }
        }
    }
    /// An unnamed file on the filesystem of containerd's local content store to download the
    /// blob `digest` into (see [`UnnamedBlob`]); `None` where crius does not see that store,
    /// its filesystem makes no unnamed files, or the store holds the blob already (for
    /// another namespace: containerd shares it at the ingest's opening).
    pub async fn unnamed_blob(&self, digest: &str) -> Option<UnnamedBlob> {
        let root = self.content_root().await?.to_path_buf();
        let name = blob_name(digest)?.to_string();
        let blobs = root.join("blobs").join("sha256");
        let held = blobs.join(&name);
        let opened = tokio::task::spawn_blocking(move || {
            if std::fs::symlink_metadata(held).is_ok() {
                return Ok(None);
            }
            crate::sys::fsutil::open_unnamed(&root, 0o644).map(Some)
        })
        .await
        .ok()?;
        match opened {
            Ok(None) => None,
            Ok(Some(file)) => Some(UnnamedBlob {
                containerd: self.clone(),
                file,
                digest: digest.to_string(),
                blobs,
                name,
            }),
            Err(e) => {
                tracing::debug!(error = %e, "no unnamed file in containerd's content store");
                None
            }
        }
    }

    pub async fn get_image(&self, name: &str) -> Result<Option<Image>, ContainerdError> {
        match self
            .images()
            .get(GetImageRequest {
                name: name.to_string(),
            })
            .await
        {
            Ok(resp) => Ok(resp.into_inner().image),
            Err(status) if status.code() == Code::NotFound => Ok(None),
            Err(status) => Err(ContainerdError::Rpc {
                op: "get image",
                status,
            }),
        }
    }

    pub async fn list_images(&self) -> Result<Vec<Image>, ContainerdError> {
        Ok(self
            .images()
            .list(ListImagesRequest {
                filters: Vec::new(),
            })
            .await
            .map_err(ContainerdError::rpc("list images"))?
            .into_inner()
            .images)
    }

    /// Creates the image record `name`, or points an existing one at `target`.
    pub async fn put_image(
        &self,
        name: &str,
        target: Descriptor,
        labels: HashMap<String, String>,
    ) -> Result<(), ContainerdError> {
        let image = Image {
            name: name.to_string(),
            labels,
            target: Some(target),
            ..Default::default()
        };
        match self
            .images()
            .create(CreateImageRequest {
                image: Some(image.clone()),
                source_date_epoch: None,
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(status) if status.code() == Code::AlreadyExists => {
                let mut paths = vec!["target".to_string()];
                paths.extend(image.labels.keys().map(|k| format!("labels.{k}")));
                self.images()
                    .update(UpdateImageRequest {
                        image: Some(image),
                        update_mask: Some(prost_types::FieldMask { paths }),
                        source_date_epoch: None,
                    })
                    .await
                    .map_err(ContainerdError::rpc("update image"))?;
                Ok(())
            }
            Err(status) => Err(ContainerdError::Rpc {
                op: "create image",
                status,
            }),
        }
    }

    /// Deletes the image record `name`; `sync` runs garbage collection before answering.
    pub async fn delete_image(&self, name: &str, sync: bool) -> Result<(), ContainerdError> {
        match self
            .images()
            .delete(DeleteImageRequest {
                name: name.to_string(),
                sync,
                target: None,
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(status) if status.code() == Code::NotFound => Ok(()),
            Err(status) => Err(ContainerdError::Rpc {
                op: "delete image",
                status,
            }),
        }
    }

    pub async fn snapshot_exists(
        &self,
        snapshotter: &str,
        key: &str,
    ) -> Result<bool, ContainerdError> {
        Ok(self.snapshot_parent(snapshotter, key).await?.is_some())
    }

    /// The parent of the snapshot `key` ("" for none); `None` when it does not exist.
    pub async fn snapshot_parent(
        &self,
        snapshotter: &str,
        key: &str,
    ) -> Result<Option<String>, ContainerdError> {
        match self
            .snapshots()
            .stat(StatSnapshotRequest {
                snapshotter: snapshotter.to_string(),
                key: key.to_string(),
            })
            .await
        {
            Ok(resp) => Ok(Some(
                resp.into_inner().info.map(|i| i.parent).unwrap_or_default(),
            )),
            Err(status) if status.code() == Code::NotFound => Ok(None),
            Err(status) => Err(ContainerdError::Rpc {
                op: "stat snapshot",
                status,
            }),
        }
    }

    /// Prepares an active snapshot `key` on `parent` and returns its mounts.
    pub async fn prepare_snapshot(
        &self,
        snapshotter: &str,
        key: &str,
        parent: &str,
        labels: HashMap<String, String>,
        lease: Option<&str>,
    ) -> Result<Vec<Mount>, ContainerdError> {
        let resp = self
            .snapshots()
            .prepare(leased(
                PrepareSnapshotRequest {
                    snapshotter: snapshotter.to_string(),
                    key: key.to_string(),
                    parent: parent.to_string(),
                    labels,
                },
                lease,
            ))
            .await
            .map_err(ContainerdError::rpc("prepare snapshot"))?;
        Ok(resp.into_inner().mounts)
    }

    /// Prepares an active snapshot `key` on `parent` with no labels and returns its mounts;
    /// one that exists already is reused (its mounts are returned).
    pub async fn prepare_or_reuse_snapshot(
        &self,
        snapshotter: &str,
        key: &str,
        parent: &str,
        lease: Option<&str>,
    ) -> Result<Vec<Mount>, ContainerdError> {
        match self
            .prepare_snapshot(snapshotter, key, parent, HashMap::new(), lease)
            .await
        {
            Err(e) if e.code() == Some(Code::AlreadyExists) => {
                self.snapshot_mounts(snapshotter, key).await
            }
            other => other,
        }
    }

    /// Makes a read-only view `key` of `parent` and returns its mounts. A view that exists
    /// already is reused: its mounts are returned.
    pub async fn view_snapshot(
        &self,
        snapshotter: &str,
        key: &str,
        parent: &str,
        lease: Option<&str>,
    ) -> Result<Vec<Mount>, ContainerdError> {
        let viewed = self
            .snapshots()
            .view(leased(
                ViewSnapshotRequest {
                    snapshotter: snapshotter.to_string(),
                    key: key.to_string(),
                    parent: parent.to_string(),
                    labels: HashMap::new(),
                },
                lease,
            ))
            .await;
        match viewed {
            Ok(resp) => Ok(resp.into_inner().mounts),
            Err(status) if status.code() == Code::AlreadyExists => {
                self.snapshot_mounts(snapshotter, key).await
            }
            Err(status) => Err(ContainerdError::Rpc {
                op: "view snapshot",
                status,
            }),
        }
    }

    pub async fn commit_snapshot(
        &self,
        snapshotter: &str,
        name: &str,
        key: &str,
        labels: HashMap<String, String>,
        lease: Option<&str>,
    ) -> Result<(), ContainerdError> {
        self.snapshots()
            .commit(leased(
                CommitSnapshotRequest {
                    snapshotter: snapshotter.to_string(),
                    name: name.to_string(),
                    key: key.to_string(),
                    labels,
                },
                lease,
            ))
            .await
            .map_err(ContainerdError::rpc("commit snapshot"))?;
        Ok(())
    }

    /// Commits the active snapshot `key`, prepared without a parent, as `name` on the
    /// committed snapshot `parent`: one call where otherwise a snapshot is prepared on the
    /// parent, the files moved into it and that committed. Only for a snapshotter that
    /// [can rebase](super::Containerd::snapshotter_can_rebase): an older containerd
    /// ignores the parent and commits the snapshot without one.
    pub async fn commit_snapshot_onto(
        &self,
        snapshotter: &str,
        name: &str,
        key: &str,
        parent: &str,
        lease: Option<&str>,
    ) -> Result<(), ContainerdError> {
        let request = CommitOntoParentRequest {
            snapshotter: snapshotter.to_string(),
            name: name.to_string(),
            key: key.to_string(),
            labels: HashMap::new(),
            parent: parent.to_string(),
        };
        let mut grpc = tonic::client::Grpc::new(self.namespaced());
        grpc.ready().await.map_err(|e| ContainerdError::Rpc {
            op: "commit snapshot",
            status: tonic::Status::unavailable(format!("containerd not ready: {e}")),
        })?;
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(
            "/containerd.services.snapshots.v1.Snapshots/Commit",
        );
        grpc.unary::<_, (), _>(
            leased(request, lease),
            path,
            tonic_prost::ProstCodec::default(),
        )
        .await
        .map_err(ContainerdError::rpc("commit snapshot"))?;
        Ok(())
    }

    /// Bytes and inodes a snapshot uses; `None` when it does not exist.
    pub async fn snapshot_usage(
        &self,
        snapshotter: &str,
        key: &str,
    ) -> Result<Option<(u64, u64)>, ContainerdError> {
        match self
            .snapshots()
            .usage(UsageRequest {
                snapshotter: snapshotter.to_string(),
                key: key.to_string(),
            })
            .await
        {
            Ok(response) => {
                let usage = response.into_inner();
                Ok(Some((
                    u64::try_from(usage.size).unwrap_or(0),
                    u64::try_from(usage.inodes).unwrap_or(0),
                )))
            }
            Err(status) if status.code() == Code::NotFound => Ok(None),
            Err(status) => Err(ContainerdError::Rpc {
                op: "snapshot usage",
                status,
            }),
        }
    }

    pub async fn remove_snapshot(
        &self,
        snapshotter: &str,
        key: &str,
    ) -> Result<(), ContainerdError> {
        match self
            .snapshots()
            .remove(RemoveSnapshotRequest {
                snapshotter: snapshotter.to_string(),
                key: key.to_string(),
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(status) if status.code() == Code::NotFound => Ok(()),
            Err(status) => Err(ContainerdError::Rpc {
                op: "remove snapshot",
                status,
            }),
        }
    }

    /// Applies the layer `diff` onto `mounts`; returns the uncompressed descriptor.
    pub async fn apply_diff(
        &self,
        diff: Descriptor,
        mounts: Vec<Mount>,
        lease: Option<&str>,
    ) -> Result<Descriptor, ContainerdError> {
        let resp = self
            .diff()
            .apply(leased(
                ApplyRequest {
                    diff: Some(diff),
                    mounts,
                    payloads: HashMap::new(),
                    sync_fs: false,
                },
                lease,
            ))
            .await
            .map_err(ContainerdError::rpc("apply layer"))?;
        resp.into_inner().applied.ok_or(ContainerdError::Rpc {
            op: "apply layer",
            status: tonic::Status::internal("containerd returned no applied descriptor"),
        })
    }
}

/// An open ingest in the content store. Dropping it without committing leaves the ingest
/// to [`Containerd::abort_ingest`] (done on every failure path here).
pub struct ContentWriter {
    containerd: Containerd,
    tx: mpsc::Sender<WriteContentRequest>,
    responses: tonic::Streaming<containerd_client::services::v1::WriteContentResponse>,
    ingest_ref: String,
    digest: String,
    size: i64,
    /// How much containerd already has.
    offset: i64,
}

impl ContentWriter {
    /// Whether containerd already holds all of the blob (shared from another namespace).
    pub fn is_complete(&self) -> bool {
        self.size > 0 && self.offset == self.size
    }

    /// Commits without writing: for a complete writer.
    pub async fn commit(mut self, labels: HashMap<String, String>) -> Result<(), ContainerdError> {
        let commit = self.commit_request(labels);
        let _ = self.tx.send(commit).await;
        drop(self.tx);
        while let Some(resp) = self.responses.next().await {
            match resp {
                Ok(_) => {}
                Err(status) if status.code() == Code::AlreadyExists => return Ok(()),
                Err(status) => {
                    self.containerd.abort_ingest(&self.ingest_ref).await;
                    return Err(rpc_write(status));
                }
            }
        }
        Ok(())
    }

    fn commit_request(&self, labels: HashMap<String, String>) -> WriteContentRequest {
        WriteContentRequest {
            action: WriteAction::Commit as i32,
            total: self.size,
            expected: self.digest.clone(),
            offset: self.size,
            labels,
            ..Default::default()
        }
    }

    /// Writes the blob from its start over the Write stream, checking its digest and size,
    /// and commits it with `labels`. `progress` is called with each chunk's length.
    pub async fn write_all<S, E>(
        self,
        data: S,
        labels: HashMap<String, String>,
        progress: impl Fn(usize),
    ) -> Result<(), WriteError<E>>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::error::Error + 'static,
    {
        let commit = self.commit_request(labels);
        let Self {
            containerd,
            tx,
            responses,
            ingest_ref,
            digest,
            size,
            ..
        } = self;
        // Every request gets a response; drain them concurrently and keep the first error.
        let drain = tokio::spawn(async move {
            let mut responses = responses;
            while let Some(resp) = responses.next().await {
                resp?;
            }
            Ok::<(), tonic::Status>(())
        });
        let mut sink = StreamSink(&tx);
        let outcome = match copy_blob(data, &mut sink, size, Some(Sha256::new()), progress)
            .await
            .check(&digest, size)
        {
            Ok(()) => {
                let _ = tx.send(commit).await;
                Ok(())
            }
            Err(e) => Err(e),
        };
        drop(tx);
        let drained = drain
            .await
            .unwrap_or_else(|e| Err(tonic::Status::internal(e.to_string())));
        match (outcome, drained) {
            (Ok(()), Ok(())) => Ok(()),
            (Ok(()), Err(status)) if status.code() == Code::AlreadyExists => Ok(()),
            (Ok(()), Err(status)) => {
                containerd.abort_ingest(&ingest_ref).await;
                Err(rpc_write(status).into())
            }
            (Err(e), _) => {
                containerd.abort_ingest(&ingest_ref).await;
                Err(e)
            }
        }
    }
}

/// A blob downloaded into an unnamed file on the filesystem of containerd's local content
/// store. It gets its name in the store's `blobs/` only once crius has checked its digest
/// and size (synced, read-only, as containerd's own commit leaves a blob), and containerd
/// then records it without a transfer: its "shared" content policy, the default on every
/// line, finds the blob in the store. No ingest is open while the bytes come in; bytes that
/// are not the blob never get a name, and dropping this before frees the file.
pub struct UnnamedBlob {
    containerd: Containerd,
    file: std::fs::File,
    digest: String,
    /// `<root>/blobs/sha256`: the store keeps a SHA-256 blob there under its hex digest.
    blobs: PathBuf,
    /// The blob's name there.
    name: String,
}

impl UnnamedBlob {
    /// Writes `data`, the blob of `size` bytes, into the file (`progress` is called with each
    /// chunk's length), checks it, names it and records it under `lease` with `labels`
    /// (through the ingest `ingest_ref`).
    pub async fn write_and_record<S, E>(
        self,
        lease: &str,
        ingest_ref: &str,
        size: i64,
        labels: HashMap<String, String>,
        data: S,
        progress: impl Fn(usize),
    ) -> Result<(), WriteError<E>>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::error::Error + 'static,
    {
        let Self {
            containerd,
            file,
            digest,
            blobs,
            name,
        } = self;
        let file_error = |source| ContainerdError::Ingest {
            path: blobs.clone(),
            source,
        };
        tracing::debug!(%digest, "downloading the blob into an unnamed file");
        let started = std::time::Instant::now();
        let mut sink = FileSink::new(file);
        let mut sent = copy_blob(data, &mut sink, size, None, progress).await;
        let (file, actual) = sink.finish().await.map_err(file_error)?;
        sent.actual = Some(actual);
        sent.check(&digest, size)?;
        let written = started.elapsed();
        let named = name_blob(Arc::clone(&file), &blobs, &name).await;
        // Where containerd's collection could remove the blob, recorded nowhere yet.
        if named.is_some() {
            crate::failpoint::hit("blob_published")
                .await
                .map_err(|e| rpc_write(tonic::Status::internal(e.to_string())))?;
        }
        // A blob named here and then not recorded (containerd gone, the pull cancelled) is
        // left for containerd's collection, which removes any blob recorded nowhere: crius
        // does not remove it itself, as another namespace's ingest may already share it.
        record_written(&containerd, lease, ingest_ref, &digest, size, labels, &file)
            .await
            .map_err(|e| e.map_source(|source| file_error(source).into()))?;
        // fs-verity only once no descriptor is open for writing, as containerd's commit does.
        drop(file);
        if named == Some(true) {
            protect_blob(blobs.join(name)).await;
        }
        tracing::debug!(
            %digest,
            named = ?named,
            write_ms = written.as_millis() as u64,
            record_ms = (started.elapsed() - written).as_millis() as u64,
            "blob downloaded into an unnamed file and recorded"
        );
        Ok(())
    }
}

/// Names the checked blob in `file` `name` in the store's `blobs` directory: `Some(true)` when
/// crius named it, `Some(false)` when the name was taken already (by containerd's own blob),
/// `None`, logged, when it cannot (the bytes then go over the Write stream).
async fn name_blob(file: Arc<std::fs::File>, blobs: &std::path::Path, name: &str) -> Option<bool> {
    let (dir, name) = (blobs.to_path_buf(), name.to_string());
    let linked =
        tokio::task::spawn_blocking(move || crate::sys::fsutil::link_durably(&file, &dir, &name))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    match linked {
        Ok(linked) => Some(linked),
        Err(e) => {
            tracing::debug!(dir = %blobs.display(), error = %e, "cannot name the blob in the store");
            None
        }
    }
}

/// Turns fs-verity on for a blob crius named, where the filesystem has it (best effort, as
/// containerd's own commit).
async fn protect_blob(blob: PathBuf) {
    let path = blob.clone();
    let done = tokio::task::spawn_blocking(move || crate::sys::fsutil::enable_verity(&path)).await;
    if let Ok(Err(e)) = done
        && !matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOTTY))
    {
        tracing::debug!(blob = %blob.display(), error = %e, "cannot turn fs-verity on");
    }
}

/// Records the blob crius wrote into `file`: containerd finds it named in the store and the
/// commit only records it. Where it does not (it could not be named, containerd's collection
/// removed it meanwhile as it removes any blob recorded nowhere, or an "isolated" content
/// policy), the file's bytes go over the Write stream. Waits while another writer holds the
/// ingest.
async fn record_written(
    containerd: &Containerd,
    lease: &str,
    ingest_ref: &str,
    digest: &str,
    size: i64,
    labels: HashMap<String, String>,
    file: &Arc<std::fs::File>,
) -> Result<(), WriteError<std::io::Error>> {
    const LOCKED_WAIT: Duration = Duration::from_millis(50);
    const LOCKED_TRIES: u32 = 600;
    for _ in 0..LOCKED_TRIES {
        match containerd
            .open_writer(lease, ingest_ref, digest, size)
            .await
        {
            Ok(None) => return Ok(()),
            Ok(Some(writer)) if writer.is_complete() => return Ok(writer.commit(labels).await?),
            Ok(Some(writer)) => {
                tracing::debug!(%digest, "containerd did not find the blob in its store; sending it");
                return writer
                    .write_all(file_chunks(Arc::clone(file), size), labels, |_| {})
                    .await;
            }
            Err(e) if e.is_locked() => tokio::time::sleep(LOCKED_WAIT).await,
            Err(e) => return Err(e.into()),
        }
    }
    Err(rpc_write(tonic::Status::unavailable(format!(
        "ingest {ingest_ref} stayed locked by another writer"
    )))
    .into())
}

/// The first `size` bytes of `file`, in chunks of up to [`WRITE_CHUNK`], read on the
/// blocking pool.
fn file_chunks(
    file: Arc<std::fs::File>,
    size: i64,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Unpin {
    let size = u64::try_from(size).unwrap_or(0);
    Box::pin(futures::stream::try_unfold(0u64, move |offset| {
        let file = Arc::clone(&file);
        async move {
            if offset >= size {
                return Ok(None);
            }
            let len = (size - offset).min(WRITE_CHUNK as u64);
            let chunk = tokio::task::spawn_blocking(move || {
                let mut chunk = vec![0u8; len as usize];
                file.read_exact_at(&mut chunk, offset).map(|()| chunk)
            })
            .await
            .map_err(std::io::Error::other)??;
            Ok(Some((Bytes::from(chunk), offset + len)))
        }
    }))
}

/// containerd's `CommitSnapshotRequest` as of 2.2, with the `parent` (field 5) that the
/// generated client of containerd-client 0.9 predates.
#[derive(Clone, PartialEq, prost::Message)]
struct CommitOntoParentRequest {
    #[prost(string, tag = "1")]
    snapshotter: String,
    #[prost(string, tag = "2")]
    name: String,
    #[prost(string, tag = "3")]
    key: String,
    #[prost(map = "string, string", tag = "4")]
    labels: HashMap<String, String>,
    #[prost(string, tag = "5")]
    parent: String,
}

/// A blob's name in the store: the hex of a `sha256:` digest, 64 lower-case hex digits
/// (anything else gets none).
fn blob_name(digest: &str) -> Option<&str> {
    digest.strip_prefix("sha256:").filter(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// What sending a blob's data to containerd came to.
struct Sent<E> {
    /// The digest of what the source gave, where crius hashed it.
    actual: Option<String>,
    /// Bytes sent in writes.
    offset: i64,
    /// Bytes taken from the source and not sent (a source cut off, or a closed stream).
    buffered: usize,
    source_error: Option<E>,
    /// The source gave more than the blob's size.
    overrun: bool,
}

impl<E: std::error::Error + 'static> Sent<E> {
    /// Whether what was sent is the blob: all of it, of its digest and size.
    fn check(self, digest: &str, size: i64) -> Result<(), WriteError<E>> {
        if let Some(e) = self.source_error {
            return Err(WriteError::Source(e));
        }
        if self.overrun {
            return Err(WriteError::Mismatch {
                expected: digest.to_string(),
                actual: "(cut off: longer than its descriptor)".to_string(),
                size: self.offset + self.buffered as i64,
                expected_size: size,
            });
        }
        let wrong_digest = self
            .actual
            .as_deref()
            .is_some_and(|actual| actual != digest);
        if wrong_digest || self.offset != size {
            return Err(WriteError::Mismatch {
                expected: digest.to_string(),
                actual: self
                    .actual
                    .unwrap_or_else(|| "(not hashed: size differs)".to_string()),
                size: self.offset,
                expected_size: size,
            });
        }
        Ok(())
    }
}

/// Where a blob's bytes go, in writes at increasing offsets.
trait BlobSink {
    /// Writes `data` at `offset`; false when the sink is gone (its error is kept elsewhere).
    async fn put(&mut self, offset: i64, data: Vec<u8>) -> bool;

    /// An emptied buffer of an earlier write, to fill with the next, where the sink gives
    /// them back.
    fn spare(&mut self) -> Option<Vec<u8>> {
        None
    }
}

/// The Write stream to containerd.
struct StreamSink<'a>(&'a mpsc::Sender<WriteContentRequest>);

impl BlobSink for StreamSink<'_> {
    async fn put(&mut self, offset: i64, data: Vec<u8>) -> bool {
        let req = WriteContentRequest {
            action: WriteAction::Write as i32,
            offset,
            data,
            ..Default::default()
        };
        self.0.send(req).await.is_ok()
    }
}

/// A file write done on the blocking pool: its outcome, the hash so far, and its buffer.
type WriteDone = (std::io::Result<()>, Sha256, Vec<u8>);

/// An ingest's data file, written in order from its start on the blocking pool, one write
/// in flight while the next chunk comes in. Each written range starts on its way to the
/// disk at once: containerd's commit syncs the file, and would otherwise wait for all of
/// it (and, on ext4, for every other layer written meanwhile).
struct FileSink {
    out: Arc<std::fs::File>,
    in_flight: Option<tokio::task::JoinHandle<WriteDone>>,
    /// The hash of what was written so far (with the write in flight, while it is away).
    hasher: Option<Sha256>,
    /// The buffer of the last write done, emptied: the copy fills it with the next chunk
    /// rather than a new megabyte the kernel would have to fault in and zero page by page.
    spare: Option<Vec<u8>>,
    error: Option<std::io::Error>,
}

impl FileSink {
    fn new(out: std::fs::File) -> Self {
        Self {
            out: Arc::new(out),
            in_flight: None,
            hasher: Some(Sha256::new()),
            spare: None,
            error: None,
        }
    }

    /// Waits for the write in flight; false once any write failed.
    async fn settle(&mut self) -> bool {
        if let Some(write) = self.in_flight.take() {
            match write.await {
                Ok((done, hasher, mut buffer)) => {
                    self.hasher = Some(hasher);
                    buffer.clear();
                    self.spare = Some(buffer);
                    if let Err(e) = done {
                        self.error.get_or_insert(e);
                    }
                }
                Err(e) => {
                    self.error.get_or_insert(std::io::Error::other(e));
                }
            }
        }
        self.error.is_none()
    }

    /// Waits for the last write; the file and the digest of all that was written, or the
    /// first error.
    async fn finish(mut self) -> std::io::Result<(Arc<std::fs::File>, String)> {
        self.settle().await;
        if let Some(e) = self.error {
            return Err(e);
        }
        let hasher = self
            .hasher
            .ok_or_else(|| std::io::Error::other("hash lost"))?;
        Ok((self.out, format!("sha256:{:x}", hasher.finalize())))
    }
}

impl BlobSink for FileSink {
    async fn put(&mut self, offset: i64, data: Vec<u8>) -> bool {
        if !self.settle().await {
            return false;
        }
        let Ok(offset) = u64::try_from(offset) else {
            self.error = Some(std::io::Error::from(std::io::ErrorKind::InvalidInput));
            return false;
        };
        let out = Arc::clone(&self.out);
        let Some(mut hasher) = self.hasher.take() else {
            self.error = Some(std::io::Error::other("hash lost"));
            return false;
        };
        // Hashed here, off the task that receives the next chunk meanwhile.
        self.in_flight = Some(tokio::task::spawn_blocking(move || {
            let written = out.write_all_at(&data, offset);
            if written.is_ok() {
                hasher.update(&data);
                // Only a head start: the sync before the blob is published writes the rest.
                let _ = crate::sys::fsutil::start_writeback(&out, offset, data.len() as u64);
            }
            (written, hasher, data)
        }));
        true
    }

    fn spare(&mut self) -> Option<Vec<u8>> {
        self.spare.take()
    }
}

/// Copies `data` into `sink` in writes of up to [`WRITE_CHUNK`] from offset 0 (which
/// restarts any earlier partial ingest), hashing it on the way with `hasher` (if any); a
/// source that gives more than `size` is cut off at once, not when it stops (it might
/// never).
async fn copy_blob<S, E>(
    mut data: S,
    sink: &mut impl BlobSink,
    size: i64,
    mut hasher: Option<Sha256>,
    progress: impl Fn(usize),
) -> Sent<E>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
{
    let mut offset: i64 = 0;
    // A small blob (a manifest, a config) needs no megabyte buffer.
    let write_size = usize::try_from(size)
        .unwrap_or(WRITE_CHUNK)
        .clamp(1, WRITE_CHUNK);
    let mut buffer: Vec<u8> = Vec::with_capacity(write_size);
    let mut source_error = None;
    let mut overrun = false;
    loop {
        let chunk = match data.next().await {
            Some(Ok(chunk)) => Some(chunk),
            Some(Err(e)) => {
                source_error = Some(e);
                break;
            }
            None => None,
        };
        let last = chunk.is_none();
        if let Some(chunk) = chunk {
            if offset + (buffer.len() + chunk.len()) as i64 > size {
                overrun = true;
                break;
            }
            if let Some(hasher) = hasher.as_mut() {
                hasher.update(&chunk);
            }
            progress(chunk.len());
            buffer.extend_from_slice(&chunk);
        }
        if buffer.len() >= write_size || (last && !buffer.is_empty()) {
            let payload = std::mem::take(&mut buffer);
            let len = payload.len() as i64;
            if !sink.put(offset, payload).await {
                break;
            }
            offset += len;
            if !last {
                buffer = (sink.spare()).unwrap_or_else(|| Vec::with_capacity(write_size));
            }
        }
        if last {
            break;
        }
    }
    Sent {
        actual: hasher.map(|hasher| format!("sha256:{:x}", hasher.finalize())),
        offset,
        buffered: buffer.len(),
        source_error,
        overrun,
    }
}

fn rpc_write(status: tonic::Status) -> ContainerdError {
    ContainerdError::Rpc {
        op: "write content",
        status,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(
        parts: &[&'static [u8]],
    ) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Unpin {
        futures::stream::iter(
            parts
                .iter()
                .map(|p| Ok(Bytes::from_static(p)))
                .collect::<Vec<_>>(),
        )
    }

    fn sha256(data: &[u8]) -> String {
        format!("sha256:{:x}", Sha256::digest(data))
    }

    #[tokio::test]
    async fn a_blob_copied_into_a_file_lands_whole_and_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        std::fs::write(&path, b"an earlier, longer partial ingest").unwrap();
        let out = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        // Three writes: the third fills the buffer the first gave back.
        let big: &'static [u8] = Box::leak(vec![3u8; 2 * WRITE_CHUNK + 17].into_boxed_slice());
        let mut expected = b"head".to_vec();
        expected.extend_from_slice(big);
        expected.extend_from_slice(b"tail");
        let mut sink = FileSink::new(out);
        let sent = copy_blob(
            chunks(&[b"head", big, b"tail"]),
            &mut sink,
            expected.len() as i64,
            None,
            |_| {},
        )
        .await;
        let (_, written) = sink.finish().await.unwrap();
        assert!(sent.actual.is_none(), "not hashed by the copy");
        assert_eq!(written, sha256(&expected), "the sink hashes what it wrote");
        let size = expected.len() as i64;
        sent.check(&sha256(b"anything"), size).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), expected);
    }

    #[tokio::test]
    async fn the_file_sink_gives_each_written_buffer_back_for_the_next() {
        let mut sink = FileSink::new(tempfile::tempfile().unwrap());
        let first = vec![1u8; 4096];
        let first_at = first.as_ptr();
        assert!(sink.put(0, first).await);
        assert!(sink.spare().is_none(), "the first write is still away");
        assert!(sink.put(4096, vec![2u8; 10]).await);
        let spare = sink.spare().expect("the first write's buffer back");
        assert!(spare.is_empty());
        assert_eq!(spare.as_ptr(), first_at, "the same allocation");
        assert!(spare.capacity() >= 4096);
        let (_, written) = sink.finish().await.unwrap();
        let mut expected = vec![1u8; 4096];
        expected.extend_from_slice(&[2u8; 10]);
        assert_eq!(written, sha256(&expected));
    }

    #[tokio::test]
    async fn a_file_is_read_back_in_chunks_up_to_the_size_given() {
        let mut file = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..WRITE_CHUNK * 2 + 5).map(|i| i as u8).collect();
        std::io::Write::write_all(&mut file, &data).unwrap();
        let chunks: Vec<Bytes> = file_chunks(Arc::new(file), data.len() as i64 - 1)
            .map(Result::unwrap)
            .collect()
            .await;
        let lengths: Vec<usize> = chunks.iter().map(Bytes::len).collect();
        assert_eq!(lengths, [WRITE_CHUNK, WRITE_CHUNK, 4]);
        assert_eq!(chunks.concat(), data[..data.len() - 1]);
    }

    #[test]
    fn only_a_well_formed_sha256_digest_names_a_blob() {
        let hex = "a".repeat(64);
        assert_eq!(blob_name(&format!("sha256:{hex}")), Some(hex.as_str()));
        for bad in [
            format!("sha512:{hex}"),
            format!("sha256:{}", "A".repeat(64)),
            format!("sha256:{}", "a".repeat(63)),
            format!("sha256:../{}", "a".repeat(61)),
            hex.clone(),
        ] {
            assert_eq!(blob_name(&bad), None, "{bad}");
        }
    }

    #[tokio::test]
    async fn a_short_or_overlong_unhashed_blob_is_still_a_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        let open = |name: &str| std::fs::File::create(dir.path().join(name)).unwrap();
        let mut sink = FileSink::new(open("short"));
        let sent = copy_blob(chunks(&[b"abc"]), &mut sink, 4, None, |_| {}).await;
        sink.finish().await.unwrap();
        let err = sent.check(&sha256(b"abcd"), 4).unwrap_err();
        assert!(matches!(err, WriteError::Mismatch { size: 3, .. }), "{err}");

        let mut sink = FileSink::new(open("long"));
        let sent = copy_blob(chunks(&[b"abc", b"de"]), &mut sink, 4, None, |_| {}).await;
        sink.finish().await.unwrap();
        let err = sent.check(&sha256(b"abcd"), 4).unwrap_err();
        assert!(
            err.to_string().contains("longer than its descriptor"),
            "{err}"
        );
    }
}
