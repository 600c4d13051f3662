//! `RemoveImage`: removes the image with every name it has (tags, digests, its ID) and lets
//! containerd collect the content. An image that is not there is removed already.

use crate::api::v1::{RemoveImageRequest, RemoveImageResponse};
use tonic::Status;

use crate::server::CriService;

impl CriService {
    pub async fn remove_image(
        &self,
        req: RemoveImageRequest,
    ) -> Result<RemoveImageResponse, Status> {
        let text = req.image.map(|spec| spec.image).unwrap_or_default();
        if text.is_empty() {
            return Err(Status::invalid_argument("image to remove is required"));
        }
        let Some(image) = self.images.resolve(&text) else {
            return Ok(RemoveImageResponse {});
        };
        let pods = self.pods_with_image_volume(&image.id);
        if !pods.is_empty() {
            return Err(Status::failed_precondition(format!(
                "image {} is mounted as an image volume of pod(s) {}: stop them first",
                image.id,
                pods.join(", ")
            )));
        }
        // Any of its names, digests or its ID removes the image with every name, as
        // containerd's CRI does (kubelet removes an image once, by whichever name it has).
        let names: Vec<String> = image.references.iter().cloned().collect();
        let last = names.len().saturating_sub(1);
        for (i, name) in names.iter().enumerate() {
            // The last delete collects garbage synchronously, so the content is gone on return.
            self.containerd
                .delete_image(name, i == last)
                .await
                .map_err(|e| Status::internal(format!("failed to remove image {name}: {e}")))?;
            self.images.remove_reference(name);
        }
        tracing::info!(image = %image.id, removed = ?names, "image removed");
        Ok(RemoveImageResponse {})
    }
}
