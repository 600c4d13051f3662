//! Container checkpoints (kubelet's forensic checkpoint): whether CRIU works on this host,
//! and the archive a checkpoint is written as, in the layout containerd's CRI and CRI-O
//! write (and `checkpointctl` reads).

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::io::AsyncReadExt;

/// The archive's members, as checkpointctl names them.
pub const CHECKPOINT_DIR: &str = "checkpoint";
pub const CONFIG_DUMP: &str = "config.dump";
pub const SPEC_DUMP: &str = "spec.dump";
pub const STATUS_DUMP: &str = "status.dump";
pub const ROOTFS_DIFF: &str = "rootfs-diff.tar";
pub const DELETED_FILES: &str = "deleted.files";
pub const CONTAINER_LOG: &str = "container.log";
/// What CRIU writes in its work dir, kept for whoever reads the checkpoint.
const CRIU_WORK_FILES: &[&str] = &["dump.log", "stats-dump"];
/// How deep a writable layer is walked.
const MAX_DEPTH: usize = 128;

/// How long `criu check` may take.
const CRIU_CHECK_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of its output kept for the reason.
const CRIU_CHECK_MAX_BYTES: u64 = 64 * 1024;

/// Whether CRIU can checkpoint on this host (`criu check`); the reason when not.
pub async fn probe_criu() -> Result<(), String> {
    let child = tokio::process::Command::new("criu")
        .arg("check")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err("CRIU is not installed (no `criu` on the PATH)".to_string());
        }
        Err(e) => return Err(format!("running `criu check`: {e}")),
    };
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let run = async {
        let mut out = Vec::new();
        if let Some(stdout) = stdout {
            stdout
                .take(CRIU_CHECK_MAX_BYTES)
                .read_to_end(&mut out)
                .await?;
        }
        if let Some(stderr) = stderr {
            stderr
                .take(CRIU_CHECK_MAX_BYTES)
                .read_to_end(&mut out)
                .await?;
        }
        let status = child.wait().await?;
        Ok::<_, std::io::Error>((status, out))
    };
    match tokio::time::timeout(CRIU_CHECK_TIMEOUT, run).await {
        Err(_) => Err(format!("`criu check` took over {CRIU_CHECK_TIMEOUT:?}")),
        Ok(Err(e)) => Err(format!("running `criu check`: {e}")),
        Ok(Ok((status, _))) if status.success() => Ok(()),
        Ok(Ok((status, out))) => Err(criu_check_reason(&String::from_utf8_lossy(&out), status)),
    }
}

/// The first error CRIU printed (the root cause; later lines follow from it).
fn criu_check_reason(output: &str, status: std::process::ExitStatus) -> String {
    match first_criu_error(output) {
        Some(line) => format!("`criu check` failed: {line}"),
        None => format!("`criu check` failed ({status})"),
    }
}

/// The first error line of CRIU's output or log (up to 512 characters): the root cause,
/// the later ones follow from it.
pub fn first_criu_error(text: &str) -> Option<String> {
    // `criu check` starts its lines with it; a log puts a timestamp first.
    text.lines()
        .find_map(|l| l.find("Error (").map(|at| &l[at..]))
        .map(|l| l.trim().chars().take(512).collect())
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> CheckpointError {
    let what = what.to_string();
    move |source| CheckpointError::Io { what, source }
}

/// `config.dump`: checkpointctl's description of the checkpointed container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerConfigDump {
    pub id: String,
    pub name: String,
    pub rootfs_image: String,
    pub rootfs_image_ref: String,
    pub rootfs_image_name: String,
    pub runtime: String,
    pub created_time: String,
    pub checkpointed_time: String,
    pub restored_time: String,
    pub restored: bool,
}

/// An RFC 3339 time as Go writes `time.Time` in JSON; the zero time for "never".
pub fn go_time(time: Option<SystemTime>) -> String {
    match time {
        Some(time) => humantime::format_rfc3339_nanos(time).to_string(),
        None => "0001-01-01T00:00:00Z".to_string(),
    }
}

/// Everything a checkpoint archive is made of.
pub struct ArchiveParts<'a> {
    /// CRIU's images (`checkpoint/` in the archive).
    pub images: &'a Path,
    /// CRIU's work dir, whose log and statistics are kept.
    pub work: &'a Path,
    pub config_dump: &'a ContainerConfigDump,
    /// The OCI runtime spec, as JSON.
    pub spec_dump: &'a [u8],
    /// The CRI `ContainerStatus`, as JSON.
    pub status_dump: &'a [u8],
    /// The container's CRI log, if it has one.
    pub log: Option<&'a Path>,
    /// The writable layer's changes, taken while the container was paused.
    pub layer: Option<&'a StagedLayer>,
}

