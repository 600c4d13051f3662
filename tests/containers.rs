//! Containers against the real containerd and runc: create/start/stop/remove, the CRI log,
//! exit codes and reasons, entrypoint merging, users, mounts, ExecSync, log reopening,
//! start failures, concurrency and recovery after a crius restart.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::pod::{
    Pod, container, host_network_pod_config, image, log_contains, pod, pod_on, pull,
};
use common::{Crius, eventually, pod_config};
use crius::api::v1::{
    ContainerFilter, ContainerState, ContainerStateValue, ContainerStatusRequest, Int64Value,
    LinuxContainerConfig, LinuxContainerResources, LinuxContainerSecurityContext,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, ListContainersRequest, Mount,
    NamespaceMode, NamespaceOption, RemovePodSandboxRequest, ReopenContainerLogRequest,
    RunPodSandboxRequest, SupplementalGroupsPolicy,
};

#[tokio::test]
async fn a_running_container_logs_both_streams_and_reports_a_complete_status() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "logs").await;
    let id = pod
        .run(container(
            "app",
            "busybox:latest",
            &["sh", "-c", "echo out; echo err >&2; sleep 1000"],
        ))
        .await;
    let (status, info) = pod.status(&id).await;
    assert_eq!(status.state, ContainerState::ContainerRunning as i32);
    assert!(status.created_at > 0 && status.started_at >= status.created_at);
    assert_eq!(status.metadata.unwrap().name, "app");
    assert_eq!(status.image.unwrap().image, image("busybox:latest"));
    assert!(
        status
            .image_ref
            .starts_with(&format!("{}@sha256:", image("busybox"))),
        "{}",
        status.image_ref
    );
    assert_eq!(status.labels["name"], "app");
    assert_eq!(status.log_path, pod.log_path("app").display().to_string());
    assert_eq!(info["sandboxID"], pod.id);
    assert!(info["pid"].as_u64().unwrap() > 0);
    assert_eq!(info["runtimeSpec"]["process"]["args"][0], "sh");

    let log = pod.log_path("app");
    assert!(
        log_contains(&log, " stdout F out\n").await,
        "{:?}",
        std::fs::read_to_string(&log)
    );
    assert!(log_contains(&log, " stderr F err\n").await);
    let first = std::fs::read_to_string(&log).unwrap();
    let line = first.lines().next().unwrap();
    let time = line.split(' ').next().unwrap();
    assert!(humantime::parse_rfc3339(time).is_ok(), "{line}");

    pod.stop(&id, 0).await;
    let status = pod.wait_exited(&id).await;
    assert_eq!(status.exit_code, 137);
    pod.remove(&id).await;
    pod.remove_pod().await;
}

#[tokio::test]
async fn a_long_line_becomes_partial_entries_and_a_full_tail() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "longline").await;
    let id = pod
        .run(container(
            "long",
            "busybox:latest",
            &["sh", "-c", "head -c 102400 /dev/zero | tr '\\000' x; echo"],
        ))
        .await;
    let status = pod.wait_exited(&id).await;
    assert_eq!(status.exit_code, 0);
    let log = std::fs::read_to_string(pod.log_path("long")).unwrap();
    let entries: Vec<(&str, &str)> = log
        .lines()
        .map(|l| {
            let mut parts = l.splitn(4, ' ');
            let _time = parts.next();
            let _stream = parts.next();
            (parts.next().unwrap(), parts.next().unwrap_or(""))
        })
        .collect();
    assert_eq!(entries.len(), 7, "{}", entries.len());
    assert!(
        entries[..6]
            .iter()
            .all(|(tag, c)| *tag == "P" && c.len() == 16 * 1024)
    );
    assert_eq!(entries[6].0, "F");
    let total: usize = entries.iter().map(|(_, c)| c.len()).sum();
    assert_eq!(total, 102400);
    assert!(entries.iter().all(|(_, c)| c.bytes().all(|b| b == b'x')));
    pod.remove_pod().await;
}

#[tokio::test]
async fn exit_codes_and_reasons() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "exits").await;
    let failing = pod
        .run(container(
            "three",
            "busybox:latest",
            &["sh", "-c", "exit 3"],
        ))
        .await;
    let ok = pod
        .run(container("zero", "busybox:latest", &["true"]))
        .await;
    let status = pod.wait_exited(&failing).await;
    assert_eq!((status.exit_code, status.reason.as_str()), (3, "Error"));
    assert!(status.finished_at >= status.started_at);
    let status = pod.wait_exited(&ok).await;
    assert_eq!((status.exit_code, status.reason.as_str()), (0, "Completed"));

    let mut hog = container(
        "hog",
        "busybox:latest",
        &["sh", "-c", "x=a; while true; do x=$x$x$x$x; done"],
    );
    hog.linux = Some(LinuxContainerConfig {
        resources: Some(LinuxContainerResources {
            memory_limit_in_bytes: 32 * 1024 * 1024,
            ..Default::default()
        }),
        ..Default::default()
    });
    let hog = pod.run(hog).await;
    let status = pod.wait_exited(&hog).await;
    assert_eq!(status.reason, "OOMKilled", "{status:?}");
    assert_eq!(status.exit_code, 137);
    pod.remove_pod().await;
}

