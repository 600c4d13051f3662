//! Small filesystem helpers shared by the parts that persist crius's own state, and path
//! resolution that stays inside a root a tenant controls (an image's filesystem).

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{OFlag, OpenHow, ResolveFlag};

/// Resolves `relative` inside `root` as if `root` were `/`: symlinks (absolute ones too) and
/// `..` cannot leave it. Returns the host path of what it names, free of symlinks, so a
/// later user of the path (a bind mount) finds the same object; on a root nobody can change
/// (a read-only image) that stays true.
pub fn resolve_in_root(root: &Path, relative: &Path) -> std::io::Result<PathBuf> {
    let root_dir = std::fs::File::open(root)?;
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let relative = relative_path(relative);
    let fd = nix::fcntl::openat2(&root_dir, &relative, how).map_err(std::io::Error::from)?;
    let resolved = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    let canonical_root = std::fs::read_link(format!("/proc/self/fd/{}", root_dir.as_raw_fd()))?;
    if !resolved.starts_with(&canonical_root) {
        // Only a concurrent rename inside the root could get here; refuse, never follow.
        return Err(std::io::Error::other(format!(
            "{} resolved outside {}",
            relative.display(),
            root.display()
        )));
    }
    Ok(resolved)
}

/// Resolves `relative` beneath `root`, refusing rather than clamping what would leave it:
/// an absolute path, a `..` above `root`, an absolute symlink or one leading out fail with
/// `EXDEV` (Go's `os.Root`, which containerd's CRI resolves image sub paths with, refuses
/// the same). Returns the host path of what it names, free of symlinks.
pub fn resolve_beneath(root: &Path, relative: &Path) -> std::io::Result<PathBuf> {
    if relative.is_absolute() {
        return Err(std::io::Error::from_raw_os_error(libc::EXDEV));
    }
    let root_dir = std::fs::File::open(root)?;
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let fd = nix::fcntl::openat2(&root_dir, &relative_path(relative), how)
        .map_err(std::io::Error::from)?;
    let resolved = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    let canonical_root = std::fs::read_link(format!("/proc/self/fd/{}", root_dir.as_raw_fd()))?;
    if !resolved.starts_with(&canonical_root) {
        return Err(std::io::Error::from_raw_os_error(libc::EXDEV));
    }
    Ok(resolved)
}

/// Opens `relative` inside `root` for reading, resolved as [`resolve_in_root`] does, without
/// blocking (a FIFO opens at once; reading it then finds no data) and never as the
/// controlling terminal.
pub fn open_in_root(root: &Path, relative: &Path) -> std::io::Result<std::fs::File> {
    let root_dir = std::fs::File::open(root)?;
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let fd = nix::fcntl::openat2(&root_dir, &relative_path(relative), how)
        .map_err(std::io::Error::from)?;
    Ok(std::fs::File::from(fd))
}

/// `relative` with its leading `/` dropped: in-root resolution treats both alike, but an
/// empty path must name the root itself.
fn relative_path(relative: &Path) -> PathBuf {
    let rest: PathBuf = relative
        .components()
        .filter(|c| !matches!(c, Component::RootDir))
        .collect();
    if rest.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        rest
    }
}

/// Puts the directory `from` in the place of the empty directory `to`, in one atomic
/// exchange (what was at `to` is left, empty, at `from`). Both must be the same kind of
/// entry of sibling directories (`<root>/<a>/fs` and `<root>/<b>/fs`): the rename never
/// moves a tree anywhere else.
pub fn replace_empty_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    let root_of = |p: &Path| p.parent().and_then(Path::parent).map(Path::to_path_buf);
    if root_of(from).is_none() || root_of(from) != root_of(to) || from.file_name() != to.file_name()
    {
        return Err(std::io::Error::other(format!(
            "{} and {} are not siblings' directories",
            from.display(),
            to.display()
        )));
    }
    if std::fs::read_dir(to)?.next().is_some() {
        return Err(std::io::Error::other(format!(
            "{} is not empty",
            to.display()
        )));
    }
    nix::fcntl::renameat2(
        nix::fcntl::AT_FDCWD,
        from,
        nix::fcntl::AT_FDCWD,
        to,
        nix::fcntl::RenameFlags::RENAME_EXCHANGE,
    )
    .map_err(std::io::Error::from)
}

