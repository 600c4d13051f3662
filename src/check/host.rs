//! Checks of the host itself: filesystems, cgroups, OOM scores, security modules, the CNI
//! conf dir and the ports crius listens on. The parsing is split from the reading so it
//! can be tested on sample files.

use std::path::Path;

use super::Finding;
use crate::config::{Config, RestrictOomScoreAdj};
use crate::stats::cgroup::{CgroupLayout, CgroupMount, cgroup_mounts};

/// CAP_SYS_RESOURCE, which lowering an OOM score adjustment needs.
const CAP_SYS_RESOURCE: u32 = 24;

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// overlayfs in the kernel, when the snapshotter needs it.
pub fn overlayfs(config: &Config) -> Finding {
    if config.containerd.snapshotter != "overlayfs" {
        return Finding::pass(
            "overlayfs",
            format!(
                "not needed by the {:?} snapshotter",
                config.containerd.snapshotter
            ),
        );
    }
    if has_filesystem(&read("/proc/filesystems"), "overlay") {
        Finding::pass("overlayfs", "the kernel has it")
    } else if overlay_module_installed() {
        Finding::pass(
            "overlayfs",
            "the overlay module is installed (the kernel loads it at the first mount)",
        )
    } else {
        Finding::fail(
            "overlayfs",
            "the kernel does not list overlay in /proc/filesystems",
            "modprobe overlay (and add it to /etc/modules-load.d), or use another snapshotter",
        )
    }
}

/// `overlay.ko` (compressed or not) among the running kernel's modules.
fn overlay_module_installed() -> bool {
    let release = read("/proc/sys/kernel/osrelease");
    let release = release.trim();
    if release.is_empty() || release.contains('/') {
        return false;
    }
    let dir = Path::new("/lib/modules")
        .join(release)
        .join("kernel/fs/overlayfs");
    std::fs::read_dir(dir).is_ok_and(|mut entries| {
        entries.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("overlay.ko")))
    })
}

fn has_filesystem(filesystems: &str, name: &str) -> bool {
    filesystems
        .lines()
        .any(|l| l.split_whitespace().last() == Some(name))
}

/// The cgroup hierarchy and the driver the default runtime uses.
pub fn cgroups(config: &Config) -> Finding {
    let systemd_driver = config.runtime("").is_some_and(|r| r.options.systemd_cgroup);
    let systemd_runs = Path::new("/run/systemd/system").is_dir();
    cgroup_finding(
        CgroupLayout::from_mountinfo(&read("/proc/self/mountinfo")),
        systemd_driver,
        systemd_runs,
    )
}

fn cgroup_finding(
    layout: Option<CgroupLayout>,
    systemd_driver: bool,
    systemd_runs: bool,
) -> Finding {
    let driver = if systemd_driver {
        "systemd"
    } else {
        "cgroupfs"
    };
    let Some(layout) = layout else {
        return Finding::fail(
            "cgroups",
            "no cgroup filesystem is mounted",
            "mount cgroup2 at /sys/fs/cgroup",
        );
    };
    if systemd_driver && !systemd_runs {
        return Finding::fail(
            "cgroups",
            "the default runtime uses the systemd cgroup driver but systemd is not running",
            "set SystemdCgroup = false in the default runtime's options (and kubelet's cgroupDriver: cgroupfs)",
        );
    }
    match layout {
        CgroupLayout::V2 { .. } => Finding::pass(
            "cgroups",
            format!("v2 (unified), driver {driver}: kubelet's cgroupDriver must be {driver}"),
        ),
        CgroupLayout::V1 { .. } => Finding::warn(
            "cgroups",
            format!("v1 (or hybrid), driver {driver}"),
            "kubelet 1.35 and later refuse cgroup v1 unless failCgroupV1: false; boot with systemd.unified_cgroup_hierarchy=1",
        ),
    }
}

/// Whether moving a process into a cgroup is cheap. Without `favordynmods` the kernel
/// guards every move (runc's write of a pid to `cgroup.procs`, once for each container start
/// and each exec) with one global lock whose writer waits for an RCU grace period: 10-30 ms
/// on the development VM whenever the node was quiet for a moment, as between kubelet's exec
/// probes. With it a move waits for no grace period (from Linux 6.18 it takes a lock of the
/// process's thread group only).
pub fn cgroup_moves() -> Option<Finding> {
    cgroup_moves_finding(&read("/proc/self/mountinfo"))
}

