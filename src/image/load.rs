//! Reading an image back from containerd: a record's target, through the index and the
//! manifest to the config, into a store [`Image`].

use std::collections::BTreeSet;

use containerd_client::services::v1::Image as ImageRecord;

use crate::containerd::{Containerd, ContainerdError};
use crate::imagespec::manifest::{
    ImageConfigFile, Index, Manifest, Platform, chain_ids, is_index, is_manifest,
};
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
            pinned_references: BTreeSet::new(),
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

/// The manifest a containerd record's target leads to (through an index, the host
/// platform's), with the manifest's size when the target is an index.
pub async fn read_manifest(
    containerd: &Containerd,
    record: &ImageRecord,
) -> Result<(Manifest, Option<i64>), LoadError> {
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
    Ok((manifest, manifest_size))
}

/// Loads the image that the containerd record `record` names.
pub async fn load_image(containerd: &Containerd, record: &ImageRecord) -> Result<Image, LoadError> {
    let name = record.name.as_str();
    let target_size = record.target.as_ref().map_or(0, |t| t.size);
    let (manifest, manifest_size) = read_manifest(containerd, record).await?;
    let data = containerd.read_content(&manifest.config.digest).await?;
    let config: ImageConfigFile = serde_json::from_slice(&data)
        .map_err(|e| invalid(name, format!("config {}: {e}", manifest.config.digest)))?;
    Ok(ImageDocuments {
        target_size,
        manifest_size,
        manifest: &manifest,
        config,
    }
    .into_image(BTreeSet::from([name.to_string()]))
    .with_pinned_label(record))
}

/// Unpacks an image whose layers are in the content store but not in the snapshotter (a
/// client pulled it without unpacking), as containerd's CRI does before it makes a container
/// of such an image: each layer applied under `lease`, and the image's config labelled so
/// containerd's garbage collection keeps the snapshots with the image.
pub async fn ensure_unpacked(
    containerd: &Containerd,
    snapshotter: &str,
    image: &Image,
    lease: &str,
) -> Result<(), String> {
    let record = containerd
        .get_image(&image.id)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("image {} has no record in containerd", image.id))?;
    let (manifest, _) = read_manifest(containerd, &record)
        .await
        .map_err(|e| e.to_string())?;
    let diff_ids = &image.config.rootfs.diff_ids;
    if manifest.layers.len() != diff_ids.len() {
        return Err(format!(
            "image {}: {} layers but {} diff IDs",
            image.id,
            manifest.layers.len(),
            diff_ids.len()
        ));
    }
    let chain = chain_ids(diff_ids);
    let mut parent = String::new();
    for (i, layer) in manifest.layers.iter().enumerate() {
        super::unpack::unpack_layer(
            containerd,
            snapshotter,
            lease,
            layer,
            &diff_ids[i],
            &chain[i],
            &parent,
        )
        .await
        .map_err(|e| e.to_string())?;
        parent = chain[i].clone();
    }
    let label = format!("containerd.io/gc.ref.snapshot.{snapshotter}");
    containerd
        .set_content_labels(
            &manifest.config.digest,
            std::collections::HashMap::from([(label, parent)]),
        )
        .await
        .map_err(|e| e.to_string())?;
    tracing::info!(image = %image.id, layers = manifest.layers.len(), "image unpacked for a container");
    Ok(())
}

impl Image {
    /// Counts the record's name as pinned when its labels say so.
    fn with_pinned_label(mut self, record: &ImageRecord) -> Self {
        if record
            .labels
            .get(super::labels::PINNED_LABEL)
            .is_some_and(|v| v == "pinned")
        {
            self.pinned_references.insert(record.name.clone());
        }
        self
    }
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
            if !is_managed(&record) {
                adopt(containerd, store, &record, &image).await?;
            }
            store.add_unless_removed_since(image, read.generation);
        }
        None => store.remove_reference(name),
    }
    Ok(())
}

fn is_managed(record: &ImageRecord) -> bool {
    record
        .labels
        .get(super::labels::MANAGED_LABEL)
        .is_some_and(|v| v == "managed")
}

/// An image someone else made in crius's namespace (`ctr images pull`, a client's pull) is
/// taken in as containerd's CRI takes it: a record named by its ID is made beside it and
/// both are labelled managed, and pinned when the name is the sandbox image's (other labels
/// stay). The names are locked as a pull locks
/// them, so a RemoveImage in progress is not undone.
async fn adopt(
    containerd: &Containerd,
    store: &crate::store::ImageStore,
    record: &ImageRecord,
    image: &Image,
) -> Result<(), LoadError> {
    let _locks = store
        .lock_names([record.name.clone(), image.id.clone()])
        .await;
    // Read again under the locks: gone or taken in meanwhile, there is nothing to do.
    let Some(current) = containerd.get_image(&record.name).await? else {
        return Ok(());
    };
    let Some(target) = current.target.clone().filter(|_| !is_managed(&current)) else {
        return Ok(());
    };
    let labels = super::labels::record_labels(store.is_pinned_name(&record.name));
    containerd
        .put_image(&image.id, target.clone(), labels.clone())
        .await?;
    containerd.put_image(&record.name, target, labels).await?;
    tracing::info!(image = %record.name, id = %image.id, "image made outside crius taken in");
    Ok(())
}
