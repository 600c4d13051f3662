//! crius's own shim (`containerd-shim-crius-v2`, the default handler) under the real
//! containerd: one process per pod parenting all its containers, the task verbs crius does
//! not call itself (through containerd, as other clients would), the cleanup containerd
//! does when a shim dies, and containerd's Go shim kept as a handler.

mod common;

use std::process::Command;
use std::time::Duration;

use common::pod::{Pod, container, host_network_pod_config, pod, pod_on, pod_with};
use common::{Crius, TestNetwork, eventually, pause_processes};
use crius::api::v1::ContainerState;

const CRIUS_SHIM: &str = "containerd-shim-crius-v2";
const GO_SHIM: &str = "containerd-shim-runc-v2";

/// The serving shims (not their short-lived `start`/`delete` runs) of this crius's
/// namespace.
fn shims(crius: &Crius, binary: &str) -> Vec<i32> {
    let pattern = format!(
        "{binary} -namespace {} .*-address {}",
        crius.config.containerd.namespace,
        crius.config.containerd.address.display()
    );
    let out = Command::new("pgrep")
        .args(["-f", &pattern])
        .output()
        .expect("pgrep");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .filter(|pid| !is_action(*pid))
        .collect()
}

/// Whether a shim process is a `start` or `delete` run rather than a serving shim.
fn is_action(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            let last = c
                .split(|b| *b == 0)
                .rfind(|a| !a.is_empty())
                .unwrap_or_default()
                .to_vec();
            last == b"start" || last == b"delete"
        })
        .unwrap_or(true)
}

fn parent_of(pid: u64) -> i32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|p| p.trim().parse().ok())
        .expect("PPid")
}

/// Whether the cgroup of `pid` is frozen (cgroup v1 freezer, else v2's cgroup.freeze).
fn frozen(pid: u64) -> bool {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("proc cgroup");
    let path_of = |controller: &str| {
        cgroups.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            (controllers == controller).then(|| path.to_string())
        })
    };
    if let Some(path) = path_of("freezer") {
        let state = std::fs::read_to_string(format!("/sys/fs/cgroup/freezer{path}/freezer.state"))
            .expect("freezer.state");
        return state.trim() == "FROZEN";
    }
    let path = path_of("").expect("a cgroup v2 path");
    std::fs::read_to_string(format!("/sys/fs/cgroup{path}/cgroup.freeze"))
        .map(|s| s.trim() == "1")
        .expect("cgroup.freeze")
}

async fn container_pid(pod: &mut Pod, id: &str) -> u64 {
    let (_, info) = pod.status(id).await;
    info["pid"].as_u64().expect("pid in the verbose info")
}

async fn shim_count_becomes(crius: &Crius, binary: &str, count: usize) -> bool {
    eventually(Duration::from_secs(10), || async move {
        shims(crius, binary).len() == count
    })
    .await
}

#[tokio::test]
async fn one_shim_per_pod_parents_all_of_its_containers() {
    let crius = Crius::start().await;
    let mut first = pod(&crius, "shim-one").await;
    let a = first
        .run(container("a", "busybox:latest", &["sleep", "1000"]))
        .await;
    let b = first
        .run(container("b", "busybox:latest", &["sleep", "1000"]))
        .await;
    let mut second = pod(&crius, "shim-two").await;
    let c = second
        .run(container("c", "busybox:latest", &["sleep", "1000"]))
        .await;

    let running = shims(&crius, CRIUS_SHIM);
    assert_eq!(running.len(), 2, "one shim per pod: {running:?}");
    assert!(shims(&crius, GO_SHIM).is_empty(), "the Go shim is not used");
    let parent_a = parent_of(container_pid(&mut first, &a).await);
    let parent_b = parent_of(container_pid(&mut first, &b).await);
    let parent_c = parent_of(container_pid(&mut second, &c).await);
    assert_eq!(parent_a, parent_b, "one pod, one shim");
    assert_ne!(parent_a, parent_c, "another pod, another shim");
    assert!(running.contains(&parent_a) && running.contains(&parent_c));

    // An exec ended by a real-time signal is an exit like any other (128 + the signal).
    let (_, _, code) = first
        .exec(&a, &["sh", "-c", "kill -40 $$"], 10)
        .await
        .expect("exec");
    assert_eq!(code, 128 + 40);
    // An exec that cannot start fails at once, and the next one works.
    let err = first.exec(&a, &["/no/such/program"], 10).await;
    assert!(
        err.as_ref().map(|(_, _, code)| *code != 0).unwrap_or(true),
        "{err:?}"
    );
    let (out, _, code) = first.exec(&a, &["echo", "ok"], 10).await.expect("exec");
    assert_eq!((out.as_str(), code), ("ok\n", 0));

    // A container's exit reaches crius through the shim's events, with its code.
    let quitter = first
        .run(container(
            "quitter",
            "busybox:latest",
            &["sh", "-c", "exit 7"],
        ))
        .await;
    let status = first.wait_exited(&quitter).await;
    assert_eq!(status.exit_code, 7);
    assert_eq!(shims(&crius, CRIUS_SHIM).len(), 2, "an exit ends no shim");

    // The shim of a removed pod exits; the other stays.
    first.remove_pod().await;
    assert!(shim_count_becomes(&crius, CRIUS_SHIM, 1).await);
    assert_eq!(shims(&crius, CRIUS_SHIM), vec![parent_c]);
    second.remove_pod().await;
    assert!(shim_count_becomes(&crius, CRIUS_SHIM, 0).await);
}

