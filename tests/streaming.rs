//! exec, attach and port-forward through the stream server, with SPDY and WebSocket clients
//! of the test's own, against real containers; and that nothing is left behind.

mod common;

use std::time::Duration;

use common::pod::{Pod, container, pod, pod_with};
use common::streams::{
    SessionInput, SpdyClient, WsMessage, forward_once, spdy_session, websocket, ws_collect,
};
use common::{Crius, TestNetwork, eventually, pod_config};
use crius::api::v1::{AttachRequest, ExecRequest, PortForwardRequest, StatusRequest};
use futures::SinkExt;
use tonic::Code;

const SLEEP: &[&str] = &["sleep", "1000"];

fn exec_request(id: &str, cmd: &[&str]) -> ExecRequest {
    ExecRequest {
        container_id: id.to_string(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        stdout: true,
        ..Default::default()
    }
}

async fn exec_url(pod: &mut Pod, request: ExecRequest) -> String {
    pod.client
        .runtime
        .exec(request)
        .await
        .expect("Exec")
        .into_inner()
        .url
}

async fn sleeper(crius: &Crius, name: &str) -> (Pod, String) {
    let mut pod = pod(crius, name).await;
    let id = pod.run(container("sleeper", "busybox:latest", SLEEP)).await;
    (pod, id)
}

#[tokio::test]
async fn exec_prints_to_stdout_and_reports_success() {
    let crius = Crius::start().await;
    let (mut pod, id) = sleeper(&crius, "exec-echo").await;
    let url = exec_url(&mut pod, exec_request(&id, &["echo", "hello"])).await;
    let (prefix, token) = url.rsplit_once('/').expect("a token");
    assert!(prefix.starts_with("http://127.0.0.1:"), "{url}");
    assert!(prefix.ends_with("/exec"), "{url}");
    assert_eq!(token.len(), 8, "{url}");

    let output = spdy_session(&url, SessionInput::default()).await;
    assert_eq!(output.stdout, "hello\n");
    assert_eq!(output.error, r#"{"metadata":{},"status":"Success"}"#);
}

#[tokio::test]
async fn exec_with_stdin_and_a_non_zero_exit() {
    let crius = Crius::start().await;
    let (mut pod, id) = sleeper(&crius, "exec-stdin").await;
    let request = ExecRequest {
        stdin: true,
        stderr: true,
        ..exec_request(&id, &["sh", "-c", "cat; echo to-stderr >&2; exit 7"])
    };
    let url = exec_url(&mut pod, request).await;
    let output = spdy_session(
        &url,
        SessionInput {
            stdin: Some(b"line one\nline two\n"),
            close_stdin: true,
            stderr: true,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(output.stdout, "line one\nline two\n");
    assert_eq!(output.stderr, "to-stderr\n");
    let status = output.status();
    assert_eq!(status["status"], "Failure");
    assert_eq!(status["reason"], "NonZeroExitCode");
    assert_eq!(status["details"]["causes"][0]["reason"], "ExitCode");
    assert_eq!(status["details"]["causes"][0]["message"], "7");
    assert!(
        status["message"]
            .as_str()
            .unwrap_or_default()
            .ends_with("exit code 7"),
        "{status}"
    );
}

#[tokio::test]
async fn tty_exec_applies_the_terminal_size() {
    let crius = Crius::start().await;
    let (mut pod, id) = sleeper(&crius, "exec-tty").await;
    // The size arrives while the process starts: wait for it rather than race it.
    let script = "for i in $(seq 50); do s=$(stty size); [ \"$s\" = \"45 123\" ] && break; sleep 0.1; done; echo size=$s; tty";
    let request = ExecRequest {
        stdin: true,
        tty: true,
        ..exec_request(&id, &["sh", "-c", script])
    };
    let url = exec_url(&mut pod, request).await;
    let output = spdy_session(
        &url,
        SessionInput {
            stdin: Some(b""),
            tty: true,
            resize: Some((123, 45)),
            ..Default::default()
        },
    )
    .await;
    assert!(
        output.stdout.contains("size=45 123\r\n"),
        "{:?}",
        output.stdout
    );
    assert!(output.stdout.contains("/dev/pts/"), "{:?}", output.stdout);
    assert_eq!(output.status()["status"], "Success");
}

#[tokio::test]
async fn an_exec_that_cannot_start_is_an_internal_error() {
    let crius = Crius::start().await;
    let (mut pod, id) = sleeper(&crius, "exec-missing").await;
    let url = exec_url(&mut pod, exec_request(&id, &["/no/such/binary"])).await;
    let output = spdy_session(&url, SessionInput::default()).await;
    let status = output.status();
    assert_eq!(status["status"], "Failure");
    assert_eq!(status["reason"], "InternalError");
    assert!(
        status["message"]
            .as_str()
            .unwrap_or_default()
            .contains("/no/such/binary"),
        "{status}"
    );
}

#[tokio::test]
async fn a_client_that_goes_away_takes_its_exec_with_it() {
    let crius = Crius::start().await;
    let (mut pod, id) = sleeper(&crius, "exec-gone").await;
    let url = exec_url(&mut pod, exec_request(&id, &["sleep", "1000"])).await;
    let mut client = SpdyClient::connect(&url, &["v4.channel.k8s.io"])
        .await
        .expect("upgrade");
    client.open(&[("streamType", "error")]).await;
    client.open(&[("streamType", "stdout")]).await;
    let processes = || {
        crius
            .ctr(&["tasks", "ps", &id])
            .lines()
            .skip(1)
            .filter(|l| !l.trim().is_empty())
            .count()
    };
    assert!(
        eventually(Duration::from_secs(10), || async { processes() == 2 }).await,
        "the exec did not start"
    );
    client.close().await;
    assert!(
        eventually(Duration::from_secs(10), || async { processes() == 1 }).await,
        "the exec outlived its client"
    );
}

#[tokio::test]
async fn attach_reads_and_writes_the_containers_own_stdio() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "attach").await;
    let mut config = container(
        "talker",
        "busybox:latest",
        &["sh", "-c", "read line; echo got:$line; echo oops >&2"],
    );
    config.stdin = true;
    config.stdin_once = true;
    let id = pod.run(config).await;
    let url = pod
        .client
        .runtime
        .attach(AttachRequest {
            container_id: id.clone(),
            stdin: true,
            stdout: true,
            stderr: true,
            tty: false,
        })
        .await
        .expect("Attach")
        .into_inner()
        .url;
    assert!(url.contains("/attach/"), "{url}");
    let output = spdy_session(
        &url,
        SessionInput {
            stdin: Some(b"hello\n"),
            close_stdin: true,
            stderr: true,
            // Let the attach subscribe before the container answers.
            stdin_delay: Duration::from_millis(300),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(output.stdout, "got:hello\n");
    assert_eq!(output.stderr, "oops\n");
    assert_eq!(output.status()["status"], "Success");
    pod.wait_exited(&id).await;
}

#[tokio::test]
async fn attach_needs_a_container_created_with_stdin_for_stdin() {
    let crius = Crius::start().await;
    let (mut pod, id) = sleeper(&crius, "attach-nostdin").await;
    let err = pod
        .client
        .runtime
        .attach(AttachRequest {
            container_id: id,
            stdin: true,
            stdout: true,
            ..Default::default()
        })
        .await
        .expect_err("no stdin to attach to");
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn stream_rpcs_validate_their_requests() {
    let crius = Crius::start().await;
    let (mut pod, id) = sleeper(&crius, "stream-rpcs").await;
    let mut client = crius.client().await;
    let code = |r: Result<tonic::Response<crius::api::v1::ExecResponse>, tonic::Status>| {
        r.expect_err("refused").code()
    };
    let tty_and_stderr = ExecRequest {
        tty: true,
        stderr: true,
        ..exec_request(&id, &["true"])
    };
    assert_eq!(
        code(client.runtime.exec(tty_and_stderr).await),
        Code::InvalidArgument
    );
    let no_streams = ExecRequest {
        stdout: false,
        ..exec_request(&id, &["true"])
    };
    assert_eq!(
        code(client.runtime.exec(no_streams).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(client.runtime.exec(exec_request(&id, &[])).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            client
                .runtime
                .exec(exec_request("nonexistent", &["true"]))
                .await
        ),
        Code::NotFound
    );
    pod.stop(&id, 0).await;
    assert_eq!(
        code(client.runtime.exec(exec_request(&id, &["true"])).await),
        Code::FailedPrecondition
    );
    let err = client
        .runtime
        .port_forward(PortForwardRequest {
            pod_sandbox_id: "nonexistent".into(),
            port: vec![80],
        })
        .await
        .expect_err("no such sandbox");
    assert_eq!(err.code(), Code::NotFound);
    let err = client
        .runtime
        .port_forward(PortForwardRequest {
            pod_sandbox_id: pod.id.clone(),
            port: vec![70000],
        })
        .await
        .expect_err("bad port");
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn tokens_work_once_and_expire() {
    let crius = Crius::start_with(|c| c.stream.token_ttl = Duration::from_secs(1), &[]).await;
    let (mut pod, id) = sleeper(&crius, "tokens").await;
    let url = exec_url(&mut pod, exec_request(&id, &["true"])).await;
    let output = spdy_session(&url, SessionInput::default()).await;
    assert_eq!(output.status()["status"], "Success");
    let reused = SpdyClient::connect(&url, &["v4.channel.k8s.io"])
        .await
        .err()
        .expect("a used token is refused");
    assert_eq!(reused.status, 404);

    let url = exec_url(&mut pod, exec_request(&id, &["true"])).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let expired = SpdyClient::connect(&url, &["v4.channel.k8s.io"])
        .await
        .err()
        .expect("an expired token is refused");
    assert_eq!(expired.status, 404);

    let (base, _) = url.rsplit_once('/').expect("a token");
    let unknown = SpdyClient::connect(&format!("{base}/AAAAAAAA"), &["v4.channel.k8s.io"])
        .await
        .err()
        .expect("an unknown token is refused");
    assert_eq!(unknown.status, 404);
}

#[tokio::test]
async fn protocol_negotiation_refuses_what_it_cannot_speak() {
    let crius = Crius::start().await;
    let (mut pod, id) = sleeper(&crius, "negotiation").await;
    let url = exec_url(&mut pod, exec_request(&id, &["true"])).await;
    let missing = SpdyClient::connect(&url, &[]).await.err().expect("refused");
    assert_eq!(missing.status, 400);
    let url = exec_url(&mut pod, exec_request(&id, &["true"])).await;
    let unknown = SpdyClient::connect(&url, &["v9.channel.k8s.io"])
        .await
        .err()
        .expect("refused");
    assert_eq!(unknown.status, 403);
    assert!(
        unknown.headers["x-accepted-stream-protocol-versions"].contains("v4.channel.k8s.io"),
        "{unknown:?}"
    );
    // An older protocol is chosen when the client offers only that one.
    let url = exec_url(&mut pod, exec_request(&id, &["true"])).await;
    let client = SpdyClient::connect(&url, &["v9.channel.k8s.io", "v2.channel.k8s.io"])
        .await
        .expect("upgrade");
    assert_eq!(client.protocol, "v2.channel.k8s.io");
}

/// A pod with its own network serving `hello-from-pod` on 8080.
async fn web_pod(crius: &Crius, name: &str) -> (Pod, String) {
    let mut pod = pod_with(crius, pod_config(name)).await;
    let id = pod
        .run(container(
            "web",
            "busybox:latest",
            &[
                "sh",
                "-c",
                "mkdir -p /www && echo hello-from-pod > /www/index.html && exec httpd -f -p 8080 -h /www",
            ],
        ))
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let probe = pod.exec(&id, &["wget", "-qO-", "127.0.0.1:8080"], 5).await;
        if probe.is_ok_and(|(_, _, code)| code == 0) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "httpd did not come up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (pod, id)
}

async fn port_forward_url(pod: &mut Pod, port: i32) -> String {
    pod.client
        .runtime
        .port_forward(PortForwardRequest {
            pod_sandbox_id: pod.id.clone(),
            port: vec![port],
        })
        .await
        .expect("PortForward")
        .into_inner()
        .url
}

const GET: &[u8] = b"GET /index.html HTTP/1.0\r\n\r\n";

#[tokio::test]
async fn port_forward_reaches_a_server_in_the_pod_network() {
    let mut network = None;
    let crius = Crius::start_with(|c| network = Some(TestNetwork::install(c, 120)), &[]).await;
    let (mut pod, _id) = web_pod(&crius, "forward").await;
    let url = port_forward_url(&mut pod, 8080).await;
    let mut client = SpdyClient::connect(&url, &["portforward.k8s.io"])
        .await
        .expect("upgrade");
    assert_eq!(client.protocol, "portforward.k8s.io");

    let (data, error) = forward_once(&mut client, 8080, 0, GET).await;
    assert!(data.starts_with("HTTP/1."), "{data:?}");
    assert!(data.contains("hello-from-pod"), "{data:?}");
    assert_eq!(error, "");

    // Two connections at once over the same session.
    let mut streams = Vec::new();
    for request_id in [1, 2] {
        let id = request_id.to_string();
        let error = client
            .open(&[
                ("streamType", "error"),
                ("port", "8080"),
                ("requestID", &id),
            ])
            .await;
        let data = client
            .open(&[("streamType", "data"), ("port", "8080"), ("requestID", &id)])
            .await;
        streams.push((data, error));
    }
    for (data, _) in &streams {
        client.send(*data, GET, true).await;
    }
    let all: Vec<u32> = streams.iter().flat_map(|(d, e)| [*d, *e]).collect();
    let collected = client.collect(&all).await;
    for (data, _) in &streams {
        assert!(
            collected.text(*data).contains("hello-from-pod"),
            "{collected:?}"
        );
    }

    // Nothing listens on 9999: the error stream says so and the data stream is reset.
    let (data, error) = forward_once(&mut client, 9999, 3, GET).await;
    assert_eq!(data, "");
    assert!(error.contains("9999"), "{error:?}");
    client.close().await;
}

#[tokio::test]
async fn port_forward_on_a_host_network_pod_forwards_on_the_host() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "forward-host").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let (mut socket, _) = listener.accept().await.unwrap();
        socket.write_all(b"from-the-host").await.unwrap();
    });
    let url = port_forward_url(&mut pod, i32::from(port)).await;
    let mut client = SpdyClient::connect(&url, &["portforward.k8s.io"])
        .await
        .expect("upgrade");
    let (data, error) = forward_once(&mut client, port, 0, b"").await;
    assert_eq!(data, "from-the-host");
    assert_eq!(error, "");
    server.await.unwrap();
}

#[tokio::test]
async fn websocket_exec_with_v5_and_stdin_close() {
    let crius = Crius::start().await;
    let (mut pod, id) = sleeper(&crius, "ws-exec").await;
    let url = exec_url(&mut pod, exec_request(&id, &["echo", "hello"])).await;
    let (mut socket, protocol) = websocket(&url, &["v5.channel.k8s.io", "v4.channel.k8s.io"]).await;
    assert_eq!(protocol.as_deref(), Some("v5.channel.k8s.io"));
    let channels = ws_collect(&mut socket).await;
    assert_eq!(channels[&1], b"hello\n");
    assert_eq!(channels[&3], br#"{"metadata":{},"status":"Success"}"#);

    let request = ExecRequest {
        stdin: true,
        ..exec_request(&id, &["sh", "-c", "cat; exit 7"])
    };
    let url = exec_url(&mut pod, request).await;
    let (mut socket, _) = websocket(&url, &["v5.channel.k8s.io"]).await;
    socket
        .send(WsMessage::Binary(b"\0piped\n".to_vec().into()))
        .await
        .unwrap();
    // v5: channel 255 closes the named channel, here stdin.
    socket
        .send(WsMessage::Binary(vec![255, 0].into()))
        .await
        .unwrap();
    let channels = ws_collect(&mut socket).await;
    assert_eq!(channels[&1], b"piped\n");
    let status: serde_json::Value = serde_json::from_slice(&channels[&3]).unwrap();
    assert_eq!(status["details"]["causes"][0]["message"], "7");
}

#[tokio::test]
async fn websocket_base64_and_unsupported_protocols() {
    let crius = Crius::start().await;
    let (mut pod, id) = sleeper(&crius, "ws-base64").await;
    let request = ExecRequest {
        stderr: true,
        ..exec_request(&id, &["sh", "-c", "echo out; echo err >&2"])
    };
    let url = exec_url(&mut pod, request).await;
    let (mut socket, protocol) = websocket(&url, &["base64.channel.k8s.io"]).await;
    assert_eq!(protocol.as_deref(), Some("base64.channel.k8s.io"));
    let channels = ws_collect(&mut socket).await;
    assert_eq!(channels[&1], b"out\n");
    assert_eq!(channels[&2], b"err\n");
    // Before v4 a success writes nothing on the error channel.
    assert!(
        channels.get(&3).is_none_or(|e| e.is_empty()),
        "{channels:?}"
    );

    let url = exec_url(&mut pod, exec_request(&id, &["true"])).await;
    let ws_url = url.replacen("http://", "ws://", 1);
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = ws_url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("Sec-WebSocket-Protocol", "chat".parse().unwrap());
    match tokio_tungstenite::connect_async(request).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 403)
        }
        other => panic!("expected a 403, got {:?}", other.map(|(_, r)| r.status())),
    }
}

/// What crius holds, from `Status` verbose info and /proc.
async fn footprint(crius: &Crius) -> (u64, u64, u64, u64, u64) {
    let mut client = crius.client().await;
    let info = client
        .runtime
        .status(StatusRequest { verbose: true })
        .await
        .expect("Status")
        .into_inner()
        .info;
    let process: serde_json::Value = serde_json::from_str(&info["process"]).unwrap();
    let streaming: serde_json::Value = serde_json::from_str(&info["streaming"]).unwrap();
    let fifos = walk_count(&crius.config.state, "exec");
    (
        process["asyncTasks"].as_u64().unwrap(),
        process["threads"].as_u64().unwrap(),
        process["openFiles"].as_u64().unwrap(),
        streaming["openSessions"].as_u64().unwrap(),
        fifos,
    )
}

/// Entries inside every directory named `name` under `root`.
fn walk_count(root: &std::path::Path, name: &str) -> u64 {
    let mut count = 0;
    let Ok(entries) = std::fs::read_dir(root) else {
        return 0;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if entry.file_name() == name {
                count += std::fs::read_dir(&path)
                    .map(|d| d.count() as u64)
                    .unwrap_or(0);
            } else {
                count += walk_count(&path, name);
            }
        }
    }
    count
}

