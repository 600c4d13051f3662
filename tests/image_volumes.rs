//! Image volumes (`Mount.image`, kubelet's ImageVolume) against the real containerd: the
//! image's merged layers read-only in the container, sub paths resolved inside the image,
//! one mount per pod and image, the image pinned while mounted, everything gone with the
//! pod, also across a crius crash, and clear errors for what cannot be mounted.

mod common;

use std::path::Path;

use common::Crius;
use common::pod::{Pod, container, image, pod};
use crius::api::v1::{ImageSpec, ListImagesRequest, Mount, RemoveImageRequest};
use tonic::Code;

fn image_mount(container_path: &str, image: &str, sub_path: &str) -> Mount {
    Mount {
        container_path: container_path.to_string(),
        readonly: true,
        image: Some(ImageSpec {
            image: image.to_string(),
            ..Default::default()
        }),
        image_sub_path: sub_path.to_string(),
        ..Default::default()
    }
}

async fn remove_image(pod: &mut Pod, image: &str) -> Result<(), tonic::Status> {
    pod.client
        .image
        .remove_image(RemoveImageRequest {
            image: Some(ImageSpec {
                image: image.to_string(),
                ..Default::default()
            }),
        })
        .await
        .map(|_| ())
}

async fn image_listed(pod: &mut Pod, id: &str) -> bool {
    pod.client
        .image
        .list_images(ListImagesRequest::default())
        .await
        .expect("list images")
        .into_inner()
        .images
        .iter()
        .any(|i| i.id == id)
}

fn mounted_under(dir: &Path) -> usize {
    let wanted = dir.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| point.starts_with(&wanted))
        .count()
}

fn volumes_dir(crius: &Crius, pod_id: &str) -> std::path::PathBuf {
    crius.config.state.join("image-volumes").join(pod_id)
}

async fn cat(pod: &mut Pod, id: &str, path: &str) -> String {
    let (out, err, code) = pod.exec(id, &["cat", path], 10).await.expect("exec");
    assert_eq!(code, 0, "cat {path}: {err}");
    out
}

#[tokio::test]
async fn an_image_volume_is_the_image_read_only_shared_by_the_pod_and_gone_with_it() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "image-volume").await;
    let volume = pod.pull("volume:latest").await;
    let mut config = container("reader", "busybox:latest", &["sleep", "1000"]);
    config.mounts = vec![
        image_mount("/vol", &volume, ""),
        image_mount("/sub", &volume, "data/dir"),
    ];
    let reader = pod.run(config).await;

    // Both layers merged, the second one's deletion honoured.
    assert_eq!(
        cat(&mut pod, &reader, "/vol/data/one.txt").await,
        "layer one\n"
    );
    assert_eq!(
        cat(&mut pod, &reader, "/vol/data/two.txt").await,
        "layer two\n"
    );
    let (_, _, gone) = pod
        .exec(&reader, &["test", "-e", "/vol/data/gone.txt"], 10)
        .await
        .unwrap();
    assert_ne!(gone, 0, "a file the top layer deleted is not there");
    // A sub path is that directory.
    assert_eq!(cat(&mut pod, &reader, "/sub/nested.txt").await, "nested\n");
    // One that would leave the image (an absolute symlink, a relative one climbing out, an
    // absolute path) is refused, never followed to the host, in containerd's words.
    for escaping in ["data/abs-link", "data/up-link/etc", "/data"] {
        let mut config = container("escape", "busybox:latest", &["sleep", "1000"]);
        config.mounts = vec![image_mount("/x", &volume, escaping)];
        let err = pod.create(config).await.expect_err(escaping);
        assert_eq!(err.code(), Code::InvalidArgument, "{escaping}: {err:?}");
        assert!(
            err.message().contains("path escapes from parent"),
            "{escaping}: {err:?}"
        );
    }
    let (_, _, written) = pod.exec(&reader, &["touch", "/vol/new"], 10).await.unwrap();
    assert_ne!(written, 0, "the volume is read-only");

    // The status shows the mount, with where crius mounted it.
    let (status, _) = pod.status(&reader).await;
    let vol = status
        .mounts
        .iter()
        .find(|m| m.container_path == "/vol")
        .expect("the volume in the status");
    let host = volumes_dir(&crius, &pod.id);
    assert!(Path::new(&vol.host_path).starts_with(&host), "{vol:?}");
    assert_eq!(
        vol.image.as_ref().map(|i| i.image.as_str()),
        Some(volume.as_str())
    );

    // A second container of the pod shares the one mount.
    let mut config = container("second", "busybox:latest", &["sleep", "1000"]);
    config.mounts = vec![image_mount("/data", &volume, "data")];
    let second = pod.run(config).await;
    assert_eq!(cat(&mut pod, &second, "/data/two.txt").await, "layer two\n");
    assert_eq!(mounted_under(&host), 1, "one mount for the pod and image");

    // The image cannot be removed while it is mounted.
    let refused = remove_image(&mut pod, &volume).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(image_listed(&mut pod, &volume).await);

    let pod_id = pod.id.clone();
    let mut client = pod.client.clone();
    pod.remove_pod().await;
    assert!(!host.exists(), "the pod's volume directory is removed");
    assert_eq!(mounted_under(&host), 0);
    let snapshots = crius.ctr(&["snapshots", "ls"]);
    assert!(!snapshots.contains(&pod_id), "{snapshots}");
    let leases = crius.ctr(&["leases", "ls"]);
    assert!(!leases.contains(&pod_id), "{leases}");
    client
        .image
        .remove_image(RemoveImageRequest {
            image: Some(ImageSpec {
                image: volume.clone(),
                ..Default::default()
            }),
        })
        .await
        .expect("the image can go once no pod mounts it");
}

