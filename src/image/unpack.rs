//! Unpacking a layer into the snapshotter under its chain ID, as containerd's unpacker does:
//! prepare an active snapshot on the parent, apply the layer, check the diff ID, commit.
//!
//! With the overlayfs snapshotter, a layer can also be applied before its parent is
//! committed (containerd 2.2+'s parallel unpack does the same): into a parentless staging
//! snapshot, handed to the diff service as an overlay upper directory so that whiteouts
//! become overlay whiteouts; once the parent is committed, the staged directory becomes the
//! upper directory of the real snapshot on the parent, which is committed under the chain
//! ID. containerd 2.2+ can do that last move in the snapshotter (a commit with a parent,
//! its overlayfs's "rebase" capability): there crius commits the staged snapshot onto its
//! parent in one call; beside 1.6 and 2.1 it renames the directory, as both snapshots are
//! still active.

use std::collections::HashMap;
use std::path::PathBuf;

use containerd_client::types::Descriptor as ContainerdDescriptor;
use containerd_client::types::Mount;

use crate::containerd::Containerd;
use crate::imagespec::manifest::Descriptor;

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error(transparent)]
    Containerd(#[from] crate::containerd::ContainerdError),
    #[error(transparent)]
    Failpoint(#[from] crate::failpoint::Triggered),
    #[error("moving the staged layer {layer} into its snapshot: {source}")]
    MoveStaged {
        layer: String,
        source: std::io::Error,
    },
    #[error(
        "containerd committed the layer {chain_id} onto {found:?}, not onto {parent}: its snapshotter no longer rebases"
    )]
    NotRebased {
        chain_id: String,
        parent: String,
        found: Option<String>,
    },
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
    crate::failpoint::hit("unpack_preparing").await?;
    let key = extract_key(chain_id);
    let Some(mounts) =
        prepare_for_chain(containerd, snapshotter, lease, &key, parent, chain_id).await?
    else {
        return Ok(());
    };
    apply_checked(containerd, snapshotter, lease, &key, layer, diff_id, mounts).await?;
    commit_extracted(containerd, snapshotter, lease, &key, chain_id).await
}

/// A unique key for an active snapshot being extracted into, as containerd names them.
fn extract_key(chain_id: &str) -> String {
    format!(
        "extract-{}-{:08x} {chain_id}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
        rand::random::<u32>()
    )
}

