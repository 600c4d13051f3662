//! The `delete` action: containerd runs it when a shim is gone (or its connection to it
//! closed) to clean up a container it cannot reach: force-delete the runtime's container
//! (or end a held pod's holder), unmount the rootfs, and report the exit as a kill.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::SystemTime;

use containerd_shim::Flags;
use containerd_shim_protos::api::DeleteResponse;
use containerd_shim_protos::protobuf::Message;

use crate::entry::start::ActionResult;

pub fn run(flags: &Flags) -> ActionResult {
    let bundle = if flags.bundle.is_empty() {
        std::env::current_dir()?
    } else {
        PathBuf::from(&flags.bundle)
    };
    if crate::pod::held::is_held_bundle(&bundle) {
        let pid = crate::pod::held::end_left_holder(&bundle, &flags.id);
        return write_killed(pid);
    }
    let runc = crate::task::bundle::load_runc(&bundle).unwrap_or_else(|| {
        crate::runtime::runc::runc_for(&Default::default(), &flags.namespace, &bundle)
    });
    let status = Command::new(&runc.binary)
        .arg("--root")
        .arg(&runc.root)
        .args(["delete", "--force", &flags.id])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if let Err(e) = status {
        log::warn!("{} delete {}: {e}", runc.binary, flags.id);
    }
    crate::task::bundle::unmount_rootfs(&bundle.join("rootfs"));
    let pid = crate::runtime::runc::read_pid_file(&bundle.join("init.pid")).unwrap_or(0);
    write_killed(pid)
}

/// Answers containerd with the container's exit as a kill.
fn write_killed(pid: i32) -> ActionResult {
    let response = DeleteResponse {
        pid: u32::try_from(pid).unwrap_or(0),
        exit_status: 128 + libc::SIGKILL as u32,
        exited_at: Some(crate::task::shim::timestamp(SystemTime::now())).into(),
        ..Default::default()
    };
    std::io::stdout().write_all(&response.write_to_bytes()?)?;
    Ok(())
}
