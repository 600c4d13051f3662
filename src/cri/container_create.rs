//! `CreateContainer`: reserve the name, resolve the image (crius does not pull here),
//! prepare the snapshot, build the spec (users from the image's own account files), create
//! the containerd container and the container's FIFOs, and persist its status as CREATED.
//! A failure half-way undoes every step.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::api::v1::{
    ContainerConfig, CreateContainerRequest, CreateContainerResponse, PodSandboxConfig,
};
use containerd_client::services::v1::Container as ContainerRecord;
use containerd_client::types::Mount;
use tonic::Status;

use super::names::Reservation;
use super::record::{KIND_CONTAINER, KIND_LABEL, container_metadata_extension};
use super::sandbox::{internal, is_host_ipc, new_id};
use super::unix_nanos;
use super::userns::PodUserns;
use crate::config::RuntimeConfig;
use crate::cri::CriService;
use crate::io::ContainerIo;
use crate::oci::container::{ContainerSpecInput, PodFiles, container_spec};
use crate::oci::user::{AccountFiles, ResolvedUser, cri_user_string, resolve_with_policy};
use crate::oci::{self};
use crate::store::{
    Container, ContainerMetadata, ContainerStatus, Image, RecordView, SandboxMetadata, SandboxState,
};
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
        self.host
            .handler_features
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
            .host
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
        let fingerprint = (req.config.as_ref())
            .map(|config| container_fingerprint(&req.pod_sandbox_id, config))
            .unwrap_or_default();
        let (config, image_text, restore_from) = self.checked_container_config(req.config).await?;
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
        let image = self.images.resolve(&image_text).ok_or_else(|| {
            Status::not_found(format!("image {image_text:?} not found: pull it first"))
        })?;
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
        let name = container_name(&config, &sandbox_meta);
        let id = new_id();
        if let Reservation::Existing(existing) = self
            .reserve_container_name(&name, &id, &fingerprint)
            .await?
        {
            tracing::info!(container = %existing, name, "a retried CreateContainer gets the container it made");
            return Ok(CreateContainerResponse {
                container_id: existing,
            });
        }
        let mut new = NewContainer {
            id,
            name,
            config,
            image,
            image_text,
            restore_from,
            sandbox: sandbox_meta,
            sandbox_pid: sandbox_status.pid,
            runtime,
        };
        let mut undo = Undo::new();
        {
            let (service, name, id) = (self.clone(), new.name.clone(), new.id.clone());
            undo.push("release container name", async move {
                service.container_names.release(&name, &id);
            });
        }
        match self.make_container(&mut undo, &mut new).await {
            Ok(()) => {
                undo.disarm();
                self.container_names.settle(&new.name, &new.id);
                if super::names::client_still_waiting() {
                    self.container_names.answered(&new.name, &new.id);
                }
                tracing::info!(container = %new.id, name = new.name, sandbox = %new.sandbox.id, "container created");
                Ok(CreateContainerResponse {
                    container_id: new.id,
                })
            }
            Err(e) => {
                undo.run().await;
                Err(e)
            }
        }
    }

    /// The request's container config, checked, with the image it names (for a restore:
    /// the checkpointed container's image, and the checkpoint).
    async fn checked_container_config(
        &self,
        config: Option<ContainerConfig>,
    ) -> Result<(ContainerConfig, String, Option<PathBuf>), Status> {
        let mut config =
            config.ok_or_else(|| Status::invalid_argument("container config is required"))?;
        if config.metadata.as_ref().is_none_or(|m| m.name.is_empty()) {
            return Err(Status::invalid_argument(
                "container config must have metadata.name",
            ));
        }
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
            self.host.cgroups.as_ref(),
        )?;
        check_log_path(&config.log_path)?;
        Ok((config, image_text, restore_from))
    }

    async fn reserve_container_name(
        &self,
        name: &str,
        id: &str,
        fingerprint: &str,
    ) -> Result<Reservation, Status> {
        let containers = self.containers.clone();
        super::names::reserve(
            &self.container_names,
            "container",
            name,
            id,
            fingerprint,
            |holder| {
                containers
                    .get(holder)
                    .ok()
                    .flatten()
                    .is_some_and(|c| c.id() == holder)
            },
        )
        .await
    }

    /// Makes everything of a new container; `undo` takes back each step if a later one
    /// fails.
    async fn make_container(&self, undo: &mut Undo, new: &mut NewContainer) -> Result<(), Status> {
        // Image volumes stay mounted for the pod's other containers, also when this
        // creation fails; stopping the pod removes them.
        self.mount_image_volumes(&new.sandbox, &mut new.config.mounts)
            .await?;
        let (root_dir, state_dir) = self.make_container_dirs(undo, &new.id)?;
        let lease = self.creation_leases.take().await.map_err(internal)?;
        let recorded = self.snapshot_and_record(undo, new, &lease).await;
        // The record holds the snapshot now: the lease goes while the container's own
        // files are made.
        let (made, ()) = tokio::join!(
            async {
                let Recorded {
                    metadata,
                    process_spec,
                    rootfs,
                    view,
                } = recorded?;
                let container =
                    persist_new_container(metadata, process_spec, &new.config, root_dir, state_dir)
                        .await?;
                container.keep_rootfs_mounts(rootfs);
                container.keep_record(view);
                Ok::<_, Status>(container)
            },
            self.creation_leases.finish(&lease)
        );
        self.containers.add(made?);
        self.emit_container_event(
            &new.id,
            &new.sandbox.id,
            crate::api::v1::ContainerEventType::ContainerCreatedEvent,
        );
        Ok(())
    }

    /// The container's dirs (its status file, its FIFOs), removed by `undo`.
    fn make_container_dirs(&self, undo: &mut Undo, id: &str) -> Result<(PathBuf, PathBuf), Status> {
        let root_dir = self.container_root_dir(id);
        let state_dir = self.container_state_dir(id);
        for dir in [&root_dir, &state_dir] {
            std::fs::create_dir_all(dir)
                .map_err(|e| Status::internal(format!("creating {}: {e}", dir.display())))?;
        }
        let dirs = [root_dir.clone(), state_dir.clone()];
        undo.push("remove container dirs", async move {
            for dir in dirs {
                let _ = std::fs::remove_dir_all(dir);
            }
        });
        Ok((root_dir, state_dir))
    }

    /// The container's active snapshot on its image (or the pod's remapped copy of it).
    async fn prepare_rootfs(
        &self,
        new: &NewContainer,
        snapshotter: &str,
        pod_userns: Option<&PodUserns>,
        lease: &str,
    ) -> Result<Vec<Mount>, RootfsError> {
        let parent = self
            .rootfs_parent(&new.image.chain_id, pod_userns, lease)
            .await
            .map_err(RootfsError::Parent)?;
        self.containerd
            .prepare_snapshot(snapshotter, &new.id, &parent, HashMap::new(), Some(lease))
            .await
            .map_err(RootfsError::Prepare)
    }

    /// Prepares the container's snapshot under `lease`, builds its spec and records it in
    /// containerd: its metadata, its process spec and its rootfs mounts.
    async fn snapshot_and_record(
        &self,
        undo: &mut Undo,
        new: &NewContainer,
        lease: &str,
    ) -> Result<Recorded, Status> {
        let snapshotter = self.snapshotter_of(&new.sandbox.snapshotter).to_string();
        let pod_userns = self.sandbox_user_namespace(&new.sandbox);
        let mounts = match self
            .prepare_rootfs(new, &snapshotter, pod_userns.as_ref(), lease)
            .await
        {
            Err(e) if e.is_not_found() => {
                // The image's layers are not in the snapshotter (pulled by another client
                // without unpacking): unpack them, as containerd's CRI does, and try again.
                crate::image::load::ensure_unpacked(
                    &self.containerd,
                    &snapshotter,
                    &new.image,
                    lease,
                )
                .await
                .map_err(|e| {
                    Status::failed_precondition(format!(
                        "image {} is not unpacked and cannot be: {e}",
                        new.image.id
                    ))
                })?;
                self.prepare_rootfs(new, &snapshotter, pod_userns.as_ref(), lease)
                    .await
            }
            other => other,
        }
        .map_err(|e| Status::internal(format!("preparing the container rootfs: {e}")))?;
        crate::failpoint::hit("container_after_snapshot")
            .await
            .map_err(internal)?;
        {
            let (service, id, snapshotter) = (self.clone(), new.id.clone(), snapshotter.clone());
            undo.push("remove container snapshot", async move {
                let _ = service.containerd.remove_snapshot(&snapshotter, &id).await;
            });
        }
        let (spec, user) = self
            .build_container_spec(undo, new, pod_userns.as_ref(), &mounts)
            .await?;
        let process_spec = serde_json::to_vec(spec.process())
            .map_err(internal)?
            .into_boxed_slice();
        let metadata = container_metadata(new, &spec, &user);
        let view = self
            .record_container(undo, new, &metadata, &spec, &snapshotter, lease)
            .await?;
        crate::failpoint::hit("container_after_record")
            .await
            .map_err(internal)?;
        Ok(Recorded {
            metadata,
            process_spec,
            rootfs: mounts,
            view,
        })
    }

    /// The container's OCI spec and the user it runs as, from the image's rootfs (its
    /// account files; the volumes it declares, made here), with idmapped mounts and CDI
    /// devices.
    async fn build_container_spec(
        &self,
        undo: &mut Undo,
        new: &NewContainer,
        pod_userns: Option<&PodUserns>,
        mounts: &[Mount],
    ) -> Result<(oci_spec::runtime::Spec, ResolvedUser), Status> {
        let (config, sandbox) = (&new.config, &new.sandbox);
        let image_volumes: Vec<String> = (new.image.config.config.volumes.iter())
            .flat_map(|v| v.keys().cloned())
            .collect();
        let rootfs = self
            .read_container_rootfs(
                &self.container_root_dir(&new.id),
                config,
                &image_volumes,
                &new.image.chain_id,
                mounts.to_vec(),
            )
            .await?;
        if let Some(pod) = pod_userns {
            give_volumes_to_pod_root(&rootfs.volumes, pod.mappings).await?;
        }
        let user = container_user(config, &new.image.config.config.user, &rootfs.accounts)?;
        let sandbox_root = self.sandbox_root_dir(&sandbox.id);
        let shm = self.container_shm(&sandbox.id, &sandbox.config);
        let idmapped_rootfs = self.idmapped_rootfs_dir(&new.id);
        {
            let (service, id) = (self.clone(), new.id.clone());
            undo.push("unmount idmapped mounts", async move {
                service.unmount_idmapped_rootfs(&id);
            });
        }
        let runtime_idmaps = self.handler_idmaps(&sandbox.runtime_handler);
        let idmapped_config = self
            .idmap_cri_mounts(&new.id, config, pod_userns, runtime_idmaps)
            .await?;
        let spec = container_spec(&ContainerSpecInput {
            id: &new.id,
            namespace: self.containerd.namespace(),
            config: idmapped_config.as_ref().unwrap_or(config),
            sandbox_id: &sandbox.id,
            sandbox_config: &sandbox.config,
            sandbox_pid: new.sandbox_pid,
            target_pid: self.target_pid(config)?,
            image: &new.image.config.config,
            image_name: &new.image_text,
            user: &user,
            pod_files: PodFiles {
                hosts: &sandbox_root.join("hosts"),
                hostname: &sandbox_root.join("hostname"),
                resolv_conf: &sandbox_root.join("resolv.conf"),
                shm: &shm,
            },
            systemd_cgroup: new.runtime.options.systemd_cgroup,
            oom_score_adj: self.container_oom_score_adj(config),
            passthrough_annotations: container_marks(
                oci::passthrough_annotations(
                    &config.annotations,
                    &new.runtime.container_annotations,
                ),
                &new.runtime,
            ),
            hostname: &super::sandbox::pod_hostname(&sandbox.config),
            declared_volumes: &rootfs.volumes,
            privileged_without_host_devices: new.runtime.privileged_without_host_devices,
            userns: pod_userns.map(|pod| oci::builder::PodUserNamespace {
                path: &pod.pin,
                mappings: &pod.mappings,
                rootfs: (!pod.copy_rootfs).then_some(idmapped_rootfs.as_path()),
                host_network: super::sandbox::is_host_network(&sandbox.config),
            }),
        })
        .map_err(|e| Status::invalid_argument(format!("invalid container config: {e}")))?;
        let spec = self.inject_cdi_devices(spec, config).await?;
        Ok((spec, user))
    }

    /// The `/dev/shm` a container of the pod gets: the host's for a pod in the host's IPC
    /// namespace, else the pod's own.
    fn container_shm(&self, sandbox_id: &str, sandbox_config: &PodSandboxConfig) -> PathBuf {
        if is_host_ipc(sandbox_config) {
            PathBuf::from("/dev/shm")
        } else {
            self.sandbox_shm_path(sandbox_id)
        }
    }

    /// The container's OOM score adjustment, when its resources set one (clamped to what
    /// crius may give).
    fn container_oom_score_adj(&self, config: &ContainerConfig) -> Option<i32> {
        config
            .linux
            .as_ref()
            .and_then(|l| l.resources.as_ref())
            .map(|r| r.oom_score_adj)
            .filter(|adj| *adj != 0)
            .map(|adj| self.clamp_oom_score_adj(adj as i32))
    }

    /// Records the container in containerd (the record holds its snapshot from then on),
    /// deleted by `undo`; returns what the verbose status shows of the record.
    async fn record_container(
        &self,
        undo: &mut Undo,
        new: &NewContainer,
        metadata: &ContainerMetadata,
        spec: &oci_spec::runtime::Spec,
        snapshotter: &str,
        lease: &str,
    ) -> Result<Option<RecordView>, Status> {
        let mut labels = new.config.labels.clone();
        labels.insert(KIND_LABEL.to_string(), KIND_CONTAINER.to_string());
        let spec_any = oci::to_any(spec).map_err(internal)?;
        let view = RecordView::new(&new.runtime.runtime_type, &spec_any.value);
        let record = ContainerRecord {
            id: new.id.clone(),
            labels,
            image: new.image_text.clone(),
            runtime: crate::containerd::tasks::runtime(
                &new.runtime.runtime_type,
                super::sandbox_run::runtime_options(&new.runtime),
            ),
            spec: Some(spec_any),
            snapshotter: snapshotter.to_string(),
            snapshot_key: new.id.clone(),
            extensions: container_metadata_extension(metadata)?,
            ..Default::default()
        };
        self.containerd
            .create_container(record, Some(lease))
            .await
            .map_err(|e| Status::internal(format!("creating the container: {e}")))?;
        let (service, id) = (self.clone(), new.id.clone());
        undo.push("delete container record", async move {
            let _ = service.delete_record_for_undo(&id).await;
        });
        Ok(view)
    }
}

