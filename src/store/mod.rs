//! In-memory stores, rebuilt from containerd at start-up: images, sandboxes (and, as they
//! land, containers), name registrars, and the ID prefix index crictl users rely on.
//!
//! Stores hold plain data behind short synchronous locks; they never call containerd.

pub mod container;
pub mod id_index;
pub mod image;
pub mod name_registrar;
pub mod sandbox;

pub use container::{
    Container, ContainerMetadata, ContainerState, ContainerStatus, ContainerStore, RecordView,
};
pub use id_index::{IdIndex, IdLookupError};
pub use image::{Image, ImageStore};
pub use name_registrar::{NameRegistrar, NameReserved};
pub use sandbox::{Sandbox, SandboxMetadata, SandboxState, SandboxStatus, SandboxStore};
