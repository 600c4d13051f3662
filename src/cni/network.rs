//! Running CNI plugins for a pod (what libcni and go-cni do for containerd).
//!
//! ADD runs a network's plugins in order, each getting the previous one's result; DEL runs
//! them in reverse with the result cached by ADD, from the cached configuration when there
//! is one, so a pod is torn down as it was set up even after the conf dir changed or the
//! netns is gone. Results are cached in libcni's on-disk format
//! (`<cache dir>/results/<network>-<container id>-<ifname>`), so other CNI tools read them.
//! Every pod's `lo` is brought up too: by crius itself (`cni.use_internal_loopback`, the
//! default), or by the loopback plugin.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Map, Value, json};
use tokio::io::AsyncWriteExt;
use tokio::process::Child;

use super::config::NetworkConfigList;
use super::{LoadError, NetworkConfigs};

/// Errors from setting up or tearing down pod networking.
#[derive(Debug, thiserror::Error)]
pub enum CniError {
    #[error("NetworkPluginNotReady: cni config load failed: {0}")]
    NotReady(LoadError),
    #[error("CNI plugin {plugin:?} not found in {dirs:?}")]
    PluginNotFound { plugin: String, dirs: Vec<PathBuf> },
    #[error(transparent)]
    PluginFailed(Box<PluginFailure>),
    #[error("CNI plugin {plugin} {command} for network {network} timed out after {timeout:?}")]
    Timeout {
        plugin: String,
        command: &'static str,
        network: String,
        timeout: Duration,
    },
    #[error("CNI plugin {plugin}: {reason}")]
    Io { plugin: String, reason: String },
    #[error("CNI result cache {path}: {reason}")]
    Cache { path: PathBuf, reason: String },
    #[error(transparent)]
    Loopback(#[from] crate::sys::netns::NetnsError),
}

/// The pauses before each new DEL of a plugin that reported a failure.
const DEL_RETRY_PAUSES: [Duration; 2] = [Duration::from_millis(100), Duration::from_millis(400)];

/// A plugin that ran and reported failure.
#[derive(Debug, thiserror::Error)]
#[error(
    "CNI plugin {plugin} {command} for network {network} failed ({status}): {message}{}",
    stderr_suffix(.stderr)
)]
pub struct PluginFailure {
    pub plugin: String,
    pub command: &'static str,
    pub network: String,
    pub status: String,
    pub message: String,
    pub stderr: String,
}

fn stderr_suffix(stderr: &str) -> String {
    let trimmed = stderr.trim();
    if trimmed.is_empty() {
        String::new()
    } else {
        format!("; stderr: {trimmed}")
    }
}

/// Who a pod is, for CNI_ARGS and the cache.
#[derive(Debug, Clone)]
pub struct PodRef {
    /// The sandbox ID.
    pub id: String,
    pub name: String,
    pub namespace: String,
    pub uid: String,
    /// The netns path; may no longer exist on teardown.
    pub netns: String,
}

impl PodRef {
    fn cni_args(&self) -> Vec<(String, String)> {
        vec![
            ("IgnoreUnknown".to_string(), "1".to_string()),
            ("K8S_POD_NAMESPACE".to_string(), self.namespace.clone()),
            ("K8S_POD_NAME".to_string(), self.name.clone()),
            ("K8S_POD_INFRA_CONTAINER_ID".to_string(), self.id.clone()),
            ("K8S_POD_UID".to_string(), self.uid.clone()),
        ]
    }
}

/// The outcome of setting up one network.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NetworkAttachment {
    pub network: String,
    pub ifname: String,
    pub result: StoredResult,
}

/// A plugin's CNI result as JSON text: it is kept for every pod, and as a parsed `Value` (a
/// tree of maps) it took eight times the memory. Serialized as the JSON object it is.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResult(Box<str>);

impl StoredResult {
    pub fn new(result: &Value) -> Self {
        Self(result.to_string().into_boxed_str())
    }

    pub fn value(&self) -> Value {
        serde_json::from_str(&self.0).unwrap_or_default()
    }
}

impl serde::Serialize for StoredResult {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.value().serialize(serializer)
    }
}

