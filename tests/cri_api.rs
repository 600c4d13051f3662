//! What the CRI of Kubernetes 1.36 (cri-api v0.36) adds: the list streams over gRPC and
//! ttrpc, GetContainerEvents over ttrpc, UpdatePodSandboxResources, the features `Status`
//! advertises, `ContainerStatus.user` and stop signals, idempotent Stop/Remove, and the
//! older `v1alpha2` API served for every RPC family.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::pod::{container, image, log_contains, pod, pod_with};
use common::{Crius, pod_config};
use crius::api::v1::{
    self, ContainerFilter, ContainerStatsFilter, LinuxContainerResources,
    LinuxContainerSecurityContext, ListContainerStatsRequest, ListContainersRequest,
    ListImagesRequest, ListPodSandboxMetricsRequest, ListPodSandboxRequest,
    ListPodSandboxStatsRequest, PodSandboxStatusRequest, Signal, StatusRequest,
    StreamContainerStatsRequest, StreamContainersRequest, StreamImagesRequest,
    StreamPodSandboxMetricsRequest, StreamPodSandboxStatsRequest, StreamPodSandboxesRequest,
    UpdatePodSandboxResourcesRequest,
};
use crius::api::v1alpha2;
use crius_testkit::{CriClientV1alpha2, TtrpcCriClient};
use futures::StreamExt;

const RUNTIME: &str = "runtime.v1.RuntimeService";
const IMAGES: &str = "runtime.v1.ImageService";

/// Every message of a gRPC server stream.
async fn collect<T>(stream: tonic::Streaming<T>) -> Vec<T> {
    stream
        .map(|m| m.expect("stream message"))
        .collect::<Vec<_>>()
        .await
}

