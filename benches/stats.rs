//! Stats benchmark: ListContainerStats and ListPodSandboxStats over 100 running containers
//! in 10 pods. Prints the median round trip over the unix socket (an upper bound of the
//! server time) of 20 calls each, after a warm-up call that primes the CPU-rate samples.
//!
//! Run with `make bench` (it starts a fresh test bed).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::Crius;
use common::pod::{container, pod};
use crius::api::v1::{ListContainerStatsRequest, ListPodSandboxStatsRequest};

const PODS: usize = 10;
const PER_POD: usize = 10;
const CALLS: usize = 20;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

#[tokio::main]
async fn main() {
    let crius = Crius::start().await;
    let mut pods = Vec::new();
    for p in 0..PODS {
        let mut pod = pod(&crius, &format!("bench-stats-{p}")).await;
        for c in 0..PER_POD {
            let mut config = container(&format!("c{c}"), "busybox:latest", &["sleep", "3600"]);
            config.log_path = String::new();
            pod.run(config).await;
        }
        pods.push(pod);
    }
    let mut client = crius.client().await;

    let mut containers = Vec::new();
    let mut listed = 0;
    for call in 0..=CALLS {
        let start = Instant::now();
        let stats = client
            .runtime
            .list_container_stats(ListContainerStatsRequest { filter: None })
            .await
            .expect("ListContainerStats")
            .into_inner()
            .stats;
        if call > 0 {
            containers.push(start.elapsed());
        }
        listed = stats.len();
    }
    let mut sandboxes = Vec::new();
    for call in 0..=CALLS {
        let start = Instant::now();
        client
            .runtime
            .list_pod_sandbox_stats(ListPodSandboxStatsRequest { filter: None })
            .await
            .expect("ListPodSandboxStats");
        if call > 0 {
            sandboxes.push(start.elapsed());
        }
    }
    println!(
        "ListContainerStats, {listed} containers: median {:.1} ms",
        median(containers).as_secs_f64() * 1000.0
    );
    println!(
        "ListPodSandboxStats, {PODS} pods of {PER_POD}: median {:.1} ms",
        median(sandboxes).as_secs_f64() * 1000.0
    );
    for pod in pods {
        pod.remove_pod().await;
    }
}