#[tokio::test]
async fn pause_resume_pids_metrics_and_checkpoint_through_containerd() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "shim-verbs").await;
    let id = pod
        .run(container("app", "busybox:latest", &["sleep", "1000"]))
        .await;
    let pid = container_pid(&mut pod, &id).await;
    let state = |crius: &Crius| {
        crius
            .ctr(&["tasks", "ls"])
            .lines()
            .find(|l| l.starts_with(&id))
            .map(|l| l.split_whitespace().last().unwrap_or_default().to_string())
            .unwrap_or_default()
    };

    crius.ctr(&["tasks", "pause", &id]);
    assert_eq!(state(&crius), "PAUSED");
    assert!(frozen(pid), "runc did not freeze the container's cgroup");
    // The shim's exec refuses a frozen container in runc's words, and nothing joins it.
    let refused = pod
        .exec(&id, &["true"], 10)
        .await
        .expect_err("an exec into a paused container");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(
        refused
            .message()
            .contains("cannot exec in a paused container"),
        "{refused:?}"
    );
    crius.ctr(&["tasks", "resume", &id]);
    assert_eq!(state(&crius), "RUNNING");
    assert!(!frozen(pid), "runc did not thaw the container's cgroup");

    let ps = crius.ctr(&["tasks", "ps", &id]);
    assert!(ps.contains(&pid.to_string()), "{ps}");

    let metrics = crius.ctr(&["tasks", "metrics", "--format", "json", &id]);
    let metrics: serde_json::Value = serde_json::from_str(&metrics).expect("metrics JSON");
    assert!(
        metrics["memory"]["usage"]["usage"].as_u64().unwrap_or(0) > 0
            || metrics["memory"]["usage"].as_u64().unwrap_or(0) > 0,
        "{metrics}"
    );
    assert_eq!(metrics["pids"]["current"], 1, "{metrics}");

    // An exec shows up in the pids with its exec id.
    let (out, _, code) = pod
        .exec(&id, &["sh", "-c", "echo $$"], 10)
        .await
        .expect("exec");
    assert_eq!(code, 0);
    assert!(out.trim().parse::<u32>().is_ok(), "{out}");

    // A checkpoint runs runc and CRIU, and leaves the container running. Bookworm's CRIU
    // 3.17 cannot dump on newer kernels (it rejects their vDSO); then the shim reports
    // CRIU's failure, with its log, as containerd's Go shim does.
    let dir = crius.dir.path().join("checkpoint");
    let out = Command::new("ctr")
        .arg("--address")
        .arg(&crius.config.containerd.address)
        .args(["-n", &crius.config.containerd.namespace])
        .args(["tasks", "checkpoint", "--image-path"])
        .arg(&dir)
        .arg(&id)
        .output()
        .expect("ctr");
    if out.status.success() {
        let images = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
        assert!(images > 0, "no checkpoint written in {}", dir.display());
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("criu failed") && err.contains("dump.log"),
            "checkpoint failed otherwise than in CRIU: {err}"
        );
    }
    assert_eq!(state(&crius), "RUNNING");
    pod.remove_pod().await;
}

