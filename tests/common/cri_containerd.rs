//! containerd 2.x with its own CRI enabled, for the tests of crius inside containerd: a
//! private one per test (own root, state, sockets, CNI network), with the runtime handlers
//! `crius-shim` (crius's shim as containerd's sandboxer) and `crius-proxy` (crius as a
//! `sandbox` proxy plugin at `proxy_socket`). Killed on drop, with what its shims run.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crius_testkit::CriClient;

use super::{
    Testbed, bridge_conflist, clean_up_containerd_dir, eventually, host_net, spawn_containerd,
};

pub const SHIM_HANDLER: &str = "crius-shim";
/// crius's shim as cargo builds it by default (linked dynamically) as the sandboxer.
pub const DYNAMIC_SHIM_HANDLER: &str = "crius-shim-dynamic";
pub const PROXY_HANDLER: &str = "crius-proxy";
/// The proxy plugin's name in containerd's config (the handler's sandboxer).
pub const PROXY_PLUGIN: &str = "crius";

pub struct CriContainerd {
    pub dir: PathBuf,
    pub address: PathBuf,
    /// Where containerd dials crius's sandbox controller.
    pub proxy_socket: PathBuf,
    pub bridge: String,
    /// The text every pod address starts with (`198.18.<tag>.`).
    pub subnet_prefix: String,
    child: Option<Child>,
}

impl CriContainerd {
    /// A containerd 2.x with its CRI on a bridge `cricd<tag>0`, on a subnet no host route
    /// overlaps.
    pub async fn start(tag: u8) -> Self {
        let testbed = Testbed::from_env();
        let dir = testbed
            .containerd_address
            .parent()
            .and_then(Path::parent)
            .expect("the test bed directory")
            .join("private")
            .join(format!("cri-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let registry_hosts = dir.join("certs.d").join(&testbed.registry);
        std::fs::create_dir_all(&registry_hosts).expect("create the registry hosts dir");
        std::fs::write(
            registry_hosts.join("hosts.toml"),
            format!(
                "server = \"http://{0}\"\n[host.\"http://{0}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
                testbed.registry
            ),
        )
        .expect("write hosts.toml");
        let bridge = format!("cricd{tag}");
        let subnet = host_net::free_subnet(tag, &format!("{bridge}0"));
        std::fs::create_dir_all(dir.join("net.d")).expect("create net.d");
        std::fs::write(
            dir.join("net.d").join("10-test.conflist"),
            bridge_conflist(&bridge, &subnet.cidr()),
        )
        .expect("write conflist");
        let address = dir.join("containerd.sock");
        let proxy_socket = dir.join("crius-sandbox.sock");
        std::fs::write(
            dir.join("config.toml"),
            config(&dir, &address, &proxy_socket, &testbed),
        )
        .expect("write containerd config");
        let mut containerd = Self {
            dir,
            address,
            proxy_socket,
            bridge,
            subnet_prefix: subnet.text_prefix(),
            child: None,
        };
        containerd.launch().await;
        containerd
    }

    async fn launch(&mut self) {
        self.child = Some(spawn_containerd(&self.dir));
        let address = self.address.clone();
        let up = eventually(Duration::from_secs(30), || {
            let address = address.clone();
            async move {
                match CriClient::connect(&address).await {
                    Ok(mut client) => client
                        .runtime
                        .version(crius::api::v1::VersionRequest::default())
                        .await
                        .is_ok(),
                    Err(_) => false,
                }
            }
        })
        .await;
        assert!(
            up,
            "containerd with its CRI did not come up: {}",
            self.log()
        );
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    pub async fn client(&self) -> CriClient {
        CriClient::connect(&self.address)
            .await
            .expect("connect to containerd's CRI")
    }

    /// Kills containerd as a crash would; its shims (and so the pods) live on.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub async fn restart(&mut self) {
        self.kill();
        self.launch().await;
    }

    /// The pids of processes whose command line matches `pattern` and names this
    /// containerd's socket.
    pub fn shims(&self, binary: &str) -> Vec<u32> {
        let out = Command::new("pgrep")
            .args([
                "-f",
                &format!("{binary}.*-address {}", self.address.display()),
            ])
            .output()
            .expect("pgrep");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }
}

/// containerd's config (v3 layout): its CRI with the two crius handlers beside `runc`.
fn config(dir: &Path, address: &Path, proxy: &Path, testbed: &Testbed) -> String {
    format!(
        r#"version = 3
root = "{root}"
state = "{state}"
# Two containerds must not share NRI's socket.
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = "{address}"
[ttrpc]
  address = "{address}.ttrpc"

[plugins.'io.containerd.cri.v1.images']
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{registry}/bench/pause:1"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "{certs}"

[plugins.'io.containerd.cri.v1.runtime']
  # Without CAP_SYS_RESOURCE (in a container) a pause container's OOM score cannot be lowered.
  restrict_oom_score_adj = {restrict_oom}
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{netd}"
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.{shim_handler}]
      runtime_type = "io.containerd.crius.v2"
      sandboxer = "shim"
    # A path as the runtime type: containerd starts a sandboxer shim by its type only.
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.{dynamic_handler}]
      runtime_type = "{dynamic_shim}"
      sandboxer = "shim"
    # runc's runtime type, so containerd asks the shim (`runtime_path`) for the runtime's
    # features; the proxy starts the pod's shim itself whatever the type.
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.{proxy_handler}]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = "{shim_path}"
      sandboxer = "{proxy_plugin}"

[proxy_plugins.{proxy_plugin}]
  type = "sandbox"
  address = "{proxy}"
"#,
        root = dir.join("root").display(),
        state = dir.join("state").display(),
        address = address.display(),
        registry = testbed.registry,
        certs = dir.join("certs.d").display(),
        netd = dir.join("net.d").display(),
        shim_handler = SHIM_HANDLER,
        dynamic_handler = DYNAMIC_SHIM_HANDLER,
        dynamic_shim = dynamic_shim_binary().display(),
        proxy_handler = PROXY_HANDLER,
        proxy_plugin = PROXY_PLUGIN,
        proxy = proxy.display(),
        restrict_oom = !has_cap_sys_resource(),
        shim_path = shim_binary().display(),
    )
}