#[tokio::test]
async fn list_streams_match_their_list_twins_over_grpc_and_ttrpc() {
    let crius = Crius::start().await;
    let mut first = pod(&crius, "streams-a").await;
    let mut second = pod(&crius, "streams-b").await;
    let a1 = first
        .run(container("one", "busybox:latest", &["sleep", "1000"]))
        .await;
    first
        .run(container("two", "busybox:latest", &["sleep", "1000"]))
        .await;
    second
        .run(container("three", "busybox:latest", &["sleep", "1000"]))
        .await;
    let mut client = crius.client().await;
    let ttrpc = TtrpcCriClient::connect(crius.ttrpc_socket())
        .await
        .expect("connect ttrpc");

    // Pods.
    let listed: BTreeSet<String> = client
        .runtime
        .list_pod_sandbox(ListPodSandboxRequest::default())
        .await
        .unwrap()
        .into_inner()
        .items
        .into_iter()
        .map(|p| p.id)
        .collect();
    assert_eq!(listed.len(), 2);
    let streamed = collect(
        client
            .runtime
            .stream_pod_sandboxes(StreamPodSandboxesRequest::default())
            .await
            .unwrap()
            .into_inner(),
    )
    .await;
    let ids = |items: Vec<v1::StreamPodSandboxesResponse>| -> BTreeSet<String> {
        items
            .into_iter()
            .flat_map(|m| m.pod_sandboxes)
            .map(|p| p.id)
            .collect()
    };
    assert_eq!(ids(streamed), listed);
    let over_ttrpc: Vec<v1::StreamPodSandboxesResponse> = ttrpc
        .call_stream(
            RUNTIME,
            "StreamPodSandboxes",
            &StreamPodSandboxesRequest::default(),
        )
        .await
        .expect("ttrpc StreamPodSandboxes");
    assert_eq!(ids(over_ttrpc), listed);

    // Containers, with the same filters as ListContainers.
    let filter = ContainerFilter {
        pod_sandbox_id: first.id.clone(),
        ..Default::default()
    };
    let listed: BTreeSet<String> = client
        .runtime
        .list_containers(ListContainersRequest {
            filter: Some(filter.clone()),
        })
        .await
        .unwrap()
        .into_inner()
        .containers
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(listed.len(), 2);
    assert!(listed.contains(&a1));
    let request = StreamContainersRequest {
        filter: Some(filter),
    };
    let ids = |items: Vec<v1::StreamContainersResponse>| -> BTreeSet<String> {
        items
            .into_iter()
            .flat_map(|m| m.containers)
            .map(|c| c.id)
            .collect()
    };
    let streamed = collect(
        client
            .runtime
            .stream_containers(request.clone())
            .await
            .unwrap()
            .into_inner(),
    )
    .await;
    assert_eq!(ids(streamed), listed);
    let over_ttrpc = ttrpc
        .call_stream(RUNTIME, "StreamContainers", &request)
        .await
        .expect("ttrpc StreamContainers");
    assert_eq!(ids(over_ttrpc), listed);
    // A filter that matches nothing streams nothing.
    let none = ttrpc
        .call_stream::<_, v1::StreamContainersResponse>(
            RUNTIME,
            "StreamContainers",
            &StreamContainersRequest {
                filter: Some(ContainerFilter {
                    id: "nosuchcontainer".into(),
                    ..Default::default()
                }),
            },
        )
        .await
        .unwrap();
    assert!(ids(none).is_empty());

    // Container stats, pod stats and pod metrics.
    let stats_filter = ContainerStatsFilter {
        pod_sandbox_id: second.id.clone(),
        ..Default::default()
    };
    let listed = client
        .runtime
        .list_container_stats(ListContainerStatsRequest {
            filter: Some(stats_filter.clone()),
        })
        .await
        .unwrap()
        .into_inner()
        .stats;
    let streamed: Vec<v1::ContainerStats> = collect(
        client
            .runtime
            .stream_container_stats(StreamContainerStatsRequest {
                filter: Some(stats_filter.clone()),
            })
            .await
            .unwrap()
            .into_inner(),
    )
    .await
    .into_iter()
    .flat_map(|m| m.container_stats)
    .collect();
    let attribute_ids = |stats: &[v1::ContainerStats]| -> Vec<String> {
        stats
            .iter()
            .map(|s| s.attributes.as_ref().unwrap().id.clone())
            .collect()
    };
    assert_eq!(attribute_ids(&streamed), attribute_ids(&listed));
    assert_eq!(streamed.len(), 1);
    assert!(streamed[0].memory.is_some(), "stats carry usage");
    let over_ttrpc: Vec<v1::StreamContainerStatsResponse> = ttrpc
        .call_stream(
            RUNTIME,
            "StreamContainerStats",
            &StreamContainerStatsRequest {
                filter: Some(stats_filter),
            },
        )
        .await
        .unwrap();
    assert_eq!(
        over_ttrpc
            .iter()
            .map(|m| m.container_stats.len())
            .sum::<usize>(),
        1
    );

    let pods_listed = client
        .runtime
        .list_pod_sandbox_stats(ListPodSandboxStatsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .stats
        .len();
    let pods_streamed: usize = ttrpc
        .call_stream::<_, v1::StreamPodSandboxStatsResponse>(
            RUNTIME,
            "StreamPodSandboxStats",
            &StreamPodSandboxStatsRequest::default(),
        )
        .await
        .unwrap()
        .iter()
        .map(|m| m.pod_sandbox_stats.len())
        .sum();
    assert_eq!((pods_listed, pods_streamed), (2, 2));
    let metrics_listed = client
        .runtime
        .list_pod_sandbox_metrics(ListPodSandboxMetricsRequest {})
        .await
        .unwrap()
        .into_inner()
        .pod_metrics
        .len();
    let metrics_streamed: usize = collect(
        client
            .runtime
            .stream_pod_sandbox_metrics(StreamPodSandboxMetricsRequest {})
            .await
            .unwrap()
            .into_inner(),
    )
    .await
    .iter()
    .map(|m| m.pod_sandbox_metrics.len())
    .sum();
    assert_eq!(metrics_streamed, metrics_listed);
    assert_eq!(metrics_streamed, 2);

    // Images.
    let listed: BTreeSet<String> = client
        .image
        .list_images(ListImagesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .images
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert!(listed.len() >= 3, "{listed:?}");
    let streamed: BTreeSet<String> = collect(
        client
            .image
            .stream_images(StreamImagesRequest::default())
            .await
            .unwrap()
            .into_inner(),
    )
    .await
    .into_iter()
    .flat_map(|m| m.images)
    .map(|i| i.id)
    .collect();
    assert_eq!(streamed, listed);
    let over_ttrpc: BTreeSet<String> = ttrpc
        .call_stream::<_, v1::StreamImagesResponse>(
            IMAGES,
            "StreamImages",
            &StreamImagesRequest::default(),
        )
        .await
        .unwrap()
        .into_iter()
        .flat_map(|m| m.images)
        .map(|i| i.id)
        .collect();
    assert_eq!(over_ttrpc, listed);

    // Streams have no v1alpha2 twin.
    let err = ttrpc
        .call_stream::<_, v1::StreamImagesResponse>(
            "runtime.v1alpha2.ImageService",
            "StreamImages",
            &StreamImagesRequest::default(),
        )
        .await
        .expect_err("no v1alpha2 stream");
    assert_eq!(err.code(), tonic::Code::Unimplemented);

    first.remove_pod().await;
    second.remove_pod().await;
}

#[tokio::test]
async fn container_events_stream_over_ttrpc() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "ttrpc-events").await;
    let ttrpc = TtrpcCriClient::connect(crius.ttrpc_socket())
        .await
        .expect("connect ttrpc");
    let mut events = ttrpc
        .open_stream(RUNTIME, "GetContainerEvents", &v1::GetEventsRequest {})
        .await
        .expect("subscribe over ttrpc");
    let id = pod
        .run(container("evented", "busybox:latest", &["sleep", "1000"]))
        .await;
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while seen.len() < 2 {
        let next = tokio::time::timeout_at(
            deadline,
            TtrpcCriClient::next_message::<v1::ContainerEventResponse>(&mut events),
        )
        .await
        .expect("events in time")
        .expect("an event")
        .expect("the stream stays open");
        if next.container_id == id {
            seen.push(next.container_event_type);
        }
    }
    assert_eq!(
        seen,
        vec![
            v1::ContainerEventType::ContainerCreatedEvent as i32,
            v1::ContainerEventType::ContainerStartedEvent as i32
        ]
    );
    pod.remove_pod().await;
}

