//! `crius check`: a read-only look at whether this host can run crius with its config.
//!
//! Each check yields one [`Finding`]: passed, a warning (crius runs, something is missing
//! or worth knowing) or a failure (crius would not start, or pods would not run), with what
//! to do about it. Nothing here changes the host: binaries are only asked for their
//! version or features, ports are only bound and released.

mod host;
mod runtimes;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::Config;

/// How long a probe of containerd or of a binary may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Warn,
    Fail,
}

/// What one check found.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub name: String,
    pub outcome: Outcome,
    pub detail: String,
    /// What to do about a warning or failure.
    pub fix: Option<String>,
}

impl Finding {
    pub fn pass(name: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            outcome: Outcome::Pass,
            detail: detail.into(),
            fix: None,
        }
    }

    pub fn warn(
        name: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            outcome: Outcome::Warn,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    pub fn fail(
        name: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            outcome: Outcome::Fail,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

/// Every finding, in the order checked.
#[derive(Debug, Default)]
pub struct Report {
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn failed(&self) -> bool {
        self.findings.iter().any(|f| f.outcome == Outcome::Fail)
    }

    /// One line per check: `ok`, `warn` or `FAIL`, the check, what was found, and for the
    /// last two what to do.
    pub fn render(&self) -> String {
        let mut text = String::new();
        for finding in &self.findings {
            let mark = match finding.outcome {
                Outcome::Pass => "ok  ",
                Outcome::Warn => "warn",
                Outcome::Fail => "FAIL",
            };
            let _ = write!(text, "{mark} {}: {}", finding.name, finding.detail);
            if let Some(fix) = &finding.fix {
                let _ = write!(text, " -> {fix}");
            }
            text.push('\n');
        }
        let failures = self
            .findings
            .iter()
            .filter(|f| f.outcome == Outcome::Fail)
            .count();
        let _ = writeln!(text, "{} checks, {failures} failed", self.findings.len());
        text
    }
}

/// Runs every check against the host and `config`.
pub async fn run(config: &Config) -> Report {
    let mut report = Report::default();
    report.findings.extend(check_containerd(config).await);
    report.findings.push(host::overlayfs(config));
    report
        .findings
        .extend(runtimes::check_runtimes(config).await);
    report.findings.push(host::cgroups(config));
    report.findings.extend(host::cgroup_moves());
    report.findings.push(host::oom_scores(config));
    report.findings.push(host::security_modules());
    report.findings.extend(host::cni(config));
    report.findings.push(runtimes::criu().await);
    let running = crius_running(config).await;
    report
        .findings
        .push(host::stream_port(config, running).await);
    if !config.metrics.address.is_empty() {
        report
            .findings
            .push(host::listen_address("metrics listener", &config.metrics.address, running).await);
    }
    report
}

/// Whether a crius answers on the configured CRI socket (its ports are then taken).
async fn crius_running(config: &Config) -> bool {
    let connect = tokio::net::UnixStream::connect(&config.grpc.address);
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, connect).await,
        Ok(Ok(_))
    )
}

/// containerd reachable, its version, and the configured snapshotter served.
async fn check_containerd(config: &Config) -> Vec<Finding> {
    let address = &config.containerd.address;
    let connected = tokio::time::timeout(
        PROBE_TIMEOUT,
        crate::containerd::Containerd::connect(
            address,
            &config.containerd.namespace,
            Duration::from_secs(1),
        ),
    )
    .await;
    let containerd = match connected {
        Ok(Ok(containerd)) => containerd,
        Ok(Err(e)) => return containerd_unreachable(config, &e.to_string()),
        Err(_) => return containerd_unreachable(config, "timed out"),
    };
    let version = match tokio::time::timeout(PROBE_TIMEOUT, containerd.version()).await {
        Ok(Ok(version)) => version,
        Ok(Err(e)) => return containerd_unreachable(config, &e.to_string()),
        Err(_) => return containerd_unreachable(config, "version timed out"),
    };
    let mut findings = vec![Finding::pass(
        "containerd",
        format!("reachable at {}, version {version}", address.display()),
    )];
    for snapshotter in config.snapshotters() {
        let served =
            match tokio::time::timeout(PROBE_TIMEOUT, containerd.check_snapshotter(snapshotter))
                .await
            {
                Ok(checked) => checked.map_err(|e| e.to_string()),
                Err(_) => Err("listing containerd's plugins timed out".to_string()),
            };
        findings.push(match served {
            Ok(()) => Finding::pass("snapshotter", format!("containerd serves {snapshotter:?}")),
            Err(reason) => Finding::fail(
                "snapshotter",
                reason,
                format!(
                    "enable the {snapshotter} snapshotter in containerd's config, or set containerd.snapshotter (or the handler's snapshotter) to one it serves"
                ),
            ),
        });
    }
    findings
}

fn containerd_unreachable(config: &Config, reason: &str) -> Vec<Finding> {
    vec![
        Finding::fail(
            "containerd",
            format!(
                "not reachable at {}: {reason}",
                config.containerd.address.display()
            ),
            "start containerd (systemctl start containerd), or set containerd.address to its socket",
        ),
        Finding::fail(
            "snapshotter",
            format!(
                "{:?} not checked: containerd is not reachable",
                config.containerd.snapshotter
            ),
            "fix the containerd check first",
        ),
    ]
}

/// `name` as the PATH finds it (or itself, when it is a path).
pub(crate) fn find_executable(name: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |path: &Path| {
        std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if name.components().count() > 1 {
        return executable(name).then(|| name.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| executable(candidate))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_fails_on_any_failure_and_says_what_to_do() {
        let report = Report {
            findings: vec![
                Finding::pass("containerd", "reachable"),
                Finding::warn("criu", "not found", "install criu"),
                Finding::fail("cni", "no network", "write a conflist"),
            ],
        };
        assert!(report.failed());
        let text = report.render();
        assert!(text.contains("ok   containerd: reachable\n"), "{text}");
        assert!(
            text.contains("warn criu: not found -> install criu\n"),
            "{text}"
        );
        assert!(
            text.contains("FAIL cni: no network -> write a conflist\n"),
            "{text}"
        );
        assert!(text.ends_with("3 checks, 1 failed\n"), "{text}");
        let passing = Report {
            findings: vec![Finding::warn("criu", "not found", "install criu")],
        };
        assert!(!passing.failed());
    }

    #[test]
    fn executables_are_found_on_the_path_or_by_path() {
        assert!(find_executable(Path::new("sh")).is_some());
        assert_eq!(
            find_executable(Path::new("/bin/sh")),
            Some(PathBuf::from("/bin/sh"))
        );
        assert!(find_executable(Path::new("no-such-binary-for-crius")).is_none());
        // A file that is not executable is not a runtime.
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("runc");
        std::fs::write(&plain, "").unwrap();
        assert!(find_executable(&plain).is_none());
    }
}
