//! crius's configuration: the TOML file, its defaults and its validation.
//!
//! The file's keys are a public interface (operators and scripts depend on them), so every
//! struct here rejects unknown keys and every semantic check names the key it is about.
//! Nothing here touches containerd or the network.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The path `crius` reads when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/crius/config.toml";

/// Errors from loading or validating a configuration file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("failed to read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// Config text that is not a crius config ([`Config::from_toml_str`]).
    #[error("invalid config: {message}")]
    Syntax { message: String },
    #[error("invalid config: {key}: {reason}")]
    Invalid { key: String, reason: String },
}

fn invalid(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_string(),
        reason: reason.into(),
    }
}

/// Whether crius clamps the OOM score adjustment it asks for to what it may set itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RestrictOomScoreAdj {
    /// Detect at start-up whether this process may lower its own oom_score_adj.
    #[default]
    Auto,
    /// Always clamp to crius's own oom_score_adj.
    Always,
    /// Never clamp.
    Never,
}

impl Serialize for RestrictOomScoreAdj {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match self {
            Self::Auto => "auto",
            Self::Always => "true",
            Self::Never => "false",
        })
    }
}

impl<'de> Deserialize<'de> for RestrictOomScoreAdj {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bool(bool),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bool(true) => Ok(Self::Always),
            Raw::Bool(false) => Ok(Self::Never),
            Raw::Text(t) => match t.as_str() {
                "auto" => Ok(Self::Auto),
                "true" => Ok(Self::Always),
                "false" => Ok(Self::Never),
                other => Err(serde::de::Error::custom(format!(
                    "restrict_oom_score_adj must be \"auto\", true or false, not {other:?}"
                ))),
            },
        }
    }
}

/// Durations are written as humantime strings: "10s", "5m", "4h".
mod duration_str {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map_err(|e| {
            serde::de::Error::custom(format!(
                "invalid duration {text:?}: {e} (write it like \"10s\", \"5m\" or \"4h\")"
            ))
        })
    }
}

/// An optional duration: absent or `""` is `None`.
mod opt_duration_str {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::duration_str::serialize(d, s),
            None => s.serialize_str(""),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text = String::deserialize(d)?;
        if text.is_empty() {
            return Ok(None);
        }
        humantime::parse_duration(&text).map(Some).map_err(|e| {
            serde::de::Error::custom(format!(
                "invalid duration {text:?}: {e} (write it like \"10s\", or \"\" for none)"
            ))
        })
    }
}

/// The longest log line crius keeps in one entry whatever `max_container_log_line_size`
/// says: a container that never writes a newline cannot make it buffer without bound.
pub const HARD_MAX_LOG_LINE: usize = 1024 * 1024;

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Persistent state: container status files, sandbox files.
    pub root: PathBuf,
    /// Volatile state: FIFOs, shm mounts.
    pub state: PathBuf,
    pub restrict_oom_score_adj: RestrictOomScoreAdj,
    #[serde(with = "duration_str")]
    pub stats_collect_period: Duration,
    /// How often every running container's and pod cgroup's CPU time is sampled in the
    /// background, so that `UsageNanoCores` is there on a first stats call and spans one
    /// period (containerd 2.3's runtime-side `stats_collect_period`). Zero: no sampling;
    /// the rate is then between one stats call and the one before it.
    #[serde(with = "duration_str")]
    pub cpu_sample_period: Duration,
    /// Do not give containers the volumes their image declares (`VOLUME`).
    pub ignore_image_defined_volumes: bool,
    /// Container log lines longer than this are split into partial entries; zero or less
    /// means no limit of its own (crius still splits at [`HARD_MAX_LOG_LINE`]).
    pub max_container_log_line_size: i64,
    /// containerd's `drain_exec_sync_io_timeout`: how long an ExecSync waits, after its
    /// process exited, for the output to close (a background child may hold it) before it
    /// kills the exec and fails with "failed to drain exec process". Zero: as long as the
    /// client's deadline allows. None: crius drains for at most half a second and answers
    /// with the output that came.
    #[serde(with = "opt_duration_str", skip_serializing_if = "Option::is_none")]
    pub drain_exec_sync_io_timeout: Option<Duration>,
    pub grpc: GrpcConfig,
    pub containerd: ContainerdConfig,
    pub cni: CniConfig,
    pub image: ImageConfig,
    pub registry: RegistryConfig,
    pub stream: StreamConfig,
    pub cdi: CdiConfig,
    pub userns: UsernsConfig,
    pub sandbox_controller: SandboxControllerConfig,
    pub log: LogConfig,
    pub metrics: MetricsConfig,
}

