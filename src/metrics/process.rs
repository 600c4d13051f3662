//! The process's own cost, read from procfs when metrics are scraped.

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Unit;

use super::Catalog;

pub struct ProcessGauges {
    resident_memory: Gauge,
    open_fds: Gauge,
    threads: Gauge,
}

impl ProcessGauges {
    pub fn register(catalog: &mut Catalog) -> Self {
        let gauges = Self {
            resident_memory: Gauge::default(),
            open_fds: Gauge::default(),
            threads: Gauge::default(),
        };
        catalog.add(
            "process_resident_memory",
            "crius's resident memory (its own process, not containerd's or the shims')",
            Some(Unit::Bytes),
            gauges.resident_memory.clone(),
        );
        catalog.add(
            "process_open_fds",
            "File descriptors crius has open",
            None,
            gauges.open_fds.clone(),
        );
        catalog.add(
            "process_threads",
            "crius's threads",
            None,
            gauges.threads.clone(),
        );
        gauges
    }

    /// Reads the current values; one that cannot be read keeps its last.
    pub fn refresh(&self) {
        if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
            if let Some(kib) = status_field(&status, "VmRSS:") {
                self.resident_memory.set(kib.saturating_mul(1024));
            }
            if let Some(threads) = status_field(&status, "Threads:") {
                self.threads.set(threads);
            }
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            self.open_fds.set(fds.count() as i64);
        }
    }
}

/// The number in a `/proc/<pid>/status` line (`VmRSS:   1234 kB`).
fn status_field(status: &str, key: &str) -> Option<i64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read_as_numbers() {
        let status = "Name:\tcrius\nVmRSS:\t   18236 kB\nThreads:\t8\n";
        assert_eq!(status_field(status, "VmRSS:"), Some(18236));
        assert_eq!(status_field(status, "Threads:"), Some(8));
        assert_eq!(status_field(status, "VmSwap:"), None);
    }
}