/// Prepares the active snapshot `key` on `parent` that is to become `chain_id`. None when
/// `chain_id` was committed meanwhile (another pull unpacking the same layer got there
/// first: containerd refuses a prepare whose target exists), which containerd's own
/// unpacker also takes as done.
async fn prepare_for_chain(
    containerd: &Containerd,
    snapshotter: &str,
    lease: &str,
    key: &str,
    parent: &str,
    chain_id: &str,
) -> Result<Option<Vec<Mount>>, UnpackError> {
    let prepared = containerd
        .prepare_snapshot(snapshotter, key, parent, ref_labels(chain_id), Some(lease))
        .await;
    match prepared {
        Ok(mounts) => Ok(Some(mounts)),
        Err(e)
            if e.is_already_exists()
                && containerd.snapshot_exists(snapshotter, chain_id).await? =>
        {
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

fn ref_labels(chain_id: &str) -> HashMap<String, String> {
    HashMap::from([(
        "containerd.io/snapshot.ref".to_string(),
        chain_id.to_string(),
    )])
}

/// Applies `layer` onto `mounts` (the active snapshot `key`) and checks its diff ID; the
/// snapshot is removed when either fails.
async fn apply_checked(
    containerd: &Containerd,
    snapshotter: &str,
    lease: &str,
    key: &str,
    layer: &Descriptor,
    diff_id: &str,
    mounts: Vec<Mount>,
) -> Result<(), UnpackError> {
    let applied = containerd
        .apply_diff(to_containerd(layer), mounts, Some(lease))
        .await;
    let applied = match applied {
        Ok(applied) => applied,
        Err(e) => {
            let _ = containerd.remove_snapshot(snapshotter, key).await;
            return Err(e.into());
        }
    };
    if applied.digest != diff_id {
        let _ = containerd.remove_snapshot(snapshotter, key).await;
        return Err(UnpackError::DiffIdMismatch {
            layer: layer.digest.clone(),
            actual: applied.digest,
            expected: diff_id.to_string(),
        });
    }
    Ok(())
}

/// Commits the active snapshot `key` under `chain_id`.
async fn commit_extracted(
    containerd: &Containerd,
    snapshotter: &str,
    lease: &str,
    key: &str,
    chain_id: &str,
) -> Result<(), UnpackError> {
    match containerd
        .commit_snapshot(snapshotter, chain_id, key, HashMap::new(), Some(lease))
        .await
    {
        Ok(()) => Ok(()),
        // Unpacked concurrently by another pull: theirs is as good as ours.
        Err(e) if e.is_already_exists() => {
            let _ = containerd.remove_snapshot(snapshotter, key).await;
            Ok(())
        }
        Err(e) => {
            let _ = containerd.remove_snapshot(snapshotter, key).await;
            Err(e.into())
        }
    }
}

/// A layer applied ahead of its parent, or why it was not.
#[derive(Debug)]
pub enum Staged {
    /// Its snapshot is there already (another pull, another image).
    Present,
    /// The snapshotter cannot take a staged layer: unpack it on its parent.
    Unsupported,
    /// Applied into a parentless snapshot.
    Ready(StagedDir),
}

/// The parentless snapshot `key` a layer was applied into, whose directory is `dir`.
#[derive(Debug)]
pub struct StagedDir {
    key: String,
    dir: PathBuf,
}

/// Applies `layer` into a parentless staging snapshot, to become the snapshot `chain_id`
/// once its parent is committed ([`finish_staged`]). Only the overlayfs snapshotter
/// stages; the staging snapshot lives under `lease`, so a pull that fails or a crius that
/// dies leaves it to containerd's collection.
pub async fn stage_layer(
    containerd: &Containerd,
    snapshotter: &str,
    lease: &str,
    layer: &Descriptor,
    diff_id: &str,
    chain_id: &str,
) -> Result<Staged, UnpackError> {
    if snapshotter != "overlayfs" {
        return Ok(Staged::Unsupported);
    }
    containerd
        .lease_snapshot(lease, snapshotter, chain_id)
        .await?;
    if containerd.snapshot_exists(snapshotter, chain_id).await? {
        return Ok(Staged::Present);
    }
    let key = format!("{} staged", extract_key(chain_id));
    let mounts = containerd
        .prepare_snapshot(snapshotter, &key, "", HashMap::new(), Some(lease))
        .await?;
    let Some((upper, mounts)) = as_upper_dir(mounts) else {
        let _ = containerd.remove_snapshot(snapshotter, &key).await;
        return Ok(Staged::Unsupported);
    };
    crate::failpoint::hit("unpack_staging").await?;
    apply_checked(containerd, snapshotter, lease, &key, layer, diff_id, mounts).await?;
    Ok(Staged::Ready(StagedDir { key, dir: upper }))
}

/// Makes the staged layer the snapshot `chain_id` on `parent` (committed by now): prepares
/// the snapshot, moves the staged directory in as its upper directory and commits it.
pub async fn finish_staged(
    containerd: &Containerd,
    snapshotter: &str,
    lease: &str,
    layer: &Descriptor,
    staged: &StagedDir,
    chain_id: &str,
    parent: &str,
) -> Result<(), UnpackError> {
    let key = extract_key(chain_id);
    let Some(mounts) =
        prepare_for_chain(containerd, snapshotter, lease, &key, parent, chain_id).await?
    else {
        let _ = containerd.remove_snapshot(snapshotter, &staged.key).await;
        return Ok(());
    };
    let moved = match overlay_upper_dir(&mounts) {
        Some(upper) => {
            let (from, to) = (staged.dir.clone(), upper);
            tokio::task::spawn_blocking(move || crate::sys::fsutil::replace_empty_dir(&from, &to))
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e)))
        }
        None => Err(std::io::Error::other(
            "the snapshot on the parent has no overlay upper directory",
        )),
    };
    let _ = containerd.remove_snapshot(snapshotter, &staged.key).await;
    if let Err(source) = moved {
        let _ = containerd.remove_snapshot(snapshotter, &key).await;
        return Err(UnpackError::MoveStaged {
            layer: layer.digest.clone(),
            source,
        });
    }
    commit_extracted(containerd, snapshotter, lease, &key, chain_id).await
}

