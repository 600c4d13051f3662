//! `PodSandboxStatus` and `ListPodSandbox`.

use std::collections::HashMap;
use std::sync::Arc;

use crate::api::v1::{
    LinuxPodSandboxStatus, ListPodSandboxRequest, ListPodSandboxResponse, Namespace, PodIp,
    PodSandbox, PodSandboxNetworkStatus, PodSandboxState as CriState, PodSandboxStatus,
    PodSandboxStatusRequest, PodSandboxStatusResponse,
};
use tonic::Status;

use super::unix_nanos;
use crate::cri::CriService;
use crate::store::{Sandbox, SandboxState};

fn cri_state(state: SandboxState) -> i32 {
    match state {
        SandboxState::Ready => CriState::SandboxReady as i32,
        SandboxState::NotReady | SandboxState::Creating => CriState::SandboxNotready as i32,
    }
}

/// Whether every `selector` label is on the object with the same value.
pub fn labels_match(labels: &HashMap<String, String>, selector: &HashMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// How long the verbose status waits for the shim to report the pause task's state.
const TASK_STATE_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(300);

impl CriService {
    pub async fn pod_sandbox_status(
        &self,
        req: PodSandboxStatusRequest,
    ) -> Result<PodSandboxStatusResponse, Status> {
        let sandbox = self
            .find_sandbox(&req.pod_sandbox_id)?
            .filter(|s| s.status().state != SandboxState::Creating)
            .ok_or_else(|| {
                Status::not_found(format!("pod sandbox {:?} not found", req.pod_sandbox_id))
            })?;
        let mut info = HashMap::new();
        if req.verbose {
            info.insert(
                "info".to_string(),
                self.sandbox_info(&sandbox).await.to_string(),
            );
        }
        Ok(PodSandboxStatusResponse {
            status: Some(sandbox_cri_status(&sandbox)),
            info,
            containers_statuses: Vec::new(),
            timestamp: unix_nanos(std::time::SystemTime::now()),
        })
    }

    /// The verbose `info` of a sandbox, as containerd's CRI reports it.
    async fn sandbox_info(&self, sandbox: &Arc<Sandbox>) -> serde_json::Value {
        let metadata = sandbox.metadata();
        let status = sandbox.status();
        // The record and the task's state are independent: one round trip's wait, not two.
        // The state comes from the shim; a hung shim must not hang the status.
        let (record, task) = tokio::join!(
            self.containerd.get_container(&metadata.id),
            tokio::time::timeout(TASK_STATE_TIMEOUT, self.containerd.task_state(&metadata.id)),
        );
        let spec = record
            .ok()
            .flatten()
            .as_ref()
            .and_then(|c| c.spec.as_ref())
            .and_then(|any| serde_json::from_slice::<serde_json::Value>(&any.value).ok());
        let process_status = match task {
            Ok(Ok(Some(task))) => format!("{:?}", task.status).to_lowercase(),
            Ok(Ok(None)) => "deleted".to_string(),
            Ok(Err(_)) | Err(_) => "unknown".to_string(),
        };
        serde_json::json!({
            "pid": status.pid,
            "processStatus": process_status,
            // Looked at now, as containerd's CRI does: someone may have unmounted it.
            "netNamespaceClosed": status.netns_closed
                || (!metadata.netns_path.is_empty()
                    && !crate::sys::netns::is_pinned(std::path::Path::new(&metadata.netns_path))),
            "netNamespace": metadata.netns_path,
            "image": metadata.image,
            "snapshotKey": if metadata.held { "" } else { metadata.id.as_str() },
            "held": metadata.held,
            "snapshotter": self.snapshotter_of(&metadata.snapshotter),
            "runtimeHandler": metadata.runtime_handler,
            "runtimeType": metadata.runtime_type,
            "config": metadata.config,
            "runtimeSpec": spec,
            // containerd's CRI's shape (go-cni's merged result), and crius's own per network.
            "cniResult": crate::cni::result::go_cni_result(
                &metadata.networks.iter().map(|n| n.result.value()).collect::<Vec<_>>()
            ),
            "cniResults": metadata.networks,
        })
    }

    pub async fn list_pod_sandbox(
        &self,
        req: ListPodSandboxRequest,
    ) -> Result<ListPodSandboxResponse, Status> {
        let filter = req.filter.unwrap_or_default();
        let wanted_id = if filter.id.is_empty() {
            None
        } else {
            match self.sandboxes.get(&filter.id) {
                Ok(Some(sandbox)) => Some(sandbox.id()),
                // An unknown or ambiguous prefix matches nothing.
                _ => return Ok(ListPodSandboxResponse { items: Vec::new() }),
            }
        };
        let items = self
            .sandboxes
            .list()
            .into_iter()
            .filter_map(|sandbox| {
                let status = sandbox.status();
                if status.state == SandboxState::Creating {
                    return None;
                }
                let metadata = sandbox.metadata();
                if wanted_id.as_ref().is_some_and(|id| id != &metadata.id) {
                    return None;
                }
                let state = cri_state(status.state);
                if filter.state.as_ref().is_some_and(|s| s.state != state) {
                    return None;
                }
                if !labels_match(&metadata.config.labels, &filter.label_selector) {
                    return None;
                }
                Some(PodSandbox {
                    id: metadata.id.clone(),
                    metadata: metadata.config.metadata.clone(),
                    state,
                    created_at: metadata.created_at,
                    labels: metadata.config.labels.clone(),
                    annotations: metadata.config.annotations.clone(),
                    runtime_handler: metadata.runtime_handler.clone(),
                })
            })
            .collect();
        Ok(ListPodSandboxResponse { items })
    }
}

/// A sandbox as the CRI shows it.
pub(crate) fn sandbox_cri_status(sandbox: &Sandbox) -> PodSandboxStatus {
    let metadata = sandbox.metadata();
    let status = sandbox.status();
    let config = &metadata.config;
    let namespace_options = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.clone());
    PodSandboxStatus {
        id: metadata.id.clone(),
        metadata: config.metadata.clone(),
        state: cri_state(status.state),
        created_at: metadata.created_at,
        network: Some(PodSandboxNetworkStatus {
            ip: metadata.ips.first().cloned().unwrap_or_default(),
            additional_ips: metadata
                .ips
                .iter()
                .skip(1)
                .map(|ip| PodIp { ip: ip.clone() })
                .collect(),
        }),
        linux: Some(LinuxPodSandboxStatus {
            namespaces: Some(Namespace {
                options: namespace_options,
            }),
        }),
        labels: config.labels.clone(),
        annotations: config.annotations.clone(),
        runtime_handler: metadata.runtime_handler.clone(),
    }
}
