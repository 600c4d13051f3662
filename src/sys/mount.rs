//! Mounting containerd's snapshot mounts on the host, for the few filesystems crius itself
//! mounts (image volumes). A snapshotter describes a mount as a type, a source and
//! fstab-style options; `MountPlan` turns that into `mount(2)` calls.

use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};

/// The longest option string `mount(2)` takes (one page, with its terminating NUL).
const MAX_MOUNT_DATA: usize = 4095;

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("mount type {0:?} is not supported (only bind and overlay)")]
    UnsupportedType(String),
    #[error(
        "the mount options are {0} bytes, more than mount(2) takes ({MAX_MOUNT_DATA}): the \
         image has too many layers"
    )]
    OptionsTooLong(usize),
    #[error("mounting {from} on {target}: {errno}")]
    Mount {
        from: String,
        target: PathBuf,
        errno: Errno,
    },
    #[error("unmounting {target}: {errno}")]
    Unmount { target: PathBuf, errno: Errno },
}

/// One snapshot mount as `mount(2)` arguments. A read-only bind needs a second, remounting
/// call (`remount_read_only`): the kernel ignores MS_RDONLY on the bind itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPlan {
    pub fstype: Option<String>,
    pub source: String,
    pub flags: MsFlags,
    pub data: String,
    pub remount_read_only: bool,
}

impl MountPlan {
    /// The plan for a containerd mount: only what a snapshotter hands out for a view
    /// (`bind` for one layer, `overlay` for more).
    pub fn from_containerd(mount: &containerd_client::types::Mount) -> Result<Self, MountError> {
        let mut flags = MsFlags::empty();
        let mut data = Vec::new();
        for option in &mount.options {
            match option_flag(option) {
                Some((flag, true)) => flags |= flag,
                Some((flag, false)) => flags &= !flag,
                None => data.push(option.as_str()),
            }
        }
        let data = data.join(",");
        if data.len() > MAX_MOUNT_DATA {
            return Err(MountError::OptionsTooLong(data.len()));
        }
        match mount.r#type.as_str() {
            "bind" | "rbind" => {
                flags |= MsFlags::MS_BIND;
                if mount.r#type == "rbind" {
                    flags |= MsFlags::MS_REC;
                }
                let remount_read_only = flags.contains(MsFlags::MS_RDONLY);
                Ok(Self {
                    fstype: None,
                    source: mount.source.clone(),
                    flags,
                    data,
                    remount_read_only,
                })
            }
            "overlay" => Ok(Self {
                fstype: Some("overlay".to_string()),
                source: mount.source.clone(),
                flags,
                data,
                remount_read_only: false,
            }),
            other => Err(MountError::UnsupportedType(other.to_string())),
        }
    }

    fn apply(&self, target: &Path) -> Result<(), MountError> {
        let failed = |errno| MountError::Mount {
            from: self.source.clone(),
            target: target.to_path_buf(),
            errno,
        };
        let data = (!self.data.is_empty()).then_some(self.data.as_str());
        nix::mount::mount(
            Some(self.source.as_str()),
            target,
            self.fstype.as_deref(),
            self.flags,
            data,
        )
        .map_err(failed)?;
        if self.remount_read_only {
            let remount = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY;
            if let Err(errno) =
                nix::mount::mount(None::<&str>, target, None::<&str>, remount, None::<&str>)
            {
                let _ = nix::mount::umount2(target, MntFlags::MNT_DETACH);
                return Err(failed(errno));
            }
        }
        Ok(())
    }
}

/// The flag an fstab option stands for, and whether it sets (true) or clears it.
fn option_flag(option: &str) -> Option<(MsFlags, bool)> {
    let flag = match option {
        "ro" => (MsFlags::MS_RDONLY, true),
        "rw" => (MsFlags::MS_RDONLY, false),
        "bind" => (MsFlags::MS_BIND, true),
        "rbind" => (MsFlags::MS_BIND | MsFlags::MS_REC, true),
        "nosuid" => (MsFlags::MS_NOSUID, true),
        "suid" => (MsFlags::MS_NOSUID, false),
        "nodev" => (MsFlags::MS_NODEV, true),
        "dev" => (MsFlags::MS_NODEV, false),
        "noexec" => (MsFlags::MS_NOEXEC, true),
        "exec" => (MsFlags::MS_NOEXEC, false),
        "noatime" => (MsFlags::MS_NOATIME, true),
        "relatime" => (MsFlags::MS_RELATIME, true),
        "strictatime" => (MsFlags::MS_STRICTATIME, true),
        "nodiratime" => (MsFlags::MS_NODIRATIME, true),
        "sync" => (MsFlags::MS_SYNCHRONOUS, true),
        _ => return None,
    };
    Some(flag)
}

/// Whether overlay takes the `volatile` option here (Linux 5.10 and later).
pub fn overlay_has_volatile() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        nix::sys::utsname::uname()
            .ok()
            .and_then(|u| kernel_at_least(&u.release().to_string_lossy(), (5, 10)))
            .unwrap_or(false)
    })
}

/// Whether a kernel release such as `6.18.0-1-amd64` is at least `version`; None when it
/// does not read as one.
pub fn kernel_at_least(release: &str, version: (u32, u32)) -> Option<bool> {
    let mut parts = release.split(['.', '-']);
    let major: u32 = parts.next()?.parse().ok()?;
    let minor: u32 = parts.next()?.parse().ok()?;
    Some((major, minor) >= version)
}

