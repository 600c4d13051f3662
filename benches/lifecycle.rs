//! The comparison benchmark: crius against containerd's built-in CRI plugin on the same
//! machine, driven by the same client with the same requests. Both have crius's pause
//! program as the sandbox image (containerd's CRI runs it; crius's shim holds its pods
//! without one) and busybox containers, each runtime with a bridge network of its own.
//!
//! It prints one table per containerd line (`make bench` runs it beside 1.6 and 2.x, each
//! against that line's own CRI): the median latency of every CRI operation a pod's life and kubelet's
//! polling use (the lifecycle steps, ExecSync, PullImage of a present image, RemoveImage,
//! and the reads, Version over a new connection among them, five samples of each a round),
//! both daemons side by side with their ratio; then the time to bring up and tear down 50
//! pods (10 at a time) and the resident memory of the CRI daemons with those 50 pods running
//! (5 s after the last came up). Rounds alternate between the runtimes so that both see the
//! same machine.
//!
//! Run with `make bench`: it starts the test bed and the CRI-enabled containerd
//! (`CRIUS_BENCH_CRI_CONTAINERD`, its pid file in `CRIUS_BENCH_CRI_CONTAINERD_PID`; the pid
//! file of the containerd crius uses in `CRIUS_BENCH_CONTAINERD_PID`).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "support/daemons.rs"]
mod daemons;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::pod::image;
use common::{Crius, TestNetwork, pod_config};
use crius::api::v1::{
    ContainerConfig, ContainerMetadata, ContainerStatusRequest, CreateContainerRequest,
    ExecSyncRequest, ImageFsInfoRequest, ImageSpec, ImageStatusRequest, ListContainerStatsRequest,
    ListContainersRequest, ListImagesRequest, ListPodSandboxRequest, PodSandboxConfig,
    PodSandboxStatusRequest, PullImageRequest, RemoveContainerRequest, RemoveImageRequest,
    RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest, StatusRequest,
    StopContainerRequest, StopPodSandboxRequest, VersionRequest,
};
use crius_testkit::CriClient;
use daemons::pid_from_file;

/// Rounds per operation; `CRIUS_BENCH_ROUNDS` changes it (a quick look: 3).
const ROUNDS: usize = 20;
/// Samples of each polling read per round.
const READ_SAMPLES: usize = 5;
const MEMORY_PODS: usize = 50;
const BATCH: usize = 10;
/// Memory is sampled this long after the last of the pods came up, for both daemons: a
/// node's steady state with them, not the peak of bringing them up.
const SETTLE: Duration = Duration::from_secs(5);
/// The longest wait for the node to go quiet before a timed phase of many pods.
const QUIET_WAIT: Duration = Duration::from_secs(30);
/// The image RemoveImage removes each round (pulled again, unmeasured, before).
const REMOVED_IMAGE: &str = "busybox-user:1000";

/// Every operation in the table, in its order.
const OPERATIONS: [&str; 23] = [
    "RunPodSandbox",
    "CreateContainer",
    "StartContainer",
    "ExecSync",
    "StopContainer",
    "RemoveContainer",
    "StopPodSandbox",
    "RemovePodSandbox",
    "PullImage (present)",
    "RemoveImage",
    "Version (new connection)",
    "Version",
    "Status",
    "ListPodSandbox",
    "PodSandboxStatus",
    "PodSandboxStatus (verbose)",
    "ListContainers",
    "ContainerStatus",
    "ContainerStatus (verbose)",
    "ListContainerStats",
    "ImageStatus",
    "ListImages",
    "ImageFsInfo",
];

struct Runtime {
    name: &'static str,
    socket: PathBuf,
    client: CriClient,
    samples: Samples,
}

