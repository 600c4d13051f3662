//! `ContainerStats`, `ListContainerStats`, `PodSandboxStats`, `ListPodSandboxStats`, and the
//! writable-layer usage syncer behind them.
//!
//! CPU, memory and process counts are read from the cgroup files on a blocking thread, a
//! few small reads per container; CPU rates come from the previous sample; writable-layer
//! usage is what the syncer last measured, so stats never wait on the snapshotter. A pod's
//! own cgroup (its cgroup parent) gives its totals; without one the pod's containers and
//! pause container are added up. Network counters come from the pause process's netns.

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::api::v1::{
    ContainerAttributes, ContainerStats, ContainerStatsRequest, ContainerStatsResponse, CpuUsage,
    FilesystemIdentifier, FilesystemUsage, IoUsage, LinuxPodSandboxStats,
    ListContainerStatsRequest, ListContainerStatsResponse, ListPodSandboxStatsRequest,
    ListPodSandboxStatsResponse, MemoryUsage as CriMemoryUsage, NetworkInterfaceUsage,
    NetworkUsage, PodSandboxAttributes, PodSandboxStats, PodSandboxStatsRequest,
    PodSandboxStatsResponse, ProcessUsage, PsiData, PsiStats, SwapUsage, UInt64Value,
};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::sandbox_status::labels_match;
use super::unix_nanos;
use crate::cri::CriService;
use crate::stats::cgroup::{Pressure, PressureLine, parent_of};
use crate::stats::netdev::{DEFAULT_INTERFACE, InterfaceCounters, read_interfaces};
use crate::stats::{CgroupUsage, LayerUsage, MemoryUsage, NetworkSample, Samples};
use crate::store::{Container, ContainerState, Sandbox, SandboxState};

/// Blocking reads of cgroups (and pods sampled) at once for one stats call.
const PARALLEL_READS: usize = 4;
/// Cgroups read in one blocking call at least: fewer are not worth another thread.
const MIN_READ_BATCH: usize = 32;

fn value(v: u64) -> Option<UInt64Value> {
    Some(UInt64Value { value: v })
}

/// One container's usage as read: the CRI stats and the raw cgroup numbers.
pub(crate) struct ContainerSample {
    pub stats: ContainerStats,
    pub usage: Option<CgroupUsage>,
}

impl CriService {
    pub async fn container_stats(
        &self,
        req: ContainerStatsRequest,
    ) -> Result<ContainerStatsResponse, Status> {
        let container = self.require_container(&req.container_id)?;
        // As under containerd's CRI, whose task metrics end with the task: a container that
        // is not running has no usage to report (ListContainerStats lists running ones).
        if container.status().state != crate::store::ContainerState::Running {
            return Err(Status::failed_precondition(format!(
                "container {} is not running: it has no usage to report",
                container.id()
            )));
        }
        let stats = self
            .sample_containers(vec![container])
            .await
            .pop()
            .map(|s| s.stats);
        Ok(ContainerStatsResponse { stats })
    }

    pub async fn list_container_stats(
        &self,
        req: ListContainerStatsRequest,
    ) -> Result<ListContainerStatsResponse, Status> {
        let filter = req.filter.unwrap_or_default();
        let wanted_id = match self.resolve_filter_id(&filter.id, |id| {
            self.containers
                .get(id)
                .map(|c| c.map(|c| c.id().to_string()))
        }) {
            Some(id) => id,
            None => return Ok(ListContainerStatsResponse { stats: Vec::new() }),
        };
        let wanted_sandbox = match self.resolve_filter_id(&filter.pod_sandbox_id, |id| {
            self.sandboxes.get(id).map(|s| s.map(|s| s.id()))
        }) {
            Some(id) => id,
            None => return Ok(ListContainerStatsResponse { stats: Vec::new() }),
        };
        let containers = self
            .containers
            .list()
            .into_iter()
            .filter(|c| wanted_id.as_ref().is_none_or(|id| c.id() == id))
            .filter(|c| {
                wanted_sandbox
                    .as_ref()
                    .is_none_or(|id| &c.metadata.sandbox_id == id)
            })
            .filter(|c| labels_match(&c.metadata.config.labels, &filter.label_selector))
            .collect();
        let stats = self
            .sample_containers(containers)
            .await
            .into_iter()
            .map(|s| s.stats)
            .collect();
        Ok(ListContainerStatsResponse { stats })
    }