#[tokio::test]
async fn stop_kills_a_process_that_ignores_sigterm_after_the_timeout() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "stubborn").await;
    let id = pod
        .run(container(
            "stubborn",
            "busybox:latest",
            &["sh", "-c", "trap '' TERM; echo trapped; sleep 1000 & wait"],
        ))
        .await;
    // StartContainer answers once runc's init is released, which may be before the shell
    // runs: a SIGTERM then would end runc's init, not meet the trap.
    assert!(log_contains(&pod.log_path("stubborn"), "trapped").await);
    let started = Instant::now();
    pod.stop(&id, 2).await;
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(2) && elapsed < Duration::from_secs(5),
        "{elapsed:?}"
    );
    let (status, _) = pod.status(&id).await;
    assert_eq!(status.state, ContainerState::ContainerExited as i32);
    assert_eq!(status.exit_code, 137);
    // Stopping again, and stopping a created container, succeed at once.
    pod.stop(&id, 2).await;
    let created = pod
        .create(container("idle", "busybox:latest", &["sleep", "1"]))
        .await
        .unwrap();
    let started = Instant::now();
    pod.stop(&created, 10).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    pod.remove_pod().await;
}

#[tokio::test]
async fn command_and_args_merge_with_the_image_entrypoint_and_cmd() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "merge").await;
    let cases: [(&str, &[&str], &[&str], &str); 4] = [
        ("both", &["/bin/echo", "cmd"], &["arg"], "cmd arg"),
        ("command", &["/bin/echo", "cmd"], &[], "cmd"),
        ("args", &[], &["arg"], "arg"),
        ("neither", &[], &[], "image-cmd"),
    ];
    for (name, command, args, expected) in cases {
        let mut config = container(name, "busybox-entry:latest", command);
        config.args = args.iter().map(|s| s.to_string()).collect();
        let id = pod.run(config).await;
        pod.wait_exited(&id).await;
        let log = std::fs::read_to_string(pod.log_path(name)).unwrap();
        assert!(
            log.ends_with(&format!(" stdout F {expected}\n")),
            "{name}: {log}"
        );
        let (_, info) = pod.status(&id).await;
        let spec_args: Vec<String> =
            serde_json::from_value(info["runtimeSpec"]["process"]["args"].clone()).unwrap();
        let mut want = vec!["/bin/echo".to_string()];
        want.extend(expected.split(' ').map(str::to_string));
        assert_eq!(spec_args, want, "{name}");
    }
    pod.remove_pod().await;
}

