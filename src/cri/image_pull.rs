//! `PullImage`.

use crate::api::v1::{AuthConfig, PullImageRequest, PullImageResponse};
use tonic::Status;

use crate::cri::CriService;
use crate::image::auth::Credentials;
use crate::imagespec::reference::{DEFAULT_DOMAIN, Reference};

impl CriService {
    pub async fn pull_image(&self, req: PullImageRequest) -> Result<PullImageResponse, Status> {
        let spec = req.image.unwrap_or_default();
        let text = spec.image;
        if text.is_empty() {
            return Err(Status::invalid_argument("image to pull is required"));
        }
        let reference =
            Reference::parse(&text).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let credentials = match req.auth {
            Some(auth) => request_credentials(&auth, &reference)?,
            None => None,
        };
        let handler = pull_runtime_handler(&spec.runtime_handler, req.sandbox_config.as_ref());
        let snapshotter = self.config.snapshotter_for(handler);
        let image = self
            .puller
            .pull(
                &reference,
                credentials,
                snapshotter,
                crate::cri::deadline::current(),
            )
            .await
            .map_err(|failure| Status::new(failure.code, failure.message))?;
        // The puller has recorded the image in the store.
        Ok(PullImageResponse {
            image_ref: image.id,
        })
    }
}

/// The pod annotation containerd's CRI read the runtime handler of a pull from before the
/// CRI carried it in the image spec; it still reads it when the spec names none.
const RUNTIME_HANDLER_ANNOTATION: &str = "io.containerd.cri.runtime-handler";

/// The runtime handler a pull is for: the image spec's, else the pod's annotation, else
/// none (the default handler).
fn pull_runtime_handler<'a>(
    spec_handler: &'a str,
    sandbox: Option<&'a crate::api::v1::PodSandboxConfig>,
) -> &'a str {
    if !spec_handler.is_empty() {
        return spec_handler;
    }
    sandbox
        .and_then(|s| s.annotations.get(RUNTIME_HANDLER_ANNOTATION))
        .map_or("", String::as_str)
}

/// The request's credentials, unless they name another registry than the image's.
fn request_credentials(
    auth: &AuthConfig,
    reference: &Reference,
) -> Result<Option<Credentials>, Status> {
    if !auth.server_address.is_empty() && !same_registry(&auth.server_address, &reference.domain) {
        tracing::debug!(server = %auth.server_address, image = %reference, "ignoring credentials for another registry");
        return Ok(None);
    }
    let creds = Credentials::from_parts(
        &auth.username,
        &auth.password,
        &auth.auth,
        &auth.identity_token,
        &auth.registry_token,
    )
    .map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok((!creds.is_empty()).then_some(creds))
}

/// Whether a credential's server address (`https://host/v1/`, `host`) is the registry.
fn same_registry(server_address: &str, registry: &str) -> bool {
    let host = server_address
        .split_once("://")
        .map(|(_, rest)| rest)
        .unwrap_or(server_address);
    let host = host.split('/').next().unwrap_or(host);
    let hub = |h: &str| {
        matches!(
            h,
            DEFAULT_DOMAIN | "index.docker.io" | "registry-1.docker.io"
        )
    };
    host == registry || (hub(host) && hub(registry))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_address_must_name_the_registry() {
        assert!(same_registry("https://index.docker.io/v1/", "docker.io"));
        assert!(same_registry("127.0.0.1:5010", "127.0.0.1:5010"));
        assert!(same_registry("http://127.0.0.1:5010/", "127.0.0.1:5010"));
        assert!(!same_registry("quay.io", "docker.io"));
    }
}
