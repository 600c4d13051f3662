//! `RunPodSandbox`: reserve the name, ensure the sandbox image, write the pod's files and
//! /dev/shm, create the netns, create the containerd container and record the sandbox
//! *before* networking (so a later Stop/Remove can always undo it), then run CNI ADD
//! (each result cached at once) while the pause task is created and started, and record
//! the network once both are done. Any failure undoes every step already done, in reverse.
//!
//! The work runs in a task of its own: a client that gives up (kubelet's RPC timeout) does
//! not cut a creation in half; it completes or is undone.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use crate::api::v1::{PodSandboxConfig, RunPodSandboxRequest, RunPodSandboxResponse};
use containerd_client::services::v1::Container;
use containerd_client::types::Mount;
use tonic::Status;

use super::record::{
    KIND_LABEL, KIND_SANDBOX, NETNS_NOTE, sandbox_metadata_extension as metadata_extension,
};
use super::sandbox::{internal, is_host_ipc, is_host_network, new_id, pod_ref};
use super::unix_nanos;
use crate::cni::network::{NetworkAttachment, capability_args};
use crate::cni::result::CniResult;
use crate::config::RuntimeConfig;
use crate::cri::CriService;
use crate::oci::{self, SANDBOX_OOM_SCORE_ADJ, SandboxSpecInput};
use crate::store::{Image, Sandbox, SandboxMetadata, SandboxState, SandboxStatus};
use crate::sys::userns::Mappings;
use crate::undo::Undo;

impl CriService {
    pub async fn run_pod_sandbox(
        &self,
        req: RunPodSandboxRequest,
    ) -> Result<RunPodSandboxResponse, Status> {
        let handler = req.runtime_handler;
        let (config, runtime) = self.checked_pod_config(req.config, &handler)?;
        let pod = config.metadata.clone().unwrap_or_default();
        let id = new_id();
        let name = format!("{}_{}_{}_{}", pod.name, pod.namespace, pod.uid, pod.attempt);
        let fingerprint = sandbox_fingerprint(&config, &handler);
        let sandboxes = self.sandboxes.clone();
        let reserved = super::names::reserve(
            &self.sandbox_names,
            "sandbox",
            &name,
            &id,
            &fingerprint,
            |holder| {
                sandboxes
                    .get(holder)
                    .ok()
                    .flatten()
                    .is_some_and(|s| s.id() == holder)
            },
        )
        .await?;
        if let super::names::Reservation::Existing(existing) = reserved {
            tracing::info!(sandbox = %existing, name, "a retried RunPodSandbox gets the pod it made");
            return Ok(RunPodSandboxResponse {
                pod_sandbox_id: existing,
            });
        }

        let service = self.clone();
        let task_id = id.clone();
        let answer_name = name.clone();
        let created = tokio::spawn(async move {
            let mut undo = Undo::new();
            {
                let (service, name, id) = (service.clone(), name.clone(), task_id.clone());
                undo.push("release sandbox name", async move {
                    service.sandbox_names.release(&name, &id);
                });
            }
            let result = service
                .create_sandbox(&mut undo, &task_id, &name, config, &handler, &runtime)
                .await;
            match result {
                Ok(()) => {
                    undo.disarm();
                    service.sandbox_names.settle(&name, &task_id);
                }
                Err(_) => undo.run().await,
            }
            result
        })
        .await
        .map_err(|e| Status::internal(format!("sandbox creation task failed: {e}")))?;
        created?;
        if super::names::client_still_waiting() {
            self.sandbox_names.answered(&answer_name, &id);
        }
        Ok(RunPodSandboxResponse { pod_sandbox_id: id })
    }

