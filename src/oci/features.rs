//! What each OCI runtime can do, from its `features` subcommand (runc ≥ 1.1, crun ≥ 1.5):
//! the `RuntimeHandlerFeatures` that `Status` reports per handler. Probed once at start-up,
//! with a time and size bound on the runtime's answer.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;

use crate::config::RuntimeConfig;

/// How long a runtime may take to describe itself.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// The most bytes of its answer read (runc's is about 6 KiB).
const PROBE_MAX_BYTES: u64 = 1024 * 1024;

/// The features of one handler's runtime that the CRI asks about.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HandlerFeatures {
    /// The runtime knows the `rro` mount option (recursive read-only).
    pub recursive_read_only_mounts: bool,
    /// The runtime can make idmapped mounts itself.
    pub idmap_mounts: bool,
    /// crius can run pods in their own user namespace on this handler: its runtime takes
    /// runc's options (runc and crun know user namespaces) and the host can make them.
    pub user_namespaces: bool,
}

impl HandlerFeatures {
    /// Reads a runtime's `features` JSON; anything it does not say is absent.
    pub fn parse(json: &[u8]) -> Self {
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(json) else {
            return Self::default();
        };
        let has_option = |name: &str| {
            value["mountOptions"]
                .as_array()
                .is_some_and(|opts| opts.iter().any(|o| o.as_str() == Some(name)))
        };
        Self {
            recursive_read_only_mounts: has_option("rro"),
            idmap_mounts: value["linux"]["mountExtensions"]["idmap"]["enabled"]
                .as_bool()
                .unwrap_or(false),
            user_namespaces: false,
        }
    }
}

/// The OCI runtime binary a handler runs (`BinaryName`, else runc).
pub fn runtime_binary(runtime: &RuntimeConfig) -> String {
    if runtime.options.binary_name.is_empty() {
        "runc".to_string()
    } else {
        runtime.options.binary_name.clone()
    }
}

/// Asks `binary features`; a runtime that cannot answer has no optional features.
pub async fn probe(binary: &str) -> HandlerFeatures {
    match run_features(binary).await {
        Ok(json) => HandlerFeatures::parse(&json),
        Err(e) => {
            tracing::info!(runtime = binary, error = %e, "runtime does not report its features; assuming none");
            HandlerFeatures::default()
        }
    }
}

async fn run_features(binary: &str) -> std::io::Result<Vec<u8>> {
    let mut child = tokio::process::Command::new(binary)
        .arg("features")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| std::io::Error::other("no stdout"))?;
    let run = async {
        let mut out = Vec::new();
        stdout.take(PROBE_MAX_BYTES).read_to_end(&mut out).await?;
        let status = child.wait().await?;
        if !status.success() {
            return Err(std::io::Error::other(format!(
                "`{binary} features` exited with {status}"
            )));
        }
        Ok(out)
    };
    tokio::time::timeout(PROBE_TIMEOUT, run)
        .await
        .map_err(|_| {
            std::io::Error::other(format!("`{binary} features` took over {PROBE_TIMEOUT:?}"))
        })?
}

/// Probes every configured handler, each runtime binary once. `userns`: whether the host
/// can run pods in their own user namespace.
pub async fn probe_handlers(
    runtimes: &BTreeMap<String, RuntimeConfig>,
    userns: bool,
) -> BTreeMap<String, HandlerFeatures> {
    let mut by_binary: BTreeMap<String, HandlerFeatures> = BTreeMap::new();
    let mut features = BTreeMap::new();
    for (name, runtime) in runtimes {
        let binary = runtime_binary(runtime);
        let found = match by_binary.get(&binary) {
            Some(found) => *found,
            None => {
                let found = probe(&binary).await;
                by_binary.insert(binary, found);
                found
            }
        };
        let user_namespaces =
            userns && crate::config::RUNC_RUNTIME_TYPES.contains(&runtime.runtime_type.as_str());
        features.insert(
            name.clone(),
            HandlerFeatures {
                user_namespaces,
                ..found
            },
        );
    }
    features
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rro_and_idmap_from_a_features_answer() {
        let json = br#"{"mountOptions": ["ro", "rro", "rbind"],
            "linux": {"mountExtensions": {"idmap": {"enabled": true}}}}"#;
        assert_eq!(
            HandlerFeatures::parse(json),
            HandlerFeatures {
                recursive_read_only_mounts: true,
                idmap_mounts: true,
                user_namespaces: false,
            }
        );
    }

    #[test]
    fn an_old_or_garbled_answer_has_no_features() {
        assert_eq!(
            HandlerFeatures::parse(br#"{"mountOptions": ["ro"]}"#),
            HandlerFeatures::default()
        );
        assert_eq!(
            HandlerFeatures::parse(b"\x00garbage"),
            HandlerFeatures::default()
        );
    }

    #[tokio::test]
    async fn a_missing_runtime_has_no_features() {
        assert_eq!(
            probe("/nonexistent/crius-test-runtime").await,
            HandlerFeatures::default()
        );
    }
}
