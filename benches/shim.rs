//! Shim benchmark: crius's own shim (handler `runc`, `containerd-shim-crius-v2`) against
//! containerd's Go shim (handler `containerd-runc`, `containerd-shim-runc-v2`), under one
//! crius and one containerd, in one run.
//!
//! It prints the median RunPodSandbox and StartContainer latency over alternating rounds,
//! and the resident memory of the shims with 50 pods of one container each running on one
//! handler at a time (the serving shim processes of crius's namespace, summed, per pod).
//!
//! Run with `make bench` (it starts the test bed).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "support/pod.rs"]
mod support;

use std::process::Command;
use std::time::Duration;

use common::{Crius, TestNetwork, pod_config};
use support::{bring_up, tear_down};

const ROUNDS: usize = 20;
const PODS: usize = 50;
const HANDLERS: [(&str, &str); 2] = [
    ("runc", "containerd-shim-crius-v2"),
    ("containerd-runc", "containerd-shim-runc-v2"),
];

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// The summed VmRSS (KiB) and count of the serving shims of `binary` in `namespace`.
fn shim_rss(binary: &str, namespace: &str) -> (u64, usize) {
    let out = Command::new("pgrep")
        .args(["-f", &format!("{binary} -namespace {namespace} ")])
        .output()
        .expect("pgrep");
    let mut total = 0;
    let mut count = 0;
    for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let rss: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0);
        total += rss;
        count += 1;
    }
    (total, count)
}

#[tokio::main]
async fn main() {
    let mut network = None;
    let crius = Crius::start_with(
        |config| {
            network = Some(TestNetwork::install(config, 151));
            config.log.level = "info".to_string();
        },
        &[],
    )
    .await;
    let namespace = crius.config.containerd.namespace.clone();
    let mut client = crius.client().await;
    common::pod::pull(&mut client, "busybox:latest").await;

    // Latency: rounds alternate between the handlers, after one unmeasured round each.
    let mut samples: Vec<[Vec<Duration>; 2]> = vec![Default::default(), Default::default()];
    for round in 0..=ROUNDS {
        for (h, (handler, _)) in HANDLERS.iter().enumerate() {
            let (pod_id, [run, start]) = bring_up(
                &mut client,
                pod_config(&format!("lat-{h}-{round}")),
                handler,
            )
            .await;
            tear_down(&mut client, &pod_id).await;
            if round > 0 {
                samples[h][0].push(run);
                samples[h][1].push(start);
            }
        }
    }

    // Memory: PODS pods on one handler at a time.
    let mut memory = [(0u64, 0usize); 2];
    for (h, (handler, binary)) in HANDLERS.iter().enumerate() {
        let mut pods = Vec::new();
        for i in 0..PODS {
            let (pod_id, _) =
                bring_up(&mut client, pod_config(&format!("mem-{h}-{i}")), handler).await;
            pods.push(pod_id);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        memory[h] = shim_rss(binary, &namespace);
        for pod_id in &pods {
            tear_down(&mut client, pod_id).await;
        }
    }

    println!("\nshim benchmark ({ROUNDS} rounds; {PODS} pods of one container for memory)\n");
    println!(
        "| | crius shim (`runc`) | Go shim (`containerd-runc`) | crius / Go |\n|---|---|---|---|"
    );
    for (step, name) in ["RunPodSandbox p50", "StartContainer p50"]
        .iter()
        .enumerate()
    {
        let ours = median(&mut samples[0][step]);
        let go = median(&mut samples[1][step]);
        println!(
            "| {name} | {} | {} | {:.2} |",
            ms(ours),
            ms(go),
            ours.as_secs_f64() / go.as_secs_f64()
        );
    }
    let per_pod = |(kib, count): (u64, usize)| {
        let pods = PODS.max(1) as f64;
        (kib as f64 / 1024.0 / pods, count)
    };
    let (ours, our_count) = per_pod(memory[0]);
    let (go, go_count) = per_pod(memory[1]);
    println!(
        "| shim RSS per pod | {ours:.2} MiB ({our_count} shims) | {go:.2} MiB ({go_count} shims) | {:.2} |",
        ours / go.max(f64::MIN_POSITIVE)
    );
    drop(network);
}
