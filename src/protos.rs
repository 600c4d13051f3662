//! Protobuf messages compiled from `protos/` by `build.rs`.

/// `containerd.runc.v1`: the runc shim's options.
pub mod runc {
    include!(concat!(env!("OUT_DIR"), "/containerd.runc.v1.rs"));
}

/// containerd's sandbox API, in modules that follow its packages.
pub mod containerd {
    /// `containerd.types`: what the sandbox API shares (mounts, platforms, metrics).
    pub mod types {
        include!(concat!(env!("OUT_DIR"), "/containerd.types.rs"));
    }
    pub mod services {
        pub mod sandbox {
            /// `containerd.services.sandbox.v1`: the `Controller` a proxy plugin serves.
            pub mod v1 {
                include!(concat!(
                    env!("OUT_DIR"),
                    "/containerd.services.sandbox.v1.rs"
                ));
            }
        }
    }
    pub mod runtime {
        pub mod sandbox {
            /// `containerd.runtime.sandbox.v1`: the messages of a shim's `Sandbox` service.
            pub mod v1 {
                include!(concat!(
                    env!("OUT_DIR"),
                    "/containerd.runtime.sandbox.v1.rs"
                ));
            }
        }
    }
}

/// The static pause program of the built-in sandbox image.
pub static PAUSE_BINARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pause"));
