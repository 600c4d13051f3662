//! Resource usage: cgroup CPU and memory ([`cgroup`]), pod network counters ([`netdev`]),
//! CPU rates from consecutive samples, and writable-layer usage measured in the background
//! so that stats never wait on the snapshotter.

pub mod cgroup;
pub mod netdev;

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub use cgroup::{CgroupLayout, CgroupUsage, MemoryUsage};

/// One CPU sample: when (Unix ns), the cumulative usage then, and the rate it gave.
type CpuSample = (i64, u64, Option<u64>);

/// The previous CPU sample per container or sandbox, to turn cumulative usage into a rate.
#[derive(Default)]
pub struct CpuRates {
    samples: Mutex<HashMap<String, CpuSample>>,
}

impl CpuRates {
    /// Records `usage_ns` at `at_ns` and returns the rate since the previous sample in
    /// nano-cores (1e9 is one core busy), when there is an older one. The same sample
    /// asked about again gets the rate it gave the first time.
    pub fn sample(&self, id: &str, at_ns: i64, usage_ns: u64) -> Option<u64> {
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let previous = samples.get(id).copied();
        match previous {
            Some((then, _, rate)) if then == at_ns => return rate,
            Some((then, _, _)) if then > at_ns => return None,
            _ => {}
        }
        let rate = previous.and_then(|(then, before, _)| {
            let elapsed = (at_ns - then) as u128;
            let used = usage_ns.checked_sub(before)? as u128;
            u64::try_from(used * 1_000_000_000 / elapsed).ok()
        });
        samples.insert(id.to_string(), (at_ns, usage_ns, rate));
        rate
    }

    /// The rate the last sample of `id` gave, if it gave one.
    pub fn latest(&self, id: &str) -> Option<u64> {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        samples.get(id).and_then(|(_, _, rate)| *rate)
    }

    /// Drops samples of IDs not in `live`.
    pub fn retain(&self, live: &HashSet<String>) {
        self.samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id, _| live.contains(id));
    }
}

/// How old a cgroup sample may be and still answer a stats call as it is...
const SAMPLE_FRESH: Duration = Duration::from_millis(500);
/// ...and how old it may be and still answer one while it is read again in the background.
/// Older ones are read before the call answers: a caller a second after the last one
/// sees new usage.
const SAMPLE_USABLE: Duration = Duration::from_secs(1);
/// Samples not asked for this long are dropped.
const SAMPLE_KEPT: Duration = Duration::from_secs(60);

/// Usage samples as last read, by what was read (a cgroup path, a pod's network namespace).
/// Reading hundreds of cgroups costs tens of milliseconds of kernel time, and kubelet, its
/// summary API and metrics agents ask for the same ones in quick succession
/// (ListPodSandboxStats, then ListContainerStats): within a second, a sample is reused
/// (each carries when it was read).
pub struct Samples<K, V> {
    samples: Mutex<HashMap<K, (Instant, V)>>,
    refreshing: AtomicBool,
}

/// Cgroup usage by cgroup path.
pub type CgroupSamples = Samples<String, CgroupUsage>;
/// A pod's network counters by the PID of a process in its network namespace.
pub type NetworkSamples = Samples<u32, NetworkSample>;

/// A network namespace's interfaces and when (Unix ns) they were read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkSample {
    pub at_ns: i64,
    pub interfaces: Vec<netdev::InterfaceCounters>,
}

impl<K, V> Default for Samples<K, V> {
    fn default() -> Self {
        Samples {
            samples: Mutex::new(HashMap::new()),
            refreshing: AtomicBool::new(false),
        }
    }
}

/// What the cache holds for a list of keys.
pub struct CachedSamples<K, V> {
    /// Per key: its sample, when a usable one is held.
    pub usages: Vec<Option<V>>,
    /// Indices of keys with no usable sample: to be read now.
    pub missing: Vec<usize>,
    /// Keys whose sample is usable but no longer fresh: to be read again.
    pub stale: Vec<K>,
}

impl<K: Eq + Hash + Clone, V: Clone> Samples<K, V> {
    /// Looks up `keys` (`None`: nothing to read).
    pub fn lookup(&self, keys: &[Option<K>]) -> CachedSamples<K, V> {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let mut cached = CachedSamples {
            usages: vec![None; keys.len()],
            missing: Vec::new(),
            stale: Vec::new(),
        };
        for (i, key) in keys.iter().enumerate() {
            let Some(key) = key else { continue };
            match samples.get(key) {
                Some((taken, usage)) if taken.elapsed() < SAMPLE_USABLE => {
                    if taken.elapsed() >= SAMPLE_FRESH {
                        cached.stale.push(key.clone());
                    }
                    cached.usages[i] = Some(usage.clone());
                }
                _ => cached.missing.push(i),
            }
        }
        cached
    }

