//! Image volumes (`Mount.image`, kubelet's ImageVolume feature): a pulled image's filesystem
//! mounted read-only into a container, or one directory of it (`image_sub_path`).
//!
//! As in containerd's CRI, a volume belongs to its pod: the first container that names an
//! image gets a snapshot of it mounted under `<state>/image-volumes/<pod>/<digest>` (the
//! digest of the image's manifest or index, as containerd names it; the snapshot's key is
//! that path, so tools written against containerd's CRI find it), with overlay's `volatile`
//! (nothing written there is kept) and read-only for the containers; later containers of
//! the pod share that mount, and stopping the pod unmounts and removes them all. The
//! snapshots are held by a lease of the pod, so nothing outlives it, even a crash: start-up
//! deletes the leases of pods that are gone. While a pod has an image mounted, the image
//! cannot be removed.

use super::record::VOLUME_LEASE_PREFIX;
use std::path::{Path, PathBuf};

use tonic::{Code, Status};

use crate::api::v1::Mount;
use crate::cri::CriService;
use crate::store::{Image, SandboxMetadata};

/// Under the state directory: one directory per pod, one mount point per image.
const VOLUMES_DIR: &str = "image-volumes";
/// cri-api's `ErrImageVolumeMountFailed`: kubelet reports the container's failure with it.
const MOUNT_FAILED: &str = "ImageVolumeMountFailed";

impl CriService {
    fn image_volumes_dir(&self, sandbox_id: &str) -> PathBuf {
        self.config.state.join(VOLUMES_DIR).join(sandbox_id)
    }

    /// Mounts every image volume among `mounts` (once per pod and image) and points each
    /// one's `host_path` at what the container is to see. The images' snapshots are in the
    /// pod's snapshotter, where PullImage for the pod's handler unpacked them.
    pub(crate) async fn mount_image_volumes(
        &self,
        sandbox: &SandboxMetadata,
        mounts: &mut [Mount],
    ) -> Result<(), Status> {
        let (sandbox_id, snapshotter) = (
            sandbox.id.as_str(),
            self.snapshotter_of(&sandbox.snapshotter),
        );
        if !mounts.iter().any(|m| m.image.is_some()) {
            return Ok(());
        }
        // Mounting and unmounting never interleave: two containers of a pod naming the same
        // image share one mount, and a pod being stopped loses all of them.
        let _serialized = self.image_volume_lock.lock().await;
        for mount in mounts.iter_mut().filter(|m| m.image.is_some()) {
            self.mount_image_volume(sandbox_id, snapshotter, mount)
                .await
                .map_err(|s| Status::new(s.code(), format!("{MOUNT_FAILED}: {}", s.message())))?;
        }
        Ok(())
    }

    async fn mount_image_volume(
        &self,
        sandbox_id: &str,
        snapshotter: &str,
        mount: &mut Mount,
    ) -> Result<(), Status> {
        let reference = mount
            .image
            .as_ref()
            .map(|spec| spec.image.clone())
            .unwrap_or_default();
        check_image_mount(mount, &reference)?;
        let image = self.images.resolve(&reference).ok_or_else(|| {
            Status::not_found(format!(
                "image {reference:?} of the volume at {:?} not found: pull it first",
                mount.container_path
            ))
        })?;
        let digest = self.volume_digest(&image).await;
        let target = self.image_volumes_dir(sandbox_id).join(hex(&digest));
        if !blocking(target.clone(), |t| crate::sys::mount::is_mount_point(&t)).await? {
            self.mount_image(sandbox_id, snapshotter, &image, &target)
                .await?;
        }
        let host_path = if mount.image_sub_path.is_empty() {
            target
        } else {
            sub_path(&target, &mount.image_sub_path, &reference).await?
        };
        mount.host_path = host_path.display().to_string();
        Ok(())
    }

    /// The digest a volume of `image` is named by: its manifest's or index's (the target of
    /// its records), as containerd names it; its ID when no record says.
    async fn volume_digest(&self, image: &Image) -> String {
        if let Some(digest) = image
            .references
            .iter()
            .find_map(|r| r.split_once('@').map(|(_, digest)| digest.to_string()))
        {
            return digest;
        }
        match self.containerd.get_image(&image.id).await {
            Ok(Some(record)) => record
                .target
                .map(|t| t.digest)
                .unwrap_or_else(|| image.id.clone()),
            _ => image.id.clone(),
        }
    }