    pub async fn pod_sandbox_stats(
        &self,
        req: PodSandboxStatsRequest,
    ) -> Result<PodSandboxStatsResponse, Status> {
        let sandbox = self
            .find_sandbox(&req.pod_sandbox_id)?
            .filter(|s| s.status().state != SandboxState::Creating)
            .ok_or_else(|| {
                Status::not_found(format!("pod sandbox {:?} not found", req.pod_sandbox_id))
            })?;
        if sandbox.status().state != SandboxState::Ready {
            return Err(Status::failed_precondition(format!(
                "pod sandbox {} is not ready",
                sandbox.id()
            )));
        }
        Ok(PodSandboxStatsResponse {
            stats: Some(self.sample_pod(&sandbox).await),
        })
    }

    pub async fn list_pod_sandbox_stats(
        &self,
        req: ListPodSandboxStatsRequest,
    ) -> Result<ListPodSandboxStatsResponse, Status> {
        let filter = req.filter.unwrap_or_default();
        let wanted_id = match self.resolve_filter_id(&filter.id, |id| {
            self.sandboxes.get(id).map(|s| s.map(|s| s.id()))
        }) {
            Some(id) => id,
            None => return Ok(ListPodSandboxStatsResponse { stats: Vec::new() }),
        };
        let pods: Vec<_> = self
            .sandboxes
            .list()
            .into_iter()
            .filter(|sandbox| {
                let metadata = sandbox.metadata();
                sandbox.status().state == SandboxState::Ready
                    && wanted_id.as_ref().is_none_or(|id| id == &metadata.id)
                    && labels_match(&metadata.config.labels, &filter.label_selector)
            })
            .collect();
        // Every pod's network counters in one blocking call, and every cgroup in one
        // batch: mostly recent samples, the rest read a few threads at a time.
        let pids: Vec<u32> = pods.iter().map(|pod| pod.status().pid).collect();
        let reads: Vec<PodReads> = pods.iter().map(|pod| self.pod_reads(pod)).collect();
        let paths = reads.iter().flat_map(PodReads::paths).collect();
        let (networks, usages) = tokio::join!(self.read_networks(pids), self.read_cgroups(paths));
        let mut usages = usages.into_iter();
        let stats = pods
            .iter()
            .zip(reads)
            .zip(networks)
            .map(|((sandbox, reads), network)| {
                let pod_usages = usages.by_ref().take(reads.path_count()).collect();
                self.pod_stats(sandbox, reads, pod_usages, network)
            })
            .collect();
        Ok(ListPodSandboxStatsResponse { stats })
    }

    /// A filter's ID (or prefix) as a full ID: `Some(None)` for no filter, `None` when it
    /// matches nothing.
    #[allow(clippy::type_complexity)]
    fn resolve_filter_id<E>(
        &self,
        id: &str,
        lookup: impl Fn(&str) -> Result<Option<String>, E>,
    ) -> Option<Option<String>> {
        if id.is_empty() {
            return Some(None);
        }
        match lookup(id) {
            Ok(Some(full)) => Some(Some(full)),
            _ => None,
        }
    }

    /// Reads the usage of `containers` (running ones from their cgroups) in one blocking
    /// batch and turns it into CRI stats.
    pub(crate) async fn sample_containers(
        &self,
        containers: Vec<Arc<Container>>,
    ) -> Vec<ContainerSample> {
        let usages = self.read_cgroups(container_paths(&containers)).await;
        self.container_samples(&containers, usages)
    }

    fn container_samples(
        &self,
        containers: &[Arc<Container>],
        usages: Vec<Option<CgroupUsage>>,
    ) -> Vec<ContainerSample> {
        let now = unix_nanos(SystemTime::now());
        containers
            .iter()
            .zip(usages)
            .map(|(container, usage)| ContainerSample {
                stats: self.container_stats_from(container, usage.as_ref(), now),
                usage,
            })
            .collect()
    }

