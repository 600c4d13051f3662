//! Checks of request fields that containerd, a CNI plugin, the kernel or the OCI runtime
//! would refuse only later, with an error crius could then report only as INTERNAL (and,
//! for CNI, after an IP was taken). Each check answers INVALID_ARGUMENT naming the field.

use std::collections::HashMap;
use std::path::{Component, Path};

use crate::api::v1::{
    ContainerConfig, LinuxContainerResources, NamespaceMode, NamespaceOption, PodSandboxConfig,
    PodSandboxMetadata, PortMapping, Protocol,
};
use tonic::Status;

use crate::stats::CgroupLayout;

/// containerd's bound on one label, key and value together (`labels.Validate`).
pub(crate) const MAX_LABEL_BYTES: usize = 4096;
/// The kernel's bound on a hostname (`__NEW_UTS_LEN`).
const MAX_HOSTNAME_BYTES: usize = 64;
/// Kubernetes names and UIDs are at most a DNS subdomain long; CNI passes them to every
/// plugin in one environment variable.
const MAX_NAME_BYTES: usize = 253;
/// A path component's and a path's bounds (`NAME_MAX`, `PATH_MAX`).
const MAX_COMPONENT_BYTES: usize = 255;
const MAX_PATH_BYTES: usize = 4096;

fn invalid(message: String) -> Status {
    Status::invalid_argument(message)
}

/// A value as an error message shows it: quoted, and cut when long.
fn shown(value: &str) -> String {
    const KEEP: usize = 64;
    if value.len() <= KEEP {
        return format!("{value:?}");
    }
    let mut cut = KEEP;
    while !value.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{:?}… ({} bytes)", &value[..cut], value.len())
}

fn no_control_characters(field: &str, value: &str) -> Result<(), Status> {
    if value.chars().any(char::is_control) {
        return Err(invalid(format!(
            "{field} {} contains a control character",
            shown(value)
        )));
    }
    Ok(())
}

fn no_nul(field: &str, value: &str) -> Result<(), Status> {
    if value.contains('\0') {
        return Err(invalid(format!(
            "{field} {} contains a NUL byte",
            shown(value)
        )));
    }
    Ok(())
}

/// Labels go onto the containerd container record, which refuses a label longer than
/// [`MAX_LABEL_BYTES`], and one with an empty key (its database needs a key).
pub(crate) fn labels(what: &str, labels: &HashMap<String, String>) -> Result<(), Status> {
    for (key, value) in labels {
        if key.is_empty() {
            return Err(invalid(format!("{what} label keys must not be empty")));
        }
        if key.len() + value.len() > MAX_LABEL_BYTES {
            return Err(invalid(format!(
                "{what} label {} is {} bytes with its value, more than the {MAX_LABEL_BYTES} \
                 containerd keeps",
                shown(key),
                key.len() + value.len()
            )));
        }
    }
    Ok(())
}

/// A name, namespace or UID of a pod, or a container's name: CNI's `CNI_ARGS` cannot carry
/// `;` or `=` in it, and nothing downstream wants control characters.
fn name(field: &str, value: &str, cni_arg: bool) -> Result<(), Status> {
    if value.len() > MAX_NAME_BYTES {
        return Err(invalid(format!(
            "{field} {} is longer than {MAX_NAME_BYTES} bytes",
            shown(value)
        )));
    }
    no_control_characters(field, value)?;
    if cni_arg && value.contains([';', '=']) {
        return Err(invalid(format!(
            "{field} {} contains ';' or '=', which CNI arguments cannot carry",
            shown(value)
        )));
    }
    Ok(())
}

fn pod_metadata(metadata: &PodSandboxMetadata) -> Result<(), Status> {
    name("pod sandbox metadata.name", &metadata.name, true)?;
    name("pod sandbox metadata.namespace", &metadata.namespace, true)?;
    name("pod sandbox metadata.uid", &metadata.uid, true)
}

/// An absolute path without NUL bytes, of at most `PATH_MAX` bytes.
fn absolute_path(field: &str, value: &str) -> Result<(), Status> {
    no_nul(field, value)?;
    if !value.starts_with('/') {
        return Err(invalid(format!(
            "{field} {} must be absolute",
            shown(value)
        )));
    }
    path_length(field, value)
}

