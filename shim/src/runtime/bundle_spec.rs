//! The parts of a bundle's OCI spec the shim reads (`config.json`), and what they say.

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

/// The annotation naming a container's pod (containerd's CRI and crius set it).
pub const SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
/// `sandbox` on a pod's own spec, `container` on its containers'.
pub const CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";

/// The few parts of a bundle's OCI spec the shim reads.
#[derive(Debug, Default, Deserialize)]
pub struct BundleSpec {
    #[serde(default)]
    pub annotations: HashMap<String, String>,
    #[serde(default)]
    pub hostname: String,
    #[serde(default)]
    pub process: Option<ProcessSpec>,
    #[serde(default)]
    pub linux: Option<LinuxSpec>,
    #[serde(default)]
    pub hooks: Option<HooksSpec>,
}

#[derive(Debug, Default, Deserialize)]
pub struct HooksSpec {
    #[serde(default)]
    pub poststart: Vec<serde_json::Value>,
}

/// What the shim keeps of a container's spec.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct SpecFacts {
    /// The container has a PID namespace of its own.
    pub own_pid_namespace: bool,
    /// The spec has poststart hooks.
    pub poststart_hooks: bool,
    /// The shim holds the pod itself (see `held.rs`).
    pub held_pod: bool,
}

#[derive(Debug, Default, Deserialize)]
pub struct ProcessSpec {
    #[serde(default, rename = "oomScoreAdj")]
    pub oom_score_adj: Option<i32>,
    /// What an exec without its own gets from the container (runc's rule).
    #[serde(default)]
    pub capabilities: Option<serde_json::Value>,
    #[serde(default)]
    pub rlimits: Option<serde_json::Value>,
    #[serde(default, rename = "apparmorProfile")]
    pub apparmor_profile: String,
    #[serde(default, rename = "selinuxLabel")]
    pub selinux_label: String,
    /// What newer runc gives an exec from the container (a umask, a scheduler, an I/O
    /// priority, a CPU affinity): such a container's execs go to runc.
    #[serde(default)]
    pub user: Option<UserSpec>,
    #[serde(default)]
    pub scheduler: Option<serde_json::Value>,
    #[serde(default, rename = "ioPriority")]
    pub io_priority: Option<serde_json::Value>,
    #[serde(default, rename = "execCPUAffinity")]
    pub exec_cpu_affinity: Option<serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
pub struct UserSpec {
    #[serde(default)]
    pub umask: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
pub struct LinuxSpec {
    #[serde(default)]
    pub namespaces: Vec<NamespaceSpec>,
    #[serde(default, rename = "cgroupsPath")]
    pub cgroups_path: String,
    #[serde(default)]
    pub sysctl: HashMap<String, String>,
    #[serde(default)]
    pub resources: Option<ResourcesSpec>,
    #[serde(default)]
    pub seccomp: Option<serde_json::Value>,
    #[serde(default)]
    pub personality: Option<serde_json::Value>,
    #[serde(default, rename = "intelRdt")]
    pub intel_rdt: Option<serde_json::Value>,
    #[serde(default, rename = "mountLabel")]
    pub mount_label: String,
    #[serde(default, rename = "uidMappings")]
    pub uid_mappings: Vec<serde_json::Value>,
    #[serde(default, rename = "timeOffsets")]
    pub time_offsets: Option<serde_json::Value>,
    #[serde(default, rename = "memoryPolicy")]
    pub memory_policy: Option<serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ResourcesSpec {
    #[serde(default)]
    pub cpu: Option<CpuSpec>,
}

#[derive(Debug, Default, Deserialize)]
pub struct CpuSpec {
    #[serde(default)]
    pub shares: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct NamespaceSpec {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub path: String,
}

/// The largest config.json the shim reads.
const MAX_SPEC: u64 = 16 << 20;

impl BundleSpec {
    pub fn read(bundle: &Path) -> std::io::Result<Self> {
        use std::io::Read;
        let mut text = Vec::new();
        std::fs::File::open(bundle.join("config.json"))?
            .take(MAX_SPEC)
            .read_to_end(&mut text)?;
        serde_json::from_slice(&text).map_err(std::io::Error::other)
    }

    pub fn facts(&self) -> SpecFacts {
        SpecFacts {
            own_pid_namespace: self.own_pid_namespace(),
            poststart_hooks: self.hooks.as_ref().is_some_and(|h| !h.poststart.is_empty()),
            held_pod: false,
        }
    }

    /// Whether the container has nothing an exec into it needs runc for: no seccomp
    /// filter, user or time namespace, personality, Intel RDT, AppArmor profile or SELinux
    /// label (runc gives an exec the container's when its own spec has none), and none of
    /// what newer runc gives execs from the container (a umask, a scheduler, an I/O
    /// priority, a CPU affinity, a memory policy).
    pub fn plain_for_exec(&self) -> bool {
        let runc_only = self.process.as_ref().is_some_and(|p| {
            !p.apparmor_profile.is_empty()
                || !p.selinux_label.is_empty()
                || p.user.as_ref().is_some_and(|u| u.umask.is_some())
                || p.scheduler.is_some()
                || p.io_priority.is_some()
                || p.exec_cpu_affinity.is_some()
        });
        if runc_only {
            return false;
        }
        let Some(linux) = &self.linux else {
            return true;
        };
        let own_namespace = |kind: &str| linux.namespaces.iter().any(|n| n.kind == kind);
        linux.seccomp.is_none()
            && linux.personality.is_none()
            && linux.intel_rdt.is_none()
            && linux.mount_label.is_empty()
            && linux.uid_mappings.is_empty()
            && linux.time_offsets.is_none()
            && linux.memory_policy.is_none()
            && !own_namespace("user")
            && !own_namespace("time")
    }

    pub fn own_pid_namespace(&self) -> bool {
        self.linux.as_ref().is_some_and(|l| {
            l.namespaces
                .iter()
                .any(|n| n.kind == "pid" && n.path.is_empty())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_joined_pid_namespace_is_not_the_containers_own() {
        let own: BundleSpec = serde_json::from_str(
            r#"{"ociVersion":"1.0.2","linux":{"namespaces":[{"type":"pid"},{"type":"mount"}]}}"#,
        )
        .expect("spec");
        assert!(own.own_pid_namespace());
        let joined: BundleSpec = serde_json::from_str(
            r#"{"linux":{"namespaces":[{"type":"pid","path":"/proc/1/ns/pid"}]}}"#,
        )
        .expect("spec");
        assert!(!joined.own_pid_namespace());
        let host: BundleSpec = serde_json::from_str(r#"{"linux":{}}"#).expect("spec");
        assert!(!host.own_pid_namespace());
    }

    #[test]
    fn poststart_hooks_are_noticed() {
        let hooked: BundleSpec =
            serde_json::from_str(r#"{"hooks":{"prestart":[],"poststart":[{"path":"/bin/true"}]}}"#)
                .expect("spec");
        assert!(hooked.facts().poststart_hooks);
        let other: BundleSpec =
            serde_json::from_str(r#"{"hooks":{"createRuntime":[{"path":"/bin/true"}]}}"#)
                .expect("spec");
        assert!(!other.facts().poststart_hooks);
        assert_eq!(BundleSpec::default().facts(), SpecFacts::default());
    }
}