    /// The usage of cgroups by spec path: from samples read within the last second (those
    /// older than half a second are read again in the background), the others read now,
    /// off the async threads.
    async fn read_cgroups(&self, paths: Vec<Option<String>>) -> Vec<Option<CgroupUsage>> {
        let Some(layout) = self.host.cgroups.clone() else {
            return paths.iter().map(|_| None).collect();
        };
        read_through(&self.stats.cgroup_samples, paths, move |path: &String| {
            CgroupUsage {
                sampled_at_ns: unix_nanos(SystemTime::now()),
                ..layout.read(path)
            }
        })
        .await
    }

    /// The network counters of the pods whose pause processes are `pids` (0: none), in
    /// order, sampled like cgroups.
    async fn read_networks(&self, pids: Vec<u32>) -> Vec<NetworkSample> {
        let keys = pids
            .into_iter()
            .map(|pid| (pid != 0).then_some(pid))
            .collect();
        read_through(&self.stats.network_samples, keys, |pid: &u32| {
            NetworkSample {
                at_ns: unix_nanos(SystemTime::now()),
                interfaces: read_interfaces(*pid).unwrap_or_default(),
            }
        })
        .await
        .into_iter()
        .map(Option::unwrap_or_default)
        .collect()
    }

    fn container_stats_from(
        &self,
        container: &Container,
        usage: Option<&CgroupUsage>,
        now: i64,
    ) -> ContainerStats {
        let metadata = &container.metadata;
        let config = &metadata.config;
        // A reused sample tells the time it was read.
        let now = usage
            .map(|u| u.sampled_at_ns)
            .filter(|at| *at > 0)
            .unwrap_or(now);
        ContainerStats {
            attributes: Some(ContainerAttributes {
                id: metadata.id.clone(),
                metadata: config.metadata.clone(),
                labels: config.labels.clone(),
                annotations: config.annotations.clone(),
            }),
            cpu: usage.and_then(|u| self.cpu_usage(&metadata.id, u, now)),
            memory: usage.and_then(|u| cgroup_memory_usage(u, now)),
            writable_layer: self
                .stats
                .layer_usages
                .get(&metadata.id)
                .map(|layer| self.filesystem_usage(layer)),
            swap: usage
                .and_then(|u| u.memory.as_ref())
                .and_then(|m| swap_usage(m, now)),
            io: usage.and_then(|u| io_usage(u, now)),
        }
    }

    fn cpu_usage(&self, id: &str, usage: &CgroupUsage, now: i64) -> Option<CpuUsage> {
        let total = usage.cpu_usage_ns?;
        Some(CpuUsage {
            timestamp: now,
            usage_core_nano_seconds: value(total),
            // The rate over the last background period, as containerd 2.3 reports it;
            // without one yet, the rate since the previous stats call.
            usage_nano_cores: self
                .stats
                .sampled_cpu
                .latest(id)
                .or_else(|| self.stats.cpu_rates.sample(id, now, total))
                .map(|v| UInt64Value { value: v }),
            psi: usage.cpu_pressure.as_ref().map(psi_stats),
        })
    }

    fn filesystem_usage(&self, layer: LayerUsage) -> FilesystemUsage {
        FilesystemUsage {
            timestamp: layer.at_ns,
            fs_id: Some(FilesystemIdentifier {
                mountpoint: self.image_fs.path().display().to_string(),
            }),
            used_bytes: value(layer.bytes),
            inodes_used: value(layer.inodes),
        }
    }

    /// A ready pod's totals, network and containers.
    pub(crate) async fn sample_pod(&self, sandbox: &Arc<Sandbox>) -> PodSandboxStats {
        let pid = sandbox.status().pid;
        let network = self
            .read_networks(vec![pid])
            .await
            .pop()
            .unwrap_or_default();
        self.sample_pod_with(sandbox, network).await
    }

    /// A ready pod's totals and containers, with its network counters read already.
    async fn sample_pod_with(
        &self,
        sandbox: &Arc<Sandbox>,
        network: NetworkSample,
    ) -> PodSandboxStats {
        let reads = self.pod_reads(sandbox);
        let usages = self.read_cgroups(reads.paths().collect()).await;
        self.pod_stats(sandbox, reads, usages, network)
    }