    /// The request's pod config, checked, and the runtime of its handler.
    fn checked_pod_config(
        &self,
        config: Option<PodSandboxConfig>,
        handler: &str,
    ) -> Result<(PodSandboxConfig, RuntimeConfig), Status> {
        let config =
            config.ok_or_else(|| Status::invalid_argument("pod sandbox config is required"))?;
        let pod = config
            .metadata
            .clone()
            .ok_or_else(|| Status::invalid_argument("pod sandbox config must have metadata"))?;
        for (field, value) in [
            ("name", &pod.name),
            ("namespace", &pod.namespace),
            ("uid", &pod.uid),
        ] {
            if value.is_empty() {
                return Err(Status::invalid_argument(format!(
                    "pod sandbox metadata.{field} is required"
                )));
            }
        }
        if let Some(linux) = &config.linux {
            super::sandbox_update::check_pod_resources(
                linux.resources.as_ref(),
                linux.overhead.as_ref(),
            )?;
        }
        let runtime = self.config.runtime(handler).cloned().ok_or_else(|| {
            Status::invalid_argument(format!("no runtime for handler {handler:?} is configured"))
        })?;
        super::validate::pod_config(&config, runtime.options.systemd_cgroup)?;
        self.pod_user_namespace_request(&config, handler)?;
        if !is_host_network(&config) {
            self.cni.ready().map_err(|e| {
                Status::failed_precondition(format!(
                    "NetworkPluginNotReady: cni config load failed: {e}"
                ))
            })?;
        }
        Ok((config, runtime))
    }

    async fn create_sandbox(
        &self,
        undo: &mut Undo,
        id: &str,
        name: &str,
        config: PodSandboxConfig,
        handler: &str,
        runtime: &RuntimeConfig,
    ) -> Result<(), Status> {
        // Checked by the RPC before: here only read.
        let userns = crate::sys::userns::pod_mappings(&config).ok().flatten();
        let snapshotter = self.config.snapshotter_for(handler).to_string();
        let image = self.ensure_sandbox_image(&snapshotter).await?;
        let shm_path = self.make_sandbox_files(undo, id, &config, userns)?;
        let netns_path = self
            .make_sandbox_namespaces(undo, id, &config, userns)
            .await?;
        crate::failpoint::hit("sandbox_after_netns")
            .await
            .map_err(internal)?;

        let copy_rootfs = userns.is_some() && self.new_pods_copy_rootfs();
        let paths = SandboxPaths {
            netns: &netns_path,
            shm: &shm_path,
            copy_rootfs,
        };
        let held = can_hold(runtime, userns.as_ref());
        let mut spec =
            self.build_sandbox_spec(id, &config, &image, runtime, userns.as_ref(), &paths)?;
        mark_held(&mut spec, held);
        let metadata = SandboxMetadata {
            id: id.to_string(),
            name: name.to_string(),
            config: config.clone(),
            runtime_handler: handler.to_string(),
            runtime_type: runtime.runtime_type.clone(),
            netns_path: netns_path.clone(),
            ips: Vec::new(),
            networks: Vec::new(),
            created_at: unix_nanos(SystemTime::now()),
            image: image.id.clone(),
            cgroups_path: oci::cgroups_path(
                (config.linux.as_ref())
                    .map(|l| l.cgroup_parent.as_str())
                    .unwrap_or_default(),
                id,
                self.containerd.namespace(),
                runtime.options.systemd_cgroup,
            ),
            userns_rootfs_copy: copy_rootfs,
            held,
            snapshotter: snapshotter.clone(),
        };
        let rootfs = self
            .create_sandbox_container(undo, &metadata, &image, &spec, runtime, &snapshotter)
            .await?;
        crate::failpoint::hit("sandbox_after_container")
            .await
            .map_err(internal)?;

        let sandbox = self.add_creating_sandbox(undo, metadata);
        let _lifecycle = sandbox.lifecycle.lock().await;
        let pid = self
            .start_sandbox_and_network(undo, &sandbox, rootfs, &config)
            .await?;
        crate::failpoint::hit("sandbox_after_start")
            .await
            .map_err(internal)?;
        self.mark_sandbox_ready(&sandbox, pid)
    }

    /// The pod is READY with its pause task's pid, unless that task died while CNI ran
    /// (its exit made the sandbox NOTREADY).
    fn mark_sandbox_ready(&self, sandbox: &Sandbox, pid: u32) -> Result<(), Status> {
        let id = &sandbox.id();
        let status = sandbox.update_status(|s| {
            if s.state == SandboxState::Creating {
                s.state = SandboxState::Ready;
                s.pid = pid;
            }
        });
        if status.state != SandboxState::Ready {
            return Err(Status::internal(format!(
                "the pause task of sandbox {id} exited while the sandbox was being created"
            )));
        }
        self.mark_sandbox_started(id)?;
        let metadata = sandbox.metadata();
        tracing::info!(sandbox = %id, name = metadata.name, pid, held = metadata.held, ips = ?metadata.ips, "pod sandbox running");
        for kind in [
            crate::api::v1::ContainerEventType::ContainerCreatedEvent,
            crate::api::v1::ContainerEventType::ContainerStartedEvent,
        ] {
            self.emit_container_event(id, id, kind);
        }
        Ok(())
    }

