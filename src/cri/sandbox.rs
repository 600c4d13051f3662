//! What the sandbox RPCs share: directories, the metadata extension on the containerd
//! record, the sandbox's files (hostname, hosts, resolv.conf), its /dev/shm, stopping its
//! task, and tearing its network down.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::api::v1::{DnsConfig, NamespaceMode, PodSandboxConfig};
use tonic::Status;

use crate::cni::network::PodRef;
use crate::cri::CriService;
use crate::store::{Sandbox, SandboxMetadata, SandboxState};

/// Size of a pod's /dev/shm (containerd's default).
const SHM_SIZE: u64 = 64 * 1024 * 1024;
/// How long stopping waits for a killed task to exit.
pub const KILL_WAIT: Duration = Duration::from_secs(10);
/// How long the undo of a failed creation keeps trying a step while the connection to
/// containerd is broken (a containerd restart takes seconds): a task or record left behind
/// would outlive what crius knows of it.
const UNDO_RETRY_FOR: Duration = Duration::from_secs(30);

/// A new sandbox or container ID: 64 hex digits, as containerd's CRI makes them.
pub fn new_id() -> String {
    format!(
        "{:032x}{:032x}",
        rand::random::<u128>(),
        rand::random::<u128>()
    )
}

pub fn is_host_network(config: &PodSandboxConfig) -> bool {
    namespace_mode(config, |ns| ns.network) == NamespaceMode::Node as i32
}

pub fn is_host_ipc(config: &PodSandboxConfig) -> bool {
    namespace_mode(config, |ns| ns.ipc) == NamespaceMode::Node as i32
}

fn namespace_mode(
    config: &PodSandboxConfig,
    pick: impl Fn(&crate::api::v1::NamespaceOption) -> i32,
) -> i32 {
    config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref())
        .map(pick)
        .unwrap_or(NamespaceMode::Pod as i32)
}

/// `/etc/hosts` of a pod with its own network.
const POD_HOSTS: &str = "127.0.0.1\tlocalhost\n\
::1\tlocalhost ip6-localhost ip6-loopback\n\
fe00::0\tip6-localnet\n\
ff00::0\tip6-mcastprefix\n\
ff02::1\tip6-allnodes\n\
ff02::2\tip6-allrouters\n";

/// The tmpfs options of a pod's /dev/shm.
fn shm_options(owner: Option<(u32, u32)>) -> String {
    match owner {
        Some((uid, gid)) => format!("mode=1777,size={SHM_SIZE},uid={uid},gid={gid}"),
        None => format!("mode=1777,size={SHM_SIZE}"),
    }
}

/// `resolv.conf` from the pod's DNS config.
pub fn resolv_conf(dns: &DnsConfig) -> String {
    crius_common::pod_files::resolv_conf(&dns.servers, &dns.searches, &dns.options)
}

impl CriService {
    pub(crate) fn sandbox_root_dir(&self, id: &str) -> PathBuf {
        self.config.root.join("sandboxes").join(id)
    }

    pub(crate) fn sandbox_state_dir(&self, id: &str) -> PathBuf {
        self.config.state.join("sandboxes").join(id)
    }

    pub(crate) fn sandbox_shm_path(&self, id: &str) -> PathBuf {
        self.sandbox_state_dir(id).join("shm")
    }

    /// Writes the pod's `hostname`, `hosts` and `resolv.conf` into its root dir.
    pub(crate) fn write_sandbox_files(
        &self,
        id: &str,
        config: &PodSandboxConfig,
    ) -> Result<(), Status> {
        let dir = self.sandbox_root_dir(id);
        let host_network = is_host_network(config);
        let hostname = pod_hostname(config);
        let hosts = if host_network {
            std::fs::read_to_string("/etc/hosts").unwrap_or_else(|_| POD_HOSTS.to_string())
        } else {
            POD_HOSTS.to_string()
        };
        let resolv = match &config.dns_config {
            Some(dns) => resolv_conf(dns),
            None => std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default(),
        };
        for (name, content) in [
            ("hostname", format!("{hostname}\n")),
            ("hosts", hosts),
            ("resolv.conf", resolv),
        ] {
            crate::sys::fsutil::write_atomic(&dir.join(name), content.as_bytes(), 0o644)
                .map_err(|e| Status::internal(format!("writing {name} of sandbox {id}: {e}")))?;
        }
        Ok(())
    }

    /// Mounts the pod's own /dev/shm (a sized tmpfs) under its state dir, owned by `owner`
    /// (the pod's root in its own user namespace) when given.
    pub(crate) fn mount_sandbox_shm(
        &self,
        id: &str,
        owner: Option<(u32, u32)>,
    ) -> Result<PathBuf, Status> {
        let path = self.sandbox_shm_path(id);
        std::fs::create_dir_all(&path)
            .map_err(|e| Status::internal(format!("creating {}: {e}", path.display())))?;
        crate::sys::mount::mount_tmpfs(&path, &shm_options(owner))
            .map_err(|e| Status::internal(format!("mounting /dev/shm of sandbox {id}: {e}")))?;
        Ok(path)
    }

