//! The shim's own exec: for a container runc made, an exec whose spec asks nothing runc
//! alone does runs through the exec helper (`helper.rs`, run from a sealed copy, see
//! `seal.rs`) rather than `runc exec`, which starts two Go programs (`runc` and `runc
//! init`) and takes most of an exec probe's time. Anything else goes to runc as before: a
//! terminal, an LSM label, seccomp, a user or time namespace, a personality, Intel RDT,
//! systemd cgroups, a runtime other than runc, a kernel older than 5.11 (`setns` on a
//! pidfd came in 5.8, `close_range` in 5.9; 5.11 leaves a margin of fixes to both).

mod cgroups;
mod child;
pub mod helper;
mod lookup;
mod seal;
pub mod spec;

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use crate::runtime::bundle_spec::BundleSpec;
use crate::runtime::reaper::Reaper;
use crate::runtime::runc::{ProcessStdio, Runc, RuncError};

/// crius's mark on a container whose handler sends every exec to runc
/// (`exec_with_runtime`).
pub const EXEC_WITH_RUNTIME: &str = "io.crius.exec-with-runtime";

/// Whether the shim may run this container's execs itself, from its spec and runtime.
pub fn container_allows(spec: &BundleSpec, runc: &Runc) -> bool {
    kernel_is_recent_enough() && spec_and_runtime_allow(spec, runc)
}

fn spec_and_runtime_allow(spec: &BundleSpec, runc: &Runc) -> bool {
    let marked = spec.annotations.get(EXEC_WITH_RUNTIME).map(String::as_str) == Some("true");
    !marked && runc.is_runc() && !runc.systemd_cgroup && spec.plain_for_exec()
}

/// Linux 5.8 joins a process's namespaces through its pidfd and 5.9 closes a range of
/// descriptors; the shim asks for 5.11.
fn kernel_is_recent_enough() -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        nix::sys::utsname::uname()
            .ok()
            .and_then(|u| release_at_least(&u.release().to_string_lossy(), (5, 11)))
            .unwrap_or(false)
    })
}

fn release_at_least(release: &str, wanted: (u32, u32)) -> Option<bool> {
    let mut parts = release.split(['.', '-']);
    let major: u32 = parts.next()?.parse().ok()?;
    let minor: u32 = parts.next()?.parse().ok()?;
    Some((major, minor) >= wanted)
}

/// What runc gives an exec from the container's own process when the exec's spec has
/// none: its capabilities and rlimits; and always the container's OOM score.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ExecDefaults {
    capabilities: Option<serde_json::Value>,
    rlimits: Option<serde_json::Value>,
    oom_score_adj: Option<i32>,
}

impl ExecDefaults {
    pub fn of(spec: &BundleSpec) -> Self {
        let process = spec.process.as_ref();
        Self {
            capabilities: process.and_then(|p| p.capabilities.clone()),
            rlimits: process.and_then(|p| p.rlimits.clone()),
            oom_score_adj: process.and_then(|p| p.oom_score_adj),
        }
    }

    /// The exec's process spec as runc would run it in this container.
    pub fn apply(&self, process: &mut serde_json::Map<String, serde_json::Value>) {
        let missing = |v: Option<&serde_json::Value>| {
            v.is_none_or(|v| v.is_null() || v.as_array().is_some_and(Vec::is_empty))
        };
        if missing(process.get("capabilities"))
            && let Some(caps) = &self.capabilities
        {
            process.insert("capabilities".into(), caps.clone());
        }
        if missing(process.get("rlimits"))
            && let Some(rlimits) = &self.rlimits
        {
            process.insert("rlimits".into(), rlimits.clone());
        }
        match self.oom_score_adj {
            Some(adj) => process.insert("oomScoreAdj".into(), adj.into()),
            None => process.remove("oomScoreAdj"),
        };
    }
}

/// What the shim's exec needs of a container: a pidfd of its init, taken at create (so a
/// pid reused after the init ends is never joined), and its process's defaults.
#[derive(Debug)]
pub struct ExecTarget {
    init: OwnedFd,
    pub defaults: ExecDefaults,
}

