//! The Linux security context and resources, each checked by its effect inside the
//! container: namespaces, users, capabilities, privileged mode, read-only rootfs, masked
//! and read-only paths, mount propagation, seccomp, no_new_privs, sysctls and cgroup limits.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use common::pod::{Pod, container, pod_with};
use common::{Crius, TestNetwork, pod_config};
use crius::api::v1::security_profile::ProfileType;
use crius::api::v1::{
    Capability, ContainerConfig, Int64Value, LinuxContainerConfig, LinuxContainerResources,
    LinuxContainerSecurityContext, LinuxPodSandboxConfig, LinuxSandboxSecurityContext, Mount,
    MountPropagation, NamespaceMode, NamespaceOption, PodSandboxConfig, SecurityProfile,
    UpdateContainerResourcesRequest,
};

const SLEEP: &[&str] = &["sleep", "1000"];

/// A pod on its own network (its own UTS, so hostname changes stay inside).
async fn network_pod(crius: &Crius, name: &str, adjust: impl FnOnce(&mut PodSandboxConfig)) -> Pod {
    let mut config = pod_config(name);
    adjust(&mut config);
    pod_with(crius, config).await
}

fn pod_security(config: &mut PodSandboxConfig) -> &mut LinuxSandboxSecurityContext {
    config
        .linux
        .get_or_insert_with(LinuxPodSandboxConfig::default)
        .security_context
        .get_or_insert_with(Default::default)
}

fn security(config: &mut ContainerConfig) -> &mut LinuxContainerSecurityContext {
    config
        .linux
        .get_or_insert_with(LinuxContainerConfig::default)
        .security_context
        .get_or_insert_with(Default::default)
}

fn with_security(
    name: &str,
    command: &[&str],
    adjust: impl FnOnce(&mut LinuxContainerSecurityContext),
) -> ContainerConfig {
    let mut config = container(name, "busybox:latest", command);
    adjust(security(&mut config));
    config
}

async fn sh(pod: &mut Pod, id: &str, script: &str) -> (String, String, i32) {
    pod.exec(id, &["sh", "-c", script], 10).await.expect("exec")
}

async fn crius_with_network(tag: u8) -> (Crius, TestNetwork) {
    let mut network = None;
    let crius = Crius::start_with(|c| network = Some(TestNetwork::install(c, tag)), &[]).await;
    (crius, network.expect("network"))
}

#[tokio::test]
async fn pid_namespace_modes() {
    let (crius, _net) = crius_with_network(110).await;
    let mut pod = network_pod(&crius, "pids", |_| {}).await;
    let a = pod
        .run(container("a", "busybox:latest", &["sleep", "1001"]))
        .await;
    let b = pod.run(container("b", "busybox:latest", SLEEP)).await;
    let (ps, _, _) = sh(&mut pod, &b, "ps").await;
    assert!(
        ps.contains("sleep 1001"),
        "pod PID namespace is shared:\n{ps}"
    );

    let own = pod
        .run(with_security("own", &["sleep", "1002"], |s| {
            s.namespace_options = Some(NamespaceOption {
                pid: NamespaceMode::Container as i32,
                ..Default::default()
            })
        }))
        .await;
    let (ps, _, _) = sh(&mut pod, &own, "ps").await;
    assert!(
        !ps.contains("sleep 1001"),
        "container PID namespace isolates:\n{ps}"
    );
    let (pid1, _, _) = sh(&mut pod, &own, "cat /proc/1/cmdline | tr '\\0' ' '").await;
    assert!(pid1.starts_with("sleep 1002"), "{pid1}");

    let target = pod
        .run(with_security("target", SLEEP, |s| {
            s.namespace_options = Some(NamespaceOption {
                pid: NamespaceMode::Target as i32,
                target_id: own.clone(),
                ..Default::default()
            })
        }))
        .await;
    let (ps, _, _) = sh(&mut pod, &target, "ps").await;
    assert!(
        ps.contains("sleep 1002") && !ps.contains("sleep 1001"),
        "target PID namespace:\n{ps}"
    );

    let host = pod
        .run(with_security("host", SLEEP, |s| {
            s.namespace_options = Some(NamespaceOption {
                pid: NamespaceMode::Node as i32,
                ..Default::default()
            })
        }))
        .await;
    let me = std::process::id();
    let (_, _, code) = sh(&mut pod, &host, &format!("test -d /proc/{me}")).await;
    assert_eq!(code, 0, "host PID namespace sees the host's processes");
    let (_, _, code) = sh(&mut pod, &a, &format!("test -d /proc/{me}")).await;
    assert_ne!(code, 0);
    pod.remove_pod().await;
}

