//! The integration test harness: a crius process per test, against the test bed's real
//! containerd and registry (`scripts/testbed.sh up`, done by `make test`).
//!
//! Each `Crius` gets its own directory (root, state, sockets, CNI conf dir) and its own
//! containerd namespace, so tests run in parallel without seeing each other.

#![allow(dead_code)]

pub mod cri_containerd;
pub mod host_net;
pub mod pod;
pub mod registry_push;
pub mod streams;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crius::api::v1::VersionRequest;
use crius::config::Config;
use crius_testkit::CriClient;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

/// What the test bed provides, from the environment `scripts/testbed.sh env` prints.
pub struct Testbed {
    pub containerd_address: PathBuf,
    pub containerd_root: PathBuf,
    pub registry: String,
    pub registry_log: PathBuf,
    pub auth_registry: String,
    /// `user:password` for the auth registry.
    pub auth_credentials: String,
    /// The OCI layout the test images were built in.
    pub images: PathBuf,
}

impl Testbed {
    pub fn from_env() -> Self {
        let var = |name: &str| {
            std::env::var(name).unwrap_or_else(|_| {
                panic!(
                    "{name} is not set: run the integration tests with `make test`, or \
                     `make testbed-up && eval \"$(scripts/testbed.sh env)\" && cargo test`"
                )
            })
        };
        Self {
            containerd_address: var("CRIUS_TEST_CONTAINERD_ADDRESS").into(),
            containerd_root: var("CRIUS_TEST_CONTAINERD_ROOT").into(),
            registry: var("CRIUS_TEST_REGISTRY"),
            registry_log: var("CRIUS_TEST_REGISTRY_LOG").into(),
            auth_registry: var("CRIUS_TEST_AUTH_REGISTRY"),
            auth_credentials: var("CRIUS_TEST_AUTH_CREDENTIALS"),
            images: var("CRIUS_TEST_IMAGES").into(),
        }
    }
}

/// Removes the cgroup `parent` (a pod's cgroup parent) from every hierarchy: runc leaves a
/// parent cgroup behind, so it is the test's to remove.
pub fn remove_cgroup(parent: &str) {
    for controller in [
        "cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "systemd",
        "unified", "",
    ] {
        let _ = std::fs::remove_dir(format!("/sys/fs/cgroup/{controller}{parent}"));
    }
}

/// The major version of the containerd on the PATH (the one the test bed runs).
pub fn containerd_major() -> u32 {
    let out = Command::new("containerd")
        .arg("--version")
        .output()
        .expect("run containerd --version");
    let text = String::from_utf8_lossy(&out.stdout);
    // `containerd github.com/containerd/containerd/v2 2.1.9+unknown` or `... 1.6.20~ds1 ...`
    text.split_whitespace()
        .nth(2)
        .and_then(|v| v.trim_start_matches('v').split('.').next()?.parse().ok())
        .unwrap_or_else(|| panic!("cannot read the containerd version from {text:?}"))
}