/// Per operation, the latency of every measured round.
#[derive(Default)]
struct Samples(HashMap<&'static str, Vec<Duration>>);

impl Samples {
    /// Awaits `call`, recording its latency under `operation`; panics on an error.
    async fn time<T, E: std::fmt::Display>(
        &mut self,
        operation: &'static str,
        call: impl Future<Output = Result<T, E>>,
    ) -> T {
        let t = Instant::now();
        let result = call.await;
        let elapsed = t.elapsed();
        let value = result.unwrap_or_else(|e| panic!("{operation}: {e}"));
        self.0.entry(operation).or_default().push(elapsed);
        value
    }

    fn median(&self, operation: &str) -> Duration {
        let mut sorted = self.0.get(operation).cloned().unwrap_or_default();
        if sorted.is_empty() {
            return Duration::ZERO;
        }
        sorted.sort();
        sorted[sorted.len() / 2]
    }
}

fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else {
        format!("{ms:.1} ms")
    }
}

fn ratio(crius: f64, containerd: f64) -> String {
    if containerd > 0.0 {
        format!("{:.2}", crius / containerd)
    } else {
        "-".to_string()
    }
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

fn image_spec(name: &str) -> Option<ImageSpec> {
    Some(ImageSpec {
        image: image(name),
        ..Default::default()
    })
}

/// Runs a pod with one container; returns (pod id, container id).
async fn bring_up(client: &mut CriClient, samples: &mut Samples, name: &str) -> (String, String) {
    let config = pod(name);
    let runtime = &mut client.runtime;
    let pod_id = samples
        .time(
            "RunPodSandbox",
            runtime.run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            }),
        )
        .await
        .into_inner()
        .pod_sandbox_id;
    let container_id = samples
        .time(
            "CreateContainer",
            runtime.create_container(CreateContainerRequest {
                pod_sandbox_id: pod_id.clone(),
                config: Some(workload("app")),
                sandbox_config: Some(config),
            }),
        )
        .await
        .into_inner()
        .container_id;
    samples
        .time(
            "StartContainer",
            runtime.start_container(StartContainerRequest {
                container_id: container_id.clone(),
            }),
        )
        .await;
    (pod_id, container_id)
}

/// Stops and removes the container and the pod.
async fn tear_down(
    client: &mut CriClient,
    samples: &mut Samples,
    pod_id: &str,
    container_id: &str,
) {
    let runtime = &mut client.runtime;
    samples
        .time(
            "StopContainer",
            runtime.stop_container(StopContainerRequest {
                container_id: container_id.to_string(),
                timeout: 10,
            }),
        )
        .await;
    samples
        .time(
            "RemoveContainer",
            runtime.remove_container(RemoveContainerRequest {
                container_id: container_id.to_string(),
            }),
        )
        .await;
    samples
        .time(
            "StopPodSandbox",
            runtime.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: pod_id.to_string(),
            }),
        )
        .await;
    samples
        .time(
            "RemovePodSandbox",
            runtime.remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: pod_id.to_string(),
            }),
        )
        .await;
}

/// What kubelet does while a pod runs: its polling reads, then an exec probe. The reads come
/// first: crius deletes an exec's process after answering ExecSync (containerd's CRI before),
/// and reads timed right behind it would time that deletion. Each read is sampled
/// `READ_SAMPLES` times a round: well under a millisecond, one sample is mostly noise.
async fn while_running(runtime: &mut Runtime, pod_id: &str, container_id: &str) {
    for _ in 0..READ_SAMPLES {
        polling_reads(runtime, pod_id, container_id).await;
    }
    let exec = runtime
        .samples
        .time(
            "ExecSync",
            runtime.client.runtime.exec_sync(ExecSyncRequest {
                container_id: container_id.to_string(),
                cmd: vec!["true".to_string()],
                timeout: 10,
            }),
        )
        .await
        .into_inner();
    assert_eq!(exec.exit_code, 0, "exec of true in {}", runtime.name);
}