/// Gives `path` to `uid`:`gid` without following it if it is a symlink.
pub fn chown(path: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))
}

/// Writes `data` to `path` atomically: a temp file in the same directory, fsync, rename. A
/// crash leaves either the old or the new content, never a mix. The directory is not
/// synced (as containerd's own atomic writes): the rename reaches the disk with the file
/// system's next commit, and a crash of crius loses nothing either way.
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> std::io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("path has no parent directory"))?;
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("path has no file name"))?;
    // Its own name each time: two writers of one path never share a temp file.
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{:016x}",
        name.to_string_lossy(),
        std::process::id(),
        rand::random::<u64>()
    ));
    let result = (|| {
        // Never through something already at that name (a link planted there).
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        file.write_all(data)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Starts writing `len` bytes of `file` from `offset` back to the disk without waiting
/// for it (sync_file_range(2) with `SYNC_FILE_RANGE_WRITE`): a later fsync of the file then
/// finds little left to write, rather than everything at once.
pub fn start_writeback(file: &std::fs::File, offset: u64, len: u64) -> std::io::Result<()> {
    let too_far = |_| std::io::Error::from(std::io::ErrorKind::InvalidInput);
    let offset = offset.try_into().map_err(too_far)?;
    let len = len.try_into().map_err(too_far)?;
    // SAFETY: the descriptor is open for the whole call (borrowed from `file`), and the call
    // reads no memory of ours.
    let rc = unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE)
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Opens an unnamed regular file (`O_TMPFILE`) of `mode` on the filesystem of the directory
/// `dir`, for reading and writing: nothing else sees it until [`link_durably`] names it, and
/// it is freed when closed without a name (a crash included).
pub fn open_unnamed(dir: &Path, mode: u32) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(mode)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)
}

/// Gives the written `file` a second name, `name` in `dir`, durably: the file's data and the
/// new entry are on the disk when this returns, and the file is read-only (its mode without
/// write or execute bits, as containerd's content store keeps its blobs). The link is made
/// to the open file itself, not to a path that could have been swapped since. `Ok(false)`
/// when `name` is taken already (that file is left as it is).
pub fn link_durably(file: &std::fs::File, dir: &Path, name: &str) -> std::io::Result<bool> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    file.sync_all()?;
    let mode = file.metadata()?.permissions().mode() & 0o777 & !0o333;
    file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)?;
    let this_file = format!("/proc/self/fd/{}", file.as_raw_fd());
    match nix::unistd::linkat(
        nix::fcntl::AT_FDCWD,
        this_file.as_str(),
        &dir,
        name,
        nix::fcntl::AtFlags::AT_SYMLINK_FOLLOW,
    ) {
        Ok(()) => {}
        Err(nix::errno::Errno::EEXIST) => return Ok(false),
        Err(e) => return Err(e.into()),
    }
    dir.sync_all()?;
    Ok(true)
}

