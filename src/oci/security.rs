//! The pieces of the CRI security context that need more than a field copy: capabilities
//! (including `ALL`, with or without the `CAP_` prefix), devices, mount propagation checks,
//! namespaced sysctls and AppArmor.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    Capabilities, Capability, LinuxDevice, LinuxDeviceBuilder, LinuxDeviceCgroup,
    LinuxDeviceCgroupBuilder, LinuxDeviceType,
};

use super::SpecError;

/// Every capability Linux knows, by its name without `CAP_`.
const ALL_CAPABILITIES: &[&str] = &[
    "AUDIT_CONTROL",
    "AUDIT_READ",
    "AUDIT_WRITE",
    "BLOCK_SUSPEND",
    "BPF",
    "CHECKPOINT_RESTORE",
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "IPC_LOCK",
    "IPC_OWNER",
    "KILL",
    "LEASE",
    "LINUX_IMMUTABLE",
    "MAC_ADMIN",
    "MAC_OVERRIDE",
    "MKNOD",
    "NET_ADMIN",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_RAW",
    "PERFMON",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_CHROOT",
    "SYS_MODULE",
    "SYS_NICE",
    "SYS_PACCT",
    "SYS_PTRACE",
    "SYS_RAWIO",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "SYSLOG",
    "WAKE_ALARM",
];

/// `NET_ADMIN`, `CAP_NET_ADMIN` and `net_admin` all name the same capability.
pub fn parse_capability(name: &str) -> Result<Capability, SpecError> {
    let upper = name.trim().to_ascii_uppercase();
    let bare = upper.strip_prefix("CAP_").unwrap_or(&upper);
    bare.parse::<Capability>()
        .map_err(|_| SpecError::Invalid(format!("unknown capability {name:?}")))
}

/// Every capability crius's own bounding set holds: what a container can be given at most
/// (a runtime cannot grant more than it has; on hosts without, say, CAP_SYS_RESOURCE,
/// "all" must leave it out).
pub fn all_capabilities() -> Capabilities {
    let bounding = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("CapBnd:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        })
        .unwrap_or(u64::MAX);
    ALL_CAPABILITIES
        .iter()
        .filter_map(|c| c.parse::<Capability>().ok())
        .filter(|c| cap_number(*c).is_none_or(|n| bounding & (1u64 << n) != 0))
        .collect()
}

/// The kernel's number for a capability.
fn cap_number(cap: Capability) -> Option<u32> {
    const ORDER: &[&str] = &[
        "CHOWN",
        "DAC_OVERRIDE",
        "DAC_READ_SEARCH",
        "FOWNER",
        "FSETID",
        "KILL",
        "SETGID",
        "SETUID",
        "SETPCAP",
        "LINUX_IMMUTABLE",
        "NET_BIND_SERVICE",
        "NET_BROADCAST",
        "NET_ADMIN",
        "NET_RAW",
        "IPC_LOCK",
        "IPC_OWNER",
        "SYS_MODULE",
        "SYS_RAWIO",
        "SYS_CHROOT",
        "SYS_PTRACE",
        "SYS_PACCT",
        "SYS_ADMIN",
        "SYS_BOOT",
        "SYS_NICE",
        "SYS_RESOURCE",
        "SYS_TIME",
        "SYS_TTY_CONFIG",
        "MKNOD",
        "LEASE",
        "AUDIT_WRITE",
        "AUDIT_CONTROL",
        "SETFCAP",
        "MAC_OVERRIDE",
        "MAC_ADMIN",
        "SYSLOG",
        "WAKE_ALARM",
        "BLOCK_SUSPEND",
        "AUDIT_READ",
        "PERFMON",
        "BPF",
        "CHECKPOINT_RESTORE",
    ];
    let name = cap.to_string();
    ORDER.iter().position(|n| *n == name).map(|i| i as u32)
}

fn is_all(name: &str) -> bool {
    name.trim().eq_ignore_ascii_case("ALL")
}

/// The capability set from the defaults and the CRI's add/drop lists (`ALL` allowed in
/// both): drop ALL starts from nothing, add ALL grants everything, then the named ones are
/// added and dropped.
pub fn capabilities(
    defaults: &Capabilities,
    add: &[String],
    drop: &[String],
) -> Result<Capabilities, SpecError> {
    let drop_all = drop.iter().any(|c| is_all(c));
    let add_all = add.iter().any(|c| is_all(c));
    let mut caps = if drop_all {
        Capabilities::new()
    } else {
        defaults.clone()
    };
    if add_all {
        caps = all_capabilities();
    }
    for name in add.iter().filter(|c| !is_all(c)) {
        caps.insert(parse_capability(name)?);
    }
    for name in drop.iter().filter(|c| !is_all(c)) {
        let cap = parse_capability(name)?;
        caps.remove(&cap);
    }
    Ok(caps)
}

/// A host device file as an OCI device and the cgroup rule that allows it.
pub fn device(
    host_path: &Path,
    container_path: &str,
    permissions: &str,
) -> Result<(LinuxDevice, LinuxDeviceCgroup), SpecError> {
    // The device cgroup takes only r, w and m; runc would fail the start on anything else.
    if !permissions.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
        return Err(SpecError::Invalid(format!(
            "device permissions {permissions:?} may hold only r, w and m"
        )));
    }
    let meta = std::fs::metadata(host_path)
        .map_err(|e| SpecError::Invalid(format!("device {}: {e}", host_path.display())))?;
    let kind = if meta.file_type().is_char_device() {
        LinuxDeviceType::C
    } else if meta.file_type().is_block_device() {
        LinuxDeviceType::B
    } else {
        return Err(SpecError::Invalid(format!(
            "{} is not a device",
            host_path.display()
        )));
    };
    let rdev = meta.rdev();
    let major = nix::sys::stat::major(rdev) as i64;
    let minor = nix::sys::stat::minor(rdev) as i64;
    let permissions = if permissions.is_empty() {
        "rwm"
    } else {
        permissions
    };
    let dev = LinuxDeviceBuilder::default()
        .path(PathBuf::from(container_path))
        .typ(kind)
        .major(major)
        .minor(minor)
        .file_mode(meta.mode() & 0o777)
        .uid(meta.uid())
        .gid(meta.gid())
        .build()?;
    let rule = LinuxDeviceCgroupBuilder::default()
        .allow(true)
        .typ(kind)
        .major(major)
        .minor(minor)
        .access(permissions)
        .build()?;
    Ok((dev, rule))
}

