//! The OCI annotations containerd's CRI puts on specs; shim and runtime tooling key on them.

pub const CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
pub const CONTAINER_TYPE_SANDBOX: &str = "sandbox";
pub const CONTAINER_TYPE_CONTAINER: &str = "container";
pub const SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
pub const SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";
pub const SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
pub const SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";
pub const SANDBOX_LOG_DIRECTORY: &str = "io.kubernetes.cri.sandbox-log-directory";
pub const CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
pub const IMAGE_NAME: &str = "io.kubernetes.cri.image-name";
/// crius's mark on a sandbox spec its shim holds without a pause container; never passed
/// through from a pod's or container's annotations.
pub const SANDBOX_HOLDER: &str = "io.crius.sandbox-holder";
/// crius's mark on a container spec whose execs its shim leaves to the OCI runtime (the
/// handler's `exec_with_runtime`); never passed through either.
pub const EXEC_WITH_RUNTIME: &str = "io.crius.exec-with-runtime";
/// The marks only crius sets.
pub const CRIUS_MARKS: [&str; 2] = [SANDBOX_HOLDER, EXEC_WITH_RUNTIME];