impl<'de> serde::Deserialize<'de> for StoredResult {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Value::deserialize(deserializer).map(|value| Self::new(&value))
    }
}

/// Runs plugins for the networks in `NetworkConfigs`.
pub struct CniNetwork {
    configs: Arc<NetworkConfigs>,
    bin_dirs: Vec<PathBuf>,
    cache_dir: PathBuf,
    plugin_timeout: Duration,
    /// `lo` is brought up by crius, not by the loopback plugin.
    internal_loopback: bool,
}

const LOOPBACK_NETWORK: &str = "cni-loopback";

fn loopback_network() -> NetworkConfigList {
    let mut plugin = Map::new();
    plugin.insert("type".to_string(), json!("loopback"));
    NetworkConfigList {
        name: LOOPBACK_NETWORK.to_string(),
        cni_version: "0.3.1".to_string(),
        disable_check: true,
        plugins: vec![plugin],
        source: PathBuf::new(),
    }
}

impl CniNetwork {
    pub fn new(
        configs: Arc<NetworkConfigs>,
        bin_dirs: Vec<PathBuf>,
        cache_dir: PathBuf,
        plugin_timeout: Duration,
    ) -> Self {
        Self {
            configs,
            bin_dirs,
            cache_dir,
            plugin_timeout,
            internal_loopback: false,
        }
    }

    /// Brings pods' `lo` up without the loopback plugin.
    pub fn with_internal_loopback(mut self, internal: bool) -> Self {
        self.internal_loopback = internal;
        self
    }

    /// Adds the pod to loopback and every loaded network (eth0, eth1, ...), caching each
    /// result as soon as it is known. On failure, what was added is deleted again.
    pub async fn setup(
        &self,
        pod: &PodRef,
        capabilities: &Map<String, Value>,
    ) -> Result<Vec<NetworkAttachment>, CniError> {
        let current = self.configs.current();
        let loaded = current
            .result
            .as_ref()
            .map_err(|e| CniError::NotReady(e.clone()))?;
        if self.internal_loopback {
            crate::sys::netns::loopback_up(Path::new(&pod.netns)).await?;
        } else {
            self.add_list(&loopback_network(), "lo", pod, &Map::new())
                .await?;
        }
        let mut attached = Vec::new();
        for (i, network) in loaded.networks.iter().enumerate() {
            let ifname = format!("eth{i}");
            match self.add_list(network, &ifname, pod, capabilities).await {
                Ok(result) => {
                    if let Err(e) = self.write_cache(network, &ifname, pod, capabilities, &result) {
                        let _ = self
                            .del_list(network, &ifname, pod, capabilities, Some(&result))
                            .await;
                        self.undo(pod, &attached, loaded.networks.as_slice(), capabilities)
                            .await;
                        return Err(e);
                    }
                    attached.push(NetworkAttachment {
                        network: network.name.clone(),
                        ifname,
                        result: StoredResult::new(&result),
                    });
                }
                Err(e) => {
                    // A plugin after the first may have failed: DEL what the others of this
                    // list added (an IP, a veth), as the CNI spec asks after a failed ADD.
                    if let Err(del) = self
                        .del_list(network, &ifname, pod, capabilities, None)
                        .await
                    {
                        tracing::warn!(pod = %pod.id, network = %network.name, error = %del, "DEL after a failed ADD failed");
                        // The capabilities may be what the plugins refused (a port mapping
                        // portmap cannot parse fails its DEL too, before the IPAM plugin
                        // gives the IP back): DEL again without them.
                        if !capabilities.is_empty()
                            && let Err(del) = self
                                .del_list(network, &ifname, pod, &Map::new(), None)
                                .await
                        {
                            tracing::warn!(pod = %pod.id, network = %network.name, error = %del, "DEL without capabilities after a failed ADD failed");
                        }
                    }
                    self.undo(pod, &attached, loaded.networks.as_slice(), capabilities)
                        .await;
                    return Err(e);
                }
            }
        }
        Ok(attached)
    }