/// What `snapshot_and_record` made of a new container.
struct Recorded {
    metadata: ContainerMetadata,
    process_spec: Box<[u8]>,
    rootfs: Vec<Mount>,
    view: Option<RecordView>,
}

/// What CreateContainer settled before it makes anything: the request checked, the pod
/// ready, the image and the runtime found, the name reserved under a new ID.
struct NewContainer {
    id: String,
    name: String,
    config: ContainerConfig,
    image: Image,
    /// The image as the request names it.
    image_text: String,
    /// The checkpoint a restore starts from.
    restore_from: Option<PathBuf>,
    sandbox: SandboxMetadata,
    sandbox_pid: u32,
    runtime: RuntimeConfig,
}

/// `<container>_<pod>_<namespace>_<pod uid>_<attempt>`, unique per pod and attempt.
fn container_name(config: &ContainerConfig, sandbox: &SandboxMetadata) -> String {
    let meta = config.metadata.clone().unwrap_or_default();
    let pod = sandbox.config.metadata.clone().unwrap_or_default();
    format!(
        "{}_{}_{}_{}_{}",
        meta.name, pod.name, pod.namespace, pod.uid, meta.attempt
    )
}

/// Who the container runs as: the security context's user, else the image's, resolved in
/// the image's account files.
fn container_user(
    config: &ContainerConfig,
    image_user: &str,
    files: &AccountFiles,
) -> Result<ResolvedUser, Status> {
    let security = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.clone())
        .unwrap_or_default();
    let user_string = cri_user_string(
        security.run_as_user.as_ref().map(|v| v.value),
        &security.run_as_username,
        security.run_as_group.as_ref().map(|v| v.value),
    )
    .map_err(|e| Status::invalid_argument(e.to_string()))?;
    let user_string = if user_string.is_empty() {
        image_user.to_string()
    } else {
        user_string
    };
    let strict = security.supplemental_groups_policy
        == crate::api::v1::SupplementalGroupsPolicy::Strict as i32;
    resolve_with_policy(&user_string, files, &security.supplemental_groups, !strict)
        .map_err(|e| Status::invalid_argument(format!("container user: {e}")))
}

