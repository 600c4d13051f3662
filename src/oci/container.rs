//! The runtime spec of a container: the image config merged with the CRI config, the pod's
//! namespaces joined through the pause process, the pod's files mounted, and the CRI
//! annotations.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::api::v1::LinuxContainerResources;
use crate::api::v1::{
    ContainerConfig, LinuxContainerSecurityContext, MountPropagation, NamespaceMode,
    PodSandboxConfig,
};
use oci_spec::runtime::{
    Capabilities, LinuxBuilder, LinuxCpuBuilder, LinuxDevice, LinuxHugepageLimitBuilder,
    LinuxMemoryBuilder, LinuxNamespace, LinuxNamespaceType, LinuxResources, LinuxResourcesBuilder,
    Mount, Process, ProcessBuilder, Spec,
};

use super::user::ResolvedUser;
use super::{
    SpecError, annotations, builder, cgroups_path, default_capabilities, mount, seccomp,
    security as sec,
};
use crate::imagespec::manifest::RunConfig;

/// The pod's files a container gets mounted.
pub struct PodFiles<'a> {
    pub hosts: &'a Path,
    pub hostname: &'a Path,
    pub resolv_conf: &'a Path,
    /// The pod's /dev/shm; the host's when the pod uses the host's IPC.
    pub shm: &'a Path,
}

/// Everything a container's spec is made from.
pub struct ContainerSpecInput<'a> {
    pub id: &'a str,
    pub namespace: &'a str,
    pub config: &'a ContainerConfig,
    pub sandbox_id: &'a str,
    pub sandbox_config: &'a PodSandboxConfig,
    /// The pause process, whose namespaces the container joins.
    pub sandbox_pid: u32,
    /// The target container's process for the TARGET PID namespace mode.
    pub target_pid: Option<u32>,
    pub image: &'a RunConfig,
    /// The image as the client named it.
    pub image_name: &'a str,
    pub user: &'a ResolvedUser,
    pub pod_files: PodFiles<'a>,
    pub systemd_cgroup: bool,
    /// Already clamped to what crius may set.
    pub oom_score_adj: Option<i32>,
    pub passthrough_annotations: HashMap<String, String>,
    /// The pod's hostname, which the container gets as `HOSTNAME`.
    pub hostname: &'a str,
    /// The volumes the image declares that no CRI mount replaces.
    pub declared_volumes: &'a [DeclaredVolume],
    /// The handler's `privileged_without_host_devices`: a privileged container then gets
    /// only the devices its config names.
    pub privileged_without_host_devices: bool,
    /// The pod's own user namespace, when it has one.
    pub userns: Option<builder::PodUserNamespace<'a>>,
}

/// A volume the image declares (`VOLUME`), with the host directory made for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredVolume {
    pub container_path: String,
    pub host_path: std::path::PathBuf,
}

/// The process arguments from the CRI command/args and the image's Entrypoint/Cmd, as
/// Docker and containerd merge them.
pub fn process_args(
    command: &[String],
    args: &[String],
    image: &RunConfig,
) -> Result<Vec<String>, SpecError> {
    let mut command = command.to_vec();
    let mut args = args.to_vec();
    if command.is_empty() {
        if args.is_empty() {
            args = image.cmd.clone().unwrap_or_default();
        }
        let entrypoint = image.entrypoint.clone().unwrap_or_default();
        // An entrypoint of [""] means "none", as Docker treats it.
        if !(entrypoint.len() == 1 && entrypoint[0].is_empty()) {
            command = entrypoint;
        }
    }
    command.extend(args);
    if command.is_empty() {
        return Err(SpecError::Invalid(
            "no command specified: neither the container config nor the image has one".to_string(),
        ));
    }
    check_argv(&command)?;
    Ok(command)
}

/// The kernel's bound on one argument or environment string (`MAX_ARG_STRLEN`).
pub const MAX_ARG_BYTES: usize = 32 * 4096;
/// The longest program path the kernel resolves (`PATH_MAX`).
pub const MAX_PROGRAM_BYTES: usize = 4096;

/// Refuses arguments `execve` can never take. The program's own name is bounded tighter:
/// runc echoes a name it cannot run in its error, and one longer than a pipe holds (64 KiB)
/// hangs runc for good, with the container's task.
pub fn check_argv(argv: &[String]) -> Result<(), SpecError> {
    if let Some(program) = argv.first()
        && program.len() > MAX_PROGRAM_BYTES
    {
        return Err(SpecError::Invalid(format!(
            "the program name is {} bytes, more than a path may be ({MAX_PROGRAM_BYTES})",
            program.len()
        )));
    }
    if let Some(arg) = argv.iter().find(|a| a.len() > MAX_ARG_BYTES) {
        return Err(SpecError::Invalid(format!(
            "an argument is {} bytes, more than the kernel takes ({MAX_ARG_BYTES})",
            arg.len()
        )));
    }
    Ok(())
}