/// The pod's holder: its pid (from the pod's verbose status), which must be the shim's
/// child running `<shim> pause`, and the cgroup directory (cpu hierarchy) it sits in.
async fn holder_of(pod: &mut Pod, crius: &Crius) -> (u64, std::path::PathBuf) {
    let mut status = pod
        .client
        .runtime
        .pod_sandbox_status(crius::api::v1::PodSandboxStatusRequest {
            pod_sandbox_id: pod.id.clone(),
            verbose: true,
        })
        .await
        .expect("pod status")
        .into_inner();
    let info: serde_json::Value =
        serde_json::from_str(&status.info.remove("info").expect("verbose info")).expect("JSON");
    assert_eq!(info["held"], true, "{info}");
    assert_eq!(info["snapshotKey"], "", "{info}");
    let pid = info["pid"].as_u64().expect("pid");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("holder cmdline");
    assert!(cmdline.ends_with(b"\0pause\0"), "{cmdline:?}");
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
    let cpu = cgroups
        .lines()
        .find_map(|l| {
            let (_, rest) = l.split_once(':')?;
            let (controllers, path) = rest.split_once(':')?;
            controllers
                .split(',')
                .any(|c| c == "cpu")
                .then(|| path.to_string())
        })
        .expect("a cpu cgroup");
    let expected = format!("/{}/{}", crius.config.containerd.namespace, pod.id);
    assert_eq!(
        cpu, expected,
        "the holder's cgroup is the pod's cgroups path"
    );
    (
        pid,
        std::path::PathBuf::from(format!("/sys/fs/cgroup/cpu{cpu}")),
    )
}

#[tokio::test]
async fn the_shim_holds_the_pod_without_a_pause_container() {
    let mut network = None;
    let crius = Crius::start_with(|c| network = Some(TestNetwork::install(c, 122)), &[]).await;
    let pauses = pause_processes();
    let mut pod = pod_with(&crius, common::pod_config("shim-held")).await;
    let id = pod
        .run(container("app", "busybox:latest", &["sleep", "1000"]))
        .await;
    let (holder, cgroup) = holder_of(&mut pod, &crius).await;
    assert_eq!(pause_processes(), pauses, "a pause container ran");
    assert_eq!(
        std::fs::read_to_string(cgroup.join("cpu.shares"))
            .expect("cpu.shares")
            .trim(),
        "2",
        "the sandbox spec's CPU shares"
    );
    // It is the pod's PID 1, and the app shares its network.
    let (init, _, _) = pod
        .exec(&id, &["cat", "/proc/1/cmdline"], 10)
        .await
        .expect("exec");
    assert!(init.contains(CRIUS_SHIM), "pid 1: {init:?}");
    let link = |pid: String| std::fs::read_link(format!("/proc/{pid}/ns/net")).expect("netns");
    let app = container_pid(&mut pod, &id).await;
    assert_eq!(link(holder.to_string()), link(app.to_string()));
    // No rootfs was prepared for it, and what a runtime does to a container is refused.
    let snapshots = crius.ctr(&["snapshots", "ls"]);
    assert!(!snapshots.contains(&pod.id), "{snapshots}");
    let out = Command::new("ctr")
        .arg("--address")
        .arg(&crius.config.containerd.address)
        .args(["-n", &crius.config.containerd.namespace])
        .args(["tasks", "pause", &pod.id])
        .output()
        .expect("ctr");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("it is not a container"),
        "a held pod was paused, or not refused as held: {err}"
    );
    pod.remove_pod().await;
    assert!(!cgroup.exists(), "the holder's cgroup was left");
    assert!(
        !std::path::Path::new(&format!("/proc/{holder}")).exists(),
        "the holder outlived its pod"
    );
    drop(network);
}

#[tokio::test]
async fn a_killed_shim_is_cleaned_up_and_its_containers_exit() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "shim-killed").await;
    let id = pod
        .run(container("app", "busybox:latest", &["sleep", "1000"]))
        .await;
    let pid = container_pid(&mut pod, &id).await;
    let shim = parent_of(pid);
    assert!(shims(&crius, CRIUS_SHIM).contains(&shim));
    let (holder, holder_cgroup) = holder_of(&mut pod, &crius).await;

    Command::new("kill")
        .args(["-9", &shim.to_string()])
        .status()
        .expect("kill");
    // containerd runs the shim's `delete` action: the container is force-deleted, and its
    // exit (137) reaches crius.
    let status = pod.wait_exited(&id).await;
    assert_eq!(status.exit_code, 137, "{status:?}");
    let gone = eventually(Duration::from_secs(10), || async move {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.contains(") Z "))
            .unwrap_or(true)
    })
    .await;
    assert!(gone, "the container process outlived its shim");
    // The pod's holder too (containerd runs `delete` for the pod's task as well).
    let holder_gone = eventually(Duration::from_secs(10), || {
        let cgroup = holder_cgroup.clone();
        async move {
            let ended = std::fs::read_to_string(format!("/proc/{holder}/stat"))
                .map(|s| s.contains(") Z "))
                .unwrap_or(true);
            ended && !cgroup.exists()
        }
    })
    .await;
    assert!(
        holder_gone,
        "the pod's holder or its cgroup outlived its shim"
    );
    let mounts = std::fs::read_to_string("/proc/mounts").expect("mounts");
    assert!(
        !mounts
            .lines()
            .any(|l| l.contains(&id) && l.contains("rootfs")),
        "the rootfs stayed mounted"
    );
    pod.remove_pod().await;
    assert!(!crius.ctr(&["tasks", "ls"]).contains(&id));
    assert!(!crius.ctr(&["containers", "ls", "-q"]).contains(&id));
}

