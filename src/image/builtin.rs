//! crius's built-in sandbox image: one uncompressed layer holding the static pause program
//! (compiled by `build.rs`), imported into containerd at start-up when it is not there yet.
//! Its documents are deterministic, so every start computes the same digests.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use bytes::Bytes;
use serde_json::json;

use super::load::ImageDocuments;
use super::unpack::{UnpackError, to_containerd, unpack_layer};
use crate::containerd::content::WriteError;
use crate::containerd::{Containerd, ContainerdError};
use crate::imagespec::manifest::{
    Descriptor, ImageConfigFile, Manifest, OCI_CONFIG, OCI_MANIFEST, sha256_digest,
};
use crate::store::Image;

/// The name of the built-in sandbox image.
pub const BUILTIN_PAUSE_IMAGE: &str = concat!("crius.local/pause:", env!("CARGO_PKG_VERSION"));
const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";

#[derive(Debug, thiserror::Error)]
pub enum BuiltinError {
    #[error("building the pause image: {0}")]
    Build(String),
    #[error(transparent)]
    Containerd(#[from] ContainerdError),
    #[error(transparent)]
    Unpack(#[from] UnpackError),
    #[error("writing the pause image: {0}")]
    Write(String),
}

/// The image's documents and layer, built in memory.
struct Documents {
    layer: Bytes,
    layer_desc: Descriptor,
    config: Bytes,
    config_desc: Descriptor,
    manifest: Bytes,
    manifest_desc: Descriptor,
}

fn descriptor(media_type: &str, data: &[u8]) -> Descriptor {
    Descriptor {
        media_type: media_type.to_string(),
        digest: sha256_digest(data),
        size: data.len() as i64,
        platform: None,
        annotations: HashMap::new(),
    }
}

/// A tar stream holding `/pause`, with fixed metadata.
fn pause_layer() -> Result<Vec<u8>, BuiltinError> {
    let binary = crate::protos::PAUSE_BINARY;
    let mut header = tar::Header::new_gnu();
    header.set_size(binary.len() as u64);
    header.set_mode(0o755);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Regular);
    let mut builder = tar::Builder::new(Vec::new());
    builder
        .append_data(&mut header, "pause", binary)
        .map_err(|e| BuiltinError::Build(e.to_string()))?;
    builder
        .into_inner()
        .map_err(|e| BuiltinError::Build(e.to_string()))
}

fn documents() -> Result<Documents, BuiltinError> {
    let layer = pause_layer()?;
    let layer_desc = descriptor(LAYER_MEDIA_TYPE, &layer);
    let platform = crate::imagespec::manifest::Platform::host();
    let config = json!({
        "architecture": platform.architecture,
        "os": platform.os,
        "config": {"Entrypoint": ["/pause"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [layer_desc.digest]},
    })
    .to_string();
    let config_desc = descriptor(OCI_CONFIG, config.as_bytes());
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": config_desc,
        "layers": [layer_desc],
    })
    .to_string();
    let manifest_desc = descriptor(OCI_MANIFEST, manifest.as_bytes());
    Ok(Documents {
        layer: Bytes::from(layer),
        layer_desc,
        config: Bytes::from(config),
        config_desc,
        manifest: Bytes::from(manifest),
        manifest_desc,
    })
}

fn write_error(e: WriteError<std::convert::Infallible>) -> BuiltinError {
    match e {
        WriteError::Containerd(e) => BuiltinError::Containerd(e),
        other => BuiltinError::Write(other.to_string()),
    }
}

