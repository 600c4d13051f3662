//! Lifecycle benchmark: crius against containerd's built-in CRI plugin on the same machine,
//! driven by the same client with the same requests. Both run crius's pause program as the
//! sandbox image and busybox containers, each runtime with a bridge network of its own.
//!
//! It prints the median latency of each step of a pod's life (run the sandbox, create,
//! start, stop and remove a container, stop and remove the sandbox), the time to bring up
//! and tear down 10 pods at once, and the resident memory of the CRI daemons with those 10
//! pods running. Rounds alternate between the runtimes so that both see the same machine.
//!
//! Run with `make bench`: it starts the test bed and the CRI-enabled containerd
//! (`CRIUS_BENCH_CRI_CONTAINERD`, its pid file in `CRIUS_BENCH_CRI_CONTAINERD_PID`; the pid
//! file of the containerd crius uses in `CRIUS_BENCH_CONTAINERD_PID`).

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::pod::image;
use common::{Crius, TestNetwork, pod_config};
use crius::api::v1::{
    ContainerConfig, ContainerMetadata, CreateContainerRequest, ImageSpec, PodSandboxConfig,
    RemoveContainerRequest, RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest,
    StopContainerRequest, StopPodSandboxRequest,
};
use crius::client::CriClient;

const ROUNDS: usize = 20;
const PARALLEL_PODS: usize = 10;
const STEPS: [&str; 7] = [
    "RunPodSandbox",
    "CreateContainer",
    "StartContainer",
    "StopContainer",
    "RemoveContainer",
    "StopPodSandbox",
    "RemovePodSandbox",
];

struct Runtime {
    name: &'static str,
    client: CriClient,
    /// Per step, the latency of every measured round.
    samples: Vec<Vec<Duration>>,
}

fn median(samples: &[Duration]) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// A container that exits promptly on SIGTERM, as a well-behaved workload does.
fn workload(name: &str) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.to_string(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: image("busybox:latest"),
            ..Default::default()
        }),
        command: ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
            .map(String::from)
            .to_vec(),
        log_path: format!("{name}.log"),
        ..Default::default()
    }
}

fn pod(name: &str) -> PodSandboxConfig {
    let config = pod_config(name);
    std::fs::create_dir_all(&config.log_directory).expect("create the pod log directory");
    config
}

/// Runs a pod with one container, returning (pod id, container id) and each step's latency.
async fn bring_up(client: &mut CriClient, name: &str) -> (String, String, [Duration; 3]) {
    let config = pod(name);
    let t = Instant::now();
    let pod_id = client
        .runtime
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .expect("RunPodSandbox")
        .into_inner()
        .pod_sandbox_id;
    let run = t.elapsed();
    let t = Instant::now();
    let container_id = client
        .runtime
        .create_container(CreateContainerRequest {
            pod_sandbox_id: pod_id.clone(),
            config: Some(workload("app")),
            sandbox_config: Some(config),
        })
        .await
        .expect("CreateContainer")
        .into_inner()
        .container_id;
    let create = t.elapsed();
    let t = Instant::now();
    client
        .runtime
        .start_container(StartContainerRequest {
            container_id: container_id.clone(),
        })
        .await
        .expect("StartContainer");
    (pod_id, container_id, [run, create, t.elapsed()])
}

/// Stops and removes the container and the pod, returning each step's latency.
async fn tear_down(client: &mut CriClient, pod_id: &str, container_id: &str) -> [Duration; 4] {
    let t = Instant::now();
    client
        .runtime
        .stop_container(StopContainerRequest {
            container_id: container_id.to_string(),
            timeout: 10,
        })
        .await
        .expect("StopContainer");
    let stop = t.elapsed();
    let t = Instant::now();
    client
        .runtime
        .remove_container(RemoveContainerRequest {
            container_id: container_id.to_string(),
        })
        .await
        .expect("RemoveContainer");
    let remove = t.elapsed();
    let t = Instant::now();
    client
        .runtime
        .stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: pod_id.to_string(),
        })
        .await
        .expect("StopPodSandbox");
    let stop_pod = t.elapsed();
    let t = Instant::now();
    client
        .runtime
        .remove_pod_sandbox(RemovePodSandboxRequest {
            pod_sandbox_id: pod_id.to_string(),
        })
        .await
        .expect("RemovePodSandbox");
    [stop, remove, stop_pod, t.elapsed()]
}

async fn one_lifecycle(runtime: &mut Runtime, name: &str, measured: bool) {
    let (pod_id, container_id, up) = bring_up(&mut runtime.client, name).await;
    let down = tear_down(&mut runtime.client, &pod_id, &container_id).await;
    if measured {
        for (step, latency) in up.into_iter().chain(down).enumerate() {
            runtime.samples[step].push(latency);
        }
    }
}