#[tokio::test]
async fn users_from_the_image_and_the_security_context() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "users").await;
    let sleep = ["sleep", "1000"];
    let nobody = pod
        .run(container("nobody", "busybox-user:nobody", &sleep))
        .await;
    let (out, _, code) = pod.exec(&nobody, &["id"], 5).await.unwrap();
    assert_eq!(code, 0);
    assert!(
        out.starts_with("uid=65534(nobody) gid=65534(nogroup)"),
        "{out}"
    );

    let mut named = container("named", "busybox:latest", &sleep);
    named.linux = Some(LinuxContainerConfig {
        security_context: Some(LinuxContainerSecurityContext {
            run_as_username: "user".into(),
            ..Default::default()
        }),
        ..Default::default()
    });
    let named = pod.run(named).await;
    let (out, _, _) = pod.exec(&named, &["id"], 5).await.unwrap();
    assert!(
        out.starts_with("uid=1000(user) gid=1000(user)") && out.contains("100(users)"),
        "{out}"
    );

    let mut numeric = container("numeric", "busybox:latest", &sleep);
    numeric.linux = Some(LinuxContainerConfig {
        security_context: Some(LinuxContainerSecurityContext {
            run_as_user: Some(Int64Value { value: 1000 }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let numeric = pod.run(numeric).await;
    let (out, _, _) = pod.exec(&numeric, &["id", "-u"], 5).await.unwrap();
    assert_eq!(out.trim(), "1000");

    let mut unknown = container("ghost", "busybox:latest", &sleep);
    unknown.linux = Some(LinuxContainerConfig {
        security_context: Some(LinuxContainerSecurityContext {
            run_as_username: "ghost".into(),
            ..Default::default()
        }),
        ..Default::default()
    });
    let err = pod.create(unknown).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("ghost"), "{}", err.message());
    pod.remove_pod().await;
}

/// containerd's TestAdditionalGids cases (its fix for CVE-2023-25173: the primary group is a
/// supplementary group too, so a process cannot shed it to get past a file denied to it),
/// and the Strict policy.
#[tokio::test]
async fn the_primary_group_is_a_supplementary_group_as_under_containerd() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "gids").await;
    let context = |user: Option<i64>, group: Option<i64>, name: &str, groups: &[i64]| {
        LinuxContainerSecurityContext {
            run_as_user: user.map(|value| Int64Value { value }),
            run_as_group: group.map(|value| Int64Value { value }),
            run_as_username: name.into(),
            supplemental_groups: groups.to_vec(),
            ..Default::default()
        }
    };
    let strict = |mut c: LinuxContainerSecurityContext| {
        c.supplemental_groups_policy = SupplementalGroupsPolicy::Strict as i32;
        c
    };
    let cases = [
        (context(None, None, "", &[]), "groups=0(root),10(wheel)"),
        (
            context(None, None, "", &[1, 1234]),
            "groups=0(root),1(daemon),10(wheel),1234",
        ),
        (context(Some(1234), None, "", &[]), "groups=0(root)"),
        (context(Some(1234), Some(1234), "", &[]), "groups=1234"),
        (
            context(Some(1234), None, "", &[1234]),
            "groups=0(root),1234",
        ),
        (context(None, None, "daemon", &[]), "groups=1(daemon)"),
        (
            context(None, None, "daemon", &[1234]),
            "groups=1(daemon),1234",
        ),
        (
            strict(context(Some(1000), Some(2000), "", &[3333])),
            "groups=2000,3333",
        ),
        (strict(context(None, None, "", &[])), "gid=0(root)\n"),
    ];
    for (i, (security, expected)) in cases.into_iter().enumerate() {
        let name = format!("case-{i}");
        let mut config = container(&name, "busybox:latest", &["id"]);
        config.linux = Some(LinuxContainerConfig {
            security_context: Some(security.clone()),
            ..Default::default()
        });
        let id = pod.run(config).await;
        pod.wait_exited(&id).await;
        let log = std::fs::read_to_string(pod.log_path(&name)).unwrap();
        let printed = log.split(" stdout F ").nth(1).unwrap_or_default();
        assert!(
            printed.contains(&format!("{expected}\n")) || printed.ends_with(expected),
            "{security:?}: `id` printed {printed:?}, containerd's CRI prints {expected:?}"
        );
    }
    // A user from the image (busybox-user:1000 runs as 1000) is in its primary group too.
    pull(&mut pod.client, "busybox-user:1000").await;
    let id = pod
        .run(container("image-user", "busybox-user:1000", &["id"]))
        .await;
    pod.wait_exited(&id).await;
    let log = std::fs::read_to_string(pod.log_path("image-user")).unwrap();
    assert!(log.contains("groups=100(users),1000(user)\n"), "{log}");
    pod.remove_pod().await;
}

/// containerd's TestContainerDrainExecIOAfterExit, with its `drain_exec_sync_io_timeout`:
/// an ExecSync whose background child holds the output past the drain fails with containerd's
/// words; one whose child lets go in time answers.
#[tokio::test]
async fn a_configured_drain_fails_an_exec_whose_output_stays_open() {
    let crius = Crius::start_with(
        |c| c.drain_exec_sync_io_timeout = Some(Duration::from_secs(2)),
        &[],
    )
    .await;
    let mut pod = pod(&crius, "drain").await;
    let id = pod
        .run(container("sleeper", "busybox:latest", &["sleep", "1000"]))
        .await;
    let started = Instant::now();
    let err = pod
        .exec(&id, &["sh", "-c", "sleep 1000 &"], 5)
        .await
        .expect_err("the output never closes");
    assert!(
        err.message().contains("failed to drain exec process"),
        "{err:?}"
    );
    // Not the command's own timeout: it ended in time.
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let (_, _, code) = pod
        .exec(&id, &["sh", "-c", "sleep 1 &"], 10)
        .await
        .expect("drained in time");
    assert_eq!(code, 0);
    pod.remove_pod().await;
}

/// containerd's TestContainerStopCancellation: a StopContainer whose client gives up before
/// the stop timeout ends is given up with it, before SIGKILL; the container runs on.
#[tokio::test]
async fn a_stop_whose_client_gives_up_first_leaves_the_container_running() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "stop-cancel").await;
    let id = pod
        .run(container(
            "ignores-term",
            "busybox:latest",
            &[
                "sh",
                "-c",
                "trap 'echo ignore sigterm' TERM; echo trapped; sleep 1000",
            ],
        ))
        .await;
    // As above: a SIGTERM before the shell set its trap would end the container.
    assert!(log_contains(&pod.log_path("ignores-term"), "trapped").await);
    let mut request = tonic::Request::new(crius::api::v1::StopContainerRequest {
        container_id: id.clone(),
        timeout: 3,
    });
    request.set_timeout(Duration::from_secs(1));
    let err = pod
        .client
        .runtime
        .stop_container(request)
        .await
        .expect_err("the client's deadline comes first");
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err:?}");
    for _ in 0..10 {
        let (status, _) = pod.status(&id).await;
        assert_eq!(
            status.state,
            ContainerState::ContainerRunning as i32,
            "the stop was given up, not finished with SIGKILL"
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    pod.stop(&id, 1).await;
    let (status, _) = pod.status(&id).await;
    assert_eq!(status.state, ContainerState::ContainerExited as i32);
    pod.remove_pod().await;
}

#[tokio::test]
async fn volumes_rw_ro_and_through_a_symlink() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "volumes").await;
    let host = crius.dir.path().join("volumes");
    std::fs::create_dir_all(host.join("rw")).unwrap();
    std::fs::create_dir_all(host.join("ro")).unwrap();
    std::fs::create_dir_all(host.join("target")).unwrap();
    std::fs::write(host.join("target/file"), "through the link").unwrap();
    std::os::unix::fs::symlink(host.join("target"), host.join("link")).unwrap();
    let mut config = container("vol", "busybox:latest", &["sleep", "1000"]);
    config.mounts = vec![
        Mount {
            container_path: "/rw".into(),
            host_path: host.join("rw").display().to_string(),
            ..Default::default()
        },
        Mount {
            container_path: "/ro".into(),
            host_path: host.join("ro").display().to_string(),
            readonly: true,
            ..Default::default()
        },
        Mount {
            container_path: "/linked".into(),
            host_path: host.join("link").display().to_string(),
            readonly: true,
            ..Default::default()
        },
    ];
    let id = pod.run(config).await;
    let (_, _, code) = pod
        .exec(&id, &["sh", "-c", "echo hi > /rw/f"], 5)
        .await
        .unwrap();
    assert_eq!(code, 0);
    assert_eq!(std::fs::read_to_string(host.join("rw/f")).unwrap(), "hi\n");
    let (_, err, code) = pod
        .exec(&id, &["sh", "-c", "echo hi > /ro/f"], 5)
        .await
        .unwrap();
    assert_ne!(code, 0);
    assert!(err.contains("Read-only"), "{err}");
    let (out, _, _) = pod.exec(&id, &["cat", "/linked/file"], 5).await.unwrap();
    assert_eq!(out, "through the link");

    let mut missing = container("missing", "busybox:latest", &["true"]);
    missing.mounts = vec![Mount {
        container_path: "/x".into(),
        host_path: "/nonexistent/host/path".into(),
        ..Default::default()
    }];
    let err = pod.create(missing).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    pod.remove_pod().await;
}