    /// The cgroups a pod's stats come from.
    fn pod_reads(&self, sandbox: &Arc<Sandbox>) -> PodReads {
        let metadata = sandbox.metadata();
        let containers = self.containers.in_sandbox(&metadata.id);
        let totals = if metadata.cgroups_path.is_empty() {
            None
        } else if let Some(path) = pod_cgroup(&metadata) {
            Some(Totals::PodCgroup(path))
        } else {
            // No pod cgroup: the pause container plus every running container.
            Some(Totals::PausePlusContainers(metadata.cgroups_path.clone()))
        };
        PodReads {
            container_paths: container_paths(&containers),
            containers,
            totals,
        }
    }

    /// A pod's stats from the usage of its [`PodReads::paths`], in that order.
    fn pod_stats(
        &self,
        sandbox: &Arc<Sandbox>,
        reads: PodReads,
        mut usages: Vec<Option<CgroupUsage>>,
        network: NetworkSample,
    ) -> PodSandboxStats {
        let metadata = sandbox.metadata();
        let totals_usage = match reads.totals {
            Some(_) => usages.pop().flatten(),
            None => None,
        };
        let containers = self.container_samples(&reads.containers, usages);
        let pod_usage = match reads.totals {
            Some(Totals::PodCgroup(_)) => totals_usage,
            Some(Totals::PausePlusContainers(_)) => totals_usage.map(|pause| {
                containers
                    .iter()
                    .filter_map(|c| c.usage.as_ref())
                    .fold(pause, |total, usage| add_usage(&total, usage))
            }),
            None => None,
        };
        let now = unix_nanos(SystemTime::now());
        // The pod's totals are as old as the samples they were added up from.
        let usage_at = pod_usage
            .as_ref()
            .map(|u| u.sampled_at_ns)
            .filter(|at| *at > 0)
            .unwrap_or(now);
        PodSandboxStats {
            attributes: Some(PodSandboxAttributes {
                id: metadata.id.clone(),
                metadata: metadata.config.metadata.clone(),
                labels: metadata.config.labels.clone(),
                annotations: metadata.config.annotations.clone(),
            }),
            linux: Some(LinuxPodSandboxStats {
                cpu: pod_usage
                    .as_ref()
                    .and_then(|u| self.cpu_usage(&metadata.id, u, usage_at)),
                memory: pod_usage
                    .as_ref()
                    .and_then(|u| cgroup_memory_usage(u, usage_at)),
                network: (!network.interfaces.is_empty())
                    .then(|| network_usage(&network.interfaces, network.at_ns)),
                process: pod_usage
                    .as_ref()
                    .and_then(|u| u.pids)
                    .map(|count| ProcessUsage {
                        timestamp: usage_at,
                        process_count: value(count),
                    }),
                containers: containers.into_iter().map(|c| c.stats).collect(),
                io: pod_usage.as_ref().and_then(|u| io_usage(u, usage_at)),
            }),
            windows: None,
        }
    }

