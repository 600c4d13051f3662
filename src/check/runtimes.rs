//! Checks of the runtime handlers: each one's shim and OCI runtime installed, what the OCI
//! runtime supports, and CRIU for checkpoints.

use std::path::{Path, PathBuf};

use super::{Finding, PROBE_TIMEOUT, find_executable};
use crate::config::{CRIUS_SHIM, Config, RUNC_RUNTIME_TYPES, RuntimeConfig};

/// The most of a probed binary's output that is read.
const MAX_PROBE_OUTPUT: usize = 1024 * 1024;

/// One finding per runtime handler.
pub async fn check_runtimes(config: &Config) -> Vec<Finding> {
    let mut findings = Vec::new();
    for (name, runtime) in &config.containerd.runtimes {
        let default = if *name == config.containerd.default_runtime {
            " (default)"
        } else {
            ""
        };
        findings.push(check_runtime(&format!("runtime {name}{default}"), runtime).await);
    }
    findings
}

async fn check_runtime(name: &str, runtime: &RuntimeConfig) -> Finding {
    let Some(shim) = shim_binary(&runtime.runtime_type) else {
        return Finding::fail(
            name,
            format!("runtime_type {:?} is not a shim name", runtime.runtime_type),
            "use a runtime_type like io.containerd.runc.v2",
        );
    };
    let Some(found) = find_executable(&shim) else {
        return Finding::fail(
            name,
            format!("shim {} not found on the PATH", shim.display()),
            "install it where containerd finds it (make install puts crius's in /usr/local/bin)",
        );
    };
    if !RUNC_RUNTIME_TYPES.contains(&runtime.runtime_type.as_str()) {
        return Finding::pass(name, format!("shim {}", shim.display()));
    }
    let binary = if runtime.options.binary_name.is_empty() {
        "runc"
    } else {
        runtime.options.binary_name.as_str()
    };
    let Some(oci) = find_executable(Path::new(binary)) else {
        return Finding::fail(
            name,
            format!(
                "shim {}, but OCI runtime {binary} not found",
                shim.display()
            ),
            "install runc (or set the runtime's BinaryName)",
        );
    };
    let features = match probe(&oci, &["features"]).await {
        Some(json) => describe_features(&json),
        None => "features not reported (an older runtime)".to_string(),
    };
    let detail = format!("shim {}, {}: {features}", shim.display(), oci.display());
    if runtime.runtime_type == CRIUS_SHIM && !has_exec_helper_beside(&found) {
        return Finding::warn(
            name,
            format!("{detail}; no {EXEC_HELPER} beside the shim (each exec copies the whole shim)"),
            format!("install {EXEC_HELPER} in the shim's directory (make install does)"),
        );
    }
    Finding::pass(name, detail)
}

/// crius's shim runs its execs from a copy of this binary beside it.
const EXEC_HELPER: &str = "crius-exec-helper";

/// Where the shim looks: beside its own binary, links resolved (it reads the helper, so the
/// helper need not be executable).
fn has_exec_helper_beside(shim: &Path) -> bool {
    std::fs::canonicalize(shim)
        .ok()
        .and_then(|shim| Some(shim.parent()?.join(EXEC_HELPER)))
        .is_some_and(|helper| helper.is_file())
}

/// containerd's shim binary for a runtime type: `io.containerd.runc.v2` runs
/// `containerd-shim-runc-v2`; a path is itself.
fn shim_binary(runtime_type: &str) -> Option<PathBuf> {
    if runtime_type.contains('/') {
        return Some(PathBuf::from(runtime_type));
    }
    let mut parts = runtime_type.rsplit('.');
    let version = parts.next().filter(|v| !v.is_empty())?;
    let name = parts.next().filter(|n| !n.is_empty())?;
    Some(PathBuf::from(format!("containerd-shim-{name}-{version}")))
}

