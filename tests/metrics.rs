//! crius's Prometheus metrics, scraped from its listener after real work: RPCs, a pod's
//! CNI ADD, an image pull, a container's exit and an exec session.

mod common;

use std::time::Duration;

use common::pod::{container, pod_with};
use common::registry_push::push_random_image;
use common::streams::{websocket, ws_collect};
use common::{Crius, TestNetwork, Testbed, eventually, pod_config};
use crius::api::v1::{
    ContainerStatusRequest, ExecRequest, ImageSpec, PullImageRequest, VersionRequest,
};

/// A free loopback port (the race with another binder is harmless in a test bed).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

async fn scrape(address: &str) -> String {
    let response = reqwest::get(format!("http://{address}/metrics"))
        .await
        .expect("scrape");
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    response.text().await.unwrap()
}

/// The value of the sample line starting with `series` (name and labels), if any.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn metrics_count_rpcs_cni_pulls_exits_and_exec_sessions() {
    let address = format!("127.0.0.1:{}", free_port());
    let mut network = None;
    let crius = Crius::start_with(
        |c| {
            c.metrics.address = address.clone();
            network = Some(TestNetwork::install(c, 160));
        },
        &[],
    )
    .await;
    let network = network.unwrap();
    let mut pod = pod_with(&crius, pod_config("metrics")).await;
    pod.client
        .runtime
        .version(VersionRequest::default())
        .await
        .unwrap();
    let missing = pod
        .client
        .runtime
        .container_status(ContainerStatusRequest {
            container_id: "no-such-container".to_string(),
            verbose: false,
        })
        .await;
    assert_eq!(missing.unwrap_err().code(), tonic::Code::NotFound);
    let done = pod
        .run(container("done", "busybox:latest", &["true"]))
        .await;
    pod.wait_exited(&done).await;
    let sleeper = pod
        .run(container("sleeper", "busybox:latest", &["sleep", "300"]))
        .await;

    // A layer no namespace of containerd holds yet, so its bytes come from the registry.
    let registry = Testbed::from_env().registry;
    let fresh = format!("{registry}/{}", push_random_image(&registry).await);
    pod.client
        .image
        .pull_image(PullImageRequest {
            image: Some(ImageSpec {
                image: fresh,
                ..Default::default()
            }),
            auth: None,
            sandbox_config: None,
        })
        .await
        .unwrap();

    let text = scrape(&address).await;
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(!text.contains("_total_total"), "{text}");
    let count = |series: &str| sample(&text, series).unwrap_or(0.0);
    assert!(
        count(r#"crius_rpc_duration_seconds_count{rpc="Version",code="OK"}"#) >= 1.0,
        "{text}"
    );
    assert_eq!(
        count(r#"crius_rpc_duration_seconds_count{rpc="ContainerStatus",code="NotFound"}"#),
        1.0,
        "{text}"
    );
    assert_eq!(
        count(&format!(
            r#"crius_cni_operation_duration_seconds_count{{operation="add",network="{}"}}"#,
            network.name
        )),
        1.0,
        "{text}"
    );
    assert!(
        count(r#"crius_image_pulls_total{result="success"}"#) >= 1.0,
        "{text}"
    );
    // The fresh image's 512 KiB layer at least.
    assert!(
        count("crius_image_pull_bytes_total") >= 512.0 * 1024.0,
        "{text}"
    );
    assert_eq!(
        count(r#"crius_container_exits_total{reason="Completed"}"#),
        1.0,
        "{text}"
    );
    assert!(count("crius_process_resident_memory_bytes") > 1e6, "{text}");
    assert!(count("crius_process_open_fds") > 0.0, "{text}");
    assert!(
        sample(&text, "crius_recovery_duration_seconds").is_some(),
        "{text}"
    );
    // Only the scrape itself is in flight... and the ones in the gauge are not negative.
    assert_eq!(
        count(r#"crius_rpcs_in_flight{rpc="Version"}"#),
        0.0,
        "{text}"
    );

    // An exec session open shows; closed, it goes.
    let url = pod
        .client
        .runtime
        .exec(ExecRequest {
            container_id: sleeper.clone(),
            cmd: vec!["sh".into(), "-c".into(), "sleep 2; echo done".into()],
            stdout: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .url;
    let (mut socket, _) = websocket(&url, &["v5.channel.k8s.io"]).await;
    let open = r#"crius_stream_sessions{kind="exec"}"#;
    assert!(
        eventually(Duration::from_secs(2), || async {
            sample(&scrape(&address).await, open) == Some(1.0)
        })
        .await,
        "the exec session never showed"
    );
    let channels = ws_collect(&mut socket).await;
    assert_eq!(channels[&1], b"done\n");
    assert!(
        eventually(Duration::from_secs(5), || async {
            sample(&scrape(&address).await, open) == Some(0.0)
        })
        .await,
        "the exec session still counted after it ended"
    );
    pod.remove_pod().await;
}

#[tokio::test]
async fn the_listener_serves_only_metrics() {
    let address = format!("127.0.0.1:{}", free_port());
    let _crius = Crius::start_with(|c| c.metrics.address = address.clone(), &[]).await;
    let other = reqwest::get(format!("http://{address}/debug"))
        .await
        .unwrap();
    assert_eq!(other.status(), 404);
    let client = reqwest::Client::new();
    let post = client
        .post(format!("http://{address}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(post.status(), 405);
}

#[test]
fn crius_metrics_lists_every_metric_with_its_meaning() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_crius"))
        .arg("metrics")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for line in [
        "crius_rpc_duration_seconds (histogram): ",
        "crius_container_exits_total (counter): ",
        "crius_stream_sessions (gauge): ",
        "crius_process_threads (gauge): ",
    ] {
        assert!(text.contains(line), "{line} missing:\n{text}");
    }
}
