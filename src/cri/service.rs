//! The service object: everything crius owns, created by `new`, served by `run`, stopped by
//! `close`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::sync::CancellationToken;

use crate::cni::NetworkConfigs;
use crate::cni::network::CniNetwork;
use crate::config::Config;
use crate::config::RestrictOomScoreAdj;
use crate::containerd::{Containerd, ContainerdError};
use crate::fsusage::ImageFs;
use crate::image::ImagePuller;
use crate::imagespec::reference::Reference;
use crate::store::{ContainerStore, ImageStore, NameRegistrar, SandboxStore};

/// Errors that stop crius from starting: the service cannot be built or cannot recover.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Containerd(#[from] ContainerdError),
    #[error("failed to create directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Failpoint(#[from] crate::failpoint::Triggered),
    #[error("invalid config: {0}")]
    Config(String),
}

/// A critical task's name and how it ended.
pub type TaskEnd = (&'static str, Result<(), String>);

/// The state behind the CRI handlers. Shared by cheap clones of [`CriService`].
pub struct ServiceState {
    pub config: Config,
    pub containerd: Containerd,
    /// Leases for creating containers and sandboxes, one made ahead.
    pub creation_leases: Arc<crate::containerd::lease_pool::LeasePool>,
    pub image_fs: ImageFs,
    pub cni: Arc<NetworkConfigs>,
    pub images: Arc<ImageStore>,
    pub puller: Arc<ImagePuller>,
    pub cni_network: CniNetwork,
    pub sandboxes: Arc<SandboxStore>,
    pub sandbox_names: NameRegistrar,
    pub containers: Arc<ContainerStore>,
    pub container_names: NameRegistrar,
    /// The sandbox image: the configured one, or the built-in pause image.
    pub sandbox_image: String,
    /// Image names that RemoveImage of another name never takes away (the sandbox image).
    pub pinned_images: std::collections::HashSet<String>,
    /// The pod CIDR kubelet last sent with UpdateRuntimeConfig.
    pub pod_cidr: std::sync::Mutex<String>,
    /// What this host can do, probed once at start-up.
    pub host: HostFacts,
    /// What the stats RPCs and the background sampler keep between calls.
    pub stats: StatsCaches,
    /// Container and sandbox lifecycle events for `GetContainerEvents`.
    pub container_events:
        tokio::sync::broadcast::Sender<std::sync::Arc<crate::api::v1::ContainerEventResponse>>,
    /// Exec/attach/port-forward requests waiting for their client.
    pub stream_requests: Arc<crate::streaming::StreamRequests>,
    /// The stream server, once it is bound.
    pub stream_endpoint: std::sync::OnceLock<crate::streaming::StreamEndpoint>,
    /// The account files of images containers were made from.
    pub(crate) account_files: crate::cri::container_rootfs::AccountFilesCache,
    /// Serializes mounting and unmounting image volumes.
    pub(crate) image_volume_lock: tokio::sync::Mutex<()>,
    /// Serializes making remapped rootfs copies (pods in their own user namespace).
    pub(crate) remap_lock: tokio::sync::Mutex<()>,
    initialized: AtomicBool,
    /// Whether crius's event subscription to containerd stands (cleared when it breaks).
    containerd_reachable: AtomicBool,
    /// Fired by `close`: every task of the service watches it.
    pub(crate) shutdown: CancellationToken,
}

/// What this host can do, probed once at start-up.
pub struct HostFacts {
    /// The lowest OOM score adjustment crius may give; `None` when it may lower freely.
    pub oom_score_floor: Option<i32>,
    /// Where cgroups are mounted; `None` when this host shows none.
    pub cgroups: Option<crate::stats::CgroupLayout>,
    /// Whether this host can idmap mounts for pods in their own user namespace; why not.
    pub idmap: Result<(), String>,
    /// How pods in their own user namespace get their rootfs (`Idmap` or `Copy`); why such
    /// pods cannot run here.
    pub userns_rootfs: Result<crate::config::UsernsRootfs, String>,
    /// Whether CRIU can checkpoint containers here (`criu check` at start-up); why not.
    pub criu: Result<(), String>,
    /// What each runtime handler's OCI runtime can do.
    pub handler_features: std::collections::BTreeMap<String, crate::oci::features::HandlerFeatures>,
}

/// What the stats RPCs and the background sampler keep between calls.
#[derive(Default)]
pub struct StatsCaches {
    /// The previous CPU sample of each container and pod, for CPU rates.
    pub cpu_rates: crate::stats::CpuRates,
    /// The background CPU samples of each running container and pod cgroup.
    pub sampled_cpu: crate::stats::CpuRates,
    /// Cgroup usage as last read, reused for a second.
    pub cgroup_samples: Arc<crate::stats::CgroupSamples>,
    /// Pods' network counters as last read, reused for a second.
    pub network_samples: Arc<crate::stats::NetworkSamples>,
    /// Writable-layer usage, measured every stats collect period.
    pub layer_usages: crate::stats::LayerUsages,
}

impl HostFacts {
    async fn probe(config: &Config) -> Self {
        let cgroups = crate::stats::CgroupLayout::detect();
        if cgroups.is_none() {
            tracing::warn!(
                "no cgroup hierarchy found in /proc/self/mountinfo: stats carry no CPU or memory"
            );
        }
        let idmap = probe_host_idmap(config).await;
        let userns_rootfs = userns_rootfs_mode(config.userns.rootfs, &idmap).await;
        let criu = crate::checkpoint::probe_criu().await;
        match &criu {
            Ok(()) => tracing::info!("CRIU works: containers can be checkpointed"),
            Err(reason) => {
                tracing::warn!(%reason, "containers cannot be checkpointed on this host: CheckpointContainer answers FAILED_PRECONDITION")
            }
        }
        let handler_features = crate::oci::features::probe_handlers(
            &config.containerd.runtimes,
            userns_rootfs.is_ok(),
        )
        .await;
        tracing::debug!(?handler_features, "runtime handler features");
        Self {
            oom_score_floor: oom_score_floor(config.restrict_oom_score_adj),
            cgroups,
            idmap,
            userns_rootfs,
            criu,
            handler_features,
        }
    }
}

/// Connects to containerd and checks that it has every configured snapshotter.
async fn connect_containerd(config: &Config) -> Result<Containerd, ServiceError> {
    let containerd = Containerd::connect(
        &config.containerd.address,
        &config.containerd.namespace,
        config.containerd.connect_timeout,
    )
    .await?;
    let version = containerd.version().await?;
    for snapshotter in config.snapshotters() {
        containerd.check_snapshotter(snapshotter).await?;
    }
    tracing::info!(address = %config.containerd.address.display(), %version, namespace = containerd.namespace(), "connected to containerd");
    Ok(containerd)
}

/// The sandbox image: the configured one, or crius's built-in pause image.
fn sandbox_image_name(config: &Config) -> Result<String, ServiceError> {
    if config.image.sandbox_image.is_empty() {
        return Ok(crate::image::builtin::BUILTIN_PAUSE_IMAGE.to_string());
    }
    Reference::parse(&config.image.sandbox_image)
        .map(|reference| reference.to_string())
        .map_err(|e| ServiceError::Config(format!("image.sandbox_image: {e}")))
}

/// The CRI service. Clones share one state.
#[derive(Clone)]
pub struct CriService(Arc<ServiceState>);

impl std::ops::Deref for CriService {
    type Target = ServiceState;
    fn deref(&self) -> &ServiceState {
        &self.0
    }
}

impl CriService {
    /// Connects to containerd, checks the snapshotter, prepares directories and builds every
    /// part of the service. Nothing serves yet.
    pub async fn new(config: Config) -> Result<Self, ServiceError> {
        let containerd = connect_containerd(&config).await?;
        create_private_dir(&config.root)?;
        create_private_dir(&config.state)?;

        let image_fs = ImageFs::new(config.image_fs_path());
        if !image_fs.path().is_dir() {
            tracing::warn!(path = %image_fs.path().display(), "image filesystem directory does not exist: check containerd.root and containerd.snapshotter");
        }
        let cni = Arc::new(NetworkConfigs::load(
            config.cni.conf_dir.clone(),
            config.cni.bin_dirs.clone(),
            config.cni.max_conf_num,
        ));

        let images = Arc::new(ImageStore::new());
        let puller = ImagePuller::new(
            containerd.clone(),
            images.clone(),
            config.registry.clone(),
            config.image.max_concurrent_downloads,
            config.image.unpacks_at_once(),
            config.image.pull_progress_timeout,
            config.image.pull_min_rate,
        );
        let sandbox_image = sandbox_image_name(&config)?;
        let pinned_images = std::collections::HashSet::from([sandbox_image.clone()]);
        images.pin_names(pinned_images.iter().cloned());
        let cni_network = CniNetwork::new(
            cni.clone(),
            config.cni.bin_dirs.clone(),
            config.cni.cache_dir.clone(),
            config.cni.plugin_timeout,
        )
        .with_internal_loopback(config.cni.use_internal_loopback);
        let host = HostFacts::probe(&config).await;
        let stream_requests = Arc::new(crate::streaming::StreamRequests::new(
            config.stream.token_ttl,
        ));
        Ok(Self(Arc::new(ServiceState {
            config,
            creation_leases: crate::containerd::lease_pool::LeasePool::new(containerd.clone()),
            containerd,
            image_fs,
            cni,
            images,
            puller,
            cni_network,
            sandboxes: Arc::new(SandboxStore::new()),
            sandbox_names: NameRegistrar::new(),
            containers: Arc::new(ContainerStore::new()),
            container_names: NameRegistrar::new(),
            sandbox_image,
            pinned_images,
            pod_cidr: std::sync::Mutex::new(String::new()),
            stream_requests,
            host,
            stats: StatsCaches::default(),
            container_events: tokio::sync::broadcast::channel(crate::cri::CONTAINER_EVENT_BUFFER).0,
            stream_endpoint: std::sync::OnceLock::new(),
            account_files: Default::default(),
            image_volume_lock: tokio::sync::Mutex::new(()),
            remap_lock: tokio::sync::Mutex::new(()),
            initialized: AtomicBool::new(false),
            containerd_reachable: AtomicBool::new(true),
            shutdown: CancellationToken::new(),
        })))
    }

    /// Whether start-up has finished; until then RPCs answer `UNAVAILABLE`.
    pub fn is_initialized(&self) -> bool {
        self.initialized.load(Ordering::Acquire)
    }

    pub(crate) fn mark_initialized(&self) {
        self.initialized.store(true, Ordering::Release);
    }

    /// Whether containerd answered last time crius looked (its event stream stands).
    pub fn containerd_reachable(&self) -> bool {
        self.containerd_reachable.load(Ordering::Acquire)
    }

    pub(crate) fn set_containerd_reachable(&self, reachable: bool) {
        let was = self.containerd_reachable.swap(reachable, Ordering::AcqRel);
        if was != reachable {
            if reachable {
                tracing::info!("containerd is reachable again");
            } else {
                tracing::warn!(
                    "containerd is not reachable; calls that need it answer UNAVAILABLE"
                );
            }
        }
    }

    /// Stops the service's tasks (CNI watcher, syncers, servers). Idempotent.
    pub fn close(&self) {
        self.shutdown.cancel();
    }
}

impl ServiceState {
    /// `adj` raised to the floor crius must respect, when there is one.
    pub fn clamp_oom_score_adj(&self, adj: i32) -> i32 {
        match self.host.oom_score_floor {
            Some(floor) if adj < floor => floor,
            _ => adj,
        }
    }
}

/// CAP_SYS_RESOURCE, which lowering an OOM score adjustment needs.
const CAP_SYS_RESOURCE: u32 = 24;

/// The floor for OOM score adjustments: crius's own value when it may not lower it
/// (no CAP_SYS_RESOURCE, as in many containers and VMs), decided once at start-up.
fn oom_score_floor(restrict: RestrictOomScoreAdj) -> Option<i32> {
    let own = std::fs::read_to_string("/proc/self/oom_score_adj")
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .unwrap_or(0);
    let restricted = match restrict {
        RestrictOomScoreAdj::Always => true,
        RestrictOomScoreAdj::Never => false,
        RestrictOomScoreAdj::Auto => !has_effective_capability(CAP_SYS_RESOURCE),
    };
    if restricted {
        tracing::info!(
            floor = own,
            "OOM score adjustments are clamped to crius's own value (it cannot lower them)"
        );
        Some(own)
    } else {
        None
    }
}

fn has_effective_capability(cap: u32) -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        })
        .is_some_and(|mask| mask & (1 << cap) != 0)
}

