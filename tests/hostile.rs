//! A tenant who picks the image or the pod config attacks the node through crius: the
//! attacks run against the real daemon, and each must fail safely, quickly, and leave crius
//! answering.

mod common;

use std::time::{Duration, Instant};

use common::Crius;
use common::pod::{Pod, container, image, pod};
use crius::api::v1::{ImageSpec, PullImageRequest};
use tonic::Code;

/// crius's resident memory, in KiB.
fn rss_kib(crius: &Crius) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", crius.pid())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// Creates a container of `img` and returns how long crius took and its answer.
async fn create(pod: &mut Pod, name: &str, img: &str) -> (Duration, Result<String, tonic::Status>) {
    let started = Instant::now();
    let outcome = pod.create(container(name, img, &["sleep", "1000"])).await;
    (started.elapsed(), outcome)
}

#[tokio::test]
async fn account_files_that_attack_the_reader_give_the_images_data_or_a_clear_error() {
    // A user only the host's file knows: an image linking to it must not get it.
    let host_file = std::path::Path::new("/etc/crius-test-host-passwd");
    std::fs::write(host_file, "hostonly:x:4321:4321::/:/bin/sh\n").unwrap();
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "hostile-accounts").await;
    for variant in ["hostlink", "devzero", "fifo", "huge"] {
        pod.pull(&format!("hostile-accounts:{variant}")).await;
    }

    let (took, hostlink) = create(&mut pod, "hostlink", "hostile-accounts:hostlink").await;
    let err = hostlink.expect_err("the host's accounts are not the image's");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("hostonly"), "{}", err.message());
    assert!(took < Duration::from_secs(10), "{took:?}");

    // /etc/group -> /dev/zero resolves inside the image, which has no /dev/zero.
    let (took, devzero) = create(&mut pod, "devzero", "hostile-accounts:devzero").await;
    devzero.expect("the image's own (missing) /dev/zero is no group file");
    assert!(took < Duration::from_secs(10), "{took:?}");
    // (Not started: runc reads the container's /etc/group itself, from inside, where its
    // /dev has a /dev/zero; that is the OCI runtime's exposure, not crius's.)

    for (variant, wanted) in [("fifo", "not a regular file"), ("huge", "more than")] {
        let (took, outcome) =
            create(&mut pod, variant, &format!("hostile-accounts:{variant}")).await;
        let err = outcome.expect_err(variant);
        assert_eq!(err.code(), Code::InvalidArgument, "{variant}: {err:?}");
        assert!(
            err.message().contains(wanted),
            "{variant}: {}",
            err.message()
        );
        assert!(took < Duration::from_secs(10), "{variant} took {took:?}");
    }

    // crius still answers, did not balloon, and the refused containers left nothing.
    common::assert_answers_within_a_second(&mut pod.client, "after the attack").await;
    assert!(rss_kib(&crius) < 256 * 1024, "{} KiB", rss_kib(&crius));
    let dirs = std::fs::read_dir(crius.config.root.join("containers"))
        .unwrap()
        .count();
    assert_eq!(dirs, 1, "only the devzero container exists");
    let staging = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains("rootfs-view"))
        .count();
    assert_eq!(staging, 0, "no read-only rootfs view stays mounted");
    pod.remove_pod().await;
    let _ = std::fs::remove_file(host_file);
}

#[tokio::test]
async fn a_log_path_cannot_leave_the_log_directory_or_follow_a_symlink() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "hostile-logs").await;
    let outside = crius.dir.path().join("outside.log");
    for bad in [
        outside.display().to_string(),
        "../../outside.log".to_string(),
    ] {
        let mut config = container("escape", "busybox:latest", &["echo", "hi"]);
        config.log_path = bad.clone();
        let err = pod.create(config).await.expect_err(&bad);
        assert_eq!(err.code(), Code::InvalidArgument, "{bad}: {err:?}");
    }
    assert!(!outside.exists());

    // A symlink planted where the log goes is not followed.
    let log_dir = std::path::Path::new(&pod.config.log_directory);
    std::fs::create_dir_all(log_dir).unwrap();
    std::os::unix::fs::symlink(&outside, log_dir.join("planted.log")).unwrap();
    let mut config = container("planted", "busybox:latest", &["echo", "hi"]);
    config.log_path = "planted.log".to_string();
    let id = pod.create(config).await.expect("create");
    let err = pod.start(&id).await.expect_err("the log is a symlink");
    assert!(
        !outside.exists(),
        "nothing was written through the link: {err:?}"
    );

    // A normal log is created 0640.
    let ok = pod
        .run(container("normal", "busybox:latest", &["echo", "hi"]))
        .await;
    pod.wait_exited(&ok).await;
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(pod.log_path("normal"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o640);
    pod.remove_pod().await;
}

