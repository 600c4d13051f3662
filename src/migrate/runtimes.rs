//! Runtime handlers: `containerd.runtimes.<name>` with their runc options, the default
//! handler, and the deprecated `default_runtime` / `untrusted_workload_runtime` tables.
//!
//! A handler keeps its containerd `runtime_type`: crius hands any runtime v2 shim type to
//! containerd, and passes runc options to the runc types. A handler is left out (and said
//! so) when carrying it would silently change what runs: the removed runtime v1 shim, a
//! `runtime_path` naming the shim binary, or options for a shim that is not runc's.
//! containerd's built-in handler, `runc` on its Go runc shim, stands in wherever the file
//! has none (crius's own default `runc` runs on crius's shim instead).

use std::collections::{BTreeMap, BTreeSet};

use toml::Value;

use super::Ctx;
use super::layout::Layout;
use super::section::{Rule, Section, any, is_empty, is_false};
use crate::config::{RUNC_RUNTIME_TYPES, RUNC_SHIM, RuncOptions, RuntimeConfig};

/// The runtime v1 shim, gone from containerd 2.0.
const RUNTIME_V1: &str = "io.containerd.runtime.v1.linux";

/// The handlers read so far.
#[derive(Debug, Default)]
pub(crate) struct Runtimes {
    pub carried: BTreeMap<String, RuntimeConfig>,
    /// Handlers defined in the file but not carried over.
    pub dropped: BTreeSet<String>,
    /// The default handler's name and the key that named it.
    pub default: Option<(String, String)>,
}

const CONTAINERD_RULES: &[Rule] = &[
    Rule {
        key: "no_pivot",
        neutral: is_false,
        reason: "applied only to the runtime v1 shim; set NoPivotRoot = true in a runc \
                 handler's options instead",
    },
    Rule {
        key: "ignore_rdt_not_enabled_errors",
        neutral: any,
        reason: "",
    },
    Rule {
        key: "ignore_blockio_not_enabled_errors",
        neutral: any,
        reason: "",
    },
];

const HANDLER_RULES: &[Rule] = &[
    Rule {
        // A handler with a runtime_path is not carried over at all (see drop_reason).
        key: "runtime_path",
        neutral: is_empty,
        reason: "crius cannot name a shim binary",
    },
    Rule {
        key: "runtime_engine",
        neutral: is_empty,
        reason: "used only by the runtime v1 shim",
    },
    Rule {
        key: "runtime_root",
        neutral: is_empty,
        reason: "used only by the runtime v1 shim; set Root in the runc options instead",
    },
    Rule {
        key: "base_runtime_spec",
        neutral: is_empty,
        reason: "crius has no base OCI spec per handler: it builds every spec from its own \
                 defaults",
    },
    Rule {
        key: "cni_conf_dir",
        neutral: is_empty,
        reason: "crius has one CNI config directory for all handlers (cni.conf_dir)",
    },
    Rule {
        key: "cni_max_conf_num",
        neutral: is_empty,
        reason: "crius has one CNI config directory for all handlers (cni.max_conf_num)",
    },
    Rule {
        key: "sandbox_mode",
        neutral: podsandbox,
        reason: "crius makes every handler's pods itself (a pause container, or a pod its \
                 shim holds), as containerd's podsandbox mode does",
    },
    Rule {
        key: "sandboxer",
        neutral: podsandbox,
        reason: "crius makes every handler's pods itself (a pause container, or a pod its \
                 shim holds), as containerd's podsandbox sandboxer does",
    },
    Rule {
        key: "io_type",
        neutral: fifo,
        reason: "crius connects container stdio through FIFOs only",
    },
    Rule {
        key: "privileged_without_host_devices_all_devices_allowed",
        neutral: is_false,
        reason: "crius has no equivalent: a privileged container without host devices gets \
                 the default device rules",
    },
    Rule {
        key: "cgroup_writable",
        neutral: is_false,
        reason: "crius gives containers no writable cgroup filesystem",
    },
    Rule {
        key: "treat_ro_mounts_as_rro",
        neutral: is_false,
        reason: "crius makes a read-only mount recursively read-only only when kubelet asks",
    },
];

const RUNC_OPTION_RULES: &[Rule] = &[Rule {
    key: "CriuPath",
    neutral: is_empty,
    reason: "crius's runc options have no CriuPath: runc finds criu on its PATH",
}];

fn podsandbox(v: &Value) -> bool {
    matches!(v.as_str(), Some("" | "podsandbox"))
}

