//! The shape of a containerd config: its version, where the CRI settings live in it, and
//! the few containerd-wide keys crius needs (containerd's socket and root).

use std::path::Path;

use toml::{Table, Value};

use super::report::join_key;
use super::section::Section;
use super::{Ctx, MigrateError, runtimes, settings};

/// Where a containerd config keeps the CRI settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// No `version` key: `plugins.cri` (containerd 1.0 to 1.x).
    V1,
    /// `version = 2`: `plugins."io.containerd.grpc.v1.cri"` (containerd 1.3 to 1.7).
    V2,
    /// `version = 3` and `4`: the runtime, images and server plugins of containerd 2.x (4,
    /// from containerd 2.3, moves containerd's own server settings into plugins too).
    V3,
}

const V2_CRI: &str = "io.containerd.grpc.v1.cri";
/// Version 4's gRPC server plugin, which holds containerd's socket address.
const V4_GRPC_SERVER: &str = "io.containerd.server.v1.grpc";
const V3_RUNTIME: &str = "io.containerd.cri.v1.runtime";
const V3_IMAGES: &str = "io.containerd.cri.v1.images";

const NO_CRI_SETTINGS: &str = "no CRI settings in the file: containerd ran its CRI with the \
                               defaults, and crius keeps its own, but for the runc handler, \
                               which stays on containerd's runc shim (io.containerd.runc.v2)";

/// Reads the whole document into `ctx`; returns the config version.
pub(super) fn migrate_document(
    doc: &Table,
    source: &Path,
    ctx: &mut Ctx,
) -> Result<i64, MigrateError> {
    let version = match doc.get("version") {
        None => 1,
        Some(Value::Integer(v @ 1..=4)) => *v,
        Some(other) => {
            return Err(MigrateError::UnknownVersion {
                path: source.to_path_buf(),
                version: other.to_string(),
            });
        }
    };
    let layout = match version {
        1 => Layout::V1,
        2 => Layout::V2,
        _ => Layout::V3,
    };
    containerd_keys(doc, layout, ctx);
    if version == 4 {
        server_plugin_address(doc, ctx);
    }
    match doc.get("plugins").and_then(Value::as_table) {
        Some(plugins) => {
            match layout {
                Layout::V1 | Layout::V2 => one_plugin(plugins, layout, ctx),
                Layout::V3 => split_plugins(plugins, ctx),
            }
            snapshotter_root(plugins, layout, ctx);
        }
        None => ctx.report.note("plugins", NO_CRI_SETTINGS),
    }
    runtimes::finish(ctx);
    Ok(version)
}

/// containerd's own `root` and `[grpc] address`: where crius finds containerd.
fn containerd_keys(doc: &Table, layout: Layout, ctx: &mut Ctx) {
    let mut top = Section::new(String::new(), doc);
    if let Some(root) = top.string("root", &mut ctx.report) {
        if Path::new(&root).is_absolute() {
            ctx.config.containerd.root = root.into();
        } else {
            ctx.report
                .not_carried("root", format!("{root:?} is not an absolute path"));
        }
    }
    if let Some(mut grpc) = top.table("grpc", &mut ctx.report)
        && let Some(address) = grpc.string("address", &mut ctx.report)
        && !address.is_empty()
    {
        if Path::new(&address).is_absolute() {
            ctx.config.containerd.address = address.into();
        } else {
            ctx.report.not_carried(
                "grpc.address",
                format!("{address:?} is not an absolute socket path"),
            );
        }
    }
    if let Some(imports) = top.strings("imports", &mut ctx.report)
        && !imports.is_empty()
    {
        ctx.report.not_carried(
            "imports",
            format!(
                "imported files are not read ({}): migrate each one that holds CRI settings \
                 and merge the results",
                imports.join(", ")
            ),
        );
    }
    let cri = if layout == Layout::V1 { "cri" } else { V2_CRI };
    if let Some(disabled) = top.strings("disabled_plugins", &mut ctx.report)
        && disabled.iter().any(|p| p == cri || p == V2_CRI)
    {
        ctx.report.note(
            "disabled_plugins",
            "containerd's CRI plugin is disabled in this file; its settings are migrated anyway",
        );
    }
}

