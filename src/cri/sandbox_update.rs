//! `UpdatePodSandboxResources`: kubelet tells the runtime the pod-level resources after it
//! resized the pod cgroup (in-place pod resize). crius keeps them in the sandbox config (so
//! status and recovery see them) and applies the CPU and memory limits to the pod cgroup,
//! where the pod has one of its own.

use std::path::PathBuf;

use crate::api::v1::{
    LinuxContainerResources, UpdatePodSandboxResourcesRequest, UpdatePodSandboxResourcesResponse,
};
use tonic::Status;

use super::record::sandbox_metadata_extension as metadata_extension;
use super::sandbox::internal;
use crate::cri::CriService;
use crate::stats::cgroup::{CgroupLimits, parent_of};
use crate::store::SandboxMetadata;

impl CriService {
    pub async fn update_pod_sandbox_resources(
        &self,
        req: UpdatePodSandboxResourcesRequest,
    ) -> Result<UpdatePodSandboxResourcesResponse, Status> {
        let sandbox = self.find_sandbox(&req.pod_sandbox_id)?.ok_or_else(|| {
            Status::not_found(format!("pod sandbox {:?} not found", req.pod_sandbox_id))
        })?;
        check_pod_resources(req.resources.as_ref(), req.overhead.as_ref())?;
        let _lifecycle = sandbox.lifecycle.lock().await;
        if !self.is_sandbox_stored(&sandbox) {
            return Err(Status::not_found(format!(
                "pod sandbox {} was removed",
                sandbox.id()
            )));
        }
        let mut updated = sandbox.metadata();
        set_pod_resources(&mut updated, &req);
        // Applied first: resources the pod cgroup refused are not recorded as the pod's.
        if let Some(resources) = req.resources.as_ref() {
            self.apply_pod_limits(&updated, resources, req.overhead.as_ref())
                .await?;
        }
        self.containerd
            .update_container_extensions(&updated.id, metadata_extension(&updated)?)
            .await
            .map_err(internal)?;
        sandbox.update_metadata(|metadata| set_pod_resources(metadata, &req));
        Ok(UpdatePodSandboxResourcesResponse {})
    }

    /// Writes the pod's limits to its cgroup, when it has one of its own (kubelet makes it).
    async fn apply_pod_limits(
        &self,
        metadata: &SandboxMetadata,
        resources: &LinuxContainerResources,
        overhead: Option<&LinuxContainerResources>,
    ) -> Result<(), Status> {
        let cgroup_parent =
            (metadata.config.linux.as_ref()).map_or("", |l| l.cgroup_parent.as_str());
        let (Some(layout), Some(pod_cgroup)) = (
            self.host.cgroups.clone(),
            own_pod_cgroup(cgroup_parent, &metadata.cgroups_path),
        ) else {
            return Ok(());
        };
        let limits = pod_limits(resources, overhead);
        tokio::task::spawn_blocking(move || layout.apply_limits(&pod_cgroup, &limits))
            .await
            .map_err(internal)?
            .map_err(|e| {
                let message = format!("applying resources to pod {}: {e}", metadata.id);
                // No pod cgroup (kubelet makes it; a stopped pod may have lost it).
                if e.kind() == std::io::ErrorKind::NotFound {
                    Status::failed_precondition(message)
                } else {
                    Status::internal(message)
                }
            })
    }
}

/// The pod's own cgroup: the parent of its cgroups path, where kubelet gave one and it is
/// not the host's root (a pod placed at `/` has no cgroup of its own, and crius never sets
/// the node's limits).
fn own_pod_cgroup(cgroup_parent: &str, cgroups_path: &str) -> Option<PathBuf> {
    let cgroup = parent_of(cgroups_path);
    (!cgroup_parent.is_empty() && cgroup != std::path::Path::new("/")).then_some(cgroup)
}

