//! A pod sandbox the shim holds itself on the task API, for crius: where crius marks a
//! sandbox's spec, the shim starts the pod's holder (see `holder.rs`) in place of runc
//! running a pause container. The holder gets the spec's namespaces, hostname, sysctls,
//! OOM score and cgroup; it has no rootfs, no stdio and runs no image. A runc create, kill
//! and delete and a rootfs snapshot per pod are saved (the holder takes the pause
//! process's place).
//!
//! The shim writes `crius-holder.json` in the bundle (the cgroup before the holder is
//! spawned, its pid and start time after), so that `shim delete`, which containerd runs
//! when the shim is gone, can end a holder the shim left behind.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::ShimError;
use crate::pod::holder::Namespaces;
use crate::runtime::bundle_spec::BundleSpec;
use crate::runtime::bundle_spec::{CONTAINER_TYPE, SANDBOX_ID};

/// The annotation crius sets on a sandbox spec it wants held (and removes otherwise).
const HOLDER_ANNOTATION: &str = "io.crius.sandbox-holder";
/// What `shim delete` reads to end a holder left behind.
const HOLDER_FILE: &str = "crius-holder.json";
/// Largest holder record read.
const MAX_RECORD: u64 = 64 * 1024;
/// Longest spec hostname taken (the kernel's limit).
const MAX_HOSTNAME: usize = 64;

/// What holding a pod takes, from its spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldPod {
    pub namespaces: Namespaces,
    /// The holder's cgroup, relative to each hierarchy's root.
    pub cgroup_path: Option<String>,
    pub cpu_shares: Option<u64>,
    pub oom_score_adj: Option<i32>,
}

/// The record `shim delete` reads.
#[derive(Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
struct HolderRecord {
    #[serde(default)]
    cgroup_path: Option<String>,
    #[serde(default)]
    pid: i32,
    /// The holder's start time (field 22 of /proc/<pid>/stat): a pid reused since is not it.
    #[serde(default)]
    start_time: u64,
}

impl HeldPod {
    /// The pod to hold when `spec` is a sandbox crius marked for it; None otherwise. A
    /// marked spec the holder cannot honour (a user namespace, a namespace to join other
    /// than the network, a systemd cgroup) is refused rather than run differently.
    pub fn from_spec(id: &str, spec: &BundleSpec) -> Result<Option<Self>, ShimError> {
        if spec.annotations.get(HOLDER_ANNOTATION).map(String::as_str) != Some("true") {
            return Ok(None);
        }
        let refuse = |why: &str| ShimError::InvalidArgument(format!("held pod {id}: {why}"));
        if spec.annotations.get(CONTAINER_TYPE).map(String::as_str) != Some("sandbox")
            || spec.annotations.get(SANDBOX_ID).map(String::as_str) != Some(id)
        {
            return Err(refuse("only a pod's own sandbox is held"));
        }
        let linux = spec
            .linux
            .as_ref()
            .ok_or_else(|| refuse("no linux section"))?;
        let mut namespaces = Namespaces::default();
        for ns in &linux.namespaces {
            let joins = !ns.path.is_empty();
            match ns.kind.as_str() {
                "network" if joins => namespaces.netns = Some(PathBuf::from(&ns.path)),
                "pid" if !joins => namespaces.pid = true,
                "ipc" if !joins => namespaces.ipc = true,
                "uts" if !joins => namespaces.uts = true,
                // The holder has a mount namespace of its own anyway; a cgroup namespace
                // would hide nothing from a process that runs no code of the pod's.
                "mount" | "cgroup" if !joins => {}
                other => return Err(refuse(&format!("cannot hold a {other} namespace here"))),
            }
        }
        if namespaces.uts {
            if spec.hostname.len() > MAX_HOSTNAME || spec.hostname.contains('\0') {
                return Err(refuse("hostname too long"));
            }
            namespaces.hostname = spec.hostname.clone();
        }
        let mut sysctls: Vec<_> = linux.sysctl.iter().collect();
        sysctls.sort();
        for (name, value) in sysctls {
            let path = crate::pod::sysctl_path(name, value, &namespaces)
                .map_err(|e| refuse(&e.to_string()))?;
            namespaces.sysctls.push((path, value.clone()));
        }
        let cgroup_path = cgroup_path(&linux.cgroups_path).map_err(|why| refuse(&why))?;
        // crius names a pod's cgroup after it; `shim delete` relies on that.
        if cgroup_path
            .as_ref()
            .is_some_and(|p| Path::new(p).file_name().is_none_or(|name| name != id))
        {
            return Err(refuse("its cgroup is not named after it"));
        }
        Ok(Some(Self {
            namespaces,
            cgroup_path,
            cpu_shares: linux
                .resources
                .as_ref()
                .and_then(|r| r.cpu.as_ref())
                .and_then(|c| c.shares),
            oom_score_adj: spec.process.as_ref().and_then(|p| p.oom_score_adj),
        }))
    }

