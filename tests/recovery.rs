//! Losing nothing: container events, crius killed and restarted (also in the middle of
//! RPCs), and containerd restarted under crius.

mod common;

use std::time::Duration;

use common::pod::{container, pod, pod_with};
use common::{Crius, PrivateContainerd, TestNetwork, eventually, pod_config};
use crius::api::v1::{
    ContainerEventResponse, ContainerEventType, ContainerState, GetEventsRequest, Mount,
    StatusRequest,
};
use futures::StreamExt;

type Events = tonic::Streaming<ContainerEventResponse>;

async fn subscribe(crius: &Crius) -> Events {
    crius
        .client()
        .await
        .runtime
        .get_container_events(GetEventsRequest {})
        .await
        .expect("GetContainerEvents")
        .into_inner()
}

/// Reads events until `until` is seen for `id`; returns the types seen for `id`, in order.
async fn events_for(
    events: &mut Events,
    id: &str,
    until: ContainerEventType,
) -> Vec<ContainerEventType> {
    let mut seen = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(20), events.next())
            .await
            .expect("an event in time")
            .expect("the stream goes on")
            .expect("an event");
        if event.container_id != id {
            continue;
        }
        let kind = ContainerEventType::try_from(event.container_event_type).expect("a known type");
        seen.push(kind);
        if kind == until {
            return seen;
        }
    }
}

#[tokio::test]
async fn container_events_follow_the_life_of_a_container_and_its_pod() {
    let crius = Crius::start().await;
    let mut events = subscribe(&crius).await;
    let mut pod = pod(&crius, "events").await;
    let pod_id = pod.id.clone();
    let id = pod
        .run(container(
            "short",
            "busybox:latest",
            &["sh", "-c", "exit 3"],
        ))
        .await;
    pod.wait_exited(&id).await;
    pod.remove(&id).await;
    pod.remove_pod().await;

    let mut for_pod = Vec::new();
    let mut for_container = Vec::new();
    while for_pod.last() != Some(&ContainerEventType::ContainerDeletedEvent) {
        let event = tokio::time::timeout(Duration::from_secs(20), events.next())
            .await
            .expect("an event in time")
            .expect("the stream goes on")
            .expect("an event");
        let kind = ContainerEventType::try_from(event.container_event_type).expect("a known type");
        assert_eq!(
            event.pod_sandbox_status.as_ref().map(|s| s.id.as_str()),
            (kind != ContainerEventType::ContainerDeletedEvent || event.container_id != pod_id)
                .then_some(pod_id.as_str()),
            "{event:?}"
        );
        if event.container_id == pod_id {
            for_pod.push(kind);
        } else if event.container_id == id {
            if kind == ContainerEventType::ContainerStoppedEvent {
                let status = &event.containers_statuses[0];
                assert_eq!(status.id, id);
                assert_eq!(status.exit_code, 3);
            }
            for_container.push(kind);
        }
    }
    let life = [
        ContainerEventType::ContainerCreatedEvent,
        ContainerEventType::ContainerStartedEvent,
        ContainerEventType::ContainerStoppedEvent,
        ContainerEventType::ContainerDeletedEvent,
    ];
    assert_eq!(for_container, life);
    assert_eq!(for_pod, life);
}

#[tokio::test]
async fn a_subscriber_that_never_reads_stalls_nothing() {
    let crius = Crius::start().await;
    let _stalled = subscribe(&crius).await;
    let mut reader = subscribe(&crius).await;
    let mut pod = pod(&crius, "events-stall").await;
    // 300 events, with statuses, is far more than an unread HTTP/2 window holds.
    let started = std::time::Instant::now();
    let mut last = String::new();
    for i in 0..150 {
        let mut config = container(&format!("c{i}"), "busybox:latest", &["true"]);
        config.log_path = String::new();
        let id = pod.create(config).await.expect("create");
        pod.remove(&id).await;
        last = id;
    }
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "creating and removing took {:?}",
        started.elapsed()
    );
    let seen = events_for(
        &mut reader,
        &last,
        ContainerEventType::ContainerDeletedEvent,
    )
    .await;
    assert_eq!(
        seen,
        [
            ContainerEventType::ContainerCreatedEvent,
            ContainerEventType::ContainerDeletedEvent
        ]
    );
}