    async fn undo(
        &self,
        pod: &PodRef,
        attached: &[NetworkAttachment],
        networks: &[NetworkConfigList],
        capabilities: &Map<String, Value>,
    ) {
        for (attachment, network) in attached.iter().zip(networks).rev() {
            if let Err(e) = self
                .del_list(
                    network,
                    &attachment.ifname,
                    pod,
                    capabilities,
                    Some(&attachment.result.value()),
                )
                .await
            {
                tracing::warn!(pod = %pod.id, network = %network.name, error = %e, "undoing CNI ADD failed");
            }
            self.remove_cache(&network.name, &pod.id, &attachment.ifname);
        }
    }

    /// Deletes the pod from every network it was added to, from the cached results and
    /// configurations; from the current configuration when nothing is cached.
    pub async fn teardown(&self, pod: &PodRef) -> Result<(), CniError> {
        let cached = self.cached_entries(&pod.id).await;
        if cached.is_empty()
            && let Ok(loaded) = self.configs.current().result.as_ref()
        {
            for (i, network) in loaded.networks.iter().enumerate().rev() {
                self.del_list(network, &format!("eth{i}"), pod, &Map::new(), None)
                    .await?;
            }
        }
        for entry in cached.into_iter().rev() {
            self.del_list(
                &entry.network,
                &entry.ifname,
                pod,
                &entry.capabilities,
                entry.result.as_ref(),
            )
            .await?;
            if let Err(e) = std::fs::remove_file(&entry.path) {
                tracing::warn!(path = %entry.path.display(), error = %e, "cannot remove CNI cache entry");
            }
        }
        // Loopback needs no teardown beyond its namespace going away; the plugin, when it
        // brought lo up, gets its DEL to keep plugins that track it honest.
        if !self.internal_loopback {
            let _ = self
                .del_list(&loopback_network(), "lo", pod, &Map::new(), None)
                .await;
        }
        Ok(())
    }

    /// Runs CHECK for each cached network (CNI 0.4.0 and later).
    pub async fn check(&self, pod: &PodRef) -> Result<(), CniError> {
        for entry in self.cached_entries(&pod.id).await {
            if entry.network.disable_check || version_before(&entry.network.cni_version, "0.4.0") {
                continue;
            }
            for plugin in &entry.network.plugins {
                let stdin = plugin_config(
                    &entry.network,
                    plugin,
                    entry.result.as_ref(),
                    &entry.capabilities,
                );
                self.exec(&entry.network, plugin, "CHECK", &entry.ifname, pod, stdin)
                    .await?;
            }
        }
        Ok(())
    }

    /// The versions a plugin binary supports (`CNI_COMMAND=VERSION`).
    pub async fn version(&self, plugin_type: &str) -> Result<Value, CniError> {
        let binary = self.find_plugin(plugin_type)?;
        let output = run_plugin(
            &binary,
            plugin_type,
            "VERSION",
            "",
            &[
                ("CNI_COMMAND".to_string(), "VERSION".to_string()),
                ("CNI_PATH".to_string(), self.cni_path()),
            ],
            br#"{"cniVersion":"1.0.0"}"#.to_vec(),
            self.plugin_timeout,
        )
        .await?;
        serde_json::from_slice(&output).map_err(|e| CniError::Io {
            plugin: plugin_type.to_string(),
            reason: format!("malformed VERSION output: {e}"),
        })
    }

    /// ADD of one network (all its plugins), timed for the metrics.
    async fn add_list(
        &self,
        network: &NetworkConfigList,
        ifname: &str,
        pod: &PodRef,
        capabilities: &Map<String, Value>,
    ) -> Result<Value, CniError> {
        let started = std::time::Instant::now();
        let added = self.add_plugins(network, ifname, pod, capabilities).await;
        crate::metrics::metrics().cni_operation(
            "add",
            &network.name,
            started.elapsed(),
            added.is_ok(),
        );
        added
    }

    async fn add_plugins(
        &self,
        network: &NetworkConfigList,
        ifname: &str,
        pod: &PodRef,
        capabilities: &Map<String, Value>,
    ) -> Result<Value, CniError> {
        let mut prev: Option<Value> = None;
        for plugin in &network.plugins {
            let stdin = plugin_config(network, plugin, prev.as_ref(), capabilities);
            let output = self
                .exec(network, plugin, "ADD", ifname, pod, stdin)
                .await?;
            let result: Value = serde_json::from_slice(&output).map_err(|e| CniError::Io {
                plugin: plugin_type(plugin).to_string(),
                reason: format!("malformed ADD result: {e}"),
            })?;
            prev = Some(result);
        }
        Ok(prev.unwrap_or_else(|| json!({})))
    }

