//! `crius check` against the test bed: a host that can run crius passes, and each broken
//! part fails with its own line and what to do.

mod common;

use common::{Crius, Testbed, bridge_conflist};

fn check(config: &crius::config::Config) -> (bool, String) {
    check_with_path(config, std::env::var_os("PATH").unwrap_or_default())
}

/// `crius check` with `path` as its PATH.
fn check_with_path(config: &crius::config::Config, path: std::ffi::OsString) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("config.toml");
    std::fs::write(&config_path, toml::to_string(config).unwrap()).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_crius"))
        .args(["check", "--config"])
        .arg(&config_path)
        .env("PATH", path)
        .output()
        .expect("run crius check");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn the_test_bed_passes_every_check() {
    let dir = tempfile::tempdir().unwrap();
    let config = Crius::config(dir.path());
    std::fs::create_dir_all(&config.cni.conf_dir).unwrap();
    std::fs::write(
        config.cni.conf_dir.join("10-check.conflist"),
        bridge_conflist("check-net", "10.77.0.0/24"),
    )
    .unwrap();
    let (passed, text) = check(&config);
    assert!(passed, "{text}");
    let containerd = Testbed::from_env().containerd_address;
    for line in [
        format!(
            "ok   containerd: reachable at {}, version ",
            containerd.display()
        ),
        "ok   snapshotter: containerd serves \"overlayfs\"".to_string(),
        "ok   runtime runc (default): shim containerd-shim-crius-v2, ".to_string(),
        "ok   CNI config: 1 network(s) from ".to_string(),
        "ok   CNI plugins: all found in ".to_string(),
    ] {
        assert!(text.contains(&line), "{line:?} missing:\n{text}");
    }
    assert!(text.contains("seccomp yes"), "{text}");
    assert!(text.ends_with(" checks, 0 failed\n"), "{text}");
    // The host's facts, read here independently of crius: the cgroup layout and whether
    // this process may lower OOM scores (the VM runs on hybrid cgroups without
    // CAP_SYS_RESOURCE).
    let unified = std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let cgroups = if unified {
        "ok   cgroups: v2 (unified), driver cgroupfs"
    } else {
        "warn cgroups: v1 (or hybrid), driver cgroupfs -> kubelet 1.35 and later refuse cgroup v1"
    };
    assert!(text.contains(cgroups), "{cgroups:?} missing:\n{text}");
    // Whether a cgroup mount has favordynmods, read from the mount table here.
    let favored = std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .any(|l| l.contains(" cgroup") && l.contains("favordynmods"));
    let moves = if favored {
        "ok   cgroup moves: favordynmods"
    } else {
        "warn cgroup moves: no favordynmods"
    };
    assert!(text.contains(moves), "{moves:?} missing:\n{text}");
    let oom = if has_sys_resource() {
        "ok   OOM scores: crius may lower them (CAP_SYS_RESOURCE)"
    } else {
        "warn OOM scores: no CAP_SYS_RESOURCE where this check runs"
    };
    assert!(text.contains(oom), "{oom:?} missing:\n{text}");
}

/// Whether this process's effective capabilities hold CAP_SYS_RESOURCE (bit 24).
fn has_sys_resource() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .unwrap()
        .trim();
    u64::from_str_radix(hex, 16).unwrap() & (1 << 24) != 0
}

#[test]
fn each_broken_part_fails_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Crius::config(dir.path());
    config.containerd.address = dir.path().join("no-containerd.sock");
    config
        .containerd
        .runtimes
        .get_mut("runc")
        .unwrap()
        .options
        .binary_name = "no-such-oci-runtime".to_string();
    std::fs::create_dir_all(&config.cni.conf_dir).unwrap();
    std::fs::write(
        config.cni.conf_dir.join("10-check.conflist"),
        r#"{"cniVersion":"1.0.0","name":"odd","plugins":[{"type":"no-such-plugin"}]}"#,
    )
    .unwrap();
    // A port something already listens on.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    config.stream.port = taken.local_addr().unwrap().port();

    let (passed, text) = check(&config);
    assert!(!passed, "{text}");
    for line in [
        "FAIL containerd: not reachable at ",
        "-> start containerd",
        "FAIL snapshotter: \"overlayfs\" not checked",
        "FAIL runtime runc (default): shim containerd-shim-crius-v2, but OCI runtime no-such-oci-runtime not found",
        ": no-such-plugin -> install them",
        "FAIL stream server: cannot listen on 127.0.0.1:",
    ] {
        assert!(text.contains(line), "{line:?} missing:\n{text}");
    }
    assert!(text.ends_with(" checks, 5 failed\n"), "{text}");
}

#[test]
fn a_shim_without_its_exec_helper_beside_it_is_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let config = Crius::config(dir.path());
    // crius's shim alone in a directory that comes first on the PATH.
    let lone = dir.path().join("bin");
    std::fs::create_dir_all(&lone).unwrap();
    let shim = std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|dir| dir.join("containerd-shim-crius-v2"))
        .find(|candidate| candidate.is_file())
        .expect("crius's shim on the test bed's PATH");
    std::fs::copy(&shim, lone.join("containerd-shim-crius-v2")).unwrap();
    let path = std::env::join_paths(
        std::iter::once(lone.clone())
            .chain(std::env::split_paths(&std::env::var_os("PATH").unwrap())),
    )
    .unwrap();
    let (_, text) = check_with_path(&config, path);
    let line = "warn runtime runc (default): shim containerd-shim-crius-v2, ";
    assert!(text.contains(line), "{line:?} missing:\n{text}");
    assert!(
        text.contains("no crius-exec-helper beside the shim (each exec copies the whole shim) -> install crius-exec-helper in the shim's directory"),
        "{text}"
    );
}

#[test]
fn an_invalid_config_is_a_failed_check() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(&path, "[metrics]\naddress = \"everywhere\"\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_crius"))
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("FAIL config: "), "{text}");
    assert!(text.contains("metrics.address"), "{text}");
}

#[tokio::test]
async fn the_ports_of_a_running_crius_pass() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let crius = Crius::start_with(|c| c.stream.port = port, &[]).await;
    let config = crius.config.clone();
    let (_, text) = tokio::task::spawn_blocking(move || check(&config))
        .await
        .unwrap();
    assert!(
        text.contains(&format!(
            "ok   stream server: 127.0.0.1:{port} is in use, as it should be: crius is running"
        )),
        "{text}"
    );
}
