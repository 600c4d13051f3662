//! `RemoveImage`: removes every name of the image (a pinned image keeps its pinned names
//! when asked to remove another name) and lets containerd collect the content.

use k8s_cri::v1::{RemoveImageRequest, RemoveImageResponse};
use tonic::Status;

use crate::image::reference::Reference;
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
        let named = if image.references.contains(&text) {
            Some(text.clone())
        } else {
            Reference::parse(&text)
                .ok()
                .map(|r| r.to_string())
                .filter(|r| image.references.contains(r))
        };
        let names: Vec<String> = match named {
            // Removing one name of the sandbox image must not take the image away.
            Some(name) if self.is_pinned(&image) && !self.pinned_images.contains(&name) => {
                vec![name]
            }
            _ => image.references.iter().cloned().collect(),
        };
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
