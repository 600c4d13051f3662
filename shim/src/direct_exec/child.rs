//! The exec's process between the helper's fork and its program: in the container's
//! namespaces and cgroups already, it becomes the spec's user with the spec's capabilities
//! and limits, in runc's order, and execs. Each step that fails ends it with runc's words.

use std::ffi::CString;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;

use nix::unistd::{Gid, Uid};

use super::lookup::{errno_text, look_path};
use super::spec::{CapSets, ExecProcess, home_of, rlimit_resource};

/// The most of the container's /etc/passwd read for the user's home.
const MAX_PASSWD: u64 = 4 << 20;

/// Becomes the process and execs its program; returns only why it could not.
pub fn become_process(process: &ExecProcess, caps: CapSets, last_cap: u32) -> String {
    match prepare(process, caps, last_cap) {
        Ok((program, args, env)) => {
            let Err(e) = nix::unistd::execve(&program, &args, &env);
            format!(
                "exec {}: {}",
                program.to_string_lossy(),
                errno_text(&std::io::Error::from(e))
            )
        }
        Err(why) => why,
    }
}

type Program = (CString, Vec<CString>, Vec<CString>);

fn prepare(process: &ExecProcess, caps: CapSets, last_cap: u32) -> Result<Program, String> {
    nix::unistd::setsid().map_err(|e| format!("setsid: {e}"))?;
    reset_signals();
    set_rlimits(process)?;
    if process.no_new_privileges {
        nix::sys::prctl::set_no_new_privs().map_err(|e| format!("no_new_privs: {e}"))?;
    }
    // As root first: a directory root may enter but the user may not is still the cwd.
    let in_cwd = match nix::unistd::chdir(process.cwd.as_str()) {
        Ok(()) => true,
        Err(nix::errno::Errno::EACCES | nix::errno::Errno::EPERM) => false,
        Err(e) => return Err(chdir_failure(&process.cwd, e)),
    };
    drop_bounding_set(caps.bounding, last_cap)?;
    become_user(process)?;
    if !in_cwd {
        nix::unistd::chdir(process.cwd.as_str()).map_err(|e| chdir_failure(&process.cwd, e))?;
    }
    set_capabilities(caps)?;
    let umask = process.user.umask.unwrap_or(0o022) & 0o777;
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(umask));
    // Read as the process itself: an /etc/passwd that links elsewhere (a host-PID
    // container's /proc) gets nothing the process could not read on its own.
    let home = home_of(&read_passwd(), process.user.uid);
    let env = process.environment(&home);
    let path = env
        .iter()
        .find_map(|e| e.strip_prefix("PATH="))
        .map(str::to_string);
    let program = look_path(&process.args[0], path.as_deref())?;
    mark_descriptors_close_on_exec();
    let c = |s: &str| CString::new(s).map_err(|_| "a NUL byte in the process".to_string());
    let args = process
        .args
        .iter()
        .map(|a| c(a))
        .collect::<Result<_, _>>()?;
    let env = env.iter().map(|e| c(e)).collect::<Result<_, _>>()?;
    Ok((c(&program)?, args, env))
}

fn chdir_failure(cwd: &str, e: nix::errno::Errno) -> String {
    format!(
        "chdir to cwd ({cwd:?}) set in config.json failed: {}",
        errno_text(&std::io::Error::from(e))
    )
}

/// Signals as a new process has them: none blocked, SIGPIPE (which Rust ignores) default.
fn reset_signals() {
    let none = nix::sys::signal::SigSet::empty();
    let _ =
        nix::sys::signal::sigprocmask(nix::sys::signal::SigmaskHow::SIG_SETMASK, Some(&none), None);
    // SAFETY: restores the default disposition; no handler runs.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

fn set_rlimits(process: &ExecProcess) -> Result<(), String> {
    for limit in &process.rlimits {
        let resource = rlimit_resource(&limit.kind).ok_or("unknown rlimit")?;
        let value = libc::rlimit {
            rlim_cur: limit.soft,
            rlim_max: limit.hard,
        };
        // SAFETY: setrlimit reads the struct.
        if unsafe { libc::setrlimit(resource, &value) } != 0 {
            return Err(format!(
                "error setting rlimit type {}: {}",
                limit.kind,
                errno_text(&std::io::Error::last_os_error())
            ));
        }
    }
    Ok(())
}

/// The container's /etc/passwd (empty when there is none, or it is no regular file: a FIFO
/// there must not hold the exec).
fn read_passwd() -> String {
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open("/etc/passwd")
    else {
        return String::new();
    };
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return String::new();
    }
    let mut text = Vec::new();
    let _ = file.take(MAX_PASSWD).read_to_end(&mut text);
    String::from_utf8_lossy(&text).into_owned()
}

fn drop_bounding_set(bounding: u64, last_cap: u32) -> Result<(), String> {
    for cap in 0..=last_cap.min(63) {
        if bounding & (1 << cap) != 0 {
            continue;
        }
        // SAFETY: prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } != 0 {
            return Err(format!(
                "drop capability {cap} from the bounding set: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

/// The spec's groups, group and user; the capabilities stay for `set_capabilities`.
fn become_user(process: &ExecProcess) -> Result<(), String> {
    let user = &process.user;
    nix::sys::prctl::set_keepcaps(true).map_err(|e| format!("keep capabilities: {e}"))?;
    let groups: Vec<Gid> = user
        .additional_gids
        .iter()
        .map(|g| Gid::from_raw(*g))
        .collect();
    nix::unistd::setgroups(&groups).map_err(|e| format!("setgroups: {e}"))?;
    let (gid, uid) = (Gid::from_raw(user.gid), Uid::from_raw(user.uid));
    nix::unistd::setresgid(gid, gid, gid).map_err(|e| format!("setgid {}: {e}", user.gid))?;
    nix::unistd::setresuid(uid, uid, uid).map_err(|e| format!("setuid {}: {e}", user.uid))?;
    nix::sys::prctl::set_keepcaps(false).map_err(|e| format!("keep capabilities: {e}"))
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

fn set_capabilities(caps: CapSets) -> Result<(), String> {
    let header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let split = |mask: u64| [mask as u32, (mask >> 32) as u32];
    let (e, p, i) = (
        split(caps.effective),
        split(caps.permitted),
        split(caps.inheritable),
    );
    let data = [0, 1].map(|n| CapData {
        effective: e[n],
        permitted: p[n],
        inheritable: i[n],
    });
    // SAFETY: capset reads the header and two data structs of version 3.
    if unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) } != 0 {
        return Err(format!("capset: {}", std::io::Error::last_os_error()));
    }
    for cap in (0..64).filter(|cap| caps.ambient & (1 << cap) != 0) {
        // SAFETY: prctl with integer arguments.
        let raised = unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong,
                cap as libc::c_ulong,
                0,
                0,
            )
        };
        if raised != 0 {
            return Err(format!(
                "raise ambient capability {cap}: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

/// Nothing the helper inherited reaches the program (the report pipe closes on exec too).
fn mark_descriptors_close_on_exec() {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 4;
    // SAFETY: marks descriptors from 3 up close-on-exec; frees nothing.
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC) };
}