/// Every device node under the host's /dev (for privileged containers).
pub fn host_devices() -> Vec<LinuxDevice> {
    let mut devices = Vec::new();
    let mut stack = vec![PathBuf::from("/dev")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let ft = meta.file_type();
            if ft.is_dir() {
                // Per-container or virtual trees that must not be copied.
                if !matches!(
                    path.file_name().and_then(|n| n.to_str()),
                    Some("pts" | "shm" | "fd" | "mqueue")
                ) {
                    stack.push(path);
                }
                continue;
            }
            if (ft.is_char_device() || ft.is_block_device())
                && path != Path::new("/dev/console")
                && path != Path::new("/dev/ptmx")
                && let Ok((dev, _)) = device(&path, &path.display().to_string(), "rwm")
            {
                devices.push(dev);
            }
        }
    }
    devices
}

/// Whether `path`'s mount is shared, slave, both or neither (from /proc/self/mountinfo).
fn mount_propagation(path: &Path) -> Result<(PathBuf, bool, bool), SpecError> {
    let path = std::fs::canonicalize(path)
        .map_err(|e| SpecError::Invalid(format!("{}: {e}", path.display())))?;
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| SpecError::Invalid(format!("reading mountinfo: {e}")))?;
    let mut best: Option<(PathBuf, bool, bool)> = None;
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(mount_point) = fields.get(4) else {
            continue;
        };
        let mount_point = PathBuf::from(mount_point.replace("\\040", " "));
        if !path.starts_with(&mount_point) {
            continue;
        }
        let optional = fields
            .iter()
            .skip(6)
            .take_while(|f| **f != "-")
            .collect::<Vec<_>>();
        let shared = optional.iter().any(|f| f.starts_with("shared:"));
        let slave = optional.iter().any(|f| f.starts_with("master:"));
        // Later lines mount over earlier ones; longer mount points are more specific.
        if best
            .as_ref()
            .is_none_or(|(b, _, _)| mount_point.as_os_str().len() >= b.as_os_str().len())
        {
            best = Some((mount_point, shared, slave));
        }
    }
    best.ok_or_else(|| SpecError::Invalid(format!("no mount holds {}", path.display())))
}

/// rshared needs the host path on a shared mount, rslave on a shared or slave one.
pub fn check_propagation(host_path: &Path, option: &str) -> Result<(), SpecError> {
    match option {
        "rshared" => {
            let (mount, shared, _) = mount_propagation(host_path)?;
            if !shared {
                return Err(SpecError::Invalid(format!(
                    "path {:?} is mounted on {:?} but it is not a shared mount",
                    host_path, mount
                )));
            }
        }
        "rslave" => {
            let (mount, shared, slave) = mount_propagation(host_path)?;
            if !shared && !slave {
                return Err(SpecError::Invalid(format!(
                    "path {:?} is mounted on {:?} but it is not a shared or slave mount",
                    host_path, mount
                )));
            }
        }
        _ => {}
    }
    Ok(())
}

