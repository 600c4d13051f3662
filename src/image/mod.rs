//! Images: registry hosts and credentials, the registry client, and pulls into
//! containerd's content store and snapshotter.
//!
//! Nothing here speaks CRI; `src/cri/image_*.rs` turn requests into calls on
//! [`ImagePuller`] and the [`crate::store::ImageStore`].

pub mod auth;
pub mod builtin;
pub mod hosts;
pub mod labels;
pub mod load;
mod pull;
pub mod registry;
pub mod unpack;

pub use pull::{ImagePuller, MANAGED_LABEL, PullFailure};
