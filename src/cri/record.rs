//! The record format: what crius writes into containerd and on disk for its pods and
//! containers, and reads back on recovery. One place for it, so that the writers (the
//! handlers) and the reader (`recovery.rs`) cannot drift apart.

use std::collections::HashMap;

use tonic::Status;

use crate::store::{ContainerMetadata, SandboxMetadata};

/// containerd label that tells sandboxes and containers apart, as containerd's CRI sets it.
pub const KIND_LABEL: &str = "io.cri-containerd.kind";
pub const KIND_SANDBOX: &str = "sandbox";
pub const KIND_CONTAINER: &str = "container";

/// The extension on the containerd container that holds crius's sandbox metadata.
pub const SANDBOX_METADATA_EXTENSION: &str = "io.crius.sandbox.metadata";
const SANDBOX_METADATA_TYPE: &str = "crius.io/SandboxMetadata/v1";
/// The extension on the containerd container that holds crius's container metadata.
pub const CONTAINER_METADATA_EXTENSION: &str = "io.crius.container.metadata";
const CONTAINER_METADATA_TYPE: &str = "crius.io/ContainerMetadata/v1";

/// In a sandbox's root dir: the path of its netns, written before the netns is made.
pub const NETNS_NOTE: &str = "netns";
/// In a sandbox's root dir: present once RunPodSandbox finished making it.
pub const STARTED_MARK: &str = "started";
/// Under a container's root dir: where the image's rootfs is mounted read-only while
/// CreateContainer reads it.
pub const ROOTFS_VIEW_DIR: &str = "rootfs-view";
/// The lease of a pod's image volumes: this prefix and the pod's ID.
pub const VOLUME_LEASE_PREFIX: &str = "crius-image-volumes-";
/// The exit code recorded when a task vanished without telling how it ended.
pub const UNKNOWN_EXIT_CODE: u32 = 255;

/// Sandbox metadata as a containerd container extension.
pub fn sandbox_metadata_extension(
    metadata: &SandboxMetadata,
) -> Result<HashMap<String, prost_types::Any>, Status> {
    extension(
        SANDBOX_METADATA_EXTENSION,
        SANDBOX_METADATA_TYPE,
        metadata,
        "sandbox",
    )
}

/// The sandbox metadata of a containerd container's extensions, if they carry one.
pub fn sandbox_metadata_from_extensions(
    extensions: &HashMap<String, prost_types::Any>,
) -> Option<Result<SandboxMetadata, serde_json::Error>> {
    from_extensions(extensions, SANDBOX_METADATA_EXTENSION)
}

/// Container metadata as a containerd container extension.
pub fn container_metadata_extension(
    metadata: &ContainerMetadata,
) -> Result<HashMap<String, prost_types::Any>, Status> {
    extension(
        CONTAINER_METADATA_EXTENSION,
        CONTAINER_METADATA_TYPE,
        metadata,
        "container",
    )
}

/// The container metadata of a containerd container's extensions, if they carry one.
pub fn container_metadata_from_extensions(
    extensions: &HashMap<String, prost_types::Any>,
) -> Option<Result<ContainerMetadata, serde_json::Error>> {
    from_extensions(extensions, CONTAINER_METADATA_EXTENSION)
}

fn extension(
    name: &str,
    type_url: &str,
    metadata: &impl serde::Serialize,
    what: &str,
) -> Result<HashMap<String, prost_types::Any>, Status> {
    let value = serde_json::to_vec(metadata)
        .map_err(|e| Status::internal(format!("encoding {what} metadata: {e}")))?;
    Ok(HashMap::from([(
        name.to_string(),
        prost_types::Any {
            type_url: type_url.to_string(),
            value,
        },
    )]))
}

fn from_extensions<T: serde::de::DeserializeOwned>(
    extensions: &HashMap<String, prost_types::Any>,
    name: &str,
) -> Option<Result<T, serde_json::Error>> {
    extensions
        .get(name)
        .map(|any| serde_json::from_slice(&any.value))
}