/// Refuses an image `WorkingDir` runc cannot take: not absolute, a NUL, or longer than a
/// path may be (runc echoes it in its error, and a long one hangs runc as a long program
/// name does). The CRI's `working_dir` is checked with the request.
fn check_image_working_dir(dir: &str) -> Result<(), SpecError> {
    if dir.is_empty() {
        return Ok(());
    }
    if !dir.starts_with('/') || dir.contains('\0') || dir.len() > MAX_PROGRAM_BYTES {
        let shown: String = dir.chars().take(64).collect();
        return Err(SpecError::Invalid(format!(
            "the image's working directory {shown:?} ({} bytes) is not an absolute path runc can take",
            dir.len()
        )));
    }
    Ok(())
}

/// Refuses image environment entries `execve` cannot take (a NUL, or longer than the
/// kernel's bound on one string).
fn check_image_env(env: &[String]) -> Result<(), SpecError> {
    if let Some(entry) = env
        .iter()
        .find(|e| e.contains('\0') || e.len() > MAX_ARG_BYTES)
    {
        let name = entry.split('=').next().unwrap_or_default();
        let shown: String = name.chars().take(64).collect();
        return Err(SpecError::Invalid(format!(
            "the image's environment variable {shown:?} ({} bytes) cannot be passed to a process",
            entry.len()
        )));
    }
    Ok(())
}

/// The image's environment with the CRI's variables replacing those of the same name.
pub fn merge_env(image_env: &[String], cri_env: &[(String, String)]) -> Vec<String> {
    let mut env: Vec<String> = image_env.to_vec();
    for (key, value) in cri_env {
        let entry = format!("{key}={value}");
        match env
            .iter()
            .position(|e| e.split_once('=').map(|(k, _)| k) == Some(key.as_str()))
        {
            Some(i) => env[i] = entry,
            None => env.push(entry),
        }
    }
    env
}

fn propagation_option(propagation: i32) -> &'static str {
    match MountPropagation::try_from(propagation) {
        Ok(MountPropagation::PropagationHostToContainer) => "rslave",
        Ok(MountPropagation::PropagationBidirectional) => "rshared",
        _ => "rprivate",
    }
}

/// The CRI mounts: host paths must exist (a symlink is followed); rshared and rslave need
/// the host path on a shared (or slave) mount; recursive read-only needs read-only and
/// private propagation.
fn cri_mounts(config: &ContainerConfig) -> Result<Vec<Mount>, SpecError> {
    config
        .mounts
        .iter()
        .map(|m| {
            if m.container_path.is_empty() {
                return Err(SpecError::Invalid(
                    "a mount has no container_path".to_string(),
                ));
            }
            let source = std::fs::canonicalize(&m.host_path).map_err(|e| {
                SpecError::Invalid(format!("mount host path {:?}: {e}", m.host_path))
            })?;
            let propagation = propagation_option(m.propagation);
            sec::check_propagation(&source, propagation)?;
            let access = if m.readonly { "ro" } else { "rw" };
            let mut options = vec!["rbind", propagation, access];
            if m.recursive_read_only {
                if !m.readonly || propagation != "rprivate" {
                    return Err(SpecError::Invalid(format!(
                        "recursive read-only mount {:?} must be read-only with private propagation",
                        m.container_path
                    )));
                }
                options.push("rro");
            }
            let mut oci = mount(
                &m.container_path,
                "bind",
                &source.display().to_string(),
                &options,
            )?;
            // Left to a runtime that idmaps mounts itself (crius stages them for others).
            if !m.uid_mappings.is_empty() || !m.gid_mappings.is_empty() {
                oci.set_uid_mappings(Some(id_mappings(&m.uid_mappings)?));
                oci.set_gid_mappings(Some(id_mappings(&m.gid_mappings)?));
            }
            Ok(oci)
        })
        .collect()
}

fn id_mappings(
    ranges: &[crate::api::v1::IdMapping],
) -> Result<Vec<oci_spec::runtime::LinuxIdMapping>, SpecError> {
    ranges
        .iter()
        .map(|r| {
            Ok(oci_spec::runtime::LinuxIdMappingBuilder::default()
                .container_id(r.container_id)
                .host_id(r.host_id)
                .size(r.length)
                .build()?)
        })
        .collect()
}