impl Config {
    /// The longest line content in one container log entry.
    pub fn log_line_limit(&self) -> usize {
        usize::try_from(self.max_container_log_line_size)
            .ok()
            .filter(|n| *n > 0)
            .map_or(HARD_MAX_LOG_LINE, |n| n.min(HARD_MAX_LOG_LINE))
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            root: PathBuf::from("/var/lib/crius"),
            state: PathBuf::from("/run/crius"),
            restrict_oom_score_adj: RestrictOomScoreAdj::Auto,
            stats_collect_period: Duration::from_secs(10),
            cpu_sample_period: Duration::from_secs(1),
            ignore_image_defined_volumes: false,
            max_container_log_line_size: 16 * 1024,
            drain_exec_sync_io_timeout: None,
            grpc: GrpcConfig::default(),
            containerd: ContainerdConfig::default(),
            cni: CniConfig::default(),
            image: ImageConfig::default(),
            registry: RegistryConfig::default(),
            stream: StreamConfig::default(),
            cdi: CdiConfig::default(),
            userns: UsernsConfig::default(),
            sandbox_controller: SandboxControllerConfig::default(),
            log: LogConfig::default(),
            metrics: MetricsConfig::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GrpcConfig {
    pub address: PathBuf,
    pub ttrpc_address: PathBuf,
}

impl Default for GrpcConfig {
    fn default() -> Self {
        Self {
            address: PathBuf::from("/run/crius/crius.sock"),
            ttrpc_address: PathBuf::from("/run/crius/crius.sock.ttrpc"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ContainerdConfig {
    pub address: PathBuf,
    pub namespace: String,
    pub snapshotter: String,
    /// containerd's own root directory; the image filesystem lives below it.
    pub root: PathBuf,
    /// How long start-up keeps retrying to reach containerd.
    #[serde(with = "duration_str")]
    pub connect_timeout: Duration,
    pub default_runtime: String,
    pub runtimes: BTreeMap<String, RuntimeConfig>,
}

impl Default for ContainerdConfig {
    fn default() -> Self {
        let mut runtimes = BTreeMap::new();
        runtimes.insert("runc".to_string(), RuntimeConfig::default());
        runtimes.insert(
            "containerd-runc".to_string(),
            RuntimeConfig {
                runtime_type: RUNC_SHIM.to_string(),
                ..RuntimeConfig::default()
            },
        );
        Self {
            address: PathBuf::from("/run/containerd/containerd.sock"),
            namespace: "k8s.io".to_string(),
            snapshotter: "overlayfs".to_string(),
            root: PathBuf::from("/var/lib/containerd"),
            connect_timeout: Duration::from_secs(30),
            default_runtime: "runc".to_string(),
            runtimes,
        }
    }
}

/// crius's own shim (`containerd-shim-crius-v2`): one process per pod, runc underneath.
pub const CRIUS_SHIM: &str = "io.containerd.crius.v2";
/// containerd's Go runc shim (`containerd-shim-runc-v2`).
pub const RUNC_SHIM: &str = "io.containerd.runc.v2";
/// Runtime types that take runc's shim options (and run runc or a runtime like it).
pub const RUNC_RUNTIME_TYPES: &[&str] = &[CRIUS_SHIM, RUNC_SHIM, "io.containerd.runc.v1"];

/// One runtime handler: what containerd runs a pod's tasks with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeConfig {
    pub runtime_type: String,
    pub options: RuncOptions,
    /// Pod annotations (glob patterns) passed on to the runtime in the OCI spec.
    pub pod_annotations: Vec<String>,
    /// Container annotations (glob patterns) passed on to the runtime in the OCI spec.
    pub container_annotations: Vec<String>,
    pub privileged_without_host_devices: bool,
    /// Every exec goes to the OCI runtime (`runc exec`), never crius's shim's own exec.
    pub exec_with_runtime: bool,
    /// The snapshotter this handler's pods and their images use; empty: `containerd.snapshotter`.
    pub snapshotter: String,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            runtime_type: CRIUS_SHIM.to_string(),
            options: RuncOptions::default(),
            pod_annotations: Vec::new(),
            container_annotations: Vec::new(),
            privileged_without_host_devices: false,
            exec_with_runtime: false,
            snapshotter: String::new(),
        }
    }
}

/// The runc shim options (`containerd.runc.v1.Options`), with containerd's key names.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "PascalCase")]
pub struct RuncOptions {
    pub binary_name: String,
    pub root: String,
    pub systemd_cgroup: bool,
    pub no_pivot_root: bool,
    pub no_new_keyring: bool,
    pub shim_cgroup: String,
    pub io_uid: u32,
    pub io_gid: u32,
    pub criu_image_path: String,
    pub criu_work_path: String,
}

/// crius as containerd 2.x's sandbox controller (a `sandbox` proxy plugin): containerd's
/// own CRI hands the pods of a runtime handler whose `sandboxer` names the plugin to crius,
/// which runs each on its shim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxControllerConfig {
    /// The unix socket containerd's `[proxy_plugins.<name>] address` names. Empty: off.
    pub address: PathBuf,
    /// The shim binary each pod runs on (found on the PATH unless absolute).
    pub shim: PathBuf,
}

impl Default for SandboxControllerConfig {
    fn default() -> Self {
        Self {
            address: PathBuf::new(),
            shim: PathBuf::from("containerd-shim-crius-v2"),
        }
    }
}

/// CDI (Container Device Interface) devices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CdiConfig {
    /// Where CDI spec files (JSON or YAML) are read from; a device in a later directory
    /// replaces one of the same name in an earlier one. Empty: CDI devices are refused.
    pub spec_dirs: Vec<PathBuf>,
}

impl Default for CdiConfig {
    fn default() -> Self {
        Self {
            spec_dirs: vec![PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")],
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CniConfig {
    pub bin_dirs: Vec<PathBuf>,
    pub conf_dir: PathBuf,
    /// How many network configs to load from the conf dir (0: all).
    pub max_conf_num: usize,
    /// A template that UpdateRuntimeConfig turns into a conflist once the pod CIDR is known.
    pub conf_template: String,
    /// Bound on one CNI plugin invocation.
    #[serde(with = "duration_str")]
    pub plugin_timeout: Duration,
    /// Where CNI results are cached (libcni's layout: `<cache_dir>/results/...`).
    pub cache_dir: PathBuf,
    /// Bring up a pod's `lo` without the loopback plugin (containerd's option of the name).
    pub use_internal_loopback: bool,
}

impl Default for CniConfig {
    fn default() -> Self {
        Self {
            bin_dirs: vec![PathBuf::from("/usr/lib/cni"), PathBuf::from("/opt/cni/bin")],
            conf_dir: PathBuf::from("/etc/cni/net.d"),
            max_conf_num: 1,
            conf_template: String::new(),
            plugin_timeout: Duration::from_secs(60),
            cache_dir: PathBuf::from("/var/lib/cni"),
            use_internal_loopback: true,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImageConfig {
    /// Empty: crius's built-in pause image.
    pub sandbox_image: String,
    #[serde(with = "duration_str")]
    pub pull_progress_timeout: Duration,
    /// The slowest average, in bytes a second, a whole pull may have over the sizes its
    /// manifest promised, on top of `pull_progress_timeout`. 0: no overall limit.
    pub pull_min_rate: u64,
    pub max_concurrent_downloads: usize,
    /// Layers of one pull applied at once; 0: one per CPU.
    pub max_concurrent_unpacks: usize,
}

impl ImageConfig {
    /// How many layers of a pull are applied at once.
    pub fn unpacks_at_once(&self) -> usize {
        match self.max_concurrent_unpacks {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            n => n,
        }
    }
}

impl Default for ImageConfig {
    fn default() -> Self {
        Self {
            sandbox_image: String::new(),
            pull_progress_timeout: Duration::from_secs(5 * 60),
            pull_min_rate: 16 * 1024,
            max_concurrent_downloads: 3,
            max_concurrent_unpacks: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegistryConfig {
    /// A containerd-style directory of `<host>/hosts.toml` files.
    pub config_path: String,
    /// Static settings per registry host, e.g. `[registry.configs."example.com:5000".auth]`.
    pub configs: BTreeMap<String, RegistryHostConfig>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegistryHostConfig {
    pub auth: Option<RegistryAuth>,
}

/// Static credentials for one registry, with the keys containerd uses.
#[derive(Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegistryAuth {
    pub username: String,
    pub password: String,
    /// base64 of `username:password`.
    pub auth: String,
    pub identitytoken: String,
}

/// The secrets of a `RegistryAuth` as they may be shown: `<redacted>` when set.
pub const REDACTED: &str = "<redacted>";

fn redact(secret: &str) -> &str {
    if secret.is_empty() { "" } else { REDACTED }
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAuth")
            .field("username", &self.username)
            .field("password", &redact(&self.password))
            .field("auth", &redact(&self.auth))
            .field("identitytoken", &redact(&self.identitytoken))
            .finish()
    }
}

impl RegistryAuth {
    /// The same credentials with the secrets replaced, for showing (`crictl info`).
    pub fn redacted(&self) -> Self {
        Self {
            username: self.username.clone(),
            password: redact(&self.password).to_string(),
            auth: redact(&self.auth).to_string(),
            identitytoken: redact(&self.identitytoken).to_string(),
        }
    }
}

impl Config {
    /// The config as `Status` shows it: registry secrets redacted.
    pub fn redacted(&self) -> Self {
        let mut shown = self.clone();
        for host in shown.registry.configs.values_mut() {
            if let Some(auth) = host.auth.as_mut() {
                *auth = auth.redacted();
            }
        }
        shown
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StreamConfig {
    pub address: String,
    pub port: u16,
    #[serde(with = "duration_str")]
    pub idle_timeout: Duration,
    /// How long an Exec/Attach/PortForward URL stays usable.
    #[serde(with = "duration_str")]
    pub token_ttl: Duration,
    /// How long a new connection has for its TLS handshake and a request with a valid
    /// token, however slowly its bytes come; then it is closed.
    #[serde(with = "duration_str")]
    pub request_timeout: Duration,
    /// Connections and sessions the server holds at once. When full, the oldest connections
    /// that have presented no request yet are closed to make room; sessions never are.
    pub max_connections: usize,
    /// Serve HTTPS: with the key pair below, or a self-signed certificate when none is set.
    pub tls: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert_file: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key_file: Option<PathBuf>,
}

impl Default for StreamConfig {
    fn default() -> Self {
        Self {
            address: "127.0.0.1".to_string(),
            port: 0,
            idle_timeout: Duration::from_secs(4 * 3600),
            token_ttl: Duration::from_secs(60),
            request_timeout: Duration::from_secs(5),
            max_connections: 1024,
            tls: false,
            tls_cert_file: None,
            tls_key_file: None,
        }
    }
}

/// Pods in their own user namespace (`hostUsers: false`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UsernsConfig {
    pub rootfs: UsernsRootfs,
}

/// How such a pod's rootfs is given to the pod's IDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UsernsRootfs {
    /// Idmapped layers where the host can idmap mounts, else the chowned copy.
    #[default]
    Auto,
    /// Idmapped layers only: no such pods on a host that cannot idmap.
    Idmap,
    /// A copy of the image with every owner shifted into the pod's range, shared by the
    /// pods of one range (containerd 1.7's remapped snapshot): any kernel, but a copy per
    /// image and range.
    Copy,
}

pub use crate::logging::LogFormat;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// A tracing filter: a level (`info`) or directives (`crius=debug,tower=warn`).
    pub level: String,
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: "info".to_string(),
            format: LogFormat::Text,
        }
    }
}

/// crius's own Prometheus metrics.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// `host:port` to serve `GET /metrics` on (plain HTTP). Empty: no listener.
    pub address: String,
}

impl Config {
    /// Loads and validates the file at `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml_str(&text).map_err(|e| match e {
            ConfigError::Syntax { message } => ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            },
            other => other,
        })
    }

    /// Parses and validates config text (a file's contents, as `load` reads them).
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            message: e.to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Loads `path` when given; otherwise the default path when that file exists, else the
    /// built-in defaults.
    pub fn load_or_default(path: Option<&Path>) -> Result<Self, ConfigError> {
        match path {
            Some(p) => Self::load(p),
            None if Path::new(DEFAULT_CONFIG_PATH).exists() => {
                Self::load(Path::new(DEFAULT_CONFIG_PATH))
            }
            None => Ok(Self::default()),
        }
    }

    /// Checks what the types alone cannot, naming the offending key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_paths()?;
        self.validate_listeners()?;
        self.validate_containerd()?;
        self.validate_cni_and_images()?;
        self.validate_stream()?;
        if crate::logging::parse_filter(&self.log.level).is_none() {
            return Err(invalid(
                "log.level",
                format!(
                    "{:?} is not a level (error, warn, info, debug, trace) or filter",
                    self.log.level
                ),
            ));
        }
        Ok(())
    }