/// The request's resources and overhead (those it sets) in the pod's config.
fn set_pod_resources(metadata: &mut SandboxMetadata, req: &UpdatePodSandboxResourcesRequest) {
    let linux = metadata.config.linux.get_or_insert_with(Default::default);
    if req.overhead.is_some() {
        linux.overhead = req.overhead.clone();
    }
    if req.resources.is_some() {
        linux.resources = req.resources.clone();
    }
}

/// The pod cgroup's limits: the containers' sum plus the pod overhead; zero means unset.
fn pod_limits(
    resources: &LinuxContainerResources,
    overhead: Option<&LinuxContainerResources>,
) -> CgroupLimits {
    let extra = overhead.cloned().unwrap_or_default();
    let positive = |v: i64| (v > 0).then_some(v);
    // Saturating: a limit and an overhead near i64::MAX add up to "unlimited", not a panic.
    CgroupLimits {
        cpu_shares: positive(resources.cpu_shares.saturating_add(extra.cpu_shares))
            .map(|v| v as u64),
        cpu_quota: positive(resources.cpu_quota).map(|q| q.saturating_add(extra.cpu_quota.max(0))),
        cpu_period: positive(resources.cpu_period).map(|v| v as u64),
        memory_limit: positive(resources.memory_limit_in_bytes)
            .map(|m| m.saturating_add(extra.memory_limit_in_bytes.max(0))),
    }
}

/// Pod-level resources and overhead hold the same kinds of values as a container's: the same
/// checks, before anything is stored or written.
pub(crate) fn check_pod_resources(
    resources: Option<&crate::api::v1::LinuxContainerResources>,
    overhead: Option<&crate::api::v1::LinuxContainerResources>,
) -> Result<(), Status> {
    for (what, r) in [("resources", resources), ("overhead", overhead)] {
        if let Some(r) = r {
            crate::oci::container::check_resources(r)
                .map_err(|e| Status::invalid_argument(format!("pod {what}: {e}")))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_pod_cgroup_below_the_root_is_the_pods_own() {
        assert_eq!(
            own_pod_cgroup("/kubepods/pod1", "/kubepods/pod1/abc"),
            Some(PathBuf::from("/kubepods/pod1"))
        );
        assert_eq!(own_pod_cgroup("/", "/abc"), None, "the host's root");
        assert_eq!(own_pod_cgroup("-.slice", "-.slice:crius:abc"), None);
        assert_eq!(own_pod_cgroup("", "/abc"), None, "no parent given");
    }

    #[test]
    fn overhead_adds_to_the_pod_limits_and_zero_stays_unset() {
        let resources = LinuxContainerResources {
            cpu_shares: 512,
            cpu_quota: 50_000,
            cpu_period: 100_000,
            memory_limit_in_bytes: 100 << 20,
            ..Default::default()
        };
        let overhead = LinuxContainerResources {
            cpu_shares: 2,
            cpu_quota: 10_000,
            memory_limit_in_bytes: 10 << 20,
            ..Default::default()
        };
        assert_eq!(
            pod_limits(&resources, Some(&overhead)),
            CgroupLimits {
                cpu_shares: Some(514),
                cpu_quota: Some(60_000),
                cpu_period: Some(100_000),
                memory_limit: Some(110 << 20),
            }
        );
        assert_eq!(
            pod_limits(&LinuxContainerResources::default(), Some(&overhead)),
            CgroupLimits {
                cpu_shares: Some(2),
                ..Default::default()
            }
        );
    }

    #[test]
    fn a_limit_and_an_overhead_near_the_maximum_do_not_overflow() {
        let huge = LinuxContainerResources {
            cpu_quota: i64::MAX,
            memory_limit_in_bytes: i64::MAX,
            ..Default::default()
        };
        let limits = pod_limits(&huge, Some(&huge));
        assert_eq!(limits.memory_limit, Some(i64::MAX));
        assert_eq!(limits.cpu_quota, Some(i64::MAX));
    }
}