#[tokio::test]
async fn exec_sync_output_exit_code_timeout_and_background_children() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "exec").await;
    let id = pod
        .run(container("exec", "busybox:latest", &["sleep", "1000"]))
        .await;
    let (out, err, code) = pod
        .exec(&id, &["sh", "-c", "echo o; echo e >&2; exit 4"], 10)
        .await
        .unwrap();
    assert_eq!((out.as_str(), err.as_str(), code), ("o\n", "e\n", 4));

    let started = Instant::now();
    let timeout = pod.exec(&id, &["sleep", "10"], 1).await.unwrap_err();
    assert_eq!(timeout.code(), tonic::Code::DeadlineExceeded);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    let started = Instant::now();
    let (_, _, code) = pod
        .exec(&id, &["sh", "-c", "sleep 100 &"], 10)
        .await
        .unwrap();
    assert_eq!(code, 0);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    // Exec in a container that is not running is refused.
    let created = pod
        .create(container("idle", "busybox:latest", &["true"]))
        .await
        .unwrap();
    let err = pod.exec(&created, &["true"], 1).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    pod.remove_pod().await;
}

#[tokio::test]
async fn reopen_container_log_writes_to_a_new_file() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "reopen").await;
    let id = pod
        .run(container(
            "ticker",
            "busybox:latest",
            &["sh", "-c", "while true; do echo tick; sleep 0.1; done"],
        ))
        .await;
    let log = pod.log_path("ticker");
    assert!(log_contains(&log, "tick").await);
    let rotated = log.with_extension("log.1");
    std::fs::rename(&log, &rotated).unwrap();
    pod.client
        .runtime
        .reopen_container_log(ReopenContainerLogRequest {
            container_id: id.clone(),
        })
        .await
        .expect("reopen");
    assert!(
        log_contains(&log, "tick").await,
        "no new lines in the new file"
    );
    pod.stop(&id, 0).await;
    let err = pod
        .client
        .runtime
        .reopen_container_log(ReopenContainerLogRequest { container_id: id })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    pod.remove_pod().await;
}

