//! Pods in their own user namespace (`hostUsers: false`) against the real containerd and
//! runc (under crius's shim and containerd's Go shim): root inside is a mapped uid outside;
//! the rootfs, the pod's files, /dev/shm and the image's declared volumes are owned by the
//! pod's root; a host path the range does not own cannot be written, unless it comes with
//! the pod's mappings (then it is idmapped, as kubelet sends volumes); the CRI's mapping
//! rules are enforced with INVALID_ARGUMENT; host-network pods work; a restart of crius
//! keeps the pod; removal leaves no mount or pinned namespace behind.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::pod::{container, pod_on, pod_with};
use common::{Crius, TestNetwork, pod_config};
use crius::api::v1::{
    IdMapping, Mount, NamespaceMode, NamespaceOption, PodSandboxConfig, RunPodSandboxRequest,
    StatusRequest, UserNamespace,
};
use crius::config::UsernsRootfs;

/// The host IDs the test pods' root maps to: far above any real user.
const HOST_ROOT: u32 = 3_000_000;
const RANGE: u32 = 65536;

fn mapping(container_id: u32, host_id: u32, length: u32) -> IdMapping {
    IdMapping {
        container_id,
        host_id,
        length,
    }
}

fn userns_options(mode: NamespaceMode, uids: Vec<IdMapping>) -> NamespaceOption {
    NamespaceOption {
        userns_options: Some(UserNamespace {
            mode: mode as i32,
            gids: uids.clone(),
            uids,
        }),
        ..Default::default()
    }
}

fn userns_pod_config(name: &str, options: NamespaceOption) -> PodSandboxConfig {
    let mut config = pod_config(name);
    let linux = config.linux.get_or_insert_with(Default::default);
    linux
        .security_context
        .get_or_insert_with(Default::default)
        .namespace_options = Some(options);
    config
}

/// A pod on the host's network in its own user namespace.
fn host_network_userns_pod_config(name: &str) -> PodSandboxConfig {
    let mut config = common::pod::host_network_pod_config(name);
    config
        .linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
        .namespace_options
        .get_or_insert_with(Default::default)
        .userns_options = own_userns().userns_options;
    config
}

fn own_userns() -> NamespaceOption {
    userns_options(NamespaceMode::Pod, vec![mapping(0, HOST_ROOT, RANGE)])
}

/// The host uid of a process, from its /proc status.
fn host_uid(pid: u64) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next())
        .and_then(|uid| uid.parse().ok())
        .expect("Uid line")
}

/// Lines of the host's mount table under `dir`.
fn mounts_under(dir: &Path) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let dir = dir.display().to_string();
    table
        .lines()
        .filter(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(&dir)))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn status_says_the_default_handler_runs_user_namespaces() {
    let crius = Crius::start().await;
    let mut client = crius.client().await;
    let status = client
        .runtime
        .status(StatusRequest { verbose: false })
        .await
        .expect("status")
        .into_inner();
    let default = status
        .runtime_handlers
        .iter()
        .find(|h| h.name.is_empty())
        .expect("the default handler");
    assert!(
        default.features.as_ref().is_some_and(|f| f.user_namespaces),
        "{status:?}\n{}",
        crius.log()
    );
}

#[tokio::test]
async fn root_inside_is_a_mapped_uid_outside_and_owns_its_files() {
    root_inside_is_mapped_outside_on("", 150, UsernsRootfs::Idmap).await;
}

#[tokio::test]
async fn the_go_shim_handler_runs_user_namespace_pods_too() {
    root_inside_is_mapped_outside_on("containerd-runc", 152, UsernsRootfs::Idmap).await;
}

#[tokio::test]
async fn a_remapped_copy_of_the_image_serves_where_mounts_cannot_be_idmapped() {
    root_inside_is_mapped_outside_on("", 153, UsernsRootfs::Copy).await;
}