/// Whether `runc features` lists the `rro` mount option (runc ≥ 1.1 does).
fn runc_knows_rro() -> bool {
    let out = std::process::Command::new("runc")
        .arg("features")
        .output()
        .expect("run runc features");
    let features: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    features["mountOptions"]
        .as_array()
        .is_some_and(|o| o.iter().any(|v| v == "rro"))
}

#[tokio::test]
async fn status_advertises_what_each_handler_supports() {
    // An OCI runtime that is runc but says it knows no `rro`.
    let bin = tempfile::tempdir().unwrap();
    let norro = bin.path().join("runc-without-rro");
    std::fs::write(
        &norro,
        "#!/bin/sh\nif [ \"$1\" = features ]; then echo '{\"mountOptions\": [\"ro\"]}'; exit 0; fi\nexec runc \"$@\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&norro, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let norro_path = norro.display().to_string();
    let crius = Crius::start_with(
        |c| {
            let mut missing = c.containerd.runtimes["runc"].clone();
            missing.options.binary_name = "/nonexistent/oci-runtime".into();
            c.containerd.runtimes.insert("gone".into(), missing);
            let mut limited = c.containerd.runtimes["runc"].clone();
            limited.options.binary_name = norro_path;
            c.containerd.runtimes.insert("norro".into(), limited);
        },
        &[],
    )
    .await;
    let status = crius
        .client()
        .await
        .runtime
        .status(StatusRequest { verbose: false })
        .await
        .unwrap()
        .into_inner();
    assert!(status.features.unwrap().supplemental_groups_policy);
    let rro = |name: &str| {
        status
            .runtime_handlers
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no handler {name:?}"))
            .features
            .unwrap()
            .recursive_read_only_mounts
    };
    let expected = runc_knows_rro();
    assert_eq!(rro(""), expected, "the default handler is runc");
    assert_eq!(rro("runc"), expected);
    assert!(!rro("gone"), "a runtime that cannot answer has no rro");
    assert!(!rro("norro"));

    // A recursive read-only mount on that handler is refused, not silently made writable.
    let mut config = pod_config("norro");
    config.hostname = String::new();
    config
        .linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
        .namespace_options = Some(v1::NamespaceOption {
        network: v1::NamespaceMode::Node as i32,
        ..Default::default()
    });
    let mut client = crius.client().await;
    client
        .image
        .pull_image(v1::PullImageRequest {
            image: Some(v1::ImageSpec {
                image: image("busybox:latest"),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    let pod_id = client
        .runtime
        .run_pod_sandbox(v1::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: "norro".into(),
        })
        .await
        .expect("a pod on the norro handler")
        .into_inner()
        .pod_sandbox_id;
    let mut rro_container = container("rro", "busybox:latest", &["sleep", "1000"]);
    rro_container.mounts.push(v1::Mount {
        container_path: "/mnt".into(),
        host_path: bin.path().display().to_string(),
        readonly: true,
        recursive_read_only: true,
        ..Default::default()
    });
    let err = client
        .runtime
        .create_container(v1::CreateContainerRequest {
            pod_sandbox_id: pod_id.clone(),
            config: Some(rro_container),
            sandbox_config: Some(config),
        })
        .await
        .expect_err("rro on a runtime without it");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("recursive read-only"),
        "{}",
        err.message()
    );
    client
        .runtime
        .remove_pod_sandbox(v1::RemovePodSandboxRequest {
            pod_sandbox_id: pod_id,
        })
        .await
        .unwrap();
    // runc takes pods in their own user namespace on this host (tests/userns.rs).
    for name in ["", "runc"] {
        let handler = status.runtime_handlers.iter().find(|h| h.name == name);
        assert!(
            handler.is_some_and(|h| h.features.is_some_and(|f| f.user_namespaces)),
            "{name:?}: {handler:?}"
        );
    }
}

#[tokio::test]
async fn container_status_reports_the_user_and_the_stop_signal() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "user-signal").await;
    let mut config = container("user", "busybox:latest", &["sleep", "1000"]);
    // What kubelet puts in the ImageSpec comes back in the status.
    if let Some(spec) = config.image.as_mut() {
        spec.user_specified_image = "busybox".into();
        spec.runtime_handler = "runc".into();
    }
    config.linux = Some(v1::LinuxContainerConfig {
        security_context: Some(LinuxContainerSecurityContext {
            run_as_username: "user".into(),
            supplemental_groups: vec![4242],
            ..Default::default()
        }),
        ..Default::default()
    });
    config.stop_signal = Signal::Sigint as i32;
    let id = pod.run(config).await;
    let (status, _) = pod.status(&id).await;
    let user = status
        .user
        .and_then(|u| u.linux)
        .expect("ContainerStatus.user");
    assert_eq!((user.uid, user.gid), (1000, 1000));
    // Its own group, and the image's /etc/group lists `user` in `users` (100): merged,
    // with the requested one.
    let mut groups = user.supplemental_groups.clone();
    groups.sort();
    assert_eq!(groups, vec![100, 1000, 4242]);
    let (stdout, _, code) = pod.exec(&id, &["id", "-G"], 10).await.expect("exec");
    assert_eq!(code, 0);
    let mut inside: Vec<i64> = stdout
        .split_whitespace()
        .map(|g| g.parse().unwrap())
        .collect();
    inside.sort();
    assert_eq!(inside, vec![100, 1000, 4242], "the process runs with them");
    assert_eq!(status.stop_signal, Signal::Sigint as i32);
    // Resources are reported even for a container that asked for none (as containerd does).
    assert!(
        status
            .resources
            .as_ref()
            .and_then(|r| r.linux.as_ref())
            .is_some(),
        "{:?}",
        status.resources
    );

    // Without one in the config: the image's STOPSIGNAL, else SIGTERM.
    let from_image = pod
        .run(container(
            "entry",
            "busybox-entry:latest",
            &["sleep", "1000"],
        ))
        .await;
    assert_eq!(
        pod.status(&from_image).await.0.stop_signal,
        Signal::Sigusr1 as i32
    );
    let default = pod
        .run(container("plain", "busybox:latest", &["sleep", "1000"]))
        .await;
    assert_eq!(
        pod.status(&default).await.0.stop_signal,
        Signal::Sigterm as i32
    );

    // The config's signal is the one StopContainer sends: a shell that traps only SIGINT
    // exits at once with its own code.
    let mut trapper = container(
        "trapper",
        "busybox:latest",
        &[
            "sh",
            "-c",
            "trap 'exit 7' INT; echo trapped; while true; do sleep 0.1; done",
        ],
    );
    trapper.stop_signal = Signal::Sigint as i32;
    let trapper = pod.run(trapper).await;
    assert!(log_contains(&pod.log_path("trapper"), "trapped").await);
    pod.stop(&trapper, 30).await;
    assert_eq!(pod.status(&trapper).await.0.exit_code, 7);
    pod.remove_pod().await;
}

/// The cgroup v1 or v2 file of `controller` for cgroup `path`.
fn cgroup_file(controller: &str, path: &str, file: &str) -> std::path::PathBuf {
    let v1 = std::path::Path::new("/sys/fs/cgroup").join(controller);
    if v1.is_dir() {
        v1.join(path.trim_start_matches('/')).join(file)
    } else {
        std::path::Path::new("/sys/fs/cgroup")
            .join(path.trim_start_matches('/'))
            .join(file)
    }
}

#[tokio::test]
async fn update_pod_sandbox_resources_is_kept_and_applied_to_the_pod_cgroup() {
    let crius = Crius::start().await;
    let parent = format!("/crius-test-resize-{}", std::process::id());
    let mut config = pod_config("resize");
    config.hostname = String::new();
    let linux = config.linux.get_or_insert_with(Default::default);
    linux.cgroup_parent = parent.clone();
    linux
        .security_context
        .get_or_insert_with(Default::default)
        .namespace_options = Some(v1::NamespaceOption {
        network: v1::NamespaceMode::Node as i32,
        ..Default::default()
    });
    let mut pod = pod_with(&crius, config).await;
    pod.run(container("app", "busybox:latest", &["sleep", "1000"]))
        .await;
    let resources = LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 150_000,
        cpu_shares: 1536,
        memory_limit_in_bytes: 256 << 20,
        ..Default::default()
    };
    pod.client
        .runtime
        .update_pod_sandbox_resources(UpdatePodSandboxResourcesRequest {
            pod_sandbox_id: pod.id.clone(),
            overhead: None,
            resources: Some(resources.clone()),
        })
        .await
        .expect("UpdatePodSandboxResources");

    let v2 = !std::path::Path::new("/sys/fs/cgroup/memory").is_dir();
    let read = |controller: &str, file: &str| {
        std::fs::read_to_string(cgroup_file(controller, &parent, file))
            .unwrap_or_else(|e| panic!("{controller}/{file}: {e}"))
            .trim()
            .to_string()
    };
    if v2 {
        assert_eq!(read("", "memory.max"), (256u64 << 20).to_string());
        assert_eq!(read("", "cpu.max"), "150000 100000");
    } else {
        assert_eq!(
            read("memory", "memory.limit_in_bytes"),
            (256u64 << 20).to_string()
        );
        assert_eq!(read("cpu", "cpu.cfs_quota_us"), "150000");
        assert_eq!(read("cpu", "cpu.shares"), "1536");
    }

    // Kept in the sandbox's config, which survives a restart of crius.
    let kept_memory_limit = |mut client: crius_testkit::CriClient, id: String| async move {
        let status = client
            .runtime
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id,
                verbose: true,
            })
            .await
            .unwrap()
            .into_inner();
        let info: serde_json::Value = serde_json::from_str(&status.info["info"]).unwrap();
        info["config"]["linux"]["resources"]["memory_limit_in_bytes"].clone()
    };
    assert_eq!(
        kept_memory_limit(pod.client.clone(), pod.id.clone()).await,
        256 << 20
    );

    if !v2 {
        // Limits the pod cgroup refuses (memory below what the pod uses: cgroup v1 answers
        // EBUSY, v2 would OOM-kill instead) are not recorded as the pod's.
        let refused = pod
            .client
            .runtime
            .update_pod_sandbox_resources(UpdatePodSandboxResourcesRequest {
                pod_sandbox_id: pod.id.clone(),
                overhead: None,
                resources: Some(LinuxContainerResources {
                    memory_limit_in_bytes: 4096,
                    ..resources.clone()
                }),
            })
            .await
            .expect_err("a limit below the pod's usage");
        assert_eq!(refused.code(), tonic::Code::Internal, "{refused:?}");
        assert_eq!(
            kept_memory_limit(pod.client.clone(), pod.id.clone()).await,
            256 << 20
        );
    }

    let err = pod
        .client
        .runtime
        .update_pod_sandbox_resources(UpdatePodSandboxResourcesRequest {
            pod_sandbox_id: "nosuchpod".into(),
            overhead: None,
            resources: Some(resources),
        })
        .await
        .expect_err("unknown pod");
    assert_eq!(err.code(), tonic::Code::NotFound);

    pod.remove_pod().await;
    common::remove_cgroup(&parent);
}