/// Mounts a snapshot's mounts on `target`, in order. What was mounted before a failure is
/// unmounted again.
pub fn mount_all(
    mounts: &[containerd_client::types::Mount],
    target: &Path,
) -> Result<(), MountError> {
    let plans = mounts
        .iter()
        .map(MountPlan::from_containerd)
        .collect::<Result<Vec<_>, _>>()?;
    for (done, plan) in plans.iter().enumerate() {
        if let Err(e) = plan.apply(target) {
            for _ in 0..done {
                let _ = nix::mount::umount2(target, MntFlags::MNT_DETACH);
            }
            return Err(e);
        }
    }
    Ok(())
}

/// Mounts a tmpfs on `target`, without exec, setuid or devices, with `options`
/// (`mode=`, `size=`, `uid=`, `gid=`).
pub fn mount_tmpfs(target: &Path, options: &str) -> Result<(), MountError> {
    nix::mount::mount(
        Some("tmpfs"),
        target,
        Some("tmpfs"),
        MsFlags::MS_NOEXEC | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(options),
    )
    .map_err(|errno| MountError::Mount {
        from: "tmpfs".to_string(),
        target: target.to_path_buf(),
        errno,
    })
}

/// Detaches what is mounted on `target` (nothing mounted, or no `target`, is fine).
pub fn unmount(target: &Path) -> Result<(), MountError> {
    match nix::mount::umount2(target, MntFlags::MNT_DETACH) {
        Ok(()) | Err(Errno::EINVAL | Errno::ENOENT) => Ok(()),
        Err(errno) => Err(MountError::Unmount {
            target: target.to_path_buf(),
            errno,
        }),
    }
}

/// Unmounts everything stacked on `target` (nothing mounted, or no `target`, is fine).
pub fn unmount_all(target: &Path) -> Result<(), MountError> {
    // A bound on the stack a hostile caller could have built on the same path.
    for _ in 0..64 {
        match nix::mount::umount2(target, MntFlags::MNT_DETACH) {
            Ok(()) => continue,
            Err(Errno::EINVAL | Errno::ENOENT) => return Ok(()),
            Err(errno) => {
                return Err(MountError::Unmount {
                    target: target.to_path_buf(),
                    errno,
                });
            }
        }
    }
    Ok(())
}

/// Unmounts a file pinned by a bind mount (a namespace) and removes it; a missing one is
/// fine. On failure, what failed ("unmount" or "remove") and why.
pub fn unpin(path: &Path) -> Result<(), (&'static str, String)> {
    match nix::mount::umount2(path, MntFlags::MNT_DETACH) {
        Ok(()) | Err(Errno::EINVAL) | Err(Errno::ENOENT) => {}
        Err(e) => return Err(("unmount", e.to_string())),
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(("remove", e.to_string())),
    }
}

/// Whether `path` is a mount point (its device differs from its parent's, or it is bound
/// on itself as the mount table says).
pub fn is_mount_point(path: &Path) -> std::io::Result<bool> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let wanted = path.to_string_lossy();
    Ok(mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .any(|point| unescape_octal(point) == wanted))
}

/// Mount points in mountinfo escape space, tab, newline and backslash as `\ooo`.
fn unescape_octal(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(code) = field
                .get(i + 1..i + 4)
                .and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            out.push(code);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use containerd_client::types::Mount;

    fn mount(kind: &str, options: &[&str]) -> Mount {
        Mount {
            r#type: kind.to_string(),
            source: "/snapshots/1/fs".to_string(),
            target: String::new(),
            options: options.iter().map(|o| o.to_string()).collect(),
        }
    }

    #[test]
    fn a_read_only_bind_is_bound_then_remounted_read_only() {
        let plan = MountPlan::from_containerd(&mount("bind", &["ro", "rbind"])).unwrap();
        assert_eq!(plan.fstype, None);
        assert!(plan.flags.contains(MsFlags::MS_BIND | MsFlags::MS_REC));
        assert!(plan.remount_read_only);
        assert_eq!(plan.data, "");
    }

    #[test]
    fn overlay_options_go_to_the_filesystem_and_flags_to_the_call() {
        let plan = MountPlan::from_containerd(&mount(
            "overlay",
            &["lowerdir=/a:/b", "index=off", "nodev", "ro"],
        ))
        .unwrap();
        assert_eq!(plan.fstype.as_deref(), Some("overlay"));
        assert_eq!(plan.data, "lowerdir=/a:/b,index=off");
        assert!(plan.flags.contains(MsFlags::MS_NODEV | MsFlags::MS_RDONLY));
        assert!(!plan.remount_read_only);
    }

    #[test]
    fn other_types_and_oversized_options_are_refused() {
        assert!(matches!(
            MountPlan::from_containerd(&mount("ext4", &[])),
            Err(MountError::UnsupportedType(_))
        ));
        let layers = vec!["/var/lib/containerd/snapshots/123456/fs"; 200].join(":");
        let lowerdir = format!("lowerdir={layers}");
        assert!(matches!(
            MountPlan::from_containerd(&mount("overlay", &[&lowerdir])),
            Err(MountError::OptionsTooLong(_))
        ));
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape_octal(r"/a\040b"), "/a b");
        assert_eq!(unescape_octal(r"/plain"), "/plain");
        assert_eq!(unescape_octal(r"/end\"), r"/end\");
    }

    #[test]
    fn the_root_is_a_mount_point_and_a_plain_directory_is_not() {
        assert!(is_mount_point(Path::new("/")).unwrap());
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_mount_point(dir.path()).unwrap());
    }
}