/// Why a container's rootfs could not be prepared.
#[derive(Debug, thiserror::Error)]
enum RootfsError {
    #[error("{}", .0.message())]
    Parent(Status),
    #[error("{0}")]
    Prepare(crate::containerd::ContainerdError),
}

impl RootfsError {
    /// The image's snapshot is missing.
    fn is_not_found(&self) -> bool {
        match self {
            Self::Parent(status) => status.code() == tonic::Code::NotFound,
            Self::Prepare(e) => e.is_not_found(),
        }
    }
}

/// What crius keeps of a new container (its record's extension and its status file).
fn container_metadata(
    new: &NewContainer,
    spec: &oci_spec::runtime::Spec,
    user: &ResolvedUser,
) -> ContainerMetadata {
    let config = &new.config;
    let log_directory = &new.sandbox.config.log_directory;
    let log_path = if log_directory.is_empty() || config.log_path.is_empty() {
        String::new()
    } else {
        Path::new(log_directory)
            .join(&config.log_path)
            .display()
            .to_string()
    };
    ContainerMetadata {
        id: new.id.clone(),
        name: new.name.clone(),
        sandbox_id: new.sandbox.id.clone(),
        config: config.clone(),
        image_ref: new.image.id.clone(),
        image_name: new.image_text.clone(),
        log_path,
        stop_signal: effective_stop_signal(config, &new.image.config.config.stop_signal),
        user: Some(status_user(user)),
        created_at: unix_nanos(SystemTime::now()),
        restore_from: (new.restore_from.as_ref())
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        cgroups_path: spec
            .linux()
            .as_ref()
            .and_then(|l| l.cgroups_path().as_ref())
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        snapshotter: new.sandbox.snapshotter.clone(),
    }
}

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

