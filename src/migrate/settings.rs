//! The CRI plugin's own keys: the runtime-side settings (log lines, OOM score, CDI, CNI and
//! the security switches), the image-side settings (sandbox image, snapshotter, downloads)
//! and the stream server. In a version 2 file they share one table; version 3 splits them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::Value;

use super::Ctx;
use super::duration::parse_go_duration;
use super::layout::Layout;
use super::section::{Rule, Section, any, is_empty, is_false, is_true, never, type_name};
use crate::config::RestrictOomScoreAdj;

const RUNTIME_RULES: &[Rule] = &[
    // containerd 2.3 (config version 4) adds these.
    Rule {
        key: "stats_retention_period",
        neutral: is_empty,
        reason: "crius keeps only the last two CPU samples of each container: the rate \
                 between them is the one reported",
    },
    Rule {
        key: "enable_criu",
        neutral: is_true,
        reason: "crius checkpoints containers with CRIU whenever the runtime can; it has no \
                 switch to refuse checkpoints",
    },
    Rule {
        key: "enable_experimental_restore_via_create",
        neutral: any,
        reason: "",
    },
    Rule {
        key: "enable_selinux",
        neutral: is_false,
        reason: "crius has no SELinux labelling",
    },
    Rule {
        key: "selinux_category_range",
        neutral: any,
        reason: "",
    },
    Rule {
        key: "disable_apparmor",
        neutral: never,
        reason: "crius has no switch for AppArmor: it applies the profiles pods name \
                 (localhost/<profile>) when the kernel has AppArmor, and has no runtime/default \
                 AppArmor profile of its own",
    },
    Rule {
        key: "disable_cgroup",
        neutral: is_false,
        reason: "crius always puts containers in cgroups",
    },
    Rule {
        key: "disable_hugetlb_controller",
        neutral: is_false,
        reason: "crius always passes the hugepage limits pods ask for to the runtime",
    },
    Rule {
        key: "tolerate_missing_hugetlb_controller",
        neutral: any,
        reason: "",
    },
    Rule {
        key: "disable_proc_mount",
        neutral: is_false,
        reason: "crius always honours the masked and read-only /proc paths kubelet sends",
    },
    Rule {
        key: "unset_seccomp_profile",
        neutral: is_empty,
        reason: "crius has no default seccomp profile for containers that name none: they run \
                 unconfined (kubelet's --seccomp-default asks for RuntimeDefault)",
    },
    Rule {
        key: "netns_mounts_under_state_dir",
        neutral: is_false,
        reason: "crius pins network namespaces under /var/run/netns",
    },
    Rule {
        key: "enable_unprivileged_ports",
        neutral: is_false,
        reason: "crius does not set net.ipv4.ip_unprivileged_port_start=0 in pods; a pod can \
                 ask for it with a sysctl",
    },
    Rule {
        key: "enable_unprivileged_icmp",
        neutral: is_false,
        reason: "crius does not set net.ipv4.ping_group_range in pods; a pod can ask for it \
                 with a sysctl",
    },
    Rule {
        key: "device_ownership_from_security_context",
        neutral: is_false,
        reason: "crius gives devices the owner they have on the host, not the container's \
                 runAsUser and runAsGroup",
    },
    Rule {
        key: "ignore_deprecation_warnings",
        neutral: any,
        reason: "",
    },
    Rule {
        key: "systemd_cgroup",
        neutral: is_false,
        reason: "applied only to the runtime v1 shim (io.containerd.runtime.v1.linux); set \
                 SystemdCgroup = true in a runc handler's options instead",
    },
];

const IMAGE_RULES: &[Rule] = &[
    Rule {
        key: "image_pull_with_sync_fs",
        neutral: is_false,
        reason: "crius does not sync the filesystem after unpacking a layer",
    },
    Rule {
        key: "concurrent_layer_fetch_buffer",
        neutral: is_empty,
        reason: "crius fetches each layer in one request",
    },
    Rule {
        key: "use_local_image_pull",
        neutral: any,
        reason: "",
    },
    Rule {
        key: "runtime_platforms",
        neutral: is_empty,
        reason: "crius pulls and unpacks images for the node's own platform only, with \
                 containerd.snapshotter",
    },
];

const SNAPSHOT_RULES: &[Rule] = &[
    Rule {
        key: "disable_snapshot_annotations",
        neutral: is_true,
        reason: "crius does not label snapshots with the image references remote \
                 snapshotters (stargz, nydus) read",
    },
    Rule {
        key: "discard_unpacked_layers",
        neutral: is_false,
        reason: "crius keeps layer blobs in the content store after unpacking them",
    },
];

