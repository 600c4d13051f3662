//! `CreateContainer`: reserve the name, resolve the image (crius does not pull here),
//! prepare the snapshot, build the spec (users from the image's own account files), create
//! the containerd container and the container's FIFOs, and persist its status as CREATED.
//! A failure half-way undoes every step.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::api::v1::{CreateContainerRequest, CreateContainerResponse};
use containerd_client::services::v1::Container as ContainerRecord;
use tonic::Status;

use super::container::metadata_extension;
use super::sandbox::{KIND_CONTAINER, KIND_LABEL, internal, is_host_ipc, new_id};
use super::unix_nanos;
use crate::io::ContainerIo;
use crate::oci::container::{ContainerSpecInput, PodFiles, container_spec};
use crate::oci::user::{cri_user_string, resolve_with_policy};
use crate::oci::{self};
use crate::server::CriService;
use crate::store::{Container, ContainerMetadata, ContainerStatus, SandboxState};
use crate::undo::Undo;

impl CriService {
    /// The pid of the container named as PID namespace target, when the mode is TARGET.
    fn target_pid(&self, config: &crate::api::v1::ContainerConfig) -> Result<Option<u32>, Status> {
        let ns = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.as_ref());
        match ns {
            Some(ns) if ns.pid == crate::api::v1::NamespaceMode::Target as i32 => {
                let target = self.find_container(&ns.target_id)?.ok_or_else(|| {
                    Status::not_found(format!("PID namespace target {:?} not found", ns.target_id))
                })?;
                let status = target.status();
                if status.state != crate::store::ContainerState::Running {
                    return Err(Status::failed_precondition(format!(
                        "PID namespace target {} is not running",
                        target.id()
                    )));
                }
                Ok(Some(status.pid))
            }
            _ => Ok(None),
        }
    }

    /// Whether the OCI runtime of `handler` makes idmapped mounts itself (`features`).
    fn handler_idmaps(&self, handler: &str) -> bool {
        let handler = if handler.is_empty() {
            self.config.containerd.default_runtime.as_str()
        } else {
            handler
        };
        self.handler_features
            .get(handler)
            .is_some_and(|f| f.idmap_mounts)
    }

    /// Refuses what the pod's OCI runtime cannot do, rather than let it be silently ignored.
    fn check_runtime_supports(
        &self,
        config: &crate::api::v1::ContainerConfig,
        handler: &str,
    ) -> Result<(), Status> {
        let handler = if handler.is_empty() {
            self.config.containerd.default_runtime.as_str()
        } else {
            handler
        };
        let features = self
            .handler_features
            .get(handler)
            .copied()
            .unwrap_or_default();
        if let Some(m) = config.mounts.iter().find(|m| m.recursive_read_only)
            && !features.recursive_read_only_mounts
        {
            return Err(Status::invalid_argument(format!(
                "recursive read-only mount {:?}: the OCI runtime of handler {handler:?} does not \
                 support recursive read-only mounts",
                m.container_path
            )));
        }
        Ok(())
    }

    pub async fn create_container(
        &self,
        req: CreateContainerRequest,
    ) -> Result<CreateContainerResponse, Status> {
        let mut config = req
            .config
            .ok_or_else(|| Status::invalid_argument("container config is required"))?;
        let fingerprint = container_fingerprint(&req.pod_sandbox_id, &config);
        let meta = config
            .metadata
            .clone()
            .filter(|m| !m.name.is_empty())
            .ok_or_else(|| Status::invalid_argument("container config must have metadata.name"))?;
        let image_text = config
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .filter(|i| !i.is_empty())
            .ok_or_else(|| Status::invalid_argument("container config must name an image"))?;
        let (image_text, restore_from) = self.restore_source(&mut config, &image_text).await?;
        super::validate::container_config(&config)?;
        super::validate::unified_resources(
            config.linux.as_ref().and_then(|l| l.resources.as_ref()),
            self.cgroups.as_ref(),
        )?;
        let sandbox = self.find_sandbox(&req.pod_sandbox_id)?.ok_or_else(|| {
            Status::not_found(format!("pod sandbox {:?} not found", req.pod_sandbox_id))
        })?;
        // Held while the container is made: a pod being stopped or removed meanwhile would
        // not see the new container, which would outlive it.
        let _pod_lifecycle = sandbox.lifecycle.lock().await;
        let sandbox_meta = sandbox.metadata();
        let sandbox_status = sandbox.status();
        if sandbox_status.state != SandboxState::Ready {
            return Err(Status::failed_precondition(format!(
                "pod sandbox {} is not ready",
                sandbox_meta.id
            )));
        }
        self.check_runtime_supports(&config, &sandbox_meta.runtime_handler)?;
        check_log_path(&config.log_path)?;
        let image = self.images.resolve(&image_text).ok_or_else(|| {
            Status::not_found(format!("image {image_text:?} not found: pull it first"))
        })?;
        let pod = sandbox_meta.config.metadata.clone().unwrap_or_default();
        let name = format!(
            "{}_{}_{}_{}_{}",
            meta.name, pod.name, pod.namespace, pod.uid, meta.attempt
        );
        let id = new_id();
        let containers = self.containers.clone();
        let reserved = super::names::reserve(
            &self.container_names,
            "container",
            &name,
            &id,
            &fingerprint,
            |holder| {
                containers
                    .get(holder)
                    .ok()
                    .flatten()
                    .is_some_and(|c| c.id() == holder)
            },
        )
        .await?;
        if let super::names::Reservation::Existing(existing) = reserved {
            tracing::info!(container = %existing, name, "a retried CreateContainer gets the container it made");
            return Ok(CreateContainerResponse {
                container_id: existing,
            });
        }
        let runtime = self
            .config
            .runtime(&sandbox_meta.runtime_handler)
            .cloned()
            .ok_or_else(|| {
                Status::failed_precondition(format!(
                    "the pod's runtime handler {:?} is no longer configured",
                    sandbox_meta.runtime_handler
                ))
            })?;

        let mut undo = Undo::new();
        {
            let (service, name, id) = (self.clone(), name.clone(), id.clone());
            undo.push("release container name", async move {
                service.container_names.release(&name, &id);
            });
        }
        let created = async {
            // Image volumes stay mounted for the pod's other containers, also when this
            // creation fails; stopping the pod removes them.
            self.mount_image_volumes(&sandbox_meta.id, &mut config.mounts)
                .await?;
            let root_dir = self.container_root_dir(&id);
            let state_dir = self.container_state_dir(&id);
            for dir in [&root_dir, &state_dir] {
                std::fs::create_dir_all(dir)
                    .map_err(|e| Status::internal(format!("creating {}: {e}", dir.display())))?;
            }
            {
                let dirs = [root_dir.clone(), state_dir.clone()];
                undo.push("remove container dirs", async move {
                    for dir in dirs {
                        let _ = std::fs::remove_dir_all(dir);
                    }
                });
            }

            let snapshotter = self.config.containerd.snapshotter.clone();
            let lease = self.creation_leases.take().await.map_err(internal)?;
            let pod_userns = self.sandbox_user_namespace(&sandbox_meta);
            let made = async {
                let parent = self
                    .rootfs_parent(&image.chain_id, pod_userns.as_ref(), &lease)
                    .await?;
                let mounts = self
                    .containerd
                    .prepare_snapshot(&snapshotter, &id, &parent, HashMap::new(), Some(&lease))
                    .await
                    .map_err(|e| {
                        Status::internal(format!("preparing the container rootfs: {e}"))
                    })?;
                crate::failpoint::hit("container_after_snapshot")
                    .await
                    .map_err(internal)?;
                {
                    let (service, id, snapshotter) =
                        (self.clone(), id.clone(), snapshotter.clone());
                    undo.push("remove container snapshot", async move {
                        let _ = service.containerd.remove_snapshot(&snapshotter, &id).await;
                    });
                }

                let image_volumes: Vec<String> = image
                    .config
                    .config
                    .volumes
                    .iter()
                    .flat_map(|v| v.keys().cloned())
                    .collect();
                let rootfs = self
                    .read_container_rootfs(
                        &root_dir,
                        &config,
                        &image_volumes,
                        &image.chain_id,
                        mounts.clone(),
                    )
                    .await?;
                let declared_volumes = rootfs.volumes;
                if let Some(pod) = &pod_userns {
                    give_volumes_to_pod_root(&declared_volumes, pod.mappings).await?;
                }

                let linux = config.linux.clone().unwrap_or_default();
                let security = linux.security_context.clone().unwrap_or_default();
                let user_string = cri_user_string(
                    security.run_as_user.as_ref().map(|v| v.value),
                    &security.run_as_username,
                    security.run_as_group.as_ref().map(|v| v.value),
                )
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
                let user_string = if user_string.is_empty() {
                    image.config.config.user.clone()
                } else {
                    user_string
                };
                let files = rootfs.accounts;
                let strict = security.supplemental_groups_policy
                    == crate::api::v1::SupplementalGroupsPolicy::Strict as i32;
                let user = resolve_with_policy(
                    &user_string,
                    &files,
                    &security.supplemental_groups,
                    !strict,
                )
                .map_err(|e| Status::invalid_argument(format!("container user: {e}")))?;

                let sandbox_root = self.sandbox_root_dir(&sandbox_meta.id);
                let shm = if is_host_ipc(&sandbox_meta.config) {
                    PathBuf::from("/dev/shm")
                } else {
                    self.sandbox_shm_path(&sandbox_meta.id)
                };
                let oom = linux
                    .resources
                    .as_ref()
                    .map(|r| r.oom_score_adj)
                    .filter(|adj| *adj != 0)
                    .map(|adj| self.clamp_oom_score_adj(adj as i32));
                let idmapped_rootfs = self.idmapped_rootfs_dir(&id);
                {
                    let (service, id) = (self.clone(), id.clone());
                    undo.push("unmount idmapped mounts", async move {
                        service.unmount_idmapped_rootfs(&id);
                    });
                }
                let runtime_idmaps = self.handler_idmaps(&sandbox_meta.runtime_handler);
                let idmapped_config = self
                    .idmap_cri_mounts(&id, &config, pod_userns.as_ref(), runtime_idmaps)
                    .await?;
                let spec = container_spec(&ContainerSpecInput {
                    id: &id,
                    namespace: self.containerd.namespace(),
                    config: idmapped_config.as_ref().unwrap_or(&config),
                    sandbox_id: &sandbox_meta.id,
                    sandbox_config: &sandbox_meta.config,
                    sandbox_pid: sandbox_status.pid,
                    target_pid: self.target_pid(&config)?,
                    image: &image.config.config,
                    image_name: &image_text,
                    user: &user,
                    pod_files: PodFiles {
                        hosts: &sandbox_root.join("hosts"),
                        hostname: &sandbox_root.join("hostname"),
                        resolv_conf: &sandbox_root.join("resolv.conf"),
                        shm: &shm,
                    },
                    systemd_cgroup: runtime.options.systemd_cgroup,
                    oom_score_adj: oom,
                    passthrough_annotations: oci::passthrough_annotations(
                        &config.annotations,
                        &runtime.container_annotations,
                    ),
                    hostname: &super::sandbox::pod_hostname(&sandbox_meta.config),
                    declared_volumes: &declared_volumes,
                    privileged_without_host_devices: runtime.privileged_without_host_devices,
                    userns: pod_userns
                        .as_ref()
                        .map(|pod| oci::builder::PodUserNamespace {
                            path: &pod.pin,
                            mappings: &pod.mappings,
                            rootfs: (!pod.copy_rootfs).then_some(idmapped_rootfs.as_path()),
                            host_network: super::sandbox::is_host_network(&sandbox_meta.config),
                        }),
                })
                .map_err(|e| Status::invalid_argument(format!("invalid container config: {e}")))?;
                let spec = self.inject_cdi_devices(spec, &config).await?;
                let process_spec = serde_json::to_vec(spec.process())
                    .map_err(internal)?
                    .into_boxed_slice();

                let log_path =
                    if sandbox_meta.config.log_directory.is_empty() || config.log_path.is_empty() {
                        String::new()
                    } else {
                        Path::new(&sandbox_meta.config.log_directory)
                            .join(&config.log_path)
                            .display()
                            .to_string()
                    };
                let metadata = ContainerMetadata {
                    id: id.clone(),
                    name: name.clone(),
                    sandbox_id: sandbox_meta.id.clone(),
                    config: config.clone(),
                    image_ref: image.id.clone(),
                    image_name: image_text.clone(),
                    log_path,
                    stop_signal: effective_stop_signal(&config, &image.config.config.stop_signal),
                    user: Some(status_user(&user)),
                    created_at: unix_nanos(SystemTime::now()),
                    restore_from: restore_from
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                    cgroups_path: spec
                        .linux()
                        .as_ref()
                        .and_then(|l| l.cgroups_path().as_ref())
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                };
                let mut labels = config.labels.clone();
                labels.insert(KIND_LABEL.to_string(), KIND_CONTAINER.to_string());
                let record = ContainerRecord {
                    id: id.clone(),
                    labels,
                    image: image_text.clone(),
                    runtime: crate::containerd::tasks::runtime(
                        &runtime.runtime_type,
                        super::sandbox_run::runtime_options(&runtime),
                    ),
                    spec: Some(oci::to_any(&spec).map_err(internal)?),
                    snapshotter: snapshotter.clone(),
                    snapshot_key: id.clone(),
                    extensions: metadata_extension(&metadata)?,
                    ..Default::default()
                };
                self.containerd
                    .create_container(record, Some(&lease))
                    .await
                    .map_err(|e| Status::internal(format!("creating the container: {e}")))?;
                {
                    let (service, id) = (self.clone(), id.clone());
                    undo.push("delete container record", async move {
                        let _ = service.containerd.delete_container(&id).await;
                    });
                }
                crate::failpoint::hit("container_after_record")
                    .await
                    .map_err(internal)?;
                Ok::<_, Status>((metadata, process_spec, mounts))
            }
            .await;
            // The record holds the snapshot now: the lease goes while the container's own
            // files are made.
            let lease_deleted = self.creation_leases.finish(&lease);
            let (made, ()) = tokio::join!(
                async {
                    let (metadata, process_spec, rootfs) = made?;
                    let container =
                        persist_new_container(metadata, process_spec, &config, root_dir, state_dir)
                            .await?;
                    container.keep_rootfs_mounts(rootfs);
                    Ok::<_, Status>(container)
                },
                lease_deleted
            );
            let container = made?;
            let metadata = &container.metadata;
            let sandbox_id = metadata.sandbox_id.clone();
            self.containers.add(container);
            self.emit_container_event(
                &id,
                &sandbox_id,
                crate::api::v1::ContainerEventType::ContainerCreatedEvent,
            );
            Ok::<(), Status>(())
        }
        .await;
        match created {
            Ok(()) => {
                undo.disarm();
                self.container_names.settle(&name, &id);
                tracing::info!(container = %id, name, sandbox = %sandbox_meta.id, "container created");
                Ok(CreateContainerResponse { container_id: id })
            }
            Err(e) => {
                undo.run().await;
                Err(e)
            }
        }
    }
}