    /// Keeps freshly read samples (read at `taken`), dropping long unused ones.
    pub fn store(&self, taken: Instant, read: impl IntoIterator<Item = (K, V)>) {
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        samples.retain(|_, (at, _)| at.elapsed() < SAMPLE_KEPT);
        for (key, usage) in read {
            // A slow background read must not replace a sample read after it began.
            match samples.get(&key) {
                Some((at, _)) if *at > taken => {}
                _ => {
                    samples.insert(key, (taken, usage));
                }
            }
        }
    }

    /// Claims the one background refresh; `false` when one is running.
    pub fn start_refresh(&self) -> bool {
        !self.refreshing.swap(true, Ordering::AcqRel)
    }

    pub fn end_refresh(&self) {
        self.refreshing.store(false, Ordering::Release);
    }
}

/// A writable layer's usage as last measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerUsage {
    pub at_ns: i64,
    pub bytes: u64,
    pub inodes: u64,
}

/// Writable-layer usage per container, filled by the snapshot usage syncer.
#[derive(Default)]
pub struct LayerUsages {
    usages: Mutex<HashMap<String, LayerUsage>>,
}

impl LayerUsages {
    pub fn get(&self, id: &str) -> Option<LayerUsage> {
        self.usages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .copied()
    }

    pub fn set(&self, id: &str, usage: LayerUsage) {
        self.usages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string(), usage);
    }

    pub fn retain(&self, live: &HashSet<String>) {
        self.usages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id, _| live.contains(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_rates_need_two_samples_in_order() {
        let rates = CpuRates::default();
        assert_eq!(rates.sample("c", 1_000_000_000, 0), None);
        // Half a core for one second.
        assert_eq!(
            rates.sample("c", 2_000_000_000, 500_000_000),
            Some(500_000_000)
        );
        // The same sample again gets the same rate; an older one is no sample.
        assert_eq!(
            rates.sample("c", 2_000_000_000, 500_000_000),
            Some(500_000_000)
        );
        assert_eq!(rates.sample("c", 1_500_000_000, 900_000_000), None);
        assert_eq!(rates.latest("c"), Some(500_000_000));
        assert_eq!(rates.latest("other"), None);
        rates.retain(&HashSet::new());
        assert_eq!(rates.latest("c"), None);
        assert_eq!(rates.sample("c", 3_000_000_000, 600_000_000), None);
    }

    #[test]
    fn cgroup_samples_answer_while_fresh_and_name_what_to_read() {
        let samples = CgroupSamples::default();
        let paths = [Some("/a".to_string()), None, Some("/b".to_string())];
        let first = samples.lookup(&paths);
        assert_eq!(first.missing, vec![0, 2]);
        assert!(first.usages.iter().all(Option::is_none));
        let usage = CgroupUsage {
            cpu_usage_ns: Some(7),
            ..Default::default()
        };
        samples.store(Instant::now(), [("/a".to_string(), usage.clone())]);
        let second = samples.lookup(&paths);
        assert_eq!(second.missing, vec![2]);
        assert_eq!(second.usages[0], Some(usage.clone()));
        assert!(second.stale.is_empty());
        // Past fresh but still usable: answered, and named for a refresh.
        let older = Instant::now() - SAMPLE_FRESH - Duration::from_millis(100);
        samples.store(older, [("/b".to_string(), usage.clone())]);
        let third = samples.lookup(&paths);
        assert!(third.missing.is_empty());
        assert_eq!(third.stale, vec!["/b".to_string()]);
        // An older read does not replace a newer sample...
        let too_old = Instant::now() - SAMPLE_USABLE - Duration::from_millis(100);
        samples.store(too_old, [("/a".to_string(), usage.clone())]);
        assert!(samples.lookup(&paths).missing.is_empty());
        // ...and a sample too old is read again before answering.
        let fresh_cache = CgroupSamples::default();
        fresh_cache.store(too_old, [("/a".to_string(), usage)]);
        assert_eq!(fresh_cache.lookup(&paths).missing, vec![0, 2]);
        assert!(samples.start_refresh());
        assert!(!samples.start_refresh(), "a second refresh at once");
        samples.end_refresh();
        assert!(samples.start_refresh());
    }
}
