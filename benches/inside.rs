//! Inside containerd 2.x: what a pod costs on containerd's own CRI with its `runc` handler,
//! with crius's shim as the handler's sandboxer (`crius-shim`), with crius as its sandbox
//! proxy plugin (`crius-proxy`), and on crius's own CRI, from one run.
//!
//! For each, 50 pods of one container are brought up one after another; it prints the
//! median RunPodSandbox and StartContainer latency and the memory per pod: the proportional
//! set size (PSS, so a binary's shared pages count once) of every process the pods cost
//! besides their containers (shims, pause containers or holders, and the growth of the
//! crius daemon where one serves them), divided by the pods.
//!
//! Run with `make bench` (containerd 2.x from the test bed, `scripts/testbed.sh env 2`).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "support/pod.rs"]
mod support;

use std::time::Duration;

use common::cri_containerd::{CriContainerd, PROXY_HANDLER, SHIM_HANDLER};
use common::pod::image;
use common::{Crius, TestNetwork, containerd_major, pod_config};
use crius::api::v1::{ImageSpec, PullImageRequest};
use crius_testkit::CriClient;
use support::{bring_up, tear_down};

const PODS: usize = 50;

struct Measured {
    name: &'static str,
    kib_per_pod: u64,
    run_p50: Duration,
    start_p50: Duration,
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// A process's proportional set size, KiB.
fn pss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn cmdline(pid: u32) -> Vec<u8> {
    std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default()
}

fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// A pause container's process or a crius shim's pod holder.
fn is_pause(pid: u32) -> bool {
    let line = cmdline(pid);
    line == b"/pause\0" || line.ends_with(b"\0pause\0")
}

/// Every shim whose command line names `address`, and the pause processes they parent.
fn pod_overhead(address: &std::path::Path) -> Vec<u32> {
    let needle = format!("-address\0{}\0", address.display());
    let pids = all_pids();
    let shims: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|&p| {
            let line = cmdline(p);
            line.starts_with(b"/")
                && contains(&line, b"containerd-shim")
                && contains(&line, needle.as_bytes())
        })
        .collect();
    let mut overhead = shims.clone();
    overhead.extend(
        pids.iter()
            .copied()
            .filter(|&p| parent(p).is_some_and(|pp| shims.contains(&pp)) && is_pause(p)),
    );
    overhead
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

async fn pull_busybox(client: &mut CriClient) {
    client
        .image
        .pull_image(PullImageRequest {
            image: Some(ImageSpec {
                image: image("busybox:latest"),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("pull busybox");
}

/// Brings up the pods on `handler`; returns their ids and the two latencies of each.
async fn bring_up_all(
    client: &mut CriClient,
    handler: &str,
    logs: &std::path::Path,
) -> (Vec<String>, Vec<Duration>, Vec<Duration>) {
    let (mut ids, mut runs, mut starts) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..PODS {
        let mut config = pod_config(&format!("inside-bench-{i}"));
        config.log_directory = logs.join(i.to_string()).display().to_string();
        let (pod, [run, start]) = bring_up(client, config, handler).await;
        ids.push(pod);
        runs.push(run);
        starts.push(start);
    }
    (ids, runs, starts)
}

/// One mode: `daemon` is the crius process whose growth the pods cost, if any.
async fn measure(
    name: &'static str,
    client: &mut CriClient,
    handler: &str,
    shims_of: &std::path::Path,
    daemon: Option<u32>,
) -> Measured {
    pull_busybox(client).await;
    let logs = tempfile::tempdir().expect("log dir");
    let daemon_before = daemon.map_or(0, pss_kib);
    let (pods, mut runs, mut starts) = bring_up_all(client, handler, logs.path()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let overhead: u64 = pod_overhead(shims_of).into_iter().map(pss_kib).sum();
    let daemon_growth = daemon.map_or(0, |pid| pss_kib(pid).saturating_sub(daemon_before));
    for pod in &pods {
        tear_down(client, pod).await;
    }
    let measured = Measured {
        name,
        kib_per_pod: (overhead + daemon_growth) / PODS as u64,
        run_p50: median(&mut runs),
        start_p50: median(&mut starts),
    };
    eprintln!(
        "{name}: {} KiB per pod, RunPodSandbox p50 {:.1} ms, StartContainer p50 {:.1} ms",
        measured.kib_per_pod,
        measured.run_p50.as_secs_f64() * 1000.0,
        measured.start_p50.as_secs_f64() * 1000.0
    );
    measured
}

#[tokio::main]
async fn main() {
    if containerd_major() < 2 {
        eprintln!("inside containerd: needs containerd 2.x on the PATH (testbed env 2)");
        return;
    }
    let mut results = Vec::new();
    {
        let cricd = CriContainerd::start(170).await;
        let mut client = cricd.client().await;
        results.push(
            measure(
                "containerd CRI, runc handler",
                &mut client,
                "",
                &cricd.address,
                None,
            )
            .await,
        );
        results.push(
            measure(
                "containerd CRI, crius-shim",
                &mut client,
                SHIM_HANDLER,
                &cricd.address,
                None,
            )
            .await,
        );
        let proxy = cricd.proxy_socket.clone();
        let address = cricd.address.clone();
        let root = cricd.dir.join("root");
        let crius = Crius::start_with(
            |config| {
                config.sandbox_controller.address = proxy;
                config.containerd.address = address;
                config.containerd.root = root;
                config.log.level = "warn".into();
            },
            &[],
        )
        .await;
        let daemon = Some(crius.pid().as_raw() as u32);
        results.push(
            measure(
                "containerd CRI, crius-proxy",
                &mut client,
                PROXY_HANDLER,
                &cricd.address,
                daemon,
            )
            .await,
        );
    }
    {
        let mut network = None;
        let crius = Crius::start_with(
            |config| {
                network = Some(TestNetwork::install(config, 171));
                config.log.level = "warn".into();
            },
            &[],
        )
        .await;
        let mut client = crius.client().await;
        let daemon = Some(crius.pid().as_raw() as u32);
        let address = crius.config.containerd.address.clone();
        results.push(measure("crius's own CRI", &mut client, "", &address, daemon).await);
    }

    let runc = results[0].kib_per_pod.max(1) as f64;
    println!("\nInside containerd 2.x: {PODS} pods of one container, one run\n");
    println!(
        "| mode | memory per pod | vs runc handler | RunPodSandbox p50 | StartContainer p50 |"
    );
    println!("|---|---|---|---|---|");
    for m in &results {
        println!(
            "| {} | {:.1} MiB | {:.2} | {:.1} ms | {:.1} ms |",
            m.name,
            m.kib_per_pod as f64 / 1024.0,
            m.kib_per_pod as f64 / runc,
            m.run_p50.as_secs_f64() * 1000.0,
            m.start_p50.as_secs_f64() * 1000.0
        );
    }
}
