//! The daemon itself: both transports and API versions, Status and the CNI conf syncer,
//! ImageFsInfo, start-up checks, the initialized gate, and supervised shutdown.

mod common;

use std::time::{Duration, Instant};

use common::{Crius, bridge_conflist, eventually};
use crius::api::v1::{
    ImageFsInfoRequest, NetworkConfig, RunPodSandboxRequest, RuntimeConfigRequest, StatusRequest,
    StatusResponse, UpdateRuntimeConfigRequest, VersionRequest,
};
use crius::api::v1alpha2;
use crius_testkit::{CriClient, CriClientV1alpha2, TtrpcCriClient};
use nix::sys::signal::Signal;

fn condition(resp: &StatusResponse, kind: &str) -> (bool, String, String) {
    let c = resp
        .status
        .as_ref()
        .expect("status")
        .conditions
        .iter()
        .find(|c| c.r#type == kind)
        .unwrap_or_else(|| panic!("no {kind} condition"));
    (c.status, c.reason.clone(), c.message.clone())
}

async fn network_ready(client: &mut CriClient) -> bool {
    let resp = client
        .runtime
        .status(StatusRequest { verbose: false })
        .await
        .expect("status")
        .into_inner();
    condition(&resp, "NetworkReady").0
}

/// Waits up to 2 s for NetworkReady to become `want`.
async fn wait_network(client: &CriClient, want: bool) -> bool {
    eventually(Duration::from_secs(2), || {
        let mut client = client.clone();
        async move { network_ready(&mut client).await == want }
    })
    .await
}

/// A log going to a file (as `make run > file`, a pipe or the journal) is plain text: no
/// ANSI escape in any line, whatever the terminal crius was started from.
#[tokio::test]
async fn a_log_that_is_not_a_terminal_has_no_colour_codes() {
    let crius = Crius::start().await;
    crius
        .client()
        .await
        .runtime
        .version(VersionRequest::default())
        .await
        .expect("version");
    let log = crius.log();
    assert!(log.contains(" INFO "), "a text log: {log}");
    assert!(!log.contains('\x1b'), "escape codes in the log: {log:?}");
}

#[tokio::test]
async fn version_answers_over_grpc_v1_v1alpha2_and_ttrpc() {
    let crius = Crius::start().await;

    let v1 = crius
        .client()
        .await
        .runtime
        .version(VersionRequest::default())
        .await
        .expect("v1 version")
        .into_inner();
    assert_eq!(v1.runtime_name, "crius");
    assert_eq!(v1.runtime_api_version, "v1");
    assert_eq!(v1.runtime_version, env!("CARGO_PKG_VERSION"));

    let mut alpha = CriClientV1alpha2::connect(crius.grpc_socket())
        .await
        .expect("connect v1alpha2");
    let v1alpha2 = alpha
        .runtime
        .version(v1alpha2::VersionRequest::default())
        .await
        .expect("v1alpha2 version")
        .into_inner();
    assert_eq!(v1alpha2.runtime_name, "crius");
    assert_eq!(v1alpha2.runtime_api_version, "v1alpha2");

    let ttrpc = TtrpcCriClient::connect(crius.ttrpc_socket())
        .await
        .expect("connect ttrpc");
    let over_ttrpc = ttrpc.version("v1").await.expect("ttrpc version");
    assert_eq!(over_ttrpc.runtime_name, "crius");
    assert_eq!(over_ttrpc.runtime_api_version, "v1");
    let alpha_ttrpc = ttrpc.version("v1alpha2").await.expect("ttrpc v1alpha2");
    assert_eq!(alpha_ttrpc.runtime_api_version, "v1alpha2");

    // Errors keep their code over ttrpc too.
    let err = ttrpc
        .call::<_, crius::api::v1::RunPodSandboxResponse>(
            "runtime.v1.RuntimeService",
            "RunPodSandbox",
            &RunPodSandboxRequest::default(),
        )
        .await
        .expect_err("not built yet");
    assert_ne!(err.code(), tonic::Code::Ok);
    assert_ne!(err.code(), tonic::Code::Unknown, "{err:?}");
}

/// One HTTP/2 frame: (type, flags, stream, payload).
type H2Frame = (u8, u8, u32, Vec<u8>);

fn h2_frame(frame_type: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend_from_slice(&[frame_type, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

async fn read_h2_frame(socket: &mut tokio::net::UnixStream) -> Option<H2Frame> {
    use tokio::io::AsyncReadExt;
    let mut head = [0u8; 9];
    socket.read_exact(&mut head).await.ok()?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    socket.read_exact(&mut payload).await.ok()?;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    Some((head[3], head[4], stream, payload))
}

/// grpc-go in kubelet and crictl up to 1.26 sends the socket path as `:authority`.
#[tokio::test]
async fn grpc_clients_that_send_the_socket_path_as_authority_are_served() {
    use tokio::io::AsyncWriteExt;
    let crius = Crius::start().await;
    let path = crius.grpc_socket().display().to_string();
    let mut socket = tokio::net::UnixStream::connect(crius.grpc_socket())
        .await
        .expect("connect");
    let headers: Vec<(&[u8], &[u8])> = vec![
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/runtime.v1.RuntimeService/Version"),
        (b":authority", path.as_bytes()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ];
    let mut encoder = loona_hpack::Encoder::new();
    let mut request = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    request.extend(h2_frame(0x4, 0, 0, &[]));
    // Two calls on one connection: the second block refers to the first's table entries.
    for stream in [1u32, 3] {
        let block = encoder.encode(headers.iter().copied());
        request.extend(h2_frame(0x1, 0x4, stream, &block));
        // gRPC message: uncompressed, 4 bytes, VersionRequest { version: "v1" }.
        let message = [0u8, 0, 0, 0, 4, 0x0a, 2, b'v', b'1'];
        request.extend(h2_frame(0x0, 0x1, stream, &message));
    }
    socket.write_all(&request).await.expect("send");
    let mut answered = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while answered.len() < 2 {
        assert!(Instant::now() < deadline, "no answers");
        let frame = tokio::time::timeout(Duration::from_secs(10), read_h2_frame(&mut socket))
            .await
            .expect("a frame in time")
            .expect("the server kept the connection");
        let (frame_type, flags, stream, payload) = frame;
        assert_ne!(frame_type, 0x3, "stream {stream} was reset");
        if frame_type == 0x4 && flags & 0x1 == 0 {
            socket
                .write_all(&h2_frame(0x4, 0x1, 0, &[]))
                .await
                .expect("ack settings");
        }
        if frame_type == 0x0 && payload.windows(5).any(|w| w == b"crius") {
            answered.insert(stream);
        }
    }
}

/// The CRI socket tells each client how many calls it may have in flight.
#[tokio::test]
async fn the_grpc_server_limits_calls_in_flight_per_connection() {
    use tokio::io::AsyncWriteExt;
    let crius = Crius::start().await;
    let mut socket = tokio::net::UnixStream::connect(crius.grpc_socket())
        .await
        .expect("connect");
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend(h2_frame(0x4, 0, 0, &[]));
    socket.write_all(&hello).await.expect("send");
    let (frame_type, flags, _, payload) =
        tokio::time::timeout(Duration::from_secs(10), read_h2_frame(&mut socket))
            .await
            .expect("a frame in time")
            .expect("the server's settings");
    assert_eq!((frame_type, flags), (0x4, 0), "not the server's SETTINGS");
    let limit = payload.chunks_exact(6).find_map(|setting| {
        (u16::from_be_bytes([setting[0], setting[1]]) == 0x3)
            .then(|| u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]]))
    });
    assert_eq!(limit, Some(crius::server::MAX_CONCURRENT_STREAMS));
}

#[tokio::test]
async fn status_reports_runtime_ready_and_follows_the_cni_conf_dir() {
    let crius = Crius::start().await;
    let mut client = crius.client().await;
    let conf_dir = crius.conf_dir().to_path_buf();

    let resp = client
        .runtime
        .status(StatusRequest { verbose: false })
        .await
        .expect("status")
        .into_inner();
    assert!(condition(&resp, "RuntimeReady").0);
    let (ready, reason, message) = condition(&resp, "NetworkReady");
    assert!(!ready);
    assert_eq!(reason, "NetworkPluginNotReady");
    assert!(message.contains("no network config found"), "{message}");

    // A conflist arrives: ready.
    let file = conf_dir.join("10-test.conflist");
    std::fs::write(&file, bridge_conflist("crius-test", "10.99.0.0/16")).unwrap();
    assert!(
        wait_network(&client, true).await,
        "conflist added:\n{}",
        crius.log()
    );

    // It is removed: not ready.
    std::fs::remove_file(&file).unwrap();
    assert!(wait_network(&client, false).await, "conflist removed");

    // A file moved in by rename (only a create/rename event in the dir).
    let staged = crius.dir.path().join("staged.conflist");
    std::fs::write(&staged, bridge_conflist("crius-test", "10.99.0.0/16")).unwrap();
    std::fs::rename(&staged, &file).unwrap();
    assert!(wait_network(&client, true).await, "conflist renamed in");

    // The conf dir is deleted, then recreated with a config in it.
    std::fs::remove_dir_all(&conf_dir).unwrap();
    assert!(wait_network(&client, false).await, "conf dir deleted");
    std::fs::create_dir(&conf_dir).unwrap();
    std::fs::write(&file, bridge_conflist("crius-test", "10.99.0.0/16")).unwrap();
    assert!(wait_network(&client, true).await, "conf dir recreated");

    // Verbose status carries the effective config and the loaded CNI config as JSON.
    let resp = client
        .runtime
        .status(StatusRequest { verbose: true })
        .await
        .expect("verbose status")
        .into_inner();
    let config: serde_json::Value = serde_json::from_str(&resp.info["config"]).unwrap();
    assert_eq!(
        config["containerd"]["namespace"],
        crius.config.containerd.namespace.as_str()
    );
    // ...and the keys containerd's CRI has there, under its names.
    let dir = |p: &std::path::Path| serde_json::Value::from(p.display().to_string());
    assert_eq!(config["rootDir"], dir(&crius.config.root));
    assert_eq!(config["stateDir"], dir(&crius.config.state));
    assert_eq!(
        config["containerdEndpoint"],
        dir(&crius.config.containerd.address)
    );
    assert_eq!(config["maxContainerLogLineSize"], 16384);
    assert_eq!(config["cni"]["confDir"], dir(crius.conf_dir()));
    let cni: serde_json::Value = serde_json::from_str(&resp.info["cniconfig"]).unwrap();
    assert_eq!(cni["networks"][0]["config"]["name"], "crius-test");
    assert_eq!(resp.info["lastCNILoadStatus"], "OK");
}

#[tokio::test]
async fn image_fs_info_reports_the_snapshotter_directory() {
    let crius = Crius::start().await;
    let resp = crius
        .client()
        .await
        .image
        .image_fs_info(ImageFsInfoRequest {})
        .await
        .expect("image fs info")
        .into_inner();
    let fs = &resp.image_filesystems[0];
    let expected = crius
        .config
        .containerd
        .root
        .join("io.containerd.snapshotter.v1.overlayfs");
    assert_eq!(
        fs.fs_id.as_ref().unwrap().mountpoint,
        expected.display().to_string()
    );
    assert!(fs.used_bytes.unwrap().value > 0);
    assert!(fs.inodes_used.unwrap().value > 0);
    assert!(fs.timestamp > 0);
    // The writable layers share that filesystem: the same one, not a split one.
    assert_eq!(resp.container_filesystems.len(), 1);
    assert_eq!(
        resp.container_filesystems[0]
            .fs_id
            .as_ref()
            .unwrap()
            .mountpoint,
        expected.display().to_string()
    );
}

#[tokio::test]
async fn unknown_snapshotter_stops_start_up() {
    let mut crius = Crius::spawn_with(|c| c.containerd.snapshotter = "nosuch".into(), &[]);
    let status = crius
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("crius exits");
    assert!(!status.success());
    assert!(
        crius
            .log()
            .contains(r#"failed to find snapshotter "nosuch""#),
        "{}",
        crius.log()
    );
}

#[tokio::test]
async fn unreachable_containerd_fails_naming_the_socket() {
    let mut crius = Crius::spawn_with(
        |c| {
            c.containerd.address = "/nonexistent/containerd.sock".into();
            c.containerd.connect_timeout = Duration::from_millis(500);
        },
        &[],
    );
    let status = crius
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("crius exits");
    assert!(!status.success());
    let log = crius.log();
    assert!(
        log.contains("failed to connect to containerd at /nonexistent/containerd.sock"),
        "{log}"
    );
}

#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs --features failpoints (make test has it)"
)]
async fn rpcs_before_start_up_finished_are_unavailable() {
    let mut crius = Crius::spawn_with(|_| {}, &[("CRIUS_FAILPOINTS", "startup=sleep(3000)")]);
    let socket = crius.grpc_socket().to_path_buf();
    assert!(
        eventually(Duration::from_secs(10), || {
            let socket = socket.clone();
            async move {
                match CriClient::connect(&socket).await {
                    Ok(mut client) => match client.runtime.version(VersionRequest::default()).await
                    {
                        Err(status) => {
                            assert_eq!(status.code(), tonic::Code::Unavailable);
                            assert_eq!(status.message(), "server is not initialized yet");
                            true
                        }
                        Ok(_) => panic!("served before start-up finished"),
                    },
                    Err(_) => false,
                }
            }
        })
        .await,
        "never saw UNAVAILABLE:\n{}",
        crius.log()
    );
    crius.wait_ready(Duration::from_secs(10)).await;
}

/// The next datagram on a service manager's notify socket, within `timeout`.
async fn next_notification(socket: &tokio::net::UnixDatagram, timeout: Duration) -> Option<String> {
    let mut buf = vec![0u8; 4096];
    let len = tokio::time::timeout(timeout, socket.recv(&mut buf))
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&buf[..len]).into_owned())
}