fn failpoints(spec: &str) -> [(&'static str, &str); 1] {
    [("CRIUS_FAILPOINTS", spec)]
}

#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs --features failpoints (make test has it)"
)]
async fn a_retried_create_container_gets_the_first_ones_container() {
    let crius = Crius::start_with(|_| {}, &failpoints("container_after_record=sleep(2000)")).await;
    let pod = pod(&crius, "retried-create").await;
    let config = container("patient", "busybox:latest", &["sleep", "1000"]);
    let request = |config: crius::api::v1::ContainerConfig, timeout: Duration| {
        let mut request = tonic::Request::new(crius::api::v1::CreateContainerRequest {
            pod_sandbox_id: pod.id.clone(),
            config: Some(config),
            sandbox_config: Some(pod.config.clone()),
        });
        request.set_timeout(timeout);
        request
    };
    let mut client = pod.client.clone();
    let err = client
        .runtime
        .create_container(request(config.clone(), Duration::from_millis(300)))
        .await
        .expect_err("kubelet gives up first");
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{err:?}"
    );
    // The retry, while the first is still running, joins it.
    let retried = client
        .runtime
        .create_container(request(config.clone(), Duration::from_secs(30)))
        .await
        .expect("the retry gets the first call's container")
        .into_inner()
        .container_id;
    // And once it is done, a retry gets the same container at once.
    let again = client
        .runtime
        .create_container(request(config.clone(), Duration::from_secs(30)))
        .await
        .expect("a late retry")
        .into_inner()
        .container_id;
    assert_eq!(retried, again);
    let listed = client
        .runtime
        .list_containers(crius::api::v1::ListContainersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, retried);
    // A different config under the same name is still refused.
    let mut other = config.clone();
    other.command = vec!["sleep".into(), "5".into()];
    let err = client
        .runtime
        .create_container(request(other, Duration::from_secs(30)))
        .await
        .expect_err("a different request");
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    pod.remove_pod().await;
}

