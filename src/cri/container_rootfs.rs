//! What CreateContainer reads from the image, on the container's rootfs mounted read-only on
//! a private directory, with every path resolved inside it (openat2 `RESOLVE_IN_ROOT`):
//! nothing the image holds (a symlink to the host's `/etc/passwd` or to `/dev/zero`, a FIFO,
//! a huge file) can make crius read a host path, hang or fill its memory. The work runs off
//! the runtime's threads.
//!
//! - The account files: `/etc/passwd` and `/etc/group`, regular files of at most 4 MiB.
//! - The volumes the image declares (`VOLUME`), as containerd's CRI gives them: per declared
//!   path a host directory under the container's root dir, seeded with what the image has
//!   at that path (owners and modes kept), mounted read-write there and removed with the
//!   container. A CRI mount at the same path wins; `ignore_image_defined_volumes` turns
//!   them off.

use std::io::Read;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Component, Path};

use tonic::Status;

use crate::api::v1::ContainerConfig;
use crate::cri::CriService;
use crate::oci::container::DeclaredVolume;
use crate::oci::user::AccountFiles;

/// The largest `/etc/passwd` or `/etc/group` crius reads.
pub const MAX_ACCOUNT_FILE: u64 = 4 * 1024 * 1024;

/// Why the image's rootfs could not be read as CreateContainer needs it.
#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    /// The image itself is at fault: the client can only pick another image.
    #[error("{0}")]
    Image(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// What the container's creation took from its image.
pub struct RootfsReads {
    pub accounts: AccountFiles,
    pub volumes: Vec<DeclaredVolume>,
}

/// Account files kept per image: at most this many images...
const CACHED_IMAGES: usize = 64;
/// ...with account files of at most this size (together); larger ones are read each time.
const CACHED_ACCOUNT_BYTES: usize = 64 * 1024;

/// The account files of the images containers were made from, by the image's chain ID: an
/// image's layers never change, and a new container's own layer is empty, so a second
/// container of an image needs no mount of its rootfs to learn its users.
#[derive(Default)]
pub struct AccountFilesCache(std::sync::Mutex<std::collections::HashMap<String, AccountFiles>>);

impl AccountFilesCache {
    fn get(&self, chain_id: &str) -> Option<AccountFiles> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(chain_id)
            .cloned()
    }

    fn insert(&self, chain_id: &str, files: &AccountFiles) {
        if chain_id.is_empty() || files.passwd.len() + files.group.len() > CACHED_ACCOUNT_BYTES {
            return;
        }
        let mut cache = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= CACHED_IMAGES {
            cache.clear();
        }
        cache.insert(chain_id.to_string(), files.clone());
    }
}

impl CriService {
    /// Reads the account files and makes the declared volumes. `rootfs` are the container's
    /// snapshot mounts, still unused; `chain_id` names the image's layers they stack.
    pub(crate) async fn read_container_rootfs(
        &self,
        root_dir: &Path,
        config: &ContainerConfig,
        image_volumes: &[String],
        chain_id: &str,
        rootfs: Vec<containerd_client::types::Mount>,
    ) -> Result<RootfsReads, Status> {
        let volumes = if self.config.ignore_image_defined_volumes {
            Vec::new()
        } else {
            volumes_to_make(root_dir, config, image_volumes)
        };
        if volumes.is_empty()
            && let Some(accounts) = self.account_files.get(chain_id)
        {
            return Ok(RootfsReads { accounts, volumes });
        }
        let reads = self
            .mount_and_read_rootfs(root_dir, volumes, rootfs)
            .await?;
        self.account_files.insert(chain_id, &reads.accounts);
        Ok(reads)
    }

    async fn mount_and_read_rootfs(
        &self,
        root_dir: &Path,
        volumes: Vec<DeclaredVolume>,
        rootfs: Vec<containerd_client::types::Mount>,
    ) -> Result<RootfsReads, Status> {
        let staging = root_dir.join(super::record::ROOTFS_VIEW_DIR);
        tokio::task::spawn_blocking(move || {
            with_read_only_rootfs(&staging, &rootfs, |root| {
                let accounts = AccountFiles {
                    passwd: read_image_file(root, "etc/passwd")?,
                    group: read_image_file(root, "etc/group")?,
                };
                for volume in &volumes {
                    seed_volume(root, volume)?;
                }
                Ok(RootfsReads { accounts, volumes })
            })
        })
        .await
        .map_err(|e| Status::internal(format!("reading the image's rootfs: {e}")))?
        .map_err(|e| match e {
            RootfsError::Image(message) => Status::invalid_argument(message),
            RootfsError::Io(e) => Status::internal(format!("reading the image's rootfs: {e}")),
        })
    }
}

/// Mounts the rootfs read-only on `staging`, runs `work` on it and unmounts it again,
/// whatever happened.
fn with_read_only_rootfs<T>(
    staging: &Path,
    rootfs: &[containerd_client::types::Mount],
    work: impl FnOnce(&Path) -> Result<T, RootfsError>,
) -> Result<T, RootfsError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(staging)?;
    let read_only: Vec<_> = rootfs
        .iter()
        .cloned()
        .map(|mut m| {
            // Device nodes in the image cannot even be opened through this view.
            m.options
                .extend(["ro", "nodev", "nosuid", "noexec"].map(String::from));
            m
        })
        .collect();
    crate::sys::mount::mount_all(&read_only, staging).map_err(std::io::Error::other)?;
    let result = work(staging);
    let unmounted = crate::sys::mount::unmount_all(staging).map_err(std::io::Error::other);
    let _ = std::fs::remove_dir(staging);
    let value = result?;
    unmounted?;
    Ok(value)
}

