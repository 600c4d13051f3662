//! OCI runtime specs for sandboxes (here) and containers (`container`), built the way
//! containerd's CRI builds them: containerd's default Linux spec, then the CRI config on top,
//! one step per concern, with the steps both share in `builder`.
//!
//! Nothing here touches the filesystem or containerd: inputs in, a `Spec` out.

pub mod annotations;
pub mod builder;
pub mod container;
pub mod features;
pub mod seccomp;
pub mod security;
pub mod user;

use std::collections::HashMap;
use std::path::PathBuf;

use crate::api::v1::{NamespaceMode, PodSandboxConfig};
use oci_spec::runtime::{
    Capabilities, Capability, LinuxBuilder, LinuxCpuBuilder, LinuxNamespaceType,
    LinuxResourcesBuilder, Mount, MountBuilder, ProcessBuilder, Spec,
};

use crate::imagespec::manifest::RunConfig;

/// The type URL containerd stores runtime specs under.
pub const SPEC_TYPE_URL: &str = "types.containerd.io/opencontainers/runtime-spec/1/Spec";
/// The runtime spec version crius writes.
pub const OCI_VERSION: &str = "1.0.2-dev";
/// The OOM score adjustment kubelet gives pod sandboxes.
pub const SANDBOX_OOM_SCORE_ADJ: i32 = -998;
/// CPU shares of the pause container (containerd's default).
const SANDBOX_CPU_SHARES: u64 = 2;

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("{0}")]
    Invalid(String),
    #[error("building the runtime spec: {0}")]
    Oci(#[from] oci_spec::OciSpecError),
}

/// containerd's default capability set.
pub fn default_capabilities() -> Capabilities {
    [
        Capability::Chown,
        Capability::DacOverride,
        Capability::Fsetid,
        Capability::Fowner,
        Capability::Mknod,
        Capability::NetRaw,
        Capability::Setgid,
        Capability::Setuid,
        Capability::Setfcap,
        Capability::Setpcap,
        Capability::NetBindService,
        Capability::SysChroot,
        Capability::Kill,
        Capability::AuditWrite,
    ]
    .into_iter()
    .collect()
}

fn mount(destination: &str, typ: &str, source: &str, options: &[&str]) -> Result<Mount, SpecError> {
    Ok(MountBuilder::default()
        .destination(PathBuf::from(destination))
        .typ(typ)
        .source(PathBuf::from(source))
        .options(options.iter().map(|o| o.to_string()).collect::<Vec<_>>())
        .build()?)
}

/// containerd's default mounts, without `/run` (CRI drops it).
fn default_mounts() -> Result<Vec<Mount>, SpecError> {
    Ok(vec![
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"])?,
        mount(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        )?,
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
                "gid=5",
            ],
        )?,
        mount(
            "/dev/shm",
            "tmpfs",
            "shm",
            &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        )?,
        mount(
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            &["nosuid", "noexec", "nodev"],
        )?,
        mount(
            "/sys",
            "sysfs",
            "sysfs",
            &["nosuid", "noexec", "nodev", "ro"],
        )?,
    ])
}

const MASKED_PATHS: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/sys/firmware",
    "/proc/scsi",
];

const READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The cgroup path for `id` under `parent`: `parent/id` for cgroupfs, `slice:cri-containerd:id`
/// for systemd. An empty parent gives containerd's default, `/<namespace>/<id>`.
pub fn cgroups_path(parent: &str, id: &str, namespace: &str, systemd: bool) -> String {
    if parent.is_empty() {
        return format!("/{namespace}/{id}");
    }
    if systemd {
        let slice = parent.rsplit('/').next().unwrap_or(parent);
        format!("{slice}:cri-containerd:{id}")
    } else {
        format!("{}/{id}", parent.trim_end_matches('/'))
    }
}