    pub(crate) fn unmount_sandbox_shm(&self, id: &str) {
        let path = self.sandbox_shm_path(id);
        if let Err(e) = crate::sys::mount::unmount(&path) {
            tracing::warn!(sandbox = id, error = %e, "unmounting /dev/shm failed");
        }
    }

    /// Records that the sandbox was fully made: recovery undoes sandboxes without it.
    pub(crate) fn mark_sandbox_started(&self, id: &str) -> Result<(), Status> {
        let path = self.sandbox_root_dir(id).join(super::record::STARTED_MARK);
        crate::sys::fsutil::write_atomic(&path, b"started\n", 0o600)
            .map_err(|e| Status::internal(format!("writing {}: {e}", path.display())))
    }

    pub(crate) fn sandbox_was_started(&self, id: &str) -> bool {
        self.sandbox_root_dir(id)
            .join(super::record::STARTED_MARK)
            .exists()
    }

    /// Removes the sandbox's root and state dirs.
    pub(crate) fn remove_sandbox_dirs(&self, id: &str) -> Result<(), Status> {
        self.unmount_sandbox_shm(id);
        crate::sys::userns::unpin(&self.sandbox_userns_pin(id)).map_err(|e| {
            Status::internal(format!("removing the user namespace of sandbox {id}: {e}"))
        })?;
        for dir in [self.sandbox_root_dir(id), self.sandbox_state_dir(id)] {
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(Status::internal(format!("removing {}: {e}", dir.display())));
                }
            }
        }
        Ok(())
    }

    /// Kills a container's task, waits for it (bounded) and deletes it. A missing task is
    /// fine.
    /// Its idmapped rootfs (pods in their own user namespace) is unmounted once the task
    /// is gone.
    pub(crate) async fn destroy_task(&self, id: &str) -> Result<(), Status> {
        self.kill_and_delete_task(id).await?;
        self.unmount_idmapped_rootfs(id);
        Ok(())
    }

    /// [`Self::destroy_task`] for the undo of a failed creation: tried again while the
    /// connection under it is broken.
    pub(crate) async fn destroy_task_for_undo(&self, id: &str) -> Result<(), Status> {
        undo_step_retried("destroy the task", id, || async {
            crate::failpoint::hit("undo_destroy_task")
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
            self.destroy_task(id).await
        })
        .await
    }

    /// Deletes the containerd record of a failed creation, tried again while the
    /// connection under it is broken.
    pub(crate) async fn delete_record_for_undo(&self, id: &str) -> Result<(), Status> {
        undo_step_retried("delete the record", id, || async {
            self.containerd.delete_container(id).await.map_err(internal)
        })
        .await
    }

    async fn kill_and_delete_task(&self, id: &str) -> Result<(), Status> {
        let Some(state) = self.containerd.task_state(id).await.map_err(internal)? else {
            return Ok(());
        };
        if state.exit.is_none() {
            self.containerd
                .kill_task(id, "", nix::sys::signal::Signal::SIGKILL as u32, true)
                .await
                .map_err(internal)?;
            match tokio::time::timeout(KILL_WAIT, self.containerd.wait_task(id, "")).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) if e.is_not_found() => {}
                Ok(Err(e)) => return Err(internal(e)),
                Err(_) => {
                    return Err(Status::deadline_exceeded(format!(
                        "task {id} did not exit within {KILL_WAIT:?} of SIGKILL"
                    )));
                }
            }
        }
        if let Err(e) = self.containerd.delete_task(id).await {
            // The shim may be going away under us; what matters is that the task is gone.
            if self
                .containerd
                .task_state(id)
                .await
                .map_err(internal)?
                .is_some()
            {
                return Err(internal(e));
            }
        }
        Ok(())
    }

    /// Stops a sandbox: its task, its network, its /dev/shm and its netns. Idempotent.
    pub(crate) async fn stop_sandbox(&self, sandbox: &Arc<Sandbox>) -> Result<(), Status> {
        let metadata = sandbox.metadata();
        let id = metadata.id.clone();
        // The pod's containers go first, forcibly and all at once, as containerd's CRI
        // stops them.
        // Each runs to its end, also when another fails: a retry finds less to do.
        let containers = self.containers.in_sandbox(&id);
        futures::future::join_all(
            containers
                .iter()
                .map(|container| self.stop_container_process(container, Duration::ZERO)),
        )
        .await
        .into_iter()
        .collect::<Result<Vec<()>, Status>>()?;
        // The netns is pinned apart from the pause task, so the network is torn down while
        // the task is killed and deleted.
        let (task, network) = tokio::join!(
            self.stop_pause_task(sandbox),
            self.release_network(sandbox, &metadata)
        );
        task.and(network)?;
        self.unmount_sandbox_shm(&id);
        self.unmount_image_volumes(&id).await?;
        if !metadata.netns_path.is_empty() {
            let netns = Path::new(&metadata.netns_path);
            if !crate::sys::netns::is_pinned_by_crius(netns) {
                return Err(Status::internal(format!(
                    "the pod's record names {} as its netns, which crius did not make: not removed",
                    netns.display()
                )));
            }
            crate::sys::netns::remove(netns)
                .await
                .map_err(|e| Status::internal(e.to_string()))?;
        }
        sandbox.update_status(|s| s.netns_closed = true);
        Ok(())
    }

    /// Kills and deletes the pause task; the sandbox is NOTREADY after.
    async fn stop_pause_task(&self, sandbox: &Arc<Sandbox>) -> Result<(), Status> {
        let id = sandbox.id();
        self.destroy_task(&id).await?;
        let was_ready = sandbox.status().state == SandboxState::Ready;
        sandbox.update_status(|s| {
            s.state = SandboxState::NotReady;
            s.pid = 0;
        });
        if was_ready {
            self.emit_container_event(
                &id,
                &id,
                crate::api::v1::ContainerEventType::ContainerStoppedEvent,
            );
        }
        Ok(())
    }

    /// Runs CNI DEL for the pod (from its cached result), once.
    async fn release_network(
        &self,
        sandbox: &Arc<Sandbox>,
        metadata: &SandboxMetadata,
    ) -> Result<(), Status> {
        if metadata.netns_path.is_empty() || sandbox.status().network_released {
            return Ok(());
        }
        self.cni_network
            .teardown(&pod_ref(metadata))
            .await
            .map_err(|e| {
                Status::internal(format!(
                    "failed to tear down the network of sandbox {}: {e}",
                    metadata.id
                ))
            })?;
        sandbox.update_status(|s| s.network_released = true);
        Ok(())
    }

    /// Whether `sandbox` is still the one stored under its ID (not removed while a caller
    /// waited for its lock).
    pub(crate) fn is_sandbox_stored(&self, sandbox: &Arc<Sandbox>) -> bool {
        self.sandboxes
            .get(&sandbox.id())
            .ok()
            .flatten()
            .is_some_and(|stored| Arc::ptr_eq(&stored, sandbox))
    }

    /// The sandbox with ID (or unique prefix) `id`.
    pub(crate) fn find_sandbox(&self, id: &str) -> Result<Option<Arc<Sandbox>>, Status> {
        if id.is_empty() {
            return Err(Status::invalid_argument("pod sandbox ID is required"));
        }
        self.sandboxes
            .get(id)
            .map_err(|e| Status::invalid_argument(e.to_string()))
    }
}

