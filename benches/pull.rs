//! Pull benchmark: pull + unpack of a 50 MB, five-layer image from the loopback registry,
//! by crius (PullImage) and by `ctr images pull --plain-http` on the same containerd, in the
//! same run. Every pull is cold: each round uses fresh containerd namespaces, and after each
//! pull the image is removed with a synchronous garbage collection, so no blob or snapshot
//! is left on disk for the next pull to share.
//!
//! Run with `make bench` (it starts a fresh test bed and pushes the image).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{Crius, Testbed};
use crius::api::v1::{ImageSpec, PullImageRequest, RemoveImageRequest};

const ROUNDS: usize = 5;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

fn ctr(testbed: &Testbed, namespace: &str, args: &[&str]) {
    let out = std::process::Command::new("ctr")
        .arg("--address")
        .arg(&testbed.containerd_address)
        .args(["-n", namespace])
        .args(args)
        .output()
        .expect("run ctr");
    assert!(
        out.status.success(),
        "ctr {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::main]
async fn main() {
    let testbed = Testbed::from_env();
    let image = format!("{}/bench/big:latest", testbed.registry);
    let spec = || {
        Some(ImageSpec {
            image: image.clone(),
            ..Default::default()
        })
    };
    let mut crius_times = Vec::new();
    let mut ctr_times = Vec::new();

    for round in 0..ROUNDS {
        let crius = Crius::start().await;
        let mut client = crius.client().await;
        let start = Instant::now();
        client
            .image
            .pull_image(PullImageRequest {
                image: spec(),
                ..Default::default()
            })
            .await
            .expect("crius pull");
        crius_times.push(start.elapsed());
        client
            .image
            .remove_image(RemoveImageRequest { image: spec() })
            .await
            .expect("crius remove");

        let namespace = format!("crius-bench-ctr-{}-{round}", std::process::id());
        let start = Instant::now();
        ctr(
            &testbed,
            &namespace,
            &["images", "pull", "--plain-http", &image],
        );
        ctr_times.push(start.elapsed());
        ctr(&testbed, &namespace, &["images", "rm", "--sync", &image]);
        println!(
            "round {round}: crius {}  ctr {}",
            ms(crius_times[round]),
            ms(ctr_times[round])
        );
    }

    println!();
    println!("pull + unpack of {image} (50 MB, 5 layers), {ROUNDS} cold rounds");
    println!("{:<30} {:>8} {:>8}", "", "median", "best");
    for (name, samples) in [
        ("crius PullImage", &crius_times),
        ("ctr images pull --plain-http", &ctr_times),
    ] {
        println!(
            "{name:<30} {:>8} {:>8}",
            ms(median(samples.clone())),
            ms(*samples.iter().min().unwrap_or(&Duration::ZERO))
        );
    }
}