#[tokio::test]
async fn containerds_go_shim_stays_a_handler() {
    let crius = Crius::start().await;
    let config = host_network_pod_config("go-shim");
    let mut pod = pod_on(&crius, config, "containerd-runc").await;
    let id = pod
        .run(container("app", "busybox:latest", &["sleep", "1000"]))
        .await;
    let (out, _, code) = pod.exec(&id, &["echo", "hi"], 10).await.expect("exec");
    assert_eq!((out.as_str(), code), ("hi\n", 0));
    let pid = container_pid(&mut pod, &id).await;
    let go = shims(&crius, GO_SHIM);
    assert!(go.contains(&parent_of(pid)), "{go:?}");
    assert!(shims(&crius, CRIUS_SHIM).is_empty());
    let (status, _) = pod.status(&id).await;
    assert_eq!(status.state, ContainerState::ContainerRunning as i32);
    pod.remove_pod().await;
}

/// containerd 2.x asks `-info` before it checks a spec against the runtime's features
/// (idmapped mounts): the shim's name, and the OCI runtime's `features` when it answers.
#[test]
fn info_reports_the_runtimes_features() {
    let info = |options: Option<prost_types::Any>| {
        let mut child = std::process::Command::new(CRIUS_SHIM)
            .arg("-info")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("run the shim");
        let input = options
            .map(|o| prost::Message::encode_to_vec(&o))
            .unwrap_or_default();
        std::io::Write::write_all(child.stdin.as_mut().expect("stdin"), &input).expect("write");
        drop(child.stdin.take());
        let out = child.wait_with_output().expect("info");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let runc = info(None);
    assert!(runc.contains("io.containerd.crius.v2"), "{runc:?}");
    assert!(
        runc.contains("runtime-spec/1/features/Features"),
        "{runc:?}"
    );
    assert!(runc.contains("ociVersionMin"), "{runc:?}");

    let missing = crius::protos::runc::Options {
        binary_name: "/nonexistent/crius-test-runtime".into(),
        ..Default::default()
    };
    let none = info(Some(prost_types::Any {
        type_url: "containerd.runc.v1.Options".into(),
        value: prost::Message::encode_to_vec(&missing),
    }));
    assert!(none.contains("io.containerd.crius.v2"), "{none:?}");
    assert!(!none.contains("features/Features"), "{none:?}");
}

/// Answers `call` within a second, or fails naming `what`.
async fn within_a_second<T>(what: &str, call: impl Future<Output = Result<T, tonic::Status>>) -> T {
    match tokio::time::timeout(Duration::from_secs(1), call).await {
        Ok(Ok(value)) => value,
        Ok(Err(e)) => panic!("{what} failed while another pod's shim hangs: {e}"),
        Err(_) => panic!("{what} took over a second while another pod's shim hangs"),
    }
}

/// A pod whose shim hangs (stopped with SIGSTOP: every task call to it waits) holds up no
/// other pod: while a StopContainer and an ExecSync into it hang, the List, Status and stats
/// RPCs answer within a second, for it and for the others, and the other pod still runs
/// execs and new containers.
#[tokio::test]
async fn a_hung_shim_blocks_no_other_pod() {
    use crius::api::v1::{
        ContainerStatusRequest, ExecSyncRequest, ListContainerStatsRequest, ListContainersRequest,
        ListPodSandboxRequest, ListPodSandboxStatsRequest, PodSandboxStatusRequest, StatusRequest,
        StopContainerRequest,
    };
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    let crius = Crius::start().await;
    let mut stuck = pod(&crius, "shim-stuck").await;
    let stuck_app = stuck
        .run(container("app", "busybox:latest", &["sleep", "1000"]))
        .await;
    let mut healthy = pod(&crius, "shim-healthy").await;
    let healthy_app = healthy
        .run(container("app", "busybox:latest", &["sleep", "1000"]))
        .await;
    let shim = Pid::from_raw(parent_of(container_pid(&mut stuck, &stuck_app).await));
    assert!(shims(&crius, CRIUS_SHIM).contains(&shim.as_raw()));
    kill(shim, Signal::SIGSTOP).expect("stop the shim");

    let mut client = crius.client().await;
    let hung_stop = tokio::spawn({
        let mut client = client.clone();
        let id = stuck_app.clone();
        async move {
            client
                .runtime
                .stop_container(StopContainerRequest {
                    container_id: id,
                    timeout: 30,
                })
                .await
        }
    });
    let hung_exec = tokio::spawn({
        let mut client = client.clone();
        let id = stuck_app.clone();
        async move {
            client
                .runtime
                .exec_sync(ExecSyncRequest {
                    container_id: id,
                    cmd: vec!["true".to_string()],
                    timeout: 30,
                })
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !hung_stop.is_finished() && !hung_exec.is_finished(),
        "the calls into the stopped shim did not hang: the test proves nothing"
    );

    let runtime = &mut client.runtime;
    let containers = within_a_second(
        "ListContainers",
        runtime.list_containers(ListContainersRequest::default()),
    )
    .await
    .into_inner()
    .containers;
    assert!(containers.iter().any(|c| c.id == stuck_app));
    assert!(containers.iter().any(|c| c.id == healthy_app));
    let pods = within_a_second(
        "ListPodSandbox",
        runtime.list_pod_sandbox(ListPodSandboxRequest::default()),
    )
    .await
    .into_inner()
    .items;
    assert_eq!(pods.len(), 2, "{pods:?}");
    for id in [&stuck_app, &healthy_app] {
        let status = within_a_second(
            "ContainerStatus",
            runtime.container_status(ContainerStatusRequest {
                container_id: id.clone(),
                verbose: false,
            }),
        )
        .await
        .into_inner()
        .status
        .expect("status");
        assert_eq!(status.state, ContainerState::ContainerRunning as i32);
    }
    // The verbose status asks the shim for the pause task's state: unknown when it hangs.
    for (id, process) in [(&stuck.id, "unknown"), (&healthy.id, "running")] {
        let status = within_a_second(
            "PodSandboxStatus",
            runtime.pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.clone(),
                verbose: true,
            }),
        )
        .await
        .into_inner();
        let info: serde_json::Value = serde_json::from_str(&status.info["info"]).expect("info");
        assert_eq!(info["processStatus"], process, "{info}");
    }
    let stats = within_a_second(
        "ListContainerStats",
        runtime.list_container_stats(ListContainerStatsRequest::default()),
    )
    .await
    .into_inner()
    .stats;
    assert_eq!(stats.len(), 2, "{stats:?}");
    let pod_stats = within_a_second(
        "ListPodSandboxStats",
        runtime.list_pod_sandbox_stats(ListPodSandboxStatsRequest::default()),
    )
    .await
    .into_inner()
    .stats;
    assert_eq!(pod_stats.len(), 2, "{pod_stats:?}");
    within_a_second("Status", runtime.status(StatusRequest { verbose: true })).await;

    // The healthy pod's own shim still serves: an exec, and a new container.
    let (out, _, code) = healthy
        .exec(&healthy_app, &["echo", "alive"], 5)
        .await
        .expect("exec in the healthy pod");
    assert_eq!((out.as_str(), code), ("alive\n", 0));
    let late = tokio::time::timeout(
        Duration::from_secs(10),
        healthy.run(container("late", "busybox:latest", &["sleep", "1000"])),
    )
    .await
    .expect("a new container in the healthy pod took over 10 s");
    assert!(!hung_stop.is_finished(), "the stopped shim answered");

    // Let the shim go: the hung calls complete, and everything is torn down.
    kill(shim, Signal::SIGCONT).expect("continue the shim");
    let stopped = tokio::time::timeout(Duration::from_secs(40), hung_stop)
        .await
        .expect("StopContainer ended after the shim continued")
        .expect("stop task");
    assert!(stopped.is_ok(), "{stopped:?}");
    let _ = tokio::time::timeout(Duration::from_secs(40), hung_exec).await;
    healthy.stop(&late, 0).await;
    stuck.remove_pod().await;
    healthy.remove_pod().await;
}

/// A runc named `runc` (the shim starts containers and runs execs itself only for runc)
/// that logs the verbs it is asked for to `<dir>/verbs` (`kill --all` as `kill-all`), and crius with it as the
/// "counted" runtime handler (and as "counted-exec", whose execs all go to runc).
async fn crius_with_counting_runc(dir: &std::path::Path) -> Crius {
    let runc = dir.join("runc");
    std::fs::write(
        &runc,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do case $a in kill) case \" $* \" in *\" --all \"*) echo kill-all;; *) echo kill;; esac >> {verbs}; break;; create|start|exec|delete) echo $a >> {verbs}; break;; esac; done\nexec /usr/sbin/runc \"$@\"\n",
            verbs = dir.join("verbs").display()
        ),
    )
    .expect("write the runc wrapper");
    std::fs::set_permissions(&runc, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let runc = runc.display().to_string();
    Crius::start_with(
        |c| {
            let mut counted = c.containerd.runtimes["runc"].clone();
            counted.options.binary_name = runc;
            c.containerd
                .runtimes
                .insert("counted".into(), counted.clone());
            counted.exec_with_runtime = true;
            c.containerd.runtimes.insert("counted-exec".into(), counted);
        },
        &[],
    )
    .await
}