fn cgroup_moves_finding(mountinfo: &str) -> Option<Finding> {
    let mounts: Vec<CgroupMount> = cgroup_mounts(mountinfo).collect();
    if mounts.is_empty() {
        // The cgroups check fails already.
        return None;
    }
    let favored = mounts
        .iter()
        .any(|m| m.super_options.split(',').any(|o| o == "favordynmods"));
    if favored {
        return Some(Finding::pass(
            "cgroup moves",
            "favordynmods: moving a process into a pod's cgroups takes no global lock",
        ));
    }
    let remount = mounts
        .iter()
        .find(|m| m.v2)
        .map(|m| {
            format!(
                "mount -o remount,favordynmods {} (Linux 6.18 keeps it until reboot), or ",
                m.point
            )
        })
        .unwrap_or_default();
    Some(Finding::warn(
        "cgroup moves",
        "no favordynmods: every container start and exec may wait for an RCU grace period \
         to move its process into the pod's cgroups (10-30 ms on a quiet node)",
        format!("{remount}boot with cgroup_favordynmods=true; forks and exits cost a little more"),
    ))
}

/// Whether crius can give pods OOM score adjustments below its own.
pub fn oom_scores(config: &Config) -> Finding {
    let own = read("/proc/self/oom_score_adj").trim().parse().unwrap_or(0);
    oom_finding(
        has_capability(&read("/proc/self/status"), CAP_SYS_RESOURCE),
        own,
        config.restrict_oom_score_adj,
    )
}

fn oom_finding(can_lower: bool, own: i32, restrict: RestrictOomScoreAdj) -> Finding {
    match (can_lower, restrict) {
        (_, RestrictOomScoreAdj::Always) => Finding::warn(
            "OOM scores",
            format!("restrict_oom_score_adj = true: pods' adjustments are clamped to {own}"),
            "set restrict_oom_score_adj = \"auto\" unless crius runs where it cannot lower them",
        ),
        (true, _) => Finding::pass("OOM scores", "crius may lower them (CAP_SYS_RESOURCE)"),
        (false, RestrictOomScoreAdj::Auto) => Finding::warn(
            "OOM scores",
            format!(
                "no CAP_SYS_RESOURCE where this check runs: crius run the same way clamps pods' adjustments to {own}"
            ),
            "run crius as root with its capabilities (the systemd unit does)",
        ),
        (false, RestrictOomScoreAdj::Never) => Finding::fail(
            "OOM scores",
            "no CAP_SYS_RESOURCE where this check runs, and restrict_oom_score_adj = false: pods asking for a lower score would fail",
            "run crius with CAP_SYS_RESOURCE, or set restrict_oom_score_adj = \"auto\"",
        ),
    }
}

fn has_capability(status: &str, cap: u32) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << cap) != 0)
}

/// AppArmor and SELinux: crius applies AppArmor profiles pods ask for, and labels nothing.
pub fn security_modules() -> Finding {
    let apparmor = read("/sys/module/apparmor/parameters/enabled").trim() == "Y";
    let selinux = match read("/sys/fs/selinux/enforce").trim() {
        "1" => Some(true),
        "0" => Some(false),
        _ => None,
    };
    lsm_finding(apparmor, selinux)
}

fn lsm_finding(apparmor: bool, selinux_enforcing: Option<bool>) -> Finding {
    let apparmor_text = if apparmor {
        "AppArmor enabled"
    } else {
        "AppArmor off (pods asking for a localhost/ profile are refused)"
    };
    match selinux_enforcing {
        Some(true) => Finding::warn(
            "security modules",
            format!("{apparmor_text}; SELinux enforcing"),
            "crius does not label containers for SELinux: use permissive mode or a policy that allows container_t's defaults",
        ),
        Some(false) => Finding::pass(
            "security modules",
            format!("{apparmor_text}; SELinux permissive"),
        ),
        None => Finding::pass("security modules", format!("{apparmor_text}; no SELinux")),
    }
}