/// The rootfs propagation the mounts need: rshared for any rshared mount, else rslave.
fn rootfs_propagation(config: &ContainerConfig) -> Option<&'static str> {
    let modes: Vec<&str> = config
        .mounts
        .iter()
        .map(|m| propagation_option(m.propagation))
        .collect();
    if modes.contains(&"rshared") {
        Some("rshared")
    } else if modes.contains(&"rslave") {
        Some("rslave")
    } else {
        None
    }
}

/// The largest CFS quota the kernel takes, in microseconds (`max_cfs_runtime`: 2^44 - 1).
const MAX_CPU_QUOTA: i64 = (1 << 44) - 1;

/// Refuses resource values the kernel would not take, before anything reaches containerd or
/// the OCI runtime (whose error would otherwise come back as INTERNAL).
pub fn check_resources(r: &LinuxContainerResources) -> Result<(), SpecError> {
    let invalid = |what: String| Err(SpecError::Invalid(what));
    if !(-1000..=1000).contains(&r.oom_score_adj) {
        return invalid(format!(
            "oom_score_adj {} is outside -1000..=1000",
            r.oom_score_adj
        ));
    }
    if r.cpu_period != 0 && !(1_000..=1_000_000).contains(&r.cpu_period) {
        return invalid(format!(
            "cpu_period {} is outside 1000..=1000000 microseconds",
            r.cpu_period
        ));
    }
    if r.cpu_quota != 0 && r.cpu_quota != -1 && r.cpu_quota < 1_000 {
        return invalid(format!(
            "cpu_quota {} is below 1000 microseconds (-1 means none)",
            r.cpu_quota
        ));
    }
    if r.cpu_quota > MAX_CPU_QUOTA {
        return invalid(format!(
            "cpu_quota {} is above the kernel's {MAX_CPU_QUOTA} microseconds",
            r.cpu_quota
        ));
    }
    if !(0..=262_144).contains(&r.cpu_shares) {
        return invalid(format!("cpu_shares {} is outside 0..=262144", r.cpu_shares));
    }
    if r.memory_limit_in_bytes < 0 || r.memory_swap_limit_in_bytes < -1 {
        return invalid("memory limits must not be negative (swap: -1 for unlimited)".into());
    }
    // The swap limit is memory plus swap: the kernel refuses one below the memory limit,
    // or one without a memory limit.
    if r.memory_swap_limit_in_bytes > 0
        && (r.memory_limit_in_bytes == 0 || r.memory_swap_limit_in_bytes < r.memory_limit_in_bytes)
    {
        return invalid(format!(
            "memory_swap_limit_in_bytes {} needs a memory limit at or below it (memory: {})",
            r.memory_swap_limit_in_bytes, r.memory_limit_in_bytes
        ));
    }
    for (field, list) in [
        ("cpuset_cpus", &r.cpuset_cpus),
        ("cpuset_mems", &r.cpuset_mems),
    ] {
        check_cpu_list(list).map_err(|e| SpecError::Invalid(format!("{field} {list:?}: {e}")))?;
    }
    for limit in &r.hugepage_limits {
        let digits = limit.page_size.trim_end_matches(['K', 'M', 'G', 'B']);
        let unit = &limit.page_size[digits.len()..];
        if digits.is_empty()
            || !digits.bytes().all(|b| b.is_ascii_digit())
            || !matches!(unit, "KB" | "MB" | "GB")
        {
            return invalid(format!(
                "hugepage page size {:?} is not like 2MB or 1GB",
                limit.page_size
            ));
        }
    }
    for key in r.unified.keys() {
        // Keys name files in the container's cgroup directory: never a path.
        if key.is_empty() || key.contains('/') || key.starts_with('.') || !key.is_ascii() {
            return invalid(format!(
                "unified cgroup key {key:?} is not a cgroup file name"
            ));
        }
    }
    Ok(())
}

/// A kernel CPU or memory-node list: `0-3,8,10-11`.
fn check_cpu_list(list: &str) -> Result<(), String> {
    const MAX_ID: u32 = 65_535;
    if list.is_empty() {
        return Ok(());
    }
    for item in list.split(',') {
        let (first, last) = item.split_once('-').unwrap_or((item, item));
        let parse = |n: &str| {
            n.parse::<u32>()
                .ok()
                .filter(|n| *n <= MAX_ID)
                .ok_or_else(|| format!("{item:?} is not a number or range up to {MAX_ID}"))
        };
        if parse(first)? > parse(last)? {
            return Err(format!("range {item:?} runs backwards"));
        }
    }
    Ok(())
}