    /// The pod's dirs and files (hostname, hosts, resolv.conf) and its /dev/shm, each
    /// removed by `undo`; returns the path of its /dev/shm.
    fn make_sandbox_files(
        &self,
        undo: &mut Undo,
        id: &str,
        config: &PodSandboxConfig,
        userns: Option<Mappings>,
    ) -> Result<String, Status> {
        for dir in [self.sandbox_root_dir(id), self.sandbox_state_dir(id)] {
            std::fs::create_dir_all(&dir)
                .map_err(|e| Status::internal(format!("creating {}: {e}", dir.display())))?;
        }
        {
            let (service, id) = (self.clone(), id.to_string());
            undo.push("remove sandbox dirs", async move {
                let _ = service.remove_sandbox_dirs(&id);
            });
        }
        self.write_sandbox_files(id, config)?;
        if let Some(mappings) = &userns {
            self.give_sandbox_files_to_pod_root(id, mappings)?;
        }
        if is_host_ipc(config) {
            return Ok("/dev/shm".to_string());
        }
        let path = self.mount_sandbox_shm(id, userns.map(|m| m.host_root()))?;
        let (service, id) = (self.clone(), id.to_string());
        undo.push("unmount sandbox shm", async move {
            service.unmount_sandbox_shm(&id)
        });
        Ok(path.display().to_string())
    }

    /// The pod's network namespace (none for a host-network pod) and, for a pod in its
    /// own user namespace, that namespace, each removed by `undo`; returns the netns path
    /// (empty: the host's).
    async fn make_sandbox_namespaces(
        &self,
        undo: &mut Undo,
        id: &str,
        config: &PodSandboxConfig,
        userns: Option<Mappings>,
    ) -> Result<String, Status> {
        if is_host_network(config) {
            if let Some(mappings) = userns {
                self.create_pod_user_namespace(undo, id, mappings, None)
                    .await?;
            }
            return Ok(String::new());
        }
        let path = crate::sys::netns::new_path();
        // Noted before it exists, so a crash right after still finds it to remove.
        let note = self.sandbox_root_dir(id).join(NETNS_NOTE);
        crate::sys::fsutil::write_atomic(&note, path.display().to_string().as_bytes(), 0o600)
            .map_err(|e| Status::internal(format!("writing {}: {e}", note.display())))?;
        match userns {
            Some(mappings) => {
                self.create_pod_user_namespace(undo, id, mappings, Some(&path))
                    .await?
            }
            None => crate::sys::netns::create(&path).await.map_err(internal)?,
        }
        let pinned = path.clone();
        undo.push("remove netns", async move {
            if let Err(e) = crate::sys::netns::remove(&pinned).await {
                tracing::warn!(error = %e, "undo: removing netns failed");
            }
        });
        Ok(path.display().to_string())
    }

    /// The pause container's OCI spec.
    fn build_sandbox_spec(
        &self,
        id: &str,
        config: &PodSandboxConfig,
        image: &Image,
        runtime: &RuntimeConfig,
        userns: Option<&Mappings>,
        paths: &SandboxPaths,
    ) -> Result<oci_spec::runtime::Spec, Status> {
        let resolv_path = self.sandbox_root_dir(id).join("resolv.conf");
        let resolv_path = resolv_path.display().to_string();
        let userns_pin = self.sandbox_userns_pin(id);
        let idmapped_rootfs = self.idmapped_rootfs_dir(id);
        oci::sandbox_spec(&SandboxSpecInput {
            id,
            namespace: self.containerd.namespace(),
            config,
            image: &image.config.config,
            netns_path: (!paths.netns.is_empty()).then_some(paths.netns),
            shm_path: paths.shm,
            resolv_conf_path: &resolv_path,
            oom_score_adj: self.clamp_oom_score_adj(SANDBOX_OOM_SCORE_ADJ),
            systemd_cgroup: runtime.options.systemd_cgroup,
            passthrough_annotations: oci::passthrough_annotations(
                &config.annotations,
                &runtime.pod_annotations,
            ),
            userns: userns.map(|mappings| oci::builder::PodUserNamespace {
                path: &userns_pin,
                mappings,
                rootfs: (!paths.copy_rootfs).then_some(idmapped_rootfs.as_path()),
                host_network: is_host_network(config),
            }),
        })
        .map_err(|e| Status::invalid_argument(format!("invalid sandbox config: {e}")))
    }