#[tokio::test]
async fn host_ipc_and_host_network() {
    let (crius, _net) = crius_with_network(111).await;
    let out = Command::new("ipcmk")
        .args(["-M", "4096"])
        .output()
        .expect("ipcmk");
    let shm_id: String = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .last()
        .unwrap_or_default()
        .to_string();
    let segment_visible = |listing: &str| {
        listing
            .lines()
            .skip(1)
            .any(|l| l.split_whitespace().nth(1) == Some(shm_id.as_str()))
    };

    let mut host = network_pod(&crius, "hostipc", |c| {
        c.hostname = String::new();
        pod_security(c).namespace_options = Some(NamespaceOption {
            ipc: NamespaceMode::Node as i32,
            network: NamespaceMode::Node as i32,
            ..Default::default()
        });
    })
    .await;
    let h = host.run(container("h", "busybox:latest", SLEEP)).await;
    let (listing, _, _) = sh(&mut host, &h, "cat /proc/sysvipc/shm").await;
    assert!(
        segment_visible(&listing),
        "host IPC sees segment {shm_id}:\n{listing}"
    );
    let (links, _, _) = sh(&mut host, &h, "ls /sys/class/net").await;
    let host_links = std::fs::read_dir("/sys/class/net").unwrap().count();
    assert_eq!(
        links.split_whitespace().count(),
        host_links,
        "host network: {links}"
    );

    let mut pod = network_pod(&crius, "podipc", |_| {}).await;
    let p = pod.run(container("p", "busybox:latest", SLEEP)).await;
    let (listing, _, _) = sh(&mut pod, &p, "cat /proc/sysvipc/shm").await;
    assert!(
        !segment_visible(&listing),
        "pod IPC is isolated:\n{listing}"
    );
    let (links, _, _) = sh(&mut pod, &p, "ls /sys/class/net").await;
    let mut links: Vec<&str> = links.split_whitespace().collect();
    links.sort();
    assert_eq!(links, vec!["eth0", "lo"]);
    let _ = Command::new("ipcrm").args(["-m", &shm_id]).status();
    host.remove_pod().await;
    pod.remove_pod().await;
}