fn fifo(v: &Value) -> bool {
    matches!(v.as_str(), Some("" | "fifo"))
}

/// The `containerd` table of the CRI plugin (version 3: of the runtime plugin).
pub(super) fn containerd_section(sec: &mut Section<'_>, layout: Layout, ctx: &mut Ctx) {
    if layout != Layout::V3 {
        super::settings::snapshot_settings(sec, ctx);
    }
    if let Some(name) = sec.string("default_runtime_name", &mut ctx.report)
        && !name.is_empty()
    {
        ctx.runtimes.default = Some((name, sec.key("default_runtime_name")));
    }
    if let Some(mut runtimes) = sec.table("runtimes", &mut ctx.report) {
        for name in runtimes.unread_keys() {
            if let Some(mut table) = runtimes.table(&name, &mut ctx.report) {
                handler(&mut table, &name, ctx);
                table.finish(&mut ctx.report);
            }
        }
        runtimes.finish(&mut ctx.report);
    }
    if layout != Layout::V3 {
        deprecated_handler(sec, "default_runtime", "default", ctx);
        deprecated_handler(sec, "untrusted_workload_runtime", "untrusted", ctx);
    }
    sec.unsupported(CONTAINERD_RULES, &mut ctx.report);
}

/// `default_runtime` and `untrusted_workload_runtime`: containerd 1.x turns them into the
/// handlers "default" (then the default) and "untrusted" when their runtime_type is set.
fn deprecated_handler(sec: &mut Section<'_>, key: &str, name: &str, ctx: &mut Ctx) {
    let Some(mut table) = sec.table(key, &mut ctx.report) else {
        return;
    };
    let runtime_type = table.peek("runtime_type").and_then(Value::as_str);
    if runtime_type.is_none_or(str::is_empty) {
        // An unused placeholder: containerd ignores the whole table.
        table.take_all();
        return;
    }
    if handler(&mut table, name, ctx) {
        ctx.report.note(
            table.path(),
            format!("deprecated: carried over as the runtime handler {name:?}"),
        );
    }
    table.finish(&mut ctx.report);
    if name == "default" {
        ctx.runtimes.default = Some((name.to_string(), sec.key(key)));
    }
}

/// One handler: carried over into `ctx.runtimes` (true), or reported as a whole.
fn handler(table: &mut Section<'_>, name: &str, ctx: &mut Ctx) -> bool {
    let mut runtime_type = table
        .string("runtime_type", &mut ctx.report)
        .unwrap_or_default();
    if runtime_type.is_empty() {
        runtime_type = RUNC_SHIM.to_string();
        ctx.report.note(
            table.key("runtime_type"),
            format!("empty: containerd runs {RUNC_SHIM}, and so does crius"),
        );
    }
    if let Some(reason) = drop_reason(table, &runtime_type) {
        ctx.report.not_carried(table.path(), reason);
        table.take_all();
        ctx.runtimes.dropped.insert(name.to_string());
        return false;
    }
    let mut runtime = RuntimeConfig {
        runtime_type,
        ..RuntimeConfig::default()
    };
    handler_fields(table, &mut runtime, ctx);
    if runtime.runtime_type != crate::config::CRIUS_SHIM
        && RUNC_RUNTIME_TYPES.contains(&runtime.runtime_type.as_str())
    {
        ctx.report.note(
            table.key("runtime_type"),
            format!(
                "{:?} kept: the handler runs on containerd's Go runc shim as before; \
                 runtime_type = \"io.containerd.crius.v2\" would run it on crius's own shim",
                runtime.runtime_type
            ),
        );
    }
    ctx.runtimes.carried.insert(name.to_string(), runtime);
    true
}

/// Why a handler cannot be carried over without changing what runs, if it cannot.
fn drop_reason(table: &Section<'_>, runtime_type: &str) -> Option<String> {
    if runtime_type == RUNTIME_V1 {
        return Some(format!(
            "the runtime v1 shim ({RUNTIME_V1}) is gone from containerd 2.0 and crius gives \
             it no options; define the handler with runtime_type = \"{RUNC_SHIM}\""
        ));
    }
    if let Some(path) = table.peek("runtime_path").and_then(Value::as_str)
        && !path.is_empty()
    {
        return Some(format!(
            "runtime_path {path:?}: crius cannot name a shim binary, so containerd would \
             start whatever shim for {runtime_type} is on its PATH instead"
        ));
    }
    let options = table.peek("options").and_then(Value::as_table);
    if !RUNC_RUNTIME_TYPES.contains(&runtime_type)
        && let Some(options) = options.filter(|o| !o.is_empty())
    {
        let keys: Vec<&str> = options.keys().map(String::as_str).collect();
        return Some(format!(
            "crius passes options only to runc shims; {runtime_type}'s options ({}) would \
             be lost and the handler would run differently",
            keys.join(", ")
        ));
    }
    None
}