async fn root_inside_is_mapped_outside_on(handler: &str, tag: u8, rootfs: UsernsRootfs) {
    let mut network = None;
    let crius = Crius::start_with(
        |c| {
            network = Some(TestNetwork::install(c, tag));
            c.userns.rootfs = rootfs;
        },
        &[],
    )
    .await;
    let config = userns_pod_config(&format!("userns-{tag}"), own_userns());
    let mut pod = pod_on(&crius, config, handler).await;

    // A host directory the range does not own, and one it does.
    let host = tempfile::tempdir().expect("tempdir");
    let (foreign, owned) = (host.path().join("foreign"), host.path().join("owned"));
    for dir in [&foreign, &owned] {
        std::fs::create_dir(dir).expect("mkdir");
    }
    std::os::unix::fs::chown(&owned, Some(HOST_ROOT), Some(HOST_ROOT)).expect("chown");
    let mut config = container("c", "busybox:latest", &["sleep", "1000"]);
    config.mounts = [(&foreign, "/foreign"), (&owned, "/owned")]
        .into_iter()
        .map(|(host_path, container_path)| Mount {
            host_path: host_path.display().to_string(),
            container_path: container_path.to_string(),
            ..Default::default()
        })
        .collect();
    // As kubelet sends a volume of such a pod: with the pod's mappings, so idmapped.
    let pod_range = vec![mapping(0, HOST_ROOT, RANGE)];
    config.mounts.push(Mount {
        host_path: foreign.display().to_string(),
        container_path: "/volume".to_string(),
        uid_mappings: pod_range.clone(),
        gid_mappings: pod_range,
        ..Default::default()
    });
    let mut other_range = config.clone();
    other_range.metadata.as_mut().expect("metadata").name = "other".into();
    other_range.mounts[2].uid_mappings = vec![mapping(0, HOST_ROOT + RANGE, RANGE)];
    let err = pod.create(other_range).await.expect_err("foreign mappings");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    let id = pod.run(config).await;

    let script = "id -u; id -g; cat /proc/self/uid_map /proc/self/gid_map; \
                  stat -c %u:%g / /bin/busybox /etc/hosts /etc/hostname /etc/resolv.conf /dev/shm; \
                  touch /new /dev/shm/x && stat -c %u:%g /new /dev/shm/x; \
                  touch /owned/y && echo owned-ok; \
                  touch /foreign/y 2>/dev/null || echo foreign-refused; \
                  stat -c %u:%g /volume && touch /volume/z && echo volume-ok";
    let (out, err, code) = pod
        .exec(&id, &["sh", "-c", script], 10)
        .await
        .expect("exec");
    let lines: Vec<String> = out
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    let range = format!("0 {HOST_ROOT} {RANGE}");
    let expected = [
        "0",
        "0",
        &range,
        &range,
        "0:0",
        "0:0",
        "0:0",
        "0:0",
        "0:0",
        "0:0",
        "0:0",
        "0:0",
        "owned-ok",
        "foreign-refused",
        "0:0",
        "volume-ok",
    ];
    assert_eq!(lines, expected, "exit {code}, stderr: {err}");

    // Outside: the process runs as the mapped uid, and what it wrote is the range's.
    let (_, info) = pod.status(&id).await;
    let pid = info["pid"].as_u64().expect("pid");
    assert_eq!(host_uid(pid), HOST_ROOT);
    let written = std::fs::metadata(owned.join("y")).expect("written file");
    assert_eq!((written.uid(), written.gid()), (HOST_ROOT, HOST_ROOT));
    assert!(!foreign.join("y").exists());
    // Through the idmapped volume, the pod's root writes as the host's root.
    assert_eq!(std::fs::metadata(foreign.join("z")).expect("z").uid(), 0);

    // A restart of crius keeps the pod working.
    let mut crius = crius;
    crius.restart().await;
    let mut pod = common::pod::Pod {
        client: crius.client().await,
        ..pod
    };
    let (out, _, _) = pod.exec(&id, &["id", "-u"], 10).await.expect("exec");
    assert_eq!(out, "0\n");

    let state = crius.config.state.clone();
    let pin = state.join("sandboxes").join(&pod.id).join("userns");
    assert!(crius::sys::netns::is_pinned(&pin));
    let remapped = crius.ctr(&["snapshots", "ls"]).contains("crius-remap-");
    match rootfs {
        UsernsRootfs::Copy => assert!(remapped, "no remapped copy of the image"),
        _ => {
            assert!(!remapped);
            assert!(!mounts_under(&state.join("rootfs")).is_empty());
        }
    }
    pod.remove_pod().await;
    assert!(
        mounts_under(&state.join("rootfs")).is_empty(),
        "{:?}",
        mounts_under(&state.join("rootfs"))
    );
    assert!(!pin.exists());
}

#[tokio::test]
async fn the_host_user_namespace_keeps_the_hosts_mappings() {
    let mut network = None;
    let crius = Crius::start_with(|c| network = Some(TestNetwork::install(c, 151)), &[]).await;
    let config = userns_pod_config("userns-node", userns_options(NamespaceMode::Node, vec![]));
    let mut pod = pod_with(&crius, config).await;
    let id = pod
        .run(container("c", "busybox:latest", &["sleep", "1000"]))
        .await;
    let (out, _, _) = pod
        .exec(&id, &["cat", "/proc/self/uid_map"], 10)
        .await
        .expect("exec");
    let host = std::fs::read_to_string("/proc/self/uid_map").expect("uid_map");
    let words = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    assert_eq!(words(&out), words(&host));
    pod.remove_pod().await;
}

