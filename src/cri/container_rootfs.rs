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
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Component, Path};

use tonic::Status;

use crate::api::v1::ContainerConfig;
use crate::oci::container::DeclaredVolume;
use crate::oci::user::AccountFiles;
use crate::server::CriService;

/// Under a container's root dir: where the image's rootfs is mounted read-only while
/// CreateContainer reads it.
pub(crate) const ROOTFS_VIEW_DIR: &str = "rootfs-view";
/// How deep a declared volume's tree may go (a hostile image could nest without end).
const MAX_DEPTH: usize = 128;
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
        let staging = root_dir.join(ROOTFS_VIEW_DIR);
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
    crate::mount::mount_all(&read_only, staging).map_err(std::io::Error::other)?;
    let result = work(staging);
    let unmounted = crate::mount::unmount_all(staging).map_err(std::io::Error::other);
    let _ = std::fs::remove_dir(staging);
    let value = result?;
    unmounted?;
    Ok(value)
}

/// A text file of the image (empty when the image has none): resolved inside the image,
/// a regular file, at most [`MAX_ACCOUNT_FILE`] bytes. Opened without blocking, so a FIFO
/// is refused rather than waited on.
fn read_image_file(root: &Path, path: &str) -> Result<String, RootfsError> {
    let file = match crate::fsutil::open_in_root(root, Path::new(path)) {
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
    match crate::fsutil::resolve_in_root(rootfs, inside) {
        Ok(source) if std::fs::symlink_metadata(&source)?.is_dir() => {
            Ok(copy_tree(&source, &volume.host_path, 0)?)
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

/// Copies a directory tree: directories, regular files and symlinks (as links), with their
/// owners and modes. Device nodes, FIFOs and sockets are left out. The image chose what is
/// there, so the copy takes no more room than the source does: hard links stay links (not
/// one full copy per name) and holes stay holes.
fn copy_tree(source: &Path, target: &Path, depth: usize) -> std::io::Result<()> {
    TreeCopy::default().copy_dir(source, target, depth)
}

/// One tree's copy: the files copied so far that have more than one name, by source inode.
#[derive(Default)]
struct TreeCopy {
    linked: std::collections::HashMap<(u64, u64), std::path::PathBuf>,
}

impl TreeCopy {
    fn copy_dir(&mut self, source: &Path, target: &Path, depth: usize) -> std::io::Result<()> {
        if depth > MAX_DEPTH {
            return Err(std::io::Error::other(format!(
                "{} nests more than {MAX_DEPTH} directories deep",
                source.display()
            )));
        }
        let meta = std::fs::symlink_metadata(source)?;
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::create_dir(target)?;
        for entry in std::fs::read_dir(source)? {
            let entry = entry?;
            let from = entry.path();
            let to = target.join(entry.file_name());
            let kind = entry.file_type()?;
            if kind.is_dir() {
                self.copy_dir(&from, &to, depth + 1)?;
            } else if kind.is_file() {
                self.copy_file(&from, &to)?;
            } else if kind.is_symlink() {
                std::os::unix::fs::symlink(std::fs::read_link(&from)?, &to)?;
                let link = std::fs::symlink_metadata(&from)?;
                std::os::unix::fs::lchown(&to, Some(link.uid()), Some(link.gid()))?;
            }
        }
        keep_owner_and_mode(&meta, target)
    }

    fn copy_file(&mut self, from: &Path, to: &Path) -> std::io::Result<()> {
        let meta = std::fs::symlink_metadata(from)?;
        let inode = (meta.dev(), meta.ino());
        if meta.nlink() > 1
            && let Some(first) = self.linked.get(&inode)
        {
            return std::fs::hard_link(first, to);
        }
        copy_keeping_holes(from, to)?;
        keep_owner_and_mode(&meta, to)?;
        if meta.nlink() > 1 {
            self.linked.insert(inode, to.to_path_buf());
        }
        Ok(())
    }
}

/// Copies a regular file's data extents only; the rest of its length stays a hole.
fn copy_keeping_holes(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let source = std::fs::File::open(from)?;
    let len = source.metadata()?.len();
    let target = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(to)?;
    target.set_len(len)?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut at = 0;
    while at < len {
        let Some((start, end)) = next_data(&source, at, len)? else {
            break;
        };
        let mut pos = start;
        while pos < end {
            let want = usize::try_from(end - pos)
                .unwrap_or(usize::MAX)
                .min(buf.len());
            let got = source.read_at(&mut buf[..want], pos)?;
            if got == 0 {
                // The source shrank under us: what is left stays a hole.
                return Ok(());
            }
            target.write_all_at(&buf[..got], pos)?;
            pos += got as u64;
        }
        at = end;
    }
    Ok(())
}

/// The next extent of data at or after `at`: `None` when only a hole is left. A
/// filesystem that cannot tell holes calls the whole rest data.
fn next_data(file: &std::fs::File, at: u64, len: u64) -> std::io::Result<Option<(u64, u64)>> {
    use std::os::fd::AsRawFd;
    let seek = |offset: u64, whence| -> std::io::Result<Option<u64>> {
        let offset = libc::off_t::try_from(offset).map_err(std::io::Error::other)?;
        // SAFETY: lseek on an fd this function borrows.
        match unsafe { libc::lseek(file.as_raw_fd(), offset, whence) } {
            -1 => match std::io::Error::last_os_error() {
                e if e.raw_os_error() == Some(libc::ENXIO) => Ok(None),
                e if e.raw_os_error() == Some(libc::EINVAL) => Ok(Some(offset as u64)),
                e => Err(e),
            },
            found => Ok(Some(found as u64)),
        }
    };
    let Some(start) = seek(at, libc::SEEK_DATA)? else {
        return Ok(None);
    };
    let end = seek(start, libc::SEEK_HOLE)?.unwrap_or(len).min(len);
    Ok((start < end).then_some((start, end)))
}

/// Gives a volume crius made (a copy of the image's content) to a pod in its own user
/// namespace: each owner becomes its host ID in the pod's range (one the range does not map
/// stays, and shows as "nobody" inside). Modes are kept; links are not followed. Also
/// shifts an image's files through an overlay mount (the "copy" rootfs): there each chown
/// copies the file up, and a second name of a hard-linked file would be copied up again
/// in full, so later names are linked to the first one's copy instead.
pub(crate) fn shift_owners(path: &Path, mappings: &crate::userns::Mappings) -> std::io::Result<()> {
    OwnerShift {
        mappings,
        linked: std::collections::HashMap::new(),
    }
    .shift(path, 0)
}

struct OwnerShift<'a> {
    mappings: &'a crate::userns::Mappings,
    /// Regular files with more than one name, by inode: the first name shifted.
    linked: std::collections::HashMap<(u64, u64), std::path::PathBuf>,
}

impl OwnerShift<'_> {
    fn shift(&mut self, path: &Path, depth: usize) -> std::io::Result<()> {
        if depth > MAX_DEPTH {
            return Err(std::io::Error::other(format!(
                "{} nests more than {MAX_DEPTH} directories deep",
                path.display()
            )));
        }
        let meta = std::fs::symlink_metadata(path)?;
        if meta.is_dir() {
            for entry in std::fs::read_dir(path)? {
                self.shift(&entry?.path(), depth + 1)?;
            }
        }
        if meta.is_file() && meta.nlink() > 1 {
            let inode = (meta.dev(), meta.ino());
            if let Some(first) = self.linked.get(&inode) {
                // Shifted already under its first name: this name becomes a link to it.
                std::fs::remove_file(path)?;
                return std::fs::hard_link(first, path);
            }
            self.linked.insert(inode, path.to_path_buf());
        }
        let uid = self.mappings.uids.to_host(meta.uid()).unwrap_or(meta.uid());
        let gid = self.mappings.gids.to_host(meta.gid()).unwrap_or(meta.gid());
        std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
        if !meta.is_symlink() {
            // chown cleared the setuid and setgid bits.
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(meta.mode() & 0o7777))?;
        }
        Ok(())
    }
}

/// Owner first: chown clears the setuid and setgid bits the mode may carry.
fn keep_owner_and_mode(meta: &std::fs::Metadata, path: &Path) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(meta.uid()), Some(meta.gid()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(meta.mode() & 0o7777))
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

    #[test]
    fn shifting_an_image_through_overlayfs_copies_a_hard_linked_file_up_once() {
        let dir = tempfile::tempdir().unwrap();
        let [lower, upper, work, merged] =
            ["lower", "upper", "work", "merged"].map(|d| dir.path().join(d));
        for d in [&lower.join("sub"), &upper, &work, &merged] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(lower.join("big"), vec![1u8; 1 << 20]).unwrap();
        for i in 0..20 {
            std::fs::hard_link(lower.join("big"), lower.join(format!("sub/name{i}"))).unwrap();
        }
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            upper.display(),
            work.display()
        );
        if let Err(e) = nix::mount::mount(
            Some("overlay"),
            &merged,
            Some("overlay"),
            nix::mount::MsFlags::empty(),
            Some(options.as_str()),
        ) {
            eprintln!("no overlay mount here ({e}): skipped");
            return;
        }
        let mappings = crate::userns::Mappings::from_zero(100000, 65536);
        let shifted = shift_owners(&merged, &mappings);
        let seen = std::fs::metadata(merged.join("sub/name7")).map(|m| m.uid());
        nix::mount::umount(&merged).unwrap();
        shifted.unwrap();
        assert_eq!(seen.unwrap(), 100000);
        let big = std::fs::metadata(upper.join("big")).unwrap();
        assert_eq!(big.uid(), 100000);
        assert_eq!(big.nlink(), 21, "every name is one copied-up file");
        let name = std::fs::metadata(upper.join("sub/name7")).unwrap();
        assert_eq!(name.ino(), big.ino());
        assert_eq!(
            std::fs::read(upper.join("sub/name7")).unwrap(),
            vec![1u8; 1 << 20]
        );
    }

    #[test]
    fn owners_shift_into_the_pods_range_and_modes_stay() {
        let dir = tempfile::tempdir().unwrap();
        let volume = dir.path().join("volume");
        std::fs::create_dir_all(volume.join("sub")).unwrap();
        std::fs::write(volume.join("sub/file"), b"x").unwrap();
        std::os::unix::fs::chown(volume.join("sub/file"), Some(5), Some(6)).unwrap();
        std::fs::set_permissions(
            volume.join("sub/file"),
            std::fs::Permissions::from_mode(0o4750),
        )
        .unwrap();
        std::os::unix::fs::symlink("/etc/passwd", volume.join("link")).unwrap();
        let mappings = crate::userns::Mappings::from_zero(100000, 1000);
        shift_owners(&volume, &mappings).unwrap();
        let file = std::fs::metadata(volume.join("sub/file")).unwrap();
        assert_eq!((file.uid(), file.gid()), (100005, 100006));
        assert_eq!(file.mode() & 0o7777, 0o4750);
        let link = std::fs::symlink_metadata(volume.join("link")).unwrap();
        assert_eq!(link.uid(), 100000);
        assert_eq!(std::fs::metadata("/etc/passwd").unwrap().uid(), 0);
        assert_eq!(std::fs::metadata(&volume).unwrap().uid(), 100000);
    }

    #[test]
    fn a_tree_is_copied_with_links_as_links() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("src");
        std::fs::create_dir_all(source.join("sub")).unwrap();
        std::fs::write(source.join("sub/file"), b"content").unwrap();
        std::fs::set_permissions(
            source.join("sub/file"),
            std::fs::Permissions::from_mode(0o640),
        )
        .unwrap();
        std::os::unix::fs::symlink("/etc/passwd", source.join("link")).unwrap();
        let target = dir.path().join("out/volume");
        copy_tree(&source, &target, 0).unwrap();
        assert_eq!(std::fs::read(target.join("sub/file")).unwrap(), b"content");
        let mode = std::fs::metadata(target.join("sub/file")).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o640);
        assert_eq!(
            std::fs::read_link(target.join("link")).unwrap(),
            PathBuf::from("/etc/passwd")
        );
    }

    #[test]
    fn a_copy_keeps_hard_links_and_holes_and_takes_no_more_room() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("src");
        std::fs::create_dir_all(source.join("sub")).unwrap();
        // 64 MiB long, 4 KiB of it data at 1 MiB.
        let sparse = std::fs::File::create(source.join("sparse")).unwrap();
        sparse.set_len(64 << 20).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&sparse, &[7u8; 4096], 1 << 20).unwrap();
        drop(sparse);
        std::fs::write(source.join("big"), vec![1u8; 1 << 20]).unwrap();
        for i in 0..50 {
            std::fs::hard_link(source.join("big"), source.join(format!("sub/name{i}"))).unwrap();
        }
        let target = dir.path().join("out/volume");
        copy_tree(&source, &target, 0).unwrap();

        let copied = std::fs::metadata(target.join("sparse")).unwrap();
        assert_eq!(copied.len(), 64 << 20);
        assert!(
            copied.blocks() * 512 <= 1 << 20,
            "holes were filled: {}",
            copied.blocks()
        );
        let data = std::fs::read(target.join("sparse")).unwrap();
        assert_eq!(&data[1 << 20..(1 << 20) + 4096], &[7u8; 4096]);
        assert!(data[..1 << 20].iter().all(|b| *b == 0));

        let big = std::fs::metadata(target.join("big")).unwrap();
        assert_eq!(big.nlink(), 51, "names became copies");
        let name = std::fs::metadata(target.join("sub/name7")).unwrap();
        assert_eq!(name.ino(), big.ino());
        assert_eq!(
            std::fs::read(target.join("sub/name7")).unwrap(),
            vec![1u8; 1 << 20]
        );
    }
}