    /// DEL of one network (all its plugins, last first), timed for the metrics.
    async fn del_list(
        &self,
        network: &NetworkConfigList,
        ifname: &str,
        pod: &PodRef,
        capabilities: &Map<String, Value>,
        result: Option<&Value>,
    ) -> Result<(), CniError> {
        let started = std::time::Instant::now();
        let deleted = self
            .del_plugins(network, ifname, pod, capabilities, result)
            .await;
        crate::metrics::metrics().cni_operation(
            "del",
            &network.name,
            started.elapsed(),
            deleted.is_ok(),
        );
        deleted
    }

    async fn del_plugins(
        &self,
        network: &NetworkConfigList,
        ifname: &str,
        pod: &PodRef,
        capabilities: &Map<String, Value>,
        result: Option<&Value>,
    ) -> Result<(), CniError> {
        // prevResult on DEL exists from spec 0.4.0 on.
        let prev = result.filter(|_| !version_before(&network.cni_version, "0.4.0"));
        for plugin in network.plugins.iter().rev() {
            let stdin = plugin_config(network, plugin, prev, capabilities);
            self.del_plugin(network, plugin, ifname, pod, stdin).await?;
        }
        Ok(())
    }

    /// One plugin's DEL, run again after a pause when the plugin reports a failure: DEL is
    /// idempotent, and plugins fail it for a moment under load (the bridge plugin's
    /// iptables calls race other pods' with the nf_tables backend: "Chain ... does not
    /// exist"), where a pod stop failing would leave the pod for kubelet to retry.
    async fn del_plugin(
        &self,
        network: &NetworkConfigList,
        plugin: &Map<String, Value>,
        ifname: &str,
        pod: &PodRef,
        stdin: Value,
    ) -> Result<(), CniError> {
        let mut pauses = DEL_RETRY_PAUSES.iter();
        loop {
            match self
                .exec(network, plugin, "DEL", ifname, pod, stdin.clone())
                .await
            {
                Err(CniError::PluginFailed(failure)) => match pauses.next() {
                    Some(pause) => {
                        tracing::warn!(pod = %pod.id, network = %network.name, error = %failure, "CNI DEL failed; running it again");
                        tokio::time::sleep(*pause).await;
                    }
                    None => return Err(CniError::PluginFailed(failure)),
                },
                done => return done.map(|_| ()),
            }
        }
    }

    fn cni_path(&self) -> String {
        self.bin_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    }

    fn find_plugin(&self, plugin_type: &str) -> Result<PathBuf, CniError> {
        self.bin_dirs
            .iter()
            .map(|dir| dir.join(plugin_type))
            .find(|path| path.is_file())
            .ok_or_else(|| CniError::PluginNotFound {
                plugin: plugin_type.to_string(),
                dirs: self.bin_dirs.clone(),
            })
    }

    async fn exec(
        &self,
        network: &NetworkConfigList,
        plugin: &Map<String, Value>,
        command: &'static str,
        ifname: &str,
        pod: &PodRef,
        stdin: Value,
    ) -> Result<Vec<u8>, CniError> {
        let plugin_type = plugin_type(plugin);
        let binary = self.find_plugin(plugin_type)?;
        let cni_args = pod
            .cni_args()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(";");
        let env = [
            ("CNI_COMMAND".to_string(), command.to_string()),
            ("CNI_CONTAINERID".to_string(), pod.id.clone()),
            ("CNI_NETNS".to_string(), pod.netns.clone()),
            ("CNI_IFNAME".to_string(), ifname.to_string()),
            ("CNI_PATH".to_string(), self.cni_path()),
            ("CNI_ARGS".to_string(), cni_args),
        ];
        let stdin = serde_json::to_vec(&stdin).map_err(|e| CniError::Io {
            plugin: plugin_type.to_string(),
            reason: e.to_string(),
        })?;
        tracing::debug!(plugin = plugin_type, command, network = %network.name, ifname, pod = %pod.id, "running CNI plugin");
        run_plugin(
            &binary,
            plugin_type,
            command,
            &network.name,
            &env,
            stdin,
            self.plugin_timeout,
        )
        .await
    }

