//! The CRI layer: the service (`service.rs`: everything crius owns, built by `new`), its
//! start-up (`startup.rs`: recovery, then the critical tasks), recovery (`recovery.rs`), the
//! containerd event loop (`events.rs`), client deadlines (`deadline.rs`) and the handlers,
//! one file per RPC family.
//!
//! Handlers are thin: validate the request, call the parts below (containerd, CNI, stores,
//! `sys` for the OS), and map failures to gRPC codes with a message a person can act on.
//! They take and return plain CRI `v1` messages; logging, the initialized gate and the other
//! API versions and transports are the transport layer's business (`crate::server`).

pub(crate) mod container;
mod container_checkpoint;
mod container_create;
pub(crate) use container_create::container_fingerprint;
mod container_events;
pub use container_events::{ContainerEventStream, EVENT_BUFFER as CONTAINER_EVENT_BUFFER};
mod container_execsync;
mod container_log;
mod container_remove;
mod container_restore;
pub(crate) mod container_rootfs;
mod container_start;
mod container_status;
mod container_stop;
mod container_update;
pub mod deadline;
pub mod events;
pub(crate) mod exits;
mod image_fs_info;
mod image_pull;
mod image_remove;
mod image_status;
pub(crate) mod image_volume;
mod list_stream;
mod metrics;
mod names;
pub mod record;
pub mod recovery;
mod runtime_config;
mod runtime_errors;
pub(crate) mod sandbox;
mod sandbox_remove;
mod sandbox_run;
pub(crate) use sandbox_run::sandbox_fingerprint;
mod sandbox_status;
mod sandbox_stop;
pub(crate) mod sandbox_update;
mod service;
pub use service::{CriService, ServiceError, ServiceState, TaskEnd};
mod startup;
mod stats;
mod status;
mod stream;
mod userns;
mod validate;
mod version;

/// The runtime name crius reports.
pub const RUNTIME_NAME: &str = "crius";
/// The CRI API version this crate implements natively.
pub const RUNTIME_API_VERSION: &str = "v1";

/// Nanoseconds since the Unix epoch, as CRI timestamps are written.
pub(crate) fn unix_nanos(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