const CNI_RULES: &[Rule] = &[
    Rule {
        key: "ip_pref",
        neutral: ipv4_first,
        reason: "crius reports a pod's IPv4 address first",
    },
    Rule {
        key: "setup_serially",
        neutral: any,
        reason: "",
    },
];

const SERVER_RULES: &[Rule] = &[Rule {
    key: "disable_tcp_service",
    neutral: is_true,
    reason: "crius serves the CRI on its unix sockets only",
}];

const DECRYPTION_RULES: &[Rule] = &[Rule {
    key: "key_model",
    neutral: node_key_model,
    reason: "crius cannot pull encrypted images",
}];

fn ipv4_first(v: &Value) -> bool {
    matches!(v.as_str(), Some("" | "ipv4"))
}

fn node_key_model(v: &Value) -> bool {
    matches!(v.as_str(), Some("" | "node"))
}

/// The runtime-side keys (version 2: the CRI plugin; version 3: `io.containerd.cri.v1.runtime`).
pub(super) fn runtime_settings(sec: &mut Section<'_>, layout: Layout, ctx: &mut Ctx) {
    if let Some(n) = sec.int("max_container_log_line_size", &mut ctx.report) {
        ctx.config.max_container_log_line_size = n;
    }
    if let Some(b) = sec.bool("ignore_image_defined_volumes", &mut ctx.report) {
        ctx.config.ignore_image_defined_volumes = b;
    }
    drain_exec_sync_io_timeout(sec, ctx);
    cpu_sample_period(sec, ctx);
    oom_score_adj(sec, ctx);
    cdi(sec, ctx);
    sec.unsupported(RUNTIME_RULES, &mut ctx.report);
    if let Some(mut sub) = sec.table("containerd", &mut ctx.report) {
        super::runtimes::containerd_section(&mut sub, layout, ctx);
        sub.finish(&mut ctx.report);
    }
    if let Some(mut sub) = sec.table("cni", &mut ctx.report) {
        cni(&mut sub, ctx);
        sub.finish(&mut ctx.report);
    }
}

/// containerd 2.3's runtime-side `stats_collect_period`, a duration ("" keeps the default):
/// how often CPU time is sampled for `UsageNanoCores`, crius's `cpu_sample_period`. (The
/// image side's, in seconds, is how often snapshots are measured, read with the downloads;
/// a version 2 file has only that one, in the same table.)
fn cpu_sample_period(sec: &mut Section<'_>, ctx: &mut Ctx) {
    const KEY: &str = "stats_collect_period";
    if !sec.peek(KEY).is_some_and(Value::is_str) {
        return;
    }
    let Some(text) = sec.string(KEY, &mut ctx.report) else {
        return;
    };
    match parse_go_duration(&text) {
        _ if text.is_empty() => {}
        Some(d) if !d.is_zero() => ctx.config.cpu_sample_period = d,
        _ => ctx.report.note(
            sec.key(KEY),
            format!("{text:?} is not a positive duration; crius's default is kept"),
        ),
    }
}

/// containerd's "0s" (its default) waits as long as it takes: crius's zero waits as long as
/// the client's deadline allows, which is where such a wait ends for kubelet too.
fn drain_exec_sync_io_timeout(sec: &mut Section<'_>, ctx: &mut Ctx) {
    const KEY: &str = "drain_exec_sync_io_timeout";
    let Some(text) = sec.string(KEY, &mut ctx.report) else {
        return;
    };
    if text.is_empty() {
        return;
    }
    match parse_go_duration(&text) {
        Some(d) => ctx.config.drain_exec_sync_io_timeout = Some(d),
        None => ctx.report.note(
            sec.key(KEY),
            format!("{text:?} is not a duration; left unset"),
        ),
    }
}

fn oom_score_adj(sec: &mut Section<'_>, ctx: &mut Ctx) {
    match sec.bool("restrict_oom_score_adj", &mut ctx.report) {
        Some(true) => ctx.config.restrict_oom_score_adj = RestrictOomScoreAdj::Always,
        Some(false) => ctx.report.note(
            sec.key("restrict_oom_score_adj"),
            "false is kept as crius's \"auto\": crius clamps only when it may not lower \
             oom_score_adj itself (write restrict_oom_score_adj = false to never clamp)",
        ),
        None => {}
    }
}

