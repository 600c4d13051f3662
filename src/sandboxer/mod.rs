//! crius as containerd 2.x's sandbox controller (`[proxy_plugins.<name>] type =
//! "sandbox"`): containerd's own CRI hands it the pods of a runtime handler whose
//! `sandboxer` names the plugin. Each pod runs on a crius shim of its own, which holds the
//! pod (no pause container) and serves its containers' tasks; Start answers that shim's
//! address as a task API v3 endpoint, so containerd sends the containers straight there.
//!
//! The state is the pods' bundles under `<state>/sandboxer/<namespace>/<id>`: each holds
//! the `address` its shim wrote, so a restarted crius finds the running shims again.

mod service;
pub mod shim;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

pub use service::serve;
use shim::{CALL_TIMEOUT, Launch, ShimClient};

use crate::protos::containerd::runtime::sandbox::v1 as shim_api;
use crate::protos::containerd::services::sandbox::v1 as api;

/// The task API version a crius shim serves, which Start answers.
const TASK_API_VERSION: u32 = 3;
/// Longest sandbox id or namespace taken (containerd's own ids are 64 hex digits).
const MAX_NAME: usize = 255;

#[derive(Debug, thiserror::Error)]
pub enum SandboxerError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("sandbox {0} not found")]
    NotFound(String),
    #[error("sandbox {0} exists already")]
    AlreadyExists(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Shim(String),
    #[error("{method}: {message}")]
    Status {
        method: String,
        code: tonic::Code,
        message: String,
    },
}

impl SandboxerError {
    /// A failed ttrpc call: the shim's own status, or its connection gone (Unavailable,
    /// which containerd retries or treats as a pod that is gone).
    fn from_ttrpc(method: &str, error: ttrpc::Error) -> Self {
        match error {
            ttrpc::Error::RpcStatus(status) => Self::Status {
                method: method.to_string(),
                code: tonic::Code::from_i32(status.code.value()),
                message: status.message,
            },
            other => Self::Unavailable(format!("{method}: shim unreachable: {other}")),
        }
    }

    fn code(&self) -> tonic::Code {
        match self {
            Self::InvalidArgument(_) => tonic::Code::InvalidArgument,
            Self::NotFound(_) => tonic::Code::NotFound,
            Self::AlreadyExists(_) => tonic::Code::AlreadyExists,
            Self::Unavailable(_) => tonic::Code::Unavailable,
            Self::Shim(_) => tonic::Code::Internal,
            Self::Status { code, .. } => *code,
        }
    }

    fn is_gone(&self) -> bool {
        matches!(
            self.code(),
            tonic::Code::NotFound | tonic::Code::Unavailable
        )
    }
}

impl From<SandboxerError> for tonic::Status {
    fn from(e: SandboxerError) -> Self {
        tonic::Status::new(e.code(), e.to_string())
    }
}

/// A name that becomes one path component: no separators, no dot names, bounded.
fn path_component(what: &str, name: &str) -> Result<(), SandboxerError> {
    let bad = name.is_empty()
        || name.len() > MAX_NAME
        || name == "."
        || name == ".."
        || name.contains(['/', '\0']);
    if bad {
        return Err(SandboxerError::InvalidArgument(format!(
            "{what} {name:?} is not a valid name"
        )));
    }
    Ok(())
}

pub struct SandboxController {
    root: PathBuf,
    shim_binary: PathBuf,
    containerd_address: PathBuf,
    containerd_ttrpc_address: PathBuf,
    shims: Mutex<HashMap<(String, String), ShimClient>>,
}

impl SandboxController {
    pub fn new(state: &Path, shim_binary: &Path, containerd_address: &Path) -> Self {
        let mut ttrpc = containerd_address.as_os_str().to_owned();
        ttrpc.push(".ttrpc");
        Self {
            root: state.join("sandboxer"),
            shim_binary: shim_binary.to_path_buf(),
            containerd_address: containerd_address.to_path_buf(),
            containerd_ttrpc_address: PathBuf::from(ttrpc),
            shims: Mutex::new(HashMap::new()),
        }
    }

    fn bundle(&self, namespace: &str, id: &str) -> Result<PathBuf, SandboxerError> {
        path_component("namespace", namespace)?;
        path_component("sandbox id", id)?;
        Ok(self.root.join(namespace).join(id))
    }

