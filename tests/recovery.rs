//! Losing nothing: container events, crius killed and restarted (also in the middle of
//! RPCs), and containerd restarted under crius.

mod common;

use std::time::Duration;

use common::pod::{container, pod};
use common::{Crius, PrivateContainerd, eventually};
use futures::StreamExt;
use k8s_cri::v1::{
    ContainerEventResponse, ContainerEventType, ContainerState, GetEventsRequest, Mount,
    StatusRequest,
};

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
            let request = k8s_cri::v1::CreateContainerRequest {
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
    let exited = exited.expect("the exit during the gap was noticed");
    assert_eq!(exited.exit_code, 42);
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