#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs --features failpoints (make test has it)"
)]
async fn a_retried_run_pod_sandbox_gets_the_first_ones_pod_also_after_a_restart() {
    let mut crius =
        Crius::start_with(|_| {}, &failpoints("sandbox_after_container=sleep(2000)")).await;
    let mut client = crius.client().await;
    let mut config = common::pod_config("retried-pod");
    config.hostname = String::new();
    config.linux = Some(crius::api::v1::LinuxPodSandboxConfig {
        security_context: Some(crius::api::v1::LinuxSandboxSecurityContext {
            namespace_options: Some(crius::api::v1::NamespaceOption {
                network: crius::api::v1::NamespaceMode::Node as i32,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let request = |config: crius::api::v1::PodSandboxConfig, timeout: Duration| {
        let mut request = tonic::Request::new(crius::api::v1::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        });
        request.set_timeout(timeout);
        request
    };
    let err = client
        .runtime
        .run_pod_sandbox(request(config.clone(), Duration::from_millis(300)))
        .await
        .expect_err("kubelet gives up first");
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{err:?}"
    );
    let first = client
        .runtime
        .run_pod_sandbox(request(config.clone(), Duration::from_secs(60)))
        .await
        .expect("the retry joins the first call")
        .into_inner()
        .pod_sandbox_id;

    // After a crius restart the retry still finds it, by the stored config.
    crius.restart().await;
    let mut client = crius.client().await;
    let again = client
        .runtime
        .run_pod_sandbox(request(config.clone(), Duration::from_secs(60)))
        .await
        .expect("a retry after a restart")
        .into_inner()
        .pod_sandbox_id;
    assert_eq!(first, again);
    let pods = client
        .runtime
        .list_pod_sandbox(crius::api::v1::ListPodSandboxRequest::default())
        .await
        .unwrap()
        .into_inner()
        .items;
    assert_eq!(pods.len(), 1);

    let mut other = config.clone();
    other.labels.insert("changed".into(), "yes".into());
    let err = client
        .runtime
        .run_pod_sandbox(request(other, Duration::from_secs(60)))
        .await
        .expect_err("a different request");
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    client
        .runtime
        .remove_pod_sandbox(crius::api::v1::RemovePodSandboxRequest {
            pod_sandbox_id: first,
        })
        .await
        .expect("remove");
}

fn privileged_pod_config(name: &str) -> crius::api::v1::PodSandboxConfig {
    let mut config = common::pod_config(name);
    config.hostname = String::new();
    config.linux = Some(crius::api::v1::LinuxPodSandboxConfig {
        security_context: Some(crius::api::v1::LinuxSandboxSecurityContext {
            privileged: true,
            namespace_options: Some(crius::api::v1::NamespaceOption {
                network: crius::api::v1::NamespaceMode::Node as i32,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    config
}

#[tokio::test]
async fn privileged_without_host_devices_keeps_the_hosts_devices_out() {
    let crius = Crius::start_with(
        |c| {
            if let Some(runc) = c.containerd.runtimes.get_mut("runc") {
                runc.privileged_without_host_devices = true;
            }
        },
        &[],
    )
    .await;
    let mut pod = common::pod::pod_with(&crius, privileged_pod_config("no-host-devices")).await;
    let mut config = container("privileged", "busybox:latest", &["sleep", "1000"]);
    config.linux = Some(crius::api::v1::LinuxContainerConfig {
        security_context: Some(crius::api::v1::LinuxContainerSecurityContext {
            privileged: true,
            ..Default::default()
        }),
        ..Default::default()
    });
    config.devices = vec![crius::api::v1::Device {
        container_path: "/dev/asked-for".into(),
        host_path: "/dev/null".into(),
        permissions: "rw".into(),
    }];
    let id = pod.run(config).await;
    let (out, _, _) = pod
        .exec(&id, &["sh", "-c", "ls /dev"], 10)
        .await
        .expect("exec");
    let devices: Vec<&str> = out.split_whitespace().collect();
    assert!(devices.contains(&"asked-for"), "{devices:?}");
    for host_only in ["mem", "kmsg", "loop0", "sda", "vda", "nvme0"] {
        if std::path::Path::new("/dev").join(host_only).exists() {
            assert!(!devices.contains(&host_only), "{host_only} in {devices:?}");
        }
    }
    pod.remove_pod().await;
}

#[tokio::test]
async fn out_of_range_resources_are_invalid_before_they_reach_the_runtime() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "bad-resources").await;
    let id = pod
        .run(container("app", "busybox:latest", &["sleep", "1000"]))
        .await;
    let bad = [
        crius::api::v1::LinuxContainerResources {
            cpuset_cpus: "1,,2".into(),
            ..Default::default()
        },
        crius::api::v1::LinuxContainerResources {
            oom_score_adj: 5000,
            ..Default::default()
        },
        crius::api::v1::LinuxContainerResources {
            cpu_quota: 5,
            ..Default::default()
        },
    ];
    for resources in bad {
        let err = pod
            .client
            .runtime
            .update_container_resources(crius::api::v1::UpdateContainerResourcesRequest {
                container_id: id.clone(),
                linux: Some(resources.clone()),
                ..Default::default()
            })
            .await
            .expect_err("refused");
        assert_eq!(err.code(), Code::InvalidArgument, "{resources:?}: {err:?}");
        let err = pod
            .client
            .runtime
            .update_pod_sandbox_resources(crius::api::v1::UpdatePodSandboxResourcesRequest {
                pod_sandbox_id: pod.id.clone(),
                resources: Some(resources.clone()),
                ..Default::default()
            })
            .await
            .expect_err("refused for the pod too");
        assert_eq!(err.code(), Code::InvalidArgument, "{resources:?}: {err:?}");
        let mut config = container("bad", "busybox:latest", &["sleep", "1000"]);
        config.linux = Some(crius::api::v1::LinuxContainerConfig {
            resources: Some(resources.clone()),
            ..Default::default()
        });
        let err = pod.create(config).await.expect_err("refused at creation");
        assert_eq!(err.code(), Code::InvalidArgument, "{resources:?}: {err:?}");
    }
    // An ExecSync timeout beyond any clock is simply no deadline.
    let (out, _, code) = pod
        .exec(&id, &["echo", "still here"], i64::MAX)
        .await
        .expect("exec with a huge timeout");
    assert_eq!((out.as_str(), code), ("still here\n", 0));
    pod.remove_pod().await;
}

#[tokio::test]
async fn start_up_leaves_containers_it_did_not_make_alone() {
    let mut crius = Crius::start().await;
    let pod = pod(&crius, "foreign").await;
    // Records as containerd's own CRI makes them, in the same namespace.
    let busybox = image("busybox:latest");
    for (id, kind) in [
        ("foreign-sandbox", "sandbox"),
        ("foreign-container", "container"),
    ] {
        crius.ctr(&[
            "containers",
            "create",
            "--label",
            &format!("io.cri-containerd.kind={kind}"),
            &busybox,
            id,
        ]);
    }
    crius.restart().await;
    let listed = crius.ctr(&["containers", "ls", "-q"]);
    assert!(
        listed.contains("foreign-sandbox") && listed.contains("foreign-container"),
        "start-up deleted what it did not make: {listed}"
    );
    let mut client = crius.client().await;
    let pods = client
        .runtime
        .list_pod_sandbox(crius::api::v1::ListPodSandboxRequest::default())
        .await
        .unwrap()
        .into_inner()
        .items;
    assert_eq!(pods.len(), 1, "only crius's own pod");
    assert_eq!(pods[0].id, pod.id);
    let containers = client
        .runtime
        .list_containers(crius::api::v1::ListContainersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert!(containers.is_empty(), "{containers:?}");
    crius.ctr(&["containers", "rm", "foreign-sandbox", "foreign-container"]);
}

/// A registry that attacks whoever pulls from it: endless chunked manifests and blobs, and
/// a mirror that asks for credentials and writes down any it gets.
struct EvilRegistry {
    addr: String,
    authorizations: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

const LAYER_DIGEST: &str =
    "sha256:1111111111111111111111111111111111111111111111111111111111111111";
const CONFIG_DIGEST_ENDLESS: &str =
    "sha256:2222222222222222222222222222222222222222222222222222222222222222";
/// Sent a byte at a time.
const LAYER_DIGEST_TRICKLE: &str =
    "sha256:3333333333333333333333333333333333333333333333333333333333333333";
/// Sent in useful amounts, but slower than any pull may take.
const LAYER_DIGEST_CRAWL: &str =
    "sha256:4444444444444444444444444444444444444444444444444444444444444444";
const CRAWL_LAYER_SIZE: usize = 512 * 1024;
/// Sent whole and at once, but its bytes are not its digest.
const LAYER_DIGEST_LIE: &str =
    "sha256:5555555555555555555555555555555555555555555555555555555555555555";
/// A big layer (written in place into containerd's ingest) that never ends.
const LAYER_DIGEST_ENDLESS_BIG: &str =
    "sha256:6666666666666666666666666666666666666666666666666666666666666666";

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{:x}", sha2::Sha256::digest(data))
}

fn config_json() -> String {
    format!(
        r#"{{"architecture":"amd64","os":"linux","config":{{}},"rootfs":{{"type":"layers","diff_ids":["{LAYER_DIGEST}"]}}}}"#
    )
}

fn manifest(config_digest: &str, config_size: usize, layer_size: usize) -> String {
    manifest_with_layer(config_digest, config_size, LAYER_DIGEST, layer_size)
}

fn manifest_with_layer(
    config_digest: &str,
    config_size: usize,
    layer_digest: &str,
    layer_size: usize,
) -> String {
    format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",
        "config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config_digest}","size":{config_size}}},
        "layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"{layer_digest}","size":{layer_size}}}]}}"#
    )
}

impl EvilRegistry {
    async fn start() -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let authorizations = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = authorizations.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") && head.len() < 64 * 1024 {
                        if conn.read(&mut byte).await.unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    let head = String::from_utf8_lossy(&head).into_owned();
                    let path = head.split(' ').nth(1).unwrap_or("").to_string();
                    for line in head.lines() {
                        if line.to_ascii_lowercase().starts_with("authorization:") {
                            seen.lock().unwrap().push(line.to_string());
                        }
                    }
                    let config = config_json();
                    let fixed = |content_type: &str, body: &str| {
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                    };
                    let manifest_type = "application/vnd.oci.image.manifest.v1+json";
                    let endless = path.ends_with("/manifests/endless")
                        || path.contains(CONFIG_DIGEST_ENDLESS)
                        || path.contains(LAYER_DIGEST)
                        || path.contains(LAYER_DIGEST_ENDLESS_BIG);
                    let config_digest = sha256_hex(config.as_bytes());
                    if path.ends_with("/manifests/trickle") || path.contains(LAYER_DIGEST_TRICKLE) {
                        let start = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: {manifest_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                            CRAWL_LAYER_SIZE
                        );
                        if conn.write_all(start.as_bytes()).await.is_err() {
                            return;
                        }
                        // A byte every 50 ms: always something, never enough.
                        while conn.write_all(b"{").await.is_ok() {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        return;
                    }
                    if path.contains(LAYER_DIGEST_CRAWL) {
                        let start = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {CRAWL_LAYER_SIZE}\r\nConnection: close\r\n\r\n"
                        );
                        if conn.write_all(start.as_bytes()).await.is_err() {
                            return;
                        }
                        // 32 KiB a second: useful progress, at half the slowest rate allowed.
                        let chunk = vec![0u8; 32 * 1024];
                        while conn.write_all(&chunk).await.is_ok() {
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                        return;
                    }
                    if path.contains(LAYER_DIGEST_LIE) {
                        let body = "0".repeat(CRAWL_LAYER_SIZE);
                        let _ = conn
                            .write_all(fixed("application/octet-stream", &body).as_bytes())
                            .await;
                        return;
                    }
                    for (tag, layer) in [
                        ("trickle-layer", LAYER_DIGEST_TRICKLE),
                        ("crawl-layer", LAYER_DIGEST_CRAWL),
                        ("lying-layer", LAYER_DIGEST_LIE),
                        ("endless-big-layer", LAYER_DIGEST_ENDLESS_BIG),
                    ] {
                        if path.ends_with(&format!("/manifests/{tag}")) {
                            let body = manifest_with_layer(
                                &config_digest,
                                config.len(),
                                layer,
                                CRAWL_LAYER_SIZE,
                            );
                            let _ = conn.write_all(fixed(manifest_type, &body).as_bytes()).await;
                            return;
                        }
                    }
                    if path.ends_with("/manifests/layered") {
                        // More layers than any overlay mount can stack; none of them exists.
                        let layer = format!(
                            r#"{{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"{LAYER_DIGEST}","size":10}}"#
                        );
                        let layers = vec![layer; 600].join(",");
                        let body = format!(
                            r#"{{"schemaVersion":2,"mediaType":"{manifest_type}","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config_digest}","size":{}}},"layers":[{layers}]}}"#,
                            config.len()
                        );
                        let _ = conn.write_all(fixed(manifest_type, &body).as_bytes()).await;
                        return;
                    }
                    if path.starts_with("/v2/mirrored/") {
                        let reply = "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"evil\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
                        let _ = conn.write_all(reply.as_bytes()).await;
                    } else if endless {
                        let start = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: {manifest_type}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                        );
                        if conn.write_all(start.as_bytes()).await.is_err() {
                            return;
                        }
                        let chunk = vec![b'{'; 64 * 1024];
                        let frame = [
                            format!("{:x}\r\n", chunk.len()).into_bytes(),
                            chunk,
                            b"\r\n".to_vec(),
                        ]
                        .concat();
                        // Until the client hangs up.
                        while conn.write_all(&frame).await.is_ok() {}
                    } else if path.ends_with("/manifests/endless-config") {
                        let body = manifest(CONFIG_DIGEST_ENDLESS, 100, 10);
                        let _ = conn.write_all(fixed(manifest_type, &body).as_bytes()).await;
                    } else if path.ends_with("/manifests/endless-layer") {
                        let body = manifest(&sha256_hex(config.as_bytes()), config.len(), 1024);
                        let _ = conn.write_all(fixed(manifest_type, &body).as_bytes()).await;
                    } else if path.contains(&config_digest) {
                        let _ = conn
                            .write_all(fixed("application/octet-stream", &config).as_bytes())
                            .await;
                    } else {
                        let _ = conn
                            .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                            .await;
                    }
                });
            }
        });
        Self {
            addr,
            authorizations,
        }
    }
}