/// A writable layer's changes, staged: its diff as a tar and what it removed.
#[derive(Debug)]
pub struct StagedLayer {
    pub diff: PathBuf,
    pub deleted: Vec<String>,
}

/// Stages the changes of the writable layer `upper` in `scratch` (blocking; the container
/// should be paused, so they agree with its memory).
pub fn stage_layer(upper: &Path, scratch: &Path) -> Result<StagedLayer, CheckpointError> {
    let diff = scratch.join(ROOTFS_DIFF);
    let deleted = write_rootfs_diff(upper, &diff)?;
    Ok(StagedLayer { diff, deleted })
}

/// Writes the archive at `location` (absolute): an uncompressed tar of the CRIU images,
/// CRIU's log, `config.dump`, `spec.dump`, `status.dump`, `container.log` and the
/// writable layer's changes (`rootfs-diff.tar` with what it added or changed, and
/// `deleted.files`, a JSON list of what it removed). It appears whole or not at all: it is
/// written next to `location` and renamed. Blocking.
pub fn write_archive(location: &Path, parts: &ArchiveParts<'_>) -> Result<(), CheckpointError> {
    if !location.is_absolute() {
        return Err(CheckpointError::Invalid(format!(
            "the checkpoint location {} is not an absolute path",
            location.display()
        )));
    }
    let name = location.file_name().ok_or_else(|| {
        CheckpointError::Invalid("the checkpoint location has no file name".into())
    })?;
    let partial = location.with_file_name(format!(
        ".{}.partial-{:x}",
        name.to_string_lossy(),
        rand::random::<u64>()
    ));
    let written = write_archive_to(&partial, parts);
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
        return written;
    }
    std::fs::rename(&partial, location).map_err(|e| {
        let _ = std::fs::remove_file(&partial);
        io(format!("rename the archive to {}", location.display()))(e)
    })
}

fn write_archive_to(path: &Path, parts: &ArchiveParts<'_>) -> Result<(), CheckpointError> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io(format!("create {}", path.display())))?;
    let mut tar = tar::Builder::new(std::io::BufWriter::new(file));
    tar.follow_symlinks(false);
    // The small descriptions first: a restore reads config.dump without going through the
    // images.
    let config = serde_json::to_vec(parts.config_dump)
        .map_err(|e| CheckpointError::Invalid(format!("config.dump: {e}")))?;
    for (name, data) in [
        (CONFIG_DUMP, config.as_slice()),
        (SPEC_DUMP, parts.spec_dump),
        (STATUS_DUMP, parts.status_dump),
    ] {
        append_bytes(&mut tar, name, data)?;
    }
    tar.append_dir_all(CHECKPOINT_DIR, parts.images)
        .map_err(io("archive the CRIU images"))?;
    for name in CRIU_WORK_FILES {
        append_file_exact(&mut tar, &parts.work.join(name), name)?;
    }
    if let Some(log) = parts.log {
        append_file_exact(&mut tar, log, CONTAINER_LOG)?;
    }
    if let Some(layer) = parts.layer {
        append_file_exact(&mut tar, &layer.diff, ROOTFS_DIFF)?;
        let deleted = serde_json::to_vec(&layer.deleted)
            .map_err(|e| CheckpointError::Invalid(format!("deleted.files: {e}")))?;
        append_bytes(&mut tar, DELETED_FILES, &deleted)?;
    }
    let mut out = tar
        .into_inner()
        .map_err(io("finish the archive"))?
        .into_inner()
        .map_err(|e| io("flush the archive")(e.into_error()))?;
    out.flush().map_err(io("flush the archive"))?;
    out.sync_all().map_err(io("sync the archive"))
}

/// Archives a regular file as `name` with the size it has when opened (it may still grow:
/// a container's log); a missing file, or one that is not a regular file, is left out.
fn append_file_exact<W: Write>(
    tar: &mut tar::Builder<W>,
    path: &Path,
    name: &str,
) -> Result<(), CheckpointError> {
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Ok(()),
        Err(e) => return Err(io(format!("open {}", path.display()))(e)),
    };
    let meta = file
        .metadata()
        .map_err(io(format!("stat {}", path.display())))?;
    if !meta.is_file() {
        return Ok(());
    }
    let mut header = tar::Header::new_gnu();
    header.set_size(meta.len());
    header.set_mode(0o600);
    header.set_uid(0);
    header.set_gid(0);
    header.set_cksum();
    let content = std::io::Read::take(file, meta.len());
    let zeros = std::io::Read::take(std::io::repeat(0), meta.len());
    let exact = std::io::Read::take(std::io::Read::chain(content, zeros), meta.len());
    tar.append_data(&mut header, name, exact)
        .map_err(io(format!("archive {name}")))
}