fn path_length(field: &str, value: &str) -> Result<(), Status> {
    let too_long = value.len() > MAX_PATH_BYTES
        || value
            .split('/')
            .any(|component| component.len() > MAX_COMPONENT_BYTES);
    if too_long {
        return Err(invalid(format!(
            "{field} {} is longer than a path may be",
            shown(value)
        )));
    }
    Ok(())
}

fn port_mapping(mapping: &PortMapping) -> Result<(), Status> {
    if Protocol::try_from(mapping.protocol).is_err() {
        return Err(invalid(format!(
            "port mapping protocol {} is not TCP, UDP or SCTP",
            mapping.protocol
        )));
    }
    if !(1..=65_535).contains(&mapping.container_port) {
        return Err(invalid(format!(
            "port mapping container_port {} is outside 1..=65535",
            mapping.container_port
        )));
    }
    if !(0..=65_535).contains(&mapping.host_port) {
        return Err(invalid(format!(
            "port mapping host_port {} is outside 0..=65535",
            mapping.host_port
        )));
    }
    if !mapping.host_ip.is_empty() && mapping.host_ip.parse::<std::net::IpAddr>().is_err() {
        return Err(invalid(format!(
            "port mapping host_ip {} is not an IP address",
            shown(&mapping.host_ip)
        )));
    }
    Ok(())
}

/// A cgroup parent stays inside the cgroup hierarchy: crius writes pod limits under it.
/// cgroupfs wants an absolute path, systemd a slice.
fn cgroup_parent(parent: &str, systemd: bool) -> Result<(), Status> {
    if parent.is_empty() {
        return Ok(());
    }
    no_control_characters("cgroup_parent", parent)?;
    path_length("cgroup_parent", parent)?;
    if Path::new(parent)
        .components()
        .any(|c| c == Component::ParentDir)
    {
        return Err(invalid(format!(
            "cgroup_parent {} must not contain `..`",
            shown(parent)
        )));
    }
    if systemd {
        let slice = parent.rsplit('/').next().unwrap_or(parent);
        if !slice.ends_with(".slice") {
            return Err(invalid(format!(
                "cgroup_parent {} is not a systemd slice (the systemd cgroup driver is on)",
                shown(parent)
            )));
        }
    } else if !parent.starts_with('/') {
        return Err(invalid(format!(
            "cgroup_parent {} must be an absolute cgroup path",
            shown(parent)
        )));
    }
    Ok(())
}

/// Where a CRI mount goes: an absolute path inside the container, never its root (the
/// runtime cannot build the container over a mount there).
fn mount_destination(path: &str) -> Result<(), Status> {
    if path.is_empty() {
        return Ok(()); // Refused with its own message when the spec is built.
    }
    absolute_path("mount container_path", path)?;
    let components: Vec<Component> = Path::new(path).components().collect();
    if components.contains(&Component::ParentDir) {
        return Err(invalid(format!(
            "mount container_path {} must not contain `..`",
            shown(path)
        )));
    }
    if components == [Component::RootDir] {
        return Err(invalid(
            "a mount cannot cover the container's root directory".to_string(),
        ));
    }
    Ok(())
}

/// Sysctl names are dotted (or slashed) words; values are one line.
fn sysctls(sysctls: &HashMap<String, String>) -> Result<(), Status> {
    for (key, value) in sysctls {
        let word = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '/' | '_' | '-');
        if key.is_empty() || !key.chars().all(word) {
            return Err(invalid(format!("sysctl name {} is malformed", shown(key))));
        }
        no_control_characters(&format!("sysctl {key} value"), value)?;
    }
    Ok(())
}

/// Namespace modes are the CRI's values; TARGET only names a PID namespace of a container.
fn namespace_modes(
    what: &str,
    options: Option<&NamespaceOption>,
    target_allowed: bool,
) -> Result<(), Status> {
    let Some(options) = options else {
        return Ok(());
    };
    for (kind, mode) in [
        ("network", options.network),
        ("pid", options.pid),
        ("ipc", options.ipc),
    ] {
        let known = match NamespaceMode::try_from(mode) {
            Ok(NamespaceMode::Target) => target_allowed && kind == "pid",
            Ok(_) => true,
            Err(_) => false,
        };
        if !known {
            return Err(invalid(format!(
                "{what} {kind} namespace mode {mode} is not valid here"
            )));
        }
    }
    Ok(())
}