/// A crius daemon started for one test. Killed on drop.
pub struct Crius {
    pub dir: tempfile::TempDir,
    pub config: Config,
    pub config_path: PathBuf,
    log_path: PathBuf,
    child: Option<Child>,
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

impl Crius {
    /// A config for a fresh crius against the test bed; tests adjust it before `spawn`.
    pub fn config(dir: &Path) -> Config {
        let testbed = Testbed::from_env();
        let mut config = Config {
            root: dir.join("root"),
            state: dir.join("state"),
            ..Config::default()
        };
        config.grpc.address = dir.join("crius.sock");
        config.grpc.ttrpc_address = dir.join("crius.sock.ttrpc");
        config.containerd.address = testbed.containerd_address;
        config.containerd.root = testbed.containerd_root;
        config.containerd.connect_timeout = Duration::from_secs(10);
        config.containerd.namespace = format!(
            "crius-test-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        config.cni.conf_dir = dir.join("net.d");
        config.log.level = "crius=debug,info".to_string();
        config
    }

    /// Starts crius with `adjust` applied to the default test config; does not wait.
    pub fn spawn_with(adjust: impl FnOnce(&mut Config), env: &[(&str, &str)]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("crius-")
            .tempdir()
            .expect("create test dir");
        let mut config = Self::config(dir.path());
        adjust(&mut config);
        let config_path = dir.path().join("config.toml");
        std::fs::write(
            &config_path,
            toml::to_string(&config).expect("serialize config"),
        )
        .expect("write config");
        let log_path = dir.path().join("crius.log");
        let log = std::fs::File::create(&log_path).expect("create log");
        let child = Command::new(env!("CARGO_BIN_EXE_crius"))
            .arg("--config")
            .arg(&config_path)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn crius");
        Self {
            dir,
            config,
            config_path,
            log_path,
            child: Some(child),
        }
    }

    /// Starts crius and waits until it serves.
    pub async fn start_with(adjust: impl FnOnce(&mut Config), env: &[(&str, &str)]) -> Self {
        let mut crius = Self::spawn_with(adjust, env);
        crius.wait_ready(Duration::from_secs(20)).await;
        crius
    }

    pub async fn start() -> Self {
        Self::start_with(|_| {}, &[]).await
    }

    /// Starts crius with the default test config and `failpoints` (`CRIUS_FAILPOINTS`:
    /// only a build with the `failpoints` feature has them).
    pub async fn start_with_failpoints(failpoints: &str) -> Self {
        Self::start_with(|_| {}, &[("CRIUS_FAILPOINTS", failpoints)]).await
    }

    /// Stops crius (SIGTERM, expecting a clean exit) and starts it again with the same
    /// config, directory and containerd namespace.
    pub async fn restart(&mut self) {
        self.stop().await;
        self.respawn().await;
    }

    /// Kills crius with SIGKILL, as a crash would (a no-op when it already died).
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts crius again (without the failpoints it may have been started with) after it
    /// died or was killed.
    pub async fn restart_after_crash(&mut self) {
        self.kill().await;
        self.respawn().await;
    }

    /// Like [`Crius::restart_after_crash`], with `env` (failpoints) for the new process.
    pub async fn restart_after_crash_with(&mut self, env: &[(&str, &str)]) {
        self.kill().await;
        self.respawn_with(env).await;
    }

    async fn respawn(&mut self) {
        self.respawn_with(&[]).await;
    }

    async fn respawn_with(&mut self, env: &[(&str, &str)]) {
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log_path)
            .expect("open log");
        let child = Command::new(env!("CARGO_BIN_EXE_crius"))
            .arg("--config")
            .arg(&self.config_path)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn crius");
        self.child = Some(child);
        self.wait_ready(Duration::from_secs(20)).await;
    }

    /// Runs `ctr` against the test containerd in this crius's namespace; returns stdout.
    pub fn ctr(&self, args: &[&str]) -> String {
        let out = Command::new("ctr")
            .arg("--address")
            .arg(&self.config.containerd.address)
            .arg("-n")
            .arg(&self.config.containerd.namespace)
            .args(args)
            .output()
            .expect("run ctr");
        assert!(
            out.status.success(),
            "ctr {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// crius's leases in containerd, but for the one it keeps made ahead for the next
    /// creation (a `crius-create-` lease when it is the only one of its kind): what an
    /// operation left behind.
    pub fn leases_left(&self) -> Vec<String> {
        let mut leases = self.leases("crius-");
        let made_ahead = |l: &String| l.starts_with("crius-create-");
        if leases.iter().filter(|l| made_ahead(l)).count() == 1 {
            leases.retain(|l| !made_ahead(l));
        }
        leases
    }

    /// The IDs of the leases in this crius's namespace that start with `prefix`.
    pub fn leases(&self, prefix: &str) -> Vec<String> {
        self.ctr(&["leases", "ls", "-q"])
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with(prefix))
            .map(String::from)
            .collect()
    }

    pub fn grpc_socket(&self) -> &Path {
        &self.config.grpc.address
    }

    pub fn ttrpc_socket(&self) -> &Path {
        &self.config.grpc.ttrpc_address
    }

    pub fn conf_dir(&self) -> &Path {
        &self.config.cni.conf_dir
    }

    /// Waits until `Version` succeeds; panics with the log when it does not in time.
    pub async fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(mut client) = CriClient::connect(self.grpc_socket()).await
                && client
                    .runtime
                    .version(VersionRequest::default())
                    .await
                    .is_ok()
            {
                return;
            }
            if let Some(status) = self.try_wait() {
                panic!("crius exited early with {status}:\n{}", self.log());
            }
            if Instant::now() > deadline {
                panic!("crius did not become ready in {timeout:?}:\n{}", self.log());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A client, or the error when crius does not answer.
    pub async fn client_now(&self) -> Result<CriClient, crius_testkit::ClientError> {
        CriClient::connect(self.grpc_socket()).await
    }

    pub async fn client(&self) -> CriClient {
        CriClient::connect(self.grpc_socket())
            .await
            .expect("connect to crius")
    }

    /// Everything crius logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    pub fn pid(&self) -> Pid {
        let child = self.child.as_ref().expect("crius is running");
        Pid::from_raw(child.id() as i32)
    }

    pub fn signal(&self, signal: Signal) {
        nix::sys::signal::kill(self.pid(), signal).expect("signal crius");
    }

    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().expect("wait for crius"))
    }

