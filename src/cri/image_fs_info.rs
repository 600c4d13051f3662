//! `ImageFsInfo`: usage of the snapshotter's directory below containerd's root.

use crate::api::v1::{
    FilesystemIdentifier, FilesystemUsage, ImageFsInfoRequest, ImageFsInfoResponse, UInt64Value,
};
use tonic::Status;

use super::unix_nanos;
use crate::server::CriService;

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
        Ok(ImageFsInfoResponse {
            image_filesystems: vec![FilesystemUsage {
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
            }],
            container_filesystems: Vec::new(),
        })
    }
}
