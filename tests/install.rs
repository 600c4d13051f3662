//! `make install`: what it puts where, that it keeps an operator's files, and that the
//! systemd unit it writes passes `systemd-analyze verify`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

/// Runs `make install PROFILE=debug` (the binaries this test build made) with `vars`.
fn make_install(vars: &[(&str, &Path)]) -> String {
    let mut make = Command::new("make");
    make.current_dir(env!("CARGO_MANIFEST_DIR")).args([
        "--no-print-directory",
        "install",
        "PROFILE=debug",
    ]);
    for (name, value) in vars {
        make.arg(format!("{name}={}", value.display()));
    }
    let out = make.output().expect("run make");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "make install failed:\n{stderr}");
    stderr
}

fn config_check(config: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_crius"))
        .args(["config", "check", "--config"])
        .arg(config)
        .output()
        .expect("run crius config check")
}

#[test]
fn install_stages_the_binaries_unit_config_and_network_under_destdir() {
    let dir = tempfile::tempdir().unwrap();
    let stage = dir.path();
    make_install(&[("DESTDIR", stage)]);

    for binary in [
        "usr/local/bin/crius",
        "usr/local/bin/containerd-shim-crius-v2",
        "usr/local/bin/crius-exec-helper",
    ] {
        let mode = std::fs::metadata(stage.join(binary))
            .unwrap_or_else(|e| panic!("{binary}: {e}"))
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755, "{binary}");
    }
    let unit =
        std::fs::read_to_string(stage.join("usr/local/lib/systemd/system/crius.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/usr/local/bin/crius --config /etc/crius/config.toml\n"),
        "{unit}"
    );
    assert!(unit.contains("Type=notify\n"), "{unit}");
    assert!(!unit.contains('@'), "a placeholder left: {unit}");

    let config = stage.join("etc/crius/config.toml");
    let checked = config_check(&config);
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );
    // Last in name order: a cluster network written later is the one crius loads.
    let network = std::fs::read_to_string(stage.join("etc/cni/net.d/99-crius-bridge.conflist"))
        .expect("the default network");
    assert!(network.contains("\"type\": \"bridge\""), "{network}");
}

#[test]
fn reinstall_keeps_the_operators_config_and_network() {
    let dir = tempfile::tempdir().unwrap();
    let stage = dir.path();
    let config = stage.join("etc/crius/config.toml");
    let conf_dir = stage.join("etc/cni/net.d");
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    std::fs::create_dir_all(&conf_dir).unwrap();
    let own = "root = \"/srv/crius\"\n";
    std::fs::write(&config, own).unwrap();
    std::fs::write(conf_dir.join("05-cluster.conflist"), "{}").unwrap();

    let log = make_install(&[("DESTDIR", stage)]);
    assert!(log.contains("kept the existing"), "{log}");
    assert_eq!(std::fs::read_to_string(&config).unwrap(), own);
    assert!(
        !conf_dir.join("99-crius-bridge.conflist").exists(),
        "a default network was added beside the cluster's"
    );
    assert!(stage.join("usr/local/bin/crius").exists());
}

#[test]
fn the_installed_unit_passes_systemd_analyze_verify() {
    let dir = tempfile::tempdir().unwrap();
    // Installed for real under a prefix of its own, so the unit's paths exist.
    let prefix = dir.path();
    let etc = prefix.join("etc");
    make_install(&[("PREFIX", prefix), ("SYSCONFDIR", &etc)]);
    let unit = prefix.join("lib/systemd/system/crius.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    assert!(
        text.contains(&format!(
            "ExecStart={}/bin/crius --config {}/crius/config.toml",
            prefix.display(),
            etc.display()
        )),
        "{text}"
    );
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit)
        .output()
        .expect("run systemd-analyze (package systemd)");
    assert!(
        out.status.success(),
        "systemd-analyze verify failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn install_refuses_paths_that_would_break_the_unit() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("make")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "--no-print-directory",
            "install",
            "PROFILE=debug",
            "PREFIX=/opt/a|b",
        ])
        .arg(format!("DESTDIR={}", dir.path().display()))
        .output()
        .expect("run make");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("install paths may not hold"), "{stderr}");
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "something was installed"
    );
}

#[test]
fn install_cni_0_writes_no_network() {
    let dir = tempfile::tempdir().unwrap();
    let log = make_install(&[("DESTDIR", dir.path())]);
    assert!(
        dir.path()
            .join("etc/cni/net.d/99-crius-bridge.conflist")
            .exists(),
        "{log}"
    );
    let other = tempfile::tempdir().unwrap();
    let mut make = Command::new("make");
    make.current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "--no-print-directory",
            "install",
            "PROFILE=debug",
            "INSTALL_CNI=0",
        ])
        .arg(format!("DESTDIR={}", other.path().display()));
    let out = make.output().expect("run make");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!other.path().join("etc/cni/net.d").exists());
}
