//! `crius config migrate` end to end: the config it prints from containerd's own default
//! configs and from real-world-shaped ones passes `crius config check`, and a crius started
//! on it (with only this node's paths swapped for the test bed's) serves with the migrated
//! runtime handlers.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::Crius;
use crius::api::v1::{StatusRequest, VersionRequest};
use crius::config::Config;

const FIXTURES: [&str; 4] = [
    "containerd-1.6-default.toml",
    "containerd-2.1-default.toml",
    "v2-custom.toml",
    "v3-split.toml",
];

fn crius() -> Command {
    Command::new(env!("CARGO_BIN_EXE_crius"))
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/containerd-config")
        .join(name)
}

/// The migrated config's text; panics with stderr when migrate fails.
fn migrate(from: &Path, hosts_dir: &Path) -> String {
    let out = crius()
        .args(["config", "migrate", "--from"])
        .arg(from)
        .arg("--hosts-dir")
        .arg(hosts_dir)
        .output()
        .expect("run crius config migrate");
    assert!(
        out.status.success(),
        "migrate {}: {}",
        from.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 config")
}

#[test]
fn every_migrated_config_passes_config_check() {
    for name in FIXTURES {
        let dir = tempfile::tempdir().unwrap();
        let text = migrate(&fixture(name), &dir.path().join("hosts"));
        let path = dir.path().join("config.toml");
        std::fs::write(&path, &text).unwrap();
        let out = crius()
            .args(["config", "check", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}\n{text}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The migrated config with this node's paths (crius's own directories and sockets,
/// containerd's address and root, the CNI conf dir, the stream server's address and port)
/// taken from the test bed's config; a
/// stream key pair the node would hold becomes a self-signed one (TLS stays on).
fn on_this_node(migrated: &Config, testbed: &Config) -> Config {
    let mut config = migrated.clone();
    config.root = testbed.root.clone();
    config.state = testbed.state.clone();
    config.grpc.address = testbed.grpc.address.clone();
    config.grpc.ttrpc_address = testbed.grpc.ttrpc_address.clone();
    config.containerd.address = testbed.containerd.address.clone();
    config.containerd.root = testbed.containerd.root.clone();
    config.containerd.namespace = testbed.containerd.namespace.clone();
    config.containerd.connect_timeout = testbed.containerd.connect_timeout;
    config.cni.conf_dir = testbed.cni.conf_dir.clone();
    config.log = testbed.log.clone();
    config.stream.address = testbed.stream.address.clone();
    config.stream.port = testbed.stream.port;
    config.stream.tls_cert_file = None;
    config.stream.tls_key_file = None;
    config
}

#[tokio::test]
async fn crius_serves_on_a_migrated_config() {
    for name in FIXTURES {
        let hosts = tempfile::tempdir().unwrap();
        let text = migrate(&fixture(name), hosts.path());
        let migrated = Config::from_toml_str(&text).expect("the migrated config parses");
        let crius = Crius::start_with(|c| *c = on_this_node(&migrated, c), &[]).await;
        let mut client = crius.client().await;
        let version = client
            .runtime
            .version(VersionRequest::default())
            .await
            .unwrap_or_else(|e| panic!("{name}: Version: {e}\n{}", crius.log()))
            .into_inner();
        assert_eq!(version.runtime_name, "crius", "{name}");
        let status = client
            .runtime
            .status(StatusRequest { verbose: false })
            .await
            .unwrap_or_else(|e| panic!("{name}: Status: {e}"))
            .into_inner();
        let mut served: Vec<String> = status
            .runtime_handlers
            .iter()
            .map(|h| h.name.clone())
            .filter(|n| !n.is_empty())
            .collect();
        served.sort();
        let mut wanted: Vec<String> = migrated.containerd.runtimes.keys().cloned().collect();
        wanted.sort();
        assert_eq!(served, wanted, "{name}: handlers\n{text}");
    }
}