    fn results_dir(&self) -> PathBuf {
        self.cache_dir.join("results")
    }

    fn cache_path(&self, network: &str, id: &str, ifname: &str) -> PathBuf {
        self.results_dir().join(format!("{network}-{id}-{ifname}"))
    }

    fn write_cache(
        &self,
        network: &NetworkConfigList,
        ifname: &str,
        pod: &PodRef,
        capabilities: &Map<String, Value>,
        result: &Value,
    ) -> Result<(), CniError> {
        let path = self.cache_path(&network.name, &pod.id, ifname);
        let config = json!({
            "cniVersion": network.cni_version,
            "name": network.name,
            "disableCheck": network.disable_check,
            "plugins": network.plugins,
        });
        let entry = json!({
            "kind": "cniCacheV1",
            "containerId": pod.id,
            "config": BASE64.encode(config.to_string()),
            "ifName": ifname,
            "networkName": network.name,
            "netns": pod.netns,
            "cniArgs": pod.cni_args().into_iter().map(|(k, v)| vec![k, v]).collect::<Vec<_>>(),
            "capabilityArgs": capabilities,
            "result": result,
        });
        let fail = |reason: String| CniError::Cache {
            path: path.clone(),
            reason,
        };
        std::fs::create_dir_all(self.results_dir()).map_err(|e| fail(e.to_string()))?;
        crate::sys::fsutil::write_atomic(&path, entry.to_string().as_bytes(), 0o600)
            .map_err(|e| fail(e.to_string()))
    }

    fn remove_cache(&self, network: &str, id: &str, ifname: &str) {
        let _ = std::fs::remove_file(self.cache_path(network, id, ifname));
    }

    /// Cache entries for a pod, in interface order, read on a blocking thread (the cache
    /// dir is libcni's layout, which other tools write too).
    async fn cached_entries(&self, id: &str) -> Vec<CacheEntry> {
        let (dir, id) = (self.results_dir(), id.to_string());
        tokio::task::spawn_blocking(move || read_cache_entries(&dir, &id))
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "reading the CNI cache failed");
                Vec::new()
            })
    }

    /// The cached results of a pod (for status and recovery).
    pub async fn cached_attachments(&self, id: &str) -> Vec<NetworkAttachment> {
        self.cached_entries(id)
            .await
            .into_iter()
            .filter_map(|e| {
                e.result.map(|result| NetworkAttachment {
                    network: e.network.name.clone(),
                    ifname: e.ifname.clone(),
                    result: StoredResult::new(&result),
                })
            })
            .collect()
    }
}

/// The cache entries of pod `id` in `dir`, in interface order; unreadable ones are skipped.
fn read_cache_entries(dir: &Path, id: &str) -> Vec<CacheEntry> {
    let Ok(dir) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let marker = format!("-{id}-");
    let mut entries: Vec<CacheEntry> = dir
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.contains(&marker))
            })
            .filter_map(|path| match CacheEntry::read(&path) {
                Ok(entry) => Some(entry),
                Err(reason) => {
                    tracing::warn!(path = %path.display(), %reason, "ignoring unreadable CNI cache entry");
                    None
                }
            })
            .filter(|entry| entry.container_id == id)
            .collect();
    entries.sort_by(|a, b| a.ifname.cmp(&b.ifname));
    entries
}

struct CacheEntry {
    path: PathBuf,
    container_id: String,
    ifname: String,
    network: NetworkConfigList,
    capabilities: Map<String, Value>,
    result: Option<Value>,
}

/// The largest result cache file read back.
const MAX_CACHE_FILE: u64 = 1024 * 1024;