    /// The new sandbox in the store, CREATING until its task and network are up; `undo`
    /// forgets it.
    fn add_creating_sandbox(&self, undo: &mut Undo, metadata: SandboxMetadata) -> Arc<Sandbox> {
        let id = metadata.id.clone();
        let sandbox = Arc::new(Sandbox::new(
            metadata,
            SandboxStatus {
                state: SandboxState::Creating,
                pid: 0,
                netns_closed: false,
                network_released: false,
            },
        ));
        self.sandboxes.add(sandbox.clone());
        let service = self.clone();
        undo.push(
            "forget sandbox",
            async move { service.sandboxes.remove(&id) },
        );
        sandbox
    }

    /// Starts the pause task and, at the same time, CNI ADD (they need only the netns);
    /// each success is registered for undo before either failure is returned. Returns the
    /// pause task's pid.
    async fn start_sandbox_and_network(
        &self,
        undo: &mut Undo,
        sandbox: &Arc<Sandbox>,
        rootfs: Vec<Mount>,
        config: &PodSandboxConfig,
    ) -> Result<u32, Status> {
        let metadata = sandbox.metadata();
        let id = metadata.id.as_str();
        let network = async {
            if metadata.netns_path.is_empty() {
                return Ok(None);
            }
            self.attach_sandbox_network(sandbox, config).await.map(Some)
        };
        let (task, network) = tokio::join!(
            self.create_and_start_sandbox_task(id, rootfs, &metadata),
            network
        );
        // Undone newest first: the task goes before its network, as in StopPodSandbox.
        if let Ok(Some(_)) = &network {
            let (service, pod) = (self.clone(), pod_ref(&metadata));
            undo.push("tear down sandbox network", async move {
                if let Err(e) = service.cni_network.teardown(&pod).await {
                    tracing::warn!(sandbox = %pod.id, error = %e, "undo: CNI teardown failed");
                }
            });
        }
        {
            // Also when creating it failed: the RPC may fail after the shim made the task.
            let (service, id) = (self.clone(), id.to_string());
            undo.push("destroy sandbox task", async move {
                if let Err(e) = service.destroy_task_for_undo(&id).await {
                    tracing::warn!(sandbox = %id, error = %e, "undo: destroying task failed");
                }
            });
        }
        if let (Err(_), Err(e)) = (&task, &network) {
            tracing::warn!(sandbox = %id, error = %e.message(), "CNI ADD failed too");
        }
        let (pid, network) = (task?, network?);
        if let Some(attachments) = network {
            crate::failpoint::hit("sandbox_after_cni")
                .await
                .map_err(internal)?;
            // Recorded only once the pause task runs too: recovery finishes a sandbox whose
            // network is recorded and whose task runs, and undoes any other.
            self.record_sandbox_network(sandbox, attachments).await?;
        }
        Ok(pid)
    }

    /// The pod's user namespace, pinned in its state dir, with its netns (if it has one of
    /// its own) inside it pinned at `netns`; both undone on failure.
    async fn create_pod_user_namespace(
        &self,
        undo: &mut Undo,
        id: &str,
        mappings: Mappings,
        netns: Option<&std::path::Path>,
    ) -> Result<(), Status> {
        let pin = self.sandbox_userns_pin(id);
        crate::sys::userns::create_pod_namespaces(mappings, pin.clone(), netns.map(Into::into))
            .await
            .map_err(internal)?;
        undo.push("remove user namespace", async move {
            if let Err(e) = crate::sys::userns::unpin(&pin) {
                tracing::warn!(error = %e, "undo: removing the user namespace failed");
            }
        });
        Ok(())
    }

