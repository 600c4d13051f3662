//! Restoring a container from a checkpoint archive, as containerd's CRI does it: a
//! CreateContainer whose image names an archive file on the host makes a container of the
//! checkpoint's base image (marked with the `restored`, `checkpointedAt` and
//! `checkpointImage` annotations), and its StartContainer replays the archive's
//! writable-layer changes on the new container's layer and has the runtime restore the
//! process from the CRIU images (containerd's task create with runc's `CriuImagePath`, so
//! containerd makes no copy of them).

use std::path::{Path, PathBuf};

use tonic::Status;

use crate::api::v1::ContainerConfig;
use crate::checkpoint::CheckpointError;
use crate::cri::CriService;
use crate::store::Container;

/// How long CreateContainer looks through an archive for its `config.dump` (crius writes it
/// first; other tools after the CRIU images).
const ARCHIVE_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
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
        if let Err(reason) = &self.host.criu {
            return Err(Status::failed_precondition(format!(
                "{image} is a checkpoint archive, but containers cannot be restored on this \
                 host: {reason}"
            )));
        }
        let path = archive.clone();
        let read = tokio::task::spawn_blocking(move || crate::checkpoint::read_config_dump(&path));
        let dump = tokio::time::timeout(ARCHIVE_READ_TIMEOUT, read)
            .await
            .map_err(|_| {
                Status::deadline_exceeded(format!(
                    "{image}: no config.dump found within {ARCHIVE_READ_TIMEOUT:?}"
                ))
            })?
            .map_err(|e| Status::internal(format!("reading {image}: {e}")))?
            .map_err(|e| Status::invalid_argument(format!("not a checkpoint archive: {e}")))?;
        let base = self.checkpoint_base_image(&dump).ok_or_else(|| {
            Status::not_found(format!(
                "the image {:?} ({}) of checkpoint {image} is not pulled: pull it first",
                dump.rootfs_image_name, dump.rootfs_image_ref
            ))
        })?;
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

    /// The checkpoint's base image by name, as long as the name still means the image
    /// checkpointed (its ID); by ID otherwise.
    fn checkpoint_base_image(
        &self,
        dump: &crate::checkpoint::ContainerConfigDump,
    ) -> Option<String> {
        let by_id = (!dump.rootfs_image_ref.is_empty())
            .then(|| self.images.resolve(&dump.rootfs_image_ref))
            .flatten();
        for name in [&dump.rootfs_image_name, &dump.rootfs_image] {
            if name.is_empty() {
                continue;
            }
            if let Some(image) = self.images.resolve(name)
                && by_id.as_ref().is_none_or(|wanted| wanted.id == image.id)
            {
                return Some(name.clone());
            }
        }
        by_id.map(|image| image.id)
    }

    /// Before a restored container's task is made (and its rootfs mounted): the archive
    /// unpacked into its root dir, its writable-layer changes replayed on the container's
    /// layer (owners shifted into the pod's range when it has its own user namespace), and
    /// the task options that have the runtime restore the process from the CRIU images.
    /// The unpacked archive stays until [`Self::finish_restore`] (runc's Go shim restores
    /// at start); on failure, nothing is left.
    pub(crate) async fn prepare_restore(
        &self,
        container: &Container,
        archive: &Path,
    ) -> Result<prost_types::Any, String> {
        let id = container.id();
        let runtime = self
            .sandboxes
            .get(&container.metadata.sandbox_id)
            .ok()
            .flatten()
            .and_then(|s| self.config.runtime(&s.metadata().runtime_handler).cloned())
            .ok_or_else(|| format!("the pod of container {id} has no runtime handler"))?;
        let upper = self
            .writable_layer(container)
            .await
            .ok_or_else(|| format!("container {id} has no writable layer to restore into"))?;
        let dest = self.container_root_dir(id).join(RESTORE_DIR);
        let images = dest.join(crate::checkpoint::CHECKPOINT_DIR);
        let options =
            super::sandbox_run::runc_options(&runtime, Some(&images)).ok_or_else(|| {
                format!(
                    "runtime {:?} cannot restore a checkpoint",
                    runtime.runtime_type
                )
            })?;
        let shift = self
            .container_user_namespace(container)
            .map(|pod| pod.mappings);
        let (archive, unpack_dest) = (archive.to_path_buf(), dest.clone());
        let unpacked = tokio::task::spawn_blocking(move || {
            let _ = std::fs::remove_dir_all(&unpack_dest);
            let unpacked = crate::checkpoint::unpack_for_restore(&archive, &unpack_dest)?;
            crate::checkpoint::apply_rootfs_diff(
                unpacked.rootfs_diff.as_deref(),
                &unpacked.deleted,
                &upper,
            )?;
            if let Some(mappings) = shift {
                crate::sys::tree::shift_owners(&upper, &mappings).map_err(|e| {
                    CheckpointError::Invalid(format!("shifting the restored files: {e}"))
                })?;
            }
            Ok::<_, CheckpointError>(())
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| format!("unpacking the checkpoint: {e}")));
        if let Err(e) = unpacked {
            self.finish_restore(id);
            return Err(e);
        }
        Ok(options)
    }

    /// After the restored task started (or failed to): the unpacked archive goes.
    pub(crate) fn finish_restore(&self, id: &str) {
        let dir = self.container_root_dir(id).join(RESTORE_DIR);
        if let Err(e) = std::fs::remove_dir_all(&dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(container = id, error = %e, "removing the unpacked checkpoint failed");
        }
    }
}
