//! Pull benchmark: cold pulls from the loopback registry, crius's PullImage against the
//! PullImage of containerd's own CRI beside the same containerd line (`make bench all` runs
//! it beside each line the lifecycle table runs beside), of
//!
//! - `bench/big:latest`: 50 MB in five layers of incompressible data;
//! - `bench/huge:gzip` and `bench/huge:zstd`: 1.1 GiB uncompressed in 13 layers, about 2:1
//!   (scripts/layered-image.py): four layers of many small files, eight of a few large ones.
//!
//! Every pull is cold: each image is removed after its pull with a synchronous collection
//! (containerd's CRI collects synchronously on an image's last name too), so no blob or
//! snapshot is left for the next. Both daemons are running ones, as kubelet finds them: one
//! crius, in a containerd namespace of its own, serves every round of an image, as the one
//! containerd with the CRI serves all of them. Rounds alternate between the two.
//!
//! For the huge images it also measures the machine's bound: the layers, already in memory,
//! decompressed and written out as files into a directory beside containerd's by the
//! fastest tools at hand (`zstd -d`, `gzip -d`, GNU tar), as many layers at once as the
//! machine has cores. And crius's peak resident
//! memory (VmHWM of the crius started for that image's pulls).
//!
//! For every cold pull it also counts the CPU time the daemons spent on it (from
//! `/proc/<pid>/stat`, waited-for children included): crius's and its containerd's for
//! crius's pull, the containerd with the CRI's for that one's (`CRIUS_BENCH_CONTAINERD_PID`
//! and `CRIUS_BENCH_CRI_CONTAINERD_PID` name their pid files). On a machine whose cores are
//! the bound, that split says whose work a pull's time is.
//!
//! Then crius's pulls with the layers already in containerd's content store (held by the
//! image pulled into another namespace; containerd shares blobs between namespaces), so
//! nothing is downloaded: what is left is containerd's unpacking, its diff service's apply
//! into snapshots, and crius's few calls a layer around it. That time over containerd's
//! CRI's cold pull is the ratio crius would reach if its downloads cost nothing: an upper
//! bound of containerd's own share.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "support/daemons.rs"]
mod daemons;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Crius, Testbed};
use crius::api::v1::{ImageSpec, PullImageRequest, RemoveImageRequest, VersionRequest};
use crius_testkit::CriClient;
use daemons::{cpu_seconds, pid_from_file};

/// Rounds per image; `CRIUS_BENCH_PULL_ROUNDS` changes it.
const ROUNDS: usize = 3;
const PULL_TIMEOUT: Duration = Duration::from_secs(900);

struct BenchImage {
    name: &'static str,
    about: &'static str,
    /// Whether the machine's bound is measured for it.
    bound: bool,
}

