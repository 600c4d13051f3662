//! Unpacking a layer into the snapshotter under its chain ID, as containerd's unpacker does:
//! prepare an active snapshot on the parent, apply the layer, check the diff ID, commit.

use std::collections::HashMap;

use containerd_client::types::Descriptor as ContainerdDescriptor;

use super::manifest::Descriptor;
use crate::containerd::Containerd;

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error(transparent)]
    Containerd(#[from] crate::containerd::ContainerdError),
    #[error(transparent)]
    Failpoint(#[from] crate::failpoint::Triggered),
    #[error("layer {layer} unpacked to {actual} but the config says {expected}")]
    DiffIdMismatch {
        layer: String,
        actual: String,
        expected: String,
    },
}

/// Applies one layer onto its parent snapshot and commits it under its chain ID.
pub async fn unpack_layer(
    containerd: &Containerd,
    snapshotter: &str,
    lease: &str,
    layer: &Descriptor,
    diff_id: &str,
    chain_id: &str,
    parent: &str,
) -> Result<(), UnpackError> {
    // Under the lease before it is looked for: a collection running meanwhile (an image
    // sharing this layer was just removed) then keeps a snapshot that is found.
    containerd
        .lease_snapshot(lease, snapshotter, chain_id)
        .await?;
    if containerd.snapshot_exists(snapshotter, chain_id).await? {
        crate::failpoint::hit("unpack_found_snapshot").await?;
        return Ok(());
    }
    let key = format!(
        "extract-{}-{:08x} {chain_id}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
        rand::random::<u32>()
    );
    let labels = HashMap::from([(
        "containerd.io/snapshot.ref".to_string(),
        chain_id.to_string(),
    )]);
    let mounts = containerd
        .prepare_snapshot(snapshotter, &key, parent, labels, Some(lease))
        .await?;
    let applied = containerd
        .apply_diff(to_containerd(layer), mounts, Some(lease))
        .await;
    let applied = match applied {
        Ok(applied) => applied,
        Err(e) => {
            let _ = containerd.remove_snapshot(snapshotter, &key).await;
            return Err(e.into());
        }
    };
    if applied.digest != diff_id {
        let _ = containerd.remove_snapshot(snapshotter, &key).await;
        return Err(UnpackError::DiffIdMismatch {
            layer: layer.digest.clone(),
            actual: applied.digest,
            expected: diff_id.to_string(),
        });
    }
    match containerd
        .commit_snapshot(snapshotter, chain_id, &key, HashMap::new(), Some(lease))
        .await
    {
        Ok(()) => Ok(()),
        // Unpacked concurrently by another pull: theirs is as good as ours.
        Err(e) if e.is_already_exists() => {
            let _ = containerd.remove_snapshot(snapshotter, &key).await;
            Ok(())
        }
        Err(e) => {
            let _ = containerd.remove_snapshot(snapshotter, &key).await;
            Err(e.into())
        }
    }
}

pub fn to_containerd(desc: &Descriptor) -> ContainerdDescriptor {
    ContainerdDescriptor {
        media_type: desc.media_type.clone(),
        digest: desc.digest.clone(),
        size: desc.size,
        annotations: desc.annotations.clone(),
    }
}