    fn validate_paths(&self) -> Result<(), ConfigError> {
        for (key, path) in [
            ("root", &self.root),
            ("state", &self.state),
            ("grpc.address", &self.grpc.address),
            ("grpc.ttrpc_address", &self.grpc.ttrpc_address),
            ("containerd.address", &self.containerd.address),
            ("containerd.root", &self.containerd.root),
            ("cni.conf_dir", &self.cni.conf_dir),
            ("cni.cache_dir", &self.cni.cache_dir),
        ] {
            if !path.is_absolute() {
                return Err(invalid(
                    key,
                    format!("must be an absolute path, got {path:?}"),
                ));
            }
        }
        Ok(())
    }

    /// The CRI sockets and the metrics listener.
    fn validate_listeners(&self) -> Result<(), ConfigError> {
        if self.grpc.address == self.grpc.ttrpc_address {
            return Err(invalid(
                "grpc.ttrpc_address",
                "must differ from grpc.address",
            ));
        }
        if !self.metrics.address.is_empty()
            && self
                .metrics
                .address
                .parse::<std::net::SocketAddr>()
                .is_err()
        {
            return Err(invalid(
                "metrics.address",
                format!(
                    "must be an IP address and port such as \"127.0.0.1:9838\", got {:?}",
                    self.metrics.address
                ),
            ));
        }
        Ok(())
    }

