//! Protobuf messages compiled from `protos/` by `build.rs`.

/// `containerd.runc.v1`: the runc shim's options.
pub mod runc {
    include!(concat!(env!("OUT_DIR"), "/containerd.runc.v1.rs"));
}

/// The static pause program of the built-in sandbox image.
pub static PAUSE_BINARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pause"));