#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs --features failpoints (make test has it)"
)]
async fn systemd_hears_ready_only_once_crius_serves_and_stopping_at_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let notify_path = dir.path().join("notify.sock");
    let notify = tokio::net::UnixDatagram::bind(&notify_path).unwrap();
    let notify_env = notify_path.to_str().unwrap();
    let mut crius = Crius::spawn_with(
        |_| {},
        &[
            ("NOTIFY_SOCKET", notify_env),
            ("CRIUS_FAILPOINTS", "startup=sleep(1500)"),
        ],
    );

    let first = next_notification(&notify, Duration::from_secs(20)).await;
    assert_eq!(
        first.as_deref(),
        Some("STATUS=recovering state\n"),
        "{}",
        crius.log()
    );
    // Start-up is held by the failpoint: not ready, and the CRI says so.
    let mut client = crius.client_now().await.expect("the socket is bound");
    let early = client.runtime.version(VersionRequest::default()).await;
    assert_eq!(early.unwrap_err().code(), tonic::Code::Unavailable);

    let ready = next_notification(&notify, Duration::from_secs(20)).await;
    assert_eq!(
        ready.as_deref(),
        Some("READY=1\nSTATUS=serving the CRI\n"),
        "{}",
        crius.log()
    );
    client
        .runtime
        .version(VersionRequest::default())
        .await
        .expect("served once READY was sent");

    crius.signal(Signal::SIGTERM);
    let stopping = next_notification(&notify, Duration::from_secs(5)).await;
    assert_eq!(stopping.as_deref(), Some("STOPPING=1\n"));
    let status = crius
        .wait_exit(Duration::from_secs(5))
        .await
        .expect("exits");
    assert!(status.success(), "{status}");
}