    fn validate_containerd(&self) -> Result<(), ConfigError> {
        if self.containerd.namespace.is_empty() {
            return Err(invalid("containerd.namespace", "must not be empty"));
        }
        if self.containerd.snapshotter.is_empty() {
            return Err(invalid("containerd.snapshotter", "must not be empty"));
        }
        if !self
            .containerd
            .runtimes
            .contains_key(&self.containerd.default_runtime)
        {
            return Err(invalid(
                "containerd.default_runtime",
                format!(
                    "runtime {:?} is not defined under [containerd.runtimes]",
                    self.containerd.default_runtime
                ),
            ));
        }
        for (name, runtime) in &self.containerd.runtimes {
            if runtime.runtime_type.is_empty() {
                return Err(invalid(
                    &format!("containerd.runtimes.{name}.runtime_type"),
                    "must not be empty",
                ));
            }
        }
        Ok(())
    }

    fn validate_cni_and_images(&self) -> Result<(), ConfigError> {
        if self.cni.bin_dirs.is_empty() {
            return Err(invalid("cni.bin_dirs", "must name at least one directory"));
        }
        if self.image.max_concurrent_downloads == 0 {
            return Err(invalid(
                "image.max_concurrent_downloads",
                "must be at least 1",
            ));
        }
        if self.stats_collect_period.is_zero() {
            return Err(invalid("stats_collect_period", "must be longer than zero"));
        }
        Ok(())
    }