/// The hostname a pod's containers get in `/etc/hostname` and `HOSTNAME`: the pod's, or the
/// node's when it names none (containerd's rule, host network or not).
pub(crate) fn pod_hostname(config: &PodSandboxConfig) -> String {
    if config.hostname.is_empty() {
        crate::sys::host::hostname()
    } else {
        config.hostname.clone()
    }
}

/// CNI's view of a sandbox.
pub fn pod_ref(metadata: &SandboxMetadata) -> PodRef {
    let pod = metadata.config.metadata.clone().unwrap_or_default();
    PodRef {
        id: metadata.id.clone(),
        name: pod.name,
        namespace: pod.namespace,
        uid: pod.uid,
        netns: metadata.netns_path.clone(),
    }
}

/// Runs `step` of an undo, again while the connection under it is broken (containerd
/// restarting), for up to `UNDO_RETRY_FOR`.
async fn undo_step_retried<F, Fut>(what: &str, id: &str, mut step: F) -> Result<(), Status>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), Status>>,
{
    let until = tokio::time::Instant::now() + UNDO_RETRY_FOR;
    let mut pause = Duration::from_millis(100);
    loop {
        match step().await {
            Err(e)
                if crate::containerd::connection_lost(&e)
                    && tokio::time::Instant::now() + pause < until =>
            {
                tracing::info!(id, error = %e.message(), "undo: trying again to {what} in {pause:?}");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            other => return other,
        }
    }
}

pub fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_from_dns_config() {
        let text = resolv_conf(&DnsConfig {
            servers: vec!["10.0.0.10".into(), "8.8.8.8".into()],
            searches: vec![
                "default.svc.cluster.local".into(),
                "svc.cluster.local".into(),
            ],
            options: vec!["ndots:5".into()],
        });
        assert_eq!(
            text,
            "nameserver 10.0.0.10\nnameserver 8.8.8.8\nsearch default.svc.cluster.local svc.cluster.local\noptions ndots:5\n"
        );
    }

    #[test]
    fn ids_are_64_hex_digits() {
        let id = new_id();
        assert_eq!(id.len(), 64);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(id, new_id());
    }
}
