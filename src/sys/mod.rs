//! OS mechanics, in one place: mounts, idmapped mounts, network namespaces, user
//! namespaces, directory trees and the file system helpers the handlers build on. The CRI
//! handlers reach the kernel only through here.

pub mod fsutil;
pub mod host;
pub mod idmap;
pub mod mount;
pub mod netns;
pub mod tree;
pub mod userns;