#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs --features failpoints (make test has it)"
)]
async fn sigterm_lets_the_rpc_in_flight_finish_and_exits_zero() {
    let mut crius = Crius::start_with_failpoints("rpc.Version=sleep(1500)").await;
    let mut client = crius.client().await;
    let in_flight =
        tokio::spawn(async move { client.runtime.version(VersionRequest::default()).await });
    tokio::time::sleep(Duration::from_millis(300)).await;

    let start = Instant::now();
    crius.signal(Signal::SIGTERM);
    let status = crius
        .wait_exit(Duration::from_secs(5))
        .await
        .expect("crius exits within 5 s");
    assert!(status.success(), "{status}:\n{}", crius.log());
    assert!(start.elapsed() < Duration::from_secs(5));
    let answered = in_flight.await.unwrap();
    assert!(answered.is_ok(), "in-flight RPC: {answered:?}");
    assert!(!crius.grpc_socket().exists(), "gRPC socket left behind");
    assert!(!crius.ttrpc_socket().exists(), "ttrpc socket left behind");
}

#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs --features failpoints (make test has it)"
)]
async fn a_failing_critical_task_stops_crius_with_the_cause() {
    let mut crius = Crius::spawn_with(|_| {}, &[("CRIUS_FAILPOINTS", "cni_conf_syncer=error")]);
    let status = crius
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("crius exits");
    assert!(!status.success());
    let log = crius.log();
    assert!(
        log.contains("critical task CNI conf syncer failed: failpoint cni_conf_syncer triggered"),
        "{log}"
    );
    assert!(!crius.grpc_socket().exists());
}