fn append_bytes<W: Write>(
    tar: &mut tar::Builder<W>,
    name: &str,
    data: &[u8],
) -> Result<(), CheckpointError> {
    let mut header = tar::Header::new_gnu();
    header.set_size(data.len() as u64);
    header.set_mode(0o600);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default(),
    );
    header.set_cksum();
    tar.append_data(&mut header, name, data)
        .map_err(io(format!("archive {name}")))
}

/// Tars what the writable layer `upper` added or changed into `out`, and returns what it
/// removed: overlay whiteouts (0/0 character devices) are removed paths, and an opaque
/// directory is one whose earlier content was removed (listed, then written whole). The
/// walk never follows a link and opens nothing that could block (the container's own files:
/// directories, regular files, symlinks and FIFOs are taken; devices and sockets are not).
pub fn write_rootfs_diff(upper: &Path, out: &Path) -> Result<Vec<String>, CheckpointError> {
    use nix::fcntl::OFlag;
    let file = File::create(out).map_err(io(format!("create {}", out.display())))?;
    let mut tar = tar::Builder::new(std::io::BufWriter::new(file));
    let root = nix::fcntl::open(
        upper,
        OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| io(format!("open {}", upper.display()))(e.into()))?;
    let mut deleted = Vec::new();
    let mut budget = ArchiveBudget::default();
    add_layer_dir(&mut tar, &root, Path::new(""), &mut deleted, &mut budget, 0)?;
    tar.into_inner()
        .map_err(io("finish the rootfs diff"))?
        .flush()
        .map_err(io("flush the rootfs diff"))?;
    Ok(deleted)
}

/// The names in a directory open at `dir`.
fn dir_names(dir: &std::os::fd::OwnedFd) -> Result<Vec<std::ffi::OsString>, CheckpointError> {
    use std::os::unix::ffi::OsStrExt;
    let copy = dir.try_clone().map_err(io("dup a directory"))?;
    let mut listing = nix::dir::Dir::from_fd(copy).map_err(|e| io("list a directory")(e.into()))?;
    let mut names = Vec::new();
    for entry in listing.iter() {
        let entry = entry.map_err(|e| io("list a directory")(e.into()))?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(std::ffi::OsStr::from_bytes(name).to_os_string());
        }
    }
    names.sort();
    Ok(names)
}

/// A tar header for a layer entry, from its stat.
fn layer_header(stat: &nix::sys::stat::FileStat, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(stat.st_mode & 0o7777);
    header.set_uid(u64::from(stat.st_uid));
    header.set_gid(u64::from(stat.st_gid));
    header.set_mtime(u64::try_from(stat.st_mtime).unwrap_or_default());
    header.set_size(size);
    header
}

fn add_layer_dir<W: Write>(
    tar: &mut tar::Builder<W>,
    dir: &std::os::fd::OwnedFd,
    relative: &Path,
    deleted: &mut Vec<String>,
    budget: &mut ArchiveBudget,
    depth: usize,
) -> Result<(), CheckpointError> {
    use nix::fcntl::{AtFlags, OFlag};
    use nix::sys::stat::SFlag;
    if depth > MAX_DEPTH {
        return Err(CheckpointError::Invalid(format!(
            "the container's writable layer nests more than {MAX_DEPTH} directories deep"
        )));
    }
    for name in dir_names(dir)? {
        let inside = relative.join(&name);
        let failed = |what: &str| io(format!("{what} {}", inside.display()));
        let stat = nix::sys::stat::fstatat(dir, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| failed("stat")(e.into()))?;
        let kind = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
        if kind == SFlag::S_IFCHR && stat.st_rdev == 0 {
            deleted.push(format!("/{}", inside.display()));
        } else if kind == SFlag::S_IFDIR {
            let child = nix::fcntl::openat(
                dir,
                name.as_os_str(),
                OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )
            .map_err(|e| failed("open")(e.into()))?;
            if is_opaque(&child) {
                deleted.push(format!("/{}", inside.display()));
            }
            let mut header = layer_header(&stat, tar::EntryType::Directory, 0);
            tar.append_data(&mut header, &inside, std::io::empty())
                .map_err(failed("archive"))?;
            add_layer_dir(tar, &child, &inside, deleted, budget, depth + 1)?;
        } else if kind == SFlag::S_IFREG {
            let Some((fd, stat)) = open_regular_file(dir, &name).map_err(failed("open"))? else {
                tracing::debug!(path = %inside.display(), "replaced by a non-file while checkpointed: left out");
                continue;
            };
            let size = u64::try_from(stat.st_size).unwrap_or_default();
            budget.charge(&stat, size, &inside)?;
            let mut header = layer_header(&stat, tar::EntryType::Regular, size);
            // Exactly the size the header promises, even if the file changes meanwhile.
            let content = std::io::Read::take(fd, size);
            let zeros = std::io::Read::take(std::io::repeat(0), size);
            let mut exact = std::io::Read::take(std::io::Read::chain(content, zeros), size);
            tar.append_data(&mut header, &inside, &mut exact)
                .map_err(failed("archive"))?;
        } else if kind == SFlag::S_IFLNK {
            let target = nix::fcntl::readlinkat(dir, name.as_os_str())
                .map_err(|e| failed("read link")(e.into()))?;
            let mut header = layer_header(&stat, tar::EntryType::Symlink, 0);
            tar.append_link(&mut header, &inside, Path::new(&target))
                .map_err(failed("archive"))?;
        } else if kind == SFlag::S_IFIFO {
            let mut header = layer_header(&stat, tar::EntryType::Fifo, 0);
            tar.append_data(&mut header, &inside, std::io::empty())
                .map_err(failed("archive"))?;
        } else {
            tracing::debug!(path = %inside.display(), "a device node or socket is not checkpointed");
        }
    }
    Ok(())
}

