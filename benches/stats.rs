//! Scale benchmark: kubelet's default maximum of 110 pods, 3 running containers each, and
//! the reads kubelet polls them with (List*, Status, the status and stats RPCs) while other
//! pods are created and removed all along. Prints p50 and p99 of each read's round trip
//! over the unix socket (an upper bound of the server time), 200 calls each, interleaved.
//!
//! Run with `make bench-all` (it starts a fresh test bed).

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::Crius;
use common::pod::{Pod, container, pod};
use crius::api::v1::{
    ContainerStatusRequest, ListContainerStatsRequest, ListContainersRequest,
    ListPodSandboxRequest, ListPodSandboxStatsRequest, PodSandboxStatusRequest, StatusRequest,
};
use crius_testkit::CriClient;

const PODS: usize = 110;
const PER_POD: usize = 3;
const CALLS: usize = 200;
/// Pods brought up at once while filling the node.
const FILL_BATCH: usize = 10;

const READS: [&str; 7] = [
    "ListPodSandbox",
    "ListContainers",
    "Status",
    "PodSandboxStatus",
    "ContainerStatus",
    "ListContainerStats",
    "ListPodSandboxStats",
];

async fn full_pod(crius: &Crius, name: String) -> (Pod, String) {
    let mut pod = pod(crius, &name).await;
    let mut first = String::new();
    for c in 0..PER_POD {
        let mut config = container(&format!("c{c}"), "busybox:latest", &["sleep", "3600"]);
        config.log_path = String::new();
        let id = pod.run(config).await;
        if first.is_empty() {
            first = id;
        }
    }
    (pod, first)
}

/// Creates and removes one pod after another until `stop`; counts the cycles.
fn churn(
    crius: Arc<Crius>,
    stop: Arc<AtomicBool>,
    cycles: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            let n = cycles.fetch_add(1, Ordering::Relaxed);
            let (pod, _) = full_pod(&crius, format!("bench-churn-{n}")).await;
            pod.remove_pod().await;
        }
    })
}

/// One call of `read`; panics on an error.
async fn call(client: &mut CriClient, read: &str, pod_id: &str, container_id: &str) {
    let runtime = &mut client.runtime;
    let result = match read {
        "ListPodSandbox" => runtime
            .list_pod_sandbox(ListPodSandboxRequest::default())
            .await
            .map(|_| ()),
        "ListContainers" => runtime
            .list_containers(ListContainersRequest::default())
            .await
            .map(|_| ()),
        "Status" => runtime.status(StatusRequest::default()).await.map(|_| ()),
        "PodSandboxStatus" => runtime
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: pod_id.to_string(),
                verbose: false,
            })
            .await
            .map(|_| ()),
        "ContainerStatus" => runtime
            .container_status(ContainerStatusRequest {
                container_id: container_id.to_string(),
                verbose: false,
            })
            .await
            .map(|_| ()),
        "ListContainerStats" => runtime
            .list_container_stats(ListContainerStatsRequest::default())
            .await
            .map(|_| ()),
        "ListPodSandboxStats" => runtime
            .list_pod_sandbox_stats(ListPodSandboxStatsRequest::default())
            .await
            .map(|_| ()),
        other => panic!("unknown read {other}"),
    };
    result.unwrap_or_else(|e| panic!("{read}: {e}"));
}

fn percentile(sorted: &[Duration], p: usize) -> f64 {
    let i = (sorted.len() * p / 100).min(sorted.len() - 1);
    sorted[i].as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() {
    let crius = Arc::new(Crius::start().await);
    let started = Instant::now();
    let mut pods = Vec::new();
    for batch in 0..PODS / FILL_BATCH {
        let ups: Vec<_> = (0..FILL_BATCH)
            .map(|i| {
                let crius = crius.clone();
                tokio::spawn(async move {
                    full_pod(&crius, format!("bench-scale-{}", batch * FILL_BATCH + i)).await
                })
            })
            .collect();
        for up in ups {
            pods.push(up.await.expect("bring-up task"));
        }
    }
    println!(
        "{PODS} pods of {PER_POD} containers up in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicUsize::new(0));
    let churner = churn(crius.clone(), stop.clone(), cycles.clone());
    let mut client = crius.client().await;
    let mut samples: HashMap<&str, Vec<Duration>> = HashMap::new();
    for i in 0..CALLS {
        let (pod, container_id) = &pods[i % pods.len()];
        for read in READS {
            let t = Instant::now();
            call(&mut client, read, &pod.id, container_id).await;
            samples.entry(read).or_default().push(t.elapsed());
        }
    }
    stop.store(true, Ordering::Relaxed);
    churner.await.expect("churn task");

    println!(
        "reads while pods churned ({} pods created and removed), {CALLS} calls each",
        cycles.load(Ordering::Relaxed)
    );
    println!("| read | p50 | p99 |");
    println!("|---|---|---|");
    for read in READS {
        let sorted = samples.get_mut(read).expect("samples");
        sorted.sort();
        println!(
            "| {read} | {:.2} ms | {:.2} ms |",
            percentile(sorted, 50),
            percentile(sorted, 99)
        );
    }
    for (pod, _) in pods {
        pod.remove_pod().await;
    }
}