#[tokio::test]
async fn v1alpha2_serves_every_rpc_family_over_grpc_and_ttrpc() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "alpha").await;
    let id = pod
        .run(container("alpha", "busybox:latest", &["sleep", "1000"]))
        .await;
    let mut alpha = CriClientV1alpha2::connect(crius.grpc_socket())
        .await
        .expect("connect v1alpha2");
    let ttrpc = TtrpcCriClient::connect(crius.ttrpc_socket())
        .await
        .expect("connect ttrpc");
    const ALPHA_RUNTIME: &str = "runtime.v1alpha2.RuntimeService";
    const ALPHA_IMAGES: &str = "runtime.v1alpha2.ImageService";

    // Runtime info.
    let status = alpha
        .runtime
        .status(v1alpha2::StatusRequest { verbose: false })
        .await
        .unwrap()
        .into_inner();
    let conditions = status.status.unwrap().conditions;
    assert!(
        conditions
            .iter()
            .any(|c| c.r#type == "RuntimeReady" && c.status),
        "{conditions:?}"
    );
    let status: v1alpha2::StatusResponse = ttrpc
        .call(
            ALPHA_RUNTIME,
            "Status",
            &v1alpha2::StatusRequest { verbose: false },
        )
        .await
        .unwrap();
    assert_eq!(status.status.unwrap().conditions.len(), 2);

    // Sandboxes.
    let pods = alpha
        .runtime
        .list_pod_sandbox(v1alpha2::ListPodSandboxRequest::default())
        .await
        .unwrap()
        .into_inner()
        .items;
    assert_eq!(
        pods.iter().map(|p| p.id.clone()).collect::<Vec<_>>(),
        vec![pod.id.clone()]
    );
    let sandbox: v1alpha2::PodSandboxStatusResponse = ttrpc
        .call(
            ALPHA_RUNTIME,
            "PodSandboxStatus",
            &v1alpha2::PodSandboxStatusRequest {
                pod_sandbox_id: pod.id.clone(),
                verbose: false,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        sandbox.status.unwrap().state,
        v1alpha2::PodSandboxState::SandboxReady as i32
    );

    // Containers.
    let containers = alpha
        .runtime
        .list_containers(v1alpha2::ListContainersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert_eq!(containers.len(), 1);
    assert_eq!(containers[0].id, id);
    let container: v1alpha2::ContainerStatusResponse = ttrpc
        .call(
            ALPHA_RUNTIME,
            "ContainerStatus",
            &v1alpha2::ContainerStatusRequest {
                container_id: id.clone(),
                verbose: false,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        container.status.unwrap().state,
        v1alpha2::ContainerState::ContainerRunning as i32
    );
    let exec = alpha
        .runtime
        .exec_sync(v1alpha2::ExecSyncRequest {
            container_id: id.clone(),
            cmd: vec!["echo".into(), "alpha".into()],
            timeout: 10,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(exec.stdout, b"alpha\n");

    // Stats.
    let stats = alpha
        .runtime
        .list_container_stats(v1alpha2::ListContainerStatsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .stats;
    assert_eq!(stats.len(), 1);
    let stats: v1alpha2::ContainerStatsResponse = ttrpc
        .call(
            ALPHA_RUNTIME,
            "ContainerStats",
            &v1alpha2::ContainerStatsRequest {
                container_id: id.clone(),
            },
        )
        .await
        .unwrap();
    assert!(stats.stats.unwrap().memory.is_some());

    // Images.
    let busybox = image("busybox:latest");
    let images = alpha
        .image
        .list_images(v1alpha2::ListImagesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .images;
    assert!(images.iter().any(|i| i.repo_tags.contains(&busybox)));
    let found: v1alpha2::ImageStatusResponse = ttrpc
        .call(
            ALPHA_IMAGES,
            "ImageStatus",
            &v1alpha2::ImageStatusRequest {
                image: Some(v1alpha2::ImageSpec {
                    image: busybox.clone(),
                    ..Default::default()
                }),
                verbose: false,
            },
        )
        .await
        .unwrap();
    assert!(found.image.unwrap().repo_tags.contains(&busybox));
    let fs: v1alpha2::ImageFsInfoResponse = ttrpc
        .call(
            ALPHA_IMAGES,
            "ImageFsInfo",
            &v1alpha2::ImageFsInfoRequest {},
        )
        .await
        .unwrap();
    assert_eq!(fs.image_filesystems.len(), 1);

    // Idempotent removal through v1alpha2 as well.
    alpha
        .runtime
        .stop_container(v1alpha2::StopContainerRequest {
            container_id: "nosuchcontainer".into(),
            timeout: 0,
        })
        .await
        .expect("stop of an unknown container");
    let _: v1alpha2::RemoveImageResponse = ttrpc
        .call(
            ALPHA_IMAGES,
            "RemoveImage",
            &v1alpha2::RemoveImageRequest {
                image: Some(v1alpha2::ImageSpec {
                    image: "nosuch/image:gone".into(),
                    ..Default::default()
                }),
            },
        )
        .await
        .expect("remove of an unknown image");
    pod.remove_pod().await;
}

#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs --features failpoints (make test has it)"
)]
async fn a_client_that_gives_up_never_cuts_a_create_in_half() {
    let crius = Crius::start_with_failpoints("container_after_record=sleep(2500)").await;
    let mut pod = pod(&crius, "given-up").await;
    let mut request = tonic::Request::new(v1::CreateContainerRequest {
        pod_sandbox_id: pod.id.clone(),
        config: Some(container("patient", "busybox:latest", &["sleep", "1000"])),
        sandbox_config: Some(pod.config.clone()),
    });
    request.set_timeout(Duration::from_millis(500));
    let err = pod
        .client
        .runtime
        .create_container(request)
        .await
        .expect_err("the client's deadline passes first");
    // crius answers DEADLINE_EXCEEDED a little early; on a loaded machine the client's own
    // timer (CANCELLED) can still win. Either way the client gave up.
    assert!(
        matches!(
            err.code(),
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        ),
        "{err:?}"
    );

    // The create goes on to the end: the container is whole, CREATED, with its name, and
    // it starts and is removed like any other.
    let listed = common::eventually(Duration::from_secs(10), || {
        let mut client = pod.client.clone();
        async move {
            client
                .runtime
                .list_containers(ListContainersRequest::default())
                .await
                .unwrap()
                .into_inner()
                .containers
                .iter()
                .any(|c| c.state == v1::ContainerState::ContainerCreated as i32)
        }
    })
    .await;
    assert!(
        listed,
        "the create did not finish; crius log:\n{}",
        crius.log()
    );
    let containers = pod
        .client
        .runtime
        .list_containers(ListContainersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert_eq!(containers.len(), 1);
    let id = containers[0].id.clone();
    assert_eq!(containers[0].metadata.as_ref().unwrap().name, "patient");
    pod.start(&id)
        .await
        .expect("start the container the first attempt made");
    assert!(crius.ctr(&["tasks", "ls"]).contains(&id));
    pod.remove(&id).await;
    // Its name is free again.
    pod.create(container("patient", "busybox:latest", &["true"]))
        .await
        .expect("the name is free after removal");
    pod.remove_pod().await;
}

/// The RPCs a cri-api proto defines: (`package.Service`, method, whether it streams).
fn rpcs_of(proto: &str) -> Vec<(String, String, bool)> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(proto))
        .expect("read the proto");
    let package = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("package "))
        .map(|p| p.trim_end_matches(';').to_string())
        .expect("a package line");
    let mut service = String::new();
    let mut rpcs = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("service ") {
            service = format!("{package}.{}", rest.trim_end_matches('{').trim());
        } else if let Some(rest) = line.strip_prefix("rpc ") {
            let method = rest.split('(').next().unwrap_or_default().to_string();
            let streams = rest.contains("returns (stream ");
            rpcs.push((service.clone(), method, streams));
        }
    }
    rpcs
}

#[tokio::test]
async fn every_rpc_of_both_protos_is_served_over_ttrpc() {
    let crius = Crius::start().await;
    let ttrpc = TtrpcCriClient::connect(crius.ttrpc_socket())
        .await
        .expect("connect ttrpc");
    let v1_rpcs = rpcs_of("protos/cri-api/runtime/v1/api.proto");
    let alpha_rpcs = rpcs_of("protos/cri-api/runtime/v1alpha2/api.proto");
    assert_eq!(v1_rpcs.len(), 41, "cri-api v0.36 has 41 RPCs");
    assert_eq!(alpha_rpcs.len(), 29);
    // What an unserved method looks like, so the check below can tell.
    let unknown = ttrpc
        .call::<_, ()>(RUNTIME, "NoSuchMethod", &v1::VersionRequest::default())
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::Unimplemented);
    assert_eq!(unknown.message(), "NoSuchMethod method");
    for (service, method, streams) in v1_rpcs.into_iter().chain(alpha_rpcs) {
        // An empty request: each handler answers it (often INVALID_ARGUMENT); a method the
        // server does not have is ttrpc's own "<method> method" UNIMPLEMENTED.
        let outcome = if streams {
            let mut stream = ttrpc
                .open_stream(&service, &method, &v1::VersionRequest::default())
                .await
                .expect("open the stream");
            match tokio::time::timeout(
                Duration::from_secs(1),
                TtrpcCriClient::next_message::<()>(&mut stream),
            )
            .await
            {
                // An event stream stays open, quiet: it is served.
                Err(_) => Ok(()),
                Ok(result) => result.map(|_| ()),
            }
        } else {
            ttrpc
                .call::<_, ()>(&service, &method, &v1::VersionRequest::default())
                .await
                .map(|_| ())
        };
        if let Err(status) = outcome {
            assert!(
                !(status.code() == tonic::Code::Unimplemented
                    && status.message() == format!("{method} method")),
                "{service}/{method} is not served over ttrpc: {status:?}"
            );
            assert!(
                !status.message().contains("service does not exist"),
                "{service} is not served over ttrpc: {status:?}"
            );
        }
    }
}