/// crius's shim as `cargo build -p crius-shim` links it (dynamically), beside the tests.
pub fn dynamic_shim_binary() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("debug")
        .join("containerd-shim-crius-v2")
}

/// crius's shim as found on the PATH (the test bed puts it there).
fn shim_binary() -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join("containerd-shim-crius-v2"))
                .find(|candidate| candidate.is_file())
        })
        .expect("containerd-shim-crius-v2 on the PATH")
}

/// Whether this process may lower OOM scores (CAP_SYS_RESOURCE, bit 24 of CapEff).
fn has_cap_sys_resource() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << 24) != 0)
}

/// The network namespaces containerd's CRI pinned for its pods (`/var/run/netns/cni-<uuid>`),
/// as its metadata database names them: what a test that failed midway leaves behind.
fn pinned_netns(root: &Path) -> Vec<PathBuf> {
    const PREFIX: &[u8] = b"/var/run/netns/cni-";
    const UUID_LEN: usize = 36;
    let db = std::fs::read(root.join("io.containerd.metadata.v1.bolt/meta.db")).unwrap_or_default();
    let mut found: Vec<PathBuf> = db
        .windows(PREFIX.len() + UUID_LEN)
        .filter(|w| w.starts_with(PREFIX))
        .filter(|w| {
            w[PREFIX.len()..]
                .iter()
                .all(|b| b.is_ascii_hexdigit() || *b == b'-')
        })
        .map(|w| PathBuf::from(String::from_utf8_lossy(w).into_owned()))
        .collect();
    found.sort();
    found.dedup();
    found
}

impl Drop for CriContainerd {
    fn drop(&mut self) {
        self.kill();
        for netns in pinned_netns(&self.dir.join("root")) {
            let _ = nix::mount::umount2(&netns, nix::mount::MntFlags::MNT_DETACH);
            let _ = std::fs::remove_file(&netns);
        }
        let _ = Command::new("ip")
            .args(["link", "del", &format!("{}0", self.bridge)])
            .stderr(Stdio::null())
            .status();
        host_net::remove_cni_rules(&self.bridge);
        clean_up_containerd_dir(&self.dir, &self.address);
    }
}