/// What archiving a writable layer may write beyond what the layer holds on disk.
const ARCHIVE_SLACK: u64 = 64 * 1024 * 1024;

/// Keeps a layer's archive near the room the layer takes: the archive has no holes and
/// stores each hard link's data again, so a sparse file of 16 TiB (no blocks) or a file of
/// many names would otherwise be written out whole, onto the node's disk.
#[derive(Default)]
struct ArchiveBudget {
    inodes: std::collections::HashSet<(u64, u64)>,
    on_disk: u64,
    archived: u64,
}

impl ArchiveBudget {
    fn charge(
        &mut self,
        stat: &nix::sys::stat::FileStat,
        size: u64,
        path: &Path,
    ) -> Result<(), CheckpointError> {
        if self.inodes.insert((stat.st_dev, stat.st_ino)) {
            let blocks = u64::try_from(stat.st_blocks).unwrap_or_default();
            self.on_disk = self.on_disk.saturating_add(blocks.saturating_mul(512));
        }
        self.archived = self.archived.saturating_add(size);
        if self.archived > self.on_disk.saturating_add(ARCHIVE_SLACK) {
            return Err(CheckpointError::Invalid(format!(
                "the writable layer would be archived at more than {} bytes, far beyond the {} \
                 it takes on disk (at /{}: sparse files or hard links, which a checkpoint \
                 stores whole)",
                self.archived,
                self.on_disk,
                path.display()
            )));
        }
        Ok(())
    }
}