/// Brings up `PARALLEL_PODS` pods at once, calls `with_pods_running`, then tears them down
/// at once; returns both wall times.
async fn parallel(
    runtime: &Runtime,
    prefix: &str,
    with_pods_running: impl FnOnce(),
) -> [Duration; 2] {
    let t = Instant::now();
    let ups = (0..PARALLEL_PODS).map(|i| {
        let mut client = runtime.client.clone();
        let name = format!("{prefix}-{i}");
        tokio::spawn(async move { bring_up(&mut client, &name).await })
    });
    let mut pods = Vec::new();
    for up in ups.collect::<Vec<_>>() {
        let (pod_id, container_id, _) = up.await.expect("bring-up task");
        pods.push((pod_id, container_id));
    }
    let up = t.elapsed();
    with_pods_running();
    let t = Instant::now();
    let downs = pods.into_iter().map(|(pod_id, container_id)| {
        let mut client = runtime.client.clone();
        tokio::spawn(async move { tear_down(&mut client, &pod_id, &container_id).await })
    });
    for down in downs.collect::<Vec<_>>() {
        down.await.expect("tear-down task");
    }
    [up, t.elapsed()]
}

fn rss_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS")
        / 1024
}

fn pid_from_file(var: &str) -> u32 {
    let path = std::env::var(var).unwrap_or_else(|_| panic!("{var} is not set: use `make bench`"));
    std::fs::read_to_string(Path::new(&path))
        .expect("read pid file")
        .trim()
        .parse()
        .expect("pid")
}

async fn pull_images(client: &mut CriClient) {
    for name in ["busybox:latest", "bench/pause:1"] {
        common::pod::pull(client, name).await;
    }
}

#[tokio::main]
async fn main() {
    let cri_socket = std::env::var("CRIUS_BENCH_CRI_CONTAINERD")
        .expect("CRIUS_BENCH_CRI_CONTAINERD is not set: use `make bench`");
    let mut network = None;
    let crius = Crius::start_with(
        |config| {
            network = Some(TestNetwork::install(config, 150));
            config.image.sandbox_image = image("bench/pause:1");
            // containerd logs at info too.
            config.log.level = "info".to_string();
        },
        &[],
    )
    .await;
    let mut runtimes = [
        Runtime {
            name: "crius",
            client: crius.client().await,
            samples: vec![Vec::new(); STEPS.len()],
        },
        Runtime {
            name: "containerd CRI",
            client: CriClient::connect(Path::new(&cri_socket))
                .await
                .expect("connect to containerd's CRI"),
            samples: vec![Vec::new(); STEPS.len()],
        },
    ];
    for runtime in &mut runtimes {
        pull_images(&mut runtime.client).await;
        one_lifecycle(runtime, "bench-warm-up", false).await;
    }
    for round in 0..ROUNDS {
        for runtime in &mut runtimes {
            one_lifecycle(runtime, &format!("bench-{round}"), true).await;
        }
    }

    println!(
        "{:<28} {:>10} {:>14}",
        format!("median of {ROUNDS} rounds"),
        runtimes[0].name,
        runtimes[1].name
    );
    for (step, name) in STEPS.iter().enumerate() {
        println!(
            "{name:<28} {:>10} {:>14}",
            ms(median(&runtimes[0].samples[step])),
            ms(median(&runtimes[1].samples[step]))
        );
    }
    let total = |r: &Runtime| -> Duration { r.samples.iter().map(|s| median(s)).sum() };
    println!(
        "{:<28} {:>10} {:>14}",
        "sum of the medians",
        ms(total(&runtimes[0])),
        ms(total(&runtimes[1]))
    );

    let crius_pid = crius.pid().as_raw() as u32;
    let containerd_pid = pid_from_file("CRIUS_BENCH_CONTAINERD_PID");
    let cri_containerd_pid = pid_from_file("CRIUS_BENCH_CRI_CONTAINERD_PID");
    let mut crius_rss = (0, 0);
    let crius_times = parallel(&runtimes[0], "bench-par", || {
        crius_rss = (rss_of(crius_pid), rss_of(containerd_pid));
    })
    .await;
    let mut cri_rss = 0;
    let cri_times = parallel(&runtimes[1], "bench-par", || {
        cri_rss = rss_of(cri_containerd_pid);
    })
    .await;
    println!(
        "{PARALLEL_PODS} pods at once: up    {:>10} {:>14}",
        ms(crius_times[0]),
        ms(cri_times[0])
    );
    println!(
        "{PARALLEL_PODS} pods at once: down  {:>10} {:>14}",
        ms(crius_times[1]),
        ms(cri_times[1])
    );
    println!(
        "RSS with {PARALLEL_PODS} pods: crius {} MiB + its containerd {} MiB; containerd with CRI {} MiB",
        crius_rss.0, crius_rss.1, cri_rss
    );
    drop(network);
}
