//! Resource usage through ContainerStats, ListContainerStats, PodSandboxStats and
//! ListPodSandboxStats, measured from real containers.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::pod::{Pod, container, pod, pod_with};
use common::{Crius, TestNetwork, pod_config};
use crius::api::v1::{
    ContainerStats, ContainerStatsFilter, ContainerStatsRequest, ListContainerStatsRequest,
    ListPodSandboxStatsRequest, PodSandboxStatsFilter, PodSandboxStatsRequest,
};

const MIB: u64 = 1024 * 1024;

async fn stats(pod: &mut Pod, id: &str) -> ContainerStats {
    pod.client
        .runtime
        .container_stats(ContainerStatsRequest {
            container_id: id.to_string(),
        })
        .await
        .expect("ContainerStats")
        .into_inner()
        .stats
        .expect("stats")
}

#[tokio::test]
async fn a_busy_container_uses_cpu_and_a_filled_one_memory() {
    // No background sampling: the CPU rate comes from two stats calls.
    let crius = Crius::start_with(|c| c.cpu_sample_period = Duration::ZERO, &[]).await;
    let mut pod = pod(&crius, "stats-cpu").await;
    let busy = pod
        .run(container(
            "busy",
            "busybox:latest",
            &["sh", "-c", "while true; do :; done"],
        ))
        .await;
    let filled = pod
        .run(container(
            "filled",
            "busybox:latest",
            &[
                "sh",
                "-c",
                "head -c 20971520 /dev/zero > /dev/shm/fill; sleep 1000",
            ],
        ))
        .await;
    let first = stats(&mut pod, &busy).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let second = stats(&mut pod, &busy).await;
    let total = |s: &ContainerStats| {
        s.cpu
            .as_ref()
            .and_then(|c| c.usage_core_nano_seconds.as_ref())
            .map(|v| v.value)
            .expect("cpu usage")
    };
    assert!(total(&second) > total(&first), "{first:?} {second:?}");
    let cores = second
        .cpu
        .as_ref()
        .and_then(|c| c.usage_nano_cores.as_ref())
        .map(|v| v.value)
        .expect("a rate from two samples");
    // The suite's other tests share this machine's cores, so a busy loop is
    // only sure of a slice of one; it can never use more than all of them.
    let online = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    assert!(
        cores > 100_000_000 && cores <= online * 1_050_000_000,
        "a busy loop uses a core's share, at most all {online}: {cores}"
    );
    assert_eq!(
        second.attributes.as_ref().map(|a| a.id.as_str()),
        Some(busy.as_str())
    );

    let mut working_set = 0;
    for _ in 0..50 {
        let memory = stats(&mut pod, &filled).await.memory.expect("memory");
        working_set = memory.working_set_bytes.map(|v| v.value).unwrap_or(0);
        if working_set > 20 * MIB {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(working_set > 20 * MIB, "working set {working_set}");
    // A stopped container has no usage to report (containerd's TestTruncIndex).
    pod.stop(&filled, 0).await;
    let err = pod
        .client
        .runtime
        .container_stats(ContainerStatsRequest {
            container_id: filled.clone(),
        })
        .await
        .expect_err("stats of a stopped container");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    // The busy loop would otherwise spin on through the tests after this one.
    pod.remove_pod().await;
}

#[tokio::test]
async fn writes_to_the_rootfs_show_in_the_writable_layer() {
    let crius =
        Crius::start_with(|c| c.stats_collect_period = Duration::from_millis(500), &[]).await;
    let mut pod = pod(&crius, "stats-layer").await;
    let id = pod
        .run(container("writer", "busybox:latest", &["sleep", "1000"]))
        .await;
    let used = |s: &ContainerStats| {
        s.writable_layer
            .as_ref()
            .and_then(|l| l.used_bytes.as_ref())
            .map(|v| v.value)
    };
    let mut before = None;
    for _ in 0..50 {
        before = used(&stats(&mut pod, &id).await);
        if before.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = before.expect("the writable layer is measured");
    let (_, _, code) = pod
        .exec(
            &id,
            &["sh", "-c", "head -c 10485760 /dev/urandom > /big"],
            10,
        )
        .await
        .expect("exec");
    assert_eq!(code, 0);
    let mut after = 0;
    for _ in 0..50 {
        after = used(&stats(&mut pod, &id).await).unwrap_or(0);
        if after >= before + 10 * MIB {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(after >= before + 10 * MIB, "before {before}, after {after}");
    let layer = stats(&mut pod, &id).await.writable_layer.expect("layer");
    assert!(layer.inodes_used.is_some_and(|v| v.value > 0));
    assert!(!layer.fs_id.expect("fs id").mountpoint.is_empty());
}

#[tokio::test]
async fn pod_stats_count_network_traffic_processes_and_containers() {
    let mut network = None;
    let crius = Crius::start_with(|c| network = Some(TestNetwork::install(c, 140)), &[]).await;
    let mut pod = pod_with(&crius, pod_config("stats-net")).await;
    let id = pod
        .run(container("app", "busybox:latest", &["sleep", "1000"]))
        .await;
    let pod_stats = |client: crius_testkit::CriClient, pod_id: String| async move {
        let mut client = client;
        client
            .runtime
            .pod_sandbox_stats(PodSandboxStatsRequest {
                pod_sandbox_id: pod_id,
            })
            .await
            .expect("PodSandboxStats")
            .into_inner()
            .stats
            .expect("stats")
    };
    let before = pod_stats(pod.client.clone(), pod.id.clone()).await;
    let linux = before.linux.as_ref().expect("linux stats");
    let eth0 = linux
        .network
        .as_ref()
        .and_then(|n| n.default_interface.as_ref())
        .expect("eth0");
    assert_eq!(eth0.name, "eth0");
    let rx_before = eth0.rx_bytes.as_ref().map(|v| v.value).unwrap_or(0);
    assert_eq!(linux.containers.len(), 1);
    assert_eq!(
        linux.containers[0]
            .attributes
            .as_ref()
            .map(|a| a.id.as_str()),
        Some(id.as_str())
    );
    assert!(
        linux
            .process
            .as_ref()
            .and_then(|p| p.process_count.as_ref())
            .is_some_and(|c| c.value >= 2)
    );
    assert!(
        linux
            .cpu
            .as_ref()
            .is_some_and(|c| c.usage_core_nano_seconds.is_some())
    );
    assert!(
        linux
            .memory
            .as_ref()
            .is_some_and(|m| m.working_set_bytes.is_some())
    );

    let status = pod
        .client
        .runtime
        .pod_sandbox_status(crius::api::v1::PodSandboxStatusRequest {
            pod_sandbox_id: pod.id.clone(),
            verbose: false,
        })
        .await
        .expect("status")
        .into_inner()
        .status
        .expect("status");
    let ip = status.network.expect("network").ip;
    let ping = std::process::Command::new("ping")
        .args(["-c", "3", "-i", "0.2", "-W", "2", &ip])
        .output()
        .expect("ping");
    assert!(
        ping.status.success(),
        "ping {ip}: {}",
        String::from_utf8_lossy(&ping.stdout)
    );
    // Samples are reused for up to a second: the traffic shows within a couple.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    let rx_after = loop {
        let rx = pod_stats(pod.client.clone(), pod.id.clone())
            .await
            .linux
            .and_then(|l| l.network)
            .and_then(|n| n.default_interface)
            .and_then(|i| i.rx_bytes)
            .map(|v| v.value)
            .unwrap_or(0);
        if rx > rx_before || std::time::Instant::now() > deadline {
            break rx;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert!(rx_after > rx_before, "rx {rx_before} -> {rx_after}");
}

#[tokio::test]
async fn list_filters_pick_exactly_the_matching_containers_and_pods() {
    let crius = Crius::start().await;
    let mut a = pod(&crius, "stats-list-a").await;
    let mut b = pod(&crius, "stats-list-b").await;
    let mut ids = Vec::new();
    for name in ["one", "two"] {
        ids.push(
            a.run(container(name, "busybox:latest", &["sleep", "1000"]))
                .await,
        );
    }
    let created = a
        .create(container("created", "busybox:latest", &["true"]))
        .await
        .expect("create");
    let mut labelled = container("labelled", "busybox:latest", &["sleep", "1000"]);
    labelled.labels = HashMap::from([("tier".to_string(), "db".to_string())]);
    let in_b = b.run(labelled).await;

    let list = |filter: Option<ContainerStatsFilter>| {
        let mut client = a.client.clone();
        async move {
            let mut ids: Vec<String> = client
                .runtime
                .list_container_stats(ListContainerStatsRequest { filter })
                .await
                .expect("ListContainerStats")
                .into_inner()
                .stats
                .into_iter()
                .filter_map(|s| s.attributes.map(|a| a.id))
                .collect();
            ids.sort();
            ids
        }
    };
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    assert_eq!(
        list(None).await,
        sorted(vec![
            ids[0].clone(),
            ids[1].clone(),
            created.clone(),
            in_b.clone()
        ]),
        "no filter lists created containers too"
    );
    assert_eq!(
        list(Some(ContainerStatsFilter {
            id: ids[0][..12].to_string(),
            ..Default::default()
        }))
        .await,
        vec![ids[0].clone()]
    );
    assert_eq!(
        list(Some(ContainerStatsFilter {
            pod_sandbox_id: a.id.clone(),
            ..Default::default()
        }))
        .await,
        sorted(vec![ids[0].clone(), ids[1].clone(), created.clone()])
    );
    assert_eq!(
        list(Some(ContainerStatsFilter {
            label_selector: HashMap::from([("tier".to_string(), "db".to_string())]),
            ..Default::default()
        }))
        .await,
        vec![in_b.clone()]
    );
    assert_eq!(
        list(Some(ContainerStatsFilter {
            id: "nonexistent".into(),
            ..Default::default()
        }))
        .await,
        Vec::<String>::new()
    );
    // A created container is listed, but has no usage of its own to report yet (as under
    // containerd's CRI, whose task metrics need a task).
    let err = a
        .client
        .runtime
        .container_stats(ContainerStatsRequest {
            container_id: created.clone(),
        })
        .await
        .expect_err("a created container has no usage yet");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");

    let pods = a
        .client
        .runtime
        .list_pod_sandbox_stats(ListPodSandboxStatsRequest {
            filter: Some(PodSandboxStatsFilter {
                id: b.id.clone(),
                ..Default::default()
            }),
        })
        .await
        .expect("ListPodSandboxStats")
        .into_inner()
        .stats;
    assert_eq!(pods.len(), 1);
    assert_eq!(
        pods[0].attributes.as_ref().map(|a| a.id.as_str()),
        Some(b.id.as_str())
    );
    let all = a
        .client
        .runtime
        .list_pod_sandbox_stats(ListPodSandboxStatsRequest { filter: None })
        .await
        .expect("ListPodSandboxStats")
        .into_inner()
        .stats;
    assert_eq!(all.len(), 2);
    let err = a
        .client
        .runtime
        .container_stats(ContainerStatsRequest {
            container_id: "nonexistent".into(),
        })
        .await
        .expect_err("unknown container");
    assert_eq!(err.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn a_pod_with_its_own_cgroup_reports_that_cgroup() {
    let crius = Crius::start().await;
    let parent = format!("/crius-test-stats-{}", std::process::id());
    let mut config = pod_config("stats-parent");
    config.hostname = String::new();
    config
        .linux
        .get_or_insert_with(Default::default)
        .cgroup_parent = parent.clone();
    config
        .linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
        .namespace_options = Some(crius::api::v1::NamespaceOption {
        network: crius::api::v1::NamespaceMode::Node as i32,
        ..Default::default()
    });
    let mut pod = pod_with(&crius, config).await;
    pod.run(container(
        "busy",
        "busybox:latest",
        &["sh", "-c", "while true; do :; done"],
    ))
    .await;
    let sample = |client: crius_testkit::CriClient, id: String| async move {
        let mut client = client;
        client
            .runtime
            .pod_sandbox_stats(PodSandboxStatsRequest { pod_sandbox_id: id })
            .await
            .expect("PodSandboxStats")
            .into_inner()
            .stats
            .and_then(|s| s.linux)
            .expect("linux stats")
    };
    // The background sampler (every second by default) has two samples of the pod's
    // cgroup and of its container by now: the first stats calls already carry rates.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let linux = sample(pod.client.clone(), pod.id.clone()).await;
    let rate = |cpu: Option<&crius::api::v1::CpuUsage>| {
        cpu.and_then(|c| c.usage_nano_cores.as_ref())
            .map_or(0, |v| v.value)
    };
    let cores = rate(linux.cpu.as_ref());
    assert!(
        cores > 100_000_000,
        "the pod cgroup includes its busy container (the suite shares the cores): {cores}"
    );
    let container_cores = rate(linux.containers.first().and_then(|c| c.cpu.as_ref()));
    assert!(
        container_cores > 100_000_000,
        "the busy container's rate on the first call: {container_cores}"
    );
    assert!(
        linux
            .process
            .and_then(|p| p.process_count)
            .is_some_and(|c| c.value >= 2)
    );
    pod.remove_pod().await;
    common::remove_cgroup(&parent);
}

#[tokio::test]
async fn cri_metrics_describe_and_report_cpu_memory_and_network() {
    let mut network = None;
    let crius = Crius::start_with(|c| network = Some(TestNetwork::install(c, 141)), &[]).await;
    let mut pod = pod_with(&crius, pod_config("stats-metrics")).await;
    let id = pod
        .run(container("app", "busybox:latest", &["sleep", "1000"]))
        .await;
    let descriptors = pod
        .client
        .runtime
        .list_metric_descriptors(crius::api::v1::ListMetricDescriptorsRequest {})
        .await
        .expect("ListMetricDescriptors")
        .into_inner()
        .descriptors;
    let keys: HashMap<String, usize> = descriptors
        .iter()
        .map(|d| (d.name.clone(), d.label_keys.len()))
        .collect();
    for name in [
        "container_cpu_usage_seconds_total",
        "container_memory_working_set_bytes",
        "container_network_receive_bytes_total",
    ] {
        assert!(keys.contains_key(name), "{name} described");
    }
    let pods = pod
        .client
        .runtime
        .list_pod_sandbox_metrics(crius::api::v1::ListPodSandboxMetricsRequest {})
        .await
        .expect("ListPodSandboxMetrics")
        .into_inner()
        .pod_metrics;
    assert_eq!(pods.len(), 1);
    let metrics = &pods[0];
    assert_eq!(metrics.pod_sandbox_id, pod.id);
    let rx = metrics
        .metrics
        .iter()
        .find(|m| m.name == "container_network_receive_bytes_total")
        .expect("network metrics for the pod");
    assert_eq!(rx.label_values.last().map(String::as_str), Some("eth0"));
    assert_eq!(rx.label_values.len(), keys[&rx.name]);
    let container = &metrics.container_metrics[0];
    assert_eq!(container.container_id, id);
    let working_set = container
        .metrics
        .iter()
        .find(|m| m.name == "container_memory_working_set_bytes")
        .expect("memory metric");
    assert_eq!(working_set.label_values.len(), keys[&working_set.name]);
    assert_eq!(working_set.label_values[0], "app");
    assert!(working_set.value.as_ref().is_some_and(|v| v.value > 0));
}