impl ExecTarget {
    pub fn open(init_pid: i32, defaults: ExecDefaults) -> std::io::Result<Self> {
        Ok(Self {
            init: crate::runtime::pidfd::open(init_pid)?,
            defaults,
        })
    }
}

/// What the helper runs from: its own pidfd of the init and the sealed binary.
pub struct Prepared {
    init: OwnedFd,
    binary: OwnedFd,
}

/// Gets an exec ready to run through the helper (off the async threads: it copies the
/// helper's binary). An error here means runc should run it instead.
pub async fn prepare(target: &ExecTarget) -> std::io::Result<Prepared> {
    let init = target.init.try_clone()?;
    let binary = tokio::task::spawn_blocking(seal::sealed_binary)
        .await
        .map_err(std::io::Error::other)??;
    Ok(Prepared { init, binary })
}

/// Runs an exec as `runc exec --detach --pid-file` does, through the helper: the process
/// runs when this returns, its pid in `pid_file`.
pub async fn exec(
    reaper: &Reaper,
    runc: &Runc,
    container_id: &str,
    prepared: Prepared,
    process_file: &Path,
    pid_file: &Path,
    stdio: ProcessStdio,
) -> Result<(), RuncError> {
    let args = helper::HelperArgs {
        process: process_file.to_path_buf(),
        pid_file: pid_file.to_path_buf(),
        log: runc.log.clone(),
        keyring: if runc.no_new_keyring {
            String::new()
        } else {
            format!("_ses.{container_id}")
        },
    };
    let Prepared { init, binary } = prepared;
    let mut command = Command::new(format!("/proc/self/fd/{}", binary.as_raw_fd()));
    command
        .arg0("containerd-shim-crius-v2")
        .args(args.to_args());
    let init_fd = init.as_raw_fd();
    // SAFETY: dup2 and fcntl are async-signal-safe; the closure touches nothing else.
    unsafe {
        command.pre_exec(move || {
            if init_fd == helper::INIT_PIDFD {
                // dup2 onto itself keeps close-on-exec: clear it instead.
                if libc::fcntl(init_fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(init_fd, helper::INIT_PIDFD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    let ran = runc.run_with_stdio(reaper, "exec", command, stdio).await;
    drop((init, binary));
    ran
}

/// Whether the helper refused the exec before touching the container, or could not be
/// started at all (say, a policy against executable memfds): runc should run it.
pub fn declined(error: &RuncError) -> bool {
    match error {
        RuncError::Failed { message, .. } => {
            if message.ends_with(helper::OTHER_BUILD) {
                // The shim's own copy serves its next execs.
                seal::helper_is_of_another_build();
            }
            message.starts_with(helper::DECLINED)
        }
        RuncError::Spawn { source, .. } => {
            if matches!(source.raw_os_error(), Some(libc::EACCES | libc::EPERM)) {
                // Refused by policy, not for want of resources: it would be again.
                seal::execs_from_memory_refused();
            }
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_of_runc_without_what_only_runc_does_allows_the_shims_exec() {
        let runc = crate::runtime::runc::runc_for(&Default::default(), "k8s.io", Path::new("/b"));
        let spec = |json: &str| -> BundleSpec { serde_json::from_str(json).expect("spec") };
        let plain = spec(r#"{"linux":{"namespaces":[{"type":"pid"},{"type":"mount"}]}}"#);
        assert!(spec_and_runtime_allow(&plain, &runc));
        let crun = crate::runtime::runc::runc_for(
            &crate::runtime::runc::RuncOptions {
                binary: "crun".into(),
                ..Default::default()
            },
            "k8s.io",
            Path::new("/b"),
        );
        assert!(!spec_and_runtime_allow(&plain, &crun));
        for json in [
            r#"{"annotations":{"io.crius.exec-with-runtime":"true"}}"#,
            r#"{"linux":{"seccomp":{"defaultAction":"SCMP_ACT_ERRNO"}}}"#,
            r#"{"linux":{"namespaces":[{"type":"user"}]}}"#,
            r#"{"linux":{"namespaces":[{"type":"time"}]}}"#,
            r#"{"linux":{"personality":{"domain":"LINUX32"}}}"#,
            r#"{"linux":{"intelRdt":{"closID":"x"}}}"#,
            r#"{"linux":{"mountLabel":"system_u:object_r:container_file_t:s0"}}"#,
            r#"{"linux":{"uidMappings":[{"containerID":0,"hostID":1000,"size":1}]}}"#,
            r#"{"process":{"apparmorProfile":"cri-containerd.apparmor.d"}}"#,
            r#"{"process":{"selinuxLabel":"system_u:system_r:container_t:s0"}}"#,
            r#"{"process":{"user":{"uid":0,"gid":0,"umask":18}}}"#,
            r#"{"process":{"scheduler":{"policy":"SCHED_IDLE"}}}"#,
            r#"{"process":{"ioPriority":{"class":"IOPRIO_CLASS_IDLE"}}}"#,
            r#"{"process":{"execCPUAffinity":{"initial":"0"}}}"#,
            r#"{"linux":{"memoryPolicy":{"mode":"MPOL_BIND"}}}"#,
        ] {
            assert!(!spec_and_runtime_allow(&spec(json), &runc), "{json}");
        }
    }

    #[test]
    fn an_exec_gets_the_containers_capabilities_rlimits_and_oom_score_as_from_runc() {
        let spec: BundleSpec = serde_json::from_str(
            r#"{"process":{"oomScoreAdj":5,"capabilities":{"bounding":["CAP_KILL"]},
                "rlimits":[{"type":"RLIMIT_NOFILE","hard":9,"soft":9}]}}"#,
        )
        .expect("spec");
        let defaults = ExecDefaults::of(&spec);
        let mut bare = serde_json::json!({"args": ["sh"], "oomScoreAdj": -999, "rlimits": []});
        let process = bare.as_object_mut().expect("object");
        defaults.apply(process);
        assert_eq!(process["oomScoreAdj"], 5);
        assert_eq!(process["capabilities"]["bounding"][0], "CAP_KILL");
        assert_eq!(process["rlimits"][0]["hard"], 9);
        let mut own = serde_json::json!({"capabilities": {"bounding": []}, "rlimits": [
            {"type": "RLIMIT_CORE", "hard": 0, "soft": 0}]});
        let process = own.as_object_mut().expect("object");
        defaults.apply(process);
        assert_eq!(process["capabilities"]["bounding"], serde_json::json!([]));
        assert_eq!(process["rlimits"][0]["type"], "RLIMIT_CORE");
        let mut none = serde_json::json!({"oomScoreAdj": 3});
        let process = none.as_object_mut().expect("object");
        ExecDefaults::default().apply(process);
        assert!(!process.contains_key("oomScoreAdj"));
    }

    #[test]
    fn the_helpers_refusals_and_a_helper_that_cannot_start_send_an_exec_to_runc() {
        let failed = |message: String| RuncError::Failed {
            verb: "exec",
            message,
        };
        assert!(declined(&failed(format!("{}a terminal", helper::DECLINED))));
        assert!(!declined(&failed(
            "exec failed: cannot exec in a paused container".into()
        )));
        assert!(declined(&RuncError::Spawn {
            verb: "exec",
            source: std::io::Error::from_raw_os_error(libc::EAGAIN),
        }));
    }

    #[test]
    fn a_host_that_refuses_execs_from_memory_is_not_asked_again() {
        assert!(declined(&RuncError::Spawn {
            verb: "exec",
            source: std::io::Error::from_raw_os_error(libc::EACCES),
        }));
        let err = seal::sealed_binary().expect_err("no copy made for nothing");
        assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
    }

    #[test]
    fn kernel_releases_compare_by_major_and_minor() {
        assert_eq!(release_at_least("6.18.0-1-amd64", (5, 11)), Some(true));
        assert_eq!(release_at_least("5.11.0", (5, 11)), Some(true));
        assert_eq!(release_at_least("5.10.200", (5, 11)), Some(false));
        assert_eq!(release_at_least("5.4.0-150-generic", (5, 8)), Some(false));
        assert_eq!(release_at_least("4.19.0", (5, 8)), Some(false));
        assert_eq!(release_at_least("garbage", (5, 8)), None);
    }
}
