//! The migration against real containerd configs: the `containerd config default` output
//! of containerd 1.6, 2.1 and 2.3, and node configs shaped like real ones.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
use crate::config::{RUNC_SHIM, RestrictOomScoreAdj};

const V16_DEFAULT: &str =
    include_str!("../../tests/fixtures/containerd-config/containerd-1.6-default.toml");
const V21_DEFAULT: &str =
    include_str!("../../tests/fixtures/containerd-config/containerd-2.1-default.toml");
const V23_DEFAULT: &str =
    include_str!("../../tests/fixtures/containerd-config/containerd-2.3-default.toml");
const V2_CUSTOM: &str = include_str!("../../tests/fixtures/containerd-config/v2-custom.toml");
const V3_SPLIT: &str = include_str!("../../tests/fixtures/containerd-config/v3-split.toml");
const V1_LEGACY: &str = include_str!("../../tests/fixtures/containerd-config/v1-legacy.toml");

const V2: &str = "plugins.\"io.containerd.grpc.v1.cri\"";
const V3_RUNTIME: &str = "plugins.\"io.containerd.cri.v1.runtime\"";

/// Migrates `text`, and checks that the printed config loads in crius as exactly the
/// migrated config.
fn migrated(text: &str, hosts_dir: Option<&Path>) -> Migration {
    let migration = migrate(
        text,
        &Options {
            source: Path::new("/etc/containerd/config.toml"),
            hosts_dir,
        },
    )
    .expect("migrates");
    let printed = migration.to_toml().expect("renders");
    assert!(
        printed.starts_with("# crius configuration migrated"),
        "{printed}"
    );
    let loaded = crate::config::Config::from_toml_str(&printed).expect("the output loads");
    assert_eq!(loaded, migration.config, "{printed}");
    migration
}

fn reason<'a>(migration: &'a Migration, key: &str) -> &'a str {
    match migration.report.find(key) {
        Some(note) => &note.reason,
        None => panic!("no report for {key}: {:#?}", migration.report.notes),
    }
}

fn not_carried(migration: &Migration, key: &str) -> String {
    let note = migration.report.find(key);
    assert_eq!(
        note.map(|n| n.kind),
        Some(NoteKind::NotCarried),
        "{key}: {:#?}",
        migration.report.notes
    );
    reason(migration, key).to_string()
}

#[test]
fn containerd_1_6_default_config() {
    let m = migrated(V16_DEFAULT, None);
    assert_eq!(m.version, 2);
    let c = &m.config;
    assert_eq!(c.image.sandbox_image, "registry.k8s.io/pause:3.6");
    assert_eq!(c.containerd.default_runtime, "runc");
    assert_eq!(c.containerd.runtimes.len(), 1);
    assert_eq!(c.containerd.runtimes["runc"].runtime_type, RUNC_SHIM);
    assert_eq!(c.cni.bin_dirs, vec![PathBuf::from("/opt/cni/bin")]);
    assert_eq!(c.containerd.snapshotter, "overlayfs");
    assert_eq!(c.stream.idle_timeout, Duration::from_secs(4 * 3600));
    assert_eq!(c.restrict_oom_score_adj, RestrictOomScoreAdj::Auto);
    // 1.6's default has no drain key: crius's own drain stays.
    assert_eq!(c.drain_exec_sync_io_timeout, None);
    assert_eq!(
        m.report.not_carried_keys(),
        vec![
            format!("{V2}.disable_apparmor"),
            format!("{V2}.disable_hugetlb_controller"),
        ]
    );
    assert!(reason(&m, &format!("{V2}.restrict_oom_score_adj")).contains("auto"));
    assert!(
        reason(&m, &format!("{V2}.containerd.runtimes.runc.runtime_type"))
            .contains("io.containerd.crius.v2")
    );
    assert!(m.hosts_files.is_empty());
}

#[test]
fn containerd_2_1_default_config() {
    let m = migrated(V21_DEFAULT, None);
    assert_eq!(m.version, 3);
    let c = &m.config;
    assert_eq!(c.image.sandbox_image, "registry.k8s.io/pause:3.10");
    assert_eq!(c.containerd.runtimes.len(), 1);
    assert_eq!(c.containerd.runtimes["runc"].runtime_type, RUNC_SHIM);
    // containerd 2.1's CNI and CDI defaults are crius's.
    let defaults = crate::config::Config::default();
    assert_eq!(c.cni, defaults.cni);
    assert_eq!(c.cdi, defaults.cdi);
    assert_eq!(c.image.pull_progress_timeout, Duration::from_secs(300));
    // containerd's "0s" waits for an ExecSync's output as long as it takes: crius as long as
    // the client's deadline allows.
    assert_eq!(c.drain_exec_sync_io_timeout, Some(Duration::ZERO));
    assert_eq!(
        m.report.not_carried_keys(),
        vec![
            format!("{V3_RUNTIME}.disable_apparmor"),
            format!("{V3_RUNTIME}.disable_hugetlb_controller"),
            format!("{V3_RUNTIME}.enable_unprivileged_ports"),
            format!("{V3_RUNTIME}.enable_unprivileged_icmp"),
        ]
    );
    assert!(
        reason(&m, &format!("{V3_RUNTIME}.enable_unprivileged_ports"))
            .contains("ip_unprivileged_port_start")
    );
}