#[tokio::test]
async fn many_execs_and_forwards_leave_nothing_behind() {
    let mut network = None;
    let crius = Crius::start_with(|c| network = Some(TestNetwork::install(c, 121)), &[]).await;
    let (mut pod, id) = web_pod(&crius, "leaks").await;
    // Warm up: the first session starts what stays (connection pools, the runtime's threads).
    let url = exec_url(&mut pod, exec_request(&id, &["true"])).await;
    spdy_session(&url, SessionInput::default()).await;
    let url = port_forward_url(&mut pod, 8080).await;
    let mut client = SpdyClient::connect(&url, &["portforward.k8s.io"])
        .await
        .unwrap();
    forward_once(&mut client, 8080, 0, GET).await;
    client.close().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = footprint(&crius).await;

    for i in 0..200 {
        let url = exec_url(&mut pod, exec_request(&id, &["echo", "x"])).await;
        let output = spdy_session(&url, SessionInput::default()).await;
        assert_eq!(output.stdout, "x\n", "exec {i}");
    }
    let url = port_forward_url(&mut pod, 8080).await;
    let mut client = SpdyClient::connect(&url, &["portforward.k8s.io"])
        .await
        .unwrap();
    for i in 0..50 {
        let (data, _) = forward_once(&mut client, 8080, i, GET).await;
        assert!(data.contains("hello-from-pod"), "forward {i}");
    }
    client.close().await;

    // Exec processes are deleted in the background, sessions close after their client.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let after = footprint(&crius).await;
        let settled = after.0 <= before.0
            && after.1 <= before.1
            && after.2 <= before.2
            && after.3 == 0
            && after.4 == 0;
        if settled {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "(tasks, threads, fds, sessions, exec FIFO dirs) before {before:?}, after {after:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let processes = crius
        .ctr(&["tasks", "ps", &id])
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .count();
    assert_eq!(processes, 1, "exec processes left in the container");
}

#[tokio::test]
async fn shutdown_is_not_held_up_by_an_open_session() {
    let mut crius = Crius::start().await;
    let (mut pod, id) = sleeper(&crius, "shutdown-session").await;
    let url = exec_url(&mut pod, exec_request(&id, &["sleep", "1000"])).await;
    let mut client = SpdyClient::connect(&url, &["v4.channel.k8s.io"])
        .await
        .unwrap();
    client.open(&[("streamType", "error")]).await;
    client.open(&[("streamType", "stdout")]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    crius.signal(nix::sys::signal::Signal::SIGTERM);
    let status = crius.wait_exit(Duration::from_secs(8)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "crius did not stop cleanly: {status:?}"
    );
}

#[tokio::test]
async fn tls_streaming_serves_https_urls() {
    let crius = Crius::start_with(|c| c.stream.tls = true, &[]).await;
    let (mut pod, id) = sleeper(&crius, "tls").await;
    let url = exec_url(&mut pod, exec_request(&id, &["true"])).await;
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let client = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    // Over TLS the server answers; without the upgrade headers it is a 400.
    let response = client.get(&url).send().await.expect("an HTTPS answer");
    assert_eq!(response.status(), 400);
}

#[tokio::test]
async fn a_request_that_opens_no_stream_closes_its_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let crius = Crius::start().await;
    let (mut pod, id) = sleeper(&crius, "one-request").await;
    // The server's address, from a real URL.
    let url = exec_url(&mut pod, exec_request(&id, &["true"])).await;
    let authority = url
        .strip_prefix("http://")
        .and_then(|rest| rest.split('/').next())
        .expect("host:port")
        .to_string();
    let mut conn = tokio::net::TcpStream::connect(&authority)
        .await
        .expect("connect");
    // Two requests for unknown tokens on one connection: the first answer closes it.
    let request = format!("GET /exec/nosuchtoken HTTP/1.1\r\nHost: {authority}\r\n\r\n");
    conn.write_all(format!("{request}{request}").as_bytes())
        .await
        .expect("send");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut answer))
        .await
        .expect("the connection was kept open")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    assert_eq!(answer.matches("http/1.1 404").count(), 1, "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
}