    /// The snapshot and the containerd container, created under a short lease so garbage
    /// collection cannot take the snapshot before the container holds it; returns the
    /// snapshot's mounts, the pause task's rootfs.
    async fn create_sandbox_container(
        &self,
        undo: &mut Undo,
        metadata: &SandboxMetadata,
        image: &Image,
        spec: &oci_spec::runtime::Spec,
        runtime: &RuntimeConfig,
        snapshotter: &str,
    ) -> Result<Vec<Mount>, Status> {
        let id = metadata.id.as_str();
        let lease = self.creation_leases.take().await.map_err(internal)?;
        let created = async {
            // A held pod runs no image: its holder needs no rootfs.
            let mounts = if metadata.held {
                Vec::new()
            } else {
                self.prepare_sandbox_snapshot(undo, metadata, image, snapshotter, &lease)
                    .await?
            };
            let snapshotter = if metadata.held { "" } else { snapshotter };
            let mut labels = metadata.config.labels.clone();
            labels.insert(KIND_LABEL.to_string(), KIND_SANDBOX.to_string());
            let container = Container {
                id: id.to_string(),
                labels,
                image: self.sandbox_image.clone(),
                runtime: crate::containerd::tasks::runtime(
                    &runtime.runtime_type,
                    runtime_options(runtime),
                ),
                spec: Some(oci::to_any(spec).map_err(internal)?),
                snapshotter: snapshotter.to_string(),
                snapshot_key: if metadata.held { "" } else { id }.to_string(),
                extensions: metadata_extension(metadata)?,
                ..Default::default()
            };
            self.containerd
                .create_container(container, Some(&lease))
                .await
                .map_err(|e| Status::internal(format!("creating the sandbox container: {e}")))?;
            let (service, id) = (self.clone(), id.to_string());
            undo.push("delete sandbox container", async move {
                let _ = service.delete_record_for_undo(&id).await;
            });
            Ok::<Vec<Mount>, Status>(mounts)
        }
        .await;
        self.creation_leases.finish(&lease).await;
        created
    }

    /// The pause container's rootfs: a snapshot of the pause image (or of its remapped copy)
    /// under `lease`, removed by `undo`; returns its mounts.
    async fn prepare_sandbox_snapshot(
        &self,
        undo: &mut Undo,
        metadata: &SandboxMetadata,
        image: &Image,
        snapshotter: &str,
        lease: &str,
    ) -> Result<Vec<Mount>, Status> {
        let id = metadata.id.as_str();
        let pod_userns = self.sandbox_user_namespace(metadata);
        let parent = self
            .rootfs_parent(&image.chain_id, pod_userns.as_ref(), lease)
            .await?;
        let mounts = self
            .containerd
            .prepare_snapshot(snapshotter, id, &parent, HashMap::new(), Some(lease))
            .await
            .map_err(|e| Status::internal(format!("preparing the sandbox rootfs: {e}")))?;
        let (service, id, snapshotter) = (self.clone(), id.to_string(), snapshotter.to_string());
        undo.push("remove sandbox snapshot", async move {
            let _ = service.containerd.remove_snapshot(&snapshotter, &id).await;
        });
        Ok(mounts)
    }

    /// CNI ADD, then the IPs and results are written to the store and containerd at once.
    /// CNI ADD for the pod (each result cached at once); undone by the caller on failure
    /// of anything later.
    async fn attach_sandbox_network(
        &self,
        sandbox: &Arc<Sandbox>,
        config: &PodSandboxConfig,
    ) -> Result<Vec<NetworkAttachment>, Status> {
        let metadata = sandbox.metadata();
        self.cni_network
            .setup(&pod_ref(&metadata), &capability_args(config))
            .await
            .map_err(|e| {
                Status::internal(format!(
                    "failed to set up the network of sandbox {}: {e}",
                    metadata.id
                ))
            })
    }

    /// Keeps the pod's IPs and CNI results in the sandbox and in its containerd record.
    async fn record_sandbox_network(
        &self,
        sandbox: &Arc<Sandbox>,
        attachments: Vec<NetworkAttachment>,
    ) -> Result<(), Status> {
        let ips = match attachments.first() {
            Some(first) => CniResult::parse(&first.result.value())
                .map_err(internal)?
                .pod_ips(&first.ifname),
            None => Vec::new(),
        };
        let updated = sandbox.update_metadata(|m| {
            m.ips = ips;
            m.networks = attachments;
        });
        self.containerd
            .update_container_extensions(&updated.id, metadata_extension(&updated)?)
            .await
            .map_err(|e| Status::internal(format!("recording the sandbox network: {e}")))?;
        Ok(())
    }

