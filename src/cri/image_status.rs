//! `ListImages` and `ImageStatus`.

use std::collections::HashMap;

use crate::api::v1::{
    Image as CriImage, ImageSpec, ImageStatusRequest, ImageStatusResponse, Int64Value,
    ListImagesRequest, ListImagesResponse,
};
use tonic::Status;

use crate::cri::CriService;
use crate::store::Image;

impl CriService {
    pub async fn list_images(&self, req: ListImagesRequest) -> Result<ListImagesResponse, Status> {
        let wanted = req
            .filter
            .and_then(|f| f.image)
            .map(|spec| spec.image)
            .unwrap_or_default();
        let images = if wanted.is_empty() {
            self.images.list()
        } else {
            self.images.resolve(&wanted).into_iter().collect()
        };
        Ok(ListImagesResponse {
            images: images.iter().map(|i| self.to_cri_image(i)).collect(),
        })
    }

    pub async fn image_status(
        &self,
        req: ImageStatusRequest,
    ) -> Result<ImageStatusResponse, Status> {
        let text = req.image.map(|spec| spec.image).unwrap_or_default();
        if text.is_empty() {
            return Err(Status::invalid_argument("image is required"));
        }
        let Some(image) = self.images.resolve(&text) else {
            return Ok(ImageStatusResponse::default());
        };
        let mut info = HashMap::new();
        if req.verbose {
            let details = serde_json::json!({
                "chainID": image.chain_id,
                "imageSpec": image.config,
                "references": image.references,
            });
            info.insert("info".to_string(), details.to_string());
        }
        Ok(ImageStatusResponse {
            image: Some(self.to_cri_image(&image)),
            info,
        })
    }

    /// Whether the image is pinned: one of its records says so, or one of its names is a
    /// pinned (sandbox) image of crius's config.
    pub(crate) fn is_pinned(&self, image: &Image) -> bool {
        !image.pinned_references.is_empty()
            || image
                .references
                .iter()
                .any(|r| self.pinned_images.contains(r))
    }

    fn to_cri_image(&self, image: &Image) -> CriImage {
        let (uid, username) = user_of(&image.config.config.user);
        CriImage {
            id: image.id.clone(),
            repo_tags: image.repo_tags(),
            repo_digests: image.repo_digests(),
            size: image.size,
            uid: uid.map(|value| Int64Value { value }),
            username,
            spec: Some(ImageSpec {
                image: image.id.clone(),
                ..Default::default()
            }),
            pinned: self.is_pinned(image),
        }
    }
}

/// The image config's `User` as CRI reports it: a numeric uid, or a user name.
fn user_of(user: &str) -> (Option<i64>, String) {
    let name = user.split(':').next().unwrap_or_default();
    if name.is_empty() {
        return (None, String::new());
    }
    match name.parse::<i64>() {
        Ok(uid) => (Some(uid), String::new()),
        Err(_) => (None, name.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::user_of;

    #[test]
    fn user_is_a_uid_or_a_name() {
        assert_eq!(user_of(""), (None, String::new()));
        assert_eq!(user_of("1000"), (Some(1000), String::new()));
        assert_eq!(user_of("1000:1000"), (Some(1000), String::new()));
        assert_eq!(user_of("nobody"), (None, "nobody".to_string()));
        assert_eq!(user_of("nobody:nogroup"), (None, "nobody".to_string()));
    }
}
