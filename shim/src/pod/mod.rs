//! A pod the shim holds itself, when containerd drives it through the sandbox API: its
//! config, its holder process (see `holder.rs`), the files its containers share
//! (`hostname`, `hosts`, `resolv.conf`, a sized `/dev/shm`) and its exit.

pub mod cgroup_leaf;
pub mod held;
pub mod holder;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use containerd_shim_protos::protobuf::Message;
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use tokio::sync::watch;

use crate::error::ShimError;
use crate::pod::holder::Namespaces;
use crate::protos::pod_config::{IDMapping, NamespaceMode, NamespaceOption, PodSandboxConfig};
use crate::runtime::reaper::Exit;

/// The type containerd's CRI gives the pod config it passes as CreateSandbox's options.
const POD_CONFIG_TYPE: &str = "runtime.v1.PodSandboxConfig";
/// Where in the sandbox's bundle the pod's shared files are.
const POD_DIR: &str = "pod";
/// Size of a pod's /dev/shm (containerd's default).
const SHM_SIZE: u64 = 64 * 1024 * 1024;
pub const SHM: &str = "/dev/shm";
/// `/etc/hosts` when the host's cannot be read.
const DEFAULT_HOSTS: &str = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n";

pub struct Pod {
    pub id: String,
    dir: PathBuf,
    namespaces: Namespaces,
    host_ipc: bool,
    /// The pod's cgroup (`<cgroup_parent>/<id>`, cgroupfs paths), where its holder goes.
    cgroup_path: Option<String>,
    cgroup: Mutex<Option<cgroups_rs::fs::Cgroup>>,
    pid: AtomicI32,
    times: Mutex<Times>,
    exit: watch::Sender<Option<Exit>>,
}

#[derive(Default)]
struct Times {
    created_at: Option<SystemTime>,
    shm_mounted: bool,
}

/// The state names containerd's CRI maps to a pod's.
pub const READY: &str = "SANDBOX_READY";
pub const NOT_READY: &str = "SANDBOX_NOTREADY";

/// What the sandbox service reports of a pod.
pub struct PodStatus {
    pub pid: i32,
    pub state: &'static str,
    pub created_at: Option<SystemTime>,
    pub exit: Option<Exit>,
}

/// The pod config containerd's CRI passed; an absent or foreign option is an empty config
/// (the pod's own namespaces, no DNS settings).
pub fn decode_config(options: Option<&Any>) -> Result<PodSandboxConfig, ShimError> {
    match options {
        Some(any) if any.type_url.ends_with(POD_CONFIG_TYPE) => {
            PodSandboxConfig::parse_from_bytes(&any.value)
                .map_err(|e| ShimError::InvalidArgument(format!("pod config: {e}")))
        }
        _ => Ok(PodSandboxConfig::new()),
    }
}

/// The holder's namespaces for `config`, joining `netns` (empty: the host's network).
pub fn namespaces(config: &PodSandboxConfig, netns: &str) -> Result<Namespaces, ShimError> {
    let options = config
        .linux
        .security_context
        .namespace_options
        .clone()
        .unwrap_or_default();
    let userns = pod_userns(&options)?;
    let host_network = options.network.enum_value_or_default() == NamespaceMode::NODE;
    if !host_network && netns.is_empty() {
        return Err(ShimError::InvalidArgument(
            "a pod with its own network needs a network namespace path".into(),
        ));
    }
    let mut namespaces = Namespaces {
        netns: (!host_network).then(|| PathBuf::from(netns)),
        pid: options.pid.enum_value_or_default() != NamespaceMode::NODE,
        ipc: options.ipc.enum_value_or_default() != NamespaceMode::NODE,
        uts: !host_network,
        hostname: pod_hostname(config),
        userns,
        sysctls: Vec::new(),
    };
    let mut sysctls: Vec<_> = config.linux.sysctls.iter().collect();
    sysctls.sort();
    for (name, value) in sysctls {
        let path = sysctl_path(name, value, &namespaces)?;
        namespaces.sysctls.push((path, value.clone()));
    }
    Ok(namespaces)
}

/// Longest sysctl value taken (the kernel's own buffers are a page).
const MAX_SYSCTL_VALUE: usize = 4096;

