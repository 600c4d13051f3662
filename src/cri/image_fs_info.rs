//! `ImageFsInfo`: usage of the snapshotter's directory below containerd's root, which holds
//! the images and the containers' writable layers.

use crate::api::v1::{
    FilesystemIdentifier, FilesystemUsage, ImageFsInfoRequest, ImageFsInfoResponse, UInt64Value,
};
use tonic::Status;

use super::unix_nanos;
use crate::cri::CriService;

impl CriService {
    pub async fn image_fs_info(
        &self,
        _req: ImageFsInfoRequest,
    ) -> Result<ImageFsInfoResponse, Status> {
        let path = self.image_fs.path();
        let usage = self.image_fs.usage().await.map_err(|e| {
            Status::failed_precondition(format!(
                "cannot measure the image filesystem {}: {e} (is containerd.root {} and \
                 containerd.snapshotter {:?} right?)",
                path.display(),
                self.config.containerd.root.display(),
                self.config.containerd.snapshotter,
            ))
        })?;
        let filesystem = FilesystemUsage {
            timestamp: unix_nanos(usage.timestamp),
            fs_id: Some(FilesystemIdentifier {
                mountpoint: path.display().to_string(),
            }),
            used_bytes: Some(UInt64Value {
                value: usage.used_bytes,
            }),
            inodes_used: Some(UInt64Value {
                value: usage.inodes_used,
            }),
        };
        // The writable layers live in the same snapshotter as the images: kubelet sees one
        // filesystem for both (no split image filesystem).
        Ok(ImageFsInfoResponse {
            image_filesystems: vec![filesystem.clone()],
            container_filesystems: vec![filesystem],
        })
    }
}