/// containerd 2.3's own `config default`: config version 4.
#[test]
fn containerd_2_3_default_config() {
    let m = migrated(V23_DEFAULT, None);
    assert_eq!(m.version, 4);
    let c = &m.config;
    assert_eq!(c.image.sandbox_image, "registry.k8s.io/pause:3.10.2");
    assert_eq!(c.containerd.runtimes["runc"].runtime_type, RUNC_SHIM);
    assert_eq!(
        c.containerd.address,
        PathBuf::from("/run/containerd/containerd.sock")
    );
    assert_eq!(c.cni.bin_dirs, vec![PathBuf::from("/opt/cni/bin")]);
    assert_eq!(c.drain_exec_sync_io_timeout, Some(Duration::ZERO));
    // The keys 2.3 adds at their defaults are as crius behaves.
    assert_eq!(
        m.report.not_carried_keys(),
        vec![
            "imports".to_string(),
            format!("{V3_RUNTIME}.disable_apparmor"),
            format!("{V3_RUNTIME}.disable_hugetlb_controller"),
            format!("{V3_RUNTIME}.enable_unprivileged_ports"),
            format!("{V3_RUNTIME}.enable_unprivileged_icmp"),
        ]
    );
}

/// Version 4 keeps containerd's socket in its gRPC server plugin.
#[test]
fn v4_server_plugin_address_and_stats_period() {
    let m = migrated(
        r#"version = 4
[plugins.'io.containerd.server.v1.grpc']
  address = '/run/ctrd/containerd.sock'
[plugins.'io.containerd.cri.v1.runtime']
  stats_collect_period = '5s'
  enable_criu = false
"#,
        None,
    );
    assert_eq!(m.version, 4);
    assert_eq!(
        m.config.containerd.address,
        PathBuf::from("/run/ctrd/containerd.sock")
    );
    assert_eq!(m.config.cpu_sample_period, Duration::from_secs(5));
    assert_eq!(m.config.stats_collect_period, Duration::from_secs(10));
    assert!(reason(&m, &format!("{V3_RUNTIME}.enable_criu")).contains("CRIU"));
}

#[test]
fn v2_node_config_runtimes_and_settings() {
    let m = migrated(V2_CUSTOM, None);
    let c = &m.config;
    assert_eq!(c.containerd.root, PathBuf::from("/data/containerd"));
    assert_eq!(c.containerd.snapshotter, "native");
    assert_eq!(c.containerd.default_runtime, "crun");
    let crun = &c.containerd.runtimes["crun"];
    assert_eq!(crun.runtime_type, RUNC_SHIM);
    assert_eq!(crun.options.binary_name, "/usr/bin/crun");
    assert_eq!(crun.options.root, "/run/crun");
    assert!(crun.options.systemd_cgroup && crun.options.no_new_keyring);
    assert_eq!((crun.options.io_uid, crun.options.io_gid), (1000, 1000));
    assert_eq!(crun.pod_annotations, vec!["io.kubernetes.cri.*"]);
    assert_eq!(crun.container_annotations, vec!["run.oci.*"]);
    assert!(crun.privileged_without_host_devices);
    assert_eq!(crun.snapshotter, "overlayfs");
    assert_eq!(c.snapshotter_for("crun"), "overlayfs");
    assert_eq!(c.snapshotter_for("runc"), "native");
    assert_eq!(c.snapshotter_for("no-such-handler"), "native");
    assert_eq!(c.snapshotters(), vec!["native", "overlayfs"]);
    assert!(c.containerd.runtimes["runc"].options.systemd_cgroup);
    // A shim crius has no options for is kept when it had none...
    assert_eq!(
        c.containerd.runtimes["runsc"].runtime_type,
        "io.containerd.runsc.v1"
    );
    // ...and left out when its options would be lost.
    assert!(!c.containerd.runtimes.contains_key("kata"));
    let kata = not_carried(&m, &format!("{V2}.containerd.runtimes.kata"));
    assert!(kata.contains("ConfigPath"), "{kata}");
    not_carried(
        &m,
        &format!("{V2}.containerd.runtimes.crun.options.CriuPath"),
    );
    not_carried(
        &m,
        &format!("{V2}.containerd.runtimes.runc.base_runtime_spec"),
    );

    assert_eq!(c.restrict_oom_score_adj, RestrictOomScoreAdj::Always);
    assert_eq!(c.max_container_log_line_size, -1);
    assert!(c.ignore_image_defined_volumes);
    assert_eq!(c.stats_collect_period, Duration::from_secs(30));
    assert_eq!(c.image.sandbox_image, "registry.example.com/k8s/pause:3.9");
    assert_eq!(c.image.max_concurrent_downloads, 5);
    assert_eq!(c.image.pull_progress_timeout, Duration::from_secs(150));
    assert_eq!(c.cdi.spec_dirs, vec![PathBuf::from("/etc/cdi")]);
    assert_eq!(c.cni.bin_dirs, vec![PathBuf::from("/opt/cni/bin")]);
    assert_eq!(c.cni.conf_dir, PathBuf::from("/etc/k8s/cni/net.d"));
    assert_eq!(c.cni.max_conf_num, 0);
    assert_eq!(c.cni.conf_template, "/etc/containerd/cni-template.json");
    assert_eq!(
        (c.stream.address.as_str(), c.stream.port),
        ("0.0.0.0", 10010)
    );
    assert_eq!(c.stream.idle_timeout, Duration::from_secs(1800));
    assert!(c.stream.tls);
    assert_eq!(
        c.stream.tls_cert_file.as_deref(),
        Some(Path::new("/etc/containerd/stream.crt"))
    );
    assert_eq!(
        c.stream.tls_key_file.as_deref(),
        Some(Path::new("/etc/containerd/stream.key"))
    );

    let selinux = not_carried(&m, &format!("{V2}.enable_selinux"));
    assert!(selinux.contains("SELinux"), "{selinux}");
    for key in [
        "device_ownership_from_security_context",
        "enable_unprivileged_ports",
        "containerd.discard_unpacked_layers",
        "cni.ip_pref",
        "registry.headers",
    ] {
        not_carried(&m, &format!("{V2}.{key}"));
    }
    not_carried(
        &m,
        "plugins.\"io.containerd.snapshotter.v1.native\".root_path",
    );
    // Values at which crius behaves as containerd did need no report.
    for quiet in [
        "enable_unprivileged_icmp",
        "disable_tcp_service",
        "selinux_category_range",
    ] {
        assert!(m.report.find(&format!("{V2}.{quiet}")).is_none(), "{quiet}");
    }
}