/// Everything the pause container's spec is made from.
pub struct SandboxSpecInput<'a> {
    pub id: &'a str,
    pub namespace: &'a str,
    pub config: &'a PodSandboxConfig,
    pub image: &'a RunConfig,
    /// The pod's pinned netns; `None` when the pod uses the host's network.
    pub netns_path: Option<&'a str>,
    /// The pod's /dev/shm (the host's when the pod uses the host's IPC).
    pub shm_path: &'a str,
    pub resolv_conf_path: &'a str,
    /// Already clamped to what crius may set.
    pub oom_score_adj: i32,
    pub systemd_cgroup: bool,
    /// Pod annotations the runtime handler passes through.
    pub passthrough_annotations: HashMap<String, String>,
    /// The pod's own user namespace, when it has one.
    pub userns: Option<builder::PodUserNamespace<'a>>,
}

/// The pause container's spec: one step per concern, shared with containers where they
/// agree (`builder`).
pub fn sandbox_spec(input: &SandboxSpecInput<'_>) -> Result<Spec, SpecError> {
    let config = input.config;
    let linux = config.linux.clone().unwrap_or_default();
    let security = linux.security_context.clone().unwrap_or_default();
    let ns = security.namespace_options.clone().unwrap_or_default();
    let host_network = ns.network == NamespaceMode::Node as i32;
    security::validate_sysctls(
        &linux.sysctls,
        host_network,
        ns.ipc == NamespaceMode::Node as i32,
    )?;
    let caps = default_capabilities();
    let (masked, readonly) = builder::masked_and_readonly_paths(false, &[], &[]);
    let mut linux_spec = LinuxBuilder::default()
        .namespaces(sandbox_namespaces(&ns, input.netns_path)?)
        .cgroups_path(PathBuf::from(cgroups_path(
            &linux.cgroup_parent,
            input.id,
            input.namespace,
            input.systemd_cgroup,
        )))
        .resources(sandbox_resources()?)
        .sysctl(linux.sysctls.clone())
        .masked_paths(masked)
        .readonly_paths(readonly)
        .build()?;
    linux_spec.set_seccomp(seccomp::select(
        security.seccomp.as_ref(),
        #[allow(deprecated)]
        &security.seccomp_profile_path,
        security.privileged,
        &caps,
    )?);

    let metadata = config.metadata.clone().unwrap_or_default();
    let mut annotations = builder::pod_annotations(
        &input.passthrough_annotations,
        annotations::CONTAINER_TYPE_SANDBOX,
        input.id,
        &metadata,
    );
    annotations.insert(
        annotations::SANDBOX_LOG_DIRECTORY.to_string(),
        config.log_directory.clone(),
    );
    let mut spec = builder::assemble(builder::SpecParts {
        readonly_rootfs: true,
        process: sandbox_process(input, &security, &caps)?,
        mounts: sandbox_mounts(input)?,
        linux: linux_spec,
        annotations,
        // A pod with its own network has its own UTS namespace and hostname.
        hostname: (!host_network && !config.hostname.is_empty()).then(|| config.hostname.clone()),
    })?;
    if let Some(userns) = &input.userns {
        builder::join_user_namespace(&mut spec, userns)?;
    }
    Ok(spec)
}

/// The pause process: the image's command as the pod's user, default capabilities.
fn sandbox_process(
    input: &SandboxSpecInput<'_>,
    security: &crate::api::v1::LinuxSandboxSecurityContext,
    caps: &Capabilities,
) -> Result<oci_spec::runtime::Process, SpecError> {
    let mut args: Vec<String> = input.image.entrypoint.clone().unwrap_or_default();
    args.extend(input.image.cmd.clone().unwrap_or_default());
    if args.is_empty() {
        return Err(SpecError::Invalid(
            "the sandbox image has neither an entrypoint nor a command".to_string(),
        ));
    }
    let (uid, gid) = user_ids(
        security.run_as_user.as_ref().map(|v| v.value),
        security.run_as_group.as_ref().map(|v| v.value),
    )?;
    let additional_gids = sandbox_gids(
        gid,
        security.run_as_user.is_some(),
        &security.supplemental_groups,
    );
    let cwd = if input.image.working_dir.is_empty() {
        "/".to_string()
    } else {
        input.image.working_dir.clone()
    };
    let process = ProcessBuilder::default()
        .terminal(false)
        .user(builder::user(uid, gid, additional_gids)?)
        .args(args)
        .env(input.image.env.clone().unwrap_or_default())
        .cwd(cwd)
        .capabilities(builder::capability_sets(caps, &Capabilities::new())?)
        .no_new_privileges(true)
        .oom_score_adj(input.oom_score_adj)
        .build()?;
    Ok(builder::without_rlimits(process))
}

