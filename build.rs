//! Compiles the containerd protos no crate ships (runc shim options) and the static pause
//! program of the built-in sandbox image.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=protos");
    println!("cargo:rerun-if-changed=pause/pause.c");
    println!("cargo:rerun-if-env-changed=CC");

    prost_build::Config::new()
        .enable_type_names()
        .compile_protos(&["protos/runc_options.proto"], &["protos"])
        .expect("compile protos (is protoc installed?)");

    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = Command::new(&cc)
        .args(["-static", "-Os", "-s", "-Wall", "-Werror", "-o"])
        .arg(out.join("pause"))
        .arg("pause/pause.c")
        .status()
        .unwrap_or_else(|e| panic!("run {cc} to build the pause program: {e}"));
    assert!(status.success(), "building the static pause program failed");
}