    /// Creates and starts the pause task on `rootfs` (its snapshot's mounts); returns its
    /// pid. With its own user namespace, the pause process gets its idmapped rootfs or
    /// remapped copy instead.
    async fn create_and_start_sandbox_task(
        &self,
        id: &str,
        rootfs: Vec<Mount>,
        metadata: &SandboxMetadata,
    ) -> Result<u32, Status> {
        let mounts = match self.sandbox_user_namespace(metadata) {
            Some(pod) => self.userns_rootfs_mounts(id, &pod).await?,
            None => rootfs,
        };
        self.containerd
            .create_task(id, mounts, ["", "", ""], false)
            .await
            .map_err(|e| {
                let message = format!("failed to create the sandbox task: {e}");
                Status::new(super::runtime_errors::sandbox_task_code(&message), message)
            })?;
        self.containerd
            .start_task(id, "")
            .await
            .map_err(|e| Status::internal(format!("failed to start the sandbox task: {e}")))
    }

    /// The sandbox image, unpacked in `snapshotter`.
    pub(crate) async fn ensure_sandbox_image(&self, snapshotter: &str) -> Result<Image, Status> {
        if let Some(image) = self.images.resolve(&self.sandbox_image) {
            if snapshotter != self.config.containerd.snapshotter {
                self.ensure_unpacked_in(snapshotter, &image).await?;
            }
            return Ok(image);
        }
        if self.config.image.sandbox_image.is_empty() {
            return crate::image::builtin::ensure_pause_image(
                &self.containerd,
                snapshotter,
                &self.images,
            )
            .await
            .map_err(|e| Status::internal(format!("importing the built-in pause image: {e}")));
        }
        let reference = crate::imagespec::reference::Reference::parse(&self.sandbox_image)
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
        // The puller records what it pulls in the store.
        self.puller
            .pull(&reference, None, snapshotter, None)
            .await
            .map_err(|f| Status::new(f.code, format!("sandbox image: {}", f.message)))
    }

    /// Unpacks `image` (its content is in the store) into `snapshotter` unless it is there:
    /// an image pulled for one handler, run by a handler with another snapshotter.
    async fn ensure_unpacked_in(&self, snapshotter: &str, image: &Image) -> Result<(), Status> {
        let present = self
            .containerd
            .snapshot_exists(snapshotter, &image.chain_id)
            .await
            .map_err(internal)?;
        if present {
            return Ok(());
        }
        let lease = self.creation_leases.take().await.map_err(internal)?;
        let unpacked =
            crate::image::load::ensure_unpacked(&self.containerd, snapshotter, image, &lease).await;
        self.creation_leases.finish(&lease).await;
        unpacked.map_err(|e| {
            Status::failed_precondition(format!(
                "image {} cannot be unpacked into snapshotter {snapshotter}: {e}",
                image.id
            ))
        })
    }
}

/// Whether crius's shim holds the pod itself instead of running a pause container: on
/// its own shim, with cgroupfs cgroups, and without a user namespace of the pod's (the
/// holder's namespaces are the host user's; such pods keep their pause container).
fn can_hold(runtime: &RuntimeConfig, userns: Option<&Mappings>) -> bool {
    runtime.runtime_type == crate::config::CRIUS_SHIM
        && runs_containers_in_namespaces(&runtime.options.binary_name)
        && !runtime.options.systemd_cgroup
        && userns.is_none()
}

/// Whether a handler's OCI runtime runs containers as processes in Linux namespaces, which
/// a held pod's containers join: runc (the default), crun or youki. Another (a VM or
/// gVisor runtime) must create the sandbox itself.
fn runs_containers_in_namespaces(binary_name: &str) -> bool {
    binary_name.is_empty()
        || matches!(
            std::path::Path::new(binary_name)
                .file_name()
                .and_then(|name| name.to_str()),
            Some("runc" | "crun" | "youki")
        )
}