    fn validate_stream(&self) -> Result<(), ConfigError> {
        if self.stream.address.parse::<std::net::IpAddr>().is_err() {
            return Err(invalid(
                "stream.address",
                format!("{:?} is not an IP address", self.stream.address),
            ));
        }
        if self.stream.tls_cert_file.is_some() != self.stream.tls_key_file.is_some() {
            return Err(invalid(
                "stream.tls_cert_file",
                "tls_cert_file and tls_key_file must be set together",
            ));
        }
        if self.stream.token_ttl.is_zero() {
            return Err(invalid("stream.token_ttl", "must be longer than zero"));
        }
        if self.stream.idle_timeout.is_zero() {
            return Err(invalid("stream.idle_timeout", "must be longer than zero"));
        }
        if self.stream.request_timeout.is_zero() {
            return Err(invalid(
                "stream.request_timeout",
                "must be longer than zero",
            ));
        }
        if self.stream.max_connections == 0 {
            return Err(invalid("stream.max_connections", "must be at least 1"));
        }
        Ok(())
    }

    /// The runtime handler to use for `name` ("" means the default runtime).
    pub fn runtime(&self, name: &str) -> Option<&RuntimeConfig> {
        let name = if name.is_empty() {
            self.containerd.default_runtime.as_str()
        } else {
            name
        };
        self.containerd.runtimes.get(name)
    }

    /// The snapshotter of runtime handler `name` ("" the default handler): its own, else
    /// `containerd.snapshotter`; also for a handler that is not configured, as containerd
    /// pulls for one.
    pub fn snapshotter_for(&self, name: &str) -> &str {
        self.runtime(name)
            .map(|r| r.snapshotter.as_str())
            .filter(|s| !s.is_empty())
            .unwrap_or(&self.containerd.snapshotter)
    }

    /// Every snapshotter some handler uses, the default first.
    pub fn snapshotters(&self) -> Vec<&str> {
        let mut all = vec![self.containerd.snapshotter.as_str()];
        for runtime in self.containerd.runtimes.values() {
            if !runtime.snapshotter.is_empty() && !all.contains(&runtime.snapshotter.as_str()) {
                all.push(&runtime.snapshotter);
            }
        }
        all
    }