/// The cgroup limits of a container: the CRI resources (zero means unset), devices denied
/// by default.
pub fn linux_resources(
    resources: Option<&LinuxContainerResources>,
) -> Result<LinuxResources, SpecError> {
    let mut builder = LinuxResourcesBuilder::default().devices(vec![builder::deny_all_devices()?]);
    let Some(r) = resources else {
        return Ok(builder.build()?);
    };
    check_resources(r)?;
    let mut cpu = LinuxCpuBuilder::default();
    let mut any_cpu = false;
    if r.cpu_period > 0 {
        cpu = cpu.period(r.cpu_period as u64);
        any_cpu = true;
    }
    if r.cpu_quota != 0 {
        cpu = cpu.quota(r.cpu_quota);
        any_cpu = true;
    }
    if r.cpu_shares > 0 {
        cpu = cpu.shares(r.cpu_shares as u64);
        any_cpu = true;
    }
    if !r.cpuset_cpus.is_empty() {
        cpu = cpu.cpus(r.cpuset_cpus.clone());
        any_cpu = true;
    }
    if !r.cpuset_mems.is_empty() {
        cpu = cpu.mems(r.cpuset_mems.clone());
        any_cpu = true;
    }
    if any_cpu {
        builder = builder.cpu(cpu.build()?);
    }
    if r.memory_limit_in_bytes > 0 {
        // Without an explicit swap limit, no swap: swap+memory equals memory.
        let swap = if r.memory_swap_limit_in_bytes > 0 {
            r.memory_swap_limit_in_bytes
        } else {
            r.memory_limit_in_bytes
        };
        builder = builder.memory(
            LinuxMemoryBuilder::default()
                .limit(r.memory_limit_in_bytes)
                .swap(swap)
                .build()?,
        );
    }
    if !r.hugepage_limits.is_empty() {
        let limits = r
            .hugepage_limits
            .iter()
            .map(|h| {
                LinuxHugepageLimitBuilder::default()
                    .page_size(h.page_size.clone())
                    .limit(h.limit as i64)
                    .build()
            })
            .collect::<Result<Vec<_>, _>>()?;
        builder = builder.hugepage_limits(limits);
    }
    if !r.unified.is_empty() {
        builder = builder.unified(r.unified.clone());
    }
    Ok(builder.build()?)
}

/// A container's spec: one step per concern, shared with the sandbox spec where they agree
/// (`builder`).
pub fn container_spec(input: &ContainerSpecInput<'_>) -> Result<Spec, SpecError> {
    let config = input.config;
    let linux = config.linux.clone().unwrap_or_default();
    let security = linux.security_context.clone().unwrap_or_default();
    let pod_linux = input.sandbox_config.linux.clone().unwrap_or_default();
    let privileged = security.privileged;
    let pod_privileged = pod_linux
        .security_context
        .as_ref()
        .is_some_and(|s| s.privileged);
    if privileged && !pod_privileged {
        return Err(SpecError::Invalid(
            // containerd's CRI words it so; tools match the words.
            "failed to generate spec opts: no privileged container allowed in sandbox (a \
             privileged container needs a privileged pod sandbox)"
                .to_string(),
        ));
    }

    let (process, permitted) = container_process(input, &security)?;
    let mut resources = linux_resources(linux.resources.as_ref())?;
    let devices = container_devices(
        config,
        privileged && !input.privileged_without_host_devices,
        &mut resources,
    )?;
    let (masked, readonly) = builder::masked_and_readonly_paths(
        privileged,
        &security.masked_paths,
        &security.readonly_paths,
    );
    let mut linux_spec = LinuxBuilder::default()
        .namespaces(container_namespaces(input, &security)?)
        .cgroups_path(PathBuf::from(cgroups_path(
            &pod_linux.cgroup_parent,
            input.id,
            input.namespace,
            input.systemd_cgroup,
        )))
        .resources(resources)
        .devices(devices)
        .masked_paths(masked)
        .readonly_paths(readonly)
        .build()?;
    linux_spec.set_seccomp(seccomp::select(
        security.seccomp.as_ref(),
        #[allow(deprecated)]
        &security.seccomp_profile_path,
        privileged,
        &permitted,
    )?);
    if let Some(propagation) = rootfs_propagation(config) {
        linux_spec.set_rootfs_propagation(Some(propagation.to_string()));
    }

    let mut spec = builder::assemble(builder::SpecParts {
        readonly_rootfs: security.readonly_rootfs,
        process,
        mounts: container_mounts(input, privileged, security.readonly_rootfs)?,
        linux: linux_spec,
        annotations: container_annotations(input),
        // Containers share the pod's UTS namespace and its hostname.
        hostname: None,
    })?;
    if let Some(userns) = &input.userns {
        builder::join_user_namespace(&mut spec, userns)?;
    }
    Ok(spec)
}