async fn runtime_ready(crius: &Crius) -> bool {
    let Ok(mut client) = crius.client_now().await else {
        return false;
    };
    let Ok(response) = client
        .runtime
        .status(StatusRequest { verbose: false })
        .await
    else {
        return false;
    };
    response.into_inner().status.is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.r#type == "RuntimeReady" && c.status)
    })
}

#[tokio::test]
async fn crius_rides_out_a_containerd_restart() {
    let mut containerd = PrivateContainerd::start().await;
    let mut crius = Crius::start_with(|c| containerd.configure(c), &[]).await;
    let signal_dir = tempfile::tempdir().expect("signal dir");
    let mut pods = Vec::new();
    for i in 0..5 {
        pods.push(pod(&crius, &format!("ctrd-restart-{i}")).await);
    }
    let mut waiter = container(
        "waiter",
        "busybox:latest",
        &[
            "sh",
            "-c",
            "while [ ! -f /signal/go ]; do sleep 0.1; done; exit 42",
        ],
    );
    waiter.mounts.push(Mount {
        container_path: "/signal".into(),
        host_path: signal_dir.path().display().to_string(),
        ..Default::default()
    });
    let waiter_id = pods[0].run(waiter).await;
    let mut sleepers = Vec::new();
    for pod in pods.iter_mut().skip(1) {
        sleepers.push(
            pod.run(container("sleeper", "busybox:latest", &["sleep", "1000"]))
                .await,
        );
    }

    containerd.kill();
    assert!(
        eventually(Duration::from_secs(10), || async {
            !runtime_ready(&crius).await
        })
        .await,
        "Status still says the runtime is ready"
    );
    let mut attempt = 0;
    let unavailable = eventually(Duration::from_secs(10), || {
        attempt += 1;
        let mut pod_client = pods[1].client.clone();
        let pod_id = pods[1].id.clone();
        let config = pods[1].config.clone();
        let name = format!("during-gap-{attempt}");
        async move {
            let request = crius::api::v1::CreateContainerRequest {
                pod_sandbox_id: pod_id,
                config: Some(container(&name, "busybox:latest", &["true"])),
                sandbox_config: Some(config),
            };
            pod_client
                .runtime
                .create_container(request)
                .await
                .is_err_and(|e| e.code() == tonic::Code::Unavailable)
        }
    })
    .await;
    assert!(
        unavailable,
        "calls that need containerd should answer UNAVAILABLE"
    );
    // The waiter exits while containerd is away.
    std::fs::write(signal_dir.path().join("go"), b"").expect("signal");
    tokio::time::sleep(Duration::from_secs(1)).await;

    containerd.restart().await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            runtime_ready(&crius).await
        })
        .await,
        "Status did not say ready again"
    );
    let mut exited = None;
    for _ in 0..200 {
        let (status, _) = pods[0].status(&waiter_id).await;
        if status.state == ContainerState::ContainerExited as i32 {
            exited = Some(status);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let exited = exited.unwrap_or_else(|| {
        panic!(
            "the exit during the gap was not noticed; crius log:\n{}",
            crius.log()
        )
    });
    // containerd 1.x keeps the exited task, so its exit code survives the gap. containerd
    // 2.x deletes, at start-up, every task whose processes have all exited (a "leaked shim"
    // to it) without telling anyone the exit code: crius records the exit as unknown (255).
    let expected = if common::containerd_major() >= 2 {
        255
    } else {
        42
    };
    assert_eq!(
        exited.exit_code,
        expected,
        "the exit code of the exit during the gap; crius log:\n{}",
        crius.log()
    );
    assert!(exited.finished_at > exited.started_at);
    for (pod, id) in pods.iter_mut().skip(1).zip(&sleepers) {
        let (status, _) = pod.status(id).await;
        assert_eq!(
            status.state,
            ContainerState::ContainerRunning as i32,
            "{id}"
        );
        let (out, _, code) = pod.exec(id, &["echo", "alive"], 10).await.expect("exec");
        assert_eq!((out.as_str(), code), ("alive\n", 0));
    }
    let mut fresh = pod(&crius, "ctrd-restart-new").await;
    let id = fresh
        .run(container("new", "busybox:latest", &["sleep", "1000"]))
        .await;
    let (out, _, _) = fresh.exec(&id, &["echo", "new"], 10).await.expect("exec");
    assert_eq!(out, "new\n");
    assert!(crius.try_wait().is_none(), "crius must keep running");
}

/// Everything of a sandbox or container crius could leave behind, in its namespace and dirs.
struct Traces {
    containers: String,
    active_snapshots: Vec<String>,
    leases: Vec<String>,
    sandbox_dirs: Vec<String>,
    container_dirs: Vec<String>,
}

fn list_dir(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn traces(crius: &Crius) -> Traces {
    let mut sandbox_dirs = list_dir(&crius.config.root.join("sandboxes"));
    sandbox_dirs.extend(list_dir(&crius.config.state.join("sandboxes")));
    let mut container_dirs = list_dir(&crius.config.root.join("containers"));
    container_dirs.extend(list_dir(&crius.config.state.join("containers")));
    Traces {
        containers: crius.ctr(&["containers", "ls", "-q"]),
        active_snapshots: crius
            .ctr(&["snapshots", "ls"])
            .lines()
            .filter(|l| l.contains("Active"))
            .map(str::to_string)
            .collect(),
        leases: crius.leases_left(),
        sandbox_dirs,
        container_dirs,
    }
}

/// The netns paths noted in the sandbox dirs crius left.
fn noted_netns(crius: &Crius) -> Vec<String> {
    list_dir(&crius.config.root.join("sandboxes"))
        .iter()
        .filter_map(|id| {
            std::fs::read_to_string(crius.config.root.join("sandboxes").join(id).join("netns")).ok()
        })
        .collect()
}

/// Runs a network pod with crius set to die at `point`, restarts crius, and checks the pod
/// is either complete and working or gone without a trace, its name free again.
async fn sandbox_crash_at(point: &str, tag: u8, survives: bool) {
    let mut network = None;
    let failpoint = format!("{point}=kill");
    let mut crius = Crius::start_with(
        |c| network = Some(TestNetwork::install(c, tag)),
        &[("CRIUS_FAILPOINTS", failpoint.as_str())],
    )
    .await;
    let network = network.expect("network");
    let config = pod_config(&format!("crash-{tag}"));
    let mut client = crius.client().await;
    let image = common::pod::image("busybox:latest");
    client
        .image
        .pull_image(crius::api::v1::PullImageRequest {
            image: Some(crius::api::v1::ImageSpec {
                image: image.clone(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("pull");
    let died = client
        .runtime
        .run_pod_sandbox(crius::api::v1::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await;
    assert!(died.is_err(), "crius should have died at {point}");
    assert!(
        crius.wait_exit(Duration::from_secs(10)).await.is_some(),
        "crius still runs"
    );
    let netns = noted_netns(&crius);
    crius.restart_after_crash().await;

    let mut client = crius.client().await;
    let pods = client
        .runtime
        .list_pod_sandbox(crius::api::v1::ListPodSandboxRequest { filter: None })
        .await
        .expect("list")
        .into_inner()
        .items;
    if survives {
        assert_eq!(pods.len(), 1, "{point}: the finished pod is kept");
        assert_eq!(
            pods[0].state,
            crius::api::v1::PodSandboxState::SandboxReady as i32
        );
        let mut pod = common::pod::Pod {
            client: client.clone(),
            id: pods[0].id.clone(),
            config: config.clone(),
        };
        let id = pod
            .run(container("after", "busybox:latest", &["sleep", "1000"]))
            .await;
        let (out, _, _) = pod
            .exec(&id, &["ip", "-4", "addr", "show", "eth0"], 10)
            .await
            .expect("exec");
        assert!(
            out.contains(&network.subnet_prefix),
            "{point}: pod network: {out}"
        );
        return;
    }
    assert!(
        pods.is_empty(),
        "{point}: the half-made pod is gone: {pods:?}"
    );
    let left = traces(&crius);
    assert_eq!(left.containers.trim(), "", "{point}: containerd containers");
    assert!(
        left.active_snapshots.is_empty(),
        "{point}: snapshots {:?}",
        left.active_snapshots
    );
    assert!(left.leases.is_empty(), "{point}: leases {:?}", left.leases);
    assert!(
        left.sandbox_dirs.is_empty(),
        "{point}: dirs {:?}",
        left.sandbox_dirs
    );
    assert!(
        network.reserved_ips().is_empty(),
        "{point}: IPs {:?}",
        network.reserved_ips()
    );
    for path in netns {
        assert!(
            !std::path::Path::new(path.trim()).exists(),
            "{point}: netns {path} left"
        );
    }
    // The name is free: the same pod runs now.
    let pod = pod_with(&crius, config).await;
    assert!(!pod.id.is_empty());
}

#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs --features failpoints (make test has it)"
)]
async fn a_crash_after_the_netns_leaves_no_pod() {
    sandbox_crash_at("sandbox_after_netns", 130, false).await;
}

#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs --features failpoints (make test has it)"
)]
async fn a_crash_after_the_sandbox_container_leaves_no_pod() {
    sandbox_crash_at("sandbox_after_container", 131, false).await;
}

#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs --features failpoints (make test has it)"
)]
async fn a_crash_after_cni_add_leaves_no_pod_and_no_ip() {
    sandbox_crash_at("sandbox_after_cni", 132, false).await;
}

#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs --features failpoints (make test has it)"
)]
async fn a_crash_after_the_pause_task_started_finishes_the_pod() {
    sandbox_crash_at("sandbox_after_start", 133, true).await;
}

