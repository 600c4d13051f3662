//! crius-exec-helper: the shim's exec helper on its own. For every exec the shim runs
//! without runc it copies a binary into a sealed memfd and runs the helper from there (see
//! `direct_exec/seal.rs`); this one is a fraction of the shim's size, so that copy costs
//! little. Installed beside the shim; without it the shim copies itself.
//!
//! The modules are the shim's own (`runtime/caps.rs` and the helper's part of `runtime/direct_exec/`),
//! built into this binary as well.

mod runtime {
    pub mod caps;
    pub mod direct_exec {
        mod cgroups;
        mod child;
        pub mod helper;
        mod lookup;
        mod spec;
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    runtime::direct_exec::helper::run(&args)
}
