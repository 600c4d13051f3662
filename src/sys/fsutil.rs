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