/// What a pod config must be before anything is made for it.
pub(crate) fn pod_config(config: &PodSandboxConfig, systemd_cgroup: bool) -> Result<(), Status> {
    if let Some(metadata) = &config.metadata {
        pod_metadata(metadata)?;
    }
    if config.hostname.len() > MAX_HOSTNAME_BYTES {
        return Err(invalid(format!(
            "hostname {} is longer than {MAX_HOSTNAME_BYTES} bytes",
            shown(&config.hostname)
        )));
    }
    no_control_characters("hostname", &config.hostname)?;
    if !config.hostname.is_empty() && super::sandbox::is_host_network(config) {
        // As under containerd's CRI, where the runtime refuses a hostname without a UTS
        // namespace of the pod's own (kubelet sends none for such pods).
        return Err(invalid(format!(
            "hostname {}: a pod in the host's network shares the host's UTS namespace and \
             cannot have a hostname of its own",
            shown(&config.hostname)
        )));
    }
    if !config.log_directory.is_empty() {
        absolute_path("log_directory", &config.log_directory)?;
    }
    if let Some(dns) = &config.dns_config {
        // One line each in resolv.conf.
        for value in dns.servers.iter().chain(&dns.searches).chain(&dns.options) {
            no_control_characters("DNS config entry", value)?;
        }
    }
    for mapping in &config.port_mappings {
        port_mapping(mapping)?;
    }
    labels("pod", &config.labels)?;
    if let Some(linux) = &config.linux {
        cgroup_parent(&linux.cgroup_parent, systemd_cgroup)?;
        sysctls(&linux.sysctls)?;
        namespace_modes(
            "pod",
            linux
                .security_context
                .as_ref()
                .and_then(|s| s.namespace_options.as_ref()),
            false,
        )?;
    }
    Ok(())
}

/// What a container config must be before anything is made for it.
pub(crate) fn container_config(config: &ContainerConfig) -> Result<(), Status> {
    if let Some(metadata) = &config.metadata {
        name("container metadata.name", &metadata.name, false)?;
    }
    labels("container", &config.labels)?;
    if !config.working_dir.is_empty() {
        absolute_path("working_dir", &config.working_dir)?;
    }
    for arg in config.command.iter().chain(&config.args) {
        no_nul("command argument", arg)?;
    }
    for env in &config.envs {
        if env.key.is_empty() || env.key.contains(['=', '\0']) {
            return Err(invalid(format!(
                "environment variable name {} must be non-empty, without '=' or NUL",
                shown(&env.key)
            )));
        }
        if env.value.contains(&0) {
            return Err(invalid(format!(
                "environment variable {} has a NUL byte in its value",
                shown(&env.key)
            )));
        }
        if env.key.len() + 1 + env.value.len() > crate::oci::container::MAX_ARG_BYTES {
            return Err(invalid(format!(
                "environment variable {} is longer than the kernel takes",
                shown(&env.key)
            )));
        }
    }
    no_nul("log_path", &config.log_path)?;
    path_length("log_path", &config.log_path)?;
    // It names a file in the pod's log directory, not the directory itself.
    if !config.log_path.is_empty()
        && matches!(config.log_path.rsplit('/').next(), Some("" | "." | ".."))
    {
        return Err(invalid(format!(
            "log_path {} does not name a file",
            shown(&config.log_path)
        )));
    }
    for device in &config.devices {
        absolute_path("device container_path", &device.container_path)?;
    }
    for mount in &config.mounts {
        mount_destination(&mount.container_path)?;
    }
    if let Some(security) = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
    {
        namespace_modes("container", security.namespace_options.as_ref(), true)?;
        // The runtime mounts over each inside the container.
        for path in &security.masked_paths {
            absolute_path("masked path", path)?;
        }
        for path in &security.readonly_paths {
            absolute_path("read-only path", path)?;
        }
    }
    Ok(())
}

