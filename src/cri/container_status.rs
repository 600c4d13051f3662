//! `ContainerStatus` and `ListContainers`.

use std::collections::HashMap;
use std::sync::Arc;

use crate::api::v1::{
    Container as CriContainer, ContainerResources, ContainerStatus as CriStatus,
    ContainerStatusRequest, ContainerStatusResponse, ContainerUser, ImageSpec,
    ListContainersRequest, ListContainersResponse,
};
use tonic::Status;

use super::container::{cri_state, cri_stop_signal};
use super::sandbox_status::labels_match;
use crate::cri::CriService;
use crate::store::{Container, RecordView};

/// The verbose `info` of a container, with containerd's CRI's keys.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ContainerInfo<'a> {
    #[serde(rename = "sandboxID")]
    sandbox_id: &'a str,
    pid: u32,
    snapshot_key: &'a str,
    snapshotter: &'a str,
    runtime_type: Option<&'a str>,
    config: &'a crate::api::v1::ContainerConfig,
    runtime_spec: Option<&'a serde_json::value::RawValue>,
}

impl CriService {
    /// `image_ref` as containerd reports it: the image's repo digest when it has one.
    fn image_ref(&self, container: &Container) -> String {
        self.images
            .get(&container.metadata.image_ref)
            .and_then(|image| image.repo_digests().into_iter().next())
            .unwrap_or_else(|| container.metadata.image_ref.clone())
    }

    fn image_spec(container: &Container) -> Option<ImageSpec> {
        // The config's spec as kubelet sent it (user_specified_image, runtime_handler and
        // annotations carried through), naming the image as the client did.
        let mut spec = container.metadata.config.image.clone().unwrap_or_default();
        spec.image = container.metadata.image_name.clone();
        Some(spec)
    }

    pub async fn container_status(
        &self,
        req: ContainerStatusRequest,
    ) -> Result<ContainerStatusResponse, Status> {
        let container = self.require_container(&req.container_id)?;
        let mut info = HashMap::new();
        if req.verbose {
            info.insert("info".to_string(), self.container_info(&container).await);
        }
        Ok(ContainerStatusResponse {
            status: Some(self.container_cri_status(&container)),
            info,
        })
    }

    /// A container as the CRI shows it.
    pub(crate) fn container_cri_status(&self, container: &Container) -> CriStatus {
        let metadata = &container.metadata;
        let status = container.status();
        let config = &metadata.config;
        CriStatus {
            id: metadata.id.clone(),
            metadata: config.metadata.clone(),
            state: cri_state(status.state),
            created_at: status.created_at,
            started_at: status.started_at,
            finished_at: status.finished_at,
            exit_code: status.exit_code,
            image: Self::image_spec(container),
            image_ref: self.image_ref(container),
            reason: status.reason.clone(),
            message: status.message.clone(),
            labels: config.labels.clone(),
            annotations: config.annotations.clone(),
            mounts: config.mounts.clone(),
            log_path: metadata.log_path.clone(),
            // Always there, as containerd reports them from the spec (zeros for limits the
            // container does not have): clients such as containerd's own tests require it.
            resources: Some(ContainerResources {
                linux: Some(container.resources().unwrap_or_default()),
                windows: None,
            }),
            image_id: metadata.image_ref.clone(),
            user: metadata
                .user
                .clone()
                .map(|linux| ContainerUser { linux: Some(linux) }),
            stop_signal: cri_stop_signal(&metadata.stop_signal) as i32,
        }
    }

    /// The verbose `info` of a container, as containerd's CRI reports it: from the record
    /// kept in memory, read from containerd only when crius has none.
    async fn container_info(&self, container: &Arc<Container>) -> String {
        let view = match container.record() {
            Some(view) => Some(view),
            None => self.read_record_view(container.id()).await.map(Arc::new),
        };
        let info = ContainerInfo {
            sandbox_id: &container.metadata.sandbox_id,
            pid: container.status().pid,
            snapshot_key: container.id(),
            snapshotter: self.snapshotter_of(&container.metadata.snapshotter),
            runtime_type: view.as_ref().map(|v| v.runtime_type.as_str()),
            config: &container.metadata.config,
            runtime_spec: view.as_ref().map(|v| &*v.spec),
        };
        serde_json::to_string(&info).unwrap_or_default()
    }

    async fn read_record_view(&self, id: &str) -> Option<RecordView> {
        let record = self.containerd.get_container(id).await.ok().flatten()?;
        let runtime_type = record.runtime.as_ref().map_or("", |r| r.name.as_str());
        RecordView::new(runtime_type, &record.spec?.value)
    }

    pub async fn list_containers(
        &self,
        req: ListContainersRequest,
    ) -> Result<ListContainersResponse, Status> {
        let filter = req.filter.unwrap_or_default();
        let wanted_id = if filter.id.is_empty() {
            None
        } else {
            match self.containers.get(&filter.id) {
                Ok(Some(c)) => Some(c.id().to_string()),
                _ => return Ok(ListContainersResponse::default()),
            }
        };
        let wanted_sandbox = if filter.pod_sandbox_id.is_empty() {
            None
        } else {
            match self.sandboxes.get(&filter.pod_sandbox_id) {
                Ok(Some(s)) => Some(s.id()),
                _ => return Ok(ListContainersResponse::default()),
            }
        };
        let containers = self
            .containers
            .list()
            .into_iter()
            .filter(|c| wanted_id.as_deref().is_none_or(|id| id == c.id()))
            .filter(|c| {
                wanted_sandbox
                    .as_deref()
                    .is_none_or(|s| s == c.metadata.sandbox_id)
            })
            .filter_map(|c| {
                let state = cri_state(c.status().state);
                if filter.state.as_ref().is_some_and(|s| s.state != state) {
                    return None;
                }
                let config = &c.metadata.config;
                if !labels_match(&config.labels, &filter.label_selector) {
                    return None;
                }
                Some(CriContainer {
                    id: c.id().to_string(),
                    pod_sandbox_id: c.metadata.sandbox_id.clone(),
                    metadata: config.metadata.clone(),
                    image: Self::image_spec(&c),
                    image_ref: self.image_ref(&c),
                    state,
                    created_at: c.metadata.created_at,
                    labels: config.labels.clone(),
                    annotations: config.annotations.clone(),
                    image_id: c.metadata.image_ref.clone(),
                })
            })
            .collect();
        Ok(ListContainersResponse { containers })
    }
}