/// Creates (or removes) a container with crius set to die at `point`; after the restart
/// the container is gone without a trace and its name is free, and the pod still works.
async fn container_crash_at(point: &str, removing: bool) {
    let failpoint = format!("{point}=kill");
    let env = [("CRIUS_FAILPOINTS", failpoint.as_str())];
    let mut crius = Crius::start_with(|_| {}, if removing { &[] } else { &env }).await;
    let mut pod = pod(&crius, &format!("crash-{}", point.replace('_', "-"))).await;
    let config = container("victim", "busybox:latest", &["sleep", "1000"]);
    if removing {
        let id = pod.run(config.clone()).await;
        crius.restart_after_crash_with(&env).await;
        pod.client = crius.client().await;
        let died = pod
            .client
            .runtime
            .remove_container(crius::api::v1::RemoveContainerRequest { container_id: id })
            .await;
        assert!(died.is_err(), "crius should have died at {point}");
    } else {
        assert!(
            pod.create(config.clone()).await.is_err(),
            "crius should have died at {point}"
        );
    }
    assert!(
        crius.wait_exit(Duration::from_secs(10)).await.is_some(),
        "crius still runs"
    );
    crius.restart_after_crash().await;
    pod.client = crius.client().await;

    let listed = pod
        .client
        .runtime
        .list_containers(crius::api::v1::ListContainersRequest { filter: None })
        .await
        .expect("list")
        .into_inner()
        .containers;
    assert!(listed.is_empty(), "{point}: {listed:?}");
    let left = traces(&crius);
    assert_eq!(
        left.containers.trim(),
        pod.id,
        "{point}: only the pod's containerd container"
    );
    // The pod is held by crius's shim, with no snapshot: none is left.
    assert!(
        left.active_snapshots.is_empty(),
        "{point}: {:?}",
        left.active_snapshots
    );
    assert!(
        left.container_dirs.is_empty(),
        "{point}: dirs {:?}",
        left.container_dirs
    );
    assert!(left.leases.is_empty(), "{point}: leases {:?}", left.leases);
    let id = pod.run(config).await;
    let (out, _, _) = pod.exec(&id, &["echo", "works"], 10).await.expect("exec");
    assert_eq!(out, "works\n");
}