impl CacheEntry {
    fn read(path: &Path) -> Result<Self, String> {
        let bytes =
            crate::sys::fsutil::read_bounded(path, MAX_CACHE_FILE).map_err(|e| e.to_string())?;
        let entry: Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
        let config = entry["config"].as_str().ok_or("no config")?;
        let config = BASE64.decode(config).map_err(|e| e.to_string())?;
        let network = super::config::parse(&config, true, path)?;
        Ok(Self {
            path: path.to_path_buf(),
            container_id: entry["containerId"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            ifname: entry["ifName"].as_str().unwrap_or_default().to_string(),
            network,
            capabilities: entry["capabilityArgs"]
                .as_object()
                .cloned()
                .unwrap_or_default(),
            result: entry.get("result").filter(|r| !r.is_null()).cloned(),
        })
    }
}

fn plugin_type(plugin: &Map<String, Value>) -> &str {
    plugin
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// One plugin's stdin: its config with the network's name and version injected, the
/// previous result, and the runtime config for the capabilities it declares.
fn plugin_config(
    network: &NetworkConfigList,
    plugin: &Map<String, Value>,
    prev: Option<&Value>,
    capabilities: &Map<String, Value>,
) -> Value {
    let mut conf = plugin.clone();
    conf.insert("name".to_string(), json!(network.name));
    conf.insert("cniVersion".to_string(), json!(network.cni_version));
    if let Some(prev) = prev {
        conf.insert("prevResult".to_string(), prev.clone());
    }
    let declared = plugin.get("capabilities").and_then(Value::as_object);
    let runtime: Map<String, Value> = capabilities
        .iter()
        .filter(|(cap, _)| {
            declared
                .and_then(|d| d.get(cap.as_str()))
                .and_then(Value::as_bool)
                .unwrap_or(false)
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !runtime.is_empty() {
        conf.insert("runtimeConfig".to_string(), Value::Object(runtime));
    }
    Value::Object(conf)
}

/// Whether a CNI version string is older than `than` (both `x.y.z`).
fn version_before(version: &str, than: &str) -> bool {
    let parse = |v: &str| -> Vec<u32> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    if version.is_empty() {
        return false;
    }
    parse(version) < parse(than)
}

/// The most a plugin may print as its result (a CNI result is a few KiB).
const MAX_PLUGIN_OUTPUT: u64 = 1024 * 1024;
/// The most of a plugin's stderr kept for its error.
const MAX_PLUGIN_STDERR: u64 = 64 * 1024;

/// Reads a pipe to its end, keeping at most `limit` bytes; says whether it all fit (what
/// does not fit is read and dropped, so the plugin is never left blocked on a full pipe).
async fn read_capped<R: tokio::io::AsyncRead + Unpin>(
    pipe: Option<R>,
    limit: u64,
) -> std::io::Result<(Vec<u8>, bool)> {
    use tokio::io::AsyncReadExt;
    let Some(mut pipe) = pipe else {
        return Ok((Vec::new(), true));
    };
    let mut kept = Vec::new();
    (&mut pipe).take(limit).read_to_end(&mut kept).await?;
    let rest = tokio::io::copy(&mut pipe, &mut tokio::io::sink()).await?;
    Ok((kept, rest == 0))
}

/// Runs one plugin binary with a bound on its run time.
async fn run_plugin(
    binary: &Path,
    plugin: &str,
    command: &'static str,
    network: &str,
    env: &[(String, String)],
    stdin: Vec<u8>,
    timeout: Duration,
) -> Result<Vec<u8>, CniError> {
    let io = |reason: String| CniError::Io {
        plugin: plugin.to_string(),
        reason,
    };
    let mut child = spawn_plugin(binary, env)
        .map_err(|e| io(format!("cannot run {}: {e}", binary.display())))?;
    let group = child.id().and_then(|pid| i32::try_from(pid).ok());
    // Fed while it runs, all within the timeout: a plugin that never reads cannot hang us.
    let finished = tokio::time::timeout(timeout, feed_and_collect(&mut child, stdin)).await;
    // Whatever of its group is left (it timed out, or left a child behind) goes now.
    if let Some(group) = group {
        // SAFETY: a signal to the plugin's own process group.
        unsafe { libc::kill(-group, libc::SIGKILL) };
    }
    let Ok(collected) = finished else {
        return Err(CniError::Timeout {
            plugin: plugin.to_string(),
            command,
            network: network.to_string(),
            timeout,
        });
    };
    let output = plugin_output(collected).map_err(io)?;
    if output.status.success() {
        return Ok(output.stdout);
    }
    Err(CniError::PluginFailed(Box::new(PluginFailure {
        plugin: plugin.to_string(),
        command,
        network: network.to_string(),
        status: output.status.to_string(),
        message: plugin_error_message(&output.stdout),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    })))
}

fn spawn_plugin(binary: &Path, env: &[(String, String)]) -> std::io::Result<Child> {
    tokio::process::Command::new(binary)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group: what it runs (an IPAM plugin) goes with it.
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
}

/// What a plugin run gave: the feeding of its config, its exit, its (capped) stdout and
/// stderr, each with whether it was read whole.
type Collected = (
    std::io::Result<()>,
    std::io::Result<std::process::ExitStatus>,
    std::io::Result<(Vec<u8>, bool)>,
    std::io::Result<(Vec<u8>, bool)>,
);

/// Writes the config to the plugin's stdin while it runs, and reads its output and exit.
async fn feed_and_collect(child: &mut Child, stdin: Vec<u8>) -> Collected {
    let pipe = child.stdin.take();
    let feed = async move {
        let Some(mut pipe) = pipe else { return Ok(()) };
        match pipe.write_all(&stdin).await {
            // The plugin exited without reading its config: its status and output say why.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            other => other,
        }
        // Dropping the pipe closes the plugin's stdin.
    };
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    tokio::join!(
        feed,
        child.wait(),
        read_capped(stdout, MAX_PLUGIN_OUTPUT),
        read_capped(stderr, MAX_PLUGIN_STDERR)
    )
}

/// The plugin's output, or why it cannot be had (its stdout is cut off past the cap).
fn plugin_output((fed, status, stdout, stderr): Collected) -> Result<std::process::Output, String> {
    fed.map_err(|e| format!("writing config: {e}"))?;
    let status = status.map_err(|e| e.to_string())?;
    let (stdout, complete) = stdout.map_err(|e| format!("reading output: {e}"))?;
    if !complete {
        return Err(format!(
            "its output is larger than {MAX_PLUGIN_OUTPUT} bytes"
        ));
    }
    let (stderr, _) = stderr.unwrap_or_default();
    Ok(std::process::Output {
        status,
        stdout,
        stderr,
    })
}

/// What a failed plugin says: plugins report errors as JSON `{code, msg, details}` on
/// stdout; anything else is taken as it is.
fn plugin_error_message(stdout: &[u8]) -> String {
    serde_json::from_slice::<Value>(stdout)
        .ok()
        .map(|v| {
            let msg = v["msg"].as_str().unwrap_or_default();
            match v["details"].as_str() {
                Some(details) if !details.is_empty() => format!("{msg}: {details}"),
                _ => msg.to_string(),
            }
        })
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| String::from_utf8_lossy(stdout).trim().to_string())
}

/// The capability args (CNI `runtimeConfig`) for a pod.
pub fn capability_args(config: &crate::api::v1::PodSandboxConfig) -> Map<String, Value> {
    let mut caps = Map::new();
    let ports: Vec<Value> = config
        .port_mappings
        .iter()
        .filter(|p| p.host_port > 0)
        .map(|p| {
            let protocol = match crate::api::v1::Protocol::try_from(p.protocol) {
                Ok(crate::api::v1::Protocol::Udp) => "udp",
                Ok(crate::api::v1::Protocol::Sctp) => "sctp",
                _ => "tcp",
            };
            json!({
                "hostPort": p.host_port,
                "containerPort": p.container_port,
                "protocol": protocol,
                "hostIP": p.host_ip,
            })
        })
        .collect();
    if !ports.is_empty() {
        caps.insert("portMappings".to_string(), Value::Array(ports));
    }
    let ingress = config
        .annotations
        .get("kubernetes.io/ingress-bandwidth")
        .and_then(|q| parse_quantity(q));
    let egress = config
        .annotations
        .get("kubernetes.io/egress-bandwidth")
        .and_then(|q| parse_quantity(q));
    if ingress.is_some() || egress.is_some() {
        let mut bw = Map::new();
        if let Some(rate) = ingress {
            bw.insert("ingressRate".to_string(), json!(rate));
            bw.insert("ingressBurst".to_string(), json!(u32::MAX));
        }
        if let Some(rate) = egress {
            bw.insert("egressRate".to_string(), json!(rate));
            bw.insert("egressBurst".to_string(), json!(u32::MAX));
        }
        caps.insert("bandwidth".to_string(), Value::Object(bw));
    }
    if let Some(dns) = &config.dns_config {
        caps.insert(
            "dns".to_string(),
            json!({"servers": dns.servers, "searches": dns.searches, "options": dns.options}),
        );
    }
    caps
}

/// A Kubernetes quantity (`10M`, `1Gi`, `500k`) as a number.
fn parse_quantity(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor: f64 = match suffix {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some((number * factor) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_result_persists_as_the_json_object_it_was() {
        let result = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.5/16"}]});
        let attachment = NetworkAttachment {
            network: "net".into(),
            ifname: "eth0".into(),
            result: StoredResult::new(&result),
        };
        let persisted = serde_json::to_value(&attachment).unwrap();
        // The same layout as when the result was a `Value`: pods recorded before come back.
        assert_eq!(persisted["result"], result);
        let back: NetworkAttachment = serde_json::from_value(persisted).unwrap();
        assert_eq!(back, attachment);
        assert_eq!(back.result.value(), result);
    }

    #[test]
    fn plugin_config_gets_name_version_prev_result_and_declared_capabilities() {
        let network = super::super::config::parse(
            br#"{"cniVersion":"1.0.0","name":"net","plugins":[
                {"type":"bridge"},{"type":"portmap","capabilities":{"portMappings":true}}]}"#,
            true,
            Path::new("x"),
        )
        .unwrap();
        let mut caps = Map::new();
        caps.insert("portMappings".into(), json!([{"hostPort": 80}]));
        caps.insert("dns".into(), json!({"servers": []}));
        let bridge = plugin_config(&network, &network.plugins[0], None, &caps);
        assert_eq!(bridge["name"], "net");
        assert_eq!(bridge["cniVersion"], "1.0.0");
        assert!(bridge.get("runtimeConfig").is_none());
        assert!(bridge.get("prevResult").is_none());
        let prev = json!({"ips": []});
        let portmap = plugin_config(&network, &network.plugins[1], Some(&prev), &caps);
        assert_eq!(portmap["prevResult"], prev);
        assert_eq!(portmap["runtimeConfig"]["portMappings"][0]["hostPort"], 80);
        assert!(portmap["runtimeConfig"].get("dns").is_none());
    }

    #[test]
    fn quantities_and_versions() {
        assert_eq!(parse_quantity("10M"), Some(10_000_000));
        assert_eq!(parse_quantity("1Gi"), Some(1 << 30));
        assert_eq!(parse_quantity("bogus"), None);
        assert!(version_before("0.3.1", "0.4.0"));
        assert!(!version_before("1.0.0", "0.4.0"));
        assert!(!version_before("", "0.4.0"));
    }

    #[test]
    fn capability_args_from_pod_config() {
        let config = crate::api::v1::PodSandboxConfig {
            port_mappings: vec![
                crate::api::v1::PortMapping {
                    protocol: crate::api::v1::Protocol::Udp as i32,
                    container_port: 53,
                    host_port: 5353,
                    host_ip: String::new(),
                },
                crate::api::v1::PortMapping {
                    container_port: 80,
                    ..Default::default()
                },
            ],
            annotations: [(
                "kubernetes.io/ingress-bandwidth".to_string(),
                "1M".to_string(),
            )]
            .into_iter()
            .collect(),
            ..Default::default()
        };
        let caps = capability_args(&config);
        assert_eq!(caps["portMappings"].as_array().unwrap().len(), 1);
        assert_eq!(caps["portMappings"][0]["protocol"], "udp");
        assert_eq!(caps["bandwidth"]["ingressRate"], 1_000_000);
        assert!(caps.get("dns").is_none());
    }
}