    fn known(&self, namespace: &str, id: &str) -> Option<ShimClient> {
        self.shims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(namespace.to_string(), id.to_string()))
            .cloned()
    }

    fn remember(&self, namespace: &str, id: &str, shim: ShimClient) {
        self.shims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((namespace.to_string(), id.to_string()), shim);
    }

    fn forget(&self, namespace: &str, id: &str) {
        self.shims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(namespace.to_string(), id.to_string()));
    }

    /// The pod's shim: known, or found again from the address in its bundle.
    async fn shim(&self, namespace: &str, id: &str) -> Result<ShimClient, SandboxerError> {
        if let Some(shim) = self.known(namespace, id) {
            return Ok(shim);
        }
        let bundle = self.bundle(namespace, id)?;
        let dir = bundle.clone();
        let address = blocking(move || Ok(shim::recorded_address(&dir)))
            .await?
            .ok_or_else(|| SandboxerError::NotFound(id.into()))?;
        let shim = ShimClient::connect(&address, &bundle).await?;
        tracing::info!(sandbox = id, %address, "found the pod's shim again");
        self.remember(namespace, id, shim.clone());
        Ok(shim)
    }

    pub async fn create(
        &self,
        namespace: &str,
        req: api::ControllerCreateRequest,
    ) -> Result<(), SandboxerError> {
        let id = req.sandbox_id.clone();
        let bundle = self.bundle(namespace, &id)?;
        if self.known(namespace, &id).is_some() {
            return Err(SandboxerError::AlreadyExists(id));
        }
        // Making the bundle claims the ID: of two Creates in flight for one pod only one
        // goes on (the other's clean-up would shut down the first one's shim).
        let dir = bundle.clone();
        let claimed = blocking(move || claim_bundle(&dir)).await?;
        if !claimed {
            return Err(SandboxerError::AlreadyExists(id));
        }
        let made = self.start_shim(namespace, &id, &bundle, req).await;
        if made.is_err() {
            // A start that failed late (or timed out) may have left its shim serving.
            if let Some(address) = shim::recorded_address(&bundle)
                && let Ok(shim) = ShimClient::connect(&address, &bundle).await
            {
                shutdown_shim(&shim, &id).await;
            }
            let _ = blocking(move || remove_dir(&bundle)).await;
        }
        made
    }

    async fn start_shim(
        &self,
        namespace: &str,
        id: &str,
        bundle: &Path,
        req: api::ControllerCreateRequest,
    ) -> Result<(), SandboxerError> {
        let address = shim::start(&Launch {
            binary: &self.shim_binary,
            namespace,
            containerd_address: &self.containerd_address,
            containerd_ttrpc_address: &self.containerd_ttrpc_address,
            id,
            bundle,
        })
        .await?;
        let shim = ShimClient::connect(&address, bundle).await?;
        let request = shim_api::CreateSandboxRequest {
            sandbox_id: id.to_string(),
            bundle_path: bundle.display().to_string(),
            rootfs: req.rootfs,
            options: req.options,
            netns_path: req.netns_path,
            annotations: req.annotations,
        };
        let created: Result<shim_api::CreateSandboxResponse, _> = shim
            .call("CreateSandbox", &request, Some(CALL_TIMEOUT))
            .await;
        if let Err(e) = created {
            shutdown_shim(&shim, id).await;
            return Err(e);
        }
        tracing::info!(sandbox = id, %address, "pod's shim started");
        self.remember(namespace, id, shim);
        Ok(())
    }

    pub async fn start(
        &self,
        namespace: &str,
        id: &str,
    ) -> Result<api::ControllerStartResponse, SandboxerError> {
        let shim = self.shim(namespace, id).await?;
        let request = shim_api::StartSandboxRequest {
            sandbox_id: id.to_string(),
        };
        let started: shim_api::StartSandboxResponse = shim
            .call("StartSandbox", &request, Some(CALL_TIMEOUT))
            .await?;
        Ok(api::ControllerStartResponse {
            sandbox_id: id.to_string(),
            pid: started.pid,
            created_at: started.created_at,
            labels: HashMap::new(),
            address: format!("ttrpc+{}", shim.address),
            version: TASK_API_VERSION,
        })
    }

    pub async fn platform(
        &self,
        namespace: &str,
        id: &str,
    ) -> Result<api::ControllerPlatformResponse, SandboxerError> {
        let shim = self.shim(namespace, id).await?;
        let request = shim_api::PlatformRequest {
            sandbox_id: id.to_string(),
        };
        let answer: shim_api::PlatformResponse =
            shim.call("Platform", &request, Some(CALL_TIMEOUT)).await?;
        Ok(api::ControllerPlatformResponse {
            platform: answer.platform,
        })
    }

    /// Stops the pod's holder; a pod whose shim is gone is stopped already.
    pub async fn stop(
        &self,
        namespace: &str,
        id: &str,
        timeout_secs: u32,
    ) -> Result<(), SandboxerError> {
        let stopped = async {
            let shim = self.shim(namespace, id).await?;
            let request = shim_api::StopSandboxRequest {
                sandbox_id: id.to_string(),
                timeout_secs,
            };
            let deadline = CALL_TIMEOUT + Duration::from_secs(timeout_secs.into());
            shim.call::<_, shim_api::StopSandboxResponse>("StopSandbox", &request, Some(deadline))
                .await
        };
        match stopped.await {
            Ok(_) => Ok(()),
            Err(e) if e.is_gone() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Waits for the pod's exit. A shim that goes away while waited on took the pod with it.
    pub async fn wait(
        &self,
        namespace: &str,
        id: &str,
    ) -> Result<api::ControllerWaitResponse, SandboxerError> {
        let request = shim_api::WaitSandboxRequest {
            sandbox_id: id.to_string(),
        };
        let waited = match self.shim(namespace, id).await {
            Ok(shim) => {
                shim.call::<_, shim_api::WaitSandboxResponse>("WaitSandbox", &request, None)
                    .await
            }
            Err(e) => Err(e),
        };
        // Unavailable here is the shim's, not crius's: containerd would retry it forever.
        match waited {
            Ok(exit) => Ok(api::ControllerWaitResponse {
                exit_status: exit.exit_status,
                exited_at: exit.exited_at,
            }),
            Err(SandboxerError::Unavailable(reason)) => {
                tracing::warn!(sandbox = id, %reason, "the pod's shim went away");
                self.forget(namespace, id);
                Ok(api::ControllerWaitResponse {
                    exit_status: 255,
                    exited_at: Some(SystemTime::now().into()),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// The pod's state and its shim's address; a pod whose shim is gone is reported exited,
    /// as containerd's own shim controller does.
    pub async fn status(
        &self,
        namespace: &str,
        id: &str,
        verbose: bool,
    ) -> Result<api::ControllerStatusResponse, SandboxerError> {
        let answered = async {
            let shim = self.shim(namespace, id).await?;
            let request = shim_api::SandboxStatusRequest {
                sandbox_id: id.to_string(),
                verbose,
            };
            let status: shim_api::SandboxStatusResponse = shim
                .call("SandboxStatus", &request, Some(CALL_TIMEOUT))
                .await?;
            Ok::<_, SandboxerError>((status, shim.address))
        };
        match answered.await {
            Ok((status, address)) => Ok(api::ControllerStatusResponse {
                sandbox_id: id.to_string(),
                pid: status.pid,
                state: status.state,
                info: status.info,
                created_at: status.created_at,
                exited_at: status.exited_at,
                extra: status.extra,
                address: format!("ttrpc+{address}"),
                version: TASK_API_VERSION,
            }),
            Err(e) if e.is_gone() => Ok(api::ControllerStatusResponse {
                sandbox_id: id.to_string(),
                state: "SANDBOX_NOTREADY".to_string(),
                exited_at: Some(SystemTime::now().into()),
                ..Default::default()
            }),
            Err(e) => Err(e),
        }
    }

    /// Ends the pod's shim and removes its bundle. Idempotent.
    pub async fn shutdown(&self, namespace: &str, id: &str) -> Result<(), SandboxerError> {
        let bundle = self.bundle(namespace, id)?;
        match self.shim(namespace, id).await {
            Ok(shim) => shutdown_shim(&shim, id).await,
            Err(e) if e.is_gone() => {}
            Err(e) => return Err(e),
        }
        self.forget(namespace, id);
        blocking(move || remove_dir(&bundle)).await
    }

    pub async fn metrics(
        &self,
        namespace: &str,
        id: &str,
    ) -> Result<api::ControllerMetricsResponse, SandboxerError> {
        let shim = self.shim(namespace, id).await?;
        let request = shim_api::SandboxMetricsRequest {
            sandbox_id: id.to_string(),
        };
        let answer: shim_api::SandboxMetricsResponse = shim
            .call("SandboxMetrics", &request, Some(CALL_TIMEOUT))
            .await?;
        Ok(api::ControllerMetricsResponse {
            metrics: answer.metrics,
        })
    }

    /// Nothing of a pod's record is the shim's to keep (containerd's own shim controller
    /// keeps nothing either); a pod crius does not hold is refused.
    pub async fn update(&self, namespace: &str, id: &str) -> Result<(), SandboxerError> {
        self.shim(namespace, id).await.map(|_| ())
    }
}

/// Asks the shim to end and waits (a little) for its socket to go.
async fn shutdown_shim(shim: &ShimClient, id: &str) {
    let request = shim_api::ShutdownSandboxRequest {
        sandbox_id: id.to_string(),
    };
    let ended: Result<shim_api::ShutdownSandboxResponse, _> = shim
        .call("ShutdownSandbox", &request, Some(CALL_TIMEOUT))
        .await;
    if let Err(e) = ended
        && !e.is_gone()
    {
        tracing::warn!(sandbox = id, error = %e, "shim shutdown failed");
        return;
    }
    let socket = PathBuf::from(shim.address.trim_start_matches("unix://"));
    for _ in 0..50 {
        if !socket.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tracing::warn!(
        sandbox = id,
        "the pod's shim still serves after its shutdown"
    );
}

/// Runs file system work off the async worker threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, SandboxerError> + Send + 'static,
) -> Result<T, SandboxerError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| SandboxerError::Shim(format!("file system work: {e}")))?
}

/// Where a crius shim mounts a pod's /dev/shm in its bundle: a shim that died without its
/// shutdown leaves it mounted.
const POD_SHM: &str = "pod/shm";

fn remove_dir(path: &Path) -> Result<(), SandboxerError> {
    let shm = path.join(POD_SHM);
    if let Err(e) = crate::sys::mount::unmount_all(&shm) {
        tracing::warn!(path = %shm.display(), error = %e, "unmounting a dead shim's pod /dev/shm");
    }
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(SandboxerError::Shim(format!(
            "remove {}: {e}",
            path.display()
        ))),
    }
}

/// Makes a pod's bundle directory (and its parents); false when it exists already.
fn claim_bundle(bundle: &Path) -> Result<bool, SandboxerError> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(parent) = bundle.parent() {
        create_private_dir(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(bundle) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(SandboxerError::Shim(format!(
            "create {}: {e}",
            bundle.display()
        ))),
    }
}

fn create_private_dir(path: &Path) -> Result<(), SandboxerError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|e| SandboxerError::Shim(format!("create {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_would_leave_the_state_dir_are_refused() {
        let controller = SandboxController::new(
            Path::new("/run/crius"),
            Path::new("shim"),
            Path::new("/run/containerd/containerd.sock"),
        );
        assert_eq!(
            controller.bundle("k8s.io", "abc").expect("bundle"),
            Path::new("/run/crius/sandboxer/k8s.io/abc")
        );
        for (ns, id) in [
            ("k8s.io", ".."),
            ("..", "abc"),
            ("k8s.io", "a/b"),
            ("", "x"),
            ("k8s.io", ""),
        ] {
            assert!(controller.bundle(ns, id).is_err(), "{ns:?} {id:?}");
        }
        assert!(controller.bundle("k8s.io", &"x".repeat(256)).is_err());
        assert_eq!(
            controller.containerd_ttrpc_address,
            Path::new("/run/containerd/containerd.sock.ttrpc")
        );
    }

    /// Two Creates of one pod in flight: the second is refused at once, and the first's
    /// failure leaves the ID free again.
    #[tokio::test]
    async fn a_create_in_flight_claims_the_pod_id() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let shim = dir.path().join("slow-shim");
        std::fs::write(&shim, "#!/bin/sh\nsleep 1\necho cannot start >&2\nexit 1\n")
            .expect("write shim");
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755))
            .expect("chmod shim");
        let controller =
            SandboxController::new(dir.path(), &shim, Path::new("/nonexistent/containerd.sock"));
        let request = || api::ControllerCreateRequest {
            sandbox_id: "pod".to_string(),
            ..Default::default()
        };
        let (first, second) = tokio::join!(
            controller.create("k8s.io", request()),
            controller.create("k8s.io", request())
        );
        let refused =
            |r: &Result<(), SandboxerError>| matches!(r, Err(SandboxerError::AlreadyExists(_)));
        let failed = |r: &Result<(), SandboxerError>| matches!(r, Err(SandboxerError::Shim(e)) if e.contains("cannot start"));
        assert!(
            refused(&first) && failed(&second) || failed(&first) && refused(&second),
            "{first:?} {second:?}"
        );
        assert!(!dir.path().join("sandboxer/k8s.io/pod").exists());
        let again = controller.create("k8s.io", request()).await;
        assert!(matches!(again, Err(SandboxerError::Shim(_))), "{again:?}");
    }

    #[test]
    fn shim_errors_keep_their_code_and_a_lost_shim_is_unavailable() {
        let status = ttrpc::get_status(ttrpc::Code::NOT_FOUND, "sandbox x");
        let e = SandboxerError::from_ttrpc("StopSandbox", ttrpc::Error::RpcStatus(status));
        assert_eq!(e.code(), tonic::Code::NotFound);
        assert!(e.is_gone());
        let e = SandboxerError::from_ttrpc("WaitSandbox", ttrpc::Error::RemoteClosed);
        assert_eq!(e.code(), tonic::Code::Unavailable);
        let status = ttrpc::get_status(ttrpc::Code::UNIMPLEMENTED, "userns");
        let e = SandboxerError::from_ttrpc("CreateSandbox", ttrpc::Error::RpcStatus(status));
        assert_eq!(tonic::Status::from(e).code(), tonic::Code::Unimplemented);
    }
}
