//! The `start` action: find or start the pod's shim and print its address.
//!
//! Containers of one pod share a shim, as with containerd's runc shim: the group is the
//! pod's sandbox id from the bundle's spec. The shim's socket name is a hash of containerd's
//! address, the namespace and the group; when that socket answers, the container joins it.
//! For a container the address is printed bare, which containerd 1.6 and 2.x both read as
//! a task v2 shim. A pod containerd 2.x hands over through its sandbox API has a bundle
//! without a spec: then the shim answers in the bootstrap JSON as version 3, so containerd
//! sends the pod's containers to this shim's task v3 service instead of starting a shim
//! per container (only containerd 2.x starts a shim without a spec). containerd 2.3 sends
//! its bootstrap params on stdin and gets a `BootstrapResult` back (see [`crate::entry::bootstrap`]);
//! older ones send the runtime options there.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use containerd_shim::Flags;
use containerd_shim_protos::protobuf::Message;
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::shim::oci::Options;

use crate::entry::bootstrap::BootstrapParams;
use crate::runtime::bundle_spec::BundleSpec;
use crate::runtime::bundle_spec::SANDBOX_ID;

/// The fd the serving shim finds its listener on.
const LISTENER_FD: RawFd = 3;

pub type ActionResult = Result<(), Box<dyn std::error::Error>>;

pub fn run(flags: &Flags) -> ActionResult {
    let bundle = std::env::current_dir()?;
    let group = group_of(&bundle, &flags.id);
    let input = read_stdin();
    let params = BootstrapParams::parse(&input, &flags.id);
    // The socket is named as containerd names its runc shim's for the pod (tools that
    // reach a pod's shim by containerd's naming find it); a pod whose shim an older crius
    // started keeps it under the older name.
    let legacy = containerd_shim::socket_address(
        &flags.address,
        &flags.namespace,
        &format!("{group}/crius"),
    );
    let mut address = if answers(&legacy) {
        legacy
    } else {
        containerd_shim::socket_address(&flags.address, &flags.namespace, &group)
    };
    if let Some(dir) = params.as_ref().and_then(|p| p.socket_dir.as_deref()) {
        address = in_socket_dir(&address, dir);
    }
    let path = address.trim_start_matches("unix://").to_string();
    if let Some(dir) = Path::new(&path).parent() {
        std::fs::create_dir_all(dir)?;
    }
    match bind(&path)? {
        Some(listener) => {
            let options = runtime_options(&input, params.as_ref());
            let pid = spawn_server(flags, &bundle, &address, &listener)?;
            let shim_cgroup = options.map(|o| o.shim_cgroup).unwrap_or_default();
            containerd_shim::cgroup::set_cgroup_and_oom_score(pid, &shim_cgroup)?;
        }
        None => log::debug!("container {} joins the shim at {address}", flags.id),
    }
    write_address(&bundle, &address)?;
    let version = if bundle.join("config.json").exists() {
        2
    } else {
        3
    };
    let answer = match (&params, version) {
        (Some(_), _) => crate::entry::bootstrap::encode_result(version, &address, "ttrpc"),
        (None, 2) => address.into_bytes(),
        (None, _) => bootstrap_v3(&address).into_bytes(),
    };
    std::io::stdout().write_all(&answer)?;
    Ok(())
}

/// containerd 2.0-2.2's bootstrap answer for a shim serving task API v3 (and the sandbox
/// API), in JSON.
fn bootstrap_v3(address: &str) -> String {
    serde_json::json!({"version": 3, "address": address, "protocol": "ttrpc"}).to_string()
}

/// The shim's socket `address` moved into the directory containerd asked for (same name).
fn in_socket_dir(address: &str, dir: &str) -> String {
    let name = Path::new(address.trim_start_matches("unix://"))
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("unix://{}", Path::new(dir).join(name).display())
}

/// What containerd wrote to stdin (bounded: containerd's own shims read at most 10 MiB).
fn read_stdin() -> Vec<u8> {
    let mut data = Vec::new();
    let _ = std::io::stdin().take(10 << 20).read_to_end(&mut data);
    data
}

/// The pod a container belongs to: its sandbox id, or itself.
fn group_of(bundle: &Path, id: &str) -> String {
    BundleSpec::read(bundle)
        .ok()
        .and_then(|spec| spec.annotations.get(SANDBOX_ID).cloned())
        .filter(|g| !g.is_empty())
        .unwrap_or_else(|| id.to_string())
}

/// Whether a live shim answers on the socket at `address`.
fn answers(address: &str) -> bool {
    UnixStream::connect(address.trim_start_matches("unix://")).is_ok()
}