/// kubelet's polling reads, Version over a new connection among them, each once.
async fn polling_reads(runtime: &mut Runtime, pod_id: &str, container_id: &str) {
    let samples = &mut runtime.samples;
    let client = &mut runtime.client;
    samples
        .time("Version (new connection)", async {
            let mut fresh = CriClient::connect(&runtime.socket)
                .await
                .map_err(|e| e.to_string())?;
            fresh
                .runtime
                .version(VersionRequest::default())
                .await
                .map_err(|e| e.to_string())
        })
        .await;
    samples
        .time("Version", client.runtime.version(VersionRequest::default()))
        .await;
    samples
        .time("Status", client.runtime.status(StatusRequest::default()))
        .await;
    samples
        .time(
            "ListPodSandbox",
            client
                .runtime
                .list_pod_sandbox(ListPodSandboxRequest::default()),
        )
        .await;
    for (operation, verbose) in [
        ("PodSandboxStatus", false),
        ("PodSandboxStatus (verbose)", true),
    ] {
        samples
            .time(
                operation,
                client.runtime.pod_sandbox_status(PodSandboxStatusRequest {
                    pod_sandbox_id: pod_id.to_string(),
                    verbose,
                }),
            )
            .await;
    }
    samples
        .time(
            "ListContainers",
            client
                .runtime
                .list_containers(ListContainersRequest::default()),
        )
        .await;
    // crictl inspect and critest's benchmark ask for the verbose status, kubelet for the
    // plain one.
    for (operation, verbose) in [
        ("ContainerStatus", false),
        ("ContainerStatus (verbose)", true),
    ] {
        samples
            .time(
                operation,
                client.runtime.container_status(ContainerStatusRequest {
                    container_id: container_id.to_string(),
                    verbose,
                }),
            )
            .await;
    }
    samples
        .time(
            "ListContainerStats",
            client
                .runtime
                .list_container_stats(ListContainerStatsRequest::default()),
        )
        .await;
    samples
        .time(
            "ImageStatus",
            client.image.image_status(ImageStatusRequest {
                image: image_spec("busybox:latest"),
                verbose: false,
            }),
        )
        .await;
    samples
        .time(
            "ListImages",
            client.image.list_images(ListImagesRequest::default()),
        )
        .await;
    samples
        .time(
            "ImageFsInfo",
            client.image.image_fs_info(ImageFsInfoRequest::default()),
        )
        .await;
}

/// Pulls an image that is present, and removes one pulled just before.
async fn images(runtime: &mut Runtime) {
    let samples = &mut runtime.samples;
    let client = &mut runtime.client;
    samples
        .time(
            "PullImage (present)",
            client.image.pull_image(PullImageRequest {
                image: image_spec("busybox:latest"),
                ..Default::default()
            }),
        )
        .await;
    common::pod::pull(client, REMOVED_IMAGE).await;
    samples
        .time(
            "RemoveImage",
            client.image.remove_image(RemoveImageRequest {
                image: image_spec(REMOVED_IMAGE),
            }),
        )
        .await;
}

async fn one_round(runtime: &mut Runtime, name: &str) {
    let (pod_id, container_id) = bring_up(&mut runtime.client, &mut runtime.samples, name).await;
    while_running(runtime, &pod_id, &container_id).await;
    tear_down(
        &mut runtime.client,
        &mut runtime.samples,
        &pod_id,
        &container_id,
    )
    .await;
    images(runtime).await;
}

