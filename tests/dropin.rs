//! What workloads and tools see matches containerd's CRI: volumes the image declares,
//! `HOSTNAME`, groups from the image's `/etc/group`, sysfs by privilege, partial last log
//! lines and the log line limit, and images changed with `ctr` behind crius's back.

mod common;

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use common::pod::{Pod, container, image, pod, pod_with};
use common::{Crius, TestNetwork, eventually, pod_config};
use crius::api::v1::{
    ImageSpec, ImageStatusRequest, KeyValue, LinuxContainerConfig, LinuxContainerSecurityContext,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, ListImagesRequest, Mount, NamespaceMode,
    NamespaceOption, SupplementalGroupsPolicy,
};

async fn sh(pod: &mut Pod, id: &str, script: &str) -> (String, i32) {
    let (out, err, code) = pod.exec(id, &["sh", "-c", script], 10).await.expect("exec");
    (format!("{out}{err}"), code)
}

fn is_mount_point(mounts: &str, path: &str) -> bool {
    mounts
        .lines()
        .any(|line| line.split(' ').nth(1) == Some(path))
}

#[tokio::test]
async fn volumes_the_image_declares_are_seeded_writable_and_go_with_the_container() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "declared-volumes").await;
    pod.pull("declared-volumes:latest").await;
    let id = pod
        .run(container(
            "db",
            "declared-volumes:latest",
            &["sleep", "1000"],
        ))
        .await;

    let (mounts, _) = sh(&mut pod, &id, "cat /proc/self/mounts").await;
    for path in [
        "/data/db",
        "/var/log/app",
        "/empty",
        "/:colon_prefixed",
        "/C:/weird_test_dir",
    ] {
        assert!(is_mount_point(&mounts, path), "{path} in {mounts}");
    }
    // Seeded from the image, owners and modes kept.
    let (out, code) = sh(
        &mut pod,
        &id,
        "stat -c '%u:%g' /data/db /data/db/seed.txt; cat /data/db/seed.txt /data/db/nested/deep.txt; \
         readlink /data/db/link; stat -c %a /var/log/app; cat /var/log/app/app.log",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out,
        "65534:65534\n65534:65534\nseeded by the image\ndeeper\nseed.txt\n750\napp log\n"
    );
    // Writable, and what is written lands in the container's own host directory.
    let (out, code) = sh(&mut pod, &id, "echo row > /data/db/new && touch /empty/x").await;
    assert_eq!(code, 0, "{out}");
    let volumes = crius
        .config
        .root
        .join("containers")
        .join(&id)
        .join("volumes");
    let written: Vec<_> = std::fs::read_dir(&volumes)
        .expect("the volumes live under the container's root dir")
        .filter_map(Result::ok)
        .filter(|e| e.path().join("new").exists())
        .collect();
    assert_eq!(written.len(), 1);
    assert_eq!(
        std::fs::metadata(written[0].path()).unwrap().uid(),
        65534,
        "the host directory keeps the image's owner"
    );

    // A CRI mount at the same path replaces the image's volume.
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("mine.txt"), "from the host\n").unwrap();
    let mut config = container("replaced", "declared-volumes:latest", &["sleep", "1000"]);
    config.mounts = vec![Mount {
        container_path: "/data/db".into(),
        host_path: host.path().display().to_string(),
        ..Default::default()
    }];
    let replaced = pod.run(config).await;
    let (out, _) = sh(&mut pod, &replaced, "ls /data/db").await;
    assert_eq!(out, "mine.txt\n");

    pod.stop(&id, 0).await;
    pod.remove(&id).await;
    let gone = common::eventually(Duration::from_secs(5), || async { !volumes.exists() }).await;
    assert!(gone, "removed right after the container");
    pod.remove_pod().await;
}