/// The CNI conf dir parses, and every plugin its networks name is installed.
pub fn cni(config: &Config) -> Vec<Finding> {
    let cni = &config.cni;
    let loaded = match crate::cni::config::load_networks(&cni.conf_dir, cni.max_conf_num) {
        Ok(loaded) => loaded,
        Err(e) if !cni.conf_template.is_empty() => {
            return vec![Finding::warn(
                "CNI config",
                e.to_string(),
                "kubelet's pod CIDR will turn cni.conf_template into a network (UpdateRuntimeConfig)",
            )];
        }
        Err(e) => {
            return vec![Finding::fail(
                "CNI config",
                e.to_string(),
                format!(
                    "install a network plugin that writes its conflist to {}, or copy contrib/10-crius-bridge.conflist there",
                    cni.conf_dir.display()
                ),
            )];
        }
    };
    let names: Vec<&str> = loaded.networks.iter().map(|n| n.name.as_str()).collect();
    let mut findings = vec![Finding::pass(
        "CNI config",
        format!(
            "{} network(s) from {}: {}",
            names.len(),
            cni.conf_dir.display(),
            names.join(", ")
        ),
    )];
    for (file, reason) in &loaded.rejected {
        findings.push(Finding::warn(
            "CNI config",
            format!("{} ignored: {reason}", file.display()),
            "fix or remove the file",
        ));
    }
    let mut missing: Vec<&str> = loaded
        .networks
        .iter()
        .flat_map(|n| n.plugin_types())
        .chain((!cni.use_internal_loopback).then_some("loopback"))
        .filter(|plugin| !cni.bin_dirs.iter().any(|dir| dir.join(plugin).is_file()))
        .collect();
    missing.sort_unstable();
    missing.dedup();
    let dirs = cni
        .bin_dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    findings.push(if missing.is_empty() {
        Finding::pass("CNI plugins", format!("all found in {dirs}"))
    } else {
        Finding::fail(
            "CNI plugins",
            format!("not found in {dirs}: {}", missing.join(", ")),
            "install them (Debian: containernetworking-plugins) or add their directory to cni.bin_dirs",
        )
    });
    findings
}

/// The stream server's port is free (or chosen at start-up, or held by the crius that
/// answers on the configured socket).
pub async fn stream_port(config: &Config, crius_running: bool) -> Finding {
    let stream = &config.stream;
    if stream.port == 0 {
        return Finding::pass(
            "stream server",
            format!("{}: a free port is picked at start-up", stream.address),
        );
    }
    let address = if stream.address.contains(':') {
        format!("[{}]:{}", stream.address, stream.port)
    } else {
        format!("{}:{}", stream.address, stream.port)
    };
    listen_address("stream server", &address, crius_running).await
}