/// What makes two CreateContainer requests the same: the pod and the container config.
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

/// `ContainerStatus.user`: the process's uid and gid, and its supplementary groups as the
/// spec has them (the primary group among them, as containerd puts it there).
fn status_user(user: &crate::oci::user::ResolvedUser) -> crate::api::v1::LinuxContainerUser {
    crate::api::v1::LinuxContainerUser {
        uid: user.uid.into(),
        gid: user.gid.into(),
        supplemental_groups: user.additional_gids.iter().map(|&g| g.into()).collect(),
    }
}

/// The volumes an image declares, made for a pod in its own user namespace: owned by the
/// pod's range, as the image's files appear through its idmapped rootfs.
async fn give_volumes_to_pod_root(
    volumes: &[oci::container::DeclaredVolume],
    mappings: crate::sys::userns::Mappings,
) -> Result<(), Status> {
    let paths: Vec<PathBuf> = volumes.iter().map(|v| v.host_path.clone()).collect();
    tokio::task::spawn_blocking(move || {
        paths
            .iter()
            .try_for_each(|p| crate::sys::tree::shift_owners(p, &mappings))
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
        container
            .persist_status()
            .map_err(|e| Status::internal(format!("writing the container's status: {e}")))?;
        Ok(container)
    })
    .await
    .map_err(|e| Status::internal(format!("persisting the container: {e}")))?
}

/// The container's pass-through annotations with the marks crius's shim reads from the
/// handler: `exec_with_runtime` sends every exec to the OCI runtime.
fn container_marks(
    mut annotations: HashMap<String, String>,
    runtime: &RuntimeConfig,
) -> HashMap<String, String> {
    if runtime.exec_with_runtime {
        annotations.insert(
            oci::annotations::EXEC_WITH_RUNTIME.to_string(),
            "true".to_string(),
        );
    }
    annotations
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

    #[test]
    fn a_handler_that_execs_with_its_runtime_marks_its_containers() {
        let passed = HashMap::from([("a".to_string(), "b".to_string())]);
        let plain = container_marks(passed.clone(), &RuntimeConfig::default());
        assert_eq!(plain, passed);
        let runtime = RuntimeConfig {
            exec_with_runtime: true,
            ..RuntimeConfig::default()
        };
        let marked = container_marks(passed, &runtime);
        assert_eq!(
            marked
                .get(oci::annotations::EXEC_WITH_RUNTIME)
                .map(String::as_str),
            Some("true")
        );
        assert_eq!(marked.get("a").map(String::as_str), Some("b"));
    }
}