/// An env value as the OCI spec can hold it. Values are bytes in the CRI; the spec is JSON,
/// whose strings are UTF-8: as containerd's Go JSON encoder does, each byte that is not
/// part of valid UTF-8 becomes U+FFFD and the rest is kept.
fn env_value(bytes: &[u8]) -> String {
    let mut value = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        value.push_str(chunk.valid());
        value.extend(chunk.invalid().iter().map(|_| char::REPLACEMENT_CHARACTER));
    }
    value
}

/// The container's process: command, environment, working dir, user, capabilities (with
/// ambient ones), no_new_privs, OOM score and AppArmor. Returns the permitted capabilities
/// too, which the seccomp profile depends on.
fn container_process(
    input: &ContainerSpecInput<'_>,
    security: &LinuxContainerSecurityContext,
) -> Result<(Process, Capabilities), SpecError> {
    let config = input.config;
    let privileged = security.privileged;
    let cri_env: Vec<(String, String)> = config
        .envs
        .iter()
        .map(|kv| (kv.key.clone(), env_value(&kv.value)))
        .collect();
    let image_env = input.image.env.clone().unwrap_or_default();
    check_image_env(&image_env)?;
    let mut env = merge_env(&image_env, &cri_env);
    // The pod's hostname, unless the image or the config set HOSTNAME (containerd's order).
    if !env.iter().any(|e| e.split('=').next() == Some("HOSTNAME")) {
        env.insert(0, format!("HOSTNAME={}", input.hostname));
    }
    let cwd = if config.working_dir.is_empty() {
        check_image_working_dir(&input.image.working_dir)?;
        Some(&input.image.working_dir).filter(|dir| !dir.is_empty())
    } else {
        Some(&config.working_dir)
    }
    .cloned()
    .unwrap_or_else(|| "/".to_string());
    let (permitted, ambient) = container_capabilities(security)?;
    let mut process = ProcessBuilder::default()
        .terminal(config.tty)
        .user(builder::user(
            input.user.uid,
            input.user.gid,
            input.user.additional_gids.clone(),
        )?)
        .args(process_args(&config.command, &config.args, input.image)?)
        .env(env)
        .cwd(cwd)
        .capabilities(builder::capability_sets(&permitted, &ambient)?)
        .no_new_privileges(security.no_new_privs)
        .build()?;
    process.set_oom_score_adj(input.oom_score_adj);
    process.set_apparmor_profile(sec::apparmor_profile(
        security.apparmor.as_ref(),
        #[allow(deprecated)]
        &security.apparmor_profile,
        privileged,
    )?);
    Ok((builder::without_rlimits(process), permitted))
}

/// The permitted set (every capability when privileged, else the defaults with the CRI's
/// adds and drops, plus the ambient ones, which must be permitted) and the ambient set.
fn container_capabilities(
    security: &LinuxContainerSecurityContext,
) -> Result<(Capabilities, Capabilities), SpecError> {
    let mut permitted = if security.privileged {
        sec::all_capabilities()
    } else {
        let cri_caps = security.capabilities.clone().unwrap_or_default();
        sec::capabilities(
            &default_capabilities(),
            &cri_caps.add_capabilities,
            &cri_caps.drop_capabilities,
        )?
    };
    let ambient: Capabilities = security
        .capabilities
        .as_ref()
        .map(|c| {
            c.add_ambient_capabilities
                .iter()
                .map(|name| sec::parse_capability(name))
                .collect::<Result<Capabilities, _>>()
        })
        .transpose()?
        .unwrap_or_default();
    permitted.extend(ambient.iter().copied());
    Ok((permitted, ambient))
}

/// A new mount namespace; the pod's network, UTS and IPC namespaces (unless the host's);
/// the PID namespace by mode: the host's, its own, the pod's, or a target container's.
fn container_namespaces(
    input: &ContainerSpecInput<'_>,
    security: &LinuxContainerSecurityContext,
) -> Result<Vec<LinuxNamespace>, SpecError> {
    let pod_ns = input
        .sandbox_config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.clone())
        .unwrap_or_default();
    let ns = security
        .namespace_options
        .clone()
        .unwrap_or_else(|| pod_ns.clone());
    let pod = |kind: &str| {
        Some(PathBuf::from(format!(
            "/proc/{}/ns/{kind}",
            input.sandbox_pid
        )))
    };
    let mut namespaces = vec![builder::namespace(LinuxNamespaceType::Mount, None)?];
    if pod_ns.network != NamespaceMode::Node as i32 {
        namespaces.push(builder::namespace(LinuxNamespaceType::Network, pod("net"))?);
        namespaces.push(builder::namespace(LinuxNamespaceType::Uts, pod("uts"))?);
    }
    if pod_ns.ipc != NamespaceMode::Node as i32 {
        namespaces.push(builder::namespace(LinuxNamespaceType::Ipc, pod("ipc"))?);
    }
    let pid_path = match NamespaceMode::try_from(ns.pid).unwrap_or(NamespaceMode::Pod) {
        NamespaceMode::Node => return Ok(namespaces),
        NamespaceMode::Container => None,
        NamespaceMode::Pod => pod("pid"),
        NamespaceMode::Target => {
            let pid = input.target_pid.ok_or_else(|| {
                SpecError::Invalid(format!(
                    "PID namespace target {:?} is not a running container",
                    ns.target_id
                ))
            })?;
            Some(PathBuf::from(format!("/proc/{pid}/ns/pid")))
        }
    };
    namespaces.push(builder::namespace(LinuxNamespaceType::Pid, pid_path)?);
    Ok(namespaces)
}