#[test]
fn v2_registry_auth_and_mirrors_without_a_hosts_dir() {
    let m = migrated(V2_CUSTOM, None);
    let configs = &m.config.registry.configs;
    let mirror = configs["mirror.example.com"].auth.as_ref().expect("auth");
    assert_eq!(
        (mirror.username.as_str(), mirror.password.as_str()),
        ("puller", "s3cret")
    );
    let internal = configs["registry.internal:5000"]
        .auth
        .as_ref()
        .expect("auth");
    assert_eq!(internal.auth, "dXNlcjpwYXNz");
    assert!(m.config.registry.config_path.is_empty());
    assert!(m.hosts_files.is_empty());
    for key in [
        "registry.mirrors.\"docker.io\"",
        "registry.mirrors.\"*\"",
        "registry.configs.\"mirror.example.com\".tls",
        "registry.configs.\"registry.internal:5000\".tls",
    ] {
        let why = not_carried(&m, &format!("{V2}.{key}"));
        assert!(why.contains("--hosts-dir"), "{key}: {why}");
    }
}

#[test]
fn v2_deprecated_mirrors_become_hosts_files_crius_reads() {
    let dir = tempfile::tempdir().unwrap();
    let hosts_dir = dir.path().join("certs.d");
    let m = migrated(V2_CUSTOM, Some(&hosts_dir));
    assert_eq!(m.config.registry.config_path, hosts_dir.to_str().unwrap());
    let hosts: Vec<&str> = m.hosts_files.iter().map(|f| f.host.as_str()).collect();
    assert_eq!(
        hosts,
        [
            "_default",
            "docker.io",
            "mirror.example.com",
            "registry.internal:5000",
            "registry.k8s.io"
        ]
    );
    // The mirrors and TLS settings are carried now; credentials stay in crius's config.
    assert!(
        m.report
            .find(&format!("{V2}.registry.mirrors.\"docker.io\""))
            .is_none()
    );
    assert!(m.hosts_files.iter().all(|f| !f.text.contains("s3cret")));

    let written = write_hosts_files(&hosts_dir, &m.hosts_files).unwrap();
    assert_eq!(written.len(), 5);
    let mode = std::fs::metadata(&written[0]).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o644);

    let config_path = &m.config.registry.config_path;
    let hub = crate::image::hosts::endpoints(config_path, "docker.io").unwrap();
    let bases: Vec<&str> = hub.iter().map(|e| e.base.as_str()).collect();
    assert_eq!(
        bases,
        ["https://mirror.example.com", "https://registry-1.docker.io"]
    );
    assert!(hub[0].capabilities.pull && hub[0].capabilities.resolve && !hub[0].capabilities.push);
    assert_eq!(hub[0].ca, vec![PathBuf::from("/etc/certs/mirror-ca.pem")]);
    assert_eq!(
        hub[0].client,
        vec![(
            PathBuf::from("/etc/certs/client.pem"),
            Some(PathBuf::from("/etc/certs/client.key"))
        )]
    );

    // containerd used a mirror's path as it was.
    let k8s = crate::image::hosts::endpoints(config_path, "registry.k8s.io").unwrap();
    assert_eq!(
        (k8s[0].base.as_str(), k8s[0].path_prefix.as_str()),
        ("http://localhost:5000", "/k8s")
    );
    assert_eq!(k8s[1].base, "https://registry.k8s.io");

    // A directory made for TLS settings alone still lists the "*" mirror first.
    let internal = crate::image::hosts::endpoints(config_path, "registry.internal:5000").unwrap();
    let bases: Vec<&str> = internal.iter().map(|e| e.base.as_str()).collect();
    assert_eq!(
        bases,
        [
            "https://catchall.example.com",
            "https://registry.internal:5000"
        ]
    );
    assert!(!internal[0].skip_verify && internal[1].skip_verify);

    // The "*" mirror serves every other registry, then the registry itself.
    let quay = crate::image::hosts::endpoints(config_path, "quay.io").unwrap();
    let bases: Vec<&str> = quay.iter().map(|e| e.base.as_str()).collect();
    assert_eq!(bases, ["https://catchall.example.com", "https://quay.io"]);
    assert_eq!(quay[0].path_prefix, "/v2");
}