    /// Spawns the holder (blocking: call off the async threads) in its cgroup, made first,
    /// and sets its OOM score; returns its pid and cgroup. The record for `shim delete`
    /// names the cgroup before the spawn and the holder after it. The caller holds a
    /// [`crate::task::shim::Starting`] so an early exit is kept for it.
    pub fn spawn(&self, bundle: &Path) -> Result<(i32, Option<cgroups_rs::fs::Cgroup>), ShimError> {
        let mut record = HolderRecord {
            cgroup_path: self.cgroup_path.clone(),
            ..Default::default()
        };
        write_record(bundle, &record)?;
        let cgroup = self.make_cgroup()?;
        let procs = match cgroup.as_ref().map(cgroup_procs_files).transpose() {
            Ok(procs) => procs.unwrap_or_default(),
            Err(e) => {
                self.remove(cgroup.as_ref());
                return Err(e);
            }
        };
        let pid = match crate::pod::holder::spawn(&self.namespaces, procs) {
            Ok(pid) => pid,
            Err(e) => {
                self.remove(cgroup.as_ref());
                return Err(e);
            }
        };
        record.pid = pid;
        record.start_time = start_time(pid).unwrap_or(0);
        let recorded = write_record(bundle, &record).and_then(|()| self.set_oom_score_adj(pid));
        if let Err(e) = recorded {
            // Reaped by the shim's reaper, which sees its exit.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            self.remove(cgroup.as_ref());
            return Err(e);
        }
        Ok((pid, cgroup))
    }

    fn remove(&self, cgroup: Option<&cgroups_rs::fs::Cgroup>) {
        if let (Some(cgroup), Some(path)) = (cgroup, &self.cgroup_path) {
            remove_cgroup(cgroup, path);
        }
    }

    fn set_oom_score_adj(&self, pid: i32) -> Result<(), ShimError> {
        let Some(score) = self.oom_score_adj else {
            return Ok(());
        };
        let path = format!("/proc/{pid}/oom_score_adj");
        std::fs::write(&path, score.to_string())
            .map_err(|e| ShimError::io(format!("write {path}"), e))
    }

    /// Makes the holder's cgroup in every hierarchy with the spec's CPU shares, as runc
    /// does a pause container's.
    fn make_cgroup(&self) -> Result<Option<cgroups_rs::fs::Cgroup>, ShimError> {
        let Some(path) = &self.cgroup_path else {
            return Ok(None);
        };
        let cgroup = cgroups_rs::fs::Cgroup::new(cgroups_rs::fs::hierarchies::auto(), path)
            .map_err(|e| ShimError::Internal(format!("the pod holder's cgroup {path}: {e}")))?;
        // Best effort: the holder uses no CPU to speak of.
        if let Some(shares) = self.cpu_shares
            && let Some(cpu) = cgroup.controller_of::<cgroups_rs::fs::cpu::CpuController>()
        {
            let value = if cgroup.v2() {
                shares_to_weight(shares)
            } else {
                shares
            };
            if let Err(e) = cpu.set_shares(value) {
                log::warn!("the pod holder's CPU shares in {path}: {e}");
            }
        }
        Ok(Some(cgroup))
    }
}