    /// Every `period`, samples the CPU time of each running container and of each ready
    /// pod's own cgroup (pods without one get their rate from stats calls).
    pub(crate) async fn run_cpu_sampler(&self, period: Duration, cancel: CancellationToken) {
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = ticks.tick() => {}
            }
            self.sample_cpu().await;
        }
    }

    async fn sample_cpu(&self) {
        let Some(layout) = self.host.cgroups.clone() else {
            return;
        };
        let containers = self
            .containers
            .list()
            .into_iter()
            .filter(|c| c.status().state == ContainerState::Running)
            .filter(|c| !c.metadata.cgroups_path.is_empty())
            .map(|c| (c.id().to_string(), c.metadata.cgroups_path.clone()));
        let pods = self
            .sandboxes
            .list()
            .into_iter()
            .filter(|s| s.status().state == SandboxState::Ready)
            .filter_map(|s| {
                let metadata = s.metadata();
                pod_cgroup(&metadata).map(|path| (metadata.id.clone(), path))
            });
        let targets: Vec<(String, String)> = containers.chain(pods).collect();
        let read = tokio::task::spawn_blocking(move || {
            targets
                .into_iter()
                .filter_map(|(id, path)| {
                    let usage = layout.read_cpu(&path)?;
                    Some((id, unix_nanos(SystemTime::now()), usage))
                })
                .collect::<Vec<_>>()
        })
        .await;
        let Ok(samples) = read else {
            return;
        };
        let live: HashSet<String> = samples.iter().map(|(id, _, _)| id.clone()).collect();
        for (id, at, usage) in samples {
            self.stats.sampled_cpu.sample(&id, at, usage);
        }
        self.stats.sampled_cpu.retain(&live);
    }

    /// Every stats collect period, measures each container's writable layer.
    pub(crate) async fn run_layer_usage_syncer(&self, period: Duration, cancel: CancellationToken) {
        loop {
            self.sync_layer_usages().await;
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
            }
        }
    }

    async fn sync_layer_usages(&self) {
        let containers = self.containers.list();
        let live: HashSet<String> = containers
            .iter()
            .map(|c| c.id().to_string())
            .chain(self.sandboxes.list().iter().map(|s| s.id()))
            .collect();
        for container in containers {
            let id = container.id();
            let snapshotter = self.snapshotter_of(&container.metadata.snapshotter);
            match self.containerd.snapshot_usage(snapshotter, id).await {
                Ok(Some((bytes, inodes))) => self.stats.layer_usages.set(
                    id,
                    LayerUsage {
                        at_ns: unix_nanos(SystemTime::now()),
                        bytes,
                        inodes,
                    },
                ),
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!(container = id, error = %e, "writable layer usage unknown")
                }
            }
        }
        self.stats.layer_usages.retain(&live);
        self.stats.cpu_rates.retain(&live);
    }
}

/// Memory usage with its pressure (cgroup v2).
fn cgroup_memory_usage(usage: &CgroupUsage, now: i64) -> Option<CriMemoryUsage> {
    let mut memory = memory_usage(usage.memory.as_ref()?, now);
    memory.psi = usage.memory_pressure.as_ref().map(psi_stats);
    Some(memory)
}

/// I/O pressure (cgroup v2); absent, not zero, where the host has none.
fn io_usage(usage: &CgroupUsage, now: i64) -> Option<IoUsage> {
    usage.io_pressure.as_ref().map(|pressure| IoUsage {
        timestamp: now,
        psi: Some(psi_stats(pressure)),
    })
}

fn psi_stats(pressure: &Pressure) -> PsiStats {
    let data = |line: &PressureLine| PsiData {
        total: line.total,
        avg10: line.avg10,
        avg60: line.avg60,
        avg300: line.avg300,
    };
    PsiStats {
        full: pressure.full.as_ref().map(data),
        some: Some(data(&pressure.some)),
    }
}

fn memory_usage(memory: &MemoryUsage, now: i64) -> CriMemoryUsage {
    CriMemoryUsage {
        timestamp: now,
        working_set_bytes: value(memory.working_set),
        available_bytes: memory.limit.map(|limit| UInt64Value {
            value: limit.saturating_sub(memory.working_set),
        }),
        usage_bytes: value(memory.usage),
        rss_bytes: value(memory.rss),
        page_faults: value(memory.page_faults),
        major_page_faults: value(memory.major_page_faults),
        psi: None,
    }
}

fn swap_usage(memory: &MemoryUsage, now: i64) -> Option<SwapUsage> {
    let used = memory.swap_usage?;
    Some(SwapUsage {
        timestamp: now,
        swap_available_bytes: memory.swap_limit.map(|limit| UInt64Value {
            value: limit.saturating_sub(used),
        }),
        swap_usage_bytes: value(used),
    })
}

fn network_usage(interfaces: &[InterfaceCounters], now: i64) -> NetworkUsage {
    let usage = |i: &InterfaceCounters| NetworkInterfaceUsage {
        name: i.name.clone(),
        rx_bytes: value(i.rx_bytes),
        rx_errors: value(i.rx_errors),
        tx_bytes: value(i.tx_bytes),
        tx_errors: value(i.tx_errors),
    };
    NetworkUsage {
        timestamp: now,
        default_interface: interfaces
            .iter()
            .find(|i| i.name == DEFAULT_INTERFACE)
            .or_else(|| interfaces.first())
            .map(usage),
        interfaces: interfaces.iter().map(usage).collect(),
    }
}