    /// containerd's convention for a snapshotter's directory.
    pub fn image_fs_path(&self) -> PathBuf {
        self.containerd.root.join(format!(
            "io.containerd.snapshotter.v1.{}",
            self.containerd.snapshotter
        ))
    }
}

/// The complete default configuration, commented, as `crius config default` prints it.
pub const DEFAULT_CONFIG_TOML: &str = r#"# crius configuration. Every key is optional; these are the defaults.

# Persistent state (container status files, sandbox files).
root = "/var/lib/crius"
# Volatile state (FIFOs, /dev/shm mounts); usually on tmpfs.
state = "/run/crius"
# Clamp the OOM score adjustment of sandboxes and containers to what crius itself may set:
# "auto" detects whether this process may lower its own oom_score_adj; true or false force it.
restrict_oom_score_adj = "auto"
# How often container and snapshot usage is collected.
stats_collect_period = "10s"
# How often each container's CPU time is sampled for its rate (UsageNanoCores); "0s": only
# when stats are asked for.
cpu_sample_period = "1s"
# Give containers no volumes for the paths their image declares (VOLUME).
ignore_image_defined_volumes = false
# Container log lines longer than this many bytes are split into partial entries; 0 or less
# means no limit of crius's own (it still splits at 1 MiB).
max_container_log_line_size = 16384
# After an ExecSync's process exited, wait this long for its output to close (a background
# child may hold it), then kill the exec and fail with "failed to drain exec process", as
# containerd's CRI does ("0s": as long as the client's deadline allows). Unset: drain for at
# most half a second and answer with the output that came.
# drain_exec_sync_io_timeout = "10s"

[grpc]
# The CRI gRPC socket that kubelet and crictl connect to.
address = "/run/crius/crius.sock"
# The same CRI services over ttrpc.
ttrpc_address = "/run/crius/crius.sock.ttrpc"

[containerd]
address = "/run/containerd/containerd.sock"
# The containerd namespace crius keeps its containers and images in.
namespace = "k8s.io"
snapshotter = "overlayfs"
# containerd's root directory; the image filesystem is <root>/io.containerd.snapshotter.v1.<snapshotter>.
root = "/var/lib/containerd"
# How long start-up retries to reach containerd before giving up.
connect_timeout = "30s"
# The runtime handler used when a pod names none.
default_runtime = "runc"

# The default handler: runc under crius's own shim (containerd-shim-crius-v2, one small
# process per pod; containerd finds it on its PATH).
[containerd.runtimes.runc]
runtime_type = "io.containerd.crius.v2"
# Pod and container annotations (glob patterns) passed through to the runtime.
pod_annotations = []
container_annotations = []
privileged_without_host_devices = false
# Run every exec with `runc exec` rather than the shim's own exec (which it uses for execs
# that ask nothing only runc does).
exec_with_runtime = false
# The snapshotter of this handler's pods and of the images pulled for it (PullImage with
# this runtime handler); "": containerd.snapshotter.
snapshotter = ""
# runc shim options; BinaryName selects another OCI runtime such as crun.
options = { BinaryName = "", Root = "", SystemdCgroup = false, NoPivotRoot = false, NoNewKeyring = false, ShimCgroup = "", IoUid = 0, IoGid = 0, CriuImagePath = "", CriuWorkPath = "" }

# runc under containerd's Go shim (containerd-shim-runc-v2). Other shims (kata, gVisor)
# are added the same way, with their runtime_type.
[containerd.runtimes.containerd-runc]
runtime_type = "io.containerd.runc.v2"
pod_annotations = []
container_annotations = []
privileged_without_host_devices = false
exec_with_runtime = false
snapshotter = ""
options = { BinaryName = "", Root = "", SystemdCgroup = false, NoPivotRoot = false, NoNewKeyring = false, ShimCgroup = "", IoUid = 0, IoGid = 0, CriuImagePath = "", CriuWorkPath = "" }

[cni]
bin_dirs = ["/usr/lib/cni", "/opt/cni/bin"]
conf_dir = "/etc/cni/net.d"
# How many network configs to load from conf_dir, in file name order (0: all).
max_conf_num = 1
# A conflist template written to conf_dir by UpdateRuntimeConfig once the pod CIDR is known
# ({{.PodCIDR}}, {{.PodCIDRRanges}} and {{.Routes}} are replaced). Empty: none.
conf_template = ""
# Bound on one CNI plugin invocation.
plugin_timeout = "1m"
# Where CNI results are cached, in libcni's layout (<cache_dir>/results/...).
cache_dir = "/var/lib/cni"
# Bring up each pod's lo itself rather than with the loopback plugin (a process per pod).
use_internal_loopback = true

[image]
# The pause image for pod sandboxes. Empty: crius's built-in pause image.
sandbox_image = ""
# A pull that makes no useful progress (32 KiB of a layer, or a blob done) for this long
# is cancelled.
pull_progress_timeout = "5m"
# A whole pull may take pull_progress_timeout plus its promised bytes at this many bytes a
# second (at most 24 h). 0: no overall limit.
pull_min_rate = 16384
max_concurrent_downloads = 3
# Layers of one pull applied at once (overlayfs: each ahead of its parent); 0: one per CPU.
max_concurrent_unpacks = 0

[registry]
# A containerd-style hosts directory: <config_path>/<host>/hosts.toml.
config_path = ""
# Static credentials per registry host, e.g.:
# [registry.configs."registry.example.com".auth]
# username = "me"
# password = "secret"

[stream]
# The exec/attach/port-forward stream server; port 0 picks a free port.
address = "127.0.0.1"
port = 0
# A connection with no traffic either way for this long is closed.
idle_timeout = "4h"
# How long the URL an Exec, Attach or PortForward call returns stays usable (once).
token_ttl = "1m"
# A new connection is closed unless its request (with a valid token) comes within this,
# TLS handshake included.
request_timeout = "5s"
# Connections and sessions held at once; when full, the oldest connections without a
# request are closed to make room (open sessions never are).
max_connections = 1024
# HTTPS for the stream server. Without a key pair a self-signed certificate is made.
tls = false
# tls_cert_file = "/etc/crius/stream.crt"
# tls_key_file = "/etc/crius/stream.key"

[cdi]
# Where CDI device specs (JSON or YAML, from device plugins and DRA drivers) are read, for
# devices a container names in CDI_devices or cdi.k8s.io/* annotations. A device in a later
# directory replaces one of the same name in an earlier one. Empty: CDI devices are refused.
spec_dirs = ["/etc/cdi", "/var/run/cdi"]

[userns]
# How the rootfs of a pod in its own user namespace (hostUsers: false) is given to the pod's
# IDs: "idmap" (idmapped image layers; Linux 5.19+), "copy" (a copy of the image with its
# owners shifted into the pod's range, shared by pods of that range), or "auto" (idmap
# where the host can, else copy).
rootfs = "auto"

[log]
# error | warn | info | debug | trace, or a filter such as "crius=debug,info".
level = "info"
format = "text"   # text | json

[metrics]
# host:port for Prometheus to scrape GET /metrics from (plain HTTP), e.g. "127.0.0.1:9838".
# Empty: no metrics listener. `crius metrics` lists every metric.
address = ""

[sandbox_controller]
# Serve containerd 2.x's sandbox Controller (a `sandbox` proxy plugin) on this unix socket.
# Empty: off.
address = ""
# The shim each such pod runs on (found on the PATH unless absolute).
shim = "containerd-shim-crius-v2"
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        let config: Config = toml::from_str(text).map_err(|e| e.to_string())?;
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    #[test]
    fn registry_secrets_never_show_in_debug_or_the_shown_config() {
        let config = parse(
            r#"
[registry.configs."example.com".auth]
username = "alice"
password = "hunter2"
auth = "YWxpY2U6aHVudGVyMg=="
"#,
        )
        .unwrap();
        let shown = serde_json::to_string(&config.redacted()).unwrap();
        let debug = format!("{config:?}");
        for text in [&shown, &debug] {
            assert!(
                !text.contains("hunter2") && !text.contains("YWxpY2U6"),
                "{text}"
            );
            assert!(text.contains("alice") && text.contains(REDACTED), "{text}");
        }
        // The config itself keeps them: crius uses them.
        let auth = config.registry.configs["example.com"]
            .auth
            .as_ref()
            .unwrap();
        assert_eq!(auth.password, "hunter2");
    }