/// Makes sure the built-in pause image is in containerd (content, unpacked snapshot and
/// records), records it in `images` and returns it. Its names are locked meanwhile: a
/// RemoveImage of it comes before the look or after the record.
pub async fn ensure_pause_image(
    containerd: &Containerd,
    snapshotter: &str,
    images: &crate::store::ImageStore,
) -> Result<Image, BuiltinError> {
    let docs = documents()?;
    let config: ImageConfigFile =
        serde_json::from_slice(&docs.config).map_err(|e| BuiltinError::Build(e.to_string()))?;
    let manifest: Manifest =
        serde_json::from_slice(&docs.manifest).map_err(|e| BuiltinError::Build(e.to_string()))?;
    let image_id = docs.config_desc.digest.clone();
    let chain_id = docs.layer_desc.digest.clone();
    let names = BTreeSet::from([BUILTIN_PAUSE_IMAGE.to_string(), image_id.clone()]);

    let _names = images.lock_names(names.iter().cloned()).await;
    let present = match containerd.get_image(BUILTIN_PAUSE_IMAGE).await? {
        Some(record) => {
            record.target.as_ref().map(|t| t.digest.as_str())
                == Some(docs.manifest_desc.digest.as_str())
                && containerd.snapshot_exists(snapshotter, &chain_id).await?
        }
        None => false,
    };
    if !present {
        let lease = format!("crius-import-{:016x}", rand::random::<u64>());
        containerd
            .create_lease(&lease, Duration::from_secs(3600))
            .await?;
        let imported = import(containerd, snapshotter, &docs, &lease, &names).await;
        if let Err(e) = containerd.delete_lease(&lease, imported.is_err()).await {
            tracing::warn!(%lease, error = %e, "failed to delete import lease; it expires by itself");
        }
        imported?;
        tracing::info!(image = BUILTIN_PAUSE_IMAGE, id = %image_id, "imported the built-in pause image");
    }
    let image = ImageDocuments {
        target_size: docs.manifest_desc.size,
        manifest_size: None,
        manifest: &manifest,
        config,
    }
    .into_image(names);
    images.add(image.clone());
    Ok(image)
}

async fn import(
    containerd: &Containerd,
    snapshotter: &str,
    docs: &Documents,
    lease: &str,
    names: &BTreeSet<String>,
) -> Result<(), BuiltinError> {
    let layer_labels = HashMap::from([(
        "containerd.io/uncompressed".to_string(),
        docs.layer_desc.digest.clone(),
    )]);
    containerd
        .put_blob(
            lease,
            &docs.layer_desc.digest,
            docs.layer.clone(),
            layer_labels,
        )
        .await
        .map_err(write_error)?;
    unpack_layer(
        containerd,
        snapshotter,
        lease,
        &docs.layer_desc,
        &docs.layer_desc.digest,
        &docs.layer_desc.digest,
        "",
    )
    .await?;
    let config_labels = HashMap::from([(
        format!("containerd.io/gc.ref.snapshot.{snapshotter}"),
        docs.layer_desc.digest.clone(),
    )]);
    containerd
        .put_blob(
            lease,
            &docs.config_desc.digest,
            docs.config.clone(),
            config_labels,
        )
        .await
        .map_err(write_error)?;
    let manifest_labels = HashMap::from([
        (
            "containerd.io/gc.ref.content.config".to_string(),
            docs.config_desc.digest.clone(),
        ),
        (
            "containerd.io/gc.ref.content.l.0".to_string(),
            docs.layer_desc.digest.clone(),
        ),
    ]);
    containerd
        .put_blob(
            lease,
            &docs.manifest_desc.digest,
            docs.manifest.clone(),
            manifest_labels,
        )
        .await
        .map_err(write_error)?;
    // The built-in pause image is the sandbox image: pinned, as containerd's CRI pins it.
    let labels = super::labels::record_labels(true);
    for name in names {
        containerd
            .put_image(name, to_containerd(&docs.manifest_desc), labels.clone())
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_deterministic_and_consistent() {
        let a = documents().unwrap();
        let b = documents().unwrap();
        assert_eq!(a.manifest_desc, b.manifest_desc);
        let manifest: Manifest = serde_json::from_slice(&a.manifest).unwrap();
        assert_eq!(manifest.config.digest, a.config_desc.digest);
        assert_eq!(manifest.layers[0].digest, sha256_digest(&a.layer));
        let config: ImageConfigFile = serde_json::from_slice(&a.config).unwrap();
        assert_eq!(config.config.entrypoint, Some(vec!["/pause".to_string()]));
        assert!(a.layer.len() > crate::protos::PAUSE_BINARY.len());
    }
}
