//! Compiles the CRI API (cri-api's `api.proto`, unmodified, see `protos/cri-api/README.md`),
//! the containerd protos no crate ships (runc shim options, the sandbox API) and the static pause program of
//! the built-in sandbox image.
//!
//! The protos are parsed by `protox` (a Rust protobuf compiler) rather than `protoc`: cri-api
//! uses the `debug_redact` field option, which Debian bookworm's protoc 3.21 does not know.

#[path = "build/ttrpc.rs"]
mod ttrpc;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The CRI API versions crius serves, each generated into its own module.
const CRI_PROTOS: &[&str] = &[
    "protos/cri-api/runtime/v1/api.proto",
    "protos/cri-api/runtime/v1alpha2/api.proto",
];
const CRI_INCLUDES: &[&str] = &["protos/cri-api", "protos/gogo"];

fn main() {
    println!("cargo:rerun-if-changed=protos");
    println!("cargo:rerun-if-changed=pause/pause.c");
    println!("cargo:rerun-if-env-changed=CC");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR is set by cargo"));

    compile_cri_api(&out);
    let runc = protox::compile(["protos/runc_options.proto"], ["protos"])
        .unwrap_or_else(|e| panic!("parse protos/runc_options.proto: {e}"));
    prost_build::Config::new()
        .enable_type_names()
        .compile_fds(runc)
        .expect("generate the runc options");
    compile_sandbox_api();
    build_pause(&out);
    pack_static_relocations();
}

/// A static-pie relocates itself at start-up from a table that stays mapped: in the classic
/// format 24 bytes per pointer (480 KiB for crius, resident for the process's life); packed
/// (DT_RELR, glibc 2.36 and binutils 2.38 or newer) it is 6 KiB. Only for static glibc
/// builds (`make release`): a dynamic binary with packed relocations would demand glibc 2.36
/// of every node.
fn pack_static_relocations() {
    let features = std::env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
    let gnu_linux = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    if gnu_linux && features.split(',').any(|f| f == "crt-static") {
        println!("cargo:rustc-link-arg-bin=crius=-Wl,-z,pack-relative-relocs");
    }
}

/// containerd's sandbox API (`protos/containerd`, its tag in the README there): the gRPC
/// `Controller` crius serves as a proxy plugin, and the messages of the shim's ttrpc
/// `Sandbox` service it forwards to (`crate::sandboxer::shim` calls it over ttrpc).
fn compile_sandbox_api() {
    const API: &str = "github.com/containerd/containerd/api";
    // One compile: both files share `containerd.types`, generated once.
    let protos = protox::compile(
        [
            format!("{API}/services/sandbox/v1/sandbox.proto"),
            format!("{API}/runtime/sandbox/v1/sandbox.proto"),
        ],
        ["protos/containerd"],
    )
    .unwrap_or_else(|e| panic!("parse containerd's sandbox protos: {e}"));
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .compile_fds(protos)
        .expect("generate containerd's sandbox API");
}

