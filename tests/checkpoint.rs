//! CheckpointContainer against the real containerd, runc and CRIU. Where CRIU works (`criu
//! check`), a running container is checkpointed into an archive with every part
//! checkpointctl reads and keeps running; where it cannot (this VM's kernel: bookworm's CRIU
//! 3.17 fails on its vDSO), the RPC is FAILED_PRECONDITION with CRIU's reason, and crius
//! says so at start-up. Bad requests are refused either way.

mod common;

use std::time::Duration;

use common::Crius;
use common::pod::{container, pod};
use crius::api::v1::CheckpointContainerRequest;

fn criu_works() -> bool {
    std::process::Command::new("criu")
        .arg("check")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// crius with a `criu` first on its PATH that only passes `criu check`: the runtime under
/// containerd still runs the real one. Keep the dir while crius runs.
async fn crius_whose_criu_check_passes() -> (Crius, tempfile::TempDir) {
    let fake = tempfile::tempdir().expect("tempdir");
    let criu = fake.path().join("criu");
    std::fs::write(&criu, "#!/bin/sh\nexit 0\n").expect("fake criu");
    std::fs::set_permissions(&criu, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let path = format!(
        "{}:{}",
        fake.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let crius = Crius::start_with(|_| {}, &[("PATH", path.as_str())]).await;
    (crius, fake)
}

fn request(id: &str, location: &str) -> CheckpointContainerRequest {
    CheckpointContainerRequest {
        container_id: id.to_string(),
        location: location.to_string(),
        timeout: 60,
    }
}

/// The member names of a tar file.
fn members(archive: &std::path::Path) -> Vec<String> {
    let file = std::fs::File::open(archive).expect("archive");
    tar::Archive::new(file)
        .entries()
        .expect("entries")
        .map(|e| {
            e.expect("entry")
                .path()
                .expect("path")
                .display()
                .to_string()
        })
        .collect()
}

#[tokio::test]
async fn a_running_container_is_checkpointed_or_refused_for_want_of_criu() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "checkpoint").await;
    let counter = container(
        "counter",
        "busybox:latest",
        &[
            "sh",
            "-c",
            "i=0; while true; do echo $i; i=$((i+1)); sleep 0.2; done",
        ],
    );
    let id = pod.run(counter).await;
    let out = tempfile::tempdir().expect("tempdir");
    let location = out.path().join("checkpoint.tar");
    let result = pod
        .client
        .runtime
        .checkpoint_container(request(&id, &location.display().to_string()))
        .await;
    if criu_works() {
        result.expect("checkpoint");
        let names = members(&location);
        for part in [
            "config.dump",
            "spec.dump",
            "status.dump",
            "rootfs-diff.tar",
            "deleted.files",
            "container.log",
        ] {
            assert!(names.iter().any(|n| n == part), "{part}: {names:?}");
        }
        assert!(
            names.iter().any(|n| n.starts_with("checkpoint/")),
            "{names:?}"
        );
    } else {
        let err = result.expect_err("CRIU does not work here");
        assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
        assert!(err.message().contains("criu check"), "{}", err.message());
        assert!(!location.exists());
        assert!(
            crius
                .log()
                .contains("containers cannot be checkpointed on this host"),
            "no start-up notice"
        );
    }
    // Either way the container keeps running, and counting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, _) = pod.status(&id).await;
    assert_eq!(
        status.state,
        crius::api::v1::ContainerState::ContainerRunning as i32
    );
    let (out, _, _) = pod.exec(&id, &["true"], 10).await.expect("exec");
    assert_eq!(out, "");
    pod.remove_pod().await;
}

#[tokio::test]
async fn bad_checkpoint_requests_are_refused() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "checkpoint-bad").await;
    let id = pod
        .run(container("c", "busybox:latest", &["sleep", "1000"]))
        .await;
    let cases = [
        (request(&id, ""), tonic::Code::InvalidArgument),
        (request(&id, "relative.tar"), tonic::Code::InvalidArgument),
        (
            request("no-such-container", "/tmp/x.tar"),
            tonic::Code::NotFound,
        ),
    ];
    for (req, code) in cases {
        let err = pod
            .client
            .runtime
            .checkpoint_container(req.clone())
            .await
            .expect_err("refused");
        assert_eq!(err.code(), code, "{req:?}: {err:?}");
    }
    if criu_works() {
        pod.stop(&id, 0).await;
        let err = pod
            .client
            .runtime
            .checkpoint_container(request(&id, "/tmp/crius-stopped.tar"))
            .await
            .expect_err("not running");
        assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    }
    pod.remove_pod().await;
}