/// Version 4 (containerd 2.3) moves `[grpc] address` into the gRPC server plugin.
fn server_plugin_address(doc: &Table, ctx: &mut Ctx) {
    let address = doc
        .get("plugins")
        .and_then(|p| p.get(V4_GRPC_SERVER))
        .and_then(|g| g.get("address"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    if address.is_empty() {
        return;
    }
    if Path::new(address).is_absolute() {
        ctx.config.containerd.address = address.into();
    } else {
        ctx.report.not_carried(
            format!("{}.address", join_key("plugins", V4_GRPC_SERVER)),
            format!("{address:?} is not an absolute socket path"),
        );
    }
}

/// Version 1 and 2: one CRI plugin table holds everything.
fn one_plugin(plugins: &Table, layout: Layout, ctx: &mut Ctx) {
    let (name, misplaced, why): (&str, &[&str], &str) = if layout == Layout::V1 {
        (
            "cri",
            &[V2_CRI],
            "this file has no version key, so containerd reads it as version 1 and never reads \
             this table (version 1 calls the plugin \"cri\"); add version = 2 if it is meant, \
             and migrate again",
        )
    } else {
        (
            V2_CRI,
            &[V3_RUNTIME, V3_IMAGES],
            "a version 3 plugin in a version 2 file; set version = 3 if the file is meant for \
             containerd 2.x, and migrate again",
        )
    };
    for other in misplaced {
        if plugins.contains_key(*other) {
            ctx.report.not_carried(join_key("plugins", other), why);
        }
    }
    let Some(mut sec) = plugin(plugins, name, ctx) else {
        ctx.report.note(join_key("plugins", name), NO_CRI_SETTINGS);
        return;
    };
    settings::runtime_settings(&mut sec, layout, ctx);
    settings::image_settings(&mut sec, layout, ctx);
    settings::server_settings(&mut sec, ctx);
    sec.finish(&mut ctx.report);
}

/// Version 3: runtime, images and server keys in three plugins.
fn split_plugins(plugins: &Table, ctx: &mut Ctx) {
    if let Some(mut sec) = plugin(plugins, V3_RUNTIME, ctx) {
        settings::runtime_settings(&mut sec, Layout::V3, ctx);
        sec.finish(&mut ctx.report);
    }
    if let Some(mut sec) = plugin(plugins, V3_IMAGES, ctx) {
        settings::image_settings(&mut sec, Layout::V3, ctx);
        sec.finish(&mut ctx.report);
    }
    if let Some(mut sec) = plugin(plugins, V2_CRI, ctx) {
        settings::server_settings(&mut sec, ctx);
        sec.finish(&mut ctx.report);
    }
}

fn plugin<'a>(plugins: &'a Table, name: &str, ctx: &mut Ctx) -> Option<Section<'a>> {
    let mut all = Section::new("plugins".to_string(), plugins);
    all.table(name, &mut ctx.report)
}

/// A snapshotter `root_path` of its own moves the image filesystem away from where crius
/// reports it (`<containerd root>/io.containerd.snapshotter.v1.<name>`).
fn snapshotter_root(plugins: &Table, layout: Layout, ctx: &mut Ctx) {
    let snapshotter = ctx.config.containerd.snapshotter.clone();
    let name = if layout == Layout::V1 {
        snapshotter.clone()
    } else {
        format!("io.containerd.snapshotter.v1.{snapshotter}")
    };
    let root_path = plugins
        .get(&name)
        .and_then(|p| p.get("root_path"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !root_path.is_empty() {
        ctx.report.not_carried(
            format!("{}.root_path", join_key("plugins", &name)),
            format!(
                "crius reports the image filesystem at <containerd.root>/io.containerd.\
                 snapshotter.v1.{snapshotter}, not at {root_path:?}"
            ),
        );
    }
}