    /// Waits up to `timeout` for crius to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// SIGTERM and wait; panics if crius does not exit 0 within 5 s.
    pub async fn stop(&mut self) {
        self.signal(Signal::SIGTERM);
        let status = self.wait_exit(Duration::from_secs(5)).await;
        assert!(
            status.is_some_and(|s| s.success()),
            "crius did not stop cleanly ({status:?}):\n{}",
            self.log()
        );
    }
}

impl Drop for Crius {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.release_host_resources();
    }
}

impl Crius {
    /// Pods a test leaves behind keep their netns and `/dev/shm` mounted on the host after
    /// the test containerd is gone: release them with the test's directory.
    fn release_host_resources(&self) {
        self.kill_leftover_containers();
        let sandboxes = self.config.root.join("sandboxes");
        for entry in std::fs::read_dir(&sandboxes)
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Ok(netns) = std::fs::read_to_string(entry.path().join("netns")) {
                let netns = netns.trim();
                let _ = nix::mount::umount2(netns, nix::mount::MntFlags::MNT_DETACH);
                let _ = std::fs::remove_file(netns);
            }
        }
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut mounts: Vec<&str> = mountinfo
            .lines()
            .filter_map(|line| line.split(' ').nth(4))
            .filter(|point| Path::new(point).starts_with(self.dir.path()))
            .collect();
        mounts.sort_by_key(|point| std::cmp::Reverse(point.len()));
        for point in mounts {
            let _ = nix::mount::umount2(point, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

impl Crius {
    /// Containers a test leaves running (a busy loop) would compete with the tests after
    /// it for the cores: kill the shims of this crius's namespace and their processes.
    fn kill_leftover_containers(&self) {
        let pattern = format!(
            "containerd-shim.* -namespace {} ",
            self.config.containerd.namespace
        );
        let Ok(out) = Command::new("pgrep").arg("-f").arg(&pattern).output() else {
            return;
        };
        for shim in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new("pkill").args(["-9", "-P", shim]).status();
            let _ = Command::new("kill").args(["-9", shim]).status();
        }
    }
}

/// Copies a test image from the OCI layout (`busybox:latest`, ...) to `destination`
/// (`127.0.0.1:5010/repo:tag`) in a test bed registry.
pub fn push_test_image(source_tag: &str, destination: &str) {
    let testbed = Testbed::from_env();
    let out = Command::new("skopeo")
        .args(["copy", "--quiet", "--dest-tls-verify=false"])
        .arg(format!("oci:{}:{source_tag}", testbed.images.display()))
        .arg(format!("docker://{destination}"))
        .output()
        .expect("run skopeo");
    assert!(
        out.status.success(),
        "skopeo copy to {destination} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Polls `check` every 50 ms until it returns true or `timeout` passes.
/// Asserts that crius answers `Version` within a second, as it must during an attack.
pub async fn assert_answers_within_a_second(client: &mut CriClient, when: &str) {
    let answered = tokio::time::timeout(
        Duration::from_secs(1),
        client.runtime.version(VersionRequest::default()),
    )
    .await;
    assert!(
        matches!(answered, Ok(Ok(_))),
        "crius did not answer Version within 1 s {when}: {answered:?}"
    );
}

pub async fn eventually<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A bridge network with host-local IPAM, portmap and loopback, as `make run` writes it.
pub fn bridge_conflist(name: &str, subnet: &str) -> String {
    format!(
        r#"{{
  "cniVersion": "1.0.0",
  "name": "{name}",
  "plugins": [
    {{"type": "bridge", "bridge": "{name}0", "isGateway": true, "ipMasq": true,
      "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "{subnet}"}}]],
               "routes": [{{"dst": "0.0.0.0/0"}}]}}}},
    {{"type": "portmap", "capabilities": {{"portMappings": true}}}}
  ]
}}"#
    )
}