fn runc_verbs(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("verbs"))
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

/// The shim starts a container runc created as `runc start` would, without running a
/// second runc: a runc that logs its verbs is asked to create the container, never to
/// start it, and the container runs (runc's state says so, and an exec works in it).
#[tokio::test]
async fn runc_creates_and_the_shim_itself_starts_the_container() {
    let bin = tempfile::tempdir().expect("tempdir");
    let crius = crius_with_counting_runc(bin.path()).await;
    let mut pod = pod_on(&crius, host_network_pod_config("fifo-start"), "counted").await;
    let id = pod
        .run(container("app", "busybox:latest", &["sleep", "1000"]))
        .await;
    let (out, _, code) = pod.exec(&id, &["echo", "up"], 10).await.expect("exec");
    assert_eq!((out.as_str(), code), ("up\n", 0));
    let logged = runc_verbs(bin.path());
    assert_eq!(
        logged.iter().filter(|v| *v == "create").count(),
        1,
        "the app's create only (the shim holds the pod itself): {logged:?}"
    );
    assert!(
        !logged.iter().any(|v| v == "start"),
        "runc start was run: {logged:?}"
    );
    let state = Command::new("runc")
        .args([
            "--root",
            &format!("/run/containerd/runc/{}", crius.config.containerd.namespace),
            "state",
            &id,
        ])
        .output()
        .expect("runc state");
    let state = String::from_utf8_lossy(&state.stdout);
    assert!(state.contains("\"status\": \"running\""), "{state}");
    pod.remove_pod().await;
}