#[tokio::test]
async fn ignore_image_defined_volumes_leaves_the_paths_in_the_rootfs() {
    let crius = Crius::start_with(|c| c.ignore_image_defined_volumes = true, &[]).await;
    let mut pod = pod(&crius, "ignored-volumes").await;
    pod.pull("declared-volumes:latest").await;
    let id = pod
        .run(container(
            "db",
            "declared-volumes:latest",
            &["sleep", "1000"],
        ))
        .await;
    let (mounts, _) = sh(&mut pod, &id, "cat /proc/self/mounts").await;
    assert!(!is_mount_point(&mounts, "/data/db"), "{mounts}");
    let (out, _) = sh(&mut pod, &id, "cat /data/db/seed.txt").await;
    assert_eq!(
        out, "seeded by the image\n",
        "the image's files are still there"
    );
    assert!(
        !crius
            .config
            .root
            .join("containers")
            .join(&id)
            .join("volumes")
            .exists()
    );
    pod.remove_pod().await;
}

#[tokio::test]
async fn hostname_is_in_the_environment_as_in_etc_hostname() {
    // A hostname is a pod's with a network (and UTS namespace) of its own.
    let mut network = None;
    let crius = Crius::start_with(|c| network = Some(TestNetwork::install(c, 181)), &[]).await;
    let _network = network;
    let mut named = pod_with(&crius, pod_config("named-host")).await;
    let id = named
        .run(container("app", "busybox:latest", &["sleep", "1000"]))
        .await;
    let (out, _) = sh(&mut named, &id, "echo $HOSTNAME; cat /etc/hostname").await;
    assert_eq!(out, "named-host\nnamed-host\n");
    let mut config = container("own", "busybox:latest", &["sleep", "1000"]);
    config.envs = vec![
        KeyValue {
            key: "HOSTNAME".into(),
            value: "chosen".into(),
        },
        // Env values are bytes in the CRI: one that is not UTF-8 keeps its good bytes and
        // each bad one becomes U+FFFD, as in containerd's JSON spec.
        KeyValue {
            key: "RAW".into(),
            value: b"a\xffb\xe2\x82".to_vec(),
        },
    ];
    let own = named.run(config).await;
    let (out, _) = sh(&mut named, &own, "echo $HOSTNAME; echo \"$RAW\"").await;
    assert_eq!(
        out, "chosen\na\u{fffd}b\u{fffd}\u{fffd}\n",
        "the config's HOSTNAME wins"
    );
    named.remove_pod().await;

    // A host-network pod without a hostname has the node's.
    let mut config = pod_config("unnamed-host");
    config.hostname = String::new();
    config.linux = Some(LinuxPodSandboxConfig {
        security_context: Some(LinuxSandboxSecurityContext {
            namespace_options: Some(NamespaceOption {
                network: NamespaceMode::Node as i32,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let mut unnamed = pod_with(&crius, config).await;
    let id = unnamed
        .run(container("app", "busybox:latest", &["sleep", "1000"]))
        .await;
    let node = nix::unistd::gethostname().unwrap().into_string().unwrap();
    let (out, _) = sh(&mut unnamed, &id, "echo $HOSTNAME; cat /etc/hostname").await;
    assert_eq!(out, format!("{node}\n{node}\n"));
    unnamed.remove_pod().await;
}

fn with_groups_policy(
    name: &str,
    policy: SupplementalGroupsPolicy,
) -> crius::api::v1::ContainerConfig {
    let mut config = container(name, "busybox:latest", &["sleep", "1000"]);
    config.linux = Some(LinuxContainerConfig {
        security_context: Some(LinuxContainerSecurityContext {
            supplemental_groups_policy: policy as i32,
            ..Default::default()
        }),
        ..Default::default()
    });
    config
}

#[tokio::test]
async fn root_gets_the_groups_the_image_lists_it_in_unless_strict() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "image-groups").await;
    let merged = pod
        .run(with_groups_policy(
            "merged",
            SupplementalGroupsPolicy::Merge,
        ))
        .await;
    let (out, _) = sh(&mut pod, &merged, "id -G").await;
    assert_eq!(out, "0 10\n", "busybox's root is in wheel");
    let strict = pod
        .run(with_groups_policy(
            "strict",
            SupplementalGroupsPolicy::Strict,
        ))
        .await;
    let (out, _) = sh(&mut pod, &strict, "id -G").await;
    assert_eq!(out, "0\n");
    pod.remove_pod().await;
}

#[tokio::test]
async fn sysfs_is_writable_only_for_a_privileged_container() {
    let crius = Crius::start().await;
    let mut config = pod_config("sysfs");
    config.hostname = String::new();
    config.linux = Some(LinuxPodSandboxConfig {
        security_context: Some(LinuxSandboxSecurityContext {
            privileged: true,
            namespace_options: Some(NamespaceOption {
                network: NamespaceMode::Node as i32,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let mut pod = pod_with(&crius, config).await;
    let mut privileged = container("privileged", "busybox:latest", &["sleep", "1000"]);
    privileged.linux = Some(LinuxContainerConfig {
        security_context: Some(LinuxContainerSecurityContext {
            privileged: true,
            ..Default::default()
        }),
        ..Default::default()
    });
    let privileged = pod.run(privileged).await;
    let plain = pod
        .run(container("plain", "busybox:latest", &["sleep", "1000"]))
        .await;
    let sys_access = |mounts: &str| {
        mounts
            .lines()
            .find(|l| l.split(' ').nth(1) == Some("/sys"))
            .and_then(|l| l.split(' ').nth(3))
            .and_then(|o| o.split(',').next())
            .map(str::to_string)
    };
    let (mounts, _) = sh(&mut pod, &privileged, "cat /proc/self/mounts").await;
    assert_eq!(sys_access(&mounts).as_deref(), Some("rw"), "{mounts}");
    let (mounts, _) = sh(&mut pod, &plain, "cat /proc/self/mounts").await;
    assert_eq!(sys_access(&mounts).as_deref(), Some("ro"), "{mounts}");
    pod.remove_pod().await;
}

async fn log_of(pod: &mut Pod, name: &str, script: &str) -> Vec<String> {
    let id = pod
        .run(container(name, "busybox:latest", &["sh", "-c", script]))
        .await;
    pod.wait_exited(&id).await;
    let path = pod.log_path(name);
    let mut lines = Vec::new();
    eventually(Duration::from_secs(5), || {
        let path = path.clone();
        async move { std::fs::read_to_string(&path).is_ok_and(|l| !l.is_empty()) }
    })
    .await;
    for line in std::fs::read_to_string(&path).unwrap_or_default().lines() {
        // Drop the timestamp: "<time> stdout P abcd" -> "stdout P abcd".
        lines.push(
            line.split_once(' ')
                .map(|(_, rest)| rest.to_string())
                .unwrap_or_default(),
        );
    }
    lines
}

#[tokio::test]
async fn a_last_line_without_newline_is_partial_and_the_line_limit_is_configurable() {
    let crius = Crius::start_with(|c| c.max_container_log_line_size = 4, &[]).await;
    let mut pod = pod(&crius, "log-lines").await;
    assert_eq!(
        log_of(&mut pod, "unfinished", "echo ok; printf abc").await,
        vec!["stdout F ok", "stdout P abc"]
    );
    assert_eq!(
        log_of(&mut pod, "long", "echo abcdefghij").await,
        vec!["stdout P abcd", "stdout P efgh", "stdout F ij"]
    );
    pod.remove_pod().await;
}

async fn listed(pod: &mut Pod) -> HashMap<String, Vec<String>> {
    pod.client
        .image
        .list_images(ListImagesRequest::default())
        .await
        .expect("list images")
        .into_inner()
        .images
        .into_iter()
        .map(|i| (i.id, i.repo_tags))
        .collect()
}

async fn status_found(pod: &mut Pod, name: &str) -> bool {
    pod.client
        .image
        .image_status(ImageStatusRequest {
            image: Some(ImageSpec {
                image: name.to_string(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await
        .expect("image status")
        .into_inner()
        .image
        .is_some()
}

/// An image another client fetched without unpacking it (`ctr content fetch`) runs: its
/// layers are unpacked when a container is made of it, as containerd's CRI does.
#[tokio::test]
async fn an_image_fetched_without_unpacking_runs() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "fetched").await;
    let fetched = image("busybox-entry:latest");
    let snapshots_before = crius.ctr(&["snapshots", "ls"]);
    crius.ctr(&["content", "fetch", "--plain-http", &fetched]);
    assert_eq!(
        crius.ctr(&["snapshots", "ls"]),
        snapshots_before,
        "nothing unpacked yet"
    );
    let mut seen = false;
    for _ in 0..50 {
        if status_found(&mut pod, &fetched).await {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen, "the fetched image is found");
    let id = pod
        .run(container("echo", "busybox-entry:latest", &[]))
        .await;
    pod.wait_exited(&id).await;
    let (status, _) = pod.status(&id).await;
    assert_eq!(status.exit_code, 0, "{status:?}");
    pod.remove_pod().await;
}

#[tokio::test]
async fn images_changed_with_ctr_show_at_once() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "ctr-images").await;
    let source = image("busybox:latest");
    let tagged = "example.test/retagged:v1".to_string();
    crius.ctr(&["images", "tag", &source, &tagged]);
    let mut found = false;
    for _ in 0..50 {
        if listed(&mut pod)
            .await
            .values()
            .flatten()
            .any(|t| *t == tagged)
        {
            found = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(found, "a tag made with ctr is listed");
    assert!(status_found(&mut pod, &tagged).await);

    crius.ctr(&["images", "rm", &tagged]);
    let mut gone = false;
    for _ in 0..50 {
        if !listed(&mut pod)
            .await
            .values()
            .flatten()
            .any(|t| *t == tagged)
        {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "a tag removed with ctr is no longer listed");
    assert!(!status_found(&mut pod, &tagged).await);
    assert!(
        status_found(&mut pod, &source).await,
        "the other name stays"
    );

    // Pulled with ctr, whole image: listed and usable.
    let pulled = image("volume:latest");
    crius.ctr(&["images", "pull", "--plain-http", &pulled]);
    let mut seen = false;
    for _ in 0..50 {
        if status_found(&mut pod, &pulled).await {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen, "an image pulled with ctr is found");
    // Taken in as containerd's CRI takes it: its record labelled managed, and a record named
    // by its ID beside it, labelled too.
    let id = pod
        .client
        .image
        .image_status(ImageStatusRequest {
            image: Some(ImageSpec {
                image: pulled.clone(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await
        .expect("image status")
        .into_inner()
        .image
        .expect("the image")
        .id;
    let managed = |name: &str| {
        crius.ctr(&["images", "ls"]).lines().any(|l| {
            l.starts_with(&format!("{name} ")) && l.contains("io.cri-containerd.image=managed")
        })
    };
    let adopted = eventually(Duration::from_secs(5), || async {
        managed(&pulled) && managed(&id)
    })
    .await;
    assert!(adopted, "records: {}", crius.ctr(&["images", "ls"]));
    // A record labelled pinned (as containerd's CRI labels them) makes the image pinned.
    crius.ctr(&[
        "images",
        "label",
        &pulled,
        "io.cri-containerd.pinned=pinned",
    ]);
    let pinned = eventually(Duration::from_secs(5), || {
        let mut client = pod.client.clone();
        let pulled = pulled.clone();
        async move {
            client
                .image
                .image_status(ImageStatusRequest {
                    image: Some(ImageSpec {
                        image: pulled,
                        ..Default::default()
                    }),
                    verbose: false,
                })
                .await
                .ok()
                .and_then(|r| r.into_inner().image)
                .is_some_and(|i| i.pinned)
        }
    })
    .await;
    assert!(pinned, "the pinned label makes the image pinned");
    // Removing the last name of an image removes the image.
    crius.ctr(&["images", "rm", &pulled, &id]);
    let id_gone = eventually(Duration::from_secs(5), || {
        let mut client = pod.client.clone();
        let pulled = pulled.clone();
        async move {
            !client
                .image
                .list_images(ListImagesRequest::default())
                .await
                .map(|r| {
                    r.into_inner()
                        .images
                        .iter()
                        .any(|i| i.repo_tags.contains(&pulled))
                })
                .unwrap_or(true)
        }
    })
    .await;
    assert!(id_gone);
    pod.remove_pod().await;
}
