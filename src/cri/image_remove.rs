//! `RemoveImage`: removes the image with every name it has (tags, digests, its ID) and lets
//! containerd collect the content. An image that is not there is removed already.

use crate::api::v1::{RemoveImageRequest, RemoveImageResponse};
use tonic::Status;

use crate::cri::CriService;

impl CriService {
    pub async fn remove_image(
        &self,
        req: RemoveImageRequest,
    ) -> Result<RemoveImageResponse, Status> {
        let text = req.image.map(|spec| spec.image).unwrap_or_default();
        if text.is_empty() {
            return Err(Status::invalid_argument("image to remove is required"));
        }
        // Held to the last delete: a pull of the image records its names before or after.
        // Waiting for it ends with the client's deadline, so retries do not pile up behind
        // a change of the image that hangs.
        let none = Default::default();
        let locking = self.images.resolve_locked(&text, &none);
        let locked = match crate::cri::deadline::current() {
            Some(at) => tokio::time::timeout_at(at, locking).await.map_err(|_| {
                Status::deadline_exceeded(format!(
                    "image {text}: another change of it is still in progress"
                ))
            })?,
            None => locking.await,
        };
        let Some(locked) = locked else {
            return Ok(RemoveImageResponse {});
        };
        let image = &locked.image;
        let pods = self.pods_with_image_volume(image);
        if !pods.is_empty() {
            return Err(Status::failed_precondition(format!(
                "image {} is mounted as an image volume of pod(s) {}: stop them first",
                image.id,
                pods.join(", ")
            )));
        }
        // Any of its names, digests or its ID removes the image with every name, as
        // containerd's CRI does (kubelet removes an image once, by whichever name it has).
        // Every name but the last is deleted at once; the last delete collects garbage
        // synchronously, so the content is gone on return.
        let mut names: Vec<String> = image.references.iter().cloned().collect();
        let Some(last) = names.pop() else {
            return Ok(RemoveImageResponse {});
        };
        futures::future::join_all(names.iter().map(|name| self.delete_image_name(name, false)))
            .await
            .into_iter()
            .collect::<Result<Vec<()>, Status>>()?;
        self.delete_image_name(&last, true).await?;
        names.push(last);
        tracing::info!(image = %image.id, removed = ?names, "image removed");
        Ok(RemoveImageResponse {})
    }

    /// Deletes one name of an image. crius forgets the name first: containerd's event of
    /// the delete then finds nothing to follow, and reads nothing back while its garbage
    /// collection runs. A delete that fails reads the record back.
    async fn delete_image_name(&self, name: &str, collect: bool) -> Result<(), Status> {
        self.images.remove_reference(name);
        let deleted = match crate::failpoint::hit("image_delete").await {
            Ok(()) => self
                .containerd
                .delete_image(name, collect)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let Err(e) = deleted else {
            return Ok(());
        };
        if let Err(sync) =
            crate::image::load::sync_record(&self.containerd, &self.images, name).await
        {
            tracing::warn!(image = %name, error = %sync, "cannot read back an image whose removal failed");
        }
        Err(Status::internal(format!(
            "failed to remove image {name}: {e}"
        )))
    }
}