/// Opens `name` in `dir` for reading only if it is a regular file: by O_PATH first (which
/// opens nothing), then through that handle, so a name swapped for a device node or a FIFO
/// in between is never opened. `None`: not a regular file (any more).
fn open_regular_file(
    dir: &std::os::fd::OwnedFd,
    name: &std::ffi::OsStr,
) -> std::io::Result<Option<(File, nix::sys::stat::FileStat)>> {
    use nix::fcntl::OFlag;
    use nix::sys::stat::SFlag;
    use std::os::fd::AsRawFd;
    let path = nix::fcntl::openat(
        dir,
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    let stat = nix::sys::stat::fstat(&path)?;
    if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Ok(None);
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(format!("/proc/self/fd/{}", path.as_raw_fd()))?;
    Ok(Some((file, stat)))
}

/// Whether overlayfs marked the directory open at `dir` opaque (what lower layers had
/// there is hidden).
fn is_opaque(dir: &std::os::fd::OwnedFd) -> bool {
    use std::os::fd::AsRawFd;
    let mut value = [0u8; 1];
    // SAFETY: an open fd, a NUL-terminated name and a buffer of the length given.
    let len = unsafe {
        libc::fgetxattr(
            dir.as_raw_fd(),
            c"trusted.overlay.opaque".as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    len == 1 && value[0] == b'y'
}

/// The most bytes read of one metadata member (`config.dump`, `deleted.files`).
const MAX_METADATA_BYTES: u64 = 16 * 1024 * 1024;

/// The restore side: whether `path` is a checkpoint archive, and its `config.dump`.
pub fn read_config_dump(archive: &Path) -> Result<ContainerConfigDump, CheckpointError> {
    let data = read_member(archive, CONFIG_DUMP)?.ok_or_else(|| {
        CheckpointError::Invalid(format!("{} has no {CONFIG_DUMP}", archive.display()))
    })?;
    serde_json::from_slice(&data).map_err(|e| {
        CheckpointError::Invalid(format!("{CONFIG_DUMP} of {}: {e}", archive.display()))
    })
}

/// One member of the archive, up to [`MAX_METADATA_BYTES`]; `None` when absent.
fn read_member(archive: &Path, name: &str) -> Result<Option<Vec<u8>>, CheckpointError> {
    let file = File::open(archive).map_err(io(format!("open {}", archive.display())))?;
    let mut tar = tar::Archive::new(std::io::BufReader::new(file));
    let entries = tar
        .entries()
        .map_err(io(format!("read {}", archive.display())))?;
    for entry in entries {
        let entry = entry.map_err(io(format!("read {}", archive.display())))?;
        let is_it = entry.path().map_err(io("an archive member's name"))? == Path::new(name);
        if is_it {
            if entry.size() > MAX_METADATA_BYTES {
                return Err(CheckpointError::Invalid(format!(
                    "{name} is {} bytes, more than {MAX_METADATA_BYTES}",
                    entry.size()
                )));
            }
            let mut data = Vec::new();
            std::io::Read::read_to_end(
                &mut std::io::Read::take(entry, MAX_METADATA_BYTES),
                &mut data,
            )
            .map_err(io(format!("read {name}")))?;
            return Ok(Some(data));
        }
    }
    Ok(None)
}

/// What a restore takes from the archive, unpacked.
#[derive(Debug)]
pub struct Unpacked {
    /// CRIU's images.
    pub images: PathBuf,
    /// The writable layer's changes, if the archive has them.
    pub rootfs_diff: Option<PathBuf>,
    /// What the writable layer removed.
    pub deleted: Vec<String>,
}

/// Unpacks the CRIU images (regular files and directories only), the rootfs diff and the
/// deleted files of an archive into `dest`; nothing lands outside it.
pub fn unpack_for_restore(archive: &Path, dest: &Path) -> Result<Unpacked, CheckpointError> {
    std::fs::create_dir_all(dest).map_err(io(format!("create {}", dest.display())))?;
    let file = File::open(archive).map_err(io(format!("open {}", archive.display())))?;
    let mut tar = tar::Archive::new(std::io::BufReader::new(file));
    tar.set_unpack_xattrs(false);
    let entries = tar
        .entries()
        .map_err(io(format!("read {}", archive.display())))?;
    for entry in entries {
        let mut entry = entry.map_err(io(format!("read {}", archive.display())))?;
        let path = entry
            .path()
            .map_err(io("an archive member's name"))?
            .into_owned();
        let kind = entry.header().entry_type();
        let wanted = match path.components().next() {
            Some(std::path::Component::Normal(first)) if first == CHECKPOINT_DIR => {
                kind.is_file() || kind.is_dir()
            }
            _ if path == Path::new(DELETED_FILES) && entry.size() > MAX_METADATA_BYTES => {
                return Err(CheckpointError::Invalid(format!(
                    "{DELETED_FILES} is more than {MAX_METADATA_BYTES} bytes"
                )));
            }
            _ => {
                kind.is_file()
                    && (path == Path::new(ROOTFS_DIFF) || path == Path::new(DELETED_FILES))
            }
        };
        if wanted {
            entry
                .unpack_in(dest)
                .map_err(io(format!("unpack {}", path.display())))?;
        }
    }
    let images = dest.join(CHECKPOINT_DIR);
    if !images.is_dir() {
        return Err(CheckpointError::Invalid(format!(
            "{} has no CRIU images ({CHECKPOINT_DIR}/)",
            archive.display()
        )));
    }
    // Only regular files were unpacked under these names, by this process, into `dest`.
    let deleted = match std::fs::read(dest.join(DELETED_FILES)) {
        Ok(data) => serde_json::from_slice(&data)
            .map_err(|e| CheckpointError::Invalid(format!("{DELETED_FILES}: {e}")))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io(DELETED_FILES)(e)),
    };
    let diff = dest.join(ROOTFS_DIFF);
    Ok(Unpacked {
        images,
        rootfs_diff: diff.is_file().then_some(diff),
        deleted,
    })
}

/// Replays a checkpoint's writable-layer changes on a fresh container's writable layer
/// (an overlay upper dir, before anything mounts it): the diff's directories, files,
/// symlinks and FIFOs (owners and modes kept, no xattrs, nothing outside `upper`), then a
/// whiteout for each removed path, or, where the diff recreated a directory, the opaque
/// mark that hides what the image had there.
pub fn apply_rootfs_diff(
    diff: Option<&Path>,
    deleted: &[String],
    upper: &Path,
) -> Result<(), CheckpointError> {
    if let Some(diff) = diff {
        let file = File::open(diff).map_err(io(format!("open {}", diff.display())))?;
        let mut tar = tar::Archive::new(std::io::BufReader::new(file));
        tar.set_unpack_xattrs(false);
        tar.set_preserve_permissions(true);
        tar.set_preserve_ownerships(true);
        for entry in tar.entries().map_err(io("read the rootfs diff"))? {
            let mut entry = entry.map_err(io("read the rootfs diff"))?;
            let kind = entry.header().entry_type();
            if kind.is_file() || kind.is_dir() || kind.is_symlink() || kind.is_fifo() {
                entry
                    .unpack_in(upper)
                    .map_err(io("unpack the rootfs diff"))?;
            }
        }
    }
    for path in deleted {
        mark_removed(upper, path)?;
    }
    Ok(())
}

/// A whiteout for `path` (a path inside the container) in the upper dir, or the opaque
/// mark on a directory the diff recreated. A path through a symlink or `..` is refused.
fn mark_removed(upper: &Path, path: &str) -> Result<(), CheckpointError> {
    let relative = Path::new(path.trim_start_matches('/'));
    let mut at = upper.to_path_buf();
    let mut components = relative.components().peekable();
    while let Some(component) = components.next() {
        let std::path::Component::Normal(name) = component else {
            return Err(CheckpointError::Invalid(format!(
                "removed path {path:?} is not clean"
            )));
        };
        at.push(name);
        let last = components.peek().is_none();
        match std::fs::symlink_metadata(&at) {
            Ok(meta) if last && meta.is_dir() => return set_opaque(&at),
            Ok(_) if last => return Ok(()),
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(CheckpointError::Invalid(format!(
                    "removed path {path:?} runs through a non-directory"
                )));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && last => {
                return nix::sys::stat::mknod(
                    &at,
                    nix::sys::stat::SFlag::S_IFCHR,
                    nix::sys::stat::Mode::empty(),
                    0,
                )
                .map_err(|e| io(format!("whiteout {path}"))(e.into()));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir(&at).map_err(io(format!("create {}", at.display())))?;
            }
            Err(e) => return Err(io(format!("stat {}", at.display()))(e)),
        }
    }
    Ok(())
}

fn set_opaque(dir: &Path) -> Result<(), CheckpointError> {
    let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| CheckpointError::Invalid(format!("{} has a NUL", dir.display())))?;
    // SAFETY: NUL-terminated strings and a one-byte value, all live across the call.
    let rc = unsafe {
        libc::lsetxattr(
            path.as_ptr(),
            c"trusted.overlay.opaque".as_ptr(),
            b"y".as_ptr().cast(),
            1,
            0,
        )
    };
    if rc != 0 {
        return Err(io(format!("mark {} opaque", dir.display()))(
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Tars a directory (the CRIU images) into `out` and returns the tar's sha256 digest
/// (`sha256:<hex>`) and size, for containerd's content store.
pub fn tar_with_digest(dir: &Path, out: &Path) -> Result<(String, u64), CheckpointError> {
    use sha2::Digest;
    struct Hashing<W> {
        inner: W,
        hasher: sha2::Sha256,
        size: u64,
    }
    impl<W: Write> Write for Hashing<W> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let n = self.inner.write(buf)?;
            self.hasher.update(&buf[..n]);
            self.size += n as u64;
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            self.inner.flush()
        }
    }
    let file = File::create(out).map_err(io(format!("create {}", out.display())))?;
    let mut tar = tar::Builder::new(Hashing {
        inner: std::io::BufWriter::new(file),
        hasher: sha2::Sha256::new(),
        size: 0,
    });
    tar.follow_symlinks(false);
    tar.append_dir_all(".", dir)
        .map_err(io("tar the CRIU images"))?;
    let mut hashing = tar.into_inner().map_err(io("finish the CRIU images"))?;
    hashing.flush().map_err(io("flush the CRIU images"))?;
    let digest = hashing
        .hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>();
    Ok((format!("sha256:{digest}"), hashing.size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    use std::os::unix::process::ExitStatusExt;

    fn entries(archive: &Path) -> Vec<String> {
        let mut tar = tar::Archive::new(File::open(archive).unwrap());
        tar.entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect()
    }

    fn member(archive: &Path, name: &str) -> Vec<u8> {
        let mut tar = tar::Archive::new(File::open(archive).unwrap());
        for entry in tar.entries().unwrap() {
            let mut entry = entry.unwrap();
            if entry.path().unwrap().to_str() == Some(name) {
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
                return data;
            }
        }
        panic!("{name} is not in the archive");
    }

    #[test]
    fn a_layer_is_not_archived_far_beyond_what_it_holds_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let upper = dir.path().join("upper");
        std::fs::create_dir_all(&upper).unwrap();
        std::fs::write(upper.join("small"), b"data").unwrap();
        // A terabyte long, no blocks.
        std::fs::File::create(upper.join("sparse"))
            .unwrap()
            .set_len(1 << 40)
            .unwrap();
        let out = dir.path().join("diff.tar");
        let err = write_rootfs_diff(&upper, &out).expect_err("a sparse terabyte");
        assert!(err.to_string().contains("/sparse"), "{err}");
        assert!(std::fs::metadata(&out).unwrap().len() < ARCHIVE_SLACK);

        // Many names of one file: each would be stored whole.
        std::fs::remove_file(upper.join("sparse")).unwrap();
        std::fs::write(upper.join("big"), vec![1u8; 1 << 20]).unwrap();
        for i in 0..100 {
            std::fs::hard_link(upper.join("big"), upper.join(format!("name{i}"))).unwrap();
        }
        let err = write_rootfs_diff(&upper, &out).expect_err("100 names of a MiB");
        assert!(err.to_string().contains("hard links"), "{err}");

        // A few are fine.
        for i in 5..100 {
            std::fs::remove_file(upper.join(format!("name{i}"))).unwrap();
        }
        write_rootfs_diff(&upper, &out).expect("six names of a MiB");
    }

    #[test]
    fn the_archive_has_every_part_checkpointctl_reads() {
        let dir = tempfile::tempdir().unwrap();
        let images = dir.path().join("images");
        let work = dir.path().join("work");
        let upper = dir.path().join("upper");
        for d in [&images, &work, &upper.join("etc"), &upper.join("data")] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(images.join("pages-1.img"), b"pages").unwrap();
        std::fs::write(work.join("dump.log"), b"dumped").unwrap();
        std::fs::write(upper.join("etc/new.conf"), b"new").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", upper.join("link")).unwrap();
        // A whiteout: the container removed /etc/old.conf.
        nix::sys::stat::mknod(
            &upper.join("etc/old.conf"),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::empty(),
            0,
        )
        .unwrap();
        let log = dir.path().join("c.log");
        std::fs::write(&log, b"2026-12-02T10:00:00Z stdout F 1\n").unwrap();
        let config = ContainerConfigDump {
            id: "abc".into(),
            name: "counter".into(),
            rootfs_image: "busybox:latest".into(),
            rootfs_image_ref: "sha256:1".into(),
            rootfs_image_name: "busybox:latest".into(),
            runtime: "io.containerd.runc.v2".into(),
            created_time: go_time(Some(SystemTime::UNIX_EPOCH)),
            checkpointed_time: go_time(Some(SystemTime::now())),
            restored_time: go_time(None),
            restored: false,
        };
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        let location = out.join("checkpoint.tar");
        let scratch = dir.path().join("scratch");
        std::fs::create_dir(&scratch).unwrap();
        nix::unistd::mkfifo(
            &upper.join("pipe"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        let layer = stage_layer(&upper, &scratch).unwrap();
        let parts = ArchiveParts {
            images: &images,
            work: &work,
            config_dump: &config,
            spec_dump: br#"{"ociVersion":"1.0.2-dev"}"#,
            status_dump: br#"{"id":"abc"}"#,
            log: Some(&log),
            layer: Some(&layer),
        };
        write_archive(&location, &parts).unwrap();

        let names = entries(&location);
        for wanted in [
            "checkpoint/pages-1.img",
            "dump.log",
            CONFIG_DUMP,
            SPEC_DUMP,
            STATUS_DUMP,
            CONTAINER_LOG,
            ROOTFS_DIFF,
            DELETED_FILES,
        ] {
            assert!(
                names.iter().any(|n| n == wanted),
                "{wanted} missing: {names:?}"
            );
        }
        let dumped: ContainerConfigDump =
            serde_json::from_slice(&member(&location, CONFIG_DUMP)).unwrap();
        assert_eq!(dumped, config);
        let text = String::from_utf8(member(&location, CONFIG_DUMP)).unwrap();
        assert!(text.contains("\"rootfsImageRef\":\"sha256:1\""), "{text}");
        assert!(
            text.contains("\"restoredTime\":\"0001-01-01T00:00:00Z\""),
            "{text}"
        );
        let deleted: Vec<String> =
            serde_json::from_slice(&member(&location, DELETED_FILES)).unwrap();
        assert_eq!(deleted, vec!["/etc/old.conf".to_string()]);

        std::fs::write(dir.path().join("diff.tar"), member(&location, ROOTFS_DIFF)).unwrap();
        let diff = entries(&dir.path().join("diff.tar"));
        assert!(diff.contains(&"etc/new.conf".to_string()), "{diff:?}");
        assert!(diff.contains(&"link".to_string()), "{diff:?}");
        assert!(diff.contains(&"pipe".to_string()), "{diff:?}");
        assert!(!diff.iter().any(|n| n.contains("old.conf")), "{diff:?}");
        // Only the archive is left in its directory.
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), 1);

        // The restore side reads it back.
        assert_eq!(read_config_dump(&location).unwrap(), config);
        let dest = dir.path().join("restore");
        let unpacked = unpack_for_restore(&location, &dest).unwrap();
        assert!(unpacked.images.join("pages-1.img").is_file());
        assert_eq!(unpacked.deleted, vec!["/etc/old.conf".to_string()]);
        let fresh = dir.path().join("fresh-upper");
        std::fs::create_dir(&fresh).unwrap();
        apply_rootfs_diff(unpacked.rootfs_diff.as_deref(), &unpacked.deleted, &fresh).unwrap();
        assert_eq!(std::fs::read(fresh.join("etc/new.conf")).unwrap(), b"new");
        let whiteout = std::fs::symlink_metadata(fresh.join("etc/old.conf")).unwrap();
        assert!(whiteout.file_type().is_char_device() && whiteout.rdev() == 0);
        assert_eq!(
            std::fs::read_link(fresh.join("link")).unwrap(),
            Path::new("/etc/passwd")
        );
        let (digest, size) = tar_with_digest(&unpacked.images, &dir.path().join("i.tar")).unwrap();
        assert!(
            digest.starts_with("sha256:") && digest.len() == 71,
            "{digest}"
        );
        assert_eq!(
            size,
            std::fs::metadata(dir.path().join("i.tar")).unwrap().len()
        );

        let relative = write_archive(Path::new("relative.tar"), &parts);
        assert!(matches!(relative, Err(CheckpointError::Invalid(_))));
        let missing_dir = write_archive(&dir.path().join("nope/x.tar"), &parts);
        assert!(matches!(missing_dir, Err(CheckpointError::Io { .. })));
    }

    #[test]
    fn the_first_error_line_is_the_reason() {
        let out = "Warn: x\nError (criu/vdso.c:381): vdso: Unexpected rt vDSO area bounds\n\
                   Error (criu/kerndat.c:1615): kerndat failed\n";
        assert_eq!(
            criu_check_reason(out, std::process::ExitStatus::from_raw(256)),
            "`criu check` failed: Error (criu/vdso.c:381): vdso: Unexpected rt vDSO area bounds"
        );
        assert!(criu_check_reason("", std::process::ExitStatus::from_raw(256)).contains("exit"));
        let log = "(00.001) Warn: x\n(00.002) Error (criu/cr-dump.c:1): dump failed\n";
        assert_eq!(
            first_criu_error(log).as_deref(),
            Some("Error (criu/cr-dump.c:1): dump failed")
        );
    }
}

#[cfg(test)]
mod hostile_tests {
    use super::*;

    #[test]
    fn removed_paths_cannot_leave_the_layer() {
        let dir = tempfile::tempdir().unwrap();
        let upper = dir.path().join("upper");
        std::fs::create_dir(&upper).unwrap();
        std::os::unix::fs::symlink(dir.path(), upper.join("escape")).unwrap();
        for bad in ["/../outside", "/escape/victim", "/a/../../b"] {
            assert!(mark_removed(&upper, bad).is_err(), "{bad}");
        }
        assert!(!dir.path().join("victim").exists());
        assert!(!dir.path().join("outside").exists());
        mark_removed(&upper, "/deep/er/gone").unwrap();
        assert!(upper.join("deep/er").is_dir());
    }

    #[test]
    fn an_archive_member_outside_the_restore_dir_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let archive = dir.path().join("evil.tar");
        let mut tar = tar::Builder::new(File::create(&archive).unwrap());
        let mut header = tar::Header::new_gnu();
        header.set_size(1);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        // Written raw: the builder itself refuses such names.
        header.as_old_mut().name[..20].copy_from_slice(b"checkpoint/../../x\0\0");
        header.set_cksum();
        tar.append(&header, &b"x"[..]).unwrap();
        tar.finish().unwrap();
        drop(tar);
        let dest = dir.path().join("restore");
        std::fs::create_dir(&dest).unwrap();
        let _ = unpack_for_restore(&archive, &dest);
        assert!(!dir.path().join("x").exists());
    }
}
