//! Resource usage: cgroup CPU and memory ([`cgroup`]), pod network counters ([`netdev`]),
//! CPU rates from consecutive samples, and writable-layer usage measured in the background
//! so that stats never wait on the snapshotter.

pub mod cgroup;
pub mod netdev;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

pub use cgroup::{CgroupLayout, CgroupUsage, MemoryUsage};

/// The previous CPU sample per container or sandbox, to turn cumulative usage into a rate.
#[derive(Default)]
pub struct CpuRates {
    samples: Mutex<HashMap<String, (i64, u64)>>,
}

impl CpuRates {
    /// Records `usage_ns` at `at_ns` and returns the rate since the previous sample in
    /// nano-cores (1e9 is one core busy), when there is an older one.
    pub fn sample(&self, id: &str, at_ns: i64, usage_ns: u64) -> Option<u64> {
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let previous = samples.get(id).copied();
        match previous {
            Some((then, _)) if then >= at_ns => return None,
            _ => {}
        }
        samples.insert(id.to_string(), (at_ns, usage_ns));
        let (then, before) = previous?;
        let elapsed = (at_ns - then) as u128;
        let used = usage_ns.checked_sub(before)? as u128;
        u64::try_from(used * 1_000_000_000 / elapsed).ok()
    }

    /// Drops samples of IDs not in `live`.
    pub fn retain(&self, live: &HashSet<String>) {
        self.samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id, _| live.contains(id));
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
        // An older or equal timestamp is no sample.
        assert_eq!(rates.sample("c", 2_000_000_000, 900_000_000), None);
        rates.retain(&HashSet::new());
        assert_eq!(rates.sample("c", 3_000_000_000, 600_000_000), None);
    }
}
