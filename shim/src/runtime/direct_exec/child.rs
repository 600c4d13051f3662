//! The exec's process between the helper's fork and its program: in the container's
//! namespaces and cgroups already, it becomes the spec's user with the spec's capabilities
//! and limits, in runc's order, and execs. Each step that fails ends it with runc's words.

use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

use nix::unistd::{Gid, Uid};

use super::lookup::{errno_text, look_path};
use super::spec::{CapSets, ExecProcess, home_of, rlimit_resource};

/// The most of the container's /etc/passwd read for the user's home.
const MAX_PASSWD: u64 = 4 << 20;
/// What the child writes just before its `execve`: a report without it is of a child that
/// died before (killed, out of memory), one with more after it of an `execve` that failed.
pub const EXECS: u8 = b'!';

/// Becomes the process and execs its program; returns only why it could not. `report` is
/// the one descriptor beyond stdio it keeps (close-on-exec) to say so.
pub fn become_process(
    process: &ExecProcess,
    caps: CapSets,
    last_cap: u32,
    report: &impl AsRawFd,
) -> String {
    if let Err(why) = close_all_but_stdio_and(report.as_raw_fd()) {
        return why;
    }
    match prepare(process, caps, last_cap) {
        Ok((program, args, env)) => {
            let marker = [EXECS];
            // SAFETY: a write of one byte from a live buffer to the report pipe.
            unsafe { libc::write(report.as_raw_fd(), marker.as_ptr().cast(), 1) };
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
    give_stdio_to(process.user.uid)?;
    become_user(process)?;
    // A changed user makes the process dumpable again (as `fs.suid_dumpable` says): it is
    // the shim's until its exec, not the container's to trace.
    nix::sys::prctl::set_dumpable(false).map_err(|e| format!("prctl: {e}"))?;
    if !in_cwd {
        nix::unistd::chdir(process.cwd.as_str()).map_err(|e| chdir_failure(&process.cwd, e))?;
    }
    set_capabilities(caps)?;
    // Read as the process itself: an /etc/passwd that links elsewhere (a host-PID
    // container's /proc) gets nothing the process could not read on its own.
    let home = home_of(&read_passwd(), process.user.uid);
    let env = process.environment(&home);
    let path = env
        .iter()
        .find_map(|e| e.strip_prefix("PATH="))
        .map(str::to_string);
    let program = look_path(&process.args[0], path.as_deref())?;
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

/// Signals as a new process has them: none blocked, none ignored (what containerd or the
/// shim ignored, and SIGPIPE, which Rust ignores). SIGHUP and SIGINT stay ignored if they
/// were, as after runc, whose Go runtime keeps those two.
fn reset_signals() {
    let none = nix::sys::signal::SigSet::empty();
    let _ =
        nix::sys::signal::sigprocmask(nix::sys::signal::SigmaskHow::SIG_SETMASK, Some(&none), None);
    for signal in 1..=64 {
        if matches!(
            signal,
            libc::SIGKILL | libc::SIGSTOP | libc::SIGHUP | libc::SIGINT
        ) {
            continue;
        }
        set_default(signal);
    }
}

/// The kernel's `struct sigaction` on x86_64, for the signals the C library keeps for itself
/// (32-34), whose disposition its `sigaction` will not change.
#[cfg(target_arch = "x86_64")]
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

fn set_default(signal: libc::c_int) {
    // SAFETY: a zeroed sigaction with SIG_DFL (0) as its handler; no handler ever runs.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = libc::SIG_DFL;
    // SAFETY: sigaction reads the struct; a signal number it refuses only fails.
    if unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) } == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let default = KernelSigaction {
            handler: libc::SIG_DFL,
            flags: 0,
            restorer: 0,
            mask: 0,
        };
        // SAFETY: rt_sigaction reads the kernel's struct of its x86_64 layout (8-byte mask).
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                signal,
                &default,
                std::ptr::null_mut::<KernelSigaction>(),
                8usize,
            )
        };
    }
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

fn set_capabilities(caps: CapSets) -> Result<(), String> {
    if crate::runtime::caps::capset(caps.effective, caps.permitted, caps.inheritable) != 0 {
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

/// Closes every descriptor the helper had but stdio and `keep`: nothing of the host stays
/// open while the process is in the container (`keep` closes on exec).
fn close_all_but_stdio_and(keep: RawFd) -> Result<(), String> {
    let keep = u32::try_from(keep).map_err(|_| "report descriptor")?;
    let ranges = [(3, keep.checked_sub(1)), (keep + 1, Some(u32::MAX))];
    for (first, last) in ranges {
        let Some(last) = last.filter(|last| *last >= first) else {
            continue;
        };
        // SAFETY: closes descriptors this process no longer uses; no Rust value owns them
        // past this point (the child only exits or execs after it).
        if unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) } != 0 {
            return Err(format!(
                "close the helper's descriptors: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

/// Makes the user the owner of stdio, as runc does, so it can reopen `/dev/stdout`;
/// `/dev/null` and descriptors whose owner cannot change are left as they are.
fn give_stdio_to(uid: u32) -> Result<(), String> {
    let null = nix::sys::stat::stat("/dev/null").ok().map(|s| s.st_rdev);
    for fd in 0..=2 {
        // SAFETY: stdio stays open for the life of the process.
        let stdio = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let Ok(stat) = nix::sys::stat::fstat(stdio) else {
            continue;
        };
        if Some(stat.st_rdev) == null && stat.st_mode & libc::S_IFMT == libc::S_IFCHR {
            continue;
        }
        // SAFETY: fchown on one of this process's stdio descriptors.
        if unsafe { libc::fchown(fd, uid, stat.st_gid) } != 0 {
            let error = std::io::Error::last_os_error();
            if !matches!(
                error.raw_os_error(),
                Some(libc::EINVAL | libc::EPERM | libc::EROFS)
            ) {
                return Err(format!("fix stdio permissions: {error}"));
            }
        }
    }
    Ok(())
}