    /// Makes the snapshot of `image` under the pod's lease and mounts it on `target`.
    async fn mount_image(
        &self,
        sandbox_id: &str,
        snapshotter: &str,
        image: &Image,
        target: &Path,
    ) -> Result<(), Status> {
        let lease = format!("{VOLUME_LEASE_PREFIX}{sandbox_id}");
        self.containerd
            .ensure_lasting_lease(&lease)
            .await
            .map_err(|e| Status::internal(format!("image volume lease: {e}")))?;
        let key = volume_snapshot_key(target);
        let mounts = self
            .containerd
            .prepare_or_reuse_snapshot(snapshotter, &key, &image.chain_id, Some(&lease))
            .await
            .map(with_volatile)
            .map_err(|e| match e.code() {
                Some(Code::NotFound) => Status::failed_precondition(format!(
                    "image {} is not unpacked (its layers are missing): pull it again",
                    image.id
                )),
                _ => Status::internal(format!("viewing image {}: {e}", image.id)),
            })?;
        let mounted = blocking(target.to_path_buf(), move |target| {
            create_private_dir(target.parent().unwrap_or(&target))?;
            std::fs::create_dir_all(&target)?;
            crate::sys::mount::mount_all(&mounts, &target).map_err(std::io::Error::other)
        })
        .await;
        if let Err(e) = mounted {
            let _ = std::fs::remove_dir(target);
            let _ = self.containerd.remove_snapshot(snapshotter, &key).await;
            return Err(Status::internal(format!(
                "mounting image {} on {}: {}",
                image.id,
                target.display(),
                e.message()
            )));
        }
        tracing::info!(sandbox = sandbox_id, image = %image.id, target = %target.display(), "image volume mounted");
        Ok(())
    }

    /// Unmounts and removes every image volume of a pod, its snapshots and its lease. Safe
    /// to repeat, and to call for a pod that has none.
    pub(crate) async fn unmount_image_volumes(&self, sandbox_id: &str) -> Result<(), Status> {
        let base = self.image_volumes_dir(sandbox_id);
        let _serialized = self.image_volume_lock.lock().await;
        let names = match std::fs::read_dir(&base) {
            Ok(entries) => entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect::<Vec<_>>(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(Status::internal(format!("reading {}: {e}", base.display()))),
        };
        for name in names {
            let target = base.join(&name);
            blocking(target.clone(), |target| {
                crate::sys::mount::unmount_all(&target).map_err(std::io::Error::other)?;
                match std::fs::remove_dir(&target) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                    _ => Ok(()),
                }
            })
            .await
            .map_err(|e| Status::new(e.code(), format!("image volume: {}", e.message())))?;
            // In whichever snapshotter the pod had: the pod's record may be gone.
            let key = volume_snapshot_key(&target);
            for snapshotter in self.config.snapshotters() {
                self.containerd
                    .remove_snapshot(snapshotter, &key)
                    .await
                    .map_err(|e| {
                        Status::internal(format!("removing image volume snapshot: {e}"))
                    })?;
            }
        }
        match std::fs::remove_dir(&base) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Status::internal(format!(
                    "removing {}: {e}",
                    base.display()
                )));
            }
            _ => {}
        }
        self.containerd
            .delete_lease(&format!("{VOLUME_LEASE_PREFIX}{sandbox_id}"), false)
            .await
            .map_err(|e| Status::internal(format!("deleting the image volume lease: {e}")))
    }

    /// The pods that have `image_id` mounted as an image volume.
    pub(crate) fn pods_with_image_volume(&self, image: &Image) -> Vec<String> {
        let Ok(pods) = std::fs::read_dir(self.config.state.join(VOLUMES_DIR)) else {
            return Vec::new();
        };
        let names = volume_dir_names(image);
        pods.filter_map(Result::ok)
            .filter(|pod| names.iter().any(|name| pod.path().join(name).exists()))
            .map(|pod| pod.file_name().to_string_lossy().into_owned())
            .collect()
    }
}

