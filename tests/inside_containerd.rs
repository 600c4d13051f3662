//! crius inside containerd 2.x: containerd's own CRI runs pods on crius's shim, which holds
//! each pod itself (no pause container, no runc shim), with the shim as the handler's
//! sandboxer, or with crius as a `sandbox` proxy plugin starting the shims. Driven with
//! crius's CRI client against containerd's CRI socket; only against containerd 2.x (1.6 has
//! no sandbox API).

mod common;

use std::time::Duration;

use common::Crius;
use common::cri_containerd::{
    CriContainerd, DYNAMIC_SHIM_HANDLER, PROXY_HANDLER, SHIM_HANDLER, dynamic_shim_binary,
};
use common::pod::{Pod, container, pull};
use common::{containerd_major, eventually, pause_processes, pod_config};
use crius::api::v1::{
    Capability, ContainerState, ContainerStatusRequest, DnsConfig, IdMapping, LinuxContainerConfig,
    LinuxContainerSecurityContext, LinuxPodSandboxConfig, LinuxSandboxSecurityContext,
    NamespaceMode, NamespaceOption, PodSandboxConfig, PodSandboxState, PodSandboxStatusRequest,
    RunPodSandboxRequest, StopPodSandboxRequest, UserNamespace,
};

fn skip_before_containerd_2() -> bool {
    if containerd_major() < 2 {
        eprintln!("containerd 1.x has no sandbox API: skipped");
        return true;
    }
    false
}

/// Runs a pod of two containers through `handler` and checks what containerd's CRI and
/// the pod's containers see.
async fn run_pod(cricd: &CriContainerd, handler: &str, logs: &std::path::Path) -> Pod {
    let mut client = cricd.client().await;
    pull(&mut client, "busybox:latest").await;
    let mut config = pod_config(&format!("inside-{handler}"));
    config.hostname = "inside-pod".into();
    config.log_directory = logs.display().to_string();
    if let Some(linux) = config.linux.as_mut() {
        linux
            .sysctls
            .insert("kernel.shm_rmid_forced".into(), "1".into());
        linux.cgroup_parent = cgroup_parent(handler);
    }
    config.dns_config = Some(DnsConfig {
        servers: vec!["10.9.9.9".into()],
        searches: vec!["inside.test".into()],
        options: vec![],
    });
    let mut request = tonic::Request::new(RunPodSandboxRequest {
        config: Some(config.clone()),
        runtime_handler: handler.to_string(),
    });
    request.set_timeout(Duration::from_secs(120));
    let id = client
        .runtime
        .run_pod_sandbox(request)
        .await
        .unwrap_or_else(|e| panic!("run a pod on {handler}: {e}\n{}", cricd.log()))
        .into_inner()
        .pod_sandbox_id;
    Pod { client, id, config }
}