#[tokio::test]
async fn a_second_crius_on_a_live_socket_refuses_to_start() {
    let first = Crius::start().await;
    let socket = first.config.grpc.address.clone();
    let mut second = Crius::spawn_with(|c| c.grpc.address = socket.clone(), &[]);
    let status = second
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("second crius exits");
    assert!(!status.success());
    assert!(
        second.log().contains("already listening"),
        "{}",
        second.log()
    );
    // The first one still serves.
    first
        .client()
        .await
        .runtime
        .version(VersionRequest::default())
        .await
        .expect("first crius still serves");
}

#[tokio::test]
async fn a_stale_socket_file_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());
    let crius = Crius::start_with(|c| c.grpc.address = socket.clone(), &[]).await;
    crius
        .client()
        .await
        .runtime
        .version(VersionRequest::default())
        .await
        .expect("serves on the replaced socket");
}

#[tokio::test]
async fn update_runtime_config_writes_the_conflist_template() {
    let template_dir = tempfile::tempdir().unwrap();
    let template = template_dir.path().join("template.json");
    std::fs::write(
        &template,
        r#"{"cniVersion":"1.0.0","name":"from-template","plugins":[{"type":"bridge","bridge":"tmpl0",
"ipam":{"type":"host-local","ranges":[{{.PodCIDRRanges}}],"routes":[{{.Routes}}]}}]}"#,
    )
    .unwrap();
    let template_path = template.display().to_string();
    let crius = Crius::start_with(|c| c.cni.conf_template = template_path, &[]).await;
    let mut client = crius.client().await;
    assert!(!network_ready(&mut client).await);

    let bad = client
        .runtime
        .update_runtime_config(UpdateRuntimeConfigRequest {
            runtime_config: Some(crius::api::v1::RuntimeConfig {
                network_config: Some(NetworkConfig {
                    pod_cidr: "not-a-cidr".into(),
                }),
            }),
        })
        .await
        .expect_err("bad CIDR");
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);

    client
        .runtime
        .update_runtime_config(UpdateRuntimeConfigRequest {
            runtime_config: Some(crius::api::v1::RuntimeConfig {
                network_config: Some(NetworkConfig {
                    pod_cidr: "10.77.0.0/24".into(),
                }),
            }),
        })
        .await
        .expect("update runtime config");
    let written = std::fs::read_to_string(crius.conf_dir().join("10-crius-net.conflist"))
        .expect("conflist written");
    let value: serde_json::Value = serde_json::from_str(&written).expect("valid JSON");
    assert_eq!(
        value["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
        "10.77.0.0/24"
    );
    assert!(network_ready(&mut client).await);

    let runtime_config = client
        .runtime
        .runtime_config(RuntimeConfigRequest {})
        .await
        .expect("runtime config")
        .into_inner();
    assert_eq!(
        runtime_config.linux.unwrap().cgroup_driver,
        crius::api::v1::CgroupDriver::Cgroupfs as i32
    );
}

#[test]
fn config_check_names_an_unknown_key_and_accepts_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[containerd]\nsnapshoter = \"overlayfs\"\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_crius"))
        .args(["config", "check", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("snapshoter"), "{stderr}");

    let default = std::process::Command::new(env!("CARGO_BIN_EXE_crius"))
        .args(["config", "default"])
        .output()
        .unwrap();
    assert!(default.status.success());
    let good = dir.path().join("good.toml");
    std::fs::write(&good, &default.stdout).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_crius"))
        .args(["config", "check", "--config"])
        .arg(&good)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