/// Binds the socket; None when a live shim serves it already. A socket nobody answers on
/// is left from a dead shim and is replaced.
fn bind(path: &str) -> std::io::Result<Option<UnixListener>> {
    match UnixListener::bind(path) {
        Ok(listener) => Ok(Some(listener)),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            if UnixStream::connect(path).is_ok() {
                return Ok(None);
            }
            std::fs::remove_file(path)?;
            UnixListener::bind(path).map(Some)
        }
        Err(e) => Err(e),
    }
}

/// The runc options (for the shim's cgroup): an extension of containerd 2.3's params, or
/// the `Any` older containerds write to stdin.
fn runtime_options(input: &[u8], params: Option<&BootstrapParams>) -> Option<Options> {
    const RUNC_OPTIONS: &str = "containerd.runc.v1.Options";
    let any = match params {
        Some(params) => params.extension(RUNC_OPTIONS)?.clone(),
        None => Any::parse_from_bytes(input).ok()?,
    };
    if !any.type_url.ends_with(RUNC_OPTIONS) {
        return None;
    }
    Options::parse_from_bytes(&any.value).ok()
}

/// Starts the serving shim in its own session, with the listener as fd 3 and no stdio
/// (containerd waits for the start action's output to close).
fn spawn_server(
    flags: &Flags,
    bundle: &Path,
    address: &str,
    listener: &UnixListener,
) -> std::io::Result<u32> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args(["-namespace", &flags.namespace, "-id", &flags.id])
        .args(["-address", &flags.address])
        .args(["-publish-binary", &flags.publish_binary])
        .args(["-socket", address]);
    if flags.debug {
        command.arg("-debug");
    }
    let fd = listener.as_raw_fd();
    command
        .current_dir(bundle)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        command.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if fd != LISTENER_FD && libc::dup2(fd, LISTENER_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::fcntl(LISTENER_FD, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = command.spawn()?;
    Ok(child.id())
}

/// Writes the `address` file containerd reads when it reconnects after a restart.
fn write_address(bundle: &Path, address: &str) -> std::io::Result<()> {
    let temp = bundle.join(".address.tmp");
    std::fs::write(&temp, address)?;
    std::fs::rename(&temp, bundle.join("address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_start_answers_version_3() {
        let answer: serde_json::Value =
            serde_json::from_str(&bootstrap_v3("unix:///run/s")).expect("json");
        assert_eq!(answer["version"], 3);
        assert_eq!(answer["address"], "unix:///run/s");
        assert_eq!(answer["protocol"], "ttrpc");
    }

    #[test]
    fn a_socket_dir_keeps_the_sockets_name() {
        assert_eq!(
            in_socket_dir("unix:///run/containerd/s/abc123", "/run/other/s"),
            "unix:///run/other/s/abc123"
        );
    }

    #[test]
    fn runtime_options_come_from_params_or_the_old_any() {
        let options = Options {
            shim_cgroup: "/pods/shim".into(),
            ..Default::default()
        };
        let any = Any {
            type_url: "containerd.runc.v1.Options".into(),
            value: options.write_to_bytes().expect("encode"),
            ..Default::default()
        };
        let old = any.write_to_bytes().expect("encode");
        assert_eq!(
            runtime_options(&old, None).map(|o| o.shim_cgroup),
            Some("/pods/shim".to_string())
        );
        let params = BootstrapParams {
            instance_id: "pod1".into(),
            extensions: vec![any],
            ..Default::default()
        };
        assert_eq!(
            runtime_options(b"", Some(&params)).map(|o| o.shim_cgroup),
            Some("/pods/shim".to_string())
        );
        assert!(runtime_options(b"", Some(&BootstrapParams::default())).is_none());
    }

    #[test]
    fn containers_group_by_their_sandbox_id() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(group_of(dir.path(), "c1"), "c1");
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"annotations":{"io.kubernetes.cri.sandbox-id":"pod1"}}"#,
        )
        .expect("write spec");
        assert_eq!(group_of(dir.path(), "c1"), "pod1");
    }

    #[test]
    fn a_dead_shims_socket_is_replaced_and_a_live_one_is_joined() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        let path = path.to_str().expect("utf-8 path");
        let first = bind(path).expect("bind").expect("listener");
        assert!(
            bind(path).expect("bind again").is_none(),
            "live socket joined"
        );
        drop(first);
        // Another test's child, forked before it execs, may hold the listener a moment.
        let replaced = (0..100).any(|_| {
            let bound = bind(path).expect("rebind").is_some();
            if !bound {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            bound
        });
        assert!(replaced, "dead socket replaced");
    }
}