#[tokio::test]
async fn run_as_user_group_and_supplemental_groups() {
    let (crius, _net) = crius_with_network(112).await;
    let mut pod = network_pod(&crius, "ids", |_| {}).await;
    let id = pod
        .run(with_security("ids", SLEEP, |s| {
            s.run_as_user = Some(Int64Value { value: 1000 });
            s.run_as_group = Some(Int64Value { value: 2000 });
            s.supplemental_groups = vec![3000];
        }))
        .await;
    let (out, _, _) = sh(&mut pod, &id, "id -u; id -g; id -G").await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "1000");
    assert_eq!(lines[1], "2000");
    assert!(lines[2].split(' ').any(|g| g == "3000"), "{out}");

    let err = pod
        .create(with_security("nouser", SLEEP, |s| {
            s.run_as_group = Some(Int64Value { value: 2000 })
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    pod.remove_pod().await;
}

fn caps(add: &[&str], drop: &[&str]) -> Option<Capability> {
    Some(Capability {
        add_capabilities: add.iter().map(|s| s.to_string()).collect(),
        drop_capabilities: drop.iter().map(|s| s.to_string()).collect(),
        add_ambient_capabilities: Vec::new(),
    })
}

async fn cap_eff(pod: &mut Pod, id: &str) -> u64 {
    let (out, _, _) = sh(pod, id, "grep CapEff /proc/self/status").await;
    u64::from_str_radix(out.split_whitespace().last().unwrap_or("0"), 16).unwrap()
}

#[tokio::test]
async fn capabilities_add_drop_and_all() {
    let (crius, _net) = crius_with_network(113).await;
    let mut pod = network_pod(&crius, "caps", |_| {}).await;
    let admin = pod
        .run(with_security("admin", SLEEP, |s| {
            s.capabilities = caps(&["NET_ADMIN"], &[])
        }))
        .await;
    let (_, err, code) = sh(&mut pod, &admin, "ip link add b0 type bridge").await;
    assert_eq!(code, 0, "NET_ADMIN lets ip link add work: {err}");
    let plain = pod.run(container("plain", "busybox:latest", SLEEP)).await;
    let (_, _, code) = sh(&mut pod, &plain, "ip link add b1 type bridge").await;
    assert_ne!(code, 0, "without NET_ADMIN ip link add fails");

    let nochown = pod
        .run(with_security("nochown", SLEEP, |s| {
            s.capabilities = caps(&[], &["CAP_CHOWN"])
        }))
        .await;
    let (_, _, code) = sh(&mut pod, &nochown, "touch /tmp/f && chown 1 /tmp/f").await;
    assert_ne!(code, 0, "dropped CHOWN makes chown fail");
    let (_, _, code) = sh(&mut pod, &plain, "touch /tmp/f && chown 1 /tmp/f").await;
    assert_eq!(code, 0);

    let all = pod
        .run(with_security("all", SLEEP, |s| {
            s.capabilities = caps(&["ALL"], &[])
        }))
        .await;
    // ALL is every capability the runtime holds itself: this process's bounding set.
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let bounding = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .map(|hex| u64::from_str_radix(hex.trim(), 16).unwrap())
        .unwrap();
    assert_eq!(cap_eff(&mut pod, &all).await, bounding);
    let none = pod
        .run(with_security("none", SLEEP, |s| {
            s.capabilities = caps(&[], &["ALL"])
        }))
        .await;
    assert_eq!(cap_eff(&mut pod, &none).await, 0);
    pod.remove_pod().await;
}

#[tokio::test]
async fn privileged_containers_need_a_privileged_pod_and_get_the_host_devices() {
    let (crius, _net) = crius_with_network(114).await;
    let mut plain_pod = network_pod(&crius, "unpriv", |_| {}).await;
    let err = plain_pod
        .create(with_security("priv", SLEEP, |s| s.privileged = true))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    // In containerd's CRI's words, which its own tests match.
    assert!(
        err.message()
            .contains("failed to generate spec opts: no privileged container allowed in sandbox"),
        "{}",
        err.message()
    );
    let plain = plain_pod
        .run(container("plain", "busybox:latest", SLEEP))
        .await;
    let (_, _, code) = sh(
        &mut plain_pod,
        &plain,
        "test -e /dev/kmsg || test -e /dev/loop0",
    )
    .await;
    assert_ne!(code, 0, "an unprivileged container has no host devices");

    let mut pod = network_pod(&crius, "priv", |c| pod_security(c).privileged = true).await;
    let id = pod
        .run(with_security("priv", SLEEP, |s| s.privileged = true))
        .await;
    let host_has_loop = Path::new("/dev/loop0").exists();
    if host_has_loop {
        let (_, _, code) = sh(&mut pod, &id, "test -b /dev/loop0").await;
        assert_eq!(code, 0, "a privileged container has the host's devices");
    }
    let (_, err, code) = sh(&mut pod, &id, "ip link add b0 type bridge").await;
    assert_eq!(code, 0, "{err}");
    // The cgroup mount is writable inside; sysfs is asked for read-write (runc may still
    // fall back to a read-only bind where the kernel refuses a fresh sysfs mount).
    let (mounts, _, _) = sh(&mut pod, &id, "grep ' /sys/fs/cgroup ' /proc/mounts").await;
    assert!(
        mounts
            .split(' ')
            .nth(3)
            .is_some_and(|o| o.starts_with("rw")),
        "cgroups are writable when privileged: {mounts}"
    );
    let (_, info) = pod.status(&id).await;
    let sys = info["runtimeSpec"]["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["destination"] == "/sys")
        .unwrap()
        .clone();
    assert!(
        sys["options"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("rw")),
        "{sys}"
    );
    plain_pod.remove_pod().await;
    pod.remove_pod().await;
}

#[tokio::test]
async fn readonly_rootfs_masked_and_readonly_paths() {
    let (crius, _net) = crius_with_network(115).await;
    let mut pod = network_pod(&crius, "fs", |_| {}).await;
    let volume = crius.dir.path().join("vol");
    std::fs::create_dir_all(&volume).unwrap();
    let mut config = with_security("ro", SLEEP, |s| s.readonly_rootfs = true);
    config.mounts = vec![Mount {
        container_path: "/vol".into(),
        host_path: volume.display().to_string(),
        ..Default::default()
    }];
    let ro = pod.run(config).await;
    let (_, _, code) = sh(&mut pod, &ro, "touch /rootfile").await;
    assert_ne!(code, 0, "the root filesystem is read-only");
    let (_, _, code) = sh(&mut pod, &ro, "touch /vol/ok").await;
    assert_eq!(code, 0, "volumes stay writable");

    let paths = pod
        .run(with_security("paths", SLEEP, |s| {
            s.masked_paths = vec!["/etc/passwd".into()];
            s.readonly_paths = vec!["/home".into()];
        }))
        .await;
    let (out, _, _) = sh(&mut pod, &paths, "cat /etc/passwd | wc -c").await;
    assert_eq!(out.trim(), "0", "a masked file reads empty");
    let (_, _, code) = sh(&mut pod, &paths, "touch /home/x").await;
    assert_ne!(code, 0, "a read-only path cannot be written");
    let (_, _, code) = sh(
        &mut pod,
        &ro,
        "cat /proc/kcore > /dev/null 2>&1 && test -s /proc/kcore",
    )
    .await;
    assert_ne!(code, 0, "default masked paths apply when none are given");
    pod.remove_pod().await;
}

/// A host directory bind-mounted onto itself and made rshared.
struct SharedDir {
    path: std::path::PathBuf,
}

impl SharedDir {
    fn new(path: &Path) -> Self {
        std::fs::create_dir_all(path).unwrap();
        let run = |args: &[&str]| {
            let ok = Command::new("mount").args(args).status().unwrap().success();
            assert!(ok, "mount {args:?}");
        };
        run(&["--bind", path.to_str().unwrap(), path.to_str().unwrap()]);
        run(&["--make-rshared", path.to_str().unwrap()]);
        Self {
            path: path.to_path_buf(),
        }
    }
}

impl Drop for SharedDir {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .args(["-R", "-l", self.path.to_str().unwrap()])
            .status();
    }
}

/// Mounts a tmpfs at `dir` (created) on the host.
fn mount_tmpfs_on_host(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    assert!(
        Command::new("mount")
            .args(["-t", "tmpfs", "none"])
            .arg(dir)
            .status()
            .unwrap()
            .success(),
        "mount a tmpfs at {}",
        dir.display()
    );
}

fn host_mounted(path: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(path.to_str().unwrap()))
}

#[tokio::test]
async fn mount_propagation_private_shared_and_slave() {
    let (crius, _net) = crius_with_network(116).await;
    let mut pod = network_pod(&crius, "prop", |c| pod_security(c).privileged = true).await;
    let base = crius.dir.path().join("prop");
    let run_with = |name: &'static str, propagation: MountPropagation, shared: &SharedDir| {
        let mut config = with_security(name, SLEEP, |s| s.privileged = true);
        config.mounts = vec![Mount {
            container_path: "/mnt/shared".into(),
            host_path: shared.path.display().to_string(),
            propagation: propagation as i32,
            ..Default::default()
        }];
        config
    };

    // Bidirectional: both ways.
    let dir = SharedDir::new(&base.join("bidi"));
    let id = pod
        .run(run_with(
            "bidi",
            MountPropagation::PropagationBidirectional,
            &dir,
        ))
        .await;
    let (_, err, code) = sh(
        &mut pod,
        &id,
        "mkdir -p /mnt/shared/from-container && mount -t tmpfs none /mnt/shared/from-container",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(
        host_mounted(&dir.path.join("from-container")),
        "container mount reaches the host"
    );
    mount_tmpfs_on_host(&dir.path.join("from-host"));
    let (mounts, _, _) = sh(&mut pod, &id, "cat /proc/mounts").await;
    assert!(
        mounts.contains("/mnt/shared/from-host"),
        "host mount reaches the container"
    );

    // Host to container: one way.
    let slave_dir = SharedDir::new(&base.join("slave"));
    let id = pod
        .run(run_with(
            "slave",
            MountPropagation::PropagationHostToContainer,
            &slave_dir,
        ))
        .await;
    mount_tmpfs_on_host(&slave_dir.path.join("from-host"));
    let (mounts, _, _) = sh(&mut pod, &id, "cat /proc/mounts").await;
    assert!(
        mounts.contains("/mnt/shared/from-host"),
        "host mount reaches an rslave container"
    );
    let (_, _, code) = sh(
        &mut pod,
        &id,
        "mkdir -p /mnt/shared/from-container && mount -t tmpfs none /mnt/shared/from-container",
    )
    .await;
    assert_eq!(code, 0);
    assert!(
        !host_mounted(&slave_dir.path.join("from-container")),
        "rslave does not propagate back"
    );

    // Private: nothing.
    let private_dir = SharedDir::new(&base.join("private"));
    let id = pod
        .run(run_with(
            "private",
            MountPropagation::PropagationPrivate,
            &private_dir,
        ))
        .await;
    mount_tmpfs_on_host(&private_dir.path.join("from-host"));
    let (mounts, _, _) = sh(&mut pod, &id, "cat /proc/mounts").await;
    assert!(
        !mounts.contains("/mnt/shared/from-host"),
        "rprivate does not propagate"
    );

    // rshared on a private host mount is refused with a reason.
    let plain = base.join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    let mut config = with_security("refused", SLEEP, |s| s.privileged = true);
    config.mounts = vec![Mount {
        container_path: "/mnt/x".into(),
        host_path: plain.display().to_string(),
        propagation: MountPropagation::PropagationBidirectional as i32,
        ..Default::default()
    }];
    let err = pod.create(config).await.unwrap_err();
    assert!(
        err.message().contains("not a shared mount"),
        "{}",
        err.message()
    );
    pod.remove_pod().await;
}

fn profile(kind: ProfileType, path: &str) -> Option<SecurityProfile> {
    Some(SecurityProfile {
        profile_type: kind as i32,
        localhost_ref: path.to_string(),
    })
}

#[tokio::test]
async fn seccomp_profiles() {
    let (crius, _net) = crius_with_network(117).await;
    let mut pod = network_pod(&crius, "seccomp", |c| pod_security(c).privileged = true).await;
    let hostname = "hostname crius-test";

    let default_no_admin = pod
        .run(with_security("default-plain", SLEEP, |s| {
            s.seccomp = profile(ProfileType::RuntimeDefault, "")
        }))
        .await;
    let (_, _, code) = sh(&mut pod, &default_no_admin, hostname).await;
    assert_ne!(
        code, 0,
        "RuntimeDefault without SYS_ADMIN blocks sethostname"
    );
    let default_admin = pod
        .run(with_security("default-admin", SLEEP, |s| {
            s.seccomp = profile(ProfileType::RuntimeDefault, "");
            s.capabilities = caps(&["SYS_ADMIN"], &[]);
        }))
        .await;
    let (_, err, code) = sh(&mut pod, &default_admin, hostname).await;
    assert_eq!(
        code, 0,
        "RuntimeDefault with SYS_ADMIN allows sethostname: {err}"
    );

    let deny = crius.dir.path().join("deny-hostname.json");
    std::fs::write(
        &deny,
        r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["sethostname"],"action":"SCMP_ACT_ERRNO"}]}"#,
    )
    .unwrap();
    let deny_path = deny.display().to_string();
    let local = pod
        .run(with_security("local", SLEEP, |s| {
            s.seccomp = profile(ProfileType::Localhost, &deny_path);
            s.capabilities = caps(&["SYS_ADMIN"], &[]);
        }))
        .await;
    let (_, _, code) = sh(&mut pod, &local, hostname).await;
    assert_ne!(
        code, 0,
        "a localhost profile that denies sethostname is enforced"
    );
    let privileged = pod
        .run(with_security("local-priv", SLEEP, |s| {
            s.seccomp = profile(ProfileType::Localhost, &deny_path);
            s.privileged = true;
        }))
        .await;
    let (_, _, code) = sh(&mut pod, &privileged, hostname).await;
    assert_eq!(code, 0, "privileged containers ignore seccomp");
    let unconfined = pod
        .run(with_security("unconfined", SLEEP, |s| {
            s.seccomp = profile(ProfileType::Unconfined, "");
            s.capabilities = caps(&["SYS_ADMIN"], &[]);
        }))
        .await;
    let (_, _, code) = sh(&mut pod, &unconfined, hostname).await;
    assert_eq!(code, 0, "unconfined allows sethostname");

    let err = pod
        .create(with_security("missing", SLEEP, |s| {
            s.seccomp = profile(ProfileType::Localhost, "/nonexistent/profile.json")
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("/nonexistent/profile.json"));
    pod.remove_pod().await;
}

#[tokio::test]
async fn no_new_privs_keeps_a_setuid_binary_unprivileged() {
    let (crius, _net) = crius_with_network(118).await;
    let mut pod = network_pod(&crius, "nnp", |_| {}).await;
    let bin = crius.dir.path().join("setuid");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy("/bin/busybox", bin.join("busybox")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(bin.join("busybox"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    let run = |name: &str, nnp: bool| {
        let mut config = with_security(name, SLEEP, |s| {
            s.run_as_user = Some(Int64Value { value: 1000 });
            s.no_new_privs = nnp;
        });
        config.mounts = vec![Mount {
            container_path: "/suid".into(),
            host_path: bin.display().to_string(),
            ..Default::default()
        }];
        config
    };
    let with = pod.run(run("nnp", true)).await;
    let (out, _, _) = sh(
        &mut pod,
        &with,
        "grep NoNewPrivs /proc/self/status; /suid/busybox grep Uid /proc/self/status",
    )
    .await;
    assert!(out.contains("NoNewPrivs:\t1"), "{out}");
    let uid_line = out.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert_eq!(
        uid_line.split_whitespace().nth(2),
        Some("1000"),
        "effective uid stays 1000: {out}"
    );
    let without = pod.run(run("plain", false)).await;
    let (out, _, _) = sh(&mut pod, &without, "grep NoNewPrivs /proc/self/status").await;
    assert!(out.contains("NoNewPrivs:\t0"), "{out}");
    pod.remove_pod().await;
}

#[tokio::test]
async fn pod_sysctls_are_applied() {
    let (crius, _net) = crius_with_network(119).await;
    let mut pod = network_pod(&crius, "sysctls", |c| {
        c.linux.get_or_insert_with(Default::default).sysctls = HashMap::from([
            ("kernel.shm_rmid_forced".to_string(), "1".to_string()),
            ("net.ipv4.ip_forward".to_string(), "1".to_string()),
        ]);
    })
    .await;
    let id = pod.run(container("sysctl", "busybox:latest", SLEEP)).await;
    let (out, _, _) = sh(
        &mut pod,
        &id,
        "cat /proc/sys/kernel/shm_rmid_forced /proc/sys/net/ipv4/ip_forward",
    )
    .await;
    assert_eq!(out, "1\n1\n");
    pod.remove_pod().await;
}

#[tokio::test]
async fn sysctls_the_kernel_or_the_pods_namespaces_refuse_are_the_pods_error() {
    let (crius, _net) = crius_with_network(123).await;
    let mut client = crius.client().await;
    // A value the kernel refuses, and a sysctl no namespace of the pod's scopes.
    for (name, value) in [
        ("net.ipv4.ip_forward", "not a number"),
        ("kernel.panic", "1"),
    ] {
        let mut config = pod_config("bad-sysctl");
        config.linux.get_or_insert_with(Default::default).sysctls =
            HashMap::from([(name.to_string(), value.to_string())]);
        let err = client
            .runtime
            .run_pod_sandbox(crius::api::v1::RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await
            .expect_err("a pod with a sysctl it may not set");
        assert_eq!(
            err.code(),
            tonic::Code::InvalidArgument,
            "{name}={value}: {err:?}"
        );
    }
    let left = crius.ctr(&["containers", "ls", "-q"]);
    assert!(left.trim().is_empty(), "{left}");
}

/// The container's memory limit in bytes, from cgroup v1 or v2.
async fn memory_limit(pod: &mut Pod, id: &str) -> u64 {
    let (out, _, _) = sh(
        pod,
        id,
        "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes",
    )
    .await;
    out.trim().parse().unwrap_or(0)
}

async fn cpu_quota(pod: &mut Pod, id: &str) -> i64 {
    let (out, _, _) = sh(
        pod,
        id,
        "cut -d' ' -f1 /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us",
    )
    .await;
    out.trim().parse().unwrap_or(0)
}

#[tokio::test]
async fn memory_and_cpu_limits_apply_and_update_live() {
    let (mut crius, _net) = crius_with_network(120).await;
    let mut pod = network_pod(&crius, "limits", |_| {}).await;
    let mut config = container("limited", "busybox:latest", SLEEP);
    config.linux = Some(LinuxContainerConfig {
        resources: Some(LinuxContainerResources {
            memory_limit_in_bytes: 32 * 1024 * 1024,
            cpu_period: 100_000,
            cpu_quota: 50_000,
            ..Default::default()
        }),
        ..Default::default()
    });
    let id = pod.run(config).await;
    assert_eq!(memory_limit(&mut pod, &id).await, 32 * 1024 * 1024);
    assert_eq!(cpu_quota(&mut pod, &id).await, 50_000);

    let updated = LinuxContainerResources {
        memory_limit_in_bytes: 64 * 1024 * 1024,
        cpu_period: 100_000,
        cpu_quota: 20_000,
        ..Default::default()
    };
    pod.client
        .runtime
        .update_container_resources(UpdateContainerResourcesRequest {
            container_id: id.clone(),
            linux: Some(updated.clone()),
            ..Default::default()
        })
        .await
        .expect("update resources");
    assert_eq!(memory_limit(&mut pod, &id).await, 64 * 1024 * 1024);
    assert_eq!(cpu_quota(&mut pod, &id).await, 20_000);
    let (status, info) = pod.status(&id).await;
    assert_eq!(
        status
            .resources
            .unwrap()
            .linux
            .unwrap()
            .memory_limit_in_bytes,
        64 * 1024 * 1024
    );
    assert_eq!(
        info["runtimeSpec"]["linux"]["resources"]["memory"]["limit"],
        64 * 1024 * 1024
    );

    // An update the runtime cannot apply (there is no CPU 63 here) leaves the kept spec
    // and the status as they were.
    let impossible = LinuxContainerResources {
        memory_limit_in_bytes: 48 * 1024 * 1024,
        cpuset_cpus: "63".to_string(),
        ..updated.clone()
    };
    let err = pod
        .client
        .runtime
        .update_container_resources(UpdateContainerResourcesRequest {
            container_id: id.clone(),
            linux: Some(impossible),
            ..Default::default()
        })
        .await
        .expect_err("no CPU 63");
    assert_eq!(err.code(), tonic::Code::Internal, "{err:?}");
    let (status, info) = pod.status(&id).await;
    let kept = status.resources.unwrap().linux.unwrap();
    assert_eq!(kept.memory_limit_in_bytes, 64 * 1024 * 1024);
    assert_eq!(kept.cpuset_cpus, "");
    assert_eq!(
        info["runtimeSpec"]["linux"]["resources"]["memory"]["limit"],
        64 * 1024 * 1024,
        "the kept spec took the failed update"
    );
    assert!(
        info["runtimeSpec"]["linux"]["resources"]["cpu"]["cpus"].is_null(),
        "{}",
        info["runtimeSpec"]["linux"]["resources"]["cpu"]
    );
    // The record keeps them too: a restarted crius reports them.
    crius.restart().await;
    pod.client = crius.client().await;
    let (status, info) = pod.status(&id).await;
    let kept = status.resources.unwrap().linux.unwrap();
    assert_eq!(kept.memory_limit_in_bytes, 64 * 1024 * 1024);
    assert_eq!(kept.cpuset_cpus, "");
    assert_eq!(
        info["runtimeSpec"]["linux"]["resources"]["memory"]["limit"],
        64 * 1024 * 1024,
        "the restarted crius shows the updated spec"
    );
    assert!(
        info["runtimeType"]
            .as_str()
            .is_some_and(|t| t.starts_with("io.containerd.")),
        "{info}"
    );
    pod.remove_pod().await;
}