#[tokio::test]
async fn a_dump_that_fails_leaves_the_container_running() {
    // crius's own check passes (a `criu` that only says yes comes first on its PATH); the
    // runtime under containerd runs the real one, which fails here at dump time.
    let (crius, _fake_criu) = crius_whose_criu_check_passes().await;
    let mut pod = pod(&crius, "checkpoint-fails").await;
    let id = pod
        .run(container("c", "busybox:latest", &["sleep", "1000"]))
        .await;
    let out = tempfile::tempdir().expect("tempdir");
    let location = out.path().join("checkpoint.tar");
    let result = pod
        .client
        .runtime
        .checkpoint_container(request(&id, &location.display().to_string()))
        .await;
    match result {
        Ok(_) => assert!(members(&location).iter().any(|n| n == "config.dump")),
        Err(err) => {
            assert_eq!(err.code(), tonic::Code::Internal, "{err:?}");
            assert!(
                err.message().contains("CRIU's first error"),
                "{}",
                err.message()
            );
            assert!(!location.exists());
            assert_eq!(std::fs::read_dir(out.path()).expect("dir").count(), 0);
        }
    }
    // Resumed, not left paused: it still answers.
    let (status, _) = pod.status(&id).await;
    assert_eq!(
        status.state,
        crius::api::v1::ContainerState::ContainerRunning as i32
    );
    let (out, _, code) = pod.exec(&id, &["echo", "alive"], 10).await.expect("exec");
    assert_eq!((out.as_str(), code), ("alive\n", 0));
    let staging: Vec<_> = std::fs::read_dir(crius.config.root.join("containers").join(&id))
        .expect("container dir")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("checkpoint-"))
        .collect();
    assert!(staging.is_empty(), "staging left: {staging:?}");
    pod.remove_pod().await;
}

/// A checkpoint archive as crius writes one, of a busybox container that wrote
/// /restored/marker and removed /bin/ls; its CRIU images are made up.
fn fake_archive(dir: &std::path::Path, image: &str) -> std::path::PathBuf {
    let append = |tar: &mut tar::Builder<std::fs::File>, name: &str, data: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_cksum();
        tar.append_data(&mut header, name, data).expect("append");
    };
    let diff_path = dir.join("diff.tar");
    let mut diff = tar::Builder::new(std::fs::File::create(&diff_path).expect("diff"));
    append(&mut diff, "restored/marker", b"from the checkpoint\n");
    diff.finish().expect("diff");
    drop(diff);
    let config = serde_json::json!({
        "id": "0123", "name": "counter", "rootfsImage": image, "rootfsImageRef": "",
        "rootfsImageName": image, "runtime": "io.containerd.crius.v2",
        "createdTime": "2026-12-02T10:00:00Z", "checkpointedTime": "2026-12-02T10:01:00Z",
        "restoredTime": "0001-01-01T00:00:00Z", "restored": false,
    });
    let archive = dir.join("checkpoint.tar");
    let mut tar = tar::Builder::new(std::fs::File::create(&archive).expect("archive"));
    append(&mut tar, "checkpoint/inventory.img", b"not really CRIU's");
    append(&mut tar, "config.dump", config.to_string().as_bytes());
    append(&mut tar, "spec.dump", b"{}");
    append(&mut tar, "deleted.files", br#"["/bin/ls"]"#);
    let diff = std::fs::read(&diff_path).expect("diff");
    append(&mut tar, "rootfs-diff.tar", &diff);
    tar.finish().expect("archive");
    archive
}

#[tokio::test]
async fn a_container_is_restored_from_an_archive_onto_its_base_image() {
    let (crius, _fake_criu) = crius_whose_criu_check_passes().await;
    let mut pod = pod(&crius, "restore").await;
    let image = common::pod::image("busybox:latest");
    let dir = tempfile::tempdir().expect("tempdir");
    let archive = fake_archive(dir.path(), &image);
    let archive_text = archive.display().to_string();

    let mut config = container("restored", "busybox:latest", &[]);
    config.image.as_mut().expect("image").image = archive_text.clone();
    let id = pod.create(config).await.expect("create from the archive");
    let (status, _) = pod.status(&id).await;
    assert_eq!(
        status.image.as_ref().map(|i| i.image.as_str()),
        Some(image.as_str())
    );
    assert_eq!(
        status.annotations.get("restored").map(String::as_str),
        Some("true")
    );
    assert_eq!(
        status.annotations.get("checkpointImage"),
        Some(&archive_text)
    );

    // Start replays the layer's changes and has the shim run `runc restore` on the images
    // containerd unpacked. These are made up, so runc refuses them.
    let err = pod.start(&id).await.expect_err("made-up CRIU images");
    assert!(err.message().contains("runc restore"), "{}", err.message());
    let (status, _) = pod.status(&id).await;
    assert_eq!(status.reason, "StartError");
    let mounts = crius.ctr(&["snapshots", "mounts", "/mnt", &id]);
    let upper = mounts
        .split(['=', ',', ' '])
        .skip_while(|w| *w != "upperdir")
        .nth(1)
        .expect("upperdir")
        .to_string();
    let upper = std::path::Path::new(&upper);
    assert_eq!(
        std::fs::read_to_string(upper.join("restored/marker")).expect("marker"),
        "from the checkpoint\n"
    );
    let whiteout = std::fs::symlink_metadata(upper.join("bin/ls")).expect("whiteout");
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(
        &whiteout.file_type()
    ));
    assert!(!crius.ctr(&["leases", "ls"]).contains("crius-restore-"));
    assert!(
        !crius
            .config
            .root
            .join("containers")
            .join(&id)
            .join("restore")
            .exists()
    );
    pod.remove_pod().await;
}

#[tokio::test]
async fn an_archive_is_refused_where_criu_cannot_work() {
    if criu_works() {
        return;
    }
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "restore-refused").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let archive = fake_archive(dir.path(), &common::pod::image("busybox:latest"));
    let mut config = container("restored", "busybox:latest", &[]);
    config.image.as_mut().expect("image").image = archive.display().to_string();
    let err = pod.create(config).await.expect_err("no CRIU");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    pod.remove_pod().await;
}