/// The path below /proc/sys of a pod sysctl (`net.ipv4.ip_forward` or `net/ipv4/...`), if
/// it is one the pod's own namespaces scope, as runc allows them: IPC ones with the pod's
/// IPC namespace, `net.*` with its network, the host and domain names with its UTS.
pub(crate) fn sysctl_path(name: &str, value: &str, ns: &Namespaces) -> Result<String, ShimError> {
    let refuse = |why: &str| ShimError::InvalidArgument(format!("sysctl {name:?}: {why}"));
    let path = if name.contains('/') {
        name.to_string()
    } else {
        name.replace('.', "/")
    };
    let well_formed = !path.is_empty()
        && path.len() <= 256
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
        && path
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'));
    if !well_formed {
        return Err(refuse("not a sysctl name"));
    }
    if value.len() > MAX_SYSCTL_VALUE || value.contains('\0') {
        return Err(refuse("value too long or not text"));
    }
    const IPC: &[&str] = &[
        "kernel/msgmax",
        "kernel/msgmnb",
        "kernel/msgmni",
        "kernel/sem",
        "kernel/shmall",
        "kernel/shmmax",
        "kernel/shmmni",
        "kernel/shm_rmid_forced",
    ];
    let scoped = if IPC.contains(&path.as_str()) || path.starts_with("fs/mqueue/") {
        ns.ipc
    } else if path.starts_with("net/") {
        ns.netns.is_some()
    } else if path == "kernel/hostname" || path == "kernel/domainname" {
        ns.uts
    } else {
        return Err(refuse("not scoped by a pod's namespaces"));
    };
    if !scoped {
        return Err(refuse("the pod shares that namespace with the host"));
    }
    Ok(path)
}

/// Whether the pod has a user namespace of its own (containerd's CRI made the pod's
/// network namespace inside one with the pod's mappings), refusing what a pause sandbox's
/// runtime would refuse: a mode other than POD or NODE, and mappings without root.
fn pod_userns(options: &NamespaceOption) -> Result<bool, ShimError> {
    if options.userns_options.is_none() {
        return Ok(false);
    }
    let userns = &options.userns_options;
    match userns.mode.enum_value_or_default() {
        NamespaceMode::NODE => Ok(false),
        NamespaceMode::POD => {
            let maps_root =
                |maps: &[IDMapping]| maps.iter().any(|m| m.container_id == 0 && m.length > 0);
            if !maps_root(&userns.uids) || !maps_root(&userns.gids) {
                return Err(ShimError::InvalidArgument(
                    "a pod user namespace must map container ID 0 (uid and gid)".into(),
                ));
            }
            Ok(true)
        }
        other => Err(ShimError::InvalidArgument(format!(
            "unsupported user namespace mode {other:?} for a pod"
        ))),
    }
}

/// The pod's cgroup below `cgroup_parent` (a cgroupfs path; none with systemd's slices,
/// which only systemd may make, nor without a parent). A parent that would leave the
/// cgroup tree is refused.
fn pod_cgroup_path(parent: &str, id: &str) -> Result<Option<String>, ShimError> {
    let parent = parent.trim_matches('/');
    if parent.is_empty() || parent.ends_with(".slice") {
        return Ok(None);
    }
    if !is_cgroup_path(parent, 1024, true) {
        return Err(ShimError::InvalidArgument(format!(
            "cgroup parent {parent:?} is not a cgroup path"
        )));
    }
    Ok(Some(format!("{parent}/{id}")))
}

/// Whether `path` (no leading or trailing `/`) is a plain path below a cgroup root: at most
/// `max` bytes of words, none `.` or `..` (`:` allowed only with `colon`).
pub(crate) fn is_cgroup_path(path: &str, max: usize, colon: bool) -> bool {
    path.len() <= max
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
        && path.chars().all(|c| {
            c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/') || (colon && c == ':')
        })
}

/// The pod's hostname, or the node's when it names none (as containerd's CRI does).
fn pod_hostname(config: &PodSandboxConfig) -> String {
    if config.hostname.is_empty() {
        nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default()
    } else {
        config.hostname.clone()
    }
}

/// Most bytes of a host file a pod gets a copy of.
const HOST_FILE_LIMIT: u64 = 1 << 20;

/// A host file the pod gets a copy of (`/etc/hosts`, `/etc/resolv.conf`), bounded.
fn read_host_file(path: &str) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(HOST_FILE_LIMIT)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// `resolv.conf` from the pod's DNS config, or the host's when it has none.
fn resolv_conf(config: &PodSandboxConfig) -> String {
    let Some(dns) = config.dns_config.as_ref() else {
        return read_host_file("/etc/resolv.conf").unwrap_or_default();
    };
    crius_common::pod_files::resolv_conf(&dns.servers, &dns.searches, &dns.options)
}