#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs --features failpoints (make test has it)"
)]
async fn remove_answers_before_the_layer_goes_and_pod_removal_waits_for_it() {
    let crius = Crius::start_with_failpoints("container_cleanup=sleep(1500)").await;
    let mut pod = pod(&crius, "rm-later").await;
    let id = pod
        .run(container("c", "busybox:latest", &["sleep", "1000"]))
        .await;
    pod.stop(&id, 0).await;
    let started = Instant::now();
    pod.remove(&id).await;
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "RemoveContainer waited for the layer's removal"
    );
    // Gone for every caller at once; its files and layer go after.
    assert!(!crius.ctr(&["containers", "ls", "-q"]).contains(&id));
    assert!(crius.config.root.join("containers").join(&id).exists());
    pod.remove_pod().await;
    assert!(
        !crius.config.root.join("containers").join(&id).exists(),
        "RemovePodSandbox answered before its removed container's files went"
    );
    assert!(!crius.ctr(&["snapshots", "ls"]).contains(&id));
}

#[tokio::test]
async fn removing_a_running_container_leaves_nothing() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "rm").await;
    let id = pod
        .run(container("victim", "busybox:latest", &["sleep", "1000"]))
        .await;
    let log = pod.log_path("victim");
    pod.remove(&id).await;
    pod.remove(&id).await;
    // Stop of a removed or unknown container succeeds, as the CRI asks.
    pod.stop(&id, 0).await;
    pod.stop("nosuchcontainer", 0).await;
    assert!(!crius.ctr(&["containers", "ls", "-q"]).contains(&id));
    assert!(!crius.ctr(&["tasks", "ls"]).contains(&id));
    // The writable layer and the files go right after RemoveContainer answers.
    let gone = eventually(Duration::from_secs(5), || async {
        !crius.ctr(&["snapshots", "ls"]).contains(&id)
            && !crius.config.state.join("containers").join(&id).exists()
            && !crius.config.root.join("containers").join(&id).exists()
    })
    .await;
    assert!(gone, "snapshot, FIFOs or status left");
    assert!(log.exists(), "the log file stays for kubelet");
    // The name is free again.
    let again = pod
        .run(container("victim", "busybox:latest", &["sleep", "1000"]))
        .await;
    assert_ne!(again, id);
    let err = pod
        .create(container("victim", "busybox:latest", &["true"]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::AlreadyExists);
    pod.remove_pod().await;
    assert!(
        !crius.ctr(&["containers", "ls", "-q"]).contains(&again),
        "pod removal removes its containers"
    );
}