/// containerd's default mounts (a writable /sys when privileged), the cgroup filesystem,
/// the pod's hosts, hostname, resolv.conf and /dev/shm unless a CRI mount takes their
/// place, then the CRI mounts.
fn container_mounts(
    input: &ContainerSpecInput<'_>,
    privileged: bool,
    readonly_rootfs: bool,
) -> Result<Vec<Mount>, SpecError> {
    let mut mounts = builder::base_mounts()?;
    if privileged {
        mounts.retain(|m| m.destination() != Path::new("/sys"));
        mounts.push(mount(
            "/sys",
            "sysfs",
            "sysfs",
            &["nosuid", "noexec", "nodev", "rw"],
        )?);
    }
    let sys_access = if privileged { "rw" } else { "ro" };
    mounts.push(mount(
        "/sys/fs/cgroup",
        "cgroup",
        "cgroup",
        &["nosuid", "noexec", "nodev", "relatime", sys_access],
    )?);
    let user_mounts = cri_mounts(input.config)?;
    let taken = |dest: &str| {
        user_mounts
            .iter()
            .any(|m| m.destination() == Path::new(dest))
    };
    let files_access = if readonly_rootfs { "ro" } else { "rw" };
    let files = [
        ("/etc/hosts", input.pod_files.hosts, files_access),
        ("/etc/hostname", input.pod_files.hostname, files_access),
        (
            "/etc/resolv.conf",
            input.pod_files.resolv_conf,
            files_access,
        ),
        ("/dev/shm", input.pod_files.shm, "rw"),
    ];
    for (dest, source, access) in files {
        if !taken(dest) {
            mounts.push(mount(
                dest,
                "bind",
                &source.display().to_string(),
                &["rbind", "rprivate", access],
            )?);
        }
    }
    for volume in input.declared_volumes {
        mounts.push(mount(
            &volume.container_path,
            "bind",
            &volume.host_path.display().to_string(),
            &["rbind", "rprivate", "rw"],
        )?);
    }
    mounts.extend(user_mounts);
    Ok(mounts)
}

/// The devices the container gets (the host's when it gets them, then the CRI's) and their
/// cgroup rules, which go into `resources`.
fn container_devices(
    config: &ContainerConfig,
    host_devices: bool,
    resources: &mut LinuxResources,
) -> Result<Vec<LinuxDevice>, SpecError> {
    let mut devices = Vec::new();
    let mut rules = resources.devices().clone().unwrap_or_default();
    if host_devices {
        devices.extend(sec::host_devices());
        rules = vec![builder::allow_all_devices()?];
    }
    for d in &config.devices {
        let (dev, rule) = sec::device(Path::new(&d.host_path), &d.container_path, &d.permissions)?;
        devices.retain(|existing| existing.path() != dev.path());
        devices.push(dev);
        rules.push(rule);
    }
    resources.set_devices(Some(rules));
    Ok(devices)
}