impl Pod {
    /// Writes the pod's shared files under its bundle and mounts its /dev/shm.
    pub fn create(
        id: &str,
        bundle: &Path,
        config: &PodSandboxConfig,
        namespaces: Namespaces,
    ) -> Result<Self, ShimError> {
        let dir = bundle.join(POD_DIR);
        std::fs::create_dir_all(&dir)
            .map_err(|e| ShimError::io(format!("create {}", dir.display()), e))?;
        let hosts = read_host_file("/etc/hosts").unwrap_or_else(|| DEFAULT_HOSTS.into());
        let files = [
            ("hostname", format!("{}\n", namespaces.hostname)),
            ("hosts", hosts),
            ("resolv.conf", resolv_conf(config)),
        ];
        for (name, text) in files {
            let path = dir.join(name);
            std::fs::write(&path, text)
                .map_err(|e| ShimError::io(format!("write {}", path.display()), e))?;
        }
        let pod = Self {
            id: id.to_string(),
            dir,
            host_ipc: !namespaces.ipc,
            cgroup_path: pod_cgroup_path(&config.linux.cgroup_parent, id)?,
            cgroup: Mutex::new(None),
            namespaces,
            pid: AtomicI32::new(0),
            times: Mutex::new(Times::default()),
            exit: watch::channel(None).0,
        };
        if !pod.host_ipc {
            pod.mount_shm()?;
        }
        Ok(pod)
    }

    fn times(&self) -> std::sync::MutexGuard<'_, Times> {
        self.times.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn namespaces(&self) -> &Namespaces {
        &self.namespaces
    }

    fn shm_path(&self) -> PathBuf {
        self.dir.join("shm")
    }

    fn mount_shm(&self) -> Result<(), ShimError> {
        let path = self.shm_path();
        std::fs::create_dir_all(&path)
            .map_err(|e| ShimError::io(format!("create {}", path.display()), e))?;
        let options = format!("mode=1777,size={SHM_SIZE}");
        nix::mount::mount(
            Some("shm"),
            &path,
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID
                | nix::mount::MsFlags::MS_NODEV
                | nix::mount::MsFlags::MS_NOEXEC,
            Some(options.as_str()),
        )
        .map_err(|e| ShimError::io(format!("mount {}", path.display()), e.into()))?;
        self.times().shm_mounted = true;
        Ok(())
    }

