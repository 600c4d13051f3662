//! Reading an image back from containerd: a record's target, through the index and the
//! manifest to the config, into a store [`Image`].

use std::collections::BTreeSet;

use containerd_client::services::v1::Image as ImageRecord;

use super::manifest::{
    ImageConfigFile, Index, Manifest, Platform, chain_ids, is_index, is_manifest,
};
use crate::containerd::{Containerd, ContainerdError};
use crate::store::Image;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Containerd(#[from] ContainerdError),
    #[error("image {name}: {reason}")]
    Invalid { name: String, reason: String },
}

/// The parts of an image's documents the store keeps.
pub struct ImageDocuments<'a> {
    pub target_size: i64,
    /// The chosen manifest's size when the target is an index.
    pub manifest_size: Option<i64>,
    pub manifest: &'a Manifest,
    pub config: ImageConfigFile,
}

impl ImageDocuments<'_> {
    /// The store's view, with `references` as names.
    pub fn into_image(self, references: BTreeSet<String>) -> Image {
        let layers: i64 = self.manifest.layers.iter().map(|l| l.size).sum();
        let size =
            self.target_size + self.manifest_size.unwrap_or(0) + self.manifest.config.size + layers;
        Image {
            id: self.manifest.config.digest.clone(),
            references,
            chain_id: chain_ids(&self.config.rootfs.diff_ids)
                .pop()
                .unwrap_or_default(),
            size: u64::try_from(size).unwrap_or(0),
            config: self.config,
        }
    }
}

fn invalid(name: &str, reason: impl Into<String>) -> LoadError {
    LoadError::Invalid {
        name: name.to_string(),
        reason: reason.into(),
    }
}

/// Loads the image that the containerd record `record` names.
pub async fn load_image(containerd: &Containerd, record: &ImageRecord) -> Result<Image, LoadError> {
    let name = record.name.as_str();
    let target = record
        .target
        .as_ref()
        .ok_or_else(|| invalid(name, "record has no target"))?;
    let (manifest_digest, manifest_size) = if is_index(&target.media_type) {
        let data = containerd.read_content(&target.digest).await?;
        let index: Index = serde_json::from_slice(&data)
            .map_err(|e| invalid(name, format!("index {}: {e}", target.digest)))?;
        let platform = Platform::host();
        let chosen = index.select(&platform).ok_or_else(|| {
            invalid(
                name,
                format!(
                    "no manifest for {}/{} in index {}",
                    platform.os, platform.architecture, target.digest
                ),
            )
        })?;
        (chosen.digest.clone(), Some(chosen.size))
    } else if is_manifest(&target.media_type) {
        (target.digest.clone(), None)
    } else {
        return Err(invalid(
            name,
            format!("unsupported media type {:?}", target.media_type),
        ));
    };
    let data = containerd.read_content(&manifest_digest).await?;
    let manifest: Manifest = serde_json::from_slice(&data)
        .map_err(|e| invalid(name, format!("manifest {manifest_digest}: {e}")))?;
    let data = containerd.read_content(&manifest.config.digest).await?;
    let config: ImageConfigFile = serde_json::from_slice(&data)
        .map_err(|e| invalid(name, format!("config {}: {e}", manifest.config.digest)))?;
    Ok(ImageDocuments {
        target_size: target.size,
        manifest_size,
        manifest: &manifest,
        config,
    }
    .into_image(BTreeSet::from([name.to_string()])))
}

/// Brings the store in line with containerd's record `name`: loads it when it exists,
/// forgets the name when it does not.
pub async fn sync_record(
    containerd: &Containerd,
    store: &crate::store::ImageStore,
    name: &str,
) -> Result<(), LoadError> {
    let read = store.read_generation();
    match containerd.get_image(name).await? {
        Some(record) => {
            let image = load_image(containerd, &record).await?;
            store.add_unless_removed_since(image, read.generation);
        }
        None => store.remove_reference(name),
    }
    Ok(())
}