/// StopContainer signals a running container's init through the pidfd the shim took at
/// create, as `runc kill` without `--all` would, and runs no runc for it: the container
/// ends by the signal. (The `kill --all` of SIGKILL after the init's exit, for what is left
/// in a shared PID namespace, still goes to runc.)
#[tokio::test]
async fn the_shim_stops_a_running_container_without_running_runc_kill() {
    let bin = tempfile::tempdir().expect("tempdir");
    let crius = crius_with_counting_runc(bin.path()).await;
    let mut pod = pod_on(&crius, host_network_pod_config("pidfd-kill"), "counted").await;
    let id = pod
        .run(container("app", "busybox:latest", &["sleep", "1000"]))
        .await;
    pod.stop(&id, 1).await;
    let status = pod.wait_exited(&id).await;
    assert!(
        matches!(status.exit_code, 137 | 143),
        "not ended by SIGTERM or SIGKILL: {status:?}"
    );
    let logged = runc_verbs(bin.path());
    assert!(
        logged.iter().any(|v| v == "create"),
        "the counting runc was not used: {logged:?}"
    );
    assert!(
        !logged.iter().any(|v| v == "kill"),
        "runc kill was run: {logged:?}"
    );
    pod.remove_pod().await;
}

/// An exec whose spec asks nothing only runc does runs without runc (the shim's exec
/// helper), and its process is the one `runc exec` makes in the same container: the same
/// user, groups, capabilities, no_new_privs, umask, environment, working directory, cgroups
/// and namespaces. Its exit code and a program that is not there come back as with runc;
/// a container with a seccomp filter, or of a handler with `exec_with_runtime`, still gets
/// its execs from runc.
#[tokio::test]
async fn the_shim_execs_without_runc_the_process_runc_exec_makes() {
    use crius::api::v1::{
        Capability, KeyValue, LinuxContainerConfig, LinuxContainerSecurityContext, SecurityProfile,
        security_profile::ProfileType,
    };
    let bin = tempfile::tempdir().expect("tempdir");
    let crius = crius_with_counting_runc(bin.path()).await;
    let mut pod = pod_on(&crius, host_network_pod_config("direct-exec"), "counted").await;
    let mut app = container("app", "busybox:latest", &["sleep", "1000"]);
    app.working_dir = "/tmp".into();
    app.envs = [("A", "1"), ("B", "x=y"), ("A", "2")]
        .map(|(key, value)| KeyValue {
            key: key.into(),
            value: value.into(),
        })
        .to_vec();
    app.linux = Some(LinuxContainerConfig {
        security_context: Some(LinuxContainerSecurityContext {
            run_as_user: Some(crius::api::v1::Int64Value { value: 1000 }),
            run_as_group: Some(crius::api::v1::Int64Value { value: 2000 }),
            supplemental_groups: vec![3000],
            no_new_privs: true,
            capabilities: Some(Capability {
                add_capabilities: vec!["SYS_PTRACE".into()],
                drop_capabilities: vec!["NET_RAW".into()],
                add_ambient_capabilities: vec!["NET_BIND_SERVICE".into()],
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let id = pod.run(app).await;

    let probe = "grep -E '^(Uid|Gid|Groups|Cap[A-Za-z]+|NoNewPrivs|Seccomp|Umask):' /proc/self/status; \
        env | sort; pwd; cat /proc/self/cgroup; ls /proc/self/fd; \
        [ \"$(cut -d' ' -f6 /proc/$$/stat)\" = $$ ] && echo session leader; \
        for n in ipc mnt net pid uts cgroup; do readlink /proc/self/ns/$n; done";
    let (direct, err, code) = pod
        .exec(&id, &["sh", "-c", probe], 10)
        .await
        .expect("exec the probe");
    assert_eq!((err.as_str(), code), ("", 0), "{direct}");
    let runc_root = format!("/run/containerd/runc/{}", crius.config.containerd.namespace);
    let by_runc = Command::new("runc")
        .args(["--root", &runc_root, "exec", &id, "sh", "-c", probe])
        .output()
        .expect("runc exec");
    assert!(by_runc.status.success(), "{by_runc:?}");
    assert_eq!(direct, String::from_utf8_lossy(&by_runc.stdout));
    for expected in [
        "Uid:\t1000",
        " 3000 \n",
        "CapAmb:\t0000000000000400",
        "NoNewPrivs:\t1",
        "session leader\n",
        "A=2",
        "/tmp\n",
    ] {
        assert!(direct.contains(expected), "{expected:?} in {direct}");
    }
    // Signals as a new process has them (runc, started from this test, inherits its own).
    let (status, _, _) = pod
        .exec(&id, &["cat", "/proc/self/status"], 10)
        .await
        .expect("status");
    let mask = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .unwrap_or_else(|| panic!("{name} in {status}"))
    };
    assert_eq!(mask("SigBlk:"), 0, "{status}");
    // SIGHUP and SIGINT stay ignored if the shim's were, as after runc.
    assert_eq!(mask("SigIgn:") & !0b11, 0, "{status}");
    assert!(
        !runc_verbs(bin.path()).iter().any(|v| v == "exec"),
        "runc exec was run: {:?}",
        runc_verbs(bin.path())
    );

    let (_, _, code) = pod
        .exec(&id, &["sh", "-c", "exit 7"], 10)
        .await
        .expect("exit 7");
    assert_eq!(code, 7);
    // As with runc, the user owns its stdio: it can reopen it by name.
    let reopen = "echo out > /dev/stdout; echo err > /dev/stderr";
    let (out, err, code) = pod
        .exec(&id, &["sh", "-c", reopen], 10)
        .await
        .expect("reopen stdio");
    assert_eq!((out.as_str(), err.as_str(), code), ("out\n", "err\n", 0));
    let missing = pod
        .exec(&id, &["no-such-program"], 10)
        .await
        .expect_err("no program");
    assert!(
        missing
            .message()
            .contains(r#"exec: \"no-such-program\": executable file not found in $PATH"#),
        "{missing:?}"
    );

    let mut filtered = container("filtered", "busybox:latest", &["sleep", "1000"]);
    filtered.linux = Some(LinuxContainerConfig {
        security_context: Some(LinuxContainerSecurityContext {
            seccomp: Some(SecurityProfile {
                profile_type: ProfileType::RuntimeDefault as i32,
                localhost_ref: String::new(),
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let filtered = pod.run(filtered).await;
    let (out, _, code) = pod
        .exec(&filtered, &["echo", "filtered"], 10)
        .await
        .expect("exec");
    assert_eq!((out.as_str(), code), ("filtered\n", 0));
    let runc_execs = || {
        runc_verbs(bin.path())
            .iter()
            .filter(|v| *v == "exec")
            .count()
    };
    assert_eq!(runc_execs(), 1, "the seccomp container's exec went to runc");

    // A handler with exec_with_runtime sends even a plain exec to runc.
    let mut marked = pod_on(&crius, host_network_pod_config("runc-exec"), "counted-exec").await;
    let plain = marked
        .run(container("plain", "busybox:latest", &["sleep", "1000"]))
        .await;
    let (out, _, code) = marked
        .exec(&plain, &["echo", "by runc"], 10)
        .await
        .expect("exec");
    assert_eq!((out.as_str(), code), ("by runc\n", 0));
    assert_eq!(runc_execs(), 2, "exec_with_runtime sent the exec to runc");
    marked.remove_pod().await;
    pod.remove_pod().await;
}

/// A runc killed in the middle of a create (found by the soak): it has made the container's
/// cgroup but written no state, so `runc delete` cannot find it, and its init is still in
/// the cgroup for a moment. The start fails ABORTED (not a server fault) and the shim
/// removes the cgroup from every hierarchy once it is empty.
#[tokio::test]
async fn a_runtime_killed_while_creating_aborts_the_start_and_leaves_no_cgroup() {
    let bin = tempfile::tempdir().expect("tempdir");
    let runc = bin.path().join("runc");
    // On create: the cgroup runc makes first, then death by SIGKILL (exit status 137).
    std::fs::write(
        &runc,
        format!(
            r#"#!/bin/sh
case " $* " in
*" create "*)
  bundle=$(echo "$*" | sed -n 's/.*--bundle \([^ ]*\).*/\1/p')
  path=$(jq -r '.linux.cgroupsPath' "$bundle/config.json")
  echo "$path" > {record}
  for h in memory pids unified; do
    [ -d /sys/fs/cgroup/$h ] && mkdir -p "/sys/fs/cgroup/$h$path"
  done
  # The init, dying a moment after runc.
  sleep 1 &
  for h in memory pids; do
    [ -d "/sys/fs/cgroup/$h$path" ] && echo $! > "/sys/fs/cgroup/$h$path/cgroup.procs"
  done
  kill -9 $$
  ;;
esac
exec /usr/sbin/runc "$@"
"#,
            record = bin.path().join("cgroup").display()
        ),
    )
    .expect("write the runc wrapper");
    std::fs::set_permissions(&runc, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let runc = runc.display().to_string();
    let crius = Crius::start_with(
        |c| {
            let mut killed = c.containerd.runtimes["runc"].clone();
            killed.options.binary_name = runc;
            c.containerd.runtimes.insert("killed".into(), killed);
        },
        &[],
    )
    .await;
    let mut pod = pod_on(&crius, host_network_pod_config("killed-create"), "killed").await;
    let id = pod
        .create(container("app", "busybox:latest", &["sleep", "1000"]))
        .await
        .expect("create");
    let err = pod.start(&id).await.expect_err("runc was killed");
    assert_eq!(err.code(), tonic::Code::Aborted, "{err:?}");
    let path = std::fs::read_to_string(bin.path().join("cgroup")).expect("runc ran");
    let path = path.trim();
    assert!(path.contains(&id), "{path}");
    let dirs: Vec<_> = ["memory", "pids", "unified"]
        .iter()
        .map(|h| {
            std::path::Path::new("/sys/fs/cgroup")
                .join(h)
                .join(path.trim_start_matches('/'))
        })
        .collect();
    let gone = eventually(Duration::from_secs(5), || {
        std::future::ready(dirs.iter().all(|d| !d.exists()))
    })
    .await;
    assert!(
        gone,
        "left: {:?}",
        dirs.iter().filter(|d| d.exists()).collect::<Vec<_>>()
    );
    pod.remove(&id).await;
    pod.remove_pod().await;
}
