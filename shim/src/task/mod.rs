//! The task and sandbox services containerd calls, and the state behind them: the shim's
//! containers and processes, their stdio, OOM and exit events, stats, and each container's
//! bundle (its rootfs mounts, idmapped where the pod has a user namespace).

pub mod bundle;
pub mod container;
pub mod control;
pub mod create;
pub mod events;
pub mod exec;
pub mod idmap;
pub mod oom;
pub mod process;
pub mod sandbox_service;
pub mod service;
pub mod shim;
pub mod stats;
pub mod stdio;