    /// The keys `crius config default` prints (commented-out ones too), as the reference
    /// names them: a runtime handler's keys and a registry's credentials belong to the rows
    /// `containerd.runtimes.<name>` and `registry.configs."<host>".auth`, returned with the
    /// key inside them.
    fn printed_keys(text: &str) -> Vec<(String, Option<String>)> {
        let mut section = String::new();
        let mut keys = Vec::new();
        for line in text.lines() {
            let line = line.trim_start_matches('#').trim();
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = if name.starts_with("containerd.runtimes.") {
                    "containerd.runtimes.<name>".to_string()
                } else if name.starts_with("registry.configs.") && name.ends_with(".auth") {
                    "registry.configs.\"<host>\".auth".to_string()
                } else {
                    name.to_string()
                };
                continue;
            }
            let Some((key, _)) = line.split_once(" = ") else {
                continue;
            };
            if key.is_empty() || !key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                continue;
            }
            if section.contains('<') {
                keys.push((section.clone(), Some(key.to_string())));
            } else if section.is_empty() {
                keys.push((key.to_string(), None));
            } else {
                keys.push((format!("{section}.{key}"), None));
            }
        }
        keys
    }

    /// docs/configuration.md's table rows: the keys each names (its first cell), the row.
    fn reference_rows(doc: &str) -> Vec<(Vec<String>, &str)> {
        doc.lines()
            .filter(|l| l.starts_with("| `"))
            .map(|row| {
                let first = row.split(" | ").next().unwrap_or_default();
                let keys = first
                    .split('`')
                    .skip(1)
                    .step_by(2)
                    .map(str::to_string)
                    .collect();
                (keys, row)
            })
            .collect()
    }

    #[test]
    fn the_configuration_reference_and_config_default_name_the_same_keys() {
        let rows = reference_rows(include_str!("../docs/configuration.md"));
        let printed = printed_keys(DEFAULT_CONFIG_TOML);
        assert!(printed.len() > 40, "{printed:?}");
        for (key, inner) in &printed {
            let row = rows.iter().find(|(keys, _)| keys.contains(key));
            let Some((_, row)) = row else {
                panic!(
                    "`crius config default` prints {key}; docs/configuration.md has no row for it"
                );
            };
            if let Some(inner) = inner {
                assert!(
                    row.contains(&format!("`{inner}`")),
                    "docs/configuration.md's row for {key} does not name `{inner}`"
                );
            }
        }
        for (keys, _) in &rows {
            for key in keys {
                assert!(
                    printed.iter().any(|(k, _)| k == key),
                    "docs/configuration.md names {key}, which `crius config default` does not print"
                );
            }
        }
    }

    #[test]
    fn printed_default_config_is_the_builtin_default() {
        let parsed = parse(DEFAULT_CONFIG_TOML).expect("default config parses");
        assert_eq!(parsed, Config::default());
    }

    #[test]
    fn the_documented_file_shape_parses() {
        let text = r#"
root = "/var/lib/crius"
state = "/run/crius"
restrict_oom_score_adj = "auto"
stats_collect_period = "10s"
[grpc]
address = "/run/crius/crius.sock"
ttrpc_address = "/run/crius/crius.sock.ttrpc"
[containerd]
address = "/run/containerd/containerd.sock"
namespace = "k8s.io"
snapshotter = "overlayfs"
root = "/var/lib/containerd"
default_runtime = "runc"
[containerd.runtimes.runc]
runtime_type = "io.containerd.crius.v2"
options = { BinaryName = "", SystemdCgroup = false }
[containerd.runtimes.containerd-runc]
runtime_type = "io.containerd.runc.v2"
[cni]
bin_dirs = ["/usr/lib/cni", "/opt/cni/bin"]
conf_dir = "/etc/cni/net.d"
max_conf_num = 1
conf_template = ""
[image]
sandbox_image = ""
pull_progress_timeout = "5m"
pull_min_rate = 16384
max_concurrent_downloads = 3
max_concurrent_unpacks = 0
[registry]
config_path = ""
[stream]
address = "127.0.0.1"
port = 0
idle_timeout = "4h"
[log]
level = "info"
format = "text"
"#;
        assert_eq!(parse(text).expect("parses"), Config::default());
    }

    #[test]
    fn unknown_key_is_named() {
        let err = parse("[containerd]\nsnapshoter = \"native\"\n").unwrap_err();
        assert!(err.contains("snapshoter"), "{err}");
        let err = parse("bogus_top_level = 1\n").unwrap_err();
        assert!(err.contains("bogus_top_level"), "{err}");
    }

    #[test]
    fn bad_values_name_their_key() {
        let err = parse("[containerd]\ndefault_runtime = \"kata\"\n").unwrap_err();
        assert!(err.contains("containerd.default_runtime"), "{err}");
        let err = parse("root = \"relative/dir\"\n").unwrap_err();
        assert!(err.contains("root"), "{err}");
        let err = parse("stats_collect_period = \"ten seconds\"\n").unwrap_err();
        assert!(err.contains("stats_collect_period"), "{err}");
        let err = parse("[log]\nformat = \"xml\"\n").unwrap_err();
        assert!(err.contains("format"), "{err}");
        let err = parse("restrict_oom_score_adj = \"maybe\"\n").unwrap_err();
        assert!(err.contains("restrict_oom_score_adj"), "{err}");
        let err = parse("[stream]\naddress = \"localhost:1\"\n").unwrap_err();
        assert!(err.contains("stream.address"), "{err}");
    }

    #[test]
    fn restrict_oom_score_adj_accepts_bools_and_strings() {
        assert_eq!(
            parse("restrict_oom_score_adj = true\n")
                .unwrap()
                .restrict_oom_score_adj,
            RestrictOomScoreAdj::Always
        );
        assert_eq!(
            parse("restrict_oom_score_adj = \"false\"\n")
                .unwrap()
                .restrict_oom_score_adj,
            RestrictOomScoreAdj::Never
        );
    }

    #[test]
    fn image_fs_path_follows_containerd_convention() {
        let mut config = Config::default();
        config.containerd.root = PathBuf::from("/data/containerd");
        config.containerd.snapshotter = "native".into();
        assert_eq!(
            config.image_fs_path(),
            PathBuf::from("/data/containerd/io.containerd.snapshotter.v1.native")
        );
    }

    #[test]
    fn empty_handler_means_default_runtime() {
        let config = Config::default();
        assert_eq!(
            config.runtime("").map(|r| r.runtime_type.as_str()),
            Some(CRIUS_SHIM)
        );
        assert_eq!(
            config
                .runtime("containerd-runc")
                .map(|r| r.runtime_type.as_str()),
            Some(RUNC_SHIM)
        );
        assert!(config.runtime("nosuch").is_none());
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(crate::fuzz_config())]

        #[test]
        fn any_config_text_loads_or_fails_cleanly(text in "\\PC{0,300}") {
            if let Ok(config) = toml::from_str::<Config>(&text) {
                let _ = config.validate();
            }
        }

        #[test]
        fn any_value_of_a_known_key_loads_or_fails_cleanly(
            key in prop::sample::select(vec![
                "root", "state", "restrict_oom_score_adj", "stats_collect_period",
                "cpu_sample_period", "max_container_log_line_size", "ignore_image_defined_volumes",
            ]),
            value in "\\PC{0,30}",
        ) {
            for text in [format!("{key} = {value:?}\n"), format!("{key} = {value}\n")] {
                if let Ok(config) = toml::from_str::<Config>(&text) {
                    let _ = config.validate();
                    let _ = config.log_line_limit();
                }
            }
        }
    }
}