#[test]
fn hosts_files_are_never_overwritten_nor_written_through_symlinks() {
    let dir = tempfile::tempdir().unwrap();
    let hosts_dir = dir.path().join("hosts");
    let m = migrated(V1_LEGACY, Some(&hosts_dir));
    assert_eq!(m.hosts_files.len(), 1);
    write_hosts_files(&hosts_dir, &m.hosts_files).unwrap();
    let file = hosts_dir.join("docker.io/hosts.toml");
    std::fs::write(&file, "# the operator's own\n").unwrap();
    match write_hosts_files(&hosts_dir, &m.hosts_files) {
        Err(MigrateError::HostsFileExists { path }) => assert_eq!(path, file),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "# the operator's own\n"
    );

    // A host directory that is a symlink is not written through.
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let linked = dir.path().join("linked");
    std::fs::create_dir(&linked).unwrap();
    std::os::unix::fs::symlink(&elsewhere, linked.join("docker.io")).unwrap();
    let err = write_hosts_files(&linked, &m.hosts_files).unwrap_err();
    assert!(err.to_string().contains("symlink"), "{err}");
    assert!(std::fs::read_dir(&elsewhere).unwrap().next().is_none());

    // Nor is a hosts directory that is one.
    let link_dir = dir.path().join("link-dir");
    std::os::unix::fs::symlink(&elsewhere, &link_dir).unwrap();
    let err = write_hosts_files(&link_dir, &m.hosts_files).unwrap_err();
    assert!(matches!(err, MigrateError::HostsDir { .. }), "{err}");
    assert!(std::fs::read_dir(&elsewhere).unwrap().next().is_none());

    // A dangling symlink where the file would go is not replaced either.
    let dangling = dir.path().join("dangling");
    std::fs::create_dir_all(dangling.join("docker.io")).unwrap();
    std::os::unix::fs::symlink(
        dir.path().join("nowhere"),
        dangling.join("docker.io/hosts.toml"),
    )
    .unwrap();
    let err = write_hosts_files(&dangling, &m.hosts_files).unwrap_err();
    assert!(matches!(err, MigrateError::HostsFileExists { .. }), "{err}");
    assert!(!dir.path().join("nowhere").exists());
}

#[test]
fn v3_split_plugins() {
    let m = migrated(V3_SPLIT, None);
    assert_eq!(m.version, 3);
    let c = &m.config;
    assert_eq!(
        c.containerd.address,
        PathBuf::from("/run/k8s/containerd.sock")
    );
    assert_eq!(c.image.sandbox_image, "registry.k8s.io/pause:3.10");
    assert_eq!(c.registry.config_path, "/etc/containerd/certs.d");
    assert_eq!(c.image.max_concurrent_downloads, 2);
    assert_eq!(c.image.pull_progress_timeout, Duration::from_secs(600));
    assert_eq!(c.stats_collect_period, Duration::from_secs(20));
    assert_eq!(c.max_container_log_line_size, 32768);
    assert_eq!(c.drain_exec_sync_io_timeout, Some(Duration::from_secs(90)));
    assert_eq!(c.restrict_oom_score_adj, RestrictOomScoreAdj::Auto);
    // enable_cdi = false is reported, not turned into a crius that refuses CDI pods.
    assert_eq!(c.cdi, crate::config::Config::default().cdi);
    assert!(not_carried(&m, &format!("{V3_RUNTIME}.enable_cdi")).contains("refuse"));
    assert_eq!(
        c.cni.bin_dirs,
        vec![
            PathBuf::from("/opt/cni/bin"),
            PathBuf::from("/usr/libexec/cni")
        ]
    );
    assert_eq!(c.cni.max_conf_num, 2);
    assert_eq!(
        (c.stream.address.as_str(), c.stream.port),
        ("10.0.0.5", 10010)
    );
    assert_eq!(c.stream.idle_timeout, Duration::from_secs(3600));

    let runc = &c.containerd.runtimes["runc"];
    assert_eq!(runc.options.binary_name, "/usr/local/sbin/runc");
    assert!(runc.options.systemd_cgroup);
    assert_eq!(c.containerd.runtimes["shimmed"].runtime_type, RUNC_SHIM);
    assert!(!c.containerd.runtimes.contains_key("kata"));
    let runtimes = format!("{V3_RUNTIME}.containerd.runtimes");
    assert!(not_carried(&m, &format!("{runtimes}.kata")).contains("runtime_path"));
    not_carried(&m, &format!("{runtimes}.runc.cgroup_writable"));
    not_carried(&m, &format!("{runtimes}.shimmed.sandboxer"));
    assert!(c.cni.use_internal_loopback);
    assert!(
        m.report
            .find(&format!("{V3_RUNTIME}.cni.use_internal_loopback"))
            .is_none()
    );
    // Settings at crius's own behaviour are quiet.
    assert!(
        m.report
            .find(&format!("{V3_RUNTIME}.enable_unprivileged_ports"))
            .is_none()
    );
    assert!(
        m.report
            .find(&format!("{runtimes}.runc.sandboxer"))
            .is_none()
    );
}

#[test]
fn v3_registry_tls_configs_are_not_read_by_containerd_2() {
    let m = migrated(
        r#"
version = 3
[plugins."io.containerd.cri.v1.images".registry.configs."reg.example.com".tls]
insecure_skip_verify = true
[plugins."io.containerd.cri.v1.images".registry.configs."reg.example.com".auth]
username = "u"
password = "p"
"#,
        Some(Path::new("/etc/crius/certs.d")),
    );
    let why = not_carried(
        &m,
        "plugins.\"io.containerd.cri.v1.images\".registry.configs.\"reg.example.com\".tls",
    );
    assert!(why.contains("containerd 2.x"), "{why}");
    assert!(m.hosts_files.is_empty());
    assert!(m.config.registry.config_path.is_empty());
    assert_eq!(
        m.config.registry.configs["reg.example.com"]
            .auth
            .as_ref()
            .map(|a| a.username.as_str()),
        Some("u")
    );
}