/// Where a pod's totals come from.
enum Totals {
    /// The pod's own cgroup (kubelet gives every pod one).
    PodCgroup(String),
    /// The pause container's cgroup, with the containers' usage added.
    PausePlusContainers(String),
}

/// The cgroups one pod's stats are read from.
struct PodReads {
    containers: Vec<Arc<Container>>,
    container_paths: Vec<Option<String>>,
    totals: Option<Totals>,
}

impl PodReads {
    /// The containers' cgroups, then the totals' one.
    fn paths(&self) -> impl Iterator<Item = Option<String>> + '_ {
        let totals = self.totals.as_ref().map(|t| match t {
            Totals::PodCgroup(path) | Totals::PausePlusContainers(path) => Some(path.clone()),
        });
        self.container_paths.iter().cloned().chain(totals)
    }

    fn path_count(&self) -> usize {
        self.container_paths.len() + usize::from(self.totals.is_some())
    }
}

/// Running containers' cgroups (`None`: nothing to read).
/// The pod's own cgroup (when it has a cgroup parent), absolute from the hierarchy's root:
/// a spec path of its own, so it is sampled like the containers'.
fn pod_cgroup(metadata: &crate::store::SandboxMetadata) -> Option<String> {
    let has_parent = metadata
        .config
        .linux
        .as_ref()
        .is_some_and(|l| !l.cgroup_parent.is_empty());
    (has_parent && !metadata.cgroups_path.is_empty()).then(|| {
        parent_of(&metadata.cgroups_path)
            .to_string_lossy()
            .into_owned()
    })
}

fn container_paths(containers: &[Arc<Container>]) -> Vec<Option<String>> {
    containers
        .iter()
        .map(|c| {
            (c.status().state == ContainerState::Running && !c.metadata.cgroups_path.is_empty())
                .then(|| c.metadata.cgroups_path.clone())
        })
        .collect()
}

/// The samples of `keys` (`None`: nothing to read) from `cache` while usable, the others
/// read with `read` now; usable ones past fresh are read again in the background, one
/// refresh at a time.
async fn read_through<K, V, F>(
    cache: &Arc<Samples<K, V>>,
    keys: Vec<Option<K>>,
    read: F,
) -> Vec<Option<V>>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    V: Clone + Default + Send + 'static,
    F: Fn(&K) -> V + Clone + Send + Sync + 'static,
{
    let mut cached = cache.lookup(&keys);
    if !cached.stale.is_empty() && cache.start_refresh() {
        let (cache, read) = (cache.clone(), read.clone());
        let stale = std::mem::take(&mut cached.stale);
        tokio::spawn(async move {
            read_and_store(&cache, stale, read).await;
            cache.end_refresh();
        });
    }
    let missing: Vec<K> = cached
        .missing
        .iter()
        .filter_map(|i| keys[*i].clone())
        .collect();
    let read = read_and_store(cache, missing, read).await;
    for (i, value) in cached.missing.into_iter().zip(read) {
        cached.usages[i] = Some(value);
    }
    cached.usages
}

/// Reads `keys` in up to [`PARALLEL_READS`] blocking batches at once and keeps the samples.
async fn read_and_store<K, V, F>(cache: &Samples<K, V>, keys: Vec<K>, read: F) -> Vec<V>
where
    K: Eq + Hash + Clone + Send + 'static,
    V: Clone + Default + Send + 'static,
    F: Fn(&K) -> V + Clone + Send + 'static,
{
    if keys.is_empty() {
        return Vec::new();
    }
    let taken = Instant::now();
    let batch = keys.len().div_ceil(PARALLEL_READS).max(MIN_READ_BATCH);
    let reads = keys.chunks(batch).map(|chunk| {
        let (read, chunk) = (read.clone(), chunk.to_vec());
        let count = chunk.len();
        async move {
            tokio::task::spawn_blocking(move || chunk.iter().map(&read).collect::<Vec<_>>())
                .await
                .unwrap_or_else(|_| vec![V::default(); count])
        }
    });
    let values: Vec<V> = futures::future::join_all(reads)
        .await
        .into_iter()
        .flatten()
        .collect();
    cache.store(taken, keys.into_iter().zip(values.iter().cloned()));
    values
}