/// Turns fs-verity on for the file at `path` (SHA-256, a block the smaller of the page and
/// the filesystem's block), as containerd's content store does for each blob it commits
/// where the filesystem supports it; an error where it does not (`EOPNOTSUPP`, `ENOTTY`) or
/// while the file is open for writing somewhere (`ETXTBSY`).
pub fn enable_verity(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    /// `struct fsverity_enable_arg` of <linux/fsverity.h>.
    #[repr(C)]
    struct EnableArg {
        version: u32,
        hash_algorithm: u32,
        block_size: u32,
        salt_size: u32,
        salt_ptr: u64,
        sig_size: u32,
        reserved1: u32,
        sig_ptr: u64,
        reserved2: [u64; 11],
    }
    /// `_IOW('f', 133, struct fsverity_enable_arg)`.
    const FS_IOC_ENABLE_VERITY: libc::c_ulong = 0x4080_6685;
    const FS_VERITY_HASH_ALG_SHA256: u32 = 1;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    // SAFETY: sysconf reads no memory of ours.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let block = match file.metadata()?.blksize() {
        0 => page,
        fs_block => fs_block.min(page),
    };
    let arg = EnableArg {
        version: 1,
        hash_algorithm: FS_VERITY_HASH_ALG_SHA256,
        block_size: u32::try_from(block).unwrap_or(4096),
        salt_size: 0,
        salt_ptr: 0,
        sig_size: 0,
        reserved1: 0,
        sig_ptr: 0,
        reserved2: [0; 11],
    };
    // SAFETY: the descriptor is open for the call and `arg` is a live, properly laid out
    // `fsverity_enable_arg` the kernel only reads (no salt or signature pointers).
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_ENABLE_VERITY as _, &arg) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Reads a small file someone else may have made: only a regular file (a FIFO or device at
/// the path is an error, never waited on), at most `limit` bytes (more is an error).
pub fn read_bounded(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is not a regular file", path.display()),
        ));
    }
    if meta.len() > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is larger than {limit} bytes", path.display()),
        ));
    }
    let mut data = Vec::new();
    file.take(limit + 1).read_to_end(&mut data)?;
    if data.len() as u64 > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is larger than {limit} bytes", path.display()),
        ));
    }
    Ok(data)
}

