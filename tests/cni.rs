//! crius's CNI client on its own, with Debian's real plugins: ADD/CHECK/DEL with the
//! libcni cache, spec versions 0.3.1/0.4.0/1.0.0, VERSION, plugin errors and timeouts.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::host_net;
use crius::cni::NetworkConfigs;
use crius::cni::network::{CniError, CniNetwork, PodRef};
use crius::cni::result::CniResult;
use serde_json::{Map, json};

const PLUGINS: &str = "/usr/lib/cni";

struct Setup {
    _dir: tempfile::TempDir,
    root: PathBuf,
    network: CniNetwork,
    bridge: String,
    /// The network's name.
    name: String,
    /// What the addresses of the network start with.
    prefix: String,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.bridge])
            .stderr(std::process::Stdio::null())
            .status();
        host_net::remove_cni_rules(&self.name);
    }
}

/// A network `cni-test-<tag>` (bridge + portmap) at spec `version`; `first_bin` is searched
/// for plugins before Debian's directory.
fn setup(version: &str, tag: u8, first_bin: Option<PathBuf>) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let conf_dir = root.join("net.d");
    std::fs::create_dir_all(&conf_dir).unwrap();
    let bridge = format!("cricni{tag}");
    let subnet = host_net::free_subnet(tag, &bridge);
    let name = format!("cni-test-{tag}");
    std::fs::write(
        conf_dir.join("10-net.conflist"),
        json!({
            "cniVersion": version,
            "name": name,
            "plugins": [
                {"type": "bridge", "bridge": bridge, "isGateway": true,
                 "ipam": {"type": "host-local", "dataDir": root.join("ipam"),
                          "ranges": [[{"subnet": subnet.cidr()}]]}},
                {"type": "portmap", "capabilities": {"portMappings": true}}
            ]
        })
        .to_string(),
    )
    .unwrap();
    let bin_dirs: Vec<PathBuf> = first_bin
        .into_iter()
        .chain([PathBuf::from(PLUGINS)])
        .collect();
    let configs = Arc::new(NetworkConfigs::load(conf_dir, bin_dirs.clone(), 1));
    let network = CniNetwork::new(
        configs,
        bin_dirs,
        root.join("cache"),
        Duration::from_secs(1),
    );
    Setup {
        _dir: dir,
        root,
        network,
        bridge,
        name,
        prefix: subnet.text_prefix(),
    }
}

fn pod(root: &Path, id: &str) -> PodRef {
    PodRef {
        id: id.to_string(),
        name: "pod".into(),
        namespace: "default".into(),
        uid: "uid".into(),
        netns: root.join(format!("ns-{id}")).display().to_string(),
    }
}

async fn add_check_del(version: &str, tag: u8) {
    let s = setup(version, tag, None);
    let pod = pod(&s.root, "abc");
    crius::sys::netns::create(Path::new(&pod.netns))
        .await
        .unwrap();
    // portmap's CHECK wants IPv6 chains this machine does not have: no mappings here (the
    // sandbox tests cover port mappings end to end).
    let mut caps = Map::new();
    caps.insert("dns".into(), json!({"servers": ["10.0.0.10"]}));
    let attached = s.network.setup(&pod, &caps).await.expect("ADD");
    assert_eq!(attached.len(), 1);
    assert_eq!(attached[0].ifname, "eth0");
    let ips = CniResult::parse(&attached[0].result.value())
        .unwrap()
        .pod_ips("eth0");
    assert_eq!(ips.len(), 1, "{:?}", attached[0].result);
    assert!(ips[0].starts_with(&s.prefix), "{ips:?}");

    // The cache is libcni's: readable, and it names the network, ifname and result.
    let cache_file = s
        .root
        .join("cache/results")
        .join(format!("cni-test-{tag}-abc-eth0"));
    let cached: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cache_file).expect("cache entry")).unwrap();
    assert_eq!(cached["kind"], "cniCacheV1");
    assert_eq!(cached["containerId"], "abc");
    assert_eq!(cached["capabilityArgs"]["dns"]["servers"][0], "10.0.0.10");
    assert_eq!(s.network.cached_attachments("abc").await.len(), 1);

    s.network.check(&pod).await.expect("CHECK");

    s.network.teardown(&pod).await.expect("DEL");
    assert!(!cache_file.exists());
    let reserved = std::fs::read_dir(s.root.join("ipam").join(format!("cni-test-{tag}")))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with(&s.prefix))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(reserved, 0, "IP still reserved");
    // DEL again, and DEL after the netns is gone, both succeed.
    s.network.teardown(&pod).await.expect("second DEL");
    crius::sys::netns::remove(Path::new(&pod.netns))
        .await
        .unwrap();
    s.network.teardown(&pod).await.expect("DEL without netns");
}

