//! Generates the shim's sandbox service (`containerd.runtime.sandbox.v1.Sandbox`, ttrpc)
//! from containerd's proto kept unmodified under `../protos/containerd` (tag in its
//! README), and the part of CRI's pod config the shim reads (`../protos/cri-api/shim`).
//! Messages use rust-protobuf, as the task service from `containerd-shim-protos` does.

use std::path::{Path, PathBuf};

use ttrpc_codegen::{Codegen, Customize, ProtobufCustomize};

const CONTAINERD: &str = "../protos/containerd";
const SANDBOX_PROTOS: &[&str] = &[
    "github.com/containerd/containerd/api/types/mount.proto",
    "github.com/containerd/containerd/api/types/platform.proto",
    "github.com/containerd/containerd/api/types/metrics.proto",
    "github.com/containerd/containerd/api/runtime/sandbox/v1/sandbox.proto",
];
const POD_CONFIG: &str = "../protos/cri-api/shim/pod_config.proto";

fn main() {
    println!("cargo:rerun-if-changed={CONTAINERD}");
    println!("cargo:rerun-if-changed={POD_CONFIG}");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let inputs: Vec<String> = SANDBOX_PROTOS
        .iter()
        .map(|p| format!("{CONTAINERD}/{p}"))
        .chain([POD_CONFIG.to_string()])
        .collect();
    let dir = out.join("protos");
    std::fs::create_dir_all(&dir).expect("create the generated protos' directory");
    Codegen::new()
        .inputs(&inputs)
        .include(CONTAINERD)
        .include("../protos/cri-api/shim")
        .rust_protobuf()
        .rust_protobuf_customize(ProtobufCustomize::default().generate_accessors(false))
        .customize(Customize {
            async_all: true,
            ..Default::default()
        })
        .out_dir(&dir)
        .run()
        .expect("generate the sandbox service");
    strip_inner_attributes(&dir);
    pack_static_relocations();
    exec_helper_build_id();
}

/// The exec helper's sources besides `src/runtime/direct_exec/` (all of which counts): the shim and
/// `crius-exec-helper` are built from them together.
const EXEC_HELPER_SOURCES: &[&str] = &["src/runtime/caps.rs", "src/exec_helper.rs"];
const EXEC_HELPER_DIR: &str = "src/runtime/direct_exec";

/// A digest of the exec helper's sources and the package version (FNV-1a, 64 bits), as
/// `CRIUS_EXEC_HELPER_BUILD`: a helper binary of another build than the shim that runs it
/// declines, and the exec goes to runc.
fn exec_helper_build_id() {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    let mut feed = |bytes: &[u8]| {
        for byte in bytes {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    feed(version.as_bytes());
    println!("cargo:rerun-if-changed={EXEC_HELPER_DIR}");
    let mut sources: Vec<PathBuf> = std::fs::read_dir(EXEC_HELPER_DIR)
        .expect("read the exec helper's directory")
        .map(|entry| entry.expect("an exec helper source").path())
        // Editors' backups and swap files are not the helper's code.
        .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
        .collect();
    sources.sort();
    for source in EXEC_HELPER_SOURCES {
        println!("cargo:rerun-if-changed={source}");
        sources.push(PathBuf::from(source));
    }
    for source in &sources {
        feed(source.to_string_lossy().as_bytes());
        feed(&std::fs::read(source).expect("read an exec helper source"));
    }
    println!("cargo:rustc-env=CRIUS_EXEC_HELPER_BUILD={hash:016x}");
}

/// The static-pie shim relocates itself at start-up from a table that stays mapped in every
/// shim: 24 bytes per pointer in the classic format (190 KiB), 2 KiB packed (DT_RELR: musl
/// 1.2.4 or glibc 2.36, binutils 2.38 or newer). Static builds only: a dynamic binary with
/// packed relocations would demand glibc 2.36 of every node.
fn pack_static_relocations() {
    let features = std::env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
    let linux = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux");
    // Cargo does not list crt-static for musl targets, which link statically by default.
    let musl = std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("musl");
    if linux && (musl || features.split(',').any(|f| f == "crt-static")) {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// `include!` takes no inner attributes (`#![...]`) nor inner doc comments: drop those lines.
fn strip_inner_attributes(dir: &Path) {
    for entry in std::fs::read_dir(dir).expect("read the generated protos") {
        let path = entry.expect("generated file").path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read a generated file");
        let kept: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with("#!") && !l.starts_with("//!"))
            .collect();
        std::fs::write(&path, kept.join("\n")).expect("write a generated file");
    }
}
