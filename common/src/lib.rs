//! What crius and its shim both need, written once: the new mount API's system calls
//! (idmapped clones of mounts) and the files a pod is given.

pub mod mount_api;
pub mod pod_files;