/// `unified` cgroup settings exist only on cgroup v2: runc refuses them on v1, at start.
pub(crate) fn unified_resources(
    resources: Option<&LinuxContainerResources>,
    layout: Option<&CgroupLayout>,
) -> Result<(), Status> {
    let unified = resources.is_some_and(|r| !r.unified.is_empty());
    if unified && matches!(layout, Some(CgroupLayout::V1 { .. })) {
        return Err(invalid(
            "unified cgroup settings need cgroup v2; this host runs cgroup v1".to_string(),
        ));
    }
    Ok(())
}

/// A command for an exec: something to run, without NUL bytes, that `execve` can take
/// (a program name runc cannot run and echoes back must not hang it either).
pub(crate) fn exec_command(cmd: &[String]) -> Result<(), Status> {
    if cmd.is_empty() {
        return Err(invalid("exec command is required".to_string()));
    }
    for arg in cmd {
        no_nul("exec command argument", arg)?;
    }
    crate::oci::container::check_argv(cmd).map_err(|e| invalid(format!("exec command: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1::{
        KeyValue, LinuxContainerConfig, LinuxContainerSecurityContext, LinuxPodSandboxConfig,
        LinuxSandboxSecurityContext, PodSandboxMetadata,
    };
    use tonic::Code;

    fn pod() -> PodSandboxConfig {
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: "web".into(),
                namespace: "default".into(),
                uid: "0e1f".into(),
                attempt: 0,
            }),
            hostname: "web".into(),
            log_directory: "/var/log/pods/web".into(),
            ..Default::default()
        }
    }

    fn refused(result: Result<(), Status>) -> bool {
        result.is_err_and(|s| s.code() == Code::InvalidArgument)
    }

    #[test]
    fn a_plain_pod_passes() {
        pod_config(&pod(), false).unwrap();
        let mut systemd = pod();
        systemd.linux = Some(LinuxPodSandboxConfig {
            cgroup_parent: "/kubepods.slice/kubepods-pod1.slice".into(),
            ..Default::default()
        });
        pod_config(&systemd, true).unwrap();
    }

    #[test]
    fn labels_longer_than_containerd_keeps_are_refused() {
        let mut config = pod();
        config
            .labels
            .insert("k".into(), "v".repeat(MAX_LABEL_BYTES));
        assert!(refused(pod_config(&config, false)));
        config
            .labels
            .insert("k".into(), "v".repeat(MAX_LABEL_BYTES - 1));
        pod_config(&config, false).unwrap();
        config.labels.insert(String::new(), "v".into());
        assert!(refused(pod_config(&config, false)));
    }

    #[test]
    fn hostnames_the_kernel_refuses_are_refused() {
        for bad in ["h".repeat(65), "a\0b".to_string(), "a\nb".to_string()] {
            let mut config = pod();
            config.hostname = bad.clone();
            assert!(refused(pod_config(&config, false)), "{bad:?}");
        }
    }

    #[test]
    fn names_cni_cannot_carry_are_refused() {
        for bad in ["=", "a;b", "x".repeat(254).as_str(), "tab\there"] {
            let mut config = pod();
            config.metadata.as_mut().unwrap().namespace = bad.to_string();
            assert!(refused(pod_config(&config, false)), "{bad:?}");
        }
    }

    #[test]
    fn port_mappings_are_in_range() {
        let good = PortMapping {
            protocol: Protocol::Tcp as i32,
            container_port: 80,
            host_port: 0,
            host_ip: String::new(),
        };
        port_mapping(&good).unwrap();
        for bad in [
            PortMapping {
                container_port: 0,
                ..good.clone()
            },
            PortMapping {
                container_port: 65_536,
                ..good.clone()
            },
            PortMapping {
                host_port: -1,
                ..good.clone()
            },
            PortMapping {
                protocol: 7,
                ..good.clone()
            },
            PortMapping {
                host_ip: "not-an-ip".into(),
                ..good.clone()
            },
        ] {
            assert!(refused(port_mapping(&bad)), "{bad:?}");
        }
    }

    #[test]
    fn cgroup_parents_stay_in_the_hierarchy() {
        cgroup_parent("/kubepods/burstable/pod1", false).unwrap();
        cgroup_parent("kubepods-burstable-pod1.slice", true).unwrap();
        for (bad, systemd) in [
            ("../../..", false),
            ("/kubepods/../../etc", false),
            ("relative", false),
            ("\n", false),
            ("/kubepods", true),
        ] {
            assert!(refused(cgroup_parent(bad, systemd)), "{bad:?}");
        }
    }

    #[test]
    fn namespace_modes_are_the_cris() {
        let mut config = pod();
        config.linux = Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: 99,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert!(refused(pod_config(&config, false)));
        let target = NamespaceOption {
            pid: NamespaceMode::Target as i32,
            ..Default::default()
        };
        namespace_modes("container", Some(&target), true).unwrap();
        assert!(refused(namespace_modes("pod", Some(&target), false)));
    }

    #[test]
    fn sysctls_are_names_and_one_line_values() {
        let ok = HashMap::from([("net.ipv4.ip_forward".to_string(), "1".to_string())]);
        sysctls(&ok).unwrap();
        for (key, value) in [("", "1"), ("net.a b", "1"), ("net.x", "1\n2")] {
            let bad = HashMap::from([(key.to_string(), value.to_string())]);
            assert!(refused(sysctls(&bad)), "{key:?}={value:?}");
        }
    }

    #[test]
    fn container_processes_the_runtime_cannot_start_are_refused() {
        let good = ContainerConfig {
            working_dir: "/app".into(),
            command: vec!["sh".into()],
            envs: vec![KeyValue {
                key: "A".into(),
                value: b"b=c".to_vec(),
            }],
            log_path: "app/0.log".into(),
            ..Default::default()
        };
        container_config(&good).unwrap();
        let cases: [fn(&mut ContainerConfig); 10] = [
            |c| c.working_dir = "relative".into(),
            |c| c.command = vec!["a\0b".into()],
            |c| c.envs[0].key = String::new(),
            |c| c.envs[0].key = "A=B".into(),
            |c| c.envs[0].value = b"a\0".to_vec(),
            |c| c.log_path = "x".repeat(256),
            |c| c.log_path = ".".into(),
            |c| c.log_path = "app/".into(),
            |c| {
                c.linux = Some(LinuxContainerConfig {
                    security_context: Some(LinuxContainerSecurityContext {
                        readonly_paths: vec![format!("/{}", "x".repeat(256))],
                        ..Default::default()
                    }),
                    ..Default::default()
                })
            },
            |c| {
                c.linux = Some(LinuxContainerConfig {
                    security_context: Some(LinuxContainerSecurityContext {
                        masked_paths: vec!["proc/kcore".into()],
                        ..Default::default()
                    }),
                    ..Default::default()
                })
            },
        ];
        for (i, spoil) in cases.iter().enumerate() {
            let mut config = good.clone();
            spoil(&mut config);
            assert!(refused(container_config(&config)), "case {i}");
        }
    }

    #[test]
    fn mounts_go_inside_the_container_and_not_over_its_root() {
        mount_destination("/data").unwrap();
        mount_destination("/var/lib/x/").unwrap();
        for bad in ["/", "//", "relative", "/a/../..", "/a\0"] {
            assert!(refused(mount_destination(bad)), "{bad:?}");
        }
    }

    #[test]
    fn exec_commands_execve_can_take() {
        exec_command(&["true".to_string()]).unwrap();
        assert!(refused(exec_command(&[])));
        assert!(refused(exec_command(&["a\0b".to_string()])));
        // runc hangs on a program name it cannot run that is longer than a pipe holds.
        assert!(refused(exec_command(&["x".repeat(70_000)])));
        assert!(refused(exec_command(&[
            "echo".to_string(),
            "x".repeat(200_000)
        ])));
    }

    #[test]
    fn unified_settings_need_cgroup_v2() {
        let resources = LinuxContainerResources {
            unified: HashMap::from([("memory.high".to_string(), "1G".to_string())]),
            ..Default::default()
        };
        let v1 = CgroupLayout::V1 {
            controllers: HashMap::new(),
        };
        let v2 = CgroupLayout::V2 {
            mount: "/sys/fs/cgroup".into(),
            root: "/".into(),
        };
        assert!(refused(unified_resources(Some(&resources), Some(&v1))));
        unified_resources(Some(&resources), Some(&v2)).unwrap();
        unified_resources(None, Some(&v1)).unwrap();
    }

    #[test]
    fn long_values_are_cut_in_messages() {
        let err = absolute_path("log_directory", &"x".repeat(1 << 20)).unwrap_err();
        assert!(err.message().len() < 200, "{}", err.message());
    }
}