#[tokio::test]
async fn mappings_the_cri_forbids_are_invalid_arguments_and_leave_nothing() {
    let crius = Crius::start().await;
    let mut client = crius.client().await;
    let two = vec![
        mapping(0, HOST_ROOT, RANGE),
        mapping(0, HOST_ROOT * 2, RANGE),
    ];
    let cases = [
        ("two", userns_options(NamespaceMode::Pod, two)),
        (
            "from-one",
            userns_options(NamespaceMode::Pod, vec![mapping(1, HOST_ROOT, RANGE)]),
        ),
        ("none", userns_options(NamespaceMode::Pod, vec![])),
        (
            "container",
            userns_options(NamespaceMode::Container, vec![]),
        ),
        ("target", userns_options(NamespaceMode::Target, vec![])),
    ];
    for (name, options) in cases {
        let err = client
            .runtime
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(userns_pod_config(name, options)),
                runtime_handler: String::new(),
            })
            .await
            .expect_err(name);
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{name}: {err:?}");
    }
    let pods = client
        .runtime
        .list_pod_sandbox(crius::api::v1::ListPodSandboxRequest::default())
        .await
        .expect("list")
        .into_inner()
        .items;
    assert!(pods.is_empty(), "{pods:?}");
}

#[tokio::test]
async fn a_host_network_pod_can_have_its_own_user_namespace() {
    let crius = Crius::start().await;
    let config = host_network_userns_pod_config("userns-hostnet");
    let mut pod = pod_with(&crius, config).await;
    let id = pod
        .run(container("c", "busybox:latest", &["sleep", "1000"]))
        .await;
    let (out, err, _) = pod
        .exec(
            &id,
            &["sh", "-c", "id -u; ls /sys/class/net | grep -c ^lo$"],
            10,
        )
        .await
        .expect("exec");
    assert_eq!(out, "0\n1\n", "{err}");
    let (_, info) = pod.status(&id).await;
    assert_eq!(host_uid(info["pid"].as_u64().expect("pid")), HOST_ROOT);
    pod.remove_pod().await;
}

#[tokio::test]
async fn volumes_the_image_declares_are_owned_by_the_pods_range() {
    let crius = Crius::start().await;
    let config = host_network_userns_pod_config("userns-volumes");
    let mut pod = pod_with(&crius, config).await;
    pod.pull("declared-volumes:latest").await;
    let id = pod
        .run(container(
            "c",
            "declared-volumes:latest",
            &["sleep", "1000"],
        ))
        .await;
    let script = "stat -c %u:%g /data/db/seed.txt /var/log/app; \
                  echo more >> /var/log/app/app.log && cat /data/db/seed.txt";
    let (out, err, _) = pod
        .exec(&id, &["sh", "-c", script], 10)
        .await
        .expect("exec");
    assert_eq!(out, "65534:65534\n0:0\nseeded by the image\n", "{err}");
    pod.remove_pod().await;
}

/// A runc that makes idmapped mounts itself (1.2 or later, `features` says so) gets the
/// pod's volumes as mounts with ID mappings instead of crius's staged ones. Runs where
/// `CRIUS_TEST_IDMAP_RUNC` names such a runc: bookworm has none, so the test bed does not.
#[tokio::test]
async fn a_runtime_that_idmaps_mounts_gets_the_volumes_mappings() {
    let Ok(runc) = std::env::var("CRIUS_TEST_IDMAP_RUNC") else {
        eprintln!("CRIUS_TEST_IDMAP_RUNC is not set: no runc of 1.2 or later to test with");
        return;
    };
    let mut network = None;
    let crius = Crius::start_with(
        |c| {
            network = Some(TestNetwork::install(c, 154));
            let mut idmapping = c.containerd.runtimes["runc"].clone();
            idmapping.options.binary_name = runc;
            c.containerd.runtimes.insert("idmapping".into(), idmapping);
        },
        &[],
    )
    .await;
    let config = userns_pod_config("userns-runc12", own_userns());
    let mut pod = pod_on(&crius, config, "idmapping").await;
    let host = tempfile::tempdir().expect("tempdir");
    let pod_range = vec![mapping(0, HOST_ROOT, RANGE)];
    let mut config = container("c", "busybox:latest", &["sleep", "1000"]);
    config.mounts.push(Mount {
        host_path: host.path().display().to_string(),
        container_path: "/volume".to_string(),
        uid_mappings: pod_range.clone(),
        gid_mappings: pod_range,
        ..Default::default()
    });
    let id = pod.run(config).await;
    let (out, err, _) = pod
        .exec(
            &id,
            &[
                "sh",
                "-c",
                "id -u; stat -c %u:%g / /volume; touch /volume/z && echo ok",
            ],
            10,
        )
        .await
        .expect("exec");
    assert_eq!(out, "0\n0:0\n0:0\nok\n", "{err}");
    let (_, info) = pod.status(&id).await;
    let volume = info["runtimeSpec"]["mounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["destination"] == "/volume"))
        .cloned()
        .expect("the volume's mount");
    assert_eq!(volume["uidMappings"][0]["hostID"], HOST_ROOT, "{volume}");
    assert!(
        !crius
            .config
            .state
            .join("rootfs")
            .join(format!("{id}.mounts"))
            .exists(),
        "crius staged a mount the runtime makes"
    );
    pod.remove_pod().await;
}
