//! Directory trees copied and re-owned: a volume seeded from an image's content, and an
//! image's or a volume's files shifted into a pod's user namespace. The trees come from
//! images, so nothing here follows a link, and depth is bounded (a hostile image could nest
//! without end).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// How deep a tree may go.
const MAX_DEPTH: usize = 128;

/// Copies a directory tree: directories, regular files and symlinks (as links), with their
/// owners and modes. Device nodes, FIFOs and sockets are left out. The image chose what is
/// there, so the copy takes no more room than the source does: hard links stay links (not
/// one full copy per name) and holes stay holes.
pub fn copy_tree(source: &Path, target: &Path) -> std::io::Result<()> {
    TreeCopy::default().copy_dir(source, target, 0)
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
pub fn shift_owners(path: &Path, mappings: &super::userns::Mappings) -> std::io::Result<()> {
    OwnerShift {
        mappings,
        linked: std::collections::HashMap::new(),
    }
    .shift(path, 0)
}

struct OwnerShift<'a> {
    mappings: &'a super::userns::Mappings,
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
    use std::path::PathBuf;

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
        let mappings = crate::sys::userns::Mappings::from_zero(100000, 65536);
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
        let mappings = crate::sys::userns::Mappings::from_zero(100000, 1000);
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
        copy_tree(&source, &target).unwrap();
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
        copy_tree(&source, &target).unwrap();

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