/// What the CRI requires of an image mount.
fn check_image_mount(mount: &Mount, reference: &str) -> Result<(), Status> {
    if reference.is_empty() {
        return Err(Status::invalid_argument(format!(
            "the image volume at {:?} names no image",
            mount.container_path
        )));
    }
    if !mount.host_path.is_empty() {
        return Err(Status::invalid_argument(format!(
            "the image volume at {:?} has a host path too ({:?}): it must be empty",
            mount.container_path, mount.host_path
        )));
    }
    if !mount.readonly {
        return Err(Status::invalid_argument(format!(
            "the image volume at {:?} must be read-only",
            mount.container_path
        )));
    }
    Ok(())
}

/// The directory `sub` of a mounted image, resolved inside it (its symlinks cannot lead
/// out). Only a directory can be mounted, as the CRI says.
async fn sub_path(target: &Path, sub: &str, reference: &str) -> Result<PathBuf, Status> {
    let sub = sub.to_string();
    let root = target.to_path_buf();
    let resolved = tokio::task::spawn_blocking(move || {
        let path = crate::sys::fsutil::resolve_beneath(&root, Path::new(&sub))
            .map_err(|e| (sub.clone(), e))?;
        let is_dir = std::fs::symlink_metadata(&path)
            .map_err(|e| (sub.clone(), e))?
            .is_dir();
        Ok::<_, (String, std::io::Error)>((path, is_dir, sub))
    })
    .await
    .map_err(|e| Status::internal(format!("resolving the image sub path: {e}")))?;
    match resolved {
        Ok((path, true, _)) => Ok(path),
        // containerd's CRI's words, which its tests and tools match.
        Ok((_, false, sub)) => Err(Status::invalid_argument(format!(
            "image sub path {sub:?} of {reference:?} is not a directory: only directory \
             subpath is supported"
        ))),
        Err((sub, e)) if e.kind() == std::io::ErrorKind::NotFound => Err(Status::not_found(
            format!("image sub path {sub:?} of {reference:?}: no such file or directory"),
        )),
        Err((sub, e)) if e.kind() == std::io::ErrorKind::CrossesDevices => {
            Err(Status::invalid_argument(format!(
                "image sub path {sub:?} of {reference:?}: path escapes from parent"
            )))
        }
        Err((sub, e)) => Err(Status::invalid_argument(format!(
            "image sub path {sub:?} of {reference:?}: {e}"
        ))),
    }
}

/// The snapshot key of a pod's image volume: its mount point, as containerd's CRI keys it.
fn volume_snapshot_key(target: &Path) -> String {
    target.display().to_string()
}

/// The names a volume directory of `image` may have: the digests its names are pinned to
/// (`repo@sha256:...`), and its ID (what crius named them before).
fn volume_dir_names(image: &Image) -> Vec<String> {
    let mut names: Vec<String> = image
        .references
        .iter()
        .filter_map(|r| r.split_once('@').map(|(_, digest)| hex(digest).to_string()))
        .collect();
    names.push(hex(&image.id).to_string());
    names
}

/// Adds overlay's `volatile` (no syncs: nothing written to an image volume is kept) on
/// kernels that have it (5.10 and later), as containerd's CRI does.
fn with_volatile(
    mut mounts: Vec<containerd_client::types::Mount>,
) -> Vec<containerd_client::types::Mount> {
    if !crate::sys::mount::overlay_has_volatile() {
        return mounts;
    }
    for mount in mounts.iter_mut().filter(|m| m.r#type == "overlay") {
        if !mount
            .options
            .iter()
            .any(|o| o == "volatile" || o == "fsync=volatile")
        {
            mount.options.push("volatile".to_string());
        }
    }
    mounts
}

fn hex(image_id: &str) -> &str {
    image_id.strip_prefix("sha256:").unwrap_or(image_id)
}