fn handler_fields(table: &mut Section<'_>, runtime: &mut RuntimeConfig, ctx: &mut Ctx) {
    if let Some(patterns) = table.strings("pod_annotations", &mut ctx.report) {
        runtime.pod_annotations = patterns;
    }
    if let Some(patterns) = table.strings("container_annotations", &mut ctx.report) {
        runtime.container_annotations = patterns;
    }
    if let Some(b) = table.bool("privileged_without_host_devices", &mut ctx.report) {
        runtime.privileged_without_host_devices = b;
    }
    if let Some(snapshotter) = table.string("snapshotter", &mut ctx.report) {
        runtime.snapshotter = snapshotter;
    }
    if let Some(mut options) = table.table("options", &mut ctx.report) {
        if RUNC_RUNTIME_TYPES.contains(&runtime.runtime_type.as_str()) {
            runc_options(&mut options, &mut runtime.options, ctx);
        }
        options.finish(&mut ctx.report);
    }
    table.unsupported(HANDLER_RULES, &mut ctx.report);
}

fn runc_options(sec: &mut Section<'_>, options: &mut RuncOptions, ctx: &mut Ctx) {
    let report = &mut ctx.report;
    let strings: [(&str, &mut String); 5] = [
        ("BinaryName", &mut options.binary_name),
        ("Root", &mut options.root),
        ("ShimCgroup", &mut options.shim_cgroup),
        ("CriuImagePath", &mut options.criu_image_path),
        ("CriuWorkPath", &mut options.criu_work_path),
    ];
    for (key, field) in strings {
        if let Some(value) = sec.string(key, report) {
            *field = value;
        }
    }
    let bools: [(&str, &mut bool); 3] = [
        ("SystemdCgroup", &mut options.systemd_cgroup),
        ("NoPivotRoot", &mut options.no_pivot_root),
        ("NoNewKeyring", &mut options.no_new_keyring),
    ];
    for (key, field) in bools {
        if let Some(value) = sec.bool(key, report) {
            *field = value;
        }
    }
    for (key, field) in [
        ("IoUid", &mut options.io_uid),
        ("IoGid", &mut options.io_gid),
    ] {
        if let Some(id) = sec.int(key, report) {
            match u32::try_from(id) {
                Ok(id) => *field = id,
                Err(_) => {
                    report.not_carried(sec.key(key), format!("{id} is not a user or group ID"))
                }
            }
        }
    }
    sec.unsupported(RUNC_OPTION_RULES, report);
}

/// Settles the handlers once the whole file is read: the carried ones replace crius's
/// defaults, and the default handler is one of them. containerd's built-in handler is
/// `runc` on its Go runc shim, so that is what stands in for a handler the file lacks.
pub(super) fn finish(ctx: &mut Ctx) {
    let mut runtimes = std::mem::take(&mut ctx.runtimes);
    let (wanted, key) = runtimes
        .default
        .take()
        .unwrap_or_else(|| ("runc".to_string(), "default_runtime_name".to_string()));
    // containerd keeps its built-in "runc" handler unless the file redefines it.
    if !runtimes.dropped.contains("runc") && !runtimes.carried.contains_key("runc") {
        runtimes
            .carried
            .insert("runc".to_string(), containerd_runc());
    }
    let default = if runtimes.carried.contains_key(&wanted) {
        wanted
    } else {
        // Also when the file's own "runc" could not come along.
        runtimes
            .carried
            .entry("runc".to_string())
            .or_insert_with(containerd_runc);
        let reason = if runtimes.dropped.contains(&wanted) {
            format!(
                "the handler {wanted:?} was not carried over; the default handler is now \"runc\""
            )
        } else {
            format!("no handler {wanted:?} is defined; the default handler stays \"runc\"")
        };
        ctx.report.not_carried(key, reason);
        "runc".to_string()
    };
    ctx.config.containerd.runtimes = runtimes.carried;
    ctx.config.containerd.default_runtime = default;
}

/// containerd's built-in handler: runc on containerd's Go runc shim.
fn containerd_runc() -> RuntimeConfig {
    RuntimeConfig {
        runtime_type: RUNC_SHIM.to_string(),
        ..RuntimeConfig::default()
    }
}