/// `address` can be listened on: bound, then released at once. When crius is running, the
/// port being taken is expected.
pub async fn listen_address(name: &str, address: &str, crius_running: bool) -> Finding {
    match tokio::net::TcpListener::bind(address).await {
        Ok(listener) => {
            drop(listener);
            Finding::pass(name, format!("{address} is free"))
        }
        Err(e) if crius_running && e.kind() == std::io::ErrorKind::AddrInUse => Finding::pass(
            name,
            format!("{address} is in use, as it should be: crius is running"),
        ),
        Err(e) => Finding::fail(
            name,
            format!("cannot listen on {address}: {e}"),
            "stop what holds the port (a running crius does), or configure another",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay_is_found_in_proc_filesystems() {
        let filesystems = "nodev\tsysfs\nnodev\ttmpfs\n\text4\nnodev\toverlay\n";
        assert!(has_filesystem(filesystems, "overlay"));
        assert!(has_filesystem(filesystems, "ext4"));
        assert!(!has_filesystem("nodev\tsysfs\n", "overlay"));
    }

    #[test]
    fn capabilities_are_read_from_the_effective_set() {
        let root = "Name:\tcrius\nCapEff:\t000001ffffffffff\n";
        let none = "Name:\tcrius\nCapEff:\t0000000000000000\n";
        assert!(has_capability(root, CAP_SYS_RESOURCE));
        assert!(!has_capability(none, CAP_SYS_RESOURCE));
        assert!(!has_capability("", CAP_SYS_RESOURCE));
    }

    #[test]
    fn oom_scores_fail_only_when_crius_must_lower_them_and_cannot() {
        use crate::check::Outcome;
        assert_eq!(
            oom_finding(true, 0, RestrictOomScoreAdj::Auto).outcome,
            Outcome::Pass
        );
        assert_eq!(
            oom_finding(false, -500, RestrictOomScoreAdj::Auto).outcome,
            Outcome::Warn
        );
        assert_eq!(
            oom_finding(false, 0, RestrictOomScoreAdj::Never).outcome,
            Outcome::Fail
        );
        let always = oom_finding(true, -999, RestrictOomScoreAdj::Always);
        assert!(always.detail.contains("-999"), "{always:?}");
    }

    #[test]
    fn cgroups_name_the_hierarchy_and_driver() {
        use crate::check::Outcome;
        let v2 =
            CgroupLayout::from_mountinfo("29 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
        let found = cgroup_finding(v2.clone(), true, true);
        assert_eq!(found.outcome, Outcome::Pass);
        assert!(found.detail.contains("driver systemd"), "{found:?}");
        assert_eq!(cgroup_finding(v2, true, false).outcome, Outcome::Fail);
        let v1 = CgroupLayout::from_mountinfo(
            "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n",
        );
        let found = cgroup_finding(v1, false, true);
        assert_eq!(found.outcome, Outcome::Warn);
        assert!(found.fix.unwrap().contains("failCgroupV1"));
        assert_eq!(cgroup_finding(None, false, true).outcome, Outcome::Fail);
    }

    #[test]
    fn cgroup_moves_want_favordynmods_on_a_cgroup_mount() {
        use crate::check::Outcome;
        let hybrid = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
                      30 25 0:27 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        let found = cgroup_moves_finding(hybrid).expect("a finding");
        assert_eq!(found.outcome, Outcome::Warn);
        let fix = found.fix.expect("a fix");
        assert!(
            fix.contains("remount,favordynmods /sys/fs/cgroup/unified"),
            "the v2 mount is named: {fix}"
        );
        let v1_only = "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        let fix = cgroup_moves_finding(v1_only)
            .and_then(|f| f.fix)
            .expect("a fix");
        assert!(!fix.contains("remount"), "v1 takes it at boot only: {fix}");
        assert!(fix.contains("cgroup_favordynmods=true"), "{fix}");
        let favored =
            "29 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate,favordynmods\n";
        assert_eq!(
            cgroup_moves_finding(favored).map(|f| f.outcome),
            Some(Outcome::Pass)
        );
        // The option on a mount's own flags (left of " - ") is not the file system's.
        let not_super = "29 23 0:26 / /sys/fs/cgroup rw,favordynmods - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup_moves_finding(not_super).map(|f| f.outcome),
            Some(Outcome::Warn)
        );
        assert!(cgroup_moves_finding("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n").is_none());
    }

    #[test]
    fn selinux_enforcing_is_a_warning() {
        use crate::check::Outcome;
        assert_eq!(lsm_finding(true, Some(true)).outcome, Outcome::Warn);
        assert_eq!(lsm_finding(false, None).outcome, Outcome::Pass);
        assert!(lsm_finding(false, None).detail.contains("AppArmor off"));
    }

    #[test]
    fn missing_cni_plugins_are_named() {
        use crate::check::Outcome;
        let dir = tempfile::tempdir().unwrap();
        let conf_dir = dir.path().join("net.d");
        let bin_dir = dir.path().join("bin");
        std::fs::create_dir_all(&conf_dir).unwrap();
        std::fs::create_dir_all(&bin_dir).unwrap();
        std::fs::write(
            conf_dir.join("10-net.conflist"),
            r#"{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"bridge"},{"type":"portmap"}]}"#,
        )
        .unwrap();
        std::fs::write(bin_dir.join("bridge"), "").unwrap();
        let mut config = Config::default();
        config.cni.conf_dir = conf_dir;
        config.cni.bin_dirs = vec![bin_dir];
        let findings = cni(&config);
        assert_eq!(findings[0].outcome, Outcome::Pass, "{findings:?}");
        assert!(findings[0].detail.contains(": net"), "{findings:?}");
        let plugins = findings.last().unwrap();
        assert_eq!(plugins.outcome, Outcome::Fail);
        assert!(plugins.detail.ends_with(": portmap"), "{plugins:?}");
        // The loopback plugin is wanted only when crius does not bring lo up itself.
        config.cni.use_internal_loopback = false;
        let plugins = cni(&config).pop().unwrap();
        assert!(
            plugins.detail.ends_with(": loopback, portmap"),
            "{plugins:?}"
        );
        config.cni.use_internal_loopback = true;

        config.cni.conf_dir = dir.path().join("empty");
        assert_eq!(cni(&config)[0].outcome, Outcome::Fail);
        config.cni.conf_template = "{}".to_string();
        assert_eq!(cni(&config)[0].outcome, Outcome::Warn);
    }
}