/// The `cgroup.procs` file of `cgroup` in each of its hierarchies, open for writing.
fn cgroup_procs_files(cgroup: &cgroups_rs::fs::Cgroup) -> Result<Vec<OwnedFd>, ShimError> {
    let mut dirs: Vec<PathBuf> = cgroup
        .subsystems()
        .iter()
        .map(|s| s.to_controller().path().to_path_buf())
        .collect();
    dirs.sort();
    dirs.dedup();
    dirs.into_iter()
        .map(|dir| {
            let path = dir.join("cgroup.procs");
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .map(OwnedFd::from)
                .map_err(|e| ShimError::io(format!("open {}", path.display()), e))
        })
        .collect()
}

/// cgroup v2's `cpu.weight` for v1 CPU shares, as runc converts them.
fn shares_to_weight(shares: u64) -> u64 {
    let shares = shares.clamp(2, 262_144);
    1 + ((shares - 2) * 9999) / 262_142
}

/// The holder's cgroup from the spec's `cgroupsPath`: a cgroupfs path below the root
/// (runc's systemd form, `slice:prefix:name`, is refused: only systemd may make those).
fn cgroup_path(spec_path: &str) -> Result<Option<String>, String> {
    let path = spec_path.trim_matches('/');
    if path.is_empty() {
        return Ok(None);
    }
    if !crate::pod::is_cgroup_path(path, 4096, false) {
        return Err(format!("cgroups path {spec_path:?} is not a cgroupfs path"));
    }
    Ok(Some(path.to_string()))
}

fn write_record(bundle: &Path, record: &HolderRecord) -> Result<(), ShimError> {
    let path = bundle.join(HOLDER_FILE);
    let temp = bundle.join(".crius-holder.json.tmp");
    let text = serde_json::to_vec(record).map_err(|e| ShimError::Internal(e.to_string()))?;
    std::fs::write(&temp, text)
        .and_then(|()| std::fs::rename(&temp, &path))
        .map_err(|e| ShimError::io(format!("write {}", path.display()), e))
}

/// The record the shim wrote (a few hundred bytes; more is not its).
fn read_record(bundle: &Path) -> Option<HolderRecord> {
    use std::io::Read;
    let mut text = Vec::new();
    std::fs::File::open(bundle.join(HOLDER_FILE))
        .ok()?
        .take(MAX_RECORD)
        .read_to_end(&mut text)
        .ok()?;
    serde_json::from_slice(&text).ok()
}

/// A process's start time in clock ticks since boot (field 22 of its stat file).
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields count from its last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the bundle is a held pod's (a `shim delete` that finds one ends its holder).
pub fn is_held_bundle(bundle: &Path) -> bool {
    bundle.join(HOLDER_FILE).exists()
}