#[tokio::test]
async fn a_registry_that_never_stops_sending_is_cut_off_and_gets_no_foreign_credentials() {
    let evil = EvilRegistry::start().await;
    let hosts = tempfile::tempdir().unwrap();
    // `mirrored.test` is served by the evil registry as its mirror.
    let dir = hosts.path().join("mirrored.test");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("hosts.toml"),
        format!(
            "server = \"http://mirrored.test\"\n[host.\"http://{}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
            evil.addr
        ),
    )
    .unwrap();
    let config_path = hosts.path().display().to_string();
    let crius = Crius::start_with(|c| c.registry.config_path = config_path, &[]).await;
    let mut client = crius.client().await;
    let pull = |image: String, auth: Option<crius::api::v1::AuthConfig>| {
        let mut client = client.clone();
        async move {
            let started = Instant::now();
            let mut request = tonic::Request::new(PullImageRequest {
                image: Some(ImageSpec {
                    image,
                    ..Default::default()
                }),
                auth,
                ..Default::default()
            });
            request.set_timeout(Duration::from_secs(60));
            let outcome = client.image.pull_image(request).await;
            (started.elapsed(), outcome)
        }
    };
    for (tag, why) in [
        ("endless", "manifest larger than"),
        (
            "endless-config",
            "longer than the 100 bytes its descriptor says",
        ),
        ("endless-layer", "longer than its descriptor"),
        ("endless-big-layer", "longer than its descriptor"),
    ] {
        let (took, outcome) = pull(format!("{}/evil:{tag}", evil.addr), None).await;
        let err = outcome.expect_err(tag);
        assert!(err.message().contains(why), "{tag}: {err:?}");
        assert!(
            took < Duration::from_secs(20),
            "{tag} took {took:?}: {err:?}"
        );
        assert!(
            !matches!(err.code(), Code::DeadlineExceeded),
            "{tag} was not cut off: {err:?}"
        );
        assert!(
            rss_kib(&crius) < 256 * 1024,
            "{tag}: {} KiB",
            rss_kib(&crius)
        );
    }
    let leases = crius.ctr(&["leases", "ls", "-q"]);
    assert!(
        !leases.contains("crius-"),
        "a failed pull left its lease: {leases}"
    );

    // Credentials for mirrored.test are not the mirror's to see.
    let auth = crius::api::v1::AuthConfig {
        username: "alice".into(),
        password: "secret".into(),
        ..Default::default()
    };
    let (_, outcome) = pull("mirrored.test/mirrored/app:v1".into(), Some(auth)).await;
    assert!(outcome.is_err());
    assert!(
        evil.authorizations.lock().unwrap().is_empty(),
        "the mirror got credentials: {:?}",
        evil.authorizations.lock().unwrap()
    );

    // crius still answers at once.
    common::assert_answers_within_a_second(&mut client, "after the attack").await;
}