/// Refuses sysctls that are not namespaced, or whose namespace is the host's.
pub fn validate_sysctls(
    sysctls: &std::collections::HashMap<String, String>,
    host_network: bool,
    host_ipc: bool,
) -> Result<(), SpecError> {
    for key in sysctls.keys() {
        let ipc = key.starts_with("kernel.shm")
            || key.starts_with("kernel.msg")
            || key == "kernel.sem"
            || key.starts_with("fs.mqueue.");
        let net = key.starts_with("net.");
        let uts = key == "kernel.hostname" || key == "kernel.domainname";
        if !(ipc || net || uts) {
            return Err(SpecError::Invalid(format!(
                "sysctl {key:?} is not namespaced: it would change the host"
            )));
        }
        if net && host_network {
            return Err(SpecError::Invalid(format!(
                "sysctl {key:?} cannot be set in a pod that uses the host's network"
            )));
        }
        if ipc && host_ipc {
            return Err(SpecError::Invalid(format!(
                "sysctl {key:?} cannot be set in a pod that uses the host's IPC"
            )));
        }
        if uts && host_network {
            return Err(SpecError::Invalid(format!(
                "sysctl {key:?} cannot be set in a pod that uses the host's UTS namespace"
            )));
        }
    }
    Ok(())
}

fn apparmor_enabled() -> bool {
    std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .map(|v| v.trim() == "Y")
        .unwrap_or(false)
}

/// The AppArmor profile for a process: a named profile (`localhost/<name>` or a Localhost
/// security profile) when the kernel has AppArmor, none for unconfined or the runtime
/// default without AppArmor; an explicit profile without AppArmor is an error.
pub fn apparmor_profile(
    profile: Option<&crate::api::v1::SecurityProfile>,
    legacy: &str,
    privileged: bool,
) -> Result<Option<String>, SpecError> {
    use crate::api::v1::security_profile::ProfileType;
    let named = match profile {
        Some(p) => match ProfileType::try_from(p.profile_type) {
            Ok(ProfileType::Localhost) => Some(p.localhost_ref.clone()),
            Ok(ProfileType::RuntimeDefault) | Ok(ProfileType::Unconfined) => None,
            Err(_) => {
                return Err(SpecError::Invalid(format!(
                    "unknown AppArmor profile type {}",
                    p.profile_type
                )));
            }
        },
        None => match legacy {
            "" | "unconfined" | "runtime/default" => None,
            other => match other.strip_prefix("localhost/") {
                Some(name) => Some(name.to_string()),
                None => {
                    return Err(SpecError::Invalid(format!(
                        "unsupported AppArmor profile {other:?}"
                    )));
                }
            },
        },
    };
    match named {
        None => Ok(None),
        Some(_) if privileged => Ok(None),
        Some(name) if apparmor_enabled() => Ok(Some(name)),
        Some(name) => Err(SpecError::Invalid(format!(
            "AppArmor profile {name:?} requested but AppArmor is not enabled on this host"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_names_with_and_without_prefix() {
        assert_eq!(parse_capability("NET_ADMIN").unwrap(), Capability::NetAdmin);
        assert_eq!(
            parse_capability("CAP_NET_ADMIN").unwrap(),
            Capability::NetAdmin
        );
        assert_eq!(parse_capability("sys_admin").unwrap(), Capability::SysAdmin);
        assert!(parse_capability("FLY").is_err());
        assert!(all_capabilities().contains(&Capability::Chown));
        assert_eq!(cap_number(Capability::SysAdmin), Some(21));
        assert_eq!(cap_number(Capability::CheckpointRestore), Some(40));
    }

    #[test]
    fn add_and_drop_with_all() {
        let defaults = crate::oci::default_capabilities();
        let caps = capabilities(&defaults, &["NET_ADMIN".into()], &["CHOWN".into()]).unwrap();
        assert!(caps.contains(&Capability::NetAdmin) && !caps.contains(&Capability::Chown));
        let only = capabilities(&defaults, &["NET_ADMIN".into()], &["ALL".into()]).unwrap();
        assert_eq!(only, [Capability::NetAdmin].into_iter().collect());
        let all = capabilities(&defaults, &["ALL".into()], &["CAP_CHOWN".into()]).unwrap();
        assert_eq!(all.len(), all_capabilities().len() - 1);
        let none = capabilities(&defaults, &[], &["all".into()]).unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn sysctls_must_be_namespaced_and_not_the_hosts() {
        let one = |k: &str| [(k.to_string(), "1".to_string())].into_iter().collect();
        assert!(validate_sysctls(&one("net.ipv4.ip_forward"), false, false).is_ok());
        assert!(validate_sysctls(&one("kernel.shm_rmid_forced"), false, false).is_ok());
        assert!(validate_sysctls(&one("net.ipv4.ip_forward"), true, false).is_err());
        assert!(validate_sysctls(&one("kernel.shm_rmid_forced"), false, true).is_err());
        assert!(validate_sysctls(&one("vm.swappiness"), false, false).is_err());
    }

    #[test]
    fn null_device() {
        let (dev, rule) = device(Path::new("/dev/null"), "/dev/mynull", "rw").unwrap();
        assert_eq!((dev.major(), dev.minor()), (1, 3));
        assert_eq!(rule.access().as_deref(), Some("rw"));
        assert!(device(Path::new("/etc/hostname"), "/x", "").is_err());
        assert!(device(Path::new("/dev/null"), "/dev/mynull", "xyz").is_err());
    }
}