/// The CRI annotations of a container: the pod's, its own name and its image's.
fn container_annotations(input: &ContainerSpecInput<'_>) -> HashMap<String, String> {
    let pod = input.sandbox_config.metadata.clone().unwrap_or_default();
    let mut all = builder::pod_annotations(
        &input.passthrough_annotations,
        annotations::CONTAINER_TYPE_CONTAINER,
        input.sandbox_id,
        &pod,
    );
    let name = input.config.metadata.clone().unwrap_or_default().name;
    all.insert(annotations::CONTAINER_NAME.to_string(), name);
    all.insert(
        annotations::IMAGE_NAME.to_string(),
        input.image_name.to_string(),
    );
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_values_the_kernel_refuses_are_invalid() {
        let ok = LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: 50_000,
            cpu_shares: 512,
            cpuset_cpus: "0-3,8".into(),
            cpuset_mems: "0".into(),
            oom_score_adj: -999,
            ..Default::default()
        };
        assert!(check_resources(&ok).is_ok());
        let bad = [
            LinuxContainerResources {
                cpuset_cpus: "1,,2".into(),
                ..ok.clone()
            },
            LinuxContainerResources {
                cpuset_cpus: "3-1".into(),
                ..ok.clone()
            },
            LinuxContainerResources {
                cpuset_mems: "x".into(),
                ..ok.clone()
            },
            LinuxContainerResources {
                oom_score_adj: 5000,
                ..ok.clone()
            },
            LinuxContainerResources {
                cpu_period: 5,
                ..ok.clone()
            },
            LinuxContainerResources {
                cpu_quota: 10,
                ..ok.clone()
            },
            LinuxContainerResources {
                cpu_shares: -1,
                ..ok.clone()
            },
            LinuxContainerResources {
                memory_limit_in_bytes: -5,
                ..ok.clone()
            },
            LinuxContainerResources {
                unified: HashMap::from([("../../cpu.max".to_string(), "1".to_string())]),
                ..ok.clone()
            },
            LinuxContainerResources {
                hugepage_limits: vec![crate::api::v1::HugepageLimit {
                    page_size: "2XB".into(),
                    limit: 1,
                }],
                ..ok.clone()
            },
            LinuxContainerResources {
                cpu_quota: 1 << 50,
                ..ok.clone()
            },
            LinuxContainerResources {
                memory_limit_in_bytes: 64 << 20,
                memory_swap_limit_in_bytes: 1 << 20,
                ..ok.clone()
            },
            LinuxContainerResources {
                memory_swap_limit_in_bytes: 1 << 20,
                ..ok.clone()
            },
        ];
        let swap = LinuxContainerResources {
            memory_limit_in_bytes: 64 << 20,
            memory_swap_limit_in_bytes: 128 << 20,
            ..ok.clone()
        };
        assert!(check_resources(&swap).is_ok());
        for r in bad {
            assert!(
                matches!(check_resources(&r), Err(SpecError::Invalid(_))),
                "{r:?}"
            );
        }
    }
    use crate::api::v1::{ContainerMetadata, KeyValue, Mount as CriMount};

    fn image(entrypoint: &[&str], cmd: &[&str]) -> RunConfig {
        let strings = |v: &[&str]| Some(v.iter().map(|s| s.to_string()).collect());
        RunConfig {
            entrypoint: strings(entrypoint),
            cmd: strings(cmd),
            env: Some(vec!["PATH=/bin".into(), "A=image".into()]),
            ..Default::default()
        }
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn arguments_execve_cannot_take_are_refused() {
        let image = image(&[], &[]);
        let huge_program = vec!["x".repeat(MAX_PROGRAM_BYTES + 1)];
        assert!(process_args(&huge_program, &[], &image).is_err());
        let huge_arg = vec!["x".repeat(MAX_ARG_BYTES + 1)];
        assert!(process_args(&strings(&["sh", "-c"]), &huge_arg, &image).is_err());
        // A long script as an argument is fine.
        let script = vec!["x".repeat(MAX_PROGRAM_BYTES * 4)];
        assert!(process_args(&strings(&["sh", "-c"]), &script, &image).is_ok());
    }

    #[test]
    fn command_and_args_merge_like_docker() {
        let img = image(&["/entry"], &["cmd-arg"]);
        assert_eq!(
            process_args(&strings(&["/bin/x"]), &strings(&["a"]), &img).unwrap(),
            strings(&["/bin/x", "a"])
        );
        assert_eq!(
            process_args(&strings(&["/bin/x"]), &[], &img).unwrap(),
            strings(&["/bin/x"])
        );
        assert_eq!(
            process_args(&[], &strings(&["a"]), &img).unwrap(),
            strings(&["/entry", "a"])
        );
        assert_eq!(
            process_args(&[], &[], &img).unwrap(),
            strings(&["/entry", "cmd-arg"])
        );
        assert_eq!(
            process_args(&[], &[], &image(&[""], &["sh"])).unwrap(),
            strings(&["sh"])
        );
        assert!(process_args(&[], &[], &image(&[], &[])).is_err());
    }

    #[test]
    fn image_working_dir_and_env_that_runc_cannot_take_are_refused() {
        assert!(check_image_working_dir("").is_ok());
        assert!(check_image_working_dir("/app").is_ok());
        for bad in [
            "app",
            "/a\0b",
            &format!("/{}", "d".repeat(MAX_PROGRAM_BYTES)),
        ] {
            assert!(check_image_working_dir(bad).is_err(), "{bad:?}");
        }
        assert!(check_image_env(&["PATH=/bin".into()]).is_ok());
        let huge = format!("BIG={}", "x".repeat(MAX_ARG_BYTES));
        let err = check_image_env(&["PATH=/bin".into(), huge]).expect_err("huge");
        assert!(err.to_string().contains("\"BIG\""), "{err}");
        assert!(check_image_env(&["A=b\0c".into()]).is_err());
    }

    #[test]
    fn env_values_that_are_not_utf8_lose_only_their_bad_bytes() {
        assert_eq!(env_value(b"plain"), "plain");
        assert_eq!(env_value("caf\u{e9}".as_bytes()), "caf\u{e9}");
        // One replacement per bad byte, as Go's JSON encoder writes them: a lone high
        // byte, a truncated three-byte sequence, an overlong encoding.
        assert_eq!(env_value(b"a\xffb"), "a\u{fffd}b");
        assert_eq!(env_value(b"\xe2\x82z"), "\u{fffd}\u{fffd}z");
        assert_eq!(env_value(b"\xc0\xaf"), "\u{fffd}\u{fffd}");
    }

    #[test]
    fn cri_env_overrides_image_env() {
        let env = merge_env(
            &strings(&["PATH=/bin", "A=image"]),
            &[("A".into(), "cri".into()), ("B".into(), "new".into())],
        );
        assert_eq!(env, strings(&["PATH=/bin", "A=cri", "B=new"]));
    }

    #[test]
    fn spec_joins_the_pod_and_mounts_its_files() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("data");
        std::fs::create_dir(&target).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: "app".into(),
                attempt: 0,
            }),
            command: strings(&["sleep", "1"]),
            envs: vec![KeyValue {
                key: "X".into(),
                value: "1".into(),
            }],
            mounts: vec![CriMount {
                container_path: "/data".into(),
                host_path: link.display().to_string(),
                readonly: true,
                ..Default::default()
            }],
            ..Default::default()
        };
        let pod = PodSandboxConfig::default();
        let img = image(&[], &["sh"]);
        let user = ResolvedUser {
            uid: 1000,
            gid: 1000,
            additional_gids: vec![10],
        };
        let spec = container_spec(&ContainerSpecInput {
            id: "cid",
            namespace: "k8s.io",
            config: &config,
            sandbox_id: "sid",
            sandbox_config: &pod,
            sandbox_pid: 4242,
            target_pid: None,
            image: &img,
            image_name: "busybox",
            user: &user,
            pod_files: PodFiles {
                hosts: Path::new("/r/hosts"),
                hostname: Path::new("/r/hostname"),
                resolv_conf: Path::new("/r/resolv.conf"),
                shm: Path::new("/s/shm"),
            },
            systemd_cgroup: false,
            oom_score_adj: None,
            passthrough_annotations: HashMap::new(),
            hostname: "pod-host",
            privileged_without_host_devices: false,
            userns: None,
            declared_volumes: &[DeclaredVolume {
                container_path: "/var/lib/db".into(),
                host_path: dir.path().to_path_buf(),
            }],
        })
        .unwrap();
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(json["process"]["args"], serde_json::json!(["sleep", "1"]));
        assert_eq!(json["process"]["env"][0], "HOSTNAME=pod-host");
        let volume = json["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == "/var/lib/db")
            .expect("the declared volume is mounted");
        assert_eq!(volume["source"], dir.path().display().to_string());
        assert_eq!(json["process"]["user"]["uid"], 1000);
        assert!(
            json["process"]["env"]
                .as_array()
                .unwrap()
                .contains(&serde_json::json!("X=1"))
        );
        let namespaces = json["linux"]["namespaces"].as_array().unwrap();
        assert!(
            namespaces
                .iter()
                .any(|n| n["type"] == "network" && n["path"] == "/proc/4242/ns/net")
        );
        assert!(
            namespaces
                .iter()
                .any(|n| n["type"] == "pid" && n["path"] == "/proc/4242/ns/pid")
        );
        let mounts = json["mounts"].as_array().unwrap();
        let data = mounts.iter().find(|m| m["destination"] == "/data").unwrap();
        assert_eq!(
            data["source"],
            target.canonicalize().unwrap().display().to_string()
        );
        assert!(
            data["options"]
                .as_array()
                .unwrap()
                .contains(&serde_json::json!("ro"))
        );
        assert!(
            mounts
                .iter()
                .any(|m| m["destination"] == "/etc/hosts" && m["source"] == "/r/hosts")
        );
        assert_eq!(
            json["annotations"]["io.kubernetes.cri.container-name"],
            "app"
        );
        assert!(json.get("hostname").is_none());
        assert!(json["process"].get("rlimits").is_none());
    }

    #[test]
    fn a_missing_host_path_is_an_error() {
        let config = ContainerConfig {
            mounts: vec![CriMount {
                container_path: "/x".into(),
                host_path: "/nonexistent/path".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let err = cri_mounts(&config).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/path"), "{err}");
    }
}