/// What makes two CreateContainer requests the same: the pod and the container config.
/// How long reading the CDI spec directories may take for one container.
const CDI_READ_TIMEOUT: Duration = Duration::from_secs(10);

impl CriService {
    /// Applies the CDI devices the container names (its `CDI_devices` and `cdi.k8s.io/*`
    /// annotations) to its spec. The spec files are read off the async threads, within
    /// [`CDI_READ_TIMEOUT`].
    async fn inject_cdi_devices(
        &self,
        mut spec: oci_spec::runtime::Spec,
        config: &crate::api::v1::ContainerConfig,
    ) -> Result<oci_spec::runtime::Spec, Status> {
        let names: Vec<String> = config.cdi_devices.iter().map(|d| d.name.clone()).collect();
        let names = crate::cdi::requested(&names, &config.annotations);
        if names.is_empty() {
            return Ok(spec);
        }
        if self.config.cdi.spec_dirs.is_empty() {
            return Err(Status::failed_precondition(format!(
                "CDI devices {names:?} asked for, but CDI is off (cdi.spec_dirs is empty)"
            )));
        }
        let dirs = self.config.cdi.spec_dirs.clone();
        let injected = tokio::task::spawn_blocking(move || {
            crate::cdi::inject(&mut spec, &dirs, &names).map(|()| spec)
        });
        let injected = tokio::time::timeout(CDI_READ_TIMEOUT, injected)
            .await
            .map_err(|_| {
                Status::failed_precondition(format!(
                    "reading the CDI specs took longer than {CDI_READ_TIMEOUT:?}"
                ))
            })?
            .map_err(internal)?;
        injected.map_err(|e| match e {
            crate::cdi::CdiError::BadName(_) => Status::invalid_argument(e.to_string()),
            _ => Status::failed_precondition(e.to_string()),
        })
    }
}

