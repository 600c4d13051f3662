//! Losing nothing: container events, crius killed and restarted (also in the middle of
//! RPCs), and containerd restarted under crius.

mod common;

use std::time::Duration;

use common::Crius;
use common::pod::{container, pod};
use futures::StreamExt;
use k8s_cri::v1::{ContainerEventResponse, ContainerEventType, GetEventsRequest};

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