#[tokio::test]
async fn what_cannot_be_mounted_is_a_clear_error_and_leaves_nothing() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "image-volume-errors").await;
    let volume = pod.pull("volume:latest").await;
    let cases = [
        (
            image_mount("/vol", &image("never-pulled:latest"), ""),
            Code::NotFound,
        ),
        (image_mount("/vol", &volume, "data/missing"), Code::NotFound),
        (
            image_mount("/vol", &volume, "file.txt"),
            Code::InvalidArgument,
        ),
        (
            Mount {
                readonly: false,
                ..image_mount("/vol", &volume, "")
            },
            Code::InvalidArgument,
        ),
        (
            Mount {
                host_path: "/etc".to_string(),
                ..image_mount("/vol", &volume, "")
            },
            Code::InvalidArgument,
        ),
    ];
    for (mount, code) in cases {
        let mut config = container("refused", "busybox:latest", &["sleep", "1000"]);
        config.mounts = vec![mount.clone()];
        let err = pod.create(config).await.unwrap_err();
        assert_eq!(err.code(), code, "{mount:?}: {err:?}");
        assert!(
            err.message().starts_with("ImageVolumeMountFailed"),
            "kubelet's reason leads the message: {}",
            err.message()
        );
    }
    // The name was released each time, and no container directory stayed behind.
    let ok = pod
        .create(container("refused", "busybox:latest", &["sleep", "1000"]))
        .await
        .expect("the name is free again");
    let containers = std::fs::read_dir(crius.config.root.join("containers"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(containers, 1, "only {ok} has a directory");
    pod.remove_pod().await;
}

#[tokio::test]
async fn image_volumes_survive_a_crius_crash_and_go_with_their_pod() {
    let mut crius = Crius::start().await;
    let mut pod = pod(&crius, "image-volume-crash").await;
    let volume = pod.pull("volume:latest").await;
    let mut config = container("before", "busybox:latest", &["sleep", "1000"]);
    config.mounts = vec![image_mount("/vol", &volume, "")];
    let before = pod.run(config).await;

    crius.restart_after_crash().await;
    pod.client = crius.client().await;
    // Start-up keeps the lease and the mount of a pod it still has.
    assert_eq!(
        cat(&mut pod, &before, "/vol/data/one.txt").await,
        "layer one\n"
    );
    let mut config = container("after", "busybox:latest", &["sleep", "1000"]);
    config.mounts = vec![image_mount("/vol", &volume, "data")];
    let after = pod.run(config).await;
    assert_eq!(cat(&mut pod, &after, "/vol/two.txt").await, "layer two\n");
    let host = volumes_dir(&crius, &pod.id);
    assert_eq!(mounted_under(&host), 1);
    let leases = crius.ctr(&["leases", "ls"]);
    assert!(leases.contains(&pod.id), "{leases}");

    let pod_id = pod.id.clone();
    pod.remove_pod().await;
    assert_eq!(mounted_under(&host), 0);
    assert!(!crius.ctr(&["snapshots", "ls"]).contains(&pod_id));
}