/// A text file of the image (empty when the image has none): resolved inside the image,
/// a regular file, at most [`MAX_ACCOUNT_FILE`] bytes. Opened without blocking, so a FIFO
/// is refused rather than waited on.
fn read_image_file(root: &Path, path: &str) -> Result<String, RootfsError> {
    let file = match crate::sys::fsutil::open_in_root(root, Path::new(path)) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(String::new()),
        Err(e) => return Err(RootfsError::Image(format!("the image's /{path}: {e}"))),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(RootfsError::Image(format!(
            "the image's /{path} is not a regular file"
        )));
    }
    if meta.len() > MAX_ACCOUNT_FILE {
        return Err(RootfsError::Image(format!(
            "the image's /{path} is {} bytes, more than the {MAX_ACCOUNT_FILE} crius reads",
            meta.len()
        )));
    }
    let mut bytes = Vec::new();
    file.take(MAX_ACCOUNT_FILE).read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The declared volumes, each with its host directory, minus those a CRI mount covers.
fn volumes_to_make(
    root_dir: &Path,
    config: &ContainerConfig,
    image_volumes: &[String],
) -> Vec<DeclaredVolume> {
    let mut paths: Vec<String> = image_volumes.iter().map(|v| container_path(v)).collect();
    paths.sort();
    paths.dedup();
    paths
        .into_iter()
        .filter(|path| path != "/")
        .filter(|path| {
            !config
                .mounts
                .iter()
                .any(|m| container_path(&m.container_path) == *path)
        })
        .enumerate()
        .map(|(i, path)| DeclaredVolume {
            container_path: path,
            host_path: root_dir.join("volumes").join(i.to_string()),
        })
        .collect()
}

/// An image config's volume path as an absolute, clean Linux path (`C:/data` is `/C:/data`,
/// `..` cannot climb above `/`).
fn container_path(volume: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for component in Path::new(volume).components() {
        match component {
            Component::Normal(part) => parts.push(part.to_str().unwrap_or_default()),
            Component::ParentDir => {
                parts.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    format!("/{}", parts.join("/"))
}

/// Creates the volume's host directory with the image's content at its path, or empty
/// (mode 0755) when the image has nothing there.
fn seed_volume(rootfs: &Path, volume: &DeclaredVolume) -> Result<(), RootfsError> {
    let inside = Path::new(&volume.container_path);
    match crate::sys::fsutil::resolve_in_root(rootfs, inside) {
        Ok(source) if std::fs::symlink_metadata(&source)?.is_dir() => {
            Ok(crate::sys::tree::copy_tree(&source, &volume.host_path)?)
        }
        Ok(_) => Err(RootfsError::Image(format!(
            "the image has a file, not a directory, at its volume {}",
            volume.container_path
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&volume.host_path)?),
        Err(e) => Err(RootfsError::Image(format!(
            "the image's volume {}: {e}",
            volume.container_path
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1::Mount;
    use std::path::PathBuf;

    fn accounts(passwd: &str) -> AccountFiles {
        AccountFiles {
            passwd: passwd.to_string(),
            group: "root:x:0:\n".to_string(),
        }
    }

    #[test]
    fn account_files_are_kept_per_image_and_only_small_ones() {
        let cache = AccountFilesCache::default();
        cache.insert("sha256:a", &accounts("root:x:0:0::/root:/bin/sh\n"));
        assert_eq!(
            cache.get("sha256:a").map(|f| f.passwd),
            Some("root:x:0:0::/root:/bin/sh\n".to_string())
        );
        assert!(cache.get("sha256:b").is_none());
        cache.insert("sha256:big", &accounts(&"x".repeat(CACHED_ACCOUNT_BYTES)));
        assert!(
            cache.get("sha256:big").is_none(),
            "an oversized file was kept"
        );
        cache.insert("", &accounts("anonymous"));
        assert!(cache.get("").is_none(), "an image without layers was kept");
    }

    #[test]
    fn the_account_files_cache_stays_bounded() {
        let cache = AccountFilesCache::default();
        for i in 0..CACHED_IMAGES * 3 {
            cache.insert(&format!("sha256:{i}"), &accounts("root"));
        }
        let held = cache.0.lock().unwrap().len();
        assert!(held <= CACHED_IMAGES, "{held} images held");
        assert!(
            cache
                .get(&format!("sha256:{}", CACHED_IMAGES * 3 - 1))
                .is_some()
        );
    }

    #[test]
    fn volume_paths_are_absolute_and_clean() {
        assert_eq!(container_path("/var/lib/db/"), "/var/lib/db");
        assert_eq!(container_path("C:/weird_test_dir"), "/C:/weird_test_dir");
        assert_eq!(container_path("/:colon_prefixed"), "/:colon_prefixed");
        assert_eq!(container_path("/../../etc"), "/etc");
        assert_eq!(container_path("./data/./x"), "/data/x");
    }

    #[test]
    fn a_cri_mount_at_the_same_path_wins() {
        let config = ContainerConfig {
            mounts: vec![Mount {
                container_path: "/data/".into(),
                host_path: "/srv".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let volumes = volumes_to_make(
            Path::new("/root/c1"),
            &config,
            &["/data".into(), "/logs".into(), "/logs/".into(), "/".into()],
        );
        assert_eq!(
            volumes,
            vec![DeclaredVolume {
                container_path: "/logs".into(),
                host_path: PathBuf::from("/root/c1/volumes/0"),
            }]
        );
    }
}