#[test]
fn v1_file_reads_plugins_cri() {
    let m = migrated(V1_LEGACY, None);
    assert_eq!(m.version, 1);
    let c = &m.config;
    assert_eq!(c.image.sandbox_image, "k8s.gcr.io/pause:3.2");
    assert_eq!(c.cni.bin_dirs, vec![PathBuf::from("/usr/lib/cni")]);
    let runc = &c.containerd.runtimes["runc"];
    assert_eq!(runc.runtime_type, "io.containerd.runc.v1");
    assert!(runc.options.no_pivot_root);
    // The runtime v1 shim default cannot come along: runc becomes the default.
    assert_eq!(c.containerd.default_runtime, "runc");
    assert!(!c.containerd.runtimes.contains_key("default"));
    let default = not_carried(&m, "plugins.cri.containerd.default_runtime");
    assert!(
        default.contains("io.containerd.runtime.v1.linux"),
        "{default}"
    );
    assert!(not_carried(&m, "plugins.cri.systemd_cgroup").contains("SystemdCgroup"));
    not_carried(&m, "plugins.cri.registry.mirrors.\"docker.io\"");
    // The unused untrusted placeholder is no handler.
    assert!(!c.containerd.runtimes.contains_key("untrusted"));
}

#[test]
fn v1_file_with_the_v2_plugin_name_says_containerd_never_read_it() {
    let m = migrated(
        "[plugins.\"io.containerd.grpc.v1.cri\"]\nsandbox_image = \"example.com/pause:1\"\n",
        None,
    );
    assert_eq!(m.version, 1);
    assert!(m.config.image.sandbox_image.is_empty());
    assert!(not_carried(&m, V2).contains("no version key"));
}

#[test]
fn unknown_and_mistyped_keys_are_reported() {
    let m = migrated(
        r#"
version = 2
[plugins."io.containerd.grpc.v1.cri"]
max_concurrent_downloads = "five"
stream_server_address = ""
no_such_setting = 1
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
IoUid = -1
Bogus = true
"#,
        None,
    );
    assert!(
        not_carried(&m, &format!("{V2}.max_concurrent_downloads")).contains("expected an integer")
    );
    assert!(not_carried(&m, &format!("{V2}.stream_server_address")).contains("primary IP"));
    assert!(not_carried(&m, &format!("{V2}.no_such_setting")).contains("unknown"));
    let options = format!("{V2}.containerd.runtimes.runc.options");
    not_carried(&m, &format!("{options}.IoUid"));
    not_carried(&m, &format!("{options}.Bogus"));
    assert_eq!(m.config.image.max_concurrent_downloads, 3);
    assert_eq!(m.config.stream.address, "127.0.0.1");
}

#[test]
fn a_default_handler_that_cannot_come_along_falls_back_to_runc() {
    let m = migrated(
        r#"
version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
default_runtime_name = "kata"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata]
runtime_type = "io.containerd.kata.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata.options]
ConfigPath = "/etc/kata/configuration.toml"
"#,
        None,
    );
    assert_eq!(m.config.containerd.default_runtime, "runc");
    // containerd's built-in runc handler, which the file did not redefine.
    assert_eq!(m.config.containerd.runtimes["runc"].runtime_type, RUNC_SHIM);
    let why = not_carried(&m, &format!("{V2}.containerd.default_runtime_name"));
    assert!(why.contains("\"kata\""), "{why}");
}

#[test]
fn a_default_handler_the_file_never_defines_is_reported() {
    let m = migrated(
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\ndefault_runtime_name = \"crun\"\n",
        None,
    );
    assert_eq!(m.config.containerd.default_runtime, "runc");
    assert_eq!(m.config.containerd.runtimes, containerd_runc_only());
    let why = not_carried(&m, &format!("{V2}.containerd.default_runtime_name"));
    assert!(why.contains("\"crun\""), "{why}");
}

#[test]
fn config_path_and_deprecated_mirrors_together_keep_config_path() {
    let m = migrated(
        r#"
version = 2
[plugins."io.containerd.grpc.v1.cri".registry]
config_path = "/etc/containerd/certs.d"
[plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]
endpoint = ["https://mirror.example.com"]
"#,
        Some(Path::new("/tmp/unused")),
    );
    assert_eq!(m.config.registry.config_path, "/etc/containerd/certs.d");
    assert!(m.hosts_files.is_empty());
    let why = not_carried(&m, &format!("{V2}.registry.mirrors.\"docker.io\""));
    assert!(why.contains("config_path"), "{why}");
}

