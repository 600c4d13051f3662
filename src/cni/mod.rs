//! CNI: network configurations from the conf dir, and the syncer that keeps them current.
//!
//! `NetworkConfigs` is the one place that holds the networks pods are wired with; the
//! syncer replaces its contents whenever the conf dir changes, and the CRI `Status` reads its
//! last load result. Nothing here is CRI-specific.

pub mod config;
pub mod network;
pub mod result;
pub mod syncer;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde_json::json;

pub use config::{LoadError, Loaded, NetworkConfigList};

/// The result of the most recent load of the conf dir.
#[derive(Debug, Clone)]
pub struct LoadStatus {
    pub result: Result<Loaded, LoadError>,
}

/// The currently loaded CNI networks. Readers get a snapshot; the syncer swaps it.
pub struct NetworkConfigs {
    conf_dir: PathBuf,
    bin_dirs: Vec<PathBuf>,
    max_conf_num: usize,
    current: RwLock<Arc<LoadStatus>>,
    /// How many times the conf dir has been read.
    loads: AtomicU64,
}

impl NetworkConfigs {
    /// Loads the conf dir once.
    pub fn load(conf_dir: PathBuf, bin_dirs: Vec<PathBuf>, max_conf_num: usize) -> Self {
        let result = config::load_networks(&conf_dir, max_conf_num);
        Self {
            conf_dir,
            bin_dirs,
            max_conf_num,
            current: RwLock::new(Arc::new(LoadStatus { result })),
            loads: AtomicU64::new(1),
        }
    }

    pub fn conf_dir(&self) -> &std::path::Path {
        &self.conf_dir
    }

    /// How many times the conf dir has been read (start-up included).
    pub fn load_count(&self) -> u64 {
        self.loads.load(Ordering::Relaxed)
    }

    /// The latest load result.
    pub fn current(&self) -> Arc<LoadStatus> {
        match self.current.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// `Ok` when at least one network is loaded; otherwise why not.
    pub fn ready(&self) -> Result<(), LoadError> {
        self.current()
            .result
            .as_ref()
            .map(|_| ())
            .map_err(Clone::clone)
    }

    /// Reads the conf dir again and swaps the result in; returns whether it changed.
    pub fn reload(&self) -> bool {
        self.loads.fetch_add(1, Ordering::Relaxed);
        let result = config::load_networks(&self.conf_dir, self.max_conf_num);
        let mut guard = match self.current.write() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if guard.result == result {
            return false;
        }
        match &result {
            Ok(loaded) => tracing::info!(
                networks = ?loaded.networks.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
                "CNI config loaded"
            ),
            Err(e) => tracing::warn!(error = %e, "CNI config not usable"),
        }
        *guard = Arc::new(LoadStatus { result });
        true
    }

    /// The loaded configuration as JSON, for `Status` verbose output.
    pub fn to_json(&self) -> serde_json::Value {
        let current = self.current();
        let (networks, rejected, error) = match &current.result {
            Ok(loaded) => (loaded.networks.clone(), loaded.rejected.clone(), None),
            Err(LoadError::NoConfig { rejected, .. }) => {
                (Vec::new(), rejected.clone(), current.result.as_ref().err())
            }
            Err(e) => (Vec::new(), Vec::new(), Some(e)),
        };
        json!({
            "pluginDirs": self.bin_dirs,
            "pluginConfDir": self.conf_dir,
            "pluginMaxConfNum": self.max_conf_num,
            "prefix": "eth",
            "networks": networks
                .iter()
                .enumerate()
                .map(|(i, n)| json!({"ifName": format!("eth{i}"), "config": n}))
                .collect::<Vec<_>>(),
            "rejected": rejected
                .iter()
                .map(|(path, reason)| json!({"file": path, "reason": reason}))
                .collect::<Vec<_>>(),
            "lastLoadError": error.map(ToString::to_string),
        })
    }
}