#[tokio::test]
async fn add_check_del_with_spec_1_0_0() {
    add_check_del("1.0.0", 201).await;
}

#[tokio::test]
async fn add_check_del_with_spec_0_4_0() {
    add_check_del("0.4.0", 202).await;
}

#[tokio::test]
async fn add_del_with_spec_0_3_1() {
    let s = setup("0.3.1", 203, None);
    let pod = pod(&s.root, "old");
    crius::sys::netns::create(Path::new(&pod.netns))
        .await
        .unwrap();
    let attached = s.network.setup(&pod, &Map::new()).await.expect("ADD");
    let ips = CniResult::parse(&attached[0].result.value())
        .unwrap()
        .pod_ips("eth0");
    assert!(ips[0].starts_with(&s.prefix), "{ips:?}");
    s.network.teardown(&pod).await.expect("DEL");
    crius::sys::netns::remove(Path::new(&pod.netns))
        .await
        .unwrap();
}

#[tokio::test]
async fn version_reports_supported_versions() {
    let s = setup("1.0.0", 204, None);
    let versions = s.network.version("bridge").await.expect("VERSION");
    let supported: Vec<String> =
        serde_json::from_value(versions["supportedVersions"].clone()).unwrap();
    assert!(supported.contains(&"1.0.0".to_string()), "{supported:?}");
    assert!(matches!(
        s.network.version("nosuchplugin").await,
        Err(CniError::PluginNotFound { .. })
    ));
}

#[tokio::test]
async fn plugin_errors_name_the_plugin_status_and_message() {
    let s = setup("1.0.0", 205, None);
    // No netns at that path: the bridge plugin fails.
    let pod = pod(&s.root, "nonetns");
    let err = s.network.setup(&pod, &Map::new()).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, CniError::PluginFailed(_)), "{text}");
    assert!(
        text.contains("CNI plugin") && text.contains("exit status"),
        "{text}"
    );
}