/// What an OCI runtime's `features` JSON says about what crius uses.
fn describe_features(json: &str) -> String {
    let Ok(features) = serde_json::from_str::<serde_json::Value>(json) else {
        return "features not readable".to_string();
    };
    let linux = &features["linux"];
    let yes_no = |on: bool| if on { "yes" } else { "no" };
    let seccomp = linux["seccomp"]["enabled"].as_bool().unwrap_or(false);
    let idmap = linux["mountExtensions"]["idmap"]["enabled"]
        .as_bool()
        .unwrap_or(false);
    let version = features["annotations"]
        .as_object()
        // The runtime's own version, not a library's (runc also names libseccomp's).
        .and_then(|a| {
            a.iter()
                .find(|(k, _)| k.ends_with(".version") && !k.contains("seccomp"))
        })
        .and_then(|(_, v)| v.as_str())
        .map(|v| format!("version {v}, "))
        .unwrap_or_default();
    format!(
        "{version}seccomp {}, idmapped mounts {} (user-namespaced pods need them)",
        yes_no(seccomp),
        yes_no(idmap)
    )
}

/// CRIU, which CheckpointContainer and restores need.
pub async fn criu() -> Finding {
    let Some(criu) = find_executable(Path::new("criu")) else {
        return Finding::warn(
            "CRIU",
            "not found: CheckpointContainer fails",
            "install criu to checkpoint containers (kubelet's ContainerCheckpoint)",
        );
    };
    match probe(&criu, &["--version"]).await {
        Some(out) => Finding::pass(
            "CRIU",
            format!(
                "{} ({})",
                criu.display(),
                out.lines().next().unwrap_or_default().trim()
            ),
        ),
        None => Finding::warn(
            "CRIU",
            format!("{} does not run", criu.display()),
            "reinstall criu",
        ),
    }
}

/// The standard output of `binary args`, if it succeeds within the probe timeout and says
/// no more than [`MAX_PROBE_OUTPUT`].
async fn probe(binary: &Path, args: &[&str]) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut child = tokio::process::Command::new(binary)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .ok()?;
    let stdout = child.stdout.take()?;
    let run = async {
        let mut out = Vec::new();
        stdout
            .take(MAX_PROBE_OUTPUT as u64 + 1)
            .read_to_end(&mut out)
            .await
            .ok()?;
        let status = child.wait().await.ok()?;
        (status.success() && out.len() <= MAX_PROBE_OUTPUT).then_some(out)
    };
    let out = tokio::time::timeout(PROBE_TIMEOUT, run).await.ok()??;
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_types_name_their_shim() {
        assert_eq!(
            shim_binary("io.containerd.runc.v2"),
            Some(PathBuf::from("containerd-shim-runc-v2"))
        );
        assert_eq!(
            shim_binary("io.containerd.crius.v2"),
            Some(PathBuf::from("containerd-shim-crius-v2"))
        );
        assert_eq!(
            shim_binary("/opt/kata/bin/containerd-shim-kata-v2"),
            Some(PathBuf::from("/opt/kata/bin/containerd-shim-kata-v2"))
        );
        assert_eq!(shim_binary("runc"), None);
        assert_eq!(shim_binary(""), None);
    }

    #[test]
    fn features_say_seccomp_idmap_and_version() {
        let runc_1_1 = r#"{"linux":{"seccomp":{"enabled":true}},
            "annotations":{"io.github.seccomp.libseccomp.version":"2.5.4",
            "org.opencontainers.runc.version":"1.1.5"}}"#;
        assert_eq!(
            describe_features(runc_1_1),
            "version 1.1.5, seccomp yes, idmapped mounts no (user-namespaced pods need them)"
        );
        let runc_1_3 = r#"{"linux":{"seccomp":{"enabled":true},
            "mountExtensions":{"idmap":{"enabled":true}}}}"#;
        assert!(describe_features(runc_1_3).contains("idmapped mounts yes"));
        assert_eq!(describe_features("not json"), "features not readable");
    }
}