/// Two cgroups' usage added up (for pods without a cgroup of their own).
fn add_usage(a: &CgroupUsage, b: &CgroupUsage) -> CgroupUsage {
    let sum = |x: Option<u64>, y: Option<u64>| match (x, y) {
        (None, None) => None,
        (x, y) => Some(x.unwrap_or(0) + y.unwrap_or(0)),
    };
    let memory = match (&a.memory, &b.memory) {
        (Some(x), Some(y)) => Some(MemoryUsage {
            usage: x.usage + y.usage,
            limit: None,
            working_set: x.working_set + y.working_set,
            rss: x.rss + y.rss,
            page_faults: x.page_faults + y.page_faults,
            major_page_faults: x.major_page_faults + y.major_page_faults,
            swap_usage: sum(x.swap_usage, y.swap_usage),
            swap_limit: None,
        }),
        (x, y) => x.clone().or_else(|| y.clone()),
    };
    // Pressure does not add up across cgroups: such a pod reports none.
    CgroupUsage {
        cpu_usage_ns: sum(a.cpu_usage_ns, b.cpu_usage_ns),
        memory,
        pids: sum(a.pids, b.pids),
        sampled_at_ns: a.sampled_at_ns.max(b.sampled_at_ns),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn available_memory_is_the_limit_minus_the_working_set() {
        let memory = MemoryUsage {
            usage: 100,
            limit: Some(1000),
            working_set: 80,
            ..Default::default()
        };
        let usage = memory_usage(&memory, 5);
        assert_eq!(usage.available_bytes, value(920));
        assert_eq!(usage.working_set_bytes, value(80));
        let unlimited = MemoryUsage {
            limit: None,
            ..memory
        };
        assert_eq!(memory_usage(&unlimited, 5).available_bytes, None);
    }

    #[test]
    fn pressure_becomes_psi_and_v1_has_none() {
        let line = PressureLine {
            avg10: 1.5,
            avg60: 0.5,
            avg300: 0.25,
            total: 99,
        };
        let usage = CgroupUsage {
            memory: Some(MemoryUsage::default()),
            memory_pressure: Some(Pressure {
                some: line,
                full: Some(line),
            }),
            io_pressure: Some(Pressure {
                some: line,
                full: None,
            }),
            ..Default::default()
        };
        let memory = cgroup_memory_usage(&usage, 3).unwrap();
        assert_eq!(memory.psi.unwrap().full.unwrap().total, 99);
        let io = io_usage(&usage, 3).unwrap();
        assert_eq!(io.psi.as_ref().unwrap().some.as_ref().unwrap().avg10, 1.5);
        assert!(io.psi.unwrap().full.is_none());
        let v1 = CgroupUsage {
            memory: Some(MemoryUsage::default()),
            ..Default::default()
        };
        assert!(cgroup_memory_usage(&v1, 3).unwrap().psi.is_none());
        assert!(io_usage(&v1, 3).is_none());
    }

    #[test]
    fn pods_without_a_cgroup_add_up_their_containers() {
        let a = CgroupUsage {
            cpu_usage_ns: Some(10),
            memory: Some(MemoryUsage {
                usage: 1,
                working_set: 1,
                ..Default::default()
            }),
            pids: Some(1),
            ..Default::default()
        };
        let b = CgroupUsage {
            cpu_usage_ns: Some(5),
            memory: None,
            pids: Some(2),
            ..Default::default()
        };
        let total = add_usage(&a, &b);
        assert_eq!(total.cpu_usage_ns, Some(15));
        assert_eq!(total.pids, Some(3));
        assert_eq!(total.memory.map(|m| m.usage), Some(1));
    }

    #[test]
    fn the_default_interface_is_eth0() {
        let interfaces = vec![
            InterfaceCounters {
                name: "net1".into(),
                ..Default::default()
            },
            InterfaceCounters {
                name: "eth0".into(),
                rx_bytes: 9,
                ..Default::default()
            },
        ];
        let usage = network_usage(&interfaces, 1);
        assert_eq!(usage.default_interface.unwrap().rx_bytes, value(9));
        assert_eq!(usage.interfaces.len(), 2);
    }
}
