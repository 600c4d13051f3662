//! `UpdateContainerResources`: new cgroup limits for a running task, kept in the stored
//! spec and metadata so they survive a restart of the container or of crius.

use crate::api::v1::{UpdateContainerResourcesRequest, UpdateContainerResourcesResponse};
use tonic::Status;

use super::record::container_metadata_extension as metadata_extension;
use super::sandbox::internal;
use crate::api::v1::LinuxContainerResources;
use crate::cri::CriService;
use crate::oci::container::linux_resources;
use crate::store::{ContainerMetadata, ContainerState, RecordView};

/// The type URL of OCI Linux resources, as containerd's task update expects them.
const RESOURCES_TYPE_URL: &str = "types.containerd.io/opencontainers/runtime-spec/1/LinuxResources";

impl CriService {
    pub async fn update_container_resources(
        &self,
        req: UpdateContainerResourcesRequest,
    ) -> Result<UpdateContainerResourcesResponse, Status> {
        let container = self.require_container(&req.container_id)?;
        let linux = req
            .linux
            .ok_or_else(|| Status::invalid_argument("linux resources are required"))?;
        let _lifecycle = container.lifecycle.lock().await;
        let id = container.id().to_string();
        let state = container.status().state;
        if !matches!(state, ContainerState::Created | ContainerState::Running) {
            return Err(Status::failed_precondition(format!(
                "container {id} is {state:?}: only created or running containers can be updated"
            )));
        }
        let new_resources = linux_resources(Some(&linux))
            .map_err(|e| Status::invalid_argument(format!("invalid resources: {e}")))?;
        super::validate::unified_resources(Some(&linux), self.host.cgroups.as_ref())?;

        // The spec and crius's metadata change in one update of the record, before the
        // task's, and both go back if the task refuses (as containerd's CRI puts its spec
        // back): the record never says what the task does not run with.
        let kept_spec = self.stored_spec(&id).await?;
        let kept_metadata = metadata_extension(&with_resources_in_config(
            &container.metadata,
            container.resources(),
        ))?;
        let (spec, resources) = with_resources(&kept_spec, &new_resources)?;
        let metadata = metadata_extension(&with_resources_in_config(
            &container.metadata,
            Some(linux.clone()),
        ))?;
        let spec_bytes = self.store_record(&id, &spec, metadata).await?;
        if state == ContainerState::Running
            && let Err(e) = self.apply_task_resources(&id, &resources).await
        {
            if let Err(restore) = self.store_record(&id, &kept_spec, kept_metadata).await {
                tracing::warn!(container = %id, error = %restore.message(), "cannot put the container's record back after a failed update");
            }
            return Err(e);
        }
        container.set_resources(linux);
        let runtime_type = container.record().map(|view| view.runtime_type.clone());
        container.keep_record(RecordView::new(
            runtime_type.as_deref().unwrap_or_default(),
            &spec_bytes,
        ));
        tracing::info!(container = %id, "container resources updated");
        Ok(UpdateContainerResourcesResponse {})
    }

    /// The container's OCI spec as containerd keeps it.
    async fn stored_spec(&self, id: &str) -> Result<serde_json::Value, Status> {
        let record = self
            .containerd
            .get_container(id)
            .await
            .map_err(internal)?
            .ok_or_else(|| Status::not_found(format!("containerd has no container {id}")))?;
        record
            .spec
            .as_ref()
            .map(|any| serde_json::from_slice(&any.value))
            .transpose()
            .map_err(|e| Status::internal(format!("stored spec of {id}: {e}")))
            .map(Option::unwrap_or_default)
    }

    /// Replaces the container record's spec and crius's metadata in it, in one update;
    /// returns the spec as written.
    async fn store_record(
        &self,
        id: &str,
        spec: &serde_json::Value,
        metadata: std::collections::HashMap<String, prost_types::Any>,
    ) -> Result<Vec<u8>, Status> {
        let value = serde_json::to_vec(spec).map_err(internal)?;
        let spec = prost_types::Any {
            type_url: crate::oci::SPEC_TYPE_URL.to_string(),
            value: value.clone(),
        };
        self.containerd
            .update_container_spec_and_extensions(id, spec, metadata)
            .await
            .map_err(internal)?;
        Ok(value)
    }

    /// Applies `resources` to the running task; a container that exited meanwhile is
    /// FAILED_PRECONDITION.
    async fn apply_task_resources(
        &self,
        id: &str,
        resources: &serde_json::Value,
    ) -> Result<(), Status> {
        let resources = prost_types::Any {
            type_url: RESOURCES_TYPE_URL.to_string(),
            value: serde_json::to_vec(resources).map_err(internal)?,
        };
        let Err(e) = self.containerd.update_task_resources(id, resources).await else {
            return Ok(());
        };
        // The container may have exited since its state was read.
        let code = if self.task_runs(id).await {
            tonic::Code::Internal
        } else {
            tonic::Code::FailedPrecondition
        };
        Err(Status::new(
            code,
            format!("applying resources to {id}: {e}"),
        ))
    }
}

/// The container's metadata with `resources` in its config, as its record keeps it.
fn with_resources_in_config(
    metadata: &ContainerMetadata,
    resources: Option<LinuxContainerResources>,
) -> ContainerMetadata {
    let mut metadata = metadata.clone();
    metadata
        .config
        .linux
        .get_or_insert_with(Default::default)
        .resources = resources;
    metadata
}

/// `spec` with `resources` as its Linux resources (its device rules kept: they are not the
/// CRI's to change here), and those resources as JSON.
fn with_resources(
    spec: &serde_json::Value,
    resources: &oci_spec::runtime::LinuxResources,
) -> Result<(serde_json::Value, serde_json::Value), Status> {
    let mut resources = serde_json::to_value(resources).map_err(internal)?;
    let mut spec = spec.clone();
    if let Some(devices) = spec["linux"]["resources"].get("devices").cloned() {
        resources["devices"] = devices;
    }
    spec["linux"]["resources"] = resources.clone();
    Ok((spec, resources))
}
