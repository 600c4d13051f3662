//! Restoring a container from a checkpoint archive, as containerd's CRI does it: a
//! CreateContainer whose image names an archive file on the host makes a container of the
//! checkpoint's base image (marked with the `restored`, `checkpointedAt` and
//! `checkpointImage` annotations), and its StartContainer replays the archive's
//! writable-layer changes on the new container's layer and has the runtime restore the
//! process from the CRIU images (containerd's task create with a checkpoint).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use containerd_client::types::Descriptor;
use tonic::Status;

use crate::api::v1::ContainerConfig;
use crate::checkpoint::CheckpointError;
use crate::server::CriService;
use crate::store::Container;

/// containerd's media type for CRIU images (a tar), which its task create unpacks.
const CRIU_CHECKPOINT_MEDIA_TYPE: &str =
    "application/vnd.containerd.container.criu.checkpoint.criu.tar";
/// In a container's root dir: the archive unpacked for its restore.
const RESTORE_DIR: &str = "restore";

impl CriService {
    /// When `image` names a checkpoint archive (an existing file on the host), points the
    /// config at the checkpoint's base image and marks it restored. Returns the image to
    /// use and the archive (`None`: an ordinary image).
    pub(crate) async fn restore_source(
        &self,
        config: &mut ContainerConfig,
        image: &str,
    ) -> Result<(String, Option<PathBuf>), Status> {
        let archive = PathBuf::from(image);
        if !archive.is_absolute() || !archive.is_file() {
            return Ok((image.to_string(), None));
        }
        if let Err(reason) = &self.criu {
            return Err(Status::failed_precondition(format!(
                "{image} is a checkpoint archive, but containers cannot be restored on this \
                 host: {reason}"
            )));
        }
        let path = archive.clone();
        let dump = tokio::task::spawn_blocking(move || crate::checkpoint::read_config_dump(&path))
            .await
            .map_err(|e| Status::internal(format!("reading {image}: {e}")))?
            .map_err(|e| Status::invalid_argument(format!("not a checkpoint archive: {e}")))?;
        let base = [
            &dump.rootfs_image_name,
            &dump.rootfs_image,
            &dump.rootfs_image_ref,
        ]
        .into_iter()
        .find(|name| !name.is_empty() && self.images.resolve(name).is_some())
        .ok_or_else(|| {
            Status::not_found(format!(
                "the image {:?} of checkpoint {image} is not pulled: pull it first",
                dump.rootfs_image_name
            ))
        })?
        .clone();
        config.annotations.extend([
            ("restored".to_string(), "true".to_string()),
            ("checkpointedAt".to_string(), dump.checkpointed_time.clone()),
            ("checkpointImage".to_string(), image.to_string()),
        ]);
        if let Some(spec) = config.image.as_mut() {
            spec.image = base.clone();
        }
        tracing::info!(archive = %image, image = %base, container = %dump.name, "restoring a container from a checkpoint");
        Ok((base, Some(archive)))
    }

    /// Before a restored container's task is made: the archive unpacked into its root dir,
    /// its writable-layer changes replayed on the container's layer, and its CRIU images put
    /// in containerd's content store (under a lease the caller drops once the task is
    /// made). Returns the checkpoint to create the task from.
    pub(crate) async fn prepare_restore(
        &self,
        container: &Container,
        archive: &Path,
    ) -> Result<(Descriptor, String), String> {
        let id = container.id();
        let upper = self
            .writable_layer(id)
            .await
            .ok_or_else(|| format!("container {id} has no writable layer to restore into"))?;
        let dest = self.container_root_dir(id).join(RESTORE_DIR);
        let (archive, images_tar) = (archive.to_path_buf(), dest.join("images.tar"));
        let unpack_dest = dest.clone();
        let tar_path = images_tar.clone();
        let (digest, size) = tokio::task::spawn_blocking(move || {
            let _ = std::fs::remove_dir_all(&unpack_dest);
            let unpacked = crate::checkpoint::unpack_for_restore(&archive, &unpack_dest)?;
            crate::checkpoint::apply_rootfs_diff(
                unpacked.rootfs_diff.as_deref(),
                &unpacked.deleted,
                &upper,
            )?;
            crate::checkpoint::tar_with_digest(&unpacked.images, &tar_path)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e: CheckpointError| format!("unpacking the checkpoint: {e}"))?;
        let lease = format!("crius-restore-{id}");
        self.containerd
            .create_lease(&lease, Duration::from_secs(3600))
            .await
            .map_err(|e| e.to_string())?;
        self.put_file_blob(&lease, &digest, size, &images_tar)
            .await
            .map_err(|e| format!("storing the CRIU images: {e}"))?;
        let descriptor = Descriptor {
            media_type: CRIU_CHECKPOINT_MEDIA_TYPE.to_string(),
            digest,
            size: size as i64,
            annotations: HashMap::new(),
        };
        Ok((descriptor, lease))
    }

    /// After the restored task was made (or failed): its unpacked archive and lease go.
    pub(crate) async fn finish_restore(&self, id: &str, lease: &str) {
        if let Err(e) = self.containerd.delete_lease(lease, false).await {
            tracing::warn!(%lease, error = %e, "deleting the restore lease failed; it expires by itself");
        }
        let dir = self.container_root_dir(id).join(RESTORE_DIR);
        if let Err(e) = std::fs::remove_dir_all(&dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(container = id, error = %e, "removing the unpacked checkpoint failed");
        }
    }

    /// Streams a file into the content store as blob `digest`.
    async fn put_file_blob(
        &self,
        lease: &str,
        digest: &str,
        size: u64,
        path: &Path,
    ) -> Result<(), String> {
        let ingest = format!("crius-restore-{digest}");
        let writer = self
            .containerd
            .open_writer(lease, &ingest, digest, size as i64)
            .await
            .map_err(|e| e.to_string())?;
        match writer {
            None => Ok(()),
            Some(writer) if writer.is_complete() => writer
                .commit(HashMap::new())
                .await
                .map_err(|e| e.to_string()),
            Some(writer) => {
                let file = tokio::fs::File::open(path)
                    .await
                    .map_err(|e| format!("open {}: {e}", path.display()))?;
                let chunks = tokio_util::io::ReaderStream::new(file);
                writer
                    .write_all(chunks, HashMap::new(), |_| {})
                    .await
                    .map_err(|e| e.to_string())
            }
        }
    }
}