/// Brings up `MEMORY_PODS` pods, `BATCH` at a time, calls `with_pods_running` once they have
/// settled, then tears them down the same way; returns both wall times.
async fn many_pods(runtime: &Runtime, with_pods_running: impl FnOnce()) -> [Duration; 2] {
    // The kernel tears network namespaces down in the background: the previous daemon's 50
    // pods would otherwise still be going while this one's come up.
    wait_for_quiet().await;
    let t = Instant::now();
    let mut pods = Vec::new();
    for batch in 0..MEMORY_PODS / BATCH {
        let ups: Vec<_> = (0..BATCH)
            .map(|i| {
                let mut client = runtime.client.clone();
                let name = format!("bench-many-{batch}-{i}");
                tokio::spawn(
                    async move { bring_up(&mut client, &mut Samples::default(), &name).await },
                )
            })
            .collect();
        for up in ups {
            pods.push(up.await.expect("bring-up task"));
        }
    }
    let up = t.elapsed();
    tokio::time::sleep(SETTLE).await;
    with_pods_running();
    wait_for_quiet().await;
    let t = Instant::now();
    while !pods.is_empty() {
        let batch = pods.split_off(pods.len().saturating_sub(BATCH));
        let downs: Vec<_> = batch
            .into_iter()
            .map(|(pod_id, container_id)| {
                let mut client = runtime.client.clone();
                tokio::spawn(async move {
                    tear_down(&mut client, &mut Samples::default(), &pod_id, &container_id).await
                })
            })
            .collect();
        for down in downs {
            down.await.expect("tear-down task");
        }
    }
    [up, t.elapsed()]
}

/// Waits until the node's CPUs have been at least 90% idle for half a second (at most
/// `QUIET_WAIT`), so work left over from the last phase is not timed in the next.
async fn wait_for_quiet() {
    let started = Instant::now();
    let mut last = cpu_ticks();
    while started.elapsed() < QUIET_WAIT {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = cpu_ticks();
        let (busy, total) = (now.0 - last.0, now.1 - last.1);
        last = now;
        if total > 0 && busy * 10 <= total {
            return;
        }
    }
    println!("(the node did not go quiet in {QUIET_WAIT:?})");
}

/// The node's busy and total CPU ticks so far, from /proc/stat.
fn cpu_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").expect("read /proc/stat");
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    let total: u64 = ticks.iter().sum();
    // idle and iowait
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// A process's resident memory in KiB: all of it, and its anonymous and file-backed parts.
#[derive(Clone, Copy, Default)]
struct Rss {
    total: u64,
    anon: u64,
    file: u64,
    threads: u64,
}