    /// Unmounts the pod's /dev/shm (idempotent): containerd removes the bundle next.
    pub fn release_shm(&self) {
        let mut times = self.times();
        if !times.shm_mounted {
            return;
        }
        let path = self.shm_path();
        match nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH) {
            Ok(()) | Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => {
                times.shm_mounted = false;
            }
            Err(e) => log::warn!("unmount {}: {e}", path.display()),
        }
    }

    /// Puts the holder in the pod's cgroup, as a pause container is put in it (a
    /// failure is logged: the pod runs on, accounted to the shim's cgroup).
    pub fn join_cgroup(&self, pid: i32) {
        let Some(path) = &self.cgroup_path else {
            return;
        };
        let joined = cgroups_rs::fs::Cgroup::new(cgroups_rs::fs::hierarchies::auto(), path)
            .and_then(|cgroup| {
                cgroup.add_task_by_tgid(cgroups_rs::CgroupPid::from(pid as u64))?;
                Ok(cgroup)
            });
        match joined {
            Ok(cgroup) => {
                *self.cgroup.lock().unwrap_or_else(PoisonError::into_inner) = Some(cgroup);
            }
            Err(e) => log::warn!("pod {}: holder not in cgroup {path}: {e}", self.id),
        }
    }

    /// Removes the pod's cgroup once its holder is gone.
    fn remove_cgroup(&self) {
        let taken = self
            .cgroup
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(cgroup) = taken
            && let Err(e) = cgroup.delete()
        {
            log::warn!("pod {}: remove its cgroup: {e}", self.id);
        }
    }

    /// Records the holder's pid once it runs.
    pub fn started(&self, pid: i32) {
        self.pid.store(pid, Ordering::SeqCst);
        self.times().created_at = Some(SystemTime::now());
    }

    /// The pod's user namespace (its holder's), when it has one of its own.
    pub fn userns_path(&self) -> Option<PathBuf> {
        let pid = self.pid();
        (self.namespaces.userns && pid > 0).then(|| PathBuf::from(format!("/proc/{pid}/ns/user")))
    }

    pub fn pid(&self) -> i32 {
        self.pid.load(Ordering::SeqCst)
    }

    pub fn has_exited(&self) -> bool {
        self.exit.borrow().is_some()
    }

    /// Records the holder's exit (the first one counts) and wakes the waiters.
    pub fn exited(&self, exit: Exit) {
        self.exit.send_if_modified(|current| {
            if current.is_some() {
                return false;
            }
            *current = Some(exit);
            true
        });
    }

    pub fn status(&self) -> PodStatus {
        let pid = self.pid();
        let exit = *self.exit.borrow();
        PodStatus {
            pid,
            state: if pid > 0 && exit.is_none() {
                READY
            } else {
                NOT_READY
            },
            created_at: self.times().created_at,
            exit,
        }
    }

    /// Waits for the holder's exit. A pod never started counts as exited now.
    pub async fn wait(&self) -> Exit {
        let mut exit = self.exit.subscribe();
        loop {
            if let Some(exit) = *exit.borrow_and_update() {
                return exit;
            }
            if self.pid() == 0 {
                return Exit {
                    status: 0,
                    at: SystemTime::now(),
                };
            }
            if exit.changed().await.is_err() {
                return Exit {
                    status: 0,
                    at: SystemTime::now(),
                };
            }
        }
    }

    /// Ends the holder: SIGKILL, as containerd's CRI ends a pause container once the pod's
    /// containers are stopped, and waits up to `timeout` for its exit. Idempotent.
    pub async fn stop(&self, timeout: Duration) -> Result<(), ShimError> {
        let pid = self.pid();
        if pid > 0 && !self.has_exited() {
            match nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            ) {
                Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
                Err(e) => return Err(ShimError::io(format!("kill pod holder {pid}"), e.into())),
            }
            if tokio::time::timeout(timeout, self.wait()).await.is_err() {
                return Err(ShimError::Internal(format!(
                    "pod holder {pid} did not exit within {timeout:?}"
                )));
            }
        }
        self.release_shm();
        if self.has_exited() {
            self.remove_cgroup();
        }
        Ok(())
    }

    /// The pod's files its containers bind, as containerd's CRI binds a pause container
    /// sandbox's: `(destination, source)`.
    pub fn shared_files(&self) -> Vec<(&'static str, PathBuf)> {
        let mut files = vec![
            ("/etc/hostname", self.dir.join("hostname")),
            ("/etc/hosts", self.dir.join("hosts")),
            ("/etc/resolv.conf", self.dir.join("resolv.conf")),
        ];
        if !self.host_ipc {
            files.push((SHM, self.shm_path()));
        }
        files
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protos::pod_config::{DNSConfig, NamespaceOption, UserNamespace};

    fn config_with(options: NamespaceOption) -> PodSandboxConfig {
        let mut config = PodSandboxConfig::new();
        config.hostname = "web-0".into();
        config
            .linux
            .mut_or_insert_default()
            .security_context
            .mut_or_insert_default()
            .namespace_options = Some(options).into();
        config
    }

    #[test]
    fn a_pod_gets_its_own_namespaces_and_joins_its_network() {
        let ns = namespaces(&config_with(NamespaceOption::new()), "/run/netns/x").expect("ns");
        assert_eq!(ns.netns.as_deref(), Some(Path::new("/run/netns/x")));
        assert!(ns.pid && ns.ipc && ns.uts);
        assert_eq!(ns.hostname, "web-0");
    }

    #[test]
    fn host_namespaces_are_kept_and_a_missing_netns_is_refused() {
        let mut options = NamespaceOption::new();
        options.network = NamespaceMode::NODE.into();
        options.pid = NamespaceMode::NODE.into();
        options.ipc = NamespaceMode::NODE.into();
        let ns = namespaces(&config_with(options), "").expect("ns");
        assert_eq!(ns.netns, None);
        assert!(!ns.pid && !ns.ipc && !ns.uts);

        let err = namespaces(&config_with(NamespaceOption::new()), "").expect_err("no netns");
        assert!(matches!(err, ShimError::InvalidArgument(_)), "{err}");
    }

    fn userns_options(mode: NamespaceMode, container_id: u32) -> NamespaceOption {
        let mut mapping = IDMapping::new();
        mapping.container_id = container_id;
        mapping.host_id = 100_000;
        mapping.length = 65536;
        let mut userns = UserNamespace::new();
        userns.mode = mode.into();
        userns.uids = vec![mapping.clone()];
        userns.gids = vec![mapping];
        let mut options = NamespaceOption::new();
        options.userns_options = Some(userns).into();
        options
    }

    #[test]
    fn a_pod_user_namespace_is_joined_and_the_hosts_is_not() {
        let pod = userns_options(NamespaceMode::POD, 0);
        assert!(
            namespaces(&config_with(pod), "/run/netns/x")
                .expect("userns")
                .userns
        );
        let node = userns_options(NamespaceMode::NODE, 0);
        assert!(
            !namespaces(&config_with(node), "/run/netns/x")
                .expect("host")
                .userns
        );
        let none = NamespaceOption::new();
        assert!(
            !namespaces(&config_with(none), "/run/netns/x")
                .expect("none")
                .userns
        );
    }

    #[test]
    fn user_namespaces_a_runtime_would_refuse_are_refused() {
        for options in [
            userns_options(NamespaceMode::POD, 1),
            userns_options(NamespaceMode::CONTAINER, 0),
            userns_options(NamespaceMode::TARGET, 0),
        ] {
            let err = namespaces(&config_with(options), "/run/netns/x").expect_err("refused");
            assert!(matches!(err, ShimError::InvalidArgument(_)), "{err}");
        }
    }

    #[test]
    fn pod_sysctls_are_set_only_where_the_pods_namespaces_scope_them() {
        let mut config = config_with(NamespaceOption::new());
        let sysctls = &mut config.linux.mut_or_insert_default().sysctls;
        sysctls.insert("kernel.shm_rmid_forced".into(), "1".into());
        sysctls.insert("fs.mqueue.msg_max".into(), "100".into());
        sysctls.insert("net/ipv4/conf/eth0.100/forwarding".into(), "1".into());
        let ns = namespaces(&config, "/run/netns/x").expect("ns");
        assert_eq!(
            ns.sysctls,
            vec![
                ("fs/mqueue/msg_max".to_string(), "100".to_string()),
                ("kernel/shm_rmid_forced".to_string(), "1".to_string()),
                (
                    "net/ipv4/conf/eth0.100/forwarding".to_string(),
                    "1".to_string()
                ),
            ]
        );
        let host = Namespaces::default();
        for name in [
            "kernel.panic",
            "net.ipv4.ip_forward",
            "../../etc/passwd",
            "a//b",
            "x y",
        ] {
            let err = sysctl_path(name, "1", &host).expect_err(name);
            assert!(matches!(err, ShimError::InvalidArgument(_)), "{err}");
        }
        assert!(sysctl_path("kernel.shmmax", &"9".repeat(5000), &ns).is_err());
    }

    #[test]
    fn the_pods_cgroup_is_below_its_parent_and_stays_in_the_tree() {
        assert_eq!(pod_cgroup_path("", "p").expect("none"), None);
        assert_eq!(
            pod_cgroup_path("kubepods.slice", "p").expect("systemd"),
            None
        );
        assert_eq!(
            pod_cgroup_path("/kubepods/besteffort/pod1", "p").expect("cgroupfs"),
            Some("kubepods/besteffort/pod1/p".to_string())
        );
        for bad in ["/../../etc", "/a//b", "/a b"] {
            assert!(pod_cgroup_path(bad, "p").is_err(), "{bad}");
        }
    }

    #[test]
    fn resolv_conf_follows_the_dns_config() {
        let mut config = PodSandboxConfig::new();
        let mut dns = DNSConfig::new();
        dns.servers = vec!["10.0.0.10".into()];
        dns.searches = vec!["svc.local".into(), "local".into()];
        dns.options = vec!["ndots:5".into()];
        config.dns_config = Some(dns).into();
        assert_eq!(
            resolv_conf(&config),
            "nameserver 10.0.0.10\nsearch svc.local local\noptions ndots:5\n"
        );
    }

    #[test]
    fn the_pod_config_decodes_from_containerds_any_and_skips_other_fields() {
        let mut config = config_with(NamespaceOption::new());
        config.hostname = "h".into();
        let mut any = Any::new();
        any.type_url = POD_CONFIG_TYPE.into();
        any.value = config.write_to_bytes().expect("encode");
        // A field the cut-down message does not have (log_directory = 3).
        any.value.extend_from_slice(&[0x1a, 0x03, b'/', b'l', b'd']);
        let decoded = decode_config(Some(&any)).expect("decode");
        assert_eq!(decoded.hostname, "h");
        assert_eq!(decode_config(None).expect("none").hostname, "");
    }
}