#[tokio::test]
async fn a_start_failure_is_exited_with_start_error() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "startfail").await;
    let id = pod
        .create(container("bad", "busybox:latest", &["/no/such/command"]))
        .await
        .unwrap();
    let err = pod.start(&id).await.unwrap_err();
    assert!(
        err.message().contains("no/such/command"),
        "{}",
        err.message()
    );
    let (status, _) = pod.status(&id).await;
    assert_eq!(status.state, ContainerState::ContainerExited as i32);
    assert_eq!(status.reason, "StartError");
    assert_eq!(status.exit_code, 128);
    assert!(!status.message.is_empty());
    assert!(!crius.ctr(&["tasks", "ls"]).contains(&id));
    // Unknown images are NOT_FOUND: crius does not pull on create.
    let err = pod
        .create(container("noimage", "nosuch:image", &["true"]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    pod.remove_pod().await;
}

#[tokio::test]
async fn list_containers_filters() {
    let crius = Crius::start().await;
    let mut pod = pod(&crius, "listing").await;
    let running = pod
        .run(container("running", "busybox:latest", &["sleep", "1000"]))
        .await;
    let created = pod
        .create(container("created", "busybox:latest", &["true"]))
        .await
        .unwrap();
    let list = |filter: ContainerFilter| {
        let mut client = pod.client.clone();
        async move {
            let mut ids: Vec<String> = client
                .runtime
                .list_containers(ListContainersRequest {
                    filter: Some(filter),
                })
                .await
                .unwrap()
                .into_inner()
                .containers
                .into_iter()
                .map(|c| c.id)
                .collect();
            ids.sort();
            ids
        }
    };
    let mut both = vec![running.clone(), created.clone()];
    both.sort();
    assert_eq!(list(ContainerFilter::default()).await, both);
    assert_eq!(
        list(ContainerFilter {
            pod_sandbox_id: pod.id[..8].to_string(),
            ..Default::default()
        })
        .await,
        both
    );
    assert_eq!(
        list(ContainerFilter {
            id: running[..10].to_string(),
            ..Default::default()
        })
        .await,
        vec![running.clone()]
    );
    assert_eq!(
        list(ContainerFilter {
            state: Some(ContainerStateValue {
                state: ContainerState::ContainerCreated as i32
            }),
            ..Default::default()
        })
        .await,
        vec![created.clone()]
    );
    assert_eq!(
        list(ContainerFilter {
            label_selector: HashMap::from([("name".to_string(), "running".to_string())]),
            ..Default::default()
        })
        .await,
        vec![running.clone()]
    );
    assert!(
        list(ContainerFilter {
            pod_sandbox_id: "nosuchpod".into(),
            ..Default::default()
        })
        .await
        .is_empty()
    );
    pod.remove_pod().await;
}

#[tokio::test]
async fn twenty_pods_with_three_containers_each_concurrently() {
    let crius = Crius::start().await;
    let first = pod(&crius, "warm").await;
    first.remove_pod().await;
    let mut handles = Vec::new();
    for i in 0..20 {
        let crius_client = crius.client().await;
        let dir = crius.dir.path().to_path_buf();
        handles.push(tokio::spawn(async move {
            let mut config = pod_config(&format!("p{i}"));
            config.hostname = String::new();
            config.log_directory = dir.join("logs").join(format!("p{i}")).display().to_string();
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
            let mut client = crius_client;
            let id = client
                .runtime
                .run_pod_sandbox(RunPodSandboxRequest {
                    config: Some(config.clone()),
                    runtime_handler: String::new(),
                })
                .await
                .expect("run pod")
                .into_inner()
                .pod_sandbox_id;
            let mut pod = Pod { client, id, config };
            let mut ids = Vec::new();
            for c in 0..3 {
                ids.push(
                    pod.run(container(
                        &format!("c{c}"),
                        "busybox:latest",
                        &["sleep", "1000"],
                    ))
                    .await,
                );
            }
            let listed = pod
                .client
                .runtime
                .list_containers(ListContainersRequest {
                    filter: Some(ContainerFilter {
                        pod_sandbox_id: pod.id.clone(),
                        ..Default::default()
                    }),
                })
                .await
                .unwrap()
                .into_inner()
                .containers;
            assert_eq!(listed.len(), 3);
            for id in &ids {
                pod.stop(id, 0).await;
                pod.remove(id).await;
            }
            pod.remove_pod().await;
        }));
    }
    for h in handles {
        h.await.expect("pod task");
    }
    assert_eq!(crius.ctr(&["containers", "ls", "-q"]).trim(), "");
    assert_eq!(crius.ctr(&["tasks", "ls", "-q"]).trim(), "");
    let left = std::fs::read_dir(crius.config.state.join("containers"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(left, 0);
}

#[tokio::test]
async fn containers_survive_a_restart_and_keep_logging() {
    let mut crius = Crius::start().await;
    let mut pod = pod(&crius, "survive").await;
    let ticker = pod
        .run(container(
            "ticker",
            "busybox:latest",
            &["sh", "-c", "while true; do echo tick; sleep 0.1; done"],
        ))
        .await;
    let done = pod
        .run(container("done", "busybox:latest", &["sh", "-c", "exit 7"]))
        .await;
    pod.wait_exited(&done).await;
    let (before_ticker, _) = pod.status(&ticker).await;
    let (before_done, _) = pod.status(&done).await;

    crius.restart().await;
    let mut client = crius.client().await;
    let status = |id: &str| {
        let mut client = client.clone();
        let id = id.to_string();
        async move {
            client
                .runtime
                .container_status(ContainerStatusRequest {
                    container_id: id,
                    verbose: false,
                })
                .await
                .unwrap()
                .into_inner()
                .status
                .unwrap()
        }
    };
    assert_eq!(status(&ticker).await, before_ticker);
    assert_eq!(status(&done).await, before_done);
    let log = pod.log_path("ticker");
    let size = std::fs::metadata(&log).unwrap().len();
    assert!(
        eventually(Duration::from_secs(5), || {
            let log = log.clone();
            async move {
                std::fs::metadata(&log)
                    .map(|m| m.len() > size)
                    .unwrap_or(false)
            }
        })
        .await,
        "the log stopped growing after the restart"
    );
    client
        .runtime
        .remove_pod_sandbox(RemovePodSandboxRequest {
            pod_sandbox_id: pod.id.clone(),
        })
        .await
        .unwrap();
    assert_eq!(crius.ctr(&["containers", "ls", "-q"]).trim(), "");
}

#[tokio::test]
async fn creations_take_a_lease_made_ahead_and_start_up_deletes_it() {
    let mut crius = Crius::start().await;
    let mut pod = pod(&crius, "leases").await;
    let made_ahead = |crius: &Crius| {
        let leases = crius.leases("crius-");
        (leases.len() == 1 && leases[0].starts_with("crius-create-")).then(|| leases[0].clone())
    };
    // The pod's creation made its own lease, deleted it and made one ahead.
    let mut ready = None;
    assert!(
        eventually(Duration::from_secs(5), || {
            ready = made_ahead(&crius);
            std::future::ready(ready.is_some())
        })
        .await,
        "{:?}",
        crius.leases("crius-")
    );
    for name in ["first", "second"] {
        pod.create(container(name, "busybox:latest", &["true"]))
            .await
            .unwrap();
        let mut next = None;
        assert!(
            eventually(Duration::from_secs(5), || {
                next = made_ahead(&crius);
                std::future::ready(next.is_some() && next != ready)
            })
            .await,
            "the lease made ahead ({ready:?}) was not taken: {:?}",
            crius.leases("crius-")
        );
        ready = next;
    }
    // Each container's snapshot is held by its record, not by a lease.
    let snapshots = crius.ctr(&["snapshots", "ls"]);
    assert!(snapshots.lines().count() >= 4, "{snapshots}");

    crius.restart().await;
    assert!(
        crius.leases("crius-").is_empty(),
        "{:?}",
        crius.leases("crius-")
    );
    // A creation after start-up makes its own lease again.
    pod.client = crius.client().await;
    pod.create(container("third", "busybox:latest", &["true"]))
        .await
        .unwrap();
    pod.remove_pod().await;
}

/// A creation's lease that containerd could not delete (it was restarting, as the soak
/// found) is deleted once it can be, not left for its hour.
#[tokio::test]
async fn a_creation_lease_containerd_could_not_delete_is_deleted_later() {
    let crius = Crius::start_with_failpoints("lease_pool_delete=error(1)").await;
    let pod = pod(&crius, "lease-retry").await;
    // The pod's creation lease failed to go at first; the one made ahead is all that stays.
    let only_made_ahead = eventually(Duration::from_secs(5), || {
        std::future::ready(crius.leases_left().is_empty())
    })
    .await;
    assert!(only_made_ahead, "left: {:?}", crius.leases("crius-"));
    assert!(
        crius.log().contains("creation lease deleted"),
        "the first delete did fail and a later one succeeded"
    );
    pod.remove_pod().await;
}

/// A pod whose runtime handler left the config (crius restarted without it) gets no new
/// containers, and a retry of the refused request is refused the same way at once: the
/// first one left no name reserved behind it.
#[tokio::test]
async fn a_pod_whose_handler_is_gone_refuses_containers_and_holds_no_name() {
    let mut crius = Crius::start_with(
        |config| {
            let runc = config.containerd.runtimes["runc"].clone();
            config.containerd.runtimes.insert("gone".to_string(), runc);
        },
        &[],
    )
    .await;
    let mut pod = pod_on(&crius, host_network_pod_config("gone"), "gone").await;
    crius.config.containerd.runtimes.remove("gone");
    std::fs::write(
        &crius.config_path,
        toml::to_string(&crius.config).expect("serialize config"),
    )
    .expect("write config");
    crius.restart().await;
    pod.client = crius.client().await;
    for attempt in ["first", "retry"] {
        let refused = tokio::time::timeout(
            Duration::from_secs(10),
            pod.create(container("app", "busybox:latest", &["true"])),
        )
        .await
        .unwrap_or_else(|_| panic!("the {attempt} CreateContainer hung"))
        .expect_err("no handler");
        assert_eq!(
            refused.code(),
            tonic::Code::FailedPrecondition,
            "{refused:?}"
        );
        assert!(
            refused.message().contains("no longer configured"),
            "{refused:?}"
        );
    }
}

/// The keys of the snapshots of `snapshotter` in this crius's containerd namespace.
fn snapshot_keys(crius: &Crius, snapshotter: &str) -> Vec<String> {
    crius
        .ctr(&["snapshots", "--snapshotter", snapshotter, "ls"])
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().next().map(str::to_string))
        .collect()
}

/// A handler with a snapshotter of its own (containerd's `runtimes.<name>.snapshotter`):
/// PullImage naming the handler unpacks into it, and the handler's pods and containers have
/// their rootfs there, removed with them.
#[tokio::test]
async fn a_handler_with_its_own_snapshotter_pulls_and_runs_there() {
    use crius::api::v1::{ImageSpec, ImageStatusRequest, PullImageRequest};
    let crius = Crius::start_with(
        |config| {
            // containerd's Go shim: the pod has a pause container (and its rootfs).
            let mut native = config.containerd.runtimes["containerd-runc"].clone();
            native.snapshotter = "native".to_string();
            config
                .containerd
                .runtimes
                .insert("native".to_string(), native);
        },
        &[],
    )
    .await;
    let mut client = crius.client().await;
    let image_ref = client
        .image
        .pull_image(PullImageRequest {
            image: Some(ImageSpec {
                image: image("busybox:latest"),
                runtime_handler: "native".to_string(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("pull for the native handler")
        .into_inner()
        .image_ref;
    let info = client
        .image
        .image_status(ImageStatusRequest {
            image: Some(ImageSpec {
                image: image_ref,
                ..Default::default()
            }),
            verbose: true,
        })
        .await
        .expect("ImageStatus")
        .into_inner()
        .info;
    let details: serde_json::Value = serde_json::from_str(&info["info"]).expect("json");
    let chain_id = details["chainID"].as_str().expect("chainID").to_string();
    assert!(
        snapshot_keys(&crius, "native").contains(&chain_id),
        "the image's layers are in the handler's snapshotter"
    );
    assert!(
        !snapshot_keys(&crius, "overlayfs").contains(&chain_id),
        "and only there"
    );

    let mut pod = pod_on(&crius, host_network_pod_config("native-snap"), "native").await;
    let id = pod
        .run(container("app", "busybox:latest", &["sleep", "1000"]))
        .await;
    let (out, _, code) = pod
        .exec(&id, &["cat", "/bin/busybox"], 10)
        .await
        .expect("exec");
    assert_eq!(code, 0);
    assert!(!out.is_empty());
    let native = snapshot_keys(&crius, "native");
    assert!(
        native.contains(&pod.id) && native.contains(&id),
        "the pause and app rootfs are native snapshots: {native:?}"
    );
    let overlay = snapshot_keys(&crius, "overlayfs");
    assert!(
        !overlay.contains(&pod.id) && !overlay.contains(&id),
        "{overlay:?}"
    );
    let pod_id = pod.id.clone();
    pod.remove_pod().await;
    let native = snapshot_keys(&crius, "native");
    assert!(
        !native.contains(&pod_id) && !native.contains(&id),
        "removed with the pod: {native:?}"
    );
}

/// CreateContainer's status file is the mark that the creation finished (start-up undoes a
/// container without one): a creation that cannot write it fails and leaves nothing, rather
/// than succeed and lose the container at crius's next start.
#[tokio::test]
async fn a_creation_that_cannot_write_its_status_fails_and_leaves_nothing() {
    use std::process::Command;
    let root = tempfile::tempdir().expect("tempdir");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs"])
        .arg(root.path())
        .status()
        .expect("mount");
    assert!(mounted.success());
    /// Unmounts the tmpfs however the test ends.
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(root.path().to_path_buf());
    let crius_root = root.path().to_path_buf();
    let crius = Crius::start_with(|config| config.root = crius_root, &[]).await;
    let mut pod = pod(&crius, "full-root").await;
    // Fill crius's root: directories still come, file contents do not.
    let filler = root.path().join("filler");
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=64k"])
        .arg(format!("of={}", filler.display()))
        .output();
    let config = container("app", "busybox:latest", &["sleep", "1000"]);
    let err = pod.create(config.clone()).await.expect_err("a full root");
    assert_eq!(err.code(), tonic::Code::Internal, "{err:?}");
    assert!(err.message().contains("status"), "{err:?}");
    let listed = pod
        .client
        .runtime
        .list_containers(ListContainersRequest::default())
        .await
        .expect("list")
        .into_inner()
        .containers;
    assert!(listed.is_empty(), "{listed:?}");
    let records = crius.ctr(&["containers", "ls", "-q"]);
    assert_eq!(records.lines().count(), 1, "only the pod's: {records}");

    // With room again, the same request makes the container: its name was released.
    std::fs::remove_file(&filler).expect("remove filler");
    let id = pod.create(config).await.expect("create with room");
    pod.remove(&id).await;
    pod.remove_pod().await;
    drop(crius);
}