/// A CNI network for one test: a bridge `criust<tag>` on a /24 of 198.18.0.0/15 that no host
/// route overlaps ([`host_net::free_subnet`]), host-local IPAM (its reservations in
/// `ipam_dir`) and portmap, written into a crius config's conf dir. On drop the bridge goes,
/// with the iptables rules of pods the test left without a CNI DEL.
pub struct TestNetwork {
    pub name: String,
    pub bridge: String,
    pub subnet: host_net::Subnet,
    /// The text every address of the network starts with (`198.18.<tag>.`).
    pub subnet_prefix: String,
    pub ipam_dir: PathBuf,
}

impl TestNetwork {
    /// Writes the conflist into `config.cni.conf_dir` and points the CNI cache and IPAM
    /// store into the test's directory.
    pub fn install(config: &mut Config, tag: u8) -> Self {
        let base = config.root.parent().expect("test dir").to_path_buf();
        let bridge = format!("criust{tag}");
        let subnet = host_net::free_subnet(tag, &bridge);
        let network = Self {
            name: format!("crius-test-{tag}"),
            subnet_prefix: subnet.text_prefix(),
            subnet,
            bridge,
            ipam_dir: base.join("ipam"),
        };
        config.cni.cache_dir = base.join("cni-cache");
        std::fs::create_dir_all(&config.cni.conf_dir).expect("create conf dir");
        std::fs::write(
            config.cni.conf_dir.join("10-test.conflist"),
            network.conflist(),
        )
        .expect("write conflist");
        network
    }

    pub fn conflist(&self) -> String {
        format!(
            r#"{{
  "cniVersion": "1.0.0",
  "name": "{name}",
  "plugins": [
    {{"type": "bridge", "bridge": "{bridge}", "isGateway": true, "ipMasq": true,
      "ipam": {{"type": "host-local", "dataDir": "{ipam}",
               "ranges": [[{{"subnet": "{cidr}"}}]], "routes": [{{"dst": "0.0.0.0/0"}}]}}}},
    {{"type": "portmap", "capabilities": {{"portMappings": true}}}}
  ]
}}"#,
            name = self.name,
            bridge = self.bridge,
            ipam = self.ipam_dir.display(),
            cidr = self.subnet.cidr(),
        )
    }

    /// IPs host-local has reserved on this network.
    pub fn reserved_ips(&self) -> Vec<String> {
        std::fs::read_dir(self.ipam_dir.join(&self.name))
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for TestNetwork {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .stderr(Stdio::null())
            .status();
        host_net::remove_cni_rules(&self.name);
    }
}

/// A pod sandbox config with the given name (namespace `default`, uid `<name>-uid`).
pub fn pod_config(name: &str) -> crius::api::v1::PodSandboxConfig {
    crius::api::v1::PodSandboxConfig {
        metadata: Some(crius::api::v1::PodSandboxMetadata {
            name: name.to_string(),
            namespace: "default".to_string(),
            uid: format!("{name}-uid"),
            attempt: 0,
        }),
        hostname: name.to_string(),
        log_directory: format!("/tmp/crius-test-logs/{name}"),
        linux: Some(crius::api::v1::LinuxPodSandboxConfig::default()),
        ..Default::default()
    }
}