const IMAGES: [BenchImage; 3] = [
    BenchImage {
        name: "bench/big:latest",
        about: "50 MB, 5 layers, incompressible",
        bound: false,
    },
    BenchImage {
        name: "bench/huge:gzip",
        about: "1.1 GiB, 13 layers, gzip",
        bound: true,
    },
    BenchImage {
        name: "bench/huge:zstd",
        about: "1.1 GiB, 13 layers, zstd",
        bound: true,
    },
];

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn median_f64(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn spec(image: &str) -> Option<ImageSpec> {
    Some(ImageSpec {
        image: image.to_string(),
        ..Default::default()
    })
}

/// Writes back what earlier rounds left dirty, so that a timed phase does not pay for it.
fn settle_disk() {
    // SAFETY: sync(2) has no arguments and cannot fail.
    unsafe { libc::sync() };
}

/// Pulls `image` (bounded by [`PULL_TIMEOUT`]).
async fn pull(client: &mut CriClient, image: &str) {
    let mut request = tonic::Request::new(PullImageRequest {
        image: spec(image),
        ..Default::default()
    });
    request.set_timeout(PULL_TIMEOUT);
    client
        .image
        .pull_image(request)
        .await
        .unwrap_or_else(|e| panic!("pull {image}: {e}"));
}

async fn remove(client: &mut CriClient, image: &str) {
    client
        .image
        .remove_image(RemoveImageRequest { image: spec(image) })
        .await
        .unwrap_or_else(|e| panic!("remove {image}: {e}"));
}

/// Pulls `image` and removes it again; returns how long the pull took and the CPU seconds
/// each of `daemons` spent meanwhile.
async fn cold_pull(client: &mut CriClient, image: &str, daemons: &[u32]) -> (Duration, Vec<f64>) {
    settle_disk();
    let cpu_before: Vec<f64> = daemons.iter().map(|&pid| cpu_seconds(pid)).collect();
    let start = Instant::now();
    pull(client, image).await;
    let took = start.elapsed();
    let cpu = (daemons.iter().zip(cpu_before))
        .map(|(&pid, before)| cpu_seconds(pid) - before)
        .collect();
    remove(client, image).await;
    (took, cpu)
}

/// Starts a crius configured for the benchmark (`CRIUS_BENCH_UNPACKS`).
async fn bench_crius(unpacks: Option<usize>) -> Crius {
    Crius::start_with(
        |c| {
            if let Some(n) = unpacks {
                c.image.max_concurrent_unpacks = n;
            }
        },
        &[],
    )
    .await
}

/// crius's cold pulls with the layers already local: a crius in a namespace of its own
/// pulls the image first and holds it until every round is done. (containerd's CRI runs on
/// a containerd of its own, where nothing holds the layers, so it has no such column.)
async fn local_layer_pulls(
    reference: &str,
    rounds: usize,
    unpacks: Option<usize>,
) -> Vec<Duration> {
    let keeper = bench_crius(unpacks).await;
    let mut keeper_client = keeper.client().await;
    pull(&mut keeper_client, reference).await;
    let crius = bench_crius(unpacks).await;
    let mut client = crius.client().await;
    let mut crius_times = Vec::new();
    for round in 0..rounds {
        crius_times.push(cold_pull(&mut client, reference, &[]).await.0);
        eprintln!(
            "{reference} with its layers local: round {round}: crius {}",
            secs(crius_times[round])
        );
    }
    remove(&mut keeper_client, reference).await;
    crius_times
}

/// The peak resident memory of `pid` so far, in MiB.
fn peak_rss_mib(pid: i32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in status");
    kib as f64 / 1024.0
}

/// The compressed layers of `image` (`<repo>:<tag>`) from the registry, with their media
/// types.
async fn fetch_layers(registry: &str, image: &str) -> Vec<(String, Vec<u8>)> {
    let (repo, tag) = image.split_once(':').expect("repo:tag");
    let http = reqwest::Client::new();
    let manifest = http
        .get(format!("http://{registry}/v2/{repo}/manifests/{tag}"))
        .header("Accept", "application/vnd.oci.image.manifest.v1+json")
        .send()
        .await
        .expect("manifest")
        .bytes()
        .await
        .expect("manifest bytes");
    let manifest: serde_json::Value = serde_json::from_slice(&manifest).expect("manifest JSON");
    let mut layers = Vec::new();
    for layer in manifest["layers"].as_array().expect("layers") {
        let digest = layer["digest"].as_str().expect("digest");
        let bytes = http
            .get(format!("http://{registry}/v2/{repo}/blobs/{digest}"))
            .send()
            .await
            .expect("blob")
            .bytes()
            .await
            .expect("blob bytes");
        let media = layer["mediaType"].as_str().unwrap_or_default().to_string();
        layers.push((media, bytes.to_vec()));
    }
    layers
}

/// The machine's bound: every layer decompressed and written out as files under `scratch`
/// by the fastest tools at hand (`zstd -d` or `gzip -d` into GNU tar), `cores` at a time.
fn machine_bound(layers: Arc<Vec<(String, Vec<u8>)>>, scratch: &Path, cores: usize) -> Duration {
    let _ = std::fs::remove_dir_all(scratch);
    std::fs::create_dir_all(scratch).expect("scratch dir");
    settle_disk();
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let workers: Vec<_> = (0..cores)
        .map(|_| {
            let (layers, next, scratch) = (layers.clone(), next.clone(), scratch.to_path_buf());
            std::thread::spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some((media, blob)) = layers.get(i) else {
                        return;
                    };
                    let dir = scratch.join(i.to_string());
                    std::fs::create_dir_all(&dir).expect("layer dir");
                    let tool = if media.ends_with("zstd") {
                        "zstd"
                    } else {
                        "gzip"
                    };
                    unpack_with_tools(tool, blob, &dir);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("bound worker");
    }
    let took = start.elapsed();
    std::fs::remove_dir_all(scratch).expect("remove scratch");
    took
}

/// `<tool> -d | tar -x` of `blob` into `dir`.
fn unpack_with_tools(tool: &str, blob: &[u8], dir: &Path) {
    use std::io::Write;
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{tool} -d -c | tar -x -C '{}'", dir.display()))
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the decompressor");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(blob)
        .expect("feed the decompressor");
    let status = child.wait().expect("wait for the decompressor");
    assert!(status.success(), "{tool} -d | tar -x failed: {status}");
}

#[tokio::main]
async fn main() {
    let testbed = Testbed::from_env();
    let cri_socket = std::env::var("CRIUS_BENCH_CRI_CONTAINERD")
        .expect("CRIUS_BENCH_CRI_CONTAINERD is not set: use `make bench all`");
    let mut cri = CriClient::connect(Path::new(&cri_socket))
        .await
        .expect("connect to containerd's CRI");
    let version = cri
        .runtime
        .version(VersionRequest::default())
        .await
        .expect("version")
        .into_inner();
    let rounds = std::env::var("CRIUS_BENCH_PULL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ROUNDS);
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let scratch: PathBuf = testbed
        .containerd_root
        .parent()
        .expect("containerd root has a parent")
        .join("bench-bound");

    println!(
        "cold pulls, {rounds} rounds, crius beside containerd {} against its CRI, {cores} cores",
        version.runtime_version
    );
    let containerd_pid = pid_from_file("CRIUS_BENCH_CONTAINERD_PID");
    let cri_containerd_pid = pid_from_file("CRIUS_BENCH_CRI_CONTAINERD_PID");
    println!(
        "| {:<34} | {:>10} | {:>10} | {:>10} | {:>5} | {:>12} | {:>13} | {:>11} | {:>12} | {:>23} | {:>9} |",
        "image",
        "containerd",
        "crius",
        "bound",
        "ratio",
        "crius/bound",
        "crius peak RSS",
        "crius local",
        "ctrd's share",
        "CPU: crius + its ctrd",
        "CPU: CRI"
    );
    // `CRIUS_BENCH_UNPACKS`: crius's image.max_concurrent_unpacks (default: its own).
    let unpacks: Option<usize> = std::env::var("CRIUS_BENCH_UNPACKS")
        .ok()
        .and_then(|v| v.parse().ok());
    // `CRIUS_BENCH_PULL_IMAGES`: only the images whose names contain one of these words.
    let only = std::env::var("CRIUS_BENCH_PULL_IMAGES").unwrap_or_default();
    for image in IMAGES {
        if !only.is_empty() && !only.split_whitespace().any(|w| image.name.contains(w)) {
            continue;
        }
        let reference = format!("{}/{}", testbed.registry, image.name);
        let (mut crius_times, mut cri_times) = (Vec::new(), Vec::new());
        let (mut crius_cpu, mut its_containerd_cpu, mut cri_cpu) =
            (Vec::new(), Vec::new(), Vec::new());
        let crius = bench_crius(unpacks).await;
        let mut client = crius.client().await;
        let daemons = [crius.pid().as_raw() as u32, containerd_pid];
        for round in 0..rounds {
            let (took, cpu) = cold_pull(&mut client, &reference, &daemons).await;
            crius_times.push(took);
            crius_cpu.push(cpu[0]);
            its_containerd_cpu.push(cpu[1]);
            let (took, cpu) = cold_pull(&mut cri, &reference, &[cri_containerd_pid]).await;
            cri_times.push(took);
            cri_cpu.push(cpu[0]);
            eprintln!(
                "{}: round {round}: crius {}  containerd {}",
                image.name,
                secs(crius_times[round]),
                secs(cri_times[round])
            );
        }
        let peak = peak_rss_mib(crius.pid().as_raw());
        if std::env::var_os("CRIUS_BENCH_PULL_VERBOSE").is_some() {
            (crius.log().lines())
                .filter(|l| l.contains("layer") || l.contains("pull") || l.contains("blob"))
                .for_each(|l| eprintln!("{l}"));
        }
        drop(client);
        drop(crius);
        let bound = if image.bound {
            let layers = Arc::new(fetch_layers(&testbed.registry, image.name).await);
            let samples = (0..rounds)
                .map(|_| machine_bound(layers.clone(), &scratch, cores))
                .collect();
            Some(median(samples))
        } else {
            None
        };
        let crius_local = median(local_layer_pulls(&reference, rounds, unpacks).await);
        let (crius_median, cri_median) = (median(crius_times), median(cri_times));
        println!(
            "| {:<34} | {:>10} | {:>10} | {:>10} | {:>5.2} | {:>12} | {:>10.1} MiB | {:>11} | {:>12.2} | {:>23} | {:>9} |",
            format!("{} ({})", image.name, image.about),
            secs(cri_median),
            secs(crius_median),
            bound.map_or("-".to_string(), secs),
            crius_median.as_secs_f64() / cri_median.as_secs_f64(),
            bound.map_or("-".to_string(), |b| format!(
                "{:.2}",
                crius_median.as_secs_f64() / b.as_secs_f64()
            )),
            peak,
            secs(crius_local),
            crius_local.as_secs_f64() / cri_median.as_secs_f64(),
            format!(
                "{:.2} + {:.2} s",
                median_f64(crius_cpu),
                median_f64(its_containerd_cpu)
            ),
            format!("{:.2} s", median_f64(cri_cpu))
        );
    }
}