fn rss_kib(pid: u32) -> Rss {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
    };
    let threads = status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    Rss {
        total: field("VmRSS:"),
        anon: field("RssAnon:"),
        file: field("RssFile:"),
        threads,
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// The median time of containerd's Images.Delete with a synchronous collection, on the
/// containerd crius runs beside, of an image `ctr` pulled just before.
async fn remove_image_floor(rounds: usize) -> Duration {
    let testbed = common::Testbed::from_env();
    let namespace = format!("crius-bench-floor-{}", std::process::id());
    let containerd = crius::containerd::Containerd::connect(
        &testbed.containerd_address,
        &namespace,
        Duration::from_secs(10),
    )
    .await
    .expect("connect to containerd");
    let name = image(REMOVED_IMAGE);
    let mut samples = Vec::new();
    for _ in 0..rounds {
        let out = std::process::Command::new("ctr")
            .arg("--address")
            .arg(&testbed.containerd_address)
            .args(["-n", &namespace, "images", "pull", "--plain-http", &name])
            .output()
            .expect("run ctr");
        assert!(
            out.status.success(),
            "ctr pull: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let t = Instant::now();
        containerd
            .delete_image(&name, true)
            .await
            .expect("delete image");
        samples.push(t.elapsed());
    }
    samples.sort();
    samples[samples.len() / 2]
}

fn row(name: &str, containerd: &str, crius: &str, ratio: &str) {
    println!("| {name:<34} | {containerd:>14} | {crius:>14} | {ratio:>5} |");
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
            name: "containerd CRI",
            socket: PathBuf::from(&cri_socket),
            client: CriClient::connect(Path::new(&cri_socket))
                .await
                .expect("connect to containerd's CRI"),
            samples: Samples::default(),
        },
        Runtime {
            name: "crius",
            socket: crius.grpc_socket().to_path_buf(),
            client: crius.client().await,
            samples: Samples::default(),
        },
    ];
    for runtime in &mut runtimes {
        for name in ["busybox:latest", "bench/pause:1"] {
            common::pod::pull(&mut runtime.client, name).await;
        }
        one_round(runtime, "bench-warm-up").await;
        runtime.samples = Samples::default();
    }
    let rounds = std::env::var("CRIUS_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(ROUNDS);
    for round in 0..rounds {
        for runtime in &mut runtimes {
            one_round(runtime, &format!("bench-{round}")).await;
        }
    }

    let line = std::env::var("CRIUS_TEST_CONTAINERD_NAME").unwrap_or_else(|_| "containerd".into());
    println!(
        "{line}: its own CRI against crius beside it; medians of {rounds} rounds ({READ_SAMPLES} samples of each read a round), same client"
    );
    row("operation", runtimes[0].name, runtimes[1].name, "ratio");
    println!("|{:-<36}|{:-<16}|{:-<16}|{:-<7}|", "", "", "", "");
    for operation in OPERATIONS {
        let [containerd, crius] = [&runtimes[0], &runtimes[1]].map(|r| r.samples.median(operation));
        row(
            operation,
            &ms(containerd),
            &ms(crius),
            &ratio(crius.as_secs_f64(), containerd.as_secs_f64()),
        );
    }

    // What of RemoveImage is containerd's own work: its Images.Delete with a synchronous
    // collection, called directly on an image `ctr` pulled into a namespace of its own.
    let floor = remove_image_floor(rounds).await;
    row(
        "  RemoveImage: containerd's Delete alone",
        "-",
        &ms(floor),
        &ratio(
            floor.as_secs_f64(),
            runtimes[0].samples.median("RemoveImage").as_secs_f64(),
        ),
    );

    let crius_pid = crius.pid().as_raw() as u32;
    let containerd_pid = pid_from_file("CRIUS_BENCH_CONTAINERD_PID");
    let cri_containerd_pid = pid_from_file("CRIUS_BENCH_CRI_CONTAINERD_PID");
    let mut cri_rss = Rss::default();
    let cri_times = many_pods(&runtimes[0], || cri_rss = rss_kib(cri_containerd_pid)).await;
    let mut crius_rss = (Rss::default(), Rss::default());
    let crius_times = many_pods(&runtimes[1], || {
        crius_rss = (rss_kib(crius_pid), rss_kib(containerd_pid));
    })
    .await;
    let seconds = |d: Duration| format!("{:.2} s", d.as_secs_f64());
    for (i, what) in ["up", "down"].into_iter().enumerate() {
        row(
            &format!("{MEMORY_PODS} pods, {BATCH} at a time: {what}"),
            &seconds(cri_times[i]),
            &seconds(crius_times[i]),
            &ratio(crius_times[i].as_secs_f64(), cri_times[i].as_secs_f64()),
        );
    }
    let (crius_own, containerd) = crius_rss;
    row(
        &format!("CRI daemon RSS, {MEMORY_PODS} pods"),
        &mib(cri_rss.total),
        &mib(crius_own.total),
        &ratio(crius_own.total as f64, cri_rss.total as f64),
    );
    row(
        "  of it anonymous (heap, stacks)",
        &mib(cri_rss.anon),
        &mib(crius_own.anon),
        &ratio(crius_own.anon as f64, cri_rss.anon as f64),
    );
    row(
        "  of it file-backed (the binary)",
        &mib(cri_rss.file),
        &mib(crius_own.file),
        &ratio(crius_own.file as f64, cri_rss.file as f64),
    );
    row(
        "  its threads",
        &cri_rss.threads.to_string(),
        &crius_own.threads.to_string(),
        &ratio(crius_own.threads as f64, cri_rss.threads as f64),
    );
    row(
        &format!("with its containerd, {MEMORY_PODS} pods"),
        &mib(cri_rss.total),
        &mib(crius_own.total + containerd.total),
        &ratio(
            (crius_own.total + containerd.total) as f64,
            cri_rss.total as f64,
        ),
    );
    drop(network);
}