pub(crate) fn container_fingerprint(
    sandbox_id: &str,
    config: &crate::api::v1::ContainerConfig,
) -> String {
    crate::store::name_registrar::fingerprint(&(sandbox_id, config))
}

/// A container's log path is relative to the pod's log directory and stays inside it.
fn check_log_path(log_path: &str) -> Result<(), Status> {
    let path = Path::new(log_path);
    let escapes = path.components().any(|c| {
        matches!(
            c,
            std::path::Component::RootDir
                | std::path::Component::ParentDir
                | std::path::Component::Prefix(_)
        )
    });
    if escapes {
        return Err(Status::invalid_argument(format!(
            "log_path {log_path:?} must be relative to the pod's log_directory, without `..`"
        )));
    }
    Ok(())
}

/// The container config's stop signal wins over the image's (`STOPSIGNAL`).
fn effective_stop_signal(config: &crate::api::v1::ContainerConfig, image_signal: &str) -> String {
    use crate::api::v1::Signal;
    match Signal::try_from(config.stop_signal) {
        Ok(Signal::RuntimeDefault) | Err(_) => image_signal.to_string(),
        Ok(signal) => signal.as_str_name().to_string(),
    }
}

/// `ContainerStatus.user`: the process's uid and gid, and every group it is in (its primary
/// group too, as `id -G` lists them).
fn status_user(user: &crate::oci::user::ResolvedUser) -> crate::api::v1::LinuxContainerUser {
    let mut groups = vec![i64::from(user.gid)];
    for &gid in &user.additional_gids {
        if !groups.contains(&i64::from(gid)) {
            groups.push(gid.into());
        }
    }
    crate::api::v1::LinuxContainerUser {
        uid: user.uid.into(),
        gid: user.gid.into(),
        supplemental_groups: groups,
    }
}