/// Checks once whether the host can idmap mounts (for pods in their own user namespace):
/// the image layers (the snapshotter's filesystem) and overlayfs over idmapped layers.
async fn probe_host_idmap(config: &Config) -> Result<(), String> {
    let (layers, root) = (config.image_fs_path(), config.root.clone());
    tokio::task::spawn_blocking(move || {
        let dirs: Vec<&std::path::Path> = [layers.as_path(), root.as_path()]
            .into_iter()
            .filter(|d| d.is_dir())
            .collect();
        crate::sys::idmap::probe_host(&dirs, &root)
    })
    .await
    .unwrap_or_else(|e| Err(e.to_string()))
}

/// How pods in their own user namespace get their rootfs here, by the configured choice
/// and what the host can do; why they cannot run at all. Says so in the log.
async fn userns_rootfs_mode(
    wanted: crate::config::UsernsRootfs,
    host_idmap: &Result<(), String>,
) -> Result<crate::config::UsernsRootfs, String> {
    use crate::config::UsernsRootfs;
    let userns = tokio::task::spawn_blocking(crate::sys::userns::probe)
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
    let mode = match (wanted, userns, host_idmap) {
        (_, Err(e), _) => Err(e),
        (UsernsRootfs::Auto | UsernsRootfs::Idmap, Ok(()), Ok(())) => Ok(UsernsRootfs::Idmap),
        (UsernsRootfs::Idmap, Ok(()), Err(e)) => Err(e.clone()),
        (UsernsRootfs::Auto | UsernsRootfs::Copy, Ok(()), _) => Ok(UsernsRootfs::Copy),
    };
    match &mode {
        Ok(mode) => tracing::info!(
            rootfs = ?mode,
            idmapped_mounts = host_idmap.is_ok(),
            "pods in their own user namespace (hostUsers: false) are supported"
        ),
        Err(e) => tracing::warn!(
            reason = %e,
            "pods in their own user namespace (hostUsers: false) cannot run on this host"
        ),
    }
    mode
}

/// Creates `path` (and parents) with mode 0711: others may traverse but not list.
fn create_private_dir(path: &Path) -> Result<(), ServiceError> {
    let err = |source| ServiceError::CreateDir {
        path: path.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o711)).map_err(err)
}