#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs --features failpoints (make test has it)"
)]
async fn a_crash_after_the_container_snapshot_leaves_no_container() {
    container_crash_at("container_after_snapshot", false).await;
}

#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs --features failpoints (make test has it)"
)]
async fn a_crash_after_the_container_record_leaves_no_container() {
    container_crash_at("container_after_record", false).await;
}

#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs --features failpoints (make test has it)"
)]
async fn a_crash_in_the_middle_of_remove_container_finishes_it() {
    container_crash_at("container_remove_after_record", true).await;
}

/// Every pod's and container's status, sorted by ID.
async fn snapshot(
    client: &mut crius_testkit::CriClient,
) -> (
    Vec<crius::api::v1::PodSandboxStatus>,
    Vec<crius::api::v1::ContainerStatus>,
) {
    let mut pods = Vec::new();
    let items = client
        .runtime
        .list_pod_sandbox(crius::api::v1::ListPodSandboxRequest { filter: None })
        .await
        .expect("list pods")
        .into_inner()
        .items;
    for item in items {
        let status = client
            .runtime
            .pod_sandbox_status(crius::api::v1::PodSandboxStatusRequest {
                pod_sandbox_id: item.id,
                verbose: false,
            })
            .await
            .expect("pod status")
            .into_inner()
            .status
            .expect("status");
        pods.push(status);
    }
    pods.sort_by(|a, b| a.id.cmp(&b.id));
    let mut containers = Vec::new();
    let items = client
        .runtime
        .list_containers(crius::api::v1::ListContainersRequest { filter: None })
        .await
        .expect("list containers")
        .into_inner()
        .containers;
    for item in items {
        let status = client
            .runtime
            .container_status(crius::api::v1::ContainerStatusRequest {
                container_id: item.id,
                verbose: false,
            })
            .await
            .expect("container status")
            .into_inner()
            .status
            .expect("status");
        containers.push(status);
    }
    containers.sort_by(|a, b| a.id.cmp(&b.id));
    (pods, containers)
}