fn cdi(sec: &mut Section<'_>, ctx: &mut Ctx) {
    let enabled = sec.bool("enable_cdi", &mut ctx.report);
    if let Some(dirs) = sec.strings("cdi_spec_dirs", &mut ctx.report) {
        let key = sec.key("cdi_spec_dirs");
        if let Some(dirs) = absolute_paths(&dirs, &key, ctx) {
            ctx.config.cdi.spec_dirs = dirs;
        }
    }
    if enabled == Some(false) {
        // Emptying cdi.spec_dirs would not match containerd either: crius would then
        // refuse the pods whose CDI requests containerd ignored (GPU pods, for one).
        ctx.report.not_carried(
            sec.key("enable_cdi"),
            "crius has no switch to ignore CDI device requests (false was containerd 1.7's \
             default): it injects the devices a pod asks for from the specs in \
             cdi.spec_dirs, where containerd ignored the request; cdi.spec_dirs = [] would \
             make crius refuse such pods instead",
        );
    }
}

/// `paths` as absolute paths; `None` (reported under `key`) when one is relative.
fn absolute_paths(paths: &[String], key: &str, ctx: &mut Ctx) -> Option<Vec<PathBuf>> {
    if let Some(relative) = paths.iter().find(|p| !Path::new(p).is_absolute()) {
        ctx.report.not_carried(
            key,
            format!("{relative:?} is not an absolute path, which crius requires"),
        );
        return None;
    }
    Some(paths.iter().map(PathBuf::from).collect())
}

fn cni(sec: &mut Section<'_>, ctx: &mut Ctx) {
    let bin_dir = sec.string("bin_dir", &mut ctx.report).unwrap_or_default();
    let bin_dirs = sec.strings("bin_dirs", &mut ctx.report).unwrap_or_default();
    if !bin_dir.is_empty() {
        ctx.config.cni.bin_dirs = vec![PathBuf::from(bin_dir)];
    } else if !bin_dirs.is_empty() {
        ctx.config.cni.bin_dirs = bin_dirs.into_iter().map(PathBuf::from).collect();
    }
    if let Some(dir) = sec.string("conf_dir", &mut ctx.report) {
        let key = sec.key("conf_dir");
        if let Some(mut dirs) = absolute_paths(&[dir], &key, ctx) {
            ctx.config.cni.conf_dir = dirs.remove(0);
        }
    }
    if let Some(n) = sec.int("max_conf_num", &mut ctx.report) {
        // containerd loads every config when the number is 0 or less; crius at 0.
        ctx.config.cni.max_conf_num = usize::try_from(n).unwrap_or(0);
    }
    if let Some(template) = sec.string("conf_template", &mut ctx.report) {
        ctx.config.cni.conf_template = template;
    }
    // Either way a pod's lo comes up; containerd's default (false: its loopback plugin) is
    // a choice of mechanism, and crius keeps its own default, which brings lo up itself.
    if sec.bool("use_internal_loopback", &mut ctx.report) == Some(true) {
        ctx.config.cni.use_internal_loopback = true;
    }
    sec.unsupported(CNI_RULES, &mut ctx.report);
}

/// The snapshotter keys (version 2: `containerd`; version 3: the images plugin).
pub(super) fn snapshot_settings(sec: &mut Section<'_>, ctx: &mut Ctx) {
    if let Some(name) = sec.string("snapshotter", &mut ctx.report)
        && !name.is_empty()
    {
        ctx.config.containerd.snapshotter = name;
    }
    sec.unsupported(SNAPSHOT_RULES, &mut ctx.report);
}

/// The image-side keys (version 2: the CRI plugin; version 3: `io.containerd.cri.v1.images`).
pub(super) fn image_settings(sec: &mut Section<'_>, layout: Layout, ctx: &mut Ctx) {
    if layout == Layout::V3 {
        pinned_images(sec, ctx);
        snapshot_settings(sec, ctx);
    } else if let Some(image) = sec.string("sandbox_image", &mut ctx.report) {
        ctx.config.image.sandbox_image = image;
    }
    downloads(sec, ctx);
    if let Some(mut sub) = sec.table("registry", &mut ctx.report) {
        super::registry::registry_section(&mut sub, layout, ctx);
        sub.finish(&mut ctx.report);
    }
    if let Some(mut sub) = sec.table("image_decryption", &mut ctx.report) {
        sub.unsupported(DECRYPTION_RULES, &mut ctx.report);
        sub.finish(&mut ctx.report);
    }
    sec.unsupported(IMAGE_RULES, &mut ctx.report);
}

fn pinned_images(sec: &mut Section<'_>, ctx: &mut Ctx) {
    let Some(mut pinned) = sec.table("pinned_images", &mut ctx.report) else {
        return;
    };
    if let Some(image) = pinned.string("sandbox", &mut ctx.report) {
        ctx.config.image.sandbox_image = image;
    }
    for key in pinned.unread_keys() {
        ctx.report.not_carried(
            pinned.key(&key),
            "crius pins only the sandbox image (image.sandbox_image)",
        );
    }
    pinned.take_all();
}