/// The namespaces the pause process creates (and holds for the pod); the network one is
/// the pinned netns.
fn sandbox_namespaces(
    ns: &crate::api::v1::NamespaceOption,
    netns_path: Option<&str>,
) -> Result<Vec<oci_spec::runtime::LinuxNamespace>, SpecError> {
    let mut namespaces = vec![builder::namespace(LinuxNamespaceType::Mount, None)?];
    if ns.pid != NamespaceMode::Node as i32 {
        namespaces.push(builder::namespace(LinuxNamespaceType::Pid, None)?);
    }
    if ns.ipc != NamespaceMode::Node as i32 {
        namespaces.push(builder::namespace(LinuxNamespaceType::Ipc, None)?);
    }
    if let (false, Some(path)) = (ns.network == NamespaceMode::Node as i32, netns_path) {
        namespaces.push(builder::namespace(
            LinuxNamespaceType::Network,
            Some(PathBuf::from(path)),
        )?);
        namespaces.push(builder::namespace(LinuxNamespaceType::Uts, None)?);
    }
    Ok(namespaces)
}

/// The pod's /dev/shm and resolv.conf, read-only for the pause process.
fn sandbox_mounts(input: &SandboxSpecInput<'_>) -> Result<Vec<Mount>, SpecError> {
    let mut mounts = builder::base_mounts()?;
    mounts.push(mount(
        "/dev/shm",
        "bind",
        input.shm_path,
        &["rbind", "ro", "nosuid", "nodev", "noexec"],
    )?);
    mounts.push(mount(
        "/etc/resolv.conf",
        "bind",
        input.resolv_conf_path,
        &["rbind", "ro"],
    )?);
    Ok(mounts)
}

/// No devices, and containerd's CPU shares for the pause container.
fn sandbox_resources() -> Result<oci_spec::runtime::LinuxResources, SpecError> {
    Ok(LinuxResourcesBuilder::default()
        .devices(vec![builder::deny_all_devices()?])
        .cpu(
            LinuxCpuBuilder::default()
                .shares(SANDBOX_CPU_SHARES)
                .build()?,
        )
        .build()?)
}

/// The pause process's supplementary groups as containerd makes them: the pod's groups
/// (ascending, each once), and the primary group in front when the pod names a user.
fn sandbox_gids(gid: u32, user_named: bool, supplemental: &[i64]) -> Vec<u32> {
    let mut gids: Vec<u32> = supplemental
        .iter()
        .filter_map(|g| u32::try_from(*g).ok())
        .collect::<std::collections::BTreeSet<u32>>()
        .into_iter()
        .collect();
    if user_named && !gids.contains(&gid) {
        gids.insert(0, gid);
    }
    gids
}

/// The uid and gid a process runs as; a group without a user is an error, as in the CRI.
pub fn user_ids(
    run_as_user: Option<i64>,
    run_as_group: Option<i64>,
) -> Result<(u32, u32), SpecError> {
    let to_id = |v: i64, what: &str| {
        u32::try_from(v).map_err(|_| SpecError::Invalid(format!("{what} {v} is out of range")))
    };
    match (run_as_user, run_as_group) {
        (None, Some(_)) => Err(SpecError::Invalid(
            "run_as_group is set without run_as_user".to_string(),
        )),
        (None, None) => Ok((0, 0)),
        (Some(uid), None) => Ok((to_id(uid, "run_as_user")?, 0)),
        (Some(uid), Some(gid)) => Ok((to_id(uid, "run_as_user")?, to_id(gid, "run_as_group")?)),
    }
}

