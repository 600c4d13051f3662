//! The OCI image format as crius reads it: image references and the manifests, indexes and
//! configs a registry or containerd's content store holds. Plain data and parsing, used by
//! the image service, the stores and the CRI handlers alike.

pub mod manifest;
pub mod reference;