/// The volumes an image declares, made for a pod in its own user namespace: owned by the
/// pod's range, as the image's files appear through its idmapped rootfs.
async fn give_volumes_to_pod_root(
    volumes: &[oci::container::DeclaredVolume],
    mappings: crate::userns::Mappings,
) -> Result<(), Status> {
    let paths: Vec<PathBuf> = volumes.iter().map(|v| v.host_path.clone()).collect();
    tokio::task::spawn_blocking(move || {
        paths
            .iter()
            .try_for_each(|p| super::container_rootfs::shift_owners(p, &mappings))
    })
    .await
    .map_err(internal)?
    .map_err(|e| {
        Status::internal(format!(
            "giving the image's volumes to the pod's range: {e}"
        ))
    })
}

/// Makes the container's FIFOs and persists its CREATED status (the mark that its creation
/// finished, for recovery), off the async threads.
async fn persist_new_container(
    metadata: ContainerMetadata,
    process_spec: Box<[u8]>,
    config: &crate::api::v1::ContainerConfig,
    root_dir: PathBuf,
    state_dir: PathBuf,
) -> Result<Arc<Container>, Status> {
    let (stdin, tty) = (config.stdin, config.tty);
    tokio::task::spawn_blocking(move || {
        let io = ContainerIo::create(&state_dir.join("io"), stdin, tty)
            .map_err(|e| Status::internal(format!("creating the container's FIFOs: {e}")))?;
        let created_at = metadata.created_at;
        let container = Arc::new(Container::new(
            metadata,
            ContainerStatus::created(created_at),
            root_dir.join("status"),
            Arc::new(io),
            process_spec,
        ));
        container.update_status(|_| {});
        Ok(container)
    })
    .await
    .map_err(|e| Status::internal(format!("persisting the container: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_path_cannot_leave_the_log_directory() {
        assert!(check_log_path("app/0.log").is_ok());
        assert!(check_log_path("").is_ok());
        for bad in ["/etc/cron.d/evil", "../../evil.log", "app/../../x.log"] {
            let err = check_log_path(bad).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{bad}");
        }
    }
}