#[tokio::test]
async fn a_registry_that_trickles_or_crawls_is_cut_off() {
    let evil = EvilRegistry::start().await;
    let progress_timeout = Duration::from_secs(2);
    let crius = Crius::start_with(
        |c| {
            c.image.pull_progress_timeout = progress_timeout;
            c.image.pull_min_rate = 64 * 1024;
        },
        &[],
    )
    .await;
    let mut client = crius.client().await;
    // 2 s for the stall; the crawl's overall limit is 2 s + 512 KiB at 64 KiB/s = 10 s,
    // where finishing at its rate would take 16 s.
    for (tag, why, at_most) in [
        ("trickle", "no progress for 2s", Duration::from_secs(8)),
        (
            "trickle-layer",
            "no progress for 2s",
            Duration::from_secs(8),
        ),
        (
            "crawl-layer",
            "not done within 10s",
            Duration::from_secs(14),
        ),
    ] {
        let started = Instant::now();
        let mut request = tonic::Request::new(PullImageRequest {
            image: Some(ImageSpec {
                image: format!("{}/evil:{tag}", evil.addr),
                ..Default::default()
            }),
            ..Default::default()
        });
        request.set_timeout(Duration::from_secs(60));
        let err = client.image.pull_image(request).await.expect_err(tag);
        let took = started.elapsed();
        assert_eq!(err.code(), Code::DeadlineExceeded, "{tag}: {err:?}");
        assert!(err.message().contains(why), "{tag}: {err:?}");
        assert!(took < at_most, "{tag} took {took:?}");
    }
    let leases = crius.ctr(&["leases", "ls", "-q"]);
    assert!(
        !leases.contains("crius-"),
        "a cut-off pull left its lease: {leases}"
    );
    let ingests = crius.ctr(&["content", "active"]);
    assert!(
        !ingests.contains("crius-layer"),
        "a cut-off pull left its download: {ingests}"
    );
}