/// Marks the sandbox spec for crius's shim to hold, or makes sure it is not marked: a
/// pod annotation passed through must not decide it.
fn mark_held(spec: &mut oci_spec::runtime::Spec, held: bool) {
    let mut annotations = spec.annotations().clone().unwrap_or_default();
    annotations.remove(oci::annotations::SANDBOX_HOLDER);
    if held {
        annotations.insert(oci::annotations::SANDBOX_HOLDER.to_string(), "true".into());
    }
    spec.set_annotations(Some(annotations));
}

/// The runc shim options of a runtime handler, for runc-type runtimes.
pub(crate) fn runtime_options(runtime: &RuntimeConfig) -> Option<prost_types::Any> {
    runc_options(runtime, None)
}

/// The runc shim options of a runtime handler, for runc-type runtimes, with
/// `restore_from` (CRIU's images) as the task's `CriuImagePath` when given: containerd and
/// the shims restore a task created with it. crius's shim takes a `CriuImagePath` only
/// from a restore, never from the handler's options.
pub(crate) fn runc_options(
    runtime: &RuntimeConfig,
    restore_from: Option<&std::path::Path>,
) -> Option<prost_types::Any> {
    if !crate::config::RUNC_RUNTIME_TYPES.contains(&runtime.runtime_type.as_str()) {
        return None;
    }
    let o = &runtime.options;
    let crius_shim = runtime.runtime_type == crate::config::CRIUS_SHIM;
    let criu_image_path = match restore_from {
        Some(images) => images.display().to_string(),
        None if crius_shim => String::new(),
        None => o.criu_image_path.clone(),
    };
    let options = crate::protos::runc::Options {
        no_pivot_root: o.no_pivot_root,
        no_new_keyring: o.no_new_keyring,
        shim_cgroup: o.shim_cgroup.clone(),
        io_uid: o.io_uid,
        io_gid: o.io_gid,
        binary_name: o.binary_name.clone(),
        root: o.root.clone(),
        systemd_cgroup: o.systemd_cgroup,
        criu_image_path,
        criu_work_path: if crius_shim {
            String::new()
        } else {
            o.criu_work_path.clone()
        },
    };
    Some(containerd_client::to_any(&options))
}

/// What makes two RunPodSandbox requests the same: the config and the handler.
pub(crate) fn sandbox_fingerprint(config: &PodSandboxConfig, handler: &str) -> String {
    crate::store::name_registrar::fingerprint(&(config, handler))
}

/// Where a new pod's namespaces and /dev/shm are, for its spec.
struct SandboxPaths<'a> {
    /// Empty: the host's network.
    netns: &'a str,
    shm: &'a str,
    /// The pause rootfs is a copy shifted into the pod's IDs (else an idmapped mount).
    copy_rootfs: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_are_held_only_on_crius_shim_with_a_namespace_runtime_cgroupfs_and_no_userns() {
        let held = RuntimeConfig::default();
        assert!(can_hold(&held, None));
        for binary in ["runc", "/usr/local/bin/crun", "youki"] {
            let mut runtime = held.clone();
            runtime.options.binary_name = binary.into();
            assert!(can_hold(&runtime, None), "{binary}");
        }
        let mut vm = held.clone();
        vm.options.binary_name = "/opt/kata/bin/kata-runtime".into();
        let mut go_shim = held.clone();
        go_shim.runtime_type = crate::config::RUNC_SHIM.into();
        let mut systemd = held.clone();
        systemd.options.systemd_cgroup = true;
        for runtime in [vm, go_shim, systemd] {
            assert!(!can_hold(&runtime, None), "{runtime:?}");
        }
        assert!(!can_hold(&held, Some(&Mappings::from_zero(65536, 65536))));
    }

    #[test]
    fn only_crius_marks_a_spec_for_holding() {
        let mut spec = oci_spec::runtime::Spec::default();
        let passed = HashMap::from([(oci::annotations::SANDBOX_HOLDER.to_string(), "true".into())]);
        spec.set_annotations(Some(passed));
        mark_held(&mut spec, false);
        let annotations = spec.annotations().clone().unwrap_or_default();
        assert!(!annotations.contains_key(oci::annotations::SANDBOX_HOLDER));
        mark_held(&mut spec, true);
        let annotations = spec.annotations().clone().unwrap_or_default();
        assert_eq!(
            annotations
                .get(oci::annotations::SANDBOX_HOLDER)
                .map(String::as_str),
            Some("true")
        );
    }
}