/// A containerd of one test's own, for tests that stop and restart it. It lives next to the
/// test bed's containerd (same filesystem, so overlayfs works) and is killed on drop.
pub struct PrivateContainerd {
    pub dir: PathBuf,
    pub address: PathBuf,
    pub root: PathBuf,
    child: Option<Child>,
}

impl PrivateContainerd {
    pub async fn start() -> Self {
        let testbed = Testbed::from_env();
        let base = testbed
            .containerd_address
            .parent()
            .and_then(Path::parent)
            .expect("the test bed directory")
            .join("private");
        let dir = base.join(format!(
            "{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create private containerd dir");
        let address = dir.join("containerd.sock");
        let root = dir.join("root");
        std::fs::write(
            dir.join("config.toml"),
            format!(
                r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{address}"
[ttrpc]
  address = "{address}.ttrpc"
[plugins."io.containerd.gc.v1.scheduler"]
  deletion_threshold = 0
"#,
                root = root.display(),
                state = dir.join("state").display(),
                address = address.display(),
            ),
        )
        .expect("write containerd config");
        let mut containerd = Self {
            dir,
            address,
            root,
            child: None,
        };
        containerd.launch().await;
        containerd
    }

    async fn launch(&mut self) {
        self.child = Some(spawn_containerd(&self.dir));
        let address = self.address.clone();
        let up = eventually(Duration::from_secs(20), || {
            let address = address.clone();
            async move {
                Command::new("ctr")
                    .arg("--address")
                    .arg(&address)
                    .args(["--connect-timeout", "1s", "version"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            }
        })
        .await;
        assert!(up, "the private containerd did not come up");
    }

    /// Kills containerd as a crash would; its shims (and so the containers) live on.
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

    /// Stops containerd with SIGTERM, as an upgrade does, waits for it to exit (SIGKILL
    /// after 10 s), and starts it again.
    pub async fn restart_cleanly(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            let until = std::time::Instant::now() + Duration::from_secs(10);
            while child.try_wait().ok().flatten().is_none() {
                if std::time::Instant::now() >= until {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        self.launch().await;
    }

    /// Points a crius config at this containerd.
    pub fn configure(&self, config: &mut Config) {
        config.containerd.address = self.address.clone();
        config.containerd.root = self.root.clone();
    }
}

impl Drop for PrivateContainerd {
    fn drop(&mut self) {
        self.kill();
        clean_up_containerd_dir(&self.dir, &self.address);
    }
}

/// Starts containerd with `<dir>/config.toml`, logging to `<dir>/log`.
pub fn spawn_containerd(dir: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("log"))
        .expect("containerd log");
    Command::new("containerd")
        .arg("--config")
        .arg(dir.join("config.toml"))
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("spawn containerd")
}

/// After a test's own containerd is gone: its shims (they name its socket) and what they
/// run, the mounts below its directory, and the directory.
pub fn clean_up_containerd_dir(dir: &Path, address: &Path) {
    kill_shims_and_containers(&format!("containerd-shim.*-address {}", address.display()));
    let _ = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "grep ' {0}' /proc/mounts | cut -d' ' -f2 | sort -r | xargs -r -n1 umount -l",
            dir.display()
        ))
        .status();
    let _ = std::fs::remove_dir_all(dir);
}

/// Kills the shims whose command line matches `pattern` and, first, the container processes
/// they parent: without their shim those would run on, reparented to init.
pub fn kill_shims_and_containers(pattern: &str) {
    let Ok(out) = Command::new("pgrep").args(["-f", pattern]).output() else {
        return;
    };
    for shim in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        let _ = Command::new("pkill").args(["-9", "-P", shim]).status();
        let _ = Command::new("kill").args(["-9", shim]).status();
    }
}

/// Processes whose whole command line is `/pause` (a pause container's).
pub fn pause_processes() -> usize {
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == b"/pause\0"))
                .count()
        })
        .unwrap_or(0)
}