#[test]
fn bad_inputs_fail_with_clear_errors() {
    let options = Options {
        source: Path::new("/etc/containerd/config.toml"),
        hosts_dir: None,
    };
    let err = migrate("version = 5\n", &options).unwrap_err();
    assert!(matches!(err, MigrateError::UnknownVersion { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("unknown containerd config version 5"),
        "{err}"
    );
    let err = migrate("version = \"2\"\n", &options).unwrap_err();
    assert!(matches!(err, MigrateError::UnknownVersion { .. }), "{err}");
    let err = migrate("[plugins\nnot toml", &options).unwrap_err();
    assert!(matches!(err, MigrateError::NotToml { .. }), "{err}");
    assert!(
        err.to_string().contains("/etc/containerd/config.toml"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.toml");
    let err = read_source(&missing).unwrap_err();
    assert!(matches!(err, MigrateError::Read { .. }), "{err}");
    assert!(err.to_string().contains("missing.toml"), "{err}");

    let big = dir.path().join("big.toml");
    let file = std::fs::File::create(&big).unwrap();
    file.set_len(MAX_SOURCE_BYTES + 1).unwrap();
    let err = read_source(&big).unwrap_err();
    assert!(matches!(err, MigrateError::TooLarge { .. }), "{err}");
}

#[test]
fn run_prints_the_config_and_reports_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("config.toml");
    std::fs::write(&source, V2_CUSTOM).unwrap();
    let hosts_dir = dir.path().join("certs.d");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    run(&source, Some(&hosts_dir), &mut out, &mut err).unwrap();
    let (out, err) = (
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    );
    let config = crate::config::Config::from_toml_str(&out).unwrap();
    assert_eq!(config.containerd.default_runtime, "crun");
    assert!(out.contains(&source.display().to_string()), "{out}");
    assert!(
        err.contains(&format!(
            "not carried over: {V2}.enable_selinux: crius has no SELinux labelling"
        )),
        "{err}"
    );
    assert!(err.contains(&format!(
        "wrote {}",
        hosts_dir.join("docker.io/hosts.toml").display()
    )));
    assert!(err.contains("registry credentials"), "{err}");
    assert!(hosts_dir.join("docker.io/hosts.toml").is_file());

    // A second run refuses to replace the hosts files it wrote, and prints nothing.
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let e = run(&source, Some(&hosts_dir), &mut out, &mut err).unwrap_err();
    assert!(matches!(e, MigrateError::HostsFileExists { .. }), "{e}");
    assert!(out.is_empty());
}

/// containerd's built-in handlers: runc on containerd's Go runc shim.
fn containerd_runc_only() -> std::collections::BTreeMap<String, crate::config::RuntimeConfig> {
    let runc = crate::config::RuntimeConfig {
        runtime_type: RUNC_SHIM.to_string(),
        ..crate::config::RuntimeConfig::default()
    };
    std::collections::BTreeMap::from([("runc".to_string(), runc)])
}

#[test]
fn without_handlers_runc_stays_on_containerds_runc_shim() {
    for text in [
        "version = 2\n",
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\nsandbox_image = \"example.com/pause:1\"\n",
        "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\".cni]\nmax_conf_num = 2\n",
    ] {
        let m = migrated(text, None);
        assert_eq!(
            m.config.containerd.runtimes,
            containerd_runc_only(),
            "{text}"
        );
        assert_eq!(m.config.containerd.default_runtime, "runc");
        let printed = m.to_toml().unwrap();
        assert!(
            printed.contains("runtime_type = \"io.containerd.runc.v2\""),
            "{printed}"
        );
    }
    // The runc stand-in for a "runc" the file defines but that cannot come along.
    let m = migrated(
        r#"
version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
runtime_type = "io.containerd.runc.v2"
runtime_path = "/opt/bin/containerd-shim-runc-v2"
"#,
        None,
    );
    assert_eq!(m.config.containerd.runtimes, containerd_runc_only());
    assert!(not_carried(&m, "default_runtime_name").contains("not carried over"));
}

#[test]
fn cdi_off_keeps_crius_spec_dirs_and_is_reported() {
    // containerd 1.7's default: CDI requests were ignored, not refused.
    let m = migrated(
        r#"
version = 2
[plugins."io.containerd.grpc.v1.cri"]
enable_cdi = false
cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
"#,
        None,
    );
    assert_eq!(m.config.cdi, crate::config::Config::default().cdi);
    let why = not_carried(&m, &format!("{V2}.enable_cdi"));
    assert!(why.contains("ignored") && why.contains("refuse"), "{why}");
}

#[test]
fn auths_entries_replace_configs_auth_of_the_same_host() {
    let m = migrated(
        r#"
version = 2
[plugins."io.containerd.grpc.v1.cri".registry.configs."reg.example.com".auth]
username = "old"
password = "a"
[plugins."io.containerd.grpc.v1.cri".registry.configs."other.example.com".auth]
username = "kept"
password = "b"
[plugins."io.containerd.grpc.v1.cri".registry.configs."wiped.example.com".auth]
username = "gone"
password = "c"
[plugins."io.containerd.grpc.v1.cri".registry.auths."https://reg.example.com/v1/"]
username = "new"
password = "d"
[plugins."io.containerd.grpc.v1.cri".registry.auths."https://wiped.example.com"]
"#,
        None,
    );
    let configs = &m.config.registry.configs;
    let user = |host: &str| configs[host].auth.as_ref().map(|a| a.username.clone());
    assert_eq!(user("reg.example.com").as_deref(), Some("new"));
    assert_eq!(user("other.example.com").as_deref(), Some("kept"));
    // An empty auths entry left containerd without credentials for the host.
    assert!(!configs.contains_key("wiped.example.com"));
    let replaced = not_carried(
        &m,
        &format!("{V2}.registry.configs.\"reg.example.com\".auth"),
    );
    assert!(replaced.contains("auths"), "{replaced}");
    let wiped = not_carried(
        &m,
        &format!("{V2}.registry.configs.\"wiped.example.com\".auth"),
    );
    assert!(wiped.contains("without credentials"), "{wiped}");
    assert!(
        m.report
            .find(&format!("{V2}.registry.configs.\"other.example.com\".auth"))
            .is_none()
    );
}

#[test]
fn auths_keys_without_a_scheme_are_read_as_containerd_did() {
    let m = migrated(
        r#"
version = 2
[plugins."io.containerd.grpc.v1.cri".registry.auths."plain.example.com"]
username = "p"
[plugins."io.containerd.grpc.v1.cri".registry.auths."localhost:5000"]
username = "x"
[plugins."io.containerd.grpc.v1.cri".registry.auths."10.0.0.4:5000"]
username = "y"
[plugins."io.containerd.grpc.v1.cri".registry.auths."reg.example.com/v2"]
username = "z"
"#,
        None,
    );
    let configs = &m.config.registry.configs;
    let hosts: Vec<&str> = configs.keys().map(String::as_str).collect();
    assert_eq!(hosts, ["plain.example.com"]);
    let auths = format!("{V2}.registry.auths");
    // Go reads "localhost" as the scheme: no host, so the credentials were never used.
    let why = not_carried(&m, &format!("{auths}.\"localhost:5000\""));
    assert!(
        why.contains("never used") && why.contains("https://localhost:5000"),
        "{why}"
    );
    let why = not_carried(&m, &format!("{auths}.\"10.0.0.4:5000\""));
    assert!(why.contains("refused to start"), "{why}");
    let why = not_carried(&m, &format!("{auths}.\"reg.example.com/v2\""));
    assert!(why.contains("never used"), "{why}");
}

/// Migrates `text` with a hosts directory, writes the hosts files, and returns the
/// migration and the directory (kept alive with it).
fn migrated_with_hosts(text: &str) -> (Migration, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let hosts_dir = dir.path().join("certs.d");
    let m = migrated(text, Some(&hosts_dir));
    write_hosts_files(&hosts_dir, &m.hosts_files).unwrap();
    (m, dir)
}

fn bases(m: &Migration, registry: &str) -> Vec<String> {
    crate::image::hosts::endpoints(&m.config.registry.config_path, registry)
        .unwrap()
        .into_iter()
        .map(|e| format!("{}{}", e.base, e.path_prefix))
        .collect()
}

#[test]
fn catch_all_mirror_reaches_every_registry_without_its_own_mirrors() {
    let (m, _dir) = migrated_with_hosts(
        r#"
version = 2
[plugins."io.containerd.grpc.v1.cri".registry.mirrors."*"]
endpoint = ["https://cache.example.com"]
[plugins."io.containerd.grpc.v1.cri".registry.mirrors."quay.io"]
endpoint = []
[plugins."io.containerd.grpc.v1.cri".registry.configs."reg.example.com".tls]
insecure_skip_verify = true
"#,
    );
    // Its own directory (for the TLS settings) hides _default: it lists "*" again.
    assert_eq!(
        bases(&m, "reg.example.com"),
        ["https://cache.example.com/v2", "https://reg.example.com/v2"]
    );
    assert_eq!(
        bases(&m, "ghcr.io"),
        ["https://cache.example.com/v2", "https://ghcr.io/v2"]
    );
    // A mirrors entry of its own, even an empty one, keeps "*" away.
    assert_eq!(bases(&m, "quay.io"), ["https://quay.io/v2"]);
}

#[test]
fn tls_settings_follow_each_endpoint_host() {
    let (m, _dir) = migrated_with_hosts(
        r#"
version = 2
[plugins."io.containerd.grpc.v1.cri".registry.configs."docker.io".tls]
ca_file = "/etc/certs/hub-ca.pem"
[plugins."io.containerd.grpc.v1.cri".registry.configs."registry-1.docker.io".tls]
insecure_skip_verify = true
[plugins."io.containerd.grpc.v1.cri".registry.mirrors."quay.io"]
endpoint = ["https://mirror.example.com"]
[plugins."io.containerd.grpc.v1.cri".registry.configs."quay.io".tls]
ca_file = "/etc/certs/quay-ca.pem"
cert_file = "/etc/certs/quay.pem"
"#,
    );
    let config_path = &m.config.registry.config_path;
    // docker.io is pulled from registry-1.docker.io: that host's settings apply.
    let hub = crate::image::hosts::endpoints(config_path, "docker.io").unwrap();
    assert_eq!(hub.len(), 1);
    assert_eq!(hub[0].base, "https://registry-1.docker.io");
    assert!(hub[0].skip_verify && hub[0].ca.is_empty());
    let quay = crate::image::hosts::endpoints(config_path, "quay.io").unwrap();
    assert_eq!(quay[0].base, "https://mirror.example.com");
    assert!(quay[0].ca.is_empty() && quay[0].client.is_empty());
    assert_eq!(quay[1].base, "https://quay.io");
    assert_eq!(quay[1].ca, vec![PathBuf::from("/etc/certs/quay-ca.pem")]);
    assert_eq!(
        quay[1].client,
        vec![(PathBuf::from("/etc/certs/quay.pem"), None)]
    );
    // No endpoint is on docker.io itself: containerd never used these settings.
    let why = not_carried(&m, &format!("{V2}.registry.configs.\"docker.io\".tls"));
    assert!(why.contains("registry-1.docker.io"), "{why}");

    // A mirrors entry without endpoints still reaches the registry itself.
    let (m, _dir) = migrated_with_hosts(
        r#"
version = 2
[plugins."io.containerd.grpc.v1.cri".registry.mirrors."reg.example.com"]
endpoint = []
[plugins."io.containerd.grpc.v1.cri".registry.configs."reg.example.com".tls]
insecure_skip_verify = true
"#,
    );
    let reg =
        crate::image::hosts::endpoints(&m.config.registry.config_path, "reg.example.com").unwrap();
    assert_eq!(reg.len(), 1);
    assert!(reg[0].skip_verify);
    assert!(m.report.not_carried_keys().is_empty(), "{:?}", m.report);
}

#[test]
fn an_endpoint_on_the_registry_itself_ends_the_list() {
    let (m, _dir) = migrated_with_hosts(
        r#"
version = 2
[plugins."io.containerd.grpc.v1.cri".registry.mirrors."10.0.0.4:5000"]
endpoint = ["http://10.0.0.4:5000"]
[plugins."io.containerd.grpc.v1.cri".registry.mirrors."reg.example.com"]
endpoint = ["https://m1.example.com", "reg.example.com", "https://m2.example.com/base"]
[plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]
endpoint = ["https://registry-1.docker.io", "https://mirror.example.com"]
"#,
    );
    // No https upstream of its own: containerd did not add one.
    assert_eq!(bases(&m, "10.0.0.4:5000"), ["http://10.0.0.4:5000/v2"]);
    // containerd's order, and nothing after the last endpoint.
    assert_eq!(
        bases(&m, "reg.example.com"),
        [
            "https://m1.example.com/v2",
            "https://reg.example.com/v2",
            "https://m2.example.com/base"
        ]
    );
    let why = reason(
        &m,
        &format!("{V2}.registry.mirrors.\"reg.example.com\".endpoint"),
    );
    assert!(why.contains("https://m2.example.com/base"), "{why}");
    // registry-1.docker.io is not docker.io: containerd added it again at the end.
    assert_eq!(
        bases(&m, "docker.io"),
        [
            "https://registry-1.docker.io/v2",
            "https://mirror.example.com/v2",
            "https://registry-1.docker.io/v2"
        ]
    );
}

#[test]
fn a_failed_write_removes_what_it_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let hosts_dir = dir.path().join("certs.d");
    let m = migrated(V2_CUSTOM, Some(&hosts_dir));
    assert_eq!(
        m.hosts_files.last().map(|f| f.host.as_str()),
        Some("registry.k8s.io")
    );
    // The operator's own directory (without a hosts.toml), and a file in the way of the
    // last host directory: the write fails after the others are written.
    std::fs::create_dir_all(hosts_dir.join("docker.io")).unwrap();
    std::fs::write(hosts_dir.join("docker.io/ca.pem"), "ca").unwrap();
    std::fs::write(hosts_dir.join("registry.k8s.io"), "in the way").unwrap();
    let err = write_hosts_files(&hosts_dir, &m.hosts_files).unwrap_err();
    assert!(err.to_string().contains("registry.k8s.io"), "{err}");
    let mut left: Vec<String> = std::fs::read_dir(&hosts_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["docker.io", "registry.k8s.io"]);
    assert!(!hosts_dir.join("docker.io/hosts.toml").exists());
    assert!(hosts_dir.join("docker.io/ca.pem").is_file());

    // Once the obstacle is gone, a retry writes everything.
    std::fs::remove_file(hosts_dir.join("registry.k8s.io")).unwrap();
    let written = write_hosts_files(&hosts_dir, &m.hosts_files).unwrap();
    assert_eq!(written.len(), m.hosts_files.len());

    // The directories a failed call created, parents included, go too.
    let fresh = dir.path().join("new/certs.d");
    let twice = [m.hosts_files[0].clone(), m.hosts_files[0].clone()];
    let err = write_hosts_files(&fresh, &twice).unwrap_err();
    assert!(matches!(err, MigrateError::HostsFileExists { .. }), "{err}");
    assert!(!dir.path().join("new").exists());
}

mod fuzz {
    use std::path::Path;

    use proptest::prelude::*;

    use super::super::*;

    /// Migrating never panics, and never prints a config crius would refuse.
    fn check(text: &str, hosts_dir: Option<&Path>) {
        let options = Options {
            source: Path::new("/etc/containerd/config.toml"),
            hosts_dir,
        };
        if let Err(MigrateError::Invalid(e)) = migrate(text, &options) {
            panic!("the migration of {text:?} does not load: {e}");
        }
    }

    proptest! {
        #![proptest_config(crate::fuzz_config())]

        #[test]
        fn any_text_migrates_or_fails_cleanly(text in "\\PC{0,300}") {
            check(&text, None);
        }

        #[test]
        fn any_value_of_a_known_key_migrates_or_fails_cleanly(
            table in prop::sample::select(vec![
                "[plugins.\"io.containerd.grpc.v1.cri\"]",
                "[plugins.\"io.containerd.grpc.v1.cri\".containerd]",
                "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.r]",
                "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.r.options]",
                "[plugins.\"io.containerd.grpc.v1.cri\".cni]",
                "[plugins.\"io.containerd.grpc.v1.cri\".x509_key_pair_streaming]",
                "[plugins.\"io.containerd.grpc.v1.cri\".registry.mirrors.\"docker.io\"]",
                "[plugins.\"io.containerd.grpc.v1.cri\".registry.configs.\"h\".tls]",
                "[grpc]",
            ]),
            key in prop::sample::select(vec![
                "sandbox_image", "stats_collect_period", "max_concurrent_downloads",
                "stream_server_address", "stream_server_port", "stream_idle_timeout",
                "image_pull_progress_timeout", "cdi_spec_dirs", "enable_cdi", "snapshotter",
                "default_runtime_name", "runtime_type", "runtime_path", "BinaryName", "IoUid",
                "bin_dir", "conf_dir", "max_conf_num", "tls_cert_file", "endpoint", "ca_file",
                "root", "address", "config_path", "restrict_oom_score_adj",
            ]),
            value in prop_oneof![
                "\\PC{0,30}".prop_map(|s| format!("{s:?}")),
                "-?[0-9]{1,12}".prop_map(String::from),
                Just("[\"\", \"relative\", \"/abs\", \"::1\"]".to_string()),
                Just("true".to_string()),
                Just("{}".to_string()),
            ],
        ) {
            let text = format!("version = 2\nroot = \"/var/lib/containerd\"\n{table}\n{key} = {value}\n");
            check(&text, Some(Path::new("/etc/crius/certs.d")));
        }
    }
}
