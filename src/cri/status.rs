//! `Status`: whether containerd answers and whether a CNI network is loaded.

use std::collections::HashMap;
use std::time::Duration;

use crate::api::v1::{
    RuntimeCondition, RuntimeFeatures, RuntimeHandler, RuntimeHandlerFeatures, RuntimeStatus,
    StatusRequest, StatusResponse,
};
use tonic::Status;

use crate::cri::CriService;

/// How long `Status` waits for containerd before calling the runtime not ready.
const RUNTIME_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

const RUNTIME_READY: &str = "RuntimeReady";
const NETWORK_READY: &str = "NetworkReady";

impl CriService {
    pub async fn status(&self, req: StatusRequest) -> Result<StatusResponse, Status> {
        let runtime = condition(RUNTIME_READY, self.runtime_readiness().await);
        let network = condition(
            NETWORK_READY,
            self.cni.ready().map_err(|e| {
                (
                    "NetworkPluginNotReady",
                    format!("Network plugin returns error: cni config load failed: {e}"),
                )
            }),
        );

        let mut info = HashMap::new();
        if req.verbose {
            info.insert("config".to_string(), config_json(&self.config));
            info.insert("cniconfig".to_string(), self.cni.to_json().to_string());
            let last = match self.cni.ready() {
                Ok(()) => "OK".to_string(),
                Err(e) => e.to_string(),
            };
            info.insert("lastCNILoadStatus".to_string(), last);
            info.insert("streaming".to_string(), self.streaming_info().to_string());
            info.insert("process".to_string(), process_info().to_string());
        }

        Ok(StatusResponse {
            status: Some(RuntimeStatus {
                conditions: vec![runtime, network],
            }),
            info,
            runtime_handlers: self.runtime_handlers(),
            features: Some(RuntimeFeatures {
                // Merge and Strict are both applied (container_create).
                supplemental_groups_policy: true,
                // The host's /sys is bound for them (no sysfs mount in a user namespace
                // that does not own the network).
                user_namespaces_host_network: self.host.userns_rootfs.is_ok(),
            }),
        })
    }

    /// Whether containerd answers. While crius's event subscription stands, containerd is
    /// serving (its death breaks the stream at once) and no round trip is made, as
    /// containerd's own CRI asks nothing of itself; otherwise containerd is asked.
    async fn runtime_readiness(&self) -> Result<(), (&'static str, String)> {
        if self.containerd_reachable() {
            return Ok(());
        }
        match tokio::time::timeout(RUNTIME_PROBE_TIMEOUT, self.containerd.version()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(("ContainerdNotReady", e.to_string())),
            Err(_) => Err((
                "ContainerdNotReady",
                format!("containerd did not answer within {RUNTIME_PROBE_TIMEOUT:?}"),
            )),
        }
    }

    /// The stream server's URL and what it holds open.
    fn streaming_info(&self) -> serde_json::Value {
        let endpoint = self.stream_endpoint.get();
        serde_json::json!({
            "url": endpoint.map(|e| e.base_url.clone()),
            "openSessions": endpoint.map(|e| e.open_sessions()),
            "outstandingTokens": self.stream_requests.len(),
        })
    }

    /// The configured runtime handlers; the default one is also listed under "".
    fn runtime_handlers(&self) -> Vec<RuntimeHandler> {
        std::iter::once(String::new())
            .chain(self.config.containerd.runtimes.keys().cloned())
            .map(|name| {
                let handler = if name.is_empty() {
                    &self.config.containerd.default_runtime
                } else {
                    &name
                };
                let probed = self
                    .host
                    .handler_features
                    .get(handler)
                    .copied()
                    .unwrap_or_default();
                RuntimeHandler {
                    name,
                    features: Some(RuntimeHandlerFeatures {
                        recursive_read_only_mounts: probed.recursive_read_only_mounts,
                        user_namespaces: probed.user_namespaces,
                    }),
                }
            })
            .collect()
    }
}

/// What the crius process holds, for operators chasing leaks.
fn process_info() -> serde_json::Value {
    let threads = std::fs::read_dir("/proc/self/task").map(|d| d.count()).ok();
    let fds = std::fs::read_dir("/proc/self/fd").map(|d| d.count()).ok();
    serde_json::json!({
        "asyncTasks": tokio::runtime::Handle::current().metrics().num_alive_tasks(),
        "threads": threads,
        "openFiles": fds,
    })
}

fn condition(kind: &str, state: Result<(), (&str, String)>) -> RuntimeCondition {
    match state {
        Ok(()) => RuntimeCondition {
            r#type: kind.to_string(),
            status: true,
            reason: String::new(),
            message: String::new(),
        },
        Err((reason, message)) => RuntimeCondition {
            r#type: kind.to_string(),
            status: false,
            reason: reason.to_string(),
            message,
        },
    }
}

/// The verbose Status `config`: crius's config (secrets redacted), with the keys containerd's
/// CRI puts there under containerd's names as well (`rootDir`, `stateDir`,
/// `containerdEndpoint`, `maxContainerLogLineSize`, `cni.confDir` ...), so tools written
/// against containerd's CRI (its own integration suite among them) find them.
fn config_json(config: &crate::config::Config) -> String {
    let mut value = serde_json::to_value(config.redacted()).unwrap_or_default();
    add_containerd_keys(&mut value, config);
    value.to_string()
}

fn add_containerd_keys(value: &mut serde_json::Value, config: &crate::config::Config) {
    let Some(top) = value.as_object_mut() else {
        return;
    };
    let path = |p: &std::path::Path| serde_json::Value::from(p.display().to_string());
    top.insert("rootDir".into(), path(&config.root));
    top.insert("stateDir".into(), path(&config.state));
    top.insert(
        "containerdEndpoint".into(),
        path(&config.containerd.address),
    );
    top.insert("containerdRootDir".into(), path(&config.containerd.root));
    top.insert(
        "maxContainerLogLineSize".into(),
        config.max_container_log_line_size.into(),
    );
    if let Some(cni) = top.get_mut("cni").and_then(|c| c.as_object_mut()) {
        let bin_dirs: Vec<serde_json::Value> =
            config.cni.bin_dirs.iter().map(|d| path(d)).collect();
        cni.insert("confDir".into(), path(&config.cni.conf_dir));
        cni.insert(
            "binDir".into(),
            bin_dirs.first().cloned().unwrap_or_default(),
        );
        cni.insert("binDirs".into(), bin_dirs.into());
        cni.insert("maxConfNum".into(), config.cni.max_conf_num.into());
    }
}