fn downloads(sec: &mut Section<'_>, ctx: &mut Ctx) {
    if let Some(n) = sec.int("max_concurrent_downloads", &mut ctx.report) {
        match usize::try_from(n) {
            Ok(n) if n > 0 => ctx.config.image.max_concurrent_downloads = n,
            _ => ctx.report.not_carried(
                sec.key("max_concurrent_downloads"),
                format!("{n}: crius needs at least 1"),
            ),
        }
    }
    if let Some(period) = sec.int("stats_collect_period", &mut ctx.report) {
        match u64::try_from(period) {
            Ok(secs) if secs > 0 => ctx.config.stats_collect_period = Duration::from_secs(secs),
            _ => ctx.report.not_carried(
                sec.key("stats_collect_period"),
                format!("{period} seconds: crius needs a period longer than zero"),
            ),
        }
    }
    if let Some(text) = sec.string("image_pull_progress_timeout", &mut ctx.report) {
        let key = sec.key("image_pull_progress_timeout");
        match parse_go_duration(&text) {
            Some(d) if !d.is_zero() => ctx.config.image.pull_progress_timeout = d,
            Some(_) => ctx.report.not_carried(
                key,
                "0 turned containerd's timeout off; crius always cancels a pull that makes no \
                 progress for image.pull_progress_timeout",
            ),
            None => ctx
                .report
                .not_carried(key, format!("{text:?} is not a duration")),
        }
    }
}

/// The stream server keys (both versions: the `io.containerd.grpc.v1.cri` plugin).
pub(super) fn server_settings(sec: &mut Section<'_>, ctx: &mut Ctx) {
    stream_address(sec, ctx);
    stream_port(sec, ctx);
    if let Some(text) = sec.string("stream_idle_timeout", &mut ctx.report) {
        match parse_go_duration(&text) {
            Some(d) if !d.is_zero() => ctx.config.stream.idle_timeout = d,
            _ => ctx.report.not_carried(
                sec.key("stream_idle_timeout"),
                format!("{text:?}: crius needs a duration longer than zero"),
            ),
        }
    }
    if let Some(tls) = sec.bool("enable_tls_streaming", &mut ctx.report) {
        ctx.config.stream.tls = tls;
    }
    if let Some(mut pair) = sec.table("x509_key_pair_streaming", &mut ctx.report) {
        stream_key_pair(&mut pair, ctx);
        pair.finish(&mut ctx.report);
    }
    sec.unsupported(SERVER_RULES, &mut ctx.report);
}

fn stream_address(sec: &mut Section<'_>, ctx: &mut Ctx) {
    let Some(address) = sec.string("stream_server_address", &mut ctx.report) else {
        return;
    };
    if address.parse::<std::net::IpAddr>().is_ok() {
        ctx.config.stream.address = address;
    } else if address.is_empty() {
        ctx.report.not_carried(
            sec.key("stream_server_address"),
            "empty: containerd listened on the node's primary IP; crius needs an IP address \
             (stream.address, 127.0.0.1 by default)",
        );
    } else {
        ctx.report.not_carried(
            sec.key("stream_server_address"),
            format!("{address:?} is not an IP address, which stream.address must be"),
        );
    }
}

fn stream_port(sec: &mut Section<'_>, ctx: &mut Ctx) {
    let Some(value) = sec.take("stream_server_port") else {
        return;
    };
    let port = match value {
        Value::String(s) => s.parse::<u16>().ok(),
        Value::Integer(i) => u16::try_from(*i).ok(),
        _ => None,
    };
    match port {
        Some(port) => ctx.config.stream.port = port,
        None => ctx.report.not_carried(
            sec.key("stream_server_port"),
            format!("{value} ({}) is not a port number", type_name(value)),
        ),
    }
}

fn stream_key_pair(pair: &mut Section<'_>, ctx: &mut Ctx) {
    let cert = pair
        .string("tls_cert_file", &mut ctx.report)
        .unwrap_or_default();
    let key = pair
        .string("tls_key_file", &mut ctx.report)
        .unwrap_or_default();
    match (cert.is_empty(), key.is_empty()) {
        (true, true) => {}
        (false, false) => {
            ctx.config.stream.tls_cert_file = Some(PathBuf::from(cert));
            ctx.config.stream.tls_key_file = Some(PathBuf::from(key));
        }
        _ => ctx.report.not_carried(
            pair.path(),
            "tls_cert_file and tls_key_file must be set together",
        ),
    }
}