/// Generates the CRI messages, the tonic services and, from the same service definitions,
/// the ttrpc ones (`build/ttrpc.rs`). Messages with fields marked
/// `debug_redact` (credentials) get a `Debug` that prints those fields as `<redacted>`, so no
/// log line at any level can show them.
fn compile_cri_api(out: &Path) {
    let mut compiler = protox::Compiler::new(CRI_INCLUDES)
        .unwrap_or_else(|e| panic!("set up the proto compiler: {e}"));
    compiler.include_imports(true).include_source_info(true);
    for file in CRI_PROTOS {
        let relative = file.trim_start_matches("protos/cri-api/");
        compiler
            .open_file(relative)
            .unwrap_or_else(|e| panic!("parse {file}: {e}"));
    }
    let redacted = redacted_messages(&compiler.descriptor_pool());
    check_v1alpha2_wire_compatible(&compiler.descriptor_pool());
    // v1alpha2 gets its messages and its client here; what crius serves of it comes from
    // `compile_cri_v1alpha2_served`.
    let services = ttrpc::ByPackage {
        generators: vec![
            (
                "runtime.v1",
                Box::new(ttrpc::TonicAndTtrpc {
                    tonic: tonic_prost_build::configure()
                        .build_client(true)
                        .build_server(true)
                        .service_generator(),
                }),
            ),
            (
                "runtime.v1alpha2",
                tonic_prost_build::configure()
                    .build_client(true)
                    .build_server(false)
                    .service_generator(),
            ),
        ],
    };
    let mut config = prost_build::Config::new();
    config.service_generator(Box::new(services));
    // The services come from `services`; this builder contributes the message settings.
    let mut builder = tonic_prost_build::configure()
        .type_attribute(
            ".runtime",
            "#[derive(serde::Serialize, serde::Deserialize)]",
        )
        .build_client(false)
        .build_server(false);
    let mut impls = String::new();
    if !redacted.is_empty() {
        builder = builder.skip_debug(redacted.iter().map(|m| m.full_name.clone()));
        for message in &redacted {
            impls.push_str(&message.debug_impl());
        }
    }
    builder
        .compile_fds_with_config(compiler.file_descriptor_set(), config)
        .expect("generate the CRI API");
    std::fs::write(out.join("cri_redacted_debug.rs"), impls)
        .expect("write the redacted Debug impls");
    compile_cri_v1alpha2_served(out);
}

/// The `v1alpha2` services crius serves (tonic and ttrpc), over the `v1` messages: the
/// older API's messages are a wire-compatible subset of the newer's (the same names, field
/// numbers and types), so its requests decode as `v1` ones and `v1` answers decode in its
/// clients, with no second set of messages to convert through.
fn compile_cri_v1alpha2_served(out: &Path) {
    let mut compiler = protox::Compiler::new(CRI_INCLUDES)
        .unwrap_or_else(|e| panic!("set up the proto compiler: {e}"));
    compiler.include_imports(true).include_source_info(true);
    compiler
        .open_file("runtime/v1alpha2/api.proto")
        .unwrap_or_else(|e| panic!("parse the v1alpha2 proto: {e}"));
    let dir = out.join("v1alpha2_served");
    std::fs::create_dir_all(&dir).expect("make the directory of the served v1alpha2 API");
    let mut config = prost_build::Config::new();
    config.service_generator(Box::new(ttrpc::TonicAndTtrpc {
        tonic: tonic_prost_build::configure()
            .build_client(false)
            .build_server(true)
            .service_generator(),
    }));
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .extern_path(".runtime.v1alpha2", "crate::api::v1")
        .out_dir(&dir)
        .compile_fds_with_config(compiler.file_descriptor_set(), config)
        .expect("generate the served v1alpha2 API");
}

/// crius serves `v1alpha2` over the `v1` messages (`compile_cri_v1alpha2_served`): that is
/// only right while every `v1alpha2` message and enum has a `v1` twin of the same name that
/// reads its bytes the same way. Checked here, so a proto update that breaks it fails the
/// build instead of an old kubelet.
fn check_v1alpha2_wire_compatible(pool: &prost_reflect::DescriptorPool) {
    let twin = |full_name: &str| full_name.replacen("runtime.v1alpha2.", "runtime.v1.", 1);
    for alpha in pool.all_messages() {
        if alpha.package_name() != "runtime.v1alpha2" {
            continue;
        }
        let v1 = pool
            .get_message_by_name(&twin(alpha.full_name()))
            .unwrap_or_else(|| panic!("{} has no runtime.v1 twin", alpha.full_name()));
        for field in alpha.fields() {
            let same = v1.get_field(field.number()).unwrap_or_else(|| {
                panic!(
                    "{}.{} has no field {} in v1",
                    alpha.full_name(),
                    field.name(),
                    field.number()
                )
            });
            assert!(
                field.cardinality() == same.cardinality()
                    && field.is_map() == same.is_map()
                    && same_wire_kind(&field.kind(), &same.kind(), twin),
                "{}.{} (field {}) is read differently in v1",
                alpha.full_name(),
                field.name(),
                field.number()
            );
        }
    }
    for alpha in pool.all_enums() {
        if alpha.package_name() != "runtime.v1alpha2" {
            continue;
        }
        let v1 = pool
            .get_enum_by_name(&twin(alpha.full_name()))
            .unwrap_or_else(|| panic!("{} has no runtime.v1 twin", alpha.full_name()));
        for value in alpha.values() {
            let same = v1.get_value(value.number()).map(|v| v.name().to_string());
            assert_eq!(
                same.as_deref(),
                Some(value.name()),
                "{} value {} means something else in v1",
                alpha.full_name(),
                value.number()
            );
        }
    }
}