#[tokio::test]
async fn a_layer_whose_bytes_are_not_its_digest_is_refused_and_leaves_nothing() {
    let evil = EvilRegistry::start().await;
    let crius = Crius::start().await;
    let mut client = crius.client().await;
    let err = pull_refused(&mut client, &evil, "lying-layer").await;
    assert_eq!(err.code(), Code::DataLoss, "{err:?}");
    assert!(err.message().contains(LAYER_DIGEST_LIE), "{err:?}");
    // Its bytes went into an unnamed file on containerd's store's filesystem.
    assert!(
        crius
            .log()
            .contains("downloading the blob into an unnamed file"),
        "{}",
        crius.log()
    );
    let ingests = crius.ctr(&["content", "active"]);
    assert!(
        !ingests.contains("crius-layer"),
        "the lying layer's ingest was left: {ingests}"
    );
    let content = crius.ctr(&["content", "ls", "-q"]);
    assert!(!content.contains(LAYER_DIGEST_LIE), "{content}");
    // Nor did its bytes get the blob's name in containerd's store, recorded or not.
    let hex = LAYER_DIGEST_LIE.trim_start_matches("sha256:");
    let named = (crius.config.containerd.root)
        .join("io.containerd.content.v1.content/blobs/sha256")
        .join(hex);
    assert!(!named.exists(), "{} exists", named.display());
    let leases = crius.ctr(&["leases", "ls", "-q"]);
    assert!(!leases.contains("crius-"), "{leases}");
}

#[tokio::test]
async fn an_image_of_more_layers_than_overlayfs_stacks_is_refused_before_any_download() {
    let evil = EvilRegistry::start().await;
    let crius = Crius::start().await;
    let mut client = crius.client().await;
    let err = pull_refused(&mut client, &evil, "layered").await;
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("600 layers"), "{err:?}");
    let ingests = crius.ctr(&["content", "active"]);
    assert!(
        !ingests.contains("crius-layer"),
        "a layer was fetched: {ingests}"
    );
}

