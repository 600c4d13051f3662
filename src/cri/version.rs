//! `Version`.

use crate::api::v1::{VersionRequest, VersionResponse};
use tonic::Status;

use super::{RUNTIME_API_VERSION, RUNTIME_NAME};
use crate::cri::CriService;

/// The version of the kubelet runtime API that `Version` reports.
const KUBE_API_VERSION: &str = "0.1.0";

impl CriService {
    pub async fn version(&self, _req: VersionRequest) -> Result<VersionResponse, Status> {
        Ok(VersionResponse {
            version: KUBE_API_VERSION.to_string(),
            runtime_name: RUNTIME_NAME.to_string(),
            runtime_version: env!("CARGO_PKG_VERSION").to_string(),
            runtime_api_version: RUNTIME_API_VERSION.to_string(),
        })
    }
}
