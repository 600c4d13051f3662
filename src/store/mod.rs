//! In-memory stores, rebuilt from containerd at start-up: images (and, as they land,
//! sandboxes and containers), with the ID prefix index crictl users rely on.
//!
//! Stores hold plain data behind short synchronous locks; they never call containerd.

pub mod id_index;
pub mod image;

pub use id_index::{IdIndex, IdLookupError};
pub use image::{Image, ImageStore};