/// As [`read_bounded`], as text.
pub fn read_bounded_string(path: &Path, limit: u64) -> std::io::Result<String> {
    String::from_utf8(read_bounded(path, limit)?).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: {e}", path.display()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verity_is_on_or_the_filesystem_has_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blob");
        std::fs::write(&path, vec![5u8; 10_000]).unwrap();
        match enable_verity(&path) {
            // A file with fs-verity can no longer be opened for writing.
            Ok(()) => assert!(std::fs::OpenOptions::new().write(true).open(&path).is_err()),
            Err(e) => assert!(
                matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOTTY)),
                "{e}"
            ),
        }
        let missing = enable_verity(&dir.path().join("missing")).unwrap_err();
        assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn a_linked_file_is_read_only_under_its_new_name_and_a_taken_name_is_kept() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let ingest = dir.path().join("ingest");
        std::fs::create_dir(&ingest).unwrap();
        let mut file = std::fs::File::create(ingest.join("data")).unwrap();
        file.write_all(b"blob").unwrap();
        let blobs = dir.path().join("blobs/sha256");
        assert!(link_durably(&file, &blobs, "abc").unwrap());
        let linked = std::fs::metadata(blobs.join("abc")).unwrap();
        assert_eq!(linked.ino(), file.metadata().unwrap().ino());
        assert_eq!(
            linked.permissions().mode() & 0o333,
            0,
            "writable or executable"
        );
        assert_eq!(std::fs::read(blobs.join("abc")).unwrap(), b"blob");
        let other = std::fs::File::create(dir.path().join("other")).unwrap();
        assert!(!link_durably(&other, &blobs, "abc").unwrap());
        assert_eq!(std::fs::read(blobs.join("abc")).unwrap(), b"blob");
        assert_eq!(std::fs::read(blobs.join("abc")).unwrap(), b"blob");
    }

    #[test]
    fn writeback_starts_on_a_file_and_refuses_what_is_not_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut file = std::fs::File::create(dir.path().join("data")).unwrap();
        file.write_all(&[7u8; 64 * 1024]).unwrap();
        start_writeback(&file, 0, 64 * 1024).unwrap();
        let err = start_writeback(&file, u64::MAX, 1).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        let (read, write) = nix::unistd::pipe().unwrap();
        drop(read);
        let pipe = std::fs::File::from(write);
        let err = start_writeback(&pipe, 0, 1).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ESPIPE), "{err}");
    }

    #[test]
    fn a_staged_directory_takes_the_place_of_an_empty_sibling_only() {
        let root = tempfile::tempdir().unwrap();
        let (staged, upper) = (root.path().join("1/fs"), root.path().join("2/fs"));
        std::fs::create_dir_all(&staged).unwrap();
        std::fs::create_dir_all(&upper).unwrap();
        std::fs::write(staged.join("file"), b"layer").unwrap();
        replace_empty_dir(&staged, &upper).unwrap();
        assert_eq!(std::fs::read(upper.join("file")).unwrap(), b"layer");
        assert_eq!(std::fs::read_dir(&staged).unwrap().count(), 0, "left empty");

        // Not onto a directory with something in it, nor anywhere but a sibling's fs.
        std::fs::write(staged.join("other"), b"x").unwrap();
        assert!(replace_empty_dir(&staged, &upper).is_err());
        let elsewhere = root.path().join("3/work");
        std::fs::create_dir_all(&elsewhere).unwrap();
        assert!(replace_empty_dir(&staged, &elsewhere).is_err());
        assert!(replace_empty_dir(&staged, Path::new("/tmp/x/fs")).is_err());
        assert_eq!(std::fs::read(upper.join("file")).unwrap(), b"layer");
    }

    #[test]
    fn a_bounded_read_takes_only_a_small_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("small");
        std::fs::write(&small, b"ok").unwrap();
        assert_eq!(read_bounded(&small, 2).unwrap(), b"ok");
        assert!(read_bounded(&small, 1).is_err(), "larger than the limit");
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // No writer: opening it to read would wait for ever without O_NONBLOCK.
        let err = read_bounded(&fifo, 1024).expect_err("a FIFO");
        assert!(err.to_string().contains("not a regular file"), "{err}");
        assert!(read_bounded(Path::new("/dev/zero"), 1024).is_err());
        std::os::unix::fs::symlink(&small, dir.path().join("link")).unwrap();
        assert_eq!(
            read_bounded_string(&dir.path().join("link"), 16).unwrap(),
            "ok"
        );
    }

    #[test]
    fn atomic_writers_of_one_path_never_share_a_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = std::sync::Arc::new(dir.path().join("state"));
        let writers: Vec<_> = (0..8u8)
            .map(|i| {
                let path = path.clone();
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        write_atomic(&path, &[i; 64], 0o600).unwrap();
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.join().unwrap();
        }
        let data = std::fs::read(&*path).unwrap();
        assert!(
            data.len() == 64 && data.iter().all(|b| *b == data[0]),
            "mixed: {data:?}"
        );
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(left.len(), 1, "temp files left behind");
    }
    use std::os::unix::fs::symlink;

    #[test]
    fn symlinks_and_dot_dot_resolve_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("data/etc")).unwrap();
        symlink("/etc", root.join("data/abs")).unwrap();
        symlink("../../../../..", root.join("data/up")).unwrap();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        let root = std::fs::canonicalize(&root).unwrap();

        assert_eq!(
            resolve_in_root(&root, Path::new("data/abs")).unwrap(),
            root.join("etc")
        );
        assert_eq!(
            resolve_in_root(&root, Path::new("/data/up/etc")).unwrap(),
            root.join("etc")
        );
        assert_eq!(
            resolve_in_root(&root, Path::new("../../data/etc")).unwrap(),
            root.join("data/etc")
        );
        assert_eq!(resolve_in_root(&root, Path::new("")).unwrap(), root);
        let missing = resolve_in_root(&root, Path::new("data/none")).unwrap_err();
        assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn replaces_content_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status");
        write_atomic(&path, b"one", 0o600).unwrap();
        write_atomic(&path, b"two", 0o600).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let entries: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(entries.len(), 1);
    }
}