/// For `shim delete`: ends the holder the record names, if it is still that process, and
/// everything left in its cgroup, then removes the cgroup. Returns the holder's pid.
pub fn end_left_holder(bundle: &Path, id: &str) -> i32 {
    let record: HolderRecord = read_record(bundle).unwrap_or_default();
    if record.pid > 0 && start_time(record.pid) == Some(record.start_time) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(record.pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    // Only the pod's own cgroup (crius names it after the pod): a record that names
    // another must not make this kill what runs there.
    if let Some(path) = record
        .cgroup_path
        .as_ref()
        .filter(|p| Path::new(p).file_name().is_some_and(|name| name == id))
    {
        let cgroup = cgroups_rs::fs::Cgroup::load(cgroups_rs::fs::hierarchies::auto(), path);
        for left in cgroup.procs() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(left.pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        remove_cgroup(&cgroup, path);
    }
    record.pid
}

/// Removes a holder's cgroup once it is empty: a killed process leaves it a moment later.
pub fn remove_cgroup(cgroup: &cgroups_rs::fs::Cgroup, path: &str) {
    for _ in 0..5 {
        if cgroup.delete().is_ok() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    log::warn!("the pod holder's cgroup {path} could not be removed");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> BundleSpec {
        serde_json::from_str(json).expect("spec")
    }

    const MARKED: &str = r#""annotations":{"io.crius.sandbox-holder":"true",
        "io.kubernetes.cri.container-type":"sandbox","io.kubernetes.cri.sandbox-id":"p1"}"#;

    #[test]
    fn a_marked_sandbox_is_held_with_its_namespaces_cgroup_and_oom_score() {
        let held = HeldPod::from_spec(
            "p1",
            &spec(&format!(
                r#"{{{MARKED},"hostname":"web","process":{{"oomScoreAdj":-998}},
                "linux":{{"cgroupsPath":"/kubepods/podx/p1","resources":{{"cpu":{{"shares":2}}}},
                "sysctl":{{"net.ipv4.ip_unprivileged_port_start":"0"}},
                "namespaces":[{{"type":"mount"}},{{"type":"pid"}},{{"type":"ipc"}},
                {{"type":"network","path":"/var/run/netns/cni-1"}},{{"type":"uts"}}]}}}}"#
            )),
        )
        .expect("valid")
        .expect("held");
        assert_eq!(
            held.namespaces,
            Namespaces {
                netns: Some(PathBuf::from("/var/run/netns/cni-1")),
                pid: true,
                ipc: true,
                uts: true,
                hostname: "web".into(),
                userns: false,
                sysctls: vec![("net/ipv4/ip_unprivileged_port_start".into(), "0".into())],
            }
        );
        assert_eq!(held.cgroup_path.as_deref(), Some("kubepods/podx/p1"));
        assert_eq!(held.cpu_shares, Some(2));
        assert_eq!(held.oom_score_adj, Some(-998));
    }

    #[test]
    fn an_unmarked_spec_is_not_held() {
        let unmarked = spec(
            r#"{"annotations":{"io.kubernetes.cri.container-type":"sandbox",
            "io.kubernetes.cri.sandbox-id":"p1"},"linux":{}}"#,
        );
        assert_eq!(HeldPod::from_spec("p1", &unmarked).expect("valid"), None);
    }

    #[test]
    fn what_the_holder_cannot_honour_is_refused() {
        let refused = [
            // A container, or another pod's sandbox, marked through an annotation.
            r#"{"annotations":{"io.crius.sandbox-holder":"true",
              "io.kubernetes.cri.container-type":"container","io.kubernetes.cri.sandbox-id":"p1"},
              "linux":{}}"#
                .to_string(),
            format!(r#"{{{MARKED},"linux":{{"namespaces":[{{"type":"user"}}]}}}}"#),
            format!(
                r#"{{{MARKED},"linux":{{"namespaces":[{{"type":"pid","path":"/proc/1/ns/pid"}}]}}}}"#
            ),
            format!(r#"{{{MARKED},"linux":{{"cgroupsPath":"system.slice:crius:p1"}}}}"#),
            format!(r#"{{{MARKED},"linux":{{"cgroupsPath":"/kubepods/../../etc"}}}}"#),
            format!(r#"{{{MARKED},"linux":{{"cgroupsPath":"/kubepods/other-pod"}}}}"#),
            // A sysctl of a namespace the pod shares with the host.
            format!(r#"{{{MARKED},"linux":{{"sysctl":{{"net.ipv4.ip_forward":"1"}}}}}}"#),
            format!(r#"{{{MARKED},"linux":{{"sysctl":{{"kernel.panic":"1"}}}}}}"#),
        ];
        for json in refused {
            let result = HeldPod::from_spec("p1", &spec(&json));
            assert!(
                matches!(result, Err(ShimError::InvalidArgument(_))),
                "{json}: {result:?}"
            );
        }
    }

    #[test]
    fn cpu_shares_convert_to_weights_as_runc_does() {
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(1024), 39);
        assert_eq!(shares_to_weight(262_144), 10_000);
        assert_eq!(shares_to_weight(0), 1);
    }

    #[test]
    fn the_record_names_the_holder_by_pid_and_start_time() {
        let dir = tempfile::tempdir().expect("tempdir");
        let me = std::process::id() as i32;
        let record = HolderRecord {
            cgroup_path: None,
            pid: me,
            start_time: start_time(me).expect("own start time"),
        };
        write_record(dir.path(), &record).expect("write");
        assert!(is_held_bundle(dir.path()));
        assert_eq!(read_record(dir.path()), Some(record));
        assert!(start_time(me).expect("start time") > 0);
    }
}