/// Creates `dir` (and its parents) readable by root only: nobody else on the host walks
/// into a tenant's image.
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Runs filesystem work off the runtime's threads.
async fn blocking<T: Send + 'static>(
    path: PathBuf,
    work: impl FnOnce(PathBuf) -> std::io::Result<T> + Send + 'static,
) -> Result<T, Status> {
    let shown = path.display().to_string();
    tokio::task::spawn_blocking(move || work(path))
        .await
        .map_err(|e| Status::internal(format!("{shown}: {e}")))?
        .map_err(|e| Status::internal(format!("{shown}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1::ImageSpec;

    fn image_mount(image: &str) -> Mount {
        Mount {
            container_path: "/vol".into(),
            readonly: true,
            image: Some(ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn an_image_mount_needs_an_image_no_host_path_and_read_only() {
        assert!(check_image_mount(&image_mount("busybox"), "busybox").is_ok());
        let none = check_image_mount(&image_mount(""), "").unwrap_err();
        assert_eq!(none.code(), Code::InvalidArgument);
        let mut both = image_mount("busybox");
        both.host_path = "/etc".into();
        assert_eq!(
            check_image_mount(&both, "busybox").unwrap_err().code(),
            Code::InvalidArgument
        );
        let mut writable = image_mount("busybox");
        writable.readonly = false;
        assert!(
            check_image_mount(&writable, "busybox")
                .unwrap_err()
                .message()
                .contains("read-only")
        );
    }

    #[test]
    fn volumes_are_named_by_their_digests_and_keyed_by_their_path() {
        let image = Image {
            id: "sha256:config".into(),
            references: ["r.io/a:1", "r.io/a@sha256:index"]
                .into_iter()
                .map(String::from)
                .collect(),
            pinned_references: Default::default(),
            chain_id: String::new(),
            size: 0,
            config: Default::default(),
        };
        assert_eq!(volume_dir_names(&image), ["index", "config"]);
        assert_eq!(
            volume_snapshot_key(Path::new("/run/crius/image-volumes/pod1/index")),
            "/run/crius/image-volumes/pod1/index"
        );
    }

    #[test]
    fn only_overlay_mounts_become_volatile() {
        let mount = |kind: &str| containerd_client::types::Mount {
            r#type: kind.into(),
            options: vec!["ro".into()],
            ..Default::default()
        };
        let mounts = with_volatile(vec![mount("overlay"), mount("bind")]);
        if crate::sys::mount::overlay_has_volatile() {
            assert_eq!(mounts[0].options, ["ro", "volatile"]);
        }
        assert_eq!(mounts[1].options, ["ro"]);
        assert_eq!(
            crate::sys::mount::kernel_at_least("6.18.0-1-amd64", (5, 10)),
            Some(true)
        );
        assert_eq!(
            crate::sys::mount::kernel_at_least("5.4.0", (5, 10)),
            Some(false)
        );
        assert_eq!(crate::sys::mount::kernel_at_least("x", (5, 10)), None);
    }

    #[tokio::test]
    async fn a_sub_path_must_be_a_directory_inside_the_image() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(root.join("data/dir")).unwrap();
        std::fs::write(root.join("data/file"), b"x").unwrap();
        std::os::unix::fs::symlink("/", root.join("data/escape")).unwrap();

        assert_eq!(
            sub_path(&root, "data/dir", "img").await.unwrap(),
            root.join("data/dir")
        );
        std::os::unix::fs::symlink("dir", root.join("data/inside")).unwrap();
        assert_eq!(
            sub_path(&root, "data/inside", "img").await.unwrap(),
            root.join("data/dir")
        );
        // What would leave the image is refused, in containerd's words: an absolute path,
        // a `..` above it, an absolute symlink.
        for escaping in ["/data", "data/../..", "data/escape"] {
            let err = sub_path(&root, escaping, "img").await.unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument, "{escaping}");
            assert!(
                err.message().contains("path escapes from parent"),
                "{err:?}"
            );
        }
        let file = sub_path(&root, "data/file", "img").await.unwrap_err();
        assert_eq!(file.code(), Code::InvalidArgument);
        assert!(
            file.message()
                .contains("only directory subpath is supported")
        );
        let missing = sub_path(&root, "nope", "img").await.unwrap_err();
        assert_eq!(missing.code(), Code::NotFound);
        assert!(missing.message().contains("no such file or directory"));
    }
}