#[tokio::test]
async fn ten_pods_come_back_identical_after_crius_is_killed() {
    let mut network = None;
    let mut crius = Crius::start_with(|c| network = Some(TestNetwork::install(c, 134)), &[]).await;
    let network = network.expect("network");
    let signal_dir = tempfile::tempdir().expect("signal dir");
    let mut pods = Vec::new();
    let mut tickers = Vec::new();
    let mut waiter = None;
    let mut attachable = None;
    let mut idle = None;
    for i in 0..10 {
        let mut pod = pod_with(&crius, pod_config(&format!("ten-{i}"))).await;
        let ticker = pod
            .run(container(
                "ticker",
                "busybox:latest",
                &["sh", "-c", "while true; do echo tick; sleep 0.2; done"],
            ))
            .await;
        tickers.push((i, ticker));
        match i {
            // Exited with distinct codes.
            0 | 3 | 6 => {
                let code = format!("exit {}", 10 + i);
                let id = pod
                    .run(container("done", "busybox:latest", &["sh", "-c", &code]))
                    .await;
                pod.wait_exited(&id).await;
            }
            // Created, never started.
            2 => {
                let config = container("idle", "busybox:latest", &["sh", "-c", "exit 3"]);
                idle = Some(pod.create(config).await.expect("create"));
            }
            // Exits while crius is down.
            9 => {
                let mut config = container(
                    "waiter",
                    "busybox:latest",
                    &[
                        "sh",
                        "-c",
                        "while [ ! -f /signal/go ]; do sleep 0.1; done; exit 77",
                    ],
                );
                config.mounts.push(Mount {
                    container_path: "/signal".into(),
                    host_path: signal_dir.path().display().to_string(),
                    ..Default::default()
                });
                waiter = Some(pod.run(config).await);
            }
            // Reads a line from whoever attaches.
            1 => {
                let mut config = container(
                    "reader",
                    "busybox:latest",
                    &["sh", "-c", "read line; echo got:$line"],
                );
                config.stdin = true;
                config.stdin_once = true;
                attachable = Some(pod.run(config).await);
            }
            _ => {
                pod.run(container("sleeper", "busybox:latest", &["sleep", "1000"]))
                    .await;
            }
        }
        pods.push(pod);
    }
    let waiter = waiter.expect("waiter");
    let attachable = attachable.expect("reader");
    let mut client = crius.client().await;
    let (pods_before, containers_before) = snapshot(&mut client).await;
    assert_eq!(pods_before.len(), 10);
    assert_eq!(containers_before.len(), 20);

    crius.kill().await;
    let killed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    std::fs::write(signal_dir.path().join("go"), b"").expect("signal");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let log_sizes: Vec<u64> = tickers
        .iter()
        .map(|(i, _)| {
            std::fs::metadata(pods[*i].log_path("ticker"))
                .map(|m| m.len())
                .unwrap_or(0)
        })
        .collect();
    crius.restart_after_crash().await;

    let mut client = crius.client().await;
    let (pods_after, containers_after) = snapshot(&mut client).await;
    assert_eq!(pods_after, pods_before, "pods differ after the restart");
    assert!(pods_after.iter().all(|p| {
        p.network
            .as_ref()
            .is_some_and(|n| n.ip.starts_with(&network.subnet_prefix))
    }));
    for (before, after) in containers_before.iter().zip(&containers_after) {
        if after.id == waiter {
            assert_eq!(after.state, ContainerState::ContainerExited as i32);
            assert_eq!(after.exit_code, 77);
            assert!(
                after.finished_at >= killed_at,
                "finished_at is the real exit time"
            );
            assert_eq!(after.started_at, before.started_at);
        } else {
            assert_eq!(
                after, before,
                "container {} differs after the restart",
                before.id
            );
        }
    }

    // Logs keep growing, exec and attach work.
    for ((i, _), size) in tickers.iter().zip(&log_sizes) {
        let path = pods[*i].log_path("ticker");
        let grew = eventually(Duration::from_secs(5), || {
            let path = path.clone();
            async move { std::fs::metadata(&path).is_ok_and(|m| m.len() > *size) }
        })
        .await;
        assert!(grew, "the log of pod {i} stopped growing");
    }
    pods[4].client = client.clone();
    let (out, _, _) = pods[4]
        .exec(&tickers[4].1, &["echo", "exec-works"], 10)
        .await
        .expect("exec");
    assert_eq!(out, "exec-works\n");
    let url = client
        .runtime
        .attach(crius::api::v1::AttachRequest {
            container_id: attachable.clone(),
            stdin: true,
            stdout: true,
            ..Default::default()
        })
        .await
        .expect("attach")
        .into_inner()
        .url;
    let output = common::streams::spdy_session(
        &url,
        common::streams::SessionInput {
            stdin: Some(b"hello\n"),
            close_stdin: true,
            stdin_delay: Duration::from_millis(300),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(output.stdout, "got:hello\n");
    // A container created before the crash starts after it (its rootfs mounts are asked of
    // containerd again: those kept from its creation died with the process).
    let idle = idle.expect("idle");
    pods[2].client = client.clone();
    pods[2]
        .start(&idle)
        .await
        .expect("start the idle container");
    assert_eq!(pods[2].wait_exited(&idle).await.exit_code, 3);

    // Stop and remove clean up everything.
    for pod in pods {
        let mut pod = pod;
        pod.client = client.clone();
        pod.remove_pod().await;
    }
    let left = traces(&crius);
    assert_eq!(left.containers.trim(), "");
    assert!(
        left.active_snapshots.is_empty(),
        "{:?}",
        left.active_snapshots
    );
    assert!(left.sandbox_dirs.is_empty() && left.container_dirs.is_empty());
    assert!(
        network.reserved_ips().is_empty(),
        "{:?}",
        network.reserved_ips()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_crius_cannot_take_back_is_left_running_not_torn_down() {
    let mut crius = Crius::start().await;
    let mut pod = pod(&crius, "untakeable").await;
    let id = pod
        .run(container("sleeper", "busybox:latest", &["sleep", "1000"]))
        .await;
    crius.kill().await;
    // Its FIFOs cannot be made again: something is in the way of their directory.
    let io = crius.config.state.join("containers").join(&id).join("io");
    std::fs::remove_dir_all(&io).expect("remove the FIFOs");
    std::fs::write(&io, b"in the way").expect("block the FIFO dir");
    crius.restart_after_crash().await;

    // Skipped at start-up, but containerd still runs it: its files and its writable layer
    // stay, and so does its task.
    assert!(crius.config.root.join("containers").join(&id).exists());
    let snapshots = crius.ctr(&["snapshots", "ls"]);
    assert!(snapshots.contains(&id), "its snapshot went: {snapshots}");
    let tasks = crius.ctr(&["tasks", "ls"]);
    assert!(
        tasks
            .lines()
            .any(|l| l.starts_with(&id) && l.contains("RUNNING")),
        "{tasks}"
    );

    // Taken back once the way is clear, and torn down as usual.
    std::fs::remove_file(&io).expect("clear the way");
    crius.restart_after_crash().await;
    pod.client = crius.client().await;
    pod.stop(&id, 5).await;
    pod.remove(&id).await;
    pod.remove_pod().await;
}