#[tokio::test]
async fn a_hanging_plugin_times_out() {
    let bin = tempfile::tempdir().unwrap();
    // A plugin named like loopback's first step never answers.
    let slow = bin.path().join("loopback");
    std::fs::write(&slow, "#!/bin/sh\nsleep 30\n").unwrap();
    std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).unwrap();
    let s = setup("1.0.0", 206, Some(bin.path().to_path_buf()));
    let pod = pod(&s.root, "slow");
    let started = std::time::Instant::now();
    let err = s.network.setup(&pod, &Map::new()).await.unwrap_err();
    assert!(matches!(err, CniError::Timeout { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn a_plugin_that_prints_without_end_is_cut_off() {
    let bin = tempfile::tempdir().unwrap();
    let loud = bin.path().join("loopback");
    // 3 MB of "result", then a clean exit.
    std::fs::write(&loud, "#!/bin/sh\nhead -c 3000000 /dev/zero | tr '\\0' x\n").unwrap();
    std::fs::set_permissions(&loud, std::fs::Permissions::from_mode(0o755)).unwrap();
    let s = setup("1.0.0", 207, Some(bin.path().to_path_buf()));
    let pod = pod(&s.root, "loud");
    let err = s.network.setup(&pod, &Map::new()).await.unwrap_err();
    assert!(err.to_string().contains("larger than"), "{err}");
}

#[tokio::test]
async fn a_timed_out_plugin_takes_what_it_started_with_it() {
    let bin = tempfile::tempdir().unwrap();
    let slow = bin.path().join("loopback");
    let child_pid = bin.path().join("child.pid");
    // Starts a delegate (as an IPAM plugin would be), then hangs.
    std::fs::write(
        &slow,
        format!(
            "#!/bin/sh\nsleep 300 &\necho $! > {}\nsleep 30\n",
            child_pid.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).unwrap();
    let s = setup("1.0.0", 208, Some(bin.path().to_path_buf()));
    let pod = pod(&s.root, "slow-child");
    let err = s.network.setup(&pod, &Map::new()).await.unwrap_err();
    assert!(matches!(err, CniError::Timeout { .. }), "{err}");
    let pid = std::fs::read_to_string(&child_pid).unwrap();
    let proc_dir = PathBuf::from(format!("/proc/{}", pid.trim()));
    let gone = (0..50).any(|_| {
        let state = std::fs::read_to_string(proc_dir.join("stat")).unwrap_or_default();
        // Gone, or a zombie waiting for init.
        let done = state.is_empty() || state.contains(") Z ");
        if !done {
            std::thread::sleep(Duration::from_millis(100));
        }
        done
    });
    assert!(gone, "the plugin's child outlived its timeout");
}

/// A portmap that fails its first `fails` DELs (as the bridge plugin's iptables calls do for
/// a moment when other pods' race them), then is Debian's; it counts its DELs.
fn flaky_portmap(bin: &Path, fails: u32) {
    let script = format!(
        r#"#!/bin/sh
if [ "$CNI_COMMAND" = DEL ]; then
  n=$(($(cat {count} 2>/dev/null || echo 0) + 1))
  echo $n > {count}
  if [ $n -le {fails} ]; then
    echo '{{"cniVersion":"1.0.0","code":11,"msg":"Chain does not exist (for a moment)"}}'
    exit 1
  fi
fi
exec {PLUGINS}/portmap
"#,
        count = bin.join("dels").display(),
    );
    let path = bin.join("portmap");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn dels(bin: &Path) -> u32 {
    std::fs::read_to_string(bin.join("dels"))
        .ok()
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// A DEL that fails for a moment (found by the soak: StopPodSandbox failed INTERNAL under
/// load) is run again, and the pod's network goes; one that keeps failing fails the
/// teardown after three tries.
#[tokio::test]
async fn a_del_that_fails_for_a_moment_is_run_again() {
    let bin = tempfile::tempdir().unwrap();
    flaky_portmap(bin.path(), 1);
    let s = setup("1.0.0", 209, Some(bin.path().to_path_buf()));
    let flaky = pod(&s.root, "flaky");
    crius::sys::netns::create(Path::new(&flaky.netns))
        .await
        .unwrap();
    s.network.setup(&flaky, &Map::new()).await.expect("ADD");
    s.network
        .teardown(&flaky)
        .await
        .expect("DEL, the second time");
    assert_eq!(dels(bin.path()), 2);
    assert!(s.network.cached_attachments("flaky").await.is_empty());
    let reserved = std::fs::read_dir(s.root.join("ipam").join("cni-test-209"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with(&s.prefix))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(reserved, 0, "the bridge plugin's DEL gave the IP back");

    // One that keeps failing: three tries, then the error.
    std::fs::remove_file(bin.path().join("dels")).unwrap();
    flaky_portmap(bin.path(), 100);
    let stuck = pod(&s.root, "stuck");
    crius::sys::netns::create(Path::new(&stuck.netns))
        .await
        .unwrap();
    s.network.setup(&stuck, &Map::new()).await.expect("ADD");
    let err = s.network.teardown(&stuck).await.unwrap_err();
    assert!(matches!(err, CniError::PluginFailed(_)), "{err}");
    assert_eq!(dels(bin.path()), 3);
    flaky_portmap(bin.path(), 0);
    s.network.teardown(&stuck).await.expect("DEL once it works");
    crius::sys::netns::remove(Path::new(&flaky.netns))
        .await
        .unwrap();
    crius::sys::netns::remove(Path::new(&stuck.netns))
        .await
        .unwrap();
}