/// Encodes a spec for a containerd container record.
pub fn to_any(spec: &Spec) -> Result<prost_types::Any, SpecError> {
    let value = serde_json::to_vec(spec)
        .map_err(|e| SpecError::Invalid(format!("serializing the runtime spec: {e}")))?;
    Ok(prost_types::Any {
        type_url: SPEC_TYPE_URL.to_string(),
        value,
    })
}

/// The pod annotations whose keys match one of `patterns` (`*` is a wildcard).
pub fn passthrough_annotations(
    annotations: &HashMap<String, String>,
    patterns: &[String],
) -> HashMap<String, String> {
    annotations
        .iter()
        .filter(|(key, _)| patterns.iter().any(|p| glob_match(p, key)))
        .filter(|(key, _)| !annotations::CRIUS_MARKS.contains(&key.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Whether `text` matches `pattern`, where `*` matches any run of characters. Linear in the
/// text for each star (the classic backtracking-to-the-last-star walk), so a pattern of many
/// stars cannot make it exponential, and it works on characters, not bytes.
fn glob_match(pattern: &str, text: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let text: Vec<char> = text.chars().collect();
    let (mut p, mut t) = (0, 0);
    let mut last_star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == '*' {
            last_star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((star, matched)) = last_star {
            // Let the last star swallow one more character and try again from there.
            p = star + 1;
            t = matched + 1;
            last_star = Some((star, matched + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_pause_process_has_its_primary_group_only_when_the_pod_names_a_user() {
        assert_eq!(sandbox_gids(0, false, &[7, 5, 7]), [5, 7]);
        assert_eq!(sandbox_gids(3, true, &[7, 5]), [3, 5, 7]);
        assert_eq!(sandbox_gids(5, true, &[7, 5]), [5, 7]);
        assert_eq!(sandbox_gids(9, true, &[7, 5]), [9, 5, 7]);
        assert!(sandbox_gids(0, false, &[-1]).is_empty());
    }

    use super::*;

    #[test]
    fn globs_match_by_characters_and_stay_fast_with_many_stars() {
        assert!(glob_match("io.kubernetes.*", "io.kubernetes.cri.x"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(!glob_match("a*b*c", "aXXbYY"));
        assert!(glob_match("é*ü", "éabcü"));
        assert!(!glob_match("ab", "äb"));
        // Non-ASCII text against a prefix that ends inside a character must not panic.
        assert!(!glob_match("a*\u{fc}x", "aü"));
        let stars = "*a".repeat(30) + "*b";
        let text = "a".repeat(5000);
        let started = std::time::Instant::now();
        assert!(!glob_match(&stars, &text));
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
    }

    #[test]
    fn crius_marks_are_never_passed_through() {
        let annotations = HashMap::from([
            (annotations::SANDBOX_HOLDER.to_string(), "true".to_string()),
            (
                annotations::EXEC_WITH_RUNTIME.to_string(),
                "true".to_string(),
            ),
            ("io.crius.other".to_string(), "x".to_string()),
        ]);
        let passed = passthrough_annotations(&annotations, &["*".to_string()]);
        assert_eq!(
            passed,
            HashMap::from([("io.crius.other".to_string(), "x".to_string())])
        );
    }
    use crate::api::v1::{
        Int64Value, LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceOption,
        PodSandboxMetadata,
    };

    fn pod(host_network: bool) -> PodSandboxConfig {
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: "web".into(),
                namespace: "default".into(),
                uid: "uid-1".into(),
                attempt: 0,
            }),
            hostname: "web-host".into(),
            log_directory: "/var/log/pods/x".into(),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: "/kubepods/pod1".into(),
                sysctls: [("net.ipv4.ip_forward".to_string(), "1".to_string())].into(),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: if host_network {
                            NamespaceMode::Node as i32
                        } else {
                            NamespaceMode::Pod as i32
                        },
                        ..Default::default()
                    }),
                    run_as_user: Some(Int64Value { value: 65535 }),
                    supplemental_groups: vec![5],
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn input<'a>(config: &'a PodSandboxConfig, image: &'a RunConfig) -> SandboxSpecInput<'a> {
        SandboxSpecInput {
            id: "abc",
            namespace: "k8s.io",
            config,
            image,
            netns_path: Some("/var/run/netns/cni-1"),
            shm_path: "/run/crius/sandboxes/abc/shm",
            resolv_conf_path: "/var/lib/crius/sandboxes/abc/resolv.conf",
            oom_score_adj: -998,
            systemd_cgroup: false,
            passthrough_annotations: HashMap::new(),
            userns: None,
        }
    }

    #[test]
    fn a_pod_user_namespace_is_joined_with_its_mappings_and_idmapped_rootfs() {
        let config = pod(false);
        let image = RunConfig {
            cmd: Some(vec!["/pause".to_string()]),
            ..Default::default()
        };
        let mappings = crate::sys::userns::Mappings::from_zero(100000, 65536);
        let mut input = input(&config, &image);
        input.userns = Some(builder::PodUserNamespace {
            path: std::path::Path::new("/run/crius/sandboxes/abc/userns"),
            mappings: &mappings,
            rootfs: Some(std::path::Path::new("/run/crius/rootfs/abc")),
            host_network: false,
        });
        let spec = sandbox_spec(&input).unwrap();
        let linux = spec.linux().as_ref().unwrap();
        let namespaces = linux.namespaces().as_ref().unwrap();
        assert_eq!(namespaces[0].typ(), LinuxNamespaceType::User);
        assert_eq!(
            namespaces[0].path().as_deref(),
            Some(std::path::Path::new("/run/crius/sandboxes/abc/userns"))
        );
        let uids = linux.uid_mappings().as_ref().unwrap();
        assert_eq!(
            (uids[0].container_id(), uids[0].host_id(), uids[0].size()),
            (0, 100000, 65536)
        );
        assert_eq!(linux.gid_mappings().as_ref().unwrap().len(), 1);
        assert_eq!(
            spec.root().as_ref().unwrap().path(),
            std::path::Path::new("/run/crius/rootfs/abc")
        );
        let sys = |spec: &Spec| {
            spec.mounts()
                .iter()
                .flatten()
                .find(|m| m.destination() == std::path::Path::new("/sys"))
                .and_then(|m| m.typ().clone())
        };
        assert_eq!(sys(&spec).as_deref(), Some("sysfs"));

        // On the host's network, the host's /sys is bound instead of a new sysfs.
        if let Some(userns) = input.userns.as_mut() {
            userns.host_network = true;
        }
        let spec = sandbox_spec(&input).unwrap();
        assert_eq!(sys(&spec).as_deref(), Some("bind"));
        let options = spec
            .mounts()
            .iter()
            .flatten()
            .find(|m| m.destination() == std::path::Path::new("/sys"))
            .and_then(|m| m.options().clone())
            .unwrap_or_default();
        assert!(options.iter().any(|o| o == "rro"), "{options:?}");
    }

    #[test]
    fn pause_spec_has_the_pod_namespaces_mounts_and_annotations() {
        let config = pod(false);
        let image = RunConfig {
            entrypoint: Some(vec!["/pause".into()]),
            ..Default::default()
        };
        let spec = sandbox_spec(&input(&config, &image)).unwrap();
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(json["process"]["args"], serde_json::json!(["/pause"]));
        assert_eq!(json["process"]["user"]["uid"], 65535);
        // The pod names a user: its primary group (0) is a supplementary group too.
        assert_eq!(
            json["process"]["user"]["additionalGids"],
            serde_json::json!([0, 5])
        );
        assert_eq!(json["process"]["oomScoreAdj"], -998);
        assert_eq!(json["hostname"], "web-host");
        assert_eq!(json["root"]["readonly"], true);
        assert_eq!(json["linux"]["cgroupsPath"], "/kubepods/pod1/abc");
        assert_eq!(json["linux"]["resources"]["cpu"]["shares"], 2);
        assert_eq!(json["linux"]["sysctl"]["net.ipv4.ip_forward"], "1");
        let namespaces = json["linux"]["namespaces"].as_array().unwrap();
        assert!(
            namespaces
                .iter()
                .any(|n| n["type"] == "network" && n["path"] == "/var/run/netns/cni-1")
        );
        assert!(namespaces.iter().any(|n| n["type"] == "uts"));
        let shm = json["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["destination"] == "/dev/shm")
            .collect::<Vec<_>>();
        assert_eq!(shm.len(), 1);
        assert_eq!(shm[0]["source"], "/run/crius/sandboxes/abc/shm");
        assert_eq!(
            json["annotations"]["io.kubernetes.cri.container-type"],
            "sandbox"
        );
        assert_eq!(
            json["annotations"]["io.kubernetes.cri.sandbox-namespace"],
            "default"
        );
    }

    #[test]
    fn host_network_drops_network_and_uts_namespaces_and_hostname() {
        let mut config = pod(true);
        let err = sandbox_spec(&input(
            &config,
            &RunConfig {
                cmd: Some(vec!["/pause".into()]),
                ..Default::default()
            },
        ))
        .unwrap_err();
        assert!(err.to_string().contains("host's network"), "{err}");
        config.linux.as_mut().unwrap().sysctls.clear();
        let image = RunConfig {
            cmd: Some(vec!["/pause".into()]),
            ..Default::default()
        };
        let mut inp = input(&config, &image);
        inp.netns_path = None;
        let json = serde_json::to_value(sandbox_spec(&inp).unwrap()).unwrap();
        let namespaces = json["linux"]["namespaces"].as_array().unwrap();
        assert!(
            !namespaces
                .iter()
                .any(|n| n["type"] == "network" || n["type"] == "uts")
        );
        assert!(json.get("hostname").is_none());
    }

    #[test]
    fn users_groups_and_globs() {
        assert!(user_ids(None, Some(5)).is_err());
        assert_eq!(user_ids(Some(1000), Some(2000)).unwrap(), (1000, 2000));
        assert!(user_ids(Some(-1), None).is_err());
        assert!(glob_match(
            "io.katacontainers.*",
            "io.katacontainers.config"
        ));
        assert!(glob_match("*", "anything"));
        assert!(!glob_match("a.*.c", "a.b.d"));
        assert!(glob_match("a.*.c", "a.b.c"));
        assert_eq!(cgroups_path("", "id", "k8s.io", false), "/k8s.io/id");
        assert_eq!(
            cgroups_path("kubepods-pod1.slice", "id", "k8s.io", true),
            "kubepods-pod1.slice:cri-containerd:id"
        );
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    /// The obvious recursive matcher, for short inputs only.
    fn reference_match(pattern: &[char], text: &[char]) -> bool {
        match pattern.split_first() {
            None => text.is_empty(),
            Some(('*', rest)) => (0..=text.len()).any(|i| reference_match(rest, &text[i..])),
            Some((c, rest)) => text.first() == Some(c) && reference_match(rest, &text[1..]),
        }
    }

    proptest! {
        #![proptest_config(crate::fuzz_config())]

        #[test]
        fn the_glob_agrees_with_the_obvious_matcher(pattern in "[ab*é]{0,8}", text in "[abé]{0,10}") {
            let p: Vec<char> = pattern.chars().collect();
            let t: Vec<char> = text.chars().collect();
            prop_assert_eq!(glob_match(&pattern, &text), reference_match(&p, &t));
        }

        #[test]
        fn any_pattern_and_text_match_without_panicking(pattern in "\\PC{0,40}", text in "\\PC{0,80}") {
            let _ = glob_match(&pattern, &text);
        }
    }
}