/// Pulls `evil:<tag>` from the evil registry, which must refuse it.
async fn pull_refused(
    client: &mut crius_testkit::CriClient,
    evil: &EvilRegistry,
    tag: &str,
) -> tonic::Status {
    client
        .image
        .pull_image(PullImageRequest {
            image: Some(ImageSpec {
                image: format!("{}/evil:{tag}", evil.addr),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect_err(tag)
}

fn open_fds(crius: &Crius) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", crius.pid()))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_flood_of_idle_stream_connections_cannot_starve_crius() {
    // crius starts with this test's own limits, then raises its soft one itself.
    let crius = Crius::start().await;
    // This test holds well over a thousand sockets itself.
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", crius.pid())).unwrap();
    let open_files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .split_whitespace()
        .skip(3)
        .take(2)
        .collect::<Vec<_>>();
    assert_eq!(
        open_files[0], open_files[1],
        "crius raised its soft limit: {open_files:?}"
    );

    let mut pod = pod(&crius, "stream-flood").await;
    let id = pod
        .run(container("sleeper", "busybox:latest", &["sleep", "1000"]))
        .await;
    let url = pod
        .client
        .runtime
        .exec(crius::api::v1::ExecRequest {
            container_id: id.clone(),
            cmd: vec!["true".into()],
            stdout: true,
            ..Default::default()
        })
        .await
        .expect("Exec")
        .into_inner()
        .url;
    let addr = url
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap()
        .to_string();
    let before = open_fds(&crius);
    let mut idle = Vec::new();
    for _ in 0..1200 {
        match tokio::net::TcpStream::connect(&addr).await {
            Ok(conn) => idle.push(conn),
            Err(_) => break,
        }
    }
    assert!(idle.len() > 1024, "opened {}", idle.len());
    // Give the accept loop time to see them all.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let during = open_fds(&crius);
    assert!(
        during < before + 1100,
        "crius holds {during} descriptors (from {before})"
    );
    // The CRI socket still answers at once, and so do FIFOs for a new container.
    common::assert_answers_within_a_second(&mut pod.client, "during the flood").await;
    let another = pod
        .run(container("another", "busybox:latest", &["sleep", "1000"]))
        .await;
    let (out, _, _) = pod.exec(&another, &["echo", "ok"], 10).await.expect("exec");
    assert_eq!(out, "ok\n");
    drop(idle);
    pod.remove_pod().await;
}

/// An exec of `sleep 1000` (which never reads its stdin) with stdin and stdout, as a URL.
async fn quiet_exec_url(pod: &mut Pod, id: &str) -> String {
    pod.client
        .runtime
        .exec(crius::api::v1::ExecRequest {
            container_id: id.to_string(),
            cmd: vec!["sleep".into(), "1000".into()],
            stdin: true,
            stdout: true,
            ..Default::default()
        })
        .await
        .expect("Exec")
        .into_inner()
        .url
}

/// The processes in a container's task (its own and its execs').
fn task_processes(crius: &Crius, id: &str) -> usize {
    crius
        .ctr(&["tasks", "ps", id])
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .count()
}

#[tokio::test]
async fn floods_on_exec_streams_are_held_to_bytes_and_leave_nothing_behind() {
    use common::streams::{SpdyClient, WsMessage, websocket};
    use futures::SinkExt;
    const CHUNK: usize = 512 * 1024;
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "stream-bytes").await;
    let id = pod
        .run(container("quiet", "busybox:latest", &["sleep", "1000"]))
        .await;
    let spdy_url = quiet_exec_url(&mut pod, &id).await;
    let ws_url = quiet_exec_url(&mut pod, &id).await;
    let rss_before = rss_kib(&crius);
    let fds_before = open_fds(&crius);

    // SPDY: 64 MiB on the stdin of a process that never reads it, 64 MiB on the error
    // stream crius never reads, and more streams than an exec may have.
    let mut spdy = SpdyClient::connect(&spdy_url, &["v4.channel.k8s.io"])
        .await
        .expect("upgrade to SPDY");
    let error = spdy.open(&[("streamType", "error")]).await;
    let stdin = spdy.open(&[("streamType", "stdin")]).await;
    spdy.open(&[("streamType", "stdout")]).await;
    let spdy_flood = tokio::spawn(async move {
        for _ in 0..16 {
            spdy.open(&[("streamType", "stdout")]).await;
        }
        let chunk = vec![b'x'; CHUNK];
        for _ in 0..128 {
            spdy.send(error, &chunk, false).await;
            spdy.send(stdin, &chunk, false).await;
        }
    });
    // WebSocket: the same 64 MiB on stdin, in messages of half a MiB.
    let (mut socket, _) = websocket(&ws_url, &["v5.channel.k8s.io"]).await;
    let ws_flood = tokio::spawn(async move {
        let mut message = vec![b'x'; CHUNK + 1];
        message[0] = 0; // stdin
        for _ in 0..128 {
            if socket
                .send(WsMessage::Binary(message.clone().into()))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!spdy_flood.is_finished(), "crius took all the SPDY input");
    assert!(
        !ws_flood.is_finished(),
        "crius took all the WebSocket input"
    );
    let grown = rss_kib(&crius).saturating_sub(rss_before);
    assert!(
        grown < 12 * 1024,
        "crius grew by {grown} KiB under the floods"
    );
    common::assert_answers_within_a_second(&mut pod.client, "during the floods").await;

    // Clients that vanish mid-flood: their sessions, exec processes and descriptors go.
    spdy_flood.abort();
    ws_flood.abort();
    let _ = spdy_flood.await;
    let _ = ws_flood.await;
    assert!(
        common::eventually(Duration::from_secs(30), || async {
            task_processes(&crius, &id) == 1 && open_fds(&crius) <= fds_before + 2
        })
        .await,
        "left behind: {} processes in the task, {} descriptors (from {fds_before})",
        task_processes(&crius, &id),
        open_fds(&crius)
    );

    // A WebSocket message larger than 1 MiB closes the session.
    let url = quiet_exec_url(&mut pod, &id).await;
    let (mut socket, _) = websocket(&url, &["v5.channel.k8s.io"]).await;
    let mut huge = vec![b'x'; 1024 * 1024 + 1];
    huge[0] = 0;
    let _ = socket.send(WsMessage::Binary(huge.into())).await;
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        use futures::StreamExt;
        while let Some(Ok(message)) = socket.next().await {
            if matches!(message, WsMessage::Close(_)) {
                break;
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "a message over 1 MiB did not end the session"
    );
    assert!(
        common::eventually(Duration::from_secs(30), || async {
            task_processes(&crius, &id) == 1
        })
        .await,
        "the exec of the closed session still runs"
    );
    pod.remove_pod().await;
}

/// The address (`host:port`) of a stream URL.
fn stream_addr(url: &str) -> String {
    url.split("://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_default()
        .to_string()
}

/// An exec of `cmd` in `id` with stdout, as a stream URL.
async fn exec_url(pod: &mut Pod, id: &str, cmd: &[&str]) -> String {
    pod.client
        .runtime
        .exec(crius::api::v1::ExecRequest {
            container_id: id.to_string(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            stdout: true,
            ..Default::default()
        })
        .await
        .expect("Exec")
        .into_inner()
        .url
}

/// Whether crius closed `conn` within `wait` (end of file or a reset on read).
async fn closed_by_crius(conn: &mut tokio::net::TcpStream, wait: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(wait, conn.read(&mut byte)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

/// 5000 connections that send nothing or a request a byte at a time cannot lock kubelet
/// out: crius closes the oldest of those without a request to make room, and each after
/// `stream.request_timeout`; an exec through the stream server still succeeds within a
/// second, and a session open before the flood runs to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_idle_and_slow_stream_connections_never_locks_out_exec() {
    let crius = Crius::start_with(|c| c.stream.request_timeout = Duration::from_secs(2), &[]).await;
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    let mut pod = pod(&crius, "stream-lockout").await;
    let id = pod
        .run(container("sleeper", "busybox:latest", &["sleep", "1000"]))
        .await;

    // A session open before the flood is never closed to make room.
    let live_url = exec_url(&mut pod, &id, &["sh", "-c", "sleep 6; echo survived"]).await;
    let addr = stream_addr(&live_url);
    let live = tokio::spawn(async move {
        common::streams::spdy_session(&live_url, common::streams::SessionInput::default()).await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut idle = Vec::new();
    for _ in 0..4000 {
        match tokio::net::TcpStream::connect(&addr).await {
            Ok(conn) => idle.push(conn),
            Err(e) => panic!("connection {} of the flood: {e}", idle.len()),
        }
    }
    // A request line a byte every 100 ms, for ever.
    let slow: Vec<_> = (0..1000)
        .map(|_| {
            let addr = addr.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                let Ok(mut conn) = tokio::net::TcpStream::connect(&addr).await else {
                    return;
                };
                for byte in b"GET /exec/abcdefgh HTTP/1.1\r\nHost: x\r\n".iter().cycle() {
                    if conn.write_all(&[*byte]).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;

    for attempt in 0..3 {
        let url = exec_url(&mut pod, &id, &["echo", "through"]).await;
        let started = Instant::now();
        let output = tokio::time::timeout(
            Duration::from_secs(1),
            common::streams::spdy_session(&url, common::streams::SessionInput::default()),
        )
        .await
        .unwrap_or_else(|_| panic!("exec {attempt} during the flood took over a second"));
        assert_eq!(output.stdout, "through\n", "exec {attempt}");
        eprintln!("exec {attempt} during the flood: {:?}", started.elapsed());
    }

    // The oldest idle connections were closed to make room; every one without a request
    // is closed once its time is up.
    assert!(
        closed_by_crius(&mut idle[0], Duration::from_millis(100)).await,
        "the oldest idle connection is still open"
    );
    let newest = idle.len() - 1;
    assert!(
        closed_by_crius(&mut idle[newest], Duration::from_secs(4)).await,
        "an idle connection outlived stream.request_timeout"
    );

    let survived = live.await.expect("live session");
    assert_eq!(
        survived.stdout, "survived\n",
        "the session open before the flood"
    );
    for task in slow {
        task.abort();
    }
    drop(idle);
    pod.remove_pod().await;
}