/// Commits the staged layer as the snapshot `chain_id` on `parent` (committed by now) in
/// one call, for a snapshotter that rebases at the commit (containerd 2.2+'s overlayfs):
/// what [`finish_staged`] does in three.
pub async fn rebase_staged(
    containerd: &Containerd,
    snapshotter: &str,
    lease: &str,
    staged: &StagedDir,
    chain_id: &str,
    parent: &str,
) -> Result<(), UnpackError> {
    match containerd
        .commit_snapshot_onto(snapshotter, chain_id, &staged.key, parent, Some(lease))
        .await
    {
        Ok(()) => check_rebased(containerd, snapshotter, chain_id, parent).await,
        // Unpacked concurrently by another pull: theirs is as good as ours.
        Err(e) if e.is_already_exists() => {
            let _ = containerd.remove_snapshot(snapshotter, &staged.key).await;
            Ok(())
        }
        Err(e) => {
            let _ = containerd.remove_snapshot(snapshotter, &staged.key).await;
            Err(e.into())
        }
    }
}

/// Checks that the snapshot committed onto `parent` has it: a containerd that does not know
/// the commit's parent (replaced by an older one since it was asked) commits the layer
/// without it, a snapshot that would look complete and is not. Such a one is removed.
async fn check_rebased(
    containerd: &Containerd,
    snapshotter: &str,
    chain_id: &str,
    parent: &str,
) -> Result<(), UnpackError> {
    let found = containerd.snapshot_parent(snapshotter, chain_id).await?;
    if found.as_deref() == Some(parent) {
        return Ok(());
    }
    if found.is_some() {
        let _ = containerd.remove_snapshot(snapshotter, chain_id).await;
    }
    Err(UnpackError::NotRebased {
        chain_id: chain_id.to_string(),
        parent: parent.to_string(),
        found,
    })
}

/// The directory of a parentless overlayfs snapshot (a bind mount of its `fs`), with the
/// mounts that make the diff service apply into it as an overlay upper directory
/// (whiteouts as overlay whiteouts); None for any other shape.
fn as_upper_dir(mounts: Vec<Mount>) -> Option<(PathBuf, Vec<Mount>)> {
    let [mount] = mounts.as_slice() else {
        return None;
    };
    if mount.r#type != "bind" || !mount.source.ends_with("/fs") {
        return None;
    }
    let mut options: Vec<String> = (mount.options.iter())
        .filter(|o| *o != "rbind")
        .cloned()
        .collect();
    options.push(format!("upperdir={}", mount.source));
    let overlay = Mount {
        r#type: "overlay".to_string(),
        source: "overlay".to_string(),
        target: String::new(),
        options,
    };
    Some((PathBuf::from(&mount.source), vec![overlay]))
}

/// The upper directory of an overlayfs snapshot on a parent.
fn overlay_upper_dir(mounts: &[Mount]) -> Option<PathBuf> {
    let [mount] = mounts else {
        return None;
    };
    if mount.r#type != "overlay" {
        return None;
    }
    (mount.options.iter())
        .find_map(|o| o.strip_prefix("upperdir="))
        .map(PathBuf::from)
}

pub fn to_containerd(desc: &Descriptor) -> ContainerdDescriptor {
    ContainerdDescriptor {
        media_type: desc.media_type.clone(),
        digest: desc.digest.clone(),
        size: desc.size,
        annotations: desc.annotations.clone(),
    }
}