/// A pod in a user namespace of `mode`, container root mapped to host ID 200000.
fn userns_pod_config(name: &str, mode: NamespaceMode) -> PodSandboxConfig {
    let mapping = vec![IdMapping {
        host_id: 200_000,
        container_id: 0,
        length: 65536,
    }];
    let mut config = pod_config(name);
    config.linux = Some(LinuxPodSandboxConfig {
        security_context: Some(LinuxSandboxSecurityContext {
            namespace_options: Some(NamespaceOption {
                userns_options: Some(UserNamespace {
                    mode: mode as i32,
                    uids: mapping.clone(),
                    gids: mapping,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    config
}

fn cgroup_parent(handler: &str) -> String {
    format!("/crius-inside-{handler}-{}", std::process::id())
}

/// The pid of the holder of the pod whose shim names `address`.
fn holder_pid(cricd: &CriContainerd) -> Option<u32> {
    let shims = cricd.shims("containerd-shim-crius-v2");
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let parent = stat
                .rfind(')')
                .and_then(|i| stat[i + 2..].split_whitespace().nth(1)?.parse::<u32>().ok());
            cmdline.ends_with(b"\0pause\0") && parent.is_some_and(|p| shims.contains(&p))
        })
}

async fn container_state(pod: &mut Pod, id: &str) -> i32 {
    pod.client
        .runtime
        .container_status(ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: false,
        })
        .await
        .expect("container status")
        .into_inner()
        .status
        .expect("status")
        .state
}

async fn pod_state(pod: &mut Pod) -> i32 {
    pod.client
        .runtime
        .pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: pod.id.clone(),
            verbose: false,
        })
        .await
        .expect("pod status")
        .into_inner()
        .status
        .expect("status")
        .state
}

async fn exec_ok(pod: &mut Pod, id: &str, cmd: &[&str]) -> String {
    let (out, err, code) = pod.exec(id, cmd, 20).await.expect("exec");
    assert_eq!(code, 0, "{cmd:?}: {err}");
    out
}

/// Two containers share the pod's namespaces and files; no runc shim nor pause container.
async fn check_pod_of_two(cricd: &CriContainerd, pod: &mut Pod) -> (String, String) {
    let pauses_before = pause_processes();
    let one = pod
        .run(container(
            "one",
            "busybox:latest",
            &["sh", "-c", "echo hello from one; exec sleep 1000"],
        ))
        .await;
    let two = pod
        .run(container("two", "busybox:latest", &["sleep", "1000"]))
        .await;

    // PID 1 of the pod is the shim's holder, and both see each other.
    let init = exec_ok(pod, &one, &["cat", "/proc/1/cmdline"]).await;
    assert!(init.contains("containerd-shim-crius-v2"), "pid 1: {init:?}");
    let ps = exec_ok(pod, &two, &["ps", "-o", "args"]).await;
    assert!(ps.contains("sleep 1000") && ps.lines().count() >= 4, "{ps}");
    // The pod's hostname, DNS and /dev/shm.
    assert_eq!(exec_ok(pod, &one, &["hostname"]).await.trim(), "inside-pod");
    assert_eq!(
        exec_ok(pod, &two, &["cat", "/etc/hostname"]).await.trim(),
        "inside-pod"
    );
    let resolv = exec_ok(pod, &two, &["cat", "/etc/resolv.conf"]).await;
    assert!(
        resolv.contains("nameserver 10.9.9.9") && resolv.contains("search inside.test"),
        "{resolv}"
    );
    exec_ok(pod, &one, &["sh", "-c", "echo shared > /dev/shm/mark"]).await;
    let sysctl = exec_ok(pod, &two, &["cat", "/proc/sys/kernel/shm_rmid_forced"]).await;
    assert_eq!(sysctl.trim(), "1", "the pod's sysctl");
    assert_eq!(
        exec_ok(pod, &two, &["cat", "/dev/shm/mark"]).await.trim(),
        "shared"
    );
    check_holder_is_shut_in(pod).await;

    // The pod's own network: an address on eth0 from containerd's CNI.
    let addr = exec_ok(pod, &two, &["ip", "-4", "addr", "show", "eth0"]).await;
    assert!(
        addr.contains(&format!("inet {}", cricd.subnet_prefix)),
        "{addr}"
    );

    // The holder is in the pod's cgroup, below the pod's cgroup parent.
    let holder = holder_pid(cricd).expect("the pod's holder");
    let cgroups = std::fs::read_to_string(format!("/proc/{holder}/cgroup")).expect("cgroup");
    let parent = pod
        .config
        .linux
        .as_ref()
        .map(|l| l.cgroup_parent.clone())
        .unwrap_or_default();
    assert!(
        cgroups.contains(&format!("{parent}/{}", pod.id)),
        "holder's cgroups: {cgroups}"
    );

    // Its log, written by containerd's CRI from the shim's stdio.
    let log = pod.log_path("one");
    let logged =
        eventually(Duration::from_secs(10), || {
            let log = log.clone();
            async move {
                std::fs::read_to_string(&log).is_ok_and(|t| t.contains("stdout F hello from one"))
            }
        })
        .await;
    assert!(logged, "log of one: {:?}", std::fs::read_to_string(&log));

    assert!(
        cricd.shims("containerd-shim-runc-v2").is_empty(),
        "a runc shim ran for the pod"
    );
    assert!(
        !cricd.shims("containerd-shim-crius-v2").is_empty(),
        "crius's shim runs"
    );
    assert_eq!(pause_processes(), pauses_before, "a pause container ran");
    (one, two)
}

/// A container that may trace what it sees (CAP_SYS_PTRACE) finds nothing of the node
/// through the pod's PID 1, the shim's holder: its root is an empty read-only directory, and
/// it holds no capability it could lend.
async fn check_holder_is_shut_in(pod: &mut Pod) {
    let mut tracer = container("tracer", "busybox:latest", &["sleep", "1000"]);
    tracer.linux = Some(LinuxContainerConfig {
        security_context: Some(LinuxContainerSecurityContext {
            capabilities: Some(Capability {
                add_capabilities: vec!["SYS_PTRACE".into()],
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let tracer = pod.run(tracer).await;
    let root = exec_ok(pod, &tracer, &["ls", "-A", "/proc/1/root/"]).await;
    assert_eq!(root.trim(), "", "the holder's root shows the node's files");
    let (_, err, code) = pod
        .exec(&tracer, &["touch", "/proc/1/root/planted"], 20)
        .await
        .expect("exec");
    assert_ne!(code, 0, "wrote into the holder's root");
    assert!(err.contains("Read-only"), "{err}");
    let status = exec_ok(pod, &tracer, &["cat", "/proc/1/status"]).await;
    for (field, value) in [
        ("CapPrm", "0000000000000000"),
        ("CapEff", "0000000000000000"),
        ("CapBnd", "0000000000000000"),
        ("NoNewPrivs", "1"),
    ] {
        assert!(
            status
                .lines()
                .any(|l| l.starts_with(&format!("{field}:")) && l.trim_end().ends_with(value)),
            "holder's {field} is not {value}: {status}"
        );
    }
    pod.stop(&tracer, 5).await;
    pod.remove(&tracer).await;
}

async fn stop_and_remove(cricd: &CriContainerd, mut pod: Pod, containers: &[String]) {
    let handler = pod
        .config
        .metadata
        .as_ref()
        .map(|m| m.name.trim_start_matches("inside-").to_string())
        .unwrap_or_default();
    for id in containers {
        pod.stop(id, 5).await;
        assert_eq!(
            container_state(&mut pod, id).await,
            ContainerState::ContainerExited as i32
        );
        pod.remove(id).await;
    }
    pod.client
        .runtime
        .stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: pod.id.clone(),
        })
        .await
        .expect("stop pod");
    assert_eq!(
        pod_state(&mut pod).await,
        PodSandboxState::SandboxNotready as i32
    );
    pod.remove_pod().await;
    let gone = eventually(Duration::from_secs(10), || async {
        cricd.shims("containerd-shim-crius-v2").is_empty()
    })
    .await;
    assert!(gone, "the pod's shim outlived its removal");
    common::remove_cgroup(&cgroup_parent(&handler));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerds_cri_runs_a_pod_on_crius_shim_as_its_sandboxer() {
    if skip_before_containerd_2() {
        return;
    }
    let logs = tempfile::tempdir().expect("log dir");
    let mut cricd = CriContainerd::start(160).await;
    let mut pod = run_pod(&cricd, SHIM_HANDLER, logs.path()).await;
    assert_eq!(
        pod_state(&mut pod).await,
        PodSandboxState::SandboxReady as i32
    );
    let (one, two) = check_pod_of_two(&cricd, &mut pod).await;

    // containerd restarts: the pod and its containers run on, and are driven again.
    cricd.restart().await;
    pod.client = cricd.client().await;
    assert_eq!(
        pod_state(&mut pod).await,
        PodSandboxState::SandboxReady as i32
    );
    for id in [&one, &two] {
        assert_eq!(
            container_state(&mut pod, id).await,
            ContainerState::ContainerRunning as i32
        );
    }
    assert_eq!(
        exec_ok(&mut pod, &two, &["cat", "/dev/shm/mark"])
            .await
            .trim(),
        "shared"
    );

    stop_and_remove(&cricd, pod, &[one, two]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerds_cri_runs_a_pod_through_crius_as_its_sandbox_proxy_plugin() {
    if skip_before_containerd_2() {
        return;
    }
    let logs = tempfile::tempdir().expect("log dir");
    let mut cricd = CriContainerd::start(161).await;
    let proxy = cricd.proxy_socket.clone();
    let address = cricd.address.clone();
    let root = cricd.dir.join("root");
    let mut crius = Crius::start_with(
        |config| {
            config.sandbox_controller.address = proxy;
            config.containerd.address = address;
            config.containerd.root = root;
        },
        &[],
    )
    .await;
    let mut pod = run_pod(&cricd, PROXY_HANDLER, logs.path()).await;
    assert_eq!(
        pod_state(&mut pod).await,
        PodSandboxState::SandboxReady as i32
    );
    let bundle = crius
        .config
        .state
        .join("sandboxer")
        .join("k8s.io")
        .join(&pod.id);
    assert!(
        bundle.join("address").exists(),
        "the pod's bundle in crius's state"
    );
    let (one, two) = check_pod_of_two(&cricd, &mut pod).await;

    // crius restarts, then containerd: the pod runs on and both find its shim again.
    crius.restart().await;
    assert_eq!(
        pod_state(&mut pod).await,
        PodSandboxState::SandboxReady as i32
    );
    cricd.restart().await;
    pod.client = cricd.client().await;
    assert_eq!(
        pod_state(&mut pod).await,
        PodSandboxState::SandboxReady as i32
    );
    for id in [&one, &two] {
        assert_eq!(
            container_state(&mut pod, id).await,
            ContainerState::ContainerRunning as i32
        );
    }
    assert_eq!(
        exec_ok(&mut pod, &one, &["hostname"]).await.trim(),
        "inside-pod"
    );

    stop_and_remove(&cricd, pod, &[one, two]).await;
    assert!(!bundle.exists(), "the pod's bundle outlived its removal");
    assert!(
        crius.log().contains("sandbox controller"),
        "one line per call"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_in_its_own_user_namespace_is_held_in_it() {
    if skip_before_containerd_2() {
        return;
    }
    let logs = tempfile::tempdir().expect("log dir");
    let cricd = CriContainerd::start(162).await;
    let mut client = cricd.client().await;
    pull(&mut client, "busybox:latest").await;
    let mut config = userns_pod_config("inside-userns", NamespaceMode::Pod);
    config.log_directory = logs.path().display().to_string();
    let id = client
        .runtime
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: SHIM_HANDLER.to_string(),
        })
        .await
        .unwrap_or_else(|e| panic!("run a userns pod: {e}\n{}", cricd.log()))
        .into_inner()
        .pod_sandbox_id;
    let namespaces = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.clone());
    let mut pod = Pod { client, id, config };
    let mut sleeper = container("one", "busybox:latest", &["sleep", "1000"]);
    sleeper.linux = Some(LinuxContainerConfig {
        security_context: Some(LinuxContainerSecurityContext {
            namespace_options: namespaces,
            ..Default::default()
        }),
        ..Default::default()
    });
    let one = pod.run(sleeper).await;
    let map = exec_ok(&mut pod, &one, &["cat", "/proc/self/uid_map"]).await;
    let fields: Vec<&str> = map.split_whitespace().collect();
    assert_eq!(fields, ["0", "200000", "65536"], "{map}");
    let init = exec_ok(&mut pod, &one, &["cat", "/proc/1/cmdline"]).await;
    assert!(init.contains("containerd-shim-crius-v2"), "pid 1: {init:?}");
    // The image's files are root's inside: its layers are idmapped by the pod's namespace.
    let owner = exec_ok(&mut pod, &one, &["stat", "-c", "%u:%g", "/bin/busybox"]).await;
    assert_eq!(owner.trim(), "0:0");
    stop_and_remove(&cricd, pod, &[one]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_the_shim_refuses_leaves_no_shim_behind() {
    if skip_before_containerd_2() {
        return;
    }
    let cricd = CriContainerd::start(163).await;
    let proxy = cricd.proxy_socket.clone();
    let address = cricd.address.clone();
    let root = cricd.dir.join("root");
    let _crius = Crius::start_with(
        |config| {
            config.sandbox_controller.address = proxy;
            config.containerd.address = address;
            config.containerd.root = root;
        },
        &[],
    )
    .await;
    let mut client = cricd.client().await;
    for handler in [SHIM_HANDLER, PROXY_HANDLER] {
        let config = userns_pod_config(&format!("refused-{handler}"), NamespaceMode::Container);
        let refused = client
            .runtime
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: handler.to_string(),
            })
            .await
            .expect_err("a pod user namespace of mode CONTAINER");
        assert!(
            refused
                .message()
                .contains("unsupported user namespace mode"),
            "{handler}: {refused:?}"
        );
        let gone = eventually(Duration::from_secs(10), || async {
            cricd.shims("containerd-shim-crius-v2").is_empty()
        })
        .await;
        assert!(gone, "{handler}: the refused pod's shim stayed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_pod_whose_shim_died_while_crius_was_down_becomes_not_ready() {
    if skip_before_containerd_2() {
        return;
    }
    let logs = tempfile::tempdir().expect("log dir");
    let cricd = CriContainerd::start(164).await;
    let proxy = cricd.proxy_socket.clone();
    let address = cricd.address.clone();
    let root = cricd.dir.join("root");
    let mut crius = Crius::start_with(
        |config| {
            config.sandbox_controller.address = proxy;
            config.containerd.address = address;
            config.containerd.root = root;
        },
        &[],
    )
    .await;
    let mut pod = run_pod(&cricd, PROXY_HANDLER, logs.path()).await;
    assert_eq!(
        pod_state(&mut pod).await,
        PodSandboxState::SandboxReady as i32
    );

    // crius goes down, and the pod's shim dies with its holder while it is away.
    crius.kill().await;
    common::kill_shims_and_containers(&format!(
        "containerd-shim-crius-v2.*-address {}",
        cricd.address.display()
    ));
    crius.restart_after_crash().await;
    // containerd's retried Wait now learns the pod is gone.
    let not_ready = eventually(Duration::from_secs(20), || {
        let mut client = pod.client.clone();
        let id = pod.id.clone();
        async move {
            client
                .runtime
                .pod_sandbox_status(PodSandboxStatusRequest {
                    pod_sandbox_id: id,
                    verbose: false,
                })
                .await
                .ok()
                .and_then(|r| r.into_inner().status)
                .is_some_and(|s| s.state == PodSandboxState::SandboxNotready as i32)
        }
    })
    .await;
    assert!(not_ready, "the pod whose shim died stayed ready");
    pod.client
        .runtime
        .stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: pod.id.clone(),
        })
        .await
        .expect("stop pod");
    let bundle = crius
        .config
        .state
        .join("sandboxer")
        .join("k8s.io")
        .join(&pod.id);
    pod.remove_pod().await;
    assert!(
        !bundle.exists(),
        "the dead shim's bundle (and its /dev/shm) outlived the pod"
    );
    common::remove_cgroup(&cgroup_parent(PROXY_HANDLER));
}

/// A shim built the ordinary way (`cargo build`, linked dynamically) cannot hold a pod: the
/// holder runs inside an empty root with no loader. The pod fails at once with an error
/// that says which shim to install, and leaves no shim behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dynamically_linked_shim_refuses_pods_saying_what_to_install() {
    if skip_before_containerd_2() {
        return;
    }
    let shim = dynamic_shim_binary();
    let kind = std::process::Command::new("file")
        .arg("-L")
        .arg(&shim)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    assert!(
        kind.contains("dynamically linked"),
        "the test bed builds a dynamic shim at {}: {kind}",
        shim.display()
    );
    let cricd = CriContainerd::start(165).await;
    let mut client = cricd.client().await;
    pull(&mut client, "busybox:latest").await;
    let mut request = tonic::Request::new(RunPodSandboxRequest {
        config: Some(pod_config("inside-dynamic")),
        runtime_handler: DYNAMIC_SHIM_HANDLER.to_string(),
    });
    request.set_timeout(Duration::from_secs(60));
    let refused = client
        .runtime
        .run_pod_sandbox(request)
        .await
        .expect_err("a dynamic shim holds no pod");
    let message = refused.message();
    assert!(
        message.contains("linked dynamically") && message.contains("static shim"),
        "{refused:?}"
    );
    let gone = eventually(Duration::from_secs(10), || async {
        cricd.shims("containerd-shim-crius-v2").is_empty()
    })
    .await;
    assert!(gone, "the refusing shim stayed");
}