/// Whether two field kinds read the same bytes the same way: the same scalar (`string` and
/// `bytes` are both length-delimited), or twin messages or enums.
fn same_wire_kind(
    alpha: &prost_reflect::Kind,
    v1: &prost_reflect::Kind,
    twin: impl Fn(&str) -> String,
) -> bool {
    use prost_reflect::Kind;
    match (alpha, v1) {
        (Kind::Message(a), Kind::Message(b)) => twin(a.full_name()) == b.full_name(),
        (Kind::Enum(a), Kind::Enum(b)) => twin(a.full_name()) == b.full_name(),
        (Kind::String | Kind::Bytes, Kind::String | Kind::Bytes) => true,
        (a, b) => a == b,
    }
}

/// A message with at least one `debug_redact` field.
struct RedactedMessage {
    /// `.runtime.v1.AuthConfig`
    full_name: String,
    /// `v1`
    module: String,
    /// `AuthConfig`
    name: String,
    /// Field names, with whether each is redacted.
    fields: Vec<(String, bool)>,
}

impl RedactedMessage {
    fn debug_impl(&self) -> String {
        let mut body = String::new();
        for (field, redacted) in &self.fields {
            let value = if *redacted {
                "&if self.{f}.is_empty() { \"\" } else { \"<redacted>\" }".replace("{f}", field)
            } else {
                format!("&self.{field}")
            };
            let _ = writeln!(body, "            .field({field:?}, {value})");
        }
        format!(
            "impl ::core::fmt::Debug for {module}::{name} {{\n    \
             fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {{\n        \
             f.debug_struct({name:?})\n{body}            .finish()\n    }}\n}}\n",
            module = self.module,
            name = self.name,
        )
    }
}

/// The messages with `debug_redact` fields. An older API version's message of the same name
/// (v1alpha2 predates the option) has the same fields redacted.
fn redacted_messages(pool: &prost_reflect::DescriptorPool) -> Vec<RedactedMessage> {
    let is_redacted = |field: &prost_reflect::FieldDescriptor| {
        field
            .options()
            .get_field_by_name("debug_redact")
            .and_then(|v| v.as_bool())
            .unwrap_or(false)
    };
    let mut marked: std::collections::HashMap<String, Vec<String>> = Default::default();
    for message in pool.all_messages() {
        let names: Vec<String> = message
            .fields()
            .filter(|f| is_redacted(f))
            .map(|f| f.name().to_string())
            .collect();
        if !names.is_empty() {
            marked
                .entry(message.name().to_string())
                .or_default()
                .extend(names);
        }
    }
    pool.all_messages()
        .filter(|m| m.full_name().starts_with("runtime.") && marked.contains_key(m.name()))
        .map(|message| {
            let secret = &marked[message.name()];
            RedactedMessage {
                full_name: format!(".{}", message.full_name()),
                module: message
                    .package_name()
                    .rsplit('.')
                    .next()
                    .unwrap_or_default()
                    .to_string(),
                name: message.name().to_string(),
                fields: message
                    .fields()
                    .map(|f| {
                        (
                            f.name().to_string(),
                            is_redacted(&f) || secret.iter().any(|s| s == f.name()),
                        )
                    })
                    .collect(),
            }
        })
        .collect()
}

fn build_pause(out: &Path) {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = Command::new(&cc)
        .args(["-static", "-Os", "-s", "-Wall", "-Werror", "-o"])
        .arg(out.join("pause"))
        .arg("pause/pause.c")
        .status()
        .unwrap_or_else(|e| panic!("run {cc} to build the pause program: {e}"));
    assert!(status.success(), "building the static pause program failed");
}
